/*
 * quant_gemv.cu - weight-only matmul for FP8 (block-scaled e4m3) and NVFP4
 * (e2m1 + e4m3 block scales + f32 global scale) weights: out[n, rows] =
 * x[n, cols] @ W^T with f32 activations, the weights dequantized inside the
 * kernel, f32 accumulation (gemv_tile.cuh: 4 rows x 8 column slices per
 * block, 16-byte weight loads of 16 e4m3 or 32 e2m1 values), up to QGEMV_NT
 * tokens per launch reading the rows once; more tokens take more launches
 * (prefill re-reads the weights once per QGEMV_NT tokens: correct, not fast).
 * Odd shapes and unaligned pointers: one-row-per-warp scalar kernels.
 * Reference: quant_matmul_fp8_rows / quant_matmul_nvfp4_rows with xs = NULL
 * (quant/matmul.c); equal up to the order of the f32 summation.
 * Not here: quantized activations (the native GEMMs of lt_gemm.cu, which the
 * backend takes for act_quant matrices at and above CUDA_NATIVE_MIN_N tokens;
 * below that, and where no native GEMM fits, this weight-only path runs).
 */
#include "cuda_check.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"
#include "cuda_pdl.cuh"
#include "gemv_tile.cuh"

#define QGEMV_WARPS 8 /* rows per block (the scalar kernels) */
#define QGEMV_NT 8    /* tokens per launch */

/* Any cols / alignment: one element per lane per step. Shapes as above, n <= QGEMV_NT. */
__global__ void __launch_bounds__(QGEMV_WARPS * 32)
qgemv_fp8_scalar_kernel(float *out, const float *x, int n, const uint8_t *Q, const float *S, int br, int bc,
                        int sc, const uint16_t *bias, int rows, int cols) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * QGEMV_WARPS + (threadIdx.x >> 5);
    if (r >= rows) return;
    const uint8_t *wr = Q + (size_t)r * cols;
    const float *srow = S + (size_t)(r / br) * sc;
    float bv = bias ? bf16_bits_to_f32(bias[r]) : 0.f;
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * cols;
        float acc = 0.f;
        for (int c = lane; c < cols; c += 32) acc += xt[c] * e4m3_to_f32(wr[c]) * srow[c / bc];
        acc = warp_sum(acc);
        if (lane == 0) out[(size_t)t * rows + r] = acc + bv;
    }
}

/* out: [NT, rows] f32; P: [rows, cols / 2] packed e2m1, element 2i in the low
 * nibble (cols % 32 == 0, 16-byte aligned); SF: [rows, cols / 16] e4m3 block
 * scales; scale2: [1] f32 device; x: [NT, cols] f32 (16-byte aligned); out = (x . e2m1 * sf) * scale2 + bias. */
/* Any cols % 16 == 0 / alignment: one 16-element block per lane per step, byte loads. n <= QGEMV_NT. */
__global__ void __launch_bounds__(QGEMV_WARPS * 32)
qgemv_nvfp4_scalar_kernel(float *out, const float *x, int n, const uint8_t *P, const uint8_t *SF,
                          const float *scale2, const uint16_t *bias, int rows, int cols) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * QGEMV_WARPS + (threadIdx.x >> 5);
    if (r >= rows) return;
    int nb = cols >> 4;
    const uint8_t *wr = P + (size_t)r * (cols >> 1), *sr = SF + (size_t)r * nb;
    float bv = bias ? bf16_bits_to_f32(bias[r]) : 0.f;
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * cols;
        float acc = 0.f;
        for (int b = lane; b < nb; b += 32) {
            float sf = e4m3_to_f32(sr[b]);
            for (int i = 0; i < 16; i++) {
                uint32_t byte = wr[b * 8 + i / 2];
                acc += xt[b * 16 + i] * (e2m1_to_f32(i & 1 ? byte >> 4 : byte) * sf);
            }
        }
        acc = warp_sum(acc);
        if (lane == 0) out[(size_t)t * rows + r] = acc * __ldg(scale2) + bv;
    }
}

static unsigned qblocks(int rows) { return (unsigned)((rows + QGEMV_WARPS - 1) / QGEMV_WARPS); }

static int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

extern "C" int cuda_gemv_fp8(float *out, const float *x, int n, const uint8_t *Q, const float *scale_inv,
                             int rows, int cols, int block_rows, int block_cols, const uint16_t *bias,
                             void *stream) {
    if (n < 0 || rows <= 0 || cols <= 0 || block_rows <= 0 || block_cols <= 0 || !out || !x || !Q || !scale_inv)
        return -1;
    cudaStream_t s = (cudaStream_t)stream;
    int sc = (cols + block_cols - 1) / block_cols;
    /* The vector path applies one scale per 16 columns: needs blocks of whole 16-column chunks. */
    int vec = cols % 16 == 0 && (block_cols % 16 == 0 || block_cols >= cols) && aligned16(Q) && aligned16(x);
    for (int t0 = 0; t0 < n; t0 += QGEMV_NT) {
        int m = n - t0 < QGEMV_NT ? n - t0 : QGEMV_NT;
        float *o = out + (size_t)t0 * rows;
        const float *xt = x + (size_t)t0 * cols;
        if (!vec) {
            pdl_launch(qgemv_fp8_scalar_kernel, dim3(qblocks(rows)), dim3(QGEMV_WARPS * 32), 0, s, o, xt, m, Q,
                       scale_inv, block_rows, block_cols, sc, bias, rows, cols);
        } else {
            GemvMulti g = {};
            g.nseg = 1;
            g.seg[0] = gemv_args_fp8(o, xt, Q, scale_inv, block_rows, block_cols, bias, rows, cols);
            gemv_tile_run(&g, m, 1, s);
        }
        CUDA_CHECK_LAUNCH();
    }
    return 0;
}

extern "C" int cuda_gemv_nvfp4(float *out, const float *x, int n, const uint8_t *packed, const uint8_t *scale,
                               const float *scale2, int rows, int cols, const uint16_t *bias, void *stream) {
    if (n < 0 || rows <= 0 || cols <= 0 || cols % 16 || !out || !x || !packed || !scale || !scale2) return -1;
    cudaStream_t s = (cudaStream_t)stream;
    /* 16-byte weight loads and 2-byte scale loads (cols / 16 is even, so rows of scales stay aligned) */
    int vec = cols % 32 == 0 && aligned16(packed) && aligned16(x) && ((uintptr_t)scale & 1) == 0;
    for (int t0 = 0; t0 < n; t0 += QGEMV_NT) {
        int m = n - t0 < QGEMV_NT ? n - t0 : QGEMV_NT;
        float *o = out + (size_t)t0 * rows;
        const float *xt = x + (size_t)t0 * cols;
        if (!vec) {
            pdl_launch(qgemv_nvfp4_scalar_kernel, dim3(qblocks(rows)), dim3(QGEMV_WARPS * 32), 0, s, o, xt, m, packed,
                       scale, scale2, bias, rows, cols);
        } else {
            GemvMulti g = {};
            g.nseg = 1;
            g.seg[0] = gemv_args_nvfp4(o, xt, packed, scale, scale2, bias, rows, cols);
            gemv_tile_run(&g, m, 2, s);
        }
        CUDA_CHECK_LAUNCH();
    }
    return 0;
}
