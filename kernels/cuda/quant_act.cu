/*
 * quant_act.cu - device-side activation quantization for the native FP8 and
 * NVFP4 GEMMs (lt_gemm.cu), and the two small helpers those GEMMs need: the
 * NVFP4 scale swizzle into cuBLASLt's tiled layout and the outer-scale /
 * bias epilogue. Bit for bit the CPU rules of quant/act.c: the casts are the
 * integer recipes of quant/cast.c, every division and product is an IEEE
 * round-to-nearest op (__fdiv_rn / __fmul_rn: no contraction, no fast-math
 * reciprocal), and the maxima are order-independent.
 *   FP8: one warp per (token, group); amax by warp_max, s = amax / 448,
 *        q = e4m3_sat(x / s).
 *   NVFP4: one block per token (the token's amax is the dynamic global
 *        scale), one thread per 16-element block.
 * Not here: the GEMMs (lt_gemm.cu), weight quantization (host, quant/).
 */
#include "cuda_check.h"
#include "cuda_device.cuh"
#include "cuda_native.h"
#include "cuda_pdl.cuh"
#include "gemv_tile.cuh"

#define QA_WARPS 4      /* FP8: groups per block */
#define QA_NV_THREADS 128

/* quant_f32_to_e2m1 (Model Optimizer's _cast_fp4). */
static __device__ __forceinline__ uint32_t dev_f32_to_e2m1(float f) {
    float a = fabsf(f);
    uint32_t ord = !(0.25f >= a) + !(0.75f >= a) + !(1.25f >= a) + !(1.75f >= a) + !(2.5f >= a) + !(3.5f >= a) +
                   !(5.0f >= a);
    ord += (a == 0.75f) | (a == 1.75f) | (a == 3.5f);
    return ((f < 0) << 3) + ord;
}

/* xq [n, cols] e4m3, xs [(ng), n] (outer-major), x [n, cols] f32; grid (ceil(ng / QA_WARPS), n). */
__global__ void __launch_bounds__(QA_WARPS * 32)
quant_act_fp8_kernel(uint8_t *xq, float *xs, const float *x, int n, int cols, int group, int ng) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    int lane = threadIdx.x & 31, g = blockIdx.x * QA_WARPS + (threadIdx.x >> 5), t = blockIdx.y;
    if (g >= ng) return;
    int c0 = g * group, c1 = c0 + group < cols ? c0 + group : cols;
    const float *v = x + (size_t)t * cols;
    float amax = 0.f;
    for (int c = c0 + lane; c < c1; c += 32) amax = fmaxf(amax, fabsf(v[c]));
    amax = warp_max(amax);
    float s = amax > 0.f ? __fdiv_rn(amax, 448.0f) : 1.0f;
    if (lane == 0) xs[(size_t)g * n + t] = s;
    uint8_t *q = xq + (size_t)t * cols;
    for (int c = c0 + lane; c < c1; c += 32) q[c] = (uint8_t)dev_f32_to_e4m3(__fdiv_rn(v[c], s));
}

extern "C" int cuda_quant_act_fp8(uint8_t *xq, float *xs, const float *x, int n, int cols, int group, void *stream) {
    if (n < 0 || n > 65535 || cols <= 0 || group <= 0 || !xq || !xs || !x) return -1;
    if (n == 0) return 0;
    int ng = (cols + group - 1) / group;
    dim3 grid((unsigned)((ng + QA_WARPS - 1) / QA_WARPS), (unsigned)n);
    pdl_launch(quant_act_fp8_kernel, dim3(grid), dim3(QA_WARPS * 32), 0, (cudaStream_t)stream, xq, xs, x, n, cols,
               group, ng);
    CUDA_CHECK_LAUNCH();
    return 0;
}

