/*
 * scheduler.h - decides what one engine step computes: which sequences, how
 * many tokens of each (chunked prefill next to decodes), which KV blocks they
 * write, which logits rows come back. Owns the running list and the waiting
 * queue; preempts the newest running sequences when the KV pool is full.
 *
 * Policy, per step (budget = max_batched_tokens tokens):
 *   1. running sequences, oldest first, each get the tokens they still need
 *      (1 for a decode, a chunk of the rest for a prefill) as the budget
 *      allows. If their blocks cannot be allocated, the NEWEST running
 *      sequence is preempted (blocks released, back to the front of the
 *      waiting queue, recomputed later) until they can; a sequence that is
 *      itself the newest preempts itself. Running sequences never fail.
 *   2. if nothing was preempted, waiting sequences are admitted in FIFO order
 *      while a running slot, budget and blocks are left: first every cached
 *      full block of their token prefix is taken from the prefix cache, then
 *      blocks for the chunk are allocated. Admission never preempts.
 *   0. (before 1 and 2) logits rows - a sampled token or a prompt log-prob row
 *      each, and on the CPU most of a step's time - are limited to max_rows
 *      per step and shared max-min fairly between REQUESTS (not sequences):
 *      each request that wants rows gets min(its demand, a fair share), the
 *      shares' remainder going to the requests served longest ago, and inside
 *      a request the sequences scheduled longest ago go first. So one request
 *      with n = 16 untruncated masks or a long prompt_logprobs prompt takes at
 *      most its share of a step, and a decode next to it waits for at most
 *      max_rows rows, not for all of the heavy request's. Work-conserving:
 *      when the rows wanted fit, everyone gets all. A sequence without its
 *      rows this step still prefills (all but its last prompt token) or
 *      simply waits for the next step; none is starved, since the request
 *      served longest ago wins ties.
 * No deadlock: the pool holds at least one max_model_len sequence, and when
 * nothing runs every cached block is evictable.
 *
 * Not here: requests, sampling, threads (engine.c). Engine thread only.
 */
#ifndef SAMPLER_SCHEDULER_H
#define SAMPLER_SCHEDULER_H

#include <stdatomic.h>
#include <stdint.h>

#include "block_manager.h"

struct EngineRequest;

#define SCHED_MAX_LORAS 64
#define SCHED_TAG_SHIFT 40

typedef enum { SEQ_PENDING = 0, SEQ_WAITING, SEQ_RUNNING, SEQ_DONE } SeqState;

typedef struct Seq {
    struct EngineRequest *req;
    int index;            /* sample index within the request (RNG stream) */
    uint64_t arrival;     /* order: older first; preemption takes the largest */
    SeqState state;
    int started;          /* admitted at least once (PAUSE_WAIT lets these continue) */
    /* tokens: prompt then generated */
    int32_t *tokens;      /* [max_len] */
    int n_tokens, n_prompt, max_len;
    /* KV */
    int32_t *blocks;      /* [max_blocks] block table */
    int n_blocks;
    int n_computed;       /* positions [0, n_computed) hold valid K/V */
    uint64_t *keys;       /* [max_blocks] prefix-cache chain keys of leading full blocks */
    int n_keys;
    uint64_t kv_version;  /* weights of the first K/V; blocks register only if current */
    uint64_t salt;        /* cache_salt: the parent key of the first block (0: unsalted), so the prefix
                             cache finds only blocks registered under the same salt */
    _Atomic int n_cached; /* prompt positions the first admission found in the prefix cache; -1 before */
    int no_prefix_lookup; /* needs every position computed (prompt log-probs, experts) */
    int lora_slot;        /* LoRA adapter slot of the request, -1 base */
    int rows_all;         /* wants a logits row for every prefill token (prompt log-probs) */
    int lp_done;          /* prompt positions whose log-prob is published */
    uint64_t last_sched;  /* when it last got logits rows: Scheduler.served then (0: never) */
    int row_allow;        /* logits rows it may produce this step (step 0 above) */
    struct Seq *wprev, *wnext; /* waiting queue links */
    /* this step's plan */
    int plan_start, plan_n;   /* tokens [plan_start, plan_start + plan_n) */
    int plan_row0, plan_rows; /* their logits rows */
    int plan_sample_row;      /* row to sample the next token from, -1 if none */
    int plan_tok0;            /* index of the first token in the batch */
} Seq;

