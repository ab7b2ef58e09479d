/*
 * engine_step.c - one engine step: plan it (scheduler.c), run the backend's
 * forward pass, write prompt log-probs / experts, fork the n samples of a
 * prompt, sample every sequence that reached its last token (rows in
 * parallel on the sampling threads, or all at once on the device when the
 * backend can: EngineBackend.sample, the logits then never leave the device)
 * and publish one TokenRecord each. A device step whose rows do not fit the
 * caps or whose sample op fails fetches its logits and samples on the host.
 *
 * Engine thread only, except sample_compute and plp_task, which run on the
 * sampling threads and touch only their own sequence's storage. Nothing is
 * allocated here: every output's room was reserved at submit (engine.h).
 * A mask is stored only through engine_mask_pack, which refuses one that does
 * not contain its token; such a record is never published and its request
 * fails (engine_request_failed).
 *
 * Not here: what happens between steps (engine_control.c), request storage
 * and the consumer API (engine_request.c), the sampling math (sampling.c).
 */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "engine_internal.h"
#include "log.h"

static void hist_add(EngineHist *h, double v) {
    int b = 0;
    while (b < ENGINE_HIST_BUCKETS - 1 && v > engine_hist_bounds[b]) b++;
    h->count[b]++;
    h->n++;
    h->sum += v;
}

/* The SampleWant of j's next token (its outputs in the request's storage,
 * the kept set into mask_buf) and its grammar matcher. fill: compute the
 * grammar's allowed set into allowed first; -1 when it allows nothing (the
 * sequence ends with FINISH_GRAMMAR at commit), else 0. */
static int sample_want(Engine *e, SampleJob *j, int32_t *mask_buf, uint64_t *allowed, int fill, SampleWant *w,
                       GrammarMatcher **gmp) {
    Seq *q = j->q;
    EngineRequest *r = q->req;
    SeqOut *o = &r->outs[q->index];
    const EngineRequestParams *p = &r->p;
    int k = q->n_tokens - q->n_prompt, top = p->top_logprobs;
    ASSERT(k >= 0 && k < r->max_new, "record %d of a sequence with room for %d", k, r->max_new);
    *w = (SampleWant){ .raw_logprob = p->want_raw_logprob, .value = p->want_logprob_value,
                       .mode = p->logprobs_mode, .top_n = top,
                       .top_ids = top ? o->top_ids + (size_t)k * top : NULL,
                       .top_logprobs = top ? o->top_lp + (size_t)k * top : NULL,
                       .mask = p->want_mask ? mask_buf : NULL };
    /* structured outputs: the one point where a grammar meets sampling */
    GrammarMatcher *gm = r->matchers ? r->matchers[q->index] : NULL;
    *gmp = gm;
    if (gm && fill) {
        if (grammar_matcher_fill_mask(gm, allowed, r->end_ids, r->n_end) <= 0) {
            o->grammar_end = 1;
            j->token = -1;
            return -1;
        }
        w->allowed = allowed;
    }
    return 0;
}

/* Write j's record (not yet published) from its sampled result res; w, gm,
 * allowed and mask_buf as sample_want set them. Touches only j->q's storage. */
static void sample_record(Engine *e, SampleJob *j, const SampleWant *w, GrammarMatcher *gm, const uint64_t *allowed,
                          int32_t *mask_buf, const SampleResult *rp) {
    Seq *q = j->q;
    const int32_t *expert_row = j->xrow;
    EngineRequest *r = q->req;
    SeqOut *o = &r->outs[q->index];
    const EngineRequestParams *p = &r->p;
    int k = q->n_tokens - q->n_prompt, top = p->top_logprobs;
    uint64_t ver = atomic_load(&e->version);
    SampleResult res = *rp;
    if (gm) {
        /* every allowed id banned (logit_bias, min_tokens): the sampler fell back
         * to an id outside the mask; the grammar cannot go on */
        int in = (allowed[res.token >> 6] >> (res.token & 63)) & 1;
        if (!in || grammar_matcher_accept(gm, res.token, r->end_ids, r->n_end) < 0) {
            o->grammar_end = 1;
            j->token = -1;
            return;
        }
    }
    TokenRecord *rec = &o->recs[k];
    memset(rec, 0, sizeof *rec);
    rec->token = res.token;
    rec->pos = q->n_tokens;
    rec->weight_version = ver;
    rec->adapter_version = q->lora_slot >= 0 ? e->lora_version[q->lora_slot] : 0;
    rec->logprob = res.logprob;
    rec->logprob_raw = res.logprob_raw;
    rec->value = res.value;
    rec->rank = res.rank;
    rec->n_top = top;
    rec->top_ids = w->top_ids;
    rec->top_logprobs = w->top_logprobs;
    rec->mask_n = res.n_kept;
    rec->grammar = gm != NULL;
    if (p->want_mask) {
        int32_t n_kept = res.n_kept;
        if (e->cfg.mask_tap) e->cfg.mask_tap(e->cfg.mask_tap_ctx, res.token, mask_buf, &n_kept);
        int32_t *dst = o->masks + o->mask_used;
        int comp = 0;
        /* room: record k starts at <= k * mask_bound of max_new * mask_bound */
        int len = engine_mask_pack(mask_buf, n_kept, e->mc.vocab, res.token, dst, r->mask_bound, &comp);
        if (len < 0) o->failed = 1;
        else {
            rec->mask_n = n_kept;
            rec->mask_complement = comp;
            rec->mask_len = len;
            rec->mask_ids = dst;
            o->mask_used += len;
        }
    }
    if (o->experts && expert_row) {
        memcpy(o->experts + (size_t)k * e->E, expert_row, (size_t)e->E * sizeof(int32_t));
        rec->experts = o->experts + (size_t)k * e->E;
    }
    j->token = res.token;
}

