/*
 * test_engine.c - the engine end to end on the tiny fixture models.
 *
 * The reference is the foundation's forward pass (model_forward, itself
 * checked against transformers in test_forward) run on one sequence alone,
 * all tokens in one step, in a fresh contiguous KV cache. The engine's logits
 * rows (seen through EngineConfig.logits_tap) must be bit-identical to it
 * whatever the batch, chunking, paging, prefix-cache hits, forks and
 * preemptions did. Token streams are compared across engine configurations
 * (tiny pool vs big pool, alone vs crowded) for greedy and seeded sampling.
 * The reference's KV cache has the engine's dtype (g_kv): every test runs at
 * the default (auto = BF16), and the batch-invariance, prefix-cache and
 * preemption tests again at float32 and fp8 (--kv-cache-dtype).
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dtype.h"
#include "engine.h"
#include "runner_backend.h"
#include "test.h"

#define FIX "tests/fixtures/qwen3_gqa2"
#define FIX_MOE "tests/fixtures/qwen3_moe"

/* ---- logits tap: every sampled row, by (request, seq, pos) ---- */
typedef struct TapRow { uint64_t rid; int seq, pos; float *row; } TapRow;
static TapRow *g_rows;
static int g_n_rows, g_cap_rows, g_vocab;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

/* The gate: armed for (prompt length, n), the engine stops in the tap at the
 * first row that would sample position >= prompt + n (of any request; the
 * tap's pos counts the prompt) until the test opens it, so a request with that
 * prompt is provably mid-generation (n tokens published, the rest not yet
 * sampled) when the test acts on it. Waits at the
 * gate end after GATE_DEADLINE_S only so that a test that never opens it fails
 * its assertions instead of hanging; nothing depends on that time. */
#define GATE_DEADLINE_S 120
static pthread_cond_t g_gate_cv = PTHREAD_COND_INITIALIZER;
static int g_gate_pos; /* 0: open; guarded by g_mu */

static void gate_arm(int n_prompt, int n) {
    pthread_mutex_lock(&g_mu);
    g_gate_pos = n_prompt + n;
    pthread_mutex_unlock(&g_mu);
}

static void gate_open(void) {
    pthread_mutex_lock(&g_mu);
    g_gate_pos = 0;
    pthread_cond_broadcast(&g_gate_cv);
    pthread_mutex_unlock(&g_mu);
}

/* ms per sampled row once the gate opened: the engine pauses only at a step
 * boundary and engine_pause blocks until it does, so a pause cannot be issued
 * while the gate holds the engine; the pace keeps the rest of the request
 * longer than the two statements between gate_open and engine_pause. */
static _Atomic int g_slow;

static void tap(void *ctx, uint64_t rid, int seq, int pos, const float *row, int vocab) {
    (void)ctx;
    pthread_mutex_lock(&g_mu);
    if (g_gate_pos > 0 && pos >= g_gate_pos) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += GATE_DEADLINE_S;
        while (g_gate_pos > 0 && pos >= g_gate_pos)
            if (pthread_cond_timedwait(&g_gate_cv, &g_mu, &dl) == ETIMEDOUT) break;
    }
    pthread_mutex_unlock(&g_mu);
    if (g_slow) usleep(g_slow * 1000);
    pthread_mutex_lock(&g_mu);
    if (g_n_rows == g_cap_rows) {
        g_cap_rows = g_cap_rows ? 2 * g_cap_rows : 1024;
        g_rows = realloc(g_rows, g_cap_rows * sizeof(TapRow));
    }
    float *copy = malloc(vocab * sizeof(float));
    memcpy(copy, row, vocab * sizeof(float));
    g_rows[g_n_rows++] = (TapRow){ rid, seq, pos, copy };
    g_vocab = vocab;
    pthread_mutex_unlock(&g_mu);
}

