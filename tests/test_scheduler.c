/*
 * test_scheduler.c - the scheduler's per-step logits-row shares (scheduler.h,
 * step 0) driven without a model: sequences of fake requests are planned and
 * committed step after step, a token appended wherever a row was sampled, as
 * engine_step does. Checked: no step has more rows than max_rows; requests
 * get max-min fair shares (a one-sequence request its row every step beside
 * a 16-sequence one); inside a request the rows rotate so no sequence falls
 * behind by more than one token; more requests than rows rotate between
 * requests; prompt-log-prob chunks are cut to their share; when the rows
 * wanted fit, every sequence gets its row (work-conserving).
 * With the limit off (max_rows = every row) the share assertions fail: the
 * heavy request then takes 16 rows of every step.
 * Async scheduling's two hooks: a planned batch without the sequences that
 * ended meanwhile (scheduler_remove drops each at once, scheduler_drop_finished)
 * is the batch of the others, and a full block holding a placeholder token (< 0) is registered in the prefix
 * cache only once the token is known.
 */
#include <stdlib.h>
#include <string.h>

#include "block_manager.h"
#include "scheduler.h"
#include "test.h"

#define MAXLEN 128
#define BS 4

typedef struct Fake { int id; } Fake; /* a request: only its address matters */

static Fake g_req[32];

static Seq *seq_new(Fake *req, int index, uint64_t arrival, int n_prompt, int rows_all) {
    Seq *q = calloc(1, sizeof *q);
    q->req = (struct EngineRequest *)(void *)req;
    q->index = index;
    q->arrival = arrival;
    q->tokens = calloc(MAXLEN, sizeof(int32_t));
    q->blocks = calloc(MAXLEN / BS, sizeof(int32_t));
    q->keys = calloc(MAXLEN / BS, sizeof(uint64_t));
    for (int i = 0; i < n_prompt; i++) q->tokens[i] = 5 + (i * 7 + index * 3 + (int)arrival) % 97;
    q->n_tokens = q->n_prompt = n_prompt;
    q->max_len = MAXLEN;
    q->rows_all = rows_all;
    q->no_prefix_lookup = rows_all;
    q->lora_slot = -1; /* the base */
    return q;
}

static void seq_free(Seq *q) {
    free(q->tokens); free(q->blocks); free(q->keys); free(q);
}

/* One step: plan, commit, append a token where a row was sampled. Counts the
 * sampled rows per request (rows[request id]) and per sequence (got[]). */
static int step(Scheduler *s, int *rows, int *n_out) {
    int n = scheduler_plan(s);
    scheduler_commit(s);
    *n_out = s->n_out;
    for (int i = 0; i < s->n_sched; i++) {
        Seq *q = s->sched[i];
        if (q->plan_sample_row < 0) continue;
        rows[((Fake *)(void *)q->req)->id]++;
        q->tokens[q->n_tokens++] = 11;
    }
    return n;
}

