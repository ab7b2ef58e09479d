/*
 * lora.cu - the batched LoRA of one linear on the GPU (Punica's SGMV, S-LoRA's
 * batched adapters): rows of many adapters in one pair of launches, rows of
 * one adapter grouped into a segment and taken in tiles of LORA_TILE rows, so
 * a tile reads its adapter's A and B once for all its rows.
 *   shrink  one warp per (tile, j < rank): lane k sums A[j, k + 32 m] x[k + 32 m]
 *           over m with fmaf, then the warp's xor tree; h = scale * that.
 *   expand  one thread per (tile, output column): v = out; v = fmaf(h[j], B^T[j], v)
 *           for j = 0..rank-1 in order (cpu_axpy's arithmetic on the AVX2 path).
 * A row's bits never depend on the other rows of the call (a tile's rows use
 * separate accumulators and the same lanes), so mixed batches are exact per
 * row. Against the CPU op (cpu_lora_row) the shrink's order differs (8 AVX2
 * lanes there, 32 here): the f32 tolerance class of tests/gpu/op_checks.h.
 * Not here: the grouping of rows into segments (backend_cuda.cu cu_lora), the
 * adapters' device memory (forward.c's adapter pool).
 */
#include "cuda_check.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"
#include "cuda_pdl.cuh"

#define LORA_TILE 4
#define LORA_WARPS 4
#define LORA_EXPAND_THREADS 256

static __device__ __forceinline__ float ld_w(const void *p, size_t i, int bf16) {
    return bf16 ? bf16_bits_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* The segment of row tile t and its rows' positions [p0, p1). */
static __device__ __forceinline__ int tile_seg(const CudaLoraSegs &s, int t, int *p0, int *p1) {
    int g = 0;
    while (g + 1 < s.n_seg && s.tile0[g + 1] <= t) g++;
    *p0 = s.row0[g] + (t - s.tile0[g]) * LORA_TILE;
    *p1 = *p0 + LORA_TILE < s.row0[g + 1] ? *p0 + LORA_TILE : s.row0[g + 1];
    return g;
}

/* grid (tiles, ceil(max rank / LORA_WARPS)), block 32 * LORA_WARPS. */
__global__ void lora_shrink_kernel(float *h, int h_stride, const float *x, int in, const int32_t *rows,
                                   CudaLoraSegs segs) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    int p0, p1, g = tile_seg(segs, blockIdx.x, &p0, &p1);
    int j = blockIdx.y * LORA_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (j >= segs.rank[g]) return; /* whole warps only: no block barrier below */
    const void *A = segs.a[g];
    int bf = segs.bf16[g], nr = p1 - p0;
    const float *xr[LORA_TILE];
    for (int r = 0; r < LORA_TILE; r++) xr[r] = x + (size_t)rows[p0 + (r < nr ? r : 0)] * in;
    float acc[LORA_TILE] = {0.f, 0.f, 0.f, 0.f};
    size_t arow = (size_t)j * in;
    for (int k = lane; k < in; k += 32) {
        float a = ld_w(A, arow + k, bf);
        for (int r = 0; r < LORA_TILE; r++)
            if (r < nr) acc[r] = fmaf(a, xr[r][k], acc[r]);
    }
    for (int r = 0; r < LORA_TILE; r++) {
        float v = warp_sum(acc[r]);
        if (lane == 0 && r < nr) h[(size_t)(p0 + r) * h_stride + j] = segs.scale[g] * v;
    }
}

/* grid (tiles, ceil(out / LORA_EXPAND_THREADS)), block LORA_EXPAND_THREADS. */
__global__ void lora_expand_kernel(float *out, int out_dim, const float *h, int h_stride, const int32_t *rows,
                                   CudaLoraSegs segs) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    int p0, p1, g = tile_seg(segs, blockIdx.x, &p0, &p1);
    int rank = segs.rank[g], nr = p1 - p0, bf = segs.bf16[g];
    __shared__ float hs[LORA_TILE][LORA_MAX_RANK];
    for (int i = threadIdx.x; i < nr * rank; i += blockDim.x)
        hs[i / rank][i % rank] = h[(size_t)(p0 + i / rank) * h_stride + i % rank];
    __syncthreads();
    int o = blockIdx.y * LORA_EXPAND_THREADS + threadIdx.x;
    if (o >= out_dim) return;
    const void *B = segs.b[g];
    for (int r = 0; r < nr; r++) {
        float *y = out + (size_t)rows[p0 + r] * out_dim + o;
        float v = *y;
        for (int j = 0; j < rank; j++) v = fmaf(hs[r][j], ld_w(B, (size_t)j * out_dim + o, bf), v);
        *y = v;
    }
}

extern "C" int cuda_lora(float *out, const float *x, int n, int in, int out_dim, float *h, int h_stride,
                         const int32_t *rows, CudaLoraSegs *segs, void *stream) {
    if (!out || !x || !h || !rows || !segs || n < 0 || in <= 0 || out_dim <= 0 || h_stride <= 0 ||
        h_stride > LORA_MAX_RANK || segs->n_seg < 0 || segs->n_seg > CUDA_LORA_MAX_SEG)
        return -1;
    if (segs->n_seg == 0) return 0;
    int tiles = 0, max_rank = 0;
    if (segs->row0[0] != 0) return -1;
    for (int s = 0; s < segs->n_seg; s++) {
        int nr = segs->row0[s + 1] - segs->row0[s];
        if (nr <= 0 || segs->row0[s + 1] > n || !segs->a[s] || !segs->b[s] || segs->rank[s] < 1 ||
            segs->rank[s] > h_stride)
            return -1;
        segs->tile0[s] = tiles;
        tiles += (nr + LORA_TILE - 1) / LORA_TILE;
        max_rank = segs->rank[s] > max_rank ? segs->rank[s] : max_rank;
    }
    segs->tile0[segs->n_seg] = tiles;
    cudaStream_t st = (cudaStream_t)stream;
    dim3 gs(tiles, (max_rank + LORA_WARPS - 1) / LORA_WARPS), ge(tiles, (out_dim + LORA_EXPAND_THREADS - 1) / LORA_EXPAND_THREADS);
    pdl_launch(lora_shrink_kernel, dim3(gs), dim3(32 * LORA_WARPS), 0, st, h, h_stride, x, in, rows, *segs);
    CUDA_CHECK_LAUNCH();
    pdl_launch(lora_expand_kernel, dim3(ge), dim3(LORA_EXPAND_THREADS), 0, st, out, out_dim, h, h_stride, rows, *segs);
    CUDA_CHECK_LAUNCH();
    return 0;
}
