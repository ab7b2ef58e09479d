/*
 * gemv_tile.cuh - the decode GEMV kernel shared by the BF16 (matmul.cu) and
 * the weight-only FP8 / NVFP4 (quant_gemv.cu) paths: out[NT, rows] =
 * x[NT, cols] @ W^T with f32 activations and f32 accumulation, the weights
 * decoded in registers. Device code only; the launchers live in those files.
 *
 * Tiling: a block owns GT_ROWS weight rows and splits their columns into
 * GT_WARPS slices, one warp each. Each lane loads one 16-byte chunk of every
 * row of the tile (GT_ROWS loads in flight, two chunks deep), so each f32
 * activation it reads serves GT_ROWS rows: at batch 1 the activations cost
 * 8 / GT_ROWS (bf16), 16 / GT_ROWS (fp8) or 32 / GT_ROWS (nvfp4) bytes of L1
 * traffic per 4 weight bytes instead of 8, 16 or 32, which is what capped the
 * one-row-per-warp kernels below the memory bandwidth. Small matrices (1024
 * rows) still get 256 blocks. The warps' partial sums meet in shared memory
 * and are added in warp order: the result does not depend on timing.
 *
 * Formats (FMT): 0 bf16 (8 values per chunk), 1 fp8 e4m3 with f32 scale_inv
 * per br x bc block (16 values, one scale: 16 divides bc or bc >= cols), 2
 * nvfp4 e2m1 pairs with an e4m3 scale per 16 values and a global scale2
 * (32 values, two scales). Every decode is exact and branch-free: e4m3x4 for
 * fp8 values and nvfp4 scales, e2m1x8 (PRMT table lookups) for nvfp4 values.
 * Not here: odd shapes and unaligned pointers (the scalar kernels), n > 8.
 */
#ifndef SAMPLER_GEMV_TILE_CUH
#define SAMPLER_GEMV_TILE_CUH

#include "cuda_device.cuh"
#include "cuda_kernels.h" /* GemvAddNorm */
#include "cuda_pdl.cuh"

#define GT_ROWS 4  /* weight rows per block */
#define GT_WARPS 8 /* column slices per block, one warp each */

typedef struct GemvArgs {
    float *out;           /* [n, rows] f32 */
    const float *x;       /* [n, cols] f32, 16-byte aligned */
    const uint4 *W;       /* [rows, cols / V] chunks, 16-byte aligned */
    const uint16_t *bias; /* [rows] bf16 or NULL */
    int rows, cols;       /* cols % V == 0 */
    const float *S;       /* fp8: [ceil(rows / br), sc] f32 scale_inv */
    int br, bc, sc;
    const uint16_t *SF;   /* nvfp4: [rows, cols / 32] pairs of e4m3 block scales */
    const float *scale2;  /* nvfp4: [1] f32 device, the global scale (read at run time: a delta
                           * that rewrites it reaches graphs captured before) */
} GemvArgs;

/* Up to GT_MAX_SEG matrices over the same x in one launch (q/k/v, gate/up):
 * blocks [end[s-1], end[s]) run segment s. */
#define GT_MAX_SEG 3
/* The split of x that gemv_mma.cuh's FP8 and NVFP4 tiles read (gm_split_kernel writes it). */
typedef struct GmSplit {
    uint32_t *hi, *lo; /* [n, cols / 2] f16 pairs of x * 2^k_t and of what they left */
    float *inv;        /* [n] 2^-k_t */
    int ready;         /* 1: they hold x's split already (a norm wrote it, rmsnorm.cu), the launch does not split */
} GmSplit;
typedef struct GemvMulti {
    GemvArgs seg[GT_MAX_SEG];
    int end[GT_MAX_SEG]; /* cumulative block counts */
    int nseg;
    int mma; /* 1: on tensor cores (gemv_mma.cuh, GM_ROWS rows a block): BF16 at 2..8 tokens, FP8 / NVFP4 at 1..8 */
    GmSplit xs; /* mma FP8 / NVFP4: scratch of cuda_gemv_mma_scratch(n, cols) bytes that the launch splits x into */
    int prefetch; /* 1: each block prefetches its first weight lines into L2 before its pdl_wait (cuda_pdl.cuh); the
                   * launchers set it from cuda_gemv_prefetch_enabled() */
} GemvMulti;

