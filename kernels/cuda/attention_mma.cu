/*
 * attention_mma.cu - prefill / chunked-prefill paged attention on tensor cores
 * (FlashAttention-2 style): one block of 4 warps per (tile of 64 consecutive
 * query tokens, query head); each warp owns 16 query rows, computes S = Q K^T
 * and O += P V with mma.sync m16n8k16 (bf16 inputs, f32 accumulators; sm_80+)
 * over tiles of 64 positions staged in shared memory, and keeps the online
 * softmax (max, sum) of its rows in f32. Q is rounded to bf16 when loaded, P to
 * bf16 before the P V product (the attn_bf16 tolerance class of
 * tests/gpu/op_checks.h); K / V are read from the BF16 cache as they are, or
 * from the FP8 e4m3 cache as their e4m3 values (exact in bf16) with the row
 * scales applied in f32: K's to the scores, V's to P before its rounding.
 *
 * Masking is per row, so any token layout is correct: a tile may hold tokens of
 * several sequences (each contiguous run of one sequence is a pass over that
 * sequence's positions 0..max pos of the run, the other rows masked), and row r
 * sees positions <= pos[r] (causal, also for chunks that start deep in an
 * existing context). A warp skips a position tile beyond all of its rows. Tiles
 * of more than two runs (decode tokens of a mixed batch) are left to the
 * CUDA-core kernel, launched after this one (attn_tiles.cuh).
 * GQA: query head h reads KV head h / (n_heads / n_kv_heads) (L2 shares it).
 *
 * K and V fragments come from shared memory through ldmatrix (V's transposed).
 * The tile loads overlap the mma work, FlashAttention-2's order with one
 * shared tile each: V of a tile travels while its scores are computed, K of
 * the next tile while P V runs; a BF16 cache's rows by cp.async (cp_async.cuh,
 * no registers), an FP8 cache's loaded into registers at the same points and
 * decoded to bf16 into shared memory after the mma work they overlap.
 * Long contexts: with n_splits > 1 (cuda_attention_mma_split) block z of a
 * tile takes the position tiles z, z + n_splits, ... and writes its rows'
 * unnormalised state to part; attention.cu's merge kernel combines them.
 * Not here: f32 KV caches, head dims other than 64 / 128 and decode-shaped
 * batches (attention.cu; cuda_attention_mma_fits says which), more than one
 * tile of K or V in flight (shared memory is 35 KB a block at head_dim 128).
 * Reference: the CPU attention of backend_cpu.c (f32, two-pass softmax).
 */
#include <math.h>

#include "attn_tiles.cuh"
#include "cp_async.cuh"
#include "cuda_check.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"
#include "cuda_pdl.cuh"
#include "kv_device.cuh"
#include "mma_tile.cuh"

#define MMA_WARPS 4
#define MMA_BQ CUDA_ATTN_MMA_TILE /* query rows per block, 16 per warp */
#define MMA_BK 64               /* positions per shared tile */
#define MMA_PAD 8               /* bf16 of padding per shared row (bank spread) */
#define MMA_SPLIT_MIN 1024      /* fewest positions per split (cuda_attention_mma_splits) */

/* A thread's share of an FP8 K or V tile on its way to shared memory: fetched
 * before the mma work it overlaps, decoded and stored after it (the BF16 tiles
 * travel by cp.async instead and leave this empty). */
#define MMA_CHUNKS(HD) (MMA_BK * (HD) / 8 / (MMA_WARPS * 32)) /* 8-element chunks a thread moves a tile */
template <int HD>
struct MmaTileRegs {
    uint2 q[MMA_CHUNKS(HD)]; /* e4m3, zero past maxp */
    float s[MMA_CHUNKS(HD)]; /* the row's scale for a chunk at dim 0, else 0 */
};

