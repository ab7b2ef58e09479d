/*
 * rmsnorm.cu - RMSNorm on the GPU: one block per row, FP32 accumulation,
 * BF16 weight. Reference: cpu_rmsnorm in kernels/cpu/cpu_ops.c.
 * Not here: a fused residual-add variant (the forward pass adds separately).
 */
#include "cuda_check.h"
#include "cuda_kernels.h"

#include <cuda_bf16.h>

/* out: [n, dim] f32; x: [n, dim] f32; w: [dim] bf16. blockDim.x threads per row. */
__global__ void rmsnorm_kernel(float *out, const float *x, const __nv_bfloat16 *w, int dim,
                               float eps) {
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *outr = out + (size_t)blockIdx.x * dim;
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
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
    rmsnorm_kernel<<<n, threads, 0, (cudaStream_t)stream>>>(out, x, (const __nv_bfloat16 *)w,
                                                            dim, eps);
    CUDA_CHECK_LAUNCH();
    return 0;
}
