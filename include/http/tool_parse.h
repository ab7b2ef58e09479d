/*
 * tool_parse.h - split Qwen3-style chat output into reasoning, content and
 * tool calls, incrementally (the same machine serves streamed and
 * non-streamed responses, so their concatenations always agree).
 *
 * Grammar (what Qwen3 emits and vLLM's qwen3 reasoning / hermes tool parsers read):
 *   [<think> reasoning </think>] content (<tool_call> {"name": ..., "arguments": ...} </tool_call> content)*
 * - Reasoning is recognised only when the output starts with "<think>"; it
 *   runs to "</think>" (or to the end of a truncated output).
 * - A <tool_call> block whose body is not a JSON object with a string "name"
 *   (or that never closes) is passed through as content, tags included.
 * - Text that could be the start of a tag is held back until it can be
 *   decided, so a tag split across tokens is still recognised.
 *
 * Not here: where the text comes from (detokenizer), the JSON chunk shapes (api_chat.c).
 */
#ifndef SAMPLER_TOOL_PARSE_H
#define SAMPLER_TOOL_PARSE_H

#include <stddef.h>

#include "buf.h"

typedef struct ToolCall {
    char *name;      /* malloc'd */
    char *arguments; /* malloc'd JSON text (json.dumps style: ", " and ": " separators) */
} ToolCall;

typedef struct ToolParser ToolParser;

/* think: recognise <think>...</think>; tools: recognise <tool_call> blocks. */
ToolParser *tool_parser_create(int think, int tools);
/* Return at most max completed calls (max >= 0); later calls are parsed and
 * dropped, not passed through as content: vLLM's parallel_tool_calls: false
 * (maybe_filter_parallel_tool_calls keeps the first call of a whole answer
 * and the deltas of call index 0 of a stream). Default: no limit. */
void tool_parser_max_calls(ToolParser *p, int max);
void tool_parser_free(ToolParser *p);
/* Feed the next piece of text. */
void tool_parser_push(ToolParser *p, const char *s, size_t n);
/* End of output: release what was held back. */
void tool_parser_finish(ToolParser *p);
/* Move out what became final since the last call: appended to content /
 * reasoning; completed calls (ownership passes to the caller; *calls is
 * malloc'd, free each member and the array). Returns the number of calls. */
int tool_parser_take(ToolParser *p, Buf *content, Buf *reasoning, ToolCall **calls);
void tool_call_free(ToolCall *c);

#endif
