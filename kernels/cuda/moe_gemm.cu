/*
 * moe_gemm.cu - the routed experts' linears of one MoE layer in one launch
 * each (grouped GEMV), and the weighted unpermute that sums each token's
 * expert outputs back into its row. The pairs come from moe_route.cu: x and
 * out rows are in pair order (by expert, tokens ascending), so expert e's
 * rows are [offsets[e], offsets[e + 1]). The grid is min(E, n_pairs) expert
 * slots x row tiles, read from the device's active list: no size depends on a
 * host read of the routing (graph-capturable); empty slots exit at once.
 * Each block runs gemv_tile.cuh (the decode GEMV's tile and its BF16 / FP8
 * decoders) over its expert's rows, up to 1, 2, 4 or 8 pairs per pass: the
 * bucket of the caller's max_cnt (the step's tokens), so a one-token decode
 * step runs a one-pair tile at its registers (sm_90, FP8: 106 instead of 255
 * with spills; BF16 56, NVFP4 80) and more blocks fit an SM.
 * FP8 experts run weight-only here also when their activations would be
 * quantized (act_quant) in steps below the experts' crossover (measured at
 * start-up, as cu_matmul's weight-only GEMV below a matrix's).
 * Reference: forward.c's per-expert loop on the CPU backend (cpu_matmul_rows
 * per expert, cpu_axpy into the token rows in expert order).
 * NVFP4 experts likewise, weight-only, each expert's scale2 read through a
 * device table of pointers to its WeightMat.dev_s2 (a delta that re-quantizes
 * an expert rewrites that float in place, and a captured graph reads it).
 * Steps of more than CUDA_GEMV_MAX_N tokens run moe_mma.cu instead (the
 * tensor-core grouped GEMM), and so do smaller ones from the experts' measured
 * record on (WeightMat.mma_min_n), so here an expert normally takes one pass.
 * At one or two tokens gate and up run in one launch with the SwiGLU
 * epilogue (cuda_moe_gemv_swiglu: the bits of the two launches it replaces),
 * and at one token it reads x's token rows through x_row instead of a
 * gathered copy; down takes the unpermute as its epilogue at up to
 * CUDA_GEMV_MAX_N tokens (cuda_moe_gemv_unpermute: a row tile's last block,
 * counted in a device array, sums the tile's rows of every token, the bits
 * of moe_unpermute_kernel): three launches fewer per MoE layer of a batch-1
 * decode step, one at 2-8 tokens. At one token it can also take the residual
 * add and the next RMSNorm (the last tile norms the row: add_rmsnorm's bits),
 * one launch fewer again.
 * Not here: shapes the 16-byte tile path does not take.
 */
#include "cuda_check.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"
#include "cuda_pdl.cuh"
#include "gemv_tile.cuh"
#include "rmsnorm_device.cuh"

static_assert(CUDA_MOE_TILE_ROWS == GT_ROWS, "cuda_kernels.h's row tile of the grouped GEMV is gemv_tile.cuh's");
static_assert(GT_WARPS * 32 == RMS_THREADS, "the last row tile's block norms with rmsnorm_kernel's block");

/* FN = 16 * FMT + NM (one template argument: the emulation's launch macro splits
 * on commas): NM pairs at most a pass (1, 2, 4, 8), so the kernel's registers are
 * those of gemv_tile<NM> (255 with spills at 8 FP8 pairs, the decode step of one
 * token needing a one-pair tile). */
/* Expert e of segment S as gemv_tile.cuh's matrix over cols columns (x and out set per pass). */
template <int FMT>
static __device__ __forceinline__ GemvArgs moe_expert_args(const CudaMoeSeg *S, int e, int cols) {
    GemvArgs a = {};
    a.W = (const uint4 *)S->w[e];
    a.rows = S->rows;
    a.cols = cols;
    if (FMT == 1) {
        a.S = (const float *)S->s[e];
        a.br = S->br;
        a.bc = S->bc;
        a.sc = (cols + S->bc - 1) / S->bc;
    }
    if (FMT == 2) {
        a.SF = (const uint16_t *)S->s[e];
        a.scale2 = (const float *)S->s2[e];
    }
    return a;
}