/* The K (or V) rows of position tile kv0 (positions past maxp zero) toward
 * the shared tile t [64, HD + pad] bf16: a BF16 cache by cp.async (the bytes
 * land at the caller's wait), an FP8 one into r for mma_tile_store. Nothing
 * when the tile starts past maxp. */
template <int HD, int DT>
static __device__ __forceinline__ void mma_tile_fetch(const AttnArgs &a, const void *cache, const float *scale,
                                                      const int32_t *bt, int kvh, int kv0, int maxp, uint16_t *t,
                                                      MmaTileRegs<HD> *r) {
    constexpr int LD = HD + MMA_PAD;
    if (kv0 > maxp) return; /* block-uniform */
#pragma unroll
    for (int k = 0; k < MMA_CHUNKS(HD); k++) {
        int c = threadIdx.x + k * MMA_WARPS * 32, i = c / (HD / 8), d = c % (HD / 8) * 8, p = kv0 + i;
        bool in = p <= maxp;
        size_t row = in ? ((size_t)bt[p / a.block_size] * a.n_kv_heads + kvh) * a.block_size + p % a.block_size : 0;
        if (DT == KV_BF16) {
            cp_async16(&t[i * LD + d], (const uint16_t *)cache + row * HD + d, in);
            continue;
        }
        r->q[k] = in ? __ldg((const uint2 *)((const uint8_t *)cache + row * HD + d)) : uint2{0u, 0u};
        r->s[k] = in && d == 0 ? __ldg(scale + row) : 0.f; /* masked: no stale NaN into 0 * scale */
    }
}

/* An FP8 tile fetched into r: decoded into t, its row scales into sc [64]. */
template <int HD, int DT>
static __device__ __forceinline__ void mma_tile_store(int kv0, int maxp, const MmaTileRegs<HD> &r, uint16_t *t,
                                                      float *sc) {
    constexpr int LD = HD + MMA_PAD;
    if (kv0 > maxp) return; /* block-uniform; a BF16 tile came by cp.async: no chunks below */
#pragma unroll
    for (int k = 0; k < MMA_CHUNKS(HD) * (DT == KV_FP8); k++) { /* (a loop bound: no unreachable code for BF16) */
        int c = threadIdx.x + k * MMA_WARPS * 32, i = c / (HD / 8), d = c % (HD / 8) * 8;
        if (d == 0) sc[i] = r.s[k];
        *(uint4 *)&t[i * LD + d] = mma_e4m3x8_bf16(r.q[k]);
    }
}

/* O += P V for one warp's 16 rows over a position tile: P (s, the exp'd
 * scores in the accumulator layout, FP8: scaled by V's row scales first, in
 * place) rounded to bf16, V's fragments from the shared tile sv through
 * ldmatrix .trans. o: [HD / 8][4] the warp's output accumulators. */
template <int HD, int DT>
static __device__ __forceinline__ void mma_pv(float (*s)[4], float (*o)[4], const uint16_t *sv, const float *s_vs,
                                              int lane, int tq) {
    constexpr int ND = HD / 8, LD = HD + MMA_PAD;
    if (DT == KV_FP8)
#pragma unroll
        for (int n = 0; n < MMA_BK / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[n][e] *= s_vs[8 * n + 2 * tq + (e & 1)]; /* P V's rows carry V's scales */
    /* P's accumulator layout of n tiles 2kk, 2kk + 1 is the A layout of k step kk */
#pragma unroll
    for (int kk = 0; kk < MMA_BK / 16; kk++) {
        uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                          pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int n = 0; n < ND; n += 2) {
            /* B[k][n] = V[pos k][dim n], transposed: matrices (positions 16kk + 8 (j & 1).., dims 8 (n + j / 2)..) */
            uint32_t b[4];
            ldsm_x4<true>(b, &sv[(16 * kk + 8 * ((lane >> 3) & 1) + (lane & 7)) * LD + 8 * (n + (lane >> 4))]);
            mma_bf16_16816(o[n], pa, b);
            mma_bf16_16816(o[n + 1], pa, b + 2);
        }
    }
}

