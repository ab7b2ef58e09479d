/*
 * test_lora.c - PEFT LoRA adapters on the CPU forward pass.
 *
 *   - parity: base + adapter logits against transformers + peft
 *     (scripts/make_lora_golden.py: random BF16-exact adapters on the Qwen3
 *     and Llama fixtures, r 2..8, all seven targets or a subset, use_rslora),
 *     every position of each recorded sequence. Tolerance as test_forward.c:
 *     both sides accumulate in f32 from the same values, so only summation
 *     order differs: MAX_ABS 1e-4 on logits, MAX_KL 1e-9 (the adapters move
 *     logits by 7-12, so a missing scale, target or layer is far outside).
 *   - mixed batch: the sequences of two adapters and of the base in one
 *     prefill step, and then in one decode step, are bit-identical to each
 *     alone (and the base rows to a runner with no adapter at all).
 *   - the CPU backend's grouped op (rows of one adapter share a segment)
 *     against the per-row reference cpu_lora_row, bit for bit, for rows of
 *     three adapters and the base interleaved.
 *   - BF16 storage (--lora-dtype bfloat16): rounding to nearest even at load,
 *     half the bytes, logits bit-identical to f32 storage of the same values
 *     and within the same bound of transformers + peft; the BF16 op equals the
 *     f32 op on the widened values (bf16_storage below).
 *   - the MoE fixture (qwen3_moe) in both expert layouts (lora.h): a1 is peft's
 *     own (target_parameters on the fused experts, gate_up at rank 2r by its
 *     rank_pattern), a2 the per-expert one, whose golden is peft running the
 *     same update in the fused layout (make_lora_golden.py): parity and the
 *     mixed batch as above (tokens of different adapters meet in one expert),
 *     the pairs each holds, and MoE-only refusals.
 *   - refusals: DoRA, modules_to_save, a trained bias, a rank above the
 *     limit, another model's adapter, a LoRA-less backend slot: a clear
 *     error and nothing loaded.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "cpu_ops.h"
#include "dtype.h"
#include "logit_stats.h"
#include "lora.h"
#include "model.h"
#include "test.h"

#define MAX_ABS 1e-4
#define MAX_KL 1e-9
#define BLOCK 4
#define MAXT 64

typedef struct {
    const char *fixture;
    int n_adapters;
} Fix;

static const float *ref_get(const SafeTensors *ref, const char *ad, int s, const char *what, int64_t *numel) {
    char name[128];
    snprintf(name, sizeof name, "%s.seq%d.%s", ad, s, what);
    const StTensor *t = safetensors_get(ref, name);
    if (!t) return NULL;
    *numel = t->numel;
    return (const float *)t->data;
}

/* Prefill tokens [T] of one sequence with every token on slot; logits [T, V]. */
static int prefill(Runner *r, KVCache *kv, const int32_t *tok, int T, int slot, int table_base, float *out) {
    int32_t pos[MAXT], seq[MAXT], rows[MAXT], lt[MAXT], bt[MAXT];
    for (int i = 0; i < T; i++) { pos[i] = i; seq[i] = 0; rows[i] = i; lt[i] = slot; }
    for (int i = 0; i < (T + BLOCK - 1) / BLOCK; i++) bt[i] = table_base + i;
    const int32_t *tables[1] = {bt};
    Batch b = {T, tok, pos, seq, 1, tables, T, rows, 0};
    runner_set_lora_tokens(r, lt);
    Err err = {0};
    int rc = model_forward(r, kv, &b, out, &err);
    runner_set_lora_tokens(r, NULL);
    T_ASSERT(rc == 0, "prefill: %s", err.msg);
    return rc;
}

