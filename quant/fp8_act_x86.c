/*
 * fp8_act_x86.c - AVX2 and AVX-512F dynamic FP8 activation quantization
 * (quant_act_fp8 on the avx2 / avx512 paths, issue #23): per token and
 * 128-column group s = amax / 448 (1 for an all-zero group), xq =
 * e4m3(x / s) as f32, the same bits as act.c's scalar loop over
 * quant_f32_to_e4m3 (cast.c), which it replaces on those paths (it was a
 * tenth of an FP8 prefill). What it is not: the weight quantizer.
 *
 * Per element, for y = x / s (one IEEE division, as the scalar code):
 *   |y| >= 2^-6: round the f32 to 3 mantissa bits, nearest even (add
 *     0x7ffff + the lowest kept bit, clear the 20 low bits), then min with 448
 *     (c10 saturates everything that rounds above 448; the rounding carry into
 *     480 is the scalar code's 0x7f -> 0x7e);
 *   |y| < 2^-6: (|y| + 2^14) - 2^14, a multiple of 2^-9 rounded to nearest
 *     even by the FPU, which is the scalar code's magic-number add;
 *   then the sign of y back on (so -0 and small negatives give -0.0).
 * A group whose scale is not a normal f32 (amax below 448 * 2^-126, where
 * x / s can be infinite or NaN) goes through the scalar code.
 */
#include "fp8_matmul.h"

#if (defined(__x86_64__) || defined(__i386__)) && !defined(QUANT_NO_SIMD)
#include <immintrin.h>
#include <stddef.h>

#define A2_FN __attribute__((target("avx2,fma")))
#define A5_FN __attribute__((target("avx512f,avx2,fma")))

/* The scalar group of act.c, for scales that are not normal. */
static void group_scalar(float *xq, const float *v, int c0, int c1, float s) {
    for (int c = c0; c < c1; c++) xq[c] = quant_e4m3_to_f32(quant_f32_to_e4m3(v[c] / s));
}

A5_FN void quant_act_fp8_avx512(float *xq, float *xs, const float *x, int n, int cols) {
    int ng = quant_fp8_groups(cols);
    const __m512i absm = _mm512_set1_epi32(0x7fffffff), low = _mm512_set1_epi32(0x7ffff), one = _mm512_set1_epi32(1);
    const __m512i keep = _mm512_set1_epi32((int)0xfff00000u);
    const __m512 min_normal = _mm512_set1_ps(0x1p-6f), magic = _mm512_set1_ps(0x1p14f), sat = _mm512_set1_ps(448.0f);
    for (int t = 0; t < n; t++)
        for (int g = 0; g < ng; g++) {
            int c0 = g * QUANT_FP8_GROUP, c1 = c0 + QUANT_FP8_GROUP < cols ? c0 + QUANT_FP8_GROUP : cols;
            const float *v = x + (size_t)t * cols;
            float *o = xq + (size_t)t * cols;
            __m512 mx = _mm512_setzero_ps();
            for (int c = c0; c < c1; c += 16) {
                __mmask16 m = c1 - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (c1 - c)) - 1);
                __m512 a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(_mm512_maskz_loadu_ps(m, v + c)), absm));
                mx = _mm512_max_ps(mx, a);
            }
            float amax = _mm512_reduce_max_ps(mx);
            float s = amax > 0.0f ? amax / QUANT_FP8_MAX : 1.0f;
            xs[(size_t)t * ng + g] = s;
            if (!(s >= 0x1p-126f)) {
                group_scalar(o, v, c0, c1, s);
                continue;
            }
            __m512 sv = _mm512_set1_ps(s);
            for (int c = c0; c < c1; c += 16) {
                __mmask16 m = c1 - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (c1 - c)) - 1);
                __m512i y = _mm512_castps_si512(_mm512_div_ps(_mm512_maskz_loadu_ps(m, v + c), sv));
                __m512i sign = _mm512_andnot_si512(absm, y), ai = _mm512_and_si512(y, absm);
                __m512 a = _mm512_castsi512_ps(ai);
                __m512i odd = _mm512_and_si512(_mm512_srli_epi32(ai, 20), one);
                __m512 nrm = _mm512_castsi512_ps(_mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(ai, low), odd), keep));
                nrm = _mm512_min_ps(nrm, sat);
                __m512 sub = _mm512_sub_ps(_mm512_add_ps(a, magic), magic);
                __m512 r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, min_normal, _CMP_LT_OQ), nrm, sub);
                _mm512_mask_storeu_ps(o + c, m, _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(r), sign)));
            }
        }
}

/* Lanes < m of 8 (m may be <= 0 or >= 8). */
A2_FN static __m256i lanes(int m) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

A2_FN void quant_act_fp8_avx2(float *xq, float *xs, const float *x, int n, int cols) {
    int ng = quant_fp8_groups(cols);
    const __m256i absm = _mm256_set1_epi32(0x7fffffff), low = _mm256_set1_epi32(0x7ffff), one = _mm256_set1_epi32(1);
    const __m256i keep = _mm256_set1_epi32((int)0xfff00000u);
    const __m256 min_normal = _mm256_set1_ps(0x1p-6f), magic = _mm256_set1_ps(0x1p14f), sat = _mm256_set1_ps(448.0f);
    for (int t = 0; t < n; t++)
        for (int g = 0; g < ng; g++) {
            int c0 = g * QUANT_FP8_GROUP, c1 = c0 + QUANT_FP8_GROUP < cols ? c0 + QUANT_FP8_GROUP : cols;
            const float *v = x + (size_t)t * cols;
            float *o = xq + (size_t)t * cols;
            __m256 mx = _mm256_setzero_ps();
            for (int c = c0; c < c1; c += 8) {
                __m256 a = _mm256_and_ps(_mm256_maskload_ps(v + c, lanes(c1 - c)), _mm256_castsi256_ps(absm));
                mx = _mm256_max_ps(mx, a);
            }
            float m8[8], amax = 0.0f;
            _mm256_storeu_ps(m8, mx);
            for (int i = 0; i < 8; i++) amax = m8[i] > amax ? m8[i] : amax;
            float s = amax > 0.0f ? amax / QUANT_FP8_MAX : 1.0f;
            xs[(size_t)t * ng + g] = s;
            if (!(s >= 0x1p-126f)) {
                group_scalar(o, v, c0, c1, s);
                continue;
            }
            __m256 sv = _mm256_set1_ps(s);
            for (int c = c0; c < c1; c += 8) {
                __m256i m = lanes(c1 - c);
                __m256i y = _mm256_castps_si256(_mm256_div_ps(_mm256_maskload_ps(v + c, m), sv));
                __m256i sign = _mm256_andnot_si256(absm, y), ai = _mm256_and_si256(y, absm);
                __m256 a = _mm256_castsi256_ps(ai);
                __m256i odd = _mm256_and_si256(_mm256_srli_epi32(ai, 20), one);
                __m256 nrm = _mm256_castsi256_ps(_mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(ai, low), odd), keep));
                nrm = _mm256_min_ps(nrm, sat);
                __m256 sub = _mm256_sub_ps(_mm256_add_ps(a, magic), magic);
                __m256 r = _mm256_blendv_ps(nrm, sub, _mm256_cmp_ps(a, min_normal, _CMP_LT_OQ));
                _mm256_maskstore_ps(o + c, m, _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(r), sign)));
            }
        }
}

#endif
