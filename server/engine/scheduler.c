/*
 * scheduler.c - step planning, preemption and prefix-cache admission
 * (policy in scheduler.h). Everything here is bookkeeping over arrays
 * allocated at creation; no allocation per step.
 */
#include "scheduler.h"

#include <stdlib.h>
#include <string.h>

#include "check.h"

Scheduler *scheduler_create(BlockManager *bm, int max_running, int max_batched, int max_model_len,
                            int lp_rows_max, int max_rows) {
    ASSERT(max_rows >= 1, "max_rows %d", max_rows);
    Scheduler *s = xcalloc(1, sizeof *s);
    s->bm = bm;
    s->max_running = max_running;
    s->max_batched = max_batched;
    s->block_size = block_manager_block_size(bm);
    s->max_blocks = (max_model_len + s->block_size - 1) / s->block_size;
    s->lp_rows_max = lp_rows_max;
    s->max_rows = max_rows;
    s->admit = 1;
    s->running = xcalloc(max_running, sizeof(Seq *));
    s->sched = xcalloc(max_running, sizeof(Seq *));
    s->tok = xmalloc(max_batched * sizeof(int32_t));
    s->pos = xmalloc(max_batched * sizeof(int32_t));
    s->seqi = xmalloc(max_batched * sizeof(int32_t));
    s->lora = xmalloc(max_batched * sizeof(int32_t));
    for (int i = 0; i < SCHED_MAX_LORAS; i++) s->lora_tag[i] = ++s->next_tag;
    s->out_rows = xmalloc((size_t)(max_running + lp_rows_max) * sizeof(int32_t));
    s->tables = xcalloc(max_running, sizeof(int32_t *));
    s->cand = xcalloc((size_t)2 * max_running, sizeof(Seq *));
    s->groups = xcalloc((size_t)2 * max_running, sizeof(RowGroup));
    return s;
}

void scheduler_free(Scheduler *s) {
    if (!s) return;
    free(s->running); free(s->sched); free(s->tok); free(s->pos); free(s->seqi); free(s->lora);
    free(s->out_rows); free(s->tables); free(s->cand); free(s->groups);
    free(s);
}

void scheduler_enqueue(Scheduler *s, Seq *q, int front) {
    q->state = SEQ_WAITING;
    if (front) {
        q->wprev = NULL;
        q->wnext = s->wait_head;
        if (s->wait_head) s->wait_head->wprev = q; else s->wait_tail = q;
        s->wait_head = q;
    } else {
        q->wnext = NULL;
        q->wprev = s->wait_tail;
        if (s->wait_tail) s->wait_tail->wnext = q; else s->wait_head = q;
        s->wait_tail = q;
    }
    s->n_waiting++;
}

static void wait_unlink(Scheduler *s, Seq *q) {
    if (q->wprev) q->wprev->wnext = q->wnext; else s->wait_head = q->wnext;
    if (q->wnext) q->wnext->wprev = q->wprev; else s->wait_tail = q->wprev;
    q->wprev = q->wnext = NULL;
    s->n_waiting--;
}

static void release_blocks(Scheduler *s, Seq *q) {
    for (int i = 0; i < q->n_blocks; i++) block_manager_unref(s->bm, q->blocks[i]);
    q->n_blocks = 0;
    q->n_computed = 0;
    q->n_keys = 0;
}

static void running_insert(Scheduler *s, Seq *q) {
    ASSERT(s->n_running < s->max_running, "running list full (%d)", s->max_running);
    int i = s->n_running;
    while (i > 0 && s->running[i - 1]->arrival > q->arrival) { s->running[i] = s->running[i - 1]; i--; }
    s->running[i] = q;
    s->n_running++;
    q->state = SEQ_RUNNING;
    q->started = 1;
}

static void running_unlink(Scheduler *s, Seq *q) {
    int i = 0;
    while (i < s->n_running && s->running[i] != q) i++;
    if (i == s->n_running) return;
    memmove(s->running + i, s->running + i + 1, (size_t)(s->n_running - i - 1) * sizeof(Seq *));
    s->n_running--;
}