static void parity_and_mix(const char *fixture) {
    char dir[256], path[300];
    snprintf(dir, sizeof dir, "tests/fixtures/%s", fixture);
    Err err = {0};
    Model *m = NULL;
    T_ASSERT(model_load(&m, dir, &err) == 0, "%s: %s", dir, err.msg);
    if (!m) return;
    snprintf(path, sizeof path, "tests/fixtures/lora/%s.ref.safetensors", fixture);
    SafeTensors *ref = NULL;
    T_ASSERT(safetensors_open(&ref, path, &err) == 0, "%s", err.msg);
    if (!ref) { model_free(m); return; }
    const char *names[2] = {"a1", "a2"};
    LoraAdapter *ad[2] = {0};
    for (int a = 0; a < 2; a++) {
        snprintf(path, sizeof path, "tests/fixtures/lora/%s-%s", fixture, names[a]);
        int rc = lora_load(&ad[a], &m->cfg, path, 64, NULL, path, &err);
        T_ASSERT(rc == 0, "%s: %s", path, err.msg);
        if (rc) goto out;
    }
    int V = m->cfg.vocab;
    Runner *r = runner_create(m, MAXT * 3, 128, 2);
    Runner *plain = runner_create(m, MAXT * 3, 128, 2); /* never sees an adapter */
    KVCache *kv = kvcache_create(&m->cfg, 256, BLOCK);
    for (int a = 0; a < 2; a++) T_ASSERT(runner_set_lora(r, a + 3, ad[a], &err) == 0, "%s", err.msg);
    /* parity: each adapter, each recorded sequence, every position */
    float *solo[2][2] = {{0}};
    const int32_t *toks[2][2] = {{0}};
    int lens[2][2] = {{0}}, compared = 0;
    for (int a = 0; a < 2; a++) {
        double max_abs = 0, max_kl = 0;
        for (int s = 0; s < 2; s++) {
            int64_t nt = 0, nl = 0;
            const int32_t *tok = (const int32_t *)ref_get(ref, names[a], s, "tokens", &nt);
            const float *want = ref_get(ref, names[a], s, "logits", &nl);
            T_ASSERT(tok && want && nt > 0 && nt <= MAXT && nl == nt * V, "%s %s seq%d: reference missing", fixture,
                     names[a], s);
            if (!tok || !want || nt > MAXT || nl != nt * V) continue;
            int T = (int)nt;
            float *out = malloc(sizeof(float) * (size_t)T * V);
            if (prefill(r, kv, tok, T, a + 3, 1 + 40 * s, out) == 0) {
                LogitStats st = logit_stats(want, out, T, V);
                if (!(st.max_abs <= max_abs)) max_abs = st.max_abs;
                if (!(st.max_kl <= max_kl)) max_kl = st.max_kl;
                compared++;
            }
            solo[a][s] = out;
            toks[a][s] = tok;
            lens[a][s] = T;
        }
        printf("%-12s + %s: max|dlogit| %.2e KL %.2e vs transformers + peft\n", fixture, names[a], max_abs, max_kl);
        T_ASSERT(max_abs <= MAX_ABS && max_kl <= MAX_KL, "%s + %s off: %.3e / %.3e", fixture, names[a], max_abs,
                 max_kl);
    }
    T_ASSERT(compared == 4, "%s: compared %d sequences, want 4", fixture, compared);
    if (compared != 4) goto done;
    /* the base alone (a runner without adapters) for the base sequence: a1's seq1 tokens */
    int Tb = lens[0][1];
    float *base = malloc(sizeof(float) * (size_t)Tb * V);
    prefill(plain, kv, toks[0][1], Tb, -1, 100, base);
    /* mixed prefill: a1 seq0, base (a1 seq1's tokens), a2 seq0 */
    {
        const int32_t *st[3] = {toks[0][0], toks[0][1], toks[1][0]};
        int sl[3] = {3, -1, 4}, Ts[3] = {lens[0][0], Tb, lens[1][0]};
        int32_t tok[3 * MAXT], pos[3 * MAXT], seq[3 * MAXT], rows[3 * MAXT], lt[3 * MAXT], bt[3][MAXT];
        int n = 0;
        for (int q = 0; q < 3; q++) {
            for (int i = 0; i < (Ts[q] + BLOCK - 1) / BLOCK; i++) bt[q][i] = 140 + 30 * q + i;
            for (int i = 0; i < Ts[q]; i++, n++) {
                tok[n] = st[q][i]; pos[n] = i; seq[n] = q; rows[n] = n; lt[n] = sl[q];
            }
        }
        const int32_t *tables[3] = {bt[0], bt[1], bt[2]};
        float *out = malloc(sizeof(float) * (size_t)n * V);
        Batch b = {n, tok, pos, seq, 3, tables, n, rows, 0};
        runner_set_lora_tokens(r, lt);
        T_ASSERT(model_forward(r, kv, &b, out, &err) == 0, "mixed: %s", err.msg);
        int same = memcmp(out, solo[0][0], sizeof(float) * (size_t)Ts[0] * V) == 0 &&
                   memcmp(out + (size_t)Ts[0] * V, base, sizeof(float) * (size_t)Tb * V) == 0 &&
                   memcmp(out + (size_t)(Ts[0] + Tb) * V, solo[1][0], sizeof(float) * (size_t)Ts[2] * V) == 0;
        T_ASSERT(same, "%s: a mixed prefill (a1, base, a2) differs from each sequence alone", fixture);
        /* mixed decode: one more step of each sequence, its last token again at its last
         * position (the K/V of the earlier positions are in the cache from the mixed prefill) */
        int32_t dtok[3], dpos[3], dseq[3] = {0, 1, 2}, drows[3] = {0, 1, 2}, dlt[3];
        for (int q = 0; q < 3; q++) { dtok[q] = st[q][Ts[q] - 1]; dpos[q] = Ts[q] - 1; dlt[q] = sl[q]; }
        Batch d = {3, dtok, dpos, dseq, 3, tables, 3, drows, 0};
        float dout[3 * 512 + 1];
        T_ASSERT(V <= 512, "vocab");
        runner_set_lora_tokens(r, dlt);
        T_ASSERT(model_forward(r, kv, &d, dout, &err) == 0, "decode: %s", err.msg);
        runner_set_lora_tokens(r, NULL);
        const float *want[3] = {solo[0][0] + (size_t)(Ts[0] - 1) * V, base + (size_t)(Tb - 1) * V,
                                solo[1][0] + (size_t)(Ts[2] - 1) * V};
        int dsame = 1;
        for (int q = 0; q < 3; q++) dsame &= memcmp(dout + (size_t)q * V, want[q], sizeof(float) * V) == 0;
        T_ASSERT(dsame, "%s: a mixed decode step differs from each sequence's prefill row", fixture);
        printf("%-12s mixed prefill == alone %s, mixed decode == alone %s\n", fixture, same ? "yes" : "NO",
               dsame ? "yes" : "NO");
        /* a slot that holds nothing is refused, not run as the base */
        int32_t bad[3] = {5, -1, 3};
        runner_set_lora_tokens(r, bad);
        Err e2 = {0};
        T_ASSERT(model_forward(r, kv, &d, dout, &e2) < 0 && strstr(e2.msg, "slot 5"), "empty slot accepted: %s",
                 e2.msg);
        runner_set_lora_tokens(r, NULL);
        free(out);
    }
    free(base);
done:
    for (int a = 0; a < 2; a++)
        for (int s = 0; s < 2; s++) free(solo[a][s]);
    kvcache_free(kv);
    runner_free(r);
    runner_free(plain);
out:
    for (int a = 0; a < 2; a++) lora_free(ad[a]);
    safetensors_free(ref);
    model_free(m);
}

