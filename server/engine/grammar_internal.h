/*
 * grammar_internal.h - what the grammar files share (private; the API is
 * grammar.h):
 *
 *   grammar_parse.c  GBNF and regex text -> an expression tree per rule (Ast)
 *   grammar_nfa.c    Ast -> one epsilon-free NFA per rule, and the checks
 *                    (undefined / unproductive / left-recursive rules)
 *   grammar_json.c   JSON Schema -> GBNF text
 *   grammar_match.c  the vocabulary trie, the matcher, the mask cache
 *   grammar_cache.c  grammar_compile and the compiled-grammar LRU cache
 *
 * Not here: request fields (HTTP layer).
 */
#ifndef SAMPLER_GRAMMAR_INTERNAL_H
#define SAMPLER_GRAMMAR_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "grammar.h"

/* ---- expression trees ---- */
typedef enum { AST_EMPTY, AST_CLASS, AST_SEQ, AST_ALT, AST_REP, AST_REF } AstKind;

typedef struct AstNode {
    uint8_t kind;
    int32_t a, b;      /* SEQ/ALT: children; REP: child a; REF: rule a */
    int32_t lo, hi;    /* REP: bounds, hi < 0 = unbounded */
    uint64_t cls[4];   /* CLASS: the bytes it matches */
} AstNode;

typedef struct Ast {
    AstNode *nodes;
    int n, cap;
    char **names;      /* [n_rules] rule names */
    int32_t *body;     /* [n_rules] root node of each rule's expression, -1 = referenced, not defined */
    int n_rules, cap_rules;
    int root;          /* start rule, -1 until known */
    int utf8_rule;     /* the shared "any multi-byte UTF-8 character" rule, -1 until used */
    int too_big;       /* a limit was hit */
} Ast;

void ast_init(Ast *a);
void ast_free(Ast *a);
int ast_node(Ast *a, AstKind k, int32_t x, int32_t y);
int ast_class(Ast *a, const uint64_t cls[4]);
int ast_literal(Ast *a, const char *s, size_t n);
/* The rule named name[0..n), created (undefined) when new. */
int ast_rule(Ast *a, const char *name, size_t n);
/* Any one UTF-8 character in the ASCII set cls (128 bits used), plus every
 * multi-byte character when with_multibyte. */
int ast_char_class(Ast *a, const uint64_t cls[4], int with_multibyte);

/* Parsers: append rules to a. GBNF defines named rules and sets a->root;
 * regex builds one expression and returns its node (or <0). */
int grammar_parse_gbnf(Ast *a, const char *s, size_t n, Err *err);
int grammar_parse_regex(Ast *a, const char *s, size_t n, Err *err);

/* ---- the compiled NFA ---- */
typedef struct GNode {
    int32_t rule;
    int32_t e0, ne;    /* byte edges [e0, e0 + ne) of Grammar.edges */
    int32_t c0, nc;    /* call edges [c0, c0 + nc) of Grammar.calls */
    uint8_t final;     /* the rule may end here */
    uint64_t first[4]; /* bytes some byte edge accepts */
} GNode;

typedef struct GEdge { int32_t cls, target; } GEdge;        /* byte class index, node */
typedef struct GCall { int32_t rule, target; } GCall;       /* callee rule, return node */

/* Per top node: the tokens it accepts in any context and the ones to check. */
typedef struct MaskEntry {
    _Atomic int ready;
    int32_t n_acc;
    int32_t *acc;       /* [n_acc] ascending ids, or NULL when acc_bits is used */
    uint64_t *acc_bits; /* [words] when the set is large */
    int32_t n_dep;
    int32_t *dep;       /* [n_dep] ids to run through the full stacks */
} MaskEntry;

struct Grammar {
    _Atomic int refs;
    const GrammarVocab *v;
    int n_nodes, n_rules;
    GNode *nodes;       /* [n_nodes] */
    int32_t *rule_start;/* [n_rules] */
    uint64_t (*follow)[4]; /* [n_rules] bytes that can follow the rule's end in some context */
    GEdge *edges; int n_edges;
    GCall *calls; int n_calls;
    uint64_t (*cls)[4]; int n_cls;
    int root;
    pthread_mutex_t mu; /* fills cache entries */
    MaskEntry *cache;   /* [n_nodes] */
    size_t cache_bytes; /* under mu */
    size_t cache_max;   /* cache_bytes stops growing here (GRAMMAR_CACHE_MAX_BYTES; under mu) */
    struct Walk *walk;  /* trie-walk scratch, made on first use (under mu) */
};

/* Build g's NFA from a (root set). 0 or <0 with a 400 err. */
int grammar_build(Ast *a, Grammar *g, Err *err);
Grammar *grammar_alloc(const GrammarVocab *v);
/* Free the mask cache entries and the walk scratch (grammar_match.c). */
void grammar_cache_entries_free(Grammar *g);

static inline int cls_has(const uint64_t c[4], unsigned b) { return (int)((c[b >> 6] >> (b & 63)) & 1); }
static inline void cls_set(uint64_t c[4], unsigned b) { c[b >> 6] |= 1ull << (b & 63); }

#endif
