/*
 * test_chat_template.c - the Jinja interpreter against goldens made by
 * scripts/make_tokenizer_goldens.py with transformers' apply_chat_template
 * and its Jinja environment: each model's own template (and Llama 3.1's
 * tool template) over the conversations, rendered text and token ids; a set
 * of small templates covering the rest of the subset; and refusal, at
 * compile time with line and name, of constructs outside it.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "chat_template.h"
#include "test.h"
#include "tokenizer.h"

#define DATA "tests/data/tokenizers"

static json_t *load(const char *path) {
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) { fprintf(stderr, "%s: %s\n", path, je.text); exit(1); }
    return j;
}

static void show_diff(const char *got, const char *want) {
    size_t i = 0;
    while (got[i] && got[i] == want[i]) i++;
    size_t s = i > 40 ? i - 40 : 0;
    fprintf(stderr, "  first difference at byte %zu\n  got:  %.80s\n  want: %.80s\n", i, got + s, want + s);
}

/* One rendering repeated from several threads on the same Tokenizer. */
typedef struct Job { const Tokenizer *t; json_t *conv, *kwargs; const char *want; int bad; } Job;

static void *render_many(void *p) {
    Job *j = p;
    for (int k = 0; k < 50; k++) {
        char *out = NULL;
        Err e = {0};
        if (tokenizer_apply_chat_template(j->t, json_object_get(j->conv, "messages"), json_object_get(j->conv, "tools"), true,
                                          j->kwargs, &out, &e) || strcmp(out, j->want))
            j->bad++;
        free(out);
    }
    return NULL;
}

static void test_model(const char *name, json_t *convs, json_t *cases) {
    char dir[256], path[512];
    snprintf(dir, sizeof dir, DATA "/%s", name);
    Err e = {0};
    Tokenizer *t = tokenizer_load(dir, &e);
    T_ASSERT(t != NULL, "%s: %s", name, e.msg);
    if (!t) return;
    T_ASSERT(tokenizer_chat_template(t) != NULL, "%s has a chat template", name);
    char *src = NULL;
    ChatTemplate *alt = NULL;
    FILE *f = fopen(DATA "/chat/llama31_tools.jinja", "rb");
    if (f) {
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        src = calloc(1, (size_t)n + 1);
        if (fread(src, 1, (size_t)n, f) != (size_t)n) n = 0;
        fclose(f);
        alt = chat_template_compile(src, &e);
        T_ASSERT(alt != NULL, "llama31_tools.jinja: %s", e.msg);
    }
    snprintf(path, sizeof path, DATA "/%s/chat.json", name);
    json_t *gold = load(path), *g;
    size_t i;
    int n_text = 0, n_bad = 0, n_err = 0;
    TokIds ids = {0};
    json_array_foreach(gold, i, g) {
        json_t *c = json_array_get(cases, i % json_array_size(cases));
        json_t *conv = json_array_get(convs, (size_t)json_integer_value(json_object_get(c, "conv")));
        bool agp = json_is_true(json_object_get(c, "add_generation_prompt"));
        const ChatTemplate *tpl = json_object_get(g, "template") ? alt : tokenizer_chat_template(t);
        if (!tpl) continue;
        char *out = NULL;
        Err re = {0};
        int rc = tokenizer_apply_template(t, tpl, json_object_get(conv, "messages"), json_object_get(conv, "tools"), agp,
                                          json_object_get(c, "kwargs"), &out, &re);
        json_t *want = json_object_get(g, "text");
        if (!want) {
            n_err++;
            T_ASSERT(rc < 0, "%s case %zu: jinja2 raised (%s) but we rendered", name, i,
                     json_string_value(json_object_get(g, "error")));
            free(out);
            continue;
        }
        n_text++;
        if (rc < 0 || strcmp(out, json_string_value(want))) {
            n_bad++;
            fprintf(stderr, "%s case %zu (conv %lld): %s\n", name, i, (long long)json_integer_value(json_object_get(c, "conv")),
                    rc < 0 ? re.msg : "text differs");
            if (rc == 0) show_diff(out, json_string_value(want));
            free(out);
            continue;
        }
        ids.n = 0;
        tokenizer_encode(t, out, strlen(out), false, &ids, &e);
        json_t *wid = json_object_get(g, "ids");
        bool same = ids.n == json_array_size(wid);
        for (size_t k = 0; same && k < ids.n; k++) same = ids.ids[k] == json_integer_value(json_array_get(wid, k));
        T_ASSERT(same, "%s case %zu: ids differ", name, i);
        free(out);
    }
    T_ASSERT(n_bad == 0, "%s: %d of %d rendered conversations differ from transformers", name, n_bad, n_text);
    /* the longest case with a generation prompt, from 4 threads at once */
    size_t best = 0, best_len = 0;
    json_array_foreach(gold, i, g) {
        json_t *c = json_array_get(cases, i % json_array_size(cases)), *txt = json_object_get(g, "text");
        if (txt && !json_object_get(g, "template") && json_is_true(json_object_get(c, "add_generation_prompt")) &&
            json_string_length(txt) > best_len) { best = i; best_len = json_string_length(txt); }
    }
    json_t *bc = json_array_get(cases, best % json_array_size(cases));
    Job jobs[4];
    pthread_t th[4];
    for (int k = 0; k < 4; k++) {
        jobs[k] = (Job){t, json_array_get(convs, (size_t)json_integer_value(json_object_get(bc, "conv"))),
                        json_object_get(bc, "kwargs"), json_string_value(json_object_get(json_array_get(gold, best), "text")), 0};
        pthread_create(&th[k], NULL, render_many, &jobs[k]);
    }
    for (int k = 0; k < 4; k++) {
        pthread_join(th[k], NULL);
        T_ASSERT(jobs[k].bad == 0, "%s: thread %d rendered %d differing texts", name, k, jobs[k].bad);
    }
    printf("%s: %d conversations rendered and tokenized, %d expected errors\n", name, n_text, n_err);
    tok_ids_free(&ids);
    json_decref(gold);
    chat_template_free(alt);
    free(src);
    tokenizer_free(t);
}

