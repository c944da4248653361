/* grpokit's attention for the training passes (fp32, CPU): forward and backward of
 *   O = softmax(Q K^T * scale + mask) V
 * per (batch row, key/value head) with its `group` query heads (grouped-query attention), called by
 * grpokit/attention.py. Each query stops at its last attended key: with the causal mask of a completion
 * pass (offset by the cached prompt) that is half the (query, key) pairs of the full square, which
 * PyTorch's CPU flash kernel computes whole (it skips only entire 512-key blocks).
 *
 * The backward recomputes the probabilities from the forward's logsumexp (flash attention's scheme):
 *   P_ij = e^(s_ij - lse_i),  dS_ij = P_ij (dO_i . V_j - dO_i . O_i)
 *   dQ_i = scale sum_j dS_ij K_j,  dK_j = scale sum_i dS_ij Q_i,  dV_j = sum_i P_ij dO_i
 * over blocks of GK_QBLOCK queries: pass 1 goes along each query's keys (P, dS and dQ), pass 2 along
 * the block's keys (dK and dV summed over the block's queries of every head in the group), so no key's
 * gradient is read and written once per query.
 */
#include "gk_common.h"

enum { GK_QBLOCK = 32 };

/* Attention of every query of a training pass (the forward).
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

/* Pass 1 for one query of one head: p[j] = e^(s_j - lse) and ds[j] = p[j] (dO.V_j - D) for its keys
 * j < ctx (0 where masked), D = dO.O. */
static inline __attribute__((always_inline)) void probs_and_dscores(
        const float *q, const float *dO, float D, float lse, const float *K, const float *V, const uint8_t *m,
        int64_t ctx, const int64_t hd, float scale, float *p, float *ds) {
    int64_t j = 0;
#ifdef GK_AVX2
    if (hd % 8 == 0) {
        __m256 vl = _mm256_set1_ps(lse), vD = _mm256_set1_ps(D);
        for (; j + 8 <= ctx; j += 8) {
            __m256 pj = gk_exp8(_mm256_sub_ps(scores8(q, K + j * hd, m + j, hd, scale), vl));
            _mm256_storeu_ps(p + j, pj);
            _mm256_storeu_ps(ds + j, _mm256_mul_ps(pj, _mm256_sub_ps(dots8(dO, V + j * hd, hd), vD)));
        }
    }
#endif
    for (; j < ctx; j++) {
        float pj = m[j] ? gk_exp(dot(q, K + j * hd, hd) * scale - lse) : 0.0f;
        p[j] = pj;
        ds[j] = m[j] ? pj * (dot(dO, V + j * hd, hd) - D) : 0.0f;
    }
}

/* dq_a = scale sum_{j < ctx} ds_a[j] K_j for the group's heads a (ds rows `dstride` apart, dq rows
 * `qstride` apart). */
static inline __attribute__((always_inline)) void query_grads(
        const float *ds, int64_t dstride, int64_t group, const float *K, int64_t ctx, const int64_t hd,
        float scale, float *dq, int64_t qstride) {
#ifdef GK_AVX2
    if (hd % 32 == 0) {  /* the forward's value loop, with dS for the probabilities and K for the values */
        for (int64_t a = 0; a < group; a += 2) {
            int two = a + 1 < group;
            for (int64_t e = 0; e < hd; e += 32)
                values32(ds + a * dstride, ds + (a + two) * dstride, two, K, ctx, hd, e, scale, scale,
                         dq + a * qstride, dq + (a + two) * qstride);
        }
        return;
    }
#endif
    for (int64_t a = 0; a < group; a++) {
        float acc[hd];
        for (int64_t e = 0; e < hd; e++) acc[e] = 0.0f;
        for (int64_t j = 0; j < ctx; j++)
            for (int64_t e = 0; e < hd; e++) acc[e] += ds[a * dstride + j] * K[j * hd + e];
        for (int64_t e = 0; e < hd; e++) dq[a * qstride + e] = acc[e] * scale;
    }
}

/* Pass 2: dK_j += scale sum_r dS[r, j] Q_r and dV_j += sum_r P[r, j] dO_r for keys j < n over the R rows
 * (query, head) of one block; P and dS rows are S apart and 0 past each row's keys. */
