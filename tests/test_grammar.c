/*
 * test_grammar.c - the grammar engine (grammar.h): at every step of random
 * walks the cached, trie-based mask equals the brute force over the
 * vocabulary (every token run through the parser); for regexes both equal
 * PCRE2's partial matching (a reference we did not write); walks end in
 * strings of the language (JSON parsed by jansson); bad grammars and schemas
 * are 400s naming what is unsupported. Uses a small synthetic vocabulary and
 * the bundled tiny model's real one (151,936 ids).
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <math.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "sampling.h"
#include "test.h"
#include "tokenizer.h"

#define EOS_SYN 9999

static const char *SYN_TOKENS[] = {
    "{\"", "\"}", "\":", "\",", "\", \"", "true", "false", "null", "12", "3.", "ab", "abc", "\"a", "a\"",
    " \"", "\\n", "\xc3\xa9", "\xc3\xa9\"", "[", "],", "]}", "},", "{\"name\": \"", "\"name\"", "name", "x)",
    "((", "))", "(x", "cd", "ee", "e", "-a", "12-", "34", "abx", "xa", "[a", "a]", "a,", ",b", "[[", "]]",
    "\"red\"", "\"green\"", "re", "\"re", "d\"", "{\"age\":", " 1", "1,", "1}", "0.5", "e+1", "-0", "\"\"",
    "{}", "[]", "\":\"", "\": ", ", ", "\n", "  ", "  \"", "\u00e9t\u00e9", NULL,
};

static GrammarVocab *syn_vocab(int *V) {
    int n = 256;
    while (SYN_TOKENS[n - 256]) n++;
    int vocab = n + 1;
    const char **b = calloc((size_t)vocab, sizeof *b);
    int32_t *l = calloc((size_t)vocab, sizeof *l);
    static char singles[256];
    for (int i = 0; i < 256; i++) { singles[i] = (char)i; b[i] = &singles[i]; l[i] = 1; }
    for (int i = 256; i < n; i++) { b[i] = SYN_TOKENS[i - 256]; l[i] = (int32_t)strlen(SYN_TOKENS[i - 256]); }
    b[n] = NULL; l[n] = -1; /* the EOS id: no bytes */
    GrammarVocab *v = grammar_vocab_create(vocab, b, l);
    free(b); free(l);
    *V = vocab;
    return v;
}

static unsigned long long rng_state = 88172645463325252ull;
static unsigned rnd(void) {
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (unsigned)(rng_state >> 11);
}

typedef struct Tok { const char *b; int len; } Tok;

/* PCRE2 reference: which of the tokens keep text[0..n) + token a prefix of
 * a match of ^(?:re)$; the end id when the text matches fully. */
static void pcre_mask(const char *re, const char *text, size_t n, const Tok *toks, int V, int32_t eos, uint64_t *bits) {
    char pat[512];
    snprintf(pat, sizeof pat, "^(?:%s)$", re);
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *c = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_DOLLAR_ENDONLY, &ec, &eo, NULL);
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    memset(bits, 0, (size_t)(V + 63) / 64 * 8);
    char *buf = malloc(n + 64);
    memcpy(buf, text, n);
    for (int t = 0; t < V; t++) {
        if (toks[t].len <= 0) continue;
        memcpy(buf + n, toks[t].b, (size_t)toks[t].len);
        int r = pcre2_match(c, (PCRE2_SPTR)buf, n + (size_t)toks[t].len, 0, PCRE2_PARTIAL_HARD, md, NULL);
        if (r >= 0 || r == PCRE2_ERROR_PARTIAL) bits[t >> 6] |= 1ull << (t & 63);
    }
    if (pcre2_match(c, (PCRE2_SPTR)text, n, 0, 0, md, NULL) >= 0) bits[eos >> 6] |= 1ull << (eos & 63);
    free(buf);
    pcre2_match_data_free(md);
    pcre2_code_free(c);
}

static int count_diff(const uint64_t *a, const uint64_t *b, int words) {
    int d = 0;
    for (int i = 0; i < words; i++) d += __builtin_popcountll(a[i] ^ b[i]);
    return d;
}

/* A random walk: at each step fast == slow (and == pcre when re); returns
 * the accepted text (malloc'd) and whether it ended on EOS. */
