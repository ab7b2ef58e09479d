/*
 * gemv_mma.cuh - the decode GEMV on tensor cores: out[NT, rows] = x[NT, cols]
 * @ W^T for BF16 weights at 2 <= NT <= 8 tokens and FP8 / NVFP4 weights at 1 <= NT <= 8,
 * the tokens being the eight columns of mma.sync m16n8k16. Why: the tiled GEMV
 * (gemv_tile.cuh) spends NT f32 FMAs per weight on CUDA cores (sm_90 SASS,
 * tests/gpu/sass_audit.py: 6.3 instructions per weight byte for BF16 at 8
 * tokens, 3.8 for FP8 at one), more than an SM can issue at the memory's rate;
 * here a warp's 16 x 16 weight block goes to the tensor cores as loaded (BF16)
 * or after one convert a pair (FP8): 1.6 / 1.8 instructions per weight byte at
 * any NT (NVFP4: 6.0, against the tiled GEMV's 8.6 at one token and 26 at 8).
 * Served decode runs there: n = 8 samples of one prompt are an 8-token step;
 * FP8 batch-1 decode is issue 19's row.
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
 * FP8 (FMT 1, e4m3 weights with f32 block scales, 1..8 tokens): the weights
 * enter as f16 (cvt e4m3x2 -> f16x2, exact: e4m3 is a subset of f16; half an
 * instruction a value where the tiled GEMV spends 1.5 converting to f32), x as
 * f16 hi + lo of x * 2^k_t, split once per launch (matmul.cu gm_split_kernel; before q/k/v
 * and gate/up the norm writes it instead, rmsnorm.cu: k_t per
 * token puts its largest |x| in [2^14, 2^15), inside f16's range: relative
 * error 2^-22 per element, f32 class), m16n8k16 f16 mmas; a group of four
 * chunks (64 columns) lies in one scale block (block_cols % 64 == 0), so each
 * group's sums take their two rows' scales once, and the token's 2^-k_t is
 * applied to the final sum. sm_89+ (the e4m3 convert; the sm_80 binary keeps
 * the tiled GEMV).
 * NVFP4 (FMT 2, e2m1 pairs with an e4m3 scale per 16 values and a global f32
 * scale2, 1..8 tokens): chunks of 32 values, x split as for FP8. A lane's four
 * values of one mma lie in one scale block, but the four lanes' in four, so the
 * scale cannot wait for the mma's sum: the weights are decoded to f16 pairs
 * (e2m1x8_f16x2, the tiled GEMV's PRMT table) and multiplied by their block's
 * scale in f16 (mul.f16x2, exact: at most 6 significant bits, in [2^-10,
 * 2688]); scale2 and 2^-k_t are applied to the final sum. Needs no e4m3 weight
 * convert, so the sm_80 binary has it too (the two scales a chunk take the
 * software path there).
 * Device code only; the launchers are matmul.cu (gemv_tile_run) and
 * matmul_swiglu.cu. Not here: more than 8 tokens, MoE experts (moe_gemv.cu).
 */
#ifndef SAMPLER_GEMV_MMA_CUH
#define SAMPLER_GEMV_MMA_CUH

#include "gemv_tile.cuh"
#include "mma_tile.cuh"

#define GM_ROWS 16 /* weight rows per block: one m16 fragment */
/* the FP8 tile needs the e4m3 convert: not in the sm_80 binary */
#if !defined(SAMPLER_GPU_SM) || SAMPLER_GPU_SM >= 89
#define GM_FP8 1
#else
#define GM_FP8 0
#endif
#define GM_DEPTH 4 /* groups of 4 chunks loaded ahead per lane */
#define GM_FP8_DEPTH 2 /* the FP8 tile's: each group also loads 64 bytes of split x a lane */

