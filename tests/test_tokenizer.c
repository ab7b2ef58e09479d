/*
 * test_tokenizer.c - the tokenizer against goldens made by
 * scripts/make_tokenizer_goldens.py with the `tokenizers` package: ids of a
 * >1 MB corpus, decode, streaming decode, random id decode, lookups, use
 * from several threads, combining marks under the four normalization forms
 * (HF's Unicode 9.0), and refusal of unsupported components.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <zstd.h>

#include <utf8proc.h>

#include "../tokenizer/tok_internal.h" /* norm_hf_*: the generated table */
#include "tok_json_diff.h"
#include "test.h"
#include "tokenizer.h"

#define DATA "tests/data/tokenizers"

static char *read_zst(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "cannot open %s\n", path); exit(1); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) exit(1);
    fclose(f);
    unsigned long long sz = ZSTD_getFrameContentSize(buf, (size_t)n);
    char *out = malloc(sz + 1);
    ZSTD_DCtx *dc = ZSTD_createDCtx();
    ZSTD_DCtx_setParameter(dc, ZSTD_d_windowLogMax, 27);
    size_t got = ZSTD_decompressDCtx(dc, out, sz, buf, (size_t)n);
    ZSTD_freeDCtx(dc);
    if (ZSTD_isError(got) || got != sz) { fprintf(stderr, "bad zstd %s\n", path); exit(1); }
    free(buf);
    *len = sz;
    return out;
}

typedef struct Reader { const char *p, *end; } Reader;
static uint32_t rd_u32(Reader *r) { uint32_t v; memcpy(&v, r->p, 4); r->p += 4; return v; }
static const char *rd_blob(Reader *r, uint32_t *n) { *n = rd_u32(r); const char *p = r->p; r->p += *n; return p; }
static const int32_t *rd_ids(Reader *r, uint32_t *n, int32_t **copy) {
    *n = rd_u32(r);
    *copy = malloc(*n * 4 + 4);
    memcpy(*copy, r->p, *n * 4);
    r->p += *n * 4;
    return *copy;
}

typedef struct Doc { const char *text; uint32_t len; } Doc;
static Doc *docs;
static uint32_t n_docs;

typedef struct Expect { uint8_t add; int32_t *ids; uint32_t n; const char *dec, *dec_skip; uint32_t ld, lds; } Expect;

static int first_diff(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return (int)i;
}

/* Streaming decode of ids must concatenate to want and never split a char. */
static int check_stream(const Tokenizer *t, TokDecoder *d, const int32_t *ids, size_t n, const char *want, size_t wl) {
    tok_decoder_reset(d);
    char *acc = malloc(wl + 64);
    size_t al = 0;
    int bad = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *p;
        size_t l;
        if (i < n) tok_decoder_push(d, ids[i], &p, &l);
        else tok_decoder_flush(d, &p, &l);
        /* a piece is whole characters: it must itself be valid UTF-8 */
        json_t *s = json_stringn(p, l);
        if (!s) bad = 1;
        json_decref(s);
        if (al + l > wl + 63) { bad = 1; break; }
        memcpy(acc + al, p, l);
        al += l;
    }
    int ok = !bad && al == wl && memcmp(acc, want, wl) == 0;
    free(acc);
    return ok;
}

static Expect *load_expect(const char *name, char **buf) {
    char path[512];
    size_t n;
    snprintf(path, sizeof path, DATA "/%s/encode.bin.zst", name);
    *buf = read_zst(path, &n);
    Reader r = {*buf, *buf + n};
    uint32_t nd = rd_u32(&r);
    T_ASSERT(nd == n_docs, "%s: %u docs in golden, %u in corpus", name, nd, n_docs);
    Expect *ex = calloc(nd, sizeof *ex);
    for (uint32_t i = 0; i < nd; i++) {
        ex[i].add = (uint8_t)*r.p++;
        rd_ids(&r, &ex[i].n, &ex[i].ids);
        ex[i].dec = rd_blob(&r, &ex[i].ld);
        ex[i].dec_skip = rd_blob(&r, &ex[i].lds);
    }
    return ex;
}

typedef struct ThreadArg { const Tokenizer *t; const Expect *ex; int start, mismatches; uint32_t n; } ThreadArg;

static void *thread_encode(void *p) {
    ThreadArg *a = p;
    TokIds ids = {0};
    for (uint32_t k = 0; k < a->n; k++) {
        uint32_t i = (k + (uint32_t)a->start * 97) % n_docs;
        Err e = {0};
        ids.n = 0;
        if (tokenizer_encode(a->t, docs[i].text, docs[i].len, a->ex[i].add, &ids, &e) ||
            ids.n != a->ex[i].n || memcmp(ids.ids, a->ex[i].ids, ids.n * 4))
            a->mismatches++;
    }
    tok_ids_free(&ids);
    return NULL;
}

/* One Tokenizer from 4 threads at once, freshly loaded: its whole-token
 * cache (Bpe.whole) is filled while they encode the first n documents (each
 * thread from its own start) against the goldens. */
