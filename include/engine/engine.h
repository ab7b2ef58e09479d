/*
 * engine.h - the generation engine: one engine thread that turns many
 * concurrent requests into batched forward steps (continuous batching with
 * chunked prefill, paged KV cache with prefix caching, preemption), samples
 * every sequence (sampling.h) and publishes per-token records to each
 * request's consumer. The public API is thread-safe: HTTP threads call
 * engine_submit / engine_abort / engine_pause / ... concurrently; only the
 * engine thread touches the model and the KV cache.
 *
 * Lifecycle of a request, from an HTTP thread:
 *
 *     EngineRequestParams p; engine_request_params_default(&p);
 *     p.prompt = ids; p.n_prompt = n; p.n = 4; p.sampling.temperature = 1;
 *     EngineRequest *r;
 *     if (engine_submit(e, &p, &r, &err) < 0) -> err.code 400 bad input, 503 queue full
 *     uint64_t seen = 0;
 *     while (engine_request_wait(r, &seen, 1000) >= 0) {      // wakes on any change
 *         EngineSeqView v; engine_request_seq(r, i, &v);       // v.tokens[0..v.n_tokens)
 *         ... stream records not sent yet ...
 *         if (engine_request_done(r)) break;
 *     }
 *     engine_request_release(r);     // consumer is done; aborts it if still running
 *
 * Records [0, n_tokens) of a sequence never change once published and stay
 * valid until engine_request_release, so they can be read without a lock.
 *
 * Version tagging: the engine holds a weight version (starts at 0). Every
 * TokenRecord carries the version of the weights that produced its logits;
 * prefix-cache keys include it, so a weight update makes old cache entries
 * unreachable. Weight updates run through engine_run_exclusive, between steps.
 *
 * Not here: HTTP, tokenization, chat templates (server), the forward pass
 * (model.h), the sampling math (sampling.h), the KV block pool (block_manager.h).
 */
#ifndef SAMPLER_ENGINE_H
#define SAMPLER_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "check.h"
#include "grammar.h"
#include "model.h"
#include "sampling.h"

/* ---- configuration (flags; engine_create prints the values it uses) ---- */
enum { ENGINE_DEVSAMPLE_AUTO = 0, ENGINE_DEVSAMPLE_ON = 1, ENGINE_DEVSAMPLE_OFF = 2 };
enum { ENGINE_ASYNC_AUTO = 0, ENGINE_ASYNC_ON = 1, ENGINE_ASYNC_OFF = 2 };

typedef struct EngineConfig {
    int max_running_seqs;   /* sequences in one step; default 64 */
    int max_batched_tokens; /* tokens in one step (prefill chunks + decodes); default 2048 */
    int max_model_len;      /* prompt + output per sequence; 0 (default) -> min(model max_pos, 4096, KV pool) */
    int max_waiting;        /* bounded waiting queue (requests); full -> 503; default 1024 */
    int block_size;         /* tokens per KV block; default 16 */
    int n_blocks;           /* KV pool size in blocks; 0 -> from kv_mem_mb */
    size_t kv_mem_mb;       /* used when n_blocks == 0; default 1024 */
    int kv_cache_dtype;     /* KvDtype (kv_dtype.h) or ENGINE_KV_AUTO (default): the model's dtype, which
                             * is BF16 for every checkpoint we load (--kv-cache-dtype) */
    int enable_prefix_cache;/* default 1 */
    int max_prompt_logprob_rows; /* logits rows per step for prompt log-probs; default 64 */
    int max_step_rows;      /* logits rows per step (sampled tokens + prompt log-prob rows), shared
                             * max-min fairly between requests (scheduler.h); 0 (default) -> 4 per
                             * sampling thread, at least 16, at most max_running_seqs + the prompt rows;
                             * with device sampling (engine_create) max_running_seqs + the prompt rows */
    size_t max_request_output_mb; /* per-request output budget (engine_request_output_bytes); default 2048 */
    size_t max_output_mem_mb;     /* outputs of all requests in flight together; default 8192 */
    int n_threads;          /* forward-pass threads; 0 -> all cores */
    int max_loras;          /* LoRA adapter slots requests may name (0..max_loras-1); default 0, at most
                               ENGINE_MAX_LORAS */
    int verbose;            /* 1: print the configuration at create (default 1) */
    int device_sampling;    /* ENGINE_DEVSAMPLE_*: sample on the device when the backend can (auto, the
                             * default), require it (on: start-up fails without), never (off) */
    int async_scheduling;   /* ENGINE_ASYNC_* (vLLM's --async-scheduling): with device sampling, plan and
                             * launch step t+1 before step t's tokens reach the host, its decode inputs
                             * taken on the device from step t's sampling (auto, the default: whenever
                             * the engine samples on the device; on: start-up fails without device
                             * sampling; off: every step waits for its tokens). Steps whose rows need
                             * step t's tokens on the host (penalties, bad words, grammars, prompt
                             * log-probs, routed experts) wait for them first. The records are the
                             * same either way (engine_step.c) */
    /* Test hook, NULL by default: sees (and may change) a token's kept set
     * [*n_kept] before it is stored, from the sampling threads. Lets a test
     * hand the publish check a mask that does not contain its token. */
    void (*mask_tap)(void *ctx, int32_t token, int32_t *kept, int32_t *n_kept);
    void *mask_tap_ctx;
    /* Test/debug hook, NULL by default: called with every logits row a token
     * is sampled from (before any processing), from the engine's sampling
     * threads, possibly concurrently (the hook must be thread-safe). */
    void (*logits_tap)(void *ctx, uint64_t request_id, int seq_index, int pos, const float *row,
                       int vocab);
    void *logits_tap_ctx;
} EngineConfig;

