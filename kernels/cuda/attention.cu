/*
 * attention.cu - paged attention for prefill and decode: each token attends
 * to positions 0..pos[t] of its sequence, read through the flattened block
 * table (KV cache layout [n_blocks, n_kv_heads, block_size, head_dim] of
 * f32, bf16 or fp8 e4m3 with per-row scales: kv_dtype.h; a warp's K/V row is
 * contiguous, and so are the positions of one block and head).
 *
 * One block per (token, KV head, group of up to CUDA_ATTN_GROUP query heads):
 * a K/V row is loaded once for all query heads that share it (GQA). The four
 * warps of a block take positions round-robin, each keeping an online-softmax
 * state (max, sum, weighted V) per head; the warps merge through shared
 * memory. When the batch is too small to fill the GPU (decode), positions are
 * also split over n_splits blocks in chunks of CUDA_ATTN_CHUNK and a second
 * kernel merges the partial states (flash-decoding).
 * Reference: attn_task in backend_cpu.c (two-pass softmax, same math).
 * Not here: tensor-core prefill attention (a later optimisation).
 */
#include <math.h>

#include "attn_tiles.cuh"
#include "cuda_check.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"
#include "kv_device.cuh"

#define ATT_WARPS 4
#define GROUP CUDA_ATTN_GROUP
#define CHUNK CUDA_ATTN_CHUNK

/* Weight of a partial state with max m against the global max M (0 when empty). */
static __device__ __forceinline__ float rescale(float m, float M) {
    return m == -INFINITY ? 0.f : expf(m - M);
}

/* JD = 4 * J + DT (one template argument: the emulation's launch macro splits on commas).
 * untiled: 1 computes only the tokens whose tile attention_mma.cu leaves (attn_tiles.cuh).
 * J: dims per lane (head_dim <= 32 * J); lane owns dims lane + 32 * j. DT: a.kv_dtype.
 * part: [n_splits, n_tokens * n_heads, head_dim + 2] (acc..., max, sum) when n_splits > 1. */
