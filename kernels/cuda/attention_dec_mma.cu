/*
 * attention_dec_mma.cu - decode-shaped paged attention on tensor cores for
 * grouped query heads (GQA): the G query heads of a token that share one KV
 * head are the rows of one mma.sync m16n8k16 tile (G <= 16; rows past G are
 * zero and never written), so each K / V row is read once for the whole group
 * and its 2 G head_dim multiply-adds run on the tensor cores instead of the
 * CUDA cores (attention.cu's vector kernel spends ~6 instructions a cache byte
 * at G = 8 and cannot keep up with HBM). FlashInfer's decode offers the same
 * choice; vLLM takes it when G > 4, and so does the CUDA backend's attention op
 * (cuda_attention_dec_mma_fits, CUDA_ATTN_DEC_MMA_MIN_G).
 *
 * One block of DM_WARPS warps per (token, KV head, split). The token's
 * positions 0..pos[t] are cut into tiles of 16; worker w (warp w of split z is
 * worker z DM_WARPS + w of n_splits DM_WARPS) takes the tiles w, w + workers,
 * ... Each warp owns two stages of a K and a V tile [16, head_dim] bf16 in
 * shared memory (warp-private: no block barrier in the loop): the next tile
 * travels (BF16 cache: cp.async; FP8: 8-byte loads into registers, decoded to
 * bf16 after the mma work, as attention_mma.cu does) while the warp computes
 * S = Q K^T (two n-tiles of 8 positions), the online softmax of its 16 rows
 * in f32, and O += P V (ldmatrix .trans of V). Q and P enter the mmas as
 * bf16 hi + lo (pack_bf16_split: two mmas each, 16 significant bits), so the
 * scores and the weighted sum are f32-class against the CPU's f32 attention
 * (the f32 tolerance of tests/gpu/op_checks.h), where bf16 Q and P alone (the
 * prefill kernel's attn_bf16 class) moved a 2-layer model's decode logits
 * 2e-2 from the CPU's. Decode is bound by the cache's bytes: the doubled mma
 * work fits in what the tensor cores leave idle (2 G head_dim FMAs a K/V row
 * pair, 4 G with the split, against ~200 a byte of H200 tensor throughput).
 * FP8 row scales apply in f32, K's to the scores, V's to P before its split.
 * At the end the block's warps merge their states through shared memory into
 * out (n_splits == 1) or into this split's rows of part (attention.cu's layout
 * and merge kernel).
 *
 * Not here: f32 caches, head dims other than 64 / 128 (attention.cu), G > 16,
 * prefill-shaped batches (attention_mma.cu, which tiles query tokens instead).
 * Any token layout is correct (each token alone, causal by its pos), so mixed
 * batches' prefill tokens may come here too.
 * Reference: the CPU attention of backend_cpu.c (f32, two-pass softmax).
 */
#include <cuda_runtime.h>
#include <math.h>

#include "cp_async.cuh"
#include "cuda_check.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"
#include "cuda_pdl.cuh"
#include "kv_device.cuh"
#include "mma_tile.cuh"

#define DM_WARPS 2  /* warps a block (two stages of K and V each: 35 KB of shared memory at head_dim 128) */
#define DM_T 16     /* positions a tile: the k of one P V mma */
#define DM_PAD 8    /* bf16 of padding per shared row (ldmatrix rows on distinct banks) */
#define DM_SPLIT_MIN 256 /* fewest positions a split (cuda_attention_dec_mma_splits) */

/* A lane's share of one tile (K and V, 16 positions x HD / 8 chunks of 8 dims). */
#define DM_CHUNKS(HD) (DM_T * (HD) / 8 / 32)
template <int HD>
struct DmRegs { /* FP8 only: the raw chunks and the row scales until they are stored */
    uint2 k[DM_CHUNKS(HD)], v[DM_CHUNKS(HD)]; /* e4m3, zero past the last position */
    float ks, vs; /* lanes 0..15: the scales of position p0 + lane (0 past the last position) */
};

/* One stage of a warp: the K and V tiles [16, HD + pad] bf16, the FP8 row scales [16]. */
template <int HD>
struct DmStage {
    uint16_t k[DM_T * (HD + DM_PAD)], v[DM_T * (HD + DM_PAD)];
    float ks[DM_T], vs[DM_T];
};

/* Tile p0.. (positions past last zero) toward stage st: a BF16 cache by cp.async
 * (landing at the caller's wait), an FP8 one into r for dm_store. */
