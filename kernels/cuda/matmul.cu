/*
 * matmul.cu - out[n, rows] = x[n, cols] @ W^T for BF16 weights W [rows, cols]
 * (HF Linear layout) and f32 activations, two ways:
 *   - decode (n <= CUDA_GEMV_MAX_N): a bandwidth-bound GEMV (gemv_tile.cuh:
 *     4 rows x 8 column slices per block, 16-byte weight loads, f32
 *     activations and accumulation); the rows are read once for all n tokens.
 *     A launch may ask for the tensor-core tile instead (GemvMulti.mma:
 *     gemv_mma.cuh, f32 class): BF16 at 2..8 tokens, FP8 and NVFP4 at
 *     1..8 (their x split first by gm_split_kernel, here, unless the norm
 *     before them wrote the split already: GmSplit.ready, rmsnorm.cu).
 *   - prefill: cuBLAS GemmEx, BF16 x BF16 with f32 accumulation and f32 output
 *     (activations rounded to bf16 first, as every BF16 inference engine does).
 * Reference: cpu_matmul_rows (f32 activations, so the GEMM path differs from it
 * by the bf16 rounding of x; tolerances in tests/gpu/op_checks.h).
 * Not here: the weight-only FP8/NVFP4 tiled and scalar GEMVs (quant_gemv.cu;
 * their tensor-core launchers are here, beside BF16's).
 */
#include "cuda_check.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"
#include "cuda_pdl.cuh"
#include "gemv_mma.cuh"
#include "gemv_tile.cuh"

#define GEMV_WARPS 8 /* rows per block (the scalar kernel) */

/* Any cols / alignment: one element per lane per step. Same shapes as above. */
__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_scalar_kernel(float *out, const float *x, int n, const uint16_t *W, const uint16_t *bias, int rows,
                   int cols) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (r >= rows) return;
    const uint16_t *wr = W + (size_t)r * cols;
    float bv = bias ? bf16_bits_to_f32(bias[r]) : 0.f;
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * cols;
        float acc = 0.f;
        for (int c = lane; c < cols; c += 32) acc += bf16_bits_to_f32(wr[c]) * xt[c];
        acc = warp_sum(acc);
        if (lane == 0) out[(size_t)t * rows + r] = acc + bv;
    }
}

template <int NT, int FMT>
static void tile_launch(const GemvMulti *m, unsigned blocks, cudaStream_t s) {
    void (*k)(GemvMulti) = gemv_tile_kernel<NT, FMT>;
    pdl_launch(k, dim3(blocks), dim3(GT_WARPS * 32), 0, s, *m);
}

template <int FMT>
static void tile_launch_n(const GemvMulti *m, int n, unsigned blocks, cudaStream_t s) {
    switch (n) {
    case 1: tile_launch<1, FMT>(m, blocks, s); break;
    case 2: tile_launch<2, FMT>(m, blocks, s); break;
    case 3: tile_launch<3, FMT>(m, blocks, s); break;
    case 4: tile_launch<4, FMT>(m, blocks, s); break;
    case 5: tile_launch<5, FMT>(m, blocks, s); break;
    case 6: tile_launch<6, FMT>(m, blocks, s); break;
    case 7: tile_launch<7, FMT>(m, blocks, s); break;
    default: tile_launch<8, FMT>(m, blocks, s); break;
    }
}

template <int NT, int FMT>
static void mma_launch(const GemvMulti *m, unsigned blocks, cudaStream_t s) {
    void (*k)(GemvMulti) = gemv_mma_kernel<NT, FMT>;
    pdl_launch(k, dim3(blocks), dim3(GT_WARPS * 32), 0, s, *m);
}
template <int FMT>
static void mma_launch_n(const GemvMulti *m, int n, unsigned blocks, cudaStream_t s) {
    switch (n) {
    case 1: mma_launch<FMT ? 1 : 2, FMT>(m, blocks, s); break; /* BF16 never at one token: no such kernel built */
    case 2: mma_launch<2, FMT>(m, blocks, s); break;
    case 3: mma_launch<3, FMT>(m, blocks, s); break;
    case 4: mma_launch<4, FMT>(m, blocks, s); break;
    case 5: mma_launch<5, FMT>(m, blocks, s); break;
    case 6: mma_launch<6, FMT>(m, blocks, s); break;
    case 7: mma_launch<7, FMT>(m, blocks, s); break;
    default: mma_launch<8, FMT>(m, blocks, s); break;
    }
}

