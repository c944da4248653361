/* Helpers of grpokit's C kernels (decode_kernels.c, whole_step.c): a vectorizable e^x, dot products,
 * the AVX2 score/value loops and the per-query-group attention of a decode step. All static
 * inline: each translation unit gets its own copy, inlined at its call sites. */
#ifndef GK_COMMON_H
#define GK_COMMON_H

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

/* One segment of a decode step's keys: K, V [ctx, hd], key j attended when m[j] != 0. A row's keys are its
 * prompt's (shared by the G rows of a group) then its own completion's: two segments, one softmax. */
typedef struct {
    const float *K, *V;
    const uint8_t *m;
    int64_t ctx;
} gk_seg;

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

/* [q.K_0, ..., q.K_7] for the 8 rows K[0..7] of hd floats (hd % 8 == 0): a dot product per key with one
 * horizontal sum for all eight (the scalar loop paid a horizontal sum per key). */
static inline __m256 dots8(const float *q, const float *K, int64_t hd) {
    __m256 a[8];
    for (int u = 0; u < 8; u++) a[u] = _mm256_setzero_ps();
    for (int64_t e = 0; e < hd; e += 8) {
        __m256 qe = _mm256_loadu_ps(q + e);
        for (int u = 0; u < 8; u++) a[u] = _mm256_fmadd_ps(qe, _mm256_loadu_ps(K + u * hd + e), a[u]);
    }
    return sum8x8(a);
}

/* One query against keys K[0..7]: the 8 scores q.k * scale, -inf where the mask byte is 0. */
static inline __m256 scores8(const float *q, const float *K, const uint8_t *m, int64_t hd, float scale) {
    __m256 s = _mm256_mul_ps(dots8(q, K, hd), _mm256_set1_ps(scale));
    __m256i mk = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)m));
    __m256 off = _mm256_castsi256_ps(_mm256_cmpeq_epi32(mk, _mm256_setzero_si256()));
    return _mm256_blendv_ps(s, _mm256_set1_ps(-INFINITY), off);
}

/* Values: o_a = inv_a sum_j p_a[j] V_j over the 32 floats at offset e of each value row, for the `two`
 * (1 or 2) query heads p_0, p_1 of one key/value head; the value rows are loaded once for both. The keys
 * come in two segments (`gk_seg`): p_a holds segment A's ctx weights, then segment B's. */
static inline void values32(const float *p0, const float *p1, int two, gk_seg A, gk_seg B, int64_t hd,
                            int64_t e, float inv0, float inv1, float *o0, float *o1) {
    __m256 a[4], b[4];
    for (int u = 0; u < 4; u++) a[u] = b[u] = _mm256_setzero_ps();
    for (int part = 0; part < 2; part++) {
        const float *V = part ? B.V : A.V, *w0s = part ? p0 + A.ctx : p0, *w1s = part ? p1 + A.ctx : p1;
        for (int64_t j = 0, ctx = part ? B.ctx : A.ctx; j < ctx; j++) {
            const float *v = V + j * hd + e;
            __m256 w0 = _mm256_broadcast_ss(w0s + j);
            for (int u = 0; u < 4; u++) a[u] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v + 8 * u), a[u]);
            if (two) {
                __m256 w1 = _mm256_broadcast_ss(w1s + j);
                for (int u = 0; u < 4; u++) b[u] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(v + 8 * u), b[u]);
            }
        }
    }
    for (int u = 0; u < 4; u++) _mm256_storeu_ps(o0 + e + 8 * u, _mm256_mul_ps(a[u], _mm256_set1_ps(inv0)));
    if (two)
        for (int u = 0; u < 4; u++) _mm256_storeu_ps(o1 + e + 8 * u, _mm256_mul_ps(b[u], _mm256_set1_ps(inv1)));
}
#endif

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

/* Scores of the `group` query heads q [group, hd] against segment S's keys: sc[a * tot + off + j] =
 * q_a . K_j * scale (-inf where masked); mx[a] keeps each head's running maximum. */
static inline __attribute__((always_inline)) void seg_scores(
        const float *q, int64_t group, const int64_t hd, gk_seg S, float scale, float *sc, int64_t tot,
        int64_t off, float *mx) {
    int64_t j0 = 0;
#ifdef GK_AVX2
    if (hd % 8 == 0) {  /* keys 8 at a time; the rest (ctx % 8) below */
        for (int64_t a = 0; a < group; a++) {
            __m256 vmx = _mm256_set1_ps(-INFINITY);
            for (int64_t j = 0; j + 8 <= S.ctx; j += 8) {
                __m256 d = scores8(q + a * hd, S.K + j * hd, S.m + j, hd, scale);
                _mm256_storeu_ps(sc + a * tot + off + j, d);
                vmx = _mm256_max_ps(vmx, d);
            }
            float v[8];
            _mm256_storeu_ps(v, vmx);
            for (int u = 0; u < 8; u++) mx[a] = v[u] > mx[a] ? v[u] : mx[a];
        }
        j0 = S.ctx - S.ctx % 8;
    }
#endif
    for (int64_t j = j0; j < S.ctx; j++) {
        const float *k = S.K + j * hd;
        for (int64_t a = 0; a < group; a++) {
            float d = S.m[j] ? dot(q + a * hd, k, hd) * scale : -INFINITY;
            sc[a * tot + off + j] = d;
            mx[a] = d > mx[a] ? d : mx[a];
        }
    }
}

/* The `group` query heads q [group, hd] that share one key/value head attend over the keys of segments A
 * then B (B.ctx may be 0; at least one key is attended): head a's output goes to o + a * ostride, and when
 * lse is not NULL, log sum_j e^(s_j) to lse[a * lstride]. sc: [group, A.ctx + B.ctx] scratch. Inlined per
 * head size (below), so that for the usual sizes the loops over hd have a constant trip count. */
static inline __attribute__((always_inline)) void attend_heads(
        const float *q, int64_t group, const int64_t hd, gk_seg A, gk_seg B, float scale, float *sc, float *o,
        int64_t ostride, float *lse, int64_t lstride) {
    float mx[group], inv[group];
    int64_t ctx = A.ctx + B.ctx;
    for (int64_t a = 0; a < group; a++) mx[a] = -INFINITY;
    seg_scores(q, group, hd, A, scale, sc, ctx, 0, mx);
    if (B.ctx) seg_scores(q, group, hd, B, scale, sc, ctx, A.ctx, mx);
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
                values32(sc + a * ctx, p1, two, A, B, hd, e, inv[a], two ? inv[a + 1] : 0.0f, o + a * ostride,
                         o + (a + two) * ostride);
        }
        return;
    }
#endif
    for (int64_t a = 0; a < group; a++) {
        float acc[hd], *p = sc + a * ctx;
        for (int64_t e = 0; e < hd; e++) acc[e] = 0.0f;
        for (int64_t j = 0; j < ctx; j++) {
            const float w = p[j], *v = j < A.ctx ? A.V + j * hd : B.V + (j - A.ctx) * hd;
            for (int64_t e = 0; e < hd; e++) acc[e] += w * v[e];
        }
        for (int64_t e = 0; e < hd; e++) o[a * ostride + e] = acc[e] * inv[a];
    }
}

/* CALL(HD) with HD a constant for the usual head sizes (the loops over hd then have a fixed trip count), else hd. */
#define GK_BY_HEAD_SIZE(hd, CALL) \
    switch (hd) { case 32: CALL(32); break; case 64: CALL(64); break; case 128: CALL(128); break; default: CALL(hd); }

#endif