/* HDT = 4 * head_dim + DT (one template argument: the emulation's launch macro
 * splits on commas). Grid: (ceil(n_tokens / 64), n_heads, n_splits); block:
 * 128 threads; registers for 4 blocks an SM at head_dim 64, 2 at 128 (their
 * shared tiles take 19 / 35 KB). part: see cuda_attention_mma_split (NULL when
 * n_splits == 1). */
template <int HDT>
__global__ void __launch_bounds__(MMA_WARPS * 32, HDT / 4 == 64 ? 4 : 2) attn_mma_kernel(AttnArgs a, float *part, int n_splits) {
    constexpr int HD = HDT / 4, DT = HDT % 4, KS = HD / 16, ND = HD / 8, LD = HD + MMA_PAD;
    __shared__ __align__(16) uint16_t sk[MMA_BK * LD], sv[MMA_BK * LD]; /* [64, HD (+pad)] bf16 */
    __shared__ float s_ks[MMA_BK], s_vs[MMA_BK]; /* FP8: the tile's row scales */
    __shared__ int s_pos[MMA_BQ], s_seq[MMA_BQ];
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    int t0 = blockIdx.x * MMA_BQ, h = blockIdx.y, kvh = h / (a.n_heads / a.n_kv_heads);
    int nrows = a.n_tokens - t0 < MMA_BQ ? a.n_tokens - t0 : MMA_BQ;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    int r0 = warp * 16 + g, r1 = r0 + 8; /* this lane's two rows in the tile */

    if (threadIdx.x < MMA_BQ) {
        int r = threadIdx.x;
        s_pos[r] = r < nrows ? a.pos[t0 + r] : -1;
        s_seq[r] = r < nrows ? a.seq[t0 + r] : -1;
    }
    /* Q fragments (A operand, row major): rows r0 / r1, dims 16 kk + 2 tq (+1, +8, +9) */
    uint32_t qa[KS][4];
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int r = (j & 1) ? r1 : r0, d = 16 * kk + 2 * tq + (j & 2 ? 8 : 0);
            float2 v = {0.f, 0.f};
            if (r < nrows) v = *(const float2 *)(a.q + ((size_t)(t0 + r) * a.n_heads + h) * HD + d);
            qa[kk][j] = pack_bf16(v.x, v.y);
        }
    }
    float o[ND][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    __syncthreads();
    int runs = 1;
    for (int r = 1; r < nrows; r++) runs += s_seq[r] != s_seq[r - 1];
    if (runs > ATTN_MMA_MAX_RUNS) { /* block-uniform: cuda_attention_untiled's tokens */
        /* split: an empty state (merged to a NaN that cuda_attention_untiled then overwrites), so
         * the merge reads no unwritten scratch */
        if (n_splits > 1 && threadIdx.x < nrows) {
            float *p = part + ((size_t)blockIdx.z * a.n_tokens * a.n_heads + (size_t)(t0 + threadIdx.x) * a.n_heads + h) *
                                  (HD + 2);
            for (int d = 0; d < HD; d++) p[d] = 0.f;
            p[HD] = -INFINITY;
            p[HD + 1] = 0.f;
        }
        return;
    }
    int p0 = s_pos[r0], p1 = s_pos[r1];

    for (int rs = 0; rs < nrows;) { /* one pass per contiguous run of one sequence (block-uniform) */
        int sq = s_seq[rs], re = rs, maxp = -1, wmax = -1;
        for (; re < nrows && s_seq[re] == sq; re++) {
            maxp = s_pos[re] > maxp ? s_pos[re] : maxp;
            if (re >> 4 == warp) wmax = s_pos[re] > wmax ? s_pos[re] : wmax;
        }
        bool in0 = r0 >= rs && r0 < re, in1 = r1 >= rs && r1 < re;
        const int32_t *bt = a.block_table + (size_t)sq * a.bt_stride;
        /* The tile loads overlap the mma work (FlashAttention-2's order): V of a tile travels
         * while its scores are computed, K of the next tile while P V runs. */
        int kv0 = (int)blockIdx.z * MMA_BK;
        MmaTileRegs<HD> rg;
        mma_tile_fetch<HD, DT>(a, a.k_cache, a.k_scale, bt, kvh, kv0, maxp, sk, &rg);
        cp_async_commit();
        mma_tile_store<HD, DT>(kv0, maxp, rg, sk, s_ks);
        for (; kv0 <= maxp; kv0 += MMA_BK * n_splits) {
            cp_async_wait<0>();
            __syncthreads(); /* this tile's K landed for every thread; every warp is done with the last V */
            mma_tile_fetch<HD, DT>(a, a.v_cache, a.v_scale, bt, kvh, kv0, maxp, sv, &rg);
            cp_async_commit();
            const bool act = kv0 <= wmax; /* warp-uniform: some row of this warp sees this tile */

            float s[MMA_BK / 8][4];
#pragma unroll
            for (int n = 0; n < MMA_BK / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
            if (act) {
#pragma unroll
                for (int n = 0; n < MMA_BK / 8; n++) {
#pragma unroll
                    for (int kk = 0; kk < KS; kk += 2) {
                        /* B[k][n] = K[pos n][dim k]: matrices (positions 8n.., dims 16kk + 8j..), j = 0..3 */
                        uint32_t b[4];
                        ldsm_x4<false>(b, &sk[(8 * n + (lane & 7)) * LD + 16 * kk + 8 * (lane >> 3)]);
                        mma_bf16_16816(s[n], qa[kk], b);
                        mma_bf16_16816(s[n], qa[kk + 1], b + 2);
                    }
                }
                float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
                for (int n = 0; n < MMA_BK / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int i = 8 * n + 2 * tq + (e & 1), p = kv0 + i;
                        bool ok = e < 2 ? in0 && p <= p0 : in1 && p <= p1;
                        float sc = DT == KV_FP8 ? a.scale * s_ks[i] : a.scale;
                        s[n][e] = ok ? s[n][e] * sc : -INFINITY;
                        mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
                    }
                float corr[2];
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
                    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2)); /* the row's quad */
                    float mn = fmaxf(m[i], mx[i]);
                    corr[i] = mma_corr(m[i], mn);
                    m[i] = mn;
                    l[i] *= corr[i];
                }
#pragma unroll
                for (int n = 0; n < MMA_BK / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float mn = m[e >> 1];
                        s[n][e] = mn == -INFINITY ? 0.f : expf(s[n][e] - mn);
                        l[e >> 1] += s[n][e];
                    }
#pragma unroll
                for (int n = 0; n < ND; n++) {
                    o[n][0] *= corr[0];
                    o[n][1] *= corr[0];
                    o[n][2] *= corr[1];
                    o[n][3] *= corr[1];
                }
            }
            mma_tile_store<HD, DT>(kv0, maxp, rg, sv, s_vs); /* sv is free: every warp passed the last barrier */
            cp_async_wait<0>();
            __syncthreads(); /* this tile's V landed for every thread; every warp is done with K */
            int kn = kv0 + MMA_BK * n_splits;
            mma_tile_fetch<HD, DT>(a, a.k_cache, a.k_scale, bt, kvh, kn, maxp, sk, &rg);
            cp_async_commit();
            if (act) mma_pv<HD, DT>(s, o, sv, s_vs, lane, tq);
            mma_tile_store<HD, DT>(kn, maxp, rg, sk, s_ks);
        }
        rs = re;
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int r = i ? r1 : r0;
        if (r >= nrows) continue;
        if (n_splits > 1) { /* this split's state: acc unnormalised, max, sum (attention.cu's part layout) */
            size_t row = (size_t)blockIdx.z * a.n_tokens * a.n_heads + (size_t)(t0 + r) * a.n_heads + h;
            float *p = part + row * (HD + 2);
#pragma unroll
            for (int n = 0; n < ND; n++) *(float2 *)(p + 8 * n + 2 * tq) = float2{o[n][2 * i], o[n][2 * i + 1]};
            if (tq == 0) {
                p[HD] = m[i];
                p[HD + 1] = l[i];
            }
            continue;
        }
        float inv = 1.f / l[i];
        float *out = a.out + ((size_t)(t0 + r) * a.n_heads + h) * HD + 2 * tq;