static void test_threads(const char *name, const Expect *ex, uint32_t n) {
    char dir[256];
    snprintf(dir, sizeof dir, DATA "/%s", name);
    Err e = {0};
    Tokenizer *fresh = tokenizer_load(dir, &e);
    T_ASSERT(fresh != NULL, "%s: load: %s", name, e.msg);
    if (!fresh) return;
    pthread_t th[4];
    ThreadArg ta[4];
    for (int k = 0; k < 4; k++) {
        ta[k] = (ThreadArg){fresh, ex, k, 0, n};
        pthread_create(&th[k], NULL, thread_encode, &ta[k]);
    }
    for (int k = 0; k < 4; k++) {
        pthread_join(th[k], NULL);
        T_ASSERT(ta[k].mismatches == 0, "%s: thread %d: %d mismatches", name, k, ta[k].mismatches);
    }
    tokenizer_free(fresh);
}

static void test_model(const char *name) {
    char dir[256], path[512];
    snprintf(dir, sizeof dir, DATA "/%s", name);
    Err e = {0};
    Tokenizer *t = tokenizer_load(dir, &e);
    T_ASSERT(t != NULL, "%s: load failed: %s", name, e.msg);
    if (!t) return;
    char *buf;
    Expect *ex = load_expect(name, &buf);

    /* encode + decode + streaming decode of every corpus document */
    TokIds ids = {0};
    TokDecoder *d = tok_decoder_create(t, false), *ds = tok_decoder_create(t, true);
    int enc_bad = 0, dec_bad = 0, str_bad = 0;
    size_t total = 0;
    for (uint32_t i = 0; i < n_docs; i++) {
        ids.n = 0;
        int rc = tokenizer_encode(t, docs[i].text, docs[i].len, ex[i].add, &ids, &e);
        total += ids.n;
        if (rc || ids.n != ex[i].n || memcmp(ids.ids, ex[i].ids, ids.n * 4)) {
            if (enc_bad++ < 5) {
                int k = first_diff(ids.ids, ids.n, ex[i].ids, ex[i].n);
                fprintf(stderr, "%s doc %u (len %u): %zu ids vs %u expected, first diff at %d: got %d want %d\n",
                        name, i, docs[i].len, ids.n, ex[i].n, k, k < (int)ids.n ? ids.ids[k] : -1,
                        k < (int)ex[i].n ? ex[i].ids[k] : -1);
            }
        }
        char *out;
        size_t ol;
        tokenizer_decode(t, ex[i].ids, ex[i].n, false, &out, &ol, &e);
        if (ol != ex[i].ld || memcmp(out, ex[i].dec, ol)) dec_bad++;
        free(out);
        tokenizer_decode(t, ex[i].ids, ex[i].n, true, &out, &ol, &e);
        if (ol != ex[i].lds || memcmp(out, ex[i].dec_skip, ol)) dec_bad++;
        free(out);
        if (!check_stream(t, d, ex[i].ids, ex[i].n, ex[i].dec, ex[i].ld)) str_bad++;
        if (!check_stream(t, ds, ex[i].ids, ex[i].n, ex[i].dec_skip, ex[i].lds)) str_bad++;
    }
    T_ASSERT(enc_bad == 0, "%s: %d of %u documents encode differently from tokenizers", name, enc_bad, n_docs);
    T_ASSERT(dec_bad == 0, "%s: %d decodes differ from tokenizers", name, dec_bad);
    T_ASSERT(str_bad == 0, "%s: %d streaming decodes differ", name, str_bad);
    printf("%s: %u docs, %zu tokens compared\n", name, n_docs, total);

    /* random id sequences: partial UTF-8, specials, unknown ids */
    size_t n;
    snprintf(path, sizeof path, DATA "/%s/decode.bin.zst", name);
    char *dbuf = read_zst(path, &n);
    Reader r = {dbuf, dbuf + n};
    uint32_t ns = rd_u32(&r);
    int rbad = 0;
    for (uint32_t k = 0; k < ns; k++) {
        uint32_t m, l1, l2;
        int32_t *seq;
        rd_ids(&r, &m, &seq);
        const char *w1 = rd_blob(&r, &l1), *w2 = rd_blob(&r, &l2);
        char *out;
        size_t ol;
        tokenizer_decode(t, seq, m, false, &out, &ol, &e);
        if (ol != l1 || memcmp(out, w1, ol)) rbad++;
        free(out);
        tokenizer_decode(t, seq, m, true, &out, &ol, &e);
        if (ol != l2 || memcmp(out, w2, ol)) rbad++;
        free(out);
        if (!check_stream(t, d, seq, m, w1, l1) || !check_stream(t, ds, seq, m, w2, l2)) rbad++;
        free(seq);
    }
    T_ASSERT(ns > 0 && rbad == 0, "%s: %d of %u random id sequences decode differently", name, rbad, ns);
    free(dbuf);

    /* lookups against transformers / tokenizers */
    snprintf(path, sizeof path, DATA "/%s/meta.json", name);
    json_error_t je;
    json_t *meta = json_load_file(path, 0, &je);
    T_ASSERT(meta != NULL, "%s: %s", path, je.text);
    if (meta) {
        T_ASSERT(tokenizer_vocab_size(t) == json_integer_value(json_object_get(meta, "vocab_size")), "%s vocab size %d", name,
                 tokenizer_vocab_size(t));
        json_t *b = json_object_get(meta, "bos_id"), *eo = json_object_get(meta, "eos_id"), *p = json_object_get(meta, "pad_id");
        T_ASSERT(tokenizer_bos_id(t) == (json_is_null(b) ? -1 : json_integer_value(b)), "%s bos id", name);
        T_ASSERT(tokenizer_eos_id(t) == (json_is_null(eo) ? -1 : json_integer_value(eo)), "%s eos id", name);
        T_ASSERT(tokenizer_pad_id(t) == (json_is_null(p) ? -1 : json_integer_value(p)), "%s pad id", name);
        json_t *eos = json_object_get(meta, "eos_token");
        T_ASSERT(tokenizer_eos_token(t) && !strcmp(tokenizer_eos_token(t), json_string_value(eos)), "%s eos token", name);
        json_t *sp = json_object_get(meta, "special_ids"), *v;
        size_t i;
        int n_special = 0;
        for (int32_t id = 0; id < tokenizer_vocab_size(t); id++) n_special += tokenizer_is_special(t, id);
        T_ASSERT(n_special == (int)json_array_size(sp), "%s: %d special ids, want %zu", name, n_special, json_array_size(sp));
        json_array_foreach(sp, i, v) T_ASSERT(tokenizer_is_special(t, (int32_t)json_integer_value(v)), "%s special id", name);
        const char *key;
        int tok_bad = 0;
        json_object_foreach(json_object_get(meta, "tokens"), key, v) {
            int32_t id = atoi(key);
            const char *s = tokenizer_id_to_token(t, id);
            if (json_is_null(v) ? s != NULL : (!s || strcmp(s, json_string_value(v)) || tokenizer_token_to_id(t, s) != id))
                tok_bad++;
        }
        T_ASSERT(tok_bad == 0, "%s: %d id<->token lookups differ", name, tok_bad);
        T_ASSERT(tokenizer_id_to_token(t, -1) == NULL && tokenizer_id_to_token(t, tokenizer_vocab_size(t)) == NULL, "range");
        json_decref(meta);
    }

    test_threads(name, ex, n_docs);

    tok_decoder_free(d);
    tok_decoder_free(ds);
    tok_ids_free(&ids);
    for (uint32_t i = 0; i < n_docs; i++) free(ex[i].ids);
    free(ex);
    free(buf);
    tokenizer_free(t);
}

