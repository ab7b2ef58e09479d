/*
 * timed_backend.c - CPU backend with forward-time accounting (timed_backend.h).
 */
#include "timed_backend.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct Timed {
    Runner *r;
    KVCache *kv;
    atomic_ullong *ns, *calls;
} Timed;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static int forward(void *ctx, const Batch *b, float *logits, Err *err) {
    Timed *t = ctx;
    uint64_t t0 = now_ns();
    int rc = model_forward(t->r, t->kv, b, logits, err);
    atomic_fetch_add(t->ns, now_ns() - t0);
    atomic_fetch_add(t->calls, 1);
    return rc;
}

static void copy_block(void *ctx, int src, int dst) {
    KVCache *kv = ((Timed *)ctx)->kv;
    size_t blk = (size_t)kv->block_size * kv->n_kv_heads * kv->head_dim;
    size_t layer = blk * (size_t)kv->n_blocks;
    for (int l = 0; l < kv->n_layers; l++) {
        memcpy(kv->k + l * layer + (size_t)dst * blk, kv->k + l * layer + (size_t)src * blk, blk * sizeof(float));
        memcpy(kv->v + l * layer + (size_t)dst * blk, kv->v + l * layer + (size_t)src * blk, blk * sizeof(float));
    }
}

static void set_capture(void *ctx, int32_t *experts) { runner_set_expert_capture(((Timed *)ctx)->r, experts); }

EngineBackend timed_backend_create(Model *m, EngineConfig *c, atomic_ullong *ns, atomic_ullong *calls) {
    size_t per_block = 2ull * m->cfg.n_layers * c->block_size * m->cfg.n_kv_heads * m->cfg.head_dim * sizeof(float);
    if (c->n_blocks <= 0) c->n_blocks = (int)((c->kv_mem_mb << 20) / per_block);
    CHECK(c->n_blocks > 0, "--kv-mem-mb %zu is less than one KV block (%zu bytes)", c->kv_mem_mb, per_block);
    int pool = c->n_blocks * c->block_size;
    if (c->max_model_len <= 0) {
        c->max_model_len = m->cfg.max_pos < 4096 ? m->cfg.max_pos : 4096;
        if (c->max_model_len > pool) c->max_model_len = pool;
    }
    CHECK(c->max_model_len >= 2 && c->max_model_len <= pool,
          "--max-model-len %d does not fit the KV pool of %d tokens: raise --kv-mem-mb or lower --max-model-len",
          c->max_model_len, pool);
    Timed *t = xcalloc(1, sizeof *t);
    t->r = runner_create(m, c->max_batched_tokens, c->max_model_len, c->n_threads);
    t->kv = kvcache_create(&m->cfg, c->n_blocks, c->block_size);
    t->ns = ns;
    t->calls = calls;
    return (EngineBackend){ t, forward, copy_block, set_capture };
}

void timed_backend_free(EngineBackend *be) {
    Timed *t = be->ctx;
    if (!t) return;
    runner_free(t->r);
    kvcache_free(t->kv);
    free(t);
    be->ctx = NULL;
}