/* A copy of a committed adapter with one config field replaced (json: "key": value). */
static void write_variant(const char *dst, const char *src, const char *key, const char *value) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s && cp %s/adapter_model.safetensors %s/ && "
             "python3 -c \"import json,sys; c=json.load(open('%s/adapter_config.json')); c['%s']=json.loads(sys.argv[1]); "
             "json.dump(c, open('%s/adapter_config.json','w'))\" '%s'",
             dst, dst, src, dst, src, key, dst, value);
    T_ASSERT(system(cmd) == 0, "%s", cmd);
}

static void refusals(void) {
    Err err = {0};
    Model *m = NULL, *llama = NULL;
    T_ASSERT(model_load(&m, "tests/fixtures/qwen3_gqa2", &err) == 0, "%s", err.msg);
    T_ASSERT(model_load(&llama, "tests/fixtures/llama31", &err) == 0, "%s", err.msg);
    if (!m || !llama) { model_free(m); model_free(llama); return; }
    const char *src = "tests/fixtures/lora/qwen3_gqa2-a1";
    char dst[128];
    snprintf(dst, sizeof dst, "/tmp/test_lora_%d", (int)getpid());
    struct { const char *key, *value, *want; } cases[] = {
        {"use_dora", "true", "use_dora"},
        {"target_parameters", "[\"mlp.experts.gate_up_proj\", \"mlp.experts.down_proj\"]", "the model is dense"},
        {"modules_to_save", "[\"lm_head\"]", "modules_to_save"},
        {"bias", "\"all\"", "bias"},
        {"r", "128", "--max-lora-rank"},
        {"r", "4", "shape"},             /* the tensors are rank 8 */
        {"peft_type", "\"IA3\"", "peft_type"},
        {"target_modules", "[\"q_proj\", \"embed_tokens\"]", "embed_tokens"},
        {"rank_pattern", "{\"q_proj\": 4}", "the model needs [4, 64]"}, /* applied: q_proj's tensors are rank 8 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_variant(dst, src, cases[i].key, cases[i].value);
        LoraAdapter *a = (LoraAdapter *)1;
        Err e = {0};
        int rc = lora_load(&a, &m->cfg, dst, 64, NULL, "adapter", &e);
        T_ASSERT(rc < 0 && e.code == 400 && a == NULL && strstr(e.msg, cases[i].want),
                 "%s = %s: rc %d, message '%s' (want it to name %s)", cases[i].key, cases[i].value, rc, e.msg,
                 cases[i].want);
    }
    /* another model's adapter: names a shape the model does not have */
    LoraAdapter *a = NULL;
    Err e = {0};
    T_ASSERT(lora_load(&a, &llama->cfg, src, 64, NULL, "adapter", &e) < 0 && !a && strstr(e.msg, "shape"),
             "a Qwen3 adapter loaded onto Llama: %s", e.msg);
    /* missing directory */
    T_ASSERT(lora_load(&a, &m->cfg, "/nonexistent/lora", 64, NULL, "adapter", &e) < 0 && !a, "missing dir loaded");
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dst);
    T_ASSERT(system(cmd) == 0, "cleanup");
    /* the budget formula: a full rank-8 adapter on every target is what the committed a1 holds */
    LoraAdapter *full = NULL;
    T_ASSERT(lora_load(&full, &m->cfg, src, 64, NULL, "a1", &e) == 0, "%s", e.msg);
    if (full) T_ASSERT(full->bytes == lora_bytes(&m->cfg, 8) && full->n_targets == 2 * LT_COUNT,
                       "a1 holds %zu bytes in %d pairs, lora_bytes says %zu", full->bytes, full->n_targets,
                       lora_bytes(&m->cfg, 8));
    lora_free(full);
    model_free(m);
    model_free(llama);
}