/* ---- tok_json.c: model.vocab and model.merges read straight from the text ---- */

/* Two Tokenizers with the same tables (one read by tok_json.c, one by jansson). */
static int tables_diff(const Tokenizer *a, const Tokenizer *b) {
    int bad = a->n_ids != b->n_ids || a->model_vocab_size != b->model_vocab_size ||
              a->max_tok_bytes != b->max_tok_bytes || a->str_to_id.n != b->str_to_id.n ||
              a->bpe.vocab.n != b->bpe.vocab.n || a->bpe.merge_cap != b->bpe.merge_cap ||
              memcmp(a->bpe.byte_id, b->bpe.byte_id, sizeof a->bpe.byte_id);
    if (bad) return bad;
    for (int32_t id = 0; id < a->n_ids; id++) {
        const char *x = a->tok_str[id], *y = b->tok_str[id];
        bad += (!x != !y) || (x && strcmp(x, y)) || a->tok_bytes_len[id] != b->tok_bytes_len[id] ||
               (a->tok_bytes[id] && memcmp(a->tok_bytes[id], b->tok_bytes[id], a->tok_bytes_len[id])) ||
               a->is_special[id] != b->is_special[id] || a->is_added[id] != b->is_added[id];
        uint32_t ia, ib;
        if (x) bad += !strmap_get(&a->str_to_id, x, strlen(x), &ia) || !strmap_get(&b->str_to_id, x, strlen(x), &ib) || ia != ib;
    }
    return bad + (memcmp(a->bpe.merges, b->bpe.merges, a->bpe.merge_cap * sizeof *a->bpe.merges) != 0);
}

/* The real files: read from the text, equal to jansson's reading, and the
 * loaded Tokenizer equal to the one jansson's path gives (forced by an
 * escape in the root key "model", which the reader refuses). */
