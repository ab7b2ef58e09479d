/*
 * engine_request.c - one request's storage and life: allocation at submit
 * (records, top-N, experts and compact masks for max_tokens, all reserved
 * against the output budget, engine.h), publishing from the engine thread, the consumer API (wait, seq,
 * done, mask CSR, prompt log-probs / experts) and release.
 *
 * A published record never changes and never moves, so consumers read
 * records without a lock; only the counts are read under EngineRequest.mu.
 * A request is freed when both sides let go: the engine at retire (its last
 * sequence finished), the consumer at engine_request_release; the two flags
 * live under Engine.mu, so exactly one side frees it.
 *
 * Not here: the queue that submits and aborts (engine_control.c), sampling
 * and the step (engine_step.c).
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine_internal.h"

const char *finish_reason_name(FinishReason f) {
    switch (f) {
    case FINISH_STOP: return "stop";
    case FINISH_LENGTH: return "length";
    case FINISH_ABORT: return "abort";
    case FINISH_GRAMMAR: return "grammar_dead_end";
    default: return NULL;
    }
}

void engine_request_params_default(EngineRequestParams *p) {
    memset(p, 0, sizeof *p);
    p->n = 1;
    sampling_params_default(&p->sampling);
    p->prompt_logprobs = -1;
    p->lora_slot = -1;
}

/* ---- request storage ---- */
void engine_request_destroy(EngineRequest *r) {
    for (int i = 0; i < r->n; i++) {
        SeqOut *o = &r->outs[i];
        free(o->recs); free(o->top_ids); free(o->top_lp); free(o->experts);
        free(o->masks);
        free(r->seqs[i].tokens); free(r->seqs[i].blocks); free(r->seqs[i].keys);
    }
    for (int i = 0; r->matchers && i < r->n; i++) grammar_matcher_free(r->matchers[i]);
    free(r->matchers);
    if (r->p.grammar) grammar_unref(r->p.grammar);
    free(r->seqs); free(r->outs);
    free(r->prompt); free(r->bias_ids); free(r->bias); free(r->allowed); free(r->bad_off); free(r->bad_ids);
    free(r->plp); free(r->ptop_ids); free(r->ptop_lp); free(r->prank); free(r->pexp);
    if (r->out_bytes) engine_output_release(r->e, r->out_bytes);
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

/* ---- output memory (engine.h: the formula) ---- */
int engine_mask_ids_bound(int vocab, const SamplingParams *sp) {
    if (sp->temperature == 0.0f) return 1; /* greedy: a point mass */
    return MASK_BITMAP_WORDS(vocab); /* the bitmap: the largest form engine_mask_pack stores */
}

static int request_max_new(const Engine *e, const EngineRequestParams *p) {
    int room = e->cfg.max_model_len - p->n_prompt;
    return p->sampling.max_tokens > 0 && p->sampling.max_tokens < room ? p->sampling.max_tokens : room;
}

size_t engine_request_output_bytes(const Engine *e, const EngineRequestParams *p) {
    size_t M = (size_t)(request_max_new(e, p) > 0 ? request_max_new(e, p) : 0), P = (size_t)p->n_prompt;
    size_t K = (size_t)(p->top_logprobs > 0 ? p->top_logprobs : 0), E = (size_t)e->E;
    size_t B = (size_t)(e->cfg.max_model_len + e->cfg.block_size - 1) / (size_t)e->cfg.block_size;
    size_t per_rec = sizeof(TokenRecord) + K * 8 +
                     (p->want_experts ? 4 * E : 0) +
                     (p->want_mask ? 4 * (size_t)engine_mask_ids_bound(e->mc.vocab, &p->sampling) : 0);
    size_t per_seq = M * per_rec + 4 * (P + M) + 12 * B + (p->grammar ? grammar_matcher_bytes() : 0);
    size_t once = 4 * P + 8 * (size_t)(p->sampling.n_logit_bias > 0 ? p->sampling.n_logit_bias : 0) +
                  4 * (size_t)(p->sampling.n_allowed > 0 ? p->sampling.n_allowed : 0);
    if (p->sampling.n_bad_words > 0)
        once += 4 * ((size_t)p->sampling.n_bad_words + 1 + (size_t)p->sampling.bad_word_off[p->sampling.n_bad_words]);
    if (p->prompt_logprobs >= 0) once += P * (8 + 8 * (size_t)p->prompt_logprobs);
    if (p->want_experts && E && P > 1) once += 4 * E * (P - 1);
    return (size_t)(p->n > 0 ? p->n : 1) * per_seq + once + p->extra_output_bytes;
}

int engine_output_reserve(Engine *e, size_t bytes, Err *err) {
    size_t cap = e->cfg.max_output_mem_mb << 20;
    pthread_mutex_lock(&e->mu);
    int ok = e->out_reserved + bytes <= cap;
    size_t held = e->out_reserved;
    if (ok) e->out_reserved += bytes;
    pthread_mutex_unlock(&e->mu);
    ENSURE(err, ok, 503,
           "server busy: this request's outputs need %zu MB and the requests in flight hold %zu of the "
           "%zu MB output budget (--max-output-mem-mb); retry later, or lower n, max_tokens, "
           "logprobs/prompt_logprobs or return_sampling_mask", (bytes >> 20) + 1, held >> 20,
           e->cfg.max_output_mem_mb);
    return 0;
}

void engine_output_release(Engine *e, size_t bytes) {
    pthread_mutex_lock(&e->mu);
    ASSERT(e->out_reserved >= bytes, "output reservation released twice");
    e->out_reserved -= bytes;
    pthread_mutex_unlock(&e->mu);
}

EngineRequest *engine_request_new(Engine *e, const EngineRequestParams *p, Err *err) {
    int fail = 0, E = e->E;
    size_t bytes = engine_request_output_bytes(e, p);
    if (engine_output_reserve(e, bytes, err) < 0) return NULL;
    EngineRequest *r = calloc(1, sizeof *r);
    if (!r) {
        engine_output_release(e, bytes);
        ERR(err, 503, "out of memory for a request (%zu MB of outputs); retry later or lower n or max_tokens",
            (bytes >> 20) + 1);
        return NULL;
    }
    r->e = e;
    r->out_bytes = bytes;
    r->p = *p;
    r->submit_cmd = (EngineCmd){ .kind = CMD_SUBMIT, .a.req = r };
    r->abort_cmd = (EngineCmd){ .kind = CMD_ABORT, .a.req = r };
    r->n = p->n;
    r->user_tag = p->user_tag;
    r->max_new = request_max_new(e, p);
    r->mask_bound = p->want_mask ? engine_mask_ids_bound(e->mc.vocab, &p->sampling) : 0;
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
    if (p->sampling.n_allowed > 0) {
        r->allowed = tryalloc((size_t)p->sampling.n_allowed * sizeof(int32_t), &fail);
        if (r->allowed) memcpy(r->allowed, p->sampling.allowed_ids, (size_t)p->sampling.n_allowed * sizeof(int32_t));
    }
    r->p.sampling.allowed_ids = r->allowed;
    if (p->sampling.n_bad_words > 0) {
        size_t nw = (size_t)p->sampling.n_bad_words, ni = (size_t)p->sampling.bad_word_off[nw];
        r->bad_off = tryalloc((nw + 1) * sizeof(int32_t), &fail);
        r->bad_ids = tryalloc(ni * sizeof(int32_t), &fail);
        if (r->bad_off) memcpy(r->bad_off, p->sampling.bad_word_off, (nw + 1) * sizeof(int32_t));
        if (r->bad_ids) memcpy(r->bad_ids, p->sampling.bad_word_ids, ni * sizeof(int32_t));
    }
    r->p.sampling.bad_word_off = r->bad_off;
    r->p.sampling.bad_word_ids = r->bad_ids;
    if (p->grammar) {
        grammar_ref(p->grammar); /* dropped by engine_request_destroy */
        r->matchers = tryalloc((size_t)r->n * sizeof *r->matchers, &fail);
        for (int i = 0; r->matchers && i < r->n; i++)
            if (!(r->matchers[i] = grammar_matcher_create(p->grammar))) fail = 1;
        if (!p->sampling.ignore_eos)
            for (int i = 0; i < e->mc.n_eos && r->n_end < 8; i++) r->end_ids[r->n_end++] = e->mc.eos_ids[i];
        for (int i = 0; i < p->sampling.n_stop_ids; i++) r->end_ids[r->n_end++] = p->sampling.stop_ids[i];
    }
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
        q->salt = p->cache_salt;
        atomic_init(&q->n_cached, -1);
        q->rows_all = p->prompt_logprobs >= 0 && i == 0;
        q->lora_slot = p->lora_slot;
        o->recs = tryalloc((size_t)r->max_new * sizeof(TokenRecord), &fail);
        if (top > 0) {
            o->top_ids = tryalloc((size_t)r->max_new * top * sizeof(int32_t), &fail);
            o->top_lp = tryalloc((size_t)r->max_new * top * sizeof(float), &fail);
        }
        if (p->want_experts && E > 0) o->experts = tryalloc((size_t)r->max_new * E * sizeof(int32_t), &fail);
        if (p->want_mask) {
            /* malloc, not calloc: pages are touched only as ids are written */
            o->masks = malloc((size_t)r->max_new * (size_t)r->mask_bound * sizeof(int32_t));
            if (!o->masks) fail = 1;
        }
        o->stop_token = -1;
        if (q->tokens) memcpy(q->tokens, p->prompt, (size_t)p->n_prompt * sizeof(int32_t));
        q->n_tokens = p->n_prompt;
    }
    if (p->prompt_logprobs >= 0) {
        r->plp = tryalloc((size_t)p->n_prompt * sizeof(float), &fail);
        if (r->plp) r->plp[0] = NAN;
        r->prank = tryalloc((size_t)p->n_prompt * sizeof(int32_t), &fail);
        if (r->prank) r->prank[0] = 0;
        if (p->prompt_logprobs > 0) {
            r->ptop_ids = tryalloc((size_t)p->n_prompt * p->prompt_logprobs * sizeof(int32_t), &fail);
            r->ptop_lp = tryalloc((size_t)p->n_prompt * p->prompt_logprobs * sizeof(float), &fail);
        }
        r->plp_pub = 1;
    }
    if (p->want_experts && E > 0 && p->n_prompt > 1)
        r->pexp = tryalloc((size_t)(p->n_prompt - 1) * E * sizeof(int32_t), &fail);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    if (fail) {
        engine_request_destroy(r);
        ERR(err, 503, "out of memory reserving the outputs of a request of %d prompt tokens, n=%d, "
            "max_tokens=%d (%zu MB); retry later, or lower n, max_tokens or the returned outputs",
            p->n_prompt, p->n, r->max_new, (bytes >> 20) + 1);
        return NULL;
    }
    return r;
}