/* e4m3 (OCP e4m3fn) byte -> f32, exact; 0x7f/0xff are NaN as in quant.h. */
static __device__ __forceinline__ float e4m3_to_f32(uint32_t b) {
    uint32_t e = (b >> 3) & 0xf, m = b & 7, s = (b & 0x80) << 24;
    if ((b & 0x7f) == 0x7f) return __uint_as_float(s | 0x7fc00000u);
    if (e) return __uint_as_float(s | ((e + 120) << 23) | (m << 20));
    float v = (float)m * 0.001953125f; /* subnormal: m * 2^-9 */
    return s ? -v : v;
}

/* e2m1 code (low 4 bits of c) -> f32, exact: 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 the sign. */
static __device__ __forceinline__ float e2m1_to_f32(uint32_t c) {
    uint32_t e = (c >> 1) & 3, m = c & 1, s = (c & 8) << 28;
    uint32_t mag = e ? ((e + 126) << 23) | (m << 22) : (m ? 0x3f000000u : 0u);
    return __uint_as_float(s | mag);
}

/* The f16 in bits 15..0 of h -> f32, exact for finite h (all that is passed
 * here). Device: one HADD2.F32 on sm_80+, which reads either half in place. */
static __device__ __forceinline__ float gt_f16_to_f32(uint32_t h) {
#if defined(__CUDA_ARCH__)
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)h));
    return f;
#else
    return __uint_as_float(((h & 0x8000u) << 16) | ((h & 0x7fffu) << 13)) * 5.192296858534828e33f; /* 2^112 */
#endif
}

/* f32 -> IEEE binary16 bits, round to nearest even (overflow to infinity, subnormals kept), as the
 * device's cvt.rn.f16x2.f32 rounds: the CPU emulation's side of that instruction. */
static __device__ __forceinline__ uint32_t gt_f32_to_f16_bits(float f) {
    uint32_t u = __float_as_uint(f), s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return s | 0x7e00u;          /* NaN */
    if (a >= 0x477ff000u) return s | 0x7c00u;         /* >= 65520: infinity */
    if (a >= 0x38800000u) {                           /* >= 2^-14: a normal f16 */
        uint32_t r = a - 0x38000000u;                 /* exponent bias 127 -> 15 */
        r += 0xfffu + ((r >> 13) & 1u);               /* round the 13 dropped bits to nearest even */
        return s | (r >> 13);
    }
    return s | (uint32_t)rintf(__uint_as_float(a) * 16777216.0f); /* units of 2^-24 (1024: the least normal) */
}

/* Four e4m3 bytes of u (the first in the low byte) -> two f16 pairs (bytes 0, 1 -> *p01; 2, 3 -> *p23),
 * exact (e4m3 is a subset of f16). sm_89+: the hardware convert, each half read in place; elsewhere
 * (the CPU emulation) from the format's definition. */
static __device__ __forceinline__ void e4m3x4_f16x2(uint32_t u, uint32_t *p01, uint32_t *p23) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    unsigned short b01, b23;
    asm("mov.b32 {%0, %1}, %2;" : "=h"(b01), "=h"(b23) : "r"(u)); /* split so the convert reads .H1 in place, no shift */
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(*p01) : "h"(b01));
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(*p23) : "h"(b23));
#else
    uint32_t f[4];
    for (int i = 0; i < 4; i++) f[i] = gt_f32_to_f16_bits(e4m3_to_f32((u >> (8 * i)) & 0xffu));
    *p01 = f[0] | f[1] << 16;
    *p23 = f[2] | f[3] << 16;
#endif
}

/* Four e4m3 bytes of u (byte i -> w[i]) -> f32, exact, NaN kept. sm_89+: e4m3x4_f16x2, then f16 ->
 * f32. Older GPUs and the CPU emulation: the byte's bits placed in an f32 (exponent bias 127
 * instead of 7, subnormals included, no FTZ in this build) times 2^120. */