/* x[g, 8 c .. 8 c + 7] (xc: its first float, 16-byte aligned) as the B fragments of chunk c's two mmas
 * (hi[2j], hi[2j + 1]: mma j's b0, b1; lo likewise): zero for a chunk past the slice. */
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
static __device__ __forceinline__ void gm_chunk(const float *xc, bool in, const uint4 &w0, const uint4 &w1, float *d) {
    uint32_t hi[4], lo[4];
    gm_bfrag(xc, in, hi, lo);
    const uint32_t A0[4] = {w0.x, w1.x, w0.y, w1.y}, A1[4] = {w0.z, w1.z, w0.w, w1.w};
    mma_bf16_16816(d, A0, hi);
    mma_bf16_16816(d, A0, lo);
    mma_bf16_16816(d, A1, hi + 2);
    mma_bf16_16816(d, A1, lo + 2);
}

/* The warps' d (lane 4 g + t: rows g (d[0], d[1]) and g + 8 (d[2], d[3]) at tokens 2t, 2t + 1) summed in
 * warp order through red: thread i < GM_ROWS * NT returns output (row r0 + i / NT, token i % NT), times
 * inv[token] when inv is given, times s2[0] when given (NVFP4's global scale), plus its bias (garbage
 * for rows past the end); the others 0. */
template <int NT>
static __device__ __forceinline__ float gm_reduce(const GemvArgs &a, const float *d, int r0, float (*red)[GM_ROWS][8],
                                                  const float *inv, const float *s2) {
    int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int tk = 2 * t + (i & 1);
        if (tk < NT) red[wp][g + 8 * (i >> 1)][tk] = d[i];
    }
    __syncthreads();
    int i = threadIdx.x;
    if (i >= GM_ROWS * NT) return 0.f;
    int rr = i / NT, tt = i % NT, r = r0 + rr < a.rows ? r0 + rr : a.rows - 1;
    float v = 0.f;
    for (int k = 0; k < GT_WARPS; k++) v += red[k][rr][tt];
    if (inv) v *= __ldg(inv + tt);
    if (s2) v *= __ldg(s2);
    return v + (a.bias ? bf16_bits_to_f32(a.bias[r]) : 0.f);
}

/* ---- FP8 ---- */

/* Two f32 -> f16 pair (lo in the low half), round to nearest even. */
static __device__ __forceinline__ uint32_t gm_f16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__)
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return gt_f32_to_f16_bits(lo) | gt_f32_to_f16_bits(hi) << 16;
#endif
}
/* The split of one token's x (matmul.cu gm_split_kernel; rmsnorm.cu writes the same bits beside the norm):
 * k_t with max |x_t| * 2^k_t in [2^14, 2^15) (0 for an all-zero or non-finite row; at most 126). amax: max
 * |x_t| by fmaxf (a NaN element drops out of it). */
static __device__ __forceinline__ int gm_split_exp(float amax) {
    int e = 0, k = 0;
    if (amax > 0.f && amax <= 3.402823466e38f) {
        frexpf(amax, &e); /* amax = f 2^e, f in [0.5, 1) */
        k = 15 - e < 126 ? 15 - e : 126;
    }
    return k;
}
/* x_t[2i], x_t[2i + 1] times sc = 2^k_t: hi the f16 pair, lo the f16 pair of what hi left. */
static __device__ __forceinline__ void gm_split_pair(float x0, float x1, float sc, uint32_t *hi, uint32_t *lo) {
    float v0 = x0 * sc, v1 = x1 * sc; /* exact: a power of two */
    uint32_t h = gm_f16x2(v0, v1);
    *hi = h;
    *lo = gm_f16x2(v0 - gt_f16_to_f32(h & 0xffffu), v1 - gt_f16_to_f32(h >> 16)); /* exact differences */
}
/* One group of four chunks (lane t: chunk c + t of rows g, g + 8: w0, w1; its x pairs h*, l*): e (rows
 * g, g + 8 x tokens 2t, 2t + 1) = the unscaled sums of the group's 64 columns. */
