/*
 * kv_cpu.c - the KV cache element types on the CPU (kv_cpu.h): the rounding
 * contract of kv_dtype.h, in plain C. It is the reference the CUDA kv_write is
 * compared with bit for bit; it is not the layout or the attention.
 */
#include "kv_cpu.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "cpu_ops.h"
#include "dtype.h"
#include "quant.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KV_X86 1
#endif

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

/* quant_e4m3_to_f32 of every byte: the same values, one load instead of the branches. */
static float e4m3_lut[256];
static pthread_once_t e4m3_once = PTHREAD_ONCE_INIT;
static void e4m3_lut_init(void) {
    for (int b = 0; b < 256; b++) e4m3_lut[b] = quant_e4m3_to_f32((uint8_t)b);
}

#ifdef KV_X86
/* The e4m3 decode of cpu_kv_rows, 8 elements a step (the same values: a table load and one f32
 * multiply per element); BF16 rows go through cpu_bf16_to_f32 (cpu_ops.h). */
__attribute__((target("avx2"))) static void e4m3_row_avx2(float *dst, const uint8_t *src, float sc, int n) {
    __m256 s = _mm256_set1_ps(sc);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(src + i)));
        _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_i32gather_ps(e4m3_lut, idx, 4), s));
    }
    for (; i < n; i++) dst[i] = e4m3_lut[src[i]] * sc;
}

/* Attention tasks call this from every pool thread: the cached answer is an
 * atomic (relaxed: every thread computes and stores the same value). */
static int kv_avx2(void) {
    static _Atomic int v = -1;
    int x = atomic_load_explicit(&v, memory_order_relaxed);
    if (x < 0) {
        x = __builtin_cpu_supports("avx2") ? 1 : 0;
        atomic_store_explicit(&v, x, memory_order_relaxed);
    }
    return x;
}
#endif

const float *cpu_kv_rows(float *buf, const void *cache, const float *scale, KvDtype t, size_t row0, int m, int hd) {
    size_t o = row0 * (size_t)hd, n = (size_t)m * hd;
    if (t == KV_F32) return (const float *)cache + o;
    if (t == KV_BF16) {
        cpu_bf16_to_f32(buf, (const uint16_t *)cache + o, n);
        return buf;
    }
    pthread_once(&e4m3_once, e4m3_lut_init);
    const uint8_t *s = (const uint8_t *)cache + o;
    for (int r = 0; r < m; r++) {
        float sc = scale[row0 + (size_t)r];
#ifdef KV_X86
        if (kv_avx2()) {
            e4m3_row_avx2(buf + (size_t)r * hd, s + (size_t)r * hd, sc, hd);
            continue;
        }
#endif
        for (int i = 0; i < hd; i++) buf[(size_t)r * hd + i] = e4m3_lut[s[(size_t)r * hd + i]] * sc;
    }
    return buf;
}