static __device__ __forceinline__ void e4m3x4(uint32_t u, float *w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    uint32_t h0, h1;
    e4m3x4_f16x2(u, &h0, &h1);
    w[0] = gt_f16_to_f32(h0 & 0xffffu);
    w[1] = gt_f16_to_f32(h0 >> 16);
    w[2] = gt_f16_to_f32(h1 & 0xffffu);
    w[3] = gt_f16_to_f32(h1 >> 16);
#else
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t b = (u >> (8 * i)) & 0xffu;
        float v = __uint_as_float(((b & 0x80u) << 24) | ((b & 0x7fu) << 20)) * 1.329227995784916e36f; /* 2^120 */
        w[i] = (b & 0x7fu) == 0x7fu ? __uint_as_float(0x7fc00000u) : v;
    }
#endif
}

/* The PRMT byte permute: byte i of the result is byte (s >> 4i) & 7 of the
 * eight bytes b:a (a the low four); s's bits 16..31 are ignored. Contract: every
 * nibble of s[15:0] is < 8, where PTX prmt (bit 3 asks for sign replication) and
 * __byte_perm (the CPU emulation) agree; the asm spares the selector mask that
 * __byte_perm costs on a register selector. */
static __device__ __forceinline__ uint32_t gt_prmt(uint32_t a, uint32_t b, uint32_t s) {
#if defined(__CUDA_ARCH__)
    uint32_t r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
    return r;
#else
    return __byte_perm(a, b, s);
#endif
}


/* Eight e2m1 nibbles of u -> four f16 pairs (p[i]: nibble 2i in the low half, 2i + 1 in the high),
 * exact (code 8 is -0.0), 13 instructions on sm_90. Every e2m1 value is an f16 with a zero low byte,
 * so a PRMT table lookup of the three magnitude bits gives four values' high bytes at once (0, 0.5,
 * 1, 1.5, 2, 3, 4, 6 -> 0x00 0x38 0x3c 0x3e 0x40 0x42 0x44 0x46); a second PRMT lines the sign bits up
 * on bit 7 of those bytes (the msbs of u << 4 are the even nibbles' signs, those of u the odd ones'),
 * and a third spreads the bytes into f16 pairs. The tiled GEMV converts the halves to f32
 * (e2m1x8); the tensor-core one (gemv_mma.cuh) feeds the pairs to the mma. */
static __device__ __forceinline__ void e2m1x8_f16x2(uint32_t u, uint32_t *p) {
    uint32_t t_lo = 0x3e3c3800u, t_hi = 0x46444240u; /* the table: codes 0..3, 4..7 */
#if defined(__CUDA_ARCH__)
    /* t_lo again as (popc(laneid) >> 6 = 0) | t_lo, which ptxas cannot fold: a
     * constant would sit in a uniform register and cost a MOV before every PRMT
     * (its first source must be a vector register); this is one register. */
    asm("{.reg .u32 c; mov.u32 c, %%laneid; popc.b32 c, c; shr.u32 c, c, 6; or.b32 %0, c, %1;}"
        : "=r"(t_lo) : "n"(0x3e3c3800u));
#endif
    uint32_t m = u & 0x77777777u, u4 = u << 4;
    uint32_t lo = gt_prmt(t_lo, t_hi, m) | (gt_prmt(u4, u, 0x5140u) & 0x80808080u);       /* nibbles 0..3 */
    uint32_t hi = gt_prmt(t_lo, t_hi, m >> 16) | (gt_prmt(u4, u, 0x7362u) & 0x80808080u); /* nibbles 4..7 */
    p[0] = gt_prmt(lo, 0, 0x1404u); /* f16 pairs: a high byte over a zero byte */
    p[1] = gt_prmt(lo, 0, 0x3424u);
    p[2] = gt_prmt(hi, 0, 0x1404u);
    p[3] = gt_prmt(hi, 0, 0x3424u);
}

