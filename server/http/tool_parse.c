/*
 * tool_parse.c - incremental <think> / <tool_call> splitter (tool_parse.h).
 *
 * State machine over a pending buffer: START (may see "<think>"), REASONING
 * (until "</think>"), CONTENT (until "<tool_call>"), TOOL (until
 * "</tool_call>"). Each state emits the text it can decide and keeps the
 * longest suffix that is a proper prefix of the tag it looks for.
 */
#include "tool_parse.h"

#include <stdlib.h>
#include <limits.h>
#include <string.h>

#include <jansson.h>

#include "check.h"

enum { S_START, S_REASONING, S_CONTENT, S_TOOL };

#define THINK_OPEN "<think>"
#define THINK_CLOSE "</think>"
#define TOOL_OPEN "<tool_call>"
#define TOOL_CLOSE "</tool_call>"

struct ToolParser {
    int think, tools, state, finished;
    Buf pending;            /* undecided text */
    Buf content, reasoning; /* decided, not yet taken */
    ToolCall *calls;        /* [n_calls] decided, not yet taken */
    int n_calls, cap_calls;
    int n_seen, max_calls;  /* calls completed so far; the most returned (INT_MAX: all) */
};

ToolParser *tool_parser_create(int think, int tools) {
    ToolParser *p = xcalloc(1, sizeof *p);
    p->think = think;
    p->tools = tools;
    p->state = think ? S_START : S_CONTENT;
    p->max_calls = INT_MAX;
    return p;
}

void tool_parser_max_calls(ToolParser *p, int max) {
    ASSERT(max >= 0, "tool_parser_max_calls(%d)", max);
    p->max_calls = max;
}

void tool_call_free(ToolCall *c) {
    free(c->name);
    free(c->arguments);
}

void tool_parser_free(ToolParser *p) {
    if (!p) return;
    for (int i = 0; i < p->n_calls; i++) tool_call_free(&p->calls[i]);
    free(p->calls);
    buf_free(&p->pending); buf_free(&p->content); buf_free(&p->reasoning);
    free(p);
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of tag. */
static size_t partial_tag(const char *s, size_t n, const char *tag) {
    size_t t = strlen(tag);
    for (size_t k = t - 1 < n ? t - 1 : n; k > 0; k--)
        if (memcmp(s + n - k, tag, k) == 0) return k;
    return 0;
}

static const char *find(const char *s, size_t n, const char *tag) {
    size_t t = strlen(tag);
    for (size_t i = 0; i + t <= n; i++)
        if (s[i] == tag[0] && memcmp(s + i, tag, t) == 0) return s + i;
    return NULL;
}

static void consume(ToolParser *p, size_t k) {
    memmove(p->pending.p, p->pending.p + k, p->pending.n - k);
    p->pending.n -= k;
    p->pending.p[p->pending.n] = 0;
}

/* A tool-call body -> call, or 0 when it is not one. */
static int parse_call(const char *s, size_t n, ToolCall *out) {
    json_error_t je;
    json_t *j = json_loadb(s, n, 0, &je);
    if (!j) return 0;
    json_t *name = json_object_get(j, "name");
    json_t *args = json_object_get(j, "arguments");
    int ok = json_is_object(j) && json_is_string(name);
    if (ok) {
        out->name = xstrdup(json_string_value(name));
        if (!args) {
            out->arguments = xstrdup("{}");
        } else {
            out->arguments = json_dumps(args, JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
            CHECK_PTR(out->arguments, "out of memory encoding tool arguments");
        }
    }
    json_decref(j);
    return ok;
}

static void add_call(ToolParser *p, ToolCall c) {
    if (p->n_seen++ >= p->max_calls) { /* past the limit: parsed, never returned */
        tool_call_free(&c);
        return;
    }
    if (p->n_calls == p->cap_calls) {
        p->cap_calls = p->cap_calls ? 2 * p->cap_calls : 4;
        p->calls = realloc(p->calls, sizeof(ToolCall) * (size_t)p->cap_calls);
        CHECK_PTR(p->calls, "out of memory");
    }
    p->calls[p->n_calls++] = c;
}

/* Emit everything decidable from pending. */
static void run(ToolParser *p) {
    for (;;) {
        const char *s = p->pending.p;
        size_t n = p->pending.n;
        if (n == 0) return;
        if (p->state == S_START) {
            size_t t = strlen(THINK_OPEN);
            if (n >= t && memcmp(s, THINK_OPEN, t) == 0) {
                consume(p, t);
                p->state = S_REASONING;
            } else if (n < t && memcmp(s, THINK_OPEN, n) == 0 && !p->finished) {
                return;
            } else {
                p->state = S_CONTENT;
            }
            continue;
        }
        const char *tag = p->state == S_REASONING ? THINK_CLOSE
                        : p->state == S_TOOL ? TOOL_CLOSE
                        : p->tools ? TOOL_OPEN : NULL;
        const char *hit = tag ? find(s, n, tag) : NULL;
        if (p->state == S_TOOL) {
            if (!hit) {
                if (!p->finished) return;
                buf_puts(&p->content, TOOL_OPEN); /* never closed: pass through */
                buf_append(&p->content, s, n);
                consume(p, n);
                p->state = S_CONTENT;
                return;
            }
            size_t body = (size_t)(hit - s), t = strlen(TOOL_CLOSE);
            ToolCall c = {0};
            if (parse_call(s, body, &c)) {
                add_call(p, c);
            } else {
                buf_puts(&p->content, TOOL_OPEN);
                buf_append(&p->content, s, body + t);
            }
            consume(p, body + t);
            p->state = S_CONTENT;
            continue;
        }
        Buf *out = p->state == S_REASONING ? &p->reasoning : &p->content;
        if (hit) {
            size_t k = (size_t)(hit - s);
            buf_append(out, s, k);
            consume(p, k + strlen(tag));
            p->state = p->state == S_REASONING ? S_CONTENT : S_TOOL;
            continue;
        }
        size_t keep = tag && !p->finished ? partial_tag(s, n, tag) : 0;
        buf_append(out, s, n - keep);
        consume(p, n - keep);
        return;
    }
}

void tool_parser_push(ToolParser *p, const char *s, size_t n) {
    buf_append(&p->pending, s, n);
    run(p);
}

void tool_parser_finish(ToolParser *p) {
    p->finished = 1;
    run(p);
}

int tool_parser_take(ToolParser *p, Buf *content, Buf *reasoning, ToolCall **calls) {
    if (p->content.n) buf_append(content, p->content.p, p->content.n);
    if (p->reasoning.n) buf_append(reasoning, p->reasoning.p, p->reasoning.n);
    p->content.n = p->reasoning.n = 0;
    int n = p->n_calls;
    *calls = p->calls;
    p->calls = NULL;
    p->n_calls = p->cap_calls = 0;
    return n;
}

