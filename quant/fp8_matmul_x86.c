/*
 * fp8_matmul_x86.c - the AVX2+FMA and AVX-512F FP8 (e4m3) matmul kernels
 * (issue #23), chosen at run time by matmul.c (quant_force_path). What they
 * are: register-tiled kernels that give every output element the reference
 * order of quant.h, bit for bit: 16 lanes (k mod 16), per 128-column group
 * p = fma(x, w, p) from zero, then acc = fma(p, scale_inv (* xs), acc), one
 * fixed lane tree. So they are bit-identical to the portable path and to the
 * old F16C kernel (path avx2-v0), whatever the tile, batch or row split.
 *
 * The e4m3 decode, exact for every byte but NaN (which no QuantFp8 holds:
 * checkpoint loading rejects 0x7f / 0xff and quantization saturates):
 * sign-extend the byte to 32 bits, shift left by 20 and keep bit 31 and
 * bits 20-26, which puts the sign in the f32 sign, the 4 exponent bits in
 * the low bits of the f32 exponent and the 3 mantissa bits on top of the f32
 * mantissa; times 2^120 (exact) that is the e4m3 value: normals 2^(e-7) *
 * 1.m, and e = 0 lands on an f32 subnormal m * 2^-129, which becomes
 * m * 2^-9. Zero stays zero with its sign. Four instructions per vector
 * (load-and-extend, shift, and, mul) against ten for the F16C route. This
 * needs the MXCSR denormals-are-zero bit clear, the default (nothing in the
 * project sets it).
 *
 * One shape for every token count: weights decoded in place from the e4m3
 * bytes, a block of rows at a time (its bytes stay in L1 while every token
 * tile passes over them), the next block prefetched. There are no packed f32
 * panels as in the bf16 GEMM (kernels/cpu/cpu_matmul_x86.c): decoding a block
 * once into an f32 panel and running the tiles over the panel was measured
 * slower than decoding in place at every token count from 2 to 256 (one
 * thread, 3072 x 1024: AVX-512 45-54 against 59-68 G multiply-adds/s; AVX2
 * about equal), since a panel tile loads four times the bytes per weight and
 * the decode's integer ops run beside the FMAs. (bench/RESULTS.md, #23.)
 *
 * What they are not: an int8 / VNNI dot product (it would sum products
 * inside a lane in another order, or exactly, and give other bits than the
 * reference the CUDA kernels are checked against), nor the NVFP4 kernel
 * (matmul.c).
 */
#include "fp8_matmul.h"

#if (defined(__x86_64__) || defined(__i386__)) && !defined(QUANT_NO_SIMD)
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#define A2_INL __attribute__((target("avx2,fma"), always_inline)) static inline
#define A2_NOINL __attribute__((target("avx2,fma"), noinline)) static void
#define A2_FN __attribute__((target("avx2,fma")))
#define A5_INL __attribute__((target("avx512f,avx2,fma"), always_inline)) static inline
#define A5_FN __attribute__((target("avx512f,avx2,fma")))

#define GROUP QUANT_FP8_GROUP
#define E4M3_KEEP ((int)0x87f00000u) /* sign and bits 20-26 of the shifted byte */

static inline int imin(int a, int b) { return a < b ? a : b; }

/* ---------------- AVX-512F ---------------- */

/* 16 e4m3 bytes as their values times 2^-120, before the multiply (e = 0: an
 * f32 subnormal, which an FMA takes exactly with MXCSR's DAZ clear). */
A5_INL __m512 e4m3x16_512_s(const uint8_t *q) {
    __m512i v = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q));
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(v, 20), _mm512_set1_epi32(E4M3_KEEP)));
}

A5_INL __m512 e4m3x16_512(const uint8_t *q) { return _mm512_mul_ps(e4m3x16_512_s(q), _mm512_set1_ps(0x1p120f)); }

/* The last m < 16 bytes of a row, zero-padded (the reference pads with zeros). */
A5_INL __m512 e4m3x16_512_tail(const uint8_t *q, int m, int scaled) {
    uint8_t b[16] = {0};
    memcpy(b, q, (size_t)m);
    return scaled ? e4m3x16_512_s(b) : e4m3x16_512(b);
}