#pragma unroll
        for (int n = 0; n < ND; n++) *(float2 *)(out + 8 * n) = float2{o[n][2 * i] * inv, o[n][2 * i + 1] * inv};
    }
}

extern "C" int cuda_attention_mma_fits(const AttnArgs *a) {
    return a && (a->kv_dtype == KV_BF16 || a->kv_dtype == KV_FP8) && (a->head_dim == 64 || a->head_dim == 128) &&
           a->n_seqs > 0 && a->n_tokens >= CUDA_ATTN_MMA_MIN_Q * a->n_seqs;
}

extern "C" int cuda_attention_mma(const AttnArgs *a, void *stream) { return cuda_attention_mma_split(a, NULL, 1, stream); }

extern "C" int cuda_attention_mma_splits(int n_tokens, int n_heads, int max_ctx, int sm_count) {
    if (n_tokens <= 0 || n_heads <= 0 || sm_count <= 0) return 1;
    long blocks = (long)(n_tokens + MMA_BQ - 1) / MMA_BQ * n_heads;
    if (blocks >= sm_count) return 1;
    /* each split at least MMA_SPLIT_MIN positions (the Q load and the merge amortised); two blocks per SM */
    long s = (max_ctx + MMA_SPLIT_MIN - 1) / MMA_SPLIT_MIN, fill = (2L * sm_count + blocks - 1) / blocks;
    if (fill < s) s = fill;
    if (s > 32) s = 32;
    return s < 1 ? 1 : (int)s;
}

