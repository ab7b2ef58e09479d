/*
 * block_manager.c - fixed KV block pool with reference counts and a
 * hash-chained prefix cache with LRU eviction (block_manager.h).
 *
 * All state is a few arrays indexed by block id, allocated at creation: a
 * free stack, an intrusive doubly linked LRU list of unreferenced cached
 * blocks, and a chained hash table (bucket heads + per-block next links).
 * Every operation is O(1) except lookup/unhash (bucket chain) and invalidate.
 */
#include "block_manager.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "check.h"

struct BlockManager {
    int n, bs, enabled;
    int32_t *ref;       /* [n] reference counts */
    uint8_t *hashed;    /* [n] 1 while registered */
    uint64_t *key, *parent, *version; /* [n] registration */
    int32_t *tokens;    /* [n, bs] registered token ids */
    int32_t *hnext;     /* [n] next block in the bucket chain */
    int32_t *bucket;    /* [nbuckets] first block of the chain, -1 empty */
    uint64_t nbuckets;  /* power of two */
    int32_t *lprev, *lnext; /* [n] LRU links; head = least recently released */
    int32_t lru_head, lru_tail;
    int n_cached;
    int32_t *free_stack; /* [n] */
    int n_free;
    BlockStats st;
};

BlockManager *block_manager_create(int n_blocks, int block_size, int enable_prefix_cache) {
    CHECK(n_blocks > 0 && block_size > 0, "KV pool needs blocks > 0 and block size > 0 (got %d, %d)",
          n_blocks, block_size);
    BlockManager *bm = xcalloc(1, sizeof *bm);
    bm->n = n_blocks;
    bm->bs = block_size;
    bm->enabled = enable_prefix_cache;
    bm->ref = xcalloc(n_blocks, sizeof(int32_t));
    bm->hashed = xcalloc(n_blocks, 1);
    bm->key = xcalloc(n_blocks, sizeof(uint64_t));
    bm->parent = xcalloc(n_blocks, sizeof(uint64_t));
    bm->version = xcalloc(n_blocks, sizeof(uint64_t));
    bm->tokens = xcalloc((size_t)n_blocks * block_size, sizeof(int32_t));
    bm->hnext = xmalloc(n_blocks * sizeof(int32_t));
    bm->nbuckets = 1;
    while (bm->nbuckets < 2 * (uint64_t)n_blocks) bm->nbuckets <<= 1;
    bm->bucket = xmalloc(bm->nbuckets * sizeof(int32_t));
    for (uint64_t i = 0; i < bm->nbuckets; i++) bm->bucket[i] = -1;
    bm->lprev = xmalloc(n_blocks * sizeof(int32_t));
    bm->lnext = xmalloc(n_blocks * sizeof(int32_t));
    bm->lru_head = bm->lru_tail = -1;
    bm->free_stack = xmalloc(n_blocks * sizeof(int32_t));
    /* pop order 0, 1, 2, ...: deterministic block ids */
    for (int i = 0; i < n_blocks; i++) bm->free_stack[i] = n_blocks - 1 - i;
    bm->n_free = n_blocks;
    return bm;
}

void block_manager_free(BlockManager *bm) {
    if (!bm) return;
    free(bm->ref); free(bm->hashed); free(bm->key); free(bm->parent); free(bm->version);
    free(bm->tokens); free(bm->hnext); free(bm->bucket); free(bm->lprev); free(bm->lnext);
    free(bm->free_stack);
    free(bm);
}

int block_manager_n_blocks(const BlockManager *bm) { return bm->n; }
int block_manager_block_size(const BlockManager *bm) { return bm->bs; }
int block_manager_n_available(const BlockManager *bm) { return bm->n_free + bm->n_cached; }
int block_manager_n_used(const BlockManager *bm) { return bm->n - bm->n_free - bm->n_cached; }
int block_manager_n_cached(const BlockManager *bm) { return bm->n_cached; }
int block_manager_refcount(const BlockManager *bm, int32_t id) { return bm->ref[id]; }
void block_manager_stats(const BlockManager *bm, BlockStats *out) { *out = bm->st; }

static void lru_remove(BlockManager *bm, int32_t id) {
    int32_t p = bm->lprev[id], n = bm->lnext[id];
    if (p >= 0) bm->lnext[p] = n; else bm->lru_head = n;
    if (n >= 0) bm->lprev[n] = p; else bm->lru_tail = p;
    bm->n_cached--;
}