static char *walk(GrammarVocab *v, const Tok *toks, Grammar *g, int32_t eos, const char *re, int steps, int prefer_end,
                  int *ended, int *bad) {
    int V = grammar_vocab_size(v), W = grammar_vocab_words(v);
    uint64_t *fast = calloc((size_t)W, 8), *slow = calloc((size_t)W, 8), *ref = calloc((size_t)W, 8);
    GrammarMatcher *m = grammar_matcher_create(g);
    size_t cap = 1 << 16, n = 0;
    char *text = calloc(cap, 1);
    *ended = 0;
    for (int s = 0; s < steps; s++) {
        int nf = grammar_matcher_fill_mask(m, fast, &eos, 1);
        int ns = grammar_matcher_fill_mask_slow(m, slow, &eos, 1);
        int d = count_diff(fast, slow, W);
        if (d || nf != ns) {
            (*bad)++;
            fprintf(stderr, "step %d after \"%.*s\": fast %d slow %d, %d differ\n", s, (int)n, text, nf, ns, d);
            for (int t = 0; t < V; t++)
                if (((fast[t >> 6] ^ slow[t >> 6]) >> (t & 63)) & 1)
                    fprintf(stderr, "  id %d \"%.*s\" fast %d\n", t, toks[t].len > 0 ? toks[t].len : 0,
                            toks[t].len > 0 ? toks[t].b : "", (int)((fast[t >> 6] >> (t & 63)) & 1));
            break;
        }
        if (re) {
            pcre_mask(re, text, n, toks, V, eos, ref);
            int dr = count_diff(fast, ref, W);
            if (dr) {
                (*bad)++;
                fprintf(stderr, "regex %s step %d after \"%.*s\": %d differ from pcre2\n", re, s, (int)n, text, dr);
                for (int t = 0; t < V; t++)
                    if (((fast[t >> 6] ^ ref[t >> 6]) >> (t & 63)) & 1)
                        fprintf(stderr, "  id %d fast %d\n", t, (int)((fast[t >> 6] >> (t & 63)) & 1));
                break;
            }
        }
        if (nf == 0) break;
        int eos_ok = (fast[eos >> 6] >> (eos & 63)) & 1;
        int32_t pick = -1;
        if (eos_ok && (prefer_end || nf == 1 || rnd() % 4 == 0)) pick = eos;
        else {
            int k = (int)(rnd() % (unsigned)nf), c = 0;
            for (int t = 0; t < V && pick < 0; t++)
                if ((fast[t >> 6] >> (t & 63)) & 1) { if (c == k) pick = t; c++; }
        }
        if (pick == eos && !eos_ok) break;
        if (grammar_matcher_accept(m, pick, &eos, 1) < 0) { (*bad)++; fprintf(stderr, "accept refused id %d\n", pick); break; }
        if (pick == eos) { *ended = 1; break; }
        if (n + (size_t)toks[pick].len + 1 < cap) { memcpy(text + n, toks[pick].b, (size_t)toks[pick].len); n += (size_t)toks[pick].len; }
    }
    grammar_matcher_free(m);
    free(fast); free(slow); free(ref);
    return text;
}

/* Threads sharing one grammar whose mask cache is still empty (the engine's
 * sampling threads): each walks and checks fast == slow. */
typedef struct Par { GrammarVocab *v; const Tok *toks; Grammar *g; int32_t eos; int bad; unsigned seed; } Par;
static void *par_walk(void *ctx) {
    Par *p = ctx;
    GrammarMatcher *m = grammar_matcher_create(p->g);
    int W = grammar_vocab_words(p->v), V = grammar_vocab_size(p->v);
    uint64_t *fast = calloc((size_t)W, 8), *slow = calloc((size_t)W, 8);
    unsigned x = p->seed;
    for (int s = 0; s < 6; s++) {
        int nf = grammar_matcher_fill_mask(m, fast, &p->eos, 1);
        int ns = grammar_matcher_fill_mask_slow(m, slow, &p->eos, 1);
        if (nf != ns || count_diff(fast, slow, W)) { p->bad++; break; }
        if (nf == 0) break;
        x = x * 1103515245u + 12345u;
        int k = (int)((x >> 8) % (unsigned)nf), c = 0;
        int32_t pick = -1;
        for (int t = 0; t < V && pick < 0; t++)
            if ((fast[t >> 6] >> (t & 63)) & 1) { if (c == k) pick = t; c++; }
        if (pick == p->eos || grammar_matcher_accept(m, pick, &p->eos, 1) < 0) break;
    }
    free(fast); free(slow);
    grammar_matcher_free(m);
    return NULL;
}

