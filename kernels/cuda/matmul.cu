/*
 * matmul.cu - out[n, rows] = x[n, cols] @ W^T for BF16 weights W [rows, cols]
 * (HF Linear layout) and f32 activations, two ways:
 *   - decode (n <= CUDA_GEMV_MAX_N): a bandwidth-bound GEMV (gemv_tile.cuh:
 *     4 rows x 8 column slices per block, 16-byte weight loads, f32
 *     activations and accumulation); the rows are read once for all n tokens.
 *     At 2..8 tokens a launch may ask for the tensor-core tile instead
 *     (GemvMulti.mma: gemv_mma.cuh, x as bf16 hi + lo, f32 class).
 *   - prefill: cuBLAS GemmEx, BF16 x BF16 with f32 accumulation and f32 output
 *     (activations rounded to bf16 first, as every BF16 inference engine does).
 * Reference: cpu_matmul_rows (f32 activations, so the GEMM path differs from it
 * by the bf16 rounding of x; tolerances in tests/gpu/op_checks.h).
 * Not here: FP8/NVFP4 weights (quant_gemv.cu).
 */
#include "cuda_check.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"
#include "gemv_mma.cuh"
#include "gemv_tile.cuh"

#define GEMV_WARPS 8 /* rows per block (the scalar kernel) */

/* Any cols / alignment: one element per lane per step. Same shapes as above. */
__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_scalar_kernel(float *out, const float *x, int n, const uint16_t *W, const uint16_t *bias, int rows,
                   int cols) {
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
    void (*k)(GemvMulti) = gemv_tile_kernel<NT, FMT>; /* (a template's comma would split the emulation's launch macro) */
    k<<<blocks, GT_WARPS * 32, 0, s>>>(*m);
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

template <int NT>
static void mma_launch(const GemvMulti *m, unsigned blocks, cudaStream_t s) {
    gemv_mma_kernel<NT><<<blocks, GT_WARPS * 32, 0, s>>>(*m);
}

void gemv_tile_run(GemvMulti *m, int n, int fmt, cudaStream_t s) {
    int tot = 0, R = m->mma ? GM_ROWS : GT_ROWS;
    for (int i = 0; i < GT_MAX_SEG; i++) {
        if (i < m->nseg) tot += (m->seg[i].rows + R - 1) / R;
        m->end[i] = tot;
    }
    if (m->mma) { /* BF16, 2..8 tokens (gemv_multi_check) */
        switch (n) {
        case 2: mma_launch<2>(m, (unsigned)tot, s); break;
        case 3: mma_launch<3>(m, (unsigned)tot, s); break;
        case 4: mma_launch<4>(m, (unsigned)tot, s); break;
        case 5: mma_launch<5>(m, (unsigned)tot, s); break;
        case 6: mma_launch<6>(m, (unsigned)tot, s); break;
        case 7: mma_launch<7>(m, (unsigned)tot, s); break;
        default: mma_launch<8>(m, (unsigned)tot, s); break;
        }
    } else if (fmt == 0) tile_launch_n<0>(m, n, (unsigned)tot, s);
    else if (fmt == 1) tile_launch_n<1>(m, n, (unsigned)tot, s);
    else tile_launch_n<2>(m, n, (unsigned)tot, s);
}

int gemv_multi_check(const GemvMulti *m, int n, int fmt) {
    if (n < 1 || n > CUDA_GEMV_MAX_N || m->nseg < 1 || m->nseg > GT_MAX_SEG || fmt < 0 || fmt > 2) return -1;
    if (m->mma && (fmt != 0 || n < 2)) return -1; /* gemv_mma.cuh: BF16, 2..8 tokens */
    int V = 8 << fmt, cols = m->seg[0].cols;
    for (int i = 0; i < m->nseg; i++) {
        const GemvArgs *a = &m->seg[i];
        if (a->cols != cols || a->x != m->seg[0].x || a->rows <= 0 || cols <= 0 || cols % V || !a->out || !a->W ||
            ((uintptr_t)a->W & 15) || ((uintptr_t)a->x & 15))
            return -1;
        if (fmt == 1 && (!a->S || a->br <= 0 || a->bc <= 0 || (a->bc % 16 && a->bc < cols))) return -1;
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
        gemv_scalar_kernel<<<(rows + GEMV_WARPS - 1) / GEMV_WARPS, GEMV_WARPS * 32, 0, s>>>(out, x, n, W, bias,
                                                                                           rows, cols);
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
