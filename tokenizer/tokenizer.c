/*
 * tokenizer.c - encode and decode with a loaded Tokenizer, in the order
 * `tokenizers` applies its stages: added tokens on the raw text, normalizer,
 * normalized added tokens, pre-tokenizer, BPE, post-processor.
 * Not here: loading (tokenizer_load.c), streaming decode (tok_decoder.c).
 */
#include <stdio.h>
#include <stdlib.h>

#include <utf8proc.h>

#include "chat_template.h"
#include "tok_internal.h"

void tok_ids_free(TokIds *v) {
    free(v->ids);
    memset(v, 0, sizeof *v);
}

Tokenizer *tokenizer_load(const char *dir, Err *e) {
    char path[4096];
    size_t n, cn;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    Err fe = {0};
    char *tj = tok_read_file(path, &n, &fe);
    if (!tj) {
        if (fe.msg[0]) *e = fe;
        else ERR(e, 400, "%s not found (nor tokenizer.json.zst): is %s a model directory?", path, dir);
        return NULL;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    char *cj = tok_read_file(path, &cn, &fe);
    Tokenizer *t = tokenizer_load_json(tj, n, cj, e);
    free(tj);
    free(cj);
    return t;
}

void tokenizer_free(Tokenizer *t) {
    if (!t) return;
    tok_arena_free(&t->arena);
    free(t->tok_str);
    free(t->tok_bytes);
    free(t->tok_bytes_len);
    free(t->is_special);
    free(t->is_added);
    strmap_free(&t->str_to_id);
    strmap_free(&t->bpe.vocab);
    free(t->bpe.merges);
    free(t->bpe.whole);
    for (int i = 0; i < t->n_pre; i++) pcre2_code_free(t->pre[i].re);
    for (int i = 0; i < t->n_added; i++) { free(t->added[i].content); free(t->added[i].orig); }
    free(t->added);
    trie_free(&t->trie_raw);
    trie_free(&t->trie_norm);
    free(t->bos);
    free(t->eos);
    free(t->pad);
    free(t->unk);
    chat_template_free(t->chat);
    free(t);
}

/* Code points NFC leaves as they are and that never compose with what
 * precedes them (NFC_QC=Yes starters): all below U+0300, CJK Unified,
 * Hiragana/Katakana less the voicing marks, Hangul syllables. Text can be
 * cut before such a character without changing its NFC. */
static bool nfc_stable_cp(int32_t cp) {
    return cp < 0x300 || (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3040 && cp <= 0x3098) ||
           (cp >= 0x309D && cp <= 0x30FF) || (cp >= 0xAC00 && cp <= 0xD7A3);
}

static bool nfc_only(const Tokenizer *t) {
    bool only = t->n_norm > 0;
    for (int k = 0; k < t->n_norm; k++) only = only && t->norm[k] == NORM_NFC;
    return only;
}

/* Whether the normalizers cannot change s: for NFC, only stable code
 * points; the other forms change some Latin-1 too, so only ASCII. */
static bool norm_skip(const Tokenizer *t, const char *s, size_t n) {
    bool nfc = nfc_only(t);
    for (size_t i = 0; i < n;) {
        if ((uint8_t)s[i] < 0x80) { i++; continue; }
        if (!nfc) return false;
        int32_t cp;
        i += (size_t)utf8_decode((const uint8_t *)s + i, &cp);
        if (!nfc_stable_cp(cp)) return false;
    }
    return true;
}

static void norm_append(char **out, size_t *o, size_t *cap, const char *p, size_t n) {
    if (*o + n + 1 > *cap) {
        *cap = (*o + n + 1) * 2;
        *out = realloc(*out, *cap);
        CHECK(*out, "out of memory normalizing text");
    }
    memcpy(*out + *o, p, n);
    *o += n;
    (*out)[*o] = 0;
}

/* One normalization form, as HF's: utf8proc on the pieces between the code
 * points HF's Unicode (9.0) does not have (norm_hf_unassigned), which are
 * copied as they are. For HF such a code point is a starter of class 0 that
 * decomposes and composes with nothing, so nothing reorders or composes
 * across it and the pieces normalize independently; everywhere else
 * utf8proc's newer Unicode agrees with 9.0 (classes and decompositions of
 * assigned characters are stable). */
static char *utf8proc_norm(NormKind k, const char *s, size_t n, size_t *out_n) {
    utf8proc_option_t opt = UTF8PROC_STABLE;
    switch (k) {
    case NORM_NFC: opt |= UTF8PROC_COMPOSE; break;
    case NORM_NFD: opt |= UTF8PROC_DECOMPOSE; break;
    case NORM_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    default: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    size_t cap = n + 16, o = 0, piece = 0;
    char *out = xmalloc(cap);
    out[0] = 0;
    for (size_t i = 0; i <= n;) {
        int32_t cp = 0;
        int len = i < n ? utf8_decode((const uint8_t *)s + i, &cp) : 0;
        if (i < n && !norm_hf_unassigned(cp)) { i += (size_t)len; continue; }
        if (i > piece) {
            utf8proc_uint8_t *dst = NULL;
            utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s + piece, (utf8proc_ssize_t)(i - piece), &dst, opt);
            CHECK(r >= 0, "utf8proc_map failed on valid UTF-8: %s", utf8proc_errmsg(r));
            norm_append(&out, &o, &cap, (const char *)dst, (size_t)r);
            free(dst);
        }
        if (i == n) break;
        norm_append(&out, &o, &cap, s + i, (size_t)len);
        i += (size_t)len;
        piece = i;
    }
    *out_n = o;
    return out;
}

/* NFC run by run: stable stretches are copied, each unstable stretch is
 * normalized together with the stable starter before it. */
static char *nfc_pieces(const char *s, size_t n, size_t *out_n) {
    size_t cap = n * 3 + 16, o = 0, i = 0, copied = 0;
    char *out = xmalloc(cap);
    size_t prev_start = 0; /* start of the previous code point */
    while (i < n) {
        int32_t cp;
        size_t st = i;
        i += (size_t)utf8_decode((const uint8_t *)s + i, &cp);
        if (nfc_stable_cp(cp)) { prev_start = st; continue; }
        size_t a = st > 0 ? prev_start : 0, b = i;
        if (a < copied) a = copied;
        while (b < n) {
            int32_t c2;
            int k = utf8_decode((const uint8_t *)s + b, &c2);
            if (nfc_stable_cp(c2)) break;
            b += (size_t)k;
        }
        memcpy(out + o, s + copied, a - copied);
        o += a - copied;
        size_t rn;
        char *r = utf8proc_norm(NORM_NFC, s + a, b - a, &rn);
        if (o + rn + (n - b) + 1 > cap) { cap = o + rn + (n - b) + 16; out = realloc(out, cap); CHECK(out, "out of memory"); }
        memcpy(out + o, r, rn);
        o += rn;
        free(r);
        copied = i = b;
        prev_start = b;
    }
    if (o + (n - copied) + 1 > cap) { cap = o + (n - copied) + 1; out = realloc(out, cap); CHECK(out, "out of memory"); }
    memcpy(out + o, s + copied, n - copied);
    o += n - copied;
    out[o] = 0;
    *out_n = o;
    return out;
}

char *normalize_str(const Tokenizer *t, const char *s, size_t n, size_t *out_n) {
    if (nfc_only(t)) return nfc_pieces(s, n, out_n);
    char *cur = xmalloc(n + 1);
    memcpy(cur, s, n);
    cur[n] = 0;
    *out_n = n;
    if (norm_skip(t, s, n)) return cur;
    for (int k = 0; k < t->n_norm; k++) {
        size_t rn;
        char *r = utf8proc_norm(t->norm[k], cur, *out_n, &rn);
        free(cur);
        cur = r;
        *out_n = rn;
    }
    return cur;
}

/* Per-call scratch: nothing shared between threads. */
typedef struct EncScratch {
    PreScratch pre;
    BpeScratch bpe;
    AddedSplitVec split;
} EncScratch;

static int encode_plain(const Tokenizer *t, const char *s, size_t n, EncScratch *sc, TokIds *out, Err *e) {
    int rc = pretok_run(t->pre, t->n_pre, s, n, &sc->pre, e);
    if (rc) return rc;
    for (size_t i = 0; i < sc->pre.a.n; i++) {
        Span p = sc->pre.a.v[i];
        bpe_word(&t->bpe, (const uint8_t *)s + p.start, p.end - p.start, &sc->bpe, out);
    }
    return 0;
}

static void push(TokIds *out, int32_t id) {
    if (out->n == out->cap) {
        out->cap = out->cap ? out->cap * 2 : 256;
        out->ids = realloc(out->ids, out->cap * sizeof *out->ids);
        CHECK(out->ids, "out of memory growing token ids");
    }
    out->ids[out->n++] = id;
}

/* A text segment without raw added tokens: normalize, then normalized
 * added tokens, then the model. */
static int encode_segment(const Tokenizer *t, const char *s, size_t n, EncScratch *sc, TokIds *out, Err *e) {
    if (!t->n_norm && !t->has_norm_added) return encode_plain(t, s, n, sc, out, e);
    size_t nn;
    char *norm = t->n_norm && !norm_skip(t, s, n) ? normalize_str(t, s, n, &nn) : NULL;
    const char *txt = norm ? norm : s;
    if (!norm) nn = n;
    int rc = 0;
    if (!t->has_norm_added) rc = encode_plain(t, txt, nn, sc, out, e);
    else {
        AddedSplitVec sp = {0};
        added_split(&t->trie_norm, t->added, txt, nn, &sp);
        for (size_t i = 0; i < sp.n && !rc; i++) {
            if (sp.v[i].tok >= 0) push(out, t->added[sp.v[i].tok].id);
            else rc = encode_plain(t, txt + sp.v[i].start, sp.v[i].end - sp.v[i].start, sc, out, e);
        }
        free(sp.v);
    }
    free(norm);
    return rc;
}

int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, bool add_special_tokens,
                     TokIds *out, Err *e) {
    size_t rlen, n0 = out->n;
    char *fixed = utf8_repair(text, len, &rlen);
    if (fixed) { text = fixed; len = rlen; }
    EncScratch sc = {0};
    int rc = 0;
    if (add_special_tokens)
        for (int i = 0; i < t->n_prefix; i++) push(out, t->prefix_ids[i]);
    if (t->trie_raw.n_nodes > 1) {
        added_split(&t->trie_raw, t->added, text, len, &sc.split);
        for (size_t i = 0; i < sc.split.n && !rc; i++) {
            AddedSplit s = sc.split.v[i];
            if (s.tok >= 0) push(out, t->added[s.tok].id);
            else rc = encode_segment(t, text + s.start, s.end - s.start, &sc, out, e);
        }
    } else rc = encode_segment(t, text, len, &sc, out, e);
    if (add_special_tokens)
        for (int i = 0; i < t->n_suffix; i++) push(out, t->suffix_ids[i]);
    pre_scratch_free(&sc.pre);
    bpe_scratch_free(&sc.bpe);
    free(sc.split.v);
    free(fixed);
    if (rc) out->n = n0;
    return rc;
}