void scheduler_remove(Scheduler *s, Seq *q) {
    if (q->state == SEQ_WAITING) wait_unlink(s, q);
    else if (q->state == SEQ_RUNNING) running_unlink(s, q);
    release_blocks(s, q);
    q->state = SEQ_DONE;
    ASSERT(s->n_running >= 0 && s->n_waiting >= 0, "running %d, waiting %d", s->n_running, s->n_waiting);
    if (s->planned) scheduler_drop_finished(s); /* no planned row may point at it (its request may go) */
}

static void preempt(Scheduler *s, Seq *q) {
    running_unlink(s, q);
    release_blocks(s, q);
    scheduler_enqueue(s, q, 1);
    s->preemptions++;
}

/* Make q's block table cover positions [0, end). Returns 0 or -1 (pool empty). */
static int grow(Scheduler *s, Seq *q, int end) {
    int need = (end + s->block_size - 1) / s->block_size;
    ASSERT(need <= s->max_blocks, "a sequence needs %d blocks, its table holds %d", need, s->max_blocks);
    if (need - q->n_blocks > block_manager_n_available(s->bm)) return -1;
    while (q->n_blocks < need) q->blocks[q->n_blocks++] = block_manager_alloc(s->bm);
    return 0;
}

/* Take every cached full block of q's token prefix (keeping at least one
 * token to compute, so the last position's logits come out). */
uint64_t scheduler_cache_version(const Scheduler *s, const Seq *q) {
    ASSERT(s->version < (1ull << SCHED_TAG_SHIFT), "weight version %llu above 2^%d", (unsigned long long)s->version,
           SCHED_TAG_SHIFT);
    return q->lora_slot < 0 ? s->version : s->version | s->lora_tag[q->lora_slot] << SCHED_TAG_SHIFT;
}

static void prefix_lookup(Scheduler *s, Seq *q) {
    int bs = s->block_size;
    uint64_t parent = q->salt, ver = scheduler_cache_version(s, q);
    q->kv_version = ver;
    if (q->no_prefix_lookup || q->n_blocks > 0) return;
    int full = q->n_tokens / bs;
    ASSERT(q->n_tokens == 0 || q->tokens[q->n_tokens - 1] >= 0, "prefix lookup over a placeholder token");
    for (int i = 0; i < full; i++) {
        const int32_t *t = q->tokens + (size_t)i * bs;
        uint64_t key = block_manager_key(s->bm, parent, ver, t);
        int32_t id = block_manager_lookup(s->bm, key, parent, ver, t);
        if (id < 0) break;
        q->blocks[q->n_blocks++] = id;
        q->keys[q->n_keys++] = key;
        parent = key;
    }
    if (q->n_blocks * bs == q->n_tokens) {
        block_manager_unref(s->bm, q->blocks[--q->n_blocks]);
        q->n_keys--;
    }
    q->n_computed = q->n_blocks * bs;
}

/* Tokens q would compute now, given the budget, the prompt-log-prob rows left
 * and its logits rows this step (q->row_allow): a chunk that would produce
 * more rows than allowed is cut (a prefill stops before its last token). */
static int chunk_len(const Seq *q, int budget, int lp_left) {
    int n = q->n_tokens - q->n_computed;
    if (n > budget) n = budget;
    if (q->rows_all && q->n_computed < q->n_prompt) {
        if (n > lp_left + 1) n = lp_left + 1;
        if (n > q->row_allow) n = q->row_allow; /* one row per token */
    } else if (q->n_computed + n == q->n_tokens && q->row_allow < 1) {
        n--; /* its last token is the row: next step */
    }
    return n;
}

/* ---- step 0: the logits rows of this step, shared between requests ---- */

/* Rows q would produce if it got every token it needs (an estimate for the
 * shares; chunk_len enforces the grant). */
static int row_demand(const Scheduler *s, const Seq *q) {
    int left = q->n_tokens - q->n_computed;
    if (left <= 0) return 0;
    if (q->rows_all && q->n_computed < q->n_prompt) return left < s->lp_rows_max + 1 ? left : s->lp_rows_max + 1;
    return left <= s->max_batched ? 1 : 0;
}