int engine_check_params(Engine *e, const EngineRequestParams *p, Err *err) {
    int V = e->mc.vocab;
    ENSURE(err, p->prompt && p->n_prompt > 0, 400, "empty prompt");
    ENSURE(err, p->n_prompt < e->cfg.max_model_len, 400,
           "prompt of %d tokens does not fit max model length %d (it needs room for 1 output token)",
           p->n_prompt, e->cfg.max_model_len);
    for (int i = 0; i < p->n_prompt; i++)
        ENSURE(err, p->prompt[i] >= 0 && p->prompt[i] < V, 400, "prompt token %d at %d out of range [0, %d)",
               p->prompt[i], i, V);
    ENSURE(err, p->lora_slot >= -1 && p->lora_slot < e->cfg.max_loras && (p->lora_slot < 0 || e->be.set_lora_tokens),
           400, "LoRA slot %d is not served (--max-loras %d)", p->lora_slot, e->cfg.max_loras);
    ENSURE(err, p->n >= 1 && p->n <= ENGINE_MAX_N, 400, "n must be in [1, %d] (got %d)", ENGINE_MAX_N, p->n);
    ENSURE(err, p->top_logprobs >= 0 && p->top_logprobs <= SAMPLING_MAX_TOP_N, 400,
           "top_logprobs must be in [0, %d] (got %d)", SAMPLING_MAX_TOP_N, p->top_logprobs);
    ENSURE(err, p->prompt_logprobs >= -1 && p->prompt_logprobs <= SAMPLING_MAX_TOP_N, 400,
           "prompt_logprobs must be in [0, %d] (got %d)", SAMPLING_MAX_TOP_N, p->prompt_logprobs);
    if (sampling_params_check(&p->sampling, V, err) < 0) return -1;
    ENSURE(err, !p->grammar || grammar_vocab_size(grammar_vocab(p->grammar)) == V, 400,
           "the grammar was compiled for another vocabulary");
    size_t mb = e->cfg.max_request_output_mb < e->cfg.max_output_mem_mb ? e->cfg.max_request_output_mb
                                                                         : e->cfg.max_output_mem_mb;
    size_t bytes = engine_request_output_bytes(e, p), cap = mb << 20;
    ENSURE(err, bytes <= cap, 400,
           "this request's outputs would need %zu MB, over the per-request budget of %zu MB "
           "(--max-request-output-mb): lower n (%d), max_tokens (%d), the prompt (%d tokens) or "
           "prompt_logprobs/echo (%d), logprobs (%d), or drop return_sampling_mask (%s; up to %d ids per "
           "token unless greedy)", (bytes >> 20) + 1, mb, p->n,
           request_max_new(e, p), p->n_prompt, p->prompt_logprobs, p->top_logprobs, p->want_mask ? "on" : "off",
           engine_mask_ids_bound(V, &p->sampling));
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

int engine_request_cached_tokens(EngineRequest *r) {
    int n = r->n > 0 ? atomic_load(&r->seqs[0].n_cached) : -1;
    return n > 0 ? n : 0;
}

const int32_t *engine_request_prompt_ranks(EngineRequest *r) { return r->prank; }

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
    int V = r->e->mc.vocab;
    for (int k = 0; k < v.n_tokens; k++) {
        const TokenRecord *t = &v.tokens[k];
        if (offsets) offsets[k] = off;
        if (!t->mask_ids) continue;
        if (ids) engine_mask_expand(t, V, 0, ids + off);
        off += t->mask_n;
    }
    if (offsets) offsets[v.n_tokens] = off;
    return v.n_tokens;
}

