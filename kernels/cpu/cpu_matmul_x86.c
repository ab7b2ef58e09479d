/*
 * cpu_matmul_x86.c - the AVX2+FMA and AVX-512F bf16 matmul kernels (issue
 * #23), chosen at run time by cpu_ops.c. What they are: register-blocked
 * kernels that give every output element the reference order of cpu_ops.h
 * (8 f32 lanes, lane j accumulating k = j, j + 8, ... by FMA, one fixed
 * horizontal sum, an FMA tail), so they are bit-identical to each other, to
 * the portable path and to the old kernel, and batch invariant: the tile a
 * (row, token) pair lands in changes which registers hold its lanes, never
 * the operations on them.
 *
 * What they are not: a bf16 dot-product (vdpbf16ps) or AMX kernel. Those
 * round the activations to bf16 and sum pairs of products inside a lane, so
 * they cannot give the reference bits, and the CUDA kernels are checked
 * against those bits (tests/gpu/op_checks.h). On Zen 4 a 512-bit FMA issues at
 * half the rate of a 256-bit one, so AVX-512F does not raise the f32 FMA peak;
 * what it buys is fewer instructions (loads, conversions) per FMA.
 *
 * Two shapes per ISA:
 * - few tokens (decode, decode batches; < 7 tokens on AVX2, < 64 on AVX-512):
 *   weights read in place as bf16,
 *   a block of rows at a time with the next block software-prefetched;
 * - many tokens (prefill, big decode batches): each block of rows widened once
 *   per block of tokens into an f32 panel laid out in the order the kernel
 *   reads it (BLIS-style packing), then register tiles of rows x tokens.
 * AVX-512 holds two rows in one zmm (lanes 0-7 row r, 8-15 row r + 1) against
 * the token's 8 activations broadcast to both halves: the per-lane arithmetic
 * is exactly the AVX2 one.
 */
#include "cpu_matmul.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>
#include <stddef.h>

#include "dtype.h"

#define AVX2_FN __attribute__((target("avx2,fma")))
#define AVX2_INL __attribute__((target("avx2,fma"), always_inline)) static inline
/* Out of line: called by both paths, one copy (the tiles inline into it). */
#define AVX2_NOINL __attribute__((target("avx2,fma"), noinline)) static void
#define AVX512_FN __attribute__((target("avx512f,avx2,fma")))
#define AVX512_INL __attribute__((target("avx512f,avx2,fma"), always_inline)) static inline

#define PANEL_MAX_K 16384     /* wider rows are read in place, never packed */
#define GEMM_MIN_TOKENS 7     /* AVX2, fewer tokens: bf16 read in place (one tile of up to 6 tokens) */
/* AVX-512, fewer tokens: bf16 read in place, 8-row blocks against 6-token tiles.
 * The block (16-48 KB) stays in L1/L2 across the tiles, so its weights come from
 * memory once, and widening them per tile cost less than packing the panel up
 * to ~128 tokens (matmuls of Qwen3-0.6B's shapes, 8 layers, in-place vs packed,
 * alternating runs on the 2-core Zen 5 VM under load: n = 8 43-50 vs 102-105 ms,
 * 16 62-70 vs 82-131, 32 126-130 vs 178-185, 64 234-245 vs 267-269, 128 469-509
 * vs 508-519; 2 threads alike; bench/RESULTS.md). Which path runs never changes
 * a bit (cpu_ops.h). The AVX2 in-place tiles are 2 rows wide and lose to the
 * packed GEMM from 8 tokens on, hence its threshold of 7. */
#define GEMM_MIN_TOKENS_AVX512 64

/* ---------------- shared pieces (AVX2 encoding) ---------------- */

