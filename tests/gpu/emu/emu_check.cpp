/*
 * emu_check.cpp - the CUDA backend on the CPU emulation (shim/):
 *   1. the op checks of tests/gpu/op_checks.h (the table gpu_check.c runs on a
 *      GPU, minus its OC_GPU rows): the CUDA backend's ops and launchers
 *      against the CPU backend's reference ops, with NaN-poisoned outputs
 *      (index, masking, reduction and merge bugs), and the tiled GEMV's
 *      decoders bit for bit;
 *   2. the fixture models end to end through backend_cuda_create and the
 *      device path of forward.c (the registry's upload, uploads, downloads,
 *      MoE gather/scatter) against transformers and the CPU backend, with the
 *      bounds of tests/gpu/gpu_check.c part 2 (the emulated cuBLAS GEMM is a
 *      plain loop, so only its call and layout are checked here).
 *   2b. LoRA adapters end to end (tests/gpu/lora_checks.h): a mixed batch of two
 *      adapters and the base against the CPU and transformers + peft, an
 *      in-place replacement, and a failure injected into each CUDA call of an
 *      adapter's upload (refused, the old adapter keeps serving);
 *   3. a CUDA failure injected into every CUDA call of a delta's device update
 *      in turn (shim: emu_fail_nth), then a bit flipped in every host-to-device
 *      copy of it in turn (emu_corrupt_nth): the commit fails and restores the
 *      host and device copies bit for bit.
 * Same tolerance classes as tests/gpu/gpu_check.c. Small shapes (every
 * emulated CUDA thread is a thread). Not covered: real cuBLAS, timing, and
 * anything about real device memory or stream ordering.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../op_checks.h"
#include "../lora_checks.h"
#include "../sampling_checks.h"
#include "../engine_devsample_check.h"
#include "../bench_delta_quant.h"
#include "../attn_bounds.h"
#include "cuda_kernels.h"
#include "cuda_runtime.h" /* the shim: gemv_tile.cuh is device code */
#include "gemv_tile.cuh"
#include "cuda_native.h"
extern "C" {
#include "backend.h"
#include "delta.h"
#include "device_select.h"
#include "dtype.h"
#include "model.h"
#include "quant.h"
#include "safetensors.h"
}
#include "../bench_crossover.h" /* after the C headers: their declarations keep C linkage */

/* The tiled GEMV's decoders (gemv_tile.cuh; their portable paths, which share the
 * PRMT selectors with the device) against the scalar references, bit for bit: every
 * byte value in every byte of a word through e2m1x8 (both nibbles: all 16 codes in
 * all 8 positions) vs e2m1_to_f32, and every byte through e4m3x4 (NaN for NaN). */
static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static void t_decode(void) {
    size_t bad = 0;
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t u = b | ((b + 85) & 0xffu) << 8 | ((b + 170) & 0xffu) << 16 | ((b + 37) & 0xffu) << 24;
        float w[8];
        e2m1x8(u, w);
        for (int i = 0; i < 8; i++)
            if (f32_bits(w[i]) != f32_bits(e2m1_to_f32(u >> (4 * i) & 0xfu)) && bad++ < 4)
                printf("       e2m1x8 word 0x%08x value %d: 0x%08x, want 0x%08x\n", u, i, f32_bits(w[i]),
                       f32_bits(e2m1_to_f32(u >> (4 * i) & 0xfu)));
        e4m3x4(u, w);
        for (int i = 0; i < 4; i++) {
            float want = e4m3_to_f32(u >> (8 * i) & 0xffu);
            if ((isnan(want) ? !isnan(w[i]) : f32_bits(w[i]) != f32_bits(want)) && bad++ < 4)
                printf("       e4m3x4 word 0x%08x value %d: 0x%08x, want 0x%08x\n", u, i, f32_bits(w[i]), f32_bits(want));
        }
    }
    bad ? n_fail++ : n_pass++;
    printf("  %-4s %-60s mismatches %zu\n", bad ? "FAIL" : "ok", "e2m1x8 / e4m3x4 decode of all 256 bytes vs scalar", bad);
}

/* ---- 2. fixture models ---- */
static void (*cpu_mm)(Backend *, float *, const float *, int, const WeightMat *, const uint16_t *);
/* The CPU matmul rounding its input to bf16 where the GPU path does (cuBLAS, n > CUDA_GEMV_MAX_N). */
static void mm_bf16act(Backend *b, float *out, const float *x, int n, const WeightMat *w, const uint16_t *bias) {
    if (n <= CUDA_GEMV_MAX_N || w->fmt != WF_BF16) { /* FP8/NVFP4: the GPU runs f32 x for every n */
        cpu_mm(b, out, x, n, w, bias);
        return;
    }
    size_t N = (size_t)n * w->cols;
    float *xr = (float *)malloc(sizeof(float) * N);
    for (size_t i = 0; i < N; i++) xr[i] = bf16_to_f32(f32_to_bf16(x[i]));
    cpu_mm(b, out, xr, n, w, bias);
    free(xr);
}

static void logit_check(const char *what, const float *ref, const float *got, int rows, int V, double max_abs, double max_kl) {
    LogitStats st = logit_stats(ref, got, rows, V);
    int ok = st.max_abs <= max_abs && st.max_kl <= max_kl;
    ok ? n_pass++ : n_fail++;
    printf("  %-4s %-58s max|dlogit| %.2e KL %.2e\n", ok ? "ok" : "FAIL", what, st.max_abs, st.max_kl);
}

/* The native paths end to end (issue 19): t_act_pc >= 0 loads the model with quantized
 * activations (FP8 per output channel when 1), prefills seq1 (16 tokens: at the
 * crossover) instead of seq0, and the CPU reference follows the GPU's per-shape
 * choice (mm_native_ref): quantized activations where the GPU takes a native GEMM,
 * weight-only where it takes the GEMV. Steps with quantized activations get the
 * flip bounds (0.1, 3e-4): an activation within ~1e-7 of an e4m3 / e2m1 rounding
 * midpoint rounds the other way on one side (measured 6.1e-3 / 1.5e-6 on
 * llama31's 70-token sequence at nvfp4); everything else stays at 1e-3 / 1e-7. */
static int t_act_pc = -1;
/* 1: the run must be able to use graphs (an MoE fixture whose experts the device groups) */
static int t_want_graphs;
static void mm_native_ref(Backend *b, float *out, const float *x, int n, const WeightMat *w, const uint16_t *bias) {
    if (w->fmt != WF_BF16 && w->act_quant && (n < CUDA_NATIVE_MIN_N || !backend_cuda_native_kind(w))) {
        WeightMat c = *w;
        c.act_quant = 0;
        cpu_mm(b, out, x, n, &c, bias);
        return;
    }
    mm_bf16act(b, out, x, n, w, bias);
}

/* prec != PREC_BF16: the decoder linears quantized weight-only on load (model_quantize), the
 * same Model on both backends; compared with the CPU only (transformers is BF16). kvt: the
 * KV cache dtype of both runners; BF16 / FP8 KV compare with the CPU at the same KV dtype
 * only, decode with the flip bounds (an element within an ulp of a rounding midpoint may
 * round the other way on the two sides; gpu_check.c run_fixture_kv). */
/* The end of a model-level check: the CPU and CUDA runners with their caches, the reference
 * file (or NULL) and the model. */
static void t_pair_free(Runner *rc, KVCache *kvc, Runner *rg, KVCache *kvg, SafeTensors *ref, Model *m) {
    runner_kvcache_free(rg, kvg);
    runner_kvcache_free(rc, kvc);
    runner_free(rg);
    runner_free(rc);
    if (ref) safetensors_free(ref);
    model_free(m);
}

