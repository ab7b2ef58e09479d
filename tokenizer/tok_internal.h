/*
 * tok_internal.h - the pieces of the tokenizer shared between its files:
 * UTF-8 helpers, the byte-level alphabet, the BPE model, the pre-tokenizer
 * pipeline and the added-token matcher. Not a public API (see tokenizer.h).
 */
#ifndef SAMPLER_TOK_INTERNAL_H
#define SAMPLER_TOK_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "check.h"
#include "tokenizer.h"

/* ---- UTF-8 (utf8.c) ---- */
/* Length of the valid UTF-8 sequence at s[0..n), or 0 if s starts with an
 * invalid or truncated sequence; *maximal gets the length of the maximal
 * subpart (>= 1) to replace by U+FFFD, and *truncated is set when the bytes
 * are a valid prefix cut by the end of the buffer. */
size_t utf8_seq(const uint8_t *s, size_t n, size_t *maximal, bool *truncated);
/* Python's bytes.decode("utf-8", "replace"): NULL if s is valid (no copy
 * needed), else a malloc'd repaired copy of length *out_len. */
char *utf8_repair(const char *s, size_t n, size_t *out_len); /* also NULL (noted in alloc_failures) when out of memory */
/* Decode one code point of valid UTF-8; returns its byte length. */
int utf8_decode(const uint8_t *s, int32_t *cp);
int utf8_encode(int32_t cp, char *out);

/* GPT-2 bytes_to_unicode: byte -> code point, and the inverse (-1 if none). */
int32_t bytelevel_char(uint8_t b);
int bytelevel_byte(int32_t cp);

/* ---- string -> id hash (tok_maps.c) ---- */
typedef struct StrMapEntry {
    const char *key; /* owner's arena; outlives the map */
    uint32_t len, val;
} StrMapEntry;
typedef struct StrMap {
    uint64_t *slots;   /* [cap] hash >> 32 << 32 | entry index + 1; 0 = empty */
    size_t cap;
    StrMapEntry *ents; /* [nalloc] the first n used, in insertion order */
    size_t n, nalloc;
    bool frozen;       /* read-only from here on: strmap_put asserts */
} StrMap;
void strmap_init(StrMap *m, size_t expect);
void strmap_free(StrMap *m);
/* Insert (true) or overwrite (false); key must outlive the map. */
bool strmap_put(StrMap *m, const char *key, size_t len, uint32_t val);
bool strmap_get(const StrMap *m, const char *key, size_t len, uint32_t *val);
/* A key with its hash (strmap_key makes it; the hash is the map's): a loop that knows its next
 * keys makes them ahead and prefetches their slots, then puts or gets them as above. */
typedef struct StrKey {
    const char *s; /* [len] bytes; for a put, the stored key (outlives the map) */
    size_t len;
    uint64_t h;    /* XXH3_64bits(s, len) */
} StrKey;
StrKey strmap_key(const char *s, size_t len);
void strmap_prefetch(const StrMap *m, StrKey k);
bool strmap_put_key(StrMap *m, StrKey k, uint32_t val);
bool strmap_get_key(const StrMap *m, StrKey k, uint32_t *val);
/* No put after this: the map is shared by every thread that tokenizes. */
void strmap_freeze(StrMap *m);

/* ---- BPE model (bpe.c) ---- */
typedef struct MergeSlot { uint64_t key; uint32_t rank; int32_t new_id; } MergeSlot;

typedef struct Bpe {
    StrMap vocab;          /* raw bytes of a token -> id */
    int32_t byte_id[256];  /* id of the one-byte token of each byte */
    MergeSlot *merges;     /* open addressing, key (a<<32|b)+1, 0 = empty */
    size_t merge_cap;
    bool ignore_merges;
    /* [n_ids] a cache: 1 if BPE of the token's own bytes gives just that token,
     * 2 if not, 0 not known yet. bpe_word fills it the first time it merges
     * the token's bytes as a word (a relaxed atomic store: threads encoding at
     * once store the same value), so loading runs no BPE over the vocab. */
    uint8_t *whole;
} Bpe;

