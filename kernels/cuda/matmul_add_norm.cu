/*
 * matmul_add_norm.cu - the residual projection (attention's o, a dense MLP's
 * down) of a one-token step with the residual add and the next block's
 * RMSNorm as its epilogue, one launch instead of two: each block runs the
 * tiled GEMV (gemv_tile.cuh) over its GT_ROWS rows, or for FP8 / NVFP4 the
 * tensor-core one (gemv_mma.cuh, GM_ROWS rows, after its split of x) where the
 * matrix's record asks for it, and adds them into the residual x in place;
 * the block that counts itself done last
 * (cuda_device.cuh last_block_done) then norms x (rmsnorm_device.cuh,
 * rmsnorm_kernel's order), and writes the FP8 / NVFP4 tensor-core GEMV's split
 * of the result when asked. BF16, FP8 and NVFP4 weight-only formats.
 * Reference: the ops it replaces (matmul into a buffer, then add_rmsnorm;
 * tests/gpu/op_checks.h check_matmul_add_rmsnorm checks the bits against them
 * and the values against the CPU). Not here: more than one token (one block
 * would norm every row, serially, after the GEMV; the BF16 GEMVs take tensor
 * cores from 2 tokens anyway), LoRA steps (forward.c adds their update to the
 * projection's output before the add); backend_cuda.cu runs the two ops then.
 */
#include "cuda_check.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"
#include "cuda_pdl.cuh"
#include "gemv_mma.cuh"
#include "gemv_tile.cuh"
#include "rmsnorm_device.cuh"

static_assert(GT_WARPS * 32 == RMS_THREADS, "the GEMV's last block norms with rmsnorm_kernel's block");

/* Blocks an SM keeps (the register cap) on the tiled GEMV: the plain one-token tiled GEMV's occupancy
 * for BF16 and FP8 (sm_90a: 48 and 64 registers, 5 and 4 blocks; the epilogue inlined makes the BF16
 * kernel 64 without spills, 48 spilled in the loop), 3 for NVFP4 (its 64 spilled in the loop; 80 do
 * not). Checked with nvcc --resource-usage and the SASS (no LDL / STL in the main loop). */
#define ADD_NORM_MIN_BLOCKS(FMT) ((FMT) == 2 ? 3 : 4)

/* A block's output v of row r (threads below its rows: mine) added into x, then the last block norms
 * x (the other blocks' sums read through L2). */
static __device__ __forceinline__ void add_norm_tail(const RmsAddNorm &an, int rows, int r, bool mine, float v) {
    if (mine && r < rows) an.x[r] = an.x[r] + v; /* add_rmsnorm's x + y, y what the GEMV alone stores */
    rms_add_norm_last<4>(an, rows, gridDim.x);
}

/* m.seg[0]: the projection (its out unused) on the tiled GEMV, GT_ROWS rows a block. */
template <int FMT>
__global__ void __launch_bounds__(GT_WARPS * 32, ADD_NORM_MIN_BLOCKS(FMT)) gemv_add_norm_kernel(GemvMulti m,
                                                                                                RmsAddNorm an) {
    __shared__ float red[GT_WARPS][GT_ROWS][1];
    if (m.prefetch) gemv_tile_prefetch<FMT>(m.seg[0], blockIdx.x);
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access but the prefetch */
    float v = gemv_tile_sum<1, FMT>(m.seg[0], blockIdx.x, red);
    add_norm_tail(an, m.seg[0].rows, blockIdx.x * GT_ROWS + threadIdx.x, threadIdx.x < GT_ROWS, v);
}

/* The same on the FP8 / NVFP4 tensor-core GEMV (gemv_mma.cuh), GM_ROWS rows a block, x split in m.xs
 * (by gm_split_kernel before it: the last block may overwrite that scratch with the norm's split, every
 * block having read it before it counted itself done). */
template <int FMT>
__global__ void __launch_bounds__(GT_WARPS * 32) gemv_mma_add_norm_kernel(GemvMulti m, RmsAddNorm an) {
    __shared__ float red[GT_WARPS][GM_ROWS][8];
    if (m.prefetch) gemv_mma_prefetch<FMT>(m.seg[0], blockIdx.x);
    pdl_wait();
    float v = gemv_mma_any<1, FMT>(m.seg[0], m.xs, blockIdx.x, red);
    add_norm_tail(an, m.seg[0].rows, blockIdx.x * GM_ROWS + threadIdx.x, threadIdx.x < GM_ROWS, v);
}

template <int FMT>
static void add_norm_launch(const GemvMulti *m, const RmsAddNorm *an, cudaStream_t s) {
    int R = m->mma ? GM_ROWS : GT_ROWS;
    unsigned blocks = (unsigned)((m->seg[0].rows + R - 1) / R);
    void (*k)(GemvMulti, RmsAddNorm) = m->mma ? gemv_mma_add_norm_kernel<FMT ? FMT : 1> /* FMT 0: never mma */
                                              : gemv_add_norm_kernel<FMT>;
    pdl_launch(k, dim3(blocks), dim3(GT_WARPS * 32), 0, s, *m, *an);
}

int cuda_gemv_add_rmsnorm(GemvMulti *m, const GemvAddNorm *an, int n, int fmt, void *stream) {
    if (!m || !an || n != 1 || m->nseg != 1 || gemv_multi_check(m, n, fmt)) return -1; /* no BF16 mma at 1 token */
    RmsAddNorm d;
    if (rms_add_norm_args(an, m->seg[0].rows, m->seg[0].x, &d)) return -1;
    m->prefetch = cuda_gemv_prefetch_enabled();
    cudaStream_t s = (cudaStream_t)stream;
    if (m->mma) gemv_mma_split(m, n, s); /* x's split, unless a norm wrote it (m->xs.ready) */
    if (fmt == 0) add_norm_launch<0>(m, &d, s);
    else if (fmt == 1) add_norm_launch<1>(m, &d, s);
    else add_norm_launch<2>(m, &d, s);
    CUDA_CHECK_LAUNCH();
    return 0;
}
