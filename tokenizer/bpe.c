/*
 * bpe.c - the BPE model's merge loop: `tokenizers`'
 * Word::merge_all (lowest rank first, leftmost on ties). Works on raw bytes:
 * the byte-level alphabet is undone at load.
 * Not here: splitting text into words (pretok.c), the tables it reads (tok_maps.c).
 */
#include <stdlib.h>

#include "tok_internal.h"

/* ---- the merge loop ---- */

struct BpeSym { int32_t id, prev, next; };
struct BpeHeapEnt { uint32_t rank; int32_t pos, new_id; };

void bpe_scratch_free(BpeScratch *s) {
    free(s->sym);
    free(s->heap);
    memset(s, 0, sizeof *s);
}

static void push_id(TokIds *out, int32_t id) {
    if (out->n == out->cap) {
        out->cap = out->cap ? out->cap * 2 : 256;
        out->ids = realloc(out->ids, out->cap * sizeof *out->ids);
        CHECK(out->ids, "out of memory growing token ids");
    }
    out->ids[out->n++] = id;
}

static inline bool heap_less(const struct BpeHeapEnt *x, const struct BpeHeapEnt *y) {
    return x->rank != y->rank ? x->rank < y->rank : x->pos < y->pos;
}

static void heap_push(BpeScratch *s, size_t *n, struct BpeHeapEnt e) {
    if (*n == s->heap_cap) {
        s->heap_cap = s->heap_cap ? s->heap_cap * 2 : 256;
        s->heap = realloc(s->heap, s->heap_cap * sizeof *s->heap);
        CHECK(s->heap, "out of memory in BPE");
    }
    size_t i = (*n)++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&e, &s->heap[p])) break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = e;
}

static struct BpeHeapEnt heap_pop(BpeScratch *s, size_t *n) {
    struct BpeHeapEnt top = s->heap[0], last = s->heap[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&s->heap[c + 1], &s->heap[c])) c++;
        if (!heap_less(&s->heap[c], &last)) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (*n) s->heap[i] = last;
    return top;
}

/* Short words: repeatedly merge the lowest-rank pair, leftmost first. */
static void bpe_small(const Bpe *b, int32_t *ids, size_t n, TokIds *out) {
    uint32_t ranks[64];
    int32_t news[64];
    for (size_t i = 0; i + 1 < n; i++)
        if (!bpe_merge_get(b, ids[i], ids[i + 1], &ranks[i], &news[i])) ranks[i] = UINT32_MAX;
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (ranks[i] < ranks[best]) best = i;
        if (ranks[best] == UINT32_MAX) break;
        ids[best] = news[best];
        memmove(ids + best + 1, ids + best + 2, (n - best - 2) * sizeof *ids);
        memmove(ranks + best + 1, ranks + best + 2, (n - best - 2) * sizeof *ranks);
        memmove(news + best + 1, news + best + 2, (n - best - 2) * sizeof *news);
        n--;
        if (best > 0 && !bpe_merge_get(b, ids[best - 1], ids[best], &ranks[best - 1], &news[best - 1]))
            ranks[best - 1] = UINT32_MAX;
        if (best + 1 < n && !bpe_merge_get(b, ids[best], ids[best + 1], &ranks[best], &news[best]))
            ranks[best] = UINT32_MAX;
    }
    for (size_t i = 0; i < n; i++) push_id(out, ids[i]);
}

/* Long words: HF's priority queue over a linked list of symbols. */
static void bpe_large(const Bpe *b, const uint8_t *w, size_t n, BpeScratch *s, TokIds *out) {
    if (n > s->sym_cap) {
        s->sym_cap = n;
        s->sym = realloc(s->sym, n * sizeof *s->sym);
        CHECK(s->sym, "out of memory in BPE");
    }
    struct BpeSym *y = s->sym;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) y[i] = (struct BpeSym){b->byte_id[w[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1};
    for (size_t i = 0; i + 1 < n; i++) {
        uint32_t r; int32_t nid;
        if (bpe_merge_get(b, y[i].id, y[i + 1].id, &r, &nid))
            heap_push(s, &hn, (struct BpeHeapEnt){r, (int32_t)i, nid});
    }
    while (hn) {
        struct BpeHeapEnt top = heap_pop(s, &hn);
        struct BpeSym *cur = &y[top.pos];
        if (cur->id < 0 || cur->next < 0) continue;
        uint32_t r; int32_t nid;
        if (!bpe_merge_get(b, cur->id, y[cur->next].id, &r, &nid) || nid != top.new_id) continue;
        int32_t gone = cur->next;
        cur->id = nid;
        cur->next = y[gone].next;
        y[gone].id = -1;
        if (cur->next >= 0) y[cur->next].prev = top.pos;
        if (cur->prev >= 0 && bpe_merge_get(b, y[cur->prev].id, nid, &r, &nid))
            heap_push(s, &hn, (struct BpeHeapEnt){r, cur->prev, nid});
        if (cur->next >= 0 && bpe_merge_get(b, cur->id, y[cur->next].id, &r, &nid))
            heap_push(s, &hn, (struct BpeHeapEnt){r, top.pos, nid});
    }
    for (int32_t i = 0; i >= 0; i = y[i].next) push_id(out, y[i].id);
}

void bpe_word(const Bpe *b, const uint8_t *w, size_t n, BpeScratch *s, TokIds *out) {
    uint32_t id;
    if (n == 0) return;
    if (n == 1) { push_id(out, b->byte_id[w[0]]); return; }
    /* A word that is itself a token BPE reproduces needs no merging: exact,
     * since BPE is a function of the word's bytes. Whether it does is learnt
     * the first time the word is merged (b->whole). */
    bool in_vocab = strmap_get(&b->vocab, (const char *)w, n, &id);
    uint8_t known = 0;
    if (in_vocab) {
        if (b->ignore_merges) { push_id(out, (int32_t)id); return; }
        known = __atomic_load_n(&b->whole[id], __ATOMIC_RELAXED);
        if (known == 1) { push_id(out, (int32_t)id); return; }
    }
    size_t before = out->n;
    if (n <= 64) {
        int32_t ids[64];
        for (size_t i = 0; i < n; i++) ids[i] = b->byte_id[w[i]];
        bpe_small(b, ids, n, out);
    } else {
        bpe_large(b, w, n, s, out);
    }
    if (in_vocab && !known) {
        uint8_t whole = out->n == before + 1 && out->ids[before] == (int32_t)id ? 1 : 2;
        __atomic_store_n(&b->whole[id], whole, __ATOMIC_RELAXED);
    }
}