static const float *tap_get(uint64_t rid, int seq, int pos) {
    const float *r = NULL;
    pthread_mutex_lock(&g_mu);
    for (int i = g_n_rows - 1; i >= 0 && !r; i--)
        if (g_rows[i].rid == rid && g_rows[i].seq == seq && g_rows[i].pos == pos) r = g_rows[i].row;
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* ---- reference: one sequence alone, one step ---- */
static Model *g_model;
static KvDtype g_kv = KV_BF16; /* the engines' and the reference's KV dtype (auto resolves to BF16) */

static void ref_forward(Model *m, const int32_t *tok, int n, float *logits /* [n, V] */) {
    int bs = 16, nb = (n + bs - 1) / bs;
    Runner *r = runner_create(m, n, n, 2);
    KVCache *kv = kvcache_create_dtype(&m->cfg, nb, bs, g_kv);
    int32_t *pos = malloc(n * sizeof(int32_t)), *seq = calloc(n, sizeof(int32_t));
    int32_t *rows = malloc(n * sizeof(int32_t)), *bt = malloc(nb * sizeof(int32_t));
    for (int i = 0; i < n; i++) pos[i] = rows[i] = i;
    for (int i = 0; i < nb; i++) bt[i] = i;
    const int32_t *tables[1] = { bt };
    Batch b = { n, tok, pos, seq, 1, tables, n, rows, 0};
    Err err = { 0 };
    int rc = model_forward(r, kv, &b, logits, &err);
    T_ASSERT(rc == 0, "reference forward: %s", err.msg);
    free(pos); free(seq); free(rows); free(bt);
    kvcache_free(kv);
    runner_free(r);
}

/* ---- helpers ---- */
/* The engine drives a backend its caller owns: each test engine's CPU runner
 * backend is kept next to it and freed after it. */
typedef struct CpuEngine { Engine *e; EngineBackend be; } CpuEngine;
static CpuEngine g_engines[8];

static Engine *engine_cpu(Model *m, EngineConfig *c) {
    EngineBackend be = runner_backend_create(m, NULL, c, NULL, NULL, NULL);
    Engine *e = engine_create(&m->cfg, &be, c);
    for (int i = 0; i < 8; i++)
        if (!g_engines[i].e) { g_engines[i] = (CpuEngine){ e, be }; return e; }
    CHECK(0, "more than 8 test engines alive");
    return NULL;
}

static void engine_cpu_free(Engine *e) {
    engine_free(e);
    for (int i = 0; i < 8; i++)
        if (g_engines[i].e == e) { runner_backend_free(&g_engines[i].be); g_engines[i].e = NULL; }
}

static Engine *make_engine(Model *m, int n_blocks, int block_size, int max_batched, int max_running,
                           int prefix) {
    EngineConfig c;
    engine_config_default(&c);
    c.n_blocks = n_blocks;
    c.block_size = block_size;
    c.max_batched_tokens = max_batched;
    c.max_running_seqs = max_running;
    c.max_model_len = n_blocks * block_size < 128 ? n_blocks * block_size : 128;
    c.enable_prefix_cache = prefix;
    c.n_threads = 2;
    c.verbose = 0;
    c.logits_tap = tap;
    c.kv_cache_dtype = g_kv;
    return engine_cpu(m, &c);
}

static void prompt_of(int32_t *p, int n, int salt) {
    for (int i = 0; i < n; i++) p[i] = 3 + (int32_t)((i * 131 + salt * 977 + (i * i) % 17) % 500);
}

static EngineRequest *submit(Engine *e, const int32_t *prompt, int n, int max_tokens, float temp,
                             uint64_t seed, int nseq) {
    EngineRequestParams p;
    engine_request_params_default(&p);
    p.prompt = prompt;
    p.n_prompt = n;
    p.n = nseq;
    p.sampling.max_tokens = max_tokens;
    p.sampling.temperature = temp;
    p.sampling.seed = seed;
    p.sampling.has_seed = 1;
    p.sampling.ignore_eos = 1;
    EngineRequest *r = NULL;
    Err err = { 0 };
    int rc = engine_submit(e, &p, &r, &err);
    T_ASSERT(rc == 0, "submit: %s", err.msg);
    return r;
}

static void wait_done(EngineRequest *r) {
    uint64_t seen = 0;
    for (int i = 0; i < 600 && !engine_request_done(r); i++) engine_request_wait(r, &seen, 100);
    T_ASSERT(engine_request_done(r), "request %llu did not finish", (unsigned long long)engine_request_id(r));
}

static int tokens_of(EngineRequest *r, int seq, int32_t *out) {
    EngineSeqView v;
    engine_request_seq(r, seq, &v);
    for (int i = 0; i < v.n_tokens; i++) out[i] = v.tokens[i].token;
    return v.n_tokens;
}

/* Every sampled row of (r, seq) equals the reference forward of its history. */
static int rows_match_reference(EngineRequest *r, int seq, const int32_t *prompt, int n_prompt) {
    int32_t hist[256];
    int ng = tokens_of(r, seq, hist + n_prompt);
    memcpy(hist, prompt, n_prompt * sizeof(int32_t));
    int V = g_model->cfg.vocab, T = n_prompt + ng - 1, bad = 0;
    float *ref = malloc((size_t)T * V * sizeof(float));
    ref_forward(g_model, hist, T, ref);
    for (int k = 0; k < ng; k++) {
        const float *row = tap_get(engine_request_id(r), seq, n_prompt + k);
        if (!row || memcmp(row, ref + (size_t)(n_prompt + k - 1) * V, V * sizeof(float)) != 0) bad++;
    }
    free(ref);
    return bad;
}

/* ---- tests ---- */

/* The same prompt alone and inside batches of other prompts: bit-identical
 * logits rows, identical tokens (greedy and seeded), equal to the reference. */
static void test_batch_invariance(void) {
    int32_t P[40], others[6][60], t_alone[64], t_crowd[64], s_alone[64], s_crowd[64];
    prompt_of(P, 37, 1);
    Engine *e = make_engine(g_model, 256, 16, 64, 16, 0);
    EngineRequest *a = submit(e, P, 37, 20, 0, 0, 1);
    EngineRequest *as = submit(e, P, 37, 20, 1.0f, 42, 1);
    wait_done(a); wait_done(as);
    int na = tokens_of(a, 0, t_alone), nas = tokens_of(as, 0, s_alone);
    T_ASSERT(na == 20 && nas == 20, "alone: %d and %d tokens", na, nas);
    T_ASSERT(rows_match_reference(a, 0, P, 37) == 0, "alone greedy rows differ from the reference forward");
    T_ASSERT(rows_match_reference(as, 0, P, 37) == 0, "alone seeded rows differ from the reference forward");
    /* crowded: other prompts first so the target is chunked next to decodes */
    EngineRequest *o[6];
    for (int i = 0; i < 6; i++) {
        prompt_of(others[i], 10 + 8 * i, 10 + i);
        o[i] = submit(e, others[i], 10 + 8 * i, 15 + i, i % 2 ? 0.7f : 0.0f, 100 + i, 1);
    }
    EngineRequest *b = submit(e, P, 37, 20, 0, 0, 1);
    EngineRequest *bs = submit(e, P, 37, 20, 1.0f, 42, 1);
    for (int i = 0; i < 6; i++) wait_done(o[i]);
    wait_done(b); wait_done(bs);
    tokens_of(b, 0, t_crowd);
    tokens_of(bs, 0, s_crowd);
    T_ASSERT(memcmp(t_alone, t_crowd, 20 * 4) == 0, "greedy tokens changed in a crowded batch");
    T_ASSERT(memcmp(s_alone, s_crowd, 20 * 4) == 0, "seeded tokens changed in a crowded batch");
    int diff = 0;
    for (int k = 0; k < 20; k++) {
        const float *x = tap_get(engine_request_id(a), 0, 37 + k), *y = tap_get(engine_request_id(b), 0, 37 + k);
        diff += !x || !y || memcmp(x, y, g_vocab * sizeof(float)) != 0;
    }
    T_ASSERT(diff == 0, "%d logits rows differ between alone and crowded", diff);
    for (int i = 0; i < 6; i++) {
        T_ASSERT(rows_match_reference(o[i], 0, others[i], 10 + 8 * i) == 0, "crowd request %d rows differ", i);
        engine_request_release(o[i]);
    }
    EngineMetrics m;
    engine_metrics(e, &m);
    T_ASSERT(m.generated_tokens == 20 * 4 + 15 * 6 + 15, "generated tokens counted: %llu",
             (unsigned long long)m.generated_tokens);
    T_ASSERT(m.ttft.n == 10 && m.itl.n == m.generated_tokens - 10, "ttft/itl counts %llu %llu",
             (unsigned long long)m.ttft.n, (unsigned long long)m.itl.n);
    engine_request_release(a); engine_request_release(as);
    engine_request_release(b); engine_request_release(bs);
    engine_cpu_free(e);
}

static int g_noop_calls;
static int noop(void *ctx, Err *er) { (void)ctx; (void)er; g_noop_calls++; return 0; }

/* Prefix-cache hits give bit-identical rows to misses; multi-turn reuse. */
static void test_prefix_cache(void) {
    int32_t P[80], t1[32], t2[32];
    prompt_of(P, 41, 3);
    Engine *e = make_engine(g_model, 256, 4, 16, 8, 1);
    EngineRequest *a = submit(e, P, 41, 12, 0, 0, 1);
    wait_done(a);
    EngineMetrics m0, m1;
    engine_metrics(e, &m0);
    T_ASSERT(m0.prefix_cache_hits == 0, "first request has no hit");
    EngineRequest *b = submit(e, P, 41, 12, 0, 0, 1);
    wait_done(b);
    engine_metrics(e, &m1);
    T_ASSERT(m1.prefix_cache_hits == 40, "second request hits 10 full blocks: %llu tokens",
             (unsigned long long)m1.prefix_cache_hits);
    int n1 = tokens_of(a, 0, t1), n2 = tokens_of(b, 0, t2);
    T_ASSERT(n1 == 12 && n2 == 12 && memcmp(t1, t2, 48) == 0, "hit and miss give the same tokens");
    int diff = 0;
    for (int k = 0; k < 12; k++) {
        const float *x = tap_get(engine_request_id(a), 0, 41 + k), *y = tap_get(engine_request_id(b), 0, 41 + k);
        diff += !x || !y || memcmp(x, y, g_vocab * sizeof(float)) != 0;
    }
    T_ASSERT(diff == 0, "%d rows differ between prefix-cache hit and miss", diff);
    /* next turn: conversation + generated + new text; blocks holding generated tokens hit too */
    int n = 41;
    memcpy(P + n, t1, 12 * 4);
    n += 12;
    prompt_of(P + n, 9, 4);
    n += 9;
    EngineRequest *c = submit(e, P, n, 6, 0, 0, 1);
    wait_done(c);
    EngineMetrics m2;
    engine_metrics(e, &m2);
    /* computed K/V: 41 + 11 positions of turn one -> 13 full blocks of 4 */
    T_ASSERT(m2.prefix_cache_hits - m1.prefix_cache_hits == 52, "turn two hits %llu tokens (want 52)",
             (unsigned long long)(m2.prefix_cache_hits - m1.prefix_cache_hits));
    T_ASSERT(rows_match_reference(c, 0, P, n) == 0, "turn two rows differ from the reference");
    /* a weight update invalidates the cache */
    Err err = { 0 };
    T_ASSERT(engine_run_exclusive(e, noop, NULL, 1, &err) == 0, "exclusive ran");
    EngineRequest *d = submit(e, P, 41, 2, 0, 0, 1);
    wait_done(d);
    EngineMetrics m3;
    engine_metrics(e, &m3);
    T_ASSERT(m3.prefix_cache_hits == m2.prefix_cache_hits, "no hit after a version bump");
    EngineSeqView v;
    engine_request_seq(d, 0, &v);
    T_ASSERT(v.n_tokens == 2 && v.tokens[0].weight_version == 1 && m3.weight_version == 1,
             "tokens carry the new version");
    engine_request_release(a); engine_request_release(b);
    engine_request_release(c); engine_request_release(d);
    engine_cpu_free(e);
}

/* cache_salt: a prompt's blocks are found again only under the same salt
 * (and unsalted only unsalted); engine_request_cached_tokens counts the
 * prompt positions the first admission found; a flush forgets every entry
 * without a version bump; forked samples register under their salt. */
static EngineRequest *submit_salted(Engine *e, const int32_t *prompt, int n, uint64_t salt, int nseq) {
    EngineRequestParams p;
    engine_request_params_default(&p);
    p.prompt = prompt;
    p.n_prompt = n;
    p.n = nseq;
    p.sampling.max_tokens = 3;
    p.sampling.temperature = 0;
    p.sampling.ignore_eos = 1;
    p.cache_salt = salt;
    EngineRequest *r = NULL;
    Err err = { 0 };
    T_ASSERT(engine_submit(e, &p, &r, &err) == 0, "submit: %s", err.msg);
    wait_done(r);
    return r;
}

static void test_cache_salt(void) {
    int32_t P[41];
    prompt_of(P, 41, 5);
    Engine *e = make_engine(g_model, 256, 4, 16, 8, 1);
    struct { uint64_t salt; int cached; } steps[] = {
        {0xA, 0}, {0xA, 40}, {0xB, 0}, {0, 0}, {0, 40}, {0xB, 40},
    };
    int32_t first[8], got[8];
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        EngineRequest *r = submit_salted(e, P, 41, steps[i].salt, 1);
        T_ASSERT(engine_request_cached_tokens(r) == steps[i].cached, "step %zu (salt %llx): %d cached, want %d", i,
                 (unsigned long long)steps[i].salt, engine_request_cached_tokens(r), steps[i].cached);
        int n = tokens_of(r, 0, i ? got : first);
        T_ASSERT(n == 3 && (i == 0 || memcmp(first, got, 12) == 0), "step %zu: the same greedy tokens", i);
        T_ASSERT(rows_match_reference(r, 0, P, 41) == 0, "step %zu: rows differ from the reference", i);
        engine_request_release(r);
    }
    Err err = { 0 };
    T_ASSERT(engine_flush_prefix_cache(e, &err) == 0, "flush: %s", err.msg);
    EngineRequest *r = submit_salted(e, P, 41, 0xA, 1);
    T_ASSERT(engine_request_cached_tokens(r) == 0 && engine_weight_version(e) == 0, "flushed, version kept");
    engine_request_release(r);
    int32_t Q[41];
    prompt_of(Q, 41, 6);
    r = submit_salted(e, Q, 41, 0xC, 3); /* n = 3: forks share the prompt, register under the salt */
    engine_request_release(r);
    r = submit_salted(e, Q, 41, 0xC, 1);
    T_ASSERT(engine_request_cached_tokens(r) == 40, "forked request's blocks found under its salt: %d",
             engine_request_cached_tokens(r));
    engine_request_release(r);
    r = submit_salted(e, Q, 41, 0xD, 1);
    T_ASSERT(engine_request_cached_tokens(r) == 0, "not under another salt");
    engine_request_release(r);
    engine_cpu_free(e);
}

/* A tiny KV pool forces preemption; every request completes with the same
 * tokens as in a big pool, and the logits still equal the reference. */