static void t_model_kv(const char *dir, int n_decode, Precision prec, KvDtype kvt) {
    Err err = {};
    Model *m = NULL;
    SafeTensors *ref = NULL;
    char path[512], what[160];
    snprintf(path, sizeof path, "%s/ref.safetensors", dir);
    int act = t_act_pc >= 0;
    if (model_load(&m, dir, &err) ||
        (prec != PREC_BF16 && (act ? model_quantize_layout(m, prec, 0, t_act_pc, &err) : model_quantize(m, prec, 1, &err))) ||
        safetensors_open(&ref, path, &err)) {
        printf("  FAIL %s: %s\n", dir, err.msg);
        n_fail++;
        return;
    }
    int V = m->cfg.vocab;
    Backend *cpu = backend_cpu_create(1, 128);
    cpu_mm = cpu->matmul;
    cpu->matmul = act ? mm_native_ref : mm_bf16act;
    Backend *gb = backend_cuda_create(&m->weights, m->cfg.head_dim, 128);
    Runner *rc = runner_create_with(m, cpu, 128, 128), *rg = runner_create_with(m, gb, 128, 128);
    KVCache *kvc = runner_kvcache_create_dtype(rc, 80, 4, kvt), *kvg = runner_kvcache_create_dtype(rg, 80, 4, kvt);
    int exact_kv = kvt == KV_F32;
    double dec_abs = exact_kv ? 1e-3 : 0.1, dec_kl = exact_kv ? 1e-7 : 3e-4;
    const StTensor *t0 = safetensors_get(ref, act ? "seq1.tokens" : "seq0.tokens"), *t1 = safetensors_get(ref, "seq1.tokens");
    const StTensor *lp = safetensors_get(ref, "seq0.prefill_logits"), *ld = safetensors_get(ref, "seq0.decode_logits");
    /* EMU_QUICK (ASan's first half): the first 3
     * positions only (causal, so the reference rows still apply) and no mixed step */
    int quick = getenv("EMU_QUICK") != NULL;
    int T0 = (int)t0->numel, T1 = t1 && !quick ? (int)t1->numel : 0;
    if (quick && T0 > 3) T0 = 3;
    int32_t bt0[32], bt1[32], pos[128], seq[128], rows[128], tok[128];
    for (int i = 0; i < 32; i++) { bt0[i] = 1 + 2 * i; bt1[i] = 78 - 2 * i; }
    const int32_t *tables[2] = {bt0, bt1};
    float *oc = (float *)malloc(sizeof(float) * 128 * V), *og = (float *)malloc(sizeof(float) * 128 * V);
    /* prefill of seq0 */
    for (int i = 0; i < T0; i++) { pos[i] = i; seq[i] = 0; rows[i] = i; }
    Batch b = {T0, (const int32_t *)t0->data, pos, seq, 1, tables, T0, rows, 0};
    int rc1 = model_forward(rc, kvc, &b, oc, &err), rc2 = model_forward(rg, kvg, &b, og, &err);
    if (rc1 || rc2) { printf("  FAIL %s prefill: %s\n", dir, err.msg); n_fail++; }
    char pn[64];
    snprintf(pn, sizeof pn, "%s%s%s%s", precision_name(prec), !act ? "" : t_act_pc ? " native per-channel" : " native",
             exact_kv ? "" : " kv ", exact_kv ? "" : kv_dtype_name(kvt));
    if (prec == PREC_BF16 && exact_kv) {
        snprintf(what, sizeof what, "%s prefill %d vs transformers", dir, T0);
        logit_check(what, (const float *)lp->data, og, T0, V, 0.2, 1e-3);
    }
    snprintf(what, sizeof what, "%s %s prefill %d vs cpu (bf16 act)", dir, pn, T0);
    logit_check(what, oc, og, T0, V, act || !exact_kv ? 0.1 : 1e-3, act || !exact_kv ? 3e-4 : 1e-7);
    /* decode steps of seq0 */
    for (int i = 0; i < n_decode && ld && i < T0; i++) {
        int32_t zero = 0;
        Batch b1 = {1, (const int32_t *)t0->data + i, pos + i, seq, 1, tables, 1, &zero, 0};
        rc1 = model_forward(rc, kvc, &b1, oc, &err);
        rc2 = model_forward(rg, kvg, &b1, og, &err);
        if (rc1 || rc2) { printf("  FAIL %s decode: %s\n", dir, err.msg); n_fail++; }
        if (prec == PREC_BF16 && exact_kv) {
            snprintf(what, sizeof what, "%s decode pos %d vs transformers", dir, i);
            logit_check(what, (const float *)ld->data + (size_t)i * V, og, 1, V, 1e-3, 1e-7);
        }
        snprintf(what, sizeof what, "%s %s decode pos %d vs cpu", dir, pn, i);
        logit_check(what, oc, og, 1, V, dec_abs, dec_kl);
    }
    if (n_decode >= 3 && ld && T0 >= 3) { /* eager, captured, replayed: the emulation records graphs as CUDA does */
        uint64_t cap = 0, rep = 0;
        int can = runner_graph_counts(rg, &cap, &rep);
        int ok = can ? cap >= 1 && rep >= 1 : cap == 0 && rep == 0 && m->cfg.n_experts > 0 && !t_want_graphs; /* only ungrouped experts opt out */
        ok ? n_pass++ : n_fail++;
        printf("  %-4s %s %s decode steps through a CUDA graph: %llu captured, %llu replayed%s\n", ok ? "ok" : "FAIL",
               dir, pn, (unsigned long long)cap, (unsigned long long)rep, can ? "" : " (experts run one by one: eager)");
    }
    /* two sequences in one step (seq1 prefill + the next seq0 token), a few output rows; four
     * times: eager at the padded bucket size, captured as piecewise graphs, replayed, then with
     * seq1's last token dropped (another padding of the same bucket, or another bucket). The
     * cache rows the steps write are the same each time. */
    if (T1 && T1 + 1 <= 128) {
        uint64_t pc0 = 0, pr0 = 0, pc1 = 0, pr1 = 0, gc = 0, gr = 0;
        runner_piece_counts(rg, &pc0, &pr0);
        for (int run = 0; run < 4; run++) {
            int m1 = run < 3 ? T1 : T1 - 1, k = 0;
            for (int i = 0; i < m1; i++, k++) { tok[k] = ((const int32_t *)t1->data)[i]; pos[k] = i; seq[k] = 1; }
            tok[k] = ((const int32_t *)t0->data)[T0 - 1]; pos[k] = T0 - 1; seq[k] = 0; k++;
            int32_t outr[3] = {0, m1 - 1, m1};
            Batch b2 = {k, tok, pos, seq, 2, tables, 3, outr, 0};
            rc1 = model_forward(rc, kvc, &b2, oc, &err);
            rc2 = model_forward(rg, kvg, &b2, og, &err);
            if (rc1 || rc2) { printf("  FAIL %s mixed: %s\n", dir, err.msg); n_fail++; }
            static const char *mode[4] = {"eager", "captured", "replayed", "one token fewer"};
            snprintf(what, sizeof what, "%s %s mixed step of %d tokens (%s) vs cpu", dir, pn, k, mode[run]);
            logit_check(what, oc, og, 3, V, 0.1, 3e-4); /* cuBLAS path: see gpu_check.c MAX_ABS_FLIP */
        }
        runner_piece_counts(rg, &pc1, &pr1);
        int can = runner_graph_counts(rg, &gc, &gr);
        int ok = can ? pc1 - pc0 >= 1 && pr1 - pr0 >= 1 : pc1 == pc0 && pr1 == pr0;
        ok ? n_pass++ : n_fail++;
        printf("  %-4s %s %s mixed steps through piecewise graphs: %llu captured, %llu replayed%s\n",
               ok ? "ok" : "FAIL", dir, pn, (unsigned long long)(pc1 - pc0), (unsigned long long)(pr1 - pr0),
               can ? "" : " (experts run one by one: eager)");
        /* seq0's prefill and the same mixed step on a second cache: the piecewise graphs write the
         * K/V of the cache they were captured on, so a step on another cache must not replay them */
        KVCache *kvc2 = runner_kvcache_create_dtype(rc, 80, 4, kvt), *kvg2 = runner_kvcache_create_dtype(rg, 80, 4, kvt);
        for (int i = 0; i < T0; i++) { pos[i] = i; seq[i] = 0; rows[i] = i; }
        rc1 = model_forward(rc, kvc2, &b, oc, &err);
        rc2 = model_forward(rg, kvg2, &b, og, &err);
        int k = 0;
        for (int i = 0; i < T1; i++, k++) { tok[k] = ((const int32_t *)t1->data)[i]; pos[k] = i; seq[k] = 1; }
        tok[k] = ((const int32_t *)t0->data)[T0 - 1]; pos[k] = T0 - 1; seq[k] = 0; k++;
        int32_t outr[3] = {0, T1 - 1, T1};
        Batch b2 = {k, tok, pos, seq, 2, tables, 3, outr, 0};
        rc1 |= model_forward(rc, kvc2, &b2, oc, &err);
        rc2 |= model_forward(rg, kvg2, &b2, og, &err);
        if (rc1 || rc2) { printf("  FAIL %s second cache: %s\n", dir, err.msg); n_fail++; }
        snprintf(what, sizeof what, "%s %s mixed step of %d tokens on a second cache vs cpu", dir, pn, k);
        logit_check(what, oc, og, 3, V, 0.1, 3e-4);
        runner_kvcache_free(rc, kvc2);
        runner_kvcache_free(rg, kvg2);
    }
    /* A sparse delta on layer 0's o_proj master, as admin_touched applies it: BF16 scatters the
     * touched elements into the device copy (verified read-back); FP8/NVFP4 re-quantize on the
     * host and re-upload the quantized bytes. Then the prefill again vs the cpu. */
    {
        WeightMat *w = &m->layers[0].o;
        for (int i = 0; i < T0; i++) { pos[i] = i; seq[i] = 0; rows[i] = i; } /* the mixed step reused them */
        float *before = (float *)malloc(sizeof(float) * (size_t)T0 * V);
        rc1 = model_forward(rc, kvc, &b, before, &err);
        /* MoE models: expert 0's gate in the first MoE layer too (its values grow, so a re-quantized
         * expert's scales change: the grouped GEMV reads NVFP4's scale2 through a pointer table) */
        WeightMat *tw[2] = {w, NULL};
        for (int l = 0; l < m->cfg.n_layers && !tw[1]; l++)
            if (model_layer_is_moe(&m->cfg, l)) tw[1] = &m->layers[l].egate[0];
        int rq = 0, ru1 = 0;
        for (int ti = 0; ti < 2 && tw[ti]; ti++) {
            WeightMat *t = tw[ti];
            int64_t idx[24];
            for (int i = 0; i < 24; i++) {
                idx[i] = (int64_t)(rng_u64() % ((uint64_t)t->rows * t->cols));
                t->bf16[idx[i]] = f32_to_bf16(i % 2 ? 0.75f : -0.75f);
            }
            for (int i = 1; i < 24; i++) /* increasing, unique, as delta commit passes them */
                for (int j = i; j > 0 && idx[j - 1] > idx[j]; j--) { int64_t x = idx[j]; idx[j] = idx[j - 1]; idx[j - 1] = x; }
            int n_idx = 1;
            for (int i = 1; i < 24; i++) if (idx[i] != idx[n_idx - 1]) idx[n_idx++] = idx[i];
            rq |= prec == PREC_BF16 ? 0
                  : prec == PREC_FP8 ? quant_fp8_requant((QuantFp8 *)t->q, t->bf16, idx, n_idx, &err)
                                     : quant_nvfp4_requant((QuantNvfp4 *)t->q, t->bf16, idx, n_idx, &err);
            ru1 |= runner_weights_changed(rg, t->bf16, sizeof(uint16_t) * (size_t)t->rows * t->cols, idx, n_idx, 2, &err);
        }
        size_t wb = sizeof(uint16_t) * (size_t)w->rows * w->cols;
        rc1 |= model_forward(rc, kvc, &b, oc, &err);
        rc2 = model_forward(rg, kvg, &b, og, &err);
        if (rq < 0 || ru1 || rc1 || rc2) { printf("  FAIL %s delta: %s\n", dir, err.msg); n_fail++; }
        if (prec == PREC_BF16) { /* the device copy must now hash like the host master */
            uint16_t *dev = (uint16_t *)malloc(wb);
            int same = backend_cuda_read_weight(gb, w, dev, wb) == 0 && memcmp(dev, w->bf16, wb) == 0;
            same ? n_pass++ : n_fail++;
            printf("  %-4s %s bf16 delta: device copy equals the host master after the scatter\n", same ? "ok" : "FAIL", dir);
            free(dev);
        }
        double moved = 0;
        for (size_t i = 0; i < (size_t)T0 * V; i++) moved = fmax(moved, fabs((double)oc[i] - before[i]));
        int ok = moved > 1e-2; /* else a stale device copy would pass unnoticed */
        ok ? n_pass++ : n_fail++;
        printf("  %-4s %s %s delta on layer 0 o_proj%s moved the cpu logits by %.2e\n", ok ? "ok" : "FAIL", dir, pn,
               tw[1] ? " and an expert" : "", moved);
        snprintf(what, sizeof what, "%s %s prefill after the delta vs cpu", dir, pn);
        logit_check(what, oc, og, T0, V, prec == PREC_BF16 || act || !exact_kv ? 0.1 : 1e-3,
                    prec == PREC_BF16 || act || !exact_kv ? 3e-4 : 1e-7);
        /* a decode step after it replays the batch-1 graph captured before the delta (the delta
         * drops no graph): every updated buffer, NVFP4's tensor scale included (WeightMat.dev_s2),
         * is read by the graph's kernels at run time */
        int32_t zero = 0, dpos = T0 - 1;
        Batch b1 = {1, (const int32_t *)t0->data + T0 - 1, &dpos, seq, 1, tables, 1, &zero, 0};
        uint64_t cap0 = 0, rep0 = 0, cap1 = 0, rep1 = 0;
        int can = runner_graph_counts(rg, &cap0, &rep0);
        rc1 = model_forward(rc, kvc, &b1, oc, &err);
        rc2 = model_forward(rg, kvg, &b1, og, &err);
        runner_graph_counts(rg, &cap1, &rep1);
        if (rc1 || rc2) { printf("  FAIL %s decode after the delta: %s\n", dir, err.msg); n_fail++; }
        snprintf(what, sizeof what, "%s %s decode after the delta vs cpu", dir, pn);
        logit_check(what, oc, og, 1, V, act ? 0.1 : dec_abs, act ? 3e-4 : dec_kl);
        if (can && n_decode >= 3 && ld && T0 >= 3) { /* a batch-1 graph was captured above */
            int ok = cap1 == cap0 && rep1 == rep0 + 1;
            ok ? n_pass++ : n_fail++;
            printf("  %-4s %s %s decode after the delta replayed the graph captured before it (%llu captures, "
                   "%llu replays)\n", ok ? "ok" : "FAIL", dir, pn, (unsigned long long)(cap1 - cap0),
                   (unsigned long long)(rep1 - rep0));
        }
        free(before);
    }
    free(oc);
    free(og);
    t_pair_free(rc, kvc, rg, kvg, ref, m);
}


static void t_model(const char *dir, int n_decode, Precision prec) { t_model_kv(dir, n_decode, prec, KV_F32); }

/* Routed experts captured through the CUDA backend (runner_set_expert_capture, what a request's
 * return_routed_experts records) against the CPU runner's: the prefill of the fixture's longest
 * sequence (past 8 tokens: the router's matmul on cuBLAS, the experts on the grouped GEMM) and 3
 * decode steps of an MoE fixture, every (token, MoE layer) row of top_k ids compared as the record carries them (in
 * routing order). The two runners' router inputs differ by float order (bf16-rounded activations on
 * both, as t_model_kv), so an id may differ only at a near tie of the router's top_k boundary; these
 * fixtures have none (measured: every row equal), so any difference fails. Also: the rows are real
 * routings (ids in range, distinct within a row, more than one expert used). */
static void t_experts_capture(const char *dir) {
    Err err = {};
    Model *m = NULL;
    char path[512];
    snprintf(path, sizeof path, "%s/ref.safetensors", dir);
    SafeTensors *ref = NULL;
    if (model_load(&m, dir, &err) || safetensors_open(&ref, path, &err)) {
        printf("  FAIL %s: %s\n", dir, err.msg);
        n_fail++;
        return;
    }
    const ModelConfig *c = &m->cfg;
    int n_moe = 0, K = c->top_k, E = c->n_experts;
    for (int l = 0; l < c->n_layers; l++) n_moe += model_layer_is_moe(c, l);
    Backend *cpu = backend_cpu_create(1, 128);
    cpu_mm = cpu->matmul;
    cpu->matmul = mm_bf16act;
    Backend *gb = backend_cuda_create(&m->weights, c->head_dim, 128);
    Runner *rc = runner_create_with(m, cpu, 128, 128), *rg = runner_create_with(m, gb, 128, 128);
    KVCache *kvc = runner_kvcache_create(rc, 80, 4), *kvg = runner_kvcache_create(rg, 80, 4);
    const StTensor *t0 = safetensors_get(ref, "seq2.tokens"); /* the longest: 33 tokens, a grouped-GEMM prefill */
    int T0 = (int)t0->numel, quick = getenv("EMU_QUICK") != NULL;
    if (quick && T0 > 3) T0 = 3;
    if (T0 > 64) T0 = 64;
    size_t row = (size_t)n_moe * K;
    int32_t *ec = (int32_t *)malloc(sizeof(int32_t) * 64 * row), *eg = (int32_t *)malloc(sizeof(int32_t) * 64 * row);
    float *oc = (float *)malloc(sizeof(float) * 64 * c->vocab), *og = (float *)malloc(sizeof(float) * 64 * c->vocab);
    int32_t bt[32], pos[64], seq[64], rows[64];
    for (int i = 0; i < 32; i++) bt[i] = 1 + 2 * i;
    const int32_t *tables[1] = {bt};
    int steps = quick ? 1 : 3, differ = 0, bad = 0, n_rows = 0, rc_ = 0;
    uint64_t used = 0;
    for (int st = 0; st <= steps && st < T0; st++) {
        int n = st == 0 ? T0 - steps : 1, p0 = st == 0 ? 0 : T0 - steps + st - 1;
        if (n < 1) break;
        for (int i = 0; i < n; i++) { pos[i] = p0 + i; seq[i] = 0; rows[i] = i; }
        memset(ec, 0xff, sizeof(int32_t) * (size_t)n * row);
        memset(eg, 0xee, sizeof(int32_t) * (size_t)n * row); /* a row the capture does not write differs */
        Batch b = {n, (const int32_t *)t0->data + p0, pos, seq, 1, tables, n, rows, 0};
        runner_set_expert_capture(rc, ec);
        runner_set_expert_capture(rg, eg);
        rc_ |= model_forward(rc, kvc, &b, oc, &err) | model_forward(rg, kvg, &b, og, &err);
        for (int t = 0; t < n; t++)
            for (int l = 0; l < n_moe; l++, n_rows++) {
                const int32_t *a = ec + ((size_t)t * n_moe + l) * K, *g = eg + ((size_t)t * n_moe + l) * K;
                differ += memcmp(a, g, sizeof(int32_t) * K) != 0;
                for (int k = 0; k < K; k++) {
                    bad += a[k] < 0 || a[k] >= E;
                    for (int j = 0; j < k; j++) bad += a[j] == a[k];
                    if (a[k] >= 0 && a[k] < 64) used |= 1ull << a[k];
                }
            }
    }
    runner_set_expert_capture(rc, NULL);
    runner_set_expert_capture(rg, NULL);
    int ok = !rc_ && differ == 0 && bad == 0 && n_rows > 0 && __builtin_popcountll(used) > 1;
    ok ? n_pass++ : n_fail++;
    printf("  %-4s %s routed experts captured through the CUDA backend vs cpu: prefill %d + %d decode tokens x %d MoE "
           "layers x top-%d: %d of %d rows differ, %d bad ids, %d experts used%s%s\n", ok ? "ok" : "FAIL", dir,
           T0 - steps, steps, n_moe, K, differ, n_rows, bad, __builtin_popcountll(used), rc_ ? "; forward failed: " : "",
           rc_ ? err.msg : "");
    free(ec); free(eg); free(oc); free(og);
    t_pair_free(rc, kvc, rg, kvg, ref, m);
}

