/*
 * bench_lora.c - the cost of serving LoRA adapters on the CPU backend.
 *
 *   bench_lora MODEL_DIR [threads] [rank] [batch] [steps]
 *   (a Qwen3-0.6B-shaped random model: python3 scripts/make_bench_model.py qwen3-0.6b DIR)
 *
 * 1. Decode: `batch` sequences (default 16) decode one token each per step;
 *    tok/s with every sequence on the base model, on 1 adapter, on 4 and on
 *    16 distinct adapters (sequence i on adapter i % k), all rank `rank`
 *    (default 16) on all seven linears; ratios against the base measured in
 *    the same run (5 rounds, the order of the configurations rotated each
 *    round, median per configuration). Also the batched LoRA op alone over
 *    every adapted linear of one step (best of 5): the part of a step that is
 *    LoRA, free of the noise of the whole step; the same with the adapters
 *    stored as BF16 (--lora-dtype bfloat16), interleaved with the f32 runs.
 * 2. Adapter update: the time to read and check one adapter directory
 *    (lora_load, while serving: no pause) and, with the engine decoding the
 *    batch under adapters, the engine_run_exclusive swap that a load_inplace
 *    commits: how long the swap itself holds the engine (the pause tokens
 *    see) and how long the caller waits for it (to the next step boundary).
 *
 * The adapters are random PEFT directories written under /tmp by this
 * program (adapter_config.json + BF16 adapter_model.safetensors).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "dtype.h"
#include "engine.h"
#include "lora.h"
#include "model.h"
#include "runner_backend.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 11) * 0x1.0p-53) - 0.5f;
}

/* A random PEFT adapter directory for model c: rank r on every supported linear (on a MoE layer its
 * attention and each routed expert's three, in the per-expert layout). */
static void write_adapter(const char *dir, const ModelConfig *c, int r) {
    mkdir(dir, 0755);
    char path[512];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"peft_type\": \"LORA\", \"r\": %d, \"lora_alpha\": %d, \"target_modules\": [\"q_proj\", "
            "\"k_proj\", \"v_proj\", \"o_proj\", \"gate_proj\", \"up_proj\", \"down_proj\"]}\n", r, 2 * r);
    fclose(f);
    static const char *blk[LT_COUNT] = {"self_attn", "self_attn", "self_attn", "self_attn", "mlp", "mlp", "mlp"};
    int q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim, I = c->moe_intermediate;
    int dims[LT_COUNT][2] = {{c->hidden, q}, {c->hidden, kv}, {c->hidden, kv}, {q, c->hidden},
                             {c->hidden, c->intermediate}, {c->hidden, c->intermediate}, {c->intermediate, c->hidden}};
    int edims[3][2] = {{c->hidden, I}, {c->hidden, I}, {I, c->hidden}};
    size_t hcap = (size_t)64 << 20, hn = 0, off = 0;
    char *hdr = malloc(hcap);
    hn += (size_t)snprintf(hdr + hn, hcap - hn, "{");
    for (int l = 0; l < c->n_layers; l++) {
        int moe = model_layer_is_moe(c, l);
        for (int t = 0; t < LT_COUNT; t++)
            for (int e = 0; e < (moe && t >= LT_GATE ? c->n_experts : 1); e++)
                for (int ab = 0; ab < 2; ab++) {
                    int in = moe && t >= LT_GATE ? edims[t - LT_GATE][0] : dims[t][0];
                    int out = moe && t >= LT_GATE ? edims[t - LT_GATE][1] : dims[t][1];
                    int d0 = ab ? out : r, d1 = ab ? r : in;
                    char mod[64];
                    if (moe && t >= LT_GATE) snprintf(mod, sizeof mod, "mlp.experts.%d", e);
                    else snprintf(mod, sizeof mod, "%s", blk[t]);
                    size_t bytes = (size_t)d0 * d1 * 2;
                    hn += (size_t)snprintf(hdr + hn, hcap - hn, "%s\"base_model.model.model.layers.%d.%s.%s.lora_%c."
                                           "weight\":{\"dtype\":\"BF16\",\"shape\":[%d,%d],\"data_offsets\":[%zu,%zu]}",
                                           hn > 1 ? "," : "", l, mod, lora_target_name((LoraTarget)t), ab ? 'B' : 'A',
                                           d0, d1, off, off + bytes);
                    off += bytes;
                }
    }
    hn += (size_t)snprintf(hdr + hn, hcap - hn, "}");
    while (hn % 8) hdr[hn++] = ' ';
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    f = fopen(path, "wb");
    uint64_t n8 = hn;
    fwrite(&n8, 8, 1, f);
    fwrite(hdr, 1, hn, f);
    for (size_t i = 0; i < off / 2; i++) {
        uint16_t h = f32_to_bf16(frand() * 0.1f);
        fwrite(&h, 2, 1, f);
    }
    fclose(f);
    free(hdr);
}