template <int JD>
__global__ void __launch_bounds__(ATT_WARPS * 32) attn_kernel(AttnArgs a, float *part, int n_splits, int untiled) {
    constexpr int J = JD / 4, DT = JD % 4;
    int t = blockIdx.x / a.n_kv_heads, kvh = blockIdx.x % a.n_kv_heads;
    if (untiled && attn_tile_is_mma(a.seq, a.n_tokens, t)) return; /* attention_mma.cu's token (block-uniform) */
    int G = a.n_heads / a.n_kv_heads, g0 = blockIdx.y * GROUP;
    int gn = G - g0 < GROUP ? G - g0 : GROUP;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, hd = a.head_dim, bs = a.block_size;
    int n = a.pos[t] + 1;
    const int32_t *bt = a.block_table + (size_t)a.seq[t] * a.bt_stride;
    size_t head0 = (size_t)t * a.n_heads + (size_t)kvh * G + g0;

    float q[GROUP][J], acc[GROUP][J], m[GROUP], l[GROUP];
#pragma unroll
    for (int g = 0; g < GROUP; g++) {
        m[g] = -INFINITY;
        l[g] = 0.f;
#pragma unroll
        for (int j = 0; j < J; j++) {
            int d = lane + 32 * j;
            q[g][j] = g < gn && d < hd ? a.q[(head0 + g) * hd + d] : 0.f;
            acc[g][j] = 0.f;
        }
    }
    for (int c = blockIdx.z; c * CHUNK < n; c += n_splits) {
        int end = (c + 1) * CHUNK < n ? (c + 1) * CHUNK : n;
        for (int i = c * CHUNK + warp; i < end; i += ATT_WARPS) {
            size_t row = ((size_t)bt[i / bs] * a.n_kv_heads + kvh) * bs + i % bs, off = row * hd;
            float ks = DT == KV_FP8 ? a.k_scale[row] : 1.f, vs = DT == KV_FP8 ? a.v_scale[row] : 1.f;
            float k[J], v[J];
#pragma unroll
            for (int j = 0; j < J; j++) {
                int d = lane + 32 * j;
                k[j] = d < hd ? kv_load<DT>(a.k_cache, off + d, ks) : 0.f;
                v[j] = d < hd ? kv_load<DT>(a.v_cache, off + d, vs) : 0.f;
            }
#pragma unroll
            for (int g = 0; g < GROUP; g++) {
                if (g >= gn) break; /* uniform across the warp */
                float s = 0.f;
#pragma unroll
                for (int j = 0; j < J; j++) s += q[g][j] * k[j];
                s = warp_sum(s) * a.scale;
                float mn = fmaxf(m[g], s), corr = rescale(m[g], mn), p = expf(s - mn);
                l[g] = l[g] * corr + p;
#pragma unroll
                for (int j = 0; j < J; j++) acc[g][j] = acc[g][j] * corr + p * v[j];
                m[g] = mn;
            }
        }
    }

    __shared__ float sm_m[ATT_WARPS][GROUP], sm_l[ATT_WARPS][GROUP];
    __shared__ float sm_acc[ATT_WARPS][GROUP][32 * J];
#pragma unroll
    for (int g = 0; g < GROUP; g++) {
        if (lane == 0) {
            sm_m[warp][g] = m[g];
            sm_l[warp][g] = l[g];
        }
#pragma unroll
        for (int j = 0; j < J; j++) sm_acc[warp][g][lane + 32 * j] = acc[g][j];
    }
    __syncthreads();
    size_t rows_total = (size_t)gridDim.x / a.n_kv_heads * a.n_heads;
    for (int idx = threadIdx.x; idx < gn * hd; idx += blockDim.x) {
        int g = idx / hd, d = idx % hd;
        float M = -INFINITY, L = 0.f, O = 0.f;
        for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm_m[w][g]);
        for (int w = 0; w < ATT_WARPS; w++) {
            float f = rescale(sm_m[w][g], M);
            L += sm_l[w][g] * f;
            O += sm_acc[w][g][d] * f;
        }
        size_t row = head0 + g;
        if (n_splits == 1) {
            a.out[row * hd + d] = O / L;
        } else {
            float *p = part + ((size_t)blockIdx.z * rows_total + row) * (hd + 2);
            p[d] = O;
            if (d == 0) {
                p[hd] = M;
                p[hd + 1] = L;
            }
        }
    }
}

/* out: [rows, hd] f32; part: [n_splits, rows, hd + 2]. One block per row. */
__global__ void attn_merge_kernel(float *out, const float *part, int rows, int hd, int n_splits) {
    size_t row = blockIdx.x, stride = (size_t)rows * (hd + 2);
    const float *p0 = part + row * (hd + 2);
    float M = -INFINITY, L = 0.f;
    for (int s = 0; s < n_splits; s++) M = fmaxf(M, p0[s * stride + hd]);
    for (int s = 0; s < n_splits; s++) L += p0[s * stride + hd + 1] * rescale(p0[s * stride + hd], M);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float O = 0.f;
        for (int s = 0; s < n_splits; s++) O += p0[s * stride + d] * rescale(p0[s * stride + hd], M);
        out[row * hd + d] = O / L;
    }
}

template <int DT>
static void attn_launch(int J, dim3 grid, cudaStream_t s, const AttnArgs *a, float *part, int n_splits, int untiled) {
    if (J == 1) attn_kernel<4 + DT><<<grid, ATT_WARPS * 32, 0, s>>>(*a, part, n_splits, untiled);
    else if (J == 2) attn_kernel<8 + DT><<<grid, ATT_WARPS * 32, 0, s>>>(*a, part, n_splits, untiled);
    else if (J <= 4) attn_kernel<16 + DT><<<grid, ATT_WARPS * 32, 0, s>>>(*a, part, n_splits, untiled);
    else attn_kernel<32 + DT><<<grid, ATT_WARPS * 32, 0, s>>>(*a, part, n_splits, untiled);
}

