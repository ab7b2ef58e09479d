/*
 * timed_backend.h - the CPU engine backend (Runner + KVCache of model.h)
 * with the model's forward time counted, so /metrics and bench/ can tell the
 * share of time spent outside the model (HTTP, JSON, tokenizer, scheduler).
 *
 * Not here: the engine's own CPU backend (engine_create), which it mirrors.
 */
#ifndef SAMPLER_TIMED_BACKEND_H
#define SAMPLER_TIMED_BACKEND_H

#include <stdatomic.h>

#include "engine.h"

/* Resolve cfg's n_blocks (from kv_mem_mb) and max_model_len as
 * engine_create would, create the runner and cache (start-up path), and
 * return a backend that adds each forward's nanoseconds to *ns and counts
 * *calls. */
EngineBackend timed_backend_create(Model *m, EngineConfig *cfg, atomic_ullong *ns, atomic_ullong *calls);
void timed_backend_free(EngineBackend *be);

#endif
