/*
 * engine.c - the engine thread and the thread-safe request API (engine.h).
 *
 * Threads: HTTP threads call the public functions; they only touch the
 * incoming list, flags and counters under Engine.mu, and each request's
 * published outputs under EngineRequest.mu. The engine thread owns the
 * scheduler, block manager, sampler, model and KV cache; between steps it
 * takes new requests, applies aborts, pauses and exclusive sections, then
 * plans a step (scheduler.c), runs the forward pass, samples every sequence
 * that reached its last token and publishes one TokenRecord per sequence.
 *
 * Memory: everything per step is preallocated at create. Per request, the
 * output storage (records, top-N, experts) is allocated at submit for
 * max_tokens; sampling masks go to a chunked arena that grows only when a
 * chunk fills (records point into it, so nothing moves once published).
 */
#define _GNU_SOURCE
#include "engine.h"
#include "runner_backend.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "block_manager.h"
#include "log.h"
#include "scheduler.h"
#include "threadpool.h"

const double engine_hist_bounds[ENGINE_HIST_BUCKETS] = {
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, INFINITY};

#define ENGINE_MAX_N 1024

typedef struct MaskChunk {
    struct MaskChunk *next;
    int64_t cap, used;
    int32_t ids[];
} MaskChunk;

typedef struct SeqOut {
    TokenRecord *recs;  /* [max_new] */
    int32_t *top_ids;   /* [max_new, top_n] */
    float *top_lp, *top_raw; /* [max_new, top_n] */
    int32_t *experts;   /* [max_new, E] */
    MaskChunk *masks;   /* newest first */
    int n_pub;          /* published records (under req->mu) */
    FinishReason finish;
    int32_t stop_token;
    double t_last;      /* last token time (engine thread) */
} SeqOut;

struct EngineRequest {
    Engine *e;
    uint64_t id, user_tag;
    EngineRequestParams p;    /* pointers replaced by owned copies */
    int32_t *prompt;
    int32_t *bias_ids;
    float *bias;
    int n, max_new, n_done;
    Seq *seqs;                /* [n] */
    SeqOut *outs;             /* [n] */
    float *plp;               /* [n_prompt] */
    int32_t *ptop_ids;        /* [n_prompt, N] */
    float *ptop_lp;           /* [n_prompt, N] */
    int plp_pub;
    int32_t *pexp;            /* [n_prompt - 1, E] */
    int pexp_pub;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t change;
    int done, consumer_gone, engine_gone, started;
    atomic_int abort_flag;
    double t_submit;
    int got_first;
    struct EngineRequest *next, *prev; /* incoming list, then the active list */
};

typedef struct SampleJob {
    Seq *q;
    const float *row;         /* [vocab] logits */
    const int32_t *xrow;      /* [E] routed experts of the input token, or NULL */
    int32_t token;            /* result */
} SampleJob;

