/*
 * cuda_device.cuh - small device helpers shared by the kernels of
 * kernels/cuda/: warp reductions, BF16 unpacking, the e4m3 cast. Device code only.
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
