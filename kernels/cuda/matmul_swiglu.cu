/*
 * matmul_swiglu.cu - the SwiGLU MLP's first half at decode sizes (n <=
 * CUDA_GEMV_MAX_N) in one launch: each block runs the tiled GEMV
 * (gemv_tile.cuh) over the same GT_ROWS rows of gate and of up and writes
 * silu(gate) * up directly, instead of a gate/up launch that stores g and u
 * and a swiglu launch that reads them back. BF16, FP8 and NVFP4 weight-only
 * formats; on tensor cores instead when the launch asks (GemvMulti.mma:
 * gemv_mma.cuh, GM_ROWS rows a block; BF16 at 2..8 tokens, FP8 and NVFP4 at
 * 1..8). Reference: the CPU ops it replaces (matmul of gate and up, then
 * swiglu; tests/gpu/op_checks.h check_matmul_swiglu), and on the GPU the same
 * bits as cuda_gemv_multi followed by cuda_swiglu. Not here: n > 8 tokens
 * (cuBLAS / the 8-token GEMV then swiglu, backend_cuda.cu), LoRA steps
 * (forward.c adds their updates to g and u before the swiglu).
 */
#include "cuda_check.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"
#include "cuda_pdl.cuh"
#include "gemv_mma.cuh"
#include "gemv_tile.cuh"

/* m.seg[0]: gate, m.seg[1]: up, out [NT, rows] f32. */
template <int NT, int FMT>
__global__ void __launch_bounds__(GT_WARPS * 32) gemv_swiglu_kernel(GemvMulti m, float *out) {
    if (m.prefetch) gemv_tile_prefetch<FMT>(m.seg[0], blockIdx.x); /* gate's: read first */
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access but the prefetch */
    gemv_tile_swiglu<NT, FMT>(m.seg[0], m.seg[1], out, blockIdx.x);
}

/* On tensor cores (gemv_mma.cuh): GM_ROWS rows of gate and of up a block, BF16 (2..8 tokens), FP8 or NVFP4. */
template <int NT, int FMT>
__global__ void __launch_bounds__(GT_WARPS * 32) gemv_mma_swiglu_kernel(GemvMulti m, float *out) {
    if (m.prefetch) gemv_mma_prefetch<FMT>(m.seg[0], blockIdx.x); /* gate's: read first */
    pdl_wait();
    gemv_mma_swiglu<NT, FMT>(m.seg[0], m.seg[1], m.xs, out, blockIdx.x);
}

template <int NT, int FMT>
static void mma_swiglu_launch(const GemvMulti *m, float *out, unsigned blocks, cudaStream_t s) {
    void (*k)(GemvMulti, float *) = gemv_mma_swiglu_kernel<NT, FMT>;
    pdl_launch(k, dim3(blocks), dim3(GT_WARPS * 32), 0, s, *m, out);
}
template <int FMT>
static void mma_swiglu_launch_n(const GemvMulti *m, float *out, int n, unsigned blocks, cudaStream_t s) {
    switch (n) {
    case 1: mma_swiglu_launch<FMT ? 1 : 2, FMT>(m, out, blocks, s); break; /* BF16 never at one token */
    case 2: mma_swiglu_launch<2, FMT>(m, out, blocks, s); break;
    case 3: mma_swiglu_launch<3, FMT>(m, out, blocks, s); break;
    case 4: mma_swiglu_launch<4, FMT>(m, out, blocks, s); break;
    case 5: mma_swiglu_launch<5, FMT>(m, out, blocks, s); break;
    case 6: mma_swiglu_launch<6, FMT>(m, out, blocks, s); break;
    case 7: mma_swiglu_launch<7, FMT>(m, out, blocks, s); break;
    default: mma_swiglu_launch<8, FMT>(m, out, blocks, s); break;
    }
}

template <int NT, int FMT>
static void swiglu_launch(const GemvMulti *m, float *out, unsigned blocks, cudaStream_t s) {
    void (*k)(GemvMulti, float *) = gemv_swiglu_kernel<NT, FMT>;
    pdl_launch(k, dim3(blocks), dim3(GT_WARPS * 32), 0, s, *m, out);
}

template <int FMT>
static void swiglu_launch_n(const GemvMulti *m, float *out, int n, unsigned blocks, cudaStream_t s) {
    switch (n) {
    case 1: swiglu_launch<1, FMT>(m, out, blocks, s); break;
    case 2: swiglu_launch<2, FMT>(m, out, blocks, s); break;
    case 3: swiglu_launch<3, FMT>(m, out, blocks, s); break;
    case 4: swiglu_launch<4, FMT>(m, out, blocks, s); break;
    case 5: swiglu_launch<5, FMT>(m, out, blocks, s); break;
    case 6: swiglu_launch<6, FMT>(m, out, blocks, s); break;
    case 7: swiglu_launch<7, FMT>(m, out, blocks, s); break;
    default: swiglu_launch<8, FMT>(m, out, blocks, s); break;
    }
}

int cuda_gemv_swiglu(GemvMulti *m, float *out, int n, int fmt, void *stream) {
    if (!m || !out || m->nseg != 2 || gemv_multi_check(m, n, fmt) || m->seg[0].rows != m->seg[1].rows) return -1;
    int R = m->mma ? GM_ROWS : GT_ROWS;
    unsigned blocks = (unsigned)((m->seg[0].rows + R - 1) / R);
    m->prefetch = cuda_gemv_prefetch_enabled();
    cudaStream_t s = (cudaStream_t)stream;
    if (m->mma && fmt >= 1) { /* FP8 / NVFP4, 1..8 tokens (gemv_multi_check) */
        gemv_mma_split(m, n, s);
        if (fmt == 1) mma_swiglu_launch_n<1>(m, out, n, blocks, s);
        else mma_swiglu_launch_n<2>(m, out, n, blocks, s);
    } else if (m->mma) { /* BF16, 2..8 tokens */
        mma_swiglu_launch_n<0>(m, out, n, blocks, s);
    } else if (fmt == 0) swiglu_launch_n<0>(m, out, n, blocks, s);
    else if (fmt == 1) swiglu_launch_n<1>(m, out, n, blocks, s);
    else swiglu_launch_n<2>(m, out, n, blocks, s);
    CUDA_CHECK_LAUNCH();
    return 0;
}
