/*
 * dialect.h - what the two agent dialects share on top of chat's machinery:
 * the OpenAI Responses API (api_responses.c) and the Anthropic Messages API
 * (api_messages.c) each translate their request into an OpenAI chat body
 * (messages, tools, tool_choice, chat_template_kwargs and the sampling fields
 * under their chat names), which is validated, rendered and tokenized exactly
 * as /v1/chat/completions does it (request_parse_gen, api_chat_prompt); the
 * output is cut by the Qwen3 parser (tool_parse.h) into an ordered list of
 * blocks (thinking, text, tool call) that each dialect renders in its shapes.
 *
 * Not here: either dialect's field names and event sequences (its own file),
 * the chat template (tokenizer/), generation (gen.h).
 */
#ifndef SAMPLER_DIALECT_H
#define SAMPLER_DIALECT_H

#include <jansson.h>

#include "gen.h"
#include "tool_parse.h"

/* A field the dialect names differently from chat: errors about chat_name
 * are reported with dialect_name ("max_tokens" -> "max_output_tokens"). */
typedef struct DialectRename {
    const char *chat_name, *dialect_name;
} DialectRename;

/* Validate chat (the translated body: n is forced to 1) into *p, render and
 * tokenize its messages into *prompt (one TokIds, malloc'd), *tools_on: tool
 * calls are parsed. The RL token-in path: when body has "prompt_token_ids"
 * (a list of ids below the vocab), those ids are the prompt instead of the
 * rendering (the messages are still validated). A tool_choice other than
 * "auto" / "none" is a 400 (for now: the one place to wire chat's forced
 * tool choice in). Errors name the dialect's
 * fields (ren: n_ren rows). Free *p with gen_params_free whatever the result. */
int dialect_prepare(Server *s, json_t *body, json_t *chat, const DialectRename *ren, int n_ren, GenParams *p,
                    TokIds **prompt, int *tools_on, Err *err);
/* Rewrite an error message that starts with a chat field's name to the dialect's. */
void dialect_rename_err(Err *err, const DialectRename *ren, int n_ren);

typedef enum { BLOCK_THINKING, BLOCK_TEXT, BLOCK_CALL } BlockKind;
/* One piece of output in order: text of a thinking or text block (n > 0), or
 * one complete tool call (call). */
typedef void (*BlockFn)(void *ctx, BlockKind kind, const char *text, size_t n, const ToolCall *call);
/* Feed s[0..n) to tp (finish: the output ends here) and hand what became
 * final to fn in output order. The text is pushed in pieces that each end
 * at a '>' (every tag ends with one), so one take of the parser never holds
 * two kinds out of order (content, a call, more content). */
void dialect_feed(ToolParser *tp, const char *s, size_t n, int finish, BlockFn fn, void *ctx);

/* The RL fields of choice 0 added to obj when any return_* field asked for
 * them: prompt_token_ids (return_token_ids), gen_rl_fields over the whole
 * output, weight_versions and weight_version. 1 if it added any. */
int dialect_rl_fields(Gen *g, json_t *obj);
/* Output tokens of choice 0 that are reasoning: up to and including the
 * "</think>" token when the output opens with "<think>" (all of them when
 * it never closes), else 0. */
int dialect_reasoning_tokens(Gen *g);
/* A fresh id in the dialects' style: prefix + '_' + 16 hex digits. */
void dialect_id(Server *s, const char *prefix, char *out, size_t cap);
/* The text of a content value: a string, or a list of parts whose "type" is
 * one of types (NULL-terminated) joined with "\n"; NULL with a 400 naming
 * what (e.g. "input[2].content") otherwise. malloc'd. */
char *dialect_text(json_t *content, const char *const *types, const char *what, Err *err);

#endif