/* One block per token t of x [n, cols] f32 (cols % 4 == 0, x 16-byte aligned: gemv_multi_check): k_t
 * (gm_split_exp), hi [t, i] / lo [t, i] the f16 pairs of x_t[2i], x_t[2i + 1] times 2^k_t (gm_split_pair),
 * inv[t] = 2^-k_t. Latency-bound (one block a token, before a GEMV that waits for it): each thread loads
 * its float4s once, in one round, keeps up to GM_SPLIT_HELD of them in registers from the max to the
 * split (a row of up to 4 GM_SPLIT_HELD GM_SPLIT_THREADS = 16384 columns; wider rows read the rest
 * again), and stores its pairs 8 bytes at a time. */
#define GM_SPLIT_THREADS 512
#define GM_SPLIT_HELD 8
static __device__ __forceinline__ float gm_max4(float m, float4 v) {
    return fmaxf(fmaxf(m, fmaxf(fabsf(v.x), fabsf(v.y))), fmaxf(fabsf(v.z), fabsf(v.w)));
}
static __device__ __forceinline__ void gm_split4(float4 v, float sc, uint2 *hi, uint2 *lo) {
    uint2 h, l;
    gm_split_pair(v.x, v.y, sc, &h.x, &l.x);
    gm_split_pair(v.z, v.w, sc, &h.y, &l.y);
    *hi = h;
    *lo = l;
}
__global__ void __launch_bounds__(GM_SPLIT_THREADS) gm_split_kernel(const float *x, int cols, uint32_t *hi,
                                                                      uint32_t *lo, float *inv) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh) */
    __shared__ float wmax[GM_SPLIT_THREADS / 32];
    __shared__ int kk;
    int t = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5, q4 = cols / 4;
    const float4 *xt = (const float4 *)(x + (size_t)t * cols);
    float4 v[GM_SPLIT_HELD];
    float m = 0.f; /* fmaxf: a NaN drops out, and the order does not matter (the norm's split gets the same k) */
#pragma unroll
    for (int j = 0; j < GM_SPLIT_HELD; j++) {
        int c = threadIdx.x + j * GM_SPLIT_THREADS;
        if (c < q4) {
            v[j] = xt[c];
            m = gm_max4(m, v[j]);
        }
    }
    for (int c = threadIdx.x + GM_SPLIT_HELD * GM_SPLIT_THREADS; c < q4; c += GM_SPLIT_THREADS) m = gm_max4(m, xt[c]);
    m = warp_max(m);
    if (lane == 0) wmax[w] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        float a = 0.f;
        for (int i = 0; i < GM_SPLIT_THREADS / 32; i++) a = fmaxf(a, wmax[i]);
        kk = gm_split_exp(a);
        inv[t] = ldexpf(1.0f, -kk);
    }
    __syncthreads();
    float sc = ldexpf(1.0f, kk);
    uint2 *h2 = (uint2 *)(hi + (size_t)t * (cols / 2)), *l2 = (uint2 *)(lo + (size_t)t * (cols / 2));
#pragma unroll
    for (int j = 0; j < GM_SPLIT_HELD; j++) {
        int c = threadIdx.x + j * GM_SPLIT_THREADS;
        if (c < q4) gm_split4(v[j], sc, &h2[c], &l2[c]);
    }
    for (int c = threadIdx.x + GM_SPLIT_HELD * GM_SPLIT_THREADS; c < q4; c += GM_SPLIT_THREADS)
        gm_split4(xt[c], sc, &h2[c], &l2[c]);
}

/* FP8 / NVFP4 on tensor cores: x split into m->xs (gm_split_kernel), before the tile reads it, unless the
 * caller wrote it already (m->xs.ready: a norm with its split, rmsnorm.cu). */
