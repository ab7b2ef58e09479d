/*
 * rmsnorm.cu - RMSNorm on the GPU: one block per row, FP32 accumulation,
 * BF16 weight, optionally fused with the residual add before it (x += y,
 * then out = rmsnorm(x): one pass over x instead of three, one launch instead
 * of two; the same f32 operations as add then rmsnorm, so the same bits).
 * Optionally it also writes the tensor-core FP8 / NVFP4 GEMV's split of its output
 * (matmul.cu), which the GEMVs over that output then skip.
 * Reference: cpu_add and cpu_rmsnorm in kernels/cpu/cpu_ops.c; the split: the bits of
 * gm_split_kernel over out.
 */
#include "cuda_check.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"
#include "cuda_pdl.cuh"
#include "gemv_mma.cuh"

#include <cuda_bf16.h>

/* out: [n, dim] f32; x: [n, dim] f32 (ADD: updated to x + y in place); y: [n, dim] f32
 * (ADD only); w: [dim] bf16. blockDim.x threads per row; each thread reads back only
 * the elements it wrote (but the split, after a barrier: its pairs span two threads).
 * split (SPLIT only): the tensor-core FP8 / NVFP4 GEMV's split of
 * out (gemv_mma.cuh gm_split_exp / gm_split_pair: hi, lo [n, dim / 2] u32, inv [n] f32),
 * the bits matmul.cu's gm_split_kernel would write from out, so that GEMV's launch over
 * out skips its own (one launch fewer before q/k/v and before gate/up). */
template <bool ADD, bool SPLIT>
__global__ void rmsnorm_kernel(float *out, float *x, const float *y, const __nv_bfloat16 *w, int dim,
                               float eps, GmSplit split) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    float *xr = x + (size_t)blockIdx.x * dim;
    float *outr = out + (size_t)blockIdx.x * dim;
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = xr[i];
        if (ADD) {
            v += y[(size_t)blockIdx.x * dim + i];
            xr[i] = v;
        }
        ss += v * v;
    }
    __shared__ float partial[32];
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        int nw = (blockDim.x + 31) >> 5;
        ss = threadIdx.x < nw ? partial[threadIdx.x] : 0.f;
        for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
        if (threadIdx.x == 0) partial[0] = ss;
    }
    __syncthreads();
    float scale = rsqrtf(partial[0] / (float)dim + eps);
    float amax = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float o = xr[i] * scale * __bfloat162float(w[i]);
        outr[i] = o;
        if (SPLIT) amax = fmaxf(amax, fabsf(o));
    }
    if (!SPLIT) return;
    /* max |out| over the row (fmaxf: order-free), then the pairs, each from two threads' writes
     * (__syncthreads makes a block's global writes visible to the block). */
    __shared__ float wmax[32];
    __shared__ int kk;
    amax = warp_max(amax);
    if ((threadIdx.x & 31) == 0) wmax[threadIdx.x >> 5] = amax;
    __syncthreads();
    if (threadIdx.x == 0) {
        float a = 0.f;
        for (int i = 0; i < (int)((blockDim.x + 31) >> 5); i++) a = fmaxf(a, wmax[i]);
        kk = gm_split_exp(a);
        split.inv[blockIdx.x] = ldexpf(1.0f, -kk);
    }
    __syncthreads();
    float sc = ldexpf(1.0f, kk);
    size_t o = (size_t)blockIdx.x * (dim / 2);
    for (int i = threadIdx.x; i < dim / 2; i += blockDim.x)
        gm_split_pair(outr[2 * i], outr[2 * i + 1], sc, &split.hi[o + i], &split.lo[o + i]);
}

typedef void (*RmsnormKernel)(float *, float *, const float *, const __nv_bfloat16 *, int, float, GmSplit);

/* split: NULL, or scratch of cuda_gemv_mma_scratch(n, dim) bytes (16-byte aligned, dim even). */
static int rmsnorm_launch(float *out, float *x, const float *y, const uint16_t *w, int n, int dim, float eps,
                          void *split, void *stream) {
    if (split && (dim % 2 || ((uintptr_t)split & 15))) return -1;
    if (n == 0) return 0;
    int threads = dim >= 1024 ? 1024 : ((dim + 31) / 32) * 32;
    GmSplit xs = split ? gemv_mma_split_at(split, n, dim) : GmSplit{};
    RmsnormKernel k = y ? (split ? rmsnorm_kernel<true, true> : rmsnorm_kernel<true, false>)
                        : (split ? rmsnorm_kernel<false, true> : rmsnorm_kernel<false, false>);
    pdl_launch(k, dim3(n), dim3(threads), 0, (cudaStream_t)stream, out, x, y, (const __nv_bfloat16 *)w, dim, eps, xs);
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
