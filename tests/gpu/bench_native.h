/*
 * bench_native.h - gpu_check's measurements of the native FP8 / NVFP4 paths
 * (issue 19), included by gpu_check.c after its helpers. Nothing here is a
 * pass/fail check (the op rows of op_checks_native.h are): it prints numbers
 * and the machine rows a GPU session copies into bench/gpu/<gpu>.json:
 *   native_fp8_crossover_n   the smallest batch from which the native FP8 GEMM
 *                            (device quantization + cuBLASLt) beats the
 *                            weight-only GEMV at every larger tested batch, on
 *                            both Qwen3-8B MLP shapes (the larger of the two
 *                            rows native_fp8_crossover_n_<rows>x<cols>), by the
 *                            measurement a server makes at start-up
 *                            (device_native_crossover);
 *   native_nvfp4_crossover_n the same for NVFP4 (Blackwell binaries only);
 *   decode_bf16_b1_tok_s, decode_fp8_b1_tok_s   batch-1 decode of part 3's
 *                            Qwen3-8B-shaped model (batch 1 is below the
 *                            crossover: the weight-only GEMV);
 *   decode_fp8_native_b{32,128}_tok_s  the same model with act_quant FP8
 *                            matrices at batch 32 and 128 (the native GEMM);
 *   kl_bf16_fp8_mean         mean over every prefill position of the fixtures
 *                            of KL(p_bf16 || p_fp8), both on this GPU, FP8 as
 *                            the server runs it (act_quant; a matrix without a
 *                            native path here runs weight-only, and the row says
 *                            how many were native), next to
 *   kl_bf16_fp8_cpu_mean     the CPU w8a8 figure for the same positions.
 */
#ifndef SAMPLER_BENCH_NATIVE_H
#define SAMPLER_BENCH_NATIVE_H

#include <limits.h>

#include "cuda_native.h"
#include "device_select.h"
#include "bench_crossover.h"

typedef struct NativeRow { char name[48]; double v; } NativeRow;
#define NATIVE_ROWS_MAX 96
static NativeRow native_rows[NATIVE_ROWS_MAX];
static int n_native_rows;

static void native_row(const char *name, double v) {
    if (n_native_rows >= NATIVE_ROWS_MAX) {
        fprintf(stderr, "gpu_check: row %s dropped: more than %d named rows (raise NATIVE_ROWS_MAX)\n", name,
                NATIVE_ROWS_MAX);
        return;
    }
    snprintf(native_rows[n_native_rows].name, sizeof native_rows[0].name, "%s", name);
    native_rows[n_native_rows++].v = v;
    printf("  row %-32s %.6g\n", name, v);
}

/* ---- part 2 addition: KL(bf16 || fp8) on the fixtures, GPU as served and CPU w8a8 ---- */
static double native_kl_rows(const float *a, const float *b, int rows, int vocab) {
    double tot = 0;
    for (int r = 0; r < rows; r++) {
        Cmp c = {0};
        logit_cmp(&c, a + (size_t)r * vocab, b + (size_t)r * vocab, 1, vocab);
        tot += c.max_kl;
    }
    return tot;
}