/* The attention kernels of the production shapes at the model level (qwen3_g8_hd128: 8 query
 * heads a KV head at head_dim 128, attention_dec_mma.cu's decode; qwen3_hd64_g4: the vector
 * kernel): the fixture's last sequence (70 tokens, two of attention_mma.cu's 64-position
 * tiles) prefilled but for its last 4 tokens, then those decoded one at a time (contexts
 * 67..70, across the tile edge), vs the CPU at the same KV dtype and, with the f32 cache, vs
 * transformers; then those 66 tokens and seq1's 16 prefilled in one step on fresh caches (two
 * sequences' tiles in one tensor-core launch). t_model_kv reads only the first two sequences
 * (7 and 16 tokens: its mixed step of 17 tokens over two sequences stays under the
 * tensor-core prefill's 16 a sequence).
 * Bounds: ATTN_TOL (tests/gpu/attn_bounds.h, with what they measured); vs transformers
 * (f32 cache) 0.2 / 1e-3, t_model_kv's (measured 5.4e-2 / 1.1e-4). */
static void t_attn_long(const char *dir, KvDtype kvt) {
    Err err = {};
    Model *m = NULL;
    SafeTensors *ref = NULL;
    char path[512], what[160];
    snprintf(path, sizeof path, "%s/ref.safetensors", dir);
    if (model_load(&m, dir, &err) || safetensors_open(&ref, path, &err)) {
        printf("  FAIL %s: %s\n", dir, err.msg);
        n_fail++;
        model_free(m);
        return;
    }
    const StTensor *tt = safetensors_get(ref, "seq2.tokens"), *lp = safetensors_get(ref, "seq2.prefill_logits");
    CHECK(tt && lp && tt->numel > 8 && tt->numel <= 128, "t_attn_long: %s has no seq2 of 9..128 tokens", dir);
    int V = m->cfg.vocab, T = (int)tt->numel, P = T - 4, exact_kv = kvt == KV_F32;
    const int32_t *tok = (const int32_t *)tt->data;
    const float *want = (const float *)lp->data; /* [T, V]: prefill rows equal decode rows (make_fixtures.py) */
    Backend *cpu = backend_cpu_create(1, 128);
    cpu_mm = cpu->matmul;
    cpu->matmul = mm_bf16act;
    Backend *gb = backend_cuda_create(&m->weights, m->cfg.head_dim, 128);
    Runner *rc = runner_create_with(m, cpu, 128, 128), *rg = runner_create_with(m, gb, 128, 128);
    KVCache *kvc = runner_kvcache_create_dtype(rc, 40, 4, kvt), *kvg = runner_kvcache_create_dtype(rg, 40, 4, kvt);
    int32_t bt[32], pos[128], seq[128], rows[128];
    for (int i = 0; i < 32; i++) bt[i] = 39 - i; /* blocks out of order */
    const int32_t *tables[1] = {bt};
    for (int i = 0; i < T; i++) { pos[i] = i; seq[i] = 0; rows[i] = i; }
    float *oc = (float *)malloc(sizeof(float) * (size_t)P * V), *og = (float *)malloc(sizeof(float) * (size_t)P * V);
    Batch b = {P, tok, pos, seq, 1, tables, P, rows, 0};
    if (model_forward(rc, kvc, &b, oc, &err) || model_forward(rg, kvg, &b, og, &err)) {
        printf("  FAIL %s prefill %d: %s\n", dir, P, err.msg);
        n_fail++;
    }
    const char *kn = kv_dtype_name(kvt);
    snprintf(what, sizeof what, "%s kv %s prefill %d vs cpu (bf16 act)", dir, kn, P);
    logit_check(what, oc, og, P, V, ATTN_TOL[kvt].pre_abs, ATTN_TOL[kvt].pre_kl);
    if (exact_kv) {
        snprintf(what, sizeof what, "%s kv %s prefill %d vs transformers", dir, kn, P);
        logit_check(what, want, og, P, V, 0.2, 1e-3);
    }
    for (int i = P; i < T; i++) {
        int32_t zero = 0;
        Batch b1 = {1, tok + i, pos + i, seq, 1, tables, 1, &zero, 0};
        if (model_forward(rc, kvc, &b1, oc, &err) || model_forward(rg, kvg, &b1, og, &err)) {
            printf("  FAIL %s decode pos %d: %s\n", dir, i, err.msg);
            n_fail++;
        }
        snprintf(what, sizeof what, "%s kv %s decode pos %d vs cpu", dir, kn, i);
        logit_check(what, oc, og, 1, V, ATTN_TOL[kvt].dec_abs, ATTN_TOL[kvt].dec_kl);
        if (exact_kv) {
            snprintf(what, sizeof what, "%s kv %s decode pos %d vs transformers", dir, kn, i);
            logit_check(what, want + (size_t)i * V, og, 1, V, 0.2, 1e-3);
        }
    }
    /* Two prompts prefilled in one step (the first P tokens and seq1's 16, on fresh caches): the
     * tensor-core kernel's tiles split by sequence, each with its own block table, every row out */
    const StTensor *t1 = safetensors_get(ref, "seq1.tokens"), *l1 = safetensors_get(ref, "seq1.prefill_logits");
    CHECK(t1 && l1 && t1->numel >= 16 && P + t1->numel <= 128, "t_attn_long: %s seq1 of 16+ tokens", dir);
    int T1 = (int)t1->numel, N2 = P + T1;
    int32_t bt1[32], tok2[128];
    for (int i = 0; i < 32; i++) bt1[i] = i; /* blocks 0.. (seq2 has 39 down to 23) */
    const int32_t *tables2[2] = {bt, bt1};
    for (int i = 0; i < N2; i++) {
        int a = i < P;
        tok2[i] = a ? tok[i] : ((const int32_t *)t1->data)[i - P];
        pos[i] = a ? i : i - P;
        seq[i] = a ? 0 : 1;
        rows[i] = i;
    }
    float *oc2 = (float *)malloc(sizeof(float) * (size_t)N2 * V), *og2 = (float *)malloc(sizeof(float) * (size_t)N2 * V);
    KVCache *kvc2 = runner_kvcache_create_dtype(rc, 40, 4, kvt), *kvg2 = runner_kvcache_create_dtype(rg, 40, 4, kvt);
    Batch b2 = {N2, tok2, pos, seq, 2, tables2, N2, rows, 0};
    if (model_forward(rc, kvc2, &b2, oc2, &err) || model_forward(rg, kvg2, &b2, og2, &err)) {
        printf("  FAIL %s two prompts: %s\n", dir, err.msg);
        n_fail++;
    }
    snprintf(what, sizeof what, "%s kv %s prompts %d + %d in one step vs cpu", dir, kn, P, T1);
    logit_check(what, oc2, og2, N2, V, ATTN_TOL[kvt].pre_abs, ATTN_TOL[kvt].pre_kl);
    if (exact_kv) {
        snprintf(what, sizeof what, "%s kv %s prompts %d + %d: the %d vs transformers", dir, kn, P, T1, P);
        logit_check(what, want, og2, P, V, 0.2, 1e-3);
        snprintf(what, sizeof what, "%s kv %s prompts %d + %d: the %d vs transformers", dir, kn, P, T1, T1);
        logit_check(what, (const float *)l1->data, og2 + (size_t)P * V, T1, V, 0.2, 1e-3);
    }
    free(oc2);
    free(og2);
    runner_kvcache_free(rg, kvg2);
    runner_kvcache_free(rc, kvc2);
    free(oc);
    free(og);
    t_pair_free(rc, kvc, rg, kvg, ref, m);
}

/* An MoE prefill above RUNNER_GRAPH_MAX (256) tokens (issue 18): the routed experts
 * grouped on the device at any step size (moe_mma.cu's GEMM: ~n * top_k / E pairs an
 * expert), so the step runs as piecewise graphs (eager at its bucket, captured,
 * replayed), then n - 3 tokens in the same bucket (padded), vs the CPU per-expert
 * loop. Bounds: FP8 / NVFP4 (weight-only: f32 activations on both sides, the
 * experts' x as bf16 hi + lo on the device) the prefill bounds of t_model_kv, 1e-3 /
 * 1e-7, for n a multiple of 16 (no padding: the same expert shapes on both sides);
 * BF16 and the padded step the flip bounds, 0.1 / 3e-4, as the mixed steps: over
 * hundreds of tokens some cuBLAS / mma input lands within an f32 ulp of a bf16
 * rounding midpoint and rounds the other way on one side (the dense qwen3_gqa2 at
 * 304 tokens: 6.8e-3; qwen3_moe at BF16: 2.2e-2, the same through the per-expert
 * path), and padded tokens add pairs, so an expert may cross the 8-pair GEMV / mma
 * line on one side only. The fixture's expert widths must suit the grouped path
 * (FP8: multiples of 16, so qwen3_moe_fp4, not qwen3_moe's 40): the graph row fails otherwise. */
/* act (t_moe_long): the model whose routed experts the device runs native FP8 (moe_mma.cu fmt 3:
 * every step of at least CUDA_NATIVE_MIN_N tokens), so the CPU reference quantizes x for its
 * expert matrices whatever rows each gets; other matrices follow mm_native_ref. */
static const Model *t_moe_native;
static void mm_moe_native_ref(Backend *b, float *out, const float *x, int n, const WeightMat *w, const uint16_t *bias) {
    if (t_moe_native && w->act_quant && model_is_routed_expert(t_moe_native, w)) cpu_mm(b, out, x, n, w, bias);
    else mm_native_ref(b, out, x, n, w, bias);
}

/* act: FP8 with quantized activations (model_quantize weight_only 0), the experts native on the device. */
static void t_moe_long(const char *dir, Precision prec, int n, int act) {
    Err err = {};
    Model *m = NULL;
    if (model_load(&m, dir, &err) || (prec != PREC_BF16 && model_quantize(m, prec, !act, &err))) {
        printf("  FAIL %s: %s\n", dir, err.msg);
        n_fail++;
        return;
    }
    const WeightMat *ex0 = NULL; /* the first MoE layer's expert 0 gate: the experts' layout */
    for (int l = 0; l < m->cfg.n_layers && !ex0; l++)
        if (model_layer_is_moe(&m->cfg, l)) ex0 = &m->layers[l].egate[0];
    CHECK(!act || (prec == PREC_FP8 && n - 3 >= CUDA_NATIVE_MIN_N && ex0 &&
                   cuda_moe_gemm_fp8_native(((const QuantFp8 *)ex0->q)->block_cols, ex0->cols)),
          "t_moe_long act: FP8 experts the native GEMM takes, steps of at least CUDA_NATIVE_MIN_N tokens");
    int V = m->cfg.vocab, ctx = 1024, bs = 16;
    Backend *cpu = backend_cpu_create(1, ctx);
    cpu_mm = cpu->matmul;
    cpu->matmul = act ? mm_moe_native_ref : mm_bf16act;
    t_moe_native = act ? m : NULL;
    Backend *gb = backend_cuda_create(&m->weights, m->cfg.head_dim, ctx);
    Runner *rc = runner_create_with(m, cpu, n, ctx), *rg = runner_create_with(m, gb, n, ctx);
    KVCache *kvc = runner_kvcache_create(rc, ctx / bs, bs), *kvg = runner_kvcache_create(rg, ctx / bs, bs);
    int32_t *tok = (int32_t *)malloc(sizeof(int32_t) * n), *pos = (int32_t *)malloc(sizeof(int32_t) * n);
    int32_t *seq = (int32_t *)calloc(n, sizeof(int32_t)), bt[64], rows[4];
    for (int i = 0; i < n; i++) { tok[i] = (int32_t)(rng_u64() % (uint64_t)V); pos[i] = i; }
    for (int i = 0; i < ctx / bs; i++) bt[i] = ctx / bs - 1 - i;
    const int32_t *tables[1] = {bt};
    float *oc = (float *)malloc(sizeof(float) * 4 * V), *og = (float *)malloc(sizeof(float) * 4 * V);
    uint64_t pc0 = 0, pr0 = 0, pc1 = 0, pr1 = 0;
    runner_piece_counts(rg, &pc0, &pr0);
    char what[200];
    int pieces = 0;
    for (int run = 0; run < 4; run++) {
        int k = run < 3 ? n : n - 3;
        rows[0] = 0, rows[1] = k / 3, rows[2] = k / 2, rows[3] = k - 1;
        Batch b = {k, tok, pos, seq, 1, tables, 4, rows, 0};
        int rc1 = model_forward(rc, kvc, &b, oc, &err), rc2 = model_forward(rg, kvg, &b, og, &err);
        if (rc1 || rc2) { printf("  FAIL %s long prefill: %s\n", dir, err.msg); n_fail++; }
        pieces += runner_last_graph(rg) == 2;
        static const char *mode[4] = {"eager", "captured", "replayed", "3 tokens fewer, padded"};
        snprintf(what, sizeof what, "%s %s%s MoE prefill of %d tokens, grouped (%s) vs cpu", dir, precision_name(prec),
                 act ? " native" : "", k, mode[run]);
        int tight = run < 3 && prec != PREC_BF16 && !act; /* quantized x: the flip bounds (t_act_pc) */
        logit_check(what, oc, og, 4, V, tight ? 1e-3 : 0.1, tight ? 1e-7 : 3e-4);
    }
    runner_piece_counts(rg, &pc1, &pr1);
    int ok = pc1 - pc0 >= 1 && pr1 - pr0 >= 2 && pieces == 3;
    ok ? n_pass++ : n_fail++;
    printf("  %-4s %s %s%s MoE prefills of %d tokens through piecewise graphs: %llu captured, %llu replayed\n",
           ok ? "ok" : "FAIL", dir, precision_name(prec), act ? " native" : "", n, (unsigned long long)(pc1 - pc0),
           (unsigned long long)(pr1 - pr0));
    t_moe_native = NULL;
    free(tok); free(pos); free(seq); free(oc); free(og);
    t_pair_free(rc, kvc, rg, kvg, NULL, m);
}

/* ---- 3. a CUDA failure while a delta updates the device copy ----
 * The touched hook of the server (api_admin.c admin_touched: re-quantize, then
 * runner_weights_changed) over the emulated backend, and a delta of three kinds
 * of update: a sparse o_proj (BF16: the verified scatter), every 8th element of
 * down_proj (too many for a scatter: a re-upload with indices) and a dense
 * final norm (a re-upload); at FP8/NVFP4 the two matrices re-upload their
 * quantized bytes. Each fallible CUDA call of the commit fails once in turn
 * (the k-th, k = 1, 2, ... until the commit runs out of calls): the commit must
 * fail, keep the version, and leave every touched buffer (BF16 master,
 * quantized host bytes, device copies) bit-identical to before. Then the commit
 * with no failure succeeds and the device copies equal the host. */
