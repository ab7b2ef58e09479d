/*
 * gpu_check.c - the one-shot GPU check (run by tests/gpu/check.sh on a machine
 * with a GPU; CI only compiles it). Three parts, then one summary table:
 *
 *   1. ops: every op of the CUDA backend against the CPU backend (the
 *      reference ops) on fresh random inputs, GPU outputs poisoned with NaN
 *      before each run so an unwritten element fails: every row of the table
 *      in tests/gpu/op_checks.h (shared with the emulation, tests/gpu/emu),
 *      with its tolerance classes (exact, f32, bf16act).
 *   2. models: every fixture (tests/fixtures/NAME, models/tiny-qwen3) end to end
 *      on the GPU against transformers' logits (ref.safetensors) and against
 *      the CPU backend: a prefill of each recorded sequence (> 8 tokens: the
 *      cuBLAS path with bf16 activations) and one-token decode steps (GEMV,
 *      f32 throughout). Bounds: see MAX_* below. The CPU side rounds matmul
 *      inputs to bf16 where the GPU does. Then the long-context fixture
 *      (tests/fixtures/qwen3_long, 8k and 32k tokens in 2048-token chunks;
 *      tests/long_context.h) with f32 and BF16 KV.
 *   3. bench: a Qwen3-8B-shaped model with random BF16 weights made directly
 *      in device memory; decode tok/s at batch 1, 32, 128 (context 512) and
 *      prefill tok/s (4 x 1024 tokens; f32 KV, and BF16 KV whose attention runs
 *      on tensor cores; that attention alone on both kernels), each as a fraction of a roofline
 *      measured in the same run (device-to-device copy bandwidth; cuBLAS
 *      BF16 GEMM FLOP/s with the prefill's types).
 *
 * Part 1 also covers the weight-only FP8/NVFP4 GEMV and the delta scatter; part
 * 2 also runs two fixtures with LoRA adapters (tests/gpu/lora_checks.h: a mixed
 * batch of two adapters and the base vs the CPU and transformers + peft, an
 * in-place replacement; f32 and bf16 adapter storage), and
 * runs fixtures at FP8/NVFP4 (vs the CPU at the same precision) and applies a
 * sparse delta to each fixture on the device (XXH3 of the device copy vs the
 * host's); part 3 adds FP8/NVFP4 weight-only decode at batch 1 and 8. The
 * native FP8/NVFP4 paths (issue 19): their op rows in part 1
 * (op_checks_native.h), KL(bf16 || fp8) on the fixtures after part 2, the
 * weight-only vs native crossover and native FP8 decode at batch 32 / 128 in
 * part 3 (bench_native.h), machine rows in the summary.
 * The three parts run as the sections of SECTIONS (tests/gpu/check_sections.h):
 * each under a watchdog, the device context checked after each (and after
 * every op row), and the JSON rewritten before and after each, so that a
 * section that faults, hangs or exits costs only itself: check.sh resumes
 * after it in a fresh process (bench/gpu_json.py resume).
 * Usage: gpu_check-smXX [--skip-bench] [--skip-sections A,B,..] [--ops-from ROW]
 * [--list-sections] [--json FILE] (from the repo root; --json writes the
 * summary for bench/gpu_json.py, the native rows as "named_rows", and the
 * sections' progress). Exit 1 on any failed check, 3 when a step died.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "cpu_ops.h"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "dtype.h"
#include "delta.h"
#include "model.h"
#include "quant.h"
#include "safetensors.h"

#include "check_sections.h"
#include "op_checks.h"
#include "../long_context.h"
#include "lora_checks.h"
#include "sampling_checks.h"
#include "engine_devsample_check.h"
#include "attn_bounds.h"

/* ---- part 2 bounds ----
 * The GPU is compared with transformers and with a CPU backend whose matmul
 * rounds its input to bf16 exactly when the GPU does (n > CUDA_GEMV_MAX_N, the
 * cuBLAS path). One-token decode steps are f32 throughout: GPU vs CPU and GPU
 * vs transformers differ only by summation order and device libm (the CPU
 * alone is within 1e-5 / 3e-12 of transformers), bound 1e-3 / 1e-7, while a
 * real bug moves logits by > 1e-2. Steps of more than 8 tokens round matmul
 * inputs to bf16: against transformers the CPU rounded the same way measured
 * max|dlogit| 6.4e-2 and KL 1.9e-4 over these fixtures, bound 0.2 / 1e-3;
 * against the rounding CPU, an input within ~1e-7 of a bf16 rounding midpoint
 * rounds the other way on one side, and one such flip measured 1.9e-2 / 1.7e-5
 * on these tiny random models (tests/gpu/README.md), bound 0.1 / 3e-4. */
#define MAX_ABS_F32 1e-3
#define MAX_KL_F32 1e-7
#define MAX_ABS_BF16ACT 0.2
#define MAX_KL_BF16ACT 1e-3
#define MAX_ABS_FLIP 0.1
#define MAX_KL_FLIP 3e-4

/* ---- part 1: ops (the table of tests/gpu/op_checks.h) ---- */
static size_t ops_from; /* --ops-from ROW: check.sh's resume after the row that died */

/* Each row of the table is a step of its own ("ops@ROW", 60 s). */
static void ops_row_begin(size_t row) { check_row_begin("ops", row, 60); }

static void section_ops(void) {
    printf("== 1. ops: CUDA backend vs CPU reference ops ==\n");
    if (ops_from) printf("   from row %zu of %zu (--ops-from)\n", ops_from, op_checks_row_count());
    bc = backend_cpu_create(0, 32768); /* op_checks.h's long-context rows reach position 32767 */
    bg = backend_cuda_create_resident(0, 2048);
    op_checks_run_from(1, 0, ops_from, ops_row_begin);
    check_rows_end();
    bg->free(bg);
    bc->free(bc);
}

static void section_sampling(void) {
    printf("   device sampler vs sampler_sample (tests/gpu/sampling_checks.h)\n");
    bc = backend_cpu_create(0, 32768);
    bg = backend_cuda_create_resident(0, 2048);
    sampling_checks_run(1);
    bg->free(bg);
    bc->free(bc);
}

/* ---- part 2: fixture models ---- */
typedef struct Cmp { double max_abs, max_kl; int rows; } Cmp;

/* Folds one comparison into c (the maxima over calls; NaN propagates). */
static void logit_cmp(Cmp *c, const float *ref, const float *ours, int rows, int vocab) {
    LogitStats st = logit_stats(ref, ours, rows, vocab);
    c->rows += rows;
    if (!(st.max_abs <= c->max_abs)) c->max_abs = st.max_abs;
    if (!(st.max_kl <= c->max_kl)) c->max_kl = st.max_kl;
}

static void bound(const char *dir, const char *what, Cmp c, double max_abs, double max_kl) {
    if (!c.rows) { /* nothing recorded to compare (e.g. no decode logits in ref.safetensors) */
        printf("  skip %-30s %-22s no reference rows\n", dir, what);
        return;
    }
    int ok = c.max_abs <= max_abs && c.max_kl <= max_kl;
    ok ? n_pass++ : n_fail++;
    printf("  %-4s %-30s %-22s max|dlogit| %.2e (<= %.0e)  KL %.2e (<= %.0e)\n", ok ? "ok" : "FAIL", dir, what,
           c.max_abs, max_abs, c.max_kl, max_kl);
}

#define FX_BLOCK 4

/* The CPU matmul fed what the GPU's cuBLAS path computes with: x rounded to bf16 for n > CUDA_GEMV_MAX_N. */
static void (*cpu_matmul_op)(Backend *, float *, const float *, int, const WeightMat *, const uint16_t *);
static void matmul_bf16act(Backend *b, float *out, const float *x, int n, const WeightMat *w, const uint16_t *bias) {
    if (n <= CUDA_GEMV_MAX_N || w->fmt != WF_BF16) { /* FP8/NVFP4: the GPU's weight-only kernel takes f32 x */
        cpu_matmul_op(b, out, x, n, w, bias);
        return;
    }
    size_t N = (size_t)n * w->cols;
    float *xr = xmalloc(sizeof(float) * N);
    for (size_t i = 0; i < N; i++) xr[i] = bf16_to_f32(f32_to_bf16(x[i]));
    cpu_matmul_op(b, out, xr, n, w, bias);
    free(xr);
}

/* Prefill of tokens [T] as sequence 0 into blocks bt, logits of every position. */
static int prefill(Runner *r, KVCache *kv, const int32_t *tok, int T, const int32_t *bt, float *out, Err *err) {
    int32_t pos[128], seq[128], rows[128];
    for (int i = 0; i < T; i++) { pos[i] = i; seq[i] = 0; rows[i] = i; }
    const int32_t *tables[1] = {bt};
    Batch b = {T, tok, pos, seq, 1, tables, T, rows, 0};
    return model_forward(r, kv, &b, out, err);
}

/* Issue 8 step 3: a sparse delta on layer 0's o_proj master as admin_touched
 * applies it (host master patched, FP8/NVFP4 blocks re-quantized, then
 * runner_weights_changed with the touched indices: BF16 scatters them into the
 * device copy and reads them back; quantized matrices re-upload). Checks: the
 * CPU logits moved (else a stale device copy would pass), the GPU follows the
 * CPU, and for BF16 the device copy hashes (XXH3, as the delta format) like the
 * host master. */
static void fixture_delta(const char *dir, Model *m, Precision prec, Backend *gb, Runner *rc, KVCache *kvc, Runner *rg,
                          KVCache *kvg, const int32_t *tok, int T, const int32_t *bt) {
    Err err = {0};
    int V = m->cfg.vocab;
    WeightMat *w = &m->layers[0].o;
    size_t numel = (size_t)w->rows * w->cols, wb = sizeof(uint16_t) * numel;
    float *before = xmalloc(sizeof(float) * (size_t)T * V), *oc = xmalloc(sizeof(float) * (size_t)T * V),
          *og = xmalloc(sizeof(float) * (size_t)T * V);
    int rc1 = prefill(rc, kvc, tok, T, bt, before, &err);
    int64_t idx[24];
    int n_idx = 0;
    for (int i = 0; i < 24; i++) { /* increasing and distinct, as delta commit passes them */
        idx[n_idx] = (int64_t)(i * (numel / 24) + rng_u64() % (numel / 24));
        w->bf16[idx[n_idx++]] = f32_to_bf16(i % 2 ? 0.75f : -0.75f);
    }
    int rq = prec == PREC_BF16 ? 0
             : prec == PREC_FP8 ? quant_fp8_requant((QuantFp8 *)w->q, w->bf16, idx, n_idx, &err)
                                : quant_nvfp4_requant((QuantNvfp4 *)w->q, w->bf16, idx, n_idx, &err);
    int ru = rq < 0 ? -1 : runner_weights_changed(rg, w->bf16, wb, idx, n_idx, 2, &err);
    rc1 |= prefill(rc, kvc, tok, T, bt, oc, &err);
    int rc2 = prefill(rg, kvg, tok, T, bt, og, &err);
    if (rq < 0 || ru || rc1 || rc2) {
        printf("  FAIL %s %s delta: %s\n", dir, precision_name(prec), err.msg);
        n_fail++;
    }
    double moved = 0;
    for (size_t i = 0; i < (size_t)T * V; i++) moved = fmax(moved, fabs((double)oc[i] - before[i]));
    int ok = moved > 1e-2;
    ok ? n_pass++ : n_fail++;
    printf("  %-4s %-30s %-22s cpu logits moved by %.2e (> 1e-2)\n", ok ? "ok" : "FAIL", dir, "delta (24 elements)", moved);
    if (prec == PREC_BF16) {
        uint16_t *dev = xmalloc(wb);
        uint64_t hd = backend_cuda_read_weight(gb, w, dev, wb) == 0 ? delta_hash(dev, wb) : 0,
                 hh = delta_hash(w->bf16, wb);
        ok = hd == hh;
        ok ? n_pass++ : n_fail++;
        printf("  %-4s %-30s %-22s device copy XXH3 %016llx, host %016llx\n", ok ? "ok" : "FAIL", dir,
               "delta scatter hash", (unsigned long long)hd, (unsigned long long)hh);
        free(dev);
    }
    Cmp c = {0};
    logit_cmp(&c, oc, og, T, V);
    bound(dir, "prefill after delta vs cpu", c, MAX_ABS_FLIP, MAX_KL_FLIP);
    free(before); free(oc); free(og);
}

/* prec: BF16 compares with transformers and the CPU; FP8/NVFP4 (decoder linears
 * quantized weight-only on load, the same Model on both backends) with the CPU
 * at the same precision only (transformers is BF16). kvt: the KV cache dtype of
 * both runners; BF16 / FP8 KV compare with the CPU at the same KV dtype only,
 * with the flip bounds for decode too (a K/V element within an ulp of a
 * rounding midpoint may round the other way on the two sides). */
