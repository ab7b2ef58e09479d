/*
 * cuda_device.cuh - small device helpers shared by the kernels of
 * kernels/cuda/: warp reductions and BF16 unpacking. Device code only.
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

/* bf16 bits -> f32, exact. */
static __device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) {
    return __uint_as_float((uint32_t)h << 16);
}

/* The two bf16 halves of a 32-bit word (low half first in memory), exact. */
static __device__ __forceinline__ void bf16x2_to_f32(uint32_t u, float *lo, float *hi) {
    *lo = __uint_as_float(u << 16);
    *hi = __uint_as_float(u & 0xffff0000u);
}

#endif
