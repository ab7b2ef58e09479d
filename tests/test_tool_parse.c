/*
 * test_tool_parse.c - the <think>/<tool_call> splitter against assistant
 * turns rendered by the real Qwen3 chat template (tests/data/tool_parse_golden.json,
 * from scripts/make_tool_parse_goldens.py): fed whole and in every split, it
 * recovers the original reasoning, content and calls. Plus the documented
 * pass-through of malformed blocks.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "test.h"
#include "tool_parse.h"

typedef struct Out {
    Buf content, reasoning;
    int n_calls;
    ToolCall calls[16];
} Out;

static int g_max_calls = -1; /* >= 0: tool_parser_max_calls for the next feeds */

/* Feed text cut at the given boundaries (piece sizes cycling through step). */
static void feed(const char *text, size_t n, size_t step, size_t cut, int think, int tools, Out *o) {
    memset(o, 0, sizeof *o);
    ToolParser *p = tool_parser_create(think, tools);
    if (g_max_calls >= 0) tool_parser_max_calls(p, g_max_calls);
    size_t i = 0;
    while (i < n) {
        size_t k = cut ? (i < cut ? cut - i : n - i) : step;
        if (k > n - i) k = n - i;
        tool_parser_push(p, text + i, k);
        i += k;
        ToolCall *c;
        int m = tool_parser_take(p, &o->content, &o->reasoning, &c);
        for (int j = 0; j < m; j++) o->calls[o->n_calls++] = c[j];
        free(c);
    }
    tool_parser_finish(p);
    ToolCall *c;
    int m = tool_parser_take(p, &o->content, &o->reasoning, &c);
    for (int j = 0; j < m; j++) o->calls[o->n_calls++] = c[j];
    free(c);
    tool_parser_free(p);
}

static void out_free(Out *o) {
    buf_free(&o->content); buf_free(&o->reasoning);
    for (int i = 0; i < o->n_calls; i++) tool_call_free(&o->calls[i]);
}

/* s stripped of chars in set at both ends equals want. */
static int strip_eq(const Buf *b, const char *want, const char *set) {
    const char *s = b->p ? b->p : "";
    size_t n = b->n;
    while (n && strchr(set, s[0])) s++, n--;
    while (n && strchr(set, s[n - 1])) n--;
    return n == strlen(want) && memcmp(s, want, n) == 0;
}

static void check_case(json_t *c, size_t step, size_t cut) {
    const char *text = json_string_value(json_object_get(c, "text"));
    Out o;
    feed(text, strlen(text), step, cut, 1, 1, &o);
    json_t *calls = json_object_get(c, "calls");
    T_ASSERT(strip_eq(&o.reasoning, json_string_value(json_object_get(c, "reasoning")), "\n"),
             "reasoning '%s' (step %zu cut %zu)", o.reasoning.p, step, cut);
    T_ASSERT(strip_eq(&o.content, json_string_value(json_object_get(c, "content")), " \n"),
             "content '%s' (step %zu cut %zu)", o.content.p, step, cut);
    T_ASSERT(o.n_calls == (int)json_array_size(calls), "%d calls (step %zu cut %zu)", o.n_calls, step, cut);
    for (int i = 0; i < o.n_calls && i < (int)json_array_size(calls); i++) {
        json_t *w = json_array_get(calls, (size_t)i);
        T_ASSERT(!strcmp(o.calls[i].name, json_string_value(json_object_get(w, "name"))), "name %s", o.calls[i].name);
        T_ASSERT(!strcmp(o.calls[i].arguments, json_string_value(json_object_get(w, "arguments"))),
                 "arguments %s vs %s", o.calls[i].arguments, json_string_value(json_object_get(w, "arguments")));
    }
    out_free(&o);
}

/* parallel_tool_calls: false (vLLM keeps the first call): a golden turn with
 * several calls gives its first call only, the same reasoning and content
 * (the dropped calls never turn into text), fed whole and in every split. */
