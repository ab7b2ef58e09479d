/*
 * bench_grammar.c - allowed-token mask time per token on the CPU at the real
 * vocabulary (models/tiny-qwen3's tokenizer, 151,936 ids), for JSON schemas,
 * json_object, a regex and a GBNF grammar. Per grammar: compile time, then
 * random walks (a uniformly drawn allowed token each step, EOS once allowed
 * after min_steps): the first walk fills the grammar's mask cache ("cold"),
 * the later walks reuse it ("warm", what a repeated schema costs). The
 * reference in the same run is one pass that only clears and counts a
 * mask-sized bitset (the floor of any mask).
 *
 * The hot pass replays the same walks (same random choices) once the cold
 * pass has filled the cache: what a repeated request costs per token.
 *
 * Usage: bench_grammar [walks] [steps]     (defaults 8 and 64)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar.h"
#include "tokenizer.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static unsigned long long rs = 0x9e3779b97f4a7c15ull;
static unsigned rnd(void) {
    rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17;
    return (unsigned)(rs >> 11);
}

typedef struct Stat { double t; long n; double max; double *all; } Stat;

static void walk(GrammarVocab *v, Grammar *g, int32_t eos, int steps, Stat *st, uint64_t *bits) {
    GrammarMatcher *m = grammar_matcher_create(g);
    int V = grammar_vocab_size(v);
    for (int s = 0; s < steps; s++) {
        double t0 = now();
        int n = grammar_matcher_fill_mask(m, bits, &eos, 1);
        double dt = now() - t0;
        st->t += dt;
        if (st->all) st->all[st->n] = dt;
        st->n++;
        if (dt > st->max) st->max = dt;
        if (n <= 0) break;
        int eos_ok = (bits[eos >> 6] >> (eos & 63)) & 1;
        int32_t pick = -1;
        if (eos_ok && s > 8) pick = eos;
        else {
            int k = (int)(rnd() % (unsigned)n), c = 0;
            for (int t = 0; t < V && pick < 0; t++)
                if ((bits[t >> 6] >> (t & 63)) & 1) { if (c == k && !(t == eos && n > 1)) pick = t; c++; }
            if (pick < 0) pick = eos_ok ? eos : -1;
        }
        if (pick < 0 || grammar_matcher_accept(m, pick, &eos, 1) < 0 || pick == eos) break;
    }
    grammar_matcher_free(m);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int walks = argc > 1 ? atoi(argv[1]) : 8, steps = argc > 2 ? atoi(argv[2]) : 64;
    Err e = { 0 };
    Tokenizer *tk = tokenizer_load("models/tiny-qwen3", &e);
    if (!tk) { fprintf(stderr, "run from the repository root: %s\n", e.msg); return 1; }
    int V = 151936;
    const char **b = calloc((size_t)V, sizeof *b);
    int32_t *l = calloc((size_t)V, sizeof *l);
    for (int i = 0; i < V; i++) {
        const char *p = NULL;
        size_t n = 0;
        l[i] = -1;
        if (i < tokenizer_vocab_size(tk) && !tokenizer_is_special(tk, i) && tokenizer_token_bytes(tk, i, &p, &n) == 0 && n > 0) {
            b[i] = p;
            l[i] = (int32_t)n;
        }
    }
    double t0 = now();
    GrammarVocab *v = grammar_vocab_create(V, b, l);
    printf("vocab %d: token trie built in %.1f ms\n", V, 1e3 * (now() - t0));
    int32_t eos = tokenizer_eos_id(tk);
    uint64_t *bits = calloc((size_t)grammar_vocab_words(v), 8);
    /* the floor: clear and count a bitset of the vocabulary */
    t0 = now();
    long acc = 0;
    for (int r = 0; r < 10000; r++) {
        memset(bits, 0, (size_t)grammar_vocab_words(v) * 8);
        bits[r % grammar_vocab_words(v)] = (uint64_t)r;
        for (int i = 0; i < grammar_vocab_words(v); i++) acc += __builtin_popcountll(bits[i]);
    }
    double floor_us = 1e6 * (now() - t0) / 10000;
    printf("reference: clear + count a %d-id bitset: %.2f us (%ld)\n\n", V, floor_us, acc & 1);
    struct { const char *name; GrammarKind k; const char *src; } gs[] = {
        { "json_schema person", GRAMMAR_JSON_SCHEMA,
          "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
          "\"skills\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":10},\"minItems\":3},"
          "\"work_history\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"company\":{\"type\":\"string\"},"
          "\"duration\":{\"type\":\"number\"},\"position\":{\"type\":\"string\"}},\"required\":[\"company\",\"position\"]}}},"
          "\"required\":[\"name\",\"age\",\"skills\",\"work_history\"]}" },
        { "json_schema enums+bool", GRAMMAR_JSON_SCHEMA,
          "{\"type\":\"object\",\"properties\":{\"color\":{\"enum\":[\"red\",\"green\",\"blue\"]},\"ok\":{\"type\":\"boolean\"},"
          "\"n\":{\"type\":\"integer\"}},\"required\":[\"color\",\"ok\",\"n\"],\"additionalProperties\":false}" },
        { "json_object", GRAMMAR_JSON_OBJECT, "" },
        { "regex ip", GRAMMAR_REGEX, "(\\d{1,3}\\.){3}\\d{1,3}" },
        { "gbnf arithmetic", GRAMMAR_GBNF, "root ::= e\ne ::= t ((\"+\" | \"-\") t)*\nt ::= [0-9]+ | \"(\" e \")\"" },
    };
    printf("%-24s %10s %14s %13s %13s %13s %10s\n", "grammar", "compile ms", "cold us/token", "hot us/token",
           "hot p50 us", "hot max us", "cache KB");
    double *all = malloc((size_t)walks * (size_t)steps * sizeof *all);
    for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++) {
        Grammar *g;
        t0 = now();
        if (grammar_compile(gs[i].k, gs[i].src, strlen(gs[i].src), v, &g, &e) < 0) {
            printf("%s: %s\n", gs[i].name, e.msg);
            continue;
        }
        double ct = now() - t0;
        Stat cold = { 0 }, hot = { .all = all };
        for (int w = 0; w < walks; w++) { rs = 0x9e3779b97f4a7c15ull + (unsigned long long)w; walk(v, g, eos, steps, &cold, bits); }
        for (int w = 0; w < walks; w++) { rs = 0x9e3779b97f4a7c15ull + (unsigned long long)w; walk(v, g, eos, steps, &hot, bits); }
        qsort(all, (size_t)hot.n, sizeof *all, cmp_d);
        printf("%-24s %10.2f %14.1f %13.1f %13.1f %13.1f %10zu\n", gs[i].name, 1e3 * ct, 1e6 * cold.t / (double)cold.n,
               1e6 * hot.t / (double)hot.n, 1e6 * all[hot.n / 2], 1e6 * hot.max, grammar_cache_kb(g));
        grammar_unref(g);
    }
    grammar_vocab_free(v);
    tokenizer_free(tk);
    free(b); free(l); free(bits); free(all);
    return 0;
}