AVX2_INL __m256 bf16x8(const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* The K % 8 tail of one (row, token) pair, after the lanes are summed. */
AVX2_INL float tail(float s, const uint16_t *wr, const float *xt, int k, int K) {
    for (; k < K; k++) s = fmaf(bf16_to_f32(wr[k]), xt[k], s);
    return s;
}

/* ---------------- AVX2 ---------------- */

/* R rows x T tokens, weights as bf16 in place (wf32 = 0: row rr at
 * w + rr * K) or as a packed panel (wf32 = 1: step s, row rr at
 * panel + (s * R + rr) * 8). pf: the next block to prefetch, R/4 lines a step. */
AVX2_INL void tile_avx2(int R, int T, float *out, int ldo, const float *x, int ldx, const uint16_t *w,
                        const float *panel, int wf32, int K, const char *pf) {
    __m256 acc[4][6];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    int S = K / 8;
    for (int s = 0; s < S; s++) {
        if (pf) _mm_prefetch(pf + (size_t)s * 64, _MM_HINT_T0);
        __m256 wv[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            wv[r] = wf32 ? _mm256_loadu_ps(panel + ((size_t)s * R + r) * 8) : bf16x8(w + (size_t)r * K + (size_t)s * 8);
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            __m256 xv = _mm256_loadu_ps(x + (size_t)t * ldx + (size_t)s * 8);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++)
            out[(size_t)t * ldo + r] = tail(cpu_hsum8(acc[r][t]), w + (size_t)r * K, x + (size_t)t * ldx, S * 8, K);
}

/* Widens R rows of bf16 into the panel layout tile_avx2 reads. */
AVX2_INL void pack_avx2(float *panel, const uint16_t *w, int K, int R) {
    int S = K / 8;
    for (int s = 0; s < S; s++)
        for (int r = 0; r < R; r++) _mm256_storeu_ps(panel + ((size_t)s * R + r) * 8, bf16x8(w + (size_t)r * K + (size_t)s * 8));
}

/* One out-of-line function per tile shape the paths run, R x T rows x tokens,
 * weights in place (b) or from the panel (p), called directly or through the
 * tables below. Inlined into the paths' loops, the 34 shapes made this file's
 * three paths three huge functions whose compile time grows faster than their
 * size (gcc 12 -O2: 13 s, under ASan + UBSan 79 s; out of line 5 s and 39 s);
 * a tile runs K / 8 steps, so the call costs nothing measurable. */
typedef void (*TileFn)(float *out, int ldo, const float *x, int ldx, const uint16_t *w, const float *panel, int K,
                       const char *pf);
#define TILE_AVX2(SRC, WF32, R, T)                                                                                 \
    __attribute__((target("avx2,fma"), noinline)) static void tile_avx2_##SRC##R##x##T(                          \
        float *out, int ldo, const float *x, int ldx, const uint16_t *w, const float *panel, int K, const char *pf) { \
        tile_avx2(R, T, out, ldo, x, ldx, w, panel, WF32, K, pf);                                                   \
    }
TILE_AVX2(b, 0, 4, 1) TILE_AVX2(b, 0, 4, 2) TILE_AVX2(b, 0, 4, 3) TILE_AVX2(b, 0, 1, 1)
TILE_AVX2(b, 0, 2, 1) TILE_AVX2(b, 0, 2, 2) TILE_AVX2(b, 0, 2, 3) TILE_AVX2(b, 0, 2, 4) TILE_AVX2(b, 0, 2, 5)
TILE_AVX2(b, 0, 2, 6)
TILE_AVX2(p, 1, 3, 1) TILE_AVX2(p, 1, 3, 2) TILE_AVX2(p, 1, 3, 3) TILE_AVX2(p, 1, 3, 4)
TILE_AVX2(p, 1, 2, 1) TILE_AVX2(p, 1, 2, 2) TILE_AVX2(p, 1, 2, 3) TILE_AVX2(p, 1, 2, 4)
TILE_AVX2(p, 1, 1, 1) TILE_AVX2(p, 1, 1, 2) TILE_AVX2(p, 1, 1, 3) TILE_AVX2(p, 1, 1, 4)
#undef TILE_AVX2
/* [T]: row pairs, weights in place; [R][T]: panel tiles */
static const TileFn g_small_avx2[7] = {NULL, tile_avx2_b2x1, tile_avx2_b2x2, tile_avx2_b2x3, tile_avx2_b2x4,
                                       tile_avx2_b2x5, tile_avx2_b2x6};
static const TileFn g_gemm_avx2[4][5] = {
    {NULL},
    {NULL, tile_avx2_p1x1, tile_avx2_p1x2, tile_avx2_p1x3, tile_avx2_p1x4},
    {NULL, tile_avx2_p2x1, tile_avx2_p2x2, tile_avx2_p2x3, tile_avx2_p2x4},
    {NULL, tile_avx2_p3x1, tile_avx2_p3x2, tile_avx2_p3x3, tile_avx2_p3x4},
};

/* Few tokens, bf16 in place: up to 3 tokens against 4-row blocks (the next
 * block prefetched), more against row pairs, 6 tokens a tile. */
AVX2_NOINL small_avx2(float *out, int ldo, const float *x, int ldx, int n, const uint16_t *w, int K, int r0,
                         int r1) {
    int r = r0;
#define AT(SHAPE, t, pf) SHAPE(out + (size_t)(t) * ldo + r, ldo, x + (size_t)(t) * ldx, ldx, w + (size_t)r * K, NULL, K, pf)
    if (n <= 3) {
        for (; r + 4 <= r1; r += 4) {
            /* The next block, also past the task's end: with one thread the next
             * task is those rows (stopping at the end read 0.8-0.96x the old
             * kernel's decode in alternating bench_matmul runs). */
            const char *pf = (const char *)(w + (size_t)(r + 4) * K);
            if (n == 1) AT(tile_avx2_b4x1, 0, pf);
            else if (n == 2) AT(tile_avx2_b4x2, 0, pf);
            else AT(tile_avx2_b4x3, 0, pf);
        }
    } else {
        for (; r + 2 <= r1; r += 2)
            for (int t = 0; t < n; t += 6) AT(g_small_avx2[n - t < 6 ? n - t : 6], t, NULL);
    }
    for (; r < r1; r++)
        for (int t = 0; t < n; t++) AT(tile_avx2_b1x1, t, NULL);
#undef AT
}

/* Per-thread panel: [K / 8][rows of a block][8] per block, blocks back to back. */
#define PANEL_FLOATS (8 * PANEL_MAX_K)
static __thread float g_panel[PANEL_FLOATS];

/* Rows of the task that fit the panel at once: a multiple of 8. */
static int chunk_rows(int K) { return PANEL_FLOATS / K / 8 * 8; }

/* Many tokens: each chunk of rows widened once into the panel (3-row blocks
 * [K / 8][3][8]); then for each 4-token tile (its x rows stay in L1) every
 * block of the chunk (the panel streams from L2). 3 x 4 tiles: 12
 * accumulators, 3 weight vectors and one x vector fill the 16 ymm registers,
 * 7 loads per 12 FMAs. */
AVX2_NOINL gemm_avx2(float *out, int ldo, const float *x, int ldx, int n, const uint16_t *w, int K, int r0,
                        int r1) {
    int S = K / 8, cr = chunk_rows(K);
    for (int c0 = r0; c0 < r1; c0 += cr) {
        int c1 = c0 + cr < r1 ? c0 + cr : r1;
        for (int r = c0; r < c1; r += 3) pack_avx2(g_panel + (size_t)(r - c0) * S * 8, w + (size_t)r * K, K, c1 - r < 3 ? c1 - r : 3);
        for (int t = 0; t < n; t += 4) {
            int T = n - t < 4 ? n - t : 4;
            for (int r = c0; r < c1; r += 3) {
                const float *pn = g_panel + (size_t)(r - c0) * S * 8;
                const uint16_t *wr = w + (size_t)r * K;
                g_gemm_avx2[c1 - r < 3 ? c1 - r : 3][T](out + (size_t)t * ldo + r, ldo, x + (size_t)t * ldx, ldx, wr, pn,
                                                         K, NULL);
            }
        }
    }
}

AVX2_FN void cpu_matmul_avx2(float *out, int ldo, const float *x, int ldx, int n, const uint16_t *w, int K, int r0,
                             int r1) {
    if (n < GEMM_MIN_TOKENS || K > PANEL_MAX_K) small_avx2(out, ldo, x, ldx, n, w, K, r0, r1);
    else gemm_avx2(out, ldo, x, ldx, n, w, K, r0, r1);
}

/* ---------------- AVX-512F ---------------- */

AVX512_INL __m512 bcast8(const float *p) {
    return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(p))));
}

