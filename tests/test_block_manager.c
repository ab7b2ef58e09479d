/*
 * test_block_manager.c - reference counts, sharing, prefix-cache hits along a
 * hash chain, LRU eviction order, weight-version invalidation, and a random
 * operation sequence checked against a naive model of the pool.
 */
#include <stdlib.h>
#include <string.h>

#include "block_manager.h"
#include "test.h"

#define BS 4

static uint64_t chain(BlockManager *bm, uint64_t parent, uint64_t ver, const int32_t *t) {
    return block_manager_key(bm, parent, ver, t);
}

static void test_refcounts(void) {
    BlockManager *bm = block_manager_create(4, BS, 1);
    int32_t a = block_manager_alloc(bm), b = block_manager_alloc(bm);
    T_ASSERT(a >= 0 && b >= 0 && a != b, "two distinct blocks");
    T_ASSERT(block_manager_n_used(bm) == 2 && block_manager_n_available(bm) == 2, "2 used 2 free");
    block_manager_ref(bm, a); /* shared by a second sequence */
    block_manager_unref(bm, a);
    T_ASSERT(block_manager_refcount(bm, a) == 1 && block_manager_n_used(bm) == 2, "still held once");
    block_manager_unref(bm, a);
    T_ASSERT(block_manager_n_available(bm) == 3 && block_manager_n_cached(bm) == 0,
             "unregistered block goes back to the free list");
    int32_t c = block_manager_alloc(bm), d = block_manager_alloc(bm), e = block_manager_alloc(bm);
    T_ASSERT(c >= 0 && d >= 0 && e >= 0 && block_manager_alloc(bm) == -1, "pool exhausted -> -1");
    block_manager_free(bm);
}

static void test_prefix_chain(void) {
    BlockManager *bm = block_manager_create(8, BS, 1);
    int32_t t0[BS] = { 1, 2, 3, 4 }, t1[BS] = { 5, 6, 7, 8 }, tx[BS] = { 5, 6, 7, 9 };
    int32_t b0 = block_manager_alloc(bm), b1 = block_manager_alloc(bm);
    uint64_t k0 = chain(bm, 0, 0, t0), k1 = chain(bm, k0, 0, t1);
    T_ASSERT(block_manager_register(bm, b0, k0, 0, 0, t0) == 1, "register b0");
    T_ASSERT(block_manager_register(bm, b1, k1, k0, 0, t1) == 1, "register b1");
    T_ASSERT(block_manager_register(bm, b1, k1, k0, 0, t1) == 0, "registering twice is a no-op");
    /* a second sequence with the same prefix hits both, sharing them */
    T_ASSERT(block_manager_lookup(bm, k0, 0, 0, t0) == b0, "hit block 0");
    T_ASSERT(block_manager_lookup(bm, k1, k0, 0, t1) == b1, "hit block 1");
    T_ASSERT(block_manager_refcount(bm, b0) == 2 && block_manager_refcount(bm, b1) == 2, "shared");
    /* same tokens after a different prefix: a different key, a miss */
    T_ASSERT(block_manager_lookup(bm, chain(bm, 0, 0, t1), 0, 0, t1) == -1, "block 1 alone misses");
    T_ASSERT(block_manager_lookup(bm, chain(bm, k0, 0, tx), k0, 0, tx) == -1, "different tokens miss");
    /* a forged key with the right hash but other tokens does not match */
    T_ASSERT(block_manager_lookup(bm, k1, k0, 0, tx) == -1, "tokens are compared, not only the hash");
    /* another weight version misses */
    T_ASSERT(block_manager_lookup(bm, chain(bm, 0, 1, t0), 0, 1, t0) == -1, "other version misses");
    /* release everything: blocks stay cached and can be revived */
    for (int i = 0; i < 2; i++) { block_manager_unref(bm, b0); block_manager_unref(bm, b1); }
    T_ASSERT(block_manager_n_cached(bm) == 2 && block_manager_n_used(bm) == 0, "2 cached, 0 used");
    T_ASSERT(block_manager_n_available(bm) == 8, "cached blocks count as available");
    T_ASSERT(block_manager_lookup(bm, k0, 0, 0, t0) == b0 && block_manager_n_cached(bm) == 1, "revived");
    block_manager_unref(bm, b0);
    /* invalidation: no more hits, cached blocks freed */
    block_manager_invalidate(bm);
    T_ASSERT(block_manager_n_cached(bm) == 0 && block_manager_n_available(bm) == 8, "invalidated");
    T_ASSERT(block_manager_lookup(bm, k0, 0, 0, t0) == -1, "no hit after invalidation");
    BlockStats st;
    block_manager_stats(bm, &st);
    T_ASSERT(st.hits == 3 && st.lookups == 8, "stats: %llu hits of %llu lookups",
             (unsigned long long)st.hits, (unsigned long long)st.lookups);
    block_manager_free(bm);
}

