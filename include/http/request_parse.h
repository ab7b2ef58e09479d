/*
 * request_parse.h - validate the JSON bodies of /v1/completions and
 * /v1/chat/completions into engine parameters. Every wrong type or
 * out-of-range value is a 400 whose message starts with the parameter name
 * ("temperature: must be in [0, 100]"), which http.c turns into the OpenAI
 * error's "param". Unknown fields are ignored, as vLLM does.
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

typedef struct GenParams {
    SamplingParams sp;      /* logit_bias arrays point into bias_ids/bias below */
    int32_t *bias_ids;      /* [sp.n_logit_bias] owned */
    float *bias;            /* [sp.n_logit_bias] owned */
    int n;
    int max_tokens_set;     /* 0: the endpoint's default applies */
    int logprobs;           /* -1: no logprobs; else N top alternatives */
    int echo;               /* completions: prepend the prompt */
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

/* An optional boolean field, for the endpoints' own fields: 0 when absent or
 * null (leaving *v), 1 when set, <0 with a 400 on a wrong type. */
int rp_bool(json_t *o, const char *key, int *v, Err *err);

#endif