/* the merge table (tok_maps.c): put at load only */
bool bpe_merge_get(const Bpe *b, int32_t a, int32_t c, uint32_t *rank, int32_t *new_id);
void bpe_merge_put(Bpe *b, int32_t a, int32_t c, uint32_t rank, int32_t new_id);
void bpe_merge_prefetch(const Bpe *b, int32_t a, int32_t c); /* its slot, ahead of the put */
/* Scratch reused across words of one encode call. */
typedef struct BpeScratch {
    struct BpeSym *sym; size_t sym_cap;
    struct BpeHeapEnt *heap; size_t heap_cap;
} BpeScratch;
void bpe_scratch_free(BpeScratch *s);
/* Append the ids of one pre-token word (raw bytes) to out. Safe from several
 * threads at once on one Bpe (each with its own scratch): it writes only the
 * whole[] cache, with atomics. */
void bpe_word(const Bpe *b, const uint8_t *w, size_t n, BpeScratch *s, TokIds *out);

/* ---- pre-tokenizer pipeline (pretok.c) ---- */
typedef enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS } SplitBehavior;
typedef enum { PRE_SPLIT, PRE_DIGITS, PRE_BYTELEVEL_REGEX } PreKind;
typedef struct PreStep {
    PreKind kind;
    pcre2_code *re;       /* PRE_SPLIT, PRE_BYTELEVEL_REGEX */
    SplitBehavior behavior;
    bool invert;
    bool individual_digits;
} PreStep;

typedef struct Span { uint32_t start, end; } Span;
typedef struct SpanVec { Span *v; size_t n, cap; } SpanVec;
void spanvec_push(SpanVec *s, uint32_t a, uint32_t b);

typedef struct PreScratch {
    SpanVec a, b, m;          /* pieces in/out, matches */
    uint8_t *is_match; size_t im_cap;
    pcre2_match_data *md;
    pcre2_jit_stack *jit;
} PreScratch;
void pre_scratch_free(PreScratch *s);
/* Compile a split regex written for Oniguruma (HF) as PCRE2 with JIT. */
pcre2_code *pretok_compile(const char *pattern, bool literal, Err *e);
/* Run steps on text[0..n) and leave the pieces in s->a. */
int pretok_run(const PreStep *steps, int n_steps, const char *text, size_t n, PreScratch *s, Err *e);

/* ---- added tokens (added.c) ---- */
typedef struct AddedTok {
    int32_t id;
    char *content; size_t len; /* matched text (normalized if .normalized) */
    char *orig;                /* content as written in tokenizer.json */
    bool special, lstrip, rstrip, normalized, single_word;
} AddedTok;

/* A byte trie over added-token contents, leftmost-longest matching. */
typedef struct Trie {
    int32_t (*next)[256]; /* [n_nodes][256] child node or 0 */
    int32_t *tok;         /* [n_nodes] AddedTok index or -1 */
    size_t n_nodes, cap;
    uint8_t first[256];   /* 1 if some token starts with this byte */
} Trie;
void trie_init(Trie *t);
void trie_free(Trie *t);
void trie_add(Trie *t, const char *s, size_t n, int32_t tok);

typedef struct AddedSplit { uint32_t start, end; int32_t tok; /* -1 = plain text */ } AddedSplit;
typedef struct AddedSplitVec { AddedSplit *v; size_t n, cap; } AddedSplitVec;
/* HF AddedVocabulary::find_matches over text[0..n) with trie (tokens toks). */
void added_split(const Trie *trie, const AddedTok *toks, const char *text, size_t n, AddedSplitVec *out);

/* ---- the tokenizer's strings: a bump arena freed whole (tokenizer_load.c) ---- */
typedef struct TokArenaChunk { struct TokArenaChunk *next; size_t used, cap; char data[]; } TokArenaChunk;
/* n bytes that live until tokenizer_free (no alignment: character data only) */
char *tok_arena_alloc(TokArenaChunk **arena, size_t n);
void tok_arena_free(TokArenaChunk **arena);