typedef struct FaultCtx { Model *m; Runner *r; } FaultCtx;
static int fault_touched(void *ctx, const char *name, void *data, Dtype dt, int64_t numel, const int64_t *idx,
                         int64_t n_idx, Err *err) {
    FaultCtx *f = (FaultCtx *)ctx;
    int rc = delta_model_requant(f->m, name, data, dt, numel, idx, n_idx, err);
    if (rc == 0)
        rc = runner_weights_changed(f->r, data, (size_t)numel * (size_t)dtype_size(dt), idx, n_idx, (int)dtype_size(dt), err);
    return rc;
}

/* A touched host buffer and its device copy (dev NULL: none, e.g. the BF16
 * master of a quantized matrix), with snapshots of both. */
typedef struct FaultBuf { const void *host; size_t bytes; const void *dev; uint8_t *h0, *d0; } FaultBuf;
static void fault_bufs_add(FaultBuf *b, int *n, const void *host, size_t bytes, const void *dev) {
    b[*n] = FaultBuf{host, bytes, dev, (uint8_t *)malloc(bytes), (uint8_t *)malloc(bytes)};
    (*n)++;
}
static int fault_read_dev(const FaultBuf *b, void *dst) {
    return cudaMemcpy(dst, b->dev, b->bytes, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
}
static void fault_bufs_mat(FaultBuf *b, int *n, const WeightMat *w) {
    size_t rows = (size_t)w->rows, cols = (size_t)w->cols;
    fault_bufs_add(b, n, w->bf16, 2 * rows * cols, w->fmt == WF_BF16 ? w->dev : NULL);
    if (w->fmt == WF_FP8) {
        const QuantFp8 *q = (const QuantFp8 *)w->q;
        fault_bufs_add(b, n, q->q, rows * cols, w->dev);
        fault_bufs_add(b, n, q->scale_inv, sizeof(float) * (size_t)q->scale_rows * q->scale_cols, w->dev_scale);
    } else if (w->fmt == WF_NVFP4) {
        const QuantNvfp4 *q = (const QuantNvfp4 *)w->q;
        fault_bufs_add(b, n, q->packed, rows * cols / 2, w->dev);
        fault_bufs_add(b, n, q->scale, rows * cols / QUANT_NVFP4_BLOCK, w->dev_scale);
        fault_bufs_add(b, n, &q->scale2, sizeof(float), w->dev_s2);
    }
}
/* Buffers differing from the snapshot (snap = 1: take it; host and device). */
static int fault_bufs_diff(Backend *gb, FaultBuf *b, int n, int snap) {
    int bad = 0;
    for (int i = 0; i < n; i++) {
        uint8_t *d = (uint8_t *)malloc(b[i].bytes);
        int rd = b[i].dev ? fault_read_dev(&b[i], d) : 0;
        if (snap) {
            memcpy(b[i].h0, b[i].host, b[i].bytes);
            memcpy(b[i].d0, b[i].dev ? d : (const uint8_t *)b[i].host, b[i].bytes);
            bad += rd != 0;
        } else {
            bad += rd != 0 || memcmp(b[i].h0, b[i].host, b[i].bytes) != 0 ||
                   (b[i].dev && memcmp(b[i].d0, d, b[i].bytes) != 0);
        }
        free(d);
    }
    return bad;
}
static int fault_bufs_device_is_host(Backend *gb, FaultBuf *b, int n) {
    int bad = 0;
    for (int i = 0; i < n; i++) {
        if (!b[i].dev) continue;
        uint8_t *d = (uint8_t *)malloc(b[i].bytes);
        bad += fault_read_dev(&b[i], d) != 0 || memcmp(d, b[i].host, b[i].bytes) != 0;
        free(d);
    }
    return bad;
}

/* Every native NVFP4 matrix's swizzled scales (WeightMat.dev_scale_sw) == its host scales put in
 * cuBLASLt's layout (cuda_nvfp4_sf_offset, padding zero): the count of matrices that differ, and in
 * *n_sw how many have such a copy. */
static int sw_mismatches(const Model *m, int *n_sw) {
    int bad = 0;
    *n_sw = 0;
    for (int i = 0; i < m->weights.n; i++) {
        const WeightMat *w = m->weights.t[i].vec ? NULL : m->weights.t[i].mat;
        if (!w || !w->dev_scale_sw) continue;
        const QuantNvfp4 *q = (const QuantNvfp4 *)w->q;
        int nb = w->cols / QUANT_NVFP4_BLOCK;
        size_t bytes = cuda_nvfp4_sf_bytes(w->rows, w->cols);
        uint8_t *want = (uint8_t *)calloc(bytes, 1), *got = (uint8_t *)malloc(bytes);
        for (int r = 0; r < w->rows; r++)
            for (int b = 0; b < nb; b++) want[cuda_nvfp4_sf_offset(r, b, nb)] = q->scale[(size_t)r * nb + b];
        bad += cudaMemcpy(got, w->dev_scale_sw, bytes, cudaMemcpyDeviceToHost) != cudaSuccess ||
               memcmp(got, want, bytes) != 0;
        (*n_sw)++;
        free(want);
        free(got);
    }
    return bad;
}

/* The delta of the header from the current weights to target_version: down_proj's every 8th element
 * moved by step, a sparse o_proj (24 elements set to +-step * 3, their indices into o_idx), the final
 * norm scaled. step 0: an optimizer step's size instead: those elements and 24 others of o_proj
 * (far below its amax) move by one bf16 ulp, so no FP8 / NVFP4 scale of o_proj moves and its device
 * copy takes only the changed bytes (quant_update_sparse); step < 0: that, and one element of o_proj's
 * row 3 raised to 1.5 times the row's amax (a per-channel FP8 scale moves: that row's bytes must all
 * follow). NULL with a FAIL printed. */
static const char *fault_names[3] = {"model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.o_proj.weight",
                                     "model.norm.weight"};
static uint8_t *fault_delta(const char *dir, Model *m, const WeightVersion *wv, uint64_t target_version, float step,
                            int64_t *o_idx, int *n_o, size_t *size) {
    Err err = {};
    DeltaRecord rec[3];
    *n_o = 0;
    for (int t = 0; t < 3; t++) {
        const StTensor *st = safetensors_get(m->st, fault_names[t]);
        Dtype dt;
        int64_t numel = 0;
        uint16_t *cur = (uint16_t *)delta_lookup_model(m, fault_names[t], &dt, &numel);
        if (!st || !cur || dt != DT_BF16) {
            printf("  FAIL %s: no BF16 tensor %s\n", dir, fault_names[t]);
            n_fail++;
            for (int j = 0; j < t; j++) delta_record_free(&rec[j]);
            return NULL;
        }
        uint16_t *nw = (uint16_t *)malloc(2 * (size_t)numel);
        memcpy(nw, cur, 2 * (size_t)numel);
        if (t == 0)
            for (int64_t i = 0; i < numel; i += 8) nw[i] = step ? f32_to_bf16(bf16_to_f32(nw[i]) + step) : nw[i] ^ 1;
        else if (t == 2)
            for (int64_t i = 0; i < numel; i++)
                nw[i] = step ? f32_to_bf16(bf16_to_f32(nw[i]) * (1.0f + 2 * step) + step / 2) : nw[i] ^ 1;
        else {
            float up = step > 0 ? step : 0.0f; /* step <= 0: the optimizer-sized kinds */
            for (int i = 0; i < 24; i++) {
                int64_t j = (int64_t)i * (numel / 24) + (up ? 5 : 11);
                nw[j] = up ? f32_to_bf16(i % 2 ? 3 * up : -3 * up) : nw[j] ^ 1;
                if (nw[j] != cur[j]) o_idx[(*n_o)++] = j;
            }
            if (step < 0) {
                int64_t cols = st->shape[1], j0 = 3 * cols + 7;
                float amax = 0;
                for (int64_t c = 0; c < cols; c++) amax = fmaxf(amax, fabsf(bf16_to_f32(cur[3 * cols + c])));
                nw[j0] = f32_to_bf16(amax * 1.5f);
                o_idx[(*n_o)++] = j0;
            }
        }
        if (delta_encode_tensor(&rec[t], fault_names[t], dt, st->ndim, st->shape, cur, nw, 3, 0, &err)) {
            printf("  FAIL %s: encode: %s\n", dir, err.msg);
            n_fail++;
            free(nw);
            for (int j = 0; j < t; j++) delta_record_free(&rec[j]);
            return NULL;
        }
        free(nw);
    }
    DeltaHeader h = {};
    h.fingerprint = wv->fingerprint;
    h.base_version = target_version - 1;
    h.target_version = target_version;
    uint8_t *buf = delta_serialize(&h, rec, 3, size);
    for (int t = 0; t < 3; t++) delta_record_free(&rec[t]);
    return buf;
}

/* One injection mode over a delta to wv->version + 1: corrupt = 0, the k-th fallible CUDA call of the
 * commit fails (emu_fail_nth); 1, the k-th host-to-device copy lands with a bit flipped
 * (emu_corrupt_nth: every copy of weights to the device is read back, so each must be caught). For
 * k = 1, 2, ... until the commit runs out of them: the commit fails, keeps the version, and every
 * touched buffer (BF16 master, quantized host bytes, device copies) stays bit-identical; then the
 * commit with nothing injected succeeds and the device copies equal the host. */
static void fault_loop(const char *dir, Model *m, Backend *gb, Runner *r, WeightVersion *wv, int corrupt, float step) {
    const WeightMat *o = &m->layers[0].o;
    const char *pn = o->fmt == WF_NVFP4 ? "nvfp4"
                     : o->fmt != WF_FP8 ? "bf16"
                     : ((const QuantFp8 *)o->q)->block_rows == 1 ? "fp8 per-channel" : "fp8";
    Err err = {};
    int64_t o_idx[32]; /* 24, + 1 with step < 0 */
    int n_o = 0;
    size_t size = 0;
    uint64_t v0 = wv->version;
    uint8_t *buf = fault_delta(dir, m, wv, v0 + 1, step, o_idx, &n_o, &size);
    if (!buf) return;
    FaultBuf bufs[12];
    int nb = 0;
    fault_bufs_mat(bufs, &nb, &m->layers[0].down);
    fault_bufs_mat(bufs, &nb, &m->layers[0].o);
    fault_bufs_add(bufs, &nb, m->final_norm.host, 2 * (size_t)m->cfg.hidden, m->final_norm.dev);
    /* grow the scatter's staging once (a no-op update of the same elements), so
     * every try below makes the same sequence of CUDA calls */
    int warm = m->layers[0].o.fmt != WF_BF16 ||
               runner_weights_changed(r, m->layers[0].o.bf16, 2 * (size_t)m->layers[0].o.rows * m->layers[0].o.cols,
                                      o_idx, n_o, 2, &err) == 0;
    int bad = !warm + fault_bufs_diff(gb, bufs, nb, 1);
    FaultCtx fc = {m, r};
    DeltaTarget tgt = {};
    tgt.lookup = delta_lookup_model;
    tgt.ctx = m;
    tgt.touched = fault_touched;
    tgt.touched_ctx = &fc;
    tgt.n_threads = 1;
    int injected = 0, wrong = 0, final_rc = -1;
    uint64_t sp0 = 0, sp1 = 0, full0 = 0, full1 = 0;
    backend_cuda_update_counts(gb, &sp0, &full0);
    char first_err[640] = "";
    for (long k = 1; k < 1000; k++) {
        DeltaPlan *plan = NULL;
        DeltaResult res;
        Err e = {};
        if (delta_prepare(&plan, buf, size, &tgt, wv, &e)) {
            snprintf(first_err, sizeof first_err, "; prepare: %s", e.msg);
            wrong++;
            break;
        }
        if (corrupt) emu_corrupt_nth(k);
        else emu_fail_nth(k);
        int rc = delta_commit(plan, &tgt, wv, &res, &e);
        int fired = corrupt ? emu_corrupted() : emu_failed();
        emu_corrupt_nth(0);
        emu_fail_nth(0);
        delta_plan_free(plan);
        if (!fired) {
            final_rc = rc;
            if (rc) snprintf(first_err, sizeof first_err, "; %s", e.msg);
            break;
        }
        injected++;
        int n_sw = 0, diff = fault_bufs_diff(gb, bufs, nb, 0) + sw_mismatches(m, &n_sw);
        if (rc == 0 || wv->version != v0 || diff) { /* the state moved: later tries would not start from it */
            wrong++;
            snprintf(first_err, sizeof first_err, "; %s %ld: commit rc %d, version %llu, %d buffers changed",
                     corrupt ? "copy" : "call", k, rc, (unsigned long long)wv->version, diff);
            break;
        }
        if (injected == 1) printf("       (the first %s: %s)\n", corrupt ? "corruption" : "failure", e.msg);
    }
    int n_sw = 0, sw_bad = sw_mismatches(m, &n_sw);
    int synced = final_rc == 0 && wv->version == v0 + 1 && fault_bufs_device_is_host(gb, bufs, nb) == 0 &&
                 fault_bufs_diff(gb, bufs, nb, 0) > 0 && sw_bad == 0 && (m->act_quant == 0 || o->fmt != WF_NVFP4 || n_sw > 0);
    backend_cuda_update_counts(gb, &sp1, &full1);
    /* an optimizer-sized step on a quantized model: o_proj's copy took only its changed bytes */
    int quantized = m->layers[0].o.fmt != WF_BF16, sparse_ok = !quantized || step > 0 || sp1 > sp0;
    int ok = !bad && !wrong && injected >= (corrupt ? 3 : 8) && synced && sparse_ok;
    ok ? n_pass++ : n_fail++;
    printf("  %-4s %s %s%s %sdelta: %d %s in turn, each commit failed and restored host + device (%d wrong); the "
           "commit with none: %s%s; quantized matrices updated by their changed bytes %llu times, whole %llu\n",
           ok ? "ok" : "FAIL", dir, pn, n_sw ? " native (swizzled scales checked)" : "", step > 0 ? "" : step < 0 ? "optimizer-sized + a row's amax raised " : "optimizer-sized ", injected,
           corrupt ? "host-to-device copies of the update landed corrupted" : "CUDA calls of the device update failed",
           wrong, synced ? "applied, device == host" : "NOT applied or device != host", first_err,
           (unsigned long long)(sp1 - sp0), (unsigned long long)(full1 - full0));
    for (int i = 0; i < nb; i++) { free(bufs[i].h0); free(bufs[i].d0); }
    free(buf);
}

static void t_delta_fault(const char *dir, Precision prec, int per_channel, int native = 0) {
    Err err = {};
    Model *m = NULL;
    LoadOptions o = {prec, !native, per_channel};
    if (model_load_opts(&m, dir, &o, &err)) {
        printf("  FAIL %s: %s\n", dir, err.msg);
        n_fail++;
        return;
    }
    Backend *gb = backend_cuda_create(&m->weights, m->cfg.head_dim, 128);
    Runner *r = runner_create_with(m, gb, 16, 128);
    WeightVersion *wv = weight_version_from_safetensors(m->st, 1);
    if (per_channel) { /* FP8 per channel: a row's scale moves inside the sparse update */
        fault_loop(dir, m, gb, r, wv, 0, -1.0f);
        fault_loop(dir, m, gb, r, wv, 1, -1.0f);
    } else {
        fault_loop(dir, m, gb, r, wv, 0, 0.25f);
        fault_loop(dir, m, gb, r, wv, 1, 0.125f); /* the next version, from the weights the first left */
        fault_loop(dir, m, gb, r, wv, 0, 0.0f);   /* optimizer-sized: the quantized copies' sparse update */
        fault_loop(dir, m, gb, r, wv, 1, 0.0f);
    }
    weight_version_free(wv);
    runner_free(r);
    model_free(m);
}

static void t_delta_faults(void) {
    printf("== a CUDA failure, or a corrupted copy, during a delta's device update: the commit fails and restores ==\n");
    t_delta_fault("tests/fixtures/qwen2", PREC_BF16, 0);
    t_delta_fault("tests/fixtures/qwen2", PREC_FP8, 0);
    t_delta_fault("tests/fixtures/qwen2", PREC_FP8, 1);
    t_delta_fault("tests/fixtures/llama31", PREC_NVFP4, 0);
    t_delta_fault("tests/fixtures/llama31", PREC_NVFP4, 0, 1); /* native: the swizzled scales follow every commit */
    /* the two update paths on a matrix of 2 x 4 FP8 blocks (bench_delta_quant.h; timed on a GPU by gpu_check) */
    dq_run(256, 512, WF_FP8, 0.01, NULL);
    dq_run(256, 512, WF_NVFP4, 0.01, NULL);
}

/* SAMPLER_CUDA_OFF (backend_cuda.cu): the named kernels' ops are gone from a
 * backend made under it and back in one made without it; with every kernel
 * off, a MoE fixture on BF16 KV (prefill attention on CUDA cores, the routed
 * experts one matmul at a time, no graphs, norm_rope + kv_write, gate/up +
 * swiglu) matches transformers and the CPU in the usual bounds. */
/* A driver that refuses the PDL attribute (cuda_pdl.cuh pdl_launch): the launch goes again without it,
 * no error is left for the launcher's check, PDL is off for the process from then on, and the op's
 * result is the plain launch's, bit for bit. */
static void t_pdl_refused(void) {
    Backend *b = backend_cuda_create_resident(0, 128);
    const int n = 2, dim = 96;
    float hx[n * dim], got[n * dim], ref[n * dim];
    uint16_t hw[dim];
    for (int i = 0; i < n * dim; i++) hx[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    for (int i = 0; i < dim; i++) hw[i] = f32_to_bf16(0.5f + (float)(i % 7) / 8.0f);
    float *dx = NULL, *dout = NULL;
    uint16_t *dw = NULL;
    CUDA_CHECK(cudaMalloc((void **)&dx, sizeof hx));
    CUDA_CHECK(cudaMalloc((void **)&dout, sizeof hx));
    CUDA_CHECK(cudaMalloc((void **)&dw, sizeof hw));
    CUDA_CHECK(cudaMemcpy(dx, hx, sizeof hx, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dw, hw, sizeof hw, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(dout, 0xff, sizeof hx)); /* NaN: unwritten shows */
    int on0 = cuda_pdl_enabled();
    long p0 = emu_pdl_launches();
    emu_pdl_refuse(1);
    b->rmsnorm(b, dout, dx, dw, n, dim, 1e-6f); /* LAUNCH_OK inside: a pending error would stop the run */
    emu_pdl_refuse(0);
    cudaError_t e = cudaGetLastError();
    CUDA_CHECK(cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost));
    int off_after = !cuda_pdl_enabled();
    CUDA_CHECK(cudaMemset(dout, 0xff, sizeof hx));
    b->rmsnorm(b, dout, dx, dw, n, dim, 1e-6f); /* PDL off now: the plain launch */
    CUDA_CHECK(cudaMemcpy(ref, dout, sizeof ref, cudaMemcpyDeviceToHost));
    int finite = 1;
    for (int i = 0; i < n * dim; i++) finite &= isfinite(got[i]) != 0;
    int ok = on0 && e == cudaSuccess && off_after && emu_pdl_launches() == p0 && finite &&
             memcmp(got, ref, sizeof got) == 0;
    printf("  %s a launch refused with the PDL attribute goes again without it (pending error %d), PDL is off "
           "after it (%d), the result is the plain launch's bit for bit\n", ok ? "ok  " : "FAIL", (int)e, off_after);
    ok ? n_pass++ : n_fail++;
    cuda_pdl_enable(1);
    cudaFree(dx); cudaFree(dout); cudaFree(dw);
    b->free(b);
}

static void t_cuda_off(int quick) {
    printf("== SAMPLER_CUDA_OFF: the fallback paths ==\n");
    const char *envs[] = {"rope_kv_write,matmul_swiglu", "all", NULL};
    for (int i = 0; i < 3; i++) {
        if (envs[i]) setenv("SAMPLER_CUDA_OFF", envs[i], 1);
        else unsetenv("SAMPLER_CUDA_OFF");
        Backend *b = backend_cuda_create_resident(0, 128);
        int fused_off = i < 2, all_off = i == 1;
        int ok = (b->rope_kv_write == NULL) == fused_off && (b->matmul_swiglu == NULL) == fused_off &&
                 (b->moe_mlp == NULL) == all_off && (b->graph_begin == NULL) == all_off && cuda_pdl_enabled() == !all_off;
        printf("  %s SAMPLER_CUDA_OFF=%s: the ops it names are off, the others on\n", ok ? "ok  " : "FAIL",
               envs[i] ? envs[i] : "(unset)");
        ok ? n_pass++ : n_fail++;
        b->free(b);
    }
    setenv("SAMPLER_CUDA_OFF", "all", 1);
    t_model_kv("tests/fixtures/qwen3_moe", quick ? 1 : 3, PREC_BF16, KV_BF16);
    unsetenv("SAMPLER_CUDA_OFF");
    cuda_attention_vec_enable(1); /* process-wide: back to the default for what follows */
    cuda_pdl_enable(1);
}

/* The per-shape crossover (device_native.c, backend_cuda_native_time): a model at native FP8 per
 * channel (qwen2) and NVFP4 (llama31) on the emulation. The timer answers for both paths; the
 * calibration gives every native matrix a crossover, one per shape; a matmul then takes the path
 * recorded, bit for bit (the weight-only GEMV below it, the quantizer + native GEMM from it; the two
 * differ, so a backend that ignored the record fails), through matmul_multi's fused GEMV too;
 * --native-crossover N sets N everywhere. The emulation's timings mean nothing: only the
 * bookkeeping is checked here, the crossovers themselves on a GPU (gpu_check's crossover rows). */
static void nx_run(Backend *b, const WeightMat *w, int n, const float *dx, float *dout, float *host) {
    b->matmul(b, dout, dx, n, w, NULL);
    CUDA_CHECK(cudaMemcpy(host, dout, sizeof(float) * (size_t)n * w->rows, cudaMemcpyDeviceToHost));
}
static void t_native_crossover(const char *dir, Precision prec, int quick) {
    Err err = {};
    Model *m = NULL;
    LoadOptions o = {prec, 0, prec == PREC_FP8};
    if (model_load_opts(&m, dir, &o, &err)) {
        printf("  FAIL %s: %s\n", dir, err.msg);
        n_fail++;
        return;
    }
    Backend *b = backend_cuda_create(&m->weights, m->cfg.head_dim, 128);
    WeightMat *q = &m->layers[0].q;
    float wo = -1, na = -1;
    int trc = backend_cuda_native_time(b, q, 4, 2, &wo, &na);
    int nonnative_rc = backend_cuda_native_time(b, &m->lm_head, 4, 2, &wo, &na); /* BF16: nothing to time */
    int ok = backend_cuda_native_kind(q) != 0 && trc == 0 && nonnative_rc == -1;
    printf("  %s %s %s: the device timer answers for both paths (rc %d), refuses a BF16 matrix (rc %d)\n",
           ok ? "ok  " : "FAIL", dir, precision_name(prec), trc, nonnative_rc);
    ok ? n_pass++ : n_fail++;

    /* measured (up to 8 tokens, 3 in the quick subset): every
     * native matrix gets a crossover in [1, 8] or never, one per shape */
    int crc = device_native_calibrate(b, m, quick ? 3 : 8, 0), n_nat = 0, bad = 0;
    for (int i = 0; i < m->weights.n; i++) {
        const WeightMat *w = m->weights.t[i].vec ? NULL : m->weights.t[i].mat;
        if (!w || !backend_cuda_native_kind(w)) continue;
        n_nat++;
        bad += !(w->native_min_n == INT_MAX || (w->native_min_n >= 1 && w->native_min_n <= 8));
        for (int j = 0; j < i; j++) {
            const WeightMat *v = m->weights.t[j].vec ? NULL : m->weights.t[j].mat;
            if (v && backend_cuda_native_kind(v) && v->rows == w->rows && v->cols == w->cols)
                bad += v->native_min_n != w->native_min_n;
        }
    }
    ok = crc == 0 && n_nat > 0 && bad == 0;
    printf("  %s %s %s: measured, %d native matrices got a crossover (q_proj: %d), one per shape (%d wrong)\n",
           ok ? "ok  " : "FAIL", dir, precision_name(prec), n_nat, q->native_min_n, bad);
    ok ? n_pass++ : n_fail++;

    /* the path recorded is the path taken, for the measured record and one of 9 (both sides of it
     * whatever the emulation measured): references with the record forced each way */
    const int N = 64, measured = q->native_min_n;
    float *x = rand_f32((size_t)N * q->cols, 1.0f), *dx = NULL, *dout = NULL;
    size_t ob = sizeof(float) * (size_t)N * q->rows;
    float *ref_wo = (float *)xmalloc(ob), *ref_na = (float *)xmalloc(ob), *got = (float *)xmalloc(ob);
    CUDA_CHECK(cudaMalloc((void **)&dx, sizeof(float) * (size_t)N * q->cols));
    CUDA_CHECK(cudaMalloc((void **)&dout, ob));
    CUDA_CHECK(cudaMemcpy(dx, x, sizeof(float) * (size_t)N * q->cols, cudaMemcpyHostToDevice));
    const int ns[] = {1, 2, 3, 5, 8, 16, 17, 33, 64};
    int wrong = 0, differ = 1, checked = 0, below = 0, n_ns = quick ? 3 : (int)(sizeof ns / sizeof ns[0]);
    for (int r = 0; r < 2; r++) {
        int rec = r ? 9 : measured;
        for (int t = 0; t < n_ns + 2; t++) {
            int n = t < 2 ? (rec == INT_MAX ? N : rec) - 1 + t : ns[t - 2]; /* the record's two sides */
            if (n < 1 || n > N) continue;
            size_t cnt = (size_t)n * q->rows;
            q->native_min_n = INT_MAX;
            nx_run(b, q, n, dx, dout, ref_wo);
            q->native_min_n = 1;
            nx_run(b, q, n, dx, dout, ref_na);
            differ &= memcmp(ref_wo, ref_na, sizeof(float) * cnt) != 0;
            q->native_min_n = rec;
            nx_run(b, q, n, dx, dout, got);
            wrong += memcmp(got, n >= rec ? ref_na : ref_wo, sizeof(float) * cnt) != 0;
            below += n < rec;
            checked++;
        }
    }
    q->native_min_n = measured;
    ok = wrong == 0 && differ && below >= (quick ? 3 : 5) && checked >= (quick ? 8 : 20);
    printf("  %s %s %s: matmul takes the path recorded (the measured %d, and 9) at %d batch sizes, %d of them "
           "below it (%d wrong; the two paths %s)\n", ok ? "ok  " : "FAIL", dir, precision_name(prec), measured,
           checked, below, wrong, differ ? "differ at every size" : "AGREE somewhere: the check cannot tell them apart");
    ok ? n_pass++ : n_fail++;

    /* q/k/v through matmul_multi (the fused GEMV below CUDA_GEMV_MAX_N): a native record there takes
     * one native GEMM each */
    const WeightMat *qkv[3] = {&m->layers[0].q, &m->layers[0].k, &m->layers[0].v};
    float *outs[3], *multi[3], *single[3];
    const uint16_t *nob[3] = {NULL, NULL, NULL};
    int n4 = 4, mwrong = 0;
    for (int pass = 0; pass < 2; pass++) { /* 0: forced native from 2; 1: never */
        for (int j = 0; j < 3; j++) ((WeightMat *)qkv[j])->native_min_n = pass ? INT_MAX : 2;
        for (int j = 0; j < 3; j++) {
            size_t bj = sizeof(float) * (size_t)n4 * qkv[j]->rows;
            CUDA_CHECK(cudaMalloc((void **)&outs[j], bj));
            multi[j] = (float *)xmalloc(bj);
            single[j] = (float *)xmalloc(bj);
        }
        b->matmul_multi(b, outs, dx, n4, qkv, nob, 3);
        for (int j = 0; j < 3; j++) {
            size_t bj = sizeof(float) * (size_t)n4 * qkv[j]->rows;
            CUDA_CHECK(cudaMemcpy(multi[j], outs[j], bj, cudaMemcpyDeviceToHost));
            nx_run(b, qkv[j], n4, dx, dout, single[j]);
            mwrong += memcmp(multi[j], single[j], bj) != 0;
            cudaFree(outs[j]);
            free(multi[j]);
            free(single[j]);
        }
    }
    ok = mwrong == 0;
    printf("  %s %s %s: matmul_multi of q/k/v at 4 tokens == one matmul each, with a native record from 2 and "
           "with none (%d differ)\n", ok ? "ok  " : "FAIL", dir, precision_name(prec), mwrong);
    ok ? n_pass++ : n_fail++;

    /* --native-crossover 12: every native matrix, no measurement */
    device_native_calibrate(b, m, 64, 12);
    int not12 = 0;
    for (int i = 0; i < m->weights.n; i++) {
        const WeightMat *w = m->weights.t[i].vec ? NULL : m->weights.t[i].mat;
        if (w && backend_cuda_native_kind(w)) not12 += w->native_min_n != 12;
    }
    printf("  %s %s %s: --native-crossover 12 sets every native matrix (%d not)\n", not12 ? "FAIL" : "ok  ", dir,
           precision_name(prec), not12);
    not12 ? n_fail++ : n_pass++;
    cudaFree(dx);
    cudaFree(dout);
    free(x); free(ref_wo); free(ref_na); free(got);
    b->free(b);
    model_free(m);
}
/* Every routed expert matrix of m gets the record rec (what device_native.c's calibration writes). */
/* Every expert matrix's native_min_n (mma 0) or mma_min_n (mma 1) = rec. */
static void experts_set_rec(Model *m, int mma, int rec) {
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int e = 0; m->layers[l].egate && e < m->cfg.n_experts; e++) {
            WeightMat *ms[3] = {&m->layers[l].egate[e], &m->layers[l].eup[e], &m->layers[l].edown[e]};
            for (int j = 0; j < 3; j++) *(mma ? &ms[j]->mma_min_n : &ms[j]->native_min_n) = rec;
        }
}
static void experts_set(Model *m, int rec) { experts_set_rec(m, 0, rec); }
static void experts_set_mma(Model *m, int rec) { experts_set_rec(m, 1, rec); }
/* Routes n tokens and runs the experts; returns how many of the kernels those launched went without
 * the programmatic-dependent-launch attribute (cuda_pdl.cuh). */
static long moe_run(Backend *b, DeviceMoeBench *mb, int n, int H, float *host) {
    MoeMlpArgs a;
    long k0 = emu_kernels_run(), p0 = emu_pdl_launches();
    device_moe_bench_route(mb, n, &a);
    CHECK(b->moe_mlp(b, &a) == 0, "moe_run: the backend refused the experts");
    long plain = (emu_kernels_run() - k0) - (emu_pdl_launches() - p0);
    CUDA_CHECK(cudaMemcpy(host, a.out, sizeof(float) * (size_t)n * H, cudaMemcpyDeviceToHost));
    return plain;
}
/* The qwen3_moe_fp4 fixture at prec (act_quant: 0 weight-only) on the emulated CUDA backend, with a
 * DeviceMoeBench of its first MoE layer for up to max_n tokens; 0, or -1 (reported as a failure). */
typedef struct { Model *m; Backend *b; DeviceMoeBench *mb; int layer, H; } MoeFixture;
static int moe_fixture_open(MoeFixture *f, Precision prec, int act_quant, int max_n) {
    const char *dir = "tests/fixtures/qwen3_moe_fp4";
    Err err = {};
    f->m = NULL;
    if (model_load(&f->m, dir, &err) || (prec != PREC_BF16 && model_quantize(f->m, prec, !act_quant, &err))) {
        printf("  FAIL %s: %s\n", dir, err.msg);
        n_fail++;
        if (f->m) model_free(f->m);
        return -1;
    }
    f->layer = 0;
    while (!model_layer_is_moe(&f->m->cfg, f->layer)) f->layer++;
    f->H = f->m->cfg.hidden;
    f->b = backend_cuda_create(&f->m->weights, f->m->cfg.head_dim, 128);
    f->mb = device_moe_bench_create(f->b, f->m, f->layer, max_n);
    return 0;
}
static void moe_fixture_close(MoeFixture *f) {
    device_moe_bench_free(f->mb);
    f->b->free(f->b);
    model_free(f->m);
}

/* The routed experts' crossover (device_native.c experts_calibrate) on act_quant FP8 experts (the
 * qwen3_moe_fp4 fixture, 128x128 blocks): the timer answers, calibration records one crossover on
 * every expert matrix, moe_mlp takes the path recorded (references with the record forced each way,
 * which differ), --native-crossover 12 sets them all. */
static void t_moe_crossover(int quick) {
    const char *dir = "tests/fixtures/qwen3_moe_fp4";
    const int N = 24;
    MoeFixture f;
    if (moe_fixture_open(&f, PREC_FP8, 1, N)) return;
    Model *m = f.m;
    Backend *b = f.b;
    DeviceMoeBench *mb = f.mb;
    int layer = f.layer, H = f.H;
    MoeMlpArgs a;
    device_moe_bench_route(mb, 4, &a);
    float wo = -1, na = -1, wo2 = -1, na2 = -1;
    int trc = backend_cuda_moe_time(b, &a, 1, &wo, &na);
    m->layers[layer].egate[0].act_quant = 0; /* weight-only experts: nothing to choose */
    int wrc = backend_cuda_moe_time(b, &a, 1, &wo2, &na2);
    m->layers[layer].egate[0].act_quant = 1;
    int ok = trc == 0 && wo > 0 && na > 0 && wrc == -1;
    printf("  %s %s fp8 experts: the device timer answers for both paths (rc %d, %.0f / %.0f us), refuses "
           "weight-only experts (rc %d)\n", ok ? "ok  " : "FAIL", dir, trc, wo, na, wrc);
    ok ? n_pass++ : n_fail++;

    /* measured up to 8 tokens (3 in the quick subset): one record on every expert matrix */
    const int max_cal = quick ? 3 : 8;
    int crc = device_native_calibrate(b, m, max_cal, 0), bad = 0, n_ex = 0;
    const int measured = m->layers[layer].egate[0].native_min_n;
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int e = 0; m->layers[l].egate && e < m->cfg.n_experts; e++, n_ex += 3)
            bad += (m->layers[l].egate[e].native_min_n != measured) + (m->layers[l].eup[e].native_min_n != measured) +
                   (m->layers[l].edown[e].native_min_n != measured);
    ok = crc == 0 && n_ex > 0 && bad == 0 && (measured == INT_MAX || (measured >= 1 && measured <= max_cal));
    printf("  %s %s fp8 experts: measured, native from %d on all %d expert matrices (%d differ)\n",
           ok ? "ok  " : "FAIL", dir, measured, n_ex, bad);
    ok ? n_pass++ : n_fail++;

    /* the path recorded is the path taken, at the measured record and at 5, both sides of each */
    size_t ob = sizeof(float) * (size_t)N * H;
    float *ref_wo = (float *)xmalloc(ob), *ref_na = (float *)xmalloc(ob), *got = (float *)xmalloc(ob);
    const int ns[] = {1, 2, 9, 16, 24};
    int wrong = 0, differ = 1, checked = 0, below = 0, n_ns = quick ? 2 : (int)(sizeof ns / sizeof ns[0]);
    for (int r = 0; r < 2; r++) {
        int rec = r ? 5 : measured;
        for (int t = 0; t < n_ns + 2; t++) {
            int n = t < 2 ? (rec == INT_MAX ? N : rec) - 1 + t : ns[t - 2];
            if (n < 1 || n > N) continue;
            experts_set(m, INT_MAX);
            moe_run(b, mb, n, H, ref_wo);
            experts_set(m, 1);
            moe_run(b, mb, n, H, ref_na);
            differ &= memcmp(ref_wo, ref_na, sizeof(float) * (size_t)n * H) != 0;
            experts_set(m, rec);
            moe_run(b, mb, n, H, got);
            wrong += memcmp(got, n >= rec ? ref_na : ref_wo, sizeof(float) * (size_t)n * H) != 0;
            below += n < rec;
            checked++;
        }
    }
    ok = wrong == 0 && differ && below >= 2 && checked >= (quick ? 5 : 11);
    printf("  %s %s fp8 experts: moe_mlp takes the path recorded (the measured %d, and 5) at %d batch sizes, %d "
           "below it (%d wrong; the two paths %s)\n", ok ? "ok  " : "FAIL", dir, measured, checked, below, wrong,
           differ ? "differ at every size" : "AGREE somewhere: the check cannot tell them apart");
    ok ? n_pass++ : n_fail++;

    /* --native-crossover 12 */
    device_native_calibrate(b, m, 64, 12);
    int not12 = 0;
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int e = 0; m->layers[l].egate && e < m->cfg.n_experts; e++)
            not12 += (m->layers[l].egate[e].native_min_n != 12) + (m->layers[l].edown[e].native_min_n != 12);
    printf("  %s %s fp8 experts: --native-crossover 12 sets every expert matrix (%d not)\n", not12 ? "FAIL" : "ok  ",
           dir, not12);
    not12 ? n_fail++ : n_pass++;
    free(ref_wo); free(ref_na); free(got);
    moe_fixture_close(&f);
}
/* The routed experts' decode-size choice (device_native.c experts_gemv_calibrate): the grouped GEMV
 * (moe_gemm.cu) or the grouped mma (moe_mma.cu) at up to 8 tokens, weight-only experts at prec
 * (qwen3_moe_fp4 fixture): the timer answers for both and refuses 9 tokens; the calibration gives
 * every expert matrix one record in {0, 1..8}; moe_mlp takes the path recorded (the record forced to
 * 1: the mma, to 0: the GEMV; the two differ in their bits and agree within f32 class: max |mma -
 * gemv| / max |gemv| < 1e-5; the GEMV is checked against the CPU by the op checks' moe rows). */
