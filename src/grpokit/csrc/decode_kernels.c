/* grpokit's fused decode kernels (fp32, CPU): what one decode step does between its matmuls.
 *
 * On a small model a decode step is ~30 tiny PyTorch ops per layer, each paying ~5-10 us of
 * dispatch: the step costs several times its matmuls. The matmuls stay in PyTorch (MKL/oneDNN);
 * these kernels replace everything between them (grpokit/native.py loads them, the sampler's
 * LeanDecoder calls them):
 *
 *   gk_add_rms      h += y (the residual), then out = w * h / sqrt(mean(h^2) + eps)   (RMSNorm)
 *   gk_rope_attend  optional per-head q/k RMSNorm, rotary on q and k, k and v written into the
 *                   cache at `slot`, then per head softmax(q k^T * scale + mask) v over slots 0..slot
 *   gk_silu_mul     out = silu(gate) * up from the fused [gate | up] projection
 *   gk_sample       one token per row from softmax(z / tau) by inverse CDF (the first i with
 *                   cdf_i > u cdf_V, given u ~ U[0,1)) or argmax, and its log-prob z_i / tau - logsumexp(z / tau)
 *   (whole_step.c) gk_decode_step: a whole decode step (embedding, every layer, lm-head) in one call
 *
 * Rotary uses the table convention of the Python decoder: out_j = x_j cos_j + x_{(j+hd/2) mod hd} s_j
 * with s = [-sin_1, sin_2] (rotate_half folded into the sign). Results equal the eager ops to fp32
 * rounding (sums run in another order). Everything is contiguous; the row loops run on OpenMP
 * threads when the work is large enough. Where the compiler targets AVX2 + FMA (-march=native on such
 * a CPU) the hot loops have intrinsics paths; the plain C loops next to them are the same math.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* e^x (x clamped to [-87, 88]; below -87 it is 0): Cody-Waite reduction and a degree-6 polynomial,
 * ~2 ulp, written so the compiler vectorizes the loop that calls it (libm's expf is scalar here). */
static inline float gk_exp(float x) {
    float zero = x < -87.0f ? 0.0f : 1.0f;  /* e^x underflows (and e^-inf = 0 exactly) */
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float k = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - k * 0.693359375f;
    r = r - k * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)k + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale * zero;
}

/* sum_j a_j b_j with 8 independent partial sums (vectorizes; one serial chain would not) */
static inline float dot(const float *a, const float *b, int64_t n) {
    float acc[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int u = 0; u < 8; u++) acc[u] += a[j + u] * b[j + u];
    float d = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; j < n; j++) d += a[j] * b[j];
    return d;
}

static void rms_row(const float *x, const float *w, float eps, int64_t n, float *out) {
    float ss = dot(x, x, n);
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t j = 0; j < n; j++) out[j] = w[j] * (x[j] * inv);
}

/* h [n, H] += y [n, H] (y may be NULL); out [n, H] = RMSNorm(h) * w. */
void gk_add_rms(float *h, const float *y, const float *w, float eps, int64_t n, int64_t H, float *out) {
#pragma omp parallel for if (n * H >= 65536)
    for (int64_t r = 0; r < n; r++) {
        float *hr = h + r * H;
        if (y)
            for (int64_t j = 0; j < H; j++) hr[j] += y[r * H + j];
        rms_row(hr, w, eps, H, out + r * H);
    }
}

/* x [hd] -> out [hd]: optional RMSNorm (norm_w != NULL), then rotary with cos/sin rows of this position. */
static void norm_rope(const float *x, const float *norm_w, float eps, const float *c, const float *s,
                      int64_t hd, float *tmp, float *out) {
    const float *src = x;
    if (norm_w) {
        rms_row(x, norm_w, eps, hd, tmp);
        src = tmp;
    }
    int64_t half = hd / 2;  /* two loops, one per half, so that each vectorizes */
    for (int64_t j = 0; j < half; j++) out[j] = src[j] * c[j] + src[j + half] * s[j];
    for (int64_t j = half; j < hd; j++) out[j] = src[j] * c[j] + src[j - half] * s[j];
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define GK_AVX2 1
/* gk_exp on 8 lanes, the same steps (GCC leaves the scalar loops that call gk_exp unvectorized). */
static inline __m256 gk_exp8(__m256 x) {
    __m256 live = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ);  /* lanes below -87 (and -inf): 0 */
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 k = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), live);
}