static void native_kl_fixtures(void) {
    printf("== 2b. KL(bf16 || fp8) on the fixtures: this GPU as served (act_quant) and the CPU w8a8 ==\n");
    const char *dirs[] = {"tests/fixtures/qwen3_gqa2", "tests/fixtures/qwen3_moe", "tests/fixtures/llama31",
                          "tests/fixtures/qwen2", "models/tiny-qwen3"};
    int per_channel = 0, caps = cuda_native_caps();
    Err err = {0};
    if (device_native_plan(1, cuda_binary_sm(), caps, PREC_FP8, 0, &per_channel, &err)) {
        printf("  skip: %s\n", err.msg);
        return;
    }
    double kl_gpu = 0, kl_cpu = 0;
    long positions = 0;
    int n_mats = 0, n_native = 0;
    for (size_t d = 0; d < sizeof dirs / sizeof dirs[0]; d++) {
        Model *mb = NULL, *mq = NULL;
        SafeTensors *ref = NULL;
        char path[512];
        snprintf(path, sizeof path, "%s/ref.safetensors", dirs[d]);
        LoadOptions ob = {PREC_BF16, 0, 0}, oq = {PREC_FP8, 0, per_channel};
        if (model_load_opts(&mb, dirs[d], &ob, &err) || model_load_opts(&mq, dirs[d], &oq, &err) ||
            safetensors_open(&ref, path, &err)) {
            printf("  FAIL %s: %s\n", dirs[d], err.msg);
            n_fail++;
            model_free(mb);
            model_free(mq);
            continue;
        }
        for (int i = 0; i < mq->weights.n; i++) {
            const WeightMat *w = mq->weights.t[i].vec ? NULL : mq->weights.t[i].mat;
            if (!w || w->fmt == WF_BF16) continue;
            n_mats++;
            n_native += backend_cuda_native_kind(w) != 0;
        }
        int V = mb->cfg.vocab, max_ctx = 128;
        Model *ms[2] = {mb, mq};
        Runner *rg[2], *rc[2];
        KVCache *kg[2], *kc[2];
        for (int k = 0; k < 2; k++) {
            Backend *gb = backend_cuda_create(&ms[k]->weights, ms[k]->cfg.head_dim, max_ctx);
            rg[k] = runner_create_with(ms[k], gb, 128, max_ctx);
            kg[k] = runner_kvcache_create(rg[k], 128, FX_BLOCK);
            rc[k] = runner_create_with(ms[k], backend_cpu_create(0, max_ctx), 128, max_ctx);
            kc[k] = kvcache_create(&ms[k]->cfg, 128, FX_BLOCK);
        }
        for (int s = 0; s < 8; s++) {
            snprintf(path, sizeof path, "seq%d.tokens", s);
            const StTensor *tt = safetensors_get(ref, path);
            if (!tt) break;
            int T = (int)tt->numel;
            int32_t bt[32];
            for (int i = 0; i < (T + FX_BLOCK - 1) / FX_BLOCK; i++) bt[i] = i;
            float *o[4];
            for (int k = 0; k < 4; k++) o[k] = xmalloc(sizeof(float) * (size_t)T * V);
            int rc0 = prefill(rg[0], kg[0], (const int32_t *)tt->data, T, bt, o[0], &err) ||
                      prefill(rg[1], kg[1], (const int32_t *)tt->data, T, bt, o[1], &err) ||
                      prefill(rc[0], kc[0], (const int32_t *)tt->data, T, bt, o[2], &err) ||
                      prefill(rc[1], kc[1], (const int32_t *)tt->data, T, bt, o[3], &err);
            if (rc0) {
                printf("  FAIL %s seq%d: %s\n", dirs[d], s, err.msg);
                n_fail++;
            } else {
                kl_gpu += native_kl_rows(o[0], o[1], T, V);
                kl_cpu += native_kl_rows(o[2], o[3], T, V);
                positions += T;
            }
            for (int k = 0; k < 4; k++) free(o[k]);
        }
        for (int k = 0; k < 2; k++) {
            runner_kvcache_free(rg[k], kg[k]);
            runner_free(rg[k]);
            kvcache_free(kc[k]);
            runner_free(rc[k]);
        }
        safetensors_free(ref);
        model_free(mb);
        model_free(mq);
    }
    if (!positions) return;
    printf("  %ld prefill positions over %zu fixtures; %d of %d FP8 matrices have a native GEMM in this binary (the "
           "fixtures' widths are mostly below what the native GEMMs take: cuda_native.h)\n",
           positions, sizeof dirs / sizeof dirs[0], n_native, n_mats);
    native_row("kl_bf16_fp8_mean", kl_gpu / positions);
    native_row("kl_bf16_fp8_cpu_mean", kl_cpu / positions);
}

/* ---- part 3 addition: weight-only GEMV vs native GEMM per batch size (bench_crossover.h) ---- */
/* Both paths on the two Qwen3-8B MLP shapes by the server's ladder (1, 2, 3, 4, 6, 8, ... to 64,
 * then on until native has won twice in a row); per-shape rows and the crossover row (the larger). */
static void bench_native_crossover(void) {
    const int shapes[2][2] = {{12288, 4096}, {4096, 12288}};
    int caps = cuda_native_caps();
    if (!caps) {
        printf("  native GEMMs: none in this binary (cuda_native.h)\n");
        return;
    }
    for (int fp4 = 0; fp4 < 2; fp4++) {
        if (fp4 && !(caps & CUDA_NATIVE_NVFP4)) continue;
        int cross = 0; /* over both shapes: -1 when either never takes native */
        for (int sh = 0; sh < 2; sh++) {
            int c = native_xover_shape(fp4, shapes[sh][0], shapes[sh][1], 512, native_row);
            cross = c < 0 || cross < 0 ? -1 : c > cross ? c : cross;
        }
        printf("  %s crossover: native from n = %d on both shapes (what a server measures at start-up for them; "
               "unmeasured, CUDA_NATIVE_MIN_N = %d; -1: native never won)\n", fp4 ? "nvfp4" : "fp8", cross,
               CUDA_NATIVE_MIN_N);
        native_row(fp4 ? "native_nvfp4_crossover_n" : "native_fp8_crossover_n", cross);
    }
}

/* The summary's machine rows. */
static void native_summary(void) {
    if (!n_native_rows) return;
    printf("\n| native FP8/NVFP4 row (bench/gpu JSON) | value |\n|---|---|\n");
    for (int i = 0; i < n_native_rows; i++) printf("| %s | %.6g |\n", native_rows[i].name, native_rows[i].v);
}

#endif