/* The routed experts in both layouts (lora.h): what each committed qwen3_moe adapter holds, and the
 * refusals that only a MoE model can reach. The logits themselves: parity_and_mix("qwen3_moe"). */
static void moe_layouts(void) {
    Err e = {0};
    Model *m = NULL;
    if (model_load(&m, "tests/fixtures/qwen3_moe", &e)) { T_ASSERT(0, "%s", e.msg); return; }
    const ModelConfig *c = &m->cfg;
    LoraAdapter *a1 = NULL, *a2 = NULL;
    T_ASSERT(lora_load(&a1, c, "tests/fixtures/lora/qwen3_moe-a1", 64, NULL, "a1", &e) == 0, "%s", e.msg);
    T_ASSERT(lora_load(&a2, c, "tests/fixtures/lora/qwen3_moe-a2", 64, NULL, "a2", &e) == 0, "%s", e.msg);
    if (a1) {
        /* peft (transformers 5) moved gate/up/down into target_parameters and gave the fused gate_up_proj
         * rank 2r = 8 and alpha 16 by rank_pattern / alpha_pattern: 3 layers x 4 attention pairs, and per MoE
         * layer 8 experts x (gate + up from gate_up_proj, down) */
        const LoraPair *g = lora_expert_pair(a1, 1, 3, LT_GATE), *u = lora_expert_pair(a1, 2, 7, LT_UP),
                       *d = lora_expert_pair(a1, 1, 0, LT_DOWN);
        T_ASSERT(a1->n_targets == 3 * 4 + 2 * 8 * 3, "a1: %d pairs", a1->n_targets);
        T_ASSERT(g && u && d && g->rank == 8 && u->rank == 8 && d->rank == 4 && g->in == c->hidden &&
                 g->out == c->moe_intermediate && d->in == c->moe_intermediate && d->out == c->hidden &&
                 g->scale == 2.0f && d->scale == 2.0f && a1->rank == 8,
                 "a1's expert pairs: gate rank %d scale %g, down rank %d scale %g", g ? g->rank : 0,
                 g ? g->scale : 0, d ? d->rank : 0, d ? d->scale : 0);
        T_ASSERT(!lora_pair(a1, 0, LT_GATE) && lora_pair(a1, 0, LT_Q) && !lora_expert_pair(a1, 0, 0, LT_GATE),
                 "a1: layer 0 (dense) has only its attention adapted");
        T_ASSERT(a1->bytes <= lora_bytes(c, 8), "a1 holds %zu bytes, above the rank-8 budget %zu", a1->bytes,
                 lora_bytes(c, 8));
    }
    if (a2) {
        const LoraPair *g = lora_expert_pair(a2, 2, 5, LT_GATE);
        T_ASSERT(a2->n_targets == 3 * 2 + 2 * 8 * 3 && g && g->rank == 2 && g->scale == 2.0f &&
                     lora_pair(a2, 0, LT_V) && !lora_pair(a2, 0, LT_DOWN) && lora_expert_pair(a2, 1, 7, LT_DOWN),
                 "a2: %d pairs", a2->n_targets);
    }
    lora_free(a1);
    lora_free(a2);
    char dst[128];
    snprintf(dst, sizeof dst, "/tmp/test_lora_moe_%d", (int)getpid());
    struct { const char *key, *value, *want; } cases[] = {
        {"target_parameters", "[\"mlp.gate.weight\"]", "not supported"},
        {"rank_pattern", "{}", "fused expert pair"},             /* the tensors are gate_up rank 8 */
        {"rank_pattern", "{\".*\\\\.gate_up_proj\": 128}", "--max-lora-rank"},
        {"rank_pattern", "{\"layers\\\\.\\\\d+\\\\.mlp\": 8}", "regex syntax"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_variant(dst, "tests/fixtures/lora/qwen3_moe-a1", cases[i].key, cases[i].value);
        LoraAdapter *a = (LoraAdapter *)1;
        Err e2 = {0};
        int rc = lora_load(&a, c, dst, 64, NULL, "adapter", &e2);
        T_ASSERT(rc < 0 && e2.code == 400 && a == NULL && strstr(e2.msg, cases[i].want),
                 "moe %s = %s: rc %d, message '%s' (want it to name %s)", cases[i].key, cases[i].value, rc, e2.msg,
                 cases[i].want);
    }
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dst);
    T_ASSERT(system(cmd) == 0, "cleanup");
    model_free(m);
}

