/*
 * engine_control.c - engine control as a command queue: engine_submit,
 * engine_abort / release, engine_pause (three modes), engine_resume and
 * engine_run_exclusive each queue one EngineCmd (engine_internal.h); the
 * engine thread applies the queued commands between two steps, in the order
 * they were queued, then runs one step.
 *
 * Guarantees: a command is applied only between steps (no forward pass in
 * flight); engine_pause returns once the pause took effect (PAUSE_WAIT: once
 * nothing started is left, or a resume came first); engine_run_exclusive
 * returns fn's status after fn ran; an abort takes effect at the next step
 * boundary; a request is freed only when both the engine and the consumer
 * let go (a queued abort is dropped at retire, so it never outlives it).
 * Memory: commands live in the request, the Engine or the blocked caller's
 * stack frame; nothing here allocates.
 *
 * Not here: the thread loop (engine.c), one step (engine_step.c), request
 * storage and the consumer API (engine_request.c).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "engine_internal.h"

/* ---- the queue (all under e->mu) ---- */
static void cmd_push(Engine *e, EngineCmd *c) {
    ASSERT(!c->queued, "command of kind %d queued twice", (int)c->kind);
    c->next = NULL;
    c->prev = e->cmd_tail;
    if (e->cmd_tail) e->cmd_tail->next = c; else e->cmd_head = c;
    e->cmd_tail = c;
    c->queued = 1;
    e->n_cmds++;
    pthread_cond_signal(&e->cv);
}

static void cmd_unlink(Engine *e, EngineCmd *c) {
    ASSERT(c->queued, "unlinking a command that is not queued");
    if (c->prev) c->prev->next = c->next; else e->cmd_head = c->next;
    if (c->next) c->next->prev = c->prev; else e->cmd_tail = c->prev;
    c->prev = c->next = NULL;
    c->queued = 0;
    e->n_cmds--;
}

static EngineCmd *cmd_pop(Engine *e) {
    EngineCmd *c = e->cmd_head;
    if (c) cmd_unlink(e, c);
    return c;
}

/* Complete a blocking command; its caller's frame may vanish right after. */
static void cmd_complete(Engine *e, EngineCmd *c, int status) {
    pthread_mutex_lock(&e->mu);
    c->status = status;
    c->done = 1;
    pthread_cond_broadcast(&e->cv_done);
    pthread_mutex_unlock(&e->mu);
}

/* Queue c and wait for its completion (under e->mu). */
static void cmd_call_locked(Engine *e, EngineCmd *c) {
    cmd_push(e, c);
    while (!c->done) pthread_cond_wait(&e->cv_done, &e->mu);
}

void engine_cmd_abort_locked(Engine *e, EngineRequest *r) {
    if (!r->engine_gone && !r->abort_cmd.queued) cmd_push(e, &r->abort_cmd);
}

void engine_cmd_forget_locked(Engine *e, EngineCmd *c) { cmd_unlink(e, c); }

/* ---- the API (any thread) ---- */
static _Atomic uint64_t seed_counter;

int engine_submit(Engine *e, const EngineRequestParams *p, EngineRequest **out, Err *err) {
    *out = NULL;
    if (engine_check_params(e, p, err) < 0) {
        pthread_mutex_lock(&e->mmu);
        e->m.requests_rejected++;
        pthread_mutex_unlock(&e->mmu);
        return -1;
    }
    EngineRequest *r = engine_request_new(e, p, err);
    if (!r) {
        pthread_mutex_lock(&e->mmu);
        e->m.requests_rejected++;
        pthread_mutex_unlock(&e->mmu);
        return -1;
    }
    if (!r->p.sampling.has_seed) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r->p.sampling.seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^
                             (atomic_fetch_add(&seed_counter, 1) * 0x9e3779b97f4a7c15ull);
    }
    r->t_submit = engine_now_s();
    pthread_mutex_lock(&e->mu);
    if (e->stop || e->n_unstarted >= e->cfg.max_waiting) {
        int stopping = e->stop;
        pthread_mutex_unlock(&e->mu);
        engine_request_destroy(r);
        pthread_mutex_lock(&e->mmu);
        e->m.requests_rejected++;
        pthread_mutex_unlock(&e->mmu);
        if (stopping) return ERR(err, 503, "engine is shutting down");
        return ERR(err, 503, "waiting queue full (%d requests); retry later", e->cfg.max_waiting);
    }
    r->id = ++e->next_id;
    e->n_unstarted++;
    cmd_push(e, &r->submit_cmd);
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_lock(&e->mmu);
    e->m.requests_submitted++;
    e->m.prompt_tokens += (uint64_t)p->n_prompt * (uint64_t)p->n;
    pthread_mutex_unlock(&e->mmu);
    *out = r;
    return 0;
}