static void lru_push_tail(BlockManager *bm, int32_t id) {
    bm->lprev[id] = bm->lru_tail;
    bm->lnext[id] = -1;
    if (bm->lru_tail >= 0) bm->lnext[bm->lru_tail] = id; else bm->lru_head = id;
    bm->lru_tail = id;
    bm->n_cached++;
}

static void unhash(BlockManager *bm, int32_t id) {
    int32_t *pp = &bm->bucket[bm->key[id] & (bm->nbuckets - 1)];
    while (*pp != id) pp = &bm->hnext[*pp];
    *pp = bm->hnext[id];
    bm->hashed[id] = 0;
}

int32_t block_manager_alloc(BlockManager *bm) {
    int32_t id;
    if (bm->n_free > 0) id = bm->free_stack[--bm->n_free];
    else if (bm->lru_head >= 0) {
        id = bm->lru_head;
        lru_remove(bm, id);
        unhash(bm, id);
        bm->st.evictions++;
    } else return -1;
    ASSERT(bm->ref[id] == 0, "block %d handed out with %d references", id, bm->ref[id]);
    bm->ref[id] = 1;
    return id;
}

void block_manager_ref(BlockManager *bm, int32_t id) {
    ASSERT(bm->ref[id] > 0, "sharing block %d that nobody holds", id);
    bm->ref[id]++;
}

void block_manager_unref(BlockManager *bm, int32_t id) {
    ASSERT(bm->ref[id] > 0, "releasing block %d with %d references", id, bm->ref[id]);
    if (--bm->ref[id] > 0) return;
    if (bm->hashed[id]) lru_push_tail(bm, id);
    else bm->free_stack[bm->n_free++] = id;
}

uint64_t block_manager_key(const BlockManager *bm, uint64_t parent, uint64_t version,
                           const int32_t *tokens) {
    uint64_t seed = XXH3_64bits_withSeed(&version, sizeof version, parent);
    uint64_t h = XXH3_64bits_withSeed(tokens, (size_t)bm->bs * sizeof(int32_t), seed);
    return h ? h : 1; /* 0 is the "no parent" key */
}

static int same(const BlockManager *bm, int32_t id, uint64_t key, uint64_t parent, uint64_t version,
                const int32_t *tokens) {
    return bm->key[id] == key && bm->parent[id] == parent && bm->version[id] == version &&
           memcmp(bm->tokens + (size_t)id * bm->bs, tokens, (size_t)bm->bs * sizeof(int32_t)) == 0;
}

static int32_t find(const BlockManager *bm, uint64_t key, uint64_t parent, uint64_t version,
                    const int32_t *tokens) {
    for (int32_t id = bm->bucket[key & (bm->nbuckets - 1)]; id >= 0; id = bm->hnext[id])
        if (same(bm, id, key, parent, version, tokens)) return id;
    return -1;
}

int32_t block_manager_lookup(BlockManager *bm, uint64_t key, uint64_t parent, uint64_t version,
                             const int32_t *tokens) {
    if (!bm->enabled) return -1;
    bm->st.lookups++;
    int32_t id = find(bm, key, parent, version, tokens);
    if (id < 0) return -1;
    bm->st.hits++;
    if (bm->ref[id] == 0) lru_remove(bm, id);
    bm->ref[id]++;
    return id;
}

int block_manager_register(BlockManager *bm, int32_t id, uint64_t key, uint64_t parent,
                           uint64_t version, const int32_t *tokens) {
    if (!bm->enabled || bm->hashed[id] || find(bm, key, parent, version, tokens) >= 0) return 0;
    bm->key[id] = key;
    bm->parent[id] = parent;
    bm->version[id] = version;
    memcpy(bm->tokens + (size_t)id * bm->bs, tokens, (size_t)bm->bs * sizeof(int32_t));
    int32_t *head = &bm->bucket[key & (bm->nbuckets - 1)];
    bm->hnext[id] = *head;
    *head = id;
    bm->hashed[id] = 1;
    bm->st.registered++;
    return 1;
}

void block_manager_invalidate(BlockManager *bm) {
    for (uint64_t b = 0; b < bm->nbuckets; b++) bm->bucket[b] = -1;
    for (int32_t id = 0; id < bm->n; id++) {
        if (!bm->hashed[id]) continue;
        bm->hashed[id] = 0;
        if (bm->ref[id] == 0) {
            lru_remove(bm, id);
            bm->free_stack[bm->n_free++] = id;
        }
    }
}
