/*
 * engine_internal.h - what the engine's source files share (private; the
 * public API is engine.h): the request and engine structs, the control
 * command, and the functions one engine file calls in another.
 *
 *   engine.c          create / free, the engine thread's loop, metrics
 *   engine_control.c  the command queue: submit, abort, pause, resume, exclusive
 *   engine_request.c  request storage, publishing, the consumer API, release
 *   engine_step.c     one step: plan, forward, sample, publish
 *
 * Locks (never nested): Engine.mu guards the command queue and the lifetime
 * flags of every request (engine_gone, consumer_gone); EngineRequest.mu
 * guards a request's published outputs; Engine.mmu guards the metrics. All
 * other state belongs to the engine thread.
 *
 * Not here: the scheduler (scheduler.h), the block pool (block_manager.h),
 * the sampling math (sampling.h).
 */
#ifndef SAMPLER_ENGINE_INTERNAL_H
#define SAMPLER_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "block_manager.h"
#include "engine.h"
#include "sampling_device.h"
#include "scheduler.h"
#include "threadpool.h"

#define ENGINE_MAX_N 1024

/* ---- control commands ----
 * Every change to what the engine thread does between two steps arrives as
 * one command in Engine's FIFO queue. A command lives where its caller
 * already has memory, never on the heap: SUBMIT and ABORT are embedded in the
 * request, RESUME in the Engine, PAUSE and EXCLUSIVE on the stack frame of the
 * caller, which blocks until `done`. */
typedef enum { CMD_SUBMIT, CMD_ABORT, CMD_PAUSE, CMD_RESUME, CMD_EXCLUSIVE } EngineCmdKind;

typedef struct EngineCmd {
    EngineCmdKind kind;
    struct EngineCmd *prev, *next; /* the queue (Engine.mu); PAUSE_WAIT waiters (engine thread) */
    int queued;                    /* in the queue (Engine.mu) */
    union {
        struct EngineRequest *req;  /* SUBMIT, ABORT */
        PauseMode mode;             /* PAUSE */
        struct { EngineExclusiveFn fn; void *ctx; int bump; } x; /* EXCLUSIVE */
    } a;
    /* completion of a blocking command (PAUSE, EXCLUSIVE), set under Engine.mu
     * and announced on Engine.cv_done; the engine never touches the command
     * after setting done (the caller's frame may be gone) */
    int done, status;
    Err *err;                      /* EXCLUSIVE: the caller's, or NULL */
} EngineCmd;

/* ---- requests ---- */
typedef struct SeqOut {
    TokenRecord *recs;  /* [max_new] */
    int32_t *top_ids;   /* [max_new, top_n] */
    float *top_lp;      /* [max_new, top_n] values in the request's logprobs_mode */
    int32_t *experts;   /* [max_new, E] */
    int32_t *masks;     /* [max_new * mask_bound] reserved at submit; compact masks, in record order */
    int64_t mask_used;  /* ids written (sampling thread of this sequence) */
    int failed;         /* a record could not be stored correctly (sampling thread) */
    int grammar_end;    /* the grammar allowed no token: finish with FINISH_GRAMMAR (sampling thread) */
    int n_pub;          /* published records (under req->mu); never decreases */
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
    int32_t *allowed;         /* [sampling.n_allowed] allowed_token_ids */
    int32_t *bad_off, *bad_ids; /* bad words: [n_bad_words + 1] offsets, [bad_off[n]] ids */
    int n, max_new, n_done;
    int mask_bound;           /* ids reserved per record for its mask (engine_mask_ids_bound) */
    size_t out_bytes;         /* engine_request_output_bytes, reserved in Engine.out_reserved */
    int failed;               /* under mu: engine_request_failed */
    Err fail;                 /* under mu */
    GrammarMatcher **matchers;/* [n] or NULL: one per sequence (its sampling thread) */
    int32_t end_ids[SAMPLING_MAX_STOP_IDS + 8]; /* the grammar's end ids [n_end] */
    int n_end;
    Seq *seqs;                /* [n] */
    SeqOut *outs;             /* [n] */
    float *plp;               /* [n_prompt] */
    int32_t *ptop_ids;        /* [n_prompt, N] */
    float *ptop_lp;           /* [n_prompt, N] */
    int32_t *prank;           /* [n_prompt] vLLM rank of each prompt token (prank[0] = 0) */
    int plp_pub;
    int32_t *pexp;            /* [n_prompt - 1, E] */
    int pexp_pub;
    pthread_mutex_t mu;       /* published outputs: n_pub, finish, *_pub, change, done */
    pthread_cond_t cv;
    uint64_t change;
    int done;
    int engine_gone, consumer_gone; /* under Engine.mu: freed when both are set */
    int started;              /* engine thread: a sequence was scheduled */
    EngineCmd submit_cmd, abort_cmd;
    double t_submit;
    int got_first;
    uint64_t wake_stamp;      /* engine thread: == Engine.wake_stamp while on the step's wake list */
    struct EngineRequest *next, *prev; /* the engine thread's active list */
};