static int cmp_cand(const void *a, const void *b) {
    const Seq *x = *(Seq *const *)a, *y = *(Seq *const *)b;
    if (x->req != y->req) return (uintptr_t)x->req < (uintptr_t)y->req ? -1 : 1;
    if (x->last_sched != y->last_sched) return x->last_sched < y->last_sched ? -1 : 1;
    return x->arrival < y->arrival ? -1 : x->arrival > y->arrival;
}

static int cmp_demand(const void *a, const void *b) {
    const RowGroup *x = a, *y = b;
    if (x->demand != y->demand) return x->demand < y->demand ? -1 : 1;
    if (x->served != y->served) return x->served < y->served ? -1 : 1;
    return x->first - y->first;
}

static int cmp_served(const void *a, const void *b) {
    const RowGroup *x = a, *y = b;
    if (x->served != y->served) return x->served < y->served ? -1 : 1;
    return x->first - y->first;
}

/* Set row_allow of every sequence this step may schedule: running ones and
 * the waiting ones admission would look at. Max-min fair over requests
 * (water filling in order of demand), the remainder of the even split to the
 * requests served longest ago; inside a request, to its sequences scheduled
 * longest ago. O(c log c) over c <= 2 * max_running candidates. */
static void share_rows(Scheduler *s) {
    int nc = 0;
    for (int i = 0; i < s->n_running; i++) s->cand[nc++] = s->running[i];
    int slots = s->max_running - s->n_running;
    for (Seq *q = s->wait_head; q && slots > 0; q = q->wnext) {
        q->row_allow = 0;
        if (s->admit == 0 || (s->admit == 2 && !q->started)) continue;
        s->cand[nc++] = q;
        slots--;
    }
    int total = 0;
    for (int i = 0; i < nc; i++) total += row_demand(s, s->cand[i]);
    s->contended = total > s->max_rows;
    if (!s->contended) { /* everyone gets all */
        for (int i = 0; i < nc; i++) s->cand[i]->row_allow = s->lp_rows_max + 1;
        return;
    }
    qsort(s->cand, (size_t)nc, sizeof *s->cand, cmp_cand);
    int ng = 0;
    for (int i = 0; i < nc; i++) {
        Seq *q = s->cand[i];
        if (ng == 0 || s->groups[ng - 1].req != q->req)
            s->groups[ng++] = (RowGroup){ .req = q->req, .first = i };
        RowGroup *g = &s->groups[ng - 1];
        g->n++;
        g->demand += row_demand(s, q);
        if (q->last_sched > g->served) g->served = q->last_sched;
    }
    qsort(s->groups, (size_t)ng, sizeof *s->groups, cmp_demand);
    int left = s->max_rows, m = ng, i = 0;
    for (; i < ng && s->groups[i].demand <= left / m; i++, m--) {
        s->groups[i].quota = s->groups[i].demand;
        left -= s->groups[i].demand;
    }
    if (i < ng) { /* the rest all want more than an even share of what is left */
        qsort(s->groups + i, (size_t)(ng - i), sizeof *s->groups, cmp_served);
        int share = left / m, extra = left % m;
        for (int j = i; j < ng; j++) s->groups[j].quota = share + (j - i < extra);
    }
    for (int j = 0; j < ng; j++) {
        RowGroup *g = &s->groups[j];
        int quota = g->quota;
        for (int k = 0; k < g->n; k++) { /* oldest-scheduled first (cmp_cand) */
            Seq *q = s->cand[g->first + k];
            int d = row_demand(s, q), give = d < quota ? d : quota;
            if (d > 0 && !(q->rows_all && q->n_computed < q->n_prompt) && give < d) give = 0;
            q->row_allow = give;
            quota -= give;
            /* stamped in grant order (oldest first), so the rotation is a queue;
             * a grant the token budget then cannot honour still counts */
            if (give > 0) q->last_sched = ++s->served;
        }
    }
}