/* The reference lane tree: l[i] = a[i] + a[i + 8], m[i] = l[i] + l[i + 4], (m0 + m2) + (m1 + m3). */
A5_INL float hsum16_512(__m512 a) {
    __m256 l = _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(l), _mm256_extractf128_ps(l, 1));
    __m128 h = _mm_add_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* R rows from r0 x T tokens from t0 (R <= 8, T <= 3, R * T <= 12), the
 * weights decoded in place. pf: the next block of rows to prefetch (R / 4
 * lines a step) or NULL.
 *
 * S (scaled, only with xs, where x is quant_act_fp8's xq: e4m3 values, 0 or
 * 2^-9 <= |x| <= 448): the weights are decoded without their multiply by
 * 2^120 (w' = w 2^-120) and x is taken times 2^112 instead (one multiply per
 * x vector, shared by the R rows, where the decode had one per weight
 * vector: a decode step is a fifth fewer vector ops). Every product is then
 * x w 2^-8 and every partial sum p' = p 2^-8 exactly: rounding commutes with
 * a power of two while nothing is subnormal, and every nonzero exact sum of
 * products of e4m3 values is a multiple of 2^-18, so |p'| >= 2^-26 (and
 * x 2^112 <= 448 2^112 < 2^121: no overflow). The group's scale is then
 * applied as fma(p', sc 2^8, acc): p' sc 2^8 = p sc exactly, so acc gets the
 * reference's bits; where sc 2^8 would overflow (|sc| >= 2^120, or sc not
 * finite) it is fma(p' 2^8, sc, acc), p' 2^8 = p exactly. */
A5_INL void tile512(const int R, const int T, float *out, const float *x, const float *xs, const QuantFp8 *w,
                    int r0, int t0, const char *pf, const int S) {
    int cols = w->cols, ng = quant_fp8_groups(cols);
    const uint8_t *q = w->q + (size_t)r0 * cols;
    const float *xt = x + (size_t)t0 * cols;
    const float *srow[8];
    __m512 acc[8][3], p[8][3], wv[8];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) srow[r] = w->scale_inv + (size_t)((r0 + r) / w->block_rows) * w->scale_cols;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    for (int g = 0; g < ng; g++) {
        int c0 = g * GROUP, c1 = imin(c0 + GROUP, cols), k = c0;
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
#pragma GCC unroll 3
            for (int t = 0; t < T; t++) p[r][t] = _mm512_setzero_ps();
        for (; k + 16 <= c1; k += 16) {
            if (pf) {
                size_t s = (size_t)(k >> 4);
#pragma GCC unroll 2
                for (int i = 0; i < (R + 3) / 4; i++) _mm_prefetch(pf + (s * ((R + 3) / 4) + i) * 64, _MM_HINT_T0);
            }
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) wv[r] = S ? e4m3x16_512_s(q + (size_t)r * cols + k) : e4m3x16_512(q + (size_t)r * cols + k);
#pragma GCC unroll 3
            for (int t = 0; t < T; t++) {
                __m512 xv = _mm512_loadu_ps(xt + (size_t)t * cols + k);
                if (S) xv = _mm512_mul_ps(xv, _mm512_set1_ps(0x1p112f));
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) p[r][t] = _mm512_fmadd_ps(xv, wv[r], p[r][t]);
            }
        }
        if (k < c1) { /* the row's last, partial step: zeros past the end, like the reference */
            __mmask16 m = (__mmask16)((1u << (c1 - k)) - 1);
            for (int r = 0; r < R; r++) wv[r] = e4m3x16_512_tail(q + (size_t)r * cols + k, c1 - k, S);
            for (int t = 0; t < T; t++) {
                __m512 xv = _mm512_maskz_loadu_ps(m, xt + (size_t)t * cols + k);
                if (S) xv = _mm512_mul_ps(xv, _mm512_set1_ps(0x1p112f));
                for (int r = 0; r < R; r++) p[r][t] = _mm512_fmadd_ps(xv, wv[r], p[r][t]);
            }
        }
        int cb = c0 / w->block_cols;
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
#pragma GCC unroll 3
            for (int t = 0; t < T; t++) {
                float sc = srow[r][cb];
                if (xs) sc *= xs[(size_t)(t0 + t) * ng + g];
                if (!S) acc[r][t] = _mm512_fmadd_ps(p[r][t], _mm512_set1_ps(sc), acc[r][t]);
                else if (fabsf(sc) < 0x1p120f) acc[r][t] = _mm512_fmadd_ps(p[r][t], _mm512_set1_ps(sc * 0x1p8f), acc[r][t]);
                else acc[r][t] = _mm512_fmadd_ps(_mm512_mul_ps(p[r][t], _mm512_set1_ps(0x1p8f)), _mm512_set1_ps(sc), acc[r][t]);
            }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) out[(size_t)(t0 + t) * w->rows + r0 + r] = hsum16_512(acc[r][t]);
}