static __device__ __forceinline__ void gm_group_fp8(const uint4 &w0, const uint4 &w1, const uint4 &h0,
                                                    const uint4 &h1, const uint4 &l0, const uint4 &l1, float *e) {
    const uint32_t W0[4] = {w0.x, w0.y, w0.z, w0.w}, W1[4] = {w1.x, w1.y, w1.z, w1.w};
    const uint32_t H[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
    const uint32_t L[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
#pragma unroll
    for (int j = 0; j < 4; j++) { /* mma j: bytes 4j .. 4j + 3 of each row's chunk */
        uint32_t A[4];
        e4m3x4_f16x2(W0[j], &A[0], &A[2]);
        e4m3x4_f16x2(W1[j], &A[1], &A[3]);
        mma_f16_16816(e, A, H + 2 * j);
        mma_f16_16816(e, A, L + 2 * j);
    }
}

/* The scale block of the current group (no division in the loop): its index cb, the groups left in it,
 * its scales for rows g (sa) and g + 8 (sb) read from the rows' scale rows s0, s1. */
typedef struct GmScales {
    const float *s0, *s1;
    int gpb, cb, left; /* groups a block (block_cols / 64; huge for one block) */
    float sa, sb;
} GmScales;

/* One group: its sums (gm_group_fp8) times its block's scales into d, the block advanced first when the
 * group starts a new one. */
static __device__ __forceinline__ void gm_step_fp8(const uint4 &w0, const uint4 &w1, const uint4 &h0, const uint4 &h1,
                                                   const uint4 &l0, const uint4 &l1, GmScales &s, float *d) {
    if (s.left == 0) {
        s.cb++;
        s.left = s.gpb;
        s.sa = __ldg(s.s0 + s.cb);
        s.sb = __ldg(s.s1 + s.cb);
    }
    s.left--;
    float e[4] = {0.f, 0.f, 0.f, 0.f};
    gm_group_fp8(w0, w1, h0, h1, l0, l1, e);
    d[0] = fmaf(s.sa, e[0], d[0]);
    d[1] = fmaf(s.sa, e[1], d[1]);
    d[2] = fmaf(s.sb, e[2], d[2]);
    d[3] = fmaf(s.sb, e[3], d[3]);
}

/* Warp wp's column slice [*lo, *hi) of a row's nv 16-byte chunks: gt_slice's even split, except that
 * FP8 splits whole groups of four chunks (64 values, inside one scale block) and the last slice ends
 * at nv. */
template <int FMT>
static __device__ __forceinline__ void gm_slice(int nv, int wp, int *lo, int *hi) {
    if (FMT != 1) {
        gt_slice(nv, wp, lo, hi);
        return;
    }
    int ng = (nv + 3) / 4;
    *lo = 4 * (int)((long long)ng * wp / GT_WARPS);
    *hi = 4 * (int)((long long)ng * (wp + 1) / GT_WARPS);
    if (*hi > nv) *hi = nv;
}

/* Before pdl_wait (cuda_pdl.cuh): the weight lines of tile blk's first loads (lane 4 g + t: chunk lo + t
 * of rows g and g + 8, 8 KiB a block) into L2, as gemv_tile_prefetch. */
template <int FMT>
static __device__ __forceinline__ void gemv_mma_prefetch(const GemvArgs &a, int blk) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, r0 = blk * GM_ROWS, nv = a.cols / (8 << FMT), lo, hi;
    gm_slice<FMT>(nv, threadIdx.x >> 5, &lo, &hi);
    int ra = r0 + g < a.rows ? r0 + g : a.rows - 1, rb = r0 + g + 8 < a.rows ? r0 + g + 8 : a.rows - 1;
    if (lo + t < hi) {
        pdl_prefetch_l2(a.W + (size_t)ra * nv + lo + t);
        pdl_prefetch_l2(a.W + (size_t)rb * nv + lo + t);
    }
}

/* gemv_mma_sum for FP8 weights (a.S, a.br, a.bc, a.sc as the tiled GEMV reads them; a.bc % 64 == 0 or
 * a.bc >= a.cols) and x split in xs. */
template <int NT>
static __device__ __forceinline__ float gemv_mma_sum_fp8(const GemvArgs &a, const GmSplit &xs, int blk,
                                                         float (*red)[GM_ROWS][8]) {
    int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3, r0 = blk * GM_ROWS;
    int nv = a.cols / 16, lo, hi; /* chunks of 16 e4m3 */
    gm_slice<1>(nv, wp, &lo, &hi);
    int ra = r0 + g < a.rows ? r0 + g : a.rows - 1, rb = r0 + g + 8 < a.rows ? r0 + g + 8 : a.rows - 1;
    const uint4 *wr0 = a.W + (size_t)ra * nv + lo + t, *wr1 = a.W + (size_t)rb * nv + lo + t;
    const float *s0 = a.S + (size_t)(ra / a.br) * a.sc, *s1 = a.S + (size_t)(rb / a.br) * a.sc;
    /* lanes of tokens past NT read token NT - 1's x: their D columns are never read, and the loads need
     * no predicate (a warp's same addresses are one request) */
    size_t xo = (size_t)(g < NT ? g : NT - 1) * (a.cols / 2) + (size_t)(lo + t) * 8; /* 8 pairs a chunk */
    const uint4 *xh = (const uint4 *)(xs.hi + xo), *xl = (const uint4 *)(xs.lo + xo);
    const uint4 z = uint4{0u, 0u, 0u, 0u};
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    GmScales sb_;
    sb_.s0 = s0;
    sb_.s1 = s1;
    sb_.gpb = a.bc >= a.cols ? 0x7fffffff : a.bc / 64;
    sb_.cb = a.bc >= a.cols ? 0 : (lo / 4) / sb_.gpb;
    sb_.left = sb_.gpb - (lo / 4) % sb_.gpb;
    sb_.sa = __ldg(s0 + sb_.cb);
    sb_.sb = __ldg(s1 + sb_.cb);
    int c = lo;
    for (; c + 4 * GM_FP8_DEPTH <= hi; c += 4 * GM_FP8_DEPTH) { /* whole groups: no bounds tests */
        uint4 w0[GM_FP8_DEPTH], w1[GM_FP8_DEPTH], h0[GM_FP8_DEPTH], h1[GM_FP8_DEPTH], l0[GM_FP8_DEPTH],
            l1[GM_FP8_DEPTH];
#pragma unroll
        for (int k = 0; k < GM_FP8_DEPTH; k++) {
            w0[k] = __ldg(wr0 + 4 * k);
            w1[k] = __ldg(wr1 + 4 * k);
            h0[k] = __ldg(xh + 8 * k);
            h1[k] = __ldg(xh + 8 * k + 1);
            l0[k] = __ldg(xl + 8 * k);
            l1[k] = __ldg(xl + 8 * k + 1);
        }
#pragma unroll
        for (int k = 0; k < GM_FP8_DEPTH; k++) gm_step_fp8(w0[k], w1[k], h0[k], h1[k], l0[k], l1[k], sb_, d);
        wr0 += 4 * GM_FP8_DEPTH;
        wr1 += 4 * GM_FP8_DEPTH;
        xh += 8 * GM_FP8_DEPTH;
        xl += 8 * GM_FP8_DEPTH;
    }
    for (; c < hi; c += 4, wr0 += 4, wr1 += 4, xh += 8, xl += 8) { /* the tail, a group at a time */
        bool in = c + t < hi;
        uint4 w0 = in ? __ldg(wr0) : z, w1 = in ? __ldg(wr1) : z;
        uint4 h0 = in ? __ldg(xh) : z, h1 = in ? __ldg(xh + 1) : z, l0 = in ? __ldg(xl) : z,
              l1 = in ? __ldg(xl + 1) : z;
        gm_step_fp8(w0, w1, h0, h1, l0, l1, sb_, d);
    }
    return gm_reduce<NT>(a, d, r0, red, xs.inv, NULL);
}

/* ---- NVFP4 ---- */

#define GM_FP4_DEPTH 2 /* the NVFP4 tile's groups loaded ahead: each also loads 128 bytes of split x a lane */

/* a * b per f16 half, round to nearest even. Here always exact: an e2m1 value (2 significant bits)
 * times an e4m3 scale (4) has at most 6 significant bits and lies in [2^-10, 2688] (or is 0): an f16. */
static __device__ __forceinline__ uint32_t gm_hmul2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
    uint32_t r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
#else
    return gt_f32_to_f16_bits(gt_f16_to_f32(a & 0xffffu) * gt_f16_to_f32(b & 0xffffu)) | /* f32: exact */
           gt_f32_to_f16_bits(gt_f16_to_f32(a >> 16) * gt_f16_to_f32(b >> 16)) << 16;
#endif
}