static void run_fixture_kv(const char *dir, Precision prec, KvDtype kvt) {
    Err err = {0};
    Model *m = NULL;
    char path[512], label[64];
    snprintf(path, sizeof path, "%s/ref.safetensors", dir);
    SafeTensors *ref = NULL;
    if (model_load(&m, dir, &err) || (prec != PREC_BF16 && model_quantize(m, prec, 1, &err)) ||
        safetensors_open(&ref, path, &err)) {
        printf("  FAIL %s: %s\n", dir, err.msg);
        n_fail++;
        model_free(m);
        return;
    }
    snprintf(label, sizeof label, "%s%s%s%s%s", dir, prec == PREC_BF16 ? "" : " ", prec == PREC_BF16 ? "" : precision_name(prec),
             kvt == KV_F32 ? "" : " kv ", kvt == KV_F32 ? "" : kv_dtype_name(kvt));
    int exact_kv = kvt == KV_F32;
    int V = m->cfg.vocab, max_ctx = 128;
    Backend *cpu = backend_cpu_create(0, max_ctx), *gb = backend_cuda_create(&m->weights, m->cfg.head_dim, max_ctx);
    cpu_matmul_op = cpu->matmul;
    cpu->matmul = matmul_bf16act;
    Runner *rc = runner_create_with(m, cpu, 128, max_ctx);
    Runner *rg = runner_create_with(m, gb, 128, max_ctx);
    KVCache *kvc = kvcache_create_dtype(&m->cfg, 128, FX_BLOCK, kvt),
            *kvg = runner_kvcache_create_dtype(rg, 128, FX_BLOCK, kvt);
    Cmp pre_ref = {0}, pre_cpu = {0}, dec_ref = {0}, dec_cpu = {0};
    int32_t bt[32];
    for (int s = 0; s < 8; s++) {
        snprintf(path, sizeof path, "seq%d.tokens", s);
        const StTensor *tt = safetensors_get(ref, path);
        if (!tt) break;
        int T = (int)tt->numel;
        const int32_t *tok = (const int32_t *)tt->data;
        snprintf(path, sizeof path, "seq%d.prefill_logits", s);
        const float *lp = (const float *)safetensors_get(ref, path)->data;
        snprintf(path, sizeof path, "seq%d.decode_logits", s);
        const StTensor *dt = safetensors_get(ref, path);
        int32_t pos[128], seq[128];
        for (int i = 0; i < (T + FX_BLOCK - 1) / FX_BLOCK; i++) bt[i] = 1 + 2 * ((T + FX_BLOCK - 1) / FX_BLOCK - 1 - i);
        const int32_t *tables[1] = {bt};
        for (int i = 0; i < T; i++) { pos[i] = i; seq[i] = 0; }
        float *oc = xmalloc(sizeof(float) * (size_t)T * V), *og = xmalloc(sizeof(float) * (size_t)T * V);
        if (prefill(rc, kvc, tok, T, bt, oc, &err) || prefill(rg, kvg, tok, T, bt, og, &err)) {
            printf("  FAIL %s seq%d prefill: %s\n", label, s, err.msg);
            n_fail++;
        }
        if (prec == PREC_BF16 && exact_kv) logit_cmp(&pre_ref, lp, og, T, V);
        logit_cmp(&pre_cpu, oc, og, T, V);
        for (int i = 0; dt && i < T; i++) {
            int32_t zero = 0;
            Batch b1 = {1, tok + i, pos + i, seq, 1, tables, 1, &zero, 0};
            if (model_forward(rc, kvc, &b1, oc, &err) || model_forward(rg, kvg, &b1, og, &err)) {
                printf("  FAIL %s seq%d decode %d: %s\n", label, s, i, err.msg);
                n_fail++;
            }
            if (prec == PREC_BF16 && exact_kv) logit_cmp(&dec_ref, (const float *)dt->data + (size_t)i * V, og, 1, V);
            logit_cmp(&dec_cpu, oc, og, 1, V);
        }
        free(oc);
        free(og);
    }
    if (prec == PREC_BF16 && exact_kv) bound(label, "prefill vs transformers", pre_ref, MAX_ABS_BF16ACT, MAX_KL_BF16ACT);
    /* BF16 / FP8 caches at head_dim 64 / 128: sequences of 16+ tokens prefill on the tensor cores
     * (cuda_attention_mma_fits), Q and P in bf16 (attn_bounds.h) */
    int tc = !exact_kv && (m->cfg.head_dim == 64 || m->cfg.head_dim == 128);
    bound(label, tc ? "prefill vs cpu (tensor-core attn)" : "prefill vs cpu (bf16 act)", pre_cpu,
          tc ? ATTN_TOL[kvt].pre_abs : MAX_ABS_FLIP, tc ? ATTN_TOL[kvt].pre_kl : MAX_KL_FLIP);
    if (prec == PREC_BF16 && exact_kv) bound(label, "decode vs transformers", dec_ref, MAX_ABS_F32, MAX_KL_F32);
    if (exact_kv) bound(label, "decode vs cpu", dec_cpu, MAX_ABS_F32, MAX_KL_F32);
    else bound(label, "decode vs cpu (same kv)", dec_cpu, MAX_ABS_FLIP, MAX_KL_FLIP);
    const StTensor *t0 = safetensors_get(ref, "seq0.tokens");
    int T0 = (int)t0->numel;
    for (int i = 0; i < (T0 + FX_BLOCK - 1) / FX_BLOCK; i++) bt[i] = 2 * i;
    fixture_delta(label, m, prec, gb, rc, kvc, rg, kvg, (const int32_t *)t0->data, T0, bt);
    runner_kvcache_free(rg, kvg);
    kvcache_free(kvc);
    runner_free(rg);
    runner_free(rc);
    safetensors_free(ref);
    model_free(m);
}

/* The benches' NVFP4 tensor scale (1e-3) in device memory, where the kernels read it: made once,
 * kept for the process. */
static const float *bench_scale2(void) {
    static void *d;
    const float v = 1e-3f;
    if (!d) d = dev_copy(&v, sizeof v);
    return (const float *)d;
}

#include "bench_native.h"
static void run_fixture(const char *dir, Precision prec) { run_fixture_kv(dir, prec, KV_F32); }

/* The 8k and 32k sequences of tests/fixtures/qwen3_long (tests/long_context.h:
 * chunked prefill of 2048-token steps, then 4 decode steps) on the GPU and on
 * the CPU rounding matmul inputs as the GPU does. The decode rows read a KV
 * cache the bf16-activation prefill wrote, so every row is in the bf16-act
 * class: vs transformers (f32 KV only) MAX_*_BF16ACT, vs the CPU MAX_*_FLIP.
 * The fixture's head_dim is 16, so BF16 KV runs the CUDA-core kernel reading
 * bf16 (attention.cu; the tensor-core kernels take head_dim 64 / 128 only: their
 * model-level rows are qwen3_g8_hd128 / qwen3_hd64_g4 in section_kv_dtypes, and
 * 8k-32k contexts are op_checks.h's long rows); f32 KV the same kernel on f32. */
static void run_long_fixture(KvDtype kvt) {
    Err err = {0};
    Model *m = NULL;
    SafeTensors *ref = NULL;
    if (model_load(&m, LONG_DIR, &err) || safetensors_open(&ref, LONG_DIR "/ref.safetensors", &err)) {
        printf("  FAIL %s: %s\n", LONG_DIR, err.msg);
        n_fail++;
        model_free(m);
        return;
    }
    int V = m->cfg.vocab;
    Backend *cpu = backend_cpu_create(0, LONG_MAX_T), *gb = backend_cuda_create(&m->weights, m->cfg.head_dim, LONG_MAX_T);
    cpu_matmul_op = cpu->matmul;
    cpu->matmul = matmul_bf16act;
    Runner *rc = runner_create_with(m, cpu, LONG_CHUNK, LONG_MAX_T);
    Runner *rg = runner_create_with(m, gb, LONG_CHUNK, LONG_MAX_T);
    KVCache *kvc = kvcache_create_dtype(&m->cfg, LONG_KV_BLOCKS, LONG_BLOCK, kvt),
            *kvg = runner_kvcache_create_dtype(rg, LONG_KV_BLOCKS, LONG_BLOCK, kvt);
    for (int s = 0; s < 2; s++) {
        LongSeq ls;
        char label[96];
        if (long_seq_get(ref, s, V, &ls)) {
            printf("  FAIL %s seq%d: reference tensors missing or malformed\n", LONG_DIR, s);
            n_fail++;
            continue;
        }
        snprintf(label, sizeof label, "%s %dk kv %s", LONG_DIR, ls.T / 1024, kv_dtype_name(kvt));
        float *oc = xmalloc(sizeof(float) * (size_t)ls.P * V), *og = xmalloc(sizeof(float) * (size_t)ls.P * V);
        if (long_seq_run(rc, kvc, &ls, V, oc, &err) || long_seq_run(rg, kvg, &ls, V, og, &err)) {
            printf("  FAIL %s: %s\n", label, err.msg);
            n_fail++;
        } else {
            Cmp vs_ref = {0}, vs_cpu = {0};
            logit_cmp(&vs_cpu, oc, og, ls.P, V);
            bound(label, "vs cpu (bf16 act)", vs_cpu, MAX_ABS_FLIP, MAX_KL_FLIP);
            if (kvt == KV_F32) {
                logit_cmp(&vs_ref, ls.logits, og, ls.P, V);
                bound(label, "vs transformers", vs_ref, MAX_ABS_BF16ACT, MAX_KL_BF16ACT);
            }
        }
        free(oc);
        free(og);
    }
    runner_kvcache_free(rg, kvg);
    kvcache_free(kvc);
    runner_free(rg);
    runner_free(rc);
    safetensors_free(ref);
    model_free(m);
}

/* Part 2 in sections, so that a fixture that breaks the device context costs
 * only its own section (check.sh resumes after it). */
static void section_models_bf16(void) {
    printf("== 2. fixture models: GPU vs transformers and vs the CPU backend ==\n");
    const char *dirs[] = {"tests/fixtures/qwen3_gqa2", "tests/fixtures/qwen3_mha_sharded", "tests/fixtures/qwen3_moe",
                          "tests/fixtures/qwen3_moe_nonorm", "tests/fixtures/llama31", "tests/fixtures/qwen2",
                          "tests/fixtures/qwen3_g8_hd128", "tests/fixtures/qwen3_hd64_g4", "models/tiny-qwen3"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) run_fixture(dirs[i], PREC_BF16);
}

/* weight-only FP8 (MoE experts too) and NVFP4 (llama31, tiny-qwen3: every width a multiple of 16) */
static void section_models_quant(void) {
    run_fixture("tests/fixtures/qwen3_moe", PREC_FP8);
    run_fixture("tests/fixtures/qwen2", PREC_FP8);
    run_fixture("models/tiny-qwen3", PREC_FP8);
    run_fixture("tests/fixtures/llama31", PREC_NVFP4);
    run_fixture("tests/fixtures/qwen3_moe_fp4", PREC_NVFP4); /* NVFP4 experts grouped on the device */
    run_fixture("models/tiny-qwen3", PREC_NVFP4);
}

/* LoRA adapters end to end (tests/gpu/lora_checks.h): f32 and bf16 storage */
static void section_lora(void) {
    lora_model_check("qwen3_gqa2", 0, 0, NULL, NULL);
    lora_model_check("llama31", 1, 0, NULL, NULL);
    lora_model_check("qwen3_moe", 0, 0, NULL, NULL); /* the routed experts' pairs (both layouts) */
}

/* the engine: device sampling on vs off over the same device forward */
static void section_devsample(void) {
    engine_devsample_check("tests/fixtures/qwen2");
    engine_devsample_check("models/tiny-qwen3");
    engine_experts_check("tests/fixtures/qwen3_moe");
}

/* the KV cache dtypes of --kv-cache-dtype (GQA, MoE, MHA; the bundled model) */
static void section_kv_dtypes(void) {
    run_fixture_kv("tests/fixtures/qwen3_gqa2", PREC_BF16, KV_BF16);
    run_fixture_kv("tests/fixtures/qwen3_moe", PREC_BF16, KV_BF16);
    run_fixture_kv("models/tiny-qwen3", PREC_BF16, KV_BF16);
    run_fixture_kv("tests/fixtures/qwen3_mha_sharded", PREC_BF16, KV_FP8);
    run_fixture_kv("models/tiny-qwen3", PREC_BF16, KV_FP8);
    /* the production attention shapes: decode on the tensor cores (8 heads a KV head, head_dim
     * 128: attention_dec_mma.cu) and the vector kernel (head_dim 64), prefill on attention_mma.cu */
    run_fixture_kv("tests/fixtures/qwen3_g8_hd128", PREC_BF16, KV_BF16);
    run_fixture_kv("tests/fixtures/qwen3_g8_hd128", PREC_BF16, KV_FP8);
    run_fixture_kv("tests/fixtures/qwen3_hd64_g4", PREC_BF16, KV_BF16);
    run_fixture_kv("tests/fixtures/qwen3_hd64_g4", PREC_BF16, KV_FP8);
}

/* long contexts: 8k and 32k tokens (issue 18) */
static void section_long_f32(void) { run_long_fixture(KV_F32); }
static void section_long_bf16(void) { run_long_fixture(KV_BF16); }

/* ---- part 3: benchmark ---- */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

typedef struct BenchRow { char name[48]; double tok_s, ms, roof_tok_s, frac; } BenchRow;
static BenchRow rows_out[48];
static int n_rows;
static double bw_gbs, gemm_tfs;

