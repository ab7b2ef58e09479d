/*
 * engine_step.c - one engine step: plan it (scheduler.c), run the backend's
 * forward pass, write prompt log-probs / experts, fork the n samples of a
 * prompt, sample every sequence that reached its last token (rows in
 * parallel on the sampling threads, or all at once on the device when the
 * backend can: EngineBackend.sample_launch, the logits then never leave the
 * device) and publish one TokenRecord each. A device step whose rows do not
 * fit the caps or whose launch fails fetches its logits and samples on the
 * host.
 *
 * Async scheduling (EngineConfig.async_scheduling; vLLM's, SGLang's overlap
 * scheduler): a step whose rows were launched on the device is left in
 * flight. Each of its rows holds a placeholder -1 - row at its token's
 * position (q->tokens[pos]), so the next plan schedules that position as if
 * the token were known; the next forward takes those tokens from the device
 * (Batch.n_pending), and only then does the engine wait for the step in
 * flight, write its records and publish them (step_end) while the device
 * computes the next one. What this changes, and why the records do not:
 *   - a row's sampling does not depend on its previous token (the counter
 *     RNG is keyed by position; min_tokens by count) unless it has penalties,
 *     bad words or a grammar: before such a row is launched the step in
 *     flight ends, so its history and matcher are complete;
 *   - a sequence whose token is its last by length gets no placeholder (it
 *     is not scheduled again); one that ends on a stop token or is aborted
 *     while its next step runs has that row forgotten (engine_step_forget):
 *     the device computes one token too many, nothing of it is recorded, and
 *     its KV blocks, released at its end, are written only by work the stream
 *     orders before any later use;
 *   - a full block holding a placeholder is registered in the prefix cache
 *     only after the token is known (scheduler.c);
 *   - steps that need the host (prompt log-probs, the logits tap, host
 *     sampling) end the step in flight before they run and are never left in
 *     flight; so do weight updates and every command other than a submission
 *     or an abort (engine_control.c), so a record's weight version is that of
 *     the weights that computed it;
 *   - routed experts (return_routed_experts) do not need the host: the
 *     device copies a step's into that step's own buffer (EngineStep.experts,
 *     pinned) behind its ops, read when the step ends, after its wait; its
 *     prompt experts too (PexpJob, by then the sequence's plan is the next
 *     step's).
 *
 * Engine thread only, except the record tasks (sample_task, sample_dev_task,
 * plp_task), which run on the sampling threads and touch only their own
 * sequence's storage. Nothing is allocated here: every output's room was
 * reserved at submit (engine.h). A mask is stored only through
 * engine_mask_pack / engine_mask_store, which refuse one that does not
 * contain its token; such a record is never published and its request fails
 * (engine_request_failed).
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

/* The SampleWant of j's token (its outputs in the request's storage, the
 * kept set into mask_buf) and its grammar matcher. fill: compute the
 * grammar's allowed set into allowed first; -1 when it allows nothing (the
 * sequence ends with FINISH_GRAMMAR at commit), else 0. */