static void test_reader_real(const char *name) {
    char path[256];
    size_t n;
    snprintf(path, sizeof path, DATA "/%s/tokenizer.json.zst", name);
    char *doc = read_zst(path, &n);
    TokBpeText bt;
    char *rest;
    size_t rl;
    bool took = tok_json_read_bpe(doc, n, &bt, &rest, &rl);
    T_ASSERT(took, "%s: tok_json_read_bpe refused the real file", name);
    if (!took) { free(doc); return; }
    T_ASSERT(bt.n_vocab > 100000 && bt.n_merges > 100000, "%s: %zu vocab, %zu merges", name, bt.n_vocab, bt.n_merges);
    int bad = reader_diff(doc, n, &bt, rest, rl);
    T_ASSERT(bad == 0, "%s: %d differences from jansson's reading", name, bad);
    tok_bpe_text_free(&bt);
    free(rest);

    char *at = strstr(doc, "\"model\": {"), *slow = malloc(n + 8);
    T_ASSERT(at && !strstr(at + 1, "\"model\": {"), "%s: one \"model\" object", name);
    if (!at) { free(doc); free(slow); return; }
    size_t k = (size_t)(at - doc);
    memcpy(slow, doc, k);
    memcpy(slow + k, "\"mod\\u0065l\":", 13);
    memcpy(slow + k + 13, at + 8, n - k - 8);
    T_ASSERT(!tok_json_read_bpe(slow, n + 5, &bt, &rest, &rl), "%s: the escaped key is refused", name);
    Err e = {0};
    Tokenizer *fast = tokenizer_load_json(doc, n, NULL, &e), *ref = tokenizer_load_json(slow, n + 5, NULL, &e);
    T_ASSERT(fast && ref, "%s: load: %s", name, e.msg);
    if (fast && ref) T_ASSERT(tables_diff(fast, ref) == 0, "%s: tables differ between the two readers", name);
    tokenizer_free(fast);
    tokenizer_free(ref);
    free(slow);
    free(doc);
}

/* Escapes decode as jansson decodes them; what the reader is unsure of, it
 * refuses; of a truncated document it takes nothing jansson would not. */
static void test_reader_cases(void) {
    static const char *ok[] = {
        "{\"version\":\"1.0\",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\\n\\u00e9\\ud83d\\ude00\\/\\\"\\\\\\b\\f\\r\\t\":0,"
        "\"\xc3\xa9\xf0\x9f\x98\x80\":7, \"\":2147483647 ,\"0\":0},\"merges\":[\"a b\",[\"x y\",\"z\"],\" c\",\"d  \\u0020e\"],"
        "\"dropout\":null},\"x\":[1,{\"model\":{\"vocab\":3}},\"model\",-1.5e3,true,null]}",
        " \r\n\t{ \"merges\" : [ ] , \"model\" : { \"merges\" : [ ] , \"vocab\" : { } } } \n",
        "{\"model\":{\"merges\":[[\"\\u00E9\",\"\\uD834\\uDD1E\"]],\"vocab\":{\"k\":10}}}",
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        TokBpeText bt;
        char *rest;
        size_t rl;
        bool took = tok_json_read_bpe(ok[i], strlen(ok[i]), &bt, &rest, &rl);
        T_ASSERT(took, "reader case %zu refused", i);
        if (!took) continue;
        int bad = reader_diff(ok[i], strlen(ok[i]), &bt, rest, rl);
        T_ASSERT(bad == 0, "reader case %zu: %d differences from jansson", i, bad);
        tok_bpe_text_free(&bt);
        free(rest);
        for (size_t cut = 0; cut < strlen(ok[i]); cut++) { /* every prefix */
            if (!tok_json_read_bpe(ok[i], cut, &bt, &rest, &rl)) continue;
            json_error_t je;
            json_t *j = json_loadb(rest, rl, 0, &je);
            if (j) /* only where the cut is trailing white space */
                T_ASSERT(reader_diff(ok[i], cut, &bt, rest, rl) == 0, "reader case %zu cut at %zu", i, cut);
            json_decref(j);
            tok_bpe_text_free(&bt);
            free(rest);
        }
    }
    static const char *no[] = {
        "{\"mod\\u0065l\":{\"vocab\":{},\"merges\":[]}}",             /* escaped key on the way */
        "{\"model\":{\"voc\\u0061b\":{},\"merges\":[]}}",
        "{\"model\":{\"vocab\":{\"a\":1.0},\"merges\":[]}}",          /* not a plain integer */
        "{\"model\":{\"vocab\":{\"a\":1e2},\"merges\":[]}}",
        "{\"model\":{\"vocab\":{\"a\":01},\"merges\":[]}}",
        "{\"model\":{\"vocab\":{\"a\":-1},\"merges\":[]}}",
        "{\"model\":{\"vocab\":{\"a\":2147483648},\"merges\":[]}}",
        "{\"model\":{\"vocab\":{\"a\":\"1\"},\"merges\":[]}}",
        "{\"model\":{\"vocab\":{\"a\\u0000\":1},\"merges\":[]}}",     /* strings jansson refuses */
        "{\"model\":{\"vocab\":{\"\\udc00\":1},\"merges\":[]}}",
        "{\"model\":{\"vocab\":{\"\\ud800x\":1},\"merges\":[]}}",
        "{\"model\":{\"vocab\":{\"\\ud800\\u0041\":1},\"merges\":[]}}",
        "{\"model\":{\"vocab\":{\"\\x\":1},\"merges\":[]}}",
        "{\"model\":{\"vocab\":{\"\\u12g4\":1},\"merges\":[]}}",
        "{\"model\":{\"vocab\":{\"\xff\":1},\"merges\":[]}}",
        "{\"model\":{\"vocab\":{\"\xed\xa0\x80\":1},\"merges\":[]}}",
        "{\"model\":{\"vocab\":{\"\xc0\xaf\":1},\"merges\":[]}}",
        "{\"model\":{\"vocab\":{\"a\tb\":1},\"merges\":[]}}",
        "{\"model\":{\"vocab\":{\"a\":1},\"merges\":[\"ab\"]}}",      /* merges of neither form */
        "{\"model\":{\"vocab\":{\"a\":1},\"merges\":[[\"a\"]]}}",
        "{\"model\":{\"vocab\":{\"a\":1},\"merges\":[[\"a\",\"b\",\"c\"]]}}",
        "{\"model\":{\"vocab\":{\"a\":1},\"merges\":[1]}}",
        "{\"model\":{\"vocab\":{},\"merges\":[]},\"model\":{}}",       /* a second model, vocab, merges */
        "{\"model\":{\"vocab\":{},\"vocab\":{},\"merges\":[]}}",
        "{\"model\":{\"vocab\":{},\"merges\":[],\"merges\":[]}}",
        "{\"model\":{\"vocab\":{}}}",                                 /* no merges */
        "{\"model\":{\"vocab\":{\"a\":1,},\"merges\":[]}}",           /* trailing commas */
        "{\"model\":{\"vocab\":{},\"merges\":[\"a b\",]}}",
        "{\"model\":[],\"vocab\":{},\"merges\":[]}",
        "[{\"model\":{\"vocab\":{},\"merges\":[]}}]",
    };
    for (size_t i = 0; i < sizeof no / sizeof *no; i++) {
        TokBpeText bt;
        char *rest;
        size_t rl;
        T_ASSERT(!tok_json_read_bpe(no[i], strlen(no[i]), &bt, &rest, &rl), "reader refusal case %zu taken: %s", i, no[i]);
    }
    static const char nul[] = "{\"x\":\0,\"model\":{\"vocab\":{},\"merges\":[]}}"; /* a NUL byte where a value starts */
    TokBpeText bt;
    char *rest;
    size_t rl;
    T_ASSERT(!tok_json_read_bpe(nul, sizeof nul - 1, &bt, &rest, &rl), "a NUL byte is refused");
}

