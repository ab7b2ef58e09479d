/*
 * rmsnorm.cu - RMSNorm on the GPU: one block per row, FP32 accumulation,
 * BF16 weight, optionally fused with the residual add before it (x += y,
 * then out = rmsnorm(x): one pass over x instead of three, one launch instead
 * of two; the same f32 operations as add then rmsnorm, so the same bits).
 * Optionally it also writes the tensor-core FP8 / NVFP4 GEMV's split of its output
 * (matmul.cu), which the GEMVs over that output then skip. The row's arithmetic is
 * rmsnorm_device.cuh's, shared with the residual projection's GEMV epilogue
 * (matmul_add_norm.cu).
 * Reference: cpu_add and cpu_rmsnorm in kernels/cpu/cpu_ops.c; the split: the bits of
 * gm_split_kernel over out.
 */
#include "cuda_check.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"
#include "cuda_pdl.cuh"
#include "gemv_mma.cuh"
#include "rmsnorm_device.cuh"

#include <cuda_bf16.h>

/* out: [n, dim] f32; x: [n, dim] f32 (ADD: updated to x + y in place); y: [n, dim] f32
 * (ADD only); w: [dim] bf16. A block of rms_threads(dim) per row (rmsnorm_device.cuh rms_row,
 * whose order the residual projection's fused GEMV repeats).
 * split (SPLIT only): the tensor-core FP8 / NVFP4 GEMV's split of
 * out (gemv_mma.cuh gm_split_exp / gm_split_pair: hi, lo [n, dim / 2] u32, inv [n] f32),
 * the bits matmul.cu's gm_split_kernel would write from out, so that GEMV's launch over
 * out skips its own (one launch fewer before q/k/v and before gate/up). */
template <bool ADD, bool SPLIT>
__global__ void __launch_bounds__(RMS_THREADS) rmsnorm_kernel(float *out, float *x, const float *y,
                                                              const __nv_bfloat16 *w, int dim, float eps, GmSplit split) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    size_t o = (size_t)blockIdx.x * dim;
    if (!SPLIT) split.hi = NULL;
    rms_row<8, false>(out + o, x + o, ADD ? y + o : NULL, w, dim, eps, split, blockIdx.x);
}

typedef void (*RmsnormKernel)(float *, float *, const float *, const __nv_bfloat16 *, int, float, GmSplit);

/* split: NULL, or scratch of cuda_gemv_mma_scratch(n, dim) bytes (16-byte aligned, dim even). */
static int rmsnorm_launch(float *out, float *x, const float *y, const uint16_t *w, int n, int dim, float eps,
                          void *split, void *stream) {
    if (split && (dim % 2 || ((uintptr_t)split & 15))) return -1;
    if (n == 0) return 0;
    GmSplit xs = split ? gemv_mma_split_at(split, n, dim) : GmSplit{};
    RmsnormKernel k = y ? (split ? rmsnorm_kernel<true, true> : rmsnorm_kernel<true, false>)
                        : (split ? rmsnorm_kernel<false, true> : rmsnorm_kernel<false, false>);
    pdl_launch(k, dim3(n), dim3(rms_threads(dim)), 0, (cudaStream_t)stream, out, x, y, (const __nv_bfloat16 *)w, dim, eps, xs);
    CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int cuda_rmsnorm(float *out, const float *x, const uint16_t *w, int n, int dim, float eps, void *split,
                            void *stream) {
    if (n < 0 || dim <= 0 || !out || !x || !w) return -1;
    return rmsnorm_launch(out, (float *)x, NULL, w, n, dim, eps, split, stream);
}

extern "C" int cuda_add_rmsnorm(float *out, float *x, const float *y, const uint16_t *w, int n, int dim,
                                float eps, void *split, void *stream) {
    if (n < 0 || dim <= 0 || !out || !x || !y || !w || out == x) return -1;
    return rmsnorm_launch(out, x, y, w, n, dim, eps, split, stream);
}
