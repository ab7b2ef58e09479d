/*
 * test_device_native.c - the start-up choice between the native and the
 * weight-only GPU paths (device_native_plan, device_native.c) for every
 * binary's capabilities, without a GPU: sm_90 runs FP8 natively with the
 * checkpoint's block scales and refuses native NVFP4 with a message offering
 * --weight-only; sm_100/103 run both, FP8 per channel; sm_80 refuses both;
 * --weight-only, bf16 and the CPU backend are never refused. Also the
 * load-time layout it asks for: an FP8 model quantized per output channel
 * is quantized per row (QUANT_FP8_PER_CHANNEL) and the CPU backend then
 * quantizes activations per token.
 * And the per-shape crossover's ladder and rule (device_native_crossover)
 * over modeled timings: a GEMV whose time grows with n against a flat GEMM,
 * a native path that loses a point past its first win (noise), one that never
 * wins, one that wins from n = 1, one that is refused, a batch limit, and the
 * timer's failure. (emu_check times the real paths and checks that a matmul
 * then takes the path recorded.)
 */
#include <limits.h>
#include <string.h>

#include "cuda_native.h"
#include "device_select.h"
#include "quant.h"
#include "test.h"

#define CAPS90 (CUDA_NATIVE_FP8_BLOCK | CUDA_NATIVE_FP8_ROWWISE)
#define CAPS100 (CUDA_NATIVE_FP8_ROWWISE | CUDA_NATIVE_NVFP4)

static void plan(int gpu, int sm, int caps, Precision p, int weight_only, int want_rc, int want_pc, const char *msg) {
    Err err = {0};
    int pc = -1, rc = device_native_plan(gpu, sm, caps, p, weight_only, &pc, &err);
    T_ASSERT((rc != 0) == want_rc, "sm%d %s weight_only %d: rc %d (%s)", sm, precision_name(p), weight_only, rc, err.msg);
    T_ASSERT(pc == want_pc, "sm%d %s weight_only %d: fp8_per_channel %d, want %d", sm, precision_name(p), weight_only,
             pc, want_pc);
    if (msg) T_ASSERT(strstr(err.msg, msg) != NULL, "sm%d %s: message '%s' lacks '%s'", sm, precision_name(p), err.msg, msg);
}

static void check_per_channel_load(void) {
    Err err = {0};
    Model *m = NULL;
    LoadOptions o = {PREC_FP8, 0, 1};
    int rc = model_load_opts(&m, "tests/fixtures/qwen3_gqa2", &o, &err);
    T_ASSERT(rc == 0, "load: %s", err.msg);
    if (rc) return;
    int n = 0, bad = 0;
    for (int i = 0; i < m->weights.n; i++) {
        const WeightMat *w = m->weights.t[i].vec ? NULL : m->weights.t[i].mat;
        if (!w || w->fmt != WF_FP8) continue;
        const QuantFp8 *q = (const QuantFp8 *)w->q;
        n++;
        bad += !(q->block_rows == 1 && q->block_cols == w->cols && w->act_quant);
    }
    T_ASSERT(n > 0 && bad == 0, "%d fp8 matrices, %d not per channel with quantized activations", n, bad);
    model_free(m);
}

/* Modeled paths: the weight-only GEMV reads the weights once per 8 tokens (10 us a pass), the native
 * GEMM costs base + slope * n; lose_at: a ladder point where native is slower anyway (noise). */
typedef struct { float base, slope; int lose_at, refuse, fail_at, calls, max_seen; } Model2;
static int modeled(void *ctx, int n, float *wo, float *na) {
    Model2 *m = (Model2 *)ctx;
    m->calls++;
    if (n > m->max_seen) m->max_seen = n;
    if (m->fail_at && n == m->fail_at) return -1;
    *wo = 10.0f * (float)((n + 7) / 8);
    *na = m->refuse ? -1.0f : n == m->lose_at ? *wo + 1 : m->base + m->slope * (float)n;
    return 0;
}
static void xover(Model2 m, int max_n, int want_rc, int want_min, int want_points, int want_max_seen,
                  const char *what) {
    NativeCrossover x;
    int rc = device_native_crossover(modeled, &m, max_n, &x);
    T_ASSERT(rc == want_rc, "%s: rc %d, want %d", what, rc, want_rc);
    if (rc) return;
    T_ASSERT(x.min_n == want_min, "%s: native from %d, want %d", what, x.min_n, want_min);
    T_ASSERT(x.points == want_points && m.calls == want_points, "%s: %d points (%d timings), want %d", what, x.points,
             m.calls, want_points);
    T_ASSERT(m.max_seen == want_max_seen, "%s: measured up to n = %d, want %d", what, m.max_seen, want_max_seen);
    static const int ladder[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512};
    for (int i = 0; i < x.points && i < (int)(sizeof ladder / sizeof ladder[0]); i++)
        T_ASSERT(x.n[i] == ladder[i], "%s: ladder point %d is %d, want %d", what, i, x.n[i], ladder[i]);
}

