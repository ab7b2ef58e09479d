/*
 * tokenizer_load.c - read tokenizer.json (+ tokenizer_config.json) into a
 * Tokenizer, refusing every component it does not implement by name, so a
 * model is never tokenized differently from `tokenizers` without notice.
 * Not here: encoding and decoding (tokenizer.c).
 */
#include <stdio.h>
#include <stdlib.h>

#include <zstd.h>

#include "chat_template.h"
#include "tok_internal.h"

/* Read a whole file (or decompress path.zst); NULL if neither exists. */
char *tok_read_file(const char *path, size_t *len, Err *e) {
    FILE *f = fopen(path, "rb");
    char zpath[4096];
    bool zst = false;
    if (!f) {
        snprintf(zpath, sizeof zpath, "%s.zst", path);
        f = fopen(zpath, "rb");
        zst = true;
        if (!f) return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = xmalloc((size_t)n + 1);
    if (n < 0 || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(buf);
        ERR(e, 500, "cannot read %s", path);
        return NULL;
    }
    fclose(f);
    buf[n] = 0;
    *len = (size_t)n;
    if (!zst) return buf;
    unsigned long long sz = ZSTD_getFrameContentSize(buf, (size_t)n);
    if (sz == ZSTD_CONTENTSIZE_ERROR || sz == ZSTD_CONTENTSIZE_UNKNOWN) {
        free(buf);
        ERR(e, 400, "%s: not a zstd file with a known content size", zpath);
        return NULL;
    }
    char *out = xmalloc(sz + 1);
    size_t got = ZSTD_decompress(out, sz, buf, (size_t)n);
    free(buf);
    if (ZSTD_isError(got) || got != sz) {
        free(out);
        ERR(e, 400, "%s: corrupt zstd data", zpath);
        return NULL;
    }
    out[sz] = 0;
    *len = sz;
    return out;
}

static const char *jstr(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static bool jbool(json_t *o, const char *key) { return json_is_true(json_object_get(o, key)); }

/* The raw bytes of a byte-level token string; false if a char is outside
 * the byte-level alphabet. */
static bool unbytelevel(const char *s, char *out, size_t *n) {
    size_t k = 0;
    for (const uint8_t *p = (const uint8_t *)s; *p;) {
        int32_t cp;
        p += utf8_decode(p, &cp);
        int b = bytelevel_byte(cp);
        if (b < 0) return false;
        out[k++] = (char)b;
    }
    *n = k;
    return true;
}

char *tok_arena_alloc(TokArenaChunk **arena, size_t n) {
    TokArenaChunk *c = *arena;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > ((size_t)1 << 20) ? n : (size_t)1 << 20;
        c = xmalloc(sizeof *c + cap);
        c->next = *arena;
        c->used = 0;
        c->cap = cap;
        *arena = c;
    }
    char *p = c->data + c->used;
    c->used += n;
    return p;
}

void tok_arena_free(TokArenaChunk **arena) {
    for (TokArenaChunk *c = *arena, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    *arena = NULL;
}

/* Id id's string s and its bytes; whether s is all ByteLevel's alphabet (its bytes decoded). */
static bool set_id_string(Tokenizer *t, int32_t id, const char *s) {
    size_t n = strlen(s), k;
    t->tok_str[id] = memcpy(tok_arena_alloc(&t->arena, n + 1), s, n + 1);
    char *raw = tok_arena_alloc(&t->arena, n + 1);
    /* ByteLevel decoder: all chars in the alphabet -> bytes, else the UTF-8 as is. */
    bool bytelevel = unbytelevel(s, raw, &k);
    if (!bytelevel) { memcpy(raw, s, n); k = n; }
    raw[k] = 0;
    t->tok_bytes[id] = raw;
    t->tok_bytes_len[id] = (uint32_t)k;
    if (k > t->max_tok_bytes) t->max_tok_bytes = k;
    return bytelevel;
}

static int load_normalizer(Tokenizer *t, json_t *n, Err *e) {
    if (json_is_null(n) || !n) return 0;
    const char *type = jstr(n, "type");
    if (!type) return ERR(e, 400, "normalizer without a type");
    if (!strcmp(type, "Sequence")) {
        json_t *v;
        size_t i;
        json_array_foreach(json_object_get(n, "normalizers"), i, v) {
            int rc = load_normalizer(t, v, e);
            if (rc) return rc;
        }
        return 0;
    }
    NormKind k = !strcmp(type, "NFC") ? NORM_NFC : !strcmp(type, "NFD") ? NORM_NFD
               : !strcmp(type, "NFKC") ? NORM_NFKC : !strcmp(type, "NFKD") ? NORM_NFKD : NORM_NONE;
    if (k == NORM_NONE) return ERR(e, 400, "unsupported normalizer %s", type);
    if (t->n_norm == 4) return ERR(e, 400, "too many normalizers");
    t->norm[t->n_norm++] = k;
    return 0;
}

static int load_pretok(Tokenizer *t, json_t *p, bool *seen_bl, Err *e) {
    if (!p || json_is_null(p)) return ERR(e, 400, "a pre_tokenizer with ByteLevel is required (byte-level BPE only)");
    const char *type = jstr(p, "type");
    if (!type) return ERR(e, 400, "pre_tokenizer without a type");
    if (!strcmp(type, "Sequence")) {
        json_t *v;
        size_t i;
        json_array_foreach(json_object_get(p, "pretokenizers"), i, v) {
            int rc = load_pretok(t, v, seen_bl, e);
            if (rc) return rc;
        }
        return 0;
    }
    if (t->n_pre == 8) return ERR(e, 400, "too many pre-tokenizers");
    PreStep *st = &t->pre[t->n_pre];
    memset(st, 0, sizeof *st);
    if (!strcmp(type, "ByteLevel")) {
        if (jbool(p, "add_prefix_space")) return ERR(e, 400, "unsupported pre_tokenizer ByteLevel with add_prefix_space=true");
        *seen_bl = true;
        if (!json_is_false(json_object_get(p, "use_regex"))) {
            st->kind = PRE_BYTELEVEL_REGEX;
            st->re = pretok_compile("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", false, e);
            if (!st->re) return -400;
            t->n_pre++;
        }
        return 0;
    }
    if (*seen_bl) return ERR(e, 400, "unsupported pre_tokenizer %s after ByteLevel", type);
    if (!strcmp(type, "Digits")) {
        st->kind = PRE_DIGITS;
        st->individual_digits = jbool(p, "individual_digits");
        t->n_pre++;
        return 0;
    }
    if (!strcmp(type, "Split")) {
        json_t *pat = json_object_get(p, "pattern");
        const char *rx = jstr(pat, "Regex"), *lit = jstr(pat, "String");
        if (!rx && !lit) return ERR(e, 400, "Split pre_tokenizer without a Regex or String pattern");
        const char *beh = jstr(p, "behavior");
        static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        int b = -1;
        for (int i = 0; i < 5; i++)
            if (beh && !strcmp(beh, names[i])) b = i;
        if (b < 0) return ERR(e, 400, "unsupported Split behavior %s", beh ? beh : "(none)");
        st->kind = PRE_SPLIT;
        st->behavior = (SplitBehavior)b;
        st->invert = jbool(p, "invert");
        st->re = pretok_compile(rx ? rx : lit, rx == NULL, e);
        if (!st->re) return -400;
        t->n_pre++;
        return 0;
    }
    return ERR(e, 400, "unsupported pre_tokenizer %s", type);
}

static int load_post(Tokenizer *t, json_t *p, Err *e) {
    if (!p || json_is_null(p)) return 0;
    const char *type = jstr(p, "type");
    if (!type) return ERR(e, 400, "post_processor without a type");
    if (!strcmp(type, "Sequence")) {
        json_t *v;
        size_t i;
        json_array_foreach(json_object_get(p, "processors"), i, v) {
            int rc = load_post(t, v, e);
            if (rc) return rc;
        }
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) return 0; /* offsets only */
    if (strcmp(type, "TemplateProcessing")) return ERR(e, 400, "unsupported post_processor %s", type);
    if (t->n_prefix || t->n_suffix) return ERR(e, 400, "more than one TemplateProcessing post_processor");
    json_t *single = json_object_get(p, "single"), *specials = json_object_get(p, "special_tokens"), *it;
    size_t i;
    bool seen_a = false;
    json_array_foreach(single, i, it) {
        json_t *sp = json_object_get(it, "SpecialToken"), *sq = json_object_get(it, "Sequence");
        if (sq) {
            if (seen_a || strcmp(jstr(sq, "id") ? jstr(sq, "id") : "", "A"))
                return ERR(e, 400, "unsupported TemplateProcessing single template (sequence B or repeated A)");
            seen_a = true;
            continue;
        }
        const char *name = jstr(sp, "id");
        json_t *ids = json_object_get(json_object_get(specials, name ? name : ""), "ids"), *idv;
        if (!name || !json_is_array(ids)) return ERR(e, 400, "TemplateProcessing: special token %s without ids", name ? name : "?");
        size_t k;
        json_array_foreach(ids, k, idv) {
            int32_t *dst = seen_a ? t->suffix_ids : t->prefix_ids;
            int *cnt = seen_a ? &t->n_suffix : &t->n_prefix;
            if (*cnt == 8) return ERR(e, 400, "TemplateProcessing: too many special tokens");
            dst[(*cnt)++] = (int32_t)json_integer_value(idv);
        }
    }
    if (!seen_a) return ERR(e, 400, "TemplateProcessing single template without sequence A");
    return 0;
}

static int load_decoder(json_t *d, Err *e) {
    const char *type = d ? jstr(d, "type") : NULL;
    if (!type) return ERR(e, 400, "a ByteLevel decoder is required");
    if (!strcmp(type, "Sequence")) {
        json_t *v;
        size_t i;
        json_array_foreach(json_object_get(d, "decoders"), i, v) {
            int rc = load_decoder(v, e);
            if (rc) return rc;
        }
        return 0;
    }
    if (strcmp(type, "ByteLevel")) return ERR(e, 400, "unsupported decoder %s", type);
    return 0;
}

static int load_model(Tokenizer *t, json_t *m, const TokBpeText *bt, Err *e) {
    const char *type = jstr(m, "type");
    if (!type || strcmp(type, "BPE")) return ERR(e, 400, "unsupported model %s", type ? type : "(none)");
    json_t *dr = json_object_get(m, "dropout");
    if (dr && !json_is_null(dr)) return ERR(e, 400, "unsupported model BPE with dropout");
    if (jbool(m, "byte_fallback")) return ERR(e, 400, "unsupported model BPE with byte_fallback");
    const char *csp = jstr(m, "continuing_subword_prefix"), *eow = jstr(m, "end_of_word_suffix");
    if ((csp && *csp) || (eow && *eow)) return ERR(e, 400, "unsupported model BPE with continuing_subword_prefix/end_of_word_suffix");
    t->bpe.ignore_merges = jbool(m, "ignore_merges");
    if (!json_is_object(json_object_get(m, "vocab")) || !json_is_array(json_object_get(m, "merges")))
        return ERR(e, 400, "BPE model without vocab or merges");
    for (size_t i = 0; i < bt->n_vocab; i++) {
        int64_t id = bt->vocab[i].id;
        if (id < 0 || id > 0x7fffffff) return ERR(e, 400, "vocab entry %s: bad id", bt->vocab[i].key);
        if (id >= t->n_ids) t->n_ids = (int32_t)id + 1;
    }
    return 0;
}

/* model.vocab and model.merges of a jansson document, as tok_json_read_bpe
 * gives them (pointers into root, which must outlive bt); false if they are
 * not an object and an array (load_model says so). */
static bool bpe_text_from_json(json_t *m, TokBpeText *bt) {
    json_t *vocab = json_object_get(m, "vocab"), *merges = json_object_get(m, "merges"), *v;
    memset(bt, 0, sizeof *bt);
    if (!json_is_object(vocab) || !json_is_array(merges)) return false;
    bt->n_vocab = json_object_size(vocab);
    bt->vocab = xcalloc(bt->n_vocab + 1, sizeof *bt->vocab);
    const char *key;
    size_t k = 0, i;
    json_object_foreach(vocab, key, v)
        bt->vocab[k++] = (TokVocabEntry){key, (uint32_t)strlen(key), json_is_integer(v) ? json_integer_value(v) : -1};
    bt->n_merges = json_array_size(merges);
    bt->merges = xcalloc(bt->n_merges + 1, sizeof *bt->merges);
    json_array_foreach(merges, i, v) {
        TokMerge *g = &bt->merges[i];
        if (json_is_string(v)) {
            const char *a = json_string_value(v), *sp = strchr(a, ' ');
            g->a = a;
            if (!sp) continue; /* b NULL: "not a b" */
            *g = (TokMerge){a, sp + 1, (uint32_t)(sp - a), (uint32_t)strlen(sp + 1)};
        } else if (json_is_array(v) && json_array_size(v) == 2 && json_is_string(json_array_get(v, 0)) &&
                   json_is_string(json_array_get(v, 1))) {
            const char *a = json_string_value(json_array_get(v, 0)), *b = json_string_value(json_array_get(v, 1));
            *g = (TokMerge){a, b, (uint32_t)strlen(a), (uint32_t)strlen(b)};
        } /* else a NULL: neither form */
    }
    return true;
}

/* The load's map puts and gets are made this many ahead, their slots prefetched meanwhile: each is a
 * miss on a table of megabytes (Qwen3's str_to_id: 4 MiB of slots), and ~750,000 of them, one
 * stalling the load after another, were over half of it */
enum { KEYS_AHEAD = 16, MERGE_BATCH = 32 };

static StrKey vocab_key(const Tokenizer *t, int32_t id, bool bytes) {
    return bytes ? strmap_key(t->tok_bytes[id], t->tok_bytes_len[id]) : strmap_key(t->tok_str[id], strlen(t->tok_str[id]));
}

/* Put each id of ids[0..n) (skipping -1) in m under its string (bytes: its decoded bytes), in order,
 * each key made and its slot prefetched KEYS_AHEAD puts ahead; the index of the first key already
 * there (its id's put is done: an overwrite), or n. */
static size_t vocab_put_all(const Tokenizer *t, StrMap *m, const int32_t *ids, size_t n, bool bytes) {
    StrKey ahead[KEYS_AHEAD]; /* entry i's key at [i % KEYS_AHEAD], from KEYS_AHEAD steps before its put */
    for (size_t i = 0; i < n + KEYS_AHEAD; i++) {
        size_t r = i % KEYS_AHEAD, put = i - KEYS_AHEAD;
        if (i >= KEYS_AHEAD && ids[put] >= 0 && !strmap_put_key(m, ahead[r], (uint32_t)ids[put])) return put;
        if (i < n && ids[i] >= 0) {
            ahead[r] = vocab_key(t, ids[i], bytes);
            strmap_prefetch(m, ahead[r]);
        }
    }
    return n;
}

/* model.merges into the merge table, MERGE_BATCH at a time: a batch's keys (both parts and their
 * join) made and their slots prefetched, then looked up, then the merge table's slots likewise;
 * the first bad merge is the one reported, as merge by merge. */
static int tok_load_merges(Tokenizer *t, const TokBpeText *bt, Err *e) {
    size_t nm = bt->n_merges;
    t->bpe.merge_cap = 16;
    while (t->bpe.merge_cap < nm * 2) t->bpe.merge_cap <<= 1;
    t->bpe.merges = xcalloc(t->bpe.merge_cap, sizeof *t->bpe.merges);
    size_t cap = 1 << 16;
    char *joined = xmalloc(cap); /* the batch's joins, one after another */
    StrKey keys[MERGE_BATCH][3]; /* a, b, a + b */
    uint32_t ids[MERGE_BATCH][3];
    int rc = 0;
    for (size_t i0 = 0; i0 < nm && !rc; i0 += MERGE_BATCH) {
        size_t nb = nm - i0 < MERGE_BATCH ? nm - i0 : MERGE_BATCH, good = 0, need = 0;
        for (; good < nb; good++) { /* the batch up to its first malformed merge */
            const TokMerge *g = &bt->merges[i0 + good];
            if (!g->a || !g->b || g->la + g->lb >= (1 << 16)) break;
            need += g->la + g->lb;
        }
        if (need > cap) {
            free(joined);
            joined = xmalloc(cap = need);
        }
        char *p = joined;
        for (size_t j = 0; j < good; j++) {
            const TokMerge *g = &bt->merges[i0 + j];
            memcpy(p, g->a, g->la);
            memcpy(p + g->la, g->b, g->lb);
            keys[j][0] = strmap_key(g->a, g->la);
            keys[j][1] = strmap_key(g->b, g->lb);
            keys[j][2] = strmap_key(p, g->la + g->lb);
            p += g->la + g->lb;
            for (int k = 0; k < 3; k++) strmap_prefetch(&t->str_to_id, keys[j][k]);
        }
        size_t found = 0;
        for (; found < good; found++) {
            int k = 0;
            while (k < 3 && strmap_get_key(&t->str_to_id, keys[found][k], &ids[found][k])) k++;
            if (k < 3) break;
            bpe_merge_prefetch(&t->bpe, (int32_t)ids[found][0], (int32_t)ids[found][1]);
        }
        for (size_t j = 0; j < found; j++)
            bpe_merge_put(&t->bpe, (int32_t)ids[j][0], (int32_t)ids[j][1], (uint32_t)(i0 + j), (int32_t)ids[j][2]);
        if (found == nb) continue;
        const TokMerge *g = &bt->merges[i0 + found]; /* the first bad one: its lookup failed, or found == good */
        if (found < good)
            rc = ERR(e, 400, "merge %zu (%.*s %.*s): token not in vocab", i0 + found, (int)g->la, g->a, (int)g->lb, g->b);
        else if (!g->a)
            rc = ERR(e, 400, "merge %zu is neither \"a b\" nor [a, b]", i0 + found);
        else if (!g->b)
            rc = ERR(e, 400, "merge %zu (%s) is not \"a b\"", i0 + found, g->a);
        else
            rc = ERR(e, 400, "merge %zu too long", i0 + found);
    }
    free(joined);
    return rc;
}

static int tok_load_vocab(Tokenizer *t, const TokBpeText *bt, Err *e) {
    size_t nv = bt->n_vocab;
    strmap_init(&t->bpe.vocab, nv);
    strmap_init(&t->str_to_id, nv + 1024);
    int32_t *ids = xmalloc((nv + 1) * sizeof *ids);
    bool *bytelevel = xmalloc(nv + 1); /* entry i's string is ByteLevel's alphabet (and < 1024 bytes) */
    int rc = 0;
    for (size_t i = 0; i < nv && !rc; i++) { /* every id's strings, then the maps */
        const char *key = bt->vocab[i].key;
        int32_t id = ids[i] = (int32_t)bt->vocab[i].id;
        if (t->tok_str[id]) rc = ERR(e, 400, "vocab: tokens %s and %s share the id %d", t->tok_str[id], key, id);
        else bytelevel[i] = set_id_string(t, id, key) && bt->vocab[i].len < 1024;
    }
    /* a key twice: only where tok_json.c read the vocab (jansson keeps the last of equal keys); the
     * caller then reads the file with jansson, which decides */
    size_t twice = rc ? nv : vocab_put_all(t, &t->str_to_id, ids, nv, false);
    if (twice < nv) rc = ERR(e, 400, "vocab: token %s twice", bt->vocab[twice].key);
    if (!rc) {
        for (size_t i = 0; i < nv; i++)
            if (!bytelevel[i]) ids[i] = -1;
        vocab_put_all(t, &t->bpe.vocab, ids, nv, true); /* an overwrite here: a later id of the same bytes wins, as before */
    }
    free(bytelevel);
    free(ids);
    if (rc) return rc;
    for (int b = 0; b < 256; b++) {
        char s[8];
        int k = utf8_encode(bytelevel_char((uint8_t)b), s);
        uint32_t id;
        if (!strmap_get(&t->str_to_id, s, (size_t)k, &id))
            return ERR(e, 400, "byte-level vocab lacks the token of byte 0x%02x", b);
        t->bpe.byte_id[b] = (int32_t)id;
    }
    return tok_load_merges(t, bt, e);
}

static int tok_load_added(Tokenizer *t, json_t *added, Err *e) {
    json_t *v;
    size_t i;
    t->n_added = (int)json_array_size(added);
    t->added = xcalloc((size_t)t->n_added + 1, sizeof *t->added);
    int32_t max_added = -1;
    json_array_foreach(added, i, v) {
        AddedTok *a = &t->added[i];
        const char *c = jstr(v, "content");
        /* AddedVocabulary::add_tokens: the id of the same content if known,
         * else the next id after the model vocab and earlier added tokens
         * (the "id" in the file only draws a warning there when it differs). */
        uint32_t known_id;
        bool known = strmap_get(&t->str_to_id, c, strlen(c), &known_id);
        if (known) a->id = (int32_t)known_id;
        else a->id = max_added >= t->model_vocab_size || t->model_vocab_size == 0 ? max_added + 1 : t->model_vocab_size;
        if (a->id > max_added) max_added = a->id;
        if (a->id >= t->n_ids) t->n_ids = a->id + 1;
        a->special = jbool(v, "special");
        a->lstrip = jbool(v, "lstrip");
        a->rstrip = jbool(v, "rstrip");
        a->normalized = jbool(v, "normalized");
        a->single_word = jbool(v, "single_word");
        t->is_added[a->id] = 1;
        t->is_special[a->id] = a->special;
        if (a->normalized) {
            a->content = normalize_str(t, c, strlen(c), &a->len);
            trie_add(&t->trie_norm, a->content, a->len, (int32_t)i);
            t->has_norm_added = true;
            /* `tokenizers` shows and decodes a normalized token by its normalized text */
            if (!t->tok_str[a->id]) set_id_string(t, a->id, a->content);
        } else {
            if (!t->tok_str[a->id]) set_id_string(t, a->id, c);
            a->content = xstrdup(c);
            a->len = strlen(c);
            trie_add(&t->trie_raw, a->content, a->len, (int32_t)i);
        }
        a->orig = xstrdup(c);
        if (!known) strmap_put(&t->str_to_id, a->orig, strlen(c), (uint32_t)a->id);
    }
    return 0;
}

/* A special token entry of tokenizer_config.json: "text" or {"content": "text"}. */
static char *cfg_token(json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? xstrdup(json_string_value(v)) : NULL;
}

static int tok_load_config(Tokenizer *t, json_t *cfg, Err *e) {
    t->bos = cfg_token(cfg, "bos_token");
    t->eos = cfg_token(cfg, "eos_token");
    t->pad = cfg_token(cfg, "pad_token");
    t->unk = cfg_token(cfg, "unk_token");
    t->bos_id = t->bos ? tokenizer_token_to_id(t, t->bos) : -1;
    t->eos_id = t->eos ? tokenizer_token_to_id(t, t->eos) : -1;
    t->pad_id = t->pad ? tokenizer_token_to_id(t, t->pad) : -1;
    if (json_is_true(json_object_get(cfg, "split_special_tokens")))
        return ERR(e, 400, "unsupported tokenizer_config split_special_tokens=true");
    json_t *ct = json_object_get(cfg, "chat_template"), *v;
    const char *src = NULL;
    size_t i;
    if (json_is_string(ct)) src = json_string_value(ct);
    else if (json_is_array(ct)) {
        json_array_foreach(ct, i, v)
            if (jstr(v, "name") && !strcmp(jstr(v, "name"), "default")) src = jstr(v, "template");
        if (!src) return ERR(e, 400, "tokenizer_config chat_template list has no \"default\" template");
    }
    if (src) {
        Err ce = {0};
        t->chat = chat_template_compile(src, &ce);
        if (!t->chat) return ERR(e, 400, "chat_template: %s", ce.msg);
    }
    return 0;
}

/* The Tokenizer of a parsed tokenizer.json (root, with its vocab and merges
 * in bt) and tokenizer_config.json (cfg, or NULL); NULL with e set. */
static Tokenizer *load_root(json_t *root, const TokBpeText *bt, json_t *cfg, Err *e) {
    Tokenizer *t = xcalloc(1, sizeof *t);
    t->bos_id = t->eos_id = t->pad_id = -1;
    trie_init(&t->trie_raw);
    trie_init(&t->trie_norm);
    int rc = 0;
    json_t *model = json_object_get(root, "model"), *added = json_object_get(root, "added_tokens"), *v;
    size_t i;
    bool seen_bl = false;
    json_t *trunc = json_object_get(root, "truncation"), *pad = json_object_get(root, "padding");
    if (trunc && !json_is_null(trunc)) { rc = ERR(e, 400, "unsupported truncation (must be null)"); goto done; }
    if (pad && !json_is_null(pad)) { rc = ERR(e, 400, "unsupported padding (must be null)"); goto done; }
    if ((rc = load_model(t, model, bt, e))) goto done;
    json_array_foreach(added, i, v) {
        json_int_t id = json_integer_value(json_object_get(v, "id"));
        if (id < 0 || id > 0x7fffffff || !jstr(v, "content")) { rc = ERR(e, 400, "added token %zu: bad id or content", i); goto done; }
    }
    /* Added tokens get ids as `tokenizers` assigns them (see tok_load_added):
     * at most one new id each, after the model vocab. */
    t->model_vocab_size = (int32_t)bt->n_vocab;
    if (t->n_ids < t->model_vocab_size) t->n_ids = t->model_vocab_size;
    size_t n_alloc = (size_t)t->n_ids + json_array_size(added) + 1;
    t->tok_str = xcalloc(n_alloc, sizeof *t->tok_str);
    t->tok_bytes = xcalloc(n_alloc, sizeof *t->tok_bytes);
    t->tok_bytes_len = xcalloc(n_alloc, sizeof *t->tok_bytes_len);
    t->is_special = xcalloc(n_alloc, 1);
    t->is_added = xcalloc(n_alloc, 1);
    if ((rc = load_normalizer(t, json_object_get(root, "normalizer"), e))) goto done;
    if ((rc = load_pretok(t, json_object_get(root, "pre_tokenizer"), &seen_bl, e))) goto done;
    if (!seen_bl) { rc = ERR(e, 400, "a ByteLevel pre_tokenizer is required (byte-level BPE only)"); goto done; }
    if ((rc = load_post(t, json_object_get(root, "post_processor"), e))) goto done;
    if ((rc = load_decoder(json_object_get(root, "decoder"), e))) goto done;
    if ((rc = tok_load_vocab(t, bt, e))) goto done;
    t->bpe.whole = xcalloc((size_t)t->n_ids, 1);
    rc = tok_load_added(t, added, e);
    if (rc) goto done;
    if (cfg) rc = tok_load_config(t, cfg, e);
    strmap_freeze(&t->str_to_id); /* shared by every tokenizing thread from here on */
    strmap_freeze(&t->bpe.vocab);
done:
    if (rc) { tokenizer_free(t); return NULL; }
    return t;
}

Tokenizer *tokenizer_load_json(const char *tokenizer_json, size_t len, const char *config_json, Err *e) {
    json_error_t je;
    json_t *cfg = NULL;
    if (config_json && !(cfg = json_loads(config_json, JSON_DECODE_INT_AS_REAL, &je))) {
        json_error_t te;
        json_t *root = json_loadb(tokenizer_json, len, 0, &te); /* tokenizer.json's own error comes first */
        if (root) ERR(e, 400, "tokenizer_config.json: %s at line %d", je.text, je.line);
        else ERR(e, 400, "tokenizer.json: %s at line %d", te.text, te.line);
        json_decref(root);
        return NULL;
    }
    Tokenizer *t = NULL;
    TokBpeText bt;
    char *rest;
    size_t rest_len;
    /* vocab and merges straight from the text, the rest through jansson. Any
     * doubt (tok_json.c) or any error, and the whole file goes through
     * jansson: what it loads, and every error message, are jansson's. */
    if (tok_json_read_bpe(tokenizer_json, len, &bt, &rest, &rest_len)) {
        json_t *root = json_loadb(rest, rest_len, 0, &je);
        free(rest);
        Err fe = {0};
        if (root) t = load_root(root, &bt, cfg, &fe);
        tok_bpe_text_free(&bt);
        json_decref(root);
        if (t) {
            json_decref(cfg);
            return t;
        }
    }
    json_t *root = json_loadb(tokenizer_json, len, 0, &je);
    if (!root) {
        json_decref(cfg);
        ERR(e, 400, "tokenizer.json: %s at line %d", je.text, je.line);
        return NULL;
    }
    bpe_text_from_json(json_object_get(root, "model"), &bt);
    t = load_root(root, &bt, cfg, e);
    tok_bpe_text_free(&bt);
    json_decref(root);
    json_decref(cfg);
    return t;
}
