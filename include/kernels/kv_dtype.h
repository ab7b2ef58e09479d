/*
 * kv_dtype.h - the element types of the paged KV cache (vLLM's
 * --kv-cache-dtype) and the one layout every backend reads and writes.
 *
 * Layout, per layer: K and V each [n_blocks, n_kv_heads, block_size, head_dim]
 * of the element type, so the positions of one (block, kv head) are
 * contiguous: attention over one head streams memory instead of striding by
 * n_kv_heads * head_dim (issue #23: the prefetcher). FP8 adds one f32 scale
 * per (position, kv head): [n_blocks, n_kv_heads, block_size], the value being
 * e4m3_to_f32(q) * scale.
 *
 * Storing a K/V row x [head_dim] f32 (the contract kv_write implements on
 * every backend, bit for bit):
 *   KV_F32   x as is
 *   KV_BF16  f32_to_bf16(x[d]) (round to nearest even, dtype.h)
 *   KV_FP8   s = max_d |x[d]| / 448 (0 -> 1.0), q[d] = quant_f32_to_e4m3(x[d] / s)
 *            (f32 division, one saturating rounding; quant.h), scale = s
 * Reading: bf16_to_f32 / e4m3_to_f32(q) * s (one f32 multiply), exact as stated.
 * Not here: the pool sizing (engine.c uses kv_dtype_bytes_per_pos) or
 * anything about scales calibrated offline (vLLM's per-tensor k_scale/v_scale:
 * our checkpoints carry none, README's differences table).
 */
#ifndef SAMPLER_KV_DTYPE_H
#define SAMPLER_KV_DTYPE_H

#include <stddef.h>
#include <string.h>

typedef enum { KV_F32 = 0, KV_BF16 = 1, KV_FP8 = 2, KV_DTYPE_COUNT } KvDtype;

#define KV_FP8_MAX 448.0f

/* Bytes of one element. */
static inline size_t kv_dtype_elem(KvDtype t) { return t == KV_F32 ? 4 : t == KV_BF16 ? 2 : 1; }

/* Bytes one position of one layer takes in K and V together (scales included). */
static inline size_t kv_dtype_bytes_per_pos(KvDtype t, int n_kv_heads, int head_dim) {
    size_t per_head = kv_dtype_elem(t) * (size_t)head_dim + (t == KV_FP8 ? sizeof(float) : 0);
    return 2 * per_head * (size_t)n_kv_heads;
}

/* The name --kv-cache-dtype prints ("float32", "bfloat16", "fp8_e4m3"). */
static inline const char *kv_dtype_name(KvDtype t) {
    return t == KV_F32 ? "float32" : t == KV_BF16 ? "bfloat16" : t == KV_FP8 ? "fp8_e4m3" : "?";
}

#endif