/* One block per token: xq [n, cols / 2], sf (swizzled or [n, cols / 16]), xg [n]. */
__global__ void __launch_bounds__(QA_NV_THREADS)
quant_act_nvfp4_kernel(uint8_t *xq, uint8_t *sf, float *xg, const float *x, int cols, float static_scale,
                       int swizzled) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    __shared__ float red[QA_NV_THREADS / 32];
    int t = blockIdx.x, nb = cols / 16;
    const float *v = x + (size_t)t * cols;
    float g = static_scale;
    if (!(static_scale > 0.f)) { /* block-uniform: every thread takes the same branch */
        float amax = 0.f;
        for (int c = threadIdx.x; c < cols; c += QA_NV_THREADS) amax = fmaxf(amax, fabsf(v[c]));
        amax = warp_max(amax);
        if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = amax;
        __syncthreads();
        amax = red[0];
        for (int w = 1; w < QA_NV_THREADS / 32; w++) amax = fmaxf(amax, red[w]);
        g = __fdiv_rn(amax, 2688.0f);
    }
    if (threadIdx.x == 0) xg[t] = g;
    for (int b = threadIdx.x; b < nb; b += QA_NV_THREADS) {
        const float *e = v + (size_t)b * 16;
        float bamax = 0.f;
        for (int i = 0; i < 16; i++) bamax = fmaxf(bamax, fabsf(e[i]));
        uint32_t sb = 0x38, codes[16];
        if (bamax == 0.f) {
            for (int i = 0; i < 16; i++) codes[i] = 0;
        } else {
            float s = __fdiv_rn(bamax, __fmul_rn(6.0f, g));
            if (s == 0.f) s = 1.0f;
            else if (s < 0.001953125f) s = 0.001953125f; /* 2^-9 */
            sb = dev_f32_to_e4m3(s);
            float d = __fmul_rn(e4m3_to_f32(sb), g);
            for (int i = 0; i < 16; i++) codes[i] = dev_f32_to_e2m1(__fdiv_rn(e[i], d));
        }
        uint8_t *q = xq + (size_t)t * (cols / 2) + (size_t)b * 8;
        for (int i = 0; i < 8; i++) q[i] = (uint8_t)(codes[2 * i] | (codes[2 * i + 1] << 4));
        sf[swizzled ? cuda_nvfp4_sf_offset(t, b, nb) : (size_t)t * nb + b] = (uint8_t)sb;
    }
}

extern "C" int cuda_quant_act_nvfp4(uint8_t *xq, uint8_t *sf, float *xg, const float *x, int n, int cols,
                                    float static_scale, int swizzled, void *stream) {
    if (n < 0 || cols <= 0 || cols % 16 || !xq || !sf || !xg || !x) return -1;
    if (n == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    if (swizzled) CUDA_CHECK(cudaMemsetAsync(sf, 0, cuda_nvfp4_sf_bytes(n, cols), s)); /* the tiles' padding */
    pdl_launch(quant_act_nvfp4_kernel, dim3((unsigned)n), dim3(QA_NV_THREADS), 0, s, xq, sf, xg, x, cols, static_scale,
               swizzled);
    CUDA_CHECK_LAUNCH();
    return 0;
}

/* dst swizzled, src [rows, nb] row-major; one thread per source byte. */
__global__ void nvfp4_swizzle_kernel(uint8_t *dst, const uint8_t *src, int rows, int nb) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * nb) return;
    int r = (int)(i / nb), b = (int)(i % nb);
    dst[cuda_nvfp4_sf_offset(r, b, nb)] = src[i];
}

extern "C" int cuda_nvfp4_swizzle(uint8_t *dst, const uint8_t *src, int rows, int cols, void *stream) {
    if (rows <= 0 || cols <= 0 || cols % 16 || !dst || !src) return -1;
    Err err = {0};
    CHECK(cuda_nvfp4_swizzle_try(dst, src, rows, cols, stream, &err) == 0, "%s", err.msg);
    return 0;
}
extern "C" int cuda_nvfp4_swizzle_try(uint8_t *dst, const uint8_t *src, int rows, int cols, void *stream, Err *err) {
    if (rows <= 0 || cols <= 0 || cols % 16 || !dst || !src)
        return ERR(err, 500, "nvfp4 swizzle: bad shape [%d x %d]", rows, cols);
    cudaStream_t s = (cudaStream_t)stream;
    int nb = cols / 16;
    CUDA_TRY(err, cudaMemsetAsync(dst, 0, cuda_nvfp4_sf_bytes(rows, cols), s));
    size_t total = (size_t)rows * nb;
    pdl_launch(nvfp4_swizzle_kernel, dim3((unsigned)((total + 255) / 256)), dim3(256), 0, s, dst, src, rows, nb);
    CUDA_TRY_LAUNCH(err);
    return 0;
}

/* out [n, rows] f32 in place; one thread per element. */
__global__ void scale_outer_kernel(float *out, int n, int rows, const float *rs, const float *cs, float alpha,
                                   const float *ad, const uint16_t *bias) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * rows) return;
    int t = (int)(i / rows), r = (int)(i % rows);
    float v = __fmul_rn(out[i], alpha);
    if (ad) v = __fmul_rn(v, __ldg(ad));
    if (rs) v = __fmul_rn(v, rs[t]);
    if (cs) v = __fmul_rn(v, cs[r]);
    out[i] = bias ? __fadd_rn(v, bf16_bits_to_f32(bias[r])) : v;
}

extern "C" int cuda_scale_outer(float *out, int n, int rows, const float *rs, const float *cs, float alpha,
                                const float *ad, const uint16_t *bias, void *stream) {
    if (n < 0 || rows <= 0 || !out) return -1;
    if (n == 0) return 0;
    size_t total = (size_t)n * rows;
    pdl_launch(scale_outer_kernel, dim3((unsigned)((total + 255) / 256)), dim3(256), 0, (cudaStream_t)stream, out, n,
               rows, rs, cs, alpha, ad, bias);
    CUDA_CHECK_LAUNCH();
    return 0;
}
