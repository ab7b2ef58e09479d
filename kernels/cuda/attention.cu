/*
 * attention.cu - paged attention for prefill and decode: each token attends
 * to positions 0..pos[t] of its sequence, read through the flattened block
 * table (KV cache layout [n_blocks, n_kv_heads, block_size, head_dim] of
 * f32, bf16 or fp8 e4m3 with per-row scales: kv_dtype.h; a warp's K/V row is
 * contiguous, and so are the positions of one block and head).
 *
 * One block per (token, KV head, group of up to CUDA_ATTN_GROUP query heads):
 * a K/V row is loaded once for all query heads that share it (GQA). Its
 * threads take positions round-robin, each worker keeping an online-softmax
 * state (max, sum, weighted V) per head; the workers merge through shared
 * memory (attn_block_merge). When the batch is too small to fill the GPU
 * (decode), positions are also split over n_splits blocks in chunks of
 * CUDA_ATTN_CHUNK and a second kernel merges the partial states
 * (flash-decoding). Two kernels of that shape:
 *   attn_vec_kernel  BF16 / FP8 caches at head_dim 64, 128, 256 (the models'
 *                    decode): workers of head_dim / 8 lanes, 8 dims a lane,
 *                    4 positions a step (16-byte loads, 8 in flight a lane);
 *   attn_kernel      any cache and head_dim <= 256: a warp a position, dims
 *                    lane + 32 j (f32 caches, head dims such as 12 or 96).
 * Reference: attn_task in backend_cpu.c (two-pass softmax, same math).
 * Not here: prefill-shaped batches on tensor cores (attention_mma.cu).
 */
#include <math.h>

#include "attn_tiles.cuh"
#include "cuda_check.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"
#include "cuda_pdl.cuh"
#include "kv_device.cuh"

#define ATT_WARPS 4
#define GROUP CUDA_ATTN_GROUP
#define CHUNK CUDA_ATTN_CHUNK

/* Weight of a partial state with max m against the global max M (0 when empty). */
static __device__ __forceinline__ float rescale(float m, float M) {
    return m == -INFINITY ? 0.f : expf(m - M);
}

/* The block's merge of its NWK partial states (per head of the group: max
 * sm_m, sum sm_l, unnormalised sm_acc over DIMS >= head_dim dims; shared,
 * written before the caller's __syncthreads) into out when n_splits == 1,
 * else into this split's rows of part. */