/* A key twice in model.vocab: jansson keeps the last value (at the first's
 * place); the loader's map finds it and the file is read with jansson. */
static void test_reader_duplicate_key(void) {
    size_t n;
    char *doc = read_zst(DATA "/qwen3/tokenizer.json.zst", &n);
    char *v = strstr(doc, "\"vocab\":");
    T_ASSERT(v != NULL, "vocab key");
    if (!v) { free(doc); return; }
    v = strchr(v, '{') + 1;
    /* "!" (id 0) given id 5 first, while "&" (id 5) comes before the real "!": jansson: "!" -> 0 */
    static const char ins[] = "\"!\":5,";
    size_t k = (size_t)(v - doc), il = sizeof ins - 1;
    char *dup = malloc(n + il);
    memcpy(dup, doc, k);
    memcpy(dup + k, ins, il);
    memcpy(dup + k + il, v, n - k);
    Err e = {0};
    Tokenizer *a = tokenizer_load_json(doc, n, NULL, &e), *b = tokenizer_load_json(dup, n + il, NULL, &e);
    T_ASSERT(a && b, "duplicate key: %s", e.msg);
    if (a && b) {
        T_ASSERT(tokenizer_token_to_id(b, "!") == 0 && !strcmp(tokenizer_id_to_token(b, 5), "&"), "duplicate key: last wins");
        T_ASSERT(tables_diff(a, b) == 0, "duplicate key: tables differ from the file without it");
    }
    tokenizer_free(a);
    tokenizer_free(b);
    free(dup);
    free(doc);
}

/* The options the real tokenizers do not use (added-token flags, other
 * normalizers, Split behaviours, Digits, ByteLevel's regex, a template with
 * prefix and suffix): variants of qwen3/tokenizer.json against `tokenizers`. */