struct Engine {
    ModelConfig mc;
    EngineConfig cfg;
    EngineBackend be;
    int own_be;               /* be was made by engine_create: free it */
    BlockManager *bm;
    Scheduler *sch;
    Sampler **samplers;       /* [n_sample_threads] */
    int32_t **mask_bufs;      /* [n_sample_threads][vocab] */
    int n_sample_threads;
    ThreadPool *stp;          /* sampling threads (rows in parallel) */
    SampleJob *jobs;          /* [max_running_seqs] this step's rows to sample */
    int n_jobs;
    float *logits;            /* [rows_cap, vocab] f32 */
    int rows_cap;
    int32_t *experts_buf;     /* [max_batched, E] */
    int n_moe, E;
    pthread_t thr;
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* wakes the engine thread */
    pthread_cond_t cv_done;   /* wakes callers of pause / exclusive */
    int stop;
    EngineRequest *in_head, *in_tail; /* submitted, not yet taken */
    EngineRequest *active;    /* engine thread's list */
    int n_unstarted;          /* bounded by max_waiting */
    int paused;               /* engine-thread view */
    int pause_pub;            /* published to engine_is_paused */
    uint64_t pause_gen, pause_ack;
    PauseMode pause_mode;
    int pause_wait_pending;
    uint64_t resume_gen, resume_seen;
    EngineExclusiveFn xfn;
    void *xctx;
    int xbump, xstatus, xbusy;
    Err *xerr;
    uint64_t x_gen, x_ack;
    _Atomic uint64_t version;
    uint64_t next_id, arrival;
    pthread_mutex_t mmu;
    EngineMetrics m;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void hist_add(EngineHist *h, double v) {
    int b = 0;
    while (b < ENGINE_HIST_BUCKETS - 1 && v > engine_hist_bounds[b]) b++;
    h->count[b]++;
    h->n++;
    h->sum += v;
}

const char *finish_reason_name(FinishReason f) {
    switch (f) {
    case FINISH_STOP: return "stop";
    case FINISH_LENGTH: return "length";
    case FINISH_ABORT: return "abort";
    default: return NULL;
    }
}

void engine_config_default(EngineConfig *c) {
    memset(c, 0, sizeof *c);
    c->max_running_seqs = 64;
    c->max_batched_tokens = 2048;
    c->max_model_len = 0;
    c->max_waiting = 1024;
    c->block_size = 16;
    c->n_blocks = 0;
    c->kv_mem_mb = 1024;
    c->enable_prefix_cache = 1;
    c->max_prompt_logprob_rows = 64;
    c->n_threads = 0;
    c->verbose = 1;
}

void engine_request_params_default(EngineRequestParams *p) {
    memset(p, 0, sizeof *p);
    p->n = 1;
    sampling_params_default(&p->sampling);
    p->prompt_logprobs = -1;
}

/* ---- request storage ---- */
static void request_destroy(EngineRequest *r) {
    for (int i = 0; i < r->n; i++) {
        SeqOut *o = &r->outs[i];
        free(o->recs); free(o->top_ids); free(o->top_lp); free(o->top_raw); free(o->experts);
        while (o->masks) { MaskChunk *c = o->masks; o->masks = c->next; free(c); }
        free(r->seqs[i].tokens); free(r->seqs[i].blocks); free(r->seqs[i].keys);
    }
    free(r->seqs); free(r->outs);
    free(r->prompt); free(r->bias_ids); free(r->bias);
    free(r->plp); free(r->ptop_ids); free(r->ptop_lp); free(r->pexp);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

/* Request-path allocation: NULL on failure, never exits. */
static void *tryalloc(size_t n, int *fail) {
    if (n == 0) return NULL;
    void *p = calloc(1, n);
    if (!p) *fail = 1;
    return p;
}

static EngineRequest *request_new(Engine *e, const EngineRequestParams *p, Err *err) {
    int fail = 0, V = e->mc.vocab, E = e->E;
    EngineRequest *r = calloc(1, sizeof *r);
    if (!r) { ERR(err, 500, "out of memory"); return NULL; }
    r->e = e;
    r->p = *p;
    r->n = p->n;
    r->user_tag = p->user_tag;
    int room = e->cfg.max_model_len - p->n_prompt;
    r->max_new = p->sampling.max_tokens > 0 && p->sampling.max_tokens < room ? p->sampling.max_tokens : room;
    r->prompt = tryalloc((size_t)p->n_prompt * sizeof(int32_t), &fail);
    if (r->prompt) memcpy(r->prompt, p->prompt, (size_t)p->n_prompt * sizeof(int32_t));
    r->p.prompt = r->prompt;
    if (p->sampling.n_logit_bias > 0) {
        r->bias_ids = tryalloc((size_t)p->sampling.n_logit_bias * sizeof(int32_t), &fail);
        r->bias = tryalloc((size_t)p->sampling.n_logit_bias * sizeof(float), &fail);
        if (!fail) {
            memcpy(r->bias_ids, p->sampling.logit_bias_ids, (size_t)p->sampling.n_logit_bias * sizeof(int32_t));
            memcpy(r->bias, p->sampling.logit_bias, (size_t)p->sampling.n_logit_bias * sizeof(float));
        }
    }
    r->p.sampling.logit_bias_ids = r->bias_ids;
    r->p.sampling.logit_bias = r->bias;
    r->seqs = tryalloc((size_t)r->n * sizeof(Seq), &fail);
    r->outs = tryalloc((size_t)r->n * sizeof(SeqOut), &fail);
    int top = p->top_logprobs, maxb = e->sch->max_blocks;
    for (int i = 0; !fail && i < r->n; i++) {
        Seq *q = &r->seqs[i];
        SeqOut *o = &r->outs[i];
        q->req = r;
        q->index = i;
        q->n_prompt = p->n_prompt;
        q->max_len = p->n_prompt + r->max_new;
        q->tokens = tryalloc((size_t)q->max_len * sizeof(int32_t), &fail);
        q->blocks = tryalloc((size_t)maxb * sizeof(int32_t), &fail);
        q->keys = tryalloc((size_t)maxb * sizeof(uint64_t), &fail);
        q->no_prefix_lookup = p->prompt_logprobs >= 0 || (p->want_experts && E > 0);
        q->rows_all = p->prompt_logprobs >= 0 && i == 0;
        o->recs = tryalloc((size_t)r->max_new * sizeof(TokenRecord), &fail);
        if (top > 0) {
            o->top_ids = tryalloc((size_t)r->max_new * top * sizeof(int32_t), &fail);
            o->top_lp = tryalloc((size_t)r->max_new * top * sizeof(float), &fail);
            if (p->want_raw_logprob) o->top_raw = tryalloc((size_t)r->max_new * top * sizeof(float), &fail);
        }
        if (p->want_experts && E > 0) o->experts = tryalloc((size_t)r->max_new * E * sizeof(int32_t), &fail);
        o->stop_token = -1;
        if (q->tokens) memcpy(q->tokens, p->prompt, (size_t)p->n_prompt * sizeof(int32_t));
        q->n_tokens = p->n_prompt;
    }
    if (p->prompt_logprobs >= 0) {
        r->plp = tryalloc((size_t)p->n_prompt * sizeof(float), &fail);
        if (r->plp) r->plp[0] = NAN;
        if (p->prompt_logprobs > 0) {
            r->ptop_ids = tryalloc((size_t)p->n_prompt * p->prompt_logprobs * sizeof(int32_t), &fail);
            r->ptop_lp = tryalloc((size_t)p->n_prompt * p->prompt_logprobs * sizeof(float), &fail);
        }
        r->plp_pub = 1;
    }
    if (p->want_experts && E > 0 && p->n_prompt > 1)
        r->pexp = tryalloc((size_t)(p->n_prompt - 1) * E * sizeof(int32_t), &fail);
    (void)V;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    if (fail) {
        request_destroy(r);
        ERR(err, 500, "out of memory for a request of %d prompt tokens, n=%d, max_tokens=%d",
            p->n_prompt, p->n, p->sampling.max_tokens);
        return NULL;
    }
    return r;
}

static int check_params(Engine *e, const EngineRequestParams *p, Err *err) {
    int V = e->mc.vocab;
    ENSURE(err, p->prompt && p->n_prompt > 0, 400, "empty prompt");
    ENSURE(err, p->n_prompt < e->cfg.max_model_len, 400,
           "prompt of %d tokens does not fit max model length %d (it needs room for 1 output token)",
           p->n_prompt, e->cfg.max_model_len);
    for (int i = 0; i < p->n_prompt; i++)
        ENSURE(err, p->prompt[i] >= 0 && p->prompt[i] < V, 400, "prompt token %d at %d out of range [0, %d)",
               p->prompt[i], i, V);
    ENSURE(err, p->n >= 1 && p->n <= ENGINE_MAX_N, 400, "n must be in [1, %d] (got %d)", ENGINE_MAX_N, p->n);
    ENSURE(err, p->top_logprobs >= 0 && p->top_logprobs <= SAMPLING_MAX_TOP_N, 400,
           "top_logprobs must be in [0, %d] (got %d)", SAMPLING_MAX_TOP_N, p->top_logprobs);
    ENSURE(err, p->prompt_logprobs >= -1 && p->prompt_logprobs <= SAMPLING_MAX_TOP_N, 400,
           "prompt_logprobs must be in [0, %d] (got %d)", SAMPLING_MAX_TOP_N, p->prompt_logprobs);
    return sampling_params_check(&p->sampling, V, err);
}

static _Atomic uint64_t seed_counter;

int engine_submit(Engine *e, const EngineRequestParams *p, EngineRequest **out, Err *err) {
    *out = NULL;
    if (check_params(e, p, err) < 0) {
        pthread_mutex_lock(&e->mmu);
        e->m.requests_rejected++;
        pthread_mutex_unlock(&e->mmu);
        return -1;
    }
    EngineRequest *r = request_new(e, p, err);
    if (!r) return -1;
    if (!r->p.sampling.has_seed) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r->p.sampling.seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^
                             (atomic_fetch_add(&seed_counter, 1) * 0x9e3779b97f4a7c15ull);
    }
    r->t_submit = now_s();
    pthread_mutex_lock(&e->mu);
    if (e->stop || e->n_unstarted >= e->cfg.max_waiting) {
        int stopping = e->stop;
        pthread_mutex_unlock(&e->mu);
        request_destroy(r);
        pthread_mutex_lock(&e->mmu);
        e->m.requests_rejected++;
        pthread_mutex_unlock(&e->mmu);
        if (stopping) return ERR(err, 503, "engine is shutting down");
        return ERR(err, 503, "waiting queue full (%d requests); retry later", e->cfg.max_waiting);
    }
    r->id = ++e->next_id;
    e->n_unstarted++;
    r->next = NULL;
    if (e->in_tail) e->in_tail->next = r; else e->in_head = r;
    e->in_tail = r;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_lock(&e->mmu);
    e->m.requests_submitted++;
    e->m.prompt_tokens += (uint64_t)p->n_prompt * (uint64_t)p->n;
    pthread_mutex_unlock(&e->mmu);
    *out = r;
    return 0;
}

/* ---- consumer side ---- */
int engine_request_wait(EngineRequest *r, uint64_t *seen, int timeout_ms) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    if (timeout_ms >= 0) {
        dl.tv_sec += timeout_ms / 1000;
        dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) { dl.tv_sec++; dl.tv_nsec -= 1000000000L; }
    }
    pthread_mutex_lock(&r->mu);
    while (r->change == *seen && !r->done) {
        if (timeout_ms < 0) pthread_cond_wait(&r->cv, &r->mu);
        else if (pthread_cond_timedwait(&r->cv, &r->mu, &dl) != 0) break;
    }
    int changed = r->change != *seen;
    *seen = r->change;
    pthread_mutex_unlock(&r->mu);
    return changed;
}

