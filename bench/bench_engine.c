/*
 * bench_engine.c - drives the engine directly (no HTTP) on a model directory.
 *
 *   bench_engine MODEL_DIR [--requests-per-slot N] [--prompt MIN:MAX] [--output MIN:MAX]
 *                [--turns T] [--threads N] [--kv-mem-mb MB]
 *
 * 1. Sampler: ns per token for a [vocab] row with common settings, against a
 *    full-sort reference measured in the same run (the ratio is the point).
 * 2. Concurrency 1, 8, 32: C client slots, each keeps one request in flight
 *    (prompt and output lengths uniform in the given ranges, seeded sampling,
 *    T = 0.8, ignore_eos). Reports output tokens/s, mean TTFT and ITL from the
 *    engine's histograms, and the speed-up over concurrency 1.
 * 3. Multi-turn: 4 conversations x T turns, each turn re-sends the whole
 *    conversation plus 32 new tokens; prefix-cache hit rate, and prefill
 *    tokens computed and wall time against the same workload with the prefix
 *    cache off.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "log.h"
#include "runner_backend.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t xr(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }
static int uni(int lo, int hi) { return lo + (int)(xr() % (uint64_t)(hi - lo + 1)); }

/* ---- 1. sampler ---- */
static const float *g_row;
static int cmp_desc(const void *a, const void *b) {
    float x = g_row[*(const int32_t *)a], y = g_row[*(const int32_t *)b];
    return x > y ? -1 : x < y ? 1 : 0;
}

static void bench_sampler(int V) {
    float *row = malloc(V * sizeof(float));
    int32_t *idx = malloc(V * sizeof(int32_t));
    for (int i = 0; i < V; i++) {
        double u = ((double)(xr() >> 11) + 0.5) * 0x1.0p-53, w = ((double)(xr() >> 11)) * 0x1.0p-53;
        row[i] = (float)(3.0 * sqrt(-2 * log(u)) * cos(2 * M_PI * w));
    }
    /* reference: one full sort of the row (what a naive top-p does per token) */
    int reps = 5;
    double t0 = now_s();
    for (int r = 0; r < reps; r++) {
        for (int i = 0; i < V; i++) idx[i] = i;
        g_row = row;
        qsort(idx, V, sizeof(int32_t), cmp_desc);
    }
    double sort_ns = (now_s() - t0) / reps * 1e9;
    Sampler *s = sampler_create(V);
    struct { const char *name; float t; int k; float p; float minp; } cases[] = {
        { "greedy", 0, 0, 1, 0 }, { "T=1", 1, 0, 1, 0 }, { "top_k=50", 1, 50, 1, 0 },
        { "top_p=0.9", 1, 0, 0.9f, 0 }, { "top_k=50,top_p=0.9", 1, 50, 0.9f, 0 },
        { "min_p=0.05", 1, 0, 1, 0.05f },
    };
    printf("sampler (vocab %d): full qsort of the row = %.0f us\n", V, sort_ns / 1e3);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        SamplingParams p;
        sampling_params_default(&p);
        p.temperature = cases[c].t; p.top_k = cases[c].k; p.top_p = cases[c].p; p.min_p = cases[c].minp;
        SampleHistory h = { 0 };
        SampleResult res;
        int n = 40;
        t0 = now_s();
        for (int i = 0; i < n; i++) sampler_sample(s, row, &p, &h, NULL, 0, 0, i, NULL, &res);
        double ns = (now_s() - t0) / n * 1e9;
        printf("  %-22s %8.0f us/token  (%.2fx the full sort)  kept %d\n", cases[c].name, ns / 1e3,
               ns / sort_ns, res.n_kept);
    }
    sampler_free(s);
    free(row);
    free(idx);
}

/* ---- 2. concurrency ---- */
typedef struct Opts {
    int per_slot, pmin, pmax, omin, omax, turns, threads;
    size_t kv_mb;
} Opts;

/* One engine at a time; its CPU runner backend is the caller's to free. */
static EngineBackend g_be;

