/*
 * grammar_cache.c - grammar_compile (every front end into one NFA), grammar
 * reference counts, and the LRU cache of compiled grammars keyed by (kind,
 * source text), so repeated schemas reuse both the NFA and its filled mask
 * cache (grammar.h).
 *
 * Memory: a cache holds at most cap grammars; each grammar holds its NFA
 * (bounded by GRAMMAR_MAX_NODES) and its mask entries, at most one per NFA
 * node: an entry is the accepted ids (4 bytes each, or a V/8-byte bitset when
 * that is smaller) plus the dependent ids.
 *
 * Not here: the matcher (grammar_match.c), the front ends.
 */
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

static void grammar_destroy(Grammar *g) {
    grammar_cache_entries_free(g);
    free(g->nodes); free(g->rule_start); free(g->follow); free(g->edges); free(g->calls); free(g->cls);
    free(g->cache);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

void grammar_ref(Grammar *g) { atomic_fetch_add(&g->refs, 1); }

void grammar_unref(Grammar *g) {
    if (g && atomic_fetch_sub(&g->refs, 1) == 1) grammar_destroy(g);
}

int grammar_n_nodes(const Grammar *g) { return g->n_nodes; }
const GrammarVocab *grammar_vocab(const Grammar *g) { return g->v; }

size_t grammar_cache_kb(Grammar *g) {
    pthread_mutex_lock(&g->mu);
    size_t b = g->cache_bytes;
    pthread_mutex_unlock(&g->mu);
    return b >> 10;
}

void grammar_set_cache_max(Grammar *g, size_t bytes) {
    pthread_mutex_lock(&g->mu);
    g->cache_max = bytes;
    pthread_mutex_unlock(&g->mu);
}

/* guided_choice: root ::= "a" | "b" | ... */
static int choice_ast(Ast *a, const char *src, size_t len, Err *err) {
    json_error_t je;
    json_t *arr = json_loadb(src, len, 0, &je);
    if (!json_is_array(arr) || json_array_size(arr) == 0) {
        json_decref(arr);
        return ERR(err, 400, "choice: must be a non-empty list of strings");
    }
    int alt = -1;
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *s = json_array_get(arr, i);
        if (!json_is_string(s)) { json_decref(arr); return ERR(err, 400, "choice: must be a non-empty list of strings"); }
        int x = ast_literal(a, json_string_value(s), json_string_length(s));
        alt = alt < 0 ? x : ast_node(a, AST_ALT, alt, x);
    }
    json_decref(arr);
    int r = ast_rule(a, "root", 4);
    if (r < 0 || a->too_big) return ERR(err, 400, "choice: too many choices");
    a->body[r] = alt;
    a->root = r;
    return 0;
}

int grammar_compile(GrammarKind kind, const char *src, size_t len, const GrammarVocab *v, Grammar **out, Err *err) {
    *out = NULL;
    ENSURE(err, len <= GRAMMAR_MAX_SOURCE, 400, "grammar: %zu bytes of grammar text, at most %d", len, GRAMMAR_MAX_SOURCE);
    Ast a;
    ast_init(&a);
    Buf gb = { 0 };
    int rc = 0;
    switch (kind) {
    case GRAMMAR_GBNF: rc = grammar_parse_gbnf(&a, src, len, err); break;
    case GRAMMAR_REGEX: {
        int x = grammar_parse_regex(&a, src, len, err);
        if (x < 0) { rc = -1; break; }
        int r = ast_rule(&a, "root", 4);
        if (r < 0) { rc = ERR(err, 400, "regex too large"); break; }
        a.body[r] = x;
        a.root = r;
        break;
    }
    case GRAMMAR_CHOICE: rc = choice_ast(&a, src, len, err); break;
    case GRAMMAR_JSON_OBJECT:
    case GRAMMAR_JSON_SCHEMA: {
        json_t *schema;
        if (kind == GRAMMAR_JSON_OBJECT) schema = json_pack("{s:s}", "type", "object");
        else {
            json_error_t je;
            schema = json_loadb(src, len, JSON_DECODE_ANY, &je);
            if (!schema) { rc = ERR(err, 400, "json_schema: not valid JSON (%s)", je.text); break; }
        }
        rc = grammar_json_schema_to_gbnf(schema, "root", &gb, err);
        json_decref(schema);
        if (rc == 0) {
            if (!gb.p) { rc = ERR(err, 503, "out of memory compiling a schema"); break; }
            rc = grammar_parse_gbnf(&a, gb.p, gb.n, err);
            if (rc < 0) /* our own output failed to parse: a bug, say so */
                err->code = 500;
        }
        break;
    }
    default: rc = ERR(err, 400, "grammar: unknown kind %d", (int)kind);
    }
    buf_free(&gb);
    if (rc < 0) { ast_free(&a); return -1; }
    Grammar *g = grammar_alloc(v);
    if (!g) { ast_free(&a); return ERR(err, 503, "out of memory compiling a grammar"); }
    rc = grammar_build(&a, g, err);
    ast_free(&a);
    if (rc < 0) { grammar_destroy(g); return -1; }
    *out = g;
    return 0;
}

