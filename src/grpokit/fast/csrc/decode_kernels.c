/* grpokit's fused decode kernels (fp32, CPU): what one decode step does between its matmuls.
 *
 * On a small model a decode step is ~30 tiny PyTorch ops per layer, each paying ~5-10 us of
 * dispatch: the step costs several times its matmuls. The matmuls stay in PyTorch (MKL/oneDNN);
 * these kernels replace everything between them (grpokit/fast/native.py loads them, the sampler's
 * LeanDecoder calls them):
 *
 *   gk_add_rms      h += y (the residual), then out = w * h / sqrt(mean(h^2) + eps)   (RMSNorm)
 *   gk_rms_fwd, gk_rms_bwd  RMSNorm and its gradients for the training passes
 *   gk_rope_attend  optional per-head q/k RMSNorm, rotary on q and k, k and v written into the
 *                   cache at `slot`, then per head softmax(q k^T * scale + mask) v over slots 0..slot;
 *                   gk_rope_attend_prefix the same with the prompt's slots read from one copy per prompt
 *   gk_silu_mul     out = silu(gate) * up (from a fused [gate | up] projection or two tensors),
 *                   gk_silu_mul_bwd its gradients (the training passes' MLP)
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
#include "gk_common.h"

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

/* The training passes' RMSNorm: out [n, H] = w * (x * r) with r = 1 / sqrt(mean(x^2) + eps) per row,
 * r [n] kept for backward. */
void gk_rms_fwd(const float *x, const float *w, float eps, int64_t n, int64_t H, float *out, float *r) {
#pragma omp parallel for if (n * H >= 65536)
    for (int64_t i = 0; i < n; i++) {
        const float *xi = x + i * H;
        r[i] = 1.0f / sqrtf(dot(xi, xi, H) / (float)H + eps);
        for (int64_t j = 0; j < H; j++) out[i * H + j] = w[j] * (xi[j] * r[i]);
    }
}

/* Its backward, from dy [n, H]: with g = w * dy,
 *   dx = r g - x r^3 (g . x) / H,   dw = sum_i dy_i * x_i r_i
 * dw in `parts` fixed row ranges, partial sums dw_parts [parts, H] (summed by the caller): the same
 * result for any thread count. */