static void t_moe_gemv_choice(Precision prec, int quick) {
    const char *dir = "tests/fixtures/qwen3_moe_fp4", *pn = precision_name(prec);
    const int N = 9;
    MoeFixture f;
    if (moe_fixture_open(&f, prec, 0, N)) return;
    Model *m = f.m;
    Backend *b = f.b;
    DeviceMoeBench *mb = f.mb;
    int layer = f.layer, H = f.H;
    MoeMlpArgs a;
    device_moe_bench_route(mb, 3, &a);
    float gv = -1, mm = -1, g9 = -1, m9 = -1;
    int trc = backend_cuda_moe_gemv_time(b, &a, 1, &gv, &mm);
    device_moe_bench_route(mb, 9, &a);
    int rc9 = backend_cuda_moe_gemv_time(b, &a, 1, &g9, &m9);
    int ok = trc == 0 && gv > 0 && mm > 0 && rc9 == -1;
    printf("  %s %s %s experts: the grouped GEMV / mma timer answers at 3 tokens (rc %d, %.0f / %.0f us), refuses 9 "
           "(rc %d)\n", ok ? "ok  " : "FAIL", dir, pn, trc, gv, mm, rc9);
    ok ? n_pass++ : n_fail++;

    int crc = device_gemv_calibrate_experts(b, m), bad = 0, n_ex = 0; /* device_gemv_calibrate's experts half */
    const int measured = m->layers[layer].egate[0].mma_min_n;
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int e = 0; m->layers[l].egate && e < m->cfg.n_experts; e++, n_ex += 3)
            bad += (m->layers[l].egate[e].mma_min_n != measured) + (m->layers[l].eup[e].mma_min_n != measured) +
                   (m->layers[l].edown[e].mma_min_n != measured);
    ok = crc == 0 && n_ex > 0 && bad == 0 && measured >= 0 && measured <= CUDA_GEMV_MAX_N;
    printf("  %s %s %s experts: measured, grouped mma from %d (0: never) on all %d expert matrices (%d differ)\n",
           ok ? "ok  " : "FAIL", dir, pn, measured, n_ex, bad);
    ok ? n_pass++ : n_fail++;

    size_t ob = sizeof(float) * (size_t)N * H;
    float *ref_g = (float *)xmalloc(ob), *ref_m = (float *)xmalloc(ob), *got = (float *)xmalloc(ob);
    int wrong = 0, differ = 1, checked = 0;
    long plain = 0; /* kernels of the routing and both experts' paths launched without PDL (cuda_pdl.cuh) */
    double worst = 0;
    long k1 = -1; /* kernels of a one-token step on the GEMV: routing, gate/up with SwiGLU reading x's token
                   * row (no gather), down with the unpermute epilogue */
    for (int n = 1; n <= (quick ? 3 : CUDA_GEMV_MAX_N); n++) {
        experts_set_mma(m, 0);
        long k0 = emu_kernels_run();
        plain += moe_run(b, mb, n, H, ref_g);
        if (n == 1) k1 = emu_kernels_run() - k0;
        experts_set_mma(m, 1);
        plain += moe_run(b, mb, n, H, ref_m);
        size_t cnt = (size_t)n * H;
        differ &= memcmp(ref_g, ref_m, sizeof(float) * cnt) != 0;
        double mx = 0, d = 0;
        for (size_t i = 0; i < cnt; i++) {
            mx = fmax(mx, fabs(ref_g[i]));
            d = fmax(d, fabs((double)ref_g[i] - ref_m[i]));
        }
        worst = fmax(worst, mx > 0 ? d / mx : 1.0);
        experts_set_mma(m, measured);
        moe_run(b, mb, n, H, got);
        wrong += memcmp(got, measured && n >= measured ? ref_m : ref_g, sizeof(float) * cnt) != 0;
        checked++;
    }
    ok = wrong == 0 && differ && worst < 1e-5 && plain == 0 && k1 == 3;
    printf("  %s %s %s experts: moe_mlp takes the path recorded at %d batch sizes (%d wrong); the grouped mma %s the "
           "GEMV's bits, max|mma - gemv| / max|gemv| %.2e (< 1e-5); kernels of the routing and both paths launched "
           "without PDL: %ld; kernels of a one-token step on the GEMV %ld (want 3)\n", ok ? "ok  " : "FAIL", dir, pn,
           checked, wrong, differ ? "differs from" : "EQUALS (the check cannot tell the paths apart)", worst, plain, k1);
    ok ? n_pass++ : n_fail++;
    /* experts the device does not group (one in another format: moe_mlp refuses the layer): nothing to
     * choose, said as such (rc 1), and every expert's record 0 without a timing failure */
    WeightMat *last = &m->layers[layer].egate[m->cfg.n_experts - 1];
    WeightFormat keep = last->fmt;
    last->fmt = keep == WF_BF16 ? WF_FP8 : WF_BF16;
    experts_set_mma(m, 3);
    NativeCrossover nx;
    int nrc = device_moe_gemv_crossover_on(b, m, layer, &nx), ncrc = device_gemv_calibrate_experts(b, m);
    last->fmt = keep;
    ok = nrc == 1 && nx.points == 0 && ncrc == 0 && m->layers[layer].egate[0].mma_min_n == 0 &&
         m->layers[layer].edown[1].mma_min_n == 0;
    printf("  %s %s %s experts not grouped (one in another format): nothing to choose (rc %d, %d points), the "
           "calibration answers %d and records 0\n", ok ? "ok  " : "FAIL", dir, pn, nrc, nx.points, ncrc);
    ok ? n_pass++ : n_fail++;
    experts_set_mma(m, 0);
    free(ref_g); free(ref_m); free(got);
    moe_fixture_close(&f);
}