#define ENGINE_KV_AUTO (-1)

void engine_config_default(EngineConfig *c);
/* The capacities of device sampling for c (resolved) and a vocab: max_running_seqs
 * rows, list room for each row's logit_bias, bans and a penalty history of
 * max_model_len + 64 ids, two bitsets per row. The backend reserves them
 * (runner_backend.c) and the engine builds rows within them. */
struct DevSampleCaps;
void engine_devsample_caps(const EngineConfig *c, int vocab, struct DevSampleCaps *caps);
/* Resolve kv_cache_dtype (auto -> BF16), fill n_blocks from kv_mem_mb (K and
 * V of every layer per block at that dtype, FP8 scales included:
 * kv_dtype_bytes_per_pos) and max_model_len (min(model max, 4096, pool))
 * where they are unset. Idempotent. */
void engine_config_resolve(EngineConfig *c, const ModelConfig *mc);

/* The backend the engine drives: the engine's only view of a model and its KV
 * pool. The caller builds it (runner_backend.h adapts a Runner on any device;
 * tests plug in doubles), keeps it alive until engine_free returned, then
 * frees it. All calls come from the engine thread. */
typedef struct EngineBackend {
    void *ctx;
    /* One step: logits [b->n_out, vocab] f32 for b->out_rows. */
    int (*forward)(void *ctx, const Batch *b, float *logits, Err *err);
    /* Copy all layers' K/V of block src into block dst. */
    void (*copy_block)(void *ctx, int src, int dst);
    /* experts [n_tokens, n_moe_layers, top_k] int32 for the next forward, or
     * NULL. A forward given a logits buffer returns with them written; one
     * without (device sampling) may return with them still on their way
     * (host_alloc memory): they are there once the step's sample_wait or
     * fetch_logits returned. */
    void (*set_expert_capture)(void *ctx, int32_t *experts);
    /* Optional (NULL: requests naming an adapter are refused): the LoRA slot of
     * each token [n_tokens] of the next forward (-1 the base), or NULL (all base). */
    void (*set_lora_tokens)(void *ctx, const int32_t *lora);
    /* Optional (NULL: every token is sampled on the host): sampling on the
     * device (sampling_device.h, dev_sample.h). forward is then also called
     * with logits == NULL, which leaves the step's logits [n_out, vocab] on the
     * device; sample_launch queues the sampling of rows of them into slot
     * (< DEV_SAMPLE_SLOTS) and returns (0, or -1 with err: nothing launched),
     * sample_wait blocks until that slot's results are on the host (*out,
     * *packed: the backend's, valid until the slot's next launch), and
     * fetch_logits copies the logits to the host (the fallback; n_out 0:
     * returns once every op queued so far ran). A forward
     * whose Batch.n_pending > 0 takes tokens < 0 from the last launch's rows
     * on the device. */
    int (*sample_launch)(void *ctx, int n_out, const struct DevSampleBatch *b, int slot, Err *err);
    int (*sample_wait)(void *ctx, int slot, const struct DevSampleOut **out, const int32_t **packed, Err *err);
    void (*fetch_logits)(void *ctx, float *logits, int n_out);
    /* Optional (NULL: the engine uses malloc): zeroed host memory the device
     * writes without staging (pinned: set_expert_capture's buffers), and its
     * release; start-up and shutdown only. */
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *p);
} EngineBackend;

