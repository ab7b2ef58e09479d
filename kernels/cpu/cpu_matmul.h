/*
 * cpu_matmul.h - private to kernels/cpu: the bf16 matmul kernels of each
 * path, all with the contract of cpu_matmul_rows (cpu_ops.h) minus the bias,
 * and all in the reference order documented there. Not a public header:
 * callers go through cpu_matmul_rows and cpu_ops_force_path.
 */
#ifndef SAMPLER_CPU_MATMUL_H
#define SAMPLER_CPU_MATMUL_H

#include <stddef.h>
#include <stdint.h>

/* out[t, r] = sum_k x[t, k] * w[r, k] for t < n, r0 <= r < r1; w: bf16 [rows, K]. */
typedef void (*CpuMatmulFn)(float *out, int ldo, const float *x, int ldx, int n, const uint16_t *w, int K,
                            int r0, int r1);

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

/* The reference horizontal sum of every x86 path (f32 matmul, dot, the BF16
 * order's tree): ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)). */
__attribute__((target("avx2,fma"), always_inline)) static inline float cpu_hsum8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
    return _mm_cvtss_f32(lo);
}

void cpu_matmul_avx2(float *out, int ldo, const float *x, int ldx, int n, const uint16_t *w, int K, int r0,
                     int r1);
void cpu_matmul_avx512(float *out, int ldo, const float *x, int ldx, int n, const uint16_t *w, int K, int r0,
                       int r1);
void cpu_matmul_bf16_avx2(float *out, int ldo, const uint16_t *x, int ldx, int n, const uint16_t *w, int K, int r0,
                          int r1);
void cpu_matmul_bf16_avx512bf16(float *out, int ldo, const uint16_t *x, int ldx, int n, const uint16_t *w, int K,
                                int r0, int r1);
void cpu_act_to_bf16_avx2(uint16_t *dst, const float *src, size_t n);
void cpu_act_to_bf16_avx512bf16(uint16_t *dst, const float *src, size_t n);
#endif

/* The BF16-activation matmul (cpu_matmul_bf16.c): the same contract with x
 * bf16 [n, ldx] (cpu_act_to_bf16), in the reference order of cpu_ops.h's
 * cpu_matmul_rows_bf16. */
typedef void (*CpuMatmulBf16Fn)(float *out, int ldo, const uint16_t *x, int ldx, int n, const uint16_t *w, int K,
                                int r0, int r1);
void cpu_matmul_bf16_portable(float *out, int ldo, const uint16_t *x, int ldx, int n, const uint16_t *w, int K,
                              int r0, int r1);
void cpu_act_to_bf16_portable(uint16_t *dst, const float *src, size_t n);

#endif