/* One chunk column (lane t: chunk c + t, 32 e2m1 values, of rows g and g + 8: w0, w1; their scale
 * pairs f0, f1, e4m3 bytes for values 0..15 and 16..31; x's split pairs h[0..3] / l[0..3], pair i =
 * values 2i, 2i + 1): d (rows g, g + 8 x tokens 2t, 2t + 1) += the chunk's products, eight mmas a
 * split half (mma m: values 4m .. 4m + 3). The block scales go into the weights before the mma,
 * exactly (gm_hmul2): inside one mma the four lanes' values lie in four different scale blocks, so no
 * scale could be applied to its sum. */
static __device__ __forceinline__ void gm_chunk_nvfp4(const uint4 &w0, const uint4 &w1, uint32_t f0, uint32_t f1,
                                                      const uint4 *h, const uint4 *l, float *d) {
    uint32_t s0, s1, z0, z1;
    e4m3x4_f16x2(f0, &s0, &z0); /* (scale of values 0..15, of 16..31) as f16; bytes 2, 3 are zero */
    e4m3x4_f16x2(f1, &s1, &z1);
    const uint32_t sa[2] = {gt_prmt(s0, 0, 0x1010u), gt_prmt(s0, 0, 0x3232u)}; /* each broadcast to a pair */
    const uint32_t sb[2] = {gt_prmt(s1, 0, 0x1010u), gt_prmt(s1, 0, 0x3232u)};
    const uint32_t W0[4] = {w0.x, w0.y, w0.z, w0.w}, W1[4] = {w1.x, w1.y, w1.z, w1.w};
    const uint32_t H[16] = {h[0].x, h[0].y, h[0].z, h[0].w, h[1].x, h[1].y, h[1].z, h[1].w,
                            h[2].x, h[2].y, h[2].z, h[2].w, h[3].x, h[3].y, h[3].z, h[3].w};
    const uint32_t L[16] = {l[0].x, l[0].y, l[0].z, l[0].w, l[1].x, l[1].y, l[1].z, l[1].w,
                            l[2].x, l[2].y, l[2].z, l[2].w, l[3].x, l[3].y, l[3].z, l[3].w};
#pragma unroll
    for (int j = 0; j < 4; j++) { /* word j: values 8j .. 8j + 7, scale block j / 2 */
        uint32_t p0[4], p1[4];
        e2m1x8_f16x2(W0[j], p0);
        e2m1x8_f16x2(W1[j], p1);
#pragma unroll
        for (int q = 0; q < 2; q++) { /* mma 2j + q: values 8j + 4q .. 8j + 4q + 3 */
            const uint32_t A[4] = {gm_hmul2(p0[2 * q], sa[j >> 1]), gm_hmul2(p1[2 * q], sb[j >> 1]),
                                   gm_hmul2(p0[2 * q + 1], sa[j >> 1]), gm_hmul2(p1[2 * q + 1], sb[j >> 1])};
            mma_f16_16816(d, A, H + 4 * j + 2 * q);
            mma_f16_16816(d, A, L + 4 * j + 2 * q);
        }
    }
}