typedef struct SampleJob {
    Seq *q;                   /* NULL: its sequence finished while the step ran (nothing to record) */
    const float *row;         /* [vocab] logits */
    const int32_t *xrow;      /* [E] routed experts of the input token, or NULL */
    int32_t token;            /* result */
    int dev_row;              /* its row of the device batch, or -1 (sampled on the host) */
    int pos;                  /* the position of the token it samples (q->n_tokens when the step was planned) */
    int held;                 /* 1: q->tokens[pos] holds the placeholder -1 - dev_row (async scheduling) */
} SampleJob;

/* Prompt tokens [pos0, pos0 + n) of q whose routed experts a step captured, at
 * its token rows tok0.. (the request's prompt experts, written at step_end). */
typedef struct PexpJob {
    Seq *q;                   /* NULL: its sequence finished while the step ran */
    int pos0, n, tok0;
} PexpJob;

/* One step from its launch to its end (engine_step.c). With async
 * scheduling the engine keeps at most one step in flight between two calls
 * of engine_step: its forward and device sampling queued, its records not yet
 * written; the next step is planned and launched before it ends. */
typedef struct EngineStep {
    SampleJob *jobs;          /* [max_running_seqs] the rows it samples */
    int n_jobs;
    int32_t *experts;         /* [max_batched_tokens, E] the routed experts of its tokens when it captures them
                               * (EngineBackend.host_alloc memory, the device may still be writing it until
                               * the step's results are waited for); NULL when E == 0 */
    PexpJob *pexp;            /* [max_running_seqs] the prompt experts it captured */
    int n_pexp;
    int capture;              /* it captures routed experts (into experts) */
    int on_host;              /* its logits came to the host: every op of it has run (else a wait must come first) */
    int live;                 /* launched, not ended */
    int slot;                 /* device sampling slot of its launch (< DEV_SAMPLE_SLOTS) */
    int on_dev;               /* its rows were launched on the device */
    int n_dev_rows;           /* rows of that launch */
    int prefill;              /* prompt tokens it computed */
    double t_plan;            /* when it was planned */
} EngineStep;

/* Sampling on the device (engine_devsample.c), set up when the backend has
 * EngineBackend.sample_launch and cfg.device_sampling is not off. */
typedef struct EngineDevSample {
    DevSampleBuilder *b[DEV_SAMPLE_SLOTS]; /* each slot's rows (caps: engine_devsample_caps), kept until
                                              the step that launched them ends */
} EngineDevSample;