typedef struct Engine Engine;
typedef struct EngineRequest EngineRequest;

/* Start-up path (fatal on bad config, with a message saying which flag to fix).
 * mc describes the model (vocab, EOS ids, MoE shape); be's KV pool has
 * cfg->n_blocks blocks (runner_backend_create fills it in). Creates the
 * scheduler and block manager and starts the engine thread. */
Engine *engine_create(const ModelConfig *mc, const EngineBackend *be, const EngineConfig *cfg);
/* Stops the thread, aborts what is left (consumers see FINISH_ABORT), frees;
 * the backend stays the caller's. No other engine call may be in progress. */
void engine_free(Engine *e);
/* The configuration after defaults were resolved (n_blocks filled in). */
const EngineConfig *engine_config(const Engine *e);

/* ---- requests ---- */
typedef struct EngineRequestParams {
    const int32_t *prompt;  /* [n_prompt] token ids; copied at submit */
    int n_prompt;
    int n;                  /* samples of this prompt (share the prompt's KV blocks); 1..1024, default 1 */
    SamplingParams sampling; /* max_tokens is capped at max_model_len - n_prompt */
    /* return options */
    int top_logprobs;       /* N alternatives per generated token, 0..SAMPLING_MAX_TOP_N */
    int want_logprob_value; /* TokenRecord.value / rank in logprobs_mode */
    LogprobsMode logprobs_mode; /* of value, rank and the top list (sampling.h); default LOGPROBS_RAW */
    int want_raw_logprob;   /* log-prob under the unprocessed distribution, log_softmax(logits) */
    int want_mask;          /* the exact kept id set per token (CSR) */
    int prompt_logprobs;    /* -1: none; 0: the prompt tokens' own log-probs; N: also top-N */
    int want_experts;       /* MoE: routed expert ids per layer per generated token */
    uint64_t user_tag;      /* opaque, for the caller's bookkeeping */
    /* cache_salt (vLLM, SGLang): 0 none; else a 64-bit digest of the salt. It is the parent key of the
     * prompt's first block, so the prefix cache shares blocks only between requests of the same salt
     * (and unsalted ones only with unsalted ones); every later key chains from it. */
    uint64_t cache_salt;
    int lora_slot;          /* LoRA adapter slot of every token of this request; -1 (default): the base.
                               The caller keeps the slot's adapter in place until the request is released */
    /* Bytes the caller will need to render this request's outputs (its JSON),
     * counted into the output budget with the engine's own storage. */
    size_t extra_output_bytes;
    /* Structured outputs (grammar.h), or NULL. The engine takes its own
     * reference; every sequence gets a matcher. Each token is drawn from the
     * logits with the ids the grammar does not allow set to -inf (so
     * logprob, top_logprobs and the mask are those of the constrained
     * distribution; logprob_raw is not constrained), then advances the
     * matcher. The grammar's end ids are the model's EOS ids (unless
     * ignore_eos) and the stop ids: one of them accepted at an end of the
     * grammar finishes the sequence with FINISH_STOP; a state that allows no
     * id (every allowed id banned by logit_bias / min_tokens, a grammar that
     * cannot continue, a matcher limit) finishes it with FINISH_GRAMMAR and
     * no record for that step. */
    Grammar *grammar;
} EngineRequestParams;

void engine_request_params_default(EngineRequestParams *p);

