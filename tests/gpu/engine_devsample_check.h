/*
 * engine_devsample_check.h - the engine sampling on the device end to end
 * (EngineConfig.device_sampling, engine_step.c, runner_backend.c), for both
 * runners: tests/gpu/emu/emu_check.cpp (the CPU emulation of CUDA) and
 * tests/gpu/gpu_check.c (a GPU). A fixture model on backend_cuda serves the
 * same seeded requests twice, with device sampling on and off (submitted
 * while paused, so both runs batch the same steps and get the same logits
 * from the same device forward: the host path is the reference):
 * every sequence must get the same tokens and kept sets, the log-probs, raw
 * log-probs, values and top-N within 1e-5, the same ranks; the device run
 * must have sampled on the device (EngineMetrics.device_sampled_tokens) with
 * no fallback, the host run never. One request asks for prompt log-probs: its
 * prefill step samples on the host by design (the logits are fetched), the
 * decode steps after it on the device.
 * The device runs twice, with async scheduling (engine_step.c: a step
 * launched before the previous step's tokens reach the host) and without:
 * both must equal the host run, and only the async one must have overlapped
 * steps (EngineMetrics.async_steps). One request (n = 2) ends on a stop id,
 * so async steps compute rows of sequences that ended meanwhile (forgotten,
 * never recorded); the finish reasons must match too. At most 8 sequences,
 * all admitted in the first step, so no step's batch depends on when a
 * sequence's end is seen (the GPU path is not batch invariant beyond 8
 * tokens). Then, async only: a request released after its first token (an
 * abort while its next step is in flight), and one after it that must still
 * finish cleanly.
 * The device time of the steps sampled on the device (Backend.device_seconds,
 * CUDA events from each step's first op to its sampled results, through
 * runner_backend_count_device's counter as the server's /metrics reads it):
 * more than 0 and at most the run's wall time on the device runs (sync and
 * async), 0 on the host run.
 * engine_experts_check: routed experts captured by steps left in flight
 * (its own header below).
 * The includer provides n_pass / n_fail (op_checks.h).
 */
#ifndef SAMPLER_ENGINE_DEVSAMPLE_CHECK_H
#define SAMPLER_ENGINE_DEVSAMPLE_CHECK_H

#ifdef __cplusplus
extern "C" {
#include "engine.h"
/* runner_backend.h's counters are C11 atomics, which C++ does not spell the
 * same way: the two functions as C declares them (pointers either way). */
EngineBackend runner_backend_create(Model *m, Runner *r, EngineConfig *cfg, void *ns, void *calls, void *graphs);
void runner_backend_free(EngineBackend *be);
void runner_backend_count_device(EngineBackend *be, void *device_ns);
}
#include <atomic>
typedef std::atomic<unsigned long long> EdsCounter;
#else
#include "engine.h"
#include "runner_backend.h"
typedef atomic_ullong EdsCounter;
#endif
#include <time.h>

static double eds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Wait for r to finish (a generous deadline, 30 min: the emulation under a sanitizer on a loaded machine
 * is slow): 0 when it finished cleanly, else -1 with a FAIL line naming request k. */
static int eds_wait_clean(EngineRequest *r, int k) {
    Err err = {0};
    uint64_t seen = 0;
    for (int i = 0; i < 18000 && !engine_request_done(r); i++) engine_request_wait(r, &seen, 100);
    if (engine_request_done(r) && !engine_request_failed(r, &err)) return 0;
    printf("  FAIL request %d did not finish cleanly\n", k);
    return -1;
}

#define EDS_REQS 6
#define EDS_MAX_TOK 8

/* What one sequence produced, copied out before its request is released. */
typedef struct EdsSeq {
    int n;
    int32_t tok[EDS_MAX_TOK], mask_n[EDS_MAX_TOK], mask_comp[EDS_MAX_TOK], mask_len[EDS_MAX_TOK];
    float lp[EDS_MAX_TOK], raw[EDS_MAX_TOK], val[EDS_MAX_TOK], top_lp[EDS_MAX_TOK][5];
    int32_t rank[EDS_MAX_TOK], top_ids[EDS_MAX_TOK][5];
    uint64_t mask_hash[EDS_MAX_TOK];
    int finish, stop_token;
} EdsSeq;

