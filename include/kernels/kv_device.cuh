/*
 * kv_device.cuh - the KV cache element types on the device (kv_dtype.h):
 * the same conversions as dtype.h's f32_to_bf16 and quant.h's
 * quant_f32_to_e4m3 / quant_e4m3_to_f32, bit for bit (checked against them by
 * the kv_write rows of tests/gpu/op_checks.h), and the load of one cache
 * element as f32. Device code only; not the kernels.
 */
#ifndef SAMPLER_KV_DEVICE_CUH
#define SAMPLER_KV_DEVICE_CUH

#include <stdint.h>

#include "cuda_device.cuh" /* dev_f32_to_e4m3 */
#include "kv_dtype.h"

/* dtype.h f32_to_bf16: round to nearest even, NaN quieted. */
static __device__ __forceinline__ uint16_t kv_f32_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* quant.h quant_e4m3_to_f32, exact (NaN with torch's payload). */
static __device__ __forceinline__ float kv_e4m3_to_f32(uint32_t b) {
    uint32_t sign = (b & 0x80u) << 24, e = (b >> 3) & 0xfu, m = b & 7u;
    if (e == 0xfu && m == 7u) return __uint_as_float(sign | 0x7f800000u | (m << 20));
    if (e == 0) return __uint_as_float(__float_as_uint((float)m * 0x1p-9f) | sign);
    return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
}

/* Element i of a cache of type DT (KvDtype) as f32; scale: the row's FP8 scale. */
template <int DT>
static __device__ __forceinline__ float kv_load(const void *cache, size_t i, float scale) {
    if (DT == KV_F32) return ((const float *)cache)[i];
    if (DT == KV_BF16) return __uint_as_float((uint32_t)((const uint16_t *)cache)[i] << 16);
    return __fmul_rn(kv_e4m3_to_f32(((const uint8_t *)cache)[i]), scale);
}

#endif
