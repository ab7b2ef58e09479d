/*
 * kv_cpu.c - the KV cache element types on the CPU (kv_cpu.h): the rounding
 * contract of kv_dtype.h, in plain C. It is the reference the CUDA kv_write is
 * compared with bit for bit; it is not the layout or the attention.
 */
#include "kv_cpu.h"

#include <math.h>
#include <stdint.h>

#include "dtype.h"
#include "quant.h"

void cpu_kv_store_row(void *cache, float *scale, KvDtype t, size_t row, const float *x, int hd) {
    size_t o = row * (size_t)hd;
    if (t == KV_F32) {
        memcpy((float *)cache + o, x, sizeof(float) * (size_t)hd);
    } else if (t == KV_BF16) {
        uint16_t *d = (uint16_t *)cache + o;
        for (int i = 0; i < hd; i++) d[i] = f32_to_bf16(x[i]);
    } else {
        uint8_t *d = (uint8_t *)cache + o;
        float amax = 0.f;
        for (int i = 0; i < hd; i++) amax = fmaxf(amax, fabsf(x[i]));
        float s = amax > 0.f ? amax / KV_FP8_MAX : 1.0f;
        for (int i = 0; i < hd; i++) d[i] = quant_f32_to_e4m3(x[i] / s);
        scale[row] = s;
    }
}

const float *cpu_kv_rows(float *buf, const void *cache, const float *scale, KvDtype t, size_t row0, int m, int hd) {
    size_t o = row0 * (size_t)hd, n = (size_t)m * hd;
    if (t == KV_F32) return (const float *)cache + o;
    if (t == KV_BF16) {
        const uint16_t *s = (const uint16_t *)cache + o;
        for (size_t i = 0; i < n; i++) buf[i] = bf16_to_f32(s[i]);
        return buf;
    }
    const uint8_t *s = (const uint8_t *)cache + o;
    for (int r = 0; r < m; r++) {
        float sc = scale[row0 + (size_t)r];
        for (int i = 0; i < hd; i++) buf[(size_t)r * hd + i] = quant_e4m3_to_f32(s[(size_t)r * hd + i]) * sc;
    }
    return buf;
}
