/*
 * grammar.h - structured outputs: a grammar over the bytes of the tokenizer's
 * vocabulary, and per step the exact set of token ids that keep the output
 * inside it.
 *
 * Front ends (each compiles to one internal form, a set of rules, each rule an
 * epsilon-free NFA over byte classes and calls of other rules):
 *   GRAMMAR_GBNF         llama.cpp's GBNF: `name ::= expr`, "literals",
 *                        [classes] ([^...] negated, ranges; ASCII members),
 *                        ( ) | * + ? {m} {m,} {m,n}, `.`, comments `#`; the
 *                        start rule is `root` (or `start`); Lark-like `name:`
 *                        for `::=` and /regex/ terminals are accepted too.
 *   GRAMMAR_REGEX        a regular expression (Python/ECMAScript subset:
 *                        literals, escapes \d \w \s \D \W \S \n \t \. ..., classes,
 *                        groups (?: ), | , quantifiers, `.`; ^ $ at the ends).
 *   GRAMMAR_JSON_SCHEMA  JSON Schema subset (grammar_json.c says which keywords).
 *   GRAMMAR_JSON_OBJECT  any JSON object (response_format json_object).
 *   GRAMMAR_CHOICE       one of a JSON array of strings (guided_choice).
 * Anything outside the subset is a 400 naming it. Left recursion and rules
 * that match no string are refused at compile time.
 *
 * Matching: the parser state is a set of rule stacks (a pushdown automaton
 * run breadth-first over bytes). The allowed-token mask is computed from a
 * token trie over the vocabulary (GrammarVocab) and, per NFA node at the top of
 * a stack, a lazily built cache (the idea of xgrammar's adaptive token mask
 * cache): the tokens the rule accepts whatever its callers are, and the few
 * "context-dependent" tokens that run past the end of the rule, which are
 * checked against the full stacks at run time. The mask is exact: equal to
 * running every token of the vocabulary through the parser.
 *
 * Ends: the ids in end_ids (the model's EOS and the request's stop ids) are
 * allowed exactly when the grammar has matched a whole string; after one is
 * accepted the matcher is done. A state that allows no token at all is a
 * dead end (the engine finishes the sequence with FINISH_GRAMMAR).
 *
 * Cost: a mask entry is one walk over the token trie (up to ~30 ms at
 * 151,936 ids for a node inside a string) and holds up to V/8 bytes (19 KB),
 * so a grammar's cache is bounded by its NFA nodes with byte edges times
 * that; GRAMMAR_MAX_REPEAT bounds how many nodes one repetition makes.
 *
 * Limits (a matcher's memory is fixed at create, grammar_matcher_bytes):
 * GRAMMAR_MAX_STACKS parallel stacks, GRAMMAR_MAX_DEPTH frames a stack,
 * GRAMMAR_MAX_FRAMES frames a state. A token whose run would go over a limit
 * is refused by grammar_matcher_accept; the cached mask may still hold it
 * (the cache is built from one stack at a time, the run uses all of them), so
 * for very ambiguous grammars (e.g. nested `(a|b)++++`) a sampled id can be
 * refused: the engine then ends the sequence with FINISH_GRAMMAR, and never
 * emits a token outside the grammar. grammar_matcher_limited says whether the
 * last call hit a limit (the mask is exact whenever it did not).
 *
 * Threads: a Grammar is immutable except its mask cache, which is filled under
 * the Grammar's own lock; any number of matchers on any threads may share it.
 * A GrammarMatcher belongs to one thread at a time.
 *
 * Not here: request fields (the HTTP layer), applying the mask to logits
 * (sampling.h: SampleWant.allowed).
 */
#ifndef SAMPLER_GRAMMAR_H
#define SAMPLER_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "buf.h"
#include "check.h"

#define GRAMMAR_MAX_STACKS 256
#define GRAMMAR_MAX_DEPTH 256
#define GRAMMAR_MAX_FRAMES 4096
#define GRAMMAR_MAX_REPEAT 1000   /* {m,n} bounds, maxLength, minLength, maxItems */
#define GRAMMAR_MAX_NODES 200000  /* NFA nodes of one compiled grammar */
#define GRAMMAR_MAX_SOURCE (1 << 20) /* bytes of grammar / schema text */
/* Bytes of one grammar's mask cache. Past it, positions whose entry is not
 * cached yet get the exact walk over the matcher's whole state (the same
 * masks, slower), so a server holds at most its cache's grammars (structured.h:
 * GRAMMAR_CACHE_CAP) x (this + the NFA) whatever clients send. */