void gemv_mma_split(const GemvMulti *m, int n, cudaStream_t s) {
    if (m->xs.ready) return;
    pdl_launch(gm_split_kernel, dim3(n), dim3(GM_SPLIT_THREADS), 0, s, m->seg[0].x, m->seg[0].cols, m->xs.hi,
               m->xs.lo, m->xs.inv);
}

extern "C" size_t cuda_gemv_mma_scratch(int n, int cols) { return (size_t)n * cols * 4 + (size_t)n * 4; }
GmSplit gemv_mma_split_at(void *scratch, int n, int cols) {
    GmSplit x = {};
    x.hi = (uint32_t *)scratch;
    x.lo = x.hi + (size_t)n * (cols / 2);
    x.inv = (float *)(x.lo + (size_t)n * (cols / 2));
    return x;
}

void gemv_tile_run(GemvMulti *m, int n, int fmt, cudaStream_t s) {
    int tot = 0, R = m->mma ? GM_ROWS : GT_ROWS;
    for (int i = 0; i < GT_MAX_SEG; i++) {
        if (i < m->nseg) tot += (m->seg[i].rows + R - 1) / R;
        m->end[i] = tot;
    }
    m->prefetch = cuda_gemv_prefetch_enabled();
    if (m->mma && fmt >= 1) { /* FP8 / NVFP4, 1..8 tokens (gemv_multi_check) */
        gemv_mma_split(m, n, s);
        if (fmt == 1) mma_launch_n<1>(m, n, (unsigned)tot, s);
        else mma_launch_n<2>(m, n, (unsigned)tot, s);
    } else if (m->mma) { /* BF16, 2..8 tokens */
        mma_launch_n<0>(m, n, (unsigned)tot, s);
    } else if (fmt == 0) tile_launch_n<0>(m, n, (unsigned)tot, s);
    else if (fmt == 1) tile_launch_n<1>(m, n, (unsigned)tot, s);
    else tile_launch_n<2>(m, n, (unsigned)tot, s);
}

int gemv_multi_check(const GemvMulti *m, int n, int fmt) {
    if (n < 1 || n > CUDA_GEMV_MAX_N || m->nseg < 1 || m->nseg > GT_MAX_SEG || fmt < 0 || fmt > 2) return -1;
    if (m->mma && !(fmt == 0 ? n >= 2 : (fmt == 2 || GM_FP8) && m->xs.hi && m->xs.lo && m->xs.inv))
        return -1; /* gemv_mma.cuh: BF16 at 2..8 tokens, FP8 (sm_89+) and NVFP4 at 1..8 with the split's scratch */
    if (m->mma && fmt >= 1 && (((uintptr_t)m->xs.hi & 15) || ((uintptr_t)m->xs.lo & 15)))
        return -1; /* the split's 16-byte loads */
    int V = 8 << fmt, cols = m->seg[0].cols;
    for (int i = 0; i < m->nseg; i++) {
        const GemvArgs *a = &m->seg[i];
        if (a->cols != cols || a->x != m->seg[0].x || a->rows <= 0 || cols <= 0 || cols % V || !a->out || !a->W ||
            ((uintptr_t)a->W & 15) || ((uintptr_t)a->x & 15))
            return -1;
        if (fmt == 1 && (!a->S || a->br <= 0 || a->bc <= 0 || (a->bc % 16 && a->bc < cols))) return -1;
        if (fmt == 1 && m->mma && a->bc % 64 && a->bc < cols) return -1; /* a group of 4 chunks in one scale block */
        if (fmt == 2 && (!a->SF || ((uintptr_t)a->SF & 1))) return -1;
    }
    return 0;
}