/* gemv_mma_sum for NVFP4 weights (a.W packed e2m1, a.SF [rows, cols / 32] scale pairs, a.scale2; cols
 * % 32 == 0) and x split in xs. */
template <int NT>
static __device__ __forceinline__ float gemv_mma_sum_nvfp4(const GemvArgs &a, const GmSplit &xs, int blk,
                                                           float (*red)[GM_ROWS][8]) {
    int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3, r0 = blk * GM_ROWS;
    int nv = a.cols / 32, lo, hi; /* chunks of 32 e2m1 values, one scale pair each */
    gm_slice<2>(nv, wp, &lo, &hi);
    int ra = r0 + g < a.rows ? r0 + g : a.rows - 1, rb = r0 + g + 8 < a.rows ? r0 + g + 8 : a.rows - 1;
    const uint4 *wr0 = a.W + (size_t)ra * nv + lo + t, *wr1 = a.W + (size_t)rb * nv + lo + t;
    const uint16_t *f0 = a.SF + (size_t)ra * nv + lo + t, *f1 = a.SF + (size_t)rb * nv + lo + t;
    /* lanes of tokens past NT read token NT - 1's x (as the FP8 tile) */
    size_t xo = (size_t)(g < NT ? g : NT - 1) * (a.cols / 2) + (size_t)(lo + t) * 16; /* 16 pairs a chunk */
    const uint4 *xh = (const uint4 *)(xs.hi + xo), *xl = (const uint4 *)(xs.lo + xo);
    const uint4 z = uint4{0u, 0u, 0u, 0u};
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    int c = lo;
    for (; c + 4 * GM_FP4_DEPTH <= hi; c += 4 * GM_FP4_DEPTH) { /* whole groups: no bounds tests */
        uint4 w0[GM_FP4_DEPTH], w1[GM_FP4_DEPTH], h[GM_FP4_DEPTH][4], l[GM_FP4_DEPTH][4];
        uint32_t s0[GM_FP4_DEPTH], s1[GM_FP4_DEPTH];
#pragma unroll
        for (int k = 0; k < GM_FP4_DEPTH; k++) {
            w0[k] = __ldg(wr0 + 4 * k);
            w1[k] = __ldg(wr1 + 4 * k);
            s0[k] = __ldg(f0 + 4 * k);
            s1[k] = __ldg(f1 + 4 * k);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                h[k][i] = __ldg(xh + 16 * k + i);
                l[k][i] = __ldg(xl + 16 * k + i);
            }
        }
#pragma unroll
        for (int k = 0; k < GM_FP4_DEPTH; k++) gm_chunk_nvfp4(w0[k], w1[k], s0[k], s1[k], h[k], l[k], d);
        wr0 += 4 * GM_FP4_DEPTH;
        wr1 += 4 * GM_FP4_DEPTH;
        f0 += 4 * GM_FP4_DEPTH;
        f1 += 4 * GM_FP4_DEPTH;
        xh += 16 * GM_FP4_DEPTH;
        xl += 16 * GM_FP4_DEPTH;
    }
    for (; c < hi; c += 4, wr0 += 4, wr1 += 4, f0 += 4, f1 += 4, xh += 16, xl += 16) { /* the tail, a group at a time */
        bool in = c + t < hi;
        uint4 w0 = in ? __ldg(wr0) : z, w1 = in ? __ldg(wr1) : z, h[4], l[4];
        uint32_t s0 = in ? __ldg(f0) : 0u, s1 = in ? __ldg(f1) : 0u;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            h[i] = in ? __ldg(xh + i) : z;
            l[i] = in ? __ldg(xl + i) : z;
        }
        gm_chunk_nvfp4(w0, w1, s0, s1, h, l, d);
    }
    return gm_reduce<NT>(a, d, r0, red, xs.inv, a.scale2);
}