/* ---- output memory: the formula, and the budget checked at submit ----
 * Everything a request's outputs can take is allocated (reserved) at submit,
 * so a running request never allocates and never fails to store an output.
 * With V = vocab, E = engine_experts_per_token, M = max_tokens (capped by
 * max_model_len - P), P = prompt length, K = top_logprobs, N = prompt_logprobs,
 * B = max blocks per sequence (max_model_len / block_size, rounded up):
 *
 *   per sequence (x n):  M * (sizeof(TokenRecord)               records
 *                             + 8 * K                            top log-probs
 *                             + 4 * E * want_experts             routed experts
 *                             + 4 * mask_ids)                    sampling masks
 *                        + 4 * (P + M) + 12 * B                  tokens, block table
 *                        + [grammar] * grammar_matcher_bytes()  its matcher
 *   once:                4 * P (prompt) + 8 * n_logit_bias + 4 * n_allowed
 *                        + [bad words] * 4 * (n_bad_words + 1 + their tokens)
 *                        + [N >= 0] * P * (8 + 8 * N)            prompt log-probs, ranks
 *                        + [want_experts] * 4 * E * (P - 1)      prompt experts
 *                        + extra_output_bytes                    the caller's rendering
 *
 * mask_ids = engine_mask_ids_bound: 1 for greedy sampling, else ceil(V / 32)
 * (a mask is stored in the smallest of three forms, engine_mask_pack: its
 * kept ids, the ids NOT kept, or a bitmap of ceil(V / 32) words, so never more
 * than the bitmap: 19 KB per token at V = 151,936). The pages of the
 * reservation are touched only as outputs are written; a token of
 * untruncated sampling stores no ids at all.
 *
 * engine_submit refuses with 400 a request whose bytes exceed
 * max_request_output_mb (the message names n, max_tokens, the prompt, the
 * log-prob options and the mask), and with 503 one that does not fit in
 * max_output_mem_mb next to the requests in flight (retry later); a failed
 * reservation (malloc) is a 503 too. Nothing is queued on refusal. */
size_t engine_request_output_bytes(const Engine *e, const EngineRequestParams *p);
int engine_mask_ids_bound(int vocab, const SamplingParams *sp);

/* The stored forms of a mask (TokenRecord.mask_complement). */
#define MASK_FORM_IDS 0        /* mask_ids: the kept ids, ascending */
#define MASK_FORM_COMPLEMENT 1 /* mask_ids: the ids NOT kept, ascending */
#define MASK_FORM_BITMAP 2     /* mask_ids: MASK_BITMAP_WORDS(vocab) words, bit (id & 31) of word id >> 5 = kept */
#define MASK_BITMAP_WORDS(vocab) (((vocab) + 31) / 32)

/* Pack a kept set kept[0..n_kept) (ascending, distinct) for storage, into dst
 * (room for cap int32s), in the smallest form: the kept ids when 2 * n_kept <=
 * vocab, else the ids of [0, vocab) not in it, unless that list is longer
 * than the bitmap (MASK_BITMAP_WORDS), then the bitmap; *complement gets the
 * form. Returns the int32s written, or -1 when the set does not contain token,
 * is not ascending inside [0, vocab), or does not fit cap: such a mask is
 * never published (the engine fails the request instead). */
int engine_mask_pack(const int32_t *kept, int n_kept, int vocab, int32_t token, int32_t *dst, int cap,
                     int *complement);
/* Store a kept set packed elsewhere (the device sampler: dev_sample.h's
 * dev_mask_form, the same rule): form, src [len] and n_kept checked to be the
 * form and length that rule gives for n_kept, ascending distinct ids inside
 * [0, vocab) (a bitmap: n_kept bits set, none past vocab), containing token,
 * within cap; then copied to dst. Returns len, or -1 (dst untouched). */
int engine_mask_store(int form, const int32_t *src, int len, int n_kept, int vocab, int32_t token, int32_t *dst,
                      int cap);

typedef enum { FINISH_NONE = 0, FINISH_STOP, FINISH_LENGTH, FINISH_ABORT, FINISH_GRAMMAR } FinishReason;
/* "stop" "length" "abort" "grammar_dead_end" (NULL for NONE) */
const char *finish_reason_name(FinishReason f);