/* The weighted unpermute's two halves, shared by moe_unpermute_kernel and the down GEMV's epilogue
 * so their bits are one expression: token t's top_k pairs sorted by position (= ascending expert:
 * the CPU's order of scale_add_rows) with their weights, by one thread (insertion sort of <= 32);
 * then element c of its weighted sum over y [pairs, dim] in that order (y through L2: the
 * epilogue reads rows other blocks wrote). */
static __device__ __forceinline__ void unpermute_sort(const int32_t *pair_of, const float *weights, int K,
                                                      int32_t *sp, float *sw) {
    for (int k = 0; k < K; k++) {
        int p = pair_of[k], j = k;
        float w = weights[k];
        for (; j > 0 && sp[j - 1] > p; j--) {
            sp[j] = sp[j - 1];
            sw[j] = sw[j - 1];
        }
        sp[j] = p;
        sw[j] = w;
    }
}
static __device__ __forceinline__ float unpermute_sum(const int32_t *sp, const float *sw, int K, const float *y,
                                                      int dim, int c) {
    float acc = 0.f;
    for (int k = 0; k < K; k++) acc = __fadd_rn(acc, __fmul_rn(sw[k], __ldcg(y + (size_t)sp[k] * dim + c)));
    return acc;
}

/* The unpermute epilogue of the down GEMV (cuda_moe_gemv_unpermute), after the block's pair rows of
 * row tile `tile` are in y [n_pairs, rows]: every block counts itself done for its tile (empty
 * expert slots too: the count is the slots), and the tile's last block (cuda_device.cuh
 * last_block_done) writes out[t, r] for the tile's rows of every token t; with an.x (one token) it
 * adds them into the residual instead, and the last of the `tiles` tiles' last blocks norms it
 * (rms_add_norm_last: add_rmsnorm's bits). B 1 there: a row past 1024 columns is read twice, no
 * registers held across the norm.
 * Not inlined: inlined, it raised the one- and two-pair kernels' registers (sm_90a: NVFP4 one pair 80
 * to 110, BF16 two pairs 80 to 106). The structs by value: a reference to a kernel parameter made
 * every thread copy them to its stack at the kernel's start (nvcc, sm_90a: 168 bytes, 21 stores a
 * thread, against a one-pair block's 12 weights a thread), by value nothing; the one-pair kernels then
 * take BF16 55, FP8 80, NVFP4 80 registers (were 44, 80, 64 with a 48-byte copy; checked with
 * nvcc --resource-usage and the SASS: no local memory at all). */
static __device__ __noinline__ void moe_unpermute_tile(CudaMoeUnpermute u, RmsAddNorm an, const float *y,
                                                       int rows, int tile, int slots, int tiles) {
    __shared__ int32_t sp[CUDA_GEMV_MAX_N][MOE_MAX_TOPK];
    __shared__ float sw[CUDA_GEMV_MAX_N][MOE_MAX_TOPK];
    if (!last_block_done(u.tile_done + tile, (unsigned)slots)) return; /* the whole block */
    int K = u.top_k, i = threadIdx.x;
    if (i < u.n) unpermute_sort(u.pair_of + (size_t)i * K, u.weights + (size_t)i * K, K, sp[i], sw[i]);
    __syncthreads();
    int t = i / GT_ROWS, r = tile * GT_ROWS + i % GT_ROWS;
    if (t < u.n && r < rows) {
        float v = unpermute_sum(sp[t], sw[t], K, y, rows, r);
        if (an.x) an.x[r] = an.x[r] + v; /* n = 1: add_rmsnorm's x + y, y what out would hold */
        else u.out[(size_t)t * rows + r] = v;
    }
    if (an.x) rms_add_norm_last<1>(an, rows, (unsigned)tiles);
}

/* u.out NULL: the grouped GEMV alone (cuda_moe_gemv); else with the unpermute epilogue over seg 0
 * (cuda_moe_gemv_unpermute), and an.x non-NULL: the residual add and the norm after it. */