/* The decode GEMV's choice (device_gemv_calibrate, backend_cuda_gemv_time, gemv_mma.cuh) on a fixture
 * at BF16, or FP8 / NVFP4 weight-only: the timer answers for both GEMVs (BF16 from 2 tokens: it
 * refuses the tensor cores at 1; FP8 / NVFP4 from 1) and refuses a matrix without its device copy;
 * the calibration gives every matrix a record in {0, lo..8}, one per shape; with every record forced
 * to lo, a prefill of lo..6 tokens
 * (every linear of the model, q/k/v and gate/up fused, on tensor cores) matches the CPU backend (and
 * transformers, at BF16) as the tiled GEMV does, and its logits are not the tiled GEMV's bits (the
 * record is followed). Timings mean nothing here. */
static void t_gemv_crossover(const char *dir, Precision prec, int quick) {
    Err err = {};
    Model *m = NULL;
    SafeTensors *ref = NULL;
    char path[512], what[160];
    snprintf(path, sizeof path, "%s/ref.safetensors", dir);
    int fp8 = prec != PREC_BF16, lo_n = fp8 ? 1 : 2; /* fp8: a quantized format, FP8 or NVFP4 */
    if (model_load(&m, dir, &err) || (fp8 && model_quantize(m, prec, 1, &err)) || safetensors_open(&ref, path, &err)) {
        printf("  FAIL %s: %s\n", dir, err.msg);
        n_fail++;
        return;
    }
    const char *pn = precision_name(prec);
    WeightFormat wf = prec == PREC_FP8 ? WF_FP8 : prec == PREC_NVFP4 ? WF_NVFP4 : WF_BF16;
    Backend *cpu = backend_cpu_create(1, 128), *gb = backend_cuda_create(&m->weights, m->cfg.head_dim, 128);
    WeightMat *q = &m->layers[0].q;
    float tile = -1, mma = -1, tile1 = -1, mma1 = -1;
    int trc = backend_cuda_gemv_time(gb, q, 4, 2, 0, &tile, &mma), trc1 = backend_cuda_gemv_time(gb, q, 1, 2, 0, &tile1, &mma1);
    float tile_p = -1, mma_p = -1; /* x split beforehand (after a norm): answers, and agrees */
    int trcp = backend_cuda_gemv_time(gb, q, 2, 2, 1, &tile_p, &mma_p);
    WeightMat fake = *q;
    fake.dev = NULL;
    float a = 0, b = 0;
    int frc = backend_cuda_gemv_time(gb, &fake, 4, 2, 0, &a, &b);
    int ok = q->fmt == wf && trc == 0 && tile > 0 && mma > 0 && trc1 == 0 && tile1 > 0 && (fp8 ? mma1 > 0 : mma1 < 0) &&
             frc == -1 && trcp == 0 && tile_p > 0 && mma_p > 0;
    printf("  %s %s %s gemv timer: 4 tokens tiled %.0f / mma %.0f us, 1 token tiled %.0f / mma %.0f%s, 2 tokens x "
           "split beforehand tiled %.0f / mma %.0f, no device copy refused (rc %d)\n", ok ? "ok  " : "FAIL", dir, pn,
           tile, mma, tile1, mma1, fp8 ? "" : " (refused)", tile_p, mma_p, frc);
    ok ? n_pass++ : n_fail++;

    /* the quick subset calibrates BF16 and FP8 only: NVFP4 goes through the same loop */
    if (!quick || prec != PREC_NVFP4) {
        int crc = device_gemv_calibrate(gb, m), n_bf = 0, bad = 0;
        auto after_norm = [m](const WeightMat *w) { /* not o, not down: FP8 / NVFP4 timed with x split */
            for (int l = 0; l < m->cfg.n_layers; l++)
                if (w == &m->layers[l].o || w == &m->layers[l].down) return 0;
            return 1;
        };
        for (int i = 0; i < m->weights.n; i++) {
            const WeightMat *w = m->weights.t[i].mat;
            if (!w || w->fmt != wf) continue;
            n_bf++;
            bad += !(w->mma_min_n == 0 || (w->mma_min_n >= lo_n && w->mma_min_n <= 8));
            for (int j = 0; j < i; j++) {
                const WeightMat *v = m->weights.t[j].mat;
                if (v && v->fmt == wf && v->rows == w->rows && v->cols == w->cols &&
                    (!fp8 || after_norm(v) == after_norm(w)))
                    bad += v->mma_min_n != w->mma_min_n;
            }
        }
        ok = crc == 0 && n_bf > 0 && bad == 0;
        printf("  %s %s %s gemv calibration: %d matrices got a record (q_proj: %d), one per shape%s (%d wrong)\n",
               ok ? "ok  " : "FAIL", dir, pn, n_bf, q->mma_min_n, fp8 ? " and input (a norm's or not)" : "", bad);
        ok ? n_pass++ : n_fail++;
    }

    /* prefills of 2..6 tokens: every record forced to 2 (tensor cores), then 0 (tiled) */
    const StTensor *t0 = safetensors_get(ref, "seq0.tokens"), *lp = safetensors_get(ref, "seq0.prefill_logits");
    int V = m->cfg.vocab, T0 = (int)t0->numel;
    Runner *rc = runner_create_with(m, cpu, 128, 128), *rg = runner_create_with(m, gb, 128, 128);
    KVCache *kvc = runner_kvcache_create(rc, 80, 4), *kvg = runner_kvcache_create(rg, 80, 4);
    float *oc = (float *)malloc(sizeof(float) * 8 * V), *og = (float *)malloc(sizeof(float) * 8 * V),
          *ot = (float *)malloc(sizeof(float) * 8 * V);
    int32_t bt0[32], pos[8], seq[8], rows[8];
    for (int i = 0; i < 32; i++) bt0[i] = 1 + 2 * i;
    const int32_t *tables[1] = {bt0};
    for (int T = lo_n; T <= (quick ? 3 : 6) && T <= T0; T++) {
        for (int i = 0; i < T; i++) { pos[i] = i; seq[i] = 0; rows[i] = i; }
        Batch bt = {T, (const int32_t *)t0->data, pos, seq, 1, tables, T, rows, 0};
        int differ = 0;
        for (int pass = 0; pass < 2; pass++) {
            for (int i = 0; i < m->weights.n; i++)
                if (m->weights.t[i].mat) m->weights.t[i].mat->mma_min_n = pass ? 0 : lo_n;
            int r1 = pass ? 0 : model_forward(rc, kvc, &bt, oc, &err), r2 = model_forward(rg, kvg, &bt, pass ? ot : og, &err);
            if (r1 || r2) { printf("  FAIL %s prefill: %s\n", dir, err.msg); n_fail++; }
        }
        differ = memcmp(og, ot, sizeof(float) * (size_t)T * V) != 0;
        snprintf(what, sizeof what, "%s %s prefill %d, gemv on tensor cores, vs cpu", dir, pn, T);
        logit_check(what, oc, og, T, V, 1e-3, 1e-7);
        if (!fp8) {
            snprintf(what, sizeof what, "%s prefill %d, gemv on tensor cores, vs transformers", dir, T);
            logit_check(what, (const float *)lp->data, og, T, V, 0.2, 1e-3);
        }
        differ ? n_pass++ : n_fail++;
        printf("  %-4s %s %s prefill %d: the logits %s the tiled GEMV's bits\n", differ ? "ok" : "FAIL", dir, pn, T,
               differ ? "differ from" : "EQUAL (the record was not followed)");
    }
    free(oc); free(og); free(ot);
    t_pair_free(rc, kvc, rg, kvg, ref, m);
}

