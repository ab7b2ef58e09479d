/*
 * fp8_matmul.h - private to quant/: the vectorised FP8 kernels, the matmul
 * of fp8_matmul_x86.c (the contract of quant_matmul_fp8_rows in quant.h and
 * its reference order) and the activation quantizer of fp8_act_x86.c (the
 * bits of quant_act_fp8). Not a public header: callers go through
 * quant_matmul_fp8_rows / quant_act_fp8 and quant_force_path.
 */
#ifndef SAMPLER_FP8_MATMUL_H
#define SAMPLER_FP8_MATMUL_H

#include "quant.h"

#if (defined(__x86_64__) || defined(__i386__)) && !defined(QUANT_NO_SIMD)
void quant_fp8_rows_avx2(float *out, const float *x, const float *xs, const QuantFp8 *w, int n, int rb, int re);
void quant_fp8_rows_avx512(float *out, const float *x, const float *xs, const QuantFp8 *w, int n, int rb, int re);
void quant_act_fp8_avx2(float *xq, float *xs, const float *x, int n, int cols);
void quant_act_fp8_avx512(float *xq, float *xs, const float *x, int n, int cols);
#endif

#endif