extern "C" int cuda_attention_splits(int n_tokens, int n_heads, int n_kv_heads, int max_ctx, int sm_count) {
    if (n_tokens <= 0 || n_kv_heads <= 0 || n_heads < n_kv_heads || sm_count <= 0) return 1;
    long groups = (n_heads / n_kv_heads + GROUP - 1) / GROUP;
    long blocks = (long)n_tokens * n_kv_heads * groups;
    if (blocks >= 2L * sm_count) return 1;
    long s = (max_ctx + CHUNK - 1) / CHUNK, fill = (8L * sm_count + blocks - 1) / blocks;
    if (fill < s) s = fill;
    if (s > 64) s = 64;
    return s < 1 ? 1 : (int)s;
}

extern "C" int cuda_attention(const AttnArgs *a, float *part, int n_splits, void *stream) {
    if (!a || a->n_tokens < 0 || a->n_heads <= 0 || a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads ||
        a->head_dim <= 0 || a->head_dim > CUDA_ATTN_MAX_HEAD_DIM || a->block_size <= 0 || a->bt_stride <= 0 ||
        n_splits < 1 || (n_splits > 1 && !part) || !a->out || !a->q || !a->k_cache || !a->v_cache || !a->pos ||
        !a->seq || !a->block_table || a->kv_dtype < KV_F32 || a->kv_dtype >= KV_DTYPE_COUNT ||
        (a->kv_dtype == KV_FP8 && (!a->k_scale || !a->v_scale)))
        return -1;
    if (a->n_tokens == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    int G = a->n_heads / a->n_kv_heads, hd = a->head_dim;
    dim3 grid((unsigned)(a->n_tokens * a->n_kv_heads), (unsigned)((G + GROUP - 1) / GROUP), (unsigned)n_splits);
    int J = (hd + 31) / 32;
    if (a->kv_dtype == KV_F32) attn_launch<KV_F32>(J, grid, s, a, part, n_splits, 0);
    else if (a->kv_dtype == KV_BF16) attn_launch<KV_BF16>(J, grid, s, a, part, n_splits, 0);
    else attn_launch<KV_FP8>(J, grid, s, a, part, n_splits, 0);
    CUDA_CHECK_LAUNCH();
    return n_splits > 1 ? cuda_attention_merge(a->out, part, a->n_tokens * a->n_heads, hd, n_splits, s) : 0;
}

extern "C" int cuda_attention_merge(float *out, const float *part, int rows, int hd, int n_splits, void *stream) {
    if (!out || !part || rows < 0 || hd <= 0 || hd > CUDA_ATTN_MAX_HEAD_DIM || n_splits < 1) return -1;
    if (rows == 0) return 0;
    attn_merge_kernel<<<rows, 128, 0, (cudaStream_t)stream>>>(out, part, rows, hd, n_splits);
    CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int cuda_attention_untiled(const AttnArgs *a, void *stream) {
    if (!a || a->n_tokens < 0 || a->n_heads <= 0 || a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads ||
        a->head_dim <= 0 || a->head_dim > CUDA_ATTN_MAX_HEAD_DIM || a->block_size <= 0 || a->bt_stride <= 0 ||
        !a->out || !a->q || !a->k_cache || !a->v_cache || !a->pos || !a->seq || !a->block_table ||
        a->kv_dtype < KV_F32 || a->kv_dtype >= KV_DTYPE_COUNT || (a->kv_dtype == KV_FP8 && (!a->k_scale || !a->v_scale)))
        return -1;
    if (a->n_tokens == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    int G = a->n_heads / a->n_kv_heads, J = (a->head_dim + 31) / 32;
    dim3 grid((unsigned)(a->n_tokens * a->n_kv_heads), (unsigned)((G + GROUP - 1) / GROUP), 1);
    if (a->kv_dtype == KV_F32) attn_launch<KV_F32>(J, grid, s, a, NULL, 1, 1);
    else if (a->kv_dtype == KV_BF16) attn_launch<KV_BF16>(J, grid, s, a, NULL, 1, 1);
    else attn_launch<KV_FP8>(J, grid, s, a, NULL, 1, 1);
    CUDA_CHECK_LAUNCH();
    return 0;
}