/* [sum(a_0), ..., sum(a_7)]: the eight vectors' lane sums in one vector (hadd tree, no stores). */
static inline __m256 sum8x8(const __m256 *a) {
    __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);  /* 128-bit halves: [4 low sums | 4 high] */
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* One query against keys K[0..7] (rows of hd floats, hd % 8 == 0): the 8 scores q.k * scale, -inf where
 * the mask byte is 0. A dot product per key with one horizontal sum for all eight: the scalar loop
 * paid a horizontal sum per key, most of the attention's time. */
static inline __m256 scores8(const float *q, const float *K, const uint8_t *m, int64_t hd, float scale) {
    __m256 a[8];
    for (int u = 0; u < 8; u++) a[u] = _mm256_setzero_ps();
    for (int64_t e = 0; e < hd; e += 8) {
        __m256 qe = _mm256_loadu_ps(q + e);
        for (int u = 0; u < 8; u++) a[u] = _mm256_fmadd_ps(qe, _mm256_loadu_ps(K + u * hd + e), a[u]);
    }
    __m256 s = _mm256_mul_ps(sum8x8(a), _mm256_set1_ps(scale));
    __m256i mk = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)m));
    __m256 off = _mm256_castsi256_ps(_mm256_cmpeq_epi32(mk, _mm256_setzero_si256()));
    return _mm256_blendv_ps(s, _mm256_set1_ps(-INFINITY), off);
}

/* Values: o_a = inv_a sum_j p_a[j] V_j over the 32 floats at offset e of each value row, for the `two`
 * (1 or 2) query heads p_0, p_1 of one key/value head; the value rows are loaded once for both. */
static inline void values32(const float *p0, const float *p1, int two, const float *V, int64_t ctx, int64_t hd,
                            int64_t e, float inv0, float inv1, float *o0, float *o1) {
    __m256 a[4], b[4];
    for (int u = 0; u < 4; u++) a[u] = b[u] = _mm256_setzero_ps();
    for (int64_t j = 0; j < ctx; j++) {
        const float *v = V + j * hd + e;
        __m256 w0 = _mm256_broadcast_ss(p0 + j);
        for (int u = 0; u < 4; u++) a[u] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v + 8 * u), a[u]);
        if (two) {
            __m256 w1 = _mm256_broadcast_ss(p1 + j);
            for (int u = 0; u < 4; u++) b[u] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(v + 8 * u), b[u]);
        }
    }
    for (int u = 0; u < 4; u++) _mm256_storeu_ps(o0 + e + 8 * u, _mm256_mul_ps(a[u], _mm256_set1_ps(inv0)));
    if (two)
        for (int u = 0; u < 4; u++) _mm256_storeu_ps(o1 + e + 8 * u, _mm256_mul_ps(b[u], _mm256_set1_ps(inv1)));
}
#endif

/* 8 when the AVX2 paths were compiled in (-march=native on an AVX2 + FMA machine), else 1 (plain C). */
int gk_vector_width(void) {
#ifdef GK_AVX2
    return 8;
#else
    return 1;
#endif
}

