/*
 * added.c - added (and special) tokens found inside text, the way
 * `tokenizers`' AddedVocabulary does it: leftmost-longest matching over all
 * token contents, then single_word / lstrip / rstrip adjustments.
 * Not here: which trie (raw or normalized) applies when (tokenizer.c).
 */
#include <stdlib.h>

#include <utf8proc.h>

#include "tok_internal.h"

void trie_init(Trie *t) {
    memset(t, 0, sizeof *t);
    t->cap = 64;
    t->next = xcalloc(t->cap, sizeof *t->next);
    t->tok = xmalloc(t->cap * sizeof *t->tok);
    t->tok[0] = -1;
    t->n_nodes = 1;
}

void trie_free(Trie *t) {
    free(t->next);
    free(t->tok);
    memset(t, 0, sizeof *t);
}

void trie_add(Trie *t, const char *s, size_t n, int32_t tok) {
    if (!n) return;
    int32_t node = 0;
    t->first[(uint8_t)s[0]] = 1;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)s[i];
        if (!t->next[node][c]) {
            if (t->n_nodes == t->cap) {
                t->cap *= 2;
                t->next = realloc(t->next, t->cap * sizeof *t->next);
                t->tok = realloc(t->tok, t->cap * sizeof *t->tok);
                CHECK(t->next && t->tok, "out of memory building the added-token trie");
            }
            memset(t->next[t->n_nodes], 0, sizeof *t->next);
            t->tok[t->n_nodes] = -1;
            t->next[node][c] = (int32_t)t->n_nodes++;
        }
        node = t->next[node][c];
    }
    t->tok[node] = tok; /* a later duplicate content wins */
}

static bool is_ws(int32_t c) {
    return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

static bool is_word(int32_t c) {
    if (c == '_') return true;
    if (c < 0x80) return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
    utf8proc_category_t k = utf8proc_category(c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_ME) || k == UTF8PROC_CATEGORY_ND ||
           k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_PC;
}

/* Last code point before text[i] (valid UTF-8). */
static int32_t cp_before(const char *text, size_t i) {
    size_t j = i - 1;
    while (j > 0 && ((uint8_t)text[j] & 0xC0) == 0x80) j--;
    int32_t cp;
    utf8_decode((const uint8_t *)text + j, &cp);
    return cp;
}

static void split_push(AddedSplitVec *v, uint32_t a, uint32_t b, int32_t tok) {
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 64;
        v->v = realloc(v->v, v->cap * sizeof *v->v);
        CHECK(v->v, "out of memory splitting added tokens");
    }
    v->v[v->n++] = (AddedSplit){a, b, tok};
}

void added_split(const Trie *trie, const AddedTok *toks, const char *text, size_t n, AddedSplitVec *out) {
    size_t start_offset = 0;
    for (size_t i = 0; i < n;) {
        if (!trie->first[(uint8_t)text[i]]) { i++; continue; }
        int32_t node = 0, best = -1;
        size_t best_end = 0;
        for (size_t j = i; j < n; j++) {
            node = trie->next[node][(uint8_t)text[j]];
            if (!node) break;
            if (trie->tok[node] >= 0) { best = trie->tok[node]; best_end = j + 1; }
        }
        if (best < 0) { i++; continue; }
        const AddedTok *t = &toks[best];
        size_t start = i, stop = best_end;
        i = best_end;
        if (t->single_word) {
            int32_t cp;
            bool start_space = start == 0 || !is_word(cp_before(text, start));
            bool stop_space = stop == n || (utf8_decode((const uint8_t *)text + stop, &cp), !is_word(cp));
            if (!start_space || !stop_space) continue;
        }
        if (t->lstrip) {
            size_t s = start;
            while (s > 0) {
                size_t j = s - 1;
                while (j > 0 && ((uint8_t)text[j] & 0xC0) == 0x80) j--;
                int32_t cp;
                utf8_decode((const uint8_t *)text + j, &cp);
                if (!is_ws(cp)) break;
                s = j;
            }
            start = s > start_offset ? s : start_offset;
        }
        if (t->rstrip) {
            while (stop < n) {
                int32_t cp;
                int k = utf8_decode((const uint8_t *)text + stop, &cp);
                if (!is_ws(cp)) break;
                stop += (size_t)k;
            }
        }
        if (start_offset < start) split_push(out, (uint32_t)start_offset, (uint32_t)start, -1);
        split_push(out, (uint32_t)start, (uint32_t)stop, best);
        start_offset = stop;
    }
    if (start_offset < n) split_push(out, (uint32_t)start_offset, (uint32_t)n, -1);
}