static void eds_params(EngineRequestParams *p, int k, const int32_t *prompt, int n_prompt) {
    static int32_t bias_ids[2] = {7, 11};
    static float bias[2] = {2.5f, -INFINITY};
    static int32_t allowed[6] = {3, 5, 7, 11, 13, 17};
    engine_request_params_default(p);
    p->prompt = prompt;
    p->n_prompt = n_prompt;
    /* EMU_QUICK (sanitizers: one OS thread per emulated CUDA thread) generates half the tokens */
    p->sampling.max_tokens = getenv("EMU_QUICK") ? EDS_MAX_TOK / 2 : EDS_MAX_TOK;
    p->sampling.ignore_eos = 1;
    p->sampling.has_seed = 1;
    p->sampling.seed = 1000 + (uint64_t)k;
    switch (k) {
    case 0: /* greedy with every reported value */
        p->sampling.temperature = 0;
        p->top_logprobs = 5;
        p->want_raw_logprob = 1;
        p->want_logprob_value = 1;
        p->want_mask = 1;
        break;
    case 1: /* n = 2, truncation and penalties, masks */
        p->n = 2;
        p->sampling.temperature = 0.8f;
        p->sampling.top_p = 0.9f;
        p->sampling.top_k = 40;
        p->sampling.repetition_penalty = 1.2f;
        p->sampling.frequency_penalty = 0.3f;
        p->sampling.presence_penalty = 0.2f;
        p->want_mask = 1;
        p->want_raw_logprob = 1;
        break;
    case 2: /* min_p, logit_bias, min_tokens with stop ids, processed values */
        p->sampling.temperature = 1.2f;
        p->sampling.min_p = 0.05f;
        p->sampling.n_logit_bias = 2;
        p->sampling.logit_bias_ids = bias_ids;
        p->sampling.logit_bias = bias;
        p->sampling.min_tokens = 4;
        p->sampling.n_stop_ids = 1;
        p->sampling.stop_ids[0] = 9;
        p->logprobs_mode = LOGPROBS_PROCESSED;
        p->want_logprob_value = 1;
        p->top_logprobs = 5;
        p->want_mask = 1;
        break;
    case 3: /* allowed_token_ids, sampled mode */
        p->sampling.temperature = 1.0f;
        p->sampling.n_allowed = 6;
        p->sampling.allowed_ids = allowed;
        p->logprobs_mode = LOGPROBS_SAMPLED;
        p->top_logprobs = 3;
        p->want_mask = 1;
        break;
    case 5: /* n = 2 over 6 allowed ids, one of them a stop id: ends early (seed fixed: it does) */
        p->n = 2;
        p->sampling.temperature = 1.0f;
        p->sampling.n_allowed = 6;
        p->sampling.allowed_ids = allowed;
        p->sampling.n_stop_ids = 1;
        p->sampling.stop_ids[0] = 5;
        p->want_mask = 1;
        p->want_raw_logprob = 1;
        break;
    default: /* prompt log-probs: its prefill step samples on the host */
        p->sampling.temperature = 0.9f;
        p->prompt_logprobs = 2;
        p->want_raw_logprob = 1;
        break;
    }
}

static uint64_t eds_hash(const int32_t *ids, int n) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) h = (h ^ (uint64_t)(uint32_t)ids[i]) * 1099511628211ull;
    return h;
}

/* Serve the requests with device sampling `mode` and async scheduling `async`;
 * seqs [EDS_REQS][2]. extra: then the abort case of the header. */
/* The graph use of the last eds_run: steps captured or replayed as whole-step graphs, as piecewise graphs. */
static uint64_t eds_graph_steps, eds_piece_steps;