template <int NWK, int DIMS>
static __device__ __forceinline__ void attn_block_merge(const AttnArgs &a, float *part, int n_splits,
                                                        const float (*sm_m)[GROUP], const float (*sm_l)[GROUP],
                                                        const float (*sm_acc)[GROUP][DIMS], int gn, size_t head0) {
    int hd = a.head_dim;
    size_t rows_total = (size_t)gridDim.x / a.n_kv_heads * a.n_heads;
    for (int idx = threadIdx.x; idx < gn * hd; idx += blockDim.x) {
        int g = idx / hd, d = idx % hd;
        float M = -INFINITY, L = 0.f, O = 0.f;
        for (int w = 0; w < NWK; w++) M = fmaxf(M, sm_m[w][g]);
        for (int w = 0; w < NWK; w++) {
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

/* JD = 4 * J + DT (one template argument: the emulation's launch macro splits on commas).
 * untiled: 1 computes only the tokens whose tile attention_mma.cu leaves (attn_tiles.cuh).
 * J: dims per lane (head_dim <= 32 * J); lane owns dims lane + 32 * j. DT: a.kv_dtype.
 * part: [n_splits, n_tokens * n_heads, head_dim + 2] (acc..., max, sum) when n_splits > 1. */
template <int JD>
__global__ void __launch_bounds__(ATT_WARPS * 32) attn_kernel(AttnArgs a, float *part, int n_splits, int untiled) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
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
    attn_block_merge<ATT_WARPS, 32 * J>(a, part, n_splits, sm_m, sm_l, sm_acc, gn, head0);
}

/* Decode-shaped attention for BF16 / FP8 caches at head_dim 64, 128 or 256
 * (attn_vec_fits): the same blocks, grid, splits and merge as attn_kernel, but
 * a block's 128 threads are workers of LPP = head_dim / 8 lanes, each lane
 * holding 8 consecutive dims (one 16-byte BF16 load, 8 bytes of FP8), and a
 * worker takes AV_U consecutive positions a step, so each lane has 2 AV_U
 * loads in flight and one warp instruction serves 32 / LPP positions. A dot
 * product is summed over the worker's lanes (log2 LPP shuffles). The online
 * softmax steps once per AV_U positions. */
#define AV_U 4

/* Eight consecutive elements (i % 8 == 0) of a BF16 or FP8 cache, raw: BF16 in
 * x..w, FP8 in x, y. */
template <int DT>
static __device__ __forceinline__ uint4 kv_raw8(const void *cache, size_t i) {
    if (DT == KV_BF16) return __ldg((const uint4 *)((const uint16_t *)cache + i));
    uint2 w = __ldg((const uint2 *)((const uint8_t *)cache + i));
    return uint4{w.x, w.y, 0u, 0u};
}

/* Element j of kv_raw8's r as f32 (kv_load's value; FP8 times its row's scale). */
template <int DT>
static __device__ __forceinline__ float kv_raw_elem(uint4 r, int j, float scale) {
    uint32_t w[4] = {r.x, r.y, r.z, r.w};
    if (DT == KV_BF16) return __uint_as_float(j & 1 ? w[j >> 1] & 0xffff0000u : w[j >> 1] << 16);
    return __fmul_rn(kv_e4m3_to_f32((w[j >> 2] >> (8 * (j & 3))) & 0xffu), scale);
}

/* LDT = 4 * LPP + DT (one template argument: the emulation's launch macro splits on commas). */
template <int LDT>
__global__ void __launch_bounds__(ATT_WARPS * 32) attn_vec_kernel(AttnArgs a, float *part, int n_splits, int untiled) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh) */
    constexpr int LPP = LDT / 4, DT = LDT % 4, HD = 8 * LPP, NWK = ATT_WARPS * 32 / LPP, GPC = CHUNK / AV_U;
    int t = blockIdx.x / a.n_kv_heads, kvh = blockIdx.x % a.n_kv_heads;
    if (untiled && attn_tile_is_mma(a.seq, a.n_tokens, t)) return; /* attention_mma.cu's token (block-uniform) */
    int G = a.n_heads / a.n_kv_heads, g0 = blockIdx.y * GROUP;
    int gn = G - g0 < GROUP ? G - g0 : GROUP;
    int sub = threadIdx.x % LPP, wk = threadIdx.x / LPP, lead = threadIdx.x / 32 * (32 / LPP), bs = a.block_size;
    int n = a.pos[t] + 1;
    const int32_t *bt = a.block_table + (size_t)a.seq[t] * a.bt_stride;
    size_t head0 = (size_t)t * a.n_heads + (size_t)kvh * G + g0;

    float q[GROUP][8], acc[GROUP][8], m[GROUP], l[GROUP];
#pragma unroll
    for (int g = 0; g < GROUP; g++) {
        m[g] = -INFINITY;
        l[g] = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            q[g][j] = g < gn ? a.q[(head0 + g) * HD + 8 * sub + j] : 0.f;
            acc[g][j] = 0.f;
        }
    }
    /* Worker wk takes the groups k = wk, wk + NWK, ... of AV_U positions of this block's chunks
     * (chunk z + (k / GPC) * n_splits, positions from (k % GPC) * AV_U in it: increasing in k).
     * A warp steps while its first worker (kl) has positions: the shuffles need the whole warp. */
    for (int k = wk, kl = lead;; k += NWK, kl += NWK) {
        if ((int)(blockIdx.z + kl / GPC * n_splits) * CHUNK + kl % GPC * AV_U >= n) break; /* warp-uniform */
        int i0 = (int)(blockIdx.z + k / GPC * n_splits) * CHUNK + k % GPC * AV_U;
        uint4 kr[AV_U], vr[AV_U];
        float ks[AV_U], vs[AV_U];
#pragma unroll
        for (int u = 0; u < AV_U; u++) { /* every load first: 2 AV_U in flight */
            int i = i0 + u;
            kr[u] = vr[u] = uint4{0u, 0u, 0u, 0u};
            ks[u] = vs[u] = 0.f;
            if (i < n) {
                size_t row = ((size_t)bt[i / bs] * a.n_kv_heads + kvh) * bs + i % bs, off = row * HD + 8 * sub;
                kr[u] = kv_raw8<DT>(a.k_cache, off);
                vr[u] = kv_raw8<DT>(a.v_cache, off);
                if (DT == KV_FP8) ks[u] = a.k_scale[row], vs[u] = a.v_scale[row];
            }
        }
        /* scores: each K row decoded once for the group's heads, then summed over the worker's lanes */
        float sc[GROUP][AV_U];
#pragma unroll
        for (int u = 0; u < AV_U; u++) {
            float kf[8];
#pragma unroll
            for (int j = 0; j < 8; j++) kf[j] = kv_raw_elem<DT>(kr[u], j, ks[u]);
#pragma unroll
            for (int g = 0; g < GROUP; g++) {
                float d = 0.f;
#pragma unroll
                for (int j = 0; j < 8; j++) d += q[g][j] * kf[j];
                sc[g][u] = d;
            }
        }
#pragma unroll
        for (int g = 0; g < GROUP; g++) {
            if (g >= gn) break; /* uniform across the block */
            float mx = -INFINITY;
#pragma unroll
            for (int u = 0; u < AV_U; u++) {
#pragma unroll
                for (int off = LPP / 2; off > 0; off >>= 1) sc[g][u] += __shfl_xor_sync(0xffffffffu, sc[g][u], off);
                sc[g][u] = i0 + u < n ? sc[g][u] * a.scale : -INFINITY;
                mx = fmaxf(mx, sc[g][u]);
            }
            float mn = fmaxf(m[g], mx), corr = rescale(m[g], mn);
            l[g] *= corr;
#pragma unroll
            for (int j = 0; j < 8; j++) acc[g][j] *= corr;
#pragma unroll
            for (int u = 0; u < AV_U; u++) {
                sc[g][u] = sc[g][u] == -INFINITY ? 0.f : expf(sc[g][u] - mn); /* past n; also a worker with none yet */
                l[g] += sc[g][u];
            }
            m[g] = mn;
        }
        /* P V: each V row decoded once */
#pragma unroll
        for (int u = 0; u < AV_U; u++) {
            float vf[8];
#pragma unroll
            for (int j = 0; j < 8; j++) vf[j] = kv_raw_elem<DT>(vr[u], j, vs[u]);
#pragma unroll
            for (int g = 0; g < GROUP; g++) {
                if (g >= gn) break;
#pragma unroll
                for (int j = 0; j < 8; j++) acc[g][j] += sc[g][u] * vf[j];
            }
        }
    }

    __shared__ float sm_m[NWK][GROUP], sm_l[NWK][GROUP];
    __shared__ float sm_acc[NWK][GROUP][HD]; /* 16 KB at every LPP */