static void test_variants(void) {
    size_t n, vn;
    char *tj = read_zst(DATA "/qwen3/tokenizer.json.zst", &n), *vj = read_zst(DATA "/variants.json.zst", &vn);
    json_error_t je;
    json_t *base = json_loadb(tj, n, 0, &je), *vs = json_loadb(vj, vn, JSON_ALLOW_NUL, &je);
    T_ASSERT(base && vs, "variants: %s", je.text);
    if (!base || !vs) return;
    json_t *texts = json_object_get(vs, "texts"), *v;
    size_t k;
    json_array_foreach(json_object_get(vs, "variants"), k, v) {
        const char *name = json_string_value(json_object_get(v, "name"));
        json_t *j = json_copy(base);
        json_object_update(j, json_object_get(v, "patch"));
        char *s = json_dumps(j, JSON_COMPACT);
        Err e = {0};
        Tokenizer *t = tokenizer_load_json(s, strlen(s), NULL, &e);
        free(s);
        json_decref(j);
        T_ASSERT(t != NULL, "variant %s: %s", name, e.msg);
        if (!t) continue;
        json_t *want_ids = json_object_get(v, "ids"), *dec = json_object_get(v, "decoded");
        TokIds ids = {0};
        int bad = 0;
        size_t nt = json_array_size(texts), nd = json_array_size(dec);
        for (size_t i = 0; i < nt; i++) {
            json_t *txt = json_array_get(texts, i), *w = json_array_get(want_ids, i);
            ids.n = 0;
            tokenizer_encode(t, json_string_value(txt), json_string_length(txt), i % 2 == 0, &ids, &e);
            bool same = ids.n == json_array_size(w);
            for (size_t q = 0; same && q < ids.n; q++) same = ids.ids[q] == json_integer_value(json_array_get(w, q));
            if (!same && bad++ < 3)
                fprintf(stderr, "variant %s text %zu: %zu ids, want %zu: %.60s\n", name, i, ids.n, json_array_size(w),
                        json_string_value(txt));
            if (i >= nt - nd) { /* decode(encode(text)) of the flag-specific texts */
                json_t *d = json_array_get(dec, i - (nt - nd));
                char *out;
                size_t ol;
                ids.n = 0;
                tokenizer_encode(t, json_string_value(txt), json_string_length(txt), true, &ids, &e);
                tokenizer_decode(t, ids.ids, ids.n, true, &out, &ol, &e);
                if (ol != json_string_length(d) || memcmp(out, json_string_value(d), ol)) {
                    bad++;
                    fprintf(stderr, "variant %s decode %zu: [%s] want [%s]\n", name, i, out, json_string_value(d));
                }
                free(out);
            }
        }
        T_ASSERT(bad == 0, "variant %s: %d of %zu texts differ from tokenizers", name, bad, nt);
        tok_ids_free(&ids);
        tokenizer_free(t);
    }
    json_decref(base);
    json_decref(vs);
    free(tj);
    free(vj);
}

static int version_cmp(const char *a, const char *b) {
    for (int k = 0; k < 3; k++) {
        long x = strtol(a, (char **)&a, 10), y = strtol(b, (char **)&b, 10);
        if (x != y) return x < y ? -1 : 1;
        if (*a == '.') a++;
        if (*b == '.') b++;
    }
    return 0;
}

/* Canonical ordering and composition as HF's normalizers (Unicode 9.0)
 * do them, whatever Unicode utf8proc has: "a" + two marks of every pair of
 * classes, and marks and composites Unicode added later (unassigned for HF:
 * not reordered, nothing moves across them) against ids from `tokenizers`
 * (scripts/make_nfc_goldens.py), with Qwen3's NFC and the three other forms. */
static void test_normalize_marks(void) {
    /* the generated table covers every Unicode utf8proc may have, from HF's up to its own */
    const char *uv = utf8proc_unicode_version();
    T_ASSERT(version_cmp(uv, norm_hf_unicode_version) >= 0 && version_cmp(uv, norm_hf_table_unicode_version) <= 0,
             "utf8proc has Unicode %s; tokenizer/norm_hf_table.c covers %s to %s: rerun "
             "scripts/make_hf_unicode_table.py with a newer unicodedata2", uv, norm_hf_unicode_version,
             norm_hf_table_unicode_version);
    T_ASSERT(norm_hf_unassigned(0x08D0) && norm_hf_unassigned(0x1AC7) && !norm_hf_unassigned(0x0301) &&
                 !norm_hf_unassigned(0x08D4) && !norm_hf_unassigned('a'),
             "table: Unicode 10+ marks unknown to HF, 9.0 ones known");
    size_t n, gn;
    char *tj = read_zst(DATA "/qwen3/tokenizer.json.zst", &n), *gj = read_zst(DATA "/normalize_marks.json.zst", &gn);
    json_error_t je;
    json_t *base = json_loadb(tj, n, 0, &je), *g = json_loadb(gj, gn, 0, &je);
    T_ASSERT(base && g, "normalize_marks: %s", je.text);
    if (!base || !g) return;
    json_t *forms = json_object_get(g, "forms"), *cases = json_object_get(g, "cases");
    T_ASSERT(json_array_size(cases) > 3000, "%zu cases", json_array_size(cases));
    for (size_t f = 0; f < json_array_size(forms); f++) {
        const char *form = json_string_value(json_array_get(forms, f));
        json_t *j = json_copy(base);
        json_object_set_new(j, "normalizer", json_pack("{ss}", "type", form));
        char *s = json_dumps(j, JSON_COMPACT);
        Err e = {0};
        Tokenizer *t = tokenizer_load_json(s, strlen(s), NULL, &e);
        free(s);
        json_decref(j);
        T_ASSERT(t != NULL, "%s: %s", form, e.msg);
        if (!t) continue;
        TokIds ids = {0};
        int bad = 0;
        json_t *c;
        size_t i;
        json_array_foreach(cases, i, c) {
            json_t *txt = json_array_get(c, 0), *w = json_array_get(c, 1 + f);
            ids.n = 0;
            int rc = tokenizer_encode(t, json_string_value(txt), json_string_length(txt), false, &ids, &e);
            bool same = rc == 0 && ids.n == json_array_size(w);
            for (size_t q = 0; same && q < ids.n; q++) same = ids.ids[q] == json_integer_value(json_array_get(w, q));
            if (!same && bad++ < 5) {
                char cps[128] = "";
                const unsigned char *p = (const unsigned char *)json_string_value(txt);
                for (size_t b = 0, o = 0; p[b] && o < sizeof cps - 10; b++)
                    if ((p[b] & 0xC0) != 0x80) {
                        int32_t cp;
                        utf8proc_iterate(p + b, -1, &cp);
                        o += (size_t)snprintf(cps + o, sizeof cps - o, " U+%04X", (unsigned)cp);
                    }
                fprintf(stderr, "%s case %zu:%s: %zu ids, want %zu\n", form, i, cps, ids.n, json_array_size(w));
            }
        }
        T_ASSERT(bad == 0, "%s: %d of %zu mark strings normalize differently from tokenizers", form, bad,
                 json_array_size(cases));
        tok_ids_free(&ids);
        tokenizer_free(t);
    }
    json_decref(base);
    json_decref(g);
    free(tj);
    free(gj);
}