extern "C" int cuda_attention_mma_split(const AttnArgs *a, float *part, int n_splits, void *stream) {
    if (!a || a->n_tokens < 0 || a->n_heads <= 0 || a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads ||
        (a->head_dim != 64 && a->head_dim != 128) || a->block_size <= 0 || a->bt_stride <= 0 || !a->out || !a->q ||
        !a->k_cache || !a->v_cache || !a->pos || !a->seq || !a->block_table ||
        (a->kv_dtype != KV_BF16 && a->kv_dtype != KV_FP8) || (a->kv_dtype == KV_FP8 && (!a->k_scale || !a->v_scale)) ||
        n_splits < 1 || n_splits > 65535 || (n_splits > 1 && !part))
        return -1;
    if (a->n_tokens == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    dim3 grid((unsigned)((a->n_tokens + MMA_BQ - 1) / MMA_BQ), (unsigned)a->n_heads, (unsigned)n_splits);
    void (*k)(AttnArgs, float *, int) = a->head_dim == 64 ? (a->kv_dtype == KV_BF16 ? attn_mma_kernel<4 * 64 + KV_BF16>
                                                                                     : attn_mma_kernel<4 * 64 + KV_FP8>)
                                        : a->kv_dtype == KV_BF16 ? attn_mma_kernel<4 * 128 + KV_BF16>
                                                                 : attn_mma_kernel<4 * 128 + KV_FP8>;
    pdl_launch(k, grid, dim3(MMA_WARPS * 32), 0, s, *a, part, n_splits);
    CUDA_CHECK_LAUNCH();
    if (n_splits > 1 && cuda_attention_merge(a->out, part, a->n_tokens * a->n_heads, a->head_dim, n_splits, s)) return -1;
    if (a->n_seqs == 1) return 0; /* one sequence: every tile is one run */
    return cuda_attention_untiled(a, stream);
}