static void test_preemption(void) {
    enum { R = 8 };
    int32_t P[R][32], big[R][64], small[R][64];
    EngineRequest *rb[R], *rs[R];
    Engine *eb = make_engine(g_model, 512, 4, 64, 16, 1);
    Engine *es = make_engine(g_model, 20, 4, 24, 8, 1); /* 80 tokens for 8 x (20 + 30) */
    for (int i = 0; i < R; i++) {
        prompt_of(P[i], 18 + i % 3, 20 + i);
        rb[i] = submit(eb, P[i], 18 + i % 3, 30, i % 2 ? 0.8f : 0.0f, 7 + i, 1);
        rs[i] = submit(es, P[i], 18 + i % 3, 30, i % 2 ? 0.8f : 0.0f, 7 + i, 1);
    }
    int bad = 0;
    for (int i = 0; i < R; i++) {
        wait_done(rb[i]); wait_done(rs[i]);
        EngineSeqView v;
        engine_request_seq(rs[i], 0, &v);
        bad += v.finish != FINISH_LENGTH;
        int nb = tokens_of(rb[i], 0, big[i]), ns = tokens_of(rs[i], 0, small[i]);
        bad += nb != 30 || ns != 30 || memcmp(big[i], small[i], 30 * 4) != 0;
    }
    T_ASSERT(bad == 0, "%d requests differ between the tiny and the big pool", bad);
    T_ASSERT(rows_match_reference(rs[4], 0, P[4], 18 + 4 % 3) == 0, "rows after preemption differ from the reference");
    EngineMetrics m;
    engine_metrics(es, &m);
    T_ASSERT(m.preemptions > 0, "the tiny pool preempted (%llu)", (unsigned long long)m.preemptions);
    T_ASSERT(m.requests_finished_length == R && m.kv_blocks_used == 0, "all finished, no block held (%d)",
             m.kv_blocks_used);
    for (int i = 0; i < R; i++) { engine_request_release(rb[i]); engine_request_release(rs[i]); }
    engine_cpu_free(eb);
    engine_cpu_free(es);
}

static void wait_tokens(EngineRequest *r, int n) {
    uint64_t seen = 0;
    EngineSeqView v = { 0 };
    for (int i = 0; i < 600; i++) {
        engine_request_seq(r, 0, &v);
        if (v.n_tokens >= n || v.finish) break;
        engine_request_wait(r, &seen, 100);
    }
}

/* Blocks are freed by the engine thread after the request finished: poll
 * (1 ms apart) until none is held; the bound only fails an engine that leaks. */
static void wait_blocks_free(Engine *e) {
    EngineMetrics m;
    for (int i = 0; i < GATE_DEADLINE_S * 1000; i++) {
        engine_metrics(e, &m);
        if (m.kv_blocks_used == 0) break;
        usleep(1000);
    }
    T_ASSERT(m.kv_blocks_used == 0, "%d KV blocks still held", m.kv_blocks_used);
}

/* Abort mid-generation: finish reason abort, blocks freed; release of a
 * running request aborts it too. */
static void test_abort(void) {
    int32_t P[20];
    prompt_of(P, 20, 5);
    Engine *e = make_engine(g_model, 128, 4, 32, 8, 0);
    gate_arm(20, 3);
    EngineRequest *a = submit(e, P, 20, 100, 1.0f, 1, 1);
    EngineRequest *b = submit(e, P, 20, 100, 1.0f, 2, 2);
    wait_tokens(a, 3); /* the engine holds at the gate: a and b are both running */
    engine_abort(e, a);
    engine_request_release(b); /* consumer gone while running */
    gate_open();
    wait_done(a);
    EngineSeqView v;
    engine_request_seq(a, 0, &v);
    /* the step held at the gate completes, then the abort lands */
    T_ASSERT(v.finish == FINISH_ABORT && v.n_tokens >= 3 && v.n_tokens <= 4, "aborted after %d tokens",
             v.n_tokens);
    wait_blocks_free(e);
    EngineMetrics m;
    engine_metrics(e, &m);
    T_ASSERT(m.requests_finished_abort == 3, "3 sequences aborted (%llu)",
             (unsigned long long)m.requests_finished_abort);
    engine_request_release(a);
    engine_cpu_free(e);
}

/* Pause modes and an exclusive section with a version bump. */
static void test_pause(void) {
    int32_t P[20], ref[64], got[64];
    prompt_of(P, 20, 6);
    Engine *e = make_engine(g_model, 128, 4, 32, 8, 1);
    Err err = { 0 };
    EngineRequest *r0 = submit(e, P, 20, 40, 1.0f, 9, 1);
    wait_done(r0);
    tokens_of(r0, 0, ref);
    /* keep: frozen in place, continues after the update with the same stream */
    g_slow = 5;
    gate_arm(20, 5);
    EngineRequest *a = submit(e, P, 20, 40, 1.0f, 9, 1);
    wait_tokens(a, 5);
    gate_open();
    T_ASSERT(engine_pause(e, PAUSE_KEEP, &err) == 0 && engine_is_paused(e), "paused (keep)");
    g_slow = 0;
    EngineSeqView v1, v2;
    engine_request_seq(a, 0, &v1);
    g_noop_calls = 0;
    T_ASSERT(engine_run_exclusive(e, noop, NULL, 1, &err) == 0 && g_noop_calls == 1, "exclusive while paused");
    engine_request_seq(a, 0, &v2);
    T_ASSERT(v1.n_tokens == v2.n_tokens && v2.finish == FINISH_NONE, "no progress while paused (%d -> %d)",
             v1.n_tokens, v2.n_tokens);
    engine_resume(e);
    wait_done(a);
    EngineSeqView v;
    engine_request_seq(a, 0, &v);
    tokens_of(a, 0, got);
    T_ASSERT(v.finish == FINISH_LENGTH && memcmp(ref, got, 40 * 4) == 0, "keep: same tokens as unpaused");
    T_ASSERT(v.tokens[0].weight_version == 0 && v.tokens[39].weight_version == 1, "versions 0 then 1");
    int mono = 1;
    for (int i = 1; i < 40; i++) mono &= v.tokens[i].weight_version >= v.tokens[i - 1].weight_version;
    T_ASSERT(mono, "versions never go back");
    /* abort: everything finishes now; submissions wait for resume */
    g_slow = 2;
    gate_arm(20, 2); /* c (prompt 10) is held at its 12th token */
    EngineRequest *b = submit(e, P, 20, 100, 1.0f, 10, 1), *c = submit(e, P, 10, 100, 0.0f, 0, 1);
    wait_tokens(b, 2);
    gate_open();
    T_ASSERT(engine_pause(e, PAUSE_ABORT, &err) == 0, "paused (abort)");
    g_slow = 0;
    T_ASSERT(engine_request_done(b) && engine_request_done(c), "abort mode finished everything");
    engine_request_seq(c, 0, &v);
    T_ASSERT(v.finish == FINISH_ABORT, "finish reason abort");
    EngineRequest *d = submit(e, P, 20, 5, 0.0f, 0, 1);
    engine_request_seq(d, 0, &v);
    T_ASSERT(v.n_tokens == 0 && !engine_request_done(d), "nothing runs while paused");
    engine_resume(e);
    wait_done(d);
    engine_request_seq(d, 0, &v);
    T_ASSERT(v.finish == FINISH_LENGTH && v.n_tokens == 5, "submitted while paused, ran after resume");
    /* wait: running ones finish normally, then paused */
    g_slow = 2;
    gate_arm(20, 2);
    EngineRequest *f = submit(e, P, 20, 30, 1.0f, 11, 1);
    wait_tokens(f, 2);
    gate_open();
    T_ASSERT(engine_pause(e, PAUSE_WAIT, &err) == 0, "paused (wait)");
    g_slow = 0;
    engine_request_seq(f, 0, &v);
    T_ASSERT(engine_request_done(f) && v.finish == FINISH_LENGTH && v.n_tokens == 30, "wait mode let it finish");
    engine_resume(e);
    T_ASSERT(!engine_is_paused(e), "resumed");
    wait_blocks_free(e);
    EngineRequest *all[] = { r0, a, b, c, d, f };
    for (int i = 0; i < 6; i++) engine_request_release(all[i]);
    engine_cpu_free(e);
}

/* A weight update while a sequence is frozen (PAUSE_KEEP): the K/V it keeps
 * were computed under the old weights, so its blocks must never be shared
 * under the new version. The next turn of that conversation must equal the
 * reference forward under the new weights. */
static int scale_norm(void *ctx, Err *er) {
    int64_t n = 0;
    uint16_t *w = model_tensor(g_model, "model.layers.0.post_attention_layernorm.weight", &n);
    if (!w) return ERR(er, 500, "no post_attention_layernorm weight");
    float f = *(float *)ctx;
    for (int64_t i = 0; i < n; i++) w[i] = f32_to_bf16(bf16_to_f32(w[i]) * f);
    return 0;
}

static void test_version_tagging(void) {
    int32_t P[80];
    prompt_of(P, 3, 13);
    /* blocks of 16: the frozen sequence has no full block yet when the
     * version changes, so only the kv_version check stops it from
     * registering a half-stale first block under the new version */
    Engine *e = make_engine(g_model, 64, 16, 32, 8, 1);
    Err err = { 0 };
    g_slow = 5;
    gate_arm(3, 4);
    EngineRequest *a = submit(e, P, 3, 30, 0.0f, 0, 1);
    wait_tokens(a, 4);
    gate_open();
    T_ASSERT(engine_pause(e, PAUSE_KEEP, &err) == 0, "paused");
    float f = 2.0f;
    uint64_t v0 = engine_weight_version(e);
    T_ASSERT(engine_run_exclusive(e, scale_norm, &f, 1, &err) == 0, "update: %s", err.msg);
    T_ASSERT(engine_weight_version(e) == v0 + 1, "version bumped");
    g_slow = 0;
    engine_resume(e);
    wait_done(a);
    int n = 3 + tokens_of(a, 0, P + 3);
    prompt_of(P + n, 7, 14);
    n += 7;
    EngineRequest *b = submit(e, P, n, 4, 0.0f, 0, 1);
    wait_done(b);
    EngineSeqView va;
    engine_request_seq(a, 0, &va);
    int first_new = 0;
    while (first_new < va.n_tokens && va.tokens[first_new].weight_version == v0) first_new++;
    T_ASSERT(first_new >= 4 && va.tokens[first_new].pos < 16, "update landed mid-block (pos %d)",
             va.tokens[first_new].pos);
    T_ASSERT(rows_match_reference(b, 0, P, n) == 0, "next turn after a keep-mode update used stale K/V");
    EngineSeqView v;
    engine_request_seq(b, 0, &v);
    T_ASSERT(v.tokens[0].weight_version == v0 + 1, "new version on the next turn");
    f = 0.5f; /* restore exactly: scaling a bf16 by 2 then 0.5 is exact */
    T_ASSERT(engine_run_exclusive(e, scale_norm, &f, 1, &err) == 0, "restore");
    engine_request_release(a);
    engine_request_release(b);
    engine_cpu_free(e);
}

