/*
 * norm_rope.cu - per-head RMSNorm (Qwen3 QK-norm, optional) fused with the
 * rotary embedding, in place on q or k. One warp per (token, head); each lane
 * owns whole rotate_half pairs (i, i + head_dim/2), so no lane reads a value
 * another lane writes. Llama 3 rope scaling lives in the cos/sin tables the
 * forward pass computes on the host (cpu_rope_inv_freq).
 * Reference: cpu_norm_rope in backend_cpu.c (cpu_rmsnorm + cpu_rope).
 */
#include "cuda_check.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"

#define NR_WARPS 4

/* x: [n * n_heads, head_dim] f32; norm_w: [head_dim] bf16 or NULL; cs, sn: [n, head_dim/2] f32. */
__global__ void norm_rope_kernel(float *x, int n_rows, int n_heads, int head_dim, const uint16_t *norm_w,
                                 float eps, const float *cs, const float *sn) {
    int row = blockIdx.x * NR_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n_rows) return;
    float *v = x + (size_t)row * head_dim;
    int h2 = head_dim / 2, t = row / n_heads;
    float scale = 1.f;
    if (norm_w) {
        float ss = 0.f;
        for (int i = lane; i < head_dim; i += 32) ss += v[i] * v[i];
        ss = warp_sum(ss);
        scale = 1.0f / sqrtf(ss / (float)head_dim + eps);
    }
    const float *c = cs + (size_t)t * h2, *s = sn + (size_t)t * h2;
    for (int i = lane; i < h2; i += 32) {
        float a = v[i], b = v[i + h2];
        if (norm_w) {
            a = bf16_bits_to_f32(norm_w[i]) * (a * scale);
            b = bf16_bits_to_f32(norm_w[i + h2]) * (b * scale);
        }
        v[i] = a * c[i] - b * s[i];
        v[i + h2] = b * c[i] + a * s[i];
    }
}

extern "C" int cuda_norm_rope(float *x, int n, int n_heads, int head_dim, const uint16_t *norm_w, float eps,
                              const float *cs, const float *sn, void *stream) {
    if (n < 0 || n_heads <= 0 || head_dim <= 0 || head_dim % 2 || head_dim > 512 || !x || !cs || !sn)
        return -1;
    if (n == 0) return 0;
    int rows = n * n_heads;
    norm_rope_kernel<<<(rows + NR_WARPS - 1) / NR_WARPS, NR_WARPS * 32, 0, (cudaStream_t)stream>>>(
        x, rows, n_heads, head_dim, norm_w, eps, cs, sn);
    CUDA_CHECK_LAUNCH();
    return 0;
}