/* ---- model.vocab and model.merges as read (tok_json.c, or jansson's) ---- */
typedef struct TokVocabEntry {
    const char *key; /* the token string, NUL-terminated */
    uint32_t len;    /* its length */
    int64_t id;      /* -1 where the value is not an integer */
} TokVocabEntry;
typedef struct TokMerge {
    const char *a, *b; /* the two parts (not NUL-terminated: la, lb); a NULL: neither form,
                        * b NULL: a string without a space, whole in a */
    uint32_t la, lb;
} TokMerge;
typedef struct TokBpeText {
    char *arena;            /* decoded strings (tok_json.c), or NULL: they are jansson's */
    TokVocabEntry *vocab;   /* [n_vocab] in the file's order */
    size_t n_vocab;
    TokMerge *merges;       /* [n_merges] in rank order */
    size_t n_merges;
} TokBpeText;
/* Read model.vocab and model.merges straight from tokenizer.json s[0..n)
 * into bt, and the text less those two values ({} and [] in their place)
 * into *rest (malloc'd, NUL-terminated); false (nothing held) where it is not
 * sure to read them as jansson does: then read the file with jansson. The
 * vocab may hold a key twice (jansson keeps the last): the loader's map
 * finds that, and the file is then read with jansson too. */
bool tok_json_read_bpe(const char *s, size_t n, TokBpeText *bt, char **rest, size_t *rest_len);
void tok_bpe_text_free(TokBpeText *bt);

/* ---- the tokenizer ---- */
typedef enum { NORM_NONE, NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD } NormKind;

struct Tokenizer {
    Bpe bpe;
    int32_t n_ids;             /* vocab size incl. added */
    int32_t model_vocab_size;  /* entries in model.vocab */
    char **tok_str;            /* [n_ids] tokenizer.json strings, NULL for holes (in arena) */
    char **tok_bytes;          /* [n_ids] decoded bytes (ByteLevel decoder rule; in arena) */
    TokArenaChunk *arena;      /* tok_str and tok_bytes of every id: one allocation per MiB, not two per token */
    uint32_t *tok_bytes_len;   /* [n_ids] */
    uint8_t *is_special;       /* [n_ids] */
    uint8_t *is_added;         /* [n_ids] */
    StrMap str_to_id;          /* tok_str -> id (added tokens win) */
    size_t max_tok_bytes;

    NormKind norm[4]; int n_norm;
    PreStep pre[8]; int n_pre;
    AddedTok *added; int n_added;
    Trie trie_raw, trie_norm;  /* non-normalized / normalized added tokens */
    bool has_norm_added;

    int32_t prefix_ids[8], suffix_ids[8]; int n_prefix, n_suffix;

    char *bos, *eos, *pad, *unk;
    int32_t bos_id, eos_id, pad_id;
    ChatTemplate *chat;
};

/* Whole file, or the zstd-decompressed path.zst; NULL if neither exists (e->msg set on read errors). */
char *tok_read_file(const char *path, size_t *len, Err *e);
/* Apply the normalizers to s[0..n), as HF's do: malloc'd result (tokenizer.c). */
char *normalize_str(const Tokenizer *t, const char *s, size_t n, size_t *out_n);

/* ---- HF's Unicode for normalization (norm_hf_table.c, generated by
 * scripts/make_hf_unicode_table.py) ---- */
extern const char *const norm_hf_unicode_version;       /* the tables inside `tokenizers`: "9.0.0" */
extern const char *const norm_hf_table_unicode_version; /* the newest Unicode the table covers */
/* cp is unassigned in HF's Unicode, but a later version gives it a combining
 * class, a decomposition or a part in a composition: HF's NFC/NFD/NFKC/NFKD
 * leave it alone and nothing moves or composes across it. */
bool norm_hf_unassigned(int32_t cp);

#endif