/* One generated token. Pointers point into storage owned by the request. */
typedef struct TokenRecord {
    int32_t token;
    int32_t pos;              /* position in the sequence (n_prompt + index) */
    uint64_t weight_version;  /* weights that produced the logits this token was sampled from */
    float logprob;            /* under the distribution actually sampled from (greedy: 0) */
    float logprob_raw;        /* log_softmax(logits)[token], before any processing; NAN unless want_raw_logprob */
    float value;              /* the token's value in logprobs_mode; NAN unless want_logprob_value */
    int32_t rank;             /* its vLLM rank in that mode (ids with value >= it); 0 unless wanted */
    int32_t n_top;            /* alternatives (top_logprobs) */
    uint32_t adapter_version; /* the LoRA adapter's version at that step (engine_lora_changed); 0 for the base.
                                 32 bits keep the record small; the server refuses a version above */
    const int32_t *top_ids;   /* [n_top] ranked in logprobs_mode (sampling.h), id asc on ties */
    const float *top_logprobs;/* [n_top] their values in logprobs_mode */
    int32_t mask_n;           /* size of the kept set (always filled) */
    /* want_mask: the kept set in its compact form (engine_mask_pack): when
     * mask_complement is MASK_FORM_IDS, mask_ids lists the kept ids; when
     * MASK_FORM_COMPLEMENT (more than half the vocabulary kept) the ids NOT
     * kept; when MASK_FORM_BITMAP (both lists longer than vocab / 32) a bitmap.
     * Read it through engine_mask_has / engine_mask_expand. Checked at publish
     * to contain token. NULL unless want_mask. */
    int32_t mask_complement;
    int32_t mask_len;         /* int32s in mask_ids: mask_n, vocab - mask_n, or MASK_BITMAP_WORDS(vocab) */
    const int32_t *mask_ids;  /* [mask_len] ascending ids, or the bitmap's words */
    const int32_t *experts;   /* [n_moe_layers, top_k] or NULL unless want_experts */
    int32_t grammar;          /* 1: drawn under the request's grammar mask (EngineRequestParams.grammar) */
} TokenRecord;

/* 1 when id is in t's kept set (t has a mask). */
int engine_mask_has(const TokenRecord *t, int32_t id);
/* The ids of t's kept set (excluded = 0: mask_n of them) or of the ids not in
 * it (excluded = 1: vocab - mask_n), ascending, into out (NULL: only count);
 * returns the count. */
int engine_mask_expand(const TokenRecord *t, int vocab, int excluded, int32_t *out);

/* A consistent snapshot of one sequence of a request. */
typedef struct EngineSeqView {
    int n_tokens;                /* published records */
    const TokenRecord *tokens;   /* [n_tokens] */
    FinishReason finish;         /* FINISH_NONE while running */
    int32_t stop_token;          /* the id that ended it with FINISH_STOP, else -1 */
} EngineSeqView;

/* Submit. Returns 0 and a handle (the caller must engine_request_release it),
 * or <0 with err: 400 bad input (prompt empty / too long for max_model_len,
 * token id out of range, bad sampling params, n out of range, outputs over
 * max_request_output_mb), 503 waiting queue full, outputs over
 * max_output_mem_mb with those in flight, or engine shutting down. Nothing is queued on error. Requests
 * submitted while paused wait and are admitted after engine_resume. */
int engine_submit(Engine *e, const EngineRequestParams *p, EngineRequest **out, Err *err);

/* Block until the request changed since *seen (new tokens, prompt log-probs
 * or a finish), or timeout_ms passed (-1: forever). Returns 1 changed (and
 * updates *seen), 0 timed out, or 0 at once when the request is done and
 * nothing changed since *seen. */
int engine_request_wait(EngineRequest *r, uint64_t *seen, int timeout_ms);
int engine_request_n_seqs(const EngineRequest *r);
void engine_request_seq(EngineRequest *r, int seq_index, EngineSeqView *out);
int engine_request_done(EngineRequest *r); /* 1 when every sequence has finished */
/* 1 (and err filled, 500) when the engine could not produce an output of r
 * correctly (a mask that would not contain its token): the record was not
 * published, r's sequences were aborted, and the caller must fail the whole
 * request rather than return what was published. 0 otherwise. */
int engine_request_failed(EngineRequest *r, Err *err);
uint64_t engine_request_id(const EngineRequest *r);
uint64_t engine_request_user_tag(const EngineRequest *r);
/* Prompt tokens whose K/V the first admission found in the prefix cache
 * (vLLM num_cached_tokens, SGLang cached_tokens): 0 before admission, 0 for
 * requests that bypass the lookup (prompt_logprobs, experts). */
int engine_request_cached_tokens(EngineRequest *r);
/* Prompt log-probs (prompt_logprobs >= 0): returns the number of prompt
 * positions published so far (n_prompt once done); lp [n_prompt] (lp[0] is NAN,
 * the first token has no context), top_ids/top_lp [n_prompt, N] or NULL. */
int engine_request_prompt_logprobs(EngineRequest *r, const float **lp,
                                   const int32_t **top_ids, const float **top_lp);
/* vLLM's rank of each prompt token in its position's whole distribution (the
 * number of ids whose log-prob is >= its own): ranks [n_prompt] (ranks[0] is
 * 0, no context), for the positions published so far (the same count as
 * engine_request_prompt_logprobs). NULL when prompt_logprobs is off. */