/* The checks' engine: dir's model on backend_cuda, 8 sequences of up to 64 tokens, steps of
 * max_batched tokens, device sampling `mode`, async scheduling `async`. 0, or -1 (printed). */
static int eds_open(const char *dir, int mode, int async, int max_batched, Model **m, Runner **r, EngineConfig *c,
                    EngineBackend *be) {
    Err err = {0};
    *m = NULL;
    if (model_load(m, dir, &err)) { printf("  FAIL %s: %s\n", dir, err.msg); return -1; }
    engine_config_default(c);
    c->max_running_seqs = 8;
    c->max_batched_tokens = max_batched;
    c->max_model_len = 64;
    c->n_blocks = 64;
    c->block_size = 4;
    c->n_threads = 2;
    c->verbose = 0;
    c->device_sampling = mode;
    c->async_scheduling = async;
    Backend *gb = backend_cuda_create(&(*m)->weights, (*m)->cfg.head_dim, c->max_model_len);
    *r = runner_create_with(*m, gb, c->max_batched_tokens, c->max_model_len);
    *be = runner_backend_create(*m, *r, c, NULL, NULL, NULL);
    return 0;
}

static int eds_run(const char *dir, int mode, int async, int extra, EdsSeq seqs[][2], EngineMetrics *met) {
    Err err = {0};
    Model *m;
    Runner *r;
    EngineConfig c;
    EngineBackend be;
    if (eds_open(dir, mode, async, 64, &m, &r, &c, &be)) return -1;
    static EdsCounter dev_ns;
    dev_ns = 0;
    runner_backend_count_device(&be, &dev_ns);
    double t_run = eds_now();
    Engine *e = engine_create(&m->cfg, &be, &c);
    {   /* the automatic row budget: every running sequence under device sampling, the host's otherwise */
        const EngineConfig *ec = engine_config(e);
        int all = c.max_running_seqs + ec->max_prompt_logprob_rows, host = 32 < all ? 32 : all; /* 4 a thread, at least 32 */
        int want = mode == ENGINE_DEVSAMPLE_OFF ? host : all, ok = ec->max_step_rows == want;
        ok ? n_pass++ : n_fail++;
        printf("  %-4s engine %s: automatic max_step_rows %d (want %d)\n", ok ? "ok" : "FAIL",
               mode == ENGINE_DEVSAMPLE_OFF ? "sampling on the host" : "sampling on the device", ec->max_step_rows,
               want);
    }
    static int32_t prompts[EDS_REQS][12];
    EngineRequest *req[EDS_REQS];
    int rc = 0;
    /* submitted while paused, so both runs batch the same steps: the GPU path is
     * not batch invariant (GEMV up to 8 tokens, GEMM beyond), the step
     * composition must not depend on timing */
    if (engine_pause(e, PAUSE_KEEP, &err)) { printf("  FAIL pause: %s\n", err.msg); rc = -1; }
    for (int k = 0; k < EDS_REQS; k++) {
        for (int i = 0; i < 12; i++) prompts[k][i] = (int32_t)(3 + (i * 37 + k * 101) % (m->cfg.vocab - 3));
        EngineRequestParams p;
        eds_params(&p, k, prompts[k], 6 + k);
        if (engine_submit(e, &p, &req[k], &err)) { printf("  FAIL submit %d: %s\n", k, err.msg); rc = -1; req[k] = NULL; }
    }
    engine_resume(e);
    for (int k = 0; k < EDS_REQS; k++) {
        if (!req[k]) continue;
        if (eds_wait_clean(req[k], k)) rc = -1;
        for (int q = 0; q < engine_request_n_seqs(req[k]) && q < 2; q++) {
            EngineSeqView v;
            engine_request_seq(req[k], q, &v);
            EdsSeq *o = &seqs[k][q];
            o->finish = (int)v.finish;
            o->stop_token = v.stop_token;
            o->n = v.n_tokens < EDS_MAX_TOK ? v.n_tokens : EDS_MAX_TOK;
            for (int t = 0; t < o->n; t++) {
                const TokenRecord *rec = &v.tokens[t];
                o->tok[t] = rec->token;
                o->lp[t] = rec->logprob;
                o->raw[t] = rec->logprob_raw;
                o->val[t] = rec->value;
                o->rank[t] = rec->rank;
                o->mask_n[t] = rec->mask_n;
                o->mask_comp[t] = rec->mask_complement;
                o->mask_len[t] = rec->mask_len;
                o->mask_hash[t] = rec->mask_ids ? eds_hash(rec->mask_ids, rec->mask_len) : 0;
                for (int j = 0; j < rec->n_top && j < 5; j++) {
                    o->top_ids[t][j] = rec->top_ids[j];
                    o->top_lp[t][j] = rec->top_logprobs[j];
                }
            }
        }
        engine_request_release(req[k]);
    }
    if (extra) { /* released after its first token: aborted with its next step in flight */
        EngineRequestParams p;
        EngineRequest *x = NULL, *y = NULL;
        eds_params(&p, 3, prompts[0], 6);
        p.sampling.max_tokens = 40;
        int ok = engine_submit(e, &p, &x, &err) == 0;
        uint64_t seen = 0;
        for (int i = 0; ok && i < 18000; i++) {
            EngineSeqView v;
            engine_request_seq(x, 0, &v);
            if (v.n_tokens >= 1 || engine_request_done(x)) break;
            engine_request_wait(x, &seen, 100);
        }
        if (x) engine_request_release(x);
        eds_params(&p, 0, prompts[1], 7);
        ok &= engine_submit(e, &p, &y, &err) == 0;
        seen = 0;
        for (int i = 0; ok && i < 18000 && !engine_request_done(y); i++) engine_request_wait(y, &seen, 100);
        ok &= y && engine_request_done(y) && !engine_request_failed(y, &err);
        if (y) {
            EngineSeqView v;
            engine_request_seq(y, 0, &v);
            ok &= v.n_tokens == p.sampling.max_tokens && v.finish == FINISH_LENGTH;
            engine_request_release(y);
        }
        /* sequences ending on a stop id (2 of the 4 ids they may take; every one of them must) while a prompt log-prob request's prefill, a
         * step that needs the host, is planned once they decode: the step in flight ends before that
         * forward, and what ended in it leaves the planned batch (scheduler_drop_finished) */
        static const int32_t four[4] = {5, 7, 11, 13};
        EngineRequest *sr[3] = {NULL, NULL, NULL}, *pr = NULL;
        for (int k = 0; k < 3 && ok; k++) {
            eds_params(&p, 5, prompts[2 + k], 6 + k);
            p.sampling.allowed_ids = four;
            p.sampling.n_allowed = 4;
            p.sampling.n_stop_ids = 2; /* 5 (eds_params) and 7: with 5 alone these seeds ran 4 of the 6 to 40 */
            p.sampling.stop_ids[1] = 7;
            p.sampling.max_tokens = 40;
            ok &= engine_submit(e, &p, &sr[k], &err) == 0;
        }
        seen = 0;
        for (int i = 0; ok && i < 18000; i++) {
            EngineSeqView v;
            engine_request_seq(sr[0], 0, &v);
            if (v.n_tokens >= 2 || engine_request_done(sr[0])) break;
            engine_request_wait(sr[0], &seen, 100);
        }
        eds_params(&p, 4, prompts[1], 9);
        p.sampling.max_tokens = 2;
        ok &= engine_submit(e, &p, &pr, &err) == 0;
        EngineRequest *all[4] = {sr[0], sr[1], sr[2], pr};
        for (int k = 0; k < 4; k++) {
            if (!all[k]) continue;
            seen = 0;
            for (int i = 0; ok && i < 18000 && !engine_request_done(all[k]); i++) engine_request_wait(all[k], &seen, 100);
            ok &= engine_request_done(all[k]) && !engine_request_failed(all[k], &err);
            for (int q = 0; k < 3 && q < engine_request_n_seqs(all[k]); q++) {
                EngineSeqView v;
                engine_request_seq(all[k], q, &v);
                ok &= v.finish == FINISH_STOP;
            }
            engine_request_release(all[k]);
        }
        /* two 10-token prompts one after the other, nothing else running: two prefill steps of the same
         * bucket, so the piecewise graphs are used whatever the timing above (the first runs eagerly,
         * the second captures) */
        for (int k = 0; k < 2 && ok; k++) {
            EngineRequest *w = NULL;
            static int32_t fresh[10]; /* no block of it is cached: the whole prompt is computed */
            for (int i = 0; i < 10; i++) fresh[i] = (int32_t)(5 + (i * 13 + k * 211 + 97) % (m->cfg.vocab - 5));
            eds_params(&p, 3, fresh, 10);
            p.sampling.max_tokens = 2;
            ok &= engine_submit(e, &p, &w, &err) == 0;
            ok &= w && eds_wait_clean(w, 100 + k) == 0;
            if (w) engine_request_release(w);
        }
        ok ? n_pass++ : n_fail++;
        printf("  %-4s engine with async scheduling: a request released after its first token, then one that "
               "finishes cleanly; sequences ending on stop ids beside a prompt log-prob request; two prefills "
               "alone\n", ok ? "ok" : "FAIL");
    }
    engine_metrics(e, met);
    {   /* the device's time on its steps: measured on the device runs, within the run's wall time */
        double dev = (double)dev_ns / 1e9, wall = eds_now() - t_run;
        int on = mode != ENGINE_DEVSAMPLE_OFF, ok = on ? dev > 0 && dev <= wall : dev == 0;
        ok ? n_pass++ : n_fail++;
        printf("  %-4s engine %s: device time of its steps %.3f s of the %.3f s run%s\n", ok ? "ok" : "FAIL",
               on ? (async == ENGINE_ASYNC_OFF ? "sampling on the device, sync" : "sampling on the device, async")
                  : "sampling on the host", dev, wall, on ? "" : " (none measured: right)");
    }
    uint64_t gc, gr, pc, pr;
    runner_graph_counts(r, &gc, &gr);
    runner_piece_counts(r, &pc, &pr);
    eds_graph_steps = gc + gr;
    eds_piece_steps = pc + pr;
    engine_free(e);
    runner_backend_free(&be);
    model_free(m);
    return rc;
}