/* Phase 1, on any sampling thread: sample the next token of j->q on the host
 * and write its record (not yet published). Touches only j->q's own storage. */
static void sample_compute(Engine *e, SampleJob *j, int thread) {
    Seq *q = j->q;
    EngineRequest *r = q->req;
    int32_t *mask_buf = e->mask_bufs[thread];
    if (e->cfg.logits_tap)
        e->cfg.logits_tap(e->cfg.logits_tap_ctx, r->id, q->index, q->n_tokens, j->row, e->mc.vocab);
    SampleWant w;
    GrammarMatcher *gm;
    if (sample_want(e, j, mask_buf, e->grammar_bits[thread], 1, &w, &gm) < 0) return;
    int k = q->n_tokens - q->n_prompt;
    SampleHistory h = { q->tokens, q->n_prompt, q->tokens + q->n_prompt, k };
    SampleResult res;
    sampler_sample(e->samplers[thread], j->row, &r->p.sampling, &h, e->mc.eos_ids, e->mc.n_eos, q->index,
                   q->n_tokens, &w, &res);
    sample_record(e, j, &w, gm, w.allowed, mask_buf, &res);
}

/* Phase 1 of a device step, on any sampling thread: j's record from its row's
 * result (the kept ids are in its own host buffer, the grammar's allowed set
 * in the batch's copy). */
static void sample_dev_task(void *ctx, int task, int thread) {
    Engine *e = ctx;
    SampleJob *j = &e->jobs[task];
    if (j->dev_row < 0) return; /* the grammar allowed nothing: marked already */
    EngineDevSample *d = e->dev;
    const DevSampleBatch *bt = dev_sample_builder_batch(d->b);
    const DevSampleRow *row = &bt->rows[j->dev_row];
    SampleWant w;
    GrammarMatcher *gm;
    sample_want(e, j, d->masks[task], NULL, 0, &w, &gm);
    const uint64_t *allowed = row->gram_off >= 0 ? bt->bits + row->gram_off : NULL;
    SampleResult res;
    dev_sample_result(&d->out[j->dev_row], &w, &res);
    sample_record(e, j, &w, gm, allowed, d->masks[task], &res);
}

/* Whether this step's tokens can be sampled on the device: the backend can
 * and nothing of the step needs its logits on the host (prompt log-probs, the
 * logits tap). */
static int step_on_device(const Engine *e, const Scheduler *s) {
    if (!e->dev || e->cfg.logits_tap) return 0;
    for (int i = 0; i < s->n_sched; i++) {
        const Seq *q = s->sched[i];
        if (q->rows_all && q->plan_rows > 0) return 0;
    }
    return 1;
}

/* Every job of the step on the device (logits rows [n_out] there): 1 when all
 * were sampled and their records written; 0 when the batch did not fit the
 * caps or the device failed (nothing written: sample them on the host). */
