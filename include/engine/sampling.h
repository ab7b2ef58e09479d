/*
 * sampling.h - turn one row of logits into one token, for every backend.
 *
 * The sampler works on one row of f32 logits [vocab] on the CPU. It applies,
 * in vLLM's order:
 *   0. allowed_token_ids: every other id is set to -inf; bad words (vLLM):
 *      for each banned token sequence w, when the output ends with w minus
 *      its last token (always, for a one-token w), that last token is -inf;
 *   1. logit_bias (added), min_tokens (EOS and stop ids set to -inf while
 *      fewer than min_tokens tokens were generated), the grammar's allowed
 *      set (SampleWant.allowed: every other id set to -inf);
 *   2. penalties, vLLM semantics:
 *        repetition r (1 = off): for every distinct id in prompt + output,
 *          l = l > 0 ? l / r : l * r
 *        frequency f (0 = off): l -= f * count of the id in the output
 *        presence  p (0 = off): l -= p if the id occurs in the output
 *   3. temperature: z = l / T; T == 0 means greedy (argmax, lowest id on ties);
 *   4. truncation, each a threshold on z so the kept set is always
 *      { i : z_i >= thr } (an upper set of the values):
 *        min_p: keep i with exp(z_i - z_max) >= min_p;
 *        top_k: keep i with z_i >= the k-th largest z (ties at the boundary
 *               are ALL kept, so the set may hold more than k ids);
 *        top_p: over the set kept so far, sort by (z desc, id asc), keep the
 *               shortest prefix whose cumulative probability (renormalised over
 *               the set, summed in double in that order, the normaliser summed
 *               in ascending id order) reaches top_p, then every id tied with
 *               the last one kept.
 *      Ids whose processed logit is -inf or NaN are never kept.
 *      exp is cpu_expf (cpu_ops.h: within 2 ulp of exp, 0 below -87, the same
 *      bits on every CPU path), every probability exp(z_i - z_max) / S with S
 *      the double sum of those floats (a log-prob (z_i - z_max) - log S).
 *   5. draw: u = counter_rng(seed, seq_index, position) in [0, 1); the token
 *      is the first id (ascending id order) whose cumulative probability over
 *      the kept set exceeds u. No state is carried between calls, so a token
 *      depends only on its logits, its history and (seed, seq_index, pos):
 *      never on the batch it was computed in.
 *
 * Outputs (SampleResult): the token; its log-prob under the distribution
 * actually sampled from (softmax of z over the kept set; 0 for greedy, whose
 * distribution is a point mass on the argmax); optionally its log-prob under
 * the unprocessed distribution, log_softmax(l_raw) over the whole vocab
 * before any processing, temperature included (vLLM's raw_logprobs);
 * optionally its value and rank, and the top-N ids with their values, in
 * one of the log-prob modes below; optionally the kept set (ascending ids).
 *
 * Log-prob modes (SampleWant.mode; vLLM's --logprobs-mode names, measured
 * against vLLM's v1 sampler):
 *   LOGPROBS_RAW              log_softmax(l_raw): before bias, penalties,
 *                             temperature and truncation (vLLM's default);
 *   LOGPROBS_RAW_LOGITS       l_raw itself;
 *   LOGPROBS_PROCESSED        log_softmax of the processed logits: for a
 *                             sampled token z with -inf outside the kept set
 *                             (= the sampled distribution); for greedy (T = 0)
 *                             the logits after bias/min_tokens/penalties,
 *                             untruncated, no temperature, as vLLM's greedy
 *                             path reports them: NOT the point mass greedy
 *                             samples from (the mask is {argmax});
 *   LOGPROBS_PROCESSED_LOGITS the same processed logits, unnormalised;
 *   LOGPROBS_SAMPLED          ours: the distribution actually sampled from,
 *                             0 / -inf for greedy (consistent with the mask).
 * The top-N are ranked by the mode's values (id asc on ties; the processed
 * modes rank masked ids by their processed logit z before masking); the rank
 * of the token is vLLM's: the number of ids whose value is >= its value.
 *
 * Not here: stop conditions on the result (engine), the logits (model).
 * Allocation: a Sampler holds scratch for one row sized at creation; sampling a
 * token allocates nothing. One Sampler per thread.
 */
#ifndef SAMPLER_SAMPLING_H
#define SAMPLER_SAMPLING_H

#include <stdint.h>

#include "check.h"

#define SAMPLING_MAX_STOP_IDS 16
#define SAMPLING_MAX_TOP_N 20

