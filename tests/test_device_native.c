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
 */
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

int main(void) {
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