static int eds_close(float a, float b) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    if (isinf(a) || isinf(b)) return a == b;
    return fabs((double)a - b) <= 1e-5 * (fabs((double)a) > 1 ? fabs((double)a) : 1);
}

/* Device run a against the host run b: the number of tokens compared, *bad the differences. */
static int eds_compare(const EdsSeq a_[][2], const EdsSeq b_[][2], const char *what, int *bad) {
    int tokens = 0;
    for (int k = 0; k < EDS_REQS; k++)
        for (int q = 0; q < 2; q++) {
            const EdsSeq *a = &a_[k][q], *b = &b_[k][q];
            if (a->n != b->n || a->finish != b->finish || a->stop_token != b->stop_token) {
                if ((*bad)++ < 4)
                    printf("       %s: request %d seq %d: %d tokens, finish %d stop %d; host %d tokens, finish %d "
                           "stop %d\n", what, k, q, a->n, a->finish, a->stop_token, b->n, b->finish, b->stop_token);
            }
            for (int t = 0; t < a->n && t < b->n; t++) {
                tokens++;
                int same = a->tok[t] == b->tok[t] && a->mask_n[t] == b->mask_n[t] && a->mask_comp[t] == b->mask_comp[t] &&
                           a->mask_len[t] == b->mask_len[t] && a->mask_hash[t] == b->mask_hash[t] &&
                           eds_close(a->lp[t], b->lp[t]) && eds_close(a->raw[t], b->raw[t]) &&
                           eds_close(a->val[t], b->val[t]) && a->rank[t] == b->rank[t];
                for (int j = 0; j < 5; j++)
                    same &= a->top_ids[t][j] == b->top_ids[t][j] && eds_close(a->top_lp[t][j], b->top_lp[t][j]);
                if (!same && (*bad)++ < 4)
                    printf("       %s: request %d seq %d token %d: device %d lp %.7g raw %.7g value %.7g rank %d "
                           "n_kept %d top %d %.7g, host %d lp %.7g raw %.7g value %.7g rank %d n_kept %d top %d %.7g\n",
                           what, k, q, t, a->tok[t], a->lp[t], a->raw[t], a->val[t], a->rank[t], a->mask_n[t],
                           a->top_ids[t][0], a->top_lp[t][0], b->tok[t], b->lp[t], b->raw[t], b->val[t], b->rank[t],
                           b->mask_n[t], b->top_ids[t][0], b->top_lp[t][0]);
            }
        }
    return tokens;
}

