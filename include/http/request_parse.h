/*
 * request_parse.h - validate the JSON bodies of /v1/completions and
 * /v1/chat/completions into engine parameters. Every wrong type or
 * out-of-range value is a 400 whose message starts with the parameter name
 * ("temperature: must be in [0, 100]"), which http.c turns into the OpenAI
 * error's "param". Unknown fields are ignored, as vLLM does; a field vLLM
 * defines that changes results and that this server does not implement is a
 * 400 naming it (the F_REFUSE rows of GEN_FIELDS), never silently dropped.
 *
 * Not here: chat messages and templates (api_chat.c), the engine limits
 * that depend on the prompt (max_tokens vs context: gen.c).
 */
#ifndef SAMPLER_REQUEST_PARSE_H
#define SAMPLER_REQUEST_PARSE_H

#include <jansson.h>

#include "check.h"
#include "grammar.h"
#include "sampling.h"
#include "tokenizer.h"

#define GEN_MAX_STOP 16
#define GEN_MAX_BAD_WORDS 64

typedef struct GenParams {
    SamplingParams sp;      /* logit_bias arrays point into bias_ids/bias below */
    int32_t *bias_ids;      /* [sp.n_logit_bias] owned */
    float *bias;            /* [sp.n_logit_bias] owned */
    int32_t *allowed_ids;   /* [sp.n_allowed] owned (allowed_token_ids) */
    char *bad_words[GEN_MAX_BAD_WORDS]; /* vLLM bad_words, owned; tokenized by gen_start */
    int n_bad_words;
    int32_t *bad_off, *bad_ids; /* owned: sp.bad_word_off / sp.bad_word_ids (gen_start) */
    int n;
    int max_tokens_set;     /* 0: the endpoint's default applies */
    int logprobs;           /* -1: no logprobs; else N top alternatives */
    int echo;               /* completions: prepend the prompt */
    int chat_echo;          /* chat (vLLM): prepend the final message's content when it is the assistant's */
    int prompt_logprobs;    /* -1: none; N >= 0 (vLLM) */
    char *stop[GEN_MAX_STOP];
    int n_stop;
    size_t stop_maxlen;     /* bytes */
    int include_stop_str;   /* include_stop_str_in_output */
    int skip_special;       /* skip_special_tokens, default 1 */
    int spaces_between_special; /* accepted, ignored (byte-level BPE) */
    int stream, include_usage, continuous_usage;
    /* RL extensions */
    int ret_token_ids;      /* return_token_ids (vLLM) */
    int ret_sampler_lp;     /* return_sampler_logprobs: per token log-prob + weight version */
    int ret_raw_lp;         /* return_raw_logprobs */
    int ret_mask;           /* return_sampling_mask */
    int ret_experts;        /* return_routed_experts (SGLang) */
    uint64_t cache_salt;    /* cache_salt: 0 none, else request_parse_cache_salt's digest */
    size_t extra_render_bytes; /* a dialect's own rendering (mask lists), counted into the output budget */
    int ret_tokens_as_ids;  /* return_tokens_as_token_ids (vLLM): logprobs tokens as "token_id:N" */
    int truncate_prompt;    /* truncate_prompt_tokens (vLLM): keep k prompt tokens; -1: max_model_len; 0: off */
    int truncate_set;       /* truncate_prompt_tokens was given */
    int truncate_right;     /* truncation_side "right": keep the first k (default "left": the last k) */
    /* not parsed: the endpoint sets them from "model" (lora_model_acquire) */
    int lora;               /* LoRA adapter slot + 1 holding a reference (gen_free releases it); 0 the base */
    char lora_name[128];    /* that adapter's name, echoed as the response's "model" */
    /* structured outputs (structured.h): a grammar reference owned here, or NULL */
    Grammar *grammar;
} GenParams;

/* Fields common to both endpoints. chat selects the chat meaning of
 * logprobs (bool + top_logprobs) and of the max_tokens default. Free p with
 * gen_params_free whatever the result (an error may leave arrays parsed so far). */
int request_parse_gen(json_t *body, int chat, int vocab, int max_n, int max_logprobs, GenParams *p, Err *err);
void gen_params_free(GenParams *p);

/* /v1/completions "prompt": a string, a list of strings, a list of token ids
 * or a list of lists. Strings are tokenized (with the tokenizer's special
 * tokens, as vLLM does); ids are used as given after a range check.
 * *out is malloc'd [*n]. */
int request_parse_prompts(json_t *prompt, const Tokenizer *t, int vocab, TokIds **out, int *n, Err *err);
void prompts_free(TokIds *p, int n);

/* body[key] as a cache salt (vLLM cache_salt): absent or null leaves *out
 * (returns 0); a non-empty string sets *out to its nonzero 64-bit digest
 * (returns 1); anything else is a 400 naming key. */
int request_parse_cache_salt(json_t *body, const char *key, uint64_t *out, Err *err);

/* An optional boolean field, for the endpoints' own fields: 0 when absent or
 * null (leaving *v), 1 when set, <0 with a 400 on a wrong type. */
int rp_bool(json_t *o, const char *key, int *v, Err *err);

#endif
