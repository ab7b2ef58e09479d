/*
 * chat_template.h - a small Jinja interpreter for Hugging Face chat
 * templates: the subset the Qwen3 and Llama 3 / 3.1 templates use, with
 * transformers' settings (trim_blocks, lstrip_blocks, loopcontrols, tojson
 * like json.dumps(ensure_ascii=False), raise_exception, strftime_now).
 * A construct outside the subset is refused at compile time with its line
 * and name, never rendered differently from jinja2.
 *
 * Thread-safety: a compiled ChatTemplate is immutable; render may run from
 * many threads at once.
 */
#ifndef SAMPLER_CHAT_TEMPLATE_H
#define SAMPLER_CHAT_TEMPLATE_H

#include <jansson.h>

#include "check.h"

typedef struct ChatTemplate ChatTemplate;

/* Compile template source; NULL with e filled ("line N: unsupported ...")
 * when it uses something outside the subset or is malformed. */
ChatTemplate *chat_template_compile(const char *source, Err *e);
void chat_template_free(ChatTemplate *t);

/* Render with the top-level variables of context (a JSON object such as
 * {"messages": [...], "tools": [...], "add_generation_prompt": true,
 * "bos_token": "...", "enable_thinking": false}). *out is malloc'd and
 * NUL-terminated. Returns 0, or <0 with e filled: 400 for raise_exception
 * and type errors caused by the context, 500 otherwise; context is not modified. */
int chat_template_render(const ChatTemplate *t, json_t *context, char **out, Err *e);

#endif
