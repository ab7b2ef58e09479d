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
    Batch b = {T, tok, pos, seq, 1, tables, T, rows};
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
        Batch b = {n, tok, pos, seq, 3, tables, n, rows};
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
        Batch d = {3, dtok, dpos, dseq, 3, tables, 3, drows};
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
        {"modules_to_save", "[\"lm_head\"]", "modules_to_save"},
        {"bias", "\"all\"", "bias"},
        {"r", "128", "--max-lora-rank"},
        {"r", "4", "shape"},             /* the tensors are rank 8 */
        {"peft_type", "\"IA3\"", "peft_type"},
        {"target_modules", "[\"q_proj\", \"embed_tokens\"]", "embed_tokens"},
        {"rank_pattern", "{\"q_proj\": 4}", "rank_pattern"},
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

int main(void) {
    grouped_op_is_the_reference();
    parity_and_mix("qwen3_gqa2");
    parity_and_mix("llama31");
    refusals();
    return T_DONE();
}
