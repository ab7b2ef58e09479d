/*
 * test_quant_act.c - the per-token FP8 activation rule (quant_act_fp8_token,
 * the CPU reference of the native FP8 path with per-channel weights) against
 * its definition: s_t = amax over the whole token / 448 (1 for an all-zero
 * token), xq = e4m3_sat(x / s_t), s_t repeated in every 128-column group; for a
 * token of at most 128 columns it is quant_act_fp8 bit for bit. And the CPU
 * backend takes it for per-channel FP8 weights with quantized activations:
 * its matmul equals quant_matmul_fp8_rows over those activations.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "dtype.h"
#include "quant.h"
#include "test.h"

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static void check_rule(int n, int cols) {
    uint64_t seed = 7 + (uint64_t)cols;
    int ng = quant_fp8_groups(cols);
    float *x = malloc(sizeof(float) * n * cols), *xq = malloc(sizeof(float) * n * cols), *xs = malloc(sizeof(float) * n * ng);
    for (int t = 0; t < n; t++)
        for (int c = 0; c < cols; c++) x[t * cols + c] = t == 1 ? 0.0f : ldexpf(frand(&seed), (t * 5) % 30 - 20);
    quant_act_fp8_token(xq, xs, x, n, cols);
    int bad = 0;
    for (int t = 0; t < n; t++) {
        float amax = 0;
        for (int c = 0; c < cols; c++) amax = fmaxf(amax, fabsf(x[t * cols + c]));
        float s = amax > 0 ? amax / 448.0f : 1.0f;
        for (int g = 0; g < ng; g++) bad += memcmp(&xs[t * ng + g], &s, 4) != 0;
        for (int c = 0; c < cols; c++) {
            float want = quant_e4m3_to_f32(quant_f32_to_e4m3(x[t * cols + c] / s));
            bad += memcmp(&xq[t * cols + c], &want, 4) != 0;
        }
    }
    T_ASSERT(bad == 0, "per-token rule, n %d cols %d: %d values differ", n, cols, bad);
    if (cols <= QUANT_FP8_GROUP) { /* one group: the same as the 1x128 rule */
        float *yq = malloc(sizeof(float) * n * cols), *ys = malloc(sizeof(float) * n * ng);
        quant_act_fp8(yq, ys, x, n, cols);
        T_ASSERT(!memcmp(xq, yq, sizeof(float) * n * cols) && !memcmp(xs, ys, sizeof(float) * n * ng),
                 "cols %d: per token differs from 1x128", cols);
        free(yq);
        free(ys);
    }
    free(x);
    free(xq);
    free(xs);
}

static void check_backend(void) {
    int n = 5, rows = 24, cols = 300;
    uint64_t seed = 99;
    Err err = {0};
    uint16_t *w = malloc(2 * rows * cols);
    float *x = malloc(sizeof(float) * n * cols), *out = malloc(sizeof(float) * n * rows), *ref = malloc(sizeof(float) * n * rows);
    for (int i = 0; i < rows * cols; i++) w[i] = f32_to_bf16(0.05f * frand(&seed));
    for (int i = 0; i < n * cols; i++) x[i] = 2 * frand(&seed);
    QuantFp8 *q = quant_fp8_from_bf16(w, rows, cols, QUANT_FP8_PER_CHANNEL, &err);
    T_ASSERT(q != NULL, "%s", err.msg);
    if (!q) return;
    float *xq = malloc(sizeof(float) * n * cols), *xs = malloc(sizeof(float) * n * quant_fp8_groups(cols));
    quant_act_fp8_token(xq, xs, x, n, cols);
    quant_matmul_fp8_rows(ref, xq, xs, q, n, 0, rows);
    Backend *b = backend_cpu_create(1, 64);
    b->reserve(b, n, cols);
    WeightMat m = {.fmt = WF_FP8, .rows = rows, .cols = cols, .bf16 = w, .q = q, .act_quant = 1};
    b->matmul(b, out, x, n, &m, NULL);
    T_ASSERT(!memcmp(out, ref, sizeof(float) * n * rows), "cpu backend, per-channel fp8 act_quant: not the per-token rule");
    b->free(b);
    quant_fp8_free(q);
    free(w); free(x); free(out); free(ref); free(xq); free(xs);
}

int main(void) {
    check_rule(4, 100);
    check_rule(4, 128);
    check_rule(3, 300);
    check_rule(2, 4096);
    check_backend();
    return T_DONE();
}