static void engine_devsample_check(const char *dir) {
    static EdsSeq on[EDS_REQS][2], sync_[EDS_REQS][2], off[EDS_REQS][2];
    memset(on, 0, sizeof on);
    memset(sync_, 0, sizeof sync_);
    memset(off, 0, sizeof off);
    EngineMetrics mon, msync, moff; /* zeroed: a run that fails early prints zeros, not stack bytes */
    memset(&mon, 0, sizeof mon);
    memset(&msync, 0, sizeof msync);
    memset(&moff, 0, sizeof moff);
    int rc = eds_run(dir, ENGINE_DEVSAMPLE_ON, ENGINE_ASYNC_ON, 1, on, &mon);
    uint64_t graph_steps = eds_graph_steps, piece_steps = eds_piece_steps; /* the async run's */
    rc |= eds_run(dir, ENGINE_DEVSAMPLE_ON, ENGINE_ASYNC_OFF, 0, sync_, &msync) |
          eds_run(dir, ENGINE_DEVSAMPLE_OFF, ENGINE_ASYNC_AUTO, 0, off, &moff);
    int bad = 0, bad_sync = 0, stopped = 0;
    int tokens = eds_compare(on, off, "async", &bad), tokens_sync = eds_compare(sync_, off, "sync", &bad_sync);
    for (int q = 0; q < 2; q++) stopped += off[5][q].finish == FINISH_STOP;
    int want = getenv("EMU_QUICK") ? 15 : 30;
    int ok = rc == 0 && bad == 0 && tokens >= want && mon.device_sampled_tokens > 0 && mon.device_sampling_fallbacks == 0 &&
             moff.device_sampled_tokens == 0 && mon.async_steps > 0 && stopped > 0 && graph_steps > 0 && piece_steps > 0;
    ok ? n_pass++ : n_fail++;
    printf("  %-4s %s engine, device sampling with async scheduling vs the host: %d tokens compared, %d differ; "
           "%llu sampled on the device, %llu fallbacks, %llu steps overlapped, %d sequences ended on a stop id; "
           "steps through graphs: %llu whole, %llu piecewise\n",
           ok ? "ok" : "FAIL", dir, tokens, bad, (unsigned long long)mon.device_sampled_tokens,
           (unsigned long long)mon.device_sampling_fallbacks, (unsigned long long)mon.async_steps, stopped,
           (unsigned long long)graph_steps, (unsigned long long)piece_steps);
    ok = rc == 0 && bad_sync == 0 && tokens_sync >= want && msync.device_sampled_tokens > 0 &&
         msync.device_sampling_fallbacks == 0 && msync.async_steps == 0;
    ok ? n_pass++ : n_fail++;
    printf("  %-4s %s engine, device sampling without async scheduling vs the host: %d tokens compared, %d differ, "
           "%llu steps overlapped\n", ok ? "ok" : "FAIL", dir, tokens_sync, bad_sync,
           (unsigned long long)msync.async_steps);
}