/* The block's GM_ROWS x NT outputs of tile blk: thread i < GM_ROWS * NT gets output (row r0 + i / NT,
 * token i % NT) with its bias (garbage for rows past the end), the others 0. red: the block's shared
 * scratch, free again after the call's last __syncthreads. */
template <int NT>
static __device__ __forceinline__ float gemv_mma_sum(const GemvArgs &a, int blk, float (*red)[GM_ROWS][8]) {
    int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3, r0 = blk * GM_ROWS;
    int nv = a.cols / 8, lo, hi;
    gm_slice<0>(nv, wp, &lo, &hi);
    const uint4 *wr0 = a.W + (size_t)(r0 + g < a.rows ? r0 + g : a.rows - 1) * nv; /* advanced by the loops */
    const uint4 *wr1 = a.W + (size_t)(r0 + g + 8 < a.rows ? r0 + g + 8 : a.rows - 1) * nv;
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    const uint4 z = uint4{0u, 0u, 0u, 0u};
    /* chunk lo + t of token g; lanes of tokens past NT read token NT - 1 (their D columns are never read) */
    const float *xc = a.x + (size_t)(g < NT ? g : NT - 1) * a.cols + (size_t)(lo + t) * 8;
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
        for (int k = 0; k < GM_DEPTH; k++) gm_chunk(xc + 32 * k, true, w0[k], w1[k], d);
    }
    for (; c < hi; c += 4, wr0 += 4, wr1 += 4, xc += 32) { /* the slice's tail, a group at a time */
        bool in = c + t < hi;
        uint4 w0 = in ? __ldg(wr0) : z, w1 = in ? __ldg(wr1) : z;
        gm_chunk(xc, in, w0, w1, d);
    }
    return gm_reduce<NT>(a, d, r0, red, NULL, NULL);
}