/* n samples: forks share the prompt blocks; greedy samples are identical,
 * seeded ones follow their own streams, and every row equals the reference. */
static void test_n_samples(void) {
    int32_t P[30], g1[64], gi[64], s1[4][64], s2[4][64];
    prompt_of(P, 23, 7); /* 23 = 5 full blocks of 4 + a partial one */
    Engine *e = make_engine(g_model, 256, 4, 64, 16, 1);
    EngineRequest *g = submit(e, P, 23, 10, 0, 0, 1), *gn = submit(e, P, 23, 10, 0, 0, 4);
    wait_done(g); wait_done(gn);
    tokens_of(g, 0, g1);
    int bad = 0;
    for (int i = 0; i < 4; i++) bad += tokens_of(gn, i, gi) != 10 || memcmp(g1, gi, 40) != 0;
    T_ASSERT(bad == 0, "greedy n=4: %d samples differ from n=1", bad);
    EngineRequest *s = submit(e, P, 23, 12, 1.0f, 5, 4);
    wait_done(s);
    int distinct = 0;
    for (int i = 0; i < 4; i++) {
        tokens_of(s, i, s1[i]);
        distinct += i > 0 && memcmp(s1[i], s1[0], 48) != 0;
        T_ASSERT(rows_match_reference(s, i, P, 23) == 0, "sample %d rows differ from the reference", i);
    }
    T_ASSERT(distinct > 0, "samples of one seeded request differ from each other");
    /* its consumer is woken once a step for all four samples' tokens (engine_request_wake), once per
     * sample's end and once at the request's: 11 steps publish tokens (the first samples all four from
     * the prompt's row), the 12th ends the four samples, then the request: 11 + 4 + 1 changes. A wake
     * per token would make 4 x 11 + 4 + 1 = 49; a step whose commits woke nobody, fewer than 16. */
    uint64_t changes = 0;
    engine_request_wait(s, &changes, 0);
    T_ASSERT(changes == 11 + 4 + 1, "n=4 x 12 tokens: %llu changes published, expected 16",
             (unsigned long long)changes);
    /* same seeded request next to other traffic */
    int32_t Q[40];
    prompt_of(Q, 33, 8);
    EngineRequest *o = submit(e, Q, 33, 20, 0.5f, 3, 3);
    EngineRequest *s_again = submit(e, P, 23, 12, 1.0f, 5, 4);
    wait_done(o); wait_done(s_again);
    bad = 0;
    for (int i = 0; i < 4; i++) bad += tokens_of(s_again, i, s2[i]) != 12 || memcmp(s1[i], s2[i], 48) != 0;
    T_ASSERT(bad == 0, "seeded n=4 changed next to other traffic (%d)", bad);
    wait_blocks_free(e);
    engine_request_release(g); engine_request_release(gn); engine_request_release(s);
    engine_request_release(o); engine_request_release(s_again);
    engine_cpu_free(e);
}

/* Prompt log-probs equal log_softmax of the reference rows. Also stop ids,
 * and the record fields (mask, top-N, raw log-prob). */
static void test_outputs(void) {
    int32_t P[40];
    prompt_of(P, 30, 9);
    int V = g_model->cfg.vocab;
    Engine *e = make_engine(g_model, 256, 4, 8, 8, 1); /* budget 8: the prompt arrives in chunks */
    EngineRequestParams p;
    engine_request_params_default(&p);
    p.prompt = P;
    p.n_prompt = 30;
    p.prompt_logprobs = 3;
    p.top_logprobs = 5;
    p.want_mask = 1;
    p.want_raw_logprob = 1;
    p.sampling.max_tokens = 6;
    p.sampling.top_k = 20;
    p.sampling.seed = 1;
    p.sampling.has_seed = 1;
    p.sampling.ignore_eos = 1;
    EngineRequest *r;
    Err err = { 0 };
    T_ASSERT(engine_submit(e, &p, &r, &err) == 0, "%s", err.msg);
    wait_done(r);
    const float *lp;
    const int32_t *tid;
    const float *tlp;
    int n = engine_request_prompt_logprobs(r, &lp, &tid, &tlp);
    T_ASSERT(n == 30, "prompt log-probs published for %d positions", n);
    float *ref = malloc((size_t)30 * V * sizeof(float));
    ref_forward(g_model, P, 30, ref);
    double maxerr = 0;
    int bad_top = 0, bad_rank = 0;
    for (int i = 1; i < 30; i++) {
        const float *row = ref + (size_t)(i - 1) * V;
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < V; j++) mx = row[j] > mx ? row[j] : mx;
        for (int j = 0; j < V; j++) s += exp(row[j] - mx);
        double want = row[P[i]] - mx - log(s), d = fabs(want - lp[i]);
        if (d > maxerr) maxerr = d;
        int am = 0;
        for (int j = 1; j < V; j++) if (row[j] > row[am]) am = j;
        bad_top += tid[i * 3] != am || fabs(tlp[i * 3] - (row[am] - mx - log(s))) > 1e-5;
        /* vLLM's rank: ids whose log-prob is >= the token's, in the whole vocab
         * (bounded by the reference's counts with a margin for rounding) */
        int lo = 0, hi = 0;
        for (int j = 0; j < V; j++) { lo += row[j] > row[P[i]] + 1e-4; hi += row[j] >= row[P[i]] - 1e-4; }
        int rk = engine_request_prompt_ranks(r)[i];
        bad_rank += rk < lo || rk > hi || rk < 1;
    }
    T_ASSERT(bad_rank == 0, "%d prompt ranks outside the reference's", bad_rank);
    T_ASSERT(isnan(lp[0]) && maxerr < 1e-5, "prompt log-probs off by %g", maxerr);
    T_ASSERT(bad_top == 0, "%d prompt top-1 mismatches", bad_top);
    EngineSeqView v;
    engine_request_seq(r, 0, &v);
    int bad = 0;
    for (int k = 0; k < v.n_tokens; k++) {
        const TokenRecord *t = &v.tokens[k];
        double s = 0;
        int in = 0;
        in = engine_mask_has(t, t->token);
        for (int j = 0; j < t->n_top; j++) s += exp(t->top_logprobs[j]);
        bad += !in || t->mask_n < 20 || t->n_top != 5 || isnan(t->logprob_raw) || t->logprob > 0 ||
               t->top_logprobs == NULL || s > 1 + 1e-6;
    }
    T_ASSERT(v.n_tokens == 6 && bad == 0, "%d malformed records", bad);
    int64_t off[8];
    engine_request_mask_csr(r, 0, off, NULL);
    int32_t *ids = malloc(off[6] * sizeof(int32_t));
    engine_request_mask_csr(r, 0, off, ids);
    int32_t *kept2 = malloc((size_t)V * sizeof(int32_t));
    engine_mask_expand(&v.tokens[2], V, 0, kept2);
    T_ASSERT(off[0] == 0 && off[6] == off[5] + v.tokens[5].mask_n && ids[off[2]] == kept2[0] &&
             memcmp(ids + off[2], kept2, (size_t)v.tokens[2].mask_n * sizeof(int32_t)) == 0, "CSR masks");
    free(kept2);
    free(ids);
    free(ref);
    engine_request_release(r);
    /* stop id: greedy run, then stop at its 4th token */
    EngineRequest *g = submit(e, P, 30, 10, 0, 0, 1);
    wait_done(g);
    int32_t gt[16];
    tokens_of(g, 0, gt);
    engine_request_params_default(&p);
    p.prompt = P; p.n_prompt = 30;
    p.sampling.temperature = 0; p.sampling.max_tokens = 10; p.sampling.ignore_eos = 1;
    p.sampling.n_stop_ids = 1; p.sampling.stop_ids[0] = gt[3];
    int first = 0;
    while (gt[first] != gt[3]) first++;
    T_ASSERT(engine_submit(e, &p, &r, &err) == 0, "%s", err.msg);
    wait_done(r);
    engine_request_seq(r, 0, &v);
    T_ASSERT(v.finish == FINISH_STOP && v.stop_token == gt[3] && v.n_tokens == first + 1, "stopped at the stop id");
    engine_request_release(r);
    engine_request_release(g);
    engine_cpu_free(e);
}

/* Bad input and a full queue are clear errors, and nothing is queued. */
static void test_errors(void) {
    int32_t P[10];
    prompt_of(P, 10, 11);
    EngineConfig c;
    engine_config_default(&c);
    c.n_blocks = 64; c.block_size = 4; c.max_model_len = 64; c.max_waiting = 2; c.verbose = 0; c.n_threads = 2;
    Engine *e = engine_cpu(g_model, &c);
    Err err = { 0 };
    T_ASSERT(engine_pause(e, PAUSE_KEEP, &err) == 0, "paused");
    EngineRequest *a = submit(e, P, 10, 4, 0, 0, 1), *b = submit(e, P, 10, 4, 0, 0, 1), *x = NULL;
    EngineRequestParams p;
    engine_request_params_default(&p);
    p.prompt = P; p.n_prompt = 10;
    T_ASSERT(engine_submit(e, &p, &x, &err) < 0 && err.code == 503 && !x, "queue full -> 503");
    int32_t badp[2] = { 1, 100000 };
    p.prompt = badp; p.n_prompt = 2;
    T_ASSERT(engine_submit(e, &p, &x, &err) < 0 && err.code == 400, "token out of range -> 400");
    int32_t longp[64] = { 0 };
    p.prompt = longp; p.n_prompt = 64;
    T_ASSERT(engine_submit(e, &p, &x, &err) < 0 && err.code == 400, "too long -> 400");
    p.prompt = P; p.n_prompt = 10; p.sampling.top_p = 2;
    T_ASSERT(engine_submit(e, &p, &x, &err) < 0 && err.code == 400, "bad top_p -> 400");
    engine_resume(e);
    wait_done(a); wait_done(b);
    p.sampling.top_p = 1;
    T_ASSERT(engine_submit(e, &p, &x, &err) == 0, "queue has room again");
    wait_done(x);
    EngineMetrics m;
    engine_metrics(e, &m);
    T_ASSERT(m.requests_rejected == 4 && m.requests_submitted == 3, "rejections counted");
    engine_request_release(a); engine_request_release(b); engine_request_release(x);
    engine_cpu_free(e);
}

