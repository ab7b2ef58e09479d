/*
 * structured.h - structured-output request fields to a compiled grammar
 * (grammar.h), under OpenAI's and vLLM's names:
 *   response_format: {"type": "text"} | {"type": "json_object"} |
 *     {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}
 *   structured_outputs (vLLM): {"json": schema | text, "regex", "choice",
 *     "grammar", "json_object": true} (one of them)
 *   guided_json, guided_regex, guided_choice, guided_grammar (vLLM, older names);
 *     guided_decoding_backend is accepted and ignored (there is one engine)
 *   chat: tool_choice "required" or {"type": "function", "function": {"name"}}
 *     forces one or more calls (required) or one call of the named function,
 *     written in the model's tool-call format ("<tool_call>\n{"name": ...,
 *     "arguments": ...}\n</tool_call>", what tool_parse.h reads back), the
 *     arguments constrained by the function's "parameters" schema;
 *     parallel_tool_calls: false makes "required" exactly one call.
 * At most one constraint per request (400 otherwise); a schema or grammar
 * outside the supported subset is a 400 naming what is unsupported.
 *
 * Compiled grammars are cached per server (GRAMMAR_CACHE_CAP, LRU) with the
 * masks they have built, so repeating a schema is cheap. The token trie over
 * the vocabulary is built on the first structured request.
 *
 * Not here: the grammar engine (engine layer), where the mask is applied
 * (engine_step.c).
 */
#ifndef SAMPLER_STRUCTURED_H
#define SAMPLER_STRUCTURED_H

#include <jansson.h>

#include "grammar.h"
#include "request_parse.h"
#include "server.h"

#define GRAMMAR_CACHE_CAP 16

/* Read the fields above from body into p->grammar (a reference p owns, freed
 * by gen_params_free), or leave it NULL. chat: tool_choice applies; tools_on:
 * the server parses tool calls (forced tool choice needs it). */
int structured_parse(Server *s, json_t *body, int chat, int tools_on, GenParams *p, Err *err);

/* For every dialect that forces tool calls (chat completions here; the
 * Responses and Messages APIs can call it): the grammar of calls of any of
 * the tools (name NULL, "required" / "any": one or more calls separated by a
 * newline, exactly one when parallel is 0) or exactly one call of `name`, over tools
 * in any of the three shapes ({"type": "function", "function": {"name",
 * "parameters"}}, {"type": "function", "name", "parameters"}, {"name",
 * "input_schema"}). A reference the caller must grammar_unref. */
int structured_tool_grammar(Server *s, json_t *tools, const char *name, int parallel, Grammar **out, Err *err);

/* A compiled grammar from the server's cache (a reference to unref). */
int structured_grammar(Server *s, GrammarKind kind, const char *src, size_t len, Grammar **out, Err *err);

/* Start-up / shutdown of the server's grammar state. */
void structured_init(Server *s);
void structured_free(Server *s);

#endif