/* ---- 1. decode with 0 / 1 / 4 / 16 adapters ---- */
static double decode_tps(Runner *r, KVCache *kv, int V, int B, int P, int steps, const int32_t *lt, int32_t **tables) {
    int32_t tok[256], pos[256], seq[256], rows[256];
    float *logits = malloc(sizeof(float) * (size_t)B * V);
    runner_set_lora_tokens(r, lt);
    Err err = {0};
    double t0 = now_s();
    for (int s = 0; s < steps; s++) {
        for (int i = 0; i < B; i++) { tok[i] = (i * 31 + s * 7) % 1000; pos[i] = P + s; seq[i] = i; rows[i] = i; }
        Batch b = {B, tok, pos, seq, B, (const int32_t *const *)tables, B, rows, 0};
        if (model_forward(r, kv, &b, logits, &err)) { fprintf(stderr, "%s\n", err.msg); exit(1); }
    }
    double t = now_s() - t0;
    runner_set_lora_tokens(r, NULL);
    free(logits);
    return (double)B * steps / t;
}

/* ---- 2. the swap a load_inplace commits ---- */
typedef struct Swap {
    Runner *r;
    Engine *e;
    const LoraAdapter *a;
    uint64_t version;
    double held;  /* seconds inside the exclusive section */
} Swap;

