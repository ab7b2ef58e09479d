/*
 * attn_tiles.cuh - which query tiles the tensor-core prefill attention takes:
 * the rule attention_mma.cu (which computes those tiles) and attention.cu
 * (which computes every other token, cuda_attention_untiled) must agree on.
 * A tile is CUDA_ATTN_MMA_TILE consecutive tokens of the batch; the tensor-core
 * kernel takes it when it holds at most ATTN_MMA_MAX_RUNS runs (maximal spans of
 * one sequence): each run is a pass over its sequence's positions, so a tile of
 * decode tokens (one run each) goes to the CUDA-core kernel, which spreads them
 * over blocks. Device code only; not the kernels.
 */
#ifndef SAMPLER_ATTN_TILES_CUH
#define SAMPLER_ATTN_TILES_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_kernels.h" /* CUDA_ATTN_MMA_TILE */

#define ATTN_MMA_MAX_RUNS 2

/* 1 when the tile holding token t of seq [n_tokens] is the tensor-core kernel's. */
static __device__ __forceinline__ int attn_tile_is_mma(const int32_t *seq, int n_tokens, int t) {
    int t0 = t / CUDA_ATTN_MMA_TILE * CUDA_ATTN_MMA_TILE;
    int t1 = t0 + CUDA_ATTN_MMA_TILE < n_tokens ? t0 + CUDA_ATTN_MMA_TILE : n_tokens;
    int runs = 1;
    for (int i = t0 + 1; i < t1; i++) runs += seq[i] != seq[i - 1];
    return runs <= ATTN_MMA_MAX_RUNS;
}

#endif
