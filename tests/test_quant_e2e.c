/*
 * test_quant_e2e.c - end-to-end error of the quantized matmuls against the
 * exact BF16 product, as NMSE = sum (y - y_bf16)^2 / sum y_bf16^2 over a
 * random Gaussian layer (W ~ N(0, 0.02^2) bf16 [512, 1024], x ~ N(0, 1) with
 * per-token magnitudes spread over 30x, plus one outlier channel).
 *
 * Bounds (about 1.5-2x the values measured when the test was written, and
 * derived from the formats): an E4M3 cast keeps 3 mantissa bits, so a value's
 * rounding error is uniform within +-2^-4 of its binade and the relative
 * mean square error is ~(2^-3)^2/12 * E[(2^e/|w|)^2] ~ 6e-4; FP8 weight-only
 * must stay under 1.5e-3 and FP8 weights + activations (two such errors)
 * under 3e-3. Per-channel / per-tensor scales differ from 128x128 blocks only
 * in rare subnormal casts for a Gaussian matrix: same bound. E2M1 keeps 1
 * mantissa bit on a grid of 8 magnitudes per 16-element block: ~1e-2 per
 * operand; NVFP4 weight-only under 1.8e-2 and weights + activations under
 * 3.5e-2.
 */
#include <math.h>

#include "quant.h"
#include "quant_golden.h"
#include "quant_ref.h"
#include "test.h"

#define N 16
#define ROWS 512
#define COLS 1024

static double nmse(const float *y, const double *ref) {
    double num = 0, den = 0;
    for (int i = 0; i < N * ROWS; i++) {
        num += (y[i] - ref[i]) * (y[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return num / den;
}

int main(void) {
    uint16_t *w = malloc((size_t)ROWS * COLS * 2);
    float *x = malloc((size_t)N * COLS * 4), *y = malloc((size_t)N * ROWS * 4);
    float *scratch = malloc(qr_matmul_scratch_floats(N, COLS) * 4);
    double *ref = malloc((size_t)N * ROWS * 8);
    for (int i = 0; i < ROWS * COLS; i++) w[i] = f32_to_bf16((float)(qg_normal() * 0.02));
    for (int t = 0; t < N; t++) {
        double mag = exp(qg_uniform() * log(30.0));
        for (int k = 0; k < COLS; k++) x[t * COLS + k] = (float)(qg_normal() * mag * (k == 100 ? 20 : 1));
    }
    for (int t = 0; t < N; t++)
        for (int r = 0; r < ROWS; r++) {
            double s = 0;
            for (int k = 0; k < COLS; k++) s += (double)x[t * COLS + k] * bf16_to_f32(w[(size_t)r * COLS + k]);
            ref[t * ROWS + r] = s;
        }
    Err e = {0};
    struct { const char *name; QuantFp8Layout lay; int aq; double bound; } fp8[] = {
        {"fp8 block128 weight-only", QUANT_FP8_BLOCK128, 0, 1.5e-3},
        {"fp8 block128 + act", QUANT_FP8_BLOCK128, 1, 3e-3},
        {"fp8 per-channel weight-only", QUANT_FP8_PER_CHANNEL, 0, 1.5e-3},
        {"fp8 per-tensor weight-only", QUANT_FP8_PER_TENSOR, 0, 1.5e-3},
    };
    for (int i = 0; i < 4; i++) {
        QuantFp8 *q = quant_fp8_from_bf16(w, ROWS, COLS, fp8[i].lay, &e);
        qr_matmul_fp8(y, x, q, N, fp8[i].aq, scratch);
        double v = nmse(y, ref);
        printf("%-30s NMSE %.3e (bound %.1e)\n", fp8[i].name, v, fp8[i].bound);
        T_ASSERT(v < fp8[i].bound && v > 0, "%s NMSE %.3e", fp8[i].name, v);
        quant_fp8_free(q);
    }
    QuantNvfp4 *q = quant_nvfp4_from_bf16(w, ROWS, COLS, &e);
    qr_matmul_nvfp4(y, x, q, N, 0, scratch);
    double v = nmse(y, ref);
    printf("%-30s NMSE %.3e (bound %.1e)\n", "nvfp4 weight-only", v, 1.8e-2);
    T_ASSERT(v < 1.8e-2 && v > 0, "nvfp4 weight-only NMSE %.3e", v);
    qr_matmul_nvfp4(y, x, q, N, 1, scratch);
    v = nmse(y, ref);
    printf("%-30s NMSE %.3e (bound %.1e)\n", "nvfp4 + act", v, 3.5e-2);
    T_ASSERT(v < 3.5e-2 && v > 0, "nvfp4 + act NMSE %.3e", v);
    QuantFp8 *f = quant_fp8_from_bf16(w, ROWS, COLS, QUANT_FP8_BLOCK128, &e);
    printf("weight bytes: bf16 %d, fp8 block128 %zu, nvfp4 %zu\n", ROWS * COLS * 2, quant_fp8_bytes(f),
           quant_nvfp4_bytes(q));
    quant_fp8_free(f);
    quant_nvfp4_free(q);
    free(w); free(x); free(y); free(scratch); free(ref);
    return T_DONE();
}
