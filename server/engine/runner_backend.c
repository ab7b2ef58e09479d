/*
 * runner_backend.c - the engine backend over a Runner (runner_backend.h).
 */
#include "runner_backend.h"

#include <stdlib.h>
#include <time.h>

#include "dev_sample.h"
#include "log.h"

typedef struct RunnerBackend {
    Runner *r;
    KVCache *kv;
    atomic_ullong *ns, *calls; /* may be NULL */
    atomic_ullong *graphs;     /* [2] forwards through a whole-step graph, through piecewise graphs; or NULL */
    atomic_ullong *device_ns;  /* runner_device_seconds in ns, or NULL (runner_backend_count_device) */
} RunnerBackend;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static int forward(void *ctx, const Batch *b, float *logits, Err *err) {
    RunnerBackend *t = ctx;
    uint64_t t0 = t->ns ? now_ns() : 0;
    int rc = model_forward(t->r, t->kv, b, logits, err);
    if (t->ns) atomic_fetch_add(t->ns, now_ns() - t0);
    if (t->calls) atomic_fetch_add(t->calls, 1);
    int g = rc ? 0 : runner_last_graph(t->r);
    if (t->graphs && g) atomic_fetch_add(&t->graphs[g - 1], 1);
    return rc;
}

static void copy_block(void *ctx, int src, int dst) {
    RunnerBackend *t = ctx;
    runner_kv_copy_block(t->r, t->kv, src, dst);
}

static void set_capture(void *ctx, int32_t *experts) { runner_set_expert_capture(((RunnerBackend *)ctx)->r, experts); }

static void *host_alloc(void *ctx, size_t bytes) { return runner_host_alloc(((RunnerBackend *)ctx)->r, bytes); }
static void host_free(void *ctx, void *p) { runner_host_free(((RunnerBackend *)ctx)->r, p); }

static void set_lora(void *ctx, const int32_t *lora) { runner_set_lora_tokens(((RunnerBackend *)ctx)->r, lora); }

static int sample_launch(void *ctx, int n_out, const DevSampleBatch *b, int slot, Err *err) {
    return runner_sample_launch(((RunnerBackend *)ctx)->r, n_out, b, slot, err);
}

static int sample_wait(void *ctx, int slot, const DevSampleOut **out, const int32_t **packed, Err *err) {
    RunnerBackend *t = ctx;
    int rc = runner_sample_wait(t->r, slot, out, packed, err);
    double s = t->device_ns && rc == 0 ? runner_device_seconds(t->r) : -1;
    if (s >= 0) atomic_store(t->device_ns, (unsigned long long)(s * 1e9));
    return rc;
}

static void fetch_logits(void *ctx, float *logits, int n_out) {
    runner_fetch_logits(((RunnerBackend *)ctx)->r, logits, n_out);
}

EngineBackend runner_backend_create(Model *m, Runner *r, EngineConfig *c, atomic_ullong *ns, atomic_ullong *calls,
                                    atomic_ullong *graphs) {
    engine_config_resolve(c, &m->cfg);
    RunnerBackend *t = xcalloc(1, sizeof *t);
    t->r = r ? r : runner_create(m, c->max_batched_tokens, c->max_model_len, c->n_threads);
    t->kv = runner_kvcache_create_dtype(t->r, c->n_blocks, c->block_size, (KvDtype)c->kv_cache_dtype);
    t->ns = ns;
    t->calls = calls;
    t->graphs = graphs;
    EngineBackend be = {t, forward, copy_block, set_capture, set_lora, NULL, NULL, NULL, host_alloc, host_free};
    if (c->device_sampling != ENGINE_DEVSAMPLE_OFF) { /* a device backend with the op: reserve its caps */
        DevSampleCaps caps;
        Err err = {0};
        engine_devsample_caps(c, m->cfg.vocab, &caps);
        if (runner_sample_reserve(t->r, &caps, &err) == 0) {
            be.sample_launch = sample_launch;
            be.sample_wait = sample_wait;
            be.fetch_logits = fetch_logits;
        } else if (c->device_sampling == ENGINE_DEVSAMPLE_ON) {
            log_error("device sampling: %s", err.msg);
        }
    }
    return be;
}

void runner_backend_count_device(EngineBackend *be, atomic_ullong *device_ns) {
    ((RunnerBackend *)be->ctx)->device_ns = device_ns;
}

Runner *runner_backend_runner(const EngineBackend *be) { return ((RunnerBackend *)be->ctx)->r; }

void runner_backend_free(EngineBackend *be) {
    RunnerBackend *t = be->ctx;
    if (!t) return;
    runner_kvcache_free(t->r, t->kv);
    runner_free(t->r);
    free(t);
    be->ctx = NULL;
}