/* MoE router replay: recorded expert ids equal the reference forward's capture. */
static void test_experts(void) {
    Model *m = NULL;
    Err err = { 0 };
    if (model_load(&m, FIX_MOE, &err) < 0) { T_ASSERT(0, "load %s: %s", FIX_MOE, err.msg); return; }
    Engine *e = make_engine(m, 128, 4, 16, 8, 1);
    int E = engine_experts_per_token(e);
    T_ASSERT(E == 2 * 2, "2 MoE layers x top 2 (got %d)", E);
    int32_t P[24];
    prompt_of(P, 21, 12);
    EngineRequestParams p;
    engine_request_params_default(&p);
    p.prompt = P; p.n_prompt = 21; p.want_experts = 1;
    p.sampling.max_tokens = 5; p.sampling.temperature = 0; p.sampling.ignore_eos = 1;
    EngineRequest *r;
    T_ASSERT(engine_submit(e, &p, &r, &err) == 0, "%s", err.msg);
    wait_done(r);
    EngineSeqView v;
    engine_request_seq(r, 0, &v);
    const int32_t *pe;
    int np = engine_request_prompt_experts(r, &pe);
    int32_t hist[32];
    memcpy(hist, P, 21 * 4);
    for (int k = 0; k < v.n_tokens; k++) hist[21 + k] = v.tokens[k].token;
    int T = 21 + v.n_tokens - 1;
    /* reference capture over the whole history */
    Runner *rr = runner_create(m, T, T, 2);
    KVCache *kv = kvcache_create_dtype(&m->cfg, 16, 4, g_kv);
    int32_t pos[32], seq[32] = { 0 }, rows[1] = { T - 1 }, bt[16];
    for (int i = 0; i < T; i++) pos[i] = i;
    for (int i = 0; i < 16; i++) bt[i] = i;
    const int32_t *tables[1] = { bt };
    int32_t *cap = calloc((size_t)T * E, sizeof(int32_t));
    float *lg = malloc(m->cfg.vocab * sizeof(float));
    runner_set_expert_capture(rr, cap);
    Batch b = { T, hist, pos, seq, 1, tables, 1, rows, 0};
    T_ASSERT(model_forward(rr, kv, &b, lg, &err) == 0, "%s", err.msg);
    T_ASSERT(np == 20 && memcmp(pe, cap, (size_t)20 * E * 4) == 0, "prompt experts (%d positions)", np);
    int bad = 0;
    for (int k = 0; k < v.n_tokens; k++)
        bad += !v.tokens[k].experts || memcmp(v.tokens[k].experts, cap + (size_t)(20 + k) * E, E * 4) != 0;
    T_ASSERT(bad == 0, "%d generated tokens with wrong experts", bad);
    free(cap); free(lg);
    kvcache_free(kv);
    runner_free(rr);
    engine_request_release(r);
    engine_cpu_free(e);
    model_free(m);
}

/* Random traffic on a tiny pool (preemption, forks, prefix hits) with random
 * aborts and a keep-mode pause: every request finishes, non-aborted ones
 * with exactly the tokens a big pool gives, and no block stays held. */
static void test_stress(void) {
    enum { R = 40 };
    int32_t P[R][48];
    int np[R], nout[R], nseq[R], abort_it[R];
    EngineRequest *rs[R], *rb[R];
    unsigned st = 99;
    Engine *es = make_engine(g_model, 24, 4, 20, 6, 1), *eb = make_engine(g_model, 512, 4, 64, 32, 1);
    Err err = { 0 };
    for (int i = 0; i < R; i++) {
        st = st * 1103515245u + 12345u;
        np[i] = 4 + (st >> 16) % 40;
        nout[i] = 1 + (st >> 8) % 40;
        if (np[i] + nout[i] > 90) nout[i] = 90 - np[i];
        nseq[i] = 1 + (st >> 4) % 3;
        abort_it[i] = (st >> 20) % 5 == 0;
        /* shared prefixes between requests: salt from a few families */
        prompt_of(P[i], np[i], (int)((st >> 24) % 4));
        P[i][np[i] - 1] = 3 + i; /* distinct tails */
        float temp = (st >> 12) % 2 ? 0.9f : 0.0f;
        rs[i] = submit(es, P[i], np[i], nout[i], temp, 1000 + i, nseq[i]);
        rb[i] = submit(eb, P[i], np[i], nout[i], temp, 1000 + i, nseq[i]);
        if (i == R / 2) {
            T_ASSERT(engine_pause(es, PAUSE_KEEP, &err) == 0, "pause");
            engine_resume(es);
        }
        if (abort_it[i] && i % 2) engine_abort(es, rs[i]);
    }
    for (int i = 0; i < R; i++) if (abort_it[i] && !(i % 2)) engine_abort(es, rs[i]);
    int bad = 0, aborted = 0;
    for (int i = 0; i < R; i++) {
        wait_done(rs[i]); wait_done(rb[i]);
        for (int k = 0; k < nseq[i]; k++) {
            int32_t a[64], b[64];
            EngineSeqView v;
            engine_request_seq(rs[i], k, &v);
            int na = tokens_of(rs[i], k, a), nb = tokens_of(rb[i], k, b);
            if (v.finish == FINISH_ABORT) {
                aborted++;
                bad += !abort_it[i] || na > nb || memcmp(a, b, na * 4) != 0; /* a prefix of the full run */
            } else bad += v.finish != FINISH_LENGTH || na != nout[i] || nb != na || memcmp(a, b, na * 4) != 0;
        }
    }
    T_ASSERT(bad == 0, "stress: %d sequences differ from the big pool", bad);
    wait_blocks_free(es);
    wait_blocks_free(eb);
    EngineMetrics m;
    engine_metrics(es, &m);
    T_ASSERT(m.running == 0 && m.waiting == 0, "stress: nothing left running/waiting");
    printf("stress: %d aborted sequences, %llu preemptions, prefix hit %llu of %llu tokens\n", aborted,
           (unsigned long long)m.preemptions, (unsigned long long)m.prefix_cache_hits,
           (unsigned long long)m.prefix_cache_queries);
    for (int i = 0; i < R; i++) { engine_request_release(rs[i]); engine_request_release(rb[i]); }
    engine_cpu_free(es);
    engine_cpu_free(eb);
}

/* ---- control calls from many threads at once ----
 * Request threads submit, abort, release early or wait; a control thread
 * cycles through the three pause modes with exclusive sections (one failing)
 * and resumes; another runs exclusive sections without pausing. Every call
 * must return, every kept request must finish consistently, the version must
 * count exactly the successful bumping sections, and nothing may stay held.
 * Workers record problems; only the main thread asserts (T_ASSERT is not
 * thread-safe). */
enum { CTL_WORKERS = 3, CTL_REQS = 16, CTL_CYCLES = 12 };

typedef struct CtlArgs {
    Engine *e;
    int id;
    int bad;                  /* inconsistencies seen */
    int submitted, seqs;      /* requests and sequences submitted */
    int x_calls, x_ok;        /* exclusive sections called / succeeded with a bump */
} CtlArgs;

static _Atomic int g_ctl_x_runs;
static int ctl_bump(void *ctx, Err *err) { (void)ctx; (void)err; atomic_fetch_add(&g_ctl_x_runs, 1); return 0; }
static int ctl_fail(void *ctx, Err *err) {
    (void)ctx;
    atomic_fetch_add(&g_ctl_x_runs, 1);
    return ERR(err, 409, "refused on purpose");
}

/* A finished request: every sequence finished, within max_tokens, versions
 * never go back; a sequence not aborted has exactly max_tokens (ignore_eos). */
static int ctl_check(EngineRequest *r, int max_tokens) {
    int bad = !engine_request_done(r);
    for (int k = 0; k < engine_request_n_seqs(r); k++) {
        EngineSeqView v;
        engine_request_seq(r, k, &v);
        bad += v.finish == FINISH_NONE || v.n_tokens > max_tokens;
        bad += v.finish != FINISH_ABORT && (v.finish != FINISH_LENGTH || v.n_tokens != max_tokens);
        for (int i = 1; i < v.n_tokens; i++) bad += v.tokens[i].weight_version < v.tokens[i - 1].weight_version;
    }
    return bad;
}

static void *ctl_requests(void *arg) {
    CtlArgs *a = arg;
    int32_t P[24];
    for (int k = 0; k < CTL_REQS; k++) {
        int n = 6 + (a->id * 5 + k) % 17, max_tokens = 2 + (k * 3 + a->id) % 7, nseq = 1 + (k + a->id) % 3;
        prompt_of(P, n, a->id * 100 + k);
        EngineRequestParams p;
        engine_request_params_default(&p);
        p.prompt = P; p.n_prompt = n; p.n = nseq;
        p.sampling.max_tokens = max_tokens; p.sampling.temperature = 1.0f;
        p.sampling.seed = (uint64_t)(a->id * 1000 + k); p.sampling.has_seed = 1; p.sampling.ignore_eos = 1;
        EngineRequest *r = NULL;
        Err err = { 0 };
        if (engine_submit(a->e, &p, &r, &err) < 0) { a->bad++; continue; }
        a->submitted++;
        a->seqs += nseq;
        int action = (a->id * 7 + k) % 3;
        if (action == 2) { engine_request_release(r); continue; } /* consumer gone at once */
        if (action == 1) engine_abort(a->e, r);
        uint64_t seen = 0;
        for (int i = 0; i < 600 && !engine_request_done(r); i++) engine_request_wait(r, &seen, 100);
        a->bad += ctl_check(r, max_tokens);
        engine_request_release(r);
    }
    return NULL;
}

