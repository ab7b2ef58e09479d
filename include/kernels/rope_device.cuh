/*
 * rope_device.cuh - the per-head QK-norm + RoPE of one head row by one warp,
 * shared by norm_rope.cu (in place) and rope_kv_write.cu (k in registers), so
 * both run the same operations in the same order as cpu_rmsnorm + cpu_rope
 * (up to the sum of squares' order). Device code only; not the kernels.
 */
#ifndef SAMPLER_ROPE_DEVICE_CUH
#define SAMPLER_ROPE_DEVICE_CUH

#include <stdint.h>

#include "cuda_device.cuh"

/* 1 / rms of x [head_dim] f32 (every lane gets it): lane-strided squares, then warp_sum. */
static __device__ __forceinline__ float rope_rms_scale(const float *x, int head_dim, float eps, int lane) {
    float ss = 0.f;
    for (int i = lane; i < head_dim; i += 32) ss += x[i] * x[i];
    ss = warp_sum(ss);
    return 1.0f / sqrtf(ss / (float)head_dim + eps);
}

/* Element d of the normed (norm_w [head_dim] bf16, or NULL) and rotated row x [head_dim]
 * (rotate_half: pairs (i, i + h2)); c, s: the token's table rows [h2] f32. */
static __device__ __forceinline__ float rope_elem(const float *x, int d, int h2, const uint16_t *norm_w,
                                                  float scale, const float *c, const float *s) {
    int i = d < h2 ? d : d - h2;
    float a = x[i], b = x[i + h2];
    if (norm_w) {
        a = bf16_bits_to_f32(norm_w[i]) * (a * scale);
        b = bf16_bits_to_f32(norm_w[i + h2]) * (b * scale);
    }
    return d < h2 ? a * c[i] - b * s[i] : b * c[i] + a * s[i];
}

/* v [head_dim] f32 in place; each lane owns whole pairs (i, i + h2), so no lane reads what another writes. */
static __device__ __forceinline__ void rope_row_inplace(float *v, int head_dim, const uint16_t *norm_w, float eps,
                                                        const float *c, const float *s, int lane) {
    int h2 = head_dim / 2;
    float scale = norm_w ? rope_rms_scale(v, head_dim, eps, lane) : 1.f;
    for (int i = lane; i < h2; i += 32) {
        float lo = rope_elem(v, i, h2, norm_w, scale, c, s), hi = rope_elem(v, i + h2, h2, norm_w, scale, c, s);
        v[i] = lo;
        v[i + h2] = hi;
    }
}

#endif