/* Routed experts (return_routed_experts) with device sampling and async
 * scheduling, against the host-sampled run of the same device forwards: an
 * MoE fixture serves, submitted while paused, a 30-token prompt (prefilled in
 * chunks of max_batched_tokens 16: a chunk with no row to sample, then one
 * with; EMU_QUICK: 20 tokens, 2 generated a sequence), an n = 2 request and
 * one without experts; every generated token's
 * experts and every prompt position's must be equal, in range, and the
 * capturing steps must have stayed in flight (EngineMetrics.async_steps) and
 * run through graphs: the device copies the ids behind the step's ops into
 * the step's own pinned buffer, read after the step's wait (the emulation
 * lands such a copy only at that wait, and poisons it until then). */
#define EEX_REQS 3
#define EEX_MAX (64 * 64)
typedef struct EexOut {
    int n_tok[EEX_REQS][2], n_pexp[EEX_REQS];
    int32_t tok[EEX_REQS][2][EDS_MAX_TOK];
    int32_t *gen[EEX_REQS][2]; /* [EDS_MAX_TOK * E] */
    int32_t *pexp[EEX_REQS];   /* [32 * E] */
    EngineMetrics met;
    uint64_t graph_steps;
    int E;
} EexOut;

static int eex_run(const char *dir, int mode, int async, EexOut *o) {
    Err err = {0};
    Model *m;
    Runner *r;
    EngineConfig c;
    EngineBackend be;
    if (eds_open(dir, mode, async, 16, &m, &r, &c, &be)) return -1;
    Engine *e = engine_create(&m->cfg, &be, &c);
    int E = engine_experts_per_token(e), rc = E > 0 ? 0 : -1;
    o->E = E;
    static int32_t prompts[EEX_REQS][30];
    int quick = getenv("EMU_QUICK") != NULL; /* the sanitizers: a shorter prompt, 2 tokens each */
    int np[EEX_REQS] = {quick ? 20 : 30, 7, 5};
    EngineRequest *req[EEX_REQS];
    if (engine_pause(e, PAUSE_KEEP, &err)) { printf("  FAIL pause: %s\n", err.msg); rc = -1; }
    for (int k = 0; k < EEX_REQS; k++) {
        for (int i = 0; i < np[k]; i++) prompts[k][i] = (int32_t)(3 + (i * 53 + k * 71) % (m->cfg.vocab - 3));
        EngineRequestParams p;
        engine_request_params_default(&p);
        p.prompt = prompts[k];
        p.n_prompt = np[k];
        p.n = k == 1 ? 2 : 1;
        p.want_experts = k < 2;
        p.sampling.max_tokens = quick ? 2 : EDS_MAX_TOK;
        p.sampling.ignore_eos = 1;
        p.sampling.has_seed = 1;
        p.sampling.seed = 77 + (uint64_t)k;
        p.sampling.temperature = k == 0 ? 0.0f : 1.0f;
        if (engine_submit(e, &p, &req[k], &err)) { printf("  FAIL submit %d: %s\n", k, err.msg); rc = -1; req[k] = NULL; }
    }
    engine_resume(e);
    for (int k = 0; k < EEX_REQS; k++) {
        if (!req[k]) continue;
        if (eds_wait_clean(req[k], k)) rc = -1;
        const int32_t *pe = NULL;
        int npe = E ? engine_request_prompt_experts(req[k], &pe) : 0;
        o->n_pexp[k] = npe;
        if (npe > 0 && npe <= 32 && E) memcpy(o->pexp[k], pe, sizeof(int32_t) * (size_t)npe * E);
        for (int q = 0; q < engine_request_n_seqs(req[k]) && q < 2; q++) {
            EngineSeqView v;
            engine_request_seq(req[k], q, &v);
            o->n_tok[k][q] = v.n_tokens < EDS_MAX_TOK ? v.n_tokens : EDS_MAX_TOK;
            for (int t = 0; t < o->n_tok[k][q]; t++) {
                o->tok[k][q][t] = v.tokens[t].token;
                if (v.tokens[t].experts && E)
                    memcpy(o->gen[k][q] + (size_t)t * E, v.tokens[t].experts, sizeof(int32_t) * (size_t)E);
                else if (E)
                    memset(o->gen[k][q] + (size_t)t * E, 0xee, sizeof(int32_t) * (size_t)E); /* none: differs */
            }
        }
        engine_request_release(req[k]);
    }
    engine_metrics(e, &o->met);
    uint64_t gc, gr, pc, pr;
    runner_graph_counts(r, &gc, &gr);
    runner_piece_counts(r, &pc, &pr);
    o->graph_steps = gc + gr + pc + pr;
    engine_free(e);
    runner_backend_free(&be);
    model_free(m);
    return rc;
}

