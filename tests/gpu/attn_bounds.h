/*
 * attn_bounds.h - model-level bounds (max |logit difference|, KL nats) of the
 * GPU against the CPU backend at the same KV dtype, for steps whose attention
 * runs on the tensor cores: gpu_check.c's part 2 and emu_check.cpp's
 * t_attn_long, so the GPU and its emulation hold one standard.
 *
 * Why a class of its own: the prefill kernel (attention_mma.cu, BF16 / FP8
 * caches at head_dim 64 / 128, 16+ query tokens a sequence) rounds Q and the
 * softmax weights P to bf16 on the GPU side only (2^-9 relative on every
 * element, where the flip class of the bf16-activation matmuls is a handful of
 * elements), and with an FP8 cache the upstream differences then land on e4m3
 * rounding steps (2^-4) of the next layer's K / V. Measured on the emulation
 * (2026-12-04, qwen3_g8_hd128 / qwen3_hd64_g4, 66-token prefill): f32 cache
 * (CUDA cores, flip class) 4.0e-2 / 7.8e-5; BF16 6.7e-2 / 2.0e-4; FP8 1.33e-1 /
 * 8.9e-4. Decode steps that read a cache such a prefill wrote inherit it: 2.3e-3
 * / 2.9e-7, 1.5e-2 / 7.2e-6, 7.1e-2 / 2.6e-4. Bounds ~2x those. The decode
 * kernels themselves are f32-class (op_checks.h), so decode steps over a cache
 * the decode steps wrote keep gpu_check.c's tighter bounds.
 *
 * Not here: bounds against transformers, or for f32-class steps (gpu_check.c's
 * MAX_*_F32 / _BF16ACT / _FLIP).
 */
#ifndef ATTN_BOUNDS_H
#define ATTN_BOUNDS_H

#include "kv_dtype.h"

typedef struct AttnTol { double pre_abs, pre_kl, dec_abs, dec_kl; } AttnTol;

/* [KvDtype]: prefill of 16+ tokens a sequence, decode over the cache that prefill wrote */
static const AttnTol ATTN_TOL[KV_DTYPE_COUNT] = {
    {0.1, 3e-4, 0.1, 3e-4},  /* KV_F32: CUDA cores, the flip class */
    {0.15, 5e-4, 0.1, 3e-4}, /* KV_BF16 */
    {0.3, 2e-3, 0.2, 1e-3},  /* KV_FP8 */
};

#endif
