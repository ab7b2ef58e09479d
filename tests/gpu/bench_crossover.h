/*
 * bench_crossover.h - one matrix's crossover between the weight-only GEMV and
 * the native GEMM, measured the way a server measures it at start-up
 * (device_native_crossover_on: the ladder and rule over backend_cuda_native_time) on
 * a backend holding that matrix alone: random weights (sd ~0.02), quantized
 * FP8 (128x128 blocks where the binary has that GEMM, else per channel) or
 * NVFP4, act_quant. gpu_check (bench_native.h): the Qwen3-8B MLP shapes up to
 * 512 tokens, rows native_<fmt>_crossover_n_<rows>x<cols>; emu_check: a small
 * shape up to a few tokens, that it runs (the emulation's times mean nothing).
 * The includer provides rand_bf16 and wmat_bf16, one_mat_set (op_checks.h).
 */
#ifndef SAMPLER_BENCH_CROSSOVER_H
#define SAMPLER_BENCH_CROSSOVER_H

#include <limits.h>

#include "cuda_native.h"
#include "device_select.h"
#include "quant.h"

/* A measured crossover's table and result printed under label (rc: the measurement's); the
 * crossover, -1 when native never won or there is no native path (rc != 0). */
static int xover_report(const char *label, int rc, const NativeCrossover *x) {
    for (int i = 0; rc == 0 && i < x->points; i++)
        printf("  %s n=%-3d weight-only %9.1f us  native %9.1f us%s\n", label, x->n[i], x->wo_us[i], x->native_us[i],
               x->native_us[i] < 0 ? " (native refused)" : "");
    int cross = rc ? -1 : x->min_n == INT_MAX ? -1 : x->min_n;
    printf("  %s: native from n = %d (-1: never, or no native path)\n", label, cross);
    return cross;
}

/* The crossover of one [rows, cols] matrix up to max_n tokens: its table printed, row(name, value) when
 * row is given; the crossover (-1: never, or no native path for it in this binary). */
static int native_xover_shape(int fp4, int rows, int cols, int max_n, void (*row)(const char *, double)) {
    Err err = {0};
    int caps = cuda_native_caps();
    uint16_t *m = rand_bf16((size_t)rows * cols, 0.0f, 0.04f);
    WeightMat w = wmat_bf16(rows, cols, m);
    w.fmt = fp4 ? WF_NVFP4 : WF_FP8;
    w.act_quant = 1;
    w.q = fp4 ? (void *)quant_nvfp4_from_bf16(m, rows, cols, &err)
              : (void *)quant_fp8_from_bf16(m, rows, cols, caps & CUDA_NATIVE_FP8_BLOCK ? QUANT_FP8_BLOCK128
                                                                                       : QUANT_FP8_PER_CHANNEL, &err);
    CHECK(w.q, "crossover: quantize: %s", err.msg);
    OneMat om;
    Backend *b = backend_cuda_create(one_mat_set(&om, &w), 128, 128);
    NativeCrossover x;
    int rc = backend_cuda_native_kind(&w) ? device_native_crossover_on(b, &w, max_n, &x) : -1;
    char name[48];
    snprintf(name, sizeof name, "%s [%d x %d]", fp4 ? "nvfp4" : "fp8", rows, cols);
    int cross = xover_report(name, rc, &x);
    snprintf(name, sizeof name, "native_%s_crossover_n_%dx%d", fp4 ? "nvfp4" : "fp8", rows, cols);
    if (row) row(name, cross);
    b->free(b);
    if (fp4) quant_nvfp4_free((QuantNvfp4 *)w.q);
    else quant_fp8_free((QuantFp8 *)w.q);
    free(m);
    return cross;
}

#endif