struct Engine {
    ModelConfig mc;
    EngineConfig cfg;
    EngineBackend be;
    BlockManager *bm;
    Scheduler *sch;
    Sampler **samplers;       /* [n_sample_threads] */
    int32_t **mask_bufs;      /* [n_sample_threads][vocab] */
    uint64_t **grammar_bits;  /* [n_sample_threads][ceil(vocab / 64)] allowed-id bitsets */
    int n_sample_threads;
    ThreadPool *stp;          /* sampling threads (rows in parallel) */
    EngineStep steps[2];      /* the step being planned and the one in flight (engine_step.c) */
    int cur;                  /* steps[cur] is planned next; steps[!cur] may be in flight */
    int async;                /* async scheduling is on (cfg.async_scheduling resolved with e->dev) */
    float *logits;            /* [rows_cap, vocab] f32 */
    int rows_cap;
    int n_moe, E;
    pthread_t thr;
    /* under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* wakes the engine thread (a command, stop) */
    pthread_cond_t cv_done;   /* wakes callers blocked on a command */
    int stop;
    EngineCmd *cmd_head, *cmd_tail; /* FIFO of commands not yet applied */
    int n_cmds;
    EngineCmd resume_cmd;     /* queued at most once; a second resume moves it to the tail */
    int n_unstarted;          /* submitted, no sequence scheduled yet; bounded by max_waiting */
    size_t out_reserved;      /* output bytes of every request not yet freed; <= max_output_mem_mb */
    int pause_pub;            /* what engine_is_paused reports */
    uint64_t next_id;
    /* engine thread */
    EngineRequest *active;    /* taken requests, not yet retired */
    int paused;               /* no steps */
    EngineCmd *pause_waiters; /* PAUSE_WAIT commands waiting for nothing in flight */
    uint64_t arrival;
    _Atomic uint64_t version; /* written by the engine thread, read anywhere */
    uint32_t lora_version[ENGINE_MAX_LORAS]; /* engine thread (engine_lora_changed); read by the sampling threads
                                                of a step, which never overlaps a change */
    double mark;              /* engine thread: where the current step phase began (engine_step.c) */
    double drained;           /* engine thread: time in engine_step_drain (counted as step time) */
    EngineStepTimes st;       /* engine thread: step phase times, copied to m.step_times with the gauges */
    EngineRequest **wake;     /* engine thread: [max_running_seqs] requests whose records a step's commits
                               * published, woken once each when the commits end (engine_step.c) */
    int n_wake;
    uint64_t wake_stamp;      /* the commits' stamp (EngineRequest.wake_stamp); starts at 1 */
    /* under mmu */
    pthread_mutex_t mmu;
    EngineMetrics m;
    EngineDevSample *dev;     /* NULL: every row is sampled on the host */
};

/* ---- engine_request.c ---- */
int engine_check_params(Engine *e, const EngineRequestParams *p, Err *err);
EngineRequest *engine_request_new(Engine *e, const EngineRequestParams *p, Err *err);
void engine_request_destroy(EngineRequest *r);
void engine_request_publish(EngineRequest *r); /* under r->mu */
/* Not under r->mu: engine_request_publish, then the broadcast after the unlock
 * (a woken consumer does not find the lock held). The caller keeps r alive. */
void engine_request_wake(EngineRequest *r);
/* Engine thread: finish one sequence (its record, if any, already written;
 * n_pub < 0 keeps the count). May retire and free the request. */
void engine_seq_finish(Engine *e, Seq *q, FinishReason f, int32_t stop_token, int n_pub);
/* Engine thread: finish every unfinished sequence of r with FINISH_ABORT.
 * r may be freed on return: never touch it after. */
void engine_request_abort_now(Engine *e, EngineRequest *r);
void engine_mark_started(Engine *e, EngineRequest *r);
/* Reserve / release p's output bytes in Engine.out_reserved (the global
 * budget): 0, or <0 with a 503 err naming what to lower. */
int engine_output_reserve(Engine *e, size_t bytes, Err *err);
void engine_output_release(Engine *e, size_t bytes);

/* ---- engine_control.c ---- */
/* Queue r's abort unless it is queued already or r is retired (under e->mu). */
void engine_cmd_abort_locked(Engine *e, EngineRequest *r);
/* Take r's queued abort out of the queue, if any (under e->mu, at retire). */
void engine_cmd_forget_locked(Engine *e, EngineCmd *c);
/* Engine thread, between two steps: apply the commands queued now, in order. */
void engine_apply_commands(Engine *e);
/* Engine thread, after a step: complete PAUSE_WAIT once nothing is in flight. */
void engine_check_pause_wait(Engine *e);
/* Engine thread, at stop: complete every queued and pending command. */
void engine_drain_commands(Engine *e);

/* ---- engine_step.c ---- */
/* One step. Returns 1 if anything was computed (or a step in flight ended).
 * With async scheduling a step may be left in flight on return. */
int engine_step(Engine *e);
/* End the step in flight, if any (its records written and published). */
void engine_step_drain(Engine *e);
/* q is finishing: forget the rows of steps in flight that sample it. */
void engine_step_forget(Engine *e, const Seq *q);

/* ---- engine_devsample.c ---- */
/* Start-up: e->dev when be.sample is set and cfg.device_sampling allows it (the
 * caps must equal those the backend reserved: engine_devsample_caps). */
void engine_devsample_init(Engine *e);
void engine_devsample_free(Engine *e);

/* ---- engine.c ---- */
double engine_now_s(void);
/* Count v in h, a histogram of kind k (caller holds e->mmu). */
void engine_vhist_add(EngineVHist *h, EngineVHistKind k, double v);
/* The same with explicit finite bounds b[n] (ascending). */
void engine_vhist_add_b(EngineVHist *h, const double *b, int n, double v);

#endif