/* Eight e2m1 nibbles of u (nibble i -> w[i]) -> f32, exact: e2m1x8_f16x2, and the f16 -> f32
 * convert reads each half in place (about 21 instructions for the eight values on sm_90 instead of
 * ~5 integer ops and an FMUL per value). */
static __device__ __forceinline__ void e2m1x8(uint32_t u, float *w) {
    uint32_t p[4];
    e2m1x8_f16x2(u, p);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        w[2 * i] = gt_f16_to_f32(p[i] & 0xffffu);
        w[2 * i + 1] = gt_f16_to_f32(p[i] >> 16);
    }
}

/* Values 8j .. 8j+8 of chunk wv, decoded (fp8/nvfp4: before their scale). */
template <int FMT>
static __device__ __forceinline__ void gt_decode8(const uint4 &wv, int j, float *w) {
    if (FMT == 0) {
        bf16x2_to_f32(wv.x, &w[0], &w[1]);
        bf16x2_to_f32(wv.y, &w[2], &w[3]);
        bf16x2_to_f32(wv.z, &w[4], &w[5]);
        bf16x2_to_f32(wv.w, &w[6], &w[7]);
    } else if (FMT == 1) {
        e4m3x4(j ? wv.z : wv.x, w);
        e4m3x4(j ? wv.w : wv.y, w + 4);
    } else {
        e2m1x8(j == 0 ? wv.x : j == 1 ? wv.y : j == 2 ? wv.z : wv.w, w);
    }
}

/* The scale rows of a tile's GT_ROWS weight rows, found once per tile rather
 * than once per chunk (an integer division by br and one by bc per chunk and
 * row cost the FP8 GEMV more instructions than its decode): fp8 the row's
 * [sc] f32 scale_inv row and the shift that maps a chunk to its column block
 * (-1: divide, bc not 16 times a power of two), nvfp4 its [cols / 32] scale
 * pairs. Rows past the end use the last row, as the weight loads do. */
typedef struct GtScales {
    const float *s8[GT_ROWS];
    const uint16_t *s4[GT_ROWS];
    int sh;
} GtScales;

template <int FMT>
static __device__ __forceinline__ GtScales gt_scales(const GemvArgs &a, int r0) {
    GtScales g;
    g.sh = -1;
    if (FMT == 1) {
        int bcc = a.bc / 16, sh = 0; /* chunks a column block */
        while (sh < 30 && (1 << sh) < bcc) sh++;
        g.sh = a.bc >= a.cols ? 31 : (1 << sh) == bcc ? sh : -1; /* 31: one block, every chunk in block 0 */
    }
#pragma unroll
    for (int rr = 0; rr < GT_ROWS; rr++) {
        int r = r0 + rr < a.rows ? r0 + rr : a.rows - 1;
        if (FMT == 1) g.s8[rr] = a.S + (size_t)(r / a.br) * a.sc;
        if (FMT == 2) g.s4[rr] = a.SF + (size_t)r * (a.cols >> 5);
    }
    return g;
}