static void grouped_op_is_the_reference(void) {
    enum { IN = 40, OUT = 150, N = 23 };
    static float a[3][8 * IN], b[3][OUT * 8], x[N * IN], out[N * OUT], ref[N * OUT];
    int ranks[3] = {8, 3, 1};
    uint32_t seed = 7;
    for (int p = 0; p < 3; p++)
        for (int i = 0; i < 8 * IN; i++) {
            seed = seed * 1664525u + 1013904223u;
            a[p][i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
            seed = seed * 1664525u + 1013904223u;
            b[p][i % (OUT * 8)] = (float)(seed >> 8) / 16777216.0f - 0.5f;
        }
    LoraPair lp[3];
    for (int p = 0; p < 3; p++) lp[p] = (LoraPair){a[p], b[p], ranks[p], IN, OUT, 0.5f + p, 0};
    const LoraPair *rows[N];
    for (int i = 0; i < N; i++) {
        rows[i] = i % 4 == 3 ? NULL : &lp[(i * 7) % 3];
        for (int k = 0; k < IN; k++) x[i * IN + k] = (float)((i * 31 + k * 17) % 97) / 97.0f - 0.5f;
        for (int k = 0; k < OUT; k++) out[i * OUT + k] = ref[i * OUT + k] = (float)k / OUT;
    }
    Backend *be = backend_cpu_create(2, 16);
    be->reserve(be, 64, 256);
    be->lora(be, out, x, N, rows);
    for (int i = 0; i < N; i++)
        if (rows[i]) cpu_lora_row(ref + i * OUT, x + i * IN, rows[i]);
    T_ASSERT(memcmp(out, ref, sizeof out) == 0, "the grouped LoRA op differs from cpu_lora_row");
    be->free(be);
}

/* --lora-dtype bfloat16 (LoraLoadOpts.dtype): adapters stored as BF16, math in f32.
 *   - storage: an F32 adapter whose values are each within half a BF16 ulp of
 *     the committed (BF16-exact) adapter's (tests/lora_f32_variant.py: x (1 -/+
 *     2^-12)) is stored as f32_to_bf16 of each value, i.e. the committed bits
 *     (truncating would not give them back), in half the bytes (lora_bytes_as);
 *   - compute: its logits are bit-identical to the committed adapter stored as
 *     f32 (widening is exact and the arithmetic is the f32 path's), so against
 *     transformers + peft the bound is the f32 one (MAX_ABS / MAX_KL), tested;
 *     an adapter that is not BF16-exact differs from its f32 storage by the
 *     rounding of its weights (<= 2^-9 relative each), which no golden covers;
 *   - the op: BF16 pairs (rows of B longer than the widening chunk) through the
 *     grouped CPU op equal cpu_lora_row on the widened f32 values, bit for bit. */
static void bf16_storage(const char *fixture) {
    char dir[256], src[300], dst[128], cmd[1024], path[320];
    snprintf(dir, sizeof dir, "tests/fixtures/%s", fixture);
    snprintf(src, sizeof src, "tests/fixtures/lora/%s-a1", fixture);
    snprintf(dst, sizeof dst, "/tmp/test_lora_bf16_%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s && python3 tests/lora_f32_variant.py %s %s", dst, dst, src, dst);
    T_ASSERT(system(cmd) == 0, "%s", cmd);
    Err err = {0};
    Model *m = NULL;
    SafeTensors *ref = NULL;
    snprintf(path, sizeof path, "tests/fixtures/lora/%s.ref.safetensors", fixture);
    T_ASSERT(model_load(&m, dir, &err) == 0 && safetensors_open(&ref, path, &err) == 0, "%s", err.msg);
    if (!m || !ref) { model_free(m); return; }
    LoraLoadOpts f32 = {64, LORA_DTYPE_F32}, bf = {64, LORA_DTYPE_BF16};
    LoraAdapter *orig = NULL, *v32 = NULL, *vbf = NULL;
    T_ASSERT(lora_load_opts(&orig, &m->cfg, src, &f32, NULL, "orig", &err) == 0, "%s", err.msg);
    T_ASSERT(lora_load_opts(&v32, &m->cfg, dst, &f32, NULL, "v32", &err) == 0, "%s", err.msg);
    T_ASSERT(lora_load_opts(&vbf, &m->cfg, dst, &bf, NULL, "vbf", &err) == 0, "%s", err.msg);
    if (!orig || !v32 || !vbf) goto out;
    T_ASSERT(vbf->dtype == LORA_DTYPE_BF16 && vbf->bytes * 2 == v32->bytes &&
             vbf->bytes == lora_bytes_as(&m->cfg, 8, LORA_DTYPE_BF16), "bf16 adapter holds %zu bytes, f32 %zu",
             vbf->bytes, v32->bytes);
    size_t ne = v32->bytes / 4, moved = 0, wrong = 0;
    const float *o32 = orig->arena, *p32 = v32->arena;
    const uint16_t *pbf = vbf->arena;
    for (size_t i = 0; i < ne; i++) {
        moved += memcmp(&o32[i], &p32[i], 4) != 0;
        wrong += pbf[i] != f32_to_bf16(p32[i]) || bf16_to_f32(pbf[i]) != o32[i];
    }
    T_ASSERT(moved > ne / 2 && wrong == 0, "bf16 storage: %zu of %zu values not rounded to nearest even (%zu of the "
             "f32 variant's values differ from the committed adapter)", wrong, ne, moved);
    int V = m->cfg.vocab;
    int64_t nt = 0, nl = 0;
    const int32_t *tok = (const int32_t *)ref_get(ref, "a1", 0, "tokens", &nt);
    const float *want = ref_get(ref, "a1", 0, "logits", &nl);
    T_ASSERT(tok && want && nt > 0 && nt <= MAXT && nl == nt * V, "reference missing");
    if (!tok || !want || nt > MAXT || nl != nt * V) goto out;
    Runner *r = runner_create(m, MAXT, 128, 2);
    KVCache *kv = kvcache_create(&m->cfg, 64, BLOCK);
    float *lf = malloc(sizeof(float) * (size_t)nt * V), *lb = malloc(sizeof(float) * (size_t)nt * V),
          *lv = malloc(sizeof(float) * (size_t)nt * V);
    T_ASSERT(runner_set_lora(r, 0, orig, &err) == 0 && runner_set_lora(r, 1, vbf, &err) == 0 &&
             runner_set_lora(r, 2, v32, &err) == 0, "%s", err.msg);
    prefill(r, kv, tok, (int)nt, 0, 1, lf);
    prefill(r, kv, tok, (int)nt, 1, 1, lb);
    prefill(r, kv, tok, (int)nt, 2, 1, lv);
    LogitStats st = logit_stats(want, lb, (int)nt, V), sv = logit_stats(lf, lv, (int)nt, V);
    printf("%-12s + a1 stored bf16: max|dlogit| %.2e KL %.2e vs transformers + peft; the f32 variant (x (1 -/+ 2^-12)) "
           "stored f32 moved logits by %.2e\n", fixture, st.max_abs, st.max_kl, sv.max_abs);
    T_ASSERT(memcmp(lf, lb, sizeof(float) * (size_t)nt * V) == 0, "%s: bf16 storage of the variant differs from f32 "
             "storage of the committed adapter", fixture);
    T_ASSERT(st.max_abs <= MAX_ABS && st.max_kl <= MAX_KL, "%s bf16 off: %.3e / %.3e", fixture, st.max_abs, st.max_kl);
    T_ASSERT(sv.max_abs > 0, "the f32 variant computed the committed adapter's bits (no perturbation reached it)");
    free(lf); free(lb); free(lv);
    kvcache_free(kv);
    runner_free(r);
out:
    lora_free(orig); lora_free(v32); lora_free(vbf);
    safetensors_free(ref);
    model_free(m);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dst);
    T_ASSERT(system(cmd) == 0, "cleanup");
}