int tokenizer_decode(const Tokenizer *t, const int32_t *ids, size_t n, bool skip_special_tokens,
                     char **out, size_t *out_len, Err *e) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < t->n_ids) total += t->tok_bytes_len[ids[i]];
    char *buf = malloc(total + 1), *o = buf; /* request path: an error, not an exit */
    if (!buf) {
        alloc_failure_note();
        return ERR(e, 503, "out of memory decoding %zu tokens", n);
    }
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || !t->tok_bytes[id]) continue;
        if (skip_special_tokens && t->is_special[id]) continue;
        memcpy(o, t->tok_bytes[id], t->tok_bytes_len[id]);
        o += t->tok_bytes_len[id];
    }
    *o = 0;
    size_t rl;
    char *fixed = utf8_repair(buf, (size_t)(o - buf), &rl);
    if (fixed) { free(buf); *out = fixed; *out_len = rl; }
    else { *out = buf; *out_len = (size_t)(o - buf); }
    return 0;
}

int32_t tokenizer_vocab_size(const Tokenizer *t) { return t->n_ids; }

const char *tokenizer_id_to_token(const Tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids ? t->tok_str[id] : NULL;
}

int32_t tokenizer_token_to_id(const Tokenizer *t, const char *token) {
    uint32_t id;
    return strmap_get(&t->str_to_id, token, strlen(token), &id) ? (int32_t)id : -1;
}

int tokenizer_token_bytes(const Tokenizer *t, int32_t id, const char **bytes, size_t *len) {
    if (id < 0 || id >= t->n_ids || !t->tok_bytes[id]) return -1;
    *bytes = t->tok_bytes[id];
    *len = t->tok_bytes_len[id];
    return 0;
}

bool tokenizer_is_special(const Tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->is_special[id];
}

int32_t tokenizer_bos_id(const Tokenizer *t) { return t->bos_id; }
int32_t tokenizer_eos_id(const Tokenizer *t) { return t->eos_id; }
int32_t tokenizer_pad_id(const Tokenizer *t) { return t->pad_id; }
const char *tokenizer_eos_token(const Tokenizer *t) { return t->eos; }
const ChatTemplate *tokenizer_chat_template(const Tokenizer *t) { return t->chat; }