static int swap_fn(void *ctx, Err *err) {
    Swap *s = ctx;
    double t0 = now_s();
    int rc = runner_set_lora(s->r, 0, s->a, err);
    if (!rc) engine_lora_changed(s->e, 0, (uint32_t)s->version);
    s->held = now_s() - t0;
    return rc;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL_DIR [threads] [rank] [batch] [steps]\n", argv[0]);
        return 2;
    }
    int threads = argc > 2 ? atoi(argv[2]) : 2, R = argc > 3 ? atoi(argv[3]) : 16;
    int B = argc > 4 ? atoi(argv[4]) : 16, steps = argc > 5 ? atoi(argv[5]) : 8, P = 16, NA = 16;
    if (B > 256) B = 256;
    Err err = {0};
    Model *m = NULL;
    if (model_load(&m, argv[1], &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    char base[128];
    snprintf(base, sizeof base, "/tmp/bench_lora_%d", (int)getpid());
    mkdir(base, 0755);
    LoraAdapter *ad[17] = {0}, *adb[17] = {0}; /* the same adapters stored f32 and bf16 (--lora-dtype) */
    double t_load = 0, t_load_bf = 0;
    LoraLoadOpts obf = {R, LORA_DTYPE_BF16};
    for (int i = 0; i <= NA; i++) {
        char d[256];
        snprintf(d, sizeof d, "%s/a%d", base, i);
        write_adapter(d, &m->cfg, R);
        double t0 = now_s();
        if (lora_load(&ad[i], &m->cfg, d, R, NULL, d, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
        double t1 = now_s();
        if (lora_load_opts(&adb[i], &m->cfg, d, &obf, NULL, d, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
        t_load += t1 - t0;
        t_load_bf += now_s() - t1;
    }
    printf("model %s: %.3fB params, %d threads; adapters rank %d on all 7 linears%s, %.1f MiB each\n", argv[1],
           m->n_params / 1e9, threads, R, m->cfg.n_experts ? " (MoE layers: attention and each routed expert's three)" : "",
           ad[0]->bytes / 1048576.0);
    printf("read + check one adapter directory (lora_load, while serving): %.1f ms (stored bf16: %.1f ms, %.1f MiB)\n",
           1e3 * t_load / (NA + 1), 1e3 * t_load_bf / (NA + 1), adb[0]->bytes / 1048576.0);

    /* 1. decode */
    int ctx = P + steps + 1, bs = 16, nbs = (ctx + bs - 1) / bs;
    Runner *r = runner_create(m, B * P > 256 ? B * P : 256, ctx, threads);
    KVCache *kv = kvcache_create(&m->cfg, B * nbs, bs);
    for (int i = 0; i < NA; i++) runner_set_lora(r, i, ad[i], &err);
    int32_t **tables = malloc(sizeof(int32_t *) * B);
    for (int i = 0; i < B; i++) {
        tables[i] = malloc(sizeof(int32_t) * nbs);
        for (int j = 0; j < nbs; j++) tables[i][j] = i * nbs + j;
    }
    { /* prefill every sequence (the base), also pages every weight in */
        int32_t *tok = malloc(sizeof(int32_t) * B * P), *pos = malloc(sizeof(int32_t) * B * P);
        int32_t *seq = malloc(sizeof(int32_t) * B * P), row = 0;
        for (int i = 0; i < B * P; i++) { tok[i] = (i * 7919) % 1000; pos[i] = i % P; seq[i] = i / P; }
        float *lg = malloc(sizeof(float) * (size_t)m->cfg.vocab);
        Batch b = {B * P, tok, pos, seq, B, (const int32_t *const *)tables, 1, &row, 0};
        if (model_forward(r, kv, &b, lg, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
        free(tok); free(pos); free(seq); free(lg);
    }
    const int ks[4] = {0, 1, 4, 16};
    int32_t lt[4][256];
    for (int c = 0; c < 4; c++)
        for (int i = 0; i < B; i++) lt[c][i] = ks[c] ? i % ks[c] : -1;
    enum { ROUNDS = 5 };
    double tps[4][ROUNDS], med[4];
    decode_tps(r, kv, m->cfg.vocab, B, P, 2, lt[3], tables); /* warm the adapters' pages */
    for (int round = 0; round < ROUNDS; round++)
        for (int k = 0; k < 4; k++) {
            int c = (k + round) % 4;
            tps[c][round] = decode_tps(r, kv, m->cfg.vocab, B, P, steps, ks[c] ? lt[c] : NULL, tables);
        }
    for (int c = 0; c < 4; c++) {
        qsort(tps[c], ROUNDS, sizeof(double), cmp_d);
        med[c] = tps[c][ROUNDS / 2];
    }
    /* the LoRA op alone: every adapted linear of one decode step */
    double op_ms[4] = {0}, op_ms_bf[4] = {0};
    {
        Backend *be = backend_cpu_create(threads, 16);
        int maxd = m->cfg.intermediate > m->cfg.n_heads * m->cfg.head_dim ? m->cfg.intermediate
                                                                            : m->cfg.n_heads * m->cfg.head_dim;
        if (m->cfg.hidden > maxd) maxd = m->cfg.hidden;
        be->reserve(be, B, maxd);
        float *x = calloc((size_t)B * maxd, sizeof(float)), *o = calloc((size_t)B * maxd, sizeof(float));
        for (size_t i = 0; i < (size_t)B * maxd; i++) x[i] = frand();
        const LoraPair *rows[256];
        /* f32 and bf16 storage interleaved per repetition, so both see the same machine load */
        for (int c = 1; c < 4; c++) {
            double bestt[2] = {1e9, 1e9};
            for (int rep = 0; rep < 5; rep++)
                for (int dt_i = 0; dt_i < 2; dt_i++) {
                    LoraAdapter **set = dt_i ? adb : ad;
                    double t0 = now_s();
                    for (int l = 0; l < m->cfg.n_layers; l++)
                        for (int t = 0; t < LT_COUNT; t++) {
                            for (int i = 0; i < B; i++) rows[i] = lora_pair(set[i % ks[c]], l, (LoraTarget)t);
                            be->lora(be, o, x, B, rows);
                        }
                    double dt = now_s() - t0;
                    if (dt < bestt[dt_i]) bestt[dt_i] = dt;
                }
            op_ms[c] = 1e3 * bestt[0];
            op_ms_bf[c] = 1e3 * bestt[1];
        }
        free(x); free(o);
        be->free(be);
    }
    printf("decode, batch %d, %d steps, median of %d rounds (min..max):\n", B, steps, ROUNDS);
    for (int c = 0; c < 4; c++) {
        printf("  %-22s %8.2f tok/s (%.2f..%.2f)  %6.3fx the base", c == 0 ? "base only" : c == 1 ? "1 adapter" :
               c == 2 ? "4 distinct adapters" : "16 distinct adapters", med[c], tps[c][0], tps[c][ROUNDS - 1],
               med[c] / med[0]);
        if (c) printf("   LoRA op alone%s %.1f ms/step = %.1f %% of a base step; adapters stored bf16: %.1f ms (%.2fx)",
                      m->cfg.n_experts ? " (dense pairs only: the experts' run inside the MoE path)" : "",
                      op_ms[c], 100.0 * op_ms[c] / (1e3 * B / med[0]), op_ms_bf[c], op_ms_bf[c] / op_ms[c]);
        printf("\n");
    }
    for (int i = 0; i < B; i++) free(tables[i]);
    free(tables);
    kvcache_free(kv);
    runner_free(r);

    /* 2. the swap under a decoding engine */
    EngineConfig ec;
    engine_config_default(&ec);
    ec.max_loras = NA;
    ec.kv_mem_mb = 256;
    ec.n_threads = threads;
    ec.verbose = 0;
    ec.max_batched_tokens = 512;
    EngineBackend be = runner_backend_create(m, NULL, &ec, NULL, NULL, NULL);
    Runner *er = runner_backend_runner(&be);
    for (int i = 0; i < NA; i++) runner_set_lora(er, i, ad[i], &err);
    Engine *e = engine_create(&m->cfg, &be, &ec);
    EngineRequest *reqs[256];
    int32_t prompt[16];
    for (int i = 0; i < 16; i++) prompt[i] = 100 + i;
    for (int i = 0; i < B; i++) {
        EngineRequestParams p;
        engine_request_params_default(&p);
        p.prompt = prompt;
        p.n_prompt = 16;
        p.sampling.max_tokens = 1 << 20;
        p.sampling.ignore_eos = 1;
        p.lora_slot = i % NA;
        if (engine_submit(e, &p, &reqs[i], &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    }
    uint64_t seen = 0;
    while (engine_request_wait(reqs[0], &seen, 1000) >= 0) { /* decoding has begun */
        EngineSeqView v;
        engine_request_seq(reqs[0], 0, &v);
        if (v.n_tokens >= 2) break;
    }
    enum { N_SWAPS = 10 };
    double wait[N_SWAPS], held[N_SWAPS];
    EngineMetrics m0, m1;
    engine_metrics(e, &m0);
    double t_run = now_s();
    for (int k = 0; k < N_SWAPS; k++) {
        usleep(20000);
        Swap s = {er, e, ad[k % 2 ? 0 : NA], (uint64_t)k + 1, 0};
        double t0 = now_s();
        if (engine_run_exclusive(e, swap_fn, &s, 0, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
        wait[k] = now_s() - t0;
        held[k] = s.held;
    }
    t_run = now_s() - t_run;
    engine_metrics(e, &m1);
    for (int i = 0; i < B; i++) engine_request_release(reqs[i]);
    engine_free(e);
    runner_backend_free(&be);
    qsort(wait, N_SWAPS, sizeof *wait, cmp_d);
    qsort(held, N_SWAPS, sizeof *held, cmp_d);
    double step = (m1.steps > m0.steps) ? t_run / (double)(m1.steps - m0.steps) : 0;
    printf("load_inplace swap under decode (batch %d on %d adapters, %d swaps):\n", B, NA, N_SWAPS);
    printf("  engine held by the swap     median %8.1f us  max %8.1f us   (the pause tokens see)\n",
           1e6 * held[N_SWAPS / 2], 1e6 * held[N_SWAPS - 1]);
    printf("  caller waits (to a step end) median %8.1f ms  max %8.1f ms   (one decode step: %.1f ms)\n",
           1e3 * wait[N_SWAPS / 2], 1e3 * wait[N_SWAPS - 1], 1e3 * step);
    for (int i = 0; i <= NA; i++) { lora_free(ad[i]); lora_free(adb[i]); }
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", base);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", base);
    model_free(m);
    return 0;
}
