/*
 * cpu_matmul_bf16.c - the BF16-activation matmul (--dtype bfloat16, issue
 * #23): out[t, r] = sum_k x[t, k] W[r, k] with x already rounded to bf16
 * (cpu_act_to_bf16), in the order of AVX512_BF16's vdpbf16ps, so that a CPU
 * with that instruction runs it natively (two bf16 multiply-adds per f32 lane
 * per instruction: twice the f32 FMA rate) and every other path gives the same
 * bits by emulating it. The reference order (cpu_ops.h states it) is:
 *
 *   16 lanes; for each 32-wide step k0 = 0, 32, .. < K & ~31, lane j does
 *     acc[j] = F(W[k0+2j+1] x[k0+2j+1] + acc[j]);  acc[j] = F(W[k0+2j] x[k0+2j] + acc[j])
 *   v[j] = F(acc[j] + acc[j+8]) (j < 8), s = hsum8(v) (the f32 path's tree, each add F),
 *   s = F(W[k] x[k] + s) for the K % 32 tail,
 *
 * where F is one FMA / add rounded to nearest even whose subnormal result is
 * flushed to a zero of its sign, and a subnormal bf16 input reads as a zero of
 * its sign (vdpbf16ps' DAZ / FTZ, measured on Zen 5 against this definition:
 * 48 M lanes around FLT_MIN and 32 M general, no difference; cpu_ops_init checks
 * the instruction against the portable path once and falls back to emulation
 * when a CPU disagrees). The AVX2 emulation splits each 32-bit pair into its
 * odd element (the high half: `and 0xffff0000` is its f32 value) and its even
 * element (`<< 16`) and issues the two FMAs in that order with MXCSR's FTZ and
 * DAZ set, which is F. Batch invariance as in the f32 path: the tile an
 * output lands in changes which registers hold its lanes, never the operations.
 *
 * What it is not: the f32-activation reference (cpu_ops.c, cpu_matmul_x86.c),
 * which stays the exact path (--dtype float32, and auto on CPUs without
 * AVX512_BF16) that the transformers parity bounds of 1e-4 are measured on;
 * nor an AMX kernel.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "cpu_matmul.h"
#include "dtype.h"

/* ---------------- the reference (portable) ---------------- */

static inline float ftz(float v) { return fabsf(v) < FLT_MIN ? copysignf(0.0f, v) : v; }
static inline float daz(uint16_t h) { return bf16_to_f32((h & 0x7f80u) ? h : (uint16_t)(h & 0x8000u)); }

static inline uint16_t act_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (!(u & 0x7f800000u)) return (uint16_t)((u >> 16) & 0x8000u); /* zero or subnormal: signed zero */
    return f32_to_bf16(f);                                          /* RNE; NaN stays a quiet NaN */
}

/* The K % 32 tail: one F per element in k order. */
static inline float tail_ref(float s, const uint16_t *wr, const uint16_t *xt, int k, int K) {
    for (; k < K; k++) s = ftz(fmaf(daz(wr[k]), daz(xt[k]), s));
    return s;
}

/* The 16 lanes folded and summed, then the tail. */
static float finish_ref(const float *acc, const uint16_t *wr, const uint16_t *xt, int k, int K) {
    float v[8];
    for (int j = 0; j < 8; j++) v[j] = ftz(acc[j] + acc[j + 8]);
    float s = ftz(ftz(ftz(v[0] + v[4]) + ftz(v[2] + v[6])) + ftz(ftz(v[1] + v[5]) + ftz(v[3] + v[7])));
    return tail_ref(s, wr, xt, k, K);
}

void cpu_matmul_bf16_portable(float *out, int ldo, const uint16_t *x, int ldx, int n, const uint16_t *w, int K,
                              int r0, int r1) {
    int K32 = K & ~31;
    for (int t = 0; t < n; t++)
        for (int r = r0; r < r1; r++) {
            const uint16_t *wr = w + (size_t)r * K, *xt = x + (size_t)t * ldx;
            float acc[16] = {0};
            for (int k = 0; k < K32; k += 32)
                for (int j = 0; j < 16; j++) {
                    acc[j] = ftz(fmaf(daz(wr[k + 2 * j + 1]), daz(xt[k + 2 * j + 1]), acc[j]));
                    acc[j] = ftz(fmaf(daz(wr[k + 2 * j]), daz(xt[k + 2 * j]), acc[j]));
                }
            out[(size_t)t * ldo + r] = finish_ref(acc, wr, xt, K32, K);
        }
}

