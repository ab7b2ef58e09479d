/*
 * moe_route.cu - MoE routing on the device (Backend.moe_route of the CUDA
 * backend; backend.h MoeRouteArgs): router logits [n, E] f32 -> top-k expert
 * ids (rows of ids_ld) and weights, then the (token, k) pairs counting-sorted by expert
 * (offsets, pair lists, the inverse permutation, the active experts). One
 * launch up to MR_FUSED_MAX tokens, two above, sized by n only, so a decode
 * step of a MoE model needs no host read and can be captured in a graph. At
 * up to CUDA_GEMV_MAX_N tokens and 256 experts the router's BF16 GEMV can take
 * the routing as its epilogue (cuda_moe_router_route: the last block to finish
 * its tile of the logits routes them), one launch instead of two with the
 * bits of both.
 * Reference: cpu_moe_route (kernels/cpu/cpu_moe.c). The ids, offsets and pair
 * lists are identical to it away from near ties (two experts whose p differ
 * by about an ulp: the softmax's sum is a warp tree here, sequential there,
 * and CUDA's expf is not glibc's); the weights agree within f32 rounding.
 * Not here: the experts' matmuls (moe_gemm.cu).
 */
#include "cuda_check.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"
#include "cuda_pdl.cuh"
#include "gemv_tile.cuh"

#define MR_WARPS 4                           /* tokens per block, one warp each */
#define MR_PER_LANE (MOE_MAX_EXPERTS / 32)   /* expert slots per lane: e = lane + 32 j */
#define MP_THREADS MOE_MAX_EXPERTS           /* the permutation: one thread per expert */
#define MP_CHUNK 2048                        /* ids staged in shared memory per pass */
#define MR_FUSED_MAX 64                      /* up to this many tokens: one launch (decode) */

/* One warp per token: softmax over the experts (max and sum as warp trees), then
 * top_k rounds of a warp argmax over the untaken experts (p descending, ties to
 * the lower id, as the CPU's strict > over ascending ids). Lane k keeps round k. */
static __device__ __forceinline__ void topk_warp(const MoeRouteArgs &a, int t, int lane) {
    int E = a.n_experts, K = a.top_k;
    const float *l = a.logits + (size_t)t * E;
    float v[MR_PER_LANE], mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < MR_PER_LANE; j++) {
        int e = lane + 32 * j;
        v[j] = e < E ? __ldcg(l + e) : -INFINITY; /* through L2: moe_router_route_kernel's other blocks wrote them */
        mx = fmaxf(mx, v[j]);
    }
    mx = warp_max(mx);
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < MR_PER_LANE; j++) {
        int e = lane + 32 * j;
        v[j] = e < E ? expf(v[j] - mx) : 0.f;
        sum += v[j];
    }
    sum = warp_sum(sum);
#pragma unroll
    for (int j = 0; j < MR_PER_LANE; j++) v[j] /= sum;
    uint32_t taken = 0; /* bit j: expert lane + 32 j is chosen (or does not exist) */
#pragma unroll
    for (int j = 0; j < MR_PER_LANE; j++)
        if (lane + 32 * j >= E) taken |= 1u << j;
    float my_w = 0.f, wsum = 0.f;
    int my_id = 0;
    for (int k = 0; k < K; k++) {
        float bv = -1.f, be = 1e9f; /* p >= 0: -1 loses to any expert left */
#pragma unroll
        for (int j = 0; j < MR_PER_LANE; j++)
            if (!((taken >> j) & 1u) && v[j] > bv) {
                bv = v[j];
                be = (float)(lane + 32 * j); /* < 2^24: exact */
            }
        for (int off = 16; off > 0; off >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, off), oe = __shfl_xor_sync(0xffffffffu, be, off);
            if (ov > bv || (ov == bv && oe < be)) {
                bv = ov;
                be = oe;
            }
        }
        int e = (int)be;
        if ((e & 31) == lane) taken |= 1u << (e >> 5);
        if (lane == k) {
            my_w = bv;
            my_id = e;
        }
        wsum += bv; /* in k order, as the CPU */
    }
    if (lane < K) {
        a.ids[(size_t)t * a.ids_ld + lane] = my_id;
        a.weights[(size_t)t * K + lane] = a.norm ? my_w / wsum : my_w;
    }
}