typedef struct SamplingParams {
    float temperature;        /* 0 = greedy; default 1 */
    int top_k;                /* <= 0 or >= vocab: off */
    float top_p;              /* (0, 1]; 1 = off */
    float min_p;              /* [0, 1]; 0 = off */
    float presence_penalty;   /* 0 = off */
    float frequency_penalty;  /* 0 = off */
    float repetition_penalty; /* > 0; 1 = off */
    int n_logit_bias;
    const int32_t *logit_bias_ids; /* [n_logit_bias]; copied by engine_submit */
    const float *logit_bias;       /* [n_logit_bias]; -INFINITY bans the id */
    int n_allowed;                 /* 0: every id; else only these may be sampled (vLLM allowed_token_ids) */
    const int32_t *allowed_ids;    /* [n_allowed]; copied by engine_submit */
    int n_bad_words;               /* banned token sequences (vLLM bad_words, tokenized) */
    const int32_t *bad_word_off;   /* [n_bad_words + 1] offsets into bad_word_ids; copied by engine_submit */
    const int32_t *bad_word_ids;   /* [bad_word_off[n_bad_words]] */
    int n_stop_ids;
    int32_t stop_ids[SAMPLING_MAX_STOP_IDS]; /* finish with reason stop (token is kept) */
    int ignore_eos;           /* 1: the model's EOS ids do not end the sequence */
    int max_tokens;           /* generated tokens per sequence; <= 0: up to max model len */
    int min_tokens;           /* EOS and stop ids are banned until this many were generated */
    int has_seed;             /* 0: the engine draws a seed at submit */
    uint64_t seed;
} SamplingParams;

/* Defaults: T = 1, no truncation, no penalties, no seed, max_tokens 16 (OpenAI). */
void sampling_params_default(SamplingParams *p);
/* Validate against a vocab size (request path: 400 with a message). */
int sampling_params_check(const SamplingParams *p, int vocab, Err *err);

/* The history a penalty looks at: prompt ids and generated ids of this sequence. */
typedef struct SampleHistory {
    const int32_t *prompt; int n_prompt;
    const int32_t *output; int n_output;
} SampleHistory;

typedef enum {
    LOGPROBS_RAW = 0,          /* vLLM raw_logprobs (vLLM's default) */
    LOGPROBS_RAW_LOGITS,       /* vLLM raw_logits */
    LOGPROBS_PROCESSED,        /* vLLM processed_logprobs */
    LOGPROBS_PROCESSED_LOGITS, /* vLLM processed_logits */
    LOGPROBS_SAMPLED,          /* ours: the distribution sampled from (greedy: 0 / -inf) */
} LogprobsMode;

/* What the caller wants besides the token. Pointers are caller-owned outputs. */
typedef struct SampleWant {
    int raw_logprob;        /* fill SampleResult.logprob_raw */
    int value;              /* fill SampleResult.value and rank in `mode` */
    LogprobsMode mode;      /* of value, rank and the top list */
    int top_n;              /* 0..SAMPLING_MAX_TOP_N alternatives */
    int32_t *top_ids;       /* [top_n] ranked by the mode's values, id asc on ties */
    float *top_logprobs;    /* [top_n] their values in the mode */
    int32_t *mask;          /* [vocab] receives the kept ids ascending, or NULL */
    /* Structured outputs (grammar.h): bitset [ceil(vocab / 64)], bit i of word
     * i / 64 set when id i is allowed, or NULL. Ids not allowed get a
     * processed logit of -inf before penalties, temperature and truncation,
     * so the sampled distribution, its log-probs, top_logprobs and the kept
     * set are those of the constrained distribution (renormalised over the
     * allowed ids). logprob_raw stays the unconstrained model distribution. */
    const uint64_t *allowed;
} SampleWant;

typedef struct SampleResult {
    int32_t token;
    float logprob;     /* under the sampled (processed, truncated, renormalised) distribution */
    float logprob_raw; /* log_softmax(l_raw)[token], before any processing; NAN unless wanted */
    float value;       /* the token's value in want->mode; NAN unless want->value */
    int32_t rank;      /* ids with value >= the token's (vLLM's rank, >= 1); 0 unless want->value */
    int32_t n_kept;    /* size of the kept set (always filled) */
} SampleResult;

typedef struct Sampler Sampler;

/* Scratch for rows of `vocab` logits. Start-up path. */
Sampler *sampler_create(int vocab);
void sampler_free(Sampler *s);

/* Sample one token from logits [vocab] (not modified). eos_ids: the model's
 * EOS ids (banned by min_tokens). seq_index: which of the request's n samples;
 * pos: the position the new token will occupy. */
int sampler_sample(Sampler *s, const float *logits, const SamplingParams *p,
                   const SampleHistory *h, const int32_t *eos_ids, int n_eos,
                   int seq_index, int pos, const SampleWant *want, SampleResult *out);

/* Log-probs of every id under the distribution the last sampler_sample drew
 * from: out [vocab], -inf outside the kept set. For tests and scoring. */
void sampler_kept_logprobs(Sampler *s, float *out);

/* log_softmax of a row at one id, and the top-n by value (id asc on ties) with
 * their log-probs: prompt log-probs. *rank (if not NULL) receives vLLM's rank
 * of id in the whole vocab: the number of ids whose log-prob is >= its own.
 * Uses the Sampler's scratch. */
float sampler_logprob_of(Sampler *s, const float *logits, int32_t id,
                         int top_n, int32_t *top_ids, float *top_logprobs, int32_t *rank);

/* The reference of SampleResult.rank (tests): the ids whose value in mode is >= v, each id's
 * value computed on its own, over the row of the last sampler_sample (logits: the same row).
 * Uses the Sampler's scratch. */
int32_t sampler_rank_reference(Sampler *s, const float *logits, LogprobsMode mode, float v);

/* The counter-based RNG: a uniform double in [0, 1) from (seed, seq, pos). */
double sampling_uniform(uint64_t seed, uint64_t seq_index, uint64_t pos);

#endif