/* A component we do not implement must be refused by name, never ignored. */
static void test_refusals(void) {
    static const struct { const char *json, *name; } cases[] = {
        {"{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}},\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"decoder\":{\"type\":\"ByteLevel\"}}", "WordPiece"},
        {"{\"normalizer\":{\"type\":\"Lowercase\"},\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]},\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"decoder\":{\"type\":\"ByteLevel\"}}", "Lowercase"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]},\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Whitespace\"},{\"type\":\"ByteLevel\"}]},\"decoder\":{\"type\":\"ByteLevel\"}}", "Whitespace"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]},\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"decoder\":{\"type\":\"WordPiece\"}}", "WordPiece"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]},\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"post_processor\":{\"type\":\"RobertaProcessing\"},\"decoder\":{\"type\":\"ByteLevel\"}}", "RobertaProcessing"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[],\"byte_fallback\":true},\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"decoder\":{\"type\":\"ByteLevel\"}}", "byte_fallback"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]},\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Weird\"},\"decoder\":{\"type\":\"ByteLevel\"}}", "Weird"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]},\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"decoder\":{\"type\":\"ByteLevel\"}}", "byte 0x00"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        Err e = {0};
        Tokenizer *t = tokenizer_load_json(cases[i].json, strlen(cases[i].json), NULL, &e);
        T_ASSERT(t == NULL && strstr(e.msg, cases[i].name), "case %zu: want refusal naming %s, got %s", i, cases[i].name,
                 t ? "a tokenizer" : e.msg);
        tokenizer_free(t);
    }
    Err e = {0};
    T_ASSERT(tokenizer_load("tests/data/tokenizers/no-such-model", &e) == NULL && strstr(e.msg, "tokenizer.json"),
             "missing dir: %s", e.msg);
}

/* The byte-level alphabet (utf8.c's closed forms) against GPT-2's bytes_to_unicode as encoder.py
 * builds it: the printable ranges in order, then every other byte at 256, 257, ... */
static void test_bytelevel(void) {
    int32_t want[256];
    int have[256] = {0}, n = 0;
    for (int b = '!'; b <= '~'; b++) have[b] = 1;
    for (int b = 0xA1; b <= 0xAC; b++) have[b] = 1;
    for (int b = 0xAE; b <= 0xFF; b++) have[b] = 1;
    for (int b = 0; b < 256; b++) want[b] = have[b] ? b : 256 + n++;
    T_ASSERT(n == 68, "%d bytes outside the printable ranges", n);
    int bad = 0;
    for (int b = 0; b < 256; b++) bad += bytelevel_char((uint8_t)b) != want[b];
    for (int32_t cp = -2; cp < 400; cp++) {
        int b = -1;
        for (int x = 0; x < 256; x++) if (want[x] == cp) b = x;
        bad += bytelevel_byte(cp) != b;
    }
    T_ASSERT(bad == 0, "%d byte-level mappings differ from bytes_to_unicode", bad);
}

/* The load's errors name the first bad entry (tok_load_merges reads the merges in batches of
 * 32, and looks a batch up after reading its shapes): a tiny ByteLevel BPE of the 256 byte tokens
 * (id = byte) and 40 merges "a" + c (c = b..z, A..O; merged id 256 + k), with one or two bad
 * merges on either side of a batch's edge. */