int main(void) {
    /* the crossover: GEMV 10 us per 8 tokens against 30 + 0.1 n: native loses at 16 (20 < 31.6) and 24
     * (30 < 32.4), wins from 32 (40 > 33.2); every point to 64 measured, then 96 and 128 (two wins past 64) */
    xover((Model2){30, 0.1f, 0, 0, 0, 0, 0}, 8192, 0, 32, 14, 128, "GEMV vs GEMM");
    /* a loss after the first win (noise at 48): native only from the point after the last loss */
    xover((Model2){30, 0.1f, 48, 0, 0, 0, 0}, 8192, 0, 64, 14, 128, "a loss at 48");
    /* native never wins up to the batch limit: weight-only at every size */
    xover((Model2){1e6f, 0, 0, 0, 0, 0, 0}, 256, 0, INT_MAX, 16, 256, "never wins");
    /* wins everywhere: from 1 */
    xover((Model2){1, 0, 0, 0, 0, 0, 0}, 8192, 0, 1, 14, 128, "always wins");
    /* refused (cuBLASLt found no algorithm): never */
    xover((Model2){1, 0, 0, 1, 0, 0, 0}, 64, 0, INT_MAX, 12, 64, "refused");
    /* a batch limit under the crossover: weight-only up to it; one of 20 tokens stops at 16 */
    xover((Model2){30, 0.1f, 0, 0, 0, 0, 0}, 20, 0, INT_MAX, 8, 16, "limit 20");
    /* a native win that ends the ladder past 64 only after two wins in a row: 96 loses, 128, 192 win */
    xover((Model2){30, 0.1f, 96, 0, 0, 0, 0}, 8192, 0, 128, 15, 192, "a loss at 96");
    /* the timer failing: -1 (the caller keeps the constant) */
    xover((Model2){30, 0.1f, 0, 0, 24, 0, 0}, 8192, -1, 0, 0, 0, "timer fails");

    /* bf16, --weight-only and the CPU backend: never refused, never re-laid-out */
    for (int p = PREC_BF16; p <= PREC_NVFP4; p++) {
        plan(0, 0, 0, (Precision)p, 0, 0, 0, NULL);
        plan(1, 80, 0, (Precision)p, 1, 0, 0, NULL);
        plan(1, 90, CAPS90, (Precision)p, 1, 0, 0, NULL);
    }
    plan(1, 80, 0, PREC_BF16, 0, 0, 0, NULL);
    /* native FP8: block scales on sm_90, per channel on Blackwell, refused on sm_80 */
    plan(1, 90, CAPS90, PREC_FP8, 0, 0, 0, NULL);
    plan(1, 100, CAPS100, PREC_FP8, 0, 0, 1, NULL);
    plan(1, 103, CAPS100, PREC_FP8, 0, 0, 1, NULL);
    plan(1, 80, 0, PREC_FP8, 0, 1, 0, "fix: pass --weight-only");
    /* native NVFP4: Blackwell only; sm_90 refuses it at start-up and offers weight-only */
    plan(1, 100, CAPS100, PREC_NVFP4, 0, 0, 0, NULL);
    plan(1, 103, CAPS100, PREC_NVFP4, 0, 0, 0, NULL);
    plan(1, 90, CAPS90, PREC_NVFP4, 0, 1, 0, "fix: pass --weight-only");
    plan(1, 90, CAPS90, PREC_NVFP4, 0, 1, 0, "needs a Blackwell GPU");
    plan(1, 80, 0, PREC_NVFP4, 0, 1, 0, "fix: pass --weight-only");
    check_per_channel_load();
    return T_DONE();
}
