/*
 * tok_json.c - model.vocab and model.merges of tokenizer.json read straight
 * from the text. They are most of the file (Qwen3: 151,643 vocab entries and
 * 151,387 merges in 11 MB): jansson would build ~450,000 heap nodes for them
 * and free them again, most of a server's start-up. Here they are decoded in
 * one pass into one buffer; the rest of the file, with those two values cut
 * out (an empty {} and []), still goes through jansson.
 *
 * Strict, and never the only judge: whatever this reader is not sure it reads
 * exactly as jansson does (an escaped key on the way to model, a second
 * "model", "vocab" or "merges", an id that is not a plain integer of at most
 * 2^31 - 1, a merge that is neither "a b" nor ["a", "b"], invalid UTF-8,
 * \u0000 or a lone surrogate, a control character) makes it say no, and the
 * caller reads the whole file with jansson as before, so every error message
 * and edge case stays jansson's. A key twice inside vocab is found by the
 * loader's map, which then does the same.
 *
 * Not here: what the entries mean and their checks (tokenizer_load.c).
 */
#include <stdlib.h>

#include "tok_internal.h"

typedef struct Rd {
    const char *s;  /* the whole tokenizer.json */
    size_t n, i;    /* length, read position */
    char *arena;    /* decoded strings, each NUL-terminated */
    size_t used;
} Rd;

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

static void ws(Rd *r) {
    while (r->i < r->n && is_ws(r->s[r->i])) r->i++;
}

static bool eat(Rd *r, char c) {
    ws(r);
    if (r->i < r->n && r->s[r->i] == c) { r->i++; return true; }
    return false;
}