/* One token: 8-row blocks (8 accumulators, 8 partial sums); more tokens:
 * 4-row blocks against 3-token tiles (12 + 12, 4 weight vectors, one x
 * vector; measured best of 4x3, 3x4, 2x6, 5x2, 6x2 and 8x1). The next block
 * is prefetched during its first tile, also past the task's end (the next
 * task's rows, as in the bf16 kernels: without it one thread streamed 12 GB/s
 * instead of 27 at n = 1). */
A5_FN void quant_fp8_rows_avx512(float *out, const float *x, const float *xs, const QuantFp8 *w, int n, int rb,
                                 int re) {
    int r = rb, cols = w->cols;
#define PF(R) ((const char *)(w->q + (size_t)(r + (R)) * cols))
    if (n == 1 && xs) { /* decode with quantized activations: the scaled decode (tile512's S) */
        for (; r + 8 <= re; r += 8) tile512(8, 1, out, x, xs, w, r, 0, PF(8), 1);
        for (; r + 4 <= re; r += 4) tile512(4, 1, out, x, xs, w, r, 0, NULL, 1);
        for (; r < re; r++) tile512(1, 1, out, x, xs, w, r, 0, NULL, 1);
        return;
    }
    if (n == 1) {
        for (; r + 8 <= re; r += 8) tile512(8, 1, out, x, xs, w, r, 0, PF(8), 0);
    } else {
        for (; r + 4 <= re; r += 4) {
            int t = 0;
            for (; t + 3 <= n; t += 3) tile512(4, 3, out, x, xs, w, r, t, t ? NULL : PF(4), 0);
            if (n - t == 2) tile512(4, 2, out, x, xs, w, r, t, t ? NULL : PF(4), 0);
            else if (n - t == 1) tile512(4, 1, out, x, xs, w, r, t, NULL, 0);
        }
    }
#undef PF
    for (; r + 4 <= re; r += 4)
        for (int t = 0; t < n; t++) tile512(4, 1, out, x, xs, w, r, t, NULL, 0);
    for (; r < re; r++)
        for (int t = 0; t < n; t++) tile512(1, 1, out, x, xs, w, r, t, NULL, 0);
}

/* ---------------- AVX2 ---------------- */

/* 16 e4m3 bytes as lanes 0-7 (*lo) and 8-15 (*hi), as e4m3x16_512. */
A2_INL void e4m3x16_avx2(const uint8_t *q, __m256 *lo, __m256 *hi) {
    const __m256i keep = _mm256_set1_epi32(E4M3_KEEP);
    const __m256 k = _mm256_set1_ps(0x1p120f);
    __m256i a = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q));
    __m256i b = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8)));
    *lo = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(a, 20), keep)), k);
    *hi = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(b, 20), keep)), k);
}

A2_INL void e4m3x16_avx2_tail(const uint8_t *q, int m, __m256 *lo, __m256 *hi) {
    uint8_t b[16] = {0};
    memcpy(b, q, (size_t)m);
    e4m3x16_avx2(b, lo, hi);
}

/* The reference lane tree over lanes 0-7 (a) and 8-15 (b). */
A2_INL float hsum16_avx2(__m256 a, __m256 b) {
    __m256 l = _mm256_add_ps(a, b);
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(l), _mm256_extractf128_ps(l, 1));
    __m128 h = _mm_add_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* Lanes lo..lo+7 of a partial step of m valid columns: mask of lanes < m. */
A2_INL __m256i tail_mask(int m, int lo) {
    __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(m - lo), idx);
}