static void test_heavy_beside_light(void) {
    BlockManager *bm = block_manager_create(512, BS, 0);
    Scheduler *s = scheduler_create(bm, 64, 256, MAXLEN, 64, 8);
    Seq *q[19];
    uint64_t t = 1;
    for (int i = 0; i < 16; i++) q[i] = seq_new(&g_req[0], i, t++, 4, 0); /* n = 16 */
    for (int i = 0; i < 3; i++) q[16 + i] = seq_new(&g_req[1 + i], 0, t++, 4, 0);
    for (int i = 0; i < 19; i++) scheduler_enqueue(s, q[i], 0);
    int over = 0, light_missed = 0, heavy_short = 0;
    for (int k = 0; k < 32; k++) {
        int rows[4] = { 0 }, n_out = 0;
        step(s, rows, &n_out);
        over += n_out > 8;
        for (int j = 1; j <= 3; j++) light_missed += rows[j] != 1;
        heavy_short += rows[0] != 5;
    }
    T_ASSERT(over == 0, "%d steps had more than 8 logits rows", over);
    T_ASSERT(light_missed == 0, "a one-sequence request missed its row %d times beside an n = 16 one",
             light_missed);
    T_ASSERT(heavy_short == 0, "the n = 16 request did not get the other 5 rows in %d steps", heavy_short);
    /* 32 steps x 5 rows = 160 rows over 16 sequences: 10 tokens each, +-1 */
    int lo = 1 << 30, hi = 0;
    for (int i = 0; i < 16; i++) {
        int g = q[i]->n_tokens - q[i]->n_prompt;
        if (g < lo) lo = g;
        if (g > hi) hi = g;
    }
    T_ASSERT(hi - lo <= 1 && lo >= 9, "rotation inside the request: tokens per sequence from %d to %d", lo, hi);
    for (int i = 16; i < 19; i++)
        T_ASSERT(q[i]->n_tokens - q[i]->n_prompt == 32, "light sequence %d has %d tokens (want 32)", i,
                 q[i]->n_tokens - q[i]->n_prompt);
    for (int i = 0; i < 19; i++) { scheduler_remove(s, q[i]); seq_free(q[i]); }
    T_ASSERT(block_manager_n_used(bm) == 0, "every block released");
    scheduler_free(s);
    block_manager_free(bm);
}

static void test_work_conserving(void) {
    BlockManager *bm = block_manager_create(512, BS, 0);
    Scheduler *s = scheduler_create(bm, 64, 256, MAXLEN, 64, 8);
    Seq *q[7];
    for (int i = 0; i < 3; i++) q[i] = seq_new(&g_req[0], i, 1 + i, 6, 0);
    for (int i = 3; i < 7; i++) q[i] = seq_new(&g_req[i - 2], 0, 1 + i, 6, 0);
    for (int i = 0; i < 7; i++) scheduler_enqueue(s, q[i], 0);
    int short_steps = 0;
    for (int k = 0; k < 10; k++) {
        int rows[8] = { 0 }, n_out = 0;
        step(s, rows, &n_out);
        short_steps += n_out != 7;
    }
    T_ASSERT(short_steps == 0, "7 rows wanted, 8 allowed: %d steps did not give all 7", short_steps);
    for (int i = 0; i < 7; i++) { scheduler_remove(s, q[i]); seq_free(q[i]); }
    scheduler_free(s);
    block_manager_free(bm);
}

static void test_more_requests_than_rows(void) {
    BlockManager *bm = block_manager_create(512, BS, 0);
    Scheduler *s = scheduler_create(bm, 64, 256, MAXLEN, 64, 4);
    Seq *q[12];
    for (int i = 0; i < 12; i++) q[i] = seq_new(&g_req[i], 0, 1 + i, 3, 0);
    for (int i = 0; i < 12; i++) scheduler_enqueue(s, q[i], 0);
    int over = 0;
    int total[12] = { 0 };
    for (int k = 0; k < 30; k++) {
        int rows[12] = { 0 }, n_out = 0;
        step(s, rows, &n_out);
        over += n_out > 4;
        for (int j = 0; j < 12; j++) total[j] += rows[j];
    }
    int lo = 1 << 30, hi = 0;
    for (int j = 0; j < 12; j++) {
        if (total[j] < lo) lo = total[j];
        if (total[j] > hi) hi = total[j];
    }
    T_ASSERT(over == 0, "%d steps had more than 4 rows", over);
    /* 30 steps x 4 rows over 12 requests: 10 each, +-1 */
    T_ASSERT(hi - lo <= 1 && lo >= 9, "rows per request from %d to %d over 30 steps", lo, hi);
    for (int i = 0; i < 12; i++) { scheduler_remove(s, q[i]); seq_free(q[i]); }
    scheduler_free(s);
    block_manager_free(bm);
}