/* FMT 0: bf16 (x split here), 1: fp8, 2: nvfp4 (x split in xs). */
template <int NT, int FMT>
static __device__ __forceinline__ float gemv_mma_any(const GemvArgs &a, const GmSplit &xs, int blk,
                                                     float (*red)[GM_ROWS][8]) {
    if (FMT == 1) return gemv_mma_sum_fp8<NT>(a, xs, blk, red);
    if (FMT == 2) return gemv_mma_sum_nvfp4<NT>(a, xs, blk, red);
    return gemv_mma_sum<NT>(a, blk, red);
}

template <int NT, int FMT>
static __device__ __forceinline__ void gemv_mma(const GemvArgs a, const GmSplit &xs, int blk) {
    __shared__ float red[GT_WARPS][GM_ROWS][8];
    float v = gemv_mma_any<NT, FMT>(a, xs, blk, red);
    int i = threadIdx.x, r = blk * GM_ROWS + i / NT;
    if (i < GM_ROWS * NT && r < a.rows) a.out[(size_t)(i % NT) * a.rows + r] = v;
}

/* gemv_tile_swiglu's epilogue on this tile: out[t, r] = silu(g) * u, swiglu_kernel's expression. */
template <int NT, int FMT>
static __device__ __forceinline__ void gemv_mma_swiglu(const GemvArgs g, const GemvArgs u, const GmSplit &xs,
                                                       float *out, int blk) {
    __shared__ float red[GT_WARPS][GM_ROWS][8];
    float gv = gemv_mma_any<NT, FMT>(g, xs, blk, red);
    __syncthreads(); /* every thread has read red: the up tile may overwrite it */
    float uv = gemv_mma_any<NT, FMT>(u, xs, blk, red);
    int i = threadIdx.x, r = blk * GM_ROWS + i / NT;
    if (i < GM_ROWS * NT && r < g.rows) out[(size_t)(i % NT) * g.rows + r] = (gv / (1.0f + expf(-gv))) * uv;
}

template <int NT, int FMT>
__global__ void __launch_bounds__(GT_WARPS * 32) gemv_mma_kernel(GemvMulti m) {
    int b = blockIdx.x, s = b < m.end[0] ? 0 : b < m.end[1] ? 1 : 2, blk = s == 0 ? b : b - m.end[s - 1];
    const GemvArgs a = s == 0 ? m.seg[0] : s == 1 ? m.seg[1] : m.seg[2];
    if (m.prefetch) gemv_mma_prefetch<FMT>(a, blk);
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access but the prefetch */
    gemv_mma<NT, FMT>(a, m.xs, blk);
}

#endif