static int sample_device(Engine *e, int n_out) {
    EngineDevSample *d = e->dev;
    dev_sample_builder_reset(d->b);
    for (int i = 0; i < e->n_jobs; i++) {
        SampleJob *j = &e->jobs[i];
        Seq *q = j->q;
        EngineRequest *r = q->req;
        SampleWant w;
        GrammarMatcher *gm;
        j->dev_row = -1;
        /* the grammar's set is computed here (engine thread) and copied into the batch */
        if (sample_want(e, j, d->masks[i], e->grammar_bits[0], 1, &w, &gm) < 0) continue;
        SampleHistory h = { q->tokens, q->n_prompt, q->tokens + q->n_prompt, q->n_tokens - q->n_prompt };
        int lrow = (int)((j->row - e->logits) / e->mc.vocab);
        int n = dev_sample_builder_add(d->b, lrow, &r->p.sampling, &h, e->mc.eos_ids, e->mc.n_eos, q->index,
                                       q->n_tokens, &w);
        if (n < 0) return 0;
        j->dev_row = n;
        d->mask_ptr[n] = w.mask;
    }
    const DevSampleBatch *bt = dev_sample_builder_batch(d->b);
    if (bt->n_rows > 0) {
        Err err = { 0 };
        if (e->be.sample(e->be.ctx, n_out, bt, d->out, d->mask_ptr, &err) < 0) {
            log_warn("engine: device sampling of %d rows failed (%s); sampling them on the host", bt->n_rows,
                     err.msg);
            return 0;
        }
    }
    if (e->n_jobs == 1) sample_dev_task(e, 0, 0);
    else threadpool_run(e->stp, e->n_jobs, sample_dev_task, e);
    return 1;
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
    if (o->grammar_end && !o->failed) {
        engine_seq_finish(e, q, FINISH_GRAMMAR, -1, -1); /* may free r: nothing after */
        return;
    }
    if (o->failed) {
        /* the record cannot be published correctly: fail the request loudly
         * (its consumer must not answer with what was published), abort its
         * other sequences at the next boundary, finish this one unpublished */
        log_error("engine: request %llu sequence %d: the sampling mask of token %d at position %d is not a "
                  "valid kept set containing it; failing the request", (unsigned long long)r->id, q->index, res.token,
                  q->n_tokens);
        pthread_mutex_lock(&r->mu);
        if (!r->failed) {
            r->failed = 1;
            ERR(&r->fail, 500, "internal error: the sampling mask of token %d (position %d of choice %d) "
                "did not contain the sampled token (or was not a valid kept set); the request was failed "
                "rather than return a wrong mask",
                res.token, q->n_tokens, q->index);
        }
        pthread_mutex_unlock(&r->mu);
        pthread_mutex_lock(&e->mu);
        engine_cmd_abort_locked(e, r);
        pthread_mutex_unlock(&e->mu);
        engine_seq_finish(e, q, FINISH_ABORT, -1, -1); /* may free r: nothing after */
        return;
    }
    ASSERT(q->n_tokens < q->max_len, "sequence full (%d tokens) but sampled again", q->n_tokens);
    q->tokens[q->n_tokens++] = res.token;
    /* stops */
    FinishReason f = FINISH_NONE;
    int32_t stop_tok = -1;
    for (int i = 0; i < p->sampling.n_stop_ids; i++)
        if (res.token == p->sampling.stop_ids[i]) { f = FINISH_STOP; stop_tok = res.token; }
    if (f == FINISH_NONE && !p->sampling.ignore_eos)
        for (int i = 0; i < e->mc.n_eos; i++) if (res.token == e->mc.eos_ids[i]) f = FINISH_STOP;
    if (f == FINISH_NONE && r->matchers && grammar_matcher_done(r->matchers[q->index])) f = FINISH_STOP;
    if (f == FINISH_NONE && k + 1 >= r->max_new) f = FINISH_LENGTH;
    /* timing */
    pthread_mutex_lock(&e->mmu);
    e->m.generated_tokens++;
    if (!r->got_first) {
        hist_add(&e->m.ttft, t - r->t_submit);
        engine_vhist_add(&e->m.vttft, ENGINE_VHIST_TTFT, t - r->t_submit);
        r->got_first = 1;
    } else if (k > 0) {
        hist_add(&e->m.itl, t - o->t_last);
        engine_vhist_add(&e->m.vitl, ENGINE_VHIST_ITL, t - o->t_last);
    }
    pthread_mutex_unlock(&e->mmu);
    o->t_last = t;
    if (f != FINISH_NONE) { engine_seq_finish(e, q, f, stop_tok, k + 1); return; }
    pthread_mutex_lock(&r->mu);
    ASSERT(o->n_pub == k, "publishing record %d after %d records", k, o->n_pub);
    o->n_pub = k + 1;
    engine_request_publish(r);
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
                                         N ? r->ptop_lp + (size_t)(pos + 1) * N : NULL, &r->prank[pos + 1]);
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
        ASSERT((!published || published >= r->plp_pub) && (!pe || pe >= r->pexp_pub),
               "published prompt outputs went back");
        if (published) r->plp_pub = published;
        if (pe) r->pexp_pub = pe;
        engine_request_publish(r);
        pthread_mutex_unlock(&r->mu);
    }
}