static void check_first_call_only(json_t *c, size_t step, size_t cut) {
    const char *text = json_string_value(json_object_get(c, "text"));
    json_t *calls = json_object_get(c, "calls");
    Out o;
    g_max_calls = 1;
    feed(text, strlen(text), step, cut, 1, 1, &o);
    g_max_calls = -1;
    T_ASSERT(o.n_calls == 1, "%d calls with max 1 (step %zu cut %zu)", o.n_calls, step, cut);
    json_t *w = json_array_get(calls, 0);
    if (o.n_calls >= 1) {
        T_ASSERT(!strcmp(o.calls[0].name, json_string_value(json_object_get(w, "name"))), "name %s", o.calls[0].name);
        T_ASSERT(!strcmp(o.calls[0].arguments, json_string_value(json_object_get(w, "arguments"))), "arguments %s",
                 o.calls[0].arguments);
    }
    T_ASSERT(strip_eq(&o.content, json_string_value(json_object_get(c, "content")), " \n"),
             "content '%s' with max 1 (step %zu cut %zu)", o.content.p, step, cut);
    T_ASSERT(strip_eq(&o.reasoning, json_string_value(json_object_get(c, "reasoning")), "\n"),
             "reasoning '%s' with max 1", o.reasoning.p);
    out_free(&o);
}

static void check_literal(const char *text, int think, int tools, const char *content, const char *reasoning,
                          int n_calls) {
    size_t n = strlen(text);
    for (size_t step = 1; step <= n; step++) {
        Out o;
        feed(text, n, step, 0, think, tools, &o);
        T_ASSERT(o.content.n == strlen(content) && (!o.content.n || !strcmp(o.content.p, content)),
                 "'%s': content '%s' want '%s' (step %zu)", text, o.content.p, content, step);
        T_ASSERT(o.reasoning.n == strlen(reasoning) && (!o.reasoning.n || !strcmp(o.reasoning.p, reasoning)),
                 "'%s': reasoning '%s' (step %zu)", text, o.reasoning.p, step);
        T_ASSERT(o.n_calls == n_calls, "'%s': %d calls (step %zu)", text, o.n_calls, step);
        out_free(&o);
    }
}

int main(void) {
    json_error_t je;
    json_t *g = json_load_file("tests/data/tool_parse_golden.json", 0, &je);
    T_ASSERT(g && json_array_size(g) > 0, "golden file: %s", je.text);
    size_t i;
    json_t *c;
    json_array_foreach(g, i, c) {
        size_t n = strlen(json_string_value(json_object_get(c, "text")));
        check_case(c, n, 0);
        for (size_t step = 1; step <= 7; step++) check_case(c, step, 0);
        for (size_t cut = 1; cut < n; cut++) check_case(c, 0, cut);
    }
    int multi = 0;
    json_array_foreach(g, i, c) {
        if (json_array_size(json_object_get(c, "calls")) < 2) continue;
        multi++;
        size_t n = strlen(json_string_value(json_object_get(c, "text")));
        check_first_call_only(c, n, 0);
        for (size_t step = 1; step <= 7; step++) check_first_call_only(c, step, 0);
        for (size_t cut = 1; cut < n; cut++) check_first_call_only(c, 0, cut);
    }
    T_ASSERT(multi > 0, "the golden file has no turn with several calls");
    json_decref(g);

    /* Documented pass-through and mode switches. */
    check_literal("<tool_call>\n{not json}\n</tool_call> after", 1, 1,
                  "<tool_call>\n{not json}\n</tool_call> after", "", 0);
    check_literal("x <tool_call>{\"name\": \"f\"", 1, 1, "x <tool_call>{\"name\": \"f\"", "", 0);
    check_literal("<tool_call>{\"arguments\": {}}</tool_call>", 1, 1, "<tool_call>{\"arguments\": {}}</tool_call>", "", 0);
    check_literal("<tool_call>{\"name\": \"f\"}</tool_call>", 1, 0, "<tool_call>{\"name\": \"f\"}</tool_call>", "", 0);
    check_literal("<tool_call>{\"name\": \"f\"}</tool_call>", 0, 1, "", "", 1);
    check_literal("<think>abc</think>rest", 0, 1, "<think>abc</think>rest", "", 0);
    check_literal("<think>abc", 1, 1, "", "abc", 0);
    check_literal("<thin", 1, 1, "<thin", "", 0);
    check_literal("a <think>b</think>", 1, 1, "a <think>b</think>", "", 0);
    check_literal("tail <tool_c", 1, 1, "tail <tool_c", "", 0);
    return T_DONE();
}