/* Rows r and r + 1 (8 bf16 each at the same k) widened into one zmm. */
AVX512_INL __m512 bf16x8x2(const uint16_t *a, const uint16_t *b) {
    __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                                        _mm_loadu_si128((const __m128i *)b), 1);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

AVX512_INL __m256 lo256(__m512 v) { return _mm512_castps512_ps256(v); }
AVX512_INL __m256 hi256(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

/* P row pairs (2P rows) x T tokens. wf32 = 0: bf16 in place; wf32 = 1:
 * panel, step s, pair p at panel + (s * P + p) * 16. pf: next block, P/2
 * lines a step. */
AVX512_INL void tile_avx512(int P, int T, float *out, int ldo, const float *x, int ldx, const uint16_t *w,
                            const float *panel, int wf32, int K, const char *pf) {
    __m512 acc[4][6];
#pragma GCC unroll 4
    for (int p = 0; p < P; p++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) acc[p][t] = _mm512_setzero_ps();
    int S = K / 8;
    for (int s = 0; s < S; s++) {
        if (pf) {
#pragma GCC unroll 2
            for (int i = 0; i < (P + 1) / 2; i++) _mm_prefetch(pf + ((size_t)s * ((P + 1) / 2) + i) * 64, _MM_HINT_T0);
        }
        __m512 wv[4];
#pragma GCC unroll 4
        for (int p = 0; p < P; p++)
            wv[p] = wf32 ? _mm512_loadu_ps(panel + ((size_t)s * P + p) * 16)
                         : bf16x8x2(w + (size_t)(2 * p) * K + (size_t)s * 8, w + (size_t)(2 * p + 1) * K + (size_t)s * 8);
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            __m512 xv = bcast8(x + (size_t)t * ldx + (size_t)s * 8);
#pragma GCC unroll 4
            for (int p = 0; p < P; p++) acc[p][t] = _mm512_fmadd_ps(wv[p], xv, acc[p][t]);
        }
    }
#pragma GCC unroll 4
    for (int p = 0; p < P; p++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            const float *xt = x + (size_t)t * ldx;
            out[(size_t)t * ldo + 2 * p] = tail(cpu_hsum8(lo256(acc[p][t])), w + (size_t)(2 * p) * K, xt, S * 8, K);
            out[(size_t)t * ldo + 2 * p + 1] = tail(cpu_hsum8(hi256(acc[p][t])), w + (size_t)(2 * p + 1) * K, xt, S * 8, K);
        }
}

