/*
 * quant_ref.h - test-side helpers over the public quant API (shared by the
 * tests/test_quant_*.c binaries; not a test itself): the dequantized f32 form
 * of a weight row, written from the formats in quant.h, and single-threaded
 * matmuls over all rows that quantize the activations first when asked, the
 * way the native GPU path does. The product calls quant_act_* and
 * quant_matmul_*_rows itself (kernels/cpu/backend_cpu.c).
 */
#ifndef SAMPLER_QUANT_REF_H
#define SAMPLER_QUANT_REF_H

#include <stddef.h>

#include "quant.h"

/* out [w->cols] = row `row` of W as f32. */
static inline void qr_fp8_dequant_row(const QuantFp8 *w, int row, float *out) {
    const float *s = w->scale_inv + (size_t)(row / w->block_rows) * w->scale_cols;
    for (int c = 0; c < w->cols; c++)
        out[c] = quant_e4m3_to_f32(w->q[(size_t)row * w->cols + c]) * s[c / w->block_cols];
}

static inline void qr_nvfp4_dequant_row(const QuantNvfp4 *w, int row, float *out) {
    const uint8_t *p = w->packed + (size_t)row * (w->cols / 2);
    const uint8_t *s = w->scale + (size_t)row * (w->cols / QUANT_NVFP4_BLOCK);
    for (int c = 0; c < w->cols; c++) {
        uint8_t code = (c & 1) ? p[c / 2] >> 4 : p[c / 2] & 0xf;
        out[c] = quant_e2m1_to_f32(code) * quant_e4m3_to_f32(s[c / QUANT_NVFP4_BLOCK]) * w->scale2;
    }
}

/* Floats of scratch qr_matmul_* needs for n tokens of cols: xq [n, cols], then
 * the scales (fp8: [n, groups]; nvfp4: [n]). */
static inline size_t qr_matmul_scratch_floats(int n, int cols) {
    return (size_t)n * cols + (size_t)n * quant_fp8_groups(cols) + (size_t)n;
}

/* out [n, w->rows] = x [n, cols] @ W^T; quant_act != 0: x quantized into scratch first. */
static inline void qr_matmul_fp8(float *out, const float *x, const QuantFp8 *w, int n, int quant_act,
                                 float *scratch) {
    if (!quant_act) {
        quant_matmul_fp8_rows(out, x, NULL, w, n, 0, w->rows);
        return;
    }
    float *xq = scratch, *xs = scratch + (size_t)n * w->cols;
    quant_act_fp8(xq, xs, x, n, w->cols);
    quant_matmul_fp8_rows(out, xq, xs, w, n, 0, w->rows);
}

static inline void qr_matmul_nvfp4(float *out, const float *x, const QuantNvfp4 *w, int n, int quant_act,
                                   float *scratch) {
    if (!quant_act) {
        quant_matmul_nvfp4_rows(out, x, NULL, w, n, 0, w->rows);
        return;
    }
    float *xq = scratch, *xg = scratch + (size_t)n * w->cols;
    quant_act_nvfp4(xq, xg, x, n, w->cols, 0.0f);
    quant_matmul_nvfp4_rows(out, xq, xg, w, n, 0, w->rows);
}

#endif