static Engine *make(Model *m, const Opts *o, int prefix) {
    EngineConfig c;
    engine_config_default(&c);
    c.max_running_seqs = 32;
    c.max_batched_tokens = 512;
    c.max_model_len = 2048;
    c.kv_mem_mb = o->kv_mb;
    c.n_threads = o->threads;
    c.enable_prefix_cache = prefix;
    c.verbose = 0;
    g_be = runner_backend_create(m, NULL, &c, NULL, NULL, NULL);
    return engine_create(&m->cfg, &g_be, &c);
}

static void unmake(Engine *e) {
    engine_free(e);
    runner_backend_free(&g_be);
}

static EngineRequest *submit(Engine *e, const int32_t *prompt, int n, int out, uint64_t seed) {
    EngineRequestParams p;
    engine_request_params_default(&p);
    p.prompt = prompt; p.n_prompt = n;
    p.sampling.max_tokens = out; p.sampling.temperature = 0.8f;
    p.sampling.seed = seed; p.sampling.has_seed = 1; p.sampling.ignore_eos = 1;
    EngineRequest *r = NULL;
    Err err = { 0 };
    if (engine_submit(e, &p, &r, &err) < 0) { fprintf(stderr, "submit: %s\n", err.msg); exit(1); }
    return r;
}

static double run_concurrency(Model *m, const Opts *o, int C, double base_tps) {
    Engine *e = make(m, o, 0);
    int V = m->cfg.vocab, total = C * o->per_slot, submitted = 0, finished = 0;
    EngineRequest **slot = calloc(C, sizeof *slot);
    uint64_t *seen = calloc(C, sizeof *seen);
    int32_t *prompt = malloc(o->pmax * sizeof(int32_t));
    uint64_t out_tokens = 0;
    double t0 = now_s();
    while (finished < total) {
        for (int i = 0; i < C; i++) {
            if (slot[i] && engine_request_done(slot[i])) {
                EngineSeqView v;
                engine_request_seq(slot[i], 0, &v);
                out_tokens += (uint64_t)v.n_tokens;
                engine_request_release(slot[i]);
                slot[i] = NULL;
                finished++;
            }
            if (!slot[i] && submitted < total) {
                int n = uni(o->pmin, o->pmax);
                for (int k = 0; k < n; k++) prompt[k] = (int32_t)(xr() % (uint64_t)V);
                slot[i] = submit(e, prompt, n, uni(o->omin, o->omax), (uint64_t)submitted);
                seen[i] = 0;
                submitted++;
            }
        }
        /* block (do not spin: the engine needs the cores) until slot 0..C-1 changes */
        for (int i = 0; i < C; i++)
            if (slot[i]) { engine_request_wait(slot[i], &seen[i], 5); break; }
    }
    double wall = now_s() - t0;
    EngineMetrics mt;
    engine_metrics(e, &mt);
    double tps = (double)out_tokens / wall;
    double itl = mt.itl.n ? mt.itl.sum / mt.itl.n : 0;
    printf("  concurrency %2d: %4d requests, %6llu output tokens in %7.2f s: %8.1f tok/s (%.2fx c=1)  "
           "TTFT %7.1f ms  ITL %7.1f ms  decode %.1f tok/s (C/ITL)  steps %llu\n",
           C, total, (unsigned long long)out_tokens, wall, tps, base_tps > 0 ? tps / base_tps : 1.0,
           mt.ttft.n ? 1e3 * mt.ttft.sum / mt.ttft.n : 0, 1e3 * itl, itl > 0 ? C / itl : 0,
           (unsigned long long)mt.steps);
    free(slot);
    free(seen);
    free(prompt);
    unmake(e);
    return tps;
}