static void *ctl_pauses(void *arg) {
    CtlArgs *a = arg;
    for (int k = 0; k < CTL_CYCLES; k++) {
        Err err = { 0 };
        PauseMode mode = (PauseMode)(k % 3);
        a->bad += engine_pause(a->e, mode, &err) != 0;
        if (mode != PAUSE_WAIT) a->bad += !engine_is_paused(a->e);
        int fail = k % 4 == 3;
        int rc = engine_run_exclusive(a->e, fail ? ctl_fail : ctl_bump, NULL, 1, &err);
        a->x_calls++;
        if (fail) a->bad += rc >= 0 || err.code != 409;
        else { a->bad += rc != 0; a->x_ok++; }
        engine_resume(a->e);
    }
    return NULL;
}

static void *ctl_exclusive(void *arg) {
    CtlArgs *a = arg;
    for (int k = 0; k < CTL_CYCLES; k++) {
        Err err = { 0 };
        int bump = k % 2;
        a->bad += engine_run_exclusive(a->e, ctl_bump, NULL, bump, &err) != 0;
        a->x_calls++;
        a->x_ok += bump;
    }
    return NULL;
}

static void test_control_concurrent(void) {
    EngineConfig c;
    engine_config_default(&c);
    c.n_blocks = 48; c.block_size = 4; c.max_batched_tokens = 24; c.max_running_seqs = 6;
    c.max_model_len = 64; c.n_threads = 2; c.verbose = 0;
    Engine *e = engine_cpu(g_model, &c);
    enum { N = CTL_WORKERS + 2 };
    CtlArgs args[N];
    pthread_t th[N];
    atomic_store(&g_ctl_x_runs, 0);
    for (int i = 0; i < N; i++) {
        args[i] = (CtlArgs){ .e = e, .id = i };
        void *(*fn)(void *) = i < CTL_WORKERS ? ctl_requests : i == CTL_WORKERS ? ctl_pauses : ctl_exclusive;
        pthread_create(&th[i], NULL, fn, &args[i]);
    }
    int bad = 0, submitted = 0, seqs = 0, x_calls = 0, x_ok = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        bad += args[i].bad; submitted += args[i].submitted; seqs += args[i].seqs;
        x_calls += args[i].x_calls; x_ok += args[i].x_ok;
    }
    T_ASSERT(bad == 0, "concurrent control: %d inconsistencies", bad);
    T_ASSERT(submitted == CTL_WORKERS * CTL_REQS, "every submission accepted (%d)", submitted);
    T_ASSERT(atomic_load(&g_ctl_x_runs) == x_calls, "every exclusive section ran once (%d of %d)",
             atomic_load(&g_ctl_x_runs), x_calls);
    T_ASSERT(engine_weight_version(e) == (uint64_t)x_ok, "version %llu counts the %d successful bumps",
             (unsigned long long)engine_weight_version(e), x_ok);
    T_ASSERT(!engine_is_paused(e), "resumed at the end");
    /* released-early requests finish at the next boundary: wait for their counts */
    EngineMetrics m;
    for (int i = 0; i < 500; i++) {
        engine_metrics(e, &m);
        if (m.requests_finished_stop + m.requests_finished_length + m.requests_finished_abort == (uint64_t)seqs &&
            m.kv_blocks_used == 0)
            break;
        usleep(10000);
    }
    T_ASSERT(m.requests_finished_stop + m.requests_finished_length + m.requests_finished_abort == (uint64_t)seqs,
             "every sequence finished once (%llu of %d)",
             (unsigned long long)(m.requests_finished_stop + m.requests_finished_length + m.requests_finished_abort),
             seqs);
    T_ASSERT(m.requests_submitted == (uint64_t)submitted && m.running == 0 && m.waiting == 0 &&
             m.kv_blocks_used == 0, "nothing left: running %d waiting %d blocks %d", m.running, m.waiting,
             m.kv_blocks_used);
    engine_cpu_free(e);
}


/* ---- sampling masks: compact storage, the publish check, the output budget ---- */

/* engine_mask_pack: the kept ids at most half the vocab, the complement
 * above, a bitmap when both lists are longer than vocab / 32 words; refuses
 * a set without its token, out of order or too big. V = 320: 10 words. */
static void test_mask_pack(void) {
    enum { V = 320, W = MASK_BITMAP_WORDS(V) };
    int32_t all[V], dst[V], some[8] = { 1, 5, 9, 33, 64, 100, 200, 319 };
    int comp = -1;
    for (int i = 0; i < V; i++) all[i] = i;
    /* all but {3, 7}: the complement */
    int32_t most[V - 2];
    for (int i = 0, w = 0; i < V; i++) if (i != 3 && i != 7) most[w++] = i;
    int n = engine_mask_pack(most, V - 2, V, 5, dst, W, &comp);
    T_ASSERT(n == 2 && comp == MASK_FORM_COMPLEMENT && dst[0] == 3 && dst[1] == 7, "complement of 318 of 320: n=%d comp=%d", n, comp);
    n = engine_mask_pack(all, V, V, 0, dst, W, &comp);
    T_ASSERT(n == 0 && comp == MASK_FORM_COMPLEMENT, "the whole vocab stores no ids (n=%d comp=%d)", n, comp);
    n = engine_mask_pack(some, 8, V, 64, dst, W, &comp); /* 8 ids <= 10 words: the kept ids */
    T_ASSERT(n == 8 && comp == MASK_FORM_IDS && dst[7] == 319, "8 of 320: n=%d comp=%d", n, comp);
    n = engine_mask_pack(all, V / 2, V, 4, dst, W, &comp); /* half the vocab: 160 ids > 10 words: a bitmap */
    T_ASSERT(n == W && comp == MASK_FORM_BITMAP, "half the vocab: n=%d comp=%d", n, comp);
    /* every form reads back as the same set, kept and excluded; vocab 301: a bitmap's last word is partial */
    int32_t sizes[] = { 1, 8, 10, 11, 100, 150, 151, 160, 161, 290, 291, 300, 301, 309, 310, 311, 319, 320 };
    int bad = 0, forms[3] = { 0 };
    for (int Vr = V; Vr >= V - 19; Vr -= 19)
    for (size_t c = 0; c < sizeof sizes / sizeof sizes[0]; c++) {
        if (sizes[c] > Vr) continue;
        int32_t kept[V], got[V];
        int nk = 0, Wr = MASK_BITMAP_WORDS(Vr);
        for (int i = 0; i < Vr && nk < sizes[c]; i++) /* a spread-out set of sizes[c] ids */
            if ((i * 7919) % Vr < sizes[c] || Vr - i <= sizes[c] - nk) kept[nk++] = i;
        int len = engine_mask_pack(kept, nk, Vr, kept[0], dst, Wr, &comp);
        TokenRecord t = { 0 };
        t.mask_n = nk; t.mask_complement = comp; t.mask_len = len; t.mask_ids = dst;
        bad += len < 0 || len > Wr || comp < 0 || comp > 2;
        if (comp >= 0 && comp <= 2) forms[comp]++;
        bad += engine_mask_expand(&t, Vr, 0, got) != nk || memcmp(got, kept, (size_t)nk * sizeof(int32_t)) != 0;
        int ne = engine_mask_expand(&t, Vr, 1, got), j = 0;
        bad += ne != Vr - nk;
        for (int i = 0, k = 0; i < Vr; i++) {
            int in = k < nk && kept[k] == i;
            k += in;
            bad += engine_mask_has(&t, i) != in;
            if (!in) bad += j >= ne || got[j++] != i;
        }
    }
    T_ASSERT(forms[0] && forms[1] && forms[2], "forms seen: ids %d, complement %d, bitmap %d", forms[0], forms[1],
             forms[2]);
    T_ASSERT(bad == 0, "%d mismatches reading packed masks back", bad);
    /* a mask that does not contain its token is refused */
    T_ASSERT(engine_mask_pack(most, V - 2, V, 3, dst, W, &comp) == -1, "a mask without its token was packed");
    T_ASSERT(engine_mask_pack(some, 8, V, 7, dst, W, &comp) == -1, "a mask without its token was packed");
    T_ASSERT(engine_mask_pack(all, V / 2, V, 200, dst, W, &comp) == -1, "a bitmap mask without its token was packed");
    T_ASSERT(engine_mask_pack(all, 0, V, 0, dst, W, &comp) == -1, "an empty mask was packed");
    int32_t bad_order[3] = { 2, 1, 5 }, out_of[2] = { 1, V };
    T_ASSERT(engine_mask_pack(bad_order, 3, V, 1, dst, W, &comp) == -1, "an unordered mask was packed");
    T_ASSERT(engine_mask_pack(out_of, 2, V, 1, dst, W, &comp) == -1, "an out-of-range mask was packed");
    T_ASSERT(engine_mask_pack(all, 3, V, 1, dst, 2, &comp) == -1, "a mask over its room was packed");
    T_ASSERT(engine_mask_pack(all, 200, V, 1, dst, W - 1, &comp) == -1, "a bitmap over its room was packed");
}

/* The mask tap: records every kept set it sees (by token order of one
 * sequence: the tests below run one sequence at a time), and when armed
 * drops the sampled token from the set at the given call. */
static pthread_mutex_t g_mask_mu = PTHREAD_MUTEX_INITIALIZER;
static int32_t *g_mask_seen;   /* [cap_calls, vocab] */
static int32_t g_mask_seen_n[256];
static int g_mask_calls, g_mask_evil_at = -1;