void cpu_act_to_bf16_portable(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = act_bf16(src[i]);
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define AVX2_INL __attribute__((target("avx2,fma"), always_inline)) static inline
#define AVX2_FN __attribute__((target("avx2,fma")))
#define BF16_INL __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma"), always_inline)) static inline
#define BF16_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))

#define MXCSR_FTZ_DAZ 0x8040u
#define TOKEN_BLOCK 48 /* tokens whose x rows (48 x K bf16, <= 288 KB at K = 3072) stay in L2 across a task's rows */

AVX2_INL __m256 odd8(__m256i v) { return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u))); }
AVX2_INL __m256 even8(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
AVX2_INL __m256i ld256(const uint16_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* The K % 32 tail of a tile (k0 = K & ~31) for every path below, vectorised
 * over the tile's T <= 8 tokens: lane t of row r's vector is output (r, t),
 * and each k is one FMA per row in k order under the caller's FTZ + DAZ, the
 * operations of tail_ref. hs[r][t]: the tile's folded and summed lanes (lanes
 * t >= T zero). Only odd widths (K % 32 != 0, e.g. the bundled model's 48)
 * come here: a scalar tail per output made their lm_head ~3x slower than f32. */
AVX2_INL void tail_tile(int R, int T, const float hs[][8], float *out, int ldo, const uint16_t *x, int ldx,
                        const uint16_t *w, int K, int k0) {
    float xt[32][8]; /* [k - k0][t]: the tokens' tail columns, widened */
    int m = K - k0;
    if (T < 8) memset(xt, 0, sizeof xt[0] * (size_t)m);
    for (int t = 0; t < T; t++)
        for (int k = 0; k < m; k++) xt[k][t] = bf16_to_f32(x[(size_t)t * ldx + k0 + k]);
    __m256 s[8];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) s[r] = _mm256_loadu_ps(hs[r]);
    for (int k = 0; k < m; k++) { /* the rows' chains side by side */
        __m256 xv = _mm256_loadu_ps(xt[k]);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            s[r] = _mm256_fmadd_ps(_mm256_set1_ps(bf16_to_f32(w[(size_t)r * K + k0 + k])), xv, s[r]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        float o[8];
        _mm256_storeu_ps(o, s[r]);
        for (int t = 0; t < T; t++) out[(size_t)t * ldo + r] = o[t];
    }
}

/* ---------------- AVX2 emulation ---------------- */

/* R rows x T tokens, R <= 2, T <= 4. Lanes 0-7 (k0 .. k0+15 of each step)
 * run first over all of K, then lanes 8-15; their sums meet in the fold. */
AVX2_INL void tile_e(int R, int T, float *out, int ldo, const uint16_t *x, int ldx, const uint16_t *w, int K,
                     const char *pf) {
    __m256 part[2][4], acc[2][4];
    int S = K / 32;
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
#pragma GCC unroll 2
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
        for (int s = 0; s < S; s++) {
            size_t off = (size_t)s * 32 + (size_t)h * 16;
            if (pf) _mm_prefetch(pf + ((size_t)h * S + (size_t)s) * 32 * R, _MM_HINT_T0); /* the next R rows, a line a step */
            __m256i wv[2];
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) wv[r] = ld256(w + (size_t)r * K + off);
            __m256 wo[2], we[2];
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) wo[r] = odd8(wv[r]);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                __m256 xo = odd8(ld256(x + (size_t)t * ldx + off));
#pragma GCC unroll 2
                for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(wo[r], xo, acc[r][t]);
            }
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) we[r] = even8(wv[r]);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                __m256 xe = even8(ld256(x + (size_t)t * ldx + off));
#pragma GCC unroll 2
                for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(we[r], xe, acc[r][t]);
            }
        }
        if (h == 0) {
#pragma GCC unroll 2
            for (int r = 0; r < R; r++)
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) part[r][t] = acc[r][t];
        }
    }
    if (S * 32 != K) {
        float hs[2][8] = {{0}};
        for (int r = 0; r < R; r++)
            for (int t = 0; t < T; t++) hs[r][t] = cpu_hsum8(_mm256_add_ps(part[r][t], acc[r][t]));
        tail_tile(R, T, hs, out, ldo, x, ldx, w, K, S * 32);
        return;
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) out[(size_t)t * ldo + r] = cpu_hsum8(_mm256_add_ps(part[r][t], acc[r][t]));
}