__global__ void __launch_bounds__(MR_WARPS * 32) moe_topk_kernel(MoeRouteArgs a) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    int t = blockIdx.x * MR_WARPS + (threadIdx.x >> 5);
    if (t < a.n) topk_warp(a, t, threadIdx.x & 31); /* whole warps: no block barrier */
}

/* Pairs [c0, c0 + m) in (token, k) order (pair g: ids[g / top_k][g % top_k])
 * into shared sid by the whole block, barriers on both sides (the previous
 * chunk's readers are done; this chunk is complete). */
static __device__ __forceinline__ void stage_ids(int32_t *sid, const MoeRouteArgs &a, int c0, int m) {
    __syncthreads();
    for (int i = threadIdx.x; i < m; i += blockDim.x) {
        int g = c0 + i;
        sid[i] = a.ids[(size_t)(g / a.top_k) * a.ids_ld + g % a.top_k];
    }
    __syncthreads();
}

/* One block, thread e owns expert e: counts its pairs, the offsets are a scan
 * (thread 0, in expert order), then it places its pairs walking the ids in
 * (token, k) order, so tokens are ascending within an expert without atomics. */
static __device__ __forceinline__ void perm_block(const MoeRouteArgs &a) {
    __shared__ int32_t sid[MP_CHUNK];
    __shared__ int32_t start[MOE_MAX_EXPERTS];
    int e = threadIdx.x, E = a.n_experts, K = a.top_k, NK = a.n * K, cnt = 0;
    for (int c0 = 0; c0 < NK; c0 += MP_CHUNK) {
        int m = NK - c0 < MP_CHUNK ? NK - c0 : MP_CHUNK;
        stage_ids(sid, a, c0, m);
        if (e < E)
            for (int i = 0; i < m; i++) cnt += sid[i] == e;
    }
    if (e < E) start[e] = cnt;
    __syncthreads();
    if (threadIdx.x == 0) {
        int s = 0, na = 0;
        for (int j = 0; j < E; j++) {
            int c = start[j];
            start[j] = s;
            a.offsets[j] = s;
            s += c;
            if (c) a.active[na++] = j;
        }
        a.offsets[E] = s;
        for (int j = na; j < E; j++) a.active[j] = -1;
    }
    __syncthreads();
    int p = e < E ? start[e] : 0;
    for (int c0 = 0; c0 < NK; c0 += MP_CHUNK) {
        int m = NK - c0 < MP_CHUNK ? NK - c0 : MP_CHUNK;
        stage_ids(sid, a, c0, m);
        if (e < E)
            for (int i = 0; i < m; i++)
                if (sid[i] == e) {
                    int g = c0 + i;
                    a.pair_tok[p] = g / K;
                    a.pair_w[p] = a.weights[g];
                    a.pair_of[g] = p++;
                }
    }
}

__global__ void __launch_bounds__(MP_THREADS) moe_perm_kernel(MoeRouteArgs a) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    perm_block(a);
}

/* Small n (decode): both phases in one block, warps taking tokens in turn; the
 * barrier makes the ids and weights written to global memory visible to the
 * whole block before the permutation reads them. */
__global__ void __launch_bounds__(MP_THREADS) moe_route_fused_kernel(MoeRouteArgs a) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    for (int t = threadIdx.x >> 5; t < a.n; t += MP_THREADS / 32) topk_warp(a, t, threadIdx.x & 31);
    __syncthreads();
    perm_block(a);
}

/* The router's GEMV with the routing as its epilogue (cuda_moe_router_route): after its tile of the
 * logits, each block counts itself done (*done); the last one (every logit written) runs
 * moe_route_fused_kernel's body on them (cuda_device.cuh last_block_done; topk_warp reads the
 * logits through L2). blockDim.x >= n_experts (perm_block's thread per
 * expert): the launcher's rule. Not inlined: its shared staging and registers stay out of the tile's. */