void engine_request_release(EngineRequest *r) {
    Engine *e = r->e;
    pthread_mutex_lock(&e->mu);
    r->consumer_gone = 1;
    int free_now = r->engine_gone;
    if (!free_now) engine_cmd_abort_locked(e, r);
    pthread_mutex_unlock(&e->mu);
    /* once unlocked, the engine may free r at any moment */
    if (free_now) engine_request_destroy(r);
}

/* ---- engine thread: publishing and retiring ---- */
void engine_request_publish(EngineRequest *r) {
    r->change++;
    pthread_cond_broadcast(&r->cv);
}

void engine_request_wake(EngineRequest *r) {
    pthread_mutex_lock(&r->mu);
    r->change++;
    pthread_mutex_unlock(&r->mu);
    /* a consumer that saw the old change was in pthread_cond_wait before the lock above, so it gets this */
    pthread_cond_broadcast(&r->cv);
}

static void count_finish(Engine *e, const EngineRequest *r, int n_gen, FinishReason f) {
    double t = engine_now_s();
    pthread_mutex_lock(&e->mmu);
    engine_vhist_add(&e->m.ve2e, ENGINE_VHIST_E2E, t - r->t_submit);
    engine_vhist_add_b(&e->m.vprompt, e->m.vtok_bounds, e->m.vtok_n, r->p.n_prompt);
    engine_vhist_add_b(&e->m.vgen, e->m.vtok_bounds, e->m.vtok_n, n_gen);
    if (f == FINISH_STOP) e->m.requests_finished_stop++;
    else if (f == FINISH_LENGTH) e->m.requests_finished_length++;
    else if (f == FINISH_GRAMMAR) e->m.requests_finished_grammar++;
    else e->m.requests_finished_abort++;
    pthread_mutex_unlock(&e->mmu);
}