/* The norms' split of x (backend_cuda_gemv_presplit; rmsnorm.cu, backend_cuda.cu norm_split) on a
 * fixture at FP8 / NVFP4 weight-only with every record forced to 1 (every quantized linear on the
 * tensor-core GEMV): two CUDA backends over two copies of the model, presplit off and on, give the
 * same logits bit for bit over a prefill and decode steps (captured in a graph and replayed), and
 * every step of the one with presplit runs 2 kernels a layer fewer (the q/k/v and gate/up launches
 * skip their split of x; lm_head stays BF16). The first runner's steps also run without programmatic
 * dependent launch (cuda_pdl.cuh; the emulation runs launches in order either way, so this checks the
 * launch path: the attribute reaches the decode kernels when on, and never when off) and without the
 * GEMVs' L2 weight prefetch (issued in every step of the other, never in this one's).
 * add_norm: instead the residual projection's add + norm epilogue (matmul_add_norm.cu; at FP8 o and
 * down on tensor cores), presplit is on in both, and the first runner takes matmul then
 * add_rmsnorm (SAMPLER_CUDA_OFF=matmul_add_rmsnorm): the same logits bit for bit, the second runner's
 * o and down norms writing the split that gate/up and q/k/v read, and 2 x layers - 1 kernels fewer a
 * decode step (the last layer's down is followed by a plain add; the prefill, of more than one token,
 * takes the two ops in both). An MoE fixture's routed experts stay on the grouped GEMV (moe_gemm.cu),
 * whose down takes the add + norm after its unpermute: the same count. */
static void t_gemv_presplit(const char *dir, Precision prec, int quick, int add_norm) {
    Err err = {};
    Model *m[2] = {NULL, NULL};
    Backend *gb[2] = {NULL, NULL};
    Runner *rg[2] = {NULL, NULL};
    KVCache *kv[2] = {NULL, NULL};
    SafeTensors *ref = NULL;
    char path[512];
    snprintf(path, sizeof path, "%s/ref.safetensors", dir);
    for (int i = 0; i < 2; i++) {
        if (model_load(&m[i], dir, &err) || (prec != PREC_BF16 && model_quantize(m[i], prec, 1, &err))) {
            printf("  FAIL %s: %s\n", dir, err.msg);
            n_fail++;
            return;
        }
        for (int j = 0; j < m[i]->weights.n; j++) { /* routed experts: the grouped GEMV (its unpermute epilogue) */
            const WeightTensor *t = &m[i]->weights.t[j];
            if (t->mat) t->mat->mma_min_n = strstr(t->name, ".experts.") ? 0 : 1;
        }
        gb[i] = backend_cuda_create(&m[i]->weights, m[i]->cfg.head_dim, 128);
        backend_cuda_gemv_presplit(gb[i], add_norm ? 1 : i); /* 0: off, 1: from one token on */
        if (add_norm && !i) CHECK(backend_cuda_off(gb[i], "matmul_add_rmsnorm", 1) == 0, "no matmul_add_rmsnorm row");
        rg[i] = runner_create_with(m[i], gb[i], 128, 128);
        kv[i] = runner_kvcache_create(rg[i], 80, 4);
    }
    if (safetensors_open(&ref, path, &err)) {
        printf("  FAIL %s: %s\n", dir, err.msg);
        n_fail++;
        return;
    }
    const StTensor *t0 = safetensors_get(ref, "seq0.tokens");
    const int32_t *tok = (const int32_t *)t0->data;
    int V = m[0]->cfg.vocab, L = m[0]->cfg.n_layers, T = quick ? 2 : 3, D = 3;
    const char *pn = precision_name(prec);
    float *o[2] = {(float *)malloc(sizeof(float) * 8 * V), (float *)malloc(sizeof(float) * 8 * V)};
    int32_t bt0[32], pos[16], seq[16], rows[16];
    for (int i = 0; i < 32; i++) bt0[i] = 1 + 2 * i;
    const int32_t *tables[1] = {bt0};
    for (int i = 0; i < 16; i++) { pos[i] = i; seq[i] = 0; rows[i] = i; }
    int differ = 0, wrong_saving = 0, steps = 0;
    long saved[8] = {0}, pdl[2] = {0, 0};
    long plain_launched = 0; /* kernels launched without the PDL attribute in PDL-on steps */
    int bad_prefetch = 0; /* runs whose GEMVs issued L2 prefetches (cuda_pdl.cuh pdl_prefetch_l2) though off, or none */
    for (int s = 0; s <= D && T + s <= (int)t0->numel; s++, steps++) {
        int32_t zero = 0;
        Batch pre = {T, tok, pos, seq, 1, tables, T, rows, 0};
        Batch dec = {1, tok + T + s - 1, pos + T + s - 1, seq, 1, tables, 1, &zero, 0};
        long k[2];
        for (int i = 0; i < 2; i++) {
            cuda_pdl_enable(add_norm || i); /* runner 0 also without programmatic dependent launch (cuda_pdl.cuh) */
            cuda_gemv_prefetch_enable(add_norm || i); /* and without the GEMVs' L2 prefetch */
            long k0 = emu_kernels_run(), p0 = emu_pdl_launches(), f0 = emu_prefetches_l2();
            if (model_forward(rg[i], kv[i], s ? &dec : &pre, o[i], &err)) {
                printf("  FAIL %s step %d: %s\n", dir, s, err.msg);
                n_fail++;
            }
            k[i] = emu_kernels_run() - k0;
            long pd = emu_pdl_launches() - p0;
            pdl[i] += pd;
            /* with PDL on, a step launched here (not a graph replay: the emulation counts the attribute at
             * the launch call) launches every kernel with it */
            if (i && pd) plain_launched += k[i] - pd;
            bad_prefetch += (emu_prefetches_l2() > f0) != (add_norm || i);
        }
        differ += memcmp(o[0], o[1], sizeof(float) * (size_t)(s ? 1 : T) * V) != 0;
        saved[s] = k[0] - k[1];
        wrong_saving += saved[s] != (add_norm ? (s ? 2 * L - 1 : 0) : 2 * L); /* add_norm: one token only */
    }
    uint64_t cap = 0, rep = 0;
    int can = runner_graph_counts(rg[1], &cap, &rep);
    cuda_pdl_enable(1);
    cuda_gemv_prefetch_enable(1);
    int ok = differ == 0 && wrong_saving == 0 && steps == D + 1 && can && cap >= 1 && rep >= 1 &&
             (add_norm || pdl[0] == 0) && pdl[1] > 0 && bad_prefetch == 0 && plain_launched == 0;
    printf("  %s %s %s %s: prefill %d + %d decode steps (%llu captured, %llu replayed) give "
           "the logits of %s bit for bit (%d differ); kernels saved a step: %ld %ld %ld %ld (want %s%d "
           "layers%s); launches with the PDL attribute %ld (on), %ld (%s), without it when on %ld; runs whose GEMV "
           "weight prefetches were not as set %d\n",
           ok ? "ok  " : "FAIL", dir, pn, add_norm ? "o / down + add + norm" : "presplit, PDL and prefetch", T, D,
           (unsigned long long)cap, (unsigned long long)rep, add_norm ? "matmul then add_rmsnorm" : "both off", differ,
           saved[0], saved[1], saved[2], saved[3], add_norm ? "0, then 2 x " : "2 x ", L, add_norm ? " - 1" : "", pdl[1], pdl[0],
           add_norm ? "on too" : "off", plain_launched, bad_prefetch);
    ok ? n_pass++ : n_fail++;
    free(o[0]); free(o[1]);
    safetensors_free(ref);
    for (int i = 0; i < 2; i++) {
        runner_kvcache_free(rg[i], kv[i]);
        runner_free(rg[i]);
        model_free(m[i]);
    }
}