/* One request's claim on this step's logits rows (scheduler.c, step 0). */
typedef struct RowGroup {
    struct EngineRequest *req;
    int first, n;         /* its sequences: cand[first .. first + n) */
    int demand, quota;    /* rows wanted, rows granted */
    uint64_t served;      /* latest last_sched stamp of its sequences */
} RowGroup;

typedef struct Scheduler {
    int max_running, max_batched, block_size, max_blocks, lp_rows_max;
    int max_rows;         /* logits rows per step, shared fairly between requests */
    uint64_t served;      /* sequences given logits rows so far (last_sched stamps) */
    int contended;        /* this step wants more rows than max_rows */
    int admit;            /* 0: admit nothing; 1: everything; 2: only started sequences */
    uint64_t version;     /* current weight version */
    BlockManager *bm;
    Seq **running;        /* [max_running] by arrival */
    int n_running;
    Seq *wait_head, *wait_tail;
    int n_waiting;
    /* the planned batch */
    Seq **sched;          /* [max_running] */
    int n_sched;
    int32_t *tok, *pos, *seqi; /* [max_batched] */
    int32_t *lora;        /* [max_batched] LoRA slot per token (-1 base) */
    int n_lora_tok;       /* tokens of this plan with an adapter */
    uint64_t lora_tag[SCHED_MAX_LORAS]; /* prefix-cache tag per slot, >= 1, new per adapter content */
    uint64_t next_tag;    /* the last tag handed out */
    int32_t *out_rows;    /* [max_running + lp_rows_max] */
    const int32_t **tables; /* [max_running] */
    int n_tok, n_out;
    int planned;          /* 1 from scheduler_plan to scheduler_commit / scheduler_unplan: a sequence
                           * removed meanwhile leaves the batch at once (scheduler_remove) */
    /* scratch of the row shares: running plus up to max_running waiting */
    Seq **cand;           /* [2 * max_running] */
    RowGroup *groups;     /* [2 * max_running] */
    /* counters */
    uint64_t preemptions, lookup_tokens, hit_tokens;
} Scheduler;

/* max_rows >= 1: logits rows per step (step 0 of the policy). */
Scheduler *scheduler_create(BlockManager *bm, int max_running, int max_batched, int max_model_len,
                            int lp_rows_max, int max_rows);
void scheduler_free(Scheduler *s);

/* Queue a sequence (SEQ_WAITING). front: ahead of everything (preempted, forks). */
void scheduler_enqueue(Scheduler *s, Seq *q, int front);
/* Take a sequence out of the running list or waiting queue and release its
 * blocks (full registered ones stay in the prefix cache). State -> SEQ_DONE.
 * Between plan and commit it also leaves the planned batch (scheduler_drop_finished),
 * before its request may be freed: the step in flight can end a sequence of the
 * next plan (async scheduling, a host-needing step ends it before its forward). */
void scheduler_remove(Scheduler *s, Seq *q);
/* Plan one step into s->tok/pos/seqi/tables/out_rows. Returns the number of
 * tokens (0: nothing to do). */
int scheduler_plan(Scheduler *s);
/* Between plan and forward: take the sequences that are no longer running
 * (they ended while the plan waited; async scheduling) out of the planned
 * batch, the others keeping their chunks. */
void scheduler_drop_finished(Scheduler *s);
/* After the forward pass: advance n_computed and register full blocks (a
 * block holding a placeholder token, < 0, only once the token is known). */
void scheduler_commit(Scheduler *s);
/* The planned batch will not run (its forward failed, or every sequence of it
 * ended before it): nothing is committed, and the plan is no longer current. */
void scheduler_unplan(Scheduler *s);
/* Start sibling `to` as a copy of `from` (prompt fully computed, nothing
 * generated): shares full blocks, copies the partial last one via copy_block.
 * Returns 0, or -1 (no running slot or block; `to` untouched). */
int scheduler_fork(Scheduler *s, Seq *from, Seq *to, void (*copy_block)(void *, int, int), void *ctx);
/* The prefix-cache version of q's K/V: the weight version, and for an
 * adapter's sequence its slot's tag in the bits above SCHED_TAG_SHIFT (weight
 * versions stay below 2^SCHED_TAG_SHIFT). */
uint64_t scheduler_cache_version(const Scheduler *s, const Seq *q);
/* A new tag for slot (its adapter changed): what was cached under it is unreachable. */
void scheduler_lora_retag(Scheduler *s, int slot);
/* Forget the prefix cache (weight version changed to `version`). */
void scheduler_set_version(Scheduler *s, uint64_t version);

#endif
