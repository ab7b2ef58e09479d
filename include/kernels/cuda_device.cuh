/*
 * cuda_device.cuh - small device helpers shared by the kernels of
 * kernels/cuda/: warp reductions, BF16 unpacking, the e4m3 cast, the last block's
 * count of a last-block epilogue. Device code only.
 */
#ifndef SAMPLER_CUDA_DEVICE_CUH
#define SAMPLER_CUDA_DEVICE_CUH

#include <cuda_bf16.h>
#include <stdint.h>

/* Sum over the 32 lanes of a warp; every lane gets the result. */
static __device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

/* A last-block epilogue's count (CUDA's threadFenceReduction pattern): every thread of the block
 * calls it once its global writes are done; it returns 1 in every thread of the block that counted
 * last among `blocks` (so every write they made is visible to it), 0 in the others. That block puts
 * *counter back to 0, so the next launch (or graph replay) finds it zero. Reads of the other
 * blocks' writes after it go through L2 (__ldcg). Block-wide: a __syncthreads inside. */
static __device__ __forceinline__ int last_block_done(uint32_t *counter, unsigned blocks) {
    __shared__ int last;
    __threadfence(); /* this thread's writes, before the block counts itself done */
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(counter, 1u) == blocks - 1;
        if (last) *counter = 0; /* every block has counted */
    }
    __syncthreads();
    if (last) __threadfence(); /* the other blocks' writes, seen after their count */
    return last;
}

/* bf16 bits -> f32, exact. */
static __device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) {
    return __uint_as_float((uint32_t)h << 16);
}

/* The two bf16 halves of a 32-bit word (low half first in memory), exact. */
static __device__ __forceinline__ void bf16x2_to_f32(uint32_t u, float *lo, float *hi) {
    *lo = __uint_as_float(u << 16);
    *hi = __uint_as_float(u & 0xffff0000u);
}

/* quant.h quant_f32_to_e4m3 (c10's fp8e4m3fn_from_fp32_value): OCP e4m3fn, round to
 * nearest even, saturating at 448, NaN -> 0x7f; bit for bit (the kv_write and
 * activation-quantizer rows of the op checks). */
static __device__ __forceinline__ uint8_t dev_f32_to_e4m3(float f) {
    uint32_t u = __float_as_uint(f), sign = u & 0x80000000u, r;
    u ^= sign;
    if (u >= (1087u << 20)) {
        r = u > 0x7f800000u ? 0x7f : 0x7e;
    } else if (u < (121u << 23)) {
        uint32_t magic = 141u << 23;
        r = __float_as_uint(__fadd_rn(__uint_as_float(u), __uint_as_float(magic))) - magic;
    } else {
        uint32_t odd = (u >> 20) & 1;
        u += ((uint32_t)(7 - 127) << 23) + 0x7ffff + odd;
        r = u >> 20;
        if (r == 0x7f) r = 0x7e;
    }
    return (uint8_t)(r | (sign >> 24));
}

#endif
