/*
 * tok_json_diff.h - tok_json.c's reading of a tokenizer.json (TokBpeText and
 * the rest it leaves) against jansson's reading of the same document; shared
 * by test_tokenizer.c and fuzz/fuzz_tok_json.c. Test code only.
 */
#ifndef SAMPLER_TOK_JSON_DIFF_H
#define SAMPLER_TOK_JSON_DIFF_H

#include <string.h>

#include <jansson.h>

#include "../tokenizer/tok_internal.h"

/* bt against jansson's reading of the same document: every vocab entry in
 * jansson's order with its id, every merge split as the loader splits it
 * ("a b" at its first space), and the rest equal to the document with an
 * empty vocab and merges. The count of differences; 1000000 where jansson
 * refuses the document or the rest. */
static inline int reader_diff(const char *doc, size_t n, const TokBpeText *bt, const char *rest, size_t rest_len) {
    json_error_t je;
    json_t *root = json_loadb(doc, n, 0, &je), *rroot = json_loadb(rest, rest_len, 0, &je);
    int bad = 0;
    if (!root || !rroot) { json_decref(root); json_decref(rroot); return 1000000; }
    json_t *m = json_object_get(root, "model"), *v;
    json_t *vocab = json_object_get(m, "vocab"), *merges = json_object_get(m, "merges");
    bad += json_object_size(vocab) != bt->n_vocab || json_array_size(merges) != bt->n_merges;
    const char *key;
    size_t i = 0;
    json_object_foreach(vocab, key, v) {
        if (i >= bt->n_vocab) break;
        const TokVocabEntry *e = &bt->vocab[i];
        bad += strlen(key) != e->len || memcmp(key, e->key, e->len + 1) || json_integer_value(v) != e->id ||
               !json_is_integer(v);
        i++;
    }
    json_array_foreach(merges, i, v) {
        if (i >= bt->n_merges) break;
        const TokMerge *g = &bt->merges[i];
        const char *a, *b;
        if (json_is_string(v)) {
            a = json_string_value(v);
            b = strchr(a, ' ');
            bad += !b || (size_t)(b - a) != g->la || memcmp(a, g->a, g->la) || strlen(b + 1) != g->lb ||
                   memcmp(b + 1, g->b, g->lb);
        } else {
            a = json_string_value(json_array_get(v, 0));
            b = json_string_value(json_array_get(v, 1));
            bad += !a || !b || strlen(a) != g->la || memcmp(a, g->a, g->la) || strlen(b) != g->lb ||
                   memcmp(b, g->b, g->lb);
        }
    }
    json_object_set_new(m, "vocab", json_object());
    json_object_set_new(m, "merges", json_array());
    bad += !json_equal(root, rroot);
    json_decref(root);
    json_decref(rroot);
    return bad;
}

#endif
