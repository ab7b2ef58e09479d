/*
 * rope_kv_write.cu - one layer's q/k norm + RoPE fused with its K/V cache
 * write (RopeKvArgs, backend.h): one launch instead of norm_rope on q, on k
 * and kv_write, and k is never written back to memory. One warp per (token,
 * head) of the n_heads q heads (in place, as norm_rope.cu) and the n_kv_heads
 * kv heads: the warp computes its k row's normed, rotated elements in
 * registers (lane l holds elements l, l + 32, ...), then stores them and the
 * v row in the cache's element type exactly as kv_write.cu does (the FP8 max
 * over the registers, the same division and rounding). Tokens with a slot < 0
 * (padding) store nothing. Reference: cpu_rope_kv_write (backend_cpu.c), which
 * is norm_rope + kv_write's bits; not here: attention.
 */
#include "cuda_check.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"
#include "cuda_pdl.cuh"
#include "kv_device.cuh"
#include "rope_device.cuh"

#define RK_WARPS 4
#define RK_PER_LANE 16 /* head_dim <= 32 * RK_PER_LANE */

/* One kv-head row x [hd] f32 (registers r, lane l holding elements l + 32 j) into cache row `row`. */
static __device__ __forceinline__ void rk_store(void *cache, float *scale, int dtype, size_t row, const float *r,
                                                int hd, int lane) {
    if (dtype == KV_F32) {
#pragma unroll
        for (int j = 0; j < RK_PER_LANE; j++)
            if (lane + 32 * j < hd) ((float *)cache)[row * hd + lane + 32 * j] = r[j];
    } else if (dtype == KV_BF16) {
#pragma unroll
        for (int j = 0; j < RK_PER_LANE; j++)
            if (lane + 32 * j < hd) ((uint16_t *)cache)[row * hd + lane + 32 * j] = kv_f32_to_bf16(r[j]);
    } else {
        float amax = 0.f;
#pragma unroll
        for (int j = 0; j < RK_PER_LANE; j++)
            if (lane + 32 * j < hd) amax = fmaxf(amax, fabsf(r[j]));
        amax = warp_max(amax);
        float s = amax > 0.f ? amax / KV_FP8_MAX : 1.0f;
#pragma unroll
        for (int j = 0; j < RK_PER_LANE; j++)
            if (lane + 32 * j < hd) ((uint8_t *)cache)[row * hd + lane + 32 * j] = dev_f32_to_e4m3(r[j] / s);
        if (lane == 0) scale[row] = s;
    }
}

/* Row w of n * (n_heads + n_kv_heads): token w / items, head w % items (q heads first). */
__global__ void rope_kv_write_kernel(RopeKvArgs a, int n_rows) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    int row = blockIdx.x * RK_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n_rows) return;
    int items = a.n_heads + a.kv.n_kv_heads, t = row / items, h = row % items, hd = a.kv.head_dim, h2 = hd / 2;
    const float *c = a.cs + (size_t)a.pos[t] * h2, *s = a.sn + (size_t)a.pos[t] * h2;
    if (h < a.n_heads) {
        rope_row_inplace(a.q + ((size_t)t * a.n_heads + h) * hd, hd, a.q_norm, a.eps, c, s, lane);
        return;
    }
    int slot = a.kv.slots[t];
    if (slot < 0) return;
    h -= a.n_heads;
    size_t crow = ((size_t)(slot / a.kv.block_size) * a.kv.n_kv_heads + h) * a.kv.block_size + slot % a.kv.block_size;
    size_t src = ((size_t)t * a.kv.n_kv_heads + h) * hd;
    const float *x = a.kv.k + src;
    float scale = a.k_norm ? rope_rms_scale(x, hd, a.eps, lane) : 1.f, r[RK_PER_LANE];
#pragma unroll
    for (int j = 0; j < RK_PER_LANE; j++)
        r[j] = lane + 32 * j < hd ? rope_elem(x, lane + 32 * j, h2, a.k_norm, scale, c, s) : 0.f;
    rk_store(a.kv.k_cache, a.kv.k_scale, a.kv.dtype, crow, r, hd, lane);
#pragma unroll
    for (int j = 0; j < RK_PER_LANE; j++) r[j] = lane + 32 * j < hd ? a.kv.v[src + lane + 32 * j] : 0.f;
    rk_store(a.kv.v_cache, a.kv.v_scale, a.kv.dtype, crow, r, hd, lane);
}

extern "C" int cuda_rope_kv_write(const RopeKvArgs *a, void *stream) {
    const KvWriteArgs *w = a ? &a->kv : NULL;
    if (!a || w->n < 0 || a->n_heads <= 0 || w->n_kv_heads <= 0 || w->head_dim <= 0 || w->head_dim % 2 ||
        w->head_dim > 32 * RK_PER_LANE || w->block_size <= 0 || !a->q || !a->cs || !a->sn || !a->pos ||
        !w->k_cache || !w->v_cache || !w->k || !w->v || !w->slots || w->dtype < KV_F32 || w->dtype >= KV_DTYPE_COUNT ||
        (w->dtype == KV_FP8 && (!w->k_scale || !w->v_scale)))
        return -1;
    if (w->n == 0) return 0;
    int rows = w->n * (a->n_heads + w->n_kv_heads);
    pdl_launch(rope_kv_write_kernel, dim3((rows + RK_WARPS - 1) / RK_WARPS), dim3(RK_WARPS * 32), 0,
               (cudaStream_t)stream, *a, rows);
    CUDA_CHECK_LAUNCH();
    return 0;
}