static int sample_want(Engine *e, SampleJob *j, int32_t *mask_buf, uint64_t *allowed, int fill, SampleWant *w,
                       GrammarMatcher **gmp) {
    (void)e;
    Seq *q = j->q;
    EngineRequest *r = q->req;
    SeqOut *o = &r->outs[q->index];
    const EngineRequestParams *p = &r->p;
    int k = j->pos - q->n_prompt, top = p->top_logprobs;
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

/* The kept set of a sampled row, as it arrives: kept ids (host sampling), or
 * packed by the device (dev_mask_form). */
typedef struct MaskIn {
    const int32_t *kept;   /* [n_kept] ascending, or NULL */
    const int32_t *packed; /* [len] of form, or NULL */
    int form, len;
    int32_t *scratch;      /* [vocab]: the packed set expanded for the mask tap */
} MaskIn;

/* Write j's record (not yet published) from its sampled result res; w, gm and
 * allowed as sample_want set them. Touches only j->q's storage. */
static void sample_record(Engine *e, SampleJob *j, const SampleWant *w, GrammarMatcher *gm, const uint64_t *allowed,
                          const MaskIn *mi, const SampleResult *rp) {
    Seq *q = j->q;
    const int32_t *expert_row = j->xrow;
    EngineRequest *r = q->req;
    SeqOut *o = &r->outs[q->index];
    const EngineRequestParams *p = &r->p;
    int k = j->pos - q->n_prompt, top = p->top_logprobs;
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
    rec->pos = j->pos;
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
        int32_t *dst = o->masks + o->mask_used;
        int comp = 0, len;
        /* room: record k starts at <= k * mask_bound of max_new * mask_bound */
        if (mi->packed && !e->cfg.mask_tap) {
            comp = mi->form;
            len = engine_mask_store(mi->form, mi->packed, mi->len, n_kept, e->mc.vocab, res.token, dst, r->mask_bound);
        } else {
            const int32_t *kept = mi->kept;
            if (mi->packed) { /* the tap sees kept ids: expand the device's set (tests only) */
                TokenRecord t = { .mask_n = n_kept, .mask_complement = mi->form, .mask_len = mi->len,
                                  .mask_ids = mi->packed };
                int form_len;
                kept = mi->scratch;
                if (n_kept < 1 || n_kept > e->mc.vocab || mi->form != dev_mask_form(n_kept, e->mc.vocab, &form_len) ||
                    mi->len != form_len)
                    n_kept = 0; /* refused by the pack below */
                else
                    engine_mask_expand(&t, e->mc.vocab, 0, mi->scratch);
            }
            if (e->cfg.mask_tap) e->cfg.mask_tap(e->cfg.mask_tap_ctx, res.token, (int32_t *)kept, &n_kept);
            len = engine_mask_pack(kept, n_kept, e->mc.vocab, res.token, dst, r->mask_bound, &comp);
        }
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

/* Phase 1, on any sampling thread: sample the token of j->q on the host and
 * write its record (not yet published). Touches only j->q's own storage. */
static void sample_compute(Engine *e, SampleJob *j, int thread) {
    Seq *q = j->q;
    EngineRequest *r = q->req;
    int32_t *mask_buf = e->mask_bufs[thread];
    if (e->cfg.logits_tap)
        e->cfg.logits_tap(e->cfg.logits_tap_ctx, r->id, q->index, j->pos, j->row, e->mc.vocab);
    SampleWant w;
    GrammarMatcher *gm;
    if (sample_want(e, j, mask_buf, e->grammar_bits[thread], 1, &w, &gm) < 0) return;
    int k = j->pos - q->n_prompt;
    SampleHistory h = { q->tokens, q->n_prompt, q->tokens + q->n_prompt, k };
    SampleResult res;
    sampler_sample(e->samplers[thread], j->row, &r->p.sampling, &h, e->mc.eos_ids, e->mc.n_eos, q->index,
                   j->pos, &w, &res);
    MaskIn mi = { .kept = mask_buf };
    sample_record(e, j, &w, gm, w.allowed, &mi, &res);
}

/* What the record tasks of one step read. */
typedef struct RecordCtx {
    Engine *e;
    EngineStep *st;
    const DevSampleBatch *bt;  /* the device batch of the step (its builder's) */
    const DevSampleOut *out;   /* [bt->n_rows] its results */
    const int32_t *packed;     /* its packed kept sets */
} RecordCtx;

/* Phase 1 of a device step, on any sampling thread: j's record from its row's
 * result (the kept set packed by the device, the grammar's allowed set in the
 * batch's copy). */
static void sample_dev_task(void *ctx, int task, int thread) {
    RecordCtx *c = ctx;
    Engine *e = c->e;
    SampleJob *j = &c->st->jobs[task];
    if (!j->q || j->dev_row < 0) return; /* forgotten, or the grammar allowed nothing: marked already */
    const DevSampleRow *row = &c->bt->rows[j->dev_row];
    const DevSampleOut *o = &c->out[j->dev_row];
    SampleWant w;
    GrammarMatcher *gm;
    sample_want(e, j, NULL, NULL, 0, &w, &gm);
    const uint64_t *allowed = row->gram_off >= 0 ? c->bt->bits + row->gram_off : NULL;
    SampleResult res;
    dev_sample_result(o, &w, &res);
    MaskIn mi = { .packed = row->mask_slot >= 0 ? c->packed + (size_t)row->mask_slot * DEV_MASK_WORDS(e->mc.vocab) : NULL,
                  .form = o->mask_form, .len = o->mask_len, .scratch = e->mask_bufs[thread] };
    if (!mi.packed) { /* read only when a mask is wanted: none was packed, so the store refuses it */
        mi.packed = e->mask_bufs[thread];
        mi.len = -1;
    }
    sample_record(e, j, &w, gm, allowed, &mi, &res);
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

/* Its token is still a placeholder: sampled in the step in flight. */
static int seq_pending(const Seq *q) { return q->n_tokens > 0 && q->tokens[q->n_tokens - 1] < 0; }

/* Its row needs the previous tokens on the host: penalties, bad words, a grammar. */
static int job_needs_history(const SampleJob *j) {
    const EngineRequest *r = j->q->req;
    const SamplingParams *p = &r->p.sampling;
    return p->repetition_penalty != 1.0f || p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f ||
           p->n_bad_words > 0 || r->matchers;
}

/* Launch every job of st on the device (logits rows [n_out] there) into
 * st->slot: 1 when launched; 0 when the batch did not fit the caps or the
 * launch failed (nothing launched: sample them on the host). Grammar sets are
 * computed here (engine thread) and copied into the batch. */
static int sample_device(Engine *e, EngineStep *st, int n_out) {
    DevSampleBuilder *b = e->dev->b[st->slot];
    dev_sample_builder_reset(b);
    for (int i = 0; i < st->n_jobs; i++) {
        SampleJob *j = &st->jobs[i];
        Seq *q = j->q;
        j->dev_row = -1;
        if (!q) continue; /* its sequence ended (engine_step_forget) */
        EngineRequest *r = q->req;
        SampleWant w;
        GrammarMatcher *gm;
        if (sample_want(e, j, NULL, e->grammar_bits[0], 1, &w, &gm) < 0) continue;
        w.mask = r->p.want_mask ? (int32_t *)1 : NULL; /* a flag for the builder, which reads no output pointer */
        int k = j->pos - q->n_prompt;
        SampleHistory h = { q->tokens, q->n_prompt, q->tokens + q->n_prompt, k };
        int lrow = (int)((j->row - e->logits) / e->mc.vocab);
        int n = dev_sample_builder_add(b, lrow, &r->p.sampling, &h, e->mc.eos_ids, e->mc.n_eos, q->index, j->pos, &w);
        if (n < 0) return 0;
        j->dev_row = n;
    }
    const DevSampleBatch *bt = dev_sample_builder_batch(b);
    Err err = { 0 };
    if (e->be.sample_launch(e->be.ctx, n_out, bt, st->slot, &err) < 0) {
        log_warn("engine: device sampling of %d rows failed (%s); sampling them on the host", bt->n_rows, err.msg);
        return 0;
    }
    st->n_dev_rows = bt->n_rows;
    return 1;
}

static void sample_task(void *ctx, int task, int thread) {
    RecordCtx *c = ctx;
    SampleJob *j = &c->st->jobs[task];
    if (j->q) sample_compute(c->e, j, thread);
}

/* Phase 2, engine thread, in job order: the token into the sequence, stops,
 * publish. */
static void sample_commit(Engine *e, SampleJob *j, double t) {
    Seq *q = j->q;
    if (!q) return; /* its sequence ended while the step ran */
    EngineRequest *r = q->req;
    SeqOut *o = &r->outs[q->index];
    const EngineRequestParams *p = &r->p;
    int k = j->pos - q->n_prompt;
    SampleResult res = { .token = j->token };
    if (j->held) { /* the placeholder becomes the token; the step after it already computed its K/V */
        ASSERT(q->tokens[j->pos] < 0 && j->pos < q->n_tokens, "placeholder at %d of %d tokens is %d", j->pos,
               q->n_tokens, q->tokens[j->pos]);
        q->tokens[j->pos] = res.token >= 0 ? res.token : 0; /* a failed row never reaches the model again */
    }
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
                  j->pos);
        pthread_mutex_lock(&r->mu);
        if (!r->failed) {
            r->failed = 1;
            ERR(&r->fail, 500, "internal error: the sampling mask of token %d (position %d of choice %d) "
                "did not contain the sampled token (or was not a valid kept set); the request was failed "
                "rather than return a wrong mask",
                res.token, j->pos, q->index);
        }
        pthread_mutex_unlock(&r->mu);
        pthread_mutex_lock(&e->mu);
        engine_cmd_abort_locked(e, r);
        pthread_mutex_unlock(&e->mu);
        engine_seq_finish(e, q, FINISH_ABORT, -1, -1); /* may free r: nothing after */
        return;
    }
    if (!j->held) {
        ASSERT(q->n_tokens < q->max_len && q->n_tokens == j->pos, "sequence of %d tokens (room %d) sampled at %d",
               q->n_tokens, q->max_len, j->pos);
        q->tokens[q->n_tokens++] = res.token;
    }
    /* stops */
    FinishReason f = FINISH_NONE;
    int32_t stop_tok = -1;
    for (int i = 0; i < p->sampling.n_stop_ids; i++)
        if (res.token == p->sampling.stop_ids[i]) { f = FINISH_STOP; stop_tok = res.token; }
    if (f == FINISH_NONE && !p->sampling.ignore_eos)
        for (int i = 0; i < e->mc.n_eos; i++) if (res.token == e->mc.eos_ids[i]) f = FINISH_STOP;
    if (f == FINISH_NONE && r->matchers && grammar_matcher_done(r->matchers[q->index])) f = FINISH_STOP;
    if (f == FINISH_NONE && k + 1 >= r->max_new) f = FINISH_LENGTH;
    ASSERT(!j->held || f != FINISH_LENGTH, "a held token at %d was its sequence's last by length", j->pos);
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
    pthread_mutex_unlock(&r->mu);
    /* its consumer is woken once when the step's commits end (n = 8: one wake, not eight); r lives
     * until then, since q, unfinished, can only be finished by its own job */
    if (r->wake_stamp != e->wake_stamp) {
        ASSERT(e->n_wake < e->cfg.max_running_seqs, "%d requests to wake in one step", e->n_wake + 1);
        r->wake_stamp = e->wake_stamp;
        e->wake[e->n_wake++] = r;
    }
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

/* Prompt log-probs for the rows of q's chunk; its prompt experts are noted in
 * st, written when st ends (prompt_experts: a device may still be copying them). */
static void prompt_outputs(Engine *e, EngineStep *st, Seq *q) {
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
    if (r->pexp && q->index == 0 && q->plan_start < q->n_prompt - 1)
        st->pexp[st->n_pexp++] = (PexpJob){ q, q->plan_start, q->plan_n, q->plan_tok0 };
    if (published) {
        pthread_mutex_lock(&r->mu);
        ASSERT(published >= r->plp_pub, "published prompt log-probs went back");
        r->plp_pub = published;
        engine_request_publish(r);
        pthread_mutex_unlock(&r->mu);
    }
}

/* The prompt experts st captured (its results are on the host), in the
 * requests' storage, published. */
static void prompt_experts(Engine *e, EngineStep *st) {
    for (int i = 0; i < st->n_pexp; i++) {
        const PexpJob *j = &st->pexp[i];
        if (!j->q) continue;
        EngineRequest *r = j->q->req;
        int pe = 0;
        for (int k = 0; k < j->n; k++) {
            int pos = j->pos0 + k;
            if (pos >= j->q->n_prompt - 1 || pos < r->pexp_pub) continue;
            memcpy(r->pexp + (size_t)pos * e->E, st->experts + (size_t)(j->tok0 + k) * e->E,
                   (size_t)e->E * sizeof(int32_t));
            pe = pos + 1;
        }
        if (!pe) continue;
        pthread_mutex_lock(&r->mu);
        ASSERT(pe >= r->pexp_pub, "published prompt experts went back");
        r->pexp_pub = pe;
        engine_request_publish(r);
        pthread_mutex_unlock(&r->mu);
    }
}

/* Steps with rows: publish the step counters (engine thread). */
static void step_count(Engine *e, const EngineStep *st, int on_dev, int fallback) {
    pthread_mutex_lock(&e->mmu);
    e->m.steps++;
    if (on_dev) e->m.device_sampled_tokens += (uint64_t)st->n_jobs;
    if (fallback) e->m.device_sampling_fallbacks++;
    e->m.prefill_tokens_computed += (uint64_t)st->prefill;
    e->m.step_times = e->st; /* with steps, so a reader sees whole steps */
    pthread_mutex_unlock(&e->mmu);
}

/* The engine thread's time since the last mark goes to phase *acc (the
 * phases of EngineStepTimes tile a step: they add up to it exactly). */
static double phase_to(Engine *e, double *acc) {
    double t = engine_now_s();
    *acc += t - e->mark;
    e->mark = t;
    return t;
}

/* End st: its device results (waited for) or the host's sampling of its
 * rows, the records, then the commits in job order. */
static void step_end(Engine *e, EngineStep *st) {
    ASSERT(st->live, "ending a step that is not in flight");
    st->live = 0;
    RecordCtx rc = { .e = e, .st = st };
    if (st->on_dev) {
        Err err = { 0 };
        if (e->be.sample_wait(e->be.ctx, st->slot, &rc.out, &rc.packed, &err) < 0) {
            /* the logits are gone (the next step may have overwritten them): these rows
             * cannot be sampled again; fail their requests loudly, keep serving */
            log_error("engine: waiting for the device sampling of %d rows failed (%s); failing their requests",
                      st->n_dev_rows, err.msg);
            for (int i = 0; i < st->n_jobs; i++) {
                SampleJob *j = &st->jobs[i];
                if (!j->q) continue;
                EngineRequest *r = j->q->req;
                pthread_mutex_lock(&r->mu);
                if (!r->failed) {
                    r->failed = 1;
                    ERR(&r->fail, 500, "internal error: the device could not deliver the sampled token at position "
                        "%d (%s); the request was failed rather than return a token that may be wrong", j->pos,
                        err.msg);
                }
                pthread_mutex_unlock(&r->mu);
                pthread_mutex_lock(&e->mu);
                engine_cmd_abort_locked(e, r);
                pthread_mutex_unlock(&e->mu);
            }
            phase_to(e, &e->st.device);
            return; /* their aborts, queued, end the sequences (and forget their rows) at the next boundary */
        }
        rc.bt = dev_sample_builder_batch(e->dev->b[st->slot]);
    } else if (st->capture && !st->on_host) {
        e->be.fetch_logits(e->be.ctx, e->logits, 0); /* nothing waited for its ops: their experts' copy */
    }
    phase_to(e, &e->st.device);
    prompt_experts(e, st);
    /* rows are independent: records in parallel, then commit in order */
    TaskFn fn = st->on_dev ? sample_dev_task : sample_task;
    if (st->n_jobs == 1) fn(&rc, 0, 0);
    else if (st->n_jobs > 1) threadpool_run(e->stp, st->n_jobs, fn, &rc);
    double t = phase_to(e, &e->st.sample); /* tokens exist from here: TTFT/ITL include sampling */
    e->n_wake = 0;
    for (int i = 0; i < st->n_jobs; i++) sample_commit(e, &st->jobs[i], t);
    for (int i = 0; i < e->n_wake; i++) engine_request_wake(e->wake[i]);
    e->wake_stamp++;
    phase_to(e, &e->st.publish);
}

void engine_step_drain(Engine *e) {
    EngineStep *f = &e->steps[!e->cur];
    if (!f->live) return;
    double t0 = e->mark = engine_now_s();
    step_end(e, f);
    e->st.step += e->mark - t0;
    e->drained += e->mark - t0; /* not the engine loop's control time */
}

void engine_step_forget(Engine *e, const Seq *q) {
    for (int k = 0; k < 2; k++) {
        EngineStep *st = &e->steps[k];
        if (!st->live) continue;
        for (int i = 0; i < st->n_jobs; i++)
            if (st->jobs[i].q == q) st->jobs[i].q = NULL;
        for (int i = 0; i < st->n_pexp; i++)
            if (st->pexp[i].q == q) st->pexp[i].q = NULL;
    }
}

/* After the step in flight ended before this step's forward: its tokens are
 * on the host now, so the batch takes them from there. */
static void batch_take_tokens(Scheduler *s) {
    for (int i = 0; i < s->n_sched; i++) {
        const Seq *q = s->sched[i];
        for (int k = 0; k < q->plan_n; k++) s->tok[q->plan_tok0 + k] = q->tokens[q->plan_start + k];
    }
}

int engine_step(Engine *e) {
    Scheduler *s = e->sch;
    EngineStep *st = &e->steps[e->cur], *fl = &e->steps[!e->cur];
    ASSERT(!st->live, "planning over a step in flight");
    double t_plan = e->mark = engine_now_s();
    int n = scheduler_plan(s);
    if (n == 0) {
        if (!fl->live) return 0;
        engine_step_drain(e); /* nothing new to compute: the step in flight ends (its tokens may plan more) */
        return 1;
    }
    int want_exp = 0, lora = s->n_lora_tok > 0;
    for (int i = 0; i < s->n_sched; i++) {
        EngineRequest *r = s->sched[i]->req;
        engine_mark_started(e, r);
        want_exp |= r->p.want_experts && e->E > 0;
    }
    /* device sampling: the logits stay on the device unless a fallback fetches them */
    int dev = step_on_device(e, s);
    /* a step that needs the host ends the one in flight first, and does not stay in flight itself;
     * routed experts do not: they come back with the step's sampled results */
    int keep = e->async && dev;
    if (fl->live && !keep) {
        step_end(e, fl); /* a sequence it ends leaves the planned batch (scheduler_remove) */
        if (s->n_tok == 0) { /* every planned sequence ended in it */
            scheduler_unplan(s);
            phase_to(e, &e->st.schedule);
            e->st.step += e->mark - t_plan;
            return 1;
        }
        batch_take_tokens(s);
    }
    int pending = fl->live ? fl->n_dev_rows : 0;
    Batch b = { .n_tokens = s->n_tok, .tokens = s->tok, .n_pending = pending, .pos = s->pos, .seq = s->seqi,
                .n_seqs = s->n_sched, .block_table = s->tables, .n_out = s->n_out, .out_rows = s->out_rows };
    if (e->be.set_expert_capture) e->be.set_expert_capture(e->be.ctx, want_exp ? st->experts : NULL);
    if (e->be.set_lora_tokens) e->be.set_lora_tokens(e->be.ctx, lora ? s->lora : NULL);
    Err err = { 0 };
    st->prefill = 0;
    for (int i = 0; i < s->n_sched; i++) st->prefill += s->sched[i]->plan_n > 1 ? s->sched[i]->plan_n : 0;
    phase_to(e, &e->st.schedule);
    int fwd = e->be.forward(e->be.ctx, &b, dev ? NULL : e->logits, &err);
    phase_to(e, &e->st.forward);
    if (fwd < 0) {
        /* a bug: the scheduler built a batch the backend refused */
        log_error("engine: forward failed (%s:%d %s); aborting the %d sequences of this step", err.file,
                  err.line, err.msg, s->n_sched);
        /* queue their aborts now (every request is alive), applied at the next boundary */
        pthread_mutex_lock(&e->mu);
        for (int i = 0; i < s->n_sched; i++) engine_cmd_abort_locked(e, s->sched[i]->req);
        pthread_mutex_unlock(&e->mu);
        scheduler_unplan(s); /* before step_end: what it ends need not leave a batch that will not run */
        if (fl->live) step_end(e, fl);
        phase_to(e, &e->st.schedule);
        e->st.step += e->mark - t_plan;
        return 1;
    }
    scheduler_commit(s);
    int n_sched = s->n_sched;
    st->n_jobs = 0;
    st->on_dev = 0;
    st->n_dev_rows = 0;
    st->n_pexp = 0;
    st->capture = want_exp;
    st->on_host = !dev;
    st->t_plan = t_plan;
    for (int i = 0; i < n_sched; i++) {
        Seq *q = s->sched[i];
        if (q->state != SEQ_RUNNING) continue; /* its request was aborted in this loop */
        prompt_outputs(e, st, q);
        if (q->plan_sample_row < 0) continue;
        const float *row = e->logits + (size_t)q->plan_sample_row * e->mc.vocab;
        const int32_t *xrow = want_exp ? st->experts + (size_t)(q->plan_tok0 + q->plan_n - 1) * e->E : NULL;
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
                    st->jobs[st->n_jobs++] = (SampleJob){ sib, row, xrow, -1, -1, sib->n_tokens, 0 };
                else scheduler_enqueue(s, sib, 0);
            }
        }
        st->jobs[st->n_jobs++] = (SampleJob){ q, row, xrow, -1, -1, q->n_tokens, 0 };
    }
    phase_to(e, &e->st.schedule);
    st->live = 1;
    int fallback = 0;
    if (dev && st->n_jobs > 0) {
        /* rows whose sampling reads the previous token on the host wait for it */
        for (int i = 0; fl->live && i < st->n_jobs; i++)
            if (st->jobs[i].q && seq_pending(st->jobs[i].q) && job_needs_history(&st->jobs[i])) step_end(e, fl);
        phase_to(e, &e->st.schedule);
        st->slot = fl->live ? !fl->slot : 0;
        st->on_dev = sample_device(e, st, b.n_out);
        if (!st->on_dev) {
            fallback = 1;
            keep = 0;
            if (fl->live) step_end(e, fl); /* the host's sampling reads the history */
            e->be.fetch_logits(e->be.ctx, e->logits, b.n_out);
            st->on_host = 1;
        }
        phase_to(e, &e->st.device);
    } else if (fl->live) {
        step_end(e, fl);
    }
    if (st->n_jobs == 0) keep = 0;
    if (keep) {
        /* placeholders: the next plan schedules these positions, the next forward
         * takes their tokens from the device; a sequence's last token gets none */
        for (int i = 0; i < st->n_jobs; i++) {
            SampleJob *j = &st->jobs[i];
            Seq *q = j->q;
            if (!q || j->dev_row < 0 || j->pos - q->n_prompt + 1 >= q->req->max_new || j->pos + 1 >= q->max_len) continue;
            ASSERT(q->n_tokens == j->pos, "a placeholder at %d of a sequence of %d tokens", j->pos, q->n_tokens);
            q->tokens[q->n_tokens++] = -1 - j->dev_row;
            j->held = 1;
        }
        if (fl->live) {
            step_end(e, fl);
            pthread_mutex_lock(&e->mmu);
            e->m.async_steps++;
            pthread_mutex_unlock(&e->mmu);
        }
        phase_to(e, &e->st.schedule);
        e->st.step += e->mark - t_plan;
        step_count(e, st, st->on_dev, fallback);
        e->cur = !e->cur; /* st stays in flight */
        return 1;
    }
    ASSERT(!fl->live, "a step in flight behind a step that ends now");
    step_end(e, st);
    e->st.step += e->mark - t_plan;
    step_count(e, st, st->on_dev, fallback);
    return 1;
}
