/*
 * gemv_mma.cuh - the decode GEMV of BF16 weights on tensor cores: out[NT, rows]
 * = x[NT, cols] @ W^T for 2 <= NT <= 8 tokens, the tokens being the eight
 * columns of mma.sync m16n8k16. Why: the tiled GEMV (gemv_tile.cuh) spends NT
 * f32 FMAs per weight on CUDA cores, about 4.5 instructions per weight byte at
 * 8 tokens, more than an SM can issue at the memory's rate; here a warp's 16 x 16
 * weight block goes to the tensor cores as loaded (no decode at all), about one
 * instruction per weight byte at any NT. Served decode runs there: n = 8
 * samples of one prompt are an 8-token step.
 *
 * Numerics: x enters as bf16 hi + lo (mma_tile.cuh pack_bf16_split: 16
 * significant bits, a relative error of at most 2^-18 per element), two mmas
 * with f32 accumulators, so the result is f32 class (op_checks.h TOL_F32
 * against the CPU reference), not the bits of the tiled GEMV. The choice
 * between the two is per matrix shape, measured at start-up
 * (WeightMat.mma_min_n; 0: never, the tiled GEMV).
 *
 * Tiling: a block owns GM_ROWS = 16 rows (one m16 fragment) and splits their
 * 16-byte chunks (8 bf16) into GT_WARPS column slices, one warp each, as the
 * tiled GEMV. Lane l = 4 g + t loads chunk c + t of rows g and g + 8 and the
 * eight x values of that chunk for token g: within a chunk the dot product's
 * order is permuted (values 4j..4j+3 of lane t's chunk are mma j's k = 2t,
 * 2t + 1, 2t + 8, 2t + 9), and A and B follow the same permutation, so the sum
 * is the same dot product. GM_DEPTH groups of four chunks are loaded before
 * any is used (2 GM_DEPTH 16-byte weight loads in flight per lane). The warps'
 * partial sums meet in shared memory and are added in warp order: the result
 * does not depend on timing. Rows past the end read the last row again; their
 * sums are dropped.
 * Device code only; the launchers are matmul.cu (gemv_tile_run) and
 * matmul_swiglu.cu. Not here: FP8 / NVFP4 (decoding them to bf16 costs what
 * the tensor cores save at one token), one token, more than 8.
 */
#ifndef SAMPLER_GEMV_MMA_CUH
#define SAMPLER_GEMV_MMA_CUH

#include "gemv_tile.cuh"
#include "mma_tile.cuh"

#define GM_ROWS 16 /* weight rows per block: one m16 fragment */
#define GM_DEPTH 4 /* groups of 4 chunks loaded ahead per lane */

/* x[g, 8 c .. 8 c + 7] (xc: its first float, 16-byte aligned) as the B fragments of chunk c's two mmas
 * (hi[2j], hi[2j + 1]: mma j's b0, b1; lo likewise): zero for a token past NT or a chunk past the slice. */
template <int NT>
static __device__ __forceinline__ void gm_bfrag(const float *xc, bool in, uint32_t *hi, uint32_t *lo) {
    if (in) {
        float4 p = __ldg((const float4 *)xc), q = __ldg((const float4 *)xc + 1);
        pack_bf16_split(p.x, p.y, &hi[0], &lo[0]);
        pack_bf16_split(p.z, p.w, &hi[1], &lo[1]);
        pack_bf16_split(q.x, q.y, &hi[2], &lo[2]);
        pack_bf16_split(q.z, q.w, &hi[3], &lo[3]);
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) hi[i] = lo[i] = 0u;
    }
}

/* One chunk column: d (rows g, g + 8 x tokens 2t, 2t + 1) += W[rows, chunk] x[tokens, chunk]. */
template <int NT>
static __device__ __forceinline__ void gm_chunk(const float *xc, bool in, const uint4 &w0, const uint4 &w1, float *d) {
    uint32_t hi[4], lo[4];
    gm_bfrag<NT>(xc, in, hi, lo);
    const uint32_t A0[4] = {w0.x, w1.x, w0.y, w1.y}, A1[4] = {w0.z, w1.z, w0.w, w1.w};
    mma_bf16_16816(d, A0, hi);
    mma_bf16_16816(d, A0, lo);
    mma_bf16_16816(d, A1, hi + 2);
    mma_bf16_16816(d, A1, lo + 2);
}

/* The block's GM_ROWS x NT outputs of tile blk: thread i < GM_ROWS * NT gets output (row r0 + i / NT,
 * token i % NT) with its bias (garbage for rows past the end), the others 0. red: the block's shared
 * scratch, free again after the call's last __syncthreads. */
