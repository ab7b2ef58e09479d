/*
 * rmsnorm.cu - RMSNorm on the GPU: one block per row, FP32 accumulation,
 * BF16 weight, optionally fused with the residual add before it (x += y,
 * then out = rmsnorm(x): one pass over x instead of three, one launch instead
 * of two; the same f32 operations as add then rmsnorm, so the same bits).
 * Reference: cpu_add and cpu_rmsnorm in kernels/cpu/cpu_ops.c.
 */
#include "cuda_check.h"
#include "cuda_kernels.h"

#include <cuda_bf16.h>

/* out: [n, dim] f32; x: [n, dim] f32 (ADD: updated to x + y in place); y: [n, dim] f32
 * (ADD only); w: [dim] bf16. blockDim.x threads per row; each thread reads back only
 * the elements it wrote. */
template <bool ADD>
__global__ void rmsnorm_kernel(float *out, float *x, const float *y, const __nv_bfloat16 *w, int dim,
                               float eps) {
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
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        outr[i] = xr[i] * scale * __bfloat162float(w[i]);
}

extern "C" int cuda_rmsnorm(float *out, const float *x, const uint16_t *w, int n, int dim,
                            float eps, void *stream) {
    if (n < 0 || dim <= 0 || !out || !x || !w) return -1;
    if (n == 0) return 0;
    int threads = dim >= 1024 ? 1024 : ((dim + 31) / 32) * 32;
    void (*k)(float *, float *, const float *, const __nv_bfloat16 *, int, float) = rmsnorm_kernel<false>;
    k<<<n, threads, 0, (cudaStream_t)stream>>>(out, (float *)x, NULL, (const __nv_bfloat16 *)w, dim, eps);
    CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int cuda_add_rmsnorm(float *out, float *x, const float *y, const uint16_t *w, int n, int dim,
                                float eps, void *stream) {
    if (n < 0 || dim <= 0 || !out || !x || !y || !w || out == x) return -1;
    if (n == 0) return 0;
    int threads = dim >= 1024 ? 1024 : ((dim + 31) / 32) * 32;
    void (*k)(float *, float *, const float *, const __nv_bfloat16 *, int, float) = rmsnorm_kernel<true>;
    k<<<n, threads, 0, (cudaStream_t)stream>>>(out, x, y, (const __nv_bfloat16 *)w, dim, eps);
    CUDA_CHECK_LAUNCH();
    return 0;
}