static void test_lru(void) {
    BlockManager *bm = block_manager_create(3, BS, 1);
    int32_t t[3][BS] = { { 1 }, { 2 }, { 3 } };
    int32_t id[3];
    uint64_t k[3];
    for (int i = 0; i < 3; i++) {
        id[i] = block_manager_alloc(bm);
        k[i] = chain(bm, 0, 0, t[i]);
        block_manager_register(bm, id[i], k[i], 0, 0, t[i]);
    }
    /* release in the order 1, 0, 2: LRU order */
    block_manager_unref(bm, id[1]);
    block_manager_unref(bm, id[0]);
    block_manager_unref(bm, id[2]);
    int32_t n0 = block_manager_alloc(bm);
    T_ASSERT(n0 == id[1], "first eviction takes the least recently released block");
    T_ASSERT(block_manager_lookup(bm, k[1], 0, 0, t[1]) == -1, "evicted block is gone from the cache");
    /* touching block 0 (revive + release) makes 2 the oldest */
    T_ASSERT(block_manager_lookup(bm, k[0], 0, 0, t[0]) == id[0], "hit 0");
    block_manager_unref(bm, id[0]);
    int32_t n1 = block_manager_alloc(bm);
    T_ASSERT(n1 == id[2], "then the next oldest");
    /* referenced registered blocks are never evicted */
    T_ASSERT(block_manager_lookup(bm, k[0], 0, 0, t[0]) == id[0], "hit 0 again");
    T_ASSERT(block_manager_alloc(bm) == -1, "nothing evictable while referenced");
    /* invalidating while referenced: the block stays with its owner, then frees */
    block_manager_invalidate(bm);
    T_ASSERT(block_manager_refcount(bm, id[0]) == 1, "owner keeps it");
    block_manager_unref(bm, id[0]);
    T_ASSERT(block_manager_n_cached(bm) == 0 && block_manager_n_available(bm) == 1, "freed, not cached");
    BlockStats st;
    block_manager_stats(bm, &st);
    T_ASSERT(st.evictions == 2, "2 evictions");
    block_manager_free(bm);
}

/* Random alloc/ref/unref/register/lookup/invalidate against a naive model. */
static void test_random(void) {
    enum { N = 16, OPS = 20000 };
    BlockManager *bm = block_manager_create(N, BS, 1);
    int ref[N] = { 0 }, reg[N] = { 0 }, tokv[N] = { 0 };
    unsigned s = 1;
    int bad = 0;
    for (int op = 0; op < OPS; op++) {
        s = s * 1103515245u + 12345u;
        int r = (s >> 16) % 100, i = (s >> 8) % N, v = (s >> 20) % 6;
        int32_t t[BS] = { v, v, v, v };
        uint64_t k = chain(bm, 0, 0, t);
        if (r < 30) {
            int32_t id = block_manager_alloc(bm);
            int can = 0, nfree = 0;
            for (int j = 0; j < N; j++) { can += ref[j] == 0; nfree += ref[j] == 0 && !reg[j]; }
            if (!can) bad += id != -1;
            else if (id < 0 || ref[id] != 0) bad++;
            else if (nfree > 0 && reg[id]) bad++; /* free blocks go before evicting cached ones */
            else { ref[id] = 1; reg[id] = 0; }
        } else if (r < 55) {
            if (ref[i] > 0) { block_manager_unref(bm, i); ref[i]--; }
        } else if (r < 65) {
            if (ref[i] > 0) { block_manager_ref(bm, i); ref[i]++; }
        } else if (r < 80) {
            if (ref[i] > 0) {
                int dup = 0;
                for (int j = 0; j < N; j++) dup |= reg[j] && tokv[j] == v;
                int got = block_manager_register(bm, i, k, 0, 0, t);
                if (got != (!reg[i] && !dup)) bad++;
                if (got) { reg[i] = 1; tokv[i] = v; }
            }
        } else if (r < 99) {
            int want = -1;
            for (int j = 0; j < N; j++) if (reg[j] && tokv[j] == v) want = j;
            int32_t id = block_manager_lookup(bm, k, 0, 0, t);
            if (id != want) bad++;
            if (id >= 0) ref[id]++;
        } else {
            block_manager_invalidate(bm);
            memset(reg, 0, sizeof reg);
        }
        int used = 0, cached = 0;
        for (int j = 0; j < N; j++) {
            used += ref[j] > 0;
            cached += ref[j] == 0 && reg[j];
            if (block_manager_refcount(bm, j) != ref[j]) bad++;
        }
        if (block_manager_n_used(bm) != used || block_manager_n_cached(bm) != cached) bad++;
    }
    T_ASSERT(bad == 0, "%d mismatches against the naive model", bad);
    block_manager_free(bm);
}

int main(void) {
    test_refcounts();
    test_prefix_chain();
    test_lru();
    test_random();
    return T_DONE();
}