static void mask_tap(void *ctx, int32_t token, int32_t *kept, int32_t *n_kept) {
    (void)ctx;
    int V = g_model->cfg.vocab;
    pthread_mutex_lock(&g_mask_mu);
    int k = g_mask_calls++;
    if (k < 256 && g_mask_seen) {
        memcpy(g_mask_seen + (size_t)k * V, kept, (size_t)*n_kept * sizeof(int32_t));
        g_mask_seen_n[k] = *n_kept;
    }
    if (k == g_mask_evil_at) { /* remove the token: this mask would be wrong */
        int w = 0;
        for (int i = 0; i < *n_kept; i++) if (kept[i] != token) kept[w++] = kept[i];
        *n_kept = w;
    }
    pthread_mutex_unlock(&g_mask_mu);
}

/* wait_done for requests with many records (each record may wake the
 * waiter once): polls until done; the deadline only turns a hang into a
 * failed assertion. */
static void wait_done_all(EngineRequest *r) {
    uint64_t seen = 0;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        engine_request_wait(r, &seen, 100);
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while (!engine_request_done(r) && t.tv_sec - t0.tv_sec < GATE_DEADLINE_S);
    T_ASSERT(engine_request_done(r), "request %llu did not finish", (unsigned long long)engine_request_id(r));
}

static Engine *make_mask_engine(size_t req_mb, size_t all_mb) {
    EngineConfig c;
    engine_config_default(&c);
    c.n_blocks = 64;
    c.block_size = 8;
    c.max_model_len = 256;
    c.n_threads = 1; /* one sampling thread: the tap sees the sequence's tokens in order */
    c.verbose = 0;
    c.mask_tap = mask_tap;
    c.max_request_output_mb = req_mb;
    c.max_output_mem_mb = all_mb;
    return engine_cpu(g_model, &c);
}

static void mask_params(EngineRequestParams *p, const int32_t *P, int np, int n, int max_tokens, int top_k) {
    engine_request_params_default(p);
    p->prompt = P;
    p->n_prompt = np;
    p->n = n;
    p->want_mask = 1;
    p->sampling.max_tokens = max_tokens;
    p->sampling.temperature = 1.0f;
    p->sampling.top_k = top_k;
    p->sampling.seed = 5;
    p->sampling.has_seed = 1;
    p->sampling.ignore_eos = 1;
}

/* Untruncated sampling stores the complement (no ids for the whole vocab);
 * top_k 400 of 512 a bitmap (112 excluded ids > 16 words); decoded CSR equals the kept set the sampler produced,
 * and every published mask contains its token. */
static void test_mask_complement_storage(void) {
    int V = g_model->cfg.vocab;
    int32_t P[16];
    prompt_of(P, 12, 21);
    Engine *e = make_mask_engine(64, 64);
    g_mask_seen = malloc((size_t)256 * V * sizeof(int32_t));
    for (int top_k = 0; top_k <= 400; top_k += 400) { /* 400 of 512: more than half, a real complement */
        pthread_mutex_lock(&g_mask_mu);
        g_mask_calls = 0;
        g_mask_evil_at = -1;
        pthread_mutex_unlock(&g_mask_mu);
        EngineRequestParams p;
        mask_params(&p, P, 12, 1, 20, top_k);
        EngineRequest *r;
        Err err = { 0 };
        T_ASSERT(engine_submit(e, &p, &r, &err) == 0, "%s", err.msg);
        wait_done(r);
        T_ASSERT(!engine_request_failed(r, &err), "a correct request failed: %s", err.msg);
        EngineSeqView v;
        engine_request_seq(r, 0, &v);
        int64_t off[32];
        engine_request_mask_csr(r, 0, off, NULL);
        int32_t *ids = malloc((size_t)(off[v.n_tokens] + 1) * sizeof(int32_t));
        engine_request_mask_csr(r, 0, off, ids);
        int bad = 0, comp = 0, stored = 0;
        for (int k = 0; k < v.n_tokens; k++) {
            const TokenRecord *t = &v.tokens[k];
            comp += t->mask_complement != MASK_FORM_IDS;
            stored += t->mask_len;
            int n = (int)(off[k + 1] - off[k]), in = 0;
            bad += n != g_mask_seen_n[k] || n != t->mask_n ||
                   memcmp(ids + off[k], g_mask_seen + (size_t)k * V, (size_t)n * sizeof(int32_t)) != 0;
            bad += t->mask_len != (t->mask_complement == MASK_FORM_BITMAP ? MASK_BITMAP_WORDS(V)
                                   : t->mask_complement ? V - t->mask_n : t->mask_n);
            for (int j = 0; j < n; j++) in |= ids[off[k] + j] == t->token;
            bad += !in;
        }
        T_ASSERT(v.n_tokens == 20 && g_mask_calls == 20 && bad == 0,
                 "top_k=%d: %d of %d decoded masks differ from the kept sets", top_k, bad, v.n_tokens);
        if (top_k == 0)
            T_ASSERT(comp == 20 && stored == 0, "untruncated: %d complemented, %d ids stored (want 20, 0)", comp,
                     stored);
        else
            T_ASSERT(comp == 20 && stored == 20 * MASK_BITMAP_WORDS(V), /* 112 excluded ids > 16 words */
                     "top_k 400: %d not as ids, %d int32s stored (want 20 bitmaps)", comp, stored);
        free(ids);
        engine_request_release(r);
    }
    free(g_mask_seen);
    g_mask_seen = NULL;
    engine_cpu_free(e);
}

/* A mask that would not contain its token is never published: the request
 * fails (engine_request_failed, 500) and every published record is right. */
static void test_mask_publish_check(void) {
    int32_t P[16];
    prompt_of(P, 12, 22);
    Engine *e = make_mask_engine(64, 64);
    pthread_mutex_lock(&g_mask_mu);
    g_mask_calls = 0;
    g_mask_evil_at = 5;
    pthread_mutex_unlock(&g_mask_mu);
    EngineRequestParams p;
    mask_params(&p, P, 12, 1, 20, 50);
    EngineRequest *r;
    Err err = { 0 };
    T_ASSERT(engine_submit(e, &p, &r, &err) == 0, "%s", err.msg);
    wait_done(r);
    Err f = { 0 };
    T_ASSERT(engine_request_failed(r, &f) && f.code == 500 && strstr(f.msg, "did not contain the sampled token"),
             "a wrong mask did not fail its request (code %d: %s)", f.code, f.msg);
    EngineSeqView v;
    engine_request_seq(r, 0, &v);
    int bad = 0;
    for (int k = 0; k < v.n_tokens; k++) {
        bad += !v.tokens[k].mask_ids || v.tokens[k].mask_n != 50 || !engine_mask_has(&v.tokens[k], v.tokens[k].token);
    }
    T_ASSERT(v.n_tokens == 5 && v.finish == FINISH_ABORT && bad == 0,
             "published %d records (want the 5 before the wrong one), finish %d, %d bad", v.n_tokens, v.finish, bad);
    engine_request_release(r);
    pthread_mutex_lock(&g_mask_mu);
    g_mask_evil_at = -1;
    pthread_mutex_unlock(&g_mask_mu);
    /* the engine keeps serving */
    mask_params(&p, P, 12, 2, 8, 0);
    T_ASSERT(engine_submit(e, &p, &r, &err) == 0, "%s", err.msg);
    wait_done(r);
    T_ASSERT(!engine_request_failed(r, NULL), "the next request failed too");
    engine_request_release(r);
    engine_cpu_free(e);
}

/* The output budget: over the per-request budget -> 400 naming what to
 * lower; over the global one next to requests in flight -> 503; the
 * reservation comes back when the request is freed. */
static void test_output_budget(void) {
    int V = g_model->cfg.vocab;
    int32_t P[16];
    prompt_of(P, 12, 23);
    Engine *e = make_mask_engine(1, 2);
    EngineRequestParams p;
    /* 40 x 200 tokens x (a 16-word bitmap + the record) = 1.3 MB > 1 MB */
    mask_params(&p, P, 12, 40, 200, 0);
    size_t want = engine_request_output_bytes(e, &p);
    T_ASSERT(want >= (size_t)40 * 200 * MASK_BITMAP_WORDS(V) * 4 && want > (1u << 20),
             "formula: %zu bytes for 40 x 200 masks", want);
    EngineRequest *r = NULL;
    Err err = { 0 };
    T_ASSERT(engine_submit(e, &p, &r, &err) < 0 && err.code == 400 && r == NULL &&
             strstr(err.msg, "--max-request-output-mb") && strstr(err.msg, "lower n (40), max_tokens (200)") &&
             strstr(err.msg, "return_sampling_mask"),
             "over the per-request budget: code %d: %s", err.code, err.msg);
    /* greedy masks are one id: the same shape fits */
    p.sampling.temperature = 0;
    T_ASSERT(engine_request_output_bytes(e, &p) <= want - (size_t)40 * 200 * (MASK_BITMAP_WORDS(V) - 1) * 4,
             "greedy masks are reserved as one id each");
    /* prompt log-probs count too */
    mask_params(&p, P, 12, 1, 4, 0);
    p.want_mask = 0;
    size_t base = engine_request_output_bytes(e, &p);
    p.prompt_logprobs = 20;
    T_ASSERT(engine_request_output_bytes(e, &p) == base + 12 * (8 + 8 * 20), "prompt log-probs (and ranks) in the formula");
    p.extra_output_bytes = 3u << 20;
    err = (Err){ 0 };
    T_ASSERT(engine_submit(e, &p, &r, &err) < 0 && err.code == 400 && strstr(err.msg, "prompt_logprobs/echo (20)"),
             "rendering bytes over the budget: code %d: %s", err.code, err.msg);
    /* the global budget: two requests of ~0.8 MB each fit 2 MB, a third does not while they are held */
    mask_params(&p, P, 12, 24, 200, 0);
    size_t one = engine_request_output_bytes(e, &p);
    T_ASSERT(one > (3u << 20) / 4 && one < (1u << 20), "test setup: %zu bytes", one);
    T_ASSERT(engine_pause(e, PAUSE_KEEP, &err) == 0, "%s", err.msg);
    EngineRequest *a = NULL, *b = NULL, *c = NULL;
    T_ASSERT(engine_submit(e, &p, &a, &err) == 0, "%s", err.msg);
    T_ASSERT(engine_submit(e, &p, &b, &err) == 0, "%s", err.msg);
    err = (Err){ 0 };
    T_ASSERT(engine_submit(e, &p, &c, &err) < 0 && err.code == 503 && c == NULL &&
             strstr(err.msg, "--max-output-mem-mb") && strstr(err.msg, "retry later"),
             "over the global budget: code %d: %s", err.code, err.msg);
    engine_resume(e);
    wait_done_all(a);
    engine_request_release(a);
    wait_done_all(b);
    /* a's reservation comes back once the engine let go of it too */
    int rc = -1;
    for (int i = 0; i < 600 && rc < 0; i++) {
        rc = engine_submit(e, &p, &c, &err);
        if (rc < 0) usleep(10000);
    }
    T_ASSERT(rc == 0, "the budget did not come back: %s", err.msg);
    wait_done_all(c);
    int bad = 0;
    for (int s = 0; s < 4; s++) {
        EngineSeqView v;
        engine_request_seq(c, s, &v);
        for (int k = 0; k < v.n_tokens; k++) bad += !v.tokens[k].mask_ids || !v.tokens[k].mask_complement;
        bad += v.n_tokens != 200;
    }
    T_ASSERT(bad == 0, "%d bad records in a request that fit the budget", bad);
    engine_request_release(b);
    engine_request_release(c);
    engine_cpu_free(e);
}