/* The engine lets go of r (every sequence finished): publish done, drop a
 * queued abort (it would outlive r), free r if the consumer let go too. */
static void request_retire(Engine *e, EngineRequest *r) {
    ASSERT(r->n_done == r->n, "request %llu retired with %d of %d sequences finished",
           (unsigned long long)r->id, r->n_done, r->n);
    if (r->prev) r->prev->next = r->next; else e->active = r->next;
    if (r->next) r->next->prev = r->prev;
    pthread_mutex_lock(&r->mu);
    r->done = 1;
    engine_request_publish(r);
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&e->mu);
    if (!r->started) {
        e->n_unstarted--;
        ASSERT(e->n_unstarted >= 0, "unstarted count went negative");
        r->started = 1;
    }
    if (r->abort_cmd.queued) engine_cmd_forget_locked(e, &r->abort_cmd);
    r->engine_gone = 1;
    int free_now = r->consumer_gone;
    pthread_mutex_unlock(&e->mu);
    if (free_now) engine_request_destroy(r);
}

/* Finish one sequence (engine thread). The record, if any, is already written. */
void engine_seq_finish(Engine *e, Seq *q, FinishReason f, int32_t stop_token, int n_pub) {
    EngineRequest *r = q->req;
    ASSERT(q->state != SEQ_DONE, "sequence %d of request %llu finished twice", q->index,
           (unsigned long long)r->id);
    engine_step_forget(e, q); /* a step in flight may sample it: nothing of that row is recorded */
    scheduler_remove(e->sch, q);
    ASSERT(q->state == SEQ_DONE && q->n_blocks == 0, "a finished sequence holds %d KV blocks", q->n_blocks);
    pthread_mutex_lock(&r->mu);
    ASSERT(n_pub < 0 || n_pub >= r->outs[q->index].n_pub, "published records went from %d to %d",
           r->outs[q->index].n_pub, n_pub);
    if (n_pub >= 0) r->outs[q->index].n_pub = n_pub;
    r->outs[q->index].finish = f;
    r->outs[q->index].stop_token = stop_token;
    int n_gen = r->outs[q->index].n_pub;
    engine_request_publish(r);
    pthread_mutex_unlock(&r->mu);
    count_finish(e, r, n_gen, f);
    if (++r->n_done == r->n) request_retire(e, r);
}