int engine_request_n_seqs(const EngineRequest *r) { return r->n; }
uint64_t engine_request_id(const EngineRequest *r) { return r->id; }
uint64_t engine_request_user_tag(const EngineRequest *r) { return r->user_tag; }
int engine_experts_per_token(const Engine *e) { return e->E; }

void engine_request_seq(EngineRequest *r, int i, EngineSeqView *v) {
    pthread_mutex_lock(&r->mu);
    v->n_tokens = r->outs[i].n_pub;
    v->tokens = r->outs[i].recs;
    v->finish = r->outs[i].finish;
    v->stop_token = r->outs[i].stop_token;
    pthread_mutex_unlock(&r->mu);
}

int engine_request_done(EngineRequest *r) {
    pthread_mutex_lock(&r->mu);
    int d = r->done;
    pthread_mutex_unlock(&r->mu);
    return d;
}

int engine_request_prompt_logprobs(EngineRequest *r, const float **lp, const int32_t **top_ids,
                                   const float **top_lp) {
    pthread_mutex_lock(&r->mu);
    int n = r->plp ? r->plp_pub : 0;
    pthread_mutex_unlock(&r->mu);
    if (lp) *lp = r->plp;
    if (top_ids) *top_ids = r->ptop_ids;
    if (top_lp) *top_lp = r->ptop_lp;
    return n;
}

int engine_request_prompt_experts(EngineRequest *r, const int32_t **experts) {
    pthread_mutex_lock(&r->mu);
    int n = r->pexp ? r->pexp_pub : 0;
    pthread_mutex_unlock(&r->mu);
    if (experts) *experts = r->pexp;
    return n;
}

int engine_request_mask_csr(EngineRequest *r, int i, int64_t *offsets, int32_t *ids) {
    EngineSeqView v;
    engine_request_seq(r, i, &v);
    return engine_request_mask_csr_n(r, i, v.n_tokens, offsets, ids);
}

int engine_request_mask_csr_n(EngineRequest *r, int i, int n, int64_t *offsets, int32_t *ids) {
    EngineSeqView v;
    engine_request_seq(r, i, &v);
    if (n > v.n_tokens) n = v.n_tokens;
    if (n < 0) n = 0;
    v.n_tokens = n;
    int64_t off = 0;
    for (int k = 0; k < v.n_tokens; k++) {
        const TokenRecord *t = &v.tokens[k];
        if (offsets) offsets[k] = off;
        if (ids && t->mask_ids) memcpy(ids + off, t->mask_ids, (size_t)t->mask_n * sizeof(int32_t));
        if (t->mask_ids) off += t->mask_n;
    }
    if (offsets) offsets[v.n_tokens] = off;
    return v.n_tokens;
}

