/*
 * tok_maps.c - the tokenizer's hash tables: string -> id (token text -> id,
 * token bytes -> id; open addressing on XXH3) and BPE's merge table (id pair
 * -> rank and merged id). Filled once while the tokenizer loads and
 * read-only after (strmap_freeze; a put after it is a bug and asserts), so
 * any number of threads read them without a lock.
 *
 * Layout, for the load (~300,000 puts and ~450,000 gets for Qwen3, most of a
 * server's start-up): a slot holds the entry index and the hash's high 32
 * bits, so a probe reads an entry only when the tags agree; an entry holds
 * key, length and value together, so a hit costs a slot, an entry and the
 * key's bytes (three cache misses, not five). The load knows its next keys:
 * it makes them ahead (strmap_key: the key with its hash) and prefetches
 * their slots, so that the misses on tables of megabytes overlap instead of
 * each stalling the load in turn (tokenizer_load.c).
 *
 * Not here: the merge loop (bpe.c), tries of added tokens (added.c).
 */
#include <stdlib.h>

#include <xxhash.h>

#include "tok_internal.h"

void strmap_init(StrMap *m, size_t expect) {
    memset(m, 0, sizeof *m);
    m->cap = 16;
    while (m->cap < expect * 2) m->cap <<= 1;
    m->slots = xcalloc(m->cap, sizeof *m->slots);
    m->nalloc = expect > 64 ? expect : 64;
    m->ents = xmalloc(m->nalloc * sizeof *m->ents);
}

void strmap_free(StrMap *m) {
    free(m->slots);
    free(m->ents);
    memset(m, 0, sizeof *m);
}

void strmap_freeze(StrMap *m) { m->frozen = true; }

StrKey strmap_key(const char *s, size_t len) { return (StrKey){s, len, XXH3_64bits(s, len)}; }

void strmap_prefetch(const StrMap *m, StrKey k) { __builtin_prefetch(&m->slots[k.h & (m->cap - 1)]); }

/* a == b over len bytes, inline: a token is a few bytes, shorter than a call
 * to memcmp (and under TSan, than its interceptor: tests/run.sh) */
static inline bool key_eq(const char *a, const char *b, size_t len) {
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t x, y;
        memcpy(&x, a + i, 8);
        memcpy(&y, b + i, 8);
        if (x != y) return false;
    }
    for (; i < len; i++)
        if (a[i] != b[i]) return false;
    return true;
}

/* The slot holding key, or the empty slot where it would go. */
static size_t strmap_find(const StrMap *m, const char *key, size_t len, uint64_t h) {
    size_t mask = m->cap - 1, i = h & mask;
    uint32_t tag = (uint32_t)(h >> 32);
    for (;; i = (i + 1) & mask) {
        uint64_t s = m->slots[i];
        uint32_t e = (uint32_t)s;
        if (!e) return i;
        const StrMapEntry *x = &m->ents[e - 1];
        if ((uint32_t)(s >> 32) == tag && x->len == len && key_eq(x->key, key, len)) return i;
    }
}

static void strmap_grow(StrMap *m) {
    uint64_t *old = m->slots;
    size_t oc = m->cap;
    m->cap *= 2;
    m->slots = xcalloc(m->cap, sizeof *m->slots);
    for (size_t i = 0; i < oc; i++) {
        uint32_t e = (uint32_t)old[i];
        if (!e) continue;
        const StrMapEntry *x = &m->ents[e - 1];
        m->slots[strmap_find(m, x->key, x->len, strmap_key(x->key, x->len).h)] = old[i];
    }
    free(old);
}

bool strmap_put(StrMap *m, const char *key, size_t len, uint32_t val) {
    return strmap_put_key(m, strmap_key(key, len), val);
}

bool strmap_put_key(StrMap *m, StrKey k, uint32_t val) {
    ASSERT(!m->frozen, "strmap_put after strmap_freeze: the maps are read-only once the tokenizer is loaded");
    if ((m->n + 1) * 2 > m->cap) strmap_grow(m);
    size_t i = strmap_find(m, k.s, k.len, k.h);
    if (m->slots[i]) { m->ents[(uint32_t)m->slots[i] - 1].val = val; return false; }
    if (m->n == m->nalloc) {
        m->nalloc *= 2;
        m->ents = realloc(m->ents, m->nalloc * sizeof *m->ents);
        CHECK(m->ents, "out of memory growing a token map");
    }
    m->ents[m->n] = (StrMapEntry){k.s, (uint32_t)k.len, val};
    m->slots[i] = (k.h >> 32) << 32 | (uint32_t)++m->n;
    return true;
}

bool strmap_get(const StrMap *m, const char *key, size_t len, uint32_t *val) {
    return strmap_get_key(m, strmap_key(key, len), val);
}

bool strmap_get_key(const StrMap *m, StrKey k, uint32_t *val) {
    uint32_t e = (uint32_t)m->slots[strmap_find(m, k.s, k.len, k.h)];
    if (!e) return false;
    *val = m->ents[e - 1].val;
    return true;
}

/* ---- merges ---- */

static inline size_t merge_hash(uint64_t k, size_t cap) {
    return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);
}

bool bpe_merge_get(const Bpe *b, int32_t a, int32_t c, uint32_t *rank, int32_t *new_id) {
    uint64_t k = (((uint64_t)(uint32_t)a << 32) | (uint32_t)c) + 1;
    for (size_t i = merge_hash(k, b->merge_cap);; i = (i + 1) & (b->merge_cap - 1)) {
        const MergeSlot *s = &b->merges[i];
        if (s->key == k) { *rank = s->rank; *new_id = s->new_id; return true; }
        if (!s->key) return false;
    }
}

void bpe_merge_prefetch(const Bpe *b, int32_t a, int32_t c) {
    __builtin_prefetch(&b->merges[merge_hash((((uint64_t)(uint32_t)a << 32) | (uint32_t)c) + 1, b->merge_cap)]);
}

/* Later duplicates overwrite earlier ones, as HF's HashMap collect does. */
void bpe_merge_put(Bpe *b, int32_t a, int32_t c, uint32_t rank, int32_t new_id) {
    ASSERT(!b->whole, "bpe_merge_put after the load (Bpe.whole is allocated once the merges are in)");
    uint64_t k = (((uint64_t)(uint32_t)a << 32) | (uint32_t)c) + 1;
    for (size_t i = merge_hash(k, b->merge_cap);; i = (i + 1) & (b->merge_cap - 1)) {
        MergeSlot *s = &b->merges[i];
        if (!s->key || s->key == k) { s->key = k; s->rank = rank; s->new_id = new_id; return; }
    }
}