/* Finish every unfinished sequence of r with FINISH_ABORT. r may be freed
 * by the last seq_finish (consumer already gone): never touch it after. */
void engine_request_abort_now(Engine *e, EngineRequest *r) {
    int n = r->n;
    for (int i = 0; i < n; i++) {
        if (r->seqs[i].state == SEQ_DONE) continue;
        int last = r->n_done == n - 1;
        engine_seq_finish(e, &r->seqs[i], FINISH_ABORT, -1, -1);
        if (last) return;
    }
}

_Static_assert(MASK_FORM_IDS == DEV_MASK_IDS && MASK_FORM_COMPLEMENT == DEV_MASK_COMPLEMENT &&
               MASK_FORM_BITMAP == DEV_MASK_BITMAP && MASK_BITMAP_WORDS(151936) == DEV_MASK_WORDS(151936),
               "engine.h's mask forms are dev_sample.h's");

int engine_mask_pack(const int32_t *kept, int n_kept, int vocab, int32_t token, int32_t *dst, int cap,
                     int *complement) {
    int has = 0;
    for (int i = 0; i < n_kept; i++) {
        if (kept[i] < 0 || kept[i] >= vocab || (i > 0 && kept[i] <= kept[i - 1])) return -1;
        has |= kept[i] == token;
    }
    if (!has) return -1;
    int len, form = dev_mask_form(n_kept, vocab, &len);
    if (len > cap) return -1;
    if (form == MASK_FORM_BITMAP) { /* a bitmap is smaller than either id list */
        memset(dst, 0, (size_t)len * sizeof(int32_t));
        for (int i = 0; i < n_kept; i++) dst[kept[i] >> 5] |= (int32_t)(1u << (kept[i] & 31));
    } else if (form == MASK_FORM_IDS) {
        memcpy(dst, kept, (size_t)n_kept * sizeof(int32_t));
    } else {
        for (int32_t id = 0, j = 0, w = 0; id < vocab; id++) {
            if (j < n_kept && kept[j] == id) j++;
            else dst[w++] = id;
        }
    }
    *complement = form;
    return len;
}