/* ---- 3. multi-turn ---- */
static void run_multiturn(Model *m, const Opts *o, int prefix, double *wall_out, uint64_t *prefill_out) {
    enum { CONV = 4 };
    Engine *e = make(m, o, prefix);
    int V = m->cfg.vocab, cap = 2048;
    int32_t *conv[CONV];
    int len[CONV];
    uint64_t seed = 1;
    rng = 12345;
    for (int c = 0; c < CONV; c++) {
        conv[c] = malloc(cap * sizeof(int32_t));
        len[c] = 64;
        for (int k = 0; k < len[c]; k++) conv[c][k] = (int32_t)(xr() % (uint64_t)V);
    }
    double t0 = now_s();
    for (int t = 0; t < o->turns; t++) {
        EngineRequest *r[CONV];
        for (int c = 0; c < CONV; c++) r[c] = submit(e, conv[c], len[c], 16, seed++);
        for (int c = 0; c < CONV; c++) {
            uint64_t seen = 0;
            while (!engine_request_done(r[c])) engine_request_wait(r[c], &seen, 100);
            EngineSeqView v;
            engine_request_seq(r[c], 0, &v);
            for (int k = 0; k < v.n_tokens && len[c] < cap - 64; k++) conv[c][len[c]++] = v.tokens[k].token;
            for (int k = 0; k < 32; k++) conv[c][len[c]++] = (int32_t)(xr() % (uint64_t)V);
            engine_request_release(r[c]);
        }
    }
    double wall = now_s() - t0;
    EngineMetrics mt;
    engine_metrics(e, &mt);
    printf("  prefix cache %-3s: %d conversations x %d turns in %6.2f s, prefill computed %llu tokens, "
           "hit rate %.1f%% (%llu of %llu prompt tokens), TTFT %.1f ms\n",
           prefix ? "on" : "off", CONV, o->turns, wall, (unsigned long long)mt.prefill_tokens_computed,
           mt.prefix_cache_queries ? 100.0 * mt.prefix_cache_hits / mt.prefix_cache_queries : 0.0,
           (unsigned long long)mt.prefix_cache_hits, (unsigned long long)mt.prefix_cache_queries,
           mt.ttft.n ? 1e3 * mt.ttft.sum / mt.ttft.n : 0);
    *wall_out = wall;
    *prefill_out = mt.prefill_tokens_computed;
    for (int c = 0; c < CONV; c++) free(conv[c]);
    unmake(e);
}

static void parse_range(const char *s, int *lo, int *hi) {
    if (sscanf(s, "%d:%d", lo, hi) != 2 || *lo < 1 || *hi < *lo) {
        fprintf(stderr, "bad range '%s' (want MIN:MAX)\n", s);
        exit(2);
    }
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL_DIR [--requests-per-slot N] [--prompt MIN:MAX] [--output MIN:MAX] "
                        "[--turns T] [--threads N] [--kv-mem-mb MB]\n", argv[0]);
        return 2;
    }
    Opts o = { 2, 32, 256, 16, 64, 4, 0, 2048 };
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--requests-per-slot")) o.per_slot = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--prompt")) parse_range(argv[i + 1], &o.pmin, &o.pmax);
        else if (!strcmp(argv[i], "--output")) parse_range(argv[i + 1], &o.omin, &o.omax);
        else if (!strcmp(argv[i], "--turns")) o.turns = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) o.threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--kv-mem-mb")) o.kv_mb = (size_t)atol(argv[i + 1]);
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress shows when redirected */
    log_set_level(LOG_WARN);
    Model *m = NULL;
    Err err = { 0 };
    if (model_load(&m, argv[1], &err) < 0) { fprintf(stderr, "load %s: %s\n", argv[1], err.msg); return 1; }
    printf("model %s: %s, %d layers, hidden %d, vocab %d, %.0fM params\n", argv[1], m->cfg.arch_name,
           m->cfg.n_layers, m->cfg.hidden, m->cfg.vocab, m->n_params / 1e6);
    bench_sampler(m->cfg.vocab);
    printf("concurrency (prompt %d..%d, output %d..%d tokens, %d requests per slot):\n", o.pmin, o.pmax, o.omin,
           o.omax, o.per_slot);
    double base = 0;
    int cs[3] = { 1, 8, 32 };
    for (int i = 0; i < 3; i++) {
        rng = 88172645463325252ull;
        double tps = run_concurrency(m, &o, cs[i], base);
        if (i == 0) base = tps;
    }
    printf("multi-turn (64-token system prompt, +16 generated +32 user tokens per turn):\n");
    double w_on, w_off;
    uint64_t p_on, p_off;
    run_multiturn(m, &o, 1, &w_on, &p_on);
    run_multiturn(m, &o, 0, &w_off, &p_off);
    printf("  prefix cache saves %.1f%% of prefill tokens; wall time %.2fx of no-cache\n",
           p_off ? 100.0 * (1.0 - (double)p_on / p_off) : 0, w_off > 0 ? w_on / w_off : 0);
    model_free(m);
    return 0;
}