AVX512_INL void pack_avx512(float *panel, const uint16_t *w, int K, int P) {
    int S = K / 8;
    for (int s = 0; s < S; s++)
        for (int p = 0; p < P; p++)
            _mm512_storeu_ps(panel + ((size_t)s * P + p) * 16,
                             bf16x8x2(w + (size_t)(2 * p) * K + (size_t)s * 8, w + (size_t)(2 * p + 1) * K + (size_t)s * 8));
}

/* The AVX-512 tile shapes, out of line as the AVX2 ones: 8 rows (4 pairs) x T
 * tokens, [T] in place (b) and from the panel (p). */
#define TILE_AVX512(SRC, WF32, T)                                                                                  \
    __attribute__((target("avx512f,avx2,fma"), noinline)) static void tile_avx512_##SRC##4x##T(                  \
        float *out, int ldo, const float *x, int ldx, const uint16_t *w, const float *panel, int K, const char *pf) { \
        tile_avx512(4, T, out, ldo, x, ldx, w, panel, WF32, K, pf);                                                 \
    }
TILE_AVX512(b, 0, 1) TILE_AVX512(b, 0, 2) TILE_AVX512(b, 0, 3) TILE_AVX512(b, 0, 4) TILE_AVX512(b, 0, 5)
TILE_AVX512(b, 0, 6)
TILE_AVX512(p, 1, 1) TILE_AVX512(p, 1, 2) TILE_AVX512(p, 1, 3) TILE_AVX512(p, 1, 4) TILE_AVX512(p, 1, 5)
TILE_AVX512(p, 1, 6)
#undef TILE_AVX512
static const TileFn g_small_avx512[7] = {NULL, tile_avx512_b4x1, tile_avx512_b4x2, tile_avx512_b4x3,
                                         tile_avx512_b4x4, tile_avx512_b4x5, tile_avx512_b4x6};