/* As tile512 with each 16-lane vector in two ymm halves (R * T <= 3). */
A2_INL void tile_avx2(const int R, const int T, float *out, const float *x, const float *xs, const QuantFp8 *w,
                      int r0, int t0, const char *pf) {
    int cols = w->cols, ng = quant_fp8_groups(cols);
    const uint8_t *q = w->q + (size_t)r0 * cols;
    const float *xt = x + (size_t)t0 * cols;
    const float *srow[3];
    __m256 acc[3][3][2], p[3][3][2], wv[3][2];
#pragma GCC unroll 3
    for (int r = 0; r < R; r++) srow[r] = w->scale_inv + (size_t)((r0 + r) / w->block_rows) * w->scale_cols;
#pragma GCC unroll 3
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) acc[r][t][0] = acc[r][t][1] = _mm256_setzero_ps();
    for (int g = 0; g < ng; g++) {
        int c0 = g * GROUP, c1 = imin(c0 + GROUP, cols), k = c0;
#pragma GCC unroll 3
        for (int r = 0; r < R; r++)
#pragma GCC unroll 3
            for (int t = 0; t < T; t++) p[r][t][0] = p[r][t][1] = _mm256_setzero_ps();
        for (; k + 16 <= c1; k += 16) {
            if (pf) _mm_prefetch(pf + (size_t)k * R, _MM_HINT_T0); /* R * 16 bytes a step */
#pragma GCC unroll 3
            for (int r = 0; r < R; r++) e4m3x16_avx2(q + (size_t)r * cols + k, &wv[r][0], &wv[r][1]);
#pragma GCC unroll 3
            for (int t = 0; t < T; t++) {
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    __m256 xv = _mm256_loadu_ps(xt + (size_t)t * cols + k + 8 * h);
#pragma GCC unroll 3
                    for (int r = 0; r < R; r++) p[r][t][h] = _mm256_fmadd_ps(xv, wv[r][h], p[r][t][h]);
                }
            }
        }
        if (k < c1) {
            for (int r = 0; r < R; r++) e4m3x16_avx2_tail(q + (size_t)r * cols + k, c1 - k, &wv[r][0], &wv[r][1]);
            for (int t = 0; t < T; t++)
                for (int h = 0; h < 2; h++) {
                    __m256 xv = _mm256_maskload_ps(xt + (size_t)t * cols + k + 8 * h, tail_mask(c1 - k, 8 * h));
                    for (int r = 0; r < R; r++) p[r][t][h] = _mm256_fmadd_ps(xv, wv[r][h], p[r][t][h]);
                }
        }
        int cb = c0 / w->block_cols;
#pragma GCC unroll 3
        for (int r = 0; r < R; r++)
#pragma GCC unroll 3
            for (int t = 0; t < T; t++) {
                float sc = srow[r][cb];
                if (xs) sc *= xs[(size_t)(t0 + t) * ng + g];
                __m256 sv = _mm256_set1_ps(sc);
                acc[r][t][0] = _mm256_fmadd_ps(p[r][t][0], sv, acc[r][t][0]);
                acc[r][t][1] = _mm256_fmadd_ps(p[r][t][1], sv, acc[r][t][1]);
            }
    }
#pragma GCC unroll 3
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int t = 0; t < T; t++)
            out[(size_t)(t0 + t) * w->rows + r0 + r] = hsum16_avx2(acc[r][t][0], acc[r][t][1]);
}

/* One token: row pairs (8 accumulators and partial sums in the 16 ymm
 * registers); more: one row against 3-token tiles (measured best of 2x1, 1x4,
 * 2x2 and 1x3 from 4 tokens up). The next block prefetched in its first tile. */
A2_FN void quant_fp8_rows_avx2(float *out, const float *x, const float *xs, const QuantFp8 *w, int n, int rb,
                               int re) {
    int r = rb, cols = w->cols;
    if (n == 1) {
        for (; r + 2 <= re; r += 2) tile_avx2(2, 1, out, x, xs, w, r, 0, (const char *)(w->q + (size_t)(r + 2) * cols));
        if (r < re) tile_avx2(1, 1, out, x, xs, w, r, 0, NULL);
        return;
    }
    for (; r < re; r++) {
        const char *pf = (const char *)(w->q + (size_t)(r + 1) * cols);
        int t = 0;
        for (; t + 3 <= n; t += 3) tile_avx2(1, 3, out, x, xs, w, r, t, t ? NULL : pf);
        if (n - t == 2) tile_avx2(1, 2, out, x, xs, w, r, t, t ? NULL : pf);
        else if (n - t == 1) tile_avx2(1, 1, out, x, xs, w, r, t, NULL);
    }
}

#endif