template <int FN>
__global__ void __launch_bounds__(GT_WARPS * 32) moe_gemv_kernel(CudaMoeGemv g, CudaMoeUnpermute u, RmsAddNorm an) {
    constexpr int FMT = FN / 16, NM = FN % 16;
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access (which expert is a read) */
    int slot = blockIdx.x / g.tiles, tile = blockIdx.x % g.tiles;
    int e = g.active[slot];
    if (e < 0) { /* the whole block; with the epilogue it still counts itself done */
        if (u.out) moe_unpermute_tile(u, an, g.seg[0].out, g.seg[0].rows, tile, gridDim.x / g.tiles, g.tiles);
        return;
    }
    int sg = tile < g.tiles0 ? 0 : 1;
    if (sg) tile -= g.tiles0;
    const CudaMoeSeg *S = &g.seg[sg];
    int p0 = g.offsets[e], cnt = g.offsets[e + 1] - p0;
    GemvArgs a = moe_expert_args<FMT>(S, e, g.cols);
    for (int c0 = 0; c0 < cnt; c0 += NM) {
        a.x = g.x + (size_t)(p0 + c0) * g.cols;
        a.out = S->out + (size_t)(p0 + c0) * S->rows;
        switch (cnt - c0 < NM ? cnt - c0 : NM) { /* cases above NM cannot occur: their tile is NM's */
        case 1: gemv_tile<1, FMT>(a, tile); break;
        case 2: gemv_tile<(NM < 2 ? NM : 2), FMT>(a, tile); break;
        case 3: gemv_tile<(NM < 3 ? NM : 3), FMT>(a, tile); break;
        case 4: gemv_tile<(NM < 4 ? NM : 4), FMT>(a, tile); break;
        case 5: gemv_tile<(NM < 5 ? NM : 5), FMT>(a, tile); break;
        case 6: gemv_tile<(NM < 6 ? NM : 6), FMT>(a, tile); break;
        case 7: gemv_tile<(NM < 7 ? NM : 7), FMT>(a, tile); break;
        default: gemv_tile<NM, FMT>(a, tile); break;
        }
        __syncthreads(); /* the next pass reuses the tile's shared partial sums */
    }
    if (u.out) moe_unpermute_tile(u, an, S->out, S->rows, tile, gridDim.x / g.tiles, g.tiles);
}

/* Gate (seg 0) and up (seg 1) with the SwiGLU epilogue (gemv_tile_swiglu): a block takes the same
 * row tile of both for its expert's pairs, NM (1 or 2) a pass, and writes act [n_pairs, rows] =
 * silu(gate) * up, the bits of moe_gemv_kernel then swiglu_kernel; the segments' out are not written. */
template <int FN>
__global__ void __launch_bounds__(GT_WARPS * 32) moe_gemv_swiglu_kernel(CudaMoeGemv g, float *act) {
    constexpr int FMT = FN / 16, NM = FN % 16;
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access (which expert is a read) */
    int slot = blockIdx.x / g.tiles, tile = blockIdx.x % g.tiles;
    int e = g.active[slot];
    if (e < 0) return; /* the whole block */
    int p0 = g.offsets[e], cnt = g.offsets[e + 1] - p0;
    GemvArgs ga = moe_expert_args<FMT>(&g.seg[0], e, g.cols), ua = moe_expert_args<FMT>(&g.seg[1], e, g.cols);
    for (int c0 = 0; c0 < cnt; c0 += NM) {
        int xr = NM == 1 && g.x_row ? __ldg(g.x_row + p0 + c0) : p0 + c0; /* NM 2: no x_row (the launcher) */
        ga.x = ua.x = g.x + (size_t)xr * g.cols;
        float *out = act + (size_t)(p0 + c0) * ga.rows;
        if (NM == 1 || cnt - c0 == 1) gemv_tile_swiglu<1, FMT>(ga, ua, out, tile);
        else gemv_tile_swiglu<(NM < 2 ? NM : 2), FMT>(ga, ua, out, tile);
        __syncthreads(); /* the next pass reuses the tile's shared partial sums */
    }
}