/* ---- the LRU cache ---- */
typedef struct CEntry {
    GrammarKind kind;
    char *src;
    size_t len;
    Grammar *g;
    uint64_t used;
} CEntry;

struct GrammarCache {
    const GrammarVocab *v;
    pthread_mutex_t mu;
    CEntry *e;   /* [cap] */
    int n, cap;
    uint64_t clock;
};

GrammarCache *grammar_cache_create(const GrammarVocab *v, int cap) {
    GrammarCache *c = xcalloc(1, sizeof *c);
    c->v = v;
    c->cap = cap > 0 ? cap : 1;
    c->e = xcalloc((size_t)c->cap, sizeof *c->e);
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

void grammar_cache_free(GrammarCache *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) { grammar_unref(c->e[i].g); free(c->e[i].src); }
    free(c->e);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

int grammar_cache_get(GrammarCache *c, GrammarKind kind, const char *src, size_t len, Grammar **out, Err *err) {
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n; i++) {
        CEntry *e = &c->e[i];
        if (e->kind == kind && e->len == len && !memcmp(e->src, src, len)) {
            e->used = ++c->clock;
            grammar_ref(e->g);
            *out = e->g;
            pthread_mutex_unlock(&c->mu);
            return 0;
        }
    }
    pthread_mutex_unlock(&c->mu);
    /* compile outside the lock: two requests with one new schema may both
     * compile it; the second insert finds the first and keeps it */
    Grammar *g;
    if (grammar_compile(kind, src, len, c->v, &g, err) < 0) return -1;
    char *copy = malloc(len + 1);
    if (!copy) { *out = g; return 0; } /* works, just not cached */
    memcpy(copy, src, len);
    copy[len] = 0;
    pthread_mutex_lock(&c->mu);
    int slot = -1;
    for (int i = 0; i < c->n; i++)
        if (c->e[i].kind == kind && c->e[i].len == len && !memcmp(c->e[i].src, src, len)) slot = i;
    if (slot >= 0) { /* raced: keep the one already there */
        grammar_unref(g);
        free(copy);
        g = c->e[slot].g;
        grammar_ref(g);
        c->e[slot].used = ++c->clock;
        pthread_mutex_unlock(&c->mu);
        *out = g;
        return 0;
    }
    if (c->n < c->cap) slot = c->n++;
    else {
        slot = 0;
        for (int i = 1; i < c->n; i++) if (c->e[i].used < c->e[slot].used) slot = i;
        grammar_unref(c->e[slot].g);
        free(c->e[slot].src);
    }
    c->e[slot] = (CEntry){ kind, copy, len, g, ++c->clock };
    grammar_ref(g);
    pthread_mutex_unlock(&c->mu);
    *out = g;
    return 0;
}
