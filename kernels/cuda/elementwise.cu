/*
 * elementwise.cu - the memory-bound element and row ops of the forward pass:
 * embedding lookup, SwiGLU, residual add, bias add, f32 -> bf16 rounding,
 * row gather and weighted row scatter-add (MoE), and
 * the random fill used to build benchmark models in device memory.
 * References: cpu_embed, cpu_swiglu, cpu_add and the row ops of backend_cpu.c.
 */
#include "cuda_check.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"
#include "cuda_pdl.cuh"

#define EW_THREADS 256

static unsigned ew_blocks(size_t n) {
    size_t b = (n + EW_THREADS - 1) / EW_THREADS;
    return (unsigned)(b > 65535u * 16u ? 65535u * 16u : b); /* grid-stride beyond */
}

/* x: [n, dim] f32; emb: [vocab, dim] bf16; tokens: [n]. One block per token. */
__global__ void embed_kernel(float *x, const uint16_t *emb, const int32_t *tokens, int dim) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    const uint16_t *row = emb + (size_t)tokens[blockIdx.x] * dim;
    float *xr = x + (size_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) xr[i] = bf16_bits_to_f32(row[i]);
}

extern "C" int cuda_embed(float *x, const uint16_t *emb, const int32_t *tokens, int n, int dim,
                          void *stream) {
    if (n < 0 || dim <= 0 || !x || !emb || !tokens) return -1;
    if (n == 0) return 0;
    pdl_launch(embed_kernel, dim3(n), dim3(EW_THREADS), 0, (cudaStream_t)stream, x, emb, tokens, dim);
    CUDA_CHECK_LAUNCH();
    return 0;
}

/* out, g, u: [n] f32. Same expression as cpu_swiglu. */
__global__ void swiglu_kernel(float *out, const float *g, const float *u, size_t n) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float gv = g[i];
        out[i] = (gv / (1.0f + expf(-gv))) * u[i];
    }
}

extern "C" int cuda_swiglu(float *out, const float *g, const float *u, size_t n, void *stream) {
    if (!out || !g || !u) return -1;
    if (n == 0) return 0;
    pdl_launch(swiglu_kernel, dim3(ew_blocks(n)), dim3(EW_THREADS), 0, (cudaStream_t)stream, out, g, u, n);
    CUDA_CHECK_LAUNCH();
    return 0;
}

/* x, y: [n] f32. */
__global__ void add_kernel(float *x, const float *y, size_t n) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

extern "C" int cuda_add(float *x, const float *y, size_t n, void *stream) {
    if (!x || !y) return -1;
    if (n == 0) return 0;
    pdl_launch(add_kernel, dim3(ew_blocks(n)), dim3(EW_THREADS), 0, (cudaStream_t)stream, x, y, n);
    CUDA_CHECK_LAUNCH();
    return 0;
}

/* out: [n] bf16 bits; x: [n] f32. __float2bfloat16 rounds to nearest even, NaN stays NaN. */
__global__ void f32_to_bf16_kernel(__nv_bfloat16 *out, const float *x, size_t n) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(x[i]);
}

extern "C" int cuda_f32_to_bf16(uint16_t *out, const float *x, size_t n, void *stream) {
    if (!out || !x) return -1;
    if (n == 0) return 0;
    pdl_launch(f32_to_bf16_kernel, dim3(ew_blocks(n)), dim3(EW_THREADS), 0, (cudaStream_t)stream, (__nv_bfloat16 *)out,
               x, n);
    CUDA_CHECK_LAUNCH();
    return 0;
}

/* out: [n, rows] f32; bias: [rows] bf16. */
__global__ void add_bias_kernel(float *out, const uint16_t *bias, size_t total, int rows) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        out[i] += bf16_bits_to_f32(bias[i % (size_t)rows]);
}

extern "C" int cuda_add_bias(float *out, const uint16_t *bias, int n, int rows, void *stream) {
    if (n < 0 || rows <= 0 || !out || !bias) return -1;
    size_t total = (size_t)n * rows;
    if (total == 0) return 0;
    pdl_launch(add_bias_kernel, dim3(ew_blocks(total)), dim3(EW_THREADS), 0, (cudaStream_t)stream, out, bias, total,
               rows);
    CUDA_CHECK_LAUNCH();
    return 0;
}

/* dst: [n, dim]; src: [*, dim]; rows: [n]. One block per output row. */
__global__ void gather_rows_kernel(float *dst, const float *src, const int32_t *rows, int dim) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    const float *s = src + (size_t)rows[blockIdx.x] * dim;
    float *d = dst + (size_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) d[i] = s[i];
}

extern "C" int cuda_gather_rows(float *dst, const float *src, const int32_t *rows, int n, int dim,
                                void *stream) {
    if (n < 0 || dim <= 0 || !dst || !src || !rows) return -1;
    if (n == 0) return 0;
    pdl_launch(gather_rows_kernel, dim3(n), dim3(EW_THREADS), 0, (cudaStream_t)stream, dst, src, rows, dim);
    CUDA_CHECK_LAUNCH();
    return 0;
}

/* dst: [*, dim]; src: [n, dim]; rows, w: [n]. Each thread owns one column and
 * walks i in order, so repeated rows accumulate in the order of i exactly as
 * the CPU op does (same fmaf-free expression: d += w * s). */
__global__ void scale_add_rows_kernel(float *dst, const float *src, const int32_t *rows, const float *w, int n,
                                      int dim) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= dim) return;
    for (int i = 0; i < n; i++) {
        float *d = dst + (size_t)rows[i] * dim + c;
        *d = __fadd_rn(*d, __fmul_rn(w[i], src[(size_t)i * dim + c]));
    }
}

extern "C" int cuda_scale_add_rows(float *dst, const float *src, const int32_t *rows, const float *w, int n,
                                   int dim, void *stream) {
    if (n < 0 || dim <= 0 || !dst || !src || !rows || !w) return -1;
    if (n == 0) return 0;
    pdl_launch(scale_add_rows_kernel, dim3((dim + 127) / 128), dim3(128), 0, (cudaStream_t)stream, dst, src, rows, w, n,
               dim);
    CUDA_CHECK_LAUNCH();
    return 0;
}

/* splitmix64 of (seed, i): independent of the launch shape. */
__global__ void fill_bf16_kernel(__nv_bfloat16 *p, size_t n, uint64_t seed, float mean, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        float u = (float)(z >> 40) * (1.0f / 8388608.0f) - 1.0f; /* [-1, 1) */
        p[i] = __float2bfloat16(mean + scale * u);
    }
}

extern "C" int cuda_fill_bf16(uint16_t *p, size_t n, uint64_t seed, float mean, float scale, void *stream) {
    if (!p) return -1;
    if (n == 0) return 0;
    fill_bf16_kernel<<<ew_blocks(n), EW_THREADS, 0, (cudaStream_t)stream>>>((__nv_bfloat16 *)p, n, seed, mean,
                                                                             scale);
    CUDA_CHECK_LAUNCH();
    return 0;
}