/* One chunk column c of the tile: acc[rr][t] += (scaled) dot of row rr's chunk with x[t]. */
template <int NT, int FMT>
static __device__ __forceinline__ void gt_chunk(const GemvArgs &a, const GtScales &gs, int c, const uint4 *wv,
                                                float (*acc)[NT]) {
    constexpr int V = FMT == 0 ? 8 : FMT == 1 ? 16 : 32;
    float sc[GT_ROWS][2];
    int kb = FMT != 1 ? 0 : gs.sh >= 0 ? c >> gs.sh : (c * 16) / a.bc;
#pragma unroll
    for (int rr = 0; rr < GT_ROWS; rr++) {
        if (FMT == 1) sc[rr][0] = __ldg(gs.s8[rr] + kb);
        if (FMT == 2) {
            float s4[4]; /* s4[2], s4[3] are zero bytes, left unused */
            e4m3x4(__ldg(gs.s4[rr] + c), s4);
            sc[rr][0] = s4[0];
            sc[rr][1] = s4[1];
        }
    }
    float part[GT_ROWS][NT];
#pragma unroll
    for (int rr = 0; rr < GT_ROWS; rr++)
#pragma unroll
        for (int t = 0; t < NT; t++) part[rr][t] = 0.f;
#pragma unroll
    for (int j = 0; j < V / 8; j++) {
        float4 xa[NT], xb[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float4 *xp = (const float4 *)(a.x + (size_t)t * a.cols + (size_t)c * V + 8 * j);
            xa[t] = __ldg(xp);
            xb[t] = __ldg(xp + 1);
        }
#pragma unroll
        for (int rr = 0; rr < GT_ROWS; rr++) {
            float w[8];
            gt_decode8<FMT>(wv[rr], j, w);
#pragma unroll
            for (int t = 0; t < NT; t++)
                part[rr][t] += w[0] * xa[t].x + w[1] * xa[t].y + w[2] * xa[t].z + w[3] * xa[t].w + w[4] * xb[t].x +
                               w[5] * xb[t].y + w[6] * xb[t].z + w[7] * xb[t].w;
        }
        if (FMT == 2 && (j & 1)) { /* a 16-value scale block ends */
#pragma unroll
            for (int rr = 0; rr < GT_ROWS; rr++)
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    acc[rr][t] = fmaf(part[rr][t], sc[rr][j >> 1], acc[rr][t]);
                    part[rr][t] = 0.f;
                }
        }
    }
    if (FMT != 2) {
#pragma unroll
        for (int rr = 0; rr < GT_ROWS; rr++)
#pragma unroll
            for (int t = 0; t < NT; t++) acc[rr][t] = FMT == 1 ? fmaf(part[rr][t], sc[rr][0], acc[rr][t]) : acc[rr][t] + part[rr][t];
    }
}

/* Warp wp's column slice [*lo, *hi) of a row's nv 16-byte chunks: the GT_WARPS slices split the row
 * evenly (the tensor-core tile's BF16 and NVFP4 slices too: gemv_mma.cuh gm_slice). */
static __device__ __forceinline__ void gt_slice(int nv, int wp, int *lo, int *hi) {
    *lo = (int)((long long)nv * wp / GT_WARPS);
    *hi = (int)((long long)nv * (wp + 1) / GT_WARPS);
}

/* Before pdl_wait (cuda_pdl.cuh): the weight lines of tile blk's first loads (chunk lo + lane of its
 * GT_ROWS rows, 16 KiB a block) into L2, so they stream while the kernel before runs. */
template <int FMT>
static __device__ __forceinline__ void gemv_tile_prefetch(const GemvArgs &a, int blk) {
    constexpr int V = FMT == 0 ? 8 : FMT == 1 ? 16 : 32;
    int lane = threadIdx.x & 31, r0 = blk * GT_ROWS, nv = a.cols / V, lo, hi;
    gt_slice(nv, threadIdx.x >> 5, &lo, &hi);
#pragma unroll
    for (int rr = 0; rr < GT_ROWS; rr++) {
        const uint4 *w = a.W + (size_t)(r0 + rr < a.rows ? r0 + rr : a.rows - 1) * nv;
        if (lo + lane < hi) pdl_prefetch_l2(w + lo + lane);
    }
}

/* The block's GT_ROWS x NT outputs of tile blk: thread i < GT_ROWS * NT gets output (row r0 + i / NT,
 * token i % NT) with its bias (the value gemv_tile stores; garbage for rows past the end), the
 * others 0. red: the block's shared scratch, free again after the call's last __syncthreads. */
