/*
 * runner_backend.h - the engine's backend over a Runner (model.h) on any
 * device: forward steps, KV block copies and MoE expert capture, with the
 * model's forward time counted so /metrics and bench/ can tell the share of
 * time spent outside the model (HTTP, JSON, tokenizer, scheduler).
 *
 * An adapter above the engine: it implements EngineBackend (engine.h); the
 * engine never sees a Runner. The server (or a test) builds it and passes it
 * to engine_create, and frees it after engine_free.
 *
 * Not here: the device choice (device_select.h), the scheduler (engine.h).
 */
#ifndef SAMPLER_RUNNER_BACKEND_H
#define SAMPLER_RUNNER_BACKEND_H

#include <stdatomic.h>

#include "engine.h"

/* Start-up path. Resolves cfg's n_blocks (from kv_mem_mb) and max_model_len
 * (engine_config_resolve), creates a CPU runner when r is NULL (else takes
 * ownership of r), allocates the KV pool in the runner's backend memory, and
 * returns a backend that adds each forward's nanoseconds to *ns, counts
 * *calls, and counts in graphs[0] the forwards that ran through a whole-step
 * CUDA graph and in graphs[1] those that ran through piecewise graphs
 * (captured or replayed; model.h runner_last_graph).
 * Each may be NULL. */
EngineBackend runner_backend_create(Model *m, Runner *r, EngineConfig *cfg, atomic_ullong *ns,
                                    atomic_ullong *calls, atomic_ullong *graphs);
void runner_backend_free(EngineBackend *be);
/* From now on *device_ns holds the device time of the steps sampled on the
 * device (runner_device_seconds, in ns; set after each step's results
 * arrive), or stays 0 where the backend does not measure it. */
void runner_backend_count_device(EngineBackend *be, atomic_ullong *device_ns);
/* The runner a backend made by runner_backend_create drives. */
Runner *runner_backend_runner(const EngineBackend *be);

#endif
