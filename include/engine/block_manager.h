/*
 * block_manager.h - the paged KV cache's bookkeeping: a fixed pool of blocks
 * (allocated once), reference counts, and the prefix cache.
 *
 * A block holds block_size consecutive positions of one sequence's K/V. A
 * sequence owns a block table (list of block ids); blocks are shared by
 * reference counting: n samples of one prompt share the prompt's full blocks,
 * and a new request reuses cached full blocks of a matching prefix.
 *
 * Prefix cache: a FULL block whose K/V were computed under weight version W
 * can be registered under the key
 *     key = hash(parent key, W, its block_size token ids)
 * where the parent key is the key of the previous block of the same sequence
 * (for the first block: the request's cache salt digest, 0 when unsalted).
 * The chain makes a key identify the whole prefix, and the salt, up to and
 * including the block. Lookups compare the stored parent, version
 * and token ids, never only the 64-bit hash. A registered block whose
 * reference count drops to 0 is not freed but becomes "cached": it sits in an
 * LRU list and can be revived by a lookup, or evicted (least recently
 * released first) when a fresh block is needed and the free list is empty.
 * block_manager_invalidate (after a weight update) forgets every key:
 * unreferenced cached blocks return to the free list, referenced ones stay
 * with their sequences but can no longer be found.
 *
 * Not here: the K/V memory (model.h KVCache), which sequence owns what (engine).
 * Single-threaded: only the engine thread calls it.
 */
#ifndef SAMPLER_BLOCK_MANAGER_H
#define SAMPLER_BLOCK_MANAGER_H

#include <stdint.h>

typedef struct BlockManager BlockManager;

/* Start-up path. enable_prefix_cache 0: register/lookup do nothing. */
BlockManager *block_manager_create(int n_blocks, int block_size, int enable_prefix_cache);
void block_manager_free(BlockManager *bm);

int block_manager_n_blocks(const BlockManager *bm);
int block_manager_block_size(const BlockManager *bm);
/* Blocks a caller can get now: free + evictable cached. */
int block_manager_n_available(const BlockManager *bm);
/* Blocks with a reference. */
int block_manager_n_used(const BlockManager *bm);
/* Unreferenced blocks kept for the prefix cache. */
int block_manager_n_cached(const BlockManager *bm);

/* A fresh, unregistered block with reference count 1 (evicting the least
 * recently released cached block if no free one is left), or -1 if every
 * block is referenced. */
int32_t block_manager_alloc(BlockManager *bm);
void block_manager_ref(BlockManager *bm, int32_t id);
/* Drop one reference; at 0 the block is cached (if registered) or freed. */
void block_manager_unref(BlockManager *bm, int32_t id);
int block_manager_refcount(const BlockManager *bm, int32_t id);

/* The chained key of a full block: tokens [block_size]. */
uint64_t block_manager_key(const BlockManager *bm, uint64_t parent, uint64_t version,
                           const int32_t *tokens);
/* Find a registered block with exactly this (parent, version, tokens); on a
 * hit take a reference (reviving it from the LRU list) and return its id,
 * else -1. Counts queries/hits. */
int32_t block_manager_lookup(BlockManager *bm, uint64_t key, uint64_t parent, uint64_t version,
                             const int32_t *tokens);
/* Register a full, referenced block under its key. Returns 1 if registered,
 * 0 if an equal block is already registered (this one stays anonymous), the
 * cache is disabled, or the block is already registered. */
int block_manager_register(BlockManager *bm, int32_t id, uint64_t key, uint64_t parent,
                           uint64_t version, const int32_t *tokens);
/* Forget every key (weight update). */
void block_manager_invalidate(BlockManager *bm);

typedef struct BlockStats {
    uint64_t lookups, hits, evictions, registered;
} BlockStats;
void block_manager_stats(const BlockManager *bm, BlockStats *out);

#endif