template <int HD, int DT>
static __device__ __forceinline__ void dm_fetch(const AttnArgs &a, const int32_t *bt, int kvh, int p0, int last,
                                                DmStage<HD> *st, DmRegs<HD> *r, int lane) {
    constexpr int LD = HD + DM_PAD;
#pragma unroll
    for (int k = 0; k < DM_CHUNKS(HD); k++) {
        int c = lane + 32 * k, i = c / (HD / 8), d = c % (HD / 8) * 8, p = p0 + i;
        bool in = p <= last;
        size_t row = in ? ((size_t)bt[p / a.block_size] * a.n_kv_heads + kvh) * a.block_size + p % a.block_size : 0;
        if (DT == KV_BF16) {
            cp_async16(&st->k[i * LD + d], (const uint16_t *)a.k_cache + row * HD + d, in);
            cp_async16(&st->v[i * LD + d], (const uint16_t *)a.v_cache + row * HD + d, in);
            continue;
        }
        r->k[k] = in ? __ldg((const uint2 *)((const uint8_t *)a.k_cache + row * HD + d)) : uint2{0u, 0u};
        r->v[k] = in ? __ldg((const uint2 *)((const uint8_t *)a.v_cache + row * HD + d)) : uint2{0u, 0u};
    }
    if (DT == KV_FP8) {
        int p = p0 + (lane & 15);
        bool in = lane < 16 && p <= last;
        size_t row = in ? ((size_t)bt[p / a.block_size] * a.n_kv_heads + kvh) * a.block_size + p % a.block_size : 0;
        r->ks = in ? __ldg(a.k_scale + row) : 0.f; /* masked: no stale NaN into 0 * scale */
        r->vs = in ? __ldg(a.v_scale + row) : 0.f;
    }
}

/* An FP8 tile fetched into r: decoded into stage st (nothing for BF16). */
template <int HD, int DT>
static __device__ __forceinline__ void dm_store(const DmRegs<HD> &r, DmStage<HD> *st, int lane) {
    constexpr int LD = HD + DM_PAD;
    if (DT == KV_FP8 && lane < 16) {
        st->ks[lane] = r.ks;
        st->vs[lane] = r.vs;
    }
#pragma unroll
    for (int k = 0; k < DM_CHUNKS(HD) * (DT == KV_FP8); k++) { /* (a loop bound: no unreachable code for BF16) */
        int c = lane + 32 * k, i = c / (HD / 8), d = c % (HD / 8) * 8;
        *(uint4 *)&st->k[i * LD + d] = mma_e4m3x8_bf16(r.k[k]);
        *(uint4 *)&st->v[i * LD + d] = mma_e4m3x8_bf16(r.v[k]);
    }
}

/* HDT = 4 * head_dim + DT (one template argument: the emulation's launch macro
 * splits on commas). Grid: (n_tokens * n_kv_heads, 1, n_splits); block:
 * DM_WARPS * 32 threads. part: [n_splits, n_tokens * n_heads, HD + 2]
 * (unnormalised acc..., max, sum) when n_splits > 1. */