static void measure_roofline(void) {
    size_t bytes = (size_t)2 << 30;
    void *a, *b;
    CUDA_CHECK(cudaMalloc(&a, bytes));
    CUDA_CHECK(cudaMalloc(&b, bytes));
    CUDA_CHECK(cudaMemset(a, 1, bytes));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    int it = 10;
    float ms = 0;
    CUDA_CHECK(cudaEventRecord(e0, 0));
    for (int i = 0; i < it; i++) CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0));
    CUDA_CHECK(cudaEventRecord(e1, 0));
    CUDA_CHECK(cudaEventSynchronize(e1));
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    bw_gbs = 2.0 * bytes * it / (ms / 1e3) / 1e9; /* read + write */
    CUDA_CHECK(cudaFree(a));
    CUDA_CHECK(cudaFree(b));
    /* GEMM with the prefill's types: bf16 x bf16, f32 accumulate, f32 out */
    int N = 8192;
    void *A, *B, *C;
    CUDA_CHECK(cudaMalloc(&A, (size_t)N * N * 2));
    CUDA_CHECK(cudaMalloc(&B, (size_t)N * N * 2));
    CUDA_CHECK(cudaMalloc(&C, (size_t)N * N * 4));
    cuda_fill_bf16(A, (size_t)N * N, 1, 0, 1, NULL);
    cuda_fill_bf16(B, (size_t)N * N, 2, 0, 1, NULL);
    cublasHandle_t h;
    CUDA_CHECK(cublasCreate(&h));
    const float one = 1, zero = 0;
    for (int i = 0; i < it + 2; i++) {
        if (i == 2) CUDA_CHECK(cudaEventRecord(e0, 0));
        CUDA_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, N, N, &one, A, CUDA_R_16BF, N, B, CUDA_R_16BF, N, &zero,
                                C, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    CUDA_CHECK(cudaEventRecord(e1, 0));
    CUDA_CHECK(cudaEventSynchronize(e1));
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    gemm_tfs = 2.0 * N * (double)N * N * it / (ms / 1e3) / 1e12;
    cublasDestroy(h);
    CUDA_CHECK(cudaFree(A));
    CUDA_CHECK(cudaFree(B));
    CUDA_CHECK(cudaFree(C));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    printf("  roofline: device-to-device copy %.0f GB/s; cuBLAS BF16 GEMM (f32 acc/out, %d^3) %.0f TFLOP/s\n", bw_gbs,
           N, gemm_tfs);
}

/* Qwen3-8B shapes. */
static void qwen3_8b_config(ModelConfig *c) {
    memset(c, 0, sizeof *c);
    c->arch = ARCH_QWEN3;
    snprintf(c->arch_name, sizeof c->arch_name, "Qwen3ForCausalLM (random, Qwen3-8B shapes)");
    c->hidden = 4096;
    c->n_layers = 36;
    c->n_heads = 32;
    c->n_kv_heads = 8;
    c->head_dim = 128;
    c->intermediate = 12288;
    c->vocab = 151936;
    c->max_pos = 40960;
    c->rms_eps = 1e-6f;
    c->rope_theta = 1e6f;
    c->qk_norm = 1;
    c->bos_id = -1;
}

static WeightMat wmat(size_t rows, size_t cols, uint16_t *p) {
    return (WeightMat){.fmt = WF_BF16, .rows = (int)rows, .cols = (int)cols, .bf16 = p, .dev = p};
}

/* A vector already in device memory (what the ops of a device backend are handed). */
static WeightVec dvec(const uint16_t *p) {
    return (WeightVec){.host = NULL, .dev = p};
}

/* Weights carved from one device arena, filled with random bf16. */
static uint16_t *carve(char **cur, size_t n, uint64_t seed, float mean, float scale) {
    uint16_t *p = (uint16_t *)*cur;
    *cur += (n * 2 + 255) / 256 * 256;
    if (cuda_fill_bf16(p, n, seed, mean, scale, NULL)) { fprintf(stderr, "fatal: fill\n"); exit(1); }
    return p;
}

/* The parts every bench model shares, carved in this order: embedding, final
 * norm and lm_head (carve_model_ends), and per layer its two norms, QK norms
 * and attention matrices (carve_layer_attn); the callers add the MLP or the
 * experts after each layer's attention. */
static void carve_model_ends(Model *m, char **cur, uint64_t *seed, float ws) {
    const ModelConfig *c = &m->cfg;
    size_t H = c->hidden, V = c->vocab;
    m->embed = dvec(carve(cur, V * H, (*seed)++, 0, 0.05f));
    m->final_norm = dvec(carve(cur, H, (*seed)++, 1, 0.1f));
    m->lm_head = wmat(V, H, carve(cur, V * H, (*seed)++, 0, ws));
    m->layers = xcalloc((size_t)c->n_layers, sizeof(LayerWeights));
}

static void carve_layer_attn(LayerWeights *w, const ModelConfig *c, char **cur, uint64_t *seed, float ws) {
    size_t H = c->hidden, qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    w->attn_norm = dvec(carve(cur, H, (*seed)++, 1, 0.1f));
    w->mlp_norm = dvec(carve(cur, H, (*seed)++, 1, 0.1f));
    w->q_norm = dvec(carve(cur, c->head_dim, (*seed)++, 1, 0.1f));
    w->k_norm = dvec(carve(cur, c->head_dim, (*seed)++, 1, 0.1f));
    w->q = wmat(qd, H, carve(cur, qd * H, (*seed)++, 0, ws));
    w->k = wmat(kvd, H, carve(cur, kvd * H, (*seed)++, 0, ws));
    w->v = wmat(kvd, H, carve(cur, kvd * H, (*seed)++, 0, ws));
    w->o = wmat(H, qd, carve(cur, H * qd, (*seed)++, 0, ws));
}

#define BENCH_CTX 512
#define BENCH_STEPS 16
#define BENCH_MAX_CTX 1088
#define PREFILL_SEQS 4
#define PREFILL_LEN 1024
#define BS 16

/* B sequences decoding BENCH_STEPS tokens from position ctx on (their blocks:
 * blocks_per_seq of tables_mem each); the roofline reads the weights and every
 * sequence's KV (kv's element size) once per step. */
static void bench_decode_ctx(Runner *r, KVCache *kv, const ModelConfig *c, int B, int ctx, double weight_bytes,
                             float *logits, int32_t *tables_mem, int blocks_per_seq, const char *prec) {
    int32_t *tok = xmalloc(sizeof(int32_t) * B), *pos = xmalloc(sizeof(int32_t) * B),
            *seq = xmalloc(sizeof(int32_t) * B), *rows = xmalloc(sizeof(int32_t) * B);
    const int32_t **tables = xmalloc(sizeof(int32_t *) * B);
    for (int i = 0; i < B; i++) {
        tok[i] = (int32_t)(rng_u64() % (uint64_t)c->vocab);
        seq[i] = i;
        rows[i] = i;
        tables[i] = tables_mem + (size_t)i * blocks_per_seq;
    }
    Err err = {0};
    double t0 = 0, kv_bytes = 0,
           slot_bytes = (double)c->n_layers * c->n_kv_heads * c->head_dim * kv_dtype_elem(kv->dtype) * 2;
    CHECK((ctx + BENCH_STEPS) / BS < blocks_per_seq, "bench: %d positions need more than %d blocks (a bug)",
          ctx + BENCH_STEPS, blocks_per_seq);
    for (int step = -2; step < BENCH_STEPS; step++) {
        if (step == 0) t0 = now_s();
        int p = ctx + (step < 0 ? 0 : step);
        for (int i = 0; i < B; i++) pos[i] = p;
        if (step >= 0) kv_bytes += (double)B * (p + 1) * slot_bytes;
        Batch b = {B, tok, pos, seq, B, tables, B, rows, 0};
        if (model_forward(r, kv, &b, logits, &err)) { fprintf(stderr, "fatal: decode: %s\n", err.msg); exit(1); }
    }
    double dt = now_s() - t0, step_s = dt / BENCH_STEPS;
    double roof_step = (weight_bytes + kv_bytes / BENCH_STEPS) / (bw_gbs * 1e9);
    ASSERT(n_rows < (int)(sizeof rows_out / sizeof rows_out[0]), "more bench rows than rows_out holds");
    BenchRow *row = &rows_out[n_rows++];
    snprintf(row->name, sizeof row->name, "%s decode batch %d (ctx %d)", prec, B, ctx);
    row->tok_s = B / step_s;
    row->ms = step_s * 1e3;
    row->roof_tok_s = B / roof_step;
    row->frac = roof_step / step_s;
    printf("  %-28s %9.1f tok/s  %8.2f ms/step  roofline %9.1f tok/s  %5.1f%%\n", row->name, row->tok_s, row->ms,
           row->roof_tok_s, 100 * row->frac);
    free(tok); free(pos); free(seq); free(rows); free(tables);
}

static void bench_decode(Runner *r, KVCache *kv, const ModelConfig *c, int B, double weight_bytes, float *logits,
                         int32_t *tables_mem, int blocks_per_seq, const char *prec) {
    bench_decode_ctx(r, kv, c, B, BENCH_CTX, weight_bytes, logits, tables_mem, blocks_per_seq, prec);
}

/* Issue 18's long-context row: batch 8 decoding at context 32k with the BF16 KV
 * cache (the server's default), on a runner and backend sized for that context
 * (the backend picks its attention splits from max_ctx, as a server started
 * with --max-model-len 32k+ does). 8 x 32k positions of Qwen3-8B's BF16 KV are
 * 38.7 GiB: skipped, and said, where the device has less free. */
#define LONG_BENCH_CTX 32768
#define LONG_BENCH_B 8
static void bench_decode_long(Model *m, double weight_bytes, float *logits) {
    const ModelConfig *c = &m->cfg;
    int max_ctx = LONG_BENCH_CTX + BENCH_STEPS + BS, bps = max_ctx / BS + 1, n_blocks = LONG_BENCH_B * bps;
    size_t kv_bytes = (size_t)n_blocks * BS * c->n_layers * c->n_kv_heads * c->head_dim * 2 * 2;
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if ((double)kv_bytes + (2u << 30) > (double)free_b) {
        printf("  SKIP decode batch %d at ctx %d: its BF16 KV needs %.1f GiB, %.1f GiB free\n", LONG_BENCH_B,
               LONG_BENCH_CTX, kv_bytes / 1073741824.0, free_b / 1073741824.0);
        return;
    }
    Backend *b = backend_cuda_create_resident(c->head_dim, max_ctx);
    Runner *r = runner_create_with(m, b, LONG_BENCH_B, max_ctx);
    KVCache *kv = runner_kvcache_create_dtype(r, n_blocks, BS, KV_BF16);
    int32_t *tables = xmalloc(sizeof(int32_t) * (size_t)n_blocks);
    for (int i = 0; i < n_blocks; i++) tables[i] = i;
    bench_decode_ctx(r, kv, c, LONG_BENCH_B, LONG_BENCH_CTX, weight_bytes, logits, tables, bps, "bf16");
    free(tables);
    runner_kvcache_free(r, kv);
    runner_free(r);
}

#include "bench_moe.h" /* the Qwen3-30B-A3B-shaped MoE decode rows */
#include "bench_delta_quant.h" /* a quantized matrix's device update after a delta */

static void bench_prefill(Runner *r, KVCache *kv, const ModelConfig *c, double mat_params, float *logits,
                          int32_t *tables_mem, int blocks_per_seq, const char *label) {
    int S = PREFILL_SEQS, L = PREFILL_LEN, T = S * L;
    int32_t *tok = xmalloc(sizeof(int32_t) * T), *pos = xmalloc(sizeof(int32_t) * T),
            *seq = xmalloc(sizeof(int32_t) * T), rows[PREFILL_SEQS];
    const int32_t *tables[PREFILL_SEQS];
    for (int s = 0; s < S; s++) {
        tables[s] = tables_mem + (size_t)s * blocks_per_seq;
        rows[s] = s * L + L - 1;
        for (int i = 0; i < L; i++) {
            tok[s * L + i] = (int32_t)(rng_u64() % (uint64_t)c->vocab);
            pos[s * L + i] = i;
            seq[s * L + i] = s;
        }
    }
    Err err = {0};
    Batch b = {T, tok, pos, seq, S, tables, S, rows, 0};
    int runs = 2;
    double t0 = 0;
    for (int i = -1; i < runs; i++) {
        if (i == 0) t0 = now_s();
        if (model_forward(r, kv, &b, logits, &err)) { fprintf(stderr, "fatal: prefill: %s\n", err.msg); exit(1); }
    }
    double dt = (now_s() - t0) / runs;
    double attn = 4.0 * c->n_layers * c->n_heads * c->head_dim * (double)S * L * (L + 1) / 2;
    double flops = 2.0 * T * mat_params + 2.0 * S * (double)c->vocab * c->hidden + attn;
    double roof = flops / (gemm_tfs * 1e12);
    ASSERT(n_rows < (int)(sizeof rows_out / sizeof rows_out[0]), "more bench rows than rows_out holds");
    BenchRow *row = &rows_out[n_rows++];
    snprintf(row->name, sizeof row->name, "%s prefill %d x %d tokens", label, S, L);
    row->tok_s = T / dt;
    row->ms = dt * 1e3;
    row->roof_tok_s = T / roof;
    row->frac = roof / dt;
    printf("  %-28s %9.1f tok/s  %8.2f ms/batch  roofline %9.1f tok/s  %5.1f%%\n", row->name, row->tok_s, row->ms,
           row->roof_tok_s, 100 * row->frac);
    free(tok); free(pos); free(seq);
}