template <int NT, int FMT>
static __device__ __forceinline__ float gemv_tile_sum(const GemvArgs &a, int blk, float (*red)[GT_ROWS][NT]) {
    constexpr int V = FMT == 0 ? 8 : FMT == 1 ? 16 : 32;
    int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, r0 = blk * GT_ROWS;
    int nv = a.cols / V, lo, hi;
    gt_slice(nv, wp, &lo, &hi);
    float acc[GT_ROWS][NT];
#pragma unroll
    for (int rr = 0; rr < GT_ROWS; rr++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[rr][t] = 0.f;
    /* rows past the end load the last row again; their sums are dropped below */
    const uint4 *wr[GT_ROWS];
#pragma unroll
    for (int rr = 0; rr < GT_ROWS; rr++) wr[rr] = a.W + (size_t)(r0 + rr < a.rows ? r0 + rr : a.rows - 1) * nv;
    GtScales gs = gt_scales<FMT>(a, r0);
    int c = lo + lane;
    for (; c + 32 < hi; c += 64) { /* two chunks deep: 2 * GT_ROWS 16-byte loads in flight */
        uint4 w0[GT_ROWS], w1[GT_ROWS];
#pragma unroll
        for (int rr = 0; rr < GT_ROWS; rr++) {
            w0[rr] = __ldg(wr[rr] + c);
            w1[rr] = __ldg(wr[rr] + c + 32);
        }
        gt_chunk<NT, FMT>(a, gs, c, w0, acc);
        gt_chunk<NT, FMT>(a, gs, c + 32, w1, acc);
    }
    if (c < hi) {
        uint4 w0[GT_ROWS];
#pragma unroll
        for (int rr = 0; rr < GT_ROWS; rr++) w0[rr] = __ldg(wr[rr] + c);
        gt_chunk<NT, FMT>(a, gs, c, w0, acc);
    }
#pragma unroll
    for (int rr = 0; rr < GT_ROWS; rr++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v = warp_sum(acc[rr][t]);
            if (lane == 0) red[wp][rr][t] = v;
        }
    __syncthreads();
    int i = threadIdx.x;
    if (i >= GT_ROWS * NT) return 0.f;
    int rr = i / NT, t = i % NT, r = r0 + rr < a.rows ? r0 + rr : a.rows - 1;
    float v = 0.f;
    for (int k = 0; k < GT_WARPS; k++) v += red[k][rr][t];
    if (FMT == 2) v *= __ldg(a.scale2);
    return v + (a.bias ? bf16_bits_to_f32(a.bias[r]) : 0.f);
}

template <int NT, int FMT>
static __device__ __forceinline__ void gemv_tile(const GemvArgs a, int blk) {
    __shared__ float red[GT_WARPS][GT_ROWS][NT];
    float v = gemv_tile_sum<NT, FMT>(a, blk, red);
    int i = threadIdx.x, r = blk * GT_ROWS + i / NT;
    if (i < GT_ROWS * NT && r < a.rows) a.out[(size_t)(i % NT) * a.rows + r] = v;
}

/* SwiGLU epilogue over two matrices of the same shape (matmul_swiglu.cu): tile blk of gate g and
 * of up u, then out[t, r] = silu(g) * u with swiglu_kernel's expression, so the bits equal the
 * two GEMVs followed by cuda_swiglu. g.out / u.out are not written. */
template <int NT, int FMT>
static __device__ __forceinline__ void gemv_tile_swiglu(const GemvArgs g, const GemvArgs u, float *out, int blk) {
    __shared__ float red[GT_WARPS][GT_ROWS][NT];
    float gv = gemv_tile_sum<NT, FMT>(g, blk, red);
    __syncthreads(); /* every thread has read red: the up tile may overwrite it */
    float uv = gemv_tile_sum<NT, FMT>(u, blk, red);
    int i = threadIdx.x, r = blk * GT_ROWS + i / NT;
    if (i < GT_ROWS * NT && r < g.rows) out[(size_t)(i % NT) * g.rows + r] = (gv / (1.0f + expf(-gv))) * uv;
}

template <int NT, int FMT>
__global__ void __launch_bounds__(GT_WARPS * 32) gemv_tile_kernel(GemvMulti m) {
    int b = blockIdx.x, s = b < m.end[0] ? 0 : b < m.end[1] ? 1 : 2, blk = s == 0 ? b : b - m.end[s - 1];
    const GemvArgs a = s == 0 ? m.seg[0] : s == 1 ? m.seg[1] : m.seg[2];
    if (m.prefetch) gemv_tile_prefetch<FMT>(a, blk);
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access but the prefetch */
    gemv_tile<NT, FMT>(a, blk);
}

/* One matrix of the launch, per format (host side). */
static inline GemvArgs gemv_args(float *out, const float *x, const void *W, const uint16_t *bias, int rows, int cols) {
    GemvArgs a = {};
    a.out = out;
    a.x = x;
    a.W = (const uint4 *)W;
    a.bias = bias;
    a.rows = rows;
    a.cols = cols;
    return a;
}
static inline GemvArgs gemv_args_fp8(float *out, const float *x, const uint8_t *Q, const float *scale_inv, int br,
                                     int bc, const uint16_t *bias, int rows, int cols) {
    GemvArgs a = gemv_args(out, x, Q, bias, rows, cols);
    a.S = scale_inv;
    a.br = br;
    a.bc = bc;
    a.sc = (cols + bc - 1) / bc;
    return a;
}
static inline GemvArgs gemv_args_nvfp4(float *out, const float *x, const uint8_t *P, const uint8_t *SF, const float *scale2,
                                       const uint16_t *bias, int rows, int cols) {
    GemvArgs a = gemv_args(out, x, P, bias, rows, cols);
    a.SF = (const uint16_t *)SF;
    a.scale2 = scale2;
    return a;
}

/* Fills m->end from the segments' rows and m->prefetch, and launches gemv_tile_kernel<n, fmt>
 * (matmul.cu). 1 <= n <= 8, 1 <= m->nseg <= GT_MAX_SEG. */
void gemv_tile_run(GemvMulti *m, int n, int fmt, cudaStream_t s);
/* The checked launcher of several matrices over one x (matmul.cu): every segment
 * shares x and cols, cols % (8 << fmt) == 0, W and x 16-byte aligned (fp8: bc a
 * multiple of 16 or >= cols; nvfp4: SF 2-byte aligned). 0, or -1 without a launch
 * (the caller runs the matrices one by one). */
int cuda_gemv_multi(GemvMulti *m, int n, int fmt, void *stream);
/* cuda_gemv_multi's shape and alignment rules: 0 when m qualifies for n tokens, else -1. */
int gemv_multi_check(const GemvMulti *m, int n, int fmt);
/* m->mma with fmt 1 or 2: split x into m->xs before the FP8 / NVFP4 tile reads it, unless m->xs.ready (matmul.cu);
 * the split's layout in scratch of cuda_gemv_mma_scratch(n, cols) bytes (ready 0). */
GmSplit gemv_mma_split_at(void *scratch, int n, int cols);
void gemv_mma_split(const GemvMulti *m, int n, cudaStream_t s);
/* gate / up (m->seg[0], m->seg[1]: the same rows, no bias needed) in one launch with the SwiGLU
 * epilogue: out[n, rows] f32 = silu(x @ gate^T) * (x @ up^T), the bits of cuda_gemv_multi then
 * cuda_swiglu; the segments' out are not written (matmul_swiglu.cu). 0, or -1 without a launch
 * (gemv_multi_check fails, nseg != 2, the rows differ, out NULL). */
int cuda_gemv_swiglu(GemvMulti *m, float *out, int n, int fmt, void *stream);
/* The residual projection (o, a dense MLP's down) of one token with the residual add and the next
 * RMSNorm as its epilogue (matmul_add_norm.cu): x += m->seg[0]'s x @ W^T (+ bias), then, in the grid's
 * last block, out = rmsnorm(x) * w (and out's split when asked), the bits of cuda_gemv_multi into a
 * buffer y then cuda_add_rmsnorm(out, x, y, w, 1, rows, eps, split). seg[0].out is not written. On
 * the tiled GEMV, or with m->mma on FP8 / NVFP4's tensor-core tile (x split into m->xs first unless
 * ready; the norm's split may share that scratch). an: GemvAddNorm (cuda_kernels.h). 0, or -1 without
 * a launch (n != 1, gemv_multi_check fails (BF16's tensor-core tile included: not at one token), nseg
 * != 1, rms_add_norm_args refuses an). */
int cuda_gemv_add_rmsnorm(GemvMulti *m, const GemvAddNorm *an, int n, int fmt, void *stream);

#endif
