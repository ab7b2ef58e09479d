/*
 * kv_cpu.h - the CPU reference of the KV cache's element types (kv_dtype.h):
 * storing one f32 row in a cache and reading rows back as f32. The CPU
 * backend's kv_write and attention are built on these; the CUDA kernels are
 * checked against them (tests/gpu/op_checks.h). Not here: the layout's
 * indexing (callers pass row = (block * n_kv_heads + kv_head) * block_size + offset).
 */
#ifndef SAMPLER_KV_CPU_H
#define SAMPLER_KV_CPU_H

#include <stddef.h>

#include "kv_dtype.h"

/* Floats of the scratch a caller of cpu_kv_rows keeps on its stack: rows are
 * read at most KV_CPU_CHUNK / head_dim at a time (head_dim <= KV_CPU_CHUNK). */
#define KV_CPU_CHUNK 4096

/* cache row `row` (and scale[row] for KV_FP8) = x [hd] f32, rounded per kv_dtype.h. */
void cpu_kv_store_row(void *cache, float *scale, KvDtype t, size_t row, const float *x, int hd);
/* Rows [row0, row0 + m) as f32 [m, hd]: the cache itself for KV_F32, else
 * decoded into buf [m * hd] (m * hd <= KV_CPU_CHUNK) and buf returned. */
const float *cpu_kv_rows(float *buf, const void *cache, const float *scale, KvDtype t, size_t row0, int m, int hd);

#endif