/* One out-of-line function per tile shape, called through tables ([R][T]):
 * inlined into the paths' loops, the 60 shapes made this file's two paths two
 * huge functions whose compile time grows faster than their size (gcc 12 -O2:
 * 13 s, under ASan + UBSan 125 s, the slowest file of that build; out of line
 * 4 s and 28 s); a tile runs K / 32 steps, so the call costs nothing measurable. */
typedef void (*TileFn)(float *out, int ldo, const uint16_t *x, int ldx, const uint16_t *w, int K, const char *pf);
#define TILE_E(R, T)                                                                                               \
    AVX2_FN static void tile_e##R##x##T(float *out, int ldo, const uint16_t *x, int ldx, const uint16_t *w, int K, \
                                        const char *pf) {                                                          \
        tile_e(R, T, out, ldo, x, ldx, w, K, pf);                                                                  \
    }
TILE_E(1, 1) TILE_E(1, 2) TILE_E(1, 3) TILE_E(1, 4) TILE_E(2, 1) TILE_E(2, 2) TILE_E(2, 3) TILE_E(2, 4)
#undef TILE_E
static const TileFn g_tile_e[3][5] = {
    {NULL},
    {NULL, tile_e1x1, tile_e1x2, tile_e1x3, tile_e1x4},
    {NULL, tile_e2x1, tile_e2x2, tile_e2x3, tile_e2x4},
};

AVX2_FN void cpu_matmul_bf16_avx2(float *out, int ldo, const uint16_t *x, int ldx, int n, const uint16_t *w, int K,
                                  int r0, int r1) {
    unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | MXCSR_FTZ_DAZ);
    for (int t0 = 0; t0 < n; t0 += TOKEN_BLOCK) {
        int t1 = t0 + TOKEN_BLOCK < n ? t0 + TOKEN_BLOCK : n;
        int r = r0;
        for (; r < r1; r += 2) {
            int R = r1 - r < 2 ? 1 : 2;
            const uint16_t *wr = w + (size_t)r * K;
            const char *pf = n <= 4 ? (const char *)(wr + (size_t)2 * K) : NULL;
            for (int t = t0; t < t1; t += 4, pf = NULL)
                g_tile_e[R][t1 - t < 4 ? t1 - t : 4](out + (size_t)t * ldo + r, ldo, x + (size_t)t * ldx, ldx, wr, K, pf);
        }
    }
    _mm_setcsr(csr);
}

AVX2_FN void cpu_act_to_bf16_avx2(uint16_t *dst, const float *src, size_t n) {
    size_t i = 0;
    const __m256i expm = _mm256_set1_epi32(0x7f800000), absm = _mm256_set1_epi32(0x7fffffff),
                  one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff), sign = _mm256_set1_epi32((int)0x80000000u),
                  qnan = _mm256_set1_epi32(0x00400000), inf = _mm256_set1_epi32(0x7f800000);
    for (; i + 8 <= n; i += 8) {
        __m256i u = _mm256_loadu_si256((const __m256i *)(src + i));
        __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absm), inf);
        r = _mm256_blendv_epi8(r, _mm256_or_si256(u, qnan), nan);
        __m256i tiny = _mm256_cmpeq_epi32(_mm256_and_si256(u, expm), _mm256_setzero_si256());
        r = _mm256_blendv_epi8(r, _mm256_and_si256(u, sign), tiny);
        r = _mm256_srli_epi32(r, 16);
        __m128i p = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
        _mm_storeu_si128((__m128i *)(dst + i), p);
    }
    for (; i < n; i++) dst[i] = act_bf16(src[i]);
}