static Grammar *compile_ok(GrammarVocab *v, GrammarKind k, const char *src) {
    Err err = { 0 };
    Grammar *g = NULL;
    int rc = grammar_compile(k, src, strlen(src), v, &g, &err);
    T_ASSERT(rc == 0, "compile %s: %s", src, err.msg);
    return g;
}

static void expect_400(GrammarVocab *v, GrammarKind k, const char *src, const char *needle) {
    Err err = { 0 };
    Grammar *g = NULL;
    int rc = grammar_compile(k, src, strlen(src), v, &g, &err);
    T_ASSERT(rc < 0 && err.code == 400 && strstr(err.msg, needle), "%s -> %d %s (want 400 with \"%s\")", src,
             err.code, err.msg, needle);
    if (g) grammar_unref(g);
}

/* The sampler under an allowed set: the kept set is the allowed set (no
 * truncation), the log-probs renormalise over it (against a double-precision
 * log-sum-exp here), greedy takes the argmax inside it, top_p truncates
 * inside it. */
static void test_sampler_allowed(void) {
    enum { SV = 1000 };
    float logits[SV], lp[SV];
    uint64_t bits[(SV + 63) / 64] = { 0 };
    int32_t mask[SV];
    for (int i = 0; i < SV; i++) logits[i] = (float)((int)(rnd() % 2001) - 1000) / 100.0f;
    int n_allowed = 0;
    for (int i = 0; i < SV; i++)
        if (rnd() % 7 == 0) { bits[i >> 6] |= 1ull << (i & 63); n_allowed++; }
    Sampler *s = sampler_create(SV);
    SamplingParams p;
    sampling_params_default(&p);
    p.seed = 3;
    SampleHistory h = { 0 };
    int bad = 0;
    for (int pos = 0; pos < 50; pos++) {
        SampleWant w = { .mask = mask, .allowed = bits };
        SampleResult r;
        sampler_sample(s, logits, &p, &h, NULL, 0, 0, pos, &w, &r);
        bad += r.n_kept != n_allowed || !((bits[r.token >> 6] >> (r.token & 63)) & 1);
        for (int k = 0; k < r.n_kept; k++) bad += !((bits[mask[k] >> 6] >> (mask[k] & 63)) & 1);
        double m = -1e30, z = 0;
        for (int i = 0; i < SV; i++) if ((bits[i >> 6] >> (i & 63)) & 1 && logits[i] > m) m = logits[i];
        for (int i = 0; i < SV; i++) if ((bits[i >> 6] >> (i & 63)) & 1) z += exp((double)logits[i] - m);
        double want = (double)logits[r.token] - m - log(z);
        bad += fabs(want - (double)r.logprob) > 1e-4;
        sampler_kept_logprobs(s, lp);
        double tot = 0;
        for (int i = 0; i < SV; i++) tot += lp[i] > -INFINITY ? exp((double)lp[i]) : 0;
        bad += fabs(tot - 1) > 1e-4;
    }
    T_ASSERT(bad == 0, "sampler under an allowed set: %d mismatches", bad);
    p.temperature = 0;
    SampleWant w = { .allowed = bits };
    SampleResult r;
    sampler_sample(s, logits, &p, &h, NULL, 0, 0, 0, &w, &r);
    int am = -1;
    for (int i = 0; i < SV; i++) if ((bits[i >> 6] >> (i & 63)) & 1 && (am < 0 || logits[i] > logits[am])) am = i;
    T_ASSERT(r.token == am, "greedy under an allowed set: %d, want %d", r.token, am);
    p.temperature = 1;
    p.top_p = 0.5f;
    SampleWant w2 = { .mask = mask, .allowed = bits };
    sampler_sample(s, logits, &p, &h, NULL, 0, 0, 0, &w2, &r);
    int inside = 1;
    for (int k = 0; k < r.n_kept; k++) inside &= (int)((bits[mask[k] >> 6] >> (mask[k] & 63)) & 1);
    T_ASSERT(inside && r.n_kept >= 1 && r.n_kept <= n_allowed, "top_p inside the allowed set (%d kept)", r.n_kept);
    sampler_free(s);
}