template <int HDT>
__global__ void __launch_bounds__(DM_WARPS * 32) attn_dec_mma_kernel(AttnArgs a, float *part, int n_splits) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    constexpr int HD = HDT / 4, DT = HDT % 4, KS = HD / 16, ND = HD / 8, LD = HD + DM_PAD;
    /* two stages a warp; after the loop the same bytes hold the warps' states for the merge */
    constexpr size_t TILE_B = sizeof(DmStage<HD>) * 2 * DM_WARPS, MERGE_B = sizeof(float) * DM_WARPS * 16 * (HD + 2);
    __shared__ __align__(16) unsigned char smem[TILE_B > MERGE_B ? TILE_B : MERGE_B];
    int t = blockIdx.x / a.n_kv_heads, kvh = blockIdx.x % a.n_kv_heads, G = a.n_heads / a.n_kv_heads;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    int last = a.pos[t], workers = n_splits * DM_WARPS, wk = (int)blockIdx.z * DM_WARPS + warp;
    const int32_t *bt = a.block_table + (size_t)a.seq[t] * a.bt_stride;
    size_t head0 = (size_t)t * a.n_heads + (size_t)kvh * G; /* row of the group's first head in q / out */
    DmStage<HD> *stg = (DmStage<HD> *)smem + 2 * warp;

    /* Q fragments (A operand) as hi + lo: rows g, g + 8 = heads of the group, dims 16 kk + 2 tq (+1, +8, +9) */
    uint32_t qa[KS][4], ql[KS][4];
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int r = (j & 1) ? g + 8 : g, d = 16 * kk + 2 * tq + (j & 2 ? 8 : 0);
            float2 v = {0.f, 0.f};
            if (r < G) v = *(const float2 *)(a.q + (head0 + r) * HD + d);
            pack_bf16_split(v.x, v.y, &qa[kk][j], &ql[kk][j]);
        }
    }
    float o[ND][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

    DmRegs<HD> rg;
    int p0 = wk * DM_T, step = workers * DM_T, s = 0;
    if (p0 <= last) { /* warp-uniform */
        dm_fetch<HD, DT>(a, bt, kvh, p0, last, stg, &rg, lane);
        dm_store<HD, DT>(rg, stg, lane);
    }
    cp_async_commit();
    for (; p0 <= last; p0 += step, s ^= 1) {
        DmStage<HD> *cur = stg + s, *nxt = stg + (s ^ 1);
        int pn = p0 + step;
        if (pn <= last) dm_fetch<HD, DT>(a, bt, kvh, pn, last, nxt, &rg, lane); /* into the stage read two tiles ago */
        cp_async_commit();
        cp_async_wait<1>(); /* this lane's copies of the current tile landed */
        __syncwarp();       /* ... and every lane's, and the FP8 stores of the last iteration */

        /* S = Q K^T: n-tile nt holds positions p0 + 8 nt .. + 7 */
        float sc[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < KS; kk += 2) {
                /* B[k][n] = K[pos n][dim k]: matrices (positions 8 nt.., dims 16 kk + 8 j..), j = 0..3 */
                uint32_t b[4];
                ldsm_x4<false>(b, &cur->k[(8 * nt + (lane & 7)) * LD + 16 * kk + 8 * (lane >> 3)]);
                mma_bf16_16816(sc[nt], qa[kk], b);
                mma_bf16_16816(sc[nt], ql[kk], b);
                mma_bf16_16816(sc[nt], qa[kk + 1], b + 2);
                mma_bf16_16816(sc[nt], ql[kk + 1], b + 2);
            }
        }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = 8 * nt + 2 * tq + (e & 1);
                float f = DT == KV_FP8 ? a.scale * cur->ks[i] : a.scale;
                sc[nt][e] = p0 + i <= last ? sc[nt][e] * f : -INFINITY;
                mx[e >> 1] = fmaxf(mx[e >> 1], sc[nt][e]);
            }
        float corr[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2)); /* the row's quad */
            float mn = fmaxf(m[i], mx[i]); /* finite: the tile's first position is <= last */
            corr[i] = mma_corr(m[i], mn);
            m[i] = mn;
            l[i] *= corr[i];
        }
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                sc[nt][e] = expf(sc[nt][e] - m[e >> 1]); /* 0 past last */
                l[e >> 1] += sc[nt][e];
                if (DT == KV_FP8) sc[nt][e] *= cur->vs[8 * nt + 2 * tq + (e & 1)]; /* P V's rows carry V's scales */
            }
#pragma unroll
        for (int n = 0; n < ND; n++) {
            o[n][0] *= corr[0];
            o[n][1] *= corr[0];
            o[n][2] *= corr[1];
            o[n][3] *= corr[1];
        }
        /* O += P V: P's accumulator layout of n-tiles 0, 1 is the A layout of one k step of 16 positions */
        uint32_t pa[4], pl[4];
#pragma unroll
        for (int j = 0; j < 4; j++) pack_bf16_split(sc[j >> 1][2 * (j & 1)], sc[j >> 1][2 * (j & 1) + 1], &pa[j], &pl[j]);
#pragma unroll
        for (int n = 0; n < ND; n += 2) {
            /* B[k][n] = V[pos k][dim n], transposed: matrices (positions 8 (j & 1).., dims 8 (n + j / 2)..) */
            uint32_t b[4];
            ldsm_x4<true>(b, &cur->v[(8 * ((lane >> 3) & 1) + (lane & 7)) * LD + 8 * (n + (lane >> 4))]);
            mma_bf16_16816(o[n], pa, b);
            mma_bf16_16816(o[n], pl, b);
            mma_bf16_16816(o[n + 1], pa, b + 2);
            mma_bf16_16816(o[n + 1], pl, b + 2);
        }
        if (pn <= last) dm_store<HD, DT>(rg, nxt, lane); /* FP8: nxt's last reader was the previous iteration */
        __syncwarp(); /* every lane is done with cur before the next iteration's copies into it */
    }
    cp_async_wait<0>(); /* (only empty groups remain; every copy waited for before the merge reuses smem) */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }

    __syncthreads(); /* every warp is done with its tiles: smem becomes the merge area */
    float *sm = (float *)smem; /* [DM_WARPS][16][HD + 2]: acc..., max, sum */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float *row = sm + ((size_t)warp * 16 + g + 8 * i) * (HD + 2);
