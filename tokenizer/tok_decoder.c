/*
 * tok_decoder.c - streaming decode: token bytes are released only up to the
 * last complete UTF-8 character; invalid sequences become U+FFFD exactly
 * where a whole-sequence decode would put them, so the pieces concatenate to
 * tokenizer_decode's output. Not here: the token bytes (tokenizer_load.c).
 */
#include <stdlib.h>

#include "tok_internal.h"

struct TokDecoder {
    const Tokenizer *t;
    bool skip_special;
    uint8_t pend[4]; size_t n_pend; /* a valid but incomplete UTF-8 prefix */
    uint8_t *work;                  /* [3 + max token bytes] pending + new bytes */
    char *out;                      /* [3 * (3 + max token bytes)] emitted text */
};

TokDecoder *tok_decoder_create(const Tokenizer *t, bool skip_special_tokens) {
    TokDecoder *d = xcalloc(1, sizeof *d);
    d->t = t;
    d->skip_special = skip_special_tokens;
    d->work = xmalloc(t->max_tok_bytes + 4);
    d->out = xmalloc(3 * (t->max_tok_bytes + 4) + 1);
    return d;
}

void tok_decoder_free(TokDecoder *d) {
    if (!d) return;
    free(d->work);
    free(d->out);
    free(d);
}

void tok_decoder_reset(TokDecoder *d) { d->n_pend = 0; }

void tok_decoder_push(TokDecoder *d, int32_t id, const char **piece, size_t *len) {
    const Tokenizer *t = d->t;
    *piece = d->out;
    *len = 0;
    if (id < 0 || id >= t->n_ids || !t->tok_bytes[id] || (d->skip_special && t->is_special[id])) return;
    size_t n = d->n_pend;
    memcpy(d->work, d->pend, n);
    memcpy(d->work + n, t->tok_bytes[id], t->tok_bytes_len[id]);
    n += t->tok_bytes_len[id];
    char *o = d->out;
    size_t i = 0, max;
    bool trunc;
    d->n_pend = 0;
    while (i < n) {
        if (d->work[i] < 0x80) { *o++ = (char)d->work[i++]; continue; }
        size_t k = utf8_seq(d->work + i, n - i, &max, &trunc);
        if (k) { memcpy(o, d->work + i, k); o += k; i += k; }
        else if (trunc) { memcpy(d->pend, d->work + i, n - i); d->n_pend = n - i; break; }
        else { memcpy(o, "\xEF\xBF\xBD", 3); o += 3; i += max; }
    }
    *o = 0;
    *len = (size_t)(o - d->out);
}

void tok_decoder_flush(TokDecoder *d, const char **piece, size_t *len) {
    *piece = d->out;
    *len = 0;
    if (d->n_pend) {
        memcpy(d->out, "\xEF\xBF\xBD", 4);
        *len = 3;
    }
    d->n_pend = 0;
}