static void t_native_crossovers(int quick) {
    printf("== the decode GEMV's choice, measured per shape at start-up (device_native.c) ==\n");
    t_gemv_crossover("tests/fixtures/qwen3_gqa2", PREC_BF16, quick);
    t_gemv_crossover("tests/fixtures/qwen3_gqa2", PREC_FP8, quick);
    t_gemv_crossover("tests/fixtures/qwen3_hd64_g4", PREC_NVFP4, quick); /* gqa2 has a [64 x 88]: not NVFP4 */
    t_gemv_presplit("tests/fixtures/qwen3_gqa2", PREC_FP8, quick, 0);
    if (!quick) t_gemv_presplit("tests/fixtures/qwen3_hd64_g4", PREC_NVFP4, 0, 0);
    /* o / down on FP8's tensor-core GEMV with the norm's split (the tiled GEMV's epilogue, BF16 / FP8 /
     * NVFP4, in the op table; BF16 decode steps take it in every fixture above, against the CPU) */
    t_gemv_presplit("tests/fixtures/qwen3_hd64_g4", PREC_FP8, quick, 1);
    t_gemv_presplit("tests/fixtures/qwen3_moe_fp4", PREC_FP8, quick, 1); /* o, layer 0 down, layer 1 experts down */
    t_moe_gemv_choice(PREC_FP8, quick);
    if (!quick) t_moe_gemv_choice(PREC_NVFP4, 0); /* the sanitizers' quick subset: FP8 (the same code) */
    if (!quick) t_moe_gemv_choice(PREC_BF16, 0);
    printf("== the native GEMM's crossover, measured per shape at start-up (device_native.c) ==\n");
    t_native_crossover("tests/fixtures/qwen2", PREC_FP8, quick);
    if (!quick) t_native_crossover("tests/fixtures/llama31", PREC_NVFP4, 0);
    t_moe_crossover(quick);
    /* gpu_check's crossover rows (bench_crossover.h) at a small shape and a few tokens: they run,
     * and native wins somewhere (the emulated cuBLASLt is a plain loop, the GEMV a thread per lane) */
    for (int fp4 = 0; fp4 < (quick ? 1 : 2); fp4++) {
        int c = native_xover_shape(fp4, fp4 ? 128 : 256, fp4 ? 256 : 512, quick ? 1 : 2, NULL);
        printf("  %s gpu_check's crossover measurement of a %s matrix runs (native from %d)\n", c >= 1 ? "ok  " : "FAIL",
               fp4 ? "nvfp4 [128, 256]" : "fp8 128x128 [256, 512]", c);
        c >= 1 ? n_pass++ : n_fail++;
    }
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* line by line: the ctest log interleaves stderr's info lines */
    device_timing_reps = 1; /* start-up's timings: their values mean nothing here, the choices are checked */
    if (getenv("EMU_FIXTURE")) { /* EMU_FIXTURE=dir [EMU_PREC=fp8|nvfp4]: one fixture end to end alone */
        Precision p = PREC_BF16;
        if (getenv("EMU_PREC") && precision_parse(getenv("EMU_PREC"), &p)) return 2;
        if (getenv("EMU_ATTN")) { /* EMU_ATTN=1: t_attn_long alone, at the three KV dtypes */
            for (int t = 0; t < KV_DTYPE_COUNT; t++) t_attn_long(getenv("EMU_FIXTURE"), (KvDtype)t);
            printf("%d passed, %d failed\n", n_pass, n_fail);
            return n_fail ? 1 : 0;
        }
        if (!getenv("EMU_LONG_ONLY")) t_model(getenv("EMU_FIXTURE"), 3, p); /* EMU_LONG_ONLY=1: t_moe_long alone */
        /* EMU_MOE_NATIVE=1 (with EMU_PREC=fp8): the native-FP8 MoE prefill of 40 tokens instead of 304 */
        if (strstr(getenv("EMU_FIXTURE"), "moe") && !getenv("EMU_QUICK"))
            t_moe_long(getenv("EMU_FIXTURE"), p, getenv("EMU_MOE_NATIVE") ? 40 : 304, getenv("EMU_MOE_NATIVE") != NULL);
        printf("%d passed, %d failed\n", n_pass, n_fail);
        return n_fail ? 1 : 0;
    }
    if (getenv("EMU_EXPERTS_ONLY")) { /* EMU_EXPERTS_ONLY=1: the engine's routed-experts check alone */
        engine_experts_check("tests/fixtures/qwen3_moe");
        printf("%d passed, %d failed\n", n_pass, n_fail);
        return n_fail ? 1 : 0;
    }
    if (getenv("EMU_CROSSOVER_ONLY")) { /* EMU_CROSSOVER_ONLY=1: the native crossover checks alone */
        t_native_crossovers(getenv("EMU_QUICK") != NULL);
        printf("%d passed, %d failed\n", n_pass, n_fail);
        return n_fail ? 1 : 0;
    }
    if (getenv("EMU_DELTA_ONLY")) { /* EMU_DELTA_ONLY=1: the delta fault checks alone (working on an update path) */
        t_delta_faults();
        printf("%d passed, %d failed\n", n_pass, n_fail);
        return n_fail ? 1 : 0;
    }
    /* EMU_PART=1 | 2: half of the run, so that ctest runs the halves side by side (cuda_emu and
     * cuda_emu_2): 1 the op and sampler checks, the fixture models, the native crossover and two MoE
     * prefills, 2 the other MoE prefills, LoRA,
     * the engine's device sampling, the KV cache dtypes and the delta faults; unset: both. */
    const char *part = getenv("EMU_PART");
    int part1 = !part || !strcmp(part, "1"), part2 = !part || !strcmp(part, "2");
    if (!part1 && !part2) {
        fprintf(stderr, "EMU_PART=%s: want 1 or 2 (or unset: both)\n", part);
        return 2;
    }
    /* EMU_QUICK (ASan's first half): one bf16 fixture, one decode step, the quick op rows */
    int quick = getenv("EMU_QUICK") != NULL;
    if (part1) {
        bc = backend_cpu_create(1, 32768); /* op_checks.h's long-context rows reach position 32767 */
        bg = backend_cuda_create_resident(0, 2048);
        printf("== CUDA kernels on the CPU emulation vs the CPU reference ops (tests/gpu/op_checks.h) ==\n");
        /* EMU_SAMPLING_ONLY=1: the device sampler's checks alone (working on sampling.cu); =engine: and the engine's */
        int only_sampling = getenv("EMU_SAMPLING_ONLY") != NULL;
        if (!only_sampling) {
            t_decode();
            op_checks_run(0, quick);
        }
        if (getenv("EMU_OPS_ONLY")) { /* EMU_OPS_ONLY=1: the op checks alone (working on a kernel) */
            printf("%d passed, %d failed\n", n_pass, n_fail);
            return n_fail ? 1 : 0;
        }
        printf("== the device sampler on the emulation vs sampler_sample (tests/gpu/sampling_checks.h) ==\n");
        sampling_checks_run(0);
        bg->free(bg);
        bc->free(bc);
        if (only_sampling) {
            if (!strcmp(getenv("EMU_SAMPLING_ONLY"), "engine")) {
                engine_devsample_check("tests/fixtures/qwen2");
                engine_experts_check("tests/fixtures/qwen3_moe");
            }
            printf("%d passed, %d failed\n", n_pass, n_fail);
            return n_fail ? 1 : 0;
        }
        printf("== fixture models through backend_cuda on the emulation ==\n");
        const char *dirs[] = {"tests/fixtures/qwen3_moe", "tests/fixtures/qwen2", "tests/fixtures/qwen3_gqa2",
                              "tests/fixtures/qwen3_mha_sharded", "tests/fixtures/qwen3_moe_nonorm",
                              "tests/fixtures/llama31"};
        for (size_t i = 0; i < (quick ? 1 : sizeof dirs / sizeof dirs[0]); i++)
            t_model(dirs[i], quick ? 1 : 3, PREC_BF16);
        t_experts_capture("tests/fixtures/qwen3_moe");
        if (!quick) t_experts_capture("tests/fixtures/qwen3_moe_nonorm");
        /* weight-only FP8 / NVFP4 (llama31: every linear width a multiple of 16) vs the CPU at the same precision */
        if (!quick) t_model("tests/fixtures/qwen3_moe", 3, PREC_FP8); /* MoE experts at fp8 */
        t_model("tests/fixtures/qwen2", quick ? 1 : 3, PREC_FP8);
        t_model("tests/fixtures/llama31", quick ? 1 : 3, PREC_NVFP4);
        t_want_graphs = 1; /* NVFP4 experts grouped on the device (moe_gemm.cu), their scale2 through a pointer table */
        t_model("tests/fixtures/qwen3_moe_fp4", quick ? 1 : 3, PREC_NVFP4);
        t_want_graphs = 0;
        if (!quick) { /* native FP8 per channel / NVFP4 (cuda_native.h), the delta re-upload included */
            t_act_pc = 1;
            t_model("tests/fixtures/qwen2", 1, PREC_FP8);
            t_act_pc = 0;
            t_model("tests/fixtures/llama31", 1, PREC_NVFP4);
            t_act_pc = -1;
        }
        t_native_crossovers(quick);
        if (!quick) { /* two of the MoE prefills (part 2 has the others): the halves take about as long */
            t_moe_long("tests/fixtures/qwen3_moe_fp4", PREC_FP8, 40, 1); /* native FP8 experts (moe_mma.cu fmt 3) */
            t_moe_long("tests/fixtures/qwen3_moe_fp4", PREC_NVFP4, 40, 0);
        }
    }
    if (!part2) {
        printf("%d passed, %d failed\n", n_pass, n_fail);
        return n_fail ? 1 : 0;
    }
    /* MoE prefills: the grouped GEMM (moe_mma.cu) in piecewise graphs, BF16 above 256 tokens (the
     * x16 buckets), FP8 at 40 (its decoder; part 1 runs the native FP8 and NVFP4 ones); not under
     * EMU_QUICK (the op checks' moe_gemm rows run there) */
    if (!quick) {
        t_moe_long("tests/fixtures/qwen3_moe", PREC_BF16, 304, 0);
        t_moe_long("tests/fixtures/qwen3_moe_fp4", PREC_FP8, 40, 0);
    }
    printf("== LoRA adapters through backend_cuda (tests/gpu/lora_checks.h) ==\n");
    lora_model_check("qwen3_gqa2", 0, quick, emu_fail_nth, emu_failed);
    if (!quick) lora_model_check("llama31", 1, 0, NULL, NULL);
    if (!quick) lora_model_check("qwen3_moe", 0, 0, NULL, NULL); /* the routed experts' pairs (both layouts) */
    /* not under EMU_QUICK: an engine step samples every row through a 512-thread block for ~40 steps
     * (the longest part); the sampler kernel itself is checked above in the quick subset too */
    if (!quick) {
        printf("== the engine sampling on the device vs on the host (tests/gpu/engine_devsample_check.h) ==\n");
        engine_devsample_check("tests/fixtures/qwen2");
    }
    /* routed experts kept in flight with the step that routed them (quick too: the sanitizers see the
     * pinned buffers and the copies' landing) */
    engine_experts_check("tests/fixtures/qwen3_moe");
    /* the KV cache dtypes: the device path's kv_write and attention at BF16 and FP8 */
    t_model_kv("tests/fixtures/qwen3_gqa2", quick ? 1 : 3, PREC_BF16, KV_BF16);
    if (!quick) t_model_kv("tests/fixtures/qwen3_moe", 3, PREC_BF16, KV_FP8);
    printf("== the production attention shapes (head_dim 128 / 8 heads a KV head, head_dim 64 / 4) ==\n");
    t_attn_long("tests/fixtures/qwen3_g8_hd128", KV_BF16);
    if (!quick) {
        /* prefill of 7, decode, the mixed steps (17 tokens over two sequences) and their graphs
         * all on the grouped-head kernel; the delta */
        t_model_kv("tests/fixtures/qwen3_g8_hd128", 3, PREC_BF16, KV_BF16);
        t_attn_long("tests/fixtures/qwen3_g8_hd128", KV_FP8);
        t_attn_long("tests/fixtures/qwen3_g8_hd128", KV_F32);
        t_attn_long("tests/fixtures/qwen3_hd64_g4", KV_BF16);
        t_attn_long("tests/fixtures/qwen3_hd64_g4", KV_FP8);
    }
    t_cuda_off(quick);
    t_pdl_refused();
    t_delta_faults();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