void gk_rms_bwd(const float *x, const float *w, const float *r, const float *dy, int64_t n, int64_t H,
                int64_t parts, float *dx, float *dw_parts) {
#pragma omp parallel for if (n * H >= 65536)
    for (int64_t c = 0; c < parts; c++) {
        float *dw = dw_parts + c * H;
        for (int64_t j = 0; j < H; j++) dw[j] = 0.0f;
        for (int64_t i = c * n / parts; i < (c + 1) * n / parts; i++) {
            const float *xi = x + i * H, *di = dy + i * H;
            float gx = 0.0f;
            for (int64_t j = 0; j < H; j++) gx += w[j] * di[j] * xi[j];
            float ri = r[i], k = gx * ri * ri * ri / (float)H;
            for (int64_t j = 0; j < H; j++) {
                dx[i * H + j] = ri * w[j] * di[j] - k * xi[j];
                dw[j] += di[j] * xi[j] * ri;
            }
        }
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

/* 8 when the AVX2 paths were compiled in (-march=native on an AVX2 + FMA machine), else 1 (plain C). */
int gk_vector_width(void) {
#ifdef GK_AVX2
    return 8;
#else
    return 1;
#endif
}

/* One row's kv head g at a decode step: its new key (normed, rotated) and value go to its own cache slot
 * `own`, then the `group` query heads that share it attend over the prompt's keys `pre` (none when the
 * row's own cache holds them) and its own slots 0..own (a row always sees its new key). m: the row's mask
 * over its own slots. */
static inline __attribute__((always_inline)) void attend_group(
        const float *qkv_row, int64_t g, const float *c, const float *s, const float *q_norm,
        const float *k_norm, float eps, float *K, float *V, int64_t own, gk_seg pre, const uint8_t *m,
        int64_t nh, int64_t nkv, int64_t group, const int64_t hd, float scale, float *sc, float *out_row) {
    float tmp[hd], q[group * hd];
    norm_rope(qkv_row + (nh + g) * hd, k_norm, eps, c, s, hd, tmp, K + own * hd);
    memcpy(V + own * hd, qkv_row + (nh + nkv + g) * hd, (size_t)hd * sizeof(float));
    for (int64_t a = 0; a < group; a++)
        norm_rope(qkv_row + (g * group + a) * hd, q_norm, eps, c, s, hd, tmp, q + a * hd);
    gk_seg mine = {K, V, m, own + 1};
    attend_heads(q, group, hd, pre, mine, scale, sc, out_row + g * group * hd, hd, NULL, 0);
}

/* One decode position per row, the prompt's keys shared by the rows of a group.
 *   qkv   [n, (nh + 2 nkv) hd]   the fused projection output (q heads, then k heads, then v heads)
 *   pos   [n] int64              each row's position (indexes the cos/sin tables [*, hd])
 *   kc,vc [n, nkv, S, hd]        this layer's own key and value cache of each row: slot `slot` - P written
 *   mask  [n, mask_stride] uint8 key j of row r is attended when mask[r, j] != 0 (j <= slot): the P
 *                                prompt keys, then the row's own
 *   pk,pv [B, nkv, P, hd]        the prompts' keys and values (P = 0: none, the own cache holds them);
 *                                row r reads prompt prow[r]
 *   out   [n, nh hd]             attention output, heads concatenated
 * The rows of one kv head run in order, so the G rows of a prompt read its keys while they are in cache. */
void gk_rope_attend_prefix(const float *qkv, const int64_t *pos, const float *cos_t, const float *sin_t,
                           const float *q_norm, const float *k_norm, float eps, float *kc, float *vc, int64_t S,
                           int64_t slot, const uint8_t *mask, int64_t mask_stride, int64_t n, int64_t nh,
                           int64_t nkv, int64_t hd, float scale, float *out, const float *pk, const float *pv,
                           int64_t P, const int64_t *prow) {
    int64_t width = (nh + 2 * nkv) * hd, group = nh / nkv, ctx = slot + 1, own = slot - P;
#pragma omp parallel for if (n * nh * ctx * hd >= 32768)
    for (int64_t gr = 0; gr < n * nkv; gr++) {
        int64_t g = gr / n, r = gr % n;
        float stack_sc[2048];                                            /* [group, ctx] scores */
        float *sc = group * ctx <= 2048 ? stack_sc : malloc((size_t)(group * ctx) * sizeof(float));
        const float *row = qkv + r * width, *c = cos_t + pos[r] * hd, *s = sin_t + pos[r] * hd;
        float *K = kc + (r * nkv + g) * S * hd, *V = vc + (r * nkv + g) * S * hd, *o = out + r * nh * hd;
        const uint8_t *m = mask + r * mask_stride;
        gk_seg pre = {NULL, NULL, m, 0};
        if (P) {
            int64_t at = (prow[r] * nkv + g) * P * hd;
            pre = (gk_seg){pk + at, pv + at, m, P};
        }
#define GK_ATTEND(HD) attend_group(row, g, c, s, q_norm, k_norm, eps, K, V, own, pre, m + P, nh, nkv, group, HD, scale, sc, o)
        GK_BY_HEAD_SIZE(hd, GK_ATTEND);
#undef GK_ATTEND
        if (sc != stack_sc) free(sc);
    }
}

/* gk_rope_attend_prefix with every key in the row's own cache (no shared prompt): slot `slot` written. */
void gk_rope_attend(const float *qkv, const int64_t *pos, const float *cos_t, const float *sin_t,
                    const float *q_norm, const float *k_norm, float eps,
                    float *kc, float *vc, int64_t S, int64_t slot, const uint8_t *mask, int64_t mask_stride,
                    int64_t n, int64_t nh, int64_t nkv, int64_t hd, float scale, float *out) {
    gk_rope_attend_prefix(qkv, pos, cos_t, sin_t, q_norm, k_norm, eps, kc, vc, S, slot, mask, mask_stride, n, nh,
                          nkv, hd, scale, out, NULL, NULL, 0, NULL);
}

/* Row r (< n) of the gate and up inputs of gk_silu_mul(_bwd) starts at (r / inner) so + (r % inner) si floats:
 * n rows si apart (inner = n), or an [n / inner, inner] grid of rows, e.g. a transposed [L, N, 2 I] record
 * read as [N, L, 2 I]. gate and up are two tensors, or the halves of one fused [gate | up] projection. */
static inline int64_t gate_row(int64_t r, int64_t inner, int64_t so, int64_t si) {
    return (r / inner) * so + (r % inner) * si;
}

/* out [n, I] (contiguous) = silu(g) * u = g / (1 + e^-g) * u */
void gk_silu_mul(const float *gate, const float *up, int64_t inner, int64_t so, int64_t si, int64_t n, int64_t I,
                 float *out) {
#pragma omp parallel for if (n * I >= 65536)
    for (int64_t r = 0; r < n; r++) {
        const float *g = gate + gate_row(r, inner, so, si), *u = up + gate_row(r, inner, so, si);
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

/* Backward of gk_silu_mul from d_out [n, I] (contiguous): with sigma = 1 / (1 + e^-g),
 *   du = d_out * g sigma,   dg = d_out * u * sigma (1 + g (1 - sigma))
 * in one pass (eager PyTorch reads and writes these tensors in three); row r of dg and du at r * d_stride. */
void gk_silu_mul_bwd(const float *gate, const float *up, int64_t inner, int64_t so, int64_t si, const float *d_out,
                     int64_t n, int64_t I, float *d_gate, float *d_up, int64_t d_stride) {
#pragma omp parallel for if (n * I >= 65536)
    for (int64_t r = 0; r < n; r++) {
        const float *g = gate + gate_row(r, inner, so, si), *u = up + gate_row(r, inner, so, si), *d = d_out + r * I;
        float *dg = d_gate + r * d_stride, *du = d_up + r * d_stride;
        int64_t j = 0;
#ifdef GK_AVX2
        __m256 one = _mm256_set1_ps(1.0f);
        for (; j + 8 <= I; j += 8) {
            __m256 gj = _mm256_loadu_ps(g + j), dj = _mm256_loadu_ps(d + j);
            __m256 sig = _mm256_div_ps(one, _mm256_add_ps(one, gk_exp8(_mm256_sub_ps(_mm256_setzero_ps(), gj))));
            __m256 silu = _mm256_mul_ps(gj, sig);
            _mm256_storeu_ps(du + j, _mm256_mul_ps(dj, silu));
            __m256 slope = _mm256_mul_ps(sig, _mm256_add_ps(one, _mm256_sub_ps(gj, silu)));  /* sigma (1 + g - g sigma) */
            _mm256_storeu_ps(dg + j, _mm256_mul_ps(_mm256_mul_ps(dj, _mm256_loadu_ps(u + j)), slope));
        }
#endif
        for (; j < I; j++) {
            float sig = 1.0f / (1.0f + gk_exp(-g[j]));
            du[j] = d[j] * g[j] * sig;
            dg[j] = d[j] * u[j] * sig * (1.0f + g[j] * (1.0f - sig));
        }
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
