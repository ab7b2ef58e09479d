/*
 * fuzz_tok_json.c - libFuzzer target: tok_json.c's reading of model.vocab and
 * model.merges against jansson's, on arbitrary bytes. Wherever the reader
 * takes a document and jansson takes the rest it leaves, jansson must take
 * the whole document and read every entry the same (reader_diff); the one
 * difference allowed is a key twice in vocab, which the loader finds and then
 * reads the file with jansson. Also a full tokenizer_load_json of the input,
 * which must not crash.
 */
#include <stdlib.h>
#include <string.h>

#include "../tok_json_diff.h"

static bool has_duplicate_key(const TokBpeText *bt) {
    for (size_t i = 0; i < bt->n_vocab; i++)
        for (size_t j = i + 1; j < bt->n_vocab; j++)
            if (bt->vocab[i].len == bt->vocab[j].len && !memcmp(bt->vocab[i].key, bt->vocab[j].key, bt->vocab[i].len))
                return true;
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0; /* the pairwise duplicate check */
    char *doc = malloc(size ? size : 1); /* exact size: ASan catches overreads */
    memcpy(doc, data, size);
    TokBpeText bt;
    char *rest;
    size_t rl;
    if (tok_json_read_bpe(doc, size, &bt, &rest, &rl)) {
        json_error_t je;
        json_t *r = json_loadb(rest, rl, 0, &je);
        if (r && !has_duplicate_key(&bt) && reader_diff(doc, size, &bt, rest, rl) != 0) abort();
        json_decref(r);
        tok_bpe_text_free(&bt);
        free(rest);
    }
    Err e = {0};
    tokenizer_free(tokenizer_load_json(doc, size, NULL, &e));
    free(doc);
    return 0;
}