static void test_prompt_rows_cut(void) {
    BlockManager *bm = block_manager_create(512, BS, 0);
    Scheduler *s = scheduler_create(bm, 64, 256, MAXLEN, 64, 6);
    Seq *plp = seq_new(&g_req[0], 0, 1, 40, 1); /* prompt_logprobs: a row per prompt token */
    Seq *a = seq_new(&g_req[1], 0, 2, 4, 0), *b = seq_new(&g_req[2], 0, 3, 4, 0);
    scheduler_enqueue(s, plp, 0);
    scheduler_enqueue(s, a, 0);
    scheduler_enqueue(s, b, 0);
    int over = 0, light_missed = 0, steps = 0;
    while (plp->n_tokens == plp->n_prompt && steps < 40) {
        int rows[3] = { 0 }, n_out = 0;
        step(s, rows, &n_out);
        over += n_out > 6;
        light_missed += rows[1] != 1 || rows[2] != 1;
        steps++;
    }
    T_ASSERT(plp->n_tokens == plp->n_prompt + 1, "the prompt-log-prob sequence sampled its token");
    T_ASSERT(over == 0 && light_missed == 0, "rows over 6 in %d steps; light requests missed %d rows", over,
             light_missed);
    /* 40 rows at 4 a step: 10 steps */
    T_ASSERT(steps == 10, "40 prompt rows at 4 per step took %d steps (want 10)", steps);
    Seq *all[3] = { plp, a, b };
    for (int i = 0; i < 3; i++) { scheduler_remove(s, all[i]); seq_free(all[i]); }
    scheduler_free(s);
    block_manager_free(bm);
}

/* Never an empty step while work is queued, whatever the grants: a small KV
 * pool (preemption, blocked admissions), siblings, prompt-log-prob prompts,
 * 1 to 3 rows a step. Every sequence reaches its 12 tokens. */
static void test_never_stalls(void) {
    for (int rows = 1; rows <= 3; rows++) {
        BlockManager *bm = block_manager_create(40, BS, 1);
        Scheduler *s = scheduler_create(bm, 8, 16, MAXLEN, 8, rows);
        enum { NQ = 20 };
        Seq *q[NQ];
        for (int i = 0; i < NQ; i++) {
            int req = i / 2; /* pairs of siblings */
            q[i] = seq_new(&g_req[req], i % 2, 1 + i, 5 + (i * 7) % 16, req % 3 == 0);
            scheduler_enqueue(s, q[i], 0);
        }
        int done = 0, stalls = 0, steps = 0;
        while (done < NQ && steps < 20000) {
            int rowsn[32] = { 0 }, n_out = 0;
            int n = step(s, rowsn, &n_out);
            steps++;
            if (n == 0) { stalls++; break; }
            for (int i = 0; i < NQ; i++)
                if (q[i]->state == SEQ_RUNNING && q[i]->n_tokens - q[i]->n_prompt >= 12) {
                    scheduler_remove(s, q[i]);
                    done++;
                }
        }
        T_ASSERT(stalls == 0 && done == NQ, "max_rows %d: %d of %d sequences done after %d steps, %d empty steps",
                 rows, done, NQ, steps, stalls);
        for (int i = 0; i < NQ; i++) {
            if (q[i]->state != SEQ_DONE) scheduler_remove(s, q[i]);
            seq_free(q[i]);
        }
        scheduler_free(s);
        block_manager_free(bm);
    }
}

/* Plan a decode step of 4 sequences and a prefill chunk, end two of them,
 * drop them: the batch holds the others' chunks, consistently indexed. */