static int hex4(const char *p) {
    int v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p[k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Decode the JSON string at r->i (its opening quote) into the arena: its
 * start there and its length, false where jansson would refuse it or this
 * reader is unsure. A decoded string is never longer than its quoted text,
 * so the arena (sized to the text) cannot overflow. */
static bool string(Rd *r, const char **out, uint32_t *len) {
    ws(r);
    if (r->i >= r->n || r->s[r->i] != '"') return false;
    r->i++;
    char *o = r->arena + r->used, *start = o;
    const uint8_t *s = (const uint8_t *)r->s;
    for (;;) {
        if (r->i >= r->n) return false;
        uint8_t c = s[r->i];
        if (c == '"') { r->i++; break; }
        if (c < 0x20) return false;
        if (c < 0x80 && c != '\\') { *o++ = (char)c; r->i++; continue; }
        if (c >= 0x80) {
            size_t maximal;
            bool trunc;
            size_t k = utf8_seq(s + r->i, r->n - r->i, &maximal, &trunc);
            if (!k) return false;
            memcpy(o, s + r->i, k);
            o += k;
            r->i += k;
            continue;
        }
        if (r->i + 1 >= r->n) return false; /* a backslash */
        char e = r->s[r->i + 1];
        r->i += 2;
        switch (e) {
        case '"': *o++ = '"'; continue;
        case '\\': *o++ = '\\'; continue;
        case '/': *o++ = '/'; continue;
        case 'b': *o++ = '\b'; continue;
        case 'f': *o++ = '\f'; continue;
        case 'n': *o++ = '\n'; continue;
        case 'r': *o++ = '\r'; continue;
        case 't': *o++ = '\t'; continue;
        case 'u': break;
        default: return false;
        }
        if (r->i + 4 > r->n) return false;
        int32_t cp = hex4(r->s + r->i);
        r->i += 4;
        if (cp <= 0 || (cp >= 0xDC00 && cp <= 0xDFFF)) return false; /* \u0000, a lone low surrogate */
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (r->i + 6 > r->n || r->s[r->i] != '\\' || r->s[r->i + 1] != 'u') return false;
            int lo = hex4(r->s + r->i + 2);
            if (lo < 0xDC00 || lo > 0xDFFF) return false;
            r->i += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        o += utf8_encode(cp, o);
    }
    *o = 0;
    *out = start;
    *len = (uint32_t)(o - start);
    r->used += (size_t)(o - start) + 1;
    return true;
}

/* A key on the way to model.vocab: its raw text, false if it has an escape. */
static bool raw_key(Rd *r, const char **k, size_t *len) {
    ws(r);
    if (r->i >= r->n || r->s[r->i] != '"') return false;
    size_t a = ++r->i;
    while (r->i < r->n && r->s[r->i] != '"') {
        if (r->s[r->i] == '\\') return false;
        r->i++;
    }
    if (r->i >= r->n) return false;
    *k = r->s + a;
    *len = r->i++ - a;
    return true;
}

/* a byte that ends a number or literal */
static bool ends_token(char c) {
    return c == ',' || c == ':' || c == ']' || c == '}' || c == '"' || c == '{' || c == '[' || c == 0 || is_ws(c);
}

static bool key_is(const char *k, size_t len, const char *want) { return len == strlen(want) && !memcmp(k, want, len); }

/* Step over one value without judging it (jansson does, on the rest). */
static bool skip_value(Rd *r) {
    int depth = 0;
    ws(r);
    do {
        if (r->i >= r->n) return false;
        char c = r->s[r->i];
        if (c == '"') {
            for (r->i++; r->i < r->n && r->s[r->i] != '"'; r->i++)
                if (r->s[r->i] == '\\') r->i++;
            if (r->i >= r->n) return false;
            r->i++;
        } else if (c == '{' || c == '[') {
            depth++;
            r->i++;
        } else if (c == '}' || c == ']') {
            if (--depth < 0) return false;
            r->i++;
        } else if (c == ',' || c == ':' || is_ws(c)) {
            if (depth == 0) return false;
            r->i++;
        } else if (c == 0) {
            return false; /* jansson refuses a NUL byte */
        } else { /* a number or literal: up to the next structural byte */
            while (r->i < r->n && !ends_token(r->s[r->i])) r->i++;
        }
    } while (depth > 0);
    return true;
}

/* Room for entry n of *p (elem bytes each, *cap of them). */
static bool grow(void **p, size_t *cap, size_t n, size_t elem) {
    if (n < *cap) return true;
    *cap = *cap ? *cap * 2 : 4096;
    void *q = realloc(*p, *cap * elem);
    if (!q) return false;
    *p = q;
    return true;
}

/* {"token": id, ...}: ids plain non-negative integers < 2^31. */
static bool read_vocab(Rd *r, TokBpeText *bt) {
    size_t cap = 0;
    if (!eat(r, '{')) return false;
    if (eat(r, '}')) return true;
    do {
        if (!grow((void **)&bt->vocab, &cap, bt->n_vocab, sizeof *bt->vocab)) return false;
        TokVocabEntry *v = &bt->vocab[bt->n_vocab];
        if (!string(r, &v->key, &v->len) || !eat(r, ':')) return false;
        ws(r);
        size_t a = r->i;
        int64_t id = 0;
        while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9' && r->i - a < 11) id = id * 10 + (r->s[r->i++] - '0');
        size_t nd = r->i - a;
        if (nd == 0 || nd > 10 || (nd > 1 && r->s[a] == '0') || id > 0x7fffffff) return false;
        if (r->i < r->n && !ends_token(r->s[r->i])) return false; /* 1.0, 1e3: not a plain integer */
        v->id = id;
        bt->n_vocab++;
    } while (eat(r, ','));
    return eat(r, '}');
}

/* ["a b", ...] or [["a", "b"], ...] (either form, entry by entry). */
static bool read_merges(Rd *r, TokBpeText *bt) {
    size_t cap = 0;
    if (!eat(r, '[')) return false;
    if (eat(r, ']')) return true;
    do {
        if (!grow((void **)&bt->merges, &cap, bt->n_merges, sizeof *bt->merges)) return false;
        TokMerge *m = &bt->merges[bt->n_merges];
        ws(r);
        if (r->i < r->n && r->s[r->i] == '[') {
            r->i++;
            if (!string(r, &m->a, &m->la) || !eat(r, ',') || !string(r, &m->b, &m->lb) || !eat(r, ']')) return false;
        } else {
            const char *s;
            uint32_t len;
            if (!string(r, &s, &len)) return false;
            const char *sp = memchr(s, ' ', len);
            if (!sp) return false;
            m->a = s;
            m->la = (uint32_t)(sp - s);
            m->b = sp + 1;
            m->lb = len - m->la - 1;
        }
        bt->n_merges++;
    } while (eat(r, ','));
    return eat(r, ']');
}

void tok_bpe_text_free(TokBpeText *bt) {
    free(bt->arena);
    free(bt->vocab);
    free(bt->merges);
    memset(bt, 0, sizeof *bt);
}

bool tok_json_read_bpe(const char *s, size_t n, TokBpeText *bt, char **rest, size_t *rest_len) {
    memset(bt, 0, sizeof *bt);
    Rd r = {s, n, 0, NULL, 0};
    size_t span[2][2] = {{0, 0}, {0, 0}}; /* [vocab, merges][start, end) */
    bool seen_model = false, seen[2] = {false, false};
    const char *k;
    size_t kl;
    if (!(r.arena = malloc(n + 1))) return false;
    bt->arena = r.arena;
    if (!eat(&r, '{') || eat(&r, '}')) goto no;
    do { /* the root object's members */
        if (!raw_key(&r, &k, &kl) || !eat(&r, ':')) goto no;
        ws(&r);
        if (!key_is(k, kl, "model")) {
            if (!skip_value(&r)) goto no;
            continue;
        }
        if (seen_model || !eat(&r, '{') || eat(&r, '}')) goto no;
        seen_model = true;
        do { /* the model's members */
            if (!raw_key(&r, &k, &kl) || !eat(&r, ':')) goto no;
            ws(&r);
            int which = key_is(k, kl, "vocab") ? 0 : key_is(k, kl, "merges") ? 1 : -1;
            if (which < 0) {
                if (!skip_value(&r)) goto no;
                continue;
            }
            if (seen[which]) goto no;
            seen[which] = true;
            span[which][0] = r.i;
            if (!(which == 0 ? read_vocab(&r, bt) : read_merges(&r, bt))) goto no;
            span[which][1] = r.i;
        } while (eat(&r, ','));
        if (!eat(&r, '}')) goto no;
    } while (eat(&r, ','));
    if (!seen[0] || !seen[1]) goto no;
    /* the text less the two values, each replaced by an empty one of its kind */
    int first = span[0][0] < span[1][0] ? 0 : 1;
    size_t len = n - (span[0][1] - span[0][0]) - (span[1][1] - span[1][0]) + 4, at = 0;
    char *o = malloc(len + 1);
    if (!o) goto no;
    size_t from = 0;
    for (int q = 0; q < 2; q++) {
        int w = q == 0 ? first : 1 - first;
        memcpy(o + at, s + from, span[w][0] - from);
        at += span[w][0] - from;
        memcpy(o + at, w == 0 ? "{}" : "[]", 2);
        at += 2;
        from = span[w][1];
    }
    memcpy(o + at, s + from, n - from);
    at += n - from;
    o[at] = 0;
    *rest = o;
    *rest_len = at;
    return true;
no:
    tok_bpe_text_free(bt);
    return false;
}