int engine_mask_store(int form, const int32_t *src, int len, int n_kept, int vocab, int32_t token, int32_t *dst,
                      int cap) {
    int want_len;
    if (n_kept < 1 || n_kept > vocab || token < 0 || token >= vocab || form != dev_mask_form(n_kept, vocab, &want_len) ||
        len != want_len || len > cap)
        return -1;
    if (form == MASK_FORM_BITMAP) {
        int n = 0;
        for (int k = 0; k < len; k++) n += __builtin_popcount((uint32_t)src[k]);
        if (n != n_kept || !(((uint32_t)src[token >> 5] >> (token & 31)) & 1u)) return -1;
        if ((vocab & 31) && ((uint32_t)src[len - 1] >> (vocab & 31))) return -1; /* a bit past vocab */
    } else {
        int has = 0;
        for (int i = 0; i < len; i++) {
            if (src[i] < 0 || src[i] >= vocab || (i > 0 && src[i] <= src[i - 1])) return -1;
            has |= src[i] == token;
        }
        if (has != (form == MASK_FORM_IDS)) return -1; /* the kept ids hold it, the others do not */
    }
    memcpy(dst, src, (size_t)len * sizeof(int32_t));
    return len;
}

int engine_mask_has(const TokenRecord *t, int32_t id) {
    if (!t->mask_ids || id < 0) return 0;
    if (t->mask_complement == MASK_FORM_BITMAP)
        return (id >> 5) < t->mask_len && ((uint32_t)t->mask_ids[id >> 5] >> (id & 31)) & 1u;
    int in = 0; /* ascending ids: a binary search */
    for (int lo = 0, hi = t->mask_len; lo < hi && !in;) {
        int mid = lo + (hi - lo) / 2;
        if (t->mask_ids[mid] == id) in = 1;
        else if (t->mask_ids[mid] < id) lo = mid + 1;
        else hi = mid;
    }
    return t->mask_complement == MASK_FORM_COMPLEMENT ? !in : in;
}

int engine_mask_expand(const TokenRecord *t, int vocab, int excluded, int32_t *out) {
    if (!t->mask_ids) return 0;
    int want_n = excluded ? vocab - t->mask_n : t->mask_n;
    if (t->mask_complement == (excluded ? MASK_FORM_COMPLEMENT : MASK_FORM_IDS)) {
        if (out) memcpy(out, t->mask_ids, (size_t)t->mask_len * sizeof(int32_t));
        return t->mask_len;
    }
    if (!out) return want_n;
    int w = 0;
    if (t->mask_complement == MASK_FORM_BITMAP) { /* a word at a time, set bits by ctz */
        for (int k = 0; k < t->mask_len; k++) {
            uint32_t bits = (uint32_t)t->mask_ids[k] ^ (excluded ? 0xffffffffu : 0u);
            if (excluded && k == t->mask_len - 1 && (vocab & 31)) bits &= (1u << (vocab & 31)) - 1u; /* past vocab */
            for (; bits; bits &= bits - 1) out[w++] = k * 32 + __builtin_ctz(bits);
        }
    } else { /* the other id list: walk the gaps */
        for (int32_t id = 0, j = 0; id < vocab; id++) {
            if (j < t->mask_len && t->mask_ids[j] == id) j++;
            else out[w++] = id;
        }
    }
    ASSERT(w == want_n, "mask of %d ids expanded to %d", want_n, w);
    return w;
}

int engine_request_failed(EngineRequest *r, Err *err) {
    pthread_mutex_lock(&r->mu);
    int f = r->failed;
    if (f && err) *err = r->fail;
    pthread_mutex_unlock(&r->mu);
    return f;
}

void engine_mark_started(Engine *e, EngineRequest *r) {
    if (r->started) return;
    r->started = 1;
    pthread_mutex_lock(&e->mu);
    e->n_unstarted--;
    ASSERT(e->n_unstarted >= 0, "unstarted count went negative");
    pthread_mutex_unlock(&e->mu);
}