int main(void) {
    test_sampler_allowed();
    int V;
    GrammarVocab *v = syn_vocab(&V);
    int32_t eos = V - 1;
    Tok *toks = calloc((size_t)V, sizeof *toks);
    static char singles[256];
    for (int i = 0; i < 256; i++) { singles[i] = (char)i; toks[i] = (Tok){ &singles[i], 1 }; }
    for (int i = 256; i < V - 1; i++) toks[i] = (Tok){ SYN_TOKENS[i - 256], (int)strlen(SYN_TOKENS[i - 256]) };
    toks[V - 1] = (Tok){ NULL, -1 };

    /* regexes against PCRE2 */
    const char *res[] = { "[a-c]+x?", "(ab|cd)*e", "\\d{2,4}-[a-z]{1,3}", "(a|ab)(c|bcd)?", "x*(\\(x\\))*",
                          "[^a-z\"]{0,3}abc", "(true|false|null)", "a{3}b?|(ab){2,}", "-?(0|[1-9][0-9]*)(\\.[0-9]+)?",
                          NULL };
    for (int i = 0; res[i]; i++) {
        Grammar *g = compile_ok(v, GRAMMAR_REGEX, res[i]);
        if (!g) continue;
        for (int w = 0; w < 8; w++) {
            int ended, bad = 0;
            free(walk(v, toks, g, eos, strchr(res[i], '^') ? NULL : res[i], 12, w & 1, &ended, &bad));
            T_ASSERT(bad == 0, "regex %s walk %d", res[i], w);
        }
        grammar_unref(g);
    }
    /* grammars with recursion, nullable rules, ambiguity */
    const char *gbnfs[] = {
        "root ::= \"(\" root \")\" | \"x\"",
        "root ::= item (\",\" item)*\nitem ::= [a-z]+ | \"[\" root \"]\"",
        "root ::= a* b\na ::= \"a\"?\nb ::= \"b\" | \"\"",
        "start: \"{\" pair? \"}\"\npair: /\"[a-z]*\"/ \":\" (\"true\" | \"null\" | start)",
        "root ::= [a-z]{1,3} (\" \" [a-z]{1,3}){0,2} \"\\n\"?",
        "root ::= x x\nx ::= \"a\" | \"ab\" | \"b\" x",
        NULL,
    };
    for (int i = 0; gbnfs[i]; i++) {
        Grammar *g = compile_ok(v, GRAMMAR_GBNF, gbnfs[i]);
        if (!g) continue;
        for (int w = 0; w < 8; w++) {
            int ended, bad = 0;
            free(walk(v, toks, g, eos, NULL, 16, w & 1, &ended, &bad));
            T_ASSERT(bad == 0, "gbnf %d walk %d", i, w);
        }
        grammar_unref(g);
    }
    /* a mask cache at its budget: positions not cached take the exact walk,
     * with the same masks (fast == slow at every step), and the cache stops growing */
    for (int i = 0; gbnfs[i]; i++) {
        Grammar *g = compile_ok(v, GRAMMAR_GBNF, gbnfs[i]);
        if (!g) continue;
        grammar_set_cache_max(g, i % 2 ? 0 : 4096);
        for (int w = 0; w < 8; w++) {
            int ended, bad = 0;
            free(walk(v, toks, g, eos, NULL, 16, w & 1, &ended, &bad));
            T_ASSERT(bad == 0, "gbnf %d walk %d, cache budget %d", i, w, i % 2 ? 0 : 4096);
        }
        T_ASSERT(i % 2 == 0 || grammar_cache_kb(g) == 0, "gbnf %d: a zero budget cached %zu KB", i,
                 grammar_cache_kb(g));
        grammar_unref(g);
    }
    /* JSON schemas on the synthetic vocabulary: walks that end parse as JSON */
    const char *schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":3},"
        "\"age\":{\"type\":\"integer\"},\"ok\":{\"type\":\"boolean\"}},\"required\":[\"name\"]}",
        "{\"enum\":[\"red\",\"green\",1,null]}",
        "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"null\"}]},\"minItems\":1,\"maxItems\":3}",
        "{\"$defs\":{\"t\":{\"type\":\"object\",\"properties\":{\"c\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/t\"},"
        "\"maxItems\":2}},\"required\":[\"c\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/t\"}",
        "{\"type\":\"string\",\"pattern\":\"^a[bc]+$\"}",
        NULL,
    };
    for (int i = 0; schemas[i]; i++) {
        Grammar *g = compile_ok(v, GRAMMAR_JSON_SCHEMA, schemas[i]);
        if (!g) continue;
        int n_end = 0;
        for (int w = 0; w < 12; w++) {
            int ended, bad = 0;
            char *t = walk(v, toks, g, eos, NULL, 60, 1, &ended, &bad);
            T_ASSERT(bad == 0, "schema %d walk %d", i, w);
            if (ended) {
                json_error_t je;
                json_t *j = json_loads(t, JSON_DECODE_ANY, &je);
                T_ASSERT(j != NULL, "schema %d output %s is not JSON (%s)", i, t, je.text);
                json_decref(j);
                n_end++;
            }
            free(t);
        }
        T_ASSERT(n_end > 0, "schema %d: some walk ended", i);
        grammar_unref(g);
    }
    /* errors: 400 naming the problem */
    expect_400(v, GRAMMAR_GBNF, "root ::= root \"a\" | \"b\"", "left-recursive");
    expect_400(v, GRAMMAR_GBNF, "root ::= x", "not defined");
    expect_400(v, GRAMMAR_GBNF, "root ::= \"a\" root", "matches no string");
    expect_400(v, GRAMMAR_GBNF, "root ::= [\xc3\xa9]", "non-ASCII");
    expect_400(v, GRAMMAR_GBNF, "x ::= \"a\"", "root");
    expect_400(v, GRAMMAR_REGEX, "(?=a)b", "lookaround");
    expect_400(v, GRAMMAR_REGEX, "(a)\\1", "back-reference");
    expect_400(v, GRAMMAR_REGEX, "(ab", "missing ')'");
    expect_400(v, GRAMMAR_JSON_SCHEMA, "{\"oneOf\":[{\"type\":\"string\"}]}", "oneOf");
    expect_400(v, GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"minimum\":3}", "minimum");
    expect_400(v, GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"date\"}", "format");
    expect_400(v, GRAMMAR_JSON_SCHEMA, "{\"type\":\"strin\"}", "strin");
    expect_400(v, GRAMMAR_JSON_SCHEMA, "{\"$ref\":\"http://x\"}", "$ref");
    expect_400(v, GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\"", "not valid JSON");
    expect_400(v, GRAMMAR_CHOICE, "[1]", "list of strings");
    expect_400(v, GRAMMAR_REGEX, "a{1001}", "over 1000");
    {   /* the empty regex matches only the empty string (it has no edges at all) */
        Grammar *g = compile_ok(v, GRAMMAR_REGEX, "");
        if (g) {
            uint64_t bits[8];
            GrammarMatcher *m = grammar_matcher_create(g);
            int n = grammar_matcher_fill_mask(m, bits, &eos, 1);
            T_ASSERT(n == 1 && ((bits[eos >> 6] >> (eos & 63)) & 1), "empty regex: only the end (%d allowed)", n);
            grammar_matcher_free(m);
            grammar_unref(g);
        }
        /* nested unbounded repetitions fold into one loop: compiles, and stays exact */
        g = compile_ok(v, GRAMMAR_REGEX, "(ab|cd)++++++++++++++++++++++++++++++++e");
        if (g) {
            int ended, bad = 0;
            free(walk(v, toks, g, eos, NULL, 12, 1, &ended, &bad));
            T_ASSERT(bad == 0, "nested + walk");
            grammar_unref(g);
        }
    }
    expect_400(v, GRAMMAR_REGEX, "(a{1000}){1000}", "too large");
    {   /* long chains compile without deep recursion: 4000 choices, a 20000-byte literal */
        Buf b = { 0 };
        buf_puts(&b, "[");
        for (int i = 0; i < 4000; i++) buf_printf(&b, "%s\"c%d\"", i ? "," : "", i);
        buf_puts(&b, "]");
        Grammar *g = compile_ok(v, GRAMMAR_CHOICE, b.p);
        if (g) grammar_unref(g);
        buf_free(&b);
        buf_puts(&b, "root ::= \"");
        for (int i = 0; i < 20000; i++) buf_puts(&b, "x");
        buf_puts(&b, "\"");
        g = compile_ok(v, GRAMMAR_GBNF, b.p);
        if (g) {
            GrammarMatcher *m = grammar_matcher_create(g);
            int ok = 1;
            for (int i = 0; i < 20000 && ok; i++) ok = grammar_matcher_accept_bytes(m, "x", 1) == 0;
            T_ASSERT(ok && grammar_matcher_can_end(m), "a 20000-byte literal matches");
            grammar_matcher_free(m);
            grammar_unref(g);
        }
        buf_free(&b);
    }
    grammar_vocab_free(v);
    free(toks);

    /* the real vocabulary: fast == slow on JSON schemas and json_object */
    Err e = { 0 };
    Tokenizer *tk = tokenizer_load("models/tiny-qwen3", &e);
    T_ASSERT(tk != NULL, "load tokenizer: %s", e.msg);
    if (tk) {
        int RV = tokenizer_vocab_size(tk);
        const char **b = calloc((size_t)RV, sizeof *b);
        int32_t *l = calloc((size_t)RV, sizeof *l);
        Tok *rt = calloc((size_t)RV, sizeof *rt);
        for (int i = 0; i < RV; i++) {
            size_t n = 0;
            const char *p = NULL;
            l[i] = -1;
            if (!tokenizer_is_special(tk, i) && tokenizer_token_bytes(tk, i, &p, &n) == 0 && n > 0) {
                b[i] = p; l[i] = (int32_t)n;
            }
            rt[i] = (Tok){ b[i], l[i] };
        }
        GrammarVocab *rv = grammar_vocab_create(RV, b, l);
        int32_t reos = tokenizer_eos_id(tk);
        const char *big[] = {
            "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},"
            "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},\"maxItems\":2}},"
            "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}",
            NULL,
        };
        for (int i = 0; big[i]; i++) {
            Grammar *g = compile_ok(rv, GRAMMAR_JSON_SCHEMA, big[i]);
            if (!g) continue;
            for (int w = 0; w < 2; w++) {
                int ended, bad = 0;
                char *t = walk(rv, rt, g, reos, NULL, 14, 1, &ended, &bad);
                T_ASSERT(bad == 0, "qwen schema %d walk %d (text %s)", i, w, t);
                free(t);
            }
            grammar_unref(g);
        }
        Grammar *pg = compile_ok(rv, GRAMMAR_JSON_SCHEMA,
                                 "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":\"array\","
                                 "\"items\":{\"type\":\"number\"}}},\"required\":[\"a\",\"b\"]}");
        if (pg) {
            pthread_t th[4];
            Par par[4];
            for (int i = 0; i < 4; i++) {
                par[i] = (Par){ rv, rt, pg, reos, 0, 17u * (unsigned)i + 1 };
                pthread_create(&th[i], NULL, par_walk, &par[i]);
            }
            int bad = 0;
            for (int i = 0; i < 4; i++) { pthread_join(th[i], NULL); bad += par[i].bad; }
            T_ASSERT(bad == 0, "threads sharing a cold grammar: %d walks differ from the brute force", bad);
            grammar_unref(pg);
        }
        Grammar *g = compile_ok(rv, GRAMMAR_JSON_OBJECT, "");
        if (g) {
            int ended, bad = 0;
            char *t = walk(rv, rt, g, reos, NULL, 10, 0, &ended, &bad);
            T_ASSERT(bad == 0, "qwen json_object walk (text %s)", t);
            free(t);
            grammar_unref(g);
        }
        grammar_vocab_free(rv);
        free(b); free(l); free(rt);
        tokenizer_free(tk);
    }
    return T_DONE();
}
