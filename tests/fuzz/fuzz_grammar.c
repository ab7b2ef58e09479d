/*
 * fuzz_grammar.c - libFuzzer target: the grammar front ends (the first byte
 * picks GBNF, regex, JSON Schema or choice; the rest is the source) compile
 * arbitrary text, refusing what they do not support; whatever compiles is
 * matched over a small byte-level vocabulary, and at every step the cached
 * trie mask must equal the brute force over the vocabulary (abort if not),
 * then a token chosen by the input advances it (below the matcher's limits,
 * grammar.h). Any crash, leak, UB, runaway or mask mismatch fails.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"

static GrammarVocab *v;
static const char *TOKS[] = { "{\"", "\"}", "\":", "ab", "abc", "true", "null", "12", "\\n", "\xc3\xa9", "((", "))",
                              "\", \"", "[1", "],", "x)", NULL };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char singles[256];
    if (!v) {
        const char *b[256 + 32];
        int32_t l[256 + 32];
        int n = 256;
        for (int i = 0; i < 256; i++) { singles[i] = (char)i; b[i] = &singles[i]; l[i] = 1; }
        for (int i = 0; TOKS[i]; i++, n++) { b[n] = TOKS[i]; l[n] = (int32_t)strlen(TOKS[i]); }
        b[n] = NULL; l[n] = -1; /* the end id */
        n++;
        v = grammar_vocab_create(n, b, l);
    }
    if (size < 1) return 0;
    GrammarKind kinds[] = { GRAMMAR_GBNF, GRAMMAR_REGEX, GRAMMAR_JSON_SCHEMA, GRAMMAR_CHOICE };
    GrammarKind k = kinds[data[0] % 4];
    if (size > 4096) size = 4096;
    Err e = { 0 };
    Grammar *g = NULL;
    if (grammar_compile(k, (const char *)data + 1, size - 1, v, &g, &e) < 0) return 0;
    int V = grammar_vocab_size(v), W = grammar_vocab_words(v);
    int32_t eos = V - 1;
    uint64_t fast[8], slow[8];
    GrammarMatcher *m = grammar_matcher_create(g);
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < size; i++) h = (h ^ data[i]) * 16777619u;
    for (int step = 0; m && step < 12; step++) {
        int nf = grammar_matcher_fill_mask(m, fast, &eos, 1);
        int lim = grammar_matcher_limited(m);
        int ns = grammar_matcher_fill_mask_slow(m, slow, &eos, 1);
        lim |= grammar_matcher_limited(m);
        if (!lim && (nf != ns || memcmp(fast, slow, (size_t)W * 8) != 0)) abort(); /* exact below the limits */
        if (nf == 0) break;
        h = h * 1103515245u + 12345u;
        int pick = (int)((h >> 8) % (unsigned)nf), c = 0, tok = -1;
        for (int t = 0; t < V && tok < 0; t++)
            if ((fast[t >> 6] >> (t & 63)) & 1) { if (c == pick) tok = t; c++; }
        if (grammar_matcher_accept(m, tok, &eos, 1) < 0) {
            if (!grammar_matcher_limited(m)) abort(); /* allowed ids are accepted, unless at a limit */
            break;
        }
        if (tok == eos) break;
    }
    grammar_matcher_free(m);
    grammar_unref(g);
    return 0;
}