/* Issue 17's mixed step: B sequences decoding at context BENCH_CTX beside one
 * sequence's prefill chunk of P tokens (B + P <= 512: piecewise graphs, the
 * attention eager between them), B + 1 output rows, timed over BENCH_STEPS
 * steps after 3 (eager at the bucket size, captured, replayed), with graphs
 * and then with runner_set_graphs(r, 0) (--enforce-eager). The same step each
 * time: the cache rows it writes are the same. Roofline: the weights read
 * once or the matmul FLOPs at the GEMM rate, whichever is longer. */
static void bench_mixed(Runner *r, KVCache *kv, const ModelConfig *c, int B, int P, double mat_params,
                        double weight_bytes, float *logits, int32_t *tables_mem, int blocks_per_seq) {
    int T = B + P;
    int32_t *tok = xmalloc(sizeof(int32_t) * T), *pos = xmalloc(sizeof(int32_t) * T),
            *seq = xmalloc(sizeof(int32_t) * T), *rows = xmalloc(sizeof(int32_t) * (B + 1));
    const int32_t **tables = xmalloc(sizeof(int32_t *) * (B + 1));
    CHECK(P / BS < blocks_per_seq, "bench: a %d-token chunk needs more than %d blocks (a bug)", P, blocks_per_seq);
    for (int i = 0; i <= B; i++) tables[i] = tables_mem + (size_t)i * blocks_per_seq;
    for (int i = 0; i < T; i++) {
        tok[i] = (int32_t)(rng_u64() % (uint64_t)c->vocab);
        seq[i] = i < B ? i : B;
        pos[i] = i < B ? BENCH_CTX : i - B;
    }
    for (int i = 0; i < B; i++) rows[i] = i;
    rows[B] = T - 1;
    Batch b = {T, tok, pos, seq, B + 1, tables, B + 1, rows, 0};
    double roof = weight_bytes / (bw_gbs * 1e9), flops = 2.0 * T * mat_params / (gemm_tfs * 1e12);
    if (flops > roof) roof = flops;
    for (int eager = 0; eager < 2; eager++) {
        runner_set_graphs(r, !eager);
        Err err = {0};
        double t0 = 0;
        uint64_t pc0, pr0, pc1, pr1;
        runner_piece_counts(r, &pc0, &pr0);
        for (int step = -3; step < BENCH_STEPS; step++) {
            if (step == 0) t0 = now_s();
            if (model_forward(r, kv, &b, logits, &err)) { fprintf(stderr, "fatal: mixed step: %s\n", err.msg); exit(1); }
        }
        double step_s = (now_s() - t0) / BENCH_STEPS;
        runner_piece_counts(r, &pc1, &pr1);
        ASSERT(n_rows < (int)(sizeof rows_out / sizeof rows_out[0]), "more bench rows than rows_out holds");
        BenchRow *row = &rows_out[n_rows++];
        snprintf(row->name, sizeof row->name, "bf16 mixed %d decode + %d prefill %s", B, P, eager ? "eager" : "graphs");
        row->tok_s = T / step_s;
        row->ms = step_s * 1e3;
        row->roof_tok_s = T / roof;
        row->frac = roof / step_s;
        printf("  %-28s %9.1f tok/s  %8.2f ms/step  roofline %9.1f tok/s  %5.1f%%  (piecewise: %llu captured, "
               "%llu replayed)\n", row->name, row->tok_s, row->ms, row->roof_tok_s, 100 * row->frac,
               (unsigned long long)(pc1 - pc0), (unsigned long long)(pr1 - pr0));
    }
    runner_set_graphs(r, 1);
    free(tok); free(pos); free(seq); free(rows); free(tables);
}

/* One layer's prefill attention alone at the bench's shape (4 x 1024 tokens,
 * Qwen3-8B heads, BF16 KV, causal): the tensor-core kernel (attention_mma.cu)
 * and the CUDA-core one (attention.cu), attention FLOPs (QK^T and PV over the
 * causal pairs) against the BF16 GEMM roofline; 5 timed launches after 1. */
