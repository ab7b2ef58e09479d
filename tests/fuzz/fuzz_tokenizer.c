/*
 * fuzz_tokenizer.c - libFuzzer target: the Qwen3 tokenizer on arbitrary
 * bytes (invalid UTF-8, special tokens, long runs): encode, decode and
 * streaming decode must not crash, ids must be in range, and the streamed
 * pieces must equal the one-shot decode. The input read as int32 ids
 * exercises decode of any id sequence the same way.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

static Tokenizer *tok;
static TokDecoder *dec;

static void check_stream(const int32_t *ids, size_t n, bool skip) {
    char *want;
    size_t wl;
    Err e = {0};
    tokenizer_decode(tok, ids, n, skip, &want, &wl, &e);
    TokDecoder *d = skip ? NULL : dec;
    if (!d) d = tok_decoder_create(tok, true);
    tok_decoder_reset(d);
    size_t at = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *p;
        size_t l;
        if (i < n) tok_decoder_push(d, ids[i], &p, &l);
        else tok_decoder_flush(d, &p, &l);
        if (at + l > wl || memcmp(want + at, p, l)) abort();
        at += l;
    }
    if (at != wl) abort();
    if (d != dec) tok_decoder_free(d);
    free(want);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tok) {
        Err e = {0};
        tok = tokenizer_load(SAMPLER_SOURCE_DIR "/tests/data/tokenizers/qwen3", &e);
        if (!tok) { fprintf(stderr, "%s\n", e.msg); abort(); }
        dec = tok_decoder_create(tok, false);
    }
    char *text = malloc(size ? size : 1); /* exact size: ASan catches overreads */
    memcpy(text, data, size);
    TokIds ids = {0};
    Err e = {0};
    if (tokenizer_encode(tok, text, size, size && (data[0] & 1), &ids, &e) == 0) {
        for (size_t i = 0; i < ids.n; i++)
            if (ids.ids[i] < 0 || ids.ids[i] >= tokenizer_vocab_size(tok)) abort();
        check_stream(ids.ids, ids.n, false);
        check_stream(ids.ids, ids.n, true);
    }
    size_t n = size / 4;
    int32_t *raw = malloc((n ? n : 1) * sizeof *raw);
    memcpy(raw, data, n * 4);
    check_stream(raw, n, false);
    free(raw);
    tok_ids_free(&ids);
    free(text);
    return 0;
}