static inline __attribute__((always_inline)) void key_grads(
        const float *P, const float *dS, int64_t R, int64_t S, const float *Q, const float *dO, int64_t n,
        const int64_t hd, float scale, float *dK, float *dV) {
    int64_t e0 = 0;
#ifdef GK_AVX2
    e0 = hd - hd % 32;  /* 32 floats of a key's gradients stay in registers over all R rows */
    for (int64_t j = 0; j < n; j++)
        for (int64_t e = 0; e < e0; e += 32) {
            __m256 ak[4], av[4];
            for (int u = 0; u < 4; u++) ak[u] = av[u] = _mm256_setzero_ps();
            for (int64_t r = 0; r < R; r++) {
                __m256 wp = _mm256_broadcast_ss(P + r * S + j), wd = _mm256_broadcast_ss(dS + r * S + j);
                for (int u = 0; u < 4; u++) {
                    av[u] = _mm256_fmadd_ps(wp, _mm256_loadu_ps(dO + r * hd + e + 8 * u), av[u]);
                    ak[u] = _mm256_fmadd_ps(wd, _mm256_loadu_ps(Q + r * hd + e + 8 * u), ak[u]);
                }
            }
            for (int u = 0; u < 4; u++) {
                float *k = dK + j * hd + e + 8 * u, *v = dV + j * hd + e + 8 * u;
                _mm256_storeu_ps(k, _mm256_fmadd_ps(ak[u], _mm256_set1_ps(scale), _mm256_loadu_ps(k)));
                _mm256_storeu_ps(v, _mm256_add_ps(av[u], _mm256_loadu_ps(v)));
            }
        }
#endif
    if (e0 == hd) return;
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < n; j++) {
            float wp = P[r * S + j], wd = dS[r * S + j] * scale;
            for (int64_t e = e0; e < hd; e++) {
                dV[j * hd + e] += wp * dO[r * hd + e];
                dK[j * hd + e] += wd * Q[r * hd + e];
            }
        }
}

/* The gradients of batch row b's key/value head g: dK, dV [S, hd] (written whole) and dq of its query
 * heads. scratch: [2 R S + 2 R hd] floats, R = GK_QBLOCK * group. */
static inline __attribute__((always_inline)) void kv_head_grads(
        const float *q, const int64_t *qs, const float *K, const float *V, const uint8_t *mask, const float *out,
        const float *dout, const float *lse, int64_t b, int64_t g, int64_t H, int64_t L, int64_t S, int64_t group,
        const int64_t hd, float scale, float *dq, float *dK, float *dV, float *scratch) {
    int64_t R = GK_QBLOCK * group, ctx[GK_QBLOCK];
    float *P = scratch, *dS = P + R * S, *Qb = dS + R * S, *dOb = Qb + R * hd;
    memset(dK, 0, (size_t)(S * hd) * sizeof(float));
    memset(dV, 0, (size_t)(S * hd) * sizeof(float));
    for (int64_t i0 = 0; i0 < L; i0 += GK_QBLOCK) {
        int64_t nb = L - i0 < GK_QBLOCK ? L - i0 : GK_QBLOCK, n = 0;
        for (int64_t i = 0; i < nb; i++) {
            const uint8_t *m = mask + (b * L + i0 + i) * S;
            int64_t c = S;
            while (c > 1 && !m[c - 1]) c--;
            ctx[i] = c;
            n = c > n ? c : n;
        }
        for (int64_t i = 0; i < nb; i++) {
            const uint8_t *m = mask + (b * L + i0 + i) * S;
            for (int64_t a = 0; a < group; a++) {
                int64_t r = i * group + a, h = g * group + a, row = (b * L + i0 + i) * H + h;
                memcpy(Qb + r * hd, q + b * qs[0] + h * qs[1] + (i0 + i) * qs[2], (size_t)hd * sizeof(float));
                memcpy(dOb + r * hd, dout + row * hd, (size_t)hd * sizeof(float));
                float *p = P + r * S, *ds = dS + r * S;
                probs_and_dscores(Qb + r * hd, dOb + r * hd, dot(dOb + r * hd, out + row * hd, hd), lse[row], K, V,
                                  m, ctx[i], hd, scale, p, ds);
                for (int64_t j = ctx[i]; j < n; j++) p[j] = ds[j] = 0.0f;
            }
            query_grads(dS + i * group * S, S, group, K, ctx[i], hd, scale,
                        dq + ((b * H + g * group) * L + i0 + i) * hd, L * hd);
        }
        key_grads(P, dS, nb * group, S, Qb, dOb, n, hd, scale, dK, dV);
    }
}

/* Backward of gk_attention_fwd: q, k, v, mask as there; out [B, L, H, hd] and lse [B, L, H] its outputs,
 * dout [B, L, H, hd] the output's gradient (contiguous) -> dq [B, H, L, hd], dk, dv [B, Hkv, S, hd]
 * (contiguous, written whole). One (batch row, key/value head) per task, so no two threads write one key. */
void gk_attention_bwd(const float *q, const int64_t *qs, const float *k, const int64_t *ks, const float *v,
                      const int64_t *vs, const uint8_t *mask, const float *out, const float *dout, const float *lse,
                      int64_t B, int64_t H, int64_t Hkv, int64_t L, int64_t S, int64_t hd, float scale,
                      float *dq, float *dk, float *dv) {
    int64_t group = H / Hkv, R = GK_QBLOCK * group;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < B * Hkv; t++) {
        int64_t b = t / Hkv, g = t % Hkv;
        float *scratch = malloc((size_t)(2 * R * S + 2 * R * hd) * sizeof(float));
        const float *K = k + b * ks[0] + g * ks[1], *V = v + b * vs[0] + g * vs[1];
#define GK_GRADS(HD) kv_head_grads(q, qs, K, V, mask, out, dout, lse, b, g, H, L, S, group, HD, scale, dq, \
                                   dk + t * S * hd, dv + t * S * hd, scratch)
        GK_BY_HEAD_SIZE(hd, GK_GRADS);
#undef GK_GRADS
        free(scratch);
    }
}
