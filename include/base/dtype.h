/*
 * dtype.h - element types of checkpoint tensors and the exact conversions
 * between them. BF16<->F32 and F16->F32 follow IEEE/PyTorch rounding
 * (round to nearest even, NaN preserved). FP8/NVFP4 live in quant.h.
 */
#ifndef SAMPLER_DTYPE_H
#define SAMPLER_DTYPE_H

#include <stdint.h>
#include <string.h>

typedef enum {
    DT_F32 = 0, DT_F16, DT_BF16, DT_F8_E4M3, DT_F8_E5M2, DT_I64, DT_I32, DT_I16, DT_I8,
    DT_U8, DT_BOOL, DT_F64, DT_COUNT
} Dtype;

/* Bytes per element; 0 for unknown. */
int dtype_size(Dtype t);
/* safetensors dtype string ("BF16", "F32", ...) <-> Dtype; -1 if unknown. */
int dtype_from_name(const char *name, Dtype *out);
const char *dtype_name(Dtype t);

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0) {
        if (m == 0) u = s;
        else { /* subnormal: normalise */
            e = 127 - 15 + 1;
            while (!(m & 0x400)) { m <<= 1; e--; }
            u = s | (e << 23) | ((m & 0x3ff) << 13);
        }
    } else if (e == 31) u = s | 0x7f800000u | (m << 13);
    else u = s | ((e + 127 - 15) << 23) | (m << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif
