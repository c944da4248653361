/* grpokit's one-call decode step (fp32, CPU): embedding, every layer and the lm-head of one decode
 * position per row in a single call, for models whose weights are not packed for oneDNN. Compiled with
 * decode_kernels.c (whose kernels it calls between the matmuls) into one library by grpokit/native.py.
 *
 *   gk_pack_panels, gk_linear_packed  y = x W^T + b on W packed once into 16-column panels: a 6 x 16
 *                   register tile with AVX2, plain loops without
 *   gk_set_sgemm, gk_linear           the same product by the BLAS sgemm PyTorch links (builds without AVX2)
 *   gk_decode_step  the step, its rows split over OpenMP threads
 */
#include <stdint.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define GK_AVX2 1
#endif

/* decode_kernels.c */
void gk_add_rms(float *h, const float *y, const float *w, float eps, int64_t n, int64_t H, float *out);
void gk_rope_attend(const float *qkv, const int64_t *pos, const float *cos_t, const float *sin_t,
                    const float *q_norm, const float *k_norm, float eps,
                    float *kc, float *vc, int64_t S, int64_t slot, const uint8_t *mask, int64_t mask_stride,
                    int64_t n, int64_t nh, int64_t nkv, int64_t hd, float scale, float *out);
void gk_silu_mul(const float *gate, const float *up, int64_t inner, int64_t so, int64_t si, int64_t n, int64_t I,
                 float *out);

/* ---- the whole decode step in one call (models whose weights are not packed for oneDNN) --------
 * Python's per-layer loop costs ~20 calls per layer of dispatch and argument conversion, a quarter
 * of a small model's step. The matmuls go to the BLAS sgemm that PyTorch itself links (its address
 * is handed over once by gk_set_sgemm); between them run the kernels above. */
/* The integer arguments point at int64 values that fit in 32 bits: on little-endian machines an LP64
 * BLAS (32-bit ints) and an ILP64 one (64-bit) both read them right. */
typedef void (*gk_sgemm_fn)(const char *, const char *, const void *, const void *, const void *, const float *,
                            const float *, const void *, const float *, const void *, const float *, float *,
                            const void *);
static gk_sgemm_fn gk_sgemm = NULL;

void gk_set_sgemm(void *fn) { gk_sgemm = (gk_sgemm_fn)fn; }

/* y [M, N] = x [M, K] W^T + b, W [N, K] row-major (column-major: y^T = W x^T, W read transposed). */
void gk_linear(const float *x, int64_t M, int64_t K, const float *W, const float *b, int64_t N, float *y) {
    float one = 1.0f, beta = 0.0f;
    if (b) {
        for (int64_t r = 0; r < M; r++) memcpy(y + r * N, b, (size_t)N * sizeof(float));
        beta = 1.0f;
    }
    int64_t m = N, n = M, k = K;
    gk_sgemm("T", "N", &m, &n, &k, &one, W, &k, x, &k, &beta, y, &m);
}

/* ---- matmuls on weights packed once per sampling call ----------------------------------------------
 * At 16-32 rows MKL's sgemm spends as long copying the weight into its panel layout as multiplying (every
 * call, every step). Here the weight is laid out once: W [N, K] -> P [ceil(N/16), K, 16], P[p, k, c] =
 * W[16 p + c, k] (zero past N), and the bias padded to ceil(N/16) * 16. A tile of up to 6 rows x 16
 * columns keeps its 12 sums in registers over the whole K; the panel (K x 16) stays in L1 while the
 * row tiles pass over it, so each weight is read from memory once per call. */
