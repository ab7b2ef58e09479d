/*
 * norm_rope.cu - per-head RMSNorm (Qwen3 QK-norm, optional) fused with the
 * rotary embedding, in place on q or k. One warp per (token, head); each lane
 * owns whole rotate_half pairs (i, i + head_dim/2), so no lane reads a value
 * another lane writes. The cos/sin come from tables [max_ctx, head_dim/2]
 * built once at runner creation (forward.c, Llama 3 scaling in
 * cpu_rope_inv_freq), row pos[t] for token t. Not here: the variant that also
 * writes K/V into the cache (rope_kv_write.cu).
 * Reference: cpu_norm_rope in backend_cpu.c (cpu_rmsnorm + cpu_rope).
 */
#include "cuda_check.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"
#include "cuda_pdl.cuh"
#include "rope_device.cuh"

#define NR_WARPS 4

/* x: [n * n_heads, head_dim] f32; norm_w: [head_dim] bf16 or NULL; cs, sn: [max_ctx, head_dim/2] f32;
 * pos: [n] int32. */
__global__ void norm_rope_kernel(float *x, int n_rows, int n_heads, int head_dim, const uint16_t *norm_w,
                                 float eps, const float *cs, const float *sn, const int32_t *pos) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    int row = blockIdx.x * NR_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n_rows) return;
    int t = row / n_heads, h2 = head_dim / 2;
    rope_row_inplace(x + (size_t)row * head_dim, head_dim, norm_w, eps, cs + (size_t)pos[t] * h2,
                     sn + (size_t)pos[t] * h2, lane);
}

extern "C" int cuda_norm_rope(float *x, int n, int n_heads, int head_dim, const uint16_t *norm_w, float eps,
                              const float *cs, const float *sn, const int32_t *pos, void *stream) {
    if (n < 0 || n_heads <= 0 || head_dim <= 0 || head_dim % 2 || head_dim > 512 || !x || !cs || !sn || !pos)
        return -1;
    if (n == 0) return 0;
    int rows = n * n_heads;
    pdl_launch(norm_rope_kernel, dim3((rows + NR_WARPS - 1) / NR_WARPS), dim3(NR_WARPS * 32), 0, (cudaStream_t)stream,
               x, rows, n_heads, head_dim, norm_w, eps, cs, sn, pos);
    CUDA_CHECK_LAUNCH();
    return 0;
}