/* q's chunk of n tokens from n_computed into the batch (no fairness stamp). */
static void batch_put(Scheduler *s, Seq *q, int n) {
    int si = s->n_sched++;
    s->sched[si] = q;
    s->tables[si] = q->blocks;
    q->plan_start = q->n_computed;
    q->plan_n = n;
    q->plan_tok0 = s->n_tok;
    for (int i = 0; i < n; i++) {
        s->tok[s->n_tok] = q->tokens[q->n_computed + i];
        s->pos[s->n_tok] = q->n_computed + i;
        s->seqi[s->n_tok] = si;
        s->lora[s->n_tok] = q->lora_slot;
        s->n_lora_tok += q->lora_slot >= 0;
        s->n_tok++;
    }
    int end = q->n_computed + n;
    q->plan_row0 = s->n_out;
    q->plan_rows = 0;
    q->plan_sample_row = -1;
    if (q->rows_all && q->n_computed < q->n_prompt) {
        for (int i = 0; i < n; i++) s->out_rows[s->n_out++] = q->plan_tok0 + i;
        q->plan_rows = n;
        if (end == q->n_tokens) q->plan_sample_row = q->plan_row0 + n - 1;
    } else if (end == q->n_tokens) {
        s->out_rows[s->n_out++] = q->plan_tok0 + n - 1;
        q->plan_rows = 1;
        q->plan_sample_row = q->plan_row0;
    }
}

static void add_to_batch(Scheduler *s, Seq *q, int n) {
    batch_put(s, q, n);
    if (q->plan_rows > 0 && !s->contended) q->last_sched = ++s->served; /* else stamped at the grant */
}

void scheduler_drop_finished(Scheduler *s) {
    int n = s->n_sched, kept = 0;
    for (int i = 0; i < n; i++)
        if (s->sched[i]->state == SEQ_RUNNING) s->sched[kept++] = s->sched[i];
    if (kept == n) return;
    s->n_sched = s->n_tok = s->n_out = s->n_lora_tok = 0;
    for (int i = 0; i < kept; i++) batch_put(s, s->sched[i], s->sched[i]->plan_n);
}

/* Steps 1 and 2 under the row grants of step 0. */
static void plan_pass(Scheduler *s) {
    int budget = s->max_batched, lp_left = s->lp_rows_max, preempted = 0;
    s->n_sched = s->n_tok = s->n_out = s->n_lora_tok = 0;
    for (int i = 0; i < s->n_running && budget > 0; i++) {
        Seq *q = s->running[i];
        int n = chunk_len(q, budget, lp_left);
        if (n <= 0) continue;
        while (grow(s, q, q->n_computed + n) < 0) {
            Seq *victim = s->running[s->n_running - 1];
            preempt(s, victim);
            preempted = 1;
            if (victim == q) break;
        }
        if (q->state != SEQ_RUNNING) break; /* q preempted itself: it was the newest */
        if (q->rows_all && q->n_computed < q->n_prompt) lp_left -= n - 1;
        add_to_batch(s, q, n);
        budget -= n;
    }
    if (!preempted && s->admit) {
        Seq *q = s->wait_head;
        while (q && budget > 0 && s->n_running < s->max_running) {
            Seq *next = q->wnext;
            if (s->admit == 2 && !q->started) { q = next; continue; }
            prefix_lookup(s, q);
            int n = chunk_len(q, budget, lp_left);
            if (n <= 0) { /* no row for it this step (all it needs is its last token): the next one may go */
                release_blocks(s, q);
                q = next;
                continue;
            }
            if (grow(s, q, q->n_computed + n) < 0) {
                release_blocks(s, q);
                break;
            }
            if (atomic_load(&q->n_cached) < 0) atomic_store(&q->n_cached, q->n_computed);
            if (!q->no_prefix_lookup) {
                s->lookup_tokens += (uint64_t)q->n_tokens;
                s->hit_tokens += (uint64_t)q->n_computed;
            }
            wait_unlink(s, q);
            running_insert(s, q);
            if (q->rows_all && q->n_computed < q->n_prompt) lp_left -= n - 1;
            add_to_batch(s, q, n);
            budget -= n;
            q = next;
        }
    }
}