static void engine_experts_check(const char *dir) {
    static EexOut a, h;
    EexOut *runs[2] = {&a, &h};
    for (int i = 0; i < 2; i++) {
        EexOut *o = runs[i];
        memset(o, 0, sizeof *o);
        for (int k = 0; k < EEX_REQS; k++) {
            o->pexp[k] = (int32_t *)calloc(EEX_MAX, sizeof(int32_t));
            for (int q = 0; q < 2; q++) o->gen[k][q] = (int32_t *)calloc(EEX_MAX, sizeof(int32_t));
        }
    }
    int rc = eex_run(dir, ENGINE_DEVSAMPLE_ON, ENGINE_ASYNC_ON, &a) | eex_run(dir, ENGINE_DEVSAMPLE_OFF, ENGINE_ASYNC_AUTO, &h);
    int E = a.E, differ = 0, bad = 0, rows = 0, prompt_rows = 0, n_experts = 0;
    {
        Err err = {0};
        Model *m = NULL;
        if (model_load(&m, dir, &err) == 0) n_experts = m->cfg.n_experts;
        model_free(m);
    }
    for (int k = 0; k < EEX_REQS && E > 0 && E <= 64; k++) {
        differ += a.n_pexp[k] != h.n_pexp[k];
        for (int i = 0; i < a.n_pexp[k] && i < h.n_pexp[k] && i < 32; i++, prompt_rows++)
            for (int j = 0; j < E; j++) {
                int32_t x = a.pexp[k][i * E + j];
                bad += x < 0 || x >= n_experts;
                differ += x != h.pexp[k][i * E + j];
            }
        for (int q = 0; q < 2; q++) {
            differ += a.n_tok[k][q] != h.n_tok[k][q];
            for (int t = 0; t < a.n_tok[k][q] && t < h.n_tok[k][q]; t++) {
                differ += a.tok[k][q][t] != h.tok[k][q][t];
                if (k == 2) continue; /* no experts asked for */
                rows++;
                for (int j = 0; j < E; j++) {
                    int32_t x = a.gen[k][q][t * E + j];
                    bad += x < 0 || x >= n_experts;
                    differ += x != h.gen[k][q][t * E + j];
                }
            }
        }
    }
    int quick = getenv("EMU_QUICK") != NULL;
    int want_rows = quick ? 6 : 24, want_prompt = quick ? 19 + 6 : 29 + 6; /* 3 sequences x max_tokens; n_prompt - 1 */
    int ok = rc == 0 && E > 0 && differ == 0 && bad == 0 && rows >= want_rows && prompt_rows == want_prompt &&
             a.met.async_steps > 0 && a.met.device_sampled_tokens > 0 && a.met.device_sampling_fallbacks == 0 &&
             a.graph_steps > 0;
    ok ? n_pass++ : n_fail++;
    printf("  %-4s %s engine, routed experts with device sampling and async scheduling vs the host: %d generated + %d "
           "prompt rows of %d ids, %d differ, %d out of range; %llu steps overlapped, %llu through graphs\n",
           ok ? "ok" : "FAIL", dir, rows, prompt_rows, E, differ, bad, (unsigned long long)a.met.async_steps,
           (unsigned long long)a.graph_steps);
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < EEX_REQS; k++) {
            free(runs[i]->pexp[k]);
            for (int q = 0; q < 2; q++) free(runs[i]->gen[k][q]);
        }
}

#endif
