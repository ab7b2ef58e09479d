/*
 * kv_write.cu - the KV cache write of one layer for a step (KvWriteArgs,
 * backend.h): each token's K and V rows, per kv head, stored at its slot in
 * the layout and element type of kv_dtype.h. Reference: cpu_kv_write
 * (backend_cpu.c) over kv_cpu.c, bit for bit (the max is exact in any order,
 * the division and the roundings are the same IEEE operations).
 * Tokens with a slot < 0 (padding, vLLM's PAD_SLOT_ID) are skipped. Not
 * here: the write fused with q/k norm + RoPE (rope_kv_write.cu).
 */
#include "cuda_check.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"
#include "cuda_pdl.cuh"
#include "kv_device.cuh"

#define KVW_WARPS 4

/* One block per token; warp w takes kv heads w, w + KVW_WARPS, ... */
__global__ void kv_write_kernel(KvWriteArgs a) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, hd = a.head_dim, bs = a.block_size;
    if (a.slots[t] < 0) return;
    size_t blk = (size_t)(a.slots[t] / bs), off = (size_t)(a.slots[t] % bs);
    for (int h = warp; h < a.n_kv_heads; h += KVW_WARPS) {
        size_t row = (blk * a.n_kv_heads + h) * bs + off, src = ((size_t)t * a.n_kv_heads + h) * hd;
        for (int kv = 0; kv < 2; kv++) {
            const float *x = (kv ? a.v : a.k) + src;
            void *cache = kv ? a.v_cache : a.k_cache;
            if (a.dtype == KV_F32) {
                for (int d = lane; d < hd; d += 32) ((float *)cache)[row * hd + d] = x[d];
            } else if (a.dtype == KV_BF16) {
                for (int d = lane; d < hd; d += 32) ((uint16_t *)cache)[row * hd + d] = kv_f32_to_bf16(x[d]);
            } else {
                float amax = 0.f;
                for (int d = lane; d < hd; d += 32) amax = fmaxf(amax, fabsf(x[d]));
                amax = warp_max(amax);
                float s = amax > 0.f ? amax / KV_FP8_MAX : 1.0f;
                for (int d = lane; d < hd; d += 32) ((uint8_t *)cache)[row * hd + d] = dev_f32_to_e4m3(x[d] / s);
                if (lane == 0) (kv ? a.v_scale : a.k_scale)[row] = s;
            }
        }
    }
}

extern "C" int cuda_kv_write(const KvWriteArgs *a, void *stream) {
    if (!a || a->n < 0 || a->n_kv_heads <= 0 || a->head_dim <= 0 || a->block_size <= 0 || !a->k_cache ||
        !a->v_cache || !a->k || !a->v || !a->slots || a->dtype < KV_F32 || a->dtype >= KV_DTYPE_COUNT ||
        (a->dtype == KV_FP8 && (!a->k_scale || !a->v_scale)))
        return -1;
    if (a->n == 0) return 0;
    pdl_launch(kv_write_kernel, dim3(a->n), dim3(KVW_WARPS * 32), 0, (cudaStream_t)stream, *a);
    CUDA_CHECK_LAUNCH();
    return 0;
}