void engine_abort(Engine *e, EngineRequest *r) {
    pthread_mutex_lock(&e->mu);
    engine_cmd_abort_locked(e, r);
    pthread_mutex_unlock(&e->mu);
}

int engine_pause(Engine *e, PauseMode mode, Err *err) {
    ENSURE(err, mode == PAUSE_ABORT || mode == PAUSE_WAIT || mode == PAUSE_KEEP, 400, "unknown pause mode %d",
           (int)mode);
    EngineCmd c = { .kind = CMD_PAUSE, .a.mode = mode };
    pthread_mutex_lock(&e->mu);
    if (!e->stop) cmd_call_locked(e, &c);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

void engine_resume(Engine *e) {
    pthread_mutex_lock(&e->mu);
    e->pause_pub = 0;
    if (!e->stop) {
        /* one resume node: a resume after commands queued behind an earlier
         * one must come after them too, so move it to the tail */
        if (e->resume_cmd.queued) cmd_unlink(e, &e->resume_cmd);
        cmd_push(e, &e->resume_cmd);
    }
    pthread_mutex_unlock(&e->mu);
}

int engine_is_paused(Engine *e) {
    pthread_mutex_lock(&e->mu);
    int p = e->pause_pub;
    pthread_mutex_unlock(&e->mu);
    return p;
}

int engine_run_exclusive(Engine *e, EngineExclusiveFn fn, void *ctx, int bump_version, Err *err) {
    EngineCmd c = { .kind = CMD_EXCLUSIVE, .a.x = { fn, ctx, bump_version }, .err = err };
    pthread_mutex_lock(&e->mu);
    if (e->stop) {
        pthread_mutex_unlock(&e->mu);
        return ERR(err, 503, "engine is shutting down");
    }
    cmd_call_locked(e, &c);
    pthread_mutex_unlock(&e->mu);
    return c.status;
}

uint64_t engine_weight_version(Engine *e) { return atomic_load(&e->version); }

void engine_lora_changed(Engine *e, int slot, uint32_t version) {
    ASSERT(slot >= 0 && slot < ENGINE_MAX_LORAS && slot < SCHED_MAX_LORAS, "LoRA slot %d", slot);
    e->lora_version[slot] = version;
    scheduler_lora_retag(e->sch, slot);
}

/* ---- the engine thread ---- */
static void set_paused(Engine *e) {
    e->paused = 1;
    e->sch->admit = 0;
    pthread_mutex_lock(&e->mu);
    e->pause_pub = 1;
    pthread_mutex_unlock(&e->mu);
}

static void complete_pause_waiters(Engine *e) {
    while (e->pause_waiters) {
        EngineCmd *c = e->pause_waiters;
        e->pause_waiters = c->next;
        cmd_complete(e, c, 0);
    }
}

/* Requests that have a sequence admitted and not finished. */
static int in_flight(Engine *e) {
    int n = 0;
    for (EngineRequest *r = e->active; r; r = r->next)
        for (int i = 0; i < r->n; i++) n += r->seqs[i].started && r->seqs[i].state != SEQ_DONE;
    return n;
}

static void apply_submit(Engine *e, EngineRequest *r) {
    r->prev = NULL;
    r->next = e->active;
    if (e->active) e->active->prev = r;
    e->active = r;
    r->seqs[0].arrival = ++e->arrival << 16;
    for (int i = 1; i < r->n; i++) r->seqs[i].arrival = r->seqs[0].arrival + (uint64_t)i;
    scheduler_enqueue(e->sch, &r->seqs[0], 0);
}

static void apply_pause(Engine *e, EngineCmd *c) {
    PauseMode mode = c->a.mode;
    e->sch->admit = 0;
    if (mode == PAUSE_ABORT)
        for (EngineRequest *r = e->active, *nx; r; r = nx) { nx = r->next; engine_request_abort_now(e, r); }
    if (mode == PAUSE_WAIT) {
        /* started sequences run on; completed by engine_check_pause_wait or a resume */
        e->sch->admit = 2;
        c->next = e->pause_waiters;
        e->pause_waiters = c;
        return;
    }
    set_paused(e);
    cmd_complete(e, c, 0);
}

static void apply_resume(Engine *e) {
    e->paused = 0;
    e->sch->admit = 1;
    pthread_mutex_lock(&e->mu);
    e->pause_pub = 0;
    pthread_mutex_unlock(&e->mu);
    complete_pause_waiters(e); /* resumed before the wait completed */
}

static void apply_exclusive(Engine *e, EngineCmd *c) {
    Err xe = { 0 };
    int st = c->a.x.fn(c->a.x.ctx, &xe);
    if (st == 0 && c->a.x.bump) {
        uint64_t v = atomic_load(&e->version) + 1;
        atomic_store(&e->version, v);
        scheduler_set_version(e->sch, v);
    }
    if (c->err) *c->err = xe; /* the caller is blocked on c: its err is ours to write */
    cmd_complete(e, c, st);
}

void engine_apply_commands(Engine *e) {
    /* only what is queued now: a steady stream of submissions cannot starve steps */
    pthread_mutex_lock(&e->mu);
    int budget = e->n_cmds;
    pthread_mutex_unlock(&e->mu);
    while (budget-- > 0) {
        /* one at a time: applying one may retire a request and drop its queued abort */
        pthread_mutex_lock(&e->mu);
        EngineCmd *c = cmd_pop(e);
        pthread_mutex_unlock(&e->mu);
        if (!c) break;
        /* a pause or an exclusive function (a weight update) runs with no step in
         * flight: its tokens carry the version of the weights that computed them */
        if (c->kind != CMD_SUBMIT && c->kind != CMD_ABORT) engine_step_drain(e);
        switch (c->kind) {
        case CMD_SUBMIT: apply_submit(e, c->a.req); break;
        case CMD_ABORT: engine_request_abort_now(e, c->a.req); break;
        case CMD_PAUSE: apply_pause(e, c); break;
        case CMD_RESUME: apply_resume(e); break;
        case CMD_EXCLUSIVE: apply_exclusive(e, c); break;
        }
    }
}

void engine_check_pause_wait(Engine *e) {
    if (!e->pause_waiters || in_flight(e) > 0) return;
    set_paused(e);
    complete_pause_waiters(e);
}

void engine_drain_commands(Engine *e) {
    engine_step_drain(e);
    for (;;) {
        pthread_mutex_lock(&e->mu);
        EngineCmd *c = cmd_pop(e);
        pthread_mutex_unlock(&e->mu);
        if (!c) break;
        switch (c->kind) {
        case CMD_SUBMIT: apply_submit(e, c->a.req); break; /* aborted with the rest below */
        case CMD_ABORT: case CMD_RESUME: break;
        case CMD_PAUSE: cmd_complete(e, c, 0); break;
        case CMD_EXCLUSIVE: cmd_complete(e, c, ERR(c->err, 503, "engine is shutting down")); break;
        }
    }
    complete_pause_waiters(e);
}

/* engine_flush_prefix_cache: forget every key between two steps (the engine
 * thread owns the block manager); blocks in use stay with their sequences. */
static int flush_fn(void *ctx, Err *err) {
    (void)err;
    Engine *e = ctx;
    block_manager_invalidate(e->bm);
    return 0;
}

int engine_flush_prefix_cache(Engine *e, Err *err) { return engine_run_exclusive(e, flush_fn, e, 0, err); }
