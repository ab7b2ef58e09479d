/*
 * fp8_matmul.h - private to quant/: the vectorised FP8 matmul kernels of
 * fp8_matmul_x86.c, with the contract of quant_matmul_fp8_rows (quant.h) and
 * its reference order. Not a public header: callers go through
 * quant_matmul_fp8_rows and quant_force_path.
 */
#ifndef SAMPLER_FP8_MATMUL_H
#define SAMPLER_FP8_MATMUL_H

#include "quant.h"

#if (defined(__x86_64__) || defined(__i386__)) && !defined(QUANT_NO_SIMD)
void quant_fp8_rows_avx2(float *out, const float *x, const float *xs, const QuantFp8 *w, int n, int rb, int re);
void quant_fp8_rows_avx512(float *out, const float *x, const float *xs, const QuantFp8 *w, int n, int rb, int re);
#endif

#endif