static void test_mini(void) {
    json_t *mini = load(DATA "/chat/mini.json"), *m;
    size_t i;
    json_array_foreach(mini, i, m) {
        Err e = {0};
        const char *src = json_string_value(json_object_get(m, "template"));
        ChatTemplate *t = chat_template_compile(src, &e);
        T_ASSERT(t != NULL, "mini %zu does not compile: %s", i, e.msg);
        if (!t) continue;
        char *out = NULL;
        int rc = chat_template_render(t, json_object_get(m, "context"), &out, &e);
        json_t *want = json_object_get(m, "text");
        if (!want) T_ASSERT(rc < 0, "mini %zu: jinja2 raised but we rendered %s", i, out);
        else {
            T_ASSERT(rc == 0 && !strcmp(out, json_string_value(want)), "mini %zu: %s\n  template: %s\n  got:  [%s]\n  want: [%s]", i,
                     rc ? e.msg : "differs", src, out ? out : "", json_string_value(want));
        }
        free(out);
        chat_template_free(t);
    }
    json_decref(mini);
}

/* Outside the subset: refused at compile time with the line and the name. */
static void test_refusals(void) {
    static const struct { const char *src, *want; } cases[] = {
        {"{% macro f() %}x{% endmacro %}", "line 1: unsupported tag 'macro'"},
        {"a\nb\n{{ x | wordcount }}", "line 3: unsupported filter 'wordcount'"},
        {"{% if x is callable %}{% endif %}", "line 1: unsupported test 'callable'"},
        {"\n{{ s.format(1) }}", "line 2: unsupported method 'format'"},
        {"{% include 'other.jinja' %}", "unsupported tag 'include'"},
        {"{{ cycler(1, 2) }}", "unsupported function 'cycler'"},
        {"{% for x in y recursive %}{% endfor %}", "unsupported loop modifier 'recursive'"},
        {"{% set x %}block{% endset %}", "unsupported block set"},
        {"{% if x %}", "missing 'endif'"},
        {"{% raw %}{{ x }}{% endraw %}", "unsupported tag 'raw'"},
        {"{% filter upper %}x{% endfilter %}", "unsupported tag 'filter'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        Err e = {0};
        ChatTemplate *t = chat_template_compile(cases[i].src, &e);
        T_ASSERT(t == NULL && strstr(e.msg, cases[i].want), "refusal %zu: want '%s', got '%s'", i, cases[i].want,
                 t ? "compiled" : e.msg);
        chat_template_free(t);
    }
    /* nesting deep enough to exhaust the C stack is refused, not crashed on */
    char deep[2048] = "{{ ";
    for (int i = 0; i < 600; i++) strcat(deep, "(");
    strcat(deep, "1");
    for (int i = 0; i < 600; i++) strcat(deep, ")");
    strcat(deep, " }}");
    Err de = {0};
    ChatTemplate *dt = chat_template_compile(deep, &de);
    T_ASSERT(dt == NULL && strstr(de.msg, "nested too deep"), "deep nesting: %s", dt ? "compiled" : de.msg);
    chat_template_free(dt);
    /* a runaway template stops at the render budget with an error */
    dt = chat_template_compile("{% for i in range(1000000) %}{% for j in range(1000000) %}{{ 'x' * 4096 }}{% endfor %}{% endfor %}", &de);
    char *dout = NULL;
    T_ASSERT(dt && chat_template_render(dt, NULL, &dout, &de) < 0 && strstr(de.msg, "too"), "runaway: %s", de.msg);
    free(dout);
    chat_template_free(dt);
    /* an empty sequence repeated a huge number of times is empty, at once (found by
     * fuzz_chat_template: the repetition looped k times over nothing; jinja2 gives '[]') */
    dt = chat_template_compile("{{ [] * 4000000000000000000 }}|{{ '' * 4000000000000000000 }}", &de);
    dout = NULL;
    T_ASSERT(dt && chat_template_render(dt, NULL, &dout, &de) == 0 && !strcmp(dout, "[]|"), "empty repeat: %s",
             dout ? dout : de.msg);
    free(dout);
    chat_template_free(dt);
    /* many large values, each under the per-value limit, stop at the render's work budget */
    dt = chat_template_compile("{% for i in range(100000) %}{% set x = [1] * 900000 %}{% endfor %}", &de);
    dout = NULL;
    T_ASSERT(dt && chat_template_render(dt, NULL, &dout, &de) < 0 && strstr(de.msg, "builds too much"),
             "work budget: %s", de.msg);
    free(dout);
    chat_template_free(dt);
    /* raise_exception reaches the caller as a 400 with the template's message */
    Err e = {0};
    ChatTemplate *t = chat_template_compile("{{ raise_exception('bad role: ' + role) }}", &e);
    char *out = NULL;
    json_t *ctx = json_pack("{ss}", "role", "robot");
    T_ASSERT(t && chat_template_render(t, ctx, &out, &e) < 0 && e.code == 400 && strstr(e.msg, "bad role: robot"),
             "raise_exception: %s", e.msg);
    json_decref(ctx);
    chat_template_free(t);
}

int main(void) {
    json_t *c = load(DATA "/chat/conversations.json");
    json_t *convs = json_object_get(c, "conversations"), *cases = json_object_get(c, "cases");
    T_ASSERT(json_array_size(convs) >= 30, "%zu conversations", json_array_size(convs));
    test_refusals();
    test_mini();
    test_model("qwen3", convs, cases);
    test_model("llama3.1", convs, cases);
    json_decref(c);
    return T_DONE();
}