extern "C" int cuda_moe_args_ok(const CudaMoeGemv *g) {
    if (!g || g->nseg < 1 || g->nseg > 2 || g->fmt < 0 || g->fmt > 3 || !g->offsets || !g->active ||
        g->n_experts < 1 || g->n_pairs < 0 || g->cols <= 0)
        return 0;
    int fp8 = g->fmt == 1 || g->fmt == 3;
    if (g->fmt == 3 ? !g->xq || !g->xs || g->xs_stride < 0 || ((uintptr_t)g->xq & 15)
                    : !g->x || g->cols % (8 << g->fmt) || ((uintptr_t)g->x & 15))
        return 0;
    for (int i = 0; i < g->nseg; i++) {
        const CudaMoeSeg *S = &g->seg[i];
        if (!S->out || !S->w || S->rows <= 0 || (fp8 && (!S->s || S->br <= 0 || S->bc <= 0)) ||
            (g->fmt == 1 && S->bc % 16 && S->bc < g->cols) ||
            (g->fmt == 3 && !cuda_moe_gemm_fp8_native(S->bc, g->cols)) || (g->fmt == 2 && (!S->s || !S->s2)))
            return 0;
    }
    return 1;
}

/* The most pairs one expert may have in this launch, capped at CUDA_GEMV_MAX_N (max_cnt 0: unknown). */
static int moe_max_cnt(const CudaMoeGemv *g) {
    return g->max_cnt > 0 && g->max_cnt < CUDA_GEMV_MAX_N ? g->max_cnt : CUDA_GEMV_MAX_N;
}
/* Expert slots (at most the active experts, which the kernels read from g->active) x row tiles. */
static unsigned moe_blocks(const CudaMoeGemv *g) {
    int slots = g->n_experts < g->n_pairs ? g->n_experts : g->n_pairs;
    return (unsigned)slots * (unsigned)g->tiles;
}

/* cuda_moe_gemv's launch, with the unpermute epilogue when u->out (cuda_moe_gemv_unpermute), and the
 * add + norm after it when an->x. */
static void moe_gemv_launch(CudaMoeGemv *g, const CudaMoeUnpermute *u, const RmsAddNorm *an, cudaStream_t s) {
    g->tiles0 = (g->seg[0].rows + GT_ROWS - 1) / GT_ROWS;
    g->tiles = g->tiles0 + (g->nseg > 1 ? (g->seg[1].rows + GT_ROWS - 1) / GT_ROWS : 0);
    unsigned blocks = moe_blocks(g);
    int mc = moe_max_cnt(g);
    int nm = mc <= 1 ? 1 : mc <= 2 ? 2 : mc <= 4 ? 4 : 8;
    void (*k)(CudaMoeGemv, CudaMoeUnpermute, RmsAddNorm) = NULL;
    switch (16 * g->fmt + nm) {
    case 1: k = moe_gemv_kernel<1>; break;
    case 2: k = moe_gemv_kernel<2>; break;
    case 4: k = moe_gemv_kernel<4>; break;
    case 8: k = moe_gemv_kernel<8>; break;
    case 17: k = moe_gemv_kernel<17>; break;
    case 18: k = moe_gemv_kernel<18>; break;
    case 20: k = moe_gemv_kernel<20>; break;
    case 24: k = moe_gemv_kernel<24>; break;
    case 33: k = moe_gemv_kernel<33>; break;
    case 34: k = moe_gemv_kernel<34>; break;
    case 36: k = moe_gemv_kernel<36>; break;
    default: k = moe_gemv_kernel<40>; break;
    }
    pdl_launch(k, dim3(blocks), dim3(GT_WARPS * 32), 0, s, *g, *u, *an);
}