/* Row shares (scheduler.h step 0) change only when rows are computed, never
 * what: the same requests (n = 6 with masks, prompt log-probs of a chunked
 * prompt, plain decodes) under max_step_rows = 1 - one logits row a step, so
 * every prefill is cut before its last token and siblings take turns - and
 * under the default give the same tokens, masks, prompt log-probs, and rows
 * equal to the reference forward. */
static void test_row_shares(void) {
    enum { NR = 4 };
    int32_t P[NR][40], t1[64], t2[64];
    int np[NR] = { 21, 30, 9, 14 };
    EngineRequest *r[2][NR];
    Engine *es[2];
    for (int k = 0; k < 2; k++) {
        EngineConfig c;
        engine_config_default(&c);
        c.n_blocks = 256; c.block_size = 4; c.max_batched_tokens = 16; c.max_running_seqs = 16;
        c.max_model_len = 128; c.n_threads = 2; c.verbose = 0; c.logits_tap = tap;
        c.max_step_rows = k == 0 ? 1 : 0;
        Engine *e = es[k] = engine_cpu(g_model, &c);
        for (int i = 0; i < NR; i++) {
            prompt_of(P[i], np[i], 40 + i);
            EngineRequestParams p;
            engine_request_params_default(&p);
            p.prompt = P[i];
            p.n_prompt = np[i];
            p.n = i == 0 ? 6 : 1;
            p.want_mask = i == 0;
            p.prompt_logprobs = i == 1 ? 2 : -1;
            p.sampling.max_tokens = 7;
            p.sampling.temperature = 1.0f;
            p.sampling.seed = 11 + i;
            p.sampling.has_seed = 1;
            p.sampling.ignore_eos = 1;
            Err err = { 0 };
            T_ASSERT(engine_submit(e, &p, &r[k][i], &err) == 0, "submit: %s", err.msg);
        }
        for (int i = 0; i < NR; i++) wait_done(r[k][i]);
        for (int j = 0; j < 6; j++)
            T_ASSERT(rows_match_reference(r[k][0], j, P[0], np[0]) == 0, "max_step_rows %d: sample %d rows differ "
                     "from the reference", c.max_step_rows, j);
        wait_blocks_free(e);
    }
    int bad = 0;
    for (int i = 0; i < NR; i++)
        for (int j = 0; j < (i == 0 ? 6 : 1); j++) {
            int n1 = tokens_of(r[0][i], j, t1), n2 = tokens_of(r[1][i], j, t2);
            bad += n1 != 7 || n2 != 7 || memcmp(t1, t2, 7 * sizeof(int32_t)) != 0;
        }
    T_ASSERT(bad == 0, "%d sequences differ between one row a step and the default", bad);
    int V = g_model->cfg.vocab;
    int32_t *ids1 = malloc((size_t)7 * V * sizeof(int32_t)), *ids2 = malloc((size_t)7 * V * sizeof(int32_t));
    for (int j = 0; j < 6; j++) {
        int64_t o1[8], o2[8];
        T_ASSERT(engine_request_mask_csr(r[0][0], j, o1, NULL) == 7 && engine_request_mask_csr(r[1][0], j, o2, NULL) == 7,
                 "masks of 7 tokens");
        int same = memcmp(o1, o2, sizeof o1) == 0 && o1[7] > 0 && o1[7] <= 7 * V;
        if (same) {
            engine_request_mask_csr(r[0][0], j, o1, ids1);
            engine_request_mask_csr(r[1][0], j, o2, ids2);
            same = memcmp(ids1, ids2, (size_t)o1[7] * sizeof(int32_t)) == 0;
        }
        T_ASSERT(same, "sample %d: masks differ between one row a step and the default", j);
    }
    free(ids1);
    free(ids2);
    const float *lp1, *lp2, *tl1, *tl2;
    const int32_t *ti1, *ti2;
    int m1 = engine_request_prompt_logprobs(r[0][1], &lp1, &ti1, &tl1);
    int m2 = engine_request_prompt_logprobs(r[1][1], &lp2, &ti2, &tl2);
    T_ASSERT(m1 == 30 && m2 == 30 && memcmp(lp1 + 1, lp2 + 1, 29 * sizeof(float)) == 0 &&
             memcmp(ti1 + 2, ti2 + 2, 29 * 2 * sizeof(int32_t)) == 0,
             "prompt log-probs differ between one row a step and the default (%d, %d positions)", m1, m2);
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < NR; i++) engine_request_release(r[k][i]);
        engine_cpu_free(es[k]);
    }
}

/* The step-phase times (EngineMetrics.step_times, /metrics sampler_step_*):
 * they move with the steps, the forward is inside the step, and the phases of
 * a step add up to at most its wall time (all read on one monotonic clock).
 * The poll's deadline only turns a hang into a failure. */
static void test_step_times(void) {
    int32_t P[24];
    prompt_of(P, 21, 7);
    Engine *e = make_engine(g_model, 64, 16, 64, 8, 0);
    EngineRequest *r = submit(e, P, 21, 12, 1.0f, 5, 2);
    wait_done(r);
    EngineMetrics m;
    for (int i = 0; i < 6000; i++) {
        engine_metrics(e, &m);
        if (m.step_times.publish > 0) break; /* the last step's phases are in */
        usleep(1000);
    }
    const EngineStepTimes *st = &m.step_times;
    T_ASSERT(m.steps >= 1 && st->step > 0 && st->forward > 0 && st->sample > 0 && st->publish > 0,
             "steps %llu, step %g forward %g sample %g publish %g s", (unsigned long long)m.steps, st->step,
             st->forward, st->sample, st->publish);
    double parts = st->schedule + st->forward + st->sample + st->publish;
    T_ASSERT(st->schedule >= 0 && st->control >= 0 && parts <= st->step * (1 + 1e-9) + 1e-9,
             "phases %g (schedule %g) exceed the step %g", parts, st->schedule, st->step);
    engine_request_release(r);
    engine_cpu_free(e);
}

/* --kv-mem-mb -> blocks at each KV dtype: K and V of every layer at the
 * element size, plus FP8's f32 scale per (position, kv head); auto is BF16. */
static void test_kv_pool_sizing(void) {
    const ModelConfig *mc = &g_model->cfg;
    int dts[] = { ENGINE_KV_AUTO, KV_F32, KV_BF16, KV_FP8 };
    size_t elem[] = { 2, 4, 2, 1 };
    for (int i = 0; i < 4; i++) {
        EngineConfig c;
        engine_config_default(&c);
        c.kv_mem_mb = 3;
        c.kv_cache_dtype = dts[i];
        engine_config_resolve(&c, mc);
        size_t per_pos = 2 * (size_t)mc->n_kv_heads * (elem[i] * mc->head_dim + (dts[i] == KV_FP8 ? 4 : 0));
        size_t want = (3u << 20) / ((size_t)mc->n_layers * c.block_size * per_pos);
        T_ASSERT(c.n_blocks == (int)want && c.kv_cache_dtype == (dts[i] == ENGINE_KV_AUTO ? KV_BF16 : dts[i]),
                 "dtype %d: %d blocks, want %zu", dts[i], c.n_blocks, want);
    }
}

int main(void) {
    Err err = { 0 };
    if (model_load(&g_model, FIX, &err) < 0) {
        fprintf(stderr, "cannot load %s: %s\n", FIX, err.msg);
        return 1;
    }
    test_kv_pool_sizing();
    test_batch_invariance();
    test_prefix_cache();
    test_cache_salt();
    test_preemption();
    test_abort();
    test_pause();
    test_n_samples();
    test_version_tagging();
    test_outputs();
    test_errors();
    test_experts();
    test_stress();
    test_control_concurrent();
    test_mask_pack();
    test_mask_complement_storage();
    test_mask_publish_check();
    test_output_budget();
    test_row_shares();
    test_step_times();
    /* batch invariance, prefix-cache hits (block copies) and preemption at the other KV dtypes */
    KvDtype others[] = { KV_F32, KV_FP8 };
    for (int i = 0; i < 2; i++) {
        g_kv = others[i];
        fprintf(stderr, "-- KV cache dtype %s\n", kv_dtype_name(g_kv));
        test_batch_invariance();
        test_prefix_cache();
        test_preemption();
        test_experts();
    }
    model_free(g_model);
    for (int i = 0; i < g_n_rows; i++) free(g_rows[i].row);
    free(g_rows);
    return T_DONE();
}