int engine_step(Engine *e) {
    Scheduler *s = e->sch;
    double t_plan = engine_now_s();
    int n = scheduler_plan(s);
    if (n == 0) return 0;
    int want_exp = 0;
    for (int i = 0; i < s->n_sched; i++) {
        EngineRequest *r = s->sched[i]->req;
        engine_mark_started(e, r);
        want_exp |= r->p.want_experts && e->E > 0;
    }
    Batch b = { .n_tokens = s->n_tok, .tokens = s->tok, .pos = s->pos, .seq = s->seqi,
                .n_seqs = s->n_sched, .block_table = s->tables, .n_out = s->n_out, .out_rows = s->out_rows };
    if (e->be.set_expert_capture) e->be.set_expert_capture(e->be.ctx, want_exp ? e->experts_buf : NULL);
    if (e->be.set_lora_tokens) e->be.set_lora_tokens(e->be.ctx, s->n_lora_tok ? s->lora : NULL);
    Err err = { 0 };
    int prefill = 0;
    for (int i = 0; i < s->n_sched; i++) prefill += s->sched[i]->plan_n > 1 ? s->sched[i]->plan_n : 0;
    /* device sampling: the logits stay on the device unless a fallback fetches them */
    int dev = step_on_device(e, s);
    double t_fwd = engine_now_s();
    int fwd = e->be.forward(e->be.ctx, &b, dev ? NULL : e->logits, &err);
    double t_fwd_end = engine_now_s();
    if (fwd < 0) {
        /* a bug: the scheduler built a batch the backend refused */
        log_error("engine: forward failed (%s:%d %s); aborting the %d sequences of this step", err.file,
                  err.line, err.msg, s->n_sched);
        /* queue their aborts now (every request is alive), applied at the next boundary */
        pthread_mutex_lock(&e->mu);
        for (int i = 0; i < s->n_sched; i++) engine_cmd_abort_locked(e, s->sched[i]->req);
        pthread_mutex_unlock(&e->mu);
        return 1;
    }
    scheduler_commit(s);
    double t = engine_now_s(), t_commit = t;
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
                    e->jobs[e->n_jobs++] = (SampleJob){ sib, row, xrow, -1, -1 };
                else scheduler_enqueue(s, sib, 0);
            }
        }
        e->jobs[e->n_jobs++] = (SampleJob){ q, row, xrow, -1, -1 };
    }
    int on_dev = 0;
    double t_dev = 0; /* device sampling's call or the fallback's logits copy: device work */
    if (dev && e->n_jobs > 0) {
        double t0 = engine_now_s();
        on_dev = sample_device(e, b.n_out);
        if (!on_dev) e->be.fetch_logits(e->be.ctx, e->logits, b.n_out);
        t_dev = engine_now_s() - t0;
    }
    /* rows are independent: sample them in parallel, then commit in order */
    if (!on_dev && e->n_jobs == 1) sample_compute(e, &e->jobs[0], 0);
    else if (!on_dev && e->n_jobs > 1) threadpool_run(e->stp, e->n_jobs, sample_task, e);
    t = engine_now_s(); /* tokens exist from here: TTFT/ITL include sampling */
    for (int i = 0; i < e->n_jobs; i++) sample_commit(e, &e->jobs[i], t);
    double t_end = engine_now_s();
    e->st.step += t_end - t_plan;
    e->st.schedule += (t_fwd - t_plan) + (t_commit - t_fwd_end);
    e->st.forward += t_fwd_end - t_fwd;
    e->st.sample += t - t_commit - t_dev;
    e->st.device += t_dev;
    e->st.publish += t_end - t;
    pthread_mutex_lock(&e->mmu);
    e->m.steps++;
    if (on_dev) e->m.device_sampled_tokens += (uint64_t)e->n_jobs;
    else if (dev && e->n_jobs > 0) e->m.device_sampling_fallbacks++;
    e->m.prefill_tokens_computed += (uint64_t)prefill;
    e->m.step_times = e->st; /* with steps, so a reader sees whole steps */
    pthread_mutex_unlock(&e->mmu);
    return 1;
}