extern "C" int cuda_moe_gemv(CudaMoeGemv *g, void *stream) {
    /* e4m3 activations: cuda_moe_gemm only; a pass reads consecutive pair rows, so no x_row */
    if (!cuda_moe_args_ok(g) || g->fmt == 3 || g->x_row) return -1;
    if (g->n_pairs == 0) return 0;
    CudaMoeUnpermute none = {};
    RmsAddNorm no_norm = {};
    moe_gemv_launch(g, &none, &no_norm, (cudaStream_t)stream);
    CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int cuda_moe_gemv_unpermute(CudaMoeGemv *g, const CudaMoeUnpermute *u, void *stream) {
    if (!cuda_moe_args_ok(g) || g->fmt == 3 || g->x_row || g->nseg != 1 || !u || !u->out || !u->pair_of ||
        !u->weights || !u->tile_done || u->n < 1 || u->n > CUDA_GEMV_MAX_N || u->top_k < 1 ||
        u->top_k > MOE_MAX_TOPK || g->n_pairs != u->n * u->top_k ||
        u->tile_cap < (g->seg[0].rows + CUDA_MOE_TILE_ROWS - 1) / CUDA_MOE_TILE_ROWS)
        return -1;
    RmsAddNorm an = {};
    if (u->add_norm.x && (u->n != 1 || u->add_norm.x == u->out ||
                          rms_add_norm_args(&u->add_norm, g->seg[0].rows, g->x, &an)))
        return -1;
    moe_gemv_launch(g, u, &an, (cudaStream_t)stream);
    CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int cuda_moe_gemv_swiglu(CudaMoeGemv *g, float *act, void *stream) {
    if (!cuda_moe_args_ok(g) || g->fmt == 3 || g->nseg != 2 || !act || g->seg[1].rows != g->seg[0].rows) return -1;
    int mc = moe_max_cnt(g);
    if (mc > 2 || (g->x_row && mc > 1)) return -1; /* passes of 1 or 2 pairs (the decode steps whose launches
                                                     * cost the most); x_row at one pair a pass */
    if (g->n_pairs == 0) return 0;
    g->tiles0 = g->tiles = (g->seg[0].rows + GT_ROWS - 1) / GT_ROWS;
    unsigned blocks = moe_blocks(g);
    void (*k)(CudaMoeGemv, float *) = NULL;
    switch (16 * g->fmt + mc) {
    case 1: k = moe_gemv_swiglu_kernel<1>; break;
    case 2: k = moe_gemv_swiglu_kernel<2>; break;
    case 17: k = moe_gemv_swiglu_kernel<17>; break;
    case 18: k = moe_gemv_swiglu_kernel<18>; break;
    case 33: k = moe_gemv_swiglu_kernel<33>; break;
    default: k = moe_gemv_swiglu_kernel<34>; break;
    }
    pdl_launch(k, dim3(blocks), dim3(GT_WARPS * 32), 0, (cudaStream_t)stream, *g, act);
    CUDA_CHECK_LAUNCH();
    return 0;
}

/* Block t sums token t's top_k pair rows of y, weighted, in ascending pair order. */
__global__ void moe_unpermute_kernel(float *out, const float *y, const int32_t *pair_of, const float *weights, int K,
                                     int dim) {
    __shared__ int32_t sp[MOE_MAX_TOPK];
    __shared__ float sw[MOE_MAX_TOPK];
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    int t = blockIdx.x;
    if (threadIdx.x == 0) unpermute_sort(pair_of + (size_t)t * K, weights + (size_t)t * K, K, sp, sw);
    __syncthreads();
    for (int c = threadIdx.x; c < dim; c += blockDim.x) out[(size_t)t * dim + c] = unpermute_sum(sp, sw, K, y, dim, c);
}

extern "C" int cuda_moe_unpermute(float *out, const float *y, const int32_t *pair_of, const float *weights, int n,
                                  int top_k, int dim, void *stream) {
    if (n < 0 || top_k < 1 || top_k > MOE_MAX_TOPK || dim <= 0 || !out || !y || !pair_of || !weights) return -1;
    if (n == 0) return 0;
    pdl_launch(moe_unpermute_kernel, dim3(n), dim3(256), 0, (cudaStream_t)stream, out, y, pair_of, weights, top_k, dim);
    CUDA_CHECK_LAUNCH();
    return 0;
}
