/*
 * test_device_select.c - the start-up device choice without a GPU.
 *
 * Binary/device matching follows NVIDIA's compatibility rules (CUDA C++
 * Programming Guide, "Binary Compatibility" and "Feature Set Compiler
 * Targets"): sm_80 SASS runs on every 8.x device; arch-specific sm_90a,
 * sm_100a, sm_103a SASS runs only on exactly 9.0, 10.0, 10.3. In sampler-cpu
 * the CUDA entry points are absent, so device_select must choose the CPU,
 * and the Runner it gives (runner_create_with + runner_kvcache_create) must
 * produce bit-identical logits to runner_create + kvcache_create.
 */
#include <stdlib.h>
#include <string.h>

#include "device_select.h"
#include "test.h"

static void check_pair(int bin, int major, int minor, const char *want_in_msg) {
    Err err = {0};
    int rc = device_check_binary(bin, major, minor, &err);
    if (!want_in_msg) {
        T_ASSERT(rc == 0, "sm%d binary on %d.%d refused: %s", bin, major, minor, err.msg);
        return;
    }
    T_ASSERT(rc != 0, "sm%d binary on %d.%d accepted", bin, major, minor);
    T_ASSERT(strstr(err.msg, want_in_msg) != NULL, "sm%d on %d.%d: message '%s' lacks '%s'", bin, major, minor,
             err.msg, want_in_msg);
}

/* Prefill of the fixture's first recorded sequence on a runner, all logits. */
static float *prefill(Runner *r, KVCache *kv, const SafeTensors *ref, int vocab, int *T_out) {
    const StTensor *tt = safetensors_get(ref, "seq0.tokens");
    int T = (int)tt->numel;
    int32_t bt[32], pos[128], seq[128], rows[128];
    for (int i = 0; i < 32; i++) bt[i] = 31 - i;
    for (int i = 0; i < T; i++) { pos[i] = i; seq[i] = 0; rows[i] = i; }
    const int32_t *tables[1] = {bt};
    Batch b = {T, (const int32_t *)tt->data, pos, seq, 1, tables, T, rows, 0};
    float *out = malloc(sizeof(float) * (size_t)T * vocab);
    Err err = {0};
    T_ASSERT(model_forward(r, kv, &b, out, &err) == 0, "forward: %s", err.msg);
    *T_out = T;
    return out;
}

static void check_device_runner(void) {
    const char *dir = "tests/fixtures/qwen3_gqa2";
    Err err = {0};
    Model *m = NULL;
    SafeTensors *ref = NULL;
    int rc = model_load(&m, dir, &err);
    T_ASSERT(rc == 0, "%s", err.msg);
    if (rc) return;
    rc = safetensors_open(&ref, "tests/fixtures/qwen3_gqa2/ref.safetensors", &err);
    T_ASSERT(rc == 0, "%s", err.msg);
    if (rc) { model_free(m); return; }
    DeviceChoice d;
    T_ASSERT(device_select(&d, 0, PREC_BF16, &err) == 0, "%s", err.msg);
    Runner *r1 = runner_create(m, 128, 128, 2), *r2 = device_runner_create(&d, m, 128, 128, 2);
    KVCache *kv1 = kvcache_create(&m->cfg, 40, 4), *kv2 = runner_kvcache_create(r2, 40, 4);
    int T1 = 0, T2 = 0, V = m->cfg.vocab;
    float *a = prefill(r1, kv1, ref, V, &T1), *b = prefill(r2, kv2, ref, V, &T2);
    T_ASSERT(T1 == T2 && T1 > 0 && memcmp(a, b, sizeof(float) * (size_t)T1 * V) == 0,
             "device_runner_create logits differ from runner_create");
    free(a);
    free(b);
    runner_kvcache_free(r2, kv2);
    kvcache_free(kv1);
    runner_free(r2);
    runner_free(r1);
    safetensors_free(ref);
    model_free(m);
}

int main(void) {
    /* matches */
    check_pair(80, 8, 0, NULL);
    check_pair(80, 8, 6, NULL);
    check_pair(80, 8, 9, NULL);
    check_pair(90, 9, 0, NULL);
    check_pair(100, 10, 0, NULL);
    check_pair(103, 10, 3, NULL);
    /* mismatches name the binary that fits */
    check_pair(80, 9, 0, "run sampler-sm90");
    check_pair(90, 8, 0, "run sampler-sm80");
    check_pair(90, 10, 0, "run sampler-sm100");
    check_pair(100, 10, 3, "run sampler-sm103");
    check_pair(103, 10, 0, "run sampler-sm100");
    check_pair(100, 9, 0, "run sampler-sm90");
    /* devices no binary targets */
    check_pair(90, 7, 5, "sampler-cpu");
    check_pair(100, 12, 0, "sampler-cpu");
    T_ASSERT(device_binary_for(12, 0) == NULL, "sm_120 has no binary");
    T_ASSERT(device_binary_for(9, 0) && !strcmp(device_binary_for(9, 0), "sampler-sm90"), "sm_90");

    Precision p;
    T_ASSERT(precision_parse("bf16", &p) == 0 && p == PREC_BF16, "bf16");
    T_ASSERT(precision_parse("fp8", &p) == 0 && p == PREC_FP8, "fp8");
    T_ASSERT(precision_parse("nvfp4", &p) == 0 && p == PREC_NVFP4, "nvfp4");
    T_ASSERT(precision_parse("fp16", &p) != 0, "unknown precisions refused");

    /* This test binary has no CUDA code: always the CPU backend. */
    DeviceChoice d;
    Err err = {0};
    T_ASSERT(device_select(&d, 0, PREC_BF16, &err) == 0 && d.gpu == 0 && d.binary_sm == 0, "cpu chosen: %s",
             err.msg);
    T_ASSERT(device_select(&d, 1, PREC_FP8, &err) == 0 && d.gpu == 0 && d.precision == PREC_FP8, "forced cpu");
    check_device_runner();
    return T_DONE();
}