const int32_t *engine_request_prompt_ranks(EngineRequest *r);
/* Prompt tokens of the request's first sequence that were found in the
 * prefix cache when it was first admitted (vLLM's num_cached_tokens; 0 before
 * admission and for requests that bypass the cache). */
int engine_request_cached_tokens(EngineRequest *r);
/* Copy a sequence's masks, decoded to the full kept sets, into CSR form:
 * offsets [n_tokens + 1] (int64), ids [offsets[n_tokens]]. Pass ids NULL to
 * get offsets (the size) first. Returns n_tokens. For a FINISHED sequence (the count cannot grow between calls);
 * while it runs use engine_request_mask_csr_n. */
int engine_request_mask_csr(EngineRequest *r, int seq_index, int64_t *offsets, int32_t *ids);
/* The same for records [0, n) only (n <= published records): offsets [n + 1]. */
int engine_request_mask_csr_n(EngineRequest *r, int seq_index, int n, int64_t *offsets, int32_t *ids);
/* Experts per token: n_moe_layers * top_k ids per record (0 for dense models).
 * Router replay (want_experts): the record of generated token i holds the
 * routing of the forward step that produced its logits, i.e. of the input
 * token at position n_prompt - 1 + i; the prompt's other positions
 * 0..n_prompt-2 come from engine_request_prompt_experts. Together they cover
 * every input position of prompt + output except the last sampled token.
 * Requests with want_experts or prompt_logprobs bypass prefix-cache lookups
 * (every prompt position is computed). */
int engine_experts_per_token(const Engine *e);
/* Returns positions published so far (n_prompt - 1 once done); experts
 * [n_prompt - 1, experts_per_token]. */
int engine_request_prompt_experts(EngineRequest *r, const int32_t **experts);
/* Abort (client gone, abort call). Takes effect at the next step boundary:
 * blocks freed, unfinished sequences finish with FINISH_ABORT. Idempotent;
 * does nothing once the request has finished. */
void engine_abort(Engine *e, EngineRequest *r);
/* The consumer is done with the handle: aborts it if unfinished; the engine
 * frees it once it has let go too. */
void engine_request_release(EngineRequest *r);

/* ---- pause / resume / exclusive sections (weight updates) ---- */
typedef enum {
    PAUSE_ABORT = 0, /* finish every request (running and waiting) now with FINISH_ABORT */
    PAUSE_WAIT,      /* admit nothing new; returns once running sequences have finished */
    PAUSE_KEEP,      /* freeze running sequences in place (KV kept); continue after resume */
} PauseMode;

/* Blocks until the pause took effect (no step in flight, and for PAUSE_WAIT
 * nothing running, or an engine_resume came first). New submissions are
 * accepted and wait. Control calls (submit, abort, pause, resume, exclusive)
 * take effect between two steps in the order they were made. */
int engine_pause(Engine *e, PauseMode mode, Err *err);
void engine_resume(Engine *e);
int engine_is_paused(Engine *e);

/* Run fn(ctx, err) on the engine thread between two steps, with exclusive
 * access to the model and KV cache, and wait for it. If fn returns 0 and
 * bump_version is set, the weight version is incremented and the prefix cache
 * invalidated. Returns fn's status. Works whether or not the engine is paused. */
typedef int (*EngineExclusiveFn)(void *ctx, Err *err);
int engine_run_exclusive(Engine *e, EngineExclusiveFn fn, void *ctx, int bump_version, Err *err);
uint64_t engine_weight_version(Engine *e);
/* Forget every prefix-cache entry between two steps (SGLang /flush_cache,
 * vLLM reset_prefix_cache): later requests recompute their prompts; running
 * sequences keep their blocks. The weight version does not move. */
int engine_flush_prefix_cache(Engine *e, Err *err);

/* ---- LoRA adapter slots ----
 * A request names a slot (EngineRequestParams.lora_slot); the caller puts the
 * adapter into the backend's slot. Call engine_lora_changed only from an
 * EngineExclusiveFn (the engine thread, between steps) whenever a slot's
 * adapter is put in place or replaced: tokens sampled after it carry
 * `version` as their adapter_version, and the slot gets a new prefix-cache
 * tag, so K/V computed under the old adapter are never shared with the new
 * one (cache keys are (weight version, slot tag, tokens)). Running sequences
 * continue, as after a delta. */