static void bf16_op_is_widened_f32(void) {
    enum { IN = 300, OUT = 2061, N = 7, R = 5 };
    static uint16_t a16[2][R * IN], b16[2][R * OUT];
    static float a32[2][R * IN], b32[2][R * OUT], x[N * IN], out[N * OUT], ref[N * OUT];
    uint32_t seed = 11;
    for (int p = 0; p < 2; p++) {
        for (int i = 0; i < R * IN; i++) {
            seed = seed * 1664525u + 1013904223u;
            a16[p][i] = f32_to_bf16((float)(seed >> 8) / 16777216.0f - 0.5f);
            a32[p][i] = bf16_to_f32(a16[p][i]);
        }
        for (int i = 0; i < R * OUT; i++) {
            seed = seed * 1664525u + 1013904223u;
            b16[p][i] = f32_to_bf16((float)(seed >> 8) / 16777216.0f - 0.5f);
            b32[p][i] = bf16_to_f32(b16[p][i]);
        }
    }
    LoraPair pb[2], pf[2];
    for (int p = 0; p < 2; p++) {
        pb[p] = (LoraPair){a16[p], b16[p], R - 2 * p, IN, OUT, 0.75f, 1};
        pf[p] = (LoraPair){a32[p], b32[p], R - 2 * p, IN, OUT, 0.75f, 0};
    }
    const LoraPair *rows[N];
    for (int i = 0; i < N; i++) {
        rows[i] = i == 4 ? NULL : &pb[i % 2];
        for (int k = 0; k < IN; k++) x[i * IN + k] = (float)((i * 13 + k * 7) % 101) / 101.0f - 0.5f;
        for (int k = 0; k < OUT; k++) out[i * OUT + k] = ref[i * OUT + k] = (float)(k % 17) / 17;
    }
    Backend *be = backend_cpu_create(2, 16);
    be->reserve(be, 64, 256);
    be->lora(be, out, x, N, rows);
    for (int i = 0; i < N; i++)
        if (rows[i]) cpu_lora_row(ref + i * OUT, x + i * IN, &pf[i % 2]);
    T_ASSERT(memcmp(out, ref, sizeof out) == 0, "the BF16 LoRA op differs from the f32 op on the widened values");
    be->free(be);
}

int main(void) {
    grouped_op_is_the_reference();
    parity_and_mix("qwen3_gqa2");
    parity_and_mix("llama31");
    parity_and_mix("qwen3_moe");
    moe_layouts();
    refusals();
    bf16_op_is_widened_f32();
    bf16_storage("qwen3_gqa2");
    bf16_storage("llama31");
    return T_DONE();
}