int scheduler_plan(Scheduler *s) {
    share_rows(s);
    plan_pass(s);
    if (s->n_tok == 0 && s->contended) {
        /* The grants went to sequences this pass could not reach (a waiting
         * one behind a head that found no blocks). An empty plan would put the
         * engine to sleep with work queued; nothing happened in the pass (no
         * chunk: no allocation, no preemption), so plan once more with every
         * row allowed. */
        s->contended = 0;
        for (int i = 0; i < s->n_running; i++) s->running[i]->row_allow = s->lp_rows_max + 1;
        for (Seq *q = s->wait_head; q; q = q->wnext) q->row_allow = s->lp_rows_max + 1;
        plan_pass(s);
    }
    /* the batch's sequence indices follow s->sched; the running order may have
     * changed through admissions, which is fine: tables are per sched slot */
    s->planned = s->n_tok > 0;
    return s->n_tok;
}

void scheduler_unplan(Scheduler *s) { s->planned = 0; }

static void register_full(Scheduler *s, Seq *q) {
    int bs = s->block_size, full = q->n_computed / bs;
    /* async scheduling: the last token may be a placeholder (< 0) until its step
     * ends; its block is registered by a later commit, once the token is known */
    int last = q->n_tokens - 1;
    if (last >= 0 && q->tokens[last] < 0 && last < full * bs) full = last / bs;
    uint64_t ver = scheduler_cache_version(s, q);
    if (q->kv_version != ver) { q->n_keys = full; return; } /* stale K/V: never shared */
    for (int i = q->n_keys; i < full; i++) {
        uint64_t parent = i ? q->keys[i - 1] : q->salt;
        const int32_t *t = q->tokens + (size_t)i * bs;
        uint64_t key = block_manager_key(s->bm, parent, ver, t);
        block_manager_register(s->bm, q->blocks[i], key, parent, ver, t);
        q->keys[i] = key;
    }
    q->n_keys = full;
}

void scheduler_commit(Scheduler *s) {
    s->planned = 0;
    for (int i = 0; i < s->n_sched; i++) {
        Seq *q = s->sched[i];
        if (q->plan_start == 0 && q->n_computed == 0) q->kv_version = scheduler_cache_version(s, q);
        q->n_computed = q->plan_start + q->plan_n;
        ASSERT(q->n_computed <= q->n_tokens && q->n_computed <= q->n_blocks * s->block_size,
               "computed %d positions of %d tokens in %d blocks", q->n_computed, q->n_tokens, q->n_blocks);
        register_full(s, q);
    }
}

int scheduler_fork(Scheduler *s, Seq *from, Seq *to, void (*copy_block)(void *, int, int), void *ctx) {
    int bs = s->block_size, full = from->n_computed / bs;
    int partial = from->n_computed % bs != 0;
    if (s->n_running >= s->max_running) return -1;
    if (partial && block_manager_n_available(s->bm) < 1) return -1;
    for (int i = 0; i < full; i++) {
        block_manager_ref(s->bm, from->blocks[i]);
        to->blocks[i] = from->blocks[i];
        to->keys[i] = from->keys[i];
    }
    to->n_blocks = full;
    to->n_keys = from->n_keys < full ? from->n_keys : full;
    if (partial) {
        int32_t id = block_manager_alloc(s->bm);
        copy_block(ctx, from->blocks[full], id);
        to->blocks[to->n_blocks++] = id;
    }
    memcpy(to->tokens, from->tokens, (size_t)from->n_computed * sizeof(int32_t));
    to->n_tokens = to->n_computed = from->n_computed;
    to->kv_version = from->kv_version;
    if (to->state == SEQ_WAITING) wait_unlink(s, to);
    running_insert(s, to);
    return 0;
}

void scheduler_lora_retag(Scheduler *s, int slot) {
    ASSERT(slot >= 0 && slot < SCHED_MAX_LORAS, "LoRA slot %d", slot);
    if (s->next_tag + 1 >= 1ull << (64 - SCHED_TAG_SHIFT)) { /* tags ran out: start over on an empty cache */
        block_manager_invalidate(s->bm);
        s->next_tag = 0;
        for (int i = 0; i < SCHED_MAX_LORAS; i++) s->lora_tag[i] = ++s->next_tag;
    }
    s->lora_tag[slot] = ++s->next_tag;
}

void scheduler_set_version(Scheduler *s, uint64_t version) {
    s->version = version;
    block_manager_invalidate(s->bm);
}