int cuda_gemv_multi(GemvMulti *m, int n, int fmt, void *stream) {
    if (gemv_multi_check(m, n, fmt)) return -1;
    gemv_tile_run(m, n, fmt, (cudaStream_t)stream);
    CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int cuda_gemv_bf16(float *out, const float *x, int n, const uint16_t *W, int rows, int cols,
                              const uint16_t *bias, void *stream) {
    if (n < 0 || n > CUDA_GEMV_MAX_N || rows <= 0 || cols <= 0 || !out || !x || !W) return -1;
    if (n == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    int vec = cols % 8 == 0 && ((uintptr_t)W & 15) == 0 && ((uintptr_t)x & 15) == 0;
    if (!vec) {
        pdl_launch(gemv_scalar_kernel, dim3((rows + GEMV_WARPS - 1) / GEMV_WARPS), dim3(GEMV_WARPS * 32), 0, s, out, x,
                   n, W, bias, rows, cols);
    } else {
        GemvMulti m = {};
        m.nseg = 1;
        m.seg[0] = gemv_args(out, x, W, bias, rows, cols);
        gemv_tile_run(&m, n, 0, s);
    }
    CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int cuda_gemv_bf16_mma(float *out, const float *x, int n, const uint16_t *W, int rows, int cols,
                                  const uint16_t *bias, void *stream) {
    if (n < 2 || n > CUDA_GEMV_MAX_N || rows <= 0 || cols <= 0 || !out || !x || !W) return -1;
    GemvMulti m = {};
    m.nseg = 1;
    m.seg[0] = gemv_args(out, x, W, bias, rows, cols);
    m.mma = 1;
    return cuda_gemv_multi(&m, n, 0, stream);
}

extern "C" int cuda_gemv_fp8_mma(float *out, const float *x, int n, const uint8_t *Q, const float *scale_inv,
                                 int rows, int cols, int block_rows, int block_cols, const uint16_t *bias,
                                 void *scratch, int x_split, void *stream) {
    if (n < 1 || n > CUDA_GEMV_MAX_N || rows <= 0 || cols <= 0 || block_rows <= 0 || block_cols <= 0 || !out ||
        !x || !Q || !scale_inv || !scratch)
        return -1;
    GemvMulti m = {};
    m.nseg = 1;
    m.seg[0] = gemv_args_fp8(out, x, Q, scale_inv, block_rows, block_cols, bias, rows, cols);
    m.mma = 1;
    m.xs = gemv_mma_split_at(scratch, n, cols);
    m.xs.ready = x_split;
    return cuda_gemv_multi(&m, n, 1, stream);
}

extern "C" int cuda_gemv_nvfp4_mma(float *out, const float *x, int n, const uint8_t *packed, const uint8_t *scale,
                                   const float *scale2, int rows, int cols, const uint16_t *bias, void *scratch,
                                   int x_split, void *stream) {
    if (n < 1 || n > CUDA_GEMV_MAX_N || rows <= 0 || cols <= 0 || !out || !x || !packed || !scale || !scale2 ||
        !scratch)
        return -1;
    GemvMulti m = {};
    m.nseg = 1;
    m.seg[0] = gemv_args_nvfp4(out, x, packed, scale, scale2, bias, rows, cols);
    m.mma = 1;
    m.xs = gemv_mma_split_at(scratch, n, cols);
    m.xs.ready = x_split;
    return cuda_gemv_multi(&m, n, 2, stream);
}

extern "C" int cuda_gemm_bf16(void *cublas, float *out, const float *x, uint16_t *xbf, int n,
                              const uint16_t *W, int rows, int cols, const uint16_t *bias, void *stream) {
    if (n < 0 || rows <= 0 || cols <= 0 || !cublas || !out || !x || !xbf || !W) return -1;
    if (n == 0) return 0;
    cublasHandle_t h = (cublasHandle_t)cublas;
    /* Not cublasSetStream here: it would also reset the handle's fixed workspace. */
    cudaStream_t hs;
    CUDA_CHECK(cublasGetStream(h, &hs));
    if (hs != (cudaStream_t)stream) return -1;
    if (cuda_f32_to_bf16(xbf, x, (size_t)n * cols, stream)) return -1;
    /* Row-major out[n, rows] is column-major out^T [rows, n] = W (col-major
     * [cols, rows], transposed) x xbf (col-major [cols, n]). */
    const float one = 1.f, zero = 0.f;
    CUDA_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, W, CUDA_R_16BF, cols, xbf,
                            CUDA_R_16BF, cols, &zero, out, CUDA_R_32F, rows, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
    if (bias && cuda_add_bias(out, bias, n, rows, stream)) return -1;
    return 0;
}