#pragma unroll
    for (int g = 0; g < GROUP; g++) {
        if (sub == 0) {
            sm_m[wk][g] = m[g];
            sm_l[wk][g] = l[g];
        }
#pragma unroll
        for (int j = 0; j < 8; j++) sm_acc[wk][g][8 * sub + j] = acc[g][j];
    }
    __syncthreads();
    attn_block_merge<NWK, HD>(a, part, n_splits, sm_m, sm_l, sm_acc, gn, head0);
}

static int attn_vec_on = 1; /* cuda_attention_vec_enable */
extern "C" void cuda_attention_vec_enable(int on) { attn_vec_on = on != 0; }

/* attn_vec_kernel takes a: a BF16 / FP8 cache, head_dim 64, 128 or 256. */
static int attn_vec_fits(const AttnArgs *a) {
    return attn_vec_on && (a->kv_dtype == KV_BF16 || a->kv_dtype == KV_FP8) &&
           (a->head_dim == 64 || a->head_dim == 128 || a->head_dim == 256);
}

/* out: [rows, hd] f32; part: [n_splits, rows, hd + 2]. One block per row. */
__global__ void attn_merge_kernel(float *out, const float *part, int rows, int hd, int n_splits) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh) */
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
    constexpr int VT = DT == KV_F32 ? KV_BF16 : DT; /* no f32 instance of attn_vec_kernel */
    void (*k)(AttnArgs, float *, int, int);
    if (DT != KV_F32 && attn_vec_fits(a))
        k = a->head_dim == 64    ? attn_vec_kernel<4 * 8 + VT>
            : a->head_dim == 128 ? attn_vec_kernel<4 * 16 + VT>
                                 : attn_vec_kernel<4 * 32 + VT>;
    else
        k = J == 1 ? attn_kernel<4 + DT> : J == 2 ? attn_kernel<8 + DT>
            : J <= 4 ? attn_kernel<16 + DT> : attn_kernel<32 + DT>;
    pdl_launch(k, grid, dim3(ATT_WARPS * 32), 0, s, *a, part, n_splits, untiled);
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
    pdl_launch(attn_merge_kernel, dim3(rows), dim3(128), 0, (cudaStream_t)stream, out, part, rows, hd, n_splits);
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