/* ---------------- AVX512_BF16 (vdpbf16ps) ---------------- */

/* v[j] = acc[j] + acc[j + 8]: the fold of the 16 lanes. */
BF16_INL __m256 fold16(__m512 a) {
    return _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

/* cpu_hsum8 of eight vectors at once (under FTZ), the same adds on the same operands:
 * v[2r] is (row r, token t), v[2r + 1] (row r, token t + 1); o0[0..3] and
 * o1[0..3] get rows 0-3 of tokens t and t + 1. Level 1 pairs lanes j and
 * j + 4, level 2 (p0 + p2, p1 + p3), level 3 their sum, as hsum8. */
BF16_INL void hsum8x8_store(const __m256 *v, float *o0, float *o1) {
    __m256 p[4], q[2];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) /* [A.lo + A.hi | B.lo + B.hi], A = v[2i], B = v[2i + 1] */
        p[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31));
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) /* [pA0+pA2, pA1+pA3, pC0+pC2, pC1+pC3 | B, D alike] */
        q[i] = _mm256_add_ps(_mm256_shuffle_ps(p[2 * i], p[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(p[2 * i], p[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* [rows 0, 1, 2, 3 of token t | of token t + 1] */
    __m256 s = _mm256_add_ps(_mm256_shuffle_ps(q[0], q[1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm256_shuffle_ps(q[0], q[1], _MM_SHUFFLE(3, 1, 3, 1)));
    _mm_storeu_ps(o0, _mm256_castps256_ps128(s));
    _mm_storeu_ps(o1, _mm256_extractf128_ps(s, 1));
}

/* R rows x T tokens, R <= 4 and T <= 6 (prefill, batches: 24 accumulators,
 * 4 weight vectors and one x vector of the 32 zmm, 10 loads per 24
 * vdpbf16ps) or R <= 8 and T <= 2 (decode). pf: the next block of R rows,
 * R lines a step in address order. */
BF16_INL void tile_n(int R, int T, float *out, int ldo, const uint16_t *x, int ldx, const uint16_t *w, int K,
                     const char *pf) {
    __m512 acc[8][6];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    int S = K / 32;
    for (int s = 0; s < S; s++) {
        if (pf) {
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) _mm_prefetch(pf + ((size_t)s * R + r) * 64, _MM_HINT_T0);
        }
        __m512i wv[8];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) wv[r] = _mm512_loadu_si512((const void *)(w + (size_t)r * K + (size_t)s * 32));
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            __m512bh xv = (__m512bh)_mm512_loadu_si512((const void *)(x + (size_t)t * ldx + (size_t)s * 32));
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], (__m512bh)wv[r], xv);
        }
    }
    if (S * 32 != K) {
        float hs[8][8] = {{0}};
        int t = 0;
        if (R == 4) { /* eight sums at once into [t][r], then transposed */
            float ts[6][4];
            for (; t + 2 <= T; t += 2) {
                __m256 v[8];
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++) {
                    v[2 * r] = fold16(acc[r][t]);
                    v[2 * r + 1] = fold16(acc[r][t + 1]);
                }
                hsum8x8_store(v, ts[t], ts[t + 1]);
            }
            for (int tt = 0; tt < t; tt++)
                for (int r = 0; r < 4; r++) hs[r][tt] = ts[tt][r];
        }
        for (int r = 0; r < R; r++)
            for (int tt = t; tt < T; tt++) hs[r][tt] = cpu_hsum8(fold16(acc[r][tt]));
        tail_tile(R, T, hs, out, ldo, x, ldx, w, K, S * 32);
        return;
    }
    int t = 0;
    if (R == 4)
#pragma GCC unroll 3
        for (; t + 2 <= T; t += 2) {
            __m256 v[8];
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                v[2 * r] = fold16(acc[r][t]);
                v[2 * r + 1] = fold16(acc[r][t + 1]);
            }
            hsum8x8_store(v, out + (size_t)t * ldo, out + (size_t)(t + 1) * ldo);
        }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 6
        for (int tt = t; tt < T; tt++)
            out[(size_t)tt * ldo + r] = cpu_hsum8(fold16(acc[r][tt]));
}