static void bench_attn_prefill(const ModelConfig *c) {
    int S = PREFILL_SEQS, L = PREFILL_LEN, T = S * L, nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim;
    int bps = (L + BS - 1) / BS, runs = 5;
    size_t qn = (size_t)T * nh * hd, kvn = (size_t)S * bps * BS * nkv * hd;
    float *hq = xmalloc(sizeof(float) * qn), *q = NULL, *out = NULL;
    uint16_t *kc = NULL, *vc = NULL;
    int32_t *hpos = xmalloc(sizeof(int32_t) * T), *hseq = xmalloc(sizeof(int32_t) * T),
            *hbt = xmalloc(sizeof(int32_t) * S * bps), *pos = NULL, *seq = NULL, *bt = NULL;
    for (size_t i = 0; i < qn; i++) hq[i] = (float)(rng_u64() >> 40) * (2.0f / 16777216.0f) - 1.0f;
    for (int t = 0; t < T; t++) { hpos[t] = t % L; hseq[t] = t / L; }
    for (int i = 0; i < S * bps; i++) hbt[i] = i;
    CUDA_CHECK(cudaMalloc((void **)&q, sizeof(float) * qn)); CUDA_CHECK(cudaMalloc((void **)&out, sizeof(float) * qn));
    CUDA_CHECK(cudaMalloc((void **)&kc, 2 * kvn)); CUDA_CHECK(cudaMalloc((void **)&vc, 2 * kvn));
    CUDA_CHECK(cudaMalloc((void **)&pos, sizeof(int32_t) * T)); CUDA_CHECK(cudaMalloc((void **)&seq, sizeof(int32_t) * T));
    CUDA_CHECK(cudaMalloc((void **)&bt, sizeof(int32_t) * S * bps));
    CUDA_CHECK(cudaMemcpy(q, hq, sizeof(float) * qn, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(pos, hpos, sizeof(int32_t) * T, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(seq, hseq, sizeof(int32_t) * T, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(bt, hbt, sizeof(int32_t) * S * bps, cudaMemcpyHostToDevice));
    CHECK(cuda_fill_bf16(kc, kvn, 11, 0, 1, NULL) == 0 && cuda_fill_bf16(vc, kvn, 12, 0, 1, NULL) == 0, "bench: fill");
    CUDA_CHECK(cudaDeviceSynchronize());
    AttnArgs a = {out, q, kc, vc, pos, seq, bt, bps, T, nh, nkv, hd, BS, 1.0f / sqrtf((float)hd), KV_BF16, NULL, NULL, S};
    double flops = 4.0 * nh * hd * S * (double)L * (L + 1) / 2, roof = flops / (gemm_tfs * 1e12);
    for (int k = 0; k < 2; k++) {
        double t0 = 0;
        for (int i = -1; i < runs; i++) {
            if (i == 0) { CUDA_CHECK(cudaDeviceSynchronize()); t0 = now_s(); }
            CHECK((k ? cuda_attention(&a, NULL, 1, NULL) : cuda_attention_mma(&a, NULL)) == 0, "bench: attention");
        }
        CUDA_CHECK(cudaDeviceSynchronize());
        double dt = (now_s() - t0) / runs;
        ASSERT(n_rows < (int)(sizeof rows_out / sizeof rows_out[0]), "more bench rows than rows_out holds");
        BenchRow *row = &rows_out[n_rows++];
        snprintf(row->name, sizeof row->name, "prefill attention %s %d x %d", k ? "cuda cores" : "mma", S, L);
        row->tok_s = T / dt;
        row->ms = dt * 1e3;
        row->roof_tok_s = T / roof;
        row->frac = roof / dt;
        printf("  %-28s %9.1f tok/s  %8.3f ms/layer %6.1f TFLOP/s  %5.1f%% of the GEMM roofline\n", row->name, row->tok_s,
               row->ms, flops / dt / 1e12, 100 * row->frac);
    }
    cudaFree(q); cudaFree(out); cudaFree(kc); cudaFree(vc); cudaFree(pos); cudaFree(seq); cudaFree(bt);
    free(hq); free(hpos); free(hseq); free(hbt);
}

/* One layer's decode attention alone (one query token a sequence at the end
 * of its context, BF16 and FP8 KV) at three shapes of 2^16 .. 2^18 positions
 * (268-537 MB a cache at Qwen3-8B's heads: no L2 reuse between launches), on
 * each decode kernel at the splits the backend would give it: the vector
 * kernel, the warp-a-position one (cuda_attention_vec_enable) and the grouped
 * heads on tensor cores (attention_dec_mma.cu), as the K / V bytes (and FP8's
 * row scales) read per second against the copy bandwidth. For Qwen3-8B's heads
 * (G = 4: the backend runs the vector kernel) the named rows are
 * attn_decode_<kv>_b<B>_ctx<C>_fraction, _warp_fraction, _mma_fraction and
 * _vec_speedup (warp time / vector time); for Qwen3-30B-A3B's (G = 8: the
 * backend runs the tensor cores) attn_decode_g8_<kv>_b<B>_ctx<C>_fraction,
 * _vec_fraction and _mma_speedup (vector time / tensor-core time). */
static void bench_attn_decode(const ModelConfig *c, const char *tag) {
    const int shapes[][2] = {{128, 512}, {32, 4096}, {8, 32768}}; /* batch, context */
    const char *ctx_name[] = {"512", "4k", "32k"};
    int nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim, sms = 0, it = 20, g8 = nh / nkv > 4;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    for (int si = 0; si < 3; si++) {
        int B = shapes[si][0], ctx = shapes[si][1], bps = ctx / BS + 1;
        size_t rows = (size_t)B * bps * BS * nkv, qn = (size_t)B * nh * hd;
        int splits = cuda_attention_splits(B, nh, nkv, ctx, sms), dsplits = cuda_attention_dec_mma_splits(B, nkv, ctx, sms);
        int nsp = splits > dsplits ? splits : dsplits;
        int32_t *hpos = xmalloc(sizeof(int32_t) * B), *hseq = xmalloc(sizeof(int32_t) * B),
                *hbt = xmalloc(sizeof(int32_t) * B * bps), *pos = NULL, *seq = NULL, *bt = NULL;
        for (int b = 0; b < B; b++) { hpos[b] = ctx - 1; hseq[b] = b; }
        for (int i = 0; i < B * bps; i++) hbt[i] = i;
        float *q = NULL, *out = NULL, *part = NULL, *ks = NULL, *vs = NULL;
        CUDA_CHECK(cudaMalloc((void **)&q, sizeof(float) * qn)); CUDA_CHECK(cudaMalloc((void **)&out, sizeof(float) * qn));
        CUDA_CHECK(cudaMalloc((void **)&part, sizeof(float) * (size_t)nsp * B * nh * (hd + 2)));
        CUDA_CHECK(cudaMalloc((void **)&ks, sizeof(float) * rows)); CUDA_CHECK(cudaMalloc((void **)&vs, sizeof(float) * rows));
        CUDA_CHECK(cudaMalloc((void **)&pos, sizeof(int32_t) * B)); CUDA_CHECK(cudaMalloc((void **)&seq, sizeof(int32_t) * B));
        CUDA_CHECK(cudaMalloc((void **)&bt, sizeof(int32_t) * B * bps));
        CUDA_CHECK(cudaMemcpy(pos, hpos, sizeof(int32_t) * B, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(seq, hseq, sizeof(int32_t) * B, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(bt, hbt, sizeof(int32_t) * B * bps, cudaMemcpyHostToDevice));
        CHECK(cuda_fill_bf16((uint16_t *)q, 2 * qn, 21, 0, 0.5f, NULL) == 0, "bench: fill"); /* any finite pattern */
        CUDA_CHECK(cudaMemset(ks, 0x3c, sizeof(float) * rows)); CUDA_CHECK(cudaMemset(vs, 0x3c, sizeof(float) * rows));
        for (int dt = 0; dt < 2; dt++) {
            KvDtype kvt = dt ? KV_FP8 : KV_BF16;
            size_t eb = dt ? 1 : 2;
            void *kc = NULL, *vc = NULL;
            CUDA_CHECK(cudaMalloc(&kc, rows * hd * eb)); CUDA_CHECK(cudaMalloc(&vc, rows * hd * eb));
            if (dt) { /* e4m3 1.0 everywhere: no NaN bytes */
                CUDA_CHECK(cudaMemset(kc, 0x38, rows * hd)); CUDA_CHECK(cudaMemset(vc, 0x38, rows * hd));
            } else {
                CHECK(cuda_fill_bf16(kc, rows * hd, 22, 0, 1, NULL) == 0 && cuda_fill_bf16(vc, rows * hd, 23, 0, 1, NULL) == 0,
                      "bench: fill");
            }
            AttnArgs a = {out, q, kc, vc, pos, seq, bt, bps, B, nh, nkv, hd, BS, 1.0f / sqrtf((float)hd), kvt,
                          dt ? ks : NULL, dt ? vs : NULL, B};
            double us[3];
            for (int v = 0; v < 3; v++) { /* 0: the vector kernel, 1: attn_kernel, 2: tensor cores */
                cuda_attention_vec_enable(v == 0);
                for (int i = -3; i < it; i++) {
                    if (i == 0) CUDA_CHECK(cudaEventRecord(e0, 0));
                    CHECK((v == 2 ? cuda_attention_dec_mma(&a, part, dsplits, NULL) : cuda_attention(&a, part, splits, NULL)) == 0,
                          "bench: decode attention");
                }
                CUDA_CHECK(cudaEventRecord(e1, 0));
                CUDA_CHECK(cudaEventSynchronize(e1));
                float ms = 0;
                CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
                us[v] = ms * 1e3 / it;
            }
            cuda_attention_vec_enable(1);
            double bytes = 2.0 * B * (double)ctx * nkv * hd * eb + (dt ? 2.0 * B * (double)ctx * nkv * sizeof(float) : 0);
            double f[3];
            for (int v = 0; v < 3; v++) f[v] = bytes / (us[v] * 1e-6) / 1e9 / bw_gbs;
            printf("  decode attention %s G %d %s b%d ctx %d: vector %.1f us (%.1f%% of copy, %d splits), warp %.1f us "
                   "(%.1f%%), tensor cores %.1f us (%.1f%%, %d splits)\n", tag, nh / nkv, kv_dtype_name(kvt), B, ctx,
                   us[0], 100 * f[0], splits, us[1], 100 * f[1], us[2], 100 * f[2], dsplits);
            char nm[64], base[48];
            snprintf(base, sizeof base, "attn_decode_%s%s_b%d_ctx%s", g8 ? "g8_" : "", dt ? "fp8" : "bf16", B, ctx_name[si]);
            if (g8) { /* the backend runs the tensor cores */
                snprintf(nm, sizeof nm, "%s_fraction", base); native_row(nm, f[2]);
                snprintf(nm, sizeof nm, "%s_vec_fraction", base); native_row(nm, f[0]);
                snprintf(nm, sizeof nm, "%s_mma_speedup", base); native_row(nm, us[0] / us[2]);
            } else {
                snprintf(nm, sizeof nm, "%s_fraction", base); native_row(nm, f[0]);
                snprintf(nm, sizeof nm, "%s_warp_fraction", base); native_row(nm, f[1]);
                snprintf(nm, sizeof nm, "%s_mma_fraction", base); native_row(nm, f[2]);
                snprintf(nm, sizeof nm, "%s_vec_speedup", base); native_row(nm, us[1] / us[0]);
            }
            CUDA_CHECK(cudaFree(kc)); CUDA_CHECK(cudaFree(vc));
        }
        cudaFree(q); cudaFree(out); cudaFree(part); cudaFree(ks); cudaFree(vs); cudaFree(pos); cudaFree(seq); cudaFree(bt);
        free(hpos); free(hseq); free(hbt);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

/* The decode GEMVs alone (batch 1), per format and Qwen3-8B shape: GB/s of
 * weight bytes read, against the copy bandwidth. Several weight copies rotate
 * so that no run is served from the 50 MB L2; 20 timed launches after 3. BF16
 * also at 4 and 8 tokens, tiled and on tensor cores (mma: gemv_mma.cuh), FP8
 * and NVFP4 on tensor cores at 1 and 8 tokens (and tiled at 8): the data
 * behind the start-up choice (device_gemv_calibrate), the n = 8 served groups'
 * decode and the FP8 / NVFP4 batch-1 decode. */
typedef struct GemvRow { char name[64]; double gbs, us; } GemvRow;
static GemvRow gemv_rows[64];
static int n_gemv_rows;

static void bench_gemv_one(int fmt, int rows, int cols, int nt, int mma) {
    const int copies = 4, it = 20;
    size_t n = (size_t)rows * cols, wbytes = fmt == 0 ? 2 * n : fmt == 1 ? n : n / 2,
           sbytes = fmt == 0 ? 0 : fmt == 1 ? sizeof(float) * ((rows + 127) / 128) * ((cols + 127) / 128) : n / 16;
    char *w[4], *sc[4];
    for (int i = 0; i < copies; i++) {
        CUDA_CHECK(cudaMalloc((void **)&w[i], wbytes));
        CUDA_CHECK(cudaMalloc((void **)&sc[i], sbytes + 16));
        if (cuda_fill_bf16((uint16_t *)w[i], wbytes / 2, 77 + i, 0, 0.02f, NULL)) exit(1);
        CUDA_CHECK(cudaMemset(sc[i], fmt == 1 ? 0x3a : 0x38, sbytes + 16));
    }
    float *x, *out;
    void *split = NULL; /* the tensor-core FP8 / NVFP4 GEMV's split of x */
    if (fmt >= 1 && mma) CUDA_CHECK(cudaMalloc(&split, cuda_gemv_mma_scratch(nt, cols)));
    CUDA_CHECK(cudaMalloc((void **)&x, sizeof(float) * nt * cols));
    CUDA_CHECK(cudaMalloc((void **)&out, sizeof(float) * nt * rows));
    if (cuda_fill_bf16((uint16_t *)x, (size_t)2 * nt * cols, 5, 0, 0.5f, NULL)) exit(1); /* any finite pattern */
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    for (int i = -3; i < it; i++) {
        if (i == 0) CUDA_CHECK(cudaEventRecord(e0, 0));
        int k = (i + 3) % copies, rc;
        if (fmt == 0 && mma) rc = cuda_gemv_bf16_mma(out, x, nt, (uint16_t *)w[k], rows, cols, NULL, NULL);
        else if (fmt == 0) rc = cuda_gemv_bf16(out, x, nt, (uint16_t *)w[k], rows, cols, NULL, NULL);
        else if (fmt == 1 && mma)
            rc = cuda_gemv_fp8_mma(out, x, nt, (uint8_t *)w[k], (float *)sc[k], rows, cols, 128, 128, NULL, split, 0,
                                   NULL);
        else if (fmt == 1) rc = cuda_gemv_fp8(out, x, nt, (uint8_t *)w[k], (float *)sc[k], rows, cols, 128, 128, NULL, NULL);
        else if (mma)
            rc = cuda_gemv_nvfp4_mma(out, x, nt, (uint8_t *)w[k], (uint8_t *)sc[k], bench_scale2(), rows, cols, NULL,
                                     split, 0, NULL);
        else rc = cuda_gemv_nvfp4(out, x, nt, (uint8_t *)w[k], (uint8_t *)sc[k], bench_scale2(), rows, cols, NULL, NULL);
        CHECK(rc == 0, "gemv bench launch");
    }
    CUDA_CHECK(cudaEventRecord(e1, 0));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    GemvRow *g = &gemv_rows[n_gemv_rows++];
    g->us = ms * 1e3 / it;
    g->gbs = (wbytes + sbytes) / (g->us * 1e-6) / 1e9;
    snprintf(g->name, sizeof g->name, "%s gemv%s n=%d [%d x %d]", fmt == 0 ? "bf16" : fmt == 1 ? "fp8" : "nvfp4",
             mma ? " mma" : "", nt, rows, cols);
    printf("  %-34s %8.1f us  %7.0f GB/s  %5.1f%% of copy\n", g->name, g->us, g->gbs, 100 * g->gbs / bw_gbs);
    for (int i = 0; i < copies; i++) { CUDA_CHECK(cudaFree(w[i])); CUDA_CHECK(cudaFree(sc[i])); }
    CUDA_CHECK(cudaFree(x)); CUDA_CHECK(cudaFree(out)); CUDA_CHECK(cudaFree(split));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

static void bench_gemv(void) {
    const int shapes[][2] = {{1024, 4096}, {4096, 4096}, {12288, 4096}, {4096, 12288}, {151936, 4096}};
    for (int f = 0; f < 3; f++)
        for (int i = 0; i < 5; i++)
            if (f == 0 || i < 4) bench_gemv_one(f, shapes[i][0], shapes[i][1], 1, 0);
    for (int nt = 4; nt <= 8; nt += 4)
        for (int i = 0; i < 5; i++)
            for (int mma = 0; mma < 2; mma++) bench_gemv_one(0, shapes[i][0], shapes[i][1], nt, mma);
    for (int f = 1; f <= 2; f++) /* FP8 / NVFP4 on tensor cores at 1 token (issue 19's decode_fp8_b1) and 8 */
        for (int nt = 1; nt <= 8; nt += 7)
            for (int i = 0; i < 4; i++) {
                if (nt > 1) bench_gemv_one(f, shapes[i][0], shapes[i][1], nt, 0);
                bench_gemv_one(f, shapes[i][0], shapes[i][1], nt, 1);
            }
}

/* Where a batch-1 BF16 decode step's time goes: each op of a Qwen3-8B layer
 * timed alone (events around 50 back-to-back launches after 3), times its
 * launches per step, against the measured step. What the sum misses is the
 * gap between dependent kernels inside the graph. */
typedef struct OpRow { char name[48]; double us; int per_step; } OpRow;
static OpRow op_rows[24];
static int n_op_rows;

#define TIME_OP(label, count, call)                                                      \
    do {                                                                                  \
        float ms_ = 0;                                                                    \
        for (int i_ = -3; i_ < 50; i_++) {                                                \
            if (i_ == 0) CUDA_CHECK(cudaEventRecord(e0, 0));                                      \
            CHECK((call) == 0, "op bench: %s", label);                                    \
        }                                                                                 \
        CUDA_CHECK(cudaEventRecord(e1, 0));                                                       \
        CUDA_CHECK(cudaEventSynchronize(e1));                                                     \
        CUDA_CHECK(cudaEventElapsedTime(&ms_, e0, e1));                                           \
        OpRow *o_ = &op_rows[n_op_rows++];                                                \
        snprintf(o_->name, sizeof o_->name, "%s", label);                                 \
        o_->us = ms_ * 1e3 / 50;                                                          \
        o_->per_step = (count);                                                           \
    } while (0)

/* matmul_multi runs on the backend's own (non-blocking) stream, which events on
 * stream 0 do not order: time it by the host clock, the stream drained by a
 * one-float download before and after the 50 launches. */
#define TIME_OP_BG(label, count, call)                                                   \
    do {                                                                                  \
        float one_;                                                                       \
        for (int i_ = 0; i_ < 3; i_++) (call);                                            \
        bg->download(bg, &one_, x, sizeof one_);                                          \
        double t0_ = now_s();                                                             \
        for (int i_ = 0; i_ < 50; i_++) (call);                                           \
        bg->download(bg, &one_, x, sizeof one_);                                          \
        OpRow *o_ = &op_rows[n_op_rows++];                                                \
        snprintf(o_->name, sizeof o_->name, "%s", label);                                 \
        o_->us = (now_s() - t0_) * 1e6 / 50;                                              \
        o_->per_step = (count);                                                           \
    } while (0)

static int mm_multi_call(WeightMat *ws, float **outs, const float *x, int count) {
    const WeightMat *wp[3] = {&ws[0], &ws[1], &ws[2]};
    const uint16_t *bs[3] = {NULL, NULL, NULL};
    bg->matmul_multi(bg, outs, x, 1, wp, bs, count);
    return 0;
}

/* matmul_swiglu at batch 1 (the fused GEMV with the SwiGLU epilogue) into g. */
static int mm_swiglu_call(WeightMat *ws, float *g, float *u, const float *x) {
    bg->matmul_swiglu(bg, g, x, 1, &ws[0], &ws[1], g, u);
    return 0;
}

/* matmul_add_rmsnorm at batch 1 (the residual projection with the add + norm epilogue): x += in @ w^T,
 * xn = rmsnorm(x). */
static int mm_add_norm_call(const WeightMat *w, float *x, float *xn, const float *in, const uint16_t *wn, float eps) {
    return bg->matmul_add_rmsnorm(bg, xn, x, in, 1, w, NULL, wn, eps);
}

static void bench_ops(const Model *m, double step_ms) {
    const ModelConfig *c = &m->cfg;
    int L = c->n_layers, H = c->hidden, nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim, I = c->intermediate;
    int ctx = BENCH_CTX, bsz = BS, nblk = (ctx + bsz) / bsz;
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    bg = backend_cuda_create_resident(c->head_dim, BENCH_MAX_CTX);
    float *x, *y, *xn, *q, *k, *v, *att, *g, *u, *cs, *sn, *kc, *vc, *part, *logits;
    int32_t *ip;
    size_t kvn = (size_t)nblk * bsz * nkv * hd;
    CUDA_CHECK(cudaMalloc((void **)&x, 4 * H)); CUDA_CHECK(cudaMalloc((void **)&y, 4 * H)); CUDA_CHECK(cudaMalloc((void **)&xn, 4 * H));
    CUDA_CHECK(cudaMalloc((void **)&q, 4 * nh * hd)); CUDA_CHECK(cudaMalloc((void **)&att, 4 * nh * hd));
    CUDA_CHECK(cudaMalloc((void **)&k, 4 * nkv * hd)); CUDA_CHECK(cudaMalloc((void **)&v, 4 * nkv * hd));
    CUDA_CHECK(cudaMalloc((void **)&g, 4 * I)); CUDA_CHECK(cudaMalloc((void **)&u, 4 * I));
    CUDA_CHECK(cudaMalloc((void **)&cs, 4 * hd)); CUDA_CHECK(cudaMalloc((void **)&sn, 4 * hd));
    CUDA_CHECK(cudaMalloc((void **)&kc, 4 * kvn)); CUDA_CHECK(cudaMalloc((void **)&vc, 4 * kvn));
    CUDA_CHECK(cudaMalloc((void **)&logits, 4 * (size_t)c->vocab));
    int splits = cuda_attention_splits(1, nh, nkv, BENCH_MAX_CTX, 132);
    CUDA_CHECK(cudaMalloc((void **)&part, sizeof(float) * (size_t)(splits > 1 ? splits : 1) * nh * (hd + 2)));
    /* device int32 scratch: [0] pos, [1] seq, [2] slot, [3] row, [4..] block table */
    int32_t hip[4 + 128];
    hip[0] = ctx; hip[1] = 0; hip[2] = ctx; hip[3] = 0;
    for (int i = 0; i < 128; i++) hip[4 + i] = i < nblk ? i : 0;
    ip = dev_copy(hip, sizeof hip);
    float *fill[] = {x, y, xn, q, k, v, g, u, cs, sn, kc, vc};
    size_t fn[] = {H, H, H, (size_t)nh * hd, (size_t)nkv * hd, (size_t)nkv * hd, I, I, hd, hd, kvn, kvn};
    for (int i = 0; i < 12; i++) /* bf16 noise: finite, non-zero as f32 and (kc, vc: the BF16 KV) as bf16 */
        if (cuda_fill_bf16((uint16_t *)fill[i], fn[i] * 2, 900 + i, 0, 0.01f, NULL)) exit(1);
    const uint16_t *wn = m->layers[0].attn_norm.dev, *qn = m->layers[0].q_norm.dev, *kn = m->layers[0].k_norm.dev;
    AttnArgs a = {.out = att, .q = q, .k_cache = kc, .v_cache = vc, .pos = ip, .seq = ip + 1, .block_table = ip + 4,
                  .bt_stride = 128, .n_tokens = 1, .n_heads = nh, .n_kv_heads = nkv, .head_dim = hd, .block_size = bsz,
                  .scale = 1.0f / sqrtf((float)hd), .kv_dtype = KV_BF16}; /* the server's default KV */
    KvWriteArgs kw = {.k_cache = kc, .v_cache = vc, .k = k, .v = v, .slots = ip + 2, .n = 1, .n_kv_heads = nkv,
                      .head_dim = hd, .block_size = bsz, .dtype = KV_BF16};
    const LayerWeights *lw = &m->layers[0];
    WeightMat qkv[3] = {lw->q, lw->k, lw->v}, gu[3] = {lw->gate, lw->up, lw->up};
    float *qkv_out[3] = {q, k, v}, *gu_out[3] = {g, u, u};
    TIME_OP("embed", 1, cuda_embed(x, m->embed.dev, ip + 3, 1, H, NULL));
    TIME_OP("add_rmsnorm (unfused)", 0, cuda_add_rmsnorm(xn, x, y, wn, 1, H, c->rms_eps, NULL, NULL));
    void *xsplit = NULL; /* FP8 / NVFP4 steps: the norm also writes the tensor-core GEMV's split of xn */
    CUDA_CHECK(cudaMalloc(&xsplit, cuda_gemv_mma_scratch(1, H)));
    TIME_OP("add_rmsnorm + x split (fp8)", 0, cuda_add_rmsnorm(xn, x, y, wn, 1, H, c->rms_eps, xsplit, NULL));
    CUDA_CHECK(cudaFree(xsplit));
    CUDA_CHECK(cudaDeviceSynchronize());
    TIME_OP_BG("q/k/v GEMV (one launch)", L, mm_multi_call(qkv, qkv_out, xn, 3));
    /* the RoPE tables of one row (cs, sn: [1, hd/2]) at position ip[1] = 0 */
    RopeKvArgs rk = {.kv = kw, .q = q, .n_heads = nh, .q_norm = qn, .k_norm = kn, .eps = c->rms_eps, .cs = cs,
                     .sn = sn, .pos = ip + 1};
    TIME_OP("norm_rope q (unfused)", 0, cuda_norm_rope(q, 1, nh, hd, qn, c->rms_eps, cs, sn, ip + 1, NULL));
    TIME_OP("norm_rope k (unfused)", 0, cuda_norm_rope(k, 1, nkv, hd, kn, c->rms_eps, cs, sn, ip + 1, NULL));
    TIME_OP("kv_write (unfused)", 0, cuda_kv_write(&kw, NULL));
    TIME_OP("rope_kv_write (q/k rope + kv)", L, cuda_rope_kv_write(&rk, NULL));
    TIME_OP("attention (ctx 512, bf16 KV)", L, cuda_attention(&a, part, splits, NULL));
    TIME_OP("o GEMV (unfused)", 0, cuda_gemv_bf16(y, att, 1, lw->o.bf16, H, nh * hd, NULL, NULL));
    CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(mm_add_norm_call(&lw->o, x, xn, att, wn, c->rms_eps) == 0, "op bench: the o GEMV's add + norm refused");
    TIME_OP_BG("o GEMV + add_rmsnorm", L, mm_add_norm_call(&lw->o, x, xn, att, wn, c->rms_eps));
    TIME_OP_BG("gate/up GEMV (unfused)", 0, mm_multi_call(gu, gu_out, xn, 2));
    TIME_OP("swiglu (unfused)", 0, cuda_swiglu(g, g, u, (size_t)I, NULL));
    TIME_OP_BG("gate/up GEMV + swiglu", L, mm_swiglu_call(gu, g, u, xn));
    TIME_OP("down GEMV (unfused)", 0, cuda_gemv_bf16(y, g, 1, lw->down.bf16, H, I, NULL, NULL));
    CUDA_CHECK(cudaDeviceSynchronize());
    TIME_OP_BG("down GEMV + add_rmsnorm", L, mm_add_norm_call(&lw->down, x, xn, g, wn, c->rms_eps));
    TIME_OP("lm_head GEMV", 1, cuda_gemv_bf16(logits, xn, 1, m->lm_head.bf16, c->vocab, H, NULL, NULL));
    double sum = 0;
    printf("  decode step at batch 1, BF16, op by op (each timed alone):\n");
    for (int i = 0; i < n_op_rows; i++) {
        sum += op_rows[i].us * op_rows[i].per_step;
        printf("    %-28s %7.1f us x %3d = %7.3f ms\n", op_rows[i].name, op_rows[i].us, op_rows[i].per_step,
               op_rows[i].us * op_rows[i].per_step / 1e3);
    }
    printf("    %-28s %27.3f ms; measured step %.3f ms; gaps and the logits copy %.3f ms\n", "sum", sum / 1e3, step_ms,
           step_ms - sum / 1e3);
    void *bufs[] = {x, y, xn, q, k, v, att, g, u, cs, sn, kc, vc, part, logits, ip};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) CUDA_CHECK(cudaFree(bufs[i]));
    bg->free(bg);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

/* One decoder matrix at FP8 (128x128 blocks) or NVFP4 with random bytes made in
 * device memory (the GEMV's speed does not depend on the values; a few random
 * e4m3 bytes are NaN, which costs nothing on a GPU). Returns its bytes. */
static int bench_act_quant; /* 1: the matrices quant_mat makes take the native GEMMs (bench_quant's act_quant) */
static size_t quant_mat(WeightMat *w, Precision prec, char **cur, uint64_t seed) {
    size_t rows = (size_t)w->rows, cols = (size_t)w->cols, qb, sb;
    w->bf16 = NULL;
    w->act_quant = bench_act_quant;
    uint8_t *q = (uint8_t *)*cur, *sc;
    if (prec == PREC_FP8) {
        QuantFp8 *f = xcalloc(1, sizeof *f);
        *f = (QuantFp8){.rows = (int)rows, .cols = (int)cols, .block_rows = 128, .block_cols = 128,
                        .scale_rows = (int)((rows + 127) / 128), .scale_cols = (int)((cols + 127) / 128)};
        qb = rows * cols;
        sb = sizeof(float) * (size_t)f->scale_rows * f->scale_cols;
        f->q = q;
        f->scale_inv = (float *)(sc = q + (qb + 255) / 256 * 256);
        w->fmt = WF_FP8;
        w->q = f;
        w->dev = q;
        w->dev_scale = sc;
    } else {
        QuantNvfp4 *f = xcalloc(1, sizeof *f);
        *f = (QuantNvfp4){.rows = (int)rows, .cols = (int)cols, .scale2 = 1e-3f};
        qb = rows * cols / 2;
        sb = rows * cols / QUANT_NVFP4_BLOCK;
        f->packed = q;
        f->scale = sc = q + (qb + 255) / 256 * 256;
        w->fmt = WF_NVFP4;
        w->q = f;
        w->dev = q;
        w->dev_scale = sc;
        w->dev_s2 = (void *)bench_scale2();
    }
    if (cuda_fill_bf16((uint16_t *)q, qb / 2, seed, 0, 0.02f, NULL)) { fprintf(stderr, "fatal: fill\n"); exit(1); }
    CUDA_CHECK(cudaMemset(sc, prec == PREC_FP8 ? 0x3a : 0x38, sb)); /* f32 ~7e-4 / e4m3 1.0 */
    *cur = (char *)sc + (sb + 255) / 256 * 256;
    return qb + sb;
}

/* Batch 1 and 8 decode with the decoder linears weight-only FP8 / NVFP4 (embedding,
 * norms and lm_head BF16, as model_quantize leaves them); roofline bytes = the
 * quantized matrices + scales + the BF16 lm_head. act_quant: the same matrices
 * with quantized activations at batch 32 and 128 (the native GEMMs, issue 19). */
/* device_gemv_calibrate's choice for the quantized copy's layer matrices, which the model's WeightSet
 * (the BF16 originals') does not list. */
static void bench_gemv_choose(Backend *b, Model *q) {
    WeightMat **mats = xmalloc(sizeof *mats * 7 * (size_t)q->cfg.n_layers);
    unsigned char *norm_fed = xmalloc(7 * (size_t)q->cfg.n_layers);
    int n = 0;
    for (int l = 0; l < q->cfg.n_layers; l++) {
        LayerWeights *w = &q->layers[l];
        WeightMat *ms[] = {&w->q, &w->k, &w->v, &w->o, &w->gate, &w->up, &w->down};
        for (int i = 0; i < 7; i++) {
            norm_fed[n] = i != 3 && i != 6; /* not o, not down */
            mats[n++] = ms[i];
        }
    }
    device_gemv_calibrate_mats(b, mats, norm_fed, n); /* and the norms' split of x (backend_cuda_gemv_presplit) */
    free(mats);
    free(norm_fed);
}

static void bench_quant(const Model *m, Precision prec, int act_quant, float *logits, int32_t *tables, int bps) {
    bench_act_quant = act_quant;
    const ModelConfig *c = &m->cfg;
    Model q = *m;
    q.layers = xcalloc((size_t)c->n_layers, sizeof(LayerWeights));
    size_t arena_bytes = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const LayerWeights *w = &m->layers[l];
        const WeightMat *ms[] = {&w->q, &w->k, &w->v, &w->o, &w->gate, &w->up, &w->down};
        for (int i = 0; i < 7; i++) arena_bytes += (size_t)ms[i]->rows * ms[i]->cols + 2 * 256 + (size_t)ms[i]->rows * ms[i]->cols / 16 * 4;
    }
    char *arena = NULL, *cur;
    CUDA_CHECK(cudaMalloc((void **)&arena, arena_bytes));
    cur = arena;
    double bytes = 2.0 * c->vocab * c->hidden;
    for (int l = 0; l < c->n_layers; l++) {
        LayerWeights *w = &q.layers[l];
        *w = m->layers[l];
        WeightMat *ms[] = {&w->q, &w->k, &w->v, &w->o, &w->gate, &w->up, &w->down};
        for (int i = 0; i < 7; i++) bytes += (double)quant_mat(ms[i], prec, &cur, 1000 + 7 * l + i);
    }
    CHECK((size_t)(cur - arena) <= arena_bytes, "bench quant arena overflow (a bug)");
    CUDA_CHECK(cudaDeviceSynchronize());
    Backend *b = backend_cuda_create_resident(c->head_dim, BENCH_MAX_CTX);
    int nb = act_quant ? 128 : 8;
    bench_gemv_choose(b, &q); /* as the server's start-up (device_gemv_calibrate) on these matrices */
    Runner *r = runner_create_with(&q, b, nb < 64 ? 64 : nb, BENCH_MAX_CTX);
    KVCache *kv = runner_kvcache_create_dtype(r, nb * bps, BS, KV_BF16);
    printf("  %s %s: %.1f GiB of weights read per decode step\n", precision_name(prec),
           act_quant ? "native (act_quant)" : "weight-only", bytes / 1073741824.0);
    char label[32];
    snprintf(label, sizeof label, "%s%s", precision_name(prec), act_quant ? " native" : "");
    bench_decode(r, kv, c, act_quant ? 32 : 1, bytes, logits, tables, bps, label);
    bench_decode(r, kv, c, act_quant ? 128 : 8, bytes, logits, tables, bps, label);
    if (!act_quant) { /* batch 1 again with o / down then add_rmsnorm as two launches each: what the residual
                       * projections' epilogue saves; then with q/k/v and gate/up splitting x themselves: what
                       * the norms' split saves. A new cache drops the graphs captured before (forward.c). */
        runner_kvcache_free(r, kv);
        CHECK(backend_cuda_off(b, "matmul_add_rmsnorm", 1) == 0, "bench: no matmul_add_rmsnorm row");
        kv = runner_kvcache_create_dtype(r, nb * bps, BS, KV_BF16);
        snprintf(label, sizeof label, "%s add_norm off", precision_name(prec));
        bench_decode(r, kv, c, 1, bytes, logits, tables, bps, label);
        backend_cuda_off(b, "matmul_add_rmsnorm", 0);
        runner_kvcache_free(r, kv);
        backend_cuda_gemv_presplit(b, 0);
        kv = runner_kvcache_create_dtype(r, nb * bps, BS, KV_BF16);
        snprintf(label, sizeof label, "%s presplit off", precision_name(prec));
        bench_decode(r, kv, c, 1, bytes, logits, tables, bps, label);
    }
    runner_kvcache_free(r, kv);
    runner_free(r);
    for (int l = 0; l < c->n_layers; l++) {
        LayerWeights *w = &q.layers[l];
        WeightMat *ms[] = {&w->q, &w->k, &w->v, &w->o, &w->gate, &w->up, &w->down};
        for (int i = 0; i < 7; i++) free(ms[i]->q);
    }
    free(q.layers);
    CUDA_CHECK(cudaFree(arena));
}

/* bench_native.h's decode rows, from the bench rows of that name prefix:
 * batch 1 of bf16 (and again without PDL, without the GEMVs' prefetch, without the residual projection's
 * add + norm epilogue) and weight-only fp8 / nvfp4
 * (and again with the norms' split of x off, bench_quant), batch 32 / 128 of native fp8. Each is
 * written once, by the first section after its bench row exists. */
static struct { const char *prefix, *row; int done; } native_decode[] = {
    {"bf16 decode batch 1 ", "decode_bf16_b1_tok_s", 0},
    {"bf16 pdl off decode batch 1 ", "decode_bf16_b1_pdl_off_tok_s", 0},
    {"bf16 prefetch off decode batch 1 ", "decode_bf16_b1_prefetch_off_tok_s", 0},
    {"bf16 add_norm off decode batch 1 ", "decode_bf16_b1_add_norm_off_tok_s", 0},
    {"fp8 decode batch 1 ", "decode_fp8_b1_tok_s", 0},
    {"fp8 presplit off decode batch 1 ", "decode_fp8_b1_presplit_off_tok_s", 0},
    {"nvfp4 decode batch 1 ", "decode_nvfp4_b1_tok_s", 0},
    {"nvfp4 presplit off decode batch 1 ", "decode_nvfp4_b1_presplit_off_tok_s", 0},
    {"fp8 add_norm off decode batch 1 ", "decode_fp8_b1_add_norm_off_tok_s", 0},
    {"nvfp4 add_norm off decode batch 1 ", "decode_nvfp4_b1_add_norm_off_tok_s", 0},
    {"fp8 native decode batch 32 ", "decode_fp8_native_b32_tok_s", 0},
    {"fp8 native decode batch 128 ", "decode_fp8_native_b128_tok_s", 0},
};
static void bench_native_decode_rows(void) {
    for (size_t k = 0; k < sizeof native_decode / sizeof native_decode[0]; k++)
        for (int i = 0; i < n_rows && !native_decode[k].done; i++)
            if (!strncmp(rows_out[i].name, native_decode[k].prefix, strlen(native_decode[k].prefix))) {
                native_row(native_decode[k].row, rows_out[i].tok_s);
                native_decode[k].done = 1;
            }
}

/* ---- part 3 in sections ----
 * The dense Qwen3-8B-shaped model, made on the first section that needs it
 * and kept for the next: weights (16 GiB), the BF16 KV pool for decode at batch
 * 128 (its "pool", dropped before the 32k decode, which needs the memory), the
 * runner, pinned logits. The rows are measured with the server's default KV
 * dtype (BF16); rows named "bf16/kv-f32 ..." repeat a few on an f32 cache, the
 * 2026-11-29 H200 run's setting, for comparison. NULL where the device has too little memory (said). */
typedef struct DenseBench {
    Model *m;
    char *arena;        /* the weights, bf16 */
    Backend *b;
    Runner *r;
    KVCache *kv;        /* BF16 (the server's default), n_blocks blocks of BS */
    int32_t *tables;    /* [n_blocks] = 0..n_blocks-1 */
    float *logits;      /* pinned [128, vocab] */
    double mat_params, weight_bytes;
    int bps_dec, bps_pre, n_blocks, unfit;
} DenseBench;
static DenseBench dense;

static void dense_release_pool(void) {
    if (!dense.r) return;
    free(dense.tables);
    runner_kvcache_free(dense.r, dense.kv);
    runner_free(dense.r); /* frees its backend */
    dense.r = NULL;
    dense.kv = NULL;
    dense.tables = NULL;
}

static void dense_free(void) {
    if (!dense.m) return;
    dense_release_pool();
    CUDA_CHECK(cudaFreeHost(dense.logits));
    CUDA_CHECK(cudaFree(dense.arena));
    free(dense.m->layers);
    free(dense.m);
    memset(&dense, 0, sizeof dense);
}

/* The model, with the KV pool and runner when pool is set. */
static DenseBench *dense_get(int pool) {
    if (dense.unfit) return NULL;
    if (!dense.m) {
        Model *m = xcalloc(1, sizeof *m);
        ModelConfig *c = &m->cfg;
        qwen3_8b_config(c);
        size_t H = c->hidden, qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim,
               I = c->intermediate, V = c->vocab;
        size_t per_layer = qd * H + 2 * kvd * H + H * qd + 3 * I * H;
        dense.mat_params = (double)per_layer * c->n_layers;
        size_t arena_bytes = ((per_layer + 4 * H) * c->n_layers + 2 * V * H + 8 * H) * 2 + (size_t)64 * 256 * c->n_layers;
        /* KV: every decode sequence of the largest batch gets its own blocks; prefill reuses them */
        int max_b = 128;
        dense.bps_dec = (BENCH_CTX + BENCH_STEPS + BS) / BS;
        dense.bps_pre = (PREFILL_LEN + BS - 1) / BS;
        dense.n_blocks = max_b * dense.bps_dec;
        CHECK(PREFILL_SEQS * dense.bps_pre <= dense.n_blocks, "bench: prefill needs more blocks than the pool (a bug)");
        /* the pool in BF16 (the server's default KV), and room for the f32-KV comparison rows' own pool */
        size_t kv_bytes = (size_t)dense.n_blocks * BS * c->n_layers * kvd * 2 * 2;
        size_t kvf_bytes = (size_t)dense.n_blocks * BS * c->n_layers * kvd * 4 * 2;
        size_t runner_bytes = (size_t)PREFILL_SEQS * PREFILL_LEN * (V + 8 * H + 2 * I + 2 * qd) * 4;
        size_t free_b = 0, total_b = 0;
        CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
        double need = (double)arena_bytes + kv_bytes + kvf_bytes + runner_bytes + (1u << 30);
        printf("  memory: weights %.1f GiB + BF16 KV cache %.1f GiB (+ %.1f GiB f32 for the comparison rows) + runner "
               "%.1f GiB; free %.1f GiB\n", arena_bytes / 1073741824.0, kv_bytes / 1073741824.0,
               kvf_bytes / 1073741824.0, runner_bytes / 1073741824.0, free_b / 1073741824.0);
        if (need > (double)free_b) {
            printf("  SKIP the dense bench: needs %.1f GiB of device memory\n", need / 1073741824.0);
            free(m);
            dense.unfit = 1;
            return NULL;
        }
        char *cur;
        CUDA_CHECK(cudaMalloc((void **)&dense.arena, arena_bytes));
        cur = dense.arena;
        uint64_t seed = 100;
        float ws = 0.02f; /* uniform +-0.02: std ~0.012, like a trained 4096-wide layer */
        carve_model_ends(m, &cur, &seed, ws);
        for (int l = 0; l < c->n_layers; l++) {
            LayerWeights *w = &m->layers[l];
            carve_layer_attn(w, c, &cur, &seed, ws);
            w->gate = wmat(I, H, carve(&cur, I * H, seed++, 0, ws));
            w->up = wmat(I, H, carve(&cur, I * H, seed++, 0, ws));
            w->down = wmat(H, I, carve(&cur, H * I, seed++, 0, ws));
        }
        CHECK((size_t)(cur - dense.arena) <= arena_bytes, "bench arena overflow (a bug)");
        CUDA_CHECK(cudaDeviceSynchronize());
        dense.weight_bytes = 2.0 * (dense.mat_params + (double)V * H); /* matmul weights + lm_head read per step */
        printf("  model: %.2fB params, %.1f GiB of matmul weights read per decode step\n",
               (dense.mat_params + 2.0 * V * H) / 1e9, dense.weight_bytes / 1073741824.0);
        /* pinned, as a server that samples on the host would use: the per-step logits copy runs at PCIe speed */
        CUDA_CHECK(cudaMallocHost((void **)&dense.logits, sizeof(float) * (size_t)max_b * V));
        dense.m = m;
    }
    if (pool && !dense.r) {
        const ModelConfig *c = &dense.m->cfg;
        dense.b = backend_cuda_create_resident(c->head_dim, BENCH_MAX_CTX);
        dense.r = runner_create_with(dense.m, dense.b, PREFILL_SEQS * PREFILL_LEN, BENCH_MAX_CTX);
        dense.kv = runner_kvcache_create_dtype(dense.r, dense.n_blocks, BS, KV_BF16);
        dense.tables = xmalloc(sizeof(int32_t) * (size_t)dense.n_blocks);
        for (int i = 0; i < dense.n_blocks; i++) dense.tables[i] = i;
        /* as a server does at start-up: each BF16 shape's decode GEMV (tiled / tensor cores at 2..8
         * tokens) measured and recorded on the model's matrices, before any step captures a graph
         * (the batch-8 rows run what it chose; its table is in the log) */
        device_gemv_calibrate(dense.b, dense.m);
    }
    return &dense;
}

/* Every bench section needs the roofline this process measured (the
 * "roofline" section, first of part 3); without it a section says so. */
static int bench_ready(const char *what) {
    if (bw_gbs > 0 && gemm_tfs > 0) return 1;
    printf("  SKIP %s: no roofline in this process (the roofline section was skipped or failed)\n", what);
    return 0;
}

static void section_roofline(void) {
    printf("== 3. bench: Qwen3-8B-shaped random BF16 model in device memory ==\n");
    measure_roofline();
}
static void section_gemv(void) { if (bench_ready("gemv")) bench_gemv(); }
static void section_crossover(void) { if (bench_ready("crossover")) bench_native_crossover(); }

static void section_prefill(void) {
    DenseBench *d = bench_ready("prefill") ? dense_get(1) : NULL;
    if (!d) return;
    const ModelConfig *c = &d->m->cfg;
    bench_prefill(d->r, d->kv, c, d->mat_params, d->logits, d->tables, d->bps_pre, "bf16"); /* attention on tensor cores */
    KVCache *kvf = runner_kvcache_create_dtype(d->r, PREFILL_SEQS * d->bps_pre, BS, KV_F32); /* CUDA cores */
    bench_prefill(d->r, kvf, c, d->mat_params, d->logits, d->tables, d->bps_pre, "bf16/kv-f32");
    runner_kvcache_free(d->r, kvf);
}

static void section_attn_prefill(void) {
    ModelConfig c;
    qwen3_8b_config(&c);
    if (bench_ready("attn_prefill")) bench_attn_prefill(&c);
}

static void section_attn_decode(void) {
    ModelConfig c, m;
    qwen3_8b_config(&c);
    qwen3_30b_a3b_config(&m);
    if (!bench_ready("attn_decode")) return;
    bench_attn_decode(&c, "Qwen3-8B");
    bench_attn_decode(&m, "Qwen3-30B-A3B");
}

/* Batch 1 with a process-wide switch off (set(0), then set(1) again): on a fresh one-sequence cache, so
 * the step is captured again with it off (forward.c keys graphs to the cache; a captured launch keeps
 * what it was launched with), freed after. */
/* set: a process-wide switch (cuda_pdl_enable, ...) or NULL; off: else a SAMPLER_CUDA_OFF row of the
 * runner's backend (backend_cuda_off). */
static void bench_b1_without(DenseBench *d, void (*set)(int), const char *off, const char *label) {
    KVCache *kv = runner_kvcache_create_dtype(d->r, d->bps_dec, BS, KV_BF16); /* new graphs (keyed to the cache) */
    if (set) set(0);
    else CHECK(backend_cuda_off(d->b, off, 1) == 0, "bench: no SAMPLER_CUDA_OFF row %s", off);
    bench_decode(d->r, kv, &d->m->cfg, 1, d->weight_bytes, d->logits, d->tables, d->bps_dec, label);
    if (set) set(1);
    else backend_cuda_off(d->b, off, 0);
    runner_kvcache_free(d->r, kv);
    bench_native_decode_rows();
}

static void section_decode(void) {
    DenseBench *d = bench_ready("decode") ? dense_get(1) : NULL;
    if (!d) return;
    const int batches[] = {1, 32, 128, 8}; /* 8: one n = 8 group (the served c1 rows), the GEMV start-up chose */
    for (int i = 0; i < 4; i++)
        bench_decode(d->r, d->kv, &d->m->cfg, batches[i], d->weight_bytes, d->logits, d->tables, d->bps_dec, "bf16");
    bench_native_decode_rows();
    KVCache *kvf = runner_kvcache_create_dtype(d->r, d->n_blocks, BS, KV_F32); /* the comparison rows */
    for (int i = 1; i < 3; i++)
        bench_decode(d->r, kvf, &d->m->cfg, batches[i], d->weight_bytes, d->logits, d->tables, d->bps_dec,
                     "bf16/kv-f32");
    runner_kvcache_free(d->r, kvf);
    /* batch 1 without programmatic dependent launch (cuda_pdl.cuh): what it saves; then without the
     * GEMVs' L2 weight prefetch before their wait: what that adds to it */
    if (cuda_pdl_enabled()) bench_b1_without(d, cuda_pdl_enable, NULL, "bf16 pdl off");
    else printf("  bf16 pdl off: programmatic dependent launch is not on here (binary or device before sm_90)\n");
    bench_b1_without(d, cuda_gemv_prefetch_enable, NULL, "bf16 prefetch off");
    /* and with o / down then add_rmsnorm as two launches each (matmul_add_norm.cu's epilogue off) */
    bench_b1_without(d, NULL, "matmul_add_rmsnorm", "bf16 add_norm off");
}

/* the measured batch-1 step the op breakdown is held against (0: not measured in this process) */
static double bench_row_ms(const char *prefix) {
    for (int i = 0; i < n_rows; i++)
        if (!strncmp(rows_out[i].name, prefix, strlen(prefix))) return rows_out[i].ms;
    return 0;
}

static void section_step_ops(void) {
    DenseBench *d = bench_ready("step_ops") ? dense_get(0) : NULL;
    if (d) bench_ops(d->m, bench_row_ms("bf16 decode batch 1 "));
}

static void section_mixed(void) {
    DenseBench *d = bench_ready("mixed") ? dense_get(1) : NULL;
    if (d) bench_mixed(d->r, d->kv, &d->m->cfg, 32, 224, d->mat_params, d->weight_bytes, d->logits, d->tables, d->bps_dec);
}

static void section_fp8(void) {
    DenseBench *d = bench_ready("fp8") ? dense_get(1) : NULL;
    if (!d) return;
    bench_quant(d->m, PREC_FP8, 0, d->logits, d->tables, d->bps_dec);
    bench_native_decode_rows();
}

static void section_fp8_native(void) {
    DenseBench *d = bench_ready("fp8_native") ? dense_get(1) : NULL;
    if (!d) return;
    if (!cuda_native_caps()) {
        printf("  fp8 native decode: no native GEMMs in this binary (cuda_native.h)\n");
        return;
    }
    bench_quant(d->m, PREC_FP8, 1, d->logits, d->tables, d->bps_dec);
    bench_native_decode_rows();
}

static void section_nvfp4(void) {
    DenseBench *d = bench_ready("nvfp4") ? dense_get(1) : NULL;
    if (!d) return;
    bench_quant(d->m, PREC_NVFP4, 0, d->logits, d->tables, d->bps_dec);
    bench_native_decode_rows();
}

static void section_decode_32k(void) {
    DenseBench *d = bench_ready("decode_32k") ? dense_get(0) : NULL;
    if (!d) return;
    dense_release_pool(); /* 8 x 32k positions of BF16 KV need the f32 pool's memory */
    bench_decode_long(d->m, d->weight_bytes, d->logits);
}

static void section_moe(void) { dense_free(); if (bench_ready("moe")) bench_moe(0); }
static void section_moe_mid(void) { dense_free(); if (bench_ready("moe_mid")) bench_moe(1); }
static void section_moe_prefill(void) { dense_free(); if (bench_ready("moe_prefill")) bench_moe_prefill(); }
/* Issue 19's deltas on quantized devices: the two device update paths on a Qwen3-8B MLP matrix. */
static void section_delta_quant(void) {
    for (int f = 0; f < 2; f++) {
        dq_run(12288, 4096, f ? WF_NVFP4 : WF_FP8, 0.001, native_row);
        dq_run(12288, 4096, f ? WF_NVFP4 : WF_FP8, 0.01, native_row);
    }
}
static void section_moe_prefill_fp8(void) { dense_free(); if (bench_ready("moe_prefill_fp8")) bench_moe_prefill_fp8(); }

/* The whole check, in order. Limits are watchdogs for a hang (a section's
 * usual time on an H200 is a few seconds to ~40 s); the ops section's rows
 * have 60 s each. Part 3's sections all need "roofline" first. */
static const CheckSection SECTIONS[] = {
    {"ops", 1, 60, section_ops},
    {"sampling", 1, 120, section_sampling},
    {"models_bf16", 2, 120, section_models_bf16},
    {"models_quant", 2, 120, section_models_quant},
    {"kl_fp8", 2, 120, native_kl_fixtures},
    {"lora", 2, 120, section_lora},
    {"devsample", 2, 120, section_devsample},
    {"kv_dtypes", 2, 120, section_kv_dtypes},
    {"long_f32", 2, 150, section_long_f32},
    {"long_bf16", 2, 150, section_long_bf16},
    {"roofline", 3, 60, section_roofline},
    {"gemv", 3, 60, section_gemv},
    {"crossover", 3, 90, section_crossover},
    {"prefill", 3, 90, section_prefill},
    {"attn_prefill", 3, 60, section_attn_prefill},
    {"attn_decode", 3, 120, section_attn_decode},
    {"decode", 3, 90, section_decode},
    {"step_ops", 3, 60, section_step_ops},
    {"mixed", 3, 60, section_mixed},
    {"fp8", 3, 90, section_fp8},
    {"fp8_native", 3, 90, section_fp8_native},
    {"nvfp4", 3, 90, section_nvfp4},
    {"decode_32k", 3, 90, section_decode_32k},
    {"moe", 3, 120, section_moe},
    {"moe_mid", 3, 120, section_moe_mid},
    {"moe_prefill", 3, 90, section_moe_prefill},
    {"moe_prefill_fp8", 3, 90, section_moe_prefill_fp8},
    {"delta_quant", 3, 90, section_delta_quant},
};
#define N_SECTIONS ((int)(sizeof SECTIONS / sizeof SECTIONS[0]))

/* --json FILE: the summary for bench/gpu_json.py (which names the rows of
 * bench/gpu/<gpu>.json from these): the device, the parts' counts and the
 * sections' progress (check_sections.h), the rooflines and every bench, GEMV
 * and op row as measured. Rewritten before and after every step, through a
 * temporary file and rename(), so what is on disk is always a whole JSON.
 * Names are our own printable ASCII without quotes or backslashes, so they
 * need no escaping. */
static const char *json_path;
static struct { char name[256]; int major, minor, sms; size_t mem; } dev;

static void write_json(void) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", json_path);
    FILE *f = fopen(tmp, "w");
    if (!f) { fprintf(stderr, "gpu_check: cannot write %s\n", tmp); return; }
    fprintf(f, "{\"gpu\": \"%s\", \"sm\": %d, \"sms\": %d, \"mem_gib\": %.1f,\n ", dev.name, dev.major * 10 + dev.minor,
            dev.sms, dev.mem / 1073741824.0);
    check_progress_json(f);
    fprintf(f, ",\n \"bench_ran\": %s, \"copy_gbs\": %.17g, \"gemm_tflops\": %.17g,\n \"rows\": [",
            bw_gbs > 0 ? "true" : "false", bw_gbs, gemm_tfs);
    for (int i = 0; i < n_rows; i++)
        fprintf(f, "%s\n  {\"name\": \"%s\", \"tok_s\": %.17g, \"ms\": %.17g, \"roof_tok_s\": %.17g, \"fraction\": %.17g}",
                i ? "," : "", rows_out[i].name, rows_out[i].tok_s, rows_out[i].ms, rows_out[i].roof_tok_s, rows_out[i].frac);
    fprintf(f, "],\n \"gemv\": [");
    for (int i = 0; i < n_gemv_rows; i++)
        fprintf(f, "%s\n  {\"name\": \"%s\", \"us\": %.17g, \"gbs\": %.17g, \"fraction\": %.17g}", i ? "," : "",
                gemv_rows[i].name, gemv_rows[i].us, gemv_rows[i].gbs, bw_gbs > 0 ? gemv_rows[i].gbs / bw_gbs : 0.0);
    fprintf(f, "],\n \"ops\": [");
    for (int i = 0; i < n_op_rows; i++)
        fprintf(f, "%s\n  {\"name\": \"%s\", \"us\": %.17g, \"per_step\": %d}", i ? "," : "", op_rows[i].name,
                op_rows[i].us, op_rows[i].per_step);
    fprintf(f, "],\n \"named_rows\": [");
    for (int i = 0; i < n_native_rows; i++) { /* bench_native.h: already named as the JSON wants */
        const char *nm = native_rows[i].name;
        size_t l = strlen(nm);
        const char *unit = l > 6 && !strcmp(nm + l - 6, "_tok_s") ? "tok/s"
                         : l > 2 && !strcmp(nm + l - 2, "_n") ? "tokens"
                         : strstr(nm, "kl_") == nm ? "nats" : "";
        fprintf(f, "%s\n  {\"name\": \"%s\", \"value\": %.17g, \"unit\": \"%s\"}", i ? "," : "", nm,
                native_rows[i].v, unit);
    }
    fprintf(f, "]}\n");
    if (fclose(f) || rename(tmp, json_path)) fprintf(stderr, "gpu_check: cannot write %s\n", json_path);
}

/* A sticky CUDA error (an illegal address, a launch failure) makes every later
 * call fail: the context is lost. Any other error left pending is reported,
 * counted as a failure and cleared. */
static int gpu_context_ok(const char *after) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) return 1;
    (void)cudaGetLastError();
    cudaError_t e2 = cudaDeviceSynchronize();
    printf("  FAIL a CUDA error was pending after %s: %s%s\n", after, cudaGetErrorString(e),
           e2 == cudaSuccess ? " (cleared)" : "");
    n_fail++;
    return e2 == cudaSuccess;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* lines survive a timeout kill (check.sh pipes us into tee) */
    char skip[2048];
    check_args_parse(argc, argv, SECTIONS, N_SECTIONS, skip, &ops_from, &json_path);
    if (cuda_device_probe(&dev.major, &dev.minor, &dev.sms, &dev.mem, dev.name, sizeof dev.name)) {
        fprintf(stderr, "gpu_check: no CUDA device\n");
        return 2;
    }
    printf("gpu_check: %s, sm_%d%d, %d SMs, %.1f GiB; binary built for sm_%d\n", dev.name, dev.major, dev.minor,
           dev.sms, dev.mem / 1073741824.0, cuda_binary_sm());
    cpu_ops_init();
    if (json_path) check_progress_write = write_json;
    check_context_ok = gpu_context_ok;
    check_sections_run(SECTIONS, N_SECTIONS, skip, &n_pass, &n_fail);

    const CheckProgress *g = &check_progress;
    printf("\n== gpu_check summary: %s (sm_%d%d, %d SMs, %.0f GiB) ==\n", dev.name, dev.major, dev.minor, dev.sms,
           dev.mem / 1073741824.0);
    printf("| part | result |\n|---|---|\n");
    printf("| 1. ops vs CPU reference | %d passed, %d failed |\n", g->pass[1], g->fail[1]);
    printf("| 2. fixture models vs transformers / CPU | %d passed, %d failed |\n", g->pass[2], g->fail[2]);
    if (n_rows) {
        printf("| 3. bench (roofline: copy %.0f GB/s, BF16 GEMM %.0f TFLOP/s) | see below |\n\n", bw_gbs, gemm_tfs);
        printf("| Qwen3-8B shapes | tok/s | ms/step | roofline tok/s | fraction of roofline |\n"
               "|---|---|---|---|---|\n");
        for (int i = 0; i < n_rows; i++)
            printf("| %s | %.1f | %.2f | %.1f | %.1f%% |\n", rows_out[i].name, rows_out[i].tok_s, rows_out[i].ms,
                   rows_out[i].roof_tok_s, 100 * rows_out[i].frac);
        printf("\n| decode GEMV alone | us | GB/s | fraction of copy bandwidth |\n|---|---|---|---|\n");
        for (int i = 0; i < n_gemv_rows; i++)
            printf("| %s | %.1f | %.0f | %.1f%% |\n", gemv_rows[i].name, gemv_rows[i].us, gemv_rows[i].gbs,
                   100 * gemv_rows[i].gbs / bw_gbs);
    }
    native_summary();
    if (skip[0]) printf("\nskipped sections: %s\n", skip);
    printf("\n%d passed, %d failed\n", n_pass, n_fail);
    dense_free();
    return n_fail ? 1 : 0;
}