static void engine_wake(Engine *e) {
    pthread_mutex_lock(&e->mu);
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void engine_abort(Engine *e, EngineRequest *r) {
    atomic_store(&r->abort_flag, 1);
    engine_wake(e);
}

void engine_request_release(EngineRequest *r) {
    Engine *e = r->e;
    pthread_mutex_lock(&r->mu);
    r->consumer_gone = 1;
    int free_now = r->engine_gone;
    if (!free_now) atomic_store(&r->abort_flag, 1);
    pthread_mutex_unlock(&r->mu);
    /* once unlocked, the engine may free r at any moment: touch only e */
    if (free_now) request_destroy(r);
    else engine_wake(e);
}

/* ---- engine thread: publishing ---- */
static void publish(EngineRequest *r) {
    r->change++;
    pthread_cond_broadcast(&r->cv);
}

static void count_finish(Engine *e, FinishReason f) {
    pthread_mutex_lock(&e->mmu);
    if (f == FINISH_STOP) e->m.requests_finished_stop++;
    else if (f == FINISH_LENGTH) e->m.requests_finished_length++;
    else e->m.requests_finished_abort++;
    pthread_mutex_unlock(&e->mmu);
}

static void request_retire(Engine *e, EngineRequest *r) {
    if (r->prev) r->prev->next = r->next; else e->active = r->next;
    if (r->next) r->next->prev = r->prev;
    if (!r->started) {
        pthread_mutex_lock(&e->mu);
        e->n_unstarted--;
        pthread_mutex_unlock(&e->mu);
        r->started = 1;
    }
    pthread_mutex_lock(&r->mu);
    r->done = 1;
    r->engine_gone = 1;
    int free_now = r->consumer_gone;
    publish(r);
    pthread_mutex_unlock(&r->mu);
    if (free_now) request_destroy(r);
}

/* Finish one sequence (engine thread). The record, if any, is already written. */
static void seq_finish(Engine *e, Seq *q, FinishReason f, int32_t stop_token, int n_pub) {
    EngineRequest *r = q->req;
    scheduler_remove(e->sch, q);
    pthread_mutex_lock(&r->mu);
    if (n_pub >= 0) r->outs[q->index].n_pub = n_pub;
    r->outs[q->index].finish = f;
    r->outs[q->index].stop_token = stop_token;
    publish(r);
    pthread_mutex_unlock(&r->mu);
    count_finish(e, f);
    if (++r->n_done == r->n) request_retire(e, r);
}

/* Finish every unfinished sequence of r with FINISH_ABORT. r may be freed
 * by the last seq_finish (consumer already gone): never touch it after. */
static void request_abort_now(Engine *e, EngineRequest *r) {
    int n = r->n;
    for (int i = 0; i < n; i++) {
        if (r->seqs[i].state == SEQ_DONE) continue;
        int last = r->n_done == n - 1;
        seq_finish(e, &r->seqs[i], FINISH_ABORT, -1, -1);
        if (last) return;
    }
}

static int32_t *mask_alloc(Engine *e, SeqOut *o, int n) {
    if (!o->masks || o->masks->cap - o->masks->used < n) {
        int64_t cap = e->mc.vocab > (1 << 16) ? e->mc.vocab : (1 << 16);
        MaskChunk *c = malloc(sizeof *c + (size_t)cap * sizeof(int32_t));
        if (!c) return NULL;
        c->cap = cap;
        c->used = 0;
        c->next = o->masks;
        o->masks = c;
    }
    int32_t *p = o->masks->ids + o->masks->used;
    o->masks->used += n;
    return p;
}

/* Phase 1, on any sampling thread: sample the next token of j->q and write
 * its record (not yet published). Touches only j->q's own storage. */
static void sample_compute(Engine *e, SampleJob *j, int thread) {
    Seq *q = j->q;
    const float *row = j->row;
    const int32_t *expert_row = j->xrow;
    EngineRequest *r = q->req;
    SeqOut *o = &r->outs[q->index];
    const EngineRequestParams *p = &r->p;
    int k = q->n_tokens - q->n_prompt, top = p->top_logprobs;
    uint64_t ver = atomic_load(&e->version);
    int32_t *mask_buf = e->mask_bufs[thread];
    if (e->cfg.logits_tap)
        e->cfg.logits_tap(e->cfg.logits_tap_ctx, r->id, q->index, q->n_tokens, row, e->mc.vocab);
    SampleHistory h = { q->tokens, q->n_prompt, q->tokens + q->n_prompt, k };
    SampleWant w = { .raw_logprob = p->want_raw_logprob, .top_n = top,
                     .top_ids = top ? o->top_ids + (size_t)k * top : NULL,
                     .top_logprobs = top ? o->top_lp + (size_t)k * top : NULL,
                     .top_logprobs_raw = top && o->top_raw ? o->top_raw + (size_t)k * top : NULL,
                     .mask = p->want_mask ? mask_buf : NULL };
    SampleResult res;
    sampler_sample(e->samplers[thread], row, &p->sampling, &h, e->mc.eos_ids, e->mc.n_eos, q->index, q->n_tokens,
                   &w, &res);
    TokenRecord *rec = &o->recs[k];
    memset(rec, 0, sizeof *rec);
    rec->token = res.token;
    rec->pos = q->n_tokens;
    rec->weight_version = ver;
    rec->logprob = res.logprob;
    rec->logprob_raw = res.logprob_raw;
    rec->n_top = top;
    rec->top_ids = w.top_ids;
    rec->top_logprobs = w.top_logprobs;
    rec->top_logprobs_raw = w.top_logprobs_raw;
    rec->mask_n = res.n_kept;
    if (p->want_mask) {
        int32_t *m = mask_alloc(e, o, res.n_kept);
        if (m) { memcpy(m, mask_buf, (size_t)res.n_kept * sizeof(int32_t)); rec->mask_ids = m; }
        else log_error("engine: out of memory for a sampling mask (request %llu)", (unsigned long long)r->id);
    }
    if (o->experts && expert_row) {
        memcpy(o->experts + (size_t)k * e->E, expert_row, (size_t)e->E * sizeof(int32_t));
        rec->experts = o->experts + (size_t)k * e->E;
    }
    j->token = res.token;
}

static void sample_task(void *ctx, int task, int thread) {
    Engine *e = ctx;
    sample_compute(e, &e->jobs[task], thread);
}

/* Phase 2, engine thread, in job order: append, check stops, publish. */
static void sample_commit(Engine *e, SampleJob *j, double t) {
    Seq *q = j->q;
    EngineRequest *r = q->req;
    SeqOut *o = &r->outs[q->index];
    const EngineRequestParams *p = &r->p;
    int k = q->n_tokens - q->n_prompt;
    SampleResult res = { .token = j->token };
    q->tokens[q->n_tokens++] = res.token;
    /* stops */
    FinishReason f = FINISH_NONE;
    int32_t stop_tok = -1;
    for (int i = 0; i < p->sampling.n_stop_ids; i++)
        if (res.token == p->sampling.stop_ids[i]) { f = FINISH_STOP; stop_tok = res.token; }
    if (f == FINISH_NONE && !p->sampling.ignore_eos)
        for (int i = 0; i < e->mc.n_eos; i++) if (res.token == e->mc.eos_ids[i]) f = FINISH_STOP;
    if (f == FINISH_NONE && k + 1 >= r->max_new) f = FINISH_LENGTH;
    /* timing */
    pthread_mutex_lock(&e->mmu);
    e->m.generated_tokens++;
    if (!r->got_first) { hist_add(&e->m.ttft, t - r->t_submit); r->got_first = 1; }
    else if (k > 0) hist_add(&e->m.itl, t - o->t_last);
    pthread_mutex_unlock(&e->mmu);
    o->t_last = t;
    if (f != FINISH_NONE) { seq_finish(e, q, f, stop_tok, k + 1); return; }
    pthread_mutex_lock(&r->mu);
    o->n_pub = k + 1;
    publish(r);
    pthread_mutex_unlock(&r->mu);
}

typedef struct PlpJob { Engine *e; Seq *q; } PlpJob;

/* One prompt row: the log-prob of the next prompt token (and top-N). Rows
 * write disjoint entries, so they run in parallel. */
static void plp_task(void *ctx, int k, int thread) {
    PlpJob *j = ctx;
    Engine *e = j->e;
    Seq *q = j->q;
    EngineRequest *r = q->req;
    int N = r->p.prompt_logprobs, pos = q->plan_start + k;
    if (pos + 1 >= q->n_prompt || pos + 1 < r->plp_pub) return;
    const float *row = e->logits + (size_t)(q->plan_row0 + k) * e->mc.vocab;
    r->plp[pos + 1] = sampler_logprob_of(e->samplers[thread], row, q->tokens[pos + 1], N,
                                         N ? r->ptop_ids + (size_t)(pos + 1) * N : NULL,
                                         N ? r->ptop_lp + (size_t)(pos + 1) * N : NULL);
}

/* Prompt log-probs and prompt experts for the rows/tokens of q's chunk. */
static void prompt_outputs(Engine *e, Seq *q) {
    EngineRequest *r = q->req;
    int published = 0;
    if (q->rows_all && q->plan_rows > 0) {
        PlpJob j = { e, q };
        threadpool_run(e->stp, q->plan_rows, plp_task, &j);
        int last = q->plan_start + q->plan_rows; /* positions < last scored token last */
        if (last > q->n_prompt - 1) last = q->n_prompt - 1;
        if (last + 1 > r->plp_pub) published = last + 1;
        if (q->plan_start + q->plan_n >= q->n_prompt) q->rows_all = 0;
    }
    int pe = 0;
    if (r->pexp && q->index == 0) {
        for (int k = 0; k < q->plan_n; k++) {
            int pos = q->plan_start + k;
            if (pos >= q->n_prompt - 1 || pos < r->pexp_pub) continue;
            memcpy(r->pexp + (size_t)pos * e->E, e->experts_buf + (size_t)(q->plan_tok0 + k) * e->E,
                   (size_t)e->E * sizeof(int32_t));
            pe = pos + 1;
        }
    }
    if (published || pe) {
        pthread_mutex_lock(&r->mu);
        if (published) r->plp_pub = published;
        if (pe) r->pexp_pub = pe;
        publish(r);
        pthread_mutex_unlock(&r->mu);
    }
}

static void mark_started(Engine *e, EngineRequest *r) {
    if (r->started) return;
    r->started = 1;
    pthread_mutex_lock(&e->mu);
    e->n_unstarted--;
    pthread_mutex_unlock(&e->mu);
}

/* One step. Returns 1 if anything was computed. */
static int engine_step(Engine *e) {
    Scheduler *s = e->sch;
    int n = scheduler_plan(s);
    if (n == 0) return 0;
    int want_exp = 0;
    for (int i = 0; i < s->n_sched; i++) {
        EngineRequest *r = s->sched[i]->req;
        mark_started(e, r);
        want_exp |= r->p.want_experts && e->E > 0;
    }
    Batch b = { .n_tokens = s->n_tok, .tokens = s->tok, .pos = s->pos, .seq = s->seqi,
                .n_seqs = s->n_sched, .block_table = s->tables, .n_out = s->n_out, .out_rows = s->out_rows };
    if (e->be.set_expert_capture) e->be.set_expert_capture(e->be.ctx, want_exp ? e->experts_buf : NULL);
    Err err = { 0 };
    int prefill = 0;
    for (int i = 0; i < s->n_sched; i++) prefill += s->sched[i]->plan_n > 1 ? s->sched[i]->plan_n : 0;
    if (e->be.forward(e->be.ctx, &b, e->logits, &err) < 0) {
        /* a bug: the scheduler built a batch the backend refused */
        log_error("engine: forward failed (%s:%d %s); aborting the %d sequences of this step", err.file,
                  err.line, err.msg, s->n_sched);
        /* flag now (every request is alive), finish at the next boundary */
        for (int i = 0; i < s->n_sched; i++) atomic_store(&s->sched[i]->req->abort_flag, 1);
        return 1;
    }
    scheduler_commit(s);
    double t = now_s();
    int n_sched = s->n_sched;
    e->n_jobs = 0;
    for (int i = 0; i < n_sched; i++) {
        Seq *q = s->sched[i];
        if (q->state != SEQ_RUNNING) continue; /* its request was aborted in this loop */
        prompt_outputs(e, q);
        if (q->plan_sample_row < 0) continue;
        const float *row = e->logits + (size_t)q->plan_sample_row * e->mc.vocab;
        const int32_t *xrow = want_exp ? e->experts_buf + (size_t)(q->plan_tok0 + q->plan_n - 1) * e->E : NULL;
        EngineRequest *r = q->req;
        int fork = q->index == 0 && r->n > 1 && q->n_tokens == q->n_prompt;
        if (fork) {
            /* n samples: siblings share the prompt's blocks (the partial last one
             * is copied) and draw their first token from the same row */
            for (int j = 1; j < r->n; j++) {
                Seq *sib = &r->seqs[j];
                if (sib->state != SEQ_PENDING) continue;
                sib->started = 1;
                if (scheduler_fork(s, q, sib, e->be.copy_block, e->be.ctx) == 0)
                    e->jobs[e->n_jobs++] = (SampleJob){ sib, row, xrow, -1 };
                else scheduler_enqueue(s, sib, 0);
            }
        }
        e->jobs[e->n_jobs++] = (SampleJob){ q, row, xrow, -1 };
    }
    /* rows are independent: sample them in parallel, then commit in order */
    if (e->n_jobs == 1) sample_compute(e, &e->jobs[0], 0);
    else if (e->n_jobs > 1) threadpool_run(e->stp, e->n_jobs, sample_task, e);
    t = now_s(); /* tokens exist from here: TTFT/ITL include sampling */
    for (int i = 0; i < e->n_jobs; i++) sample_commit(e, &e->jobs[i], t);
    pthread_mutex_lock(&e->mmu);
    e->m.steps++;
    e->m.prefill_tokens_computed += (uint64_t)prefill;
    pthread_mutex_unlock(&e->mmu);
    return 1;
}

static void update_gauges(Engine *e) {
    pthread_mutex_lock(&e->mmu);
    e->m.running = e->sch->n_running;
    e->m.waiting = e->sch->n_waiting;
    e->m.kv_blocks_total = block_manager_n_blocks(e->bm);
    e->m.kv_blocks_used = block_manager_n_used(e->bm);
    e->m.kv_blocks_cached = block_manager_n_cached(e->bm);
    e->m.kv_usage = (double)e->m.kv_blocks_used / (double)e->m.kv_blocks_total;
    e->m.prefix_cache_queries = e->sch->lookup_tokens;
    e->m.prefix_cache_hits = e->sch->hit_tokens;
    e->m.preemptions = e->sch->preemptions;
    e->m.weight_version = atomic_load(&e->version);
    e->m.paused = e->paused;
    pthread_mutex_unlock(&e->mmu);
}

/* Requests that have a sequence admitted and not finished. */
static int in_flight(Engine *e) {
    int n = 0;
    for (EngineRequest *r = e->active; r; r = r->next)
        for (int i = 0; i < r->n; i++) n += r->seqs[i].started && r->seqs[i].state != SEQ_DONE;
    return n;
}

static void *engine_main(void *arg) {
    Engine *e = arg;
    int idle = 0; /* the last step computed nothing: wait for an event */
    for (;;) {
        pthread_mutex_lock(&e->mu);
        for (;;) {
            if (e->stop || e->in_head || e->x_gen != e->x_ack || e->pause_gen != e->pause_ack ||
                e->resume_gen != e->resume_seen)
                break;
            int aborts = 0;
            for (EngineRequest *r = e->active; r && !aborts; r = r->next) aborts = atomic_load(&r->abort_flag);
            if (aborts) break;
            if (!e->paused && !idle && (e->sch->n_running > 0 || (e->sch->n_waiting > 0 && e->sch->admit)))
                break;
            pthread_cond_wait(&e->cv, &e->mu);
            idle = 0; /* something happened: plan again */
        }
        int stop = e->stop;
        EngineRequest *in = e->in_head;
        e->in_head = e->in_tail = NULL;
        int do_resume = e->resume_gen != e->resume_seen;
        e->resume_seen = e->resume_gen;
        int do_pause = e->pause_gen != e->pause_ack && !e->pause_wait_pending;
        PauseMode mode = e->pause_mode;
        int do_x = e->x_gen != e->x_ack;
        pthread_mutex_unlock(&e->mu);

        while (in) {
            EngineRequest *r = in;
            in = in->next;
            r->prev = NULL;
            r->next = e->active;
            if (e->active) e->active->prev = r;
            e->active = r;
            r->seqs[0].arrival = ++e->arrival << 16;
            for (int i = 1; i < r->n; i++) r->seqs[i].arrival = r->seqs[0].arrival + (uint64_t)i;
            scheduler_enqueue(e->sch, &r->seqs[0], 0);
        }
        if (stop) break;
        for (EngineRequest *r = e->active, *nx; r; r = nx) {
            nx = r->next;
            if (atomic_load(&r->abort_flag)) request_abort_now(e, r);
        }
        if (do_resume) {
            e->paused = 0;
            e->sch->admit = 1;
            pthread_mutex_lock(&e->mu);
            if (e->pause_wait_pending) { /* resumed before the wait completed */
                e->pause_wait_pending = 0;
                e->pause_ack = e->pause_gen;
                pthread_cond_broadcast(&e->cv_done);
            }
            pthread_mutex_unlock(&e->mu);
        }
        if (do_pause) {
            e->sch->admit = 0;
            if (mode == PAUSE_ABORT)
                for (EngineRequest *r = e->active, *nx; r; r = nx) { nx = r->next; request_abort_now(e, r); }
            if (mode == PAUSE_WAIT) {
                e->sch->admit = 2;
                pthread_mutex_lock(&e->mu);
                e->pause_wait_pending = 1;
                pthread_mutex_unlock(&e->mu);
            } else {
                e->paused = 1;
                pthread_mutex_lock(&e->mu);
                e->pause_ack = e->pause_gen;
                e->pause_pub = 1;
                pthread_cond_broadcast(&e->cv_done);
                pthread_mutex_unlock(&e->mu);
            }
        }
        if (do_x) {
            Err xe = { 0 };
            int st = e->xfn(e->xctx, &xe);
            if (st == 0 && e->xbump) {
                uint64_t v = atomic_load(&e->version) + 1;
                atomic_store(&e->version, v);
                scheduler_set_version(e->sch, v);
            }
            pthread_mutex_lock(&e->mu);
            e->xstatus = st;
            if (e->xerr) *e->xerr = xe;
            e->x_ack = e->x_gen;
            pthread_cond_broadcast(&e->cv_done);
            pthread_mutex_unlock(&e->mu);
        }
        idle = e->paused || !engine_step(e);
        pthread_mutex_lock(&e->mu);
        if (e->pause_wait_pending && in_flight(e) == 0) {
            e->pause_wait_pending = 0;
            e->paused = 1;
            e->sch->admit = 0;
            e->pause_ack = e->pause_gen;
            e->pause_pub = 1;
            pthread_cond_broadcast(&e->cv_done);
        }
        pthread_mutex_unlock(&e->mu);
        update_gauges(e);
    }
    /* shutting down: everything left finishes with FINISH_ABORT */
    while (e->active) request_abort_now(e, e->active);
    update_gauges(e);
    return NULL;
}

/* ---- pause / exclusive ---- */
int engine_pause(Engine *e, PauseMode mode, Err *err) {
    ENSURE(err, mode == PAUSE_ABORT || mode == PAUSE_WAIT || mode == PAUSE_KEEP, 400, "unknown pause mode %d",
           (int)mode);
    pthread_mutex_lock(&e->mu);
    uint64_t my = ++e->pause_gen;
    e->pause_mode = mode;
    pthread_cond_signal(&e->cv);
    while (e->pause_ack < my && !e->stop) pthread_cond_wait(&e->cv_done, &e->mu);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

void engine_resume(Engine *e) {
    pthread_mutex_lock(&e->mu);
    e->resume_gen++;
    e->pause_pub = 0;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

int engine_is_paused(Engine *e) {
    pthread_mutex_lock(&e->mu);
    int p = e->pause_pub;
    pthread_mutex_unlock(&e->mu);
    return p;
}

int engine_run_exclusive(Engine *e, EngineExclusiveFn fn, void *ctx, int bump_version, Err *err) {
    pthread_mutex_lock(&e->mu);
    while (e->xbusy && !e->stop) pthread_cond_wait(&e->cv_done, &e->mu);
    if (e->stop) {
        pthread_mutex_unlock(&e->mu);
        return ERR(err, 503, "engine is shutting down");
    }
    e->xbusy = 1;
    e->xfn = fn;
    e->xctx = ctx;
    e->xbump = bump_version;
    e->xerr = err;
    uint64_t my = ++e->x_gen;
    pthread_cond_signal(&e->cv);
    while (e->x_ack < my) pthread_cond_wait(&e->cv_done, &e->mu);
    int st = e->xstatus;
    e->xbusy = 0;
    e->xerr = NULL;
    pthread_cond_broadcast(&e->cv_done);
    pthread_mutex_unlock(&e->mu);
    return st;
}

uint64_t engine_weight_version(Engine *e) { return atomic_load(&e->version); }

void engine_metrics(Engine *e, EngineMetrics *out) {
    pthread_mutex_lock(&e->mmu);
    *out = e->m;
    pthread_mutex_unlock(&e->mmu);
}

const EngineConfig *engine_config(const Engine *e) { return &e->cfg; }

/* ---- create / free ---- */
static Engine *engine_new(const ModelConfig *mc, const EngineConfig *cfg) {
    Engine *e = xcalloc(1, sizeof *e);
    e->mc = *mc;
    if (cfg) e->cfg = *cfg;
    else engine_config_default(&e->cfg);
    EngineConfig *c = &e->cfg;
    CHECK(c->max_running_seqs > 0, "--max-running-seqs must be > 0 (got %d)", c->max_running_seqs);
    CHECK(c->max_batched_tokens > 0, "--max-batched-tokens must be > 0 (got %d)", c->max_batched_tokens);
    CHECK(c->block_size > 0, "--block-size must be > 0 (got %d)", c->block_size);
    CHECK(c->max_waiting > 0, "--max-waiting must be > 0 (got %d)", c->max_waiting);
    CHECK(c->max_prompt_logprob_rows >= 0, "--max-prompt-logprob-rows must be >= 0");
    for (int l = 0; l < mc->n_layers; l++) e->n_moe += model_layer_is_moe(mc, l);
    e->E = mc->n_experts > 0 ? e->n_moe * mc->top_k : 0;
    return e;
}

/* Start the scheduler, the block manager and the engine thread over e->be. */
static void engine_start(Engine *e) {
    EngineConfig *c = &e->cfg;
    int pool_tokens = c->n_blocks * c->block_size;
    CHECK(c->max_model_len >= 2, "--max-model-len must be >= 2 (got %d)", c->max_model_len);
    CHECK(c->max_model_len <= pool_tokens,
          "the KV pool (%d blocks of %d tokens = %d tokens) cannot hold one sequence of --max-model-len %d: "
          "raise --kv-mem-mb / --kv-blocks or lower --max-model-len", c->n_blocks, c->block_size, pool_tokens,
          c->max_model_len);
    e->bm = block_manager_create(c->n_blocks, c->block_size, c->enable_prefix_cache);
    e->sch = scheduler_create(e->bm, c->max_running_seqs, c->max_batched_tokens, c->max_model_len,
                              c->max_prompt_logprob_rows);
    e->n_sample_threads = c->n_threads > 0 ? c->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (e->n_sample_threads < 1) e->n_sample_threads = 1;
    e->stp = threadpool_create(e->n_sample_threads);
    e->samplers = xcalloc(e->n_sample_threads, sizeof(Sampler *));
    e->mask_bufs = xcalloc(e->n_sample_threads, sizeof(int32_t *));
    for (int i = 0; i < e->n_sample_threads; i++) {
        e->samplers[i] = sampler_create(e->mc.vocab);
        e->mask_bufs[i] = xmalloc((size_t)e->mc.vocab * sizeof(int32_t));
    }
    e->jobs = xcalloc(c->max_running_seqs, sizeof(SampleJob));
    e->rows_cap = c->max_running_seqs + c->max_prompt_logprob_rows;
    e->logits = xmalloc((size_t)e->rows_cap * e->mc.vocab * sizeof(float));
    if (e->E) e->experts_buf = xcalloc((size_t)c->max_batched_tokens * e->E, sizeof(int32_t));
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->mmu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_cond_init(&e->cv_done, NULL);
    update_gauges(e);
    if (c->verbose)
        log_info("engine: max_running_seqs=%d max_batched_tokens=%d max_model_len=%d max_waiting=%d "
                 "kv_blocks=%d block_size=%d (%d tokens) prefix_cache=%s threads=%d",
                 c->max_running_seqs, c->max_batched_tokens, c->max_model_len, c->max_waiting, c->n_blocks,
                 c->block_size, pool_tokens, c->enable_prefix_cache ? "on" : "off", c->n_threads);
    CHECK(pthread_create(&e->thr, NULL, engine_main, e) == 0, "cannot start the engine thread");
}

void engine_config_resolve(EngineConfig *c, const ModelConfig *mc) {
    size_t per_block = 2ull * mc->n_layers * c->block_size * mc->n_kv_heads * mc->head_dim * sizeof(float);
    if (c->n_blocks <= 0) c->n_blocks = (int)((c->kv_mem_mb << 20) / per_block);
    CHECK(c->n_blocks > 0, "--kv-mem-mb %zu is less than one KV block (%zu bytes)", c->kv_mem_mb, per_block);
    int pool_tokens = c->n_blocks * c->block_size;
    if (c->max_model_len <= 0) {
        c->max_model_len = mc->max_pos < 4096 ? mc->max_pos : 4096;
        if (c->max_model_len > pool_tokens) c->max_model_len = pool_tokens;
    }
}

Engine *engine_create(Model *m, const EngineConfig *cfg) {
    Engine *e = engine_new(&m->cfg, cfg);
    e->be = runner_backend_create(m, NULL, &e->cfg, NULL, NULL);
    e->own_be = 1;
    engine_start(e);
    return e;
}

Engine *engine_create_with_backend(const ModelConfig *mc, const EngineBackend *be, const EngineConfig *cfg) {
    Engine *e = engine_new(mc, cfg);
    CHECK(e->cfg.n_blocks > 0, "a custom backend needs EngineConfig.n_blocks > 0 (its KV pool size)");
    CHECK(be && be->forward && be->copy_block, "a backend needs forward and copy_block");
    e->be = *be;
    engine_config_resolve(&e->cfg, mc);
    engine_start(e);
    return e;
}

void engine_free(Engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    pthread_cond_signal(&e->cv);
    pthread_cond_broadcast(&e->cv_done);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thr, NULL);
    /* requests submitted but never taken */
    for (EngineRequest *r = e->in_head, *nx; r; r = nx) {
        nx = r->next;
        r->next = r->prev = NULL;
        e->active = r;
        request_abort_now(e, r);
    }
    if (e->own_be) runner_backend_free(&e->be);
    scheduler_free(e->sch);
    block_manager_free(e->bm);
    for (int i = 0; i < e->n_sample_threads; i++) {
        sampler_free(e->samplers[i]);
        free(e->mask_bufs[i]);
    }
    free(e->samplers); free(e->mask_bufs); free(e->jobs);
    threadpool_free(e->stp);
    free(e->logits); free(e->experts_buf);
    pthread_mutex_destroy(&e->mu);
    pthread_mutex_destroy(&e->mmu);
    pthread_cond_destroy(&e->cv);
    pthread_cond_destroy(&e->cv_done);
    free(e);
}