/* The vdpbf16ps tile shapes, out of line as the AVX2 ones: [R][T], R <= 4, T <= 6. */
#define TILE_N(R, T)                                                                                               \
    BF16_FN static void tile_n##R##x##T(float *out, int ldo, const uint16_t *x, int ldx, const uint16_t *w, int K, \
                                        const char *pf) {                                                          \
        tile_n(R, T, out, ldo, x, ldx, w, K, pf);                                                                  \
    }
#define TILE_N_ROWS(R) TILE_N(R, 1) TILE_N(R, 2) TILE_N(R, 3) TILE_N(R, 4) TILE_N(R, 5) TILE_N(R, 6)
TILE_N_ROWS(1) TILE_N_ROWS(2) TILE_N_ROWS(3) TILE_N_ROWS(4)
#undef TILE_N_ROWS
#undef TILE_N
#define TILE_N_ROW(R) {NULL, tile_n##R##x1, tile_n##R##x2, tile_n##R##x3, tile_n##R##x4, tile_n##R##x5, tile_n##R##x6}
static const TileFn g_tile_n[5][7] = {{NULL}, TILE_N_ROW(1), TILE_N_ROW(2), TILE_N_ROW(3), TILE_N_ROW(4)};
#undef TILE_N_ROW

BF16_FN void cpu_matmul_bf16_avx512bf16(float *out, int ldo, const uint16_t *x, int ldx, int n, const uint16_t *w,
                                        int K, int r0, int r1) {
    unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | MXCSR_FTZ_DAZ); /* the folds and sums; vdpbf16ps itself always flushes */
    if (n <= 2) {
        /* decode: 2-row blocks, the next block prefetched a line at a time in
         * address order (bench_forward batch-1 decode of Qwen3-0.6B, 9
         * alternating reps: 1.01x the f32 path; 4- and 8-row blocks, or each
         * row prefetched as its own stream, ran 0.7-0.9x) */
        int r = r0;
        for (; r + 2 <= r1; r += 2) {
            const uint16_t *wr = w + (size_t)r * K;
            const char *pf = (const char *)(wr + (size_t)2 * K); /* also past the task's end, as the f32 path */
            g_tile_n[2][n](out + r, ldo, x, ldx, wr, K, pf);
        }
        for (; r < r1; r++) g_tile_n[1][n](out + r, ldo, x, ldx, w + (size_t)r * K, K, NULL);
        _mm_setcsr(csr);
        return;
    }
    if (n < 64) {
        for (int r = r0; r < r1; r += 4) {
            int R = r1 - r < 4 ? r1 - r : 4;
            const uint16_t *wr = w + (size_t)r * K;
            /* the next block of rows (also past the task's end, as the f32 path) */
            const char *pf = (const char *)(wr + (size_t)4 * K);
            for (int t = 0; t < n; t += 6, pf = NULL)
                g_tile_n[R][n - t < 6 ? n - t : 6](out + (size_t)t * ldo + r, ldo, x + (size_t)t * ldx, ldx, wr, K, pf);
        }
        _mm_setcsr(csr);
        return;
    }
    /* prefill: each 6-token tile (its x rows in L1) against every 4-row block
     * of the task (from L2). The first tile's pass brings the task's weights in
     * from memory, the next block prefetched a line at a time while this one
     * runs, as above (Qwen3-0.6B's matrices at 64 tokens, weights from DRAM,
     * tasks as backend_cpu.c's, one thread: 1.10x) */
    for (int t = 0; t < n; t += 6) {
        for (int r = r0; r < r1; r += 4) {
            int R = r1 - r < 4 ? r1 - r : 4;
            const uint16_t *wr = w + (size_t)r * K;
            const char *pf = t == 0 && r + 4 < r1 ? (const char *)(wr + (size_t)4 * K) : NULL;
            g_tile_n[R][n - t < 6 ? n - t : 6](out + (size_t)t * ldo + r, ldo, x + (size_t)t * ldx, ldx, wr, K, pf);
        }
    }
    _mm_setcsr(csr);
}

BF16_FN void cpu_act_to_bf16_avx512bf16(uint16_t *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + i)));
    for (; i < n; i++) dst[i] = act_bf16(src[i]);
}
#endif