#pragma unroll
        for (int n = 0; n < ND; n++) *(float2 *)(row + 8 * n + 2 * tq) = float2{o[n][2 * i], o[n][2 * i + 1]};
        if (tq == 0) {
            row[HD] = m[i];
            row[HD + 1] = l[i];
        }
    }
    __syncthreads();
    size_t rows_total = (size_t)a.n_tokens * a.n_heads;
    for (int idx = threadIdx.x; idx < G * HD; idx += blockDim.x) {
        int r = idx / HD, d = idx % HD;
        float M = -INFINITY, L = 0.f, O = 0.f;
        for (int w = 0; w < DM_WARPS; w++) M = fmaxf(M, sm[((size_t)w * 16 + r) * (HD + 2) + HD]);
        for (int w = 0; w < DM_WARPS; w++) {
            const float *row = sm + ((size_t)w * 16 + r) * (HD + 2);
            float f = row[HD] == -INFINITY ? 0.f : expf(row[HD] - M); /* a warp with no tile: weight 0 */
            L += row[HD + 1] * f;
            O += row[d] * f;
        }
        if (n_splits == 1) {
            a.out[(head0 + r) * HD + d] = O / L;
        } else { /* a split with no tile writes the empty state (max -inf, sum 0): weight 0 in the merge */
            float *p = part + ((size_t)blockIdx.z * rows_total + head0 + r) * (HD + 2);
            p[d] = O;
            if (d == 0) {
                p[HD] = M;
                p[HD + 1] = L;
            }
        }
    }
}

extern "C" int cuda_attention_dec_mma_fits(const AttnArgs *a) {
    if (!a || (a->kv_dtype != KV_BF16 && a->kv_dtype != KV_FP8) || (a->head_dim != 64 && a->head_dim != 128) ||
        a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads)
        return 0;
    int G = a->n_heads / a->n_kv_heads;
    return G >= CUDA_ATTN_DEC_MMA_MIN_G && G <= CUDA_ATTN_DEC_MMA_MAX_G;
}

extern "C" int cuda_attention_dec_mma_splits(int n_tokens, int n_kv_heads, int max_ctx, int sm_count) {
    if (n_tokens <= 0 || n_kv_heads <= 0 || sm_count <= 0) return 1;
    long blocks = (long)n_tokens * n_kv_heads;
    if (blocks >= 4L * sm_count) return 1; /* 4 blocks an SM fit (registers: 64 threads of up to 255 at head_dim 128) */
    long s = (max_ctx + DM_SPLIT_MIN - 1) / DM_SPLIT_MIN, fill = (8L * sm_count + blocks - 1) / blocks;
    if (fill < s) s = fill;
    if (s > 64) s = 64;
    return s < 1 ? 1 : (int)s;
}

extern "C" int cuda_attention_dec_mma(const AttnArgs *a, float *part, int n_splits, void *stream) {
    if (!a || a->n_tokens < 0 || a->n_heads <= 0 || a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads ||
        a->n_heads / a->n_kv_heads > CUDA_ATTN_DEC_MMA_MAX_G || (a->head_dim != 64 && a->head_dim != 128) ||
        a->block_size <= 0 || a->bt_stride <= 0 || !a->out || !a->q || !a->k_cache || !a->v_cache || !a->pos ||
        !a->seq || !a->block_table || (a->kv_dtype != KV_BF16 && a->kv_dtype != KV_FP8) ||
        (a->kv_dtype == KV_FP8 && (!a->k_scale || !a->v_scale)) || n_splits < 1 || n_splits > 65535 ||
        (n_splits > 1 && !part))
        return -1;
    if (a->n_tokens == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    dim3 grid((unsigned)(a->n_tokens * a->n_kv_heads), 1, (unsigned)n_splits);
    int bf = a->kv_dtype == KV_BF16;
    void (*k)(AttnArgs, float *, int) =
        a->head_dim == 64 ? (bf ? attn_dec_mma_kernel<4 * 64 + KV_BF16> : attn_dec_mma_kernel<4 * 64 + KV_FP8>)
                          : (bf ? attn_dec_mma_kernel<4 * 128 + KV_BF16> : attn_dec_mma_kernel<4 * 128 + KV_FP8>);
    pdl_launch(k, grid, dim3(DM_WARPS * 32), 0, s, *a, part, n_splits);
    CUDA_CHECK_LAUNCH();
    return n_splits > 1 ? cuda_attention_merge(a->out, part, a->n_tokens * a->n_heads, a->head_dim, n_splits, s) : 0;
}