static void test_drop_finished(void) {
    BlockManager *bm = block_manager_create(64, BS, 0);
    Scheduler *s = scheduler_create(bm, 8, 64, MAXLEN, 8, 8);
    Seq *q[5];
    for (int i = 0; i < 4; i++) q[i] = seq_new(&g_req[i], 0, (uint64_t)i + 1, 5, 0);
    for (int i = 0; i < 4; i++) scheduler_enqueue(s, q[i], 0);
    int rows[8] = { 0 }, n_out = 0;
    step(s, rows, &n_out); /* the prompts, a token each */
    q[4] = seq_new(&g_req[4], 0, 9, 7, 0);
    scheduler_enqueue(s, q[4], 0);
    int n = scheduler_plan(s);
    T_ASSERT(n == 4 + 7 && s->n_sched == 5, "planned %d tokens of %d sequences", n, s->n_sched);
    scheduler_remove(s, q[1]);
    T_ASSERT(s->n_sched == 4 && s->n_tok == 3 + 7, "a sequence removed between plan and commit leaves the batch at "
             "once (before its request may be freed): %d sequences, %d tokens", s->n_sched, s->n_tok);
    scheduler_remove(s, q[4]);
    scheduler_drop_finished(s); /* nothing more to drop */
    int ok = s->n_sched == 3 && s->n_tok == 3 && s->n_out == 3;
    for (int i = 0; ok && i < s->n_sched; i++) {
        const Seq *p = s->sched[i];
        ok = p->state == SEQ_RUNNING && p != q[1] && p->plan_n == 1 && p->plan_tok0 == i && p->plan_row0 == i &&
             s->tok[i] == p->tokens[p->n_tokens - 1] && s->pos[i] == p->n_tokens - 1 && s->seqi[i] == i &&
             s->tables[i] == p->blocks && s->out_rows[i] == i && p->plan_sample_row == i;
    }
    T_ASSERT(ok, "the batch after dropping: %d sequences, %d tokens, %d rows", s->n_sched, s->n_tok, s->n_out);
    scheduler_commit(s);
    scheduler_remove(s, q[0]); /* after the commit the batch stays as it ran (the engine walks it) */
    T_ASSERT(s->n_sched == 3 && s->sched[0] == q[0], "a removal after the commit changed the batch: %d sequences",
             s->n_sched);
    for (int i = 0; i < 5; i++) {
        if (i != 0 && i != 1 && i != 4) scheduler_remove(s, q[i]);
        seq_free(q[i]);
    }
    scheduler_free(s);
    block_manager_free(bm);
}

/* A placeholder at the end of a full block keeps it out of the prefix cache
 * until the token is there; then the next commit registers it. */
static void test_placeholder_block(void) {
    BlockManager *bm = block_manager_create(64, BS, 1);
    Scheduler *s = scheduler_create(bm, 8, 64, MAXLEN, 8, 8);
    Seq *q = seq_new(&g_req[0], 0, 1, 2 * BS - 1, 0);
    scheduler_enqueue(s, q, 0);
    scheduler_plan(s);
    scheduler_commit(s); /* positions 0 .. 2 BS - 2: one full block registered */
    q->tokens[q->n_tokens++] = -1; /* the token of the step in flight */
    T_ASSERT(scheduler_plan(s) == 1 && s->tok[0] == -1, "the placeholder is planned");
    scheduler_commit(s);
    uint64_t k0 = q->keys[0];
    int32_t tail[BS];
    memcpy(tail, q->tokens + BS, sizeof tail);
    tail[BS - 1] = 42;
    uint64_t k1 = block_manager_key(bm, k0, 0, tail);
    T_ASSERT(q->n_keys == 1 && block_manager_lookup(bm, k1, k0, 0, tail) < 0,
             "a block holding a placeholder was registered (%d keys)", q->n_keys);
    q->tokens[2 * BS - 1] = 42; /* its step ended */
    q->tokens[q->n_tokens++] = 43;
    scheduler_plan(s);
    scheduler_commit(s);
    int32_t id = block_manager_lookup(bm, k1, k0, 0, tail);
    T_ASSERT(q->n_keys == 2 && id == q->blocks[1], "the block was not registered once its token was known (%d keys, "
             "block %d)", q->n_keys, id);
    if (id >= 0) block_manager_unref(bm, id);
    scheduler_remove(s, q);
    seq_free(q);
    scheduler_free(s);
    block_manager_free(bm);
}

int main(void) {
    for (int i = 0; i < 32; i++) g_req[i].id = i;
    test_heavy_beside_light();
    test_work_conserving();
    test_more_requests_than_rows();
    test_prompt_rows_cut();
    test_never_stalls();
    test_drop_finished();
    test_placeholder_block();
    return T_DONE();
}