#ifdef GK_AVX2
static inline __attribute__((always_inline)) void tile16(const int R, const float *x, int64_t K, const float *P,
                                                         const float *b, float *y, int64_t N, int64_t n0) {
    __m256 a0[6], a1[6];
    for (int r = 0; r < R; r++) a0[r] = a1[r] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        __m256 w0 = _mm256_loadu_ps(P + 16 * k), w1 = _mm256_loadu_ps(P + 16 * k + 8);
        for (int r = 0; r < R; r++) {
            __m256 xb = _mm256_broadcast_ss(x + r * K + k);
            a0[r] = _mm256_fmadd_ps(xb, w0, a0[r]);
            a1[r] = _mm256_fmadd_ps(xb, w1, a1[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        if (b) {
            a0[r] = _mm256_add_ps(a0[r], _mm256_loadu_ps(b + n0));
            a1[r] = _mm256_add_ps(a1[r], _mm256_loadu_ps(b + n0 + 8));
        }
        if (n0 + 16 <= N) {
            _mm256_storeu_ps(y + r * N + n0, a0[r]);
            _mm256_storeu_ps(y + r * N + n0 + 8, a1[r]);
        } else {  /* the last panel of an N that is not a multiple of 16 */
            float t[16];
            _mm256_storeu_ps(t, a0[r]);
            _mm256_storeu_ps(t + 8, a1[r]);
            memcpy(y + r * N + n0, t, (size_t)(N - n0) * sizeof(float));
        }
    }
}
#endif

/* W [N, K] -> P [ceil(N/16), K, 16] (the layout above; columns past N are zero). */
void gk_pack_panels(const float *W, int64_t N, int64_t K, float *P) {
    for (int64_t n0 = 0; n0 < N; n0 += 16) {  /* written in order; read from 16 rows at a time */
        float *panel = P + n0 * K;
        int64_t cols = N - n0 < 16 ? N - n0 : 16;
        for (int64_t k = 0; k < K; k++) {
            for (int64_t c = 0; c < cols; c++) panel[16 * k + c] = W[(n0 + c) * K + k];
            for (int64_t c = cols; c < 16; c++) panel[16 * k + c] = 0.0f;
        }
    }
}

/* y [M, N] = x [M, K] W^T + b with W packed as above (b: NULL or padded). */
void gk_linear_packed(const float *x, int64_t M, int64_t K, const float *P, const float *b, int64_t N, float *y) {
    for (int64_t n0 = 0; n0 < N; n0 += 16) {
        const float *panel = P + n0 * K;
#ifdef GK_AVX2
        for (int64_t r0 = 0; r0 < M; r0 += 6) {
            const float *xr = x + r0 * K;
            float *yr = y + r0 * N;
            switch (M - r0 < 6 ? M - r0 : 6) {
                case 6: tile16(6, xr, K, panel, b, yr, N, n0); break;
                case 5: tile16(5, xr, K, panel, b, yr, N, n0); break;
                case 4: tile16(4, xr, K, panel, b, yr, N, n0); break;
                case 3: tile16(3, xr, K, panel, b, yr, N, n0); break;
                case 2: tile16(2, xr, K, panel, b, yr, N, n0); break;
                default: tile16(1, xr, K, panel, b, yr, N, n0);
            }
        }
#else
        int64_t cols = N - n0 < 16 ? N - n0 : 16;
        for (int64_t r = 0; r < M; r++)
            for (int64_t c = 0; c < cols; c++) {
                float acc = b ? b[n0 + c] : 0.0f;
                for (int64_t k = 0; k < K; k++) acc += x[r * K + k] * panel[16 * k + c];
                y[r * N + n0 + c] = acc;
            }
#endif
    }
}

enum { GK_QKV_W, GK_QKV_B, GK_O_W, GK_O_B, GK_GU_W, GK_GU_B, GK_DOWN_W, GK_DOWN_B, GK_LN1, GK_LN2, GK_QN, GK_KN,
       GK_PER_LAYER };

/* Rows r0..r1 of one decode step (everything below is per row: rows never meet). */
static void decode_rows(int64_t r0, int64_t r1, int64_t layers, const float *const *w, const float *final_norm,
                        const float *head_w, const float *head_b, int64_t V, const float *embed, const int64_t *tok,
                        int64_t n, int64_t H, int64_t I, int64_t nh, int64_t nkv, int64_t hd, float eps, float scale,
                        const int64_t *pos, const float *cos_t, const float *sin_t, float *kv, int64_t R, int64_t S,
                        int64_t slot, const uint8_t *mask, int64_t mask_stride, float *work, float *logits,
                        int64_t packed) {
    void (*linear)(const float *, int64_t, int64_t, const float *, const float *, int64_t, float *) =
        packed ? gk_linear_packed : gk_linear;
    int64_t width = (nh + 2 * nkv) * hd, cache = R * nkv * S * hd, m = r1 - r0, row = nkv * S * hd;
    float *h = work, *x = h + n * H, *y = x + n * H, *qkv = y + n * H, *att = qkv + n * width;
    float *gu = att + n * nh * hd, *act = gu + n * 2 * I;
    h += r0 * H, x += r0 * H, y += r0 * H, qkv += r0 * width, att += r0 * nh * hd, gu += r0 * 2 * I, act += r0 * I;
    for (int64_t r = 0; r < m; r++) memcpy(h + r * H, embed + tok[r0 + r] * H, (size_t)H * sizeof(float));
    gk_add_rms(h, NULL, w[GK_LN1], eps, m, H, x);
    for (int64_t l = 0; l < layers; l++) {
        const float *const *p = w + l * GK_PER_LAYER;
        float *kc = kv + 2 * l * cache + r0 * row;
        linear(x, m, H, p[GK_QKV_W], p[GK_QKV_B], width, qkv);
        gk_rope_attend(qkv, pos + r0, cos_t, sin_t, p[GK_QN], p[GK_KN], eps, kc, kc + cache, S, slot,
                       mask + r0 * mask_stride, mask_stride, m, nh, nkv, hd, scale, att);
        linear(att, m, nh * hd, p[GK_O_W], p[GK_O_B], H, y);
        gk_add_rms(h, y, p[GK_LN2], eps, m, H, x);
        linear(x, m, H, p[GK_GU_W], p[GK_GU_B], 2 * I, gu);
        gk_silu_mul(gu, gu + I, m, 0, 2 * I, m, I, act);
        linear(act, m, I, p[GK_DOWN_W], p[GK_DOWN_B], H, y);
        gk_add_rms(h, y, l + 1 < layers ? w[(l + 1) * GK_PER_LAYER + GK_LN1] : final_norm, eps, m, H, x);
    }
    linear(x, m, H, head_w, head_b, V, logits + r0 * V);
}

/* tok [n] at positions pos [n] (cache slot `slot`) -> logits [n, V].
 *   parts  the rows are cut into this many ranges, each run start to end on its own OpenMP thread
 *          (sgemm and the kernels then run single-threaded inside it: no join per operation); 1: the
 *          operations themselves run multi-threaded
 *   w      [layers * GK_PER_LAYER] weight pointers in the enum's order (biases and q/k norms may be NULL)
 *   kv     [layers, 2, R, nkv, S, hd] the cache (R >= n rows allocated; rows 0..n-1 are live)
 *   work   n * (3 H + (nh + 2 nkv) hd + nh hd + 3 I) floats of scratch
 *   packed 1: the matrices (not the norms or the embedding) are packed for gk_linear_packed, their biases
 *          padded; 0: row-major [N, K], multiplied by the handed-over sgemm */
void gk_decode_step(int64_t layers, const float *const *w, const float *final_norm, const float *head_w,
                    const float *head_b, int64_t V, const float *embed, const int64_t *tok, int64_t n, int64_t H,
                    int64_t I, int64_t nh, int64_t nkv, int64_t hd, float eps, float scale, const int64_t *pos,
                    const float *cos_t, const float *sin_t, float *kv, int64_t R, int64_t S, int64_t slot,
                    const uint8_t *mask, int64_t mask_stride, float *work, float *logits, int64_t parts,
                    int64_t packed) {
    if (parts <= 1) {
        decode_rows(0, n, layers, w, final_norm, head_w, head_b, V, embed, tok, n, H, I, nh, nkv, hd, eps, scale,
                    pos, cos_t, sin_t, kv, R, S, slot, mask, mask_stride, work, logits, packed);
        return;
    }
#pragma omp parallel for num_threads(parts) schedule(static)
    for (int64_t t = 0; t < parts; t++)
        decode_rows(t * n / parts, (t + 1) * n / parts, layers, w, final_norm, head_w, head_b, V, embed, tok, n, H,
                    I, nh, nkv, hd, eps, scale, pos, cos_t, sin_t, kv, R, S, slot, mask, mask_stride, work, logits,
                    packed);
}