enum { BAD_NONE = -1 };
typedef struct MergeFault {
    int missing, no_space, neither, bad_part; /* the merge whose join is not in the vocab, ... */
} MergeFault;
static char *merge_doc(MergeFault f, bool shared_id) {
    static const char seconds[] = "bcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNO";
    json_t *vocab = json_object(), *merges = json_array();
    for (int b = 0; b < 256; b++) {
        char u[8];
        u[utf8_encode(bytelevel_char((uint8_t)b), u)] = 0;
        json_object_set_new(vocab, u, json_integer(b));
    }
    for (int k = 0; k < 40; k++) {
        char join[3] = {'a', seconds[k], 0}, m[8];
        if (k != f.missing) json_object_set_new(vocab, join, json_integer(256 + k));
        snprintf(m, sizeof m, k == f.bad_part ? "qq %c" : k == f.no_space ? "a%c" : "a %c", seconds[k]);
        json_array_append_new(merges, k == f.neither ? json_integer(1) : json_string(m));
    }
    if (shared_id) json_object_set_new(vocab, "zz", json_integer(98)); /* the id of "b" */
    json_t *doc = json_pack("{s:{s:s,s:o,s:o},s:{s:s,s:b,s:b,s:b},s:{s:s,s:b,s:b,s:b}}", "model", "type", "BPE",
                            "vocab", vocab, "merges", merges, "pre_tokenizer", "type", "ByteLevel", "add_prefix_space", 0,
                            "trim_offsets", 1, "use_regex", 1, "decoder", "type", "ByteLevel", "add_prefix_space", 0,
                            "trim_offsets", 1, "use_regex", 1);
    char *s = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    return s;
}

static void test_load_errors(void) {
    const MergeFault ok = {BAD_NONE, BAD_NONE, BAD_NONE, BAD_NONE};
    char *s = merge_doc(ok, false);
    Err e = {0};
    Tokenizer *t = tokenizer_load_json(s, strlen(s), NULL, &e);
    free(s);
    T_ASSERT(t != NULL, "the fault-free doc: %s", e.msg);
    if (t) { /* every merge in: "ab" is merge 0's id, "aO" merge 39's (HF tokenizers 0.23.3 on this doc: 256 32 295) */
        TokIds ids = {0};
        tokenizer_encode(t, "ab aO", 5, false, &ids, &e);
        T_ASSERT(ids.n == 3 && ids.ids[0] == 256 && ids.ids[1] == ' ' && ids.ids[2] == 256 + 39,
                 "\"ab aO\": %zu ids", ids.n);
        free(ids.ids);
        tokenizer_free(t);
    }
    static const struct { MergeFault f; const char *want; } cases[] = {
        {{0, BAD_NONE, BAD_NONE, BAD_NONE}, "merge 0 (a b): token not in vocab"},
        {{35, BAD_NONE, 36, BAD_NONE}, "merge 35 (a K): token not in vocab"},
        {{5, 3, BAD_NONE, BAD_NONE}, "merge 3 (ae) is not \"a b\""},
        {{34, BAD_NONE, 33, BAD_NONE}, "merge 33 is neither \"a b\" nor [a, b]"},
        {{31, 32, BAD_NONE, BAD_NONE}, "merge 31 (a G): token not in vocab"}, /* the last of the first batch */
        {{33, 32, BAD_NONE, BAD_NONE}, "merge 32 (aH) is not \"a b\""},      /* the first of the second */
        {{BAD_NONE, BAD_NONE, BAD_NONE, 39}, "merge 39 (qq O): token not in vocab"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        s = merge_doc(cases[i].f, false);
        e = (Err){0};
        t = tokenizer_load_json(s, strlen(s), NULL, &e);
        free(s);
        T_ASSERT(t == NULL && strstr(e.msg, cases[i].want), "merge case %zu: want \"%s\", got %s", i, cases[i].want,
                 t ? "a tokenizer" : e.msg);
        tokenizer_free(t);
    }
    s = merge_doc(ok, true);
    e = (Err){0};
    t = tokenizer_load_json(s, strlen(s), NULL, &e);
    free(s);
    T_ASSERT(t == NULL && strstr(e.msg, "share the id 98"), "two tokens of one id: %s", t ? "a tokenizer" : e.msg);
    tokenizer_free(t);
}

int main(void) {
    size_t n;
    char *corpus = read_zst(DATA "/corpus.bin.zst", &n);
    Reader r = {corpus, corpus + n};
    n_docs = rd_u32(&r);
    docs = calloc(n_docs, sizeof *docs);
    size_t bytes = 0;
    for (uint32_t i = 0; i < n_docs; i++) { docs[i].text = rd_blob(&r, &docs[i].len); bytes += docs[i].len; }
    T_ASSERT(bytes >= 1000000, "corpus is %zu bytes", bytes);
    if (getenv("TOK_THREADS_ONLY")) { /* the ThreadSanitizer pass (tests/run.sh): where threads meet */
        char *buf;
        Expect *ex = load_expect("qwen3", &buf);
        test_threads("qwen3", ex, 120);
        for (uint32_t i = 0; i < n_docs; i++) free(ex[i].ids);
        free(ex);
        free(buf);
        free(docs);
        free(corpus);
        return T_DONE();
    }
    test_bytelevel();
    test_refusals();
    test_load_errors();
    test_reader_cases();
    test_reader_real("qwen3");
    test_reader_real("llama3.1");
    test_reader_duplicate_key();
    test_variants();
    test_normalize_marks();
    test_model("qwen3");
    test_model("llama3.1");
    free(docs);
    free(corpus);
    return T_DONE();
}
