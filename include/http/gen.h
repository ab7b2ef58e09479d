/*
 * gen.h - one HTTP generation in flight: its prompts submitted to the engine
 * (one EngineRequest per prompt, n samples each), and per choice the
 * detokenized text with stop strings applied, ready to be written out as a
 * whole response or as SSE deltas. Also the JSON pieces both endpoints share:
 * usage, OpenAI logprobs (completions and chat shapes) and the RL fields.
 *
 * Stop strings: text is matched across token boundaries; a match ends the
 * choice (finish "stop") and truncates the text at the match (after it with
 * include_stop_str_in_output); the token that completed the match is the last
 * one returned. While streaming, the last (longest stop - 1) bytes are held
 * back until they cannot start a match.
 *
 * Not here: response shapes (api_completions.c, api_chat.c).
 */
#ifndef SAMPLER_GEN_H
#define SAMPLER_GEN_H

#include <jansson.h>

#include "buf.h"
#include "request_parse.h"
#include "server.h"

#define GEN_MAX_CHOICES 1024 /* prompts x n per request */

typedef struct Choice {
    int index;            /* in the response: prompt_i * n + seq */
    int prompt_i;
    EngineRequest *r;
    int seq;
    TokDecoder *dec;
    Buf text;             /* generated text, final up to a stop match */
    size_t text_sent;     /* bytes streamed */
    int n_seen;           /* engine records consumed */
    int n_out;            /* records that belong to the output */
    int n_sent;           /* records streamed */
    int done;             /* no more output will come */
    const char *finish;   /* "stop" "length" "abort" once done */
    const char *stop_str; /* the request's stop string that ended the output (finish "stop"), else NULL */
    int started;          /* streaming: the first chunk went out */
    int final_sent;       /* streaming: the finish chunk went out */
    long lp_offset;       /* streaming: text_offset of the next logprobs entry (characters) */
    int reasoning_tokens; /* Gen.count_reasoning: output tokens of the leading <think>...</think> */
    int reasoning_done;   /* the reasoning part ended (or the output does not start with <think>) */
    void *api;            /* endpoint state (chat: tool parser) */
} Choice;

typedef struct Gen {
    Server *s;
    int fd;               /* client socket for disconnect checks, or -1 */
    GenParams p;
    TokIds *prompts;      /* [n_prompts] */
    int n_prompts;
    EngineRequest **reqs; /* [n_prompts] */
    uint64_t *seen;       /* [n_prompts] */
    Choice *ch;           /* [n_ch] */
    int n_ch;
    LiveReq live;
    char id[48];
    int64_t created;
    int client_gone;
    int count_reasoning;  /* chat with the qwen3 reasoning parser: usage counts reasoning tokens */
    double last_out;      /* streaming: monotonic seconds when bytes last went out */
    int counted;          /* holds a Server.inflight slot */
    int failed;           /* an output could not be produced: the request must fail (gen_failed) */
    unsigned long alloc0; /* alloc_failures() of this thread when the current rendering began */
    Err fail;
} Gen;

/* Check lengths against the model (400 with param max_tokens / prompt),
 * apply the endpoint's default max_tokens (chat: the rest of the context),
 * submit every prompt, each with its rendering estimate (gen_render_bytes)
 * counted into the engine's output budget (400/503 naming what to lower). Takes ownership of p and prompts (freed by gen_free,
 * also on error). 503 when the queue is full or the server is shutting down. */
int gen_start(Gen *g, Server *s, int fd, GenParams *p, TokIds *prompts, int n_prompts, const char *id_prefix,
              Err *err);
/* Wait up to timeout_ms for engine progress, then consume it. Returns 1 when
 * every choice is done or the generation failed (gen_failed), 0 otherwise,
 * -1 when the client went away. */
int gen_step(Gen *g, int timeout_ms);
/* 1 (err filled) when an output of this generation could not be produced
 * correctly (engine_request_failed, or an allocation failed on this thread
 * since gen_render_begin: rendering ran out of memory): the
 * endpoint must answer with err (a stream: an error event), never with what
 * it has. Aborts the engine requests the first time it sees it. */
int gen_failed(Gen *g, Err *err);
/* Start counting this thread's allocation failures (each handler call that
 * renders: the whole response, every stream fill). */
void gen_render_begin(Gen *g);
/* An SSE error event {"error": {...}} for a failed stream. */
void gen_stream_error(Gen *g, Buf *out);
/* Streaming: after a step that produced nothing, add an SSE comment when
 * the stream has been silent for 15 s (paused engine, long queue), so
 * proxies and clients do not time out. Returns 1 if it wrote one. */
int gen_keepalive(Gen *g, Buf *out);
/* Bytes of c->text that may be sent now. */
size_t gen_emit_limit(const Gen *g, const Choice *c);
void gen_free(Gen *g);

/* {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details":
 * {"cached_tokens"} (prompt tokens found in the prefix cache), and with
 * count_reasoning "completion_tokens_details": {"reasoning_tokens"}} */
json_t *gen_usage(const Gen *g);
/* OpenAI completions logprobs {"tokens", "token_logprobs", "top_logprobs",
 * "text_offset"} for records [from, to) of c; *offset carries text_offset
 * (characters). Each position's top_logprobs is its own token plus up to
 * `logprobs` others of the engine's top list, as vLLM returns them. */
json_t *gen_logprobs_completions(Gen *g, Choice *c, int from, int to, long *offset);
/* The same shape for the echoed prompt of prompt i (echo with logprobs): the
 * positions published so far, the first with null logprob and top_logprobs
 * (no context), the others with the engine's prompt top list (top
 * prompt_logprobs when the request set it, else top logprobs), cut as above. */
json_t *gen_logprobs_completions_prompt(Gen *g, int prompt_i, long *offset);
/* Prompt positions of prompt i whose log-probs are published (its length once prefilled). */
int gen_prompt_logprobs_n(Gen *g, int prompt_i);
/* Chat logprobs content list [{"token", "logprob", "bytes", "top_logprobs"}]. */
json_t *gen_logprobs_chat(Gen *g, Choice *c, int from, int to);
/* RL fields of records [from, to) of c added to obj: token_ids,
 * sampler_logprobs + token_weight_versions, raw_logprobs, sampling_mask,
 * routed_experts (each when asked for). */
void gen_rl_fields(Gen *g, Choice *c, int from, int to, json_t *obj);
/* Distinct weight versions of the output tokens of c, ascending. */
json_t *gen_weight_versions(Gen *g, Choice *c);
/* vLLM prompt_logprobs of prompt i: [null, {"id": {"logprob", "rank", "decoded_token"}}, ...]. */
json_t *gen_prompt_logprobs(Gen *g, int prompt_i);
/* The log-prob and top list of record r the OpenAI fields report (the
 * server's --logprobs-mode), for the dialects that build their own shapes. */
void gen_record_lp(const Gen *g, const TokenRecord *r, float *lp, const float **top);
/* The raw bytes of token id as a JSON list of integers. */
json_t *gen_token_bytes(Gen *g, int32_t id);
/* A JSON number for a log-prob (-inf as -9999.0, as vLLM does). */
json_t *gen_lp(float x);
/* Text of one token (decoded alone, special tokens kept). malloc'd; when
 * out of memory "" or NULL (the JSON calls take NULL), with the failure
 * noted so that gen_failed fails the request. */
char *gen_token_text(Gen *g, int32_t id);

#endif