#define GRAMMAR_CACHE_MAX_BYTES ((size_t)32 << 20)

typedef enum {
    GRAMMAR_GBNF = 0,
    GRAMMAR_REGEX,
    GRAMMAR_JSON_SCHEMA,
    GRAMMAR_JSON_OBJECT,
    GRAMMAR_CHOICE,
} GrammarKind;

/* ---- the vocabulary as bytes (built once at start-up) ---- */
typedef struct GrammarVocab GrammarVocab;

/* bytes[i] [lens[i]] are token i's bytes; lens[i] < 0 (special tokens, ids
 * without bytes) never match a grammar. Copied. Start-up path. */
GrammarVocab *grammar_vocab_create(int vocab, const char *const *bytes, const int32_t *lens);
void grammar_vocab_free(GrammarVocab *v);
int grammar_vocab_size(const GrammarVocab *v);
int grammar_vocab_words(const GrammarVocab *v); /* uint64 words of a mask: ceil(vocab / 64) */

/* ---- compiled grammars (reference counted) ---- */
typedef struct Grammar Grammar;

/* Compile src[0..len) (JSON text for the JSON kinds). Returns 0 and *out
 * (reference count 1) or <0 with a 400 err naming what is unsupported. */
int grammar_compile(GrammarKind kind, const char *src, size_t len, const GrammarVocab *v, Grammar **out,
                    Err *err);
void grammar_ref(Grammar *g);
void grammar_unref(Grammar *g);
const GrammarVocab *grammar_vocab(const Grammar *g);
/* NFA nodes (for limits and tests). */
int grammar_n_nodes(const Grammar *g);
/* KB held by the grammar's mask cache so far. */
size_t grammar_cache_kb(Grammar *g);
/* Lower the mask-cache budget (tests; default GRAMMAR_CACHE_MAX_BYTES). */
void grammar_set_cache_max(Grammar *g, size_t bytes);

/* A JSON Schema as GBNF text appended to out (what GRAMMAR_JSON_SCHEMA
 * compiles); root_name names its start rule. 0 or <0 with a 400 err. */
int grammar_json_schema_to_gbnf(json_t *schema, const char *root_name, Buf *out, Err *err);

/* ---- compiled-grammar cache keyed by (kind, source) ----
 * At most cap grammars (least recently used evicted); thread-safe. The cache
 * keeps the masks a grammar has built, so a second request with the same
 * schema starts warm. */
typedef struct GrammarCache GrammarCache;
GrammarCache *grammar_cache_create(const GrammarVocab *v, int cap);
void grammar_cache_free(GrammarCache *c);
/* A reference the caller must grammar_unref. */
int grammar_cache_get(GrammarCache *c, GrammarKind kind, const char *src, size_t len, Grammar **out, Err *err);

/* ---- one sequence's parser state ---- */
typedef struct GrammarMatcher GrammarMatcher;

/* NULL when out of memory. Holds a reference to g. */
GrammarMatcher *grammar_matcher_create(Grammar *g);
void grammar_matcher_free(GrammarMatcher *m);
size_t grammar_matcher_bytes(void);
/* Back to the start state. */
void grammar_matcher_reset(GrammarMatcher *m);

/* The allowed ids as a bitset bits [grammar_vocab_words], bit i of word i/64
 * set when id i is allowed; end_ids [n_end] are allowed when the grammar can
 * end here. Returns the number of allowed ids (0: dead end). */
int grammar_matcher_fill_mask(GrammarMatcher *m, uint64_t *bits, const int32_t *end_ids, int n_end);
/* Advance by token id. Returns 0, or -1 when the grammar does not allow it
 * (the state is then unchanged). An end id accepted at an end makes the
 * matcher done. */
int grammar_matcher_accept(GrammarMatcher *m, int32_t token, const int32_t *end_ids, int n_end);
/* Advance by raw bytes (tests). 0, or -1 (state unchanged). */
int grammar_matcher_accept_bytes(GrammarMatcher *m, const char *s, size_t n);
int grammar_matcher_done(const GrammarMatcher *m);
/* 1 when the last fill_mask / fill_mask_slow / accept cut a run at a limit. */
int grammar_matcher_limited(const GrammarMatcher *m);
/* 1 when the bytes accepted so far form a whole string of the grammar. */
int grammar_matcher_can_end(const GrammarMatcher *m);

/* Brute force for tests: the allowed ids by running every token through the
 * parser from m's state, no trie and no cache. Same contract as fill_mask. */
int grammar_matcher_fill_mask_slow(GrammarMatcher *m, uint64_t *bits, const int32_t *end_ids, int n_end);

#endif