static const TileFn g_gemm_avx512[7] = {NULL, tile_avx512_p4x1, tile_avx512_p4x2, tile_avx512_p4x3,
                                        tile_avx512_p4x4, tile_avx512_p4x5, tile_avx512_p4x6};

/* Few tokens, bf16 in place: 8-row blocks (4 zmm chains a token), up to 6
 * tokens a tile, the next block prefetched while the first tile runs. */
AVX512_INL void small_avx512(float *out, int ldo, const float *x, int ldx, int n, const uint16_t *w, int K, int r0,
                             int r1) {
    /* One or two tokens (batch-1 decode is all of it): the AVX2 4-row blocks stream the weights
     * faster here (bench_matmul, quiet 2-core Zen 5: 35.7 vs 32.2 GB/s at 1 thread, 39.7 vs 35.5 at
     * 2, n = 1); the bits are the same on every path (test_cpu_paths). */
    if (n <= 2) {
        small_avx2(out, ldo, x, ldx, n, w, K, r0, r1);
        return;
    }
    int r = r0;
    for (; r + 8 <= r1; r += 8) {
        const uint16_t *wr = w + (size_t)r * K;
        const char *pf = (const char *)(wr + (size_t)8 * K); /* also past the task's end, as above */
        for (int t = 0; t < n; t += 6, pf = NULL)
            g_small_avx512[n - t < 6 ? n - t : 6](out + (size_t)t * ldo + r, ldo, x + (size_t)t * ldx, ldx, wr, NULL, K,
                                                   pf);
    }
    if (r < r1) small_avx2(out, ldo, x, ldx, n, w, K, r, r1);
}

/* As gemm_avx2, with 8-row blocks packed as row pairs [K / 8][4][16]. */
AVX512_INL void gemm_avx512(float *out, int ldo, const float *x, int ldx, int n, const uint16_t *w, int K, int r0,
                            int r1) {
    int S = K / 8, cr = chunk_rows(K);
    int r8 = r0 + (r1 - r0) / 8 * 8;
    for (int c0 = r0; c0 < r8; c0 += cr) {
        int c1 = c0 + cr < r8 ? c0 + cr : r8;
        for (int r = c0; r < c1; r += 8) pack_avx512(g_panel + (size_t)(r - c0) * S * 8, w + (size_t)r * K, K, 4);
        for (int t = 0; t < n; t += 6) {
            int T = n - t < 6 ? n - t : 6;
            for (int r = c0; r < c1; r += 8) {
                const float *pn = g_panel + (size_t)(r - c0) * S * 8;
                g_gemm_avx512[T](out + (size_t)t * ldo + r, ldo, x + (size_t)t * ldx, ldx, w + (size_t)r * K, pn, K, NULL);
            }
        }
    }
    /* The last rows of a matrix whose row count is not a multiple of 8. */
    if (r8 < r1) gemm_avx2(out, ldo, x, ldx, n, w, K, r8, r1);
}

AVX512_FN void cpu_matmul_avx512(float *out, int ldo, const float *x, int ldx, int n, const uint16_t *w, int K,
                                 int r0, int r1) {
    if (n < GEMM_MIN_TOKENS_AVX512 || K > PANEL_MAX_K) small_avx512(out, ldo, x, ldx, n, w, K, r0, r1);
    else gemm_avx512(out, ldo, x, ldx, n, w, K, r0, r1);
}

#endif