static __device__ __noinline__ void route_last_block(const MoeRouteArgs &a, uint32_t *done) {
    if (!last_block_done(done, gridDim.x)) return; /* the whole block */
    for (int t = threadIdx.x >> 5; t < a.n; t += blockDim.x >> 5) topk_warp(a, t, threadIdx.x & 31);
    __syncthreads();
    perm_block(a);
}

/* NT tokens: logits [NT, E] = x @ router^T by gemv_tile.cuh's tile (the bits of cuda_gemv_bf16's
 * tiled GEMV, its L2 prefetch included), block b owning router rows [4 b, 4 b + 4); then the routing. */
template <int NT>
__global__ void __launch_bounds__(GT_WARPS * 32) moe_router_route_kernel(GemvArgs g, int prefetch, MoeRouteArgs a,
                                                                         uint32_t *done) {
    if (prefetch) gemv_tile_prefetch<0>(g, blockIdx.x);
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access but the prefetch */
    gemv_tile<NT, 0>(g, blockIdx.x);
    route_last_block(a, done);
}

/* cuda_moe_route's argument rules. */
static int route_args_ok(const MoeRouteArgs *args) {
    return args && args->n >= 0 && args->n_experts >= 1 && args->n_experts <= MOE_MAX_EXPERTS && args->top_k >= 1 &&
           args->top_k <= MOE_MAX_TOPK && args->top_k <= args->n_experts && args->logits && args->ids &&
           args->weights && args->offsets && args->pair_tok && args->pair_w && args->pair_of && args->active &&
           (!args->ids_ld || args->ids_ld >= args->top_k);
}

extern "C" int cuda_moe_router_route(const MoeRouteArgs *args, const float *x, const uint16_t *W, int cols,
                                     uint32_t *done, void *stream) {
    if (!route_args_ok(args) || args->n < 1 || args->n > CUDA_GEMV_MAX_N || args->n_experts > GT_WARPS * 32 ||
        !x || !W || !done || cols <= 0 || cols % 8 || ((uintptr_t)W & 15) || ((uintptr_t)x & 15))
        return -1;
    MoeRouteArgs a = *args;
    if (!a.ids_ld) a.ids_ld = a.top_k;
    /* logits is const for the routing that reads it; here the GEMV writes it first (the caller's
     * writable buffer, as cu_matmul's out) */
    GemvArgs g = gemv_args((float *)a.logits, x, W, NULL, a.n_experts, cols);
    void (*k)(GemvArgs, int, MoeRouteArgs, uint32_t *) = NULL;
    switch (a.n) {
    case 1: k = moe_router_route_kernel<1>; break;
    case 2: k = moe_router_route_kernel<2>; break;
    case 3: k = moe_router_route_kernel<3>; break;
    case 4: k = moe_router_route_kernel<4>; break;
    case 5: k = moe_router_route_kernel<5>; break;
    case 6: k = moe_router_route_kernel<6>; break;
    case 7: k = moe_router_route_kernel<7>; break;
    default: k = moe_router_route_kernel<8>; break;
    }
    pdl_launch(k, dim3((a.n_experts + GT_ROWS - 1) / GT_ROWS), dim3(GT_WARPS * 32), 0, (cudaStream_t)stream, g,
               cuda_gemv_prefetch_enabled(), a, done);
    CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int cuda_moe_route(const MoeRouteArgs *args, void *stream) {
    if (!route_args_ok(args)) return -1;
    if (args->n == 0) return 0;
    MoeRouteArgs a = *args;
    if (!a.ids_ld) a.ids_ld = a.top_k;
    cudaStream_t s = (cudaStream_t)stream;
    if (a.n <= MR_FUSED_MAX) {
        pdl_launch(moe_route_fused_kernel, dim3(1), dim3(MP_THREADS), 0, s, a);
        CUDA_CHECK_LAUNCH();
        return 0;
    }
    pdl_launch(moe_topk_kernel, dim3((a.n + MR_WARPS - 1) / MR_WARPS), dim3(MR_WARPS * 32), 0, s, a);
    CUDA_CHECK_LAUNCH();
    pdl_launch(moe_perm_kernel, dim3(1), dim3(MP_THREADS), 0, s, a);
    CUDA_CHECK_LAUNCH();
    return 0;
}