#define ENGINE_MAX_LORAS 64
#define ENGINE_LORA_VERSION_MAX 0xffffffffu
void engine_lora_changed(Engine *e, int slot, uint32_t version);

/* ---- metrics ---- */
#define ENGINE_HIST_BUCKETS 16
extern const double engine_hist_bounds[ENGINE_HIST_BUCKETS]; /* seconds, upper bounds; last is +inf */

typedef struct EngineHist {
    uint64_t count[ENGINE_HIST_BUCKETS]; /* per bucket (not cumulative) */
    uint64_t n;
    double sum; /* seconds */
} EngineHist;

/* Histograms with vLLM's bucket bounds (vllm/v1/metrics/loggers.py), so the
 * vllm:* metrics of /metrics count exactly what vLLM's would. */
#define ENGINE_VHIST_MAX 24
typedef enum { ENGINE_VHIST_TTFT, ENGINE_VHIST_ITL, ENGINE_VHIST_E2E, ENGINE_N_VHIST } EngineVHistKind;
extern const double *const engine_vhist_bounds[ENGINE_N_VHIST]; /* seconds, upper bounds; +Inf implied */
extern const int engine_vhist_n[ENGINE_N_VHIST];                 /* finite bounds of each */
typedef struct EngineVHist {
    uint64_t count[ENGINE_VHIST_MAX + 1]; /* per bucket (not cumulative); [n] is +Inf */
    uint64_t n;
    double sum; /* seconds */
} EngineVHist;

/* Where the engine thread's time goes, seconds summed over the steps that
 * computed something (CLOCK_MONOTONIC, about ten reads per step; no allocation).
 * step = schedule + forward + sample + publish; control is outside the step:
 * the commands applied between two busy steps, the gauges, the pause check
 * (published with the gauges, one iteration late; the rest with `steps`).
 * forward is the backend's forward call: on the GPU the launches, the device
 * work, the wait for it and the logits copy; the rest is host work on the
 * step's critical path. Detokenizing, streaming and HTTP run on the
 * connections' threads, beside the engine thread, and are not in here. */
typedef struct EngineStepTimes {
    double step;     /* scheduler_plan .. the last record published */
    double schedule; /* scheduler_plan + batch build + scheduler_commit */
    double forward;  /* the backend's forward */
    double sample;   /* prompt log-probs / experts, forks, sampling rows (on the sampling threads); the
                      * host side of device sampling (building its rows, reading its results) */
    double device;   /* device sampling's launch and the wait for its results, or a fallback's logits copy
                      * (with async scheduling the wait overlaps the next step's device work) */
    double publish;  /* stops, timing, publishing records */
    double control;  /* between busy steps: commands, pause-wait check, gauges */
} EngineStepTimes;

typedef struct EngineMetrics {
    uint64_t requests_submitted, requests_rejected;
    uint64_t requests_finished_stop, requests_finished_length, requests_finished_abort; /* sequences */
    uint64_t requests_finished_grammar; /* sequences ended by a grammar dead end */
    uint64_t prompt_tokens;      /* submitted prompt tokens (x n) */
    uint64_t generated_tokens;
    uint64_t prefill_tokens_computed;
    uint64_t prefix_cache_queries, prefix_cache_hits; /* tokens looked up / found */
    uint64_t preemptions, steps;
    int running, waiting;        /* sequences */
    int paused;
    int kv_blocks_total, kv_blocks_used, kv_blocks_cached; /* used: referenced; cached: evictable */
    double kv_usage;             /* used / total */
    uint64_t weight_version;
    EngineHist ttft, itl;
    EngineVHist vttft, vitl;     /* the same samples in vLLM's buckets */
    EngineVHist ve2e;            /* submit -> finish of each sequence (any reason), vLLM's buckets */
    EngineVHist vprompt, vgen;   /* per finished sequence: its prompt tokens, its generated tokens */
    double vtok_bounds[ENGINE_VHIST_MAX]; /* their buckets: vLLM's 1, 2, 5, 10, ... <= max_model_len */
    int vtok_n;
    EngineStepTimes step_times;  /* the engine thread's time by phase (above) */
    uint64_t device_sampled_tokens;   /* tokens sampled on the device (EngineBackend.sample) */
    uint64_t device_sampling_fallbacks; /* device steps whose rows went back to the host (over caps, an error) */
    uint64_t async_steps;        /* steps launched while the previous step's tokens were still on the device */
} EngineMetrics;

void engine_metrics(Engine *e, EngineMetrics *out);

#endif