/* p[j] = e^(p[j] - shift) for j < n; returns their sum. */
static inline float exp_shift_sum(float *p, int64_t n, float shift) {
    float t = 0.0f;
    int64_t j = 0;
#ifdef GK_AVX2
    __m256 acc = _mm256_setzero_ps(), sh = _mm256_set1_ps(shift);
    for (; j + 8 <= n; j += 8) {
        __m256 e = gk_exp8(_mm256_sub_ps(_mm256_loadu_ps(p + j), sh));
        _mm256_storeu_ps(p + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    float v[8];
    _mm256_storeu_ps(v, acc);
    t = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
#endif
    for (; j < n; j++) {
        p[j] = gk_exp(p[j] - shift);
        t += p[j];
    }
    return t;
}

/* One decode position per row.
 *   qkv   [n, (nh + 2 nkv) hd]   the fused projection output (q heads, then k heads, then v heads)
 *   pos   [n] int64              each row's position (indexes the cos/sin tables [*, hd])
 *   kc,vc [n, nkv, S, hd]        this layer's key and value cache; slot `slot` is written
 *   mask  [n, mask_stride] uint8 key j of row r is attended when mask[r, j] != 0 (j <= slot)
 *   out   [n, nh hd]             attention output, heads concatenated
 */
/* The `group` query heads q [group, hd] that share one key/value head attend over keys 0..ctx-1 of K, V
 * [ctx, hd] (key j when m[j] != 0; at least one is): head a's output goes to o + a * ostride, and when
 * lse is not NULL, log sum_j e^(s_j) to lse[a * lstride]. sc: [group, ctx] scratch. Inlined per head size
 * (below), so that for the usual sizes the loops over hd have a constant trip count. */
static inline __attribute__((always_inline)) void attend_heads(
        const float *q, int64_t group, const int64_t hd, const float *K, const float *V, const uint8_t *m,
        int64_t ctx, float scale, float *sc, float *o, int64_t ostride, float *lse, int64_t lstride) {
    float mx[group], inv[group];
    for (int64_t a = 0; a < group; a++) mx[a] = -INFINITY;
    int64_t j0 = 0;
#ifdef GK_AVX2
    if (hd % 8 == 0) {  /* keys 8 at a time; the rest (ctx % 8) below */
        for (int64_t a = 0; a < group; a++) {
            __m256 vmx = _mm256_set1_ps(-INFINITY);
            for (int64_t j = 0; j + 8 <= ctx; j += 8) {
                __m256 d = scores8(q + a * hd, K + j * hd, m + j, hd, scale);
                _mm256_storeu_ps(sc + a * ctx + j, d);
                vmx = _mm256_max_ps(vmx, d);
            }
            float v[8];
            _mm256_storeu_ps(v, vmx);
            for (int u = 0; u < 8; u++) mx[a] = v[u] > mx[a] ? v[u] : mx[a];
        }
        j0 = ctx - ctx % 8;
    }
#endif
    for (int64_t j = j0; j < ctx; j++) {
        const float *k = K + j * hd;
        for (int64_t a = 0; a < group; a++) {
            float d = m[j] ? dot(q + a * hd, k, hd) * scale : -INFINITY;
            sc[a * ctx + j] = d;
            mx[a] = d > mx[a] ? d : mx[a];
        }
    }
    for (int64_t a = 0; a < group; a++) {  /* mx is finite: some key is attended */
        float total = exp_shift_sum(sc + a * ctx, ctx, mx[a]);
        inv[a] = 1.0f / total;
        if (lse) lse[a * lstride] = mx[a] + logf(total);
    }
#ifdef GK_AVX2
    if (hd % 32 == 0) {
        for (int64_t a = 0; a < group; a += 2) {
            int two = a + 1 < group;
            const float *p1 = two ? sc + (a + 1) * ctx : sc;
            for (int64_t e = 0; e < hd; e += 32)
                values32(sc + a * ctx, p1, two, V, ctx, hd, e, inv[a], two ? inv[a + 1] : 0.0f, o + a * ostride,
                         o + (a + two) * ostride);
        }
        return;
    }
#endif
    for (int64_t a = 0; a < group; a++) {
        float acc[hd], *p = sc + a * ctx;
        for (int64_t e = 0; e < hd; e++) acc[e] = 0.0f;
        for (int64_t j = 0; j < ctx; j++) {
            float w = p[j];
            for (int64_t e = 0; e < hd; e++) acc[e] += w * V[j * hd + e];
        }
        for (int64_t e = 0; e < hd; e++) o[a * ostride + e] = acc[e] * inv[a];
    }
}

/* CALL(HD) with HD a constant for the usual head sizes (the loops over hd then have a fixed trip count), else hd. */
#define GK_BY_HEAD_SIZE(hd, CALL) \
    switch (hd) { case 32: CALL(32); break; case 64: CALL(64); break; case 128: CALL(128); break; default: CALL(hd); }

/* One row's kv head g at a decode step: its new key (normed, rotated) and value go to the cache slot,
 * then the `group` query heads that share it attend over slots 0..slot (a row always sees its new key). */
static inline __attribute__((always_inline)) void attend_group(
        const float *qkv_row, int64_t g, const float *c, const float *s, const float *q_norm,
        const float *k_norm, float eps, float *K, float *V, int64_t slot, const uint8_t *m,
        int64_t nh, int64_t nkv, int64_t group, const int64_t hd, float scale, float *sc, float *out_row) {
    float tmp[hd], q[group * hd];
    norm_rope(qkv_row + (nh + g) * hd, k_norm, eps, c, s, hd, tmp, K + slot * hd);
    memcpy(V + slot * hd, qkv_row + (nh + nkv + g) * hd, (size_t)hd * sizeof(float));
    for (int64_t a = 0; a < group; a++)
        norm_rope(qkv_row + (g * group + a) * hd, q_norm, eps, c, s, hd, tmp, q + a * hd);
    attend_heads(q, group, hd, K, V, m, slot + 1, scale, sc, out_row + g * group * hd, hd, NULL, 0);
}

void gk_rope_attend(const float *qkv, const int64_t *pos, const float *cos_t, const float *sin_t,
                    const float *q_norm, const float *k_norm, float eps,
                    float *kc, float *vc, int64_t S, int64_t slot, const uint8_t *mask, int64_t mask_stride,
                    int64_t n, int64_t nh, int64_t nkv, int64_t hd, float scale, float *out) {
    int64_t width = (nh + 2 * nkv) * hd, group = nh / nkv, ctx = slot + 1;
#pragma omp parallel for if (n * nh * ctx * hd >= 32768)
    for (int64_t rg = 0; rg < n * nkv; rg++) {
        int64_t r = rg / nkv, g = rg % nkv;
        float stack_sc[2048];                                            /* [group, ctx] scores */
        float *sc = group * ctx <= 2048 ? stack_sc : malloc((size_t)(group * ctx) * sizeof(float));
        const float *row = qkv + r * width, *c = cos_t + pos[r] * hd, *s = sin_t + pos[r] * hd;
        float *K = kc + (r * nkv + g) * S * hd, *V = vc + (r * nkv + g) * S * hd, *o = out + r * nh * hd;
        const uint8_t *m = mask + r * mask_stride;
#define GK_ATTEND(HD) attend_group(row, g, c, s, q_norm, k_norm, eps, K, V, slot, m, nh, nkv, group, HD, scale, sc, o)
        GK_BY_HEAD_SIZE(hd, GK_ATTEND);
#undef GK_ATTEND
        if (sc != stack_sc) free(sc);
    }
}

/* Attention of every query of a training pass (the forward; its backward is PyTorch's flash kernel's).
 *   q [B, H, L, hd] with strides qs = (batch, head, query), k and v [B, Hkv, S, hd] with (batch, head)
 *   strides ks and vs (each key's and value's hd floats contiguous, one after the other), mask [B, L, S]
 *   uint8 (key j of query i of row b is attended when nonzero; every query attends some key)
 *   -> out [B, L, H, hd] and lse [B, L, H] = log sum_j e^(s_ij) (contiguous:
 *   the layouts of PyTorch's flash kernel). Each query stops at its last attended key, so a causal mask
 *   costs half the pairs of the full square (PyTorch's CPU flash kernel skips only whole 512-key blocks). */
void gk_attention_fwd(const float *q, const int64_t *qs, const float *k, const int64_t *ks, const float *v,
                      const int64_t *vs, const uint8_t *mask, int64_t B, int64_t H, int64_t Hkv, int64_t L, int64_t S,
                      int64_t hd, float scale, float *out, float *lse) {
    int64_t group = H / Hkv;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < B * Hkv * L; t++) {
        int64_t b = t / (Hkv * L), g = (t / L) % Hkv, i = t % L, h0 = g * group;
        const uint8_t *m = mask + (b * L + i) * S;
        int64_t ctx = S;
        while (ctx > 1 && !m[ctx - 1]) ctx--;
        float qv[group * hd], stack_sc[2048];
        float *sc = group * ctx <= 2048 ? stack_sc : malloc((size_t)(group * ctx) * sizeof(float));
        for (int64_t a = 0; a < group; a++)
            memcpy(qv + a * hd, q + b * qs[0] + (h0 + a) * qs[1] + i * qs[2], (size_t)hd * sizeof(float));
        const float *K = k + b * ks[0] + g * ks[1], *V = v + b * vs[0] + g * vs[1];
        float *o = out + ((b * L + i) * H + h0) * hd, *l = lse + (b * L + i) * H + h0;
#define GK_ATTEND(HD) attend_heads(qv, group, HD, K, V, m, ctx, scale, sc, o, HD, l, 1)
        GK_BY_HEAD_SIZE(hd, GK_ATTEND);
#undef GK_ATTEND
        if (sc != stack_sc) free(sc);
    }
}

/* gu [n, 2 I] = [gate | up] -> out [n, I] = gate / (1 + e^-gate) * up */
void gk_silu_mul(const float *gu, int64_t n, int64_t I, float *out) {
#pragma omp parallel for if (n * I >= 65536)
    for (int64_t r = 0; r < n; r++) {
        const float *g = gu + r * 2 * I, *u = g + I;
        float *o = out + r * I;
        int64_t j = 0;
#ifdef GK_AVX2
        for (; j + 8 <= I; j += 8) {
            __m256 gj = _mm256_loadu_ps(g + j), one = _mm256_set1_ps(1.0f);
            __m256 sig = _mm256_div_ps(gj, _mm256_add_ps(one, gk_exp8(_mm256_sub_ps(_mm256_setzero_ps(), gj))));
            _mm256_storeu_ps(o + j, _mm256_mul_ps(sig, _mm256_loadu_ps(u + j)));
        }
#endif
        for (; j < I; j++) o[j] = g[j] / (1.0f + gk_exp(-g[j])) * u[j];
    }
}

/* logits [n, V] -> tok [n], lp [n]. u [n] uniforms (ignored when greedy). The same law as
 * grpokit.sampling.sample_categorical: the first i whose running sum of e^(s_i - max) exceeds
 * u * total, found block by block (block sums vectorize; the scan inside one block is serial). */
void gk_sample(const float *logits, int64_t n, int64_t V, float temperature, const float *u, int greedy,
               int64_t *tok, float *lp) {
    enum { BLOCK = 256 };
#pragma omp parallel for if (n * V >= 262144)
    for (int64_t r = 0; r < n; r++) {
        const float *z = logits + r * V;
        float *e = malloc((size_t)V * sizeof(float));
        float mx = -INFINITY, zmax = -INFINITY;
        int64_t arg = 0, last = 0;
        for (int64_t i = 0; i < V; i++) {
            e[i] = z[i] / temperature;
            mx = e[i] > mx ? e[i] : mx;
            if (z[i] > zmax) { zmax = z[i]; arg = i; }  /* the first maximum, like argmax */
        }
        float total = exp_shift_sum(e, V, mx);
        for (int64_t i = V - 1; i > 0 && e[i] == 0.0f; i--) last = i - 1;
        if (e[V - 1] > 0.0f) last = V - 1;
        int64_t pick = last;  /* if rounding leaves u * total unreached: the last token that can be drawn */
        if (greedy) {
            pick = arg;
        } else {
            float target = u[r] * total, cum = 0.0f;
            for (int64_t b = 0; b < V; b += BLOCK) {
                int64_t end = b + BLOCK < V ? b + BLOCK : V;
                float part = 0.0f;
                for (int64_t i = b; i < end; i++) part += e[i];
                if (cum + part <= target && end < V) { cum += part; continue; }
                for (int64_t i = b; i < end; i++) {
                    cum += e[i];
                    if (cum > target) { pick = i; break; }
                }
                break;
            }
        }
        tok[r] = pick;
        lp[r] = (z[pick] / temperature - mx) - logf(total);
        free(e);
    }
}