template <int NT>
static __device__ __forceinline__ float gemv_mma_sum(const GemvArgs &a, int blk, float (*red)[GM_ROWS][8]) {
    int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3, r0 = blk * GM_ROWS;
    int nv = a.cols / 8;
    int lo = (int)((long long)nv * wp / GT_WARPS), hi = (int)((long long)nv * (wp + 1) / GT_WARPS);
    const uint4 *wr0 = a.W + (size_t)(r0 + g < a.rows ? r0 + g : a.rows - 1) * nv; /* advanced by the loops */
    const uint4 *wr1 = a.W + (size_t)(r0 + g + 8 < a.rows ? r0 + g + 8 : a.rows - 1) * nv;
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    const uint4 z = uint4{0u, 0u, 0u, 0u};
    const bool tok = g < NT; /* lanes of tokens past NT feed zeros */
    const float *xc = a.x + (size_t)(tok ? g : 0) * a.cols + (size_t)(lo + t) * 8; /* chunk lo + t of token g */
    wr0 += lo + t;
    wr1 += lo + t;
    int c = lo;
    for (; c + 4 * GM_DEPTH <= hi; c += 4 * GM_DEPTH, wr0 += 4 * GM_DEPTH, wr1 += 4 * GM_DEPTH, xc += 32 * GM_DEPTH) {
        uint4 w0[GM_DEPTH], w1[GM_DEPTH]; /* whole groups: no bounds tests */
#pragma unroll
        for (int k = 0; k < GM_DEPTH; k++) {
            w0[k] = __ldg(wr0 + 4 * k);
            w1[k] = __ldg(wr1 + 4 * k);
        }
#pragma unroll
        for (int k = 0; k < GM_DEPTH; k++) gm_chunk<NT>(xc + 32 * k, tok, w0[k], w1[k], d);
    }
    for (; c < hi; c += 4, wr0 += 4, wr1 += 4, xc += 32) { /* the slice's tail, a group at a time */
        bool in = c + t < hi;
        uint4 w0 = in ? __ldg(wr0) : z, w1 = in ? __ldg(wr1) : z;
        gm_chunk<NT>(xc, tok && in, w0, w1, d);
    }
    /* d: rows g (d[0], d[1]) and g + 8 (d[2], d[3]) at tokens 2t, 2t + 1 */
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int tok = 2 * t + (i & 1);
        if (tok < NT) red[wp][g + 8 * (i >> 1)][tok] = d[i];
    }
    __syncthreads();
    int i = threadIdx.x;
    if (i >= GM_ROWS * NT) return 0.f;
    int rr = i / NT, tt = i % NT, r = r0 + rr < a.rows ? r0 + rr : a.rows - 1;
    float v = 0.f;
    for (int k = 0; k < GT_WARPS; k++) v += red[k][rr][tt];
    return v + (a.bias ? bf16_bits_to_f32(a.bias[r]) : 0.f);
}

template <int NT>
static __device__ __forceinline__ void gemv_mma(const GemvArgs a, int blk) {
    __shared__ float red[GT_WARPS][GM_ROWS][8];
    float v = gemv_mma_sum<NT>(a, blk, red);
    int i = threadIdx.x, r = blk * GM_ROWS + i / NT;
    if (i < GM_ROWS * NT && r < a.rows) a.out[(size_t)(i % NT) * a.rows + r] = v;
}

/* gemv_tile_swiglu's epilogue on this tile: out[t, r] = silu(g) * u, swiglu_kernel's expression. */
template <int NT>
static __device__ __forceinline__ void gemv_mma_swiglu(const GemvArgs g, const GemvArgs u, float *out, int blk) {
    __shared__ float red[GT_WARPS][GM_ROWS][8];
    float gv = gemv_mma_sum<NT>(g, blk, red);
    __syncthreads(); /* every thread has read red: the up tile may overwrite it */
    float uv = gemv_mma_sum<NT>(u, blk, red);
    int i = threadIdx.x, r = blk * GM_ROWS + i / NT;
    if (i < GM_ROWS * NT && r < g.rows) out[(size_t)(i % NT) * g.rows + r] = (gv / (1.0f + expf(-gv))) * uv;
}

template <int NT>
__global__ void __launch_bounds__(GT_WARPS * 32) gemv_mma_kernel(GemvMulti m) {
    int b = blockIdx.x, s = b < m.end[0] ? 0 : b < m.end[1] ? 1 : 2;
    gemv_mma<NT>(s == 0 ? m.seg[0] : s == 1 ? m.seg[1] : m.seg[2], s == 0 ? b : b - m.end[s - 1]);
}

#endif
