/*
 * moe_mma.cu - the routed experts' linears of one MoE layer as one grouped
 * tensor-core GEMM launch each (mma.sync m16n8k16, bf16 x bf16 with f32
 * accumulation, sm_80+; fragments from mma_tile.cuh), for steps whose experts
 * may have more pairs than the decode GEMV takes in one pass.
 *
 * Grid: min(n_experts, n_pairs) expert slots of moe_route's active list x
 * weight-row tiles, as moe_gemm.cu's GEMV: nothing is sized by a host read of
 * the routing (graph-capturable), empty slots exit. A block owns two tiles of
 * MG_BN weight rows (gate and up at the same rows, or 2 x MG_BN rows of one
 * matrix) and loops over its expert's pairs MG_BM at a time, K in stages of
 * MG_BK staged in shared memory (zero-padded past cols and past the pairs).
 * Which kernel (backend_cuda.cu cu_moe_mlp, per step on the host): a step of
 * more than CUDA_GEMV_MAX_N tokens runs this kernel for every expert; a smaller
 * one gives no expert more pairs than that (a token's experts are distinct) and
 * runs moe_gemm.cu's GEMV, one pass, or this kernel from the experts' record on
 * (WeightMat.mma_min_n, measured at start-up: device_gemv_calibrate). The GEMV is not inlined here as a per-expert
 * fallback: its registers (~255 at 8 tokens) would cap this kernel at one block
 * per SM (this one, sm_90: 108-128 registers for fmt 0..2, held to 2 blocks an
 * SM by its launch bounds (fmt 1 gate/up spills 8 bytes); fmt 3 ~210, one
 * block, where 128 would spill 100-270 bytes).
 *
 * Numerics (the weights are always decoded exactly), per expert on the device:
 *   BF16   more than CUDA_GEMV_MAX_N pairs: x rounded to bf16 (nearest even),
 *          as cuBLAS GemmEx is fed in cuda_gemm_bf16 (the bf16act class of
 *          tests/gpu/op_checks.h); cu_matmul's rule for one expert's rows, so
 *          the numerics are those of the per-expert path. Fewer: x as two
 *          bf16, hi = bf16(x) and lo = bf16(x - hi) (x to ~2^-17 relative),
 *          two mmas a k step: f32 class, as the GEMV those experts had.
 *   FP8    e4m3 values (exact in bf16) unscaled in shared memory; each
 *          br x bc block's scale_inv is applied in f32 to the partial sum of
 *          its bc columns (bc % 16 == 0 or bc >= cols, as the GEMV's rule).
 *   NVFP4  e2m1 x its e4m3 block scale, exact in bf16 (at most 6 significant
 *          bits, exponents 2^-10 .. 2^12); scale2 on the f32 sum, as the GEMV.
 *   FP8 and NVFP4 are weight-only paths with f32 activations (the GEMV's
 *   contract): x as hi + lo at every pair count, f32 class.
 *   FP8 x e4m3 (fmt 3, native FP8, sm_89+: mma.sync m16n8k32 e4m3): the
 *          weights' and the activations' e4m3 bytes straight into shared
 *          memory (x quantized by cuda_quant_act_fp8, rows through x_row, so
 *          gate / up read the token rows with no gather), one mma per k32;
 *          per 128 columns k the partial sum is promoted: acc += part * (ws *
 *          xs), quant_matmul_fp8_rows's order of the two scales (and
 *          DeepSeek-V3's promotion interval: a Hopper FP8 mma keeps ~14
 *          accumulator bits, so no partial runs longer than 128 columns).
 * SwiGLU (two segments): the epilogue writes silu(gate) * up with
 * swiglu_kernel's expression, the bits of the two GEMMs then cuda_swiglu.
 * Stages are double-buffered: stage k + 1 travels while stage k is multiplied,
 * BF16 weights and fmt 3's two operands by cp.async (cp_async.cuh), the others
 * loaded into registers before the multiply and decoded into shared memory
 * after it (mg_fetch / mg_store), one barrier a stage.
 * Not here: more than two stages in flight, the weighted unpermute
 * (moe_gemm.cu), native NVFP4 activations (act_quant NVFP4 experts run the
 * weight-only path), which steps take fmt 3 (backend_cuda.cu cu_moe_mlp).
 * Reference: forward.c's per-expert loop on the CPU backend (cpu_matmul_rows
 * per expert, x rounded to bf16 for a BF16 expert of more than 8 pairs in the
 * emulation's reference, as for any BF16 matmul the GPU runs through cuBLAS).
 */
#include <math.h>

#include "cuda_check.h"
#include "cuda_device.cuh"
#include "cp_async.cuh"
#include "cuda_kernels.h"
#include "cuda_pdl.cuh"
#include "gemv_tile.cuh" /* the exact e4m3 / e2m1 decoders */
#include "mma_tile.cuh"

#define MG_BM 64               /* pairs per tile: 2 warps x 2 m16 fragments */
#define MG_BN 64               /* weight rows per half: 4 warps x 2 n8 fragments */
#define MG_BK 32               /* k per shared stage: two k16 steps */
#define MG_LD (MG_BK + 8)      /* bf16 per shared row: 80 bytes, ldmatrix's 8 rows on distinct banks */
#define MG_THREADS 256        /* 8 warps: 2 (pairs) x 4 (rows) */
#define MG_GROUP 128          /* fmt 3: columns per promotion (quant_act_fp8's group) */

/* The sm_89+ FP8 mma is in this binary (mma_tile.cuh mma_e4m3_16832). */
#if !defined(__CUDACC__) || SAMPLER_GPU_SM >= 90
#define MG_FP8_MMA 1
#else
#define MG_FP8_MMA 0
#endif

/* The block's weight rows of half h: (segment, first row). SW: gate / up at
 * rows r0; else rows r0 + h * MG_BN of segment 0. */
template <int SW>
static __device__ __forceinline__ const CudaMoeSeg *mg_half(const CudaMoeGemv &g, int h, int tile, int *r0) {
    *r0 = SW ? tile * MG_BN : tile * 2 * MG_BN + h * MG_BN;
    return &g.seg[SW ? h : 0];
}

/* A stage's operands that reach shared memory through registers (decoded on the
 * way): fetched from global memory before the stage in flight is multiplied,
 * stored after it (mg_store), so their load latency overlaps the mma work as
 * the cp.async operands' does. */
struct MgRegs {
    float x[8]; /* fmt 0..2: this thread's 8 x values of the stage (zero past cnt / cols) */
    uint4 wq;   /* fmt 1 / 2: its 16 weights, raw e4m3 (fmt 2: e2m1 in .x, .y) */
    float ws;   /* fmt 2: their block scale */
    bool wok;   /* fmt 1 / 2: the weight row and columns exist */
};

/* Stage k0 (both operands) into a buffer, sa [hi, lo][64, 32 (+pad)] x and sb
 * [half][64, 32 (+pad)] weights, zero past cnt, the matrix rows and cols: the
 * raw parts by cp.async (BF16 weights; fmt 3's e4m3 weights and activations,
 * MG_BN x 2 MG_BK bytes in the same 80-byte rows), landing at the caller's
 * wait; the others into r, for mg_store. Weights: both halves' rows (mg_half);
 * x: the expert's pairs m0.. from row p0 (their x / xq rows through x_row when set). */
template <int FMT, int SW>
static __device__ __forceinline__ void mg_fetch(const CudaMoeGemv &g, int e, int tile, int p0, int cnt, int m0,
                                                int k0, uint16_t (*sa)[MG_BM * MG_LD], uint16_t (*sb)[MG_BN * MG_LD],
                                                MgRegs *r) {
    int cols = g.cols, t = threadIdx.x;
    if (FMT == 3) { /* x: 64 rows x 4 chunks of 16 bytes, one a thread */
        int row = t >> 2, c = (t & 3) * 16;
        bool in = m0 + row < cnt && k0 + c < cols;
        size_t off = 0;
        if (in) {
            int p = p0 + m0 + row, xr = g.x_row ? __ldg(g.x_row + p) : p;
            off = (size_t)xr * cols + k0 + c;
        }
        cp_async16((uint8_t *)&sa[0][row * MG_LD] + c, g.xq + off, in);
    } else { /* x: 64 rows x 4 chunks of 8 f32, one a thread */
        int row = t >> 2, c = (t & 3) * 8;
#pragma unroll
        for (int j = 0; j < 8; j++) r->x[j] = 0.f;
        if (m0 + row < cnt && k0 + c < cols) {
            int p = p0 + m0 + row, xr = g.x_row ? __ldg(g.x_row + p) : p;
            const float4 *xp = (const float4 *)(g.x + (size_t)xr * cols + k0 + c);
            float4 a = __ldg(xp), b = __ldg(xp + 1);
            r->x[0] = a.x, r->x[1] = a.y, r->x[2] = a.z, r->x[3] = a.w;
            r->x[4] = b.x, r->x[5] = b.y, r->x[6] = b.z, r->x[7] = b.w;
        }
    }
    if (FMT == 0 || FMT == 3) { /* raw: 2 x 64 rows x 4 chunks of 16 bytes (8 bf16 / 16 e4m3) = 2 a thread */
        constexpr int EB = FMT == 0 ? 2 : 1, CH = 16 / EB; /* element bytes, elements a chunk */
        for (int i = t; i < 2 * MG_BN * 4; i += MG_THREADS) {
            int h = i / (MG_BN * 4), row = (i / 4) % MG_BN, c = (i % 4) * CH, r0;
            const CudaMoeSeg *S = mg_half<SW>(g, h, tile, &r0);
            int wr = r0 + row;
            bool in = wr < S->rows && k0 + c < cols;
            cp_async16((uint8_t *)&sb[h][row * MG_LD] + c * EB,
                       (const uint8_t *)S->w[e] + (in ? ((size_t)wr * cols + k0 + c) * EB : 0), in);
        }
        return;
    }
    /* FP8 / NVFP4: one thread a half row of 16 values */
    int h = t >> 7, row = (t >> 1) & (MG_BN - 1), c = (t & 1) * 16, r0;
    const CudaMoeSeg *S = mg_half<SW>(g, h, tile, &r0);
    int wr = r0 + row;
    r->wok = wr < S->rows && k0 + c < cols;
    r->wq = uint4{0u, 0u, 0u, 0u};
    r->ws = 0.f;
    if (!r->wok) return;
    if (FMT == 1) {
        r->wq = __ldg((const uint4 *)((const uint8_t *)S->w[e] + (size_t)wr * cols + k0 + c));
    } else {
        uint2 q = __ldg((const uint2 *)((const uint8_t *)S->w[e] + (size_t)wr * (cols / 2) + (k0 + c) / 2));
        r->wq = uint4{q.x, q.y, 0u, 0u};
        r->ws = e4m3_to_f32(__ldg((const uint8_t *)S->s[e] + (size_t)wr * (cols / 16) + (k0 + c) / 16));
    }
}

/* mg_fetch's register parts into the buffer: x as bf16 hi (and, when split,
 * lo = bf16(x - hi)) into sa; FP8 / NVFP4 weights decoded (exactly) into sb. */
template <int FMT>
static __device__ __forceinline__ void mg_store(const MgRegs &r, bool split, uint16_t (*sa)[MG_BM * MG_LD],
                                                uint16_t (*sb)[MG_BN * MG_LD]) {
    int t = threadIdx.x;
    if (FMT == 3) return;
    {
        int row = t >> 2, c = (t & 3) * 8;
        uint32_t hi[4], lo[4] = {0, 0, 0, 0};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            hi[j] = pack_bf16(r.x[2 * j], r.x[2 * j + 1]);
            if (split) {
                float h0 = __uint_as_float(hi[j] << 16), h1 = __uint_as_float(hi[j] & 0xffff0000u);
                lo[j] = pack_bf16(r.x[2 * j] - h0, r.x[2 * j + 1] - h1); /* exact differences (Sterbenz) */
            }
        }
        *(uint4 *)&sa[0][row * MG_LD + c] = uint4{hi[0], hi[1], hi[2], hi[3]};
        if (split) *(uint4 *)&sa[1][row * MG_LD + c] = uint4{lo[0], lo[1], lo[2], lo[3]};
    }
    if (FMT == 0) return;
    int h = t >> 7, row = (t >> 1) & (MG_BN - 1), c = (t & 1) * 16;
    uint32_t o[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (r.wok) {
        float w[16];
        if (FMT == 1) {
            e4m3x4(r.wq.x, w);
            e4m3x4(r.wq.y, w + 4);
            e4m3x4(r.wq.z, w + 8);
            e4m3x4(r.wq.w, w + 12);
        } else {
            e2m1x8(r.wq.x, w);
            e2m1x8(r.wq.y, w + 8);
#pragma unroll
            for (int j = 0; j < 16; j++) w[j] *= r.ws; /* exact (see the top) */
        }
#pragma unroll
        for (int j = 0; j < 8; j++) /* exact values: the bf16 is the f32's high half */
            o[j] = __float_as_uint(w[2 * j]) >> 16 | (__float_as_uint(w[2 * j + 1]) & 0xffff0000u);
    }
    *(uint4 *)&sb[h][row * MG_LD + c] = uint4{o[0], o[1], o[2], o[3]};
    *(uint4 *)&sb[h][row * MG_LD + c + 8] = uint4{o[4], o[5], o[6], o[7]};
}

/* The f32 promotion of FP8 partial sums at the end of a scale column kb: acc += part * s, part = 0,
 * s = ws (the lane's weight rows' scale, srow) times xs (xv: its pair rows' x scale, [m16][g, g + 8];
 * NULL: 1, the weight-only path). */
static __device__ __forceinline__ void mg_promote(float (*acc)[2][2][4], float (*part)[2][2][4],
                                                  const float *(*srow)[2][2], int kb, float (*xv)[2]) {
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                float ws = __ldg(srow[h][nt][j] + kb);
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int f = j; f < 4; f += 2) {
                        float sv = xv ? ws * xv[mt][f >> 1] : ws;
                        acc[h][mt][nt][f] = fmaf(part[h][mt][nt][f], sv, acc[h][mt][nt][f]);
                        part[h][mt][nt][f] = 0.f;
                    }
            }
}

/* FMT2 = 2 * FMT + SW (one template argument: the emulation's launch macro
 * splits on commas). act: SW's [n_pairs, rows] f32 output. */
template <int FMT2>
__global__ void __launch_bounds__(MG_THREADS, FMT2 / 2 == 3 ? 1 : 2) moe_mma_kernel(CudaMoeGemv g, float *act) {
    constexpr int FMT = FMT2 / 2, SW = FMT2 % 2;
    /* two buffers of a stage (40 KB): [buffer][hi, lo][64, 32 (+pad)] bf16 x, [buffer][half][64, 32 (+pad)] bf16 weights */
    __shared__ __align__(16) uint16_t sa[2][2][MG_BM * MG_LD];
    __shared__ __align__(16) uint16_t sb[2][2][MG_BN * MG_LD];
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    int slot = blockIdx.x / g.tiles, tile = blockIdx.x % g.tiles;
    int e = g.active[slot];
    if (e < 0) return; /* the whole block */
    int p0 = g.offsets[e], cnt = g.offsets[e + 1] - p0;
    /* x as hi + lo (f32 class) but for a BF16 expert of more than CUDA_GEMV_MAX_N pairs
     * (cu_matmul's GEMM rule: bf16 x); block-uniform */
    const bool split = FMT != 3 && (FMT != 0 || cnt <= CUDA_GEMV_MAX_N);
    constexpr int KSTEP = FMT == 3 ? 32 : 16;     /* columns per mma */
    constexpr int KSTAGE = KSTEP * (MG_BK / 16); /* columns per shared stage */
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
    int wm = warp & 1, wn = warp >> 1; /* pairs 32 wm .., rows 16 wn .. of each half */
    int cols = g.cols;
    /* FP8: this lane's 8 weight rows (half h, n8 fragment nt, column j) and their scale rows */
    const float *srow[2][2][2];
    int sc = 1;
    if (FMT == 1 || FMT == 3) {
        sc = (cols + g.seg[0].bc - 1) / g.seg[0].bc;
        for (int h = 0; h < 2; h++) {
            int r0;
            const CudaMoeSeg *S = mg_half<SW>(g, h, tile, &r0);
            for (int nt = 0; nt < 2; nt++)
                for (int j = 0; j < 2; j++) {
                    int r = r0 + 16 * wn + 8 * nt + 2 * tq + j;
                    r = r < S->rows ? r : S->rows - 1; /* past the end: dropped at the store */
                    srow[h][nt][j] = (const float *)S->s[e] + (size_t)(r / S->br) * sc;
                }
        }
    }
    for (int m0 = 0; m0 < cnt; m0 += MG_BM) {
        float acc[2][2][2][4], part[2][2][2][4]; /* [half][m16][n8][fragment] */
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int nt = 0; nt < 2; nt++)
#pragma unroll
                    for (int j = 0; j < 4; j++) acc[h][mt][nt][j] = part[h][mt][nt][j] = 0.f;
        /* fmt 3: the x scales of this lane's pair rows ([m16][g or g + 8]; past cnt: the first pair's) */
        int xri[2][2]; /* their xq rows: 32-bit indices, not pointers (registers) */
        if (FMT == 3)
            for (int mt = 0; mt < 2; mt++)
                for (int hi = 0; hi < 2; hi++) {
                    int m = m0 + 32 * wm + 16 * mt + gq + 8 * hi, p = p0 + (m < cnt ? m : 0);
                    xri[mt][hi] = g.x_row ? __ldg(g.x_row + p) : p;
                }
        __syncthreads(); /* every warp is done with the last pair tile's buffers */
        MgRegs rg;
        mg_fetch<FMT, SW>(g, e, tile, p0, cnt, m0, 0, sa[0], sb[0], &rg);
        cp_async_commit();
        mg_store<FMT>(rg, split, sa[0], sb[0]);
        for (int k0 = 0, st = 0; k0 < cols; k0 += KSTAGE, st++) {
            cp_async_wait<0>();
            __syncthreads(); /* stage st landed for every thread; every warp is done with stage st - 1 */
            const bool next = k0 + KSTAGE < cols; /* the next stage travels while this one is multiplied */
            if (next) mg_fetch<FMT, SW>(g, e, tile, p0, cnt, m0, k0 + KSTAGE, sa[(st + 1) & 1], sb[(st + 1) & 1], &rg);
            cp_async_commit();
            uint16_t (*xa)[MG_BM * MG_LD] = sa[st & 1], (*wb)[MG_BN * MG_LD] = sb[st & 1];
            uint32_t b[2][2][4]; /* [half][n8]: k 0..15 in 0, 1; k 16..31 in 2, 3 */
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int nt = 0; nt < 2; nt++)
                    ldsm_x4<false>(b[h][nt], &wb[h][(16 * wn + 8 * nt + (lane & 7)) * MG_LD + 8 * (lane >> 3)]);
#pragma unroll
            for (int kk = 0; kk < MG_BK / 16; kk++) {
                if (k0 + KSTEP * kk >= cols) break; /* block-uniform: the zero tail */
                uint32_t ah[2][4], al[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    const int off = (32 * wm + 16 * mt + (lane & 15)) * MG_LD + 16 * kk + 8 * (lane >> 4);
                    ldsm_x4<false>(ah[mt], &xa[0][off]);
                    if (split) ldsm_x4<false>(al[mt], &xa[1][off]);
                }
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int mt = 0; mt < 2; mt++)
#pragma unroll
                        for (int nt = 0; nt < 2; nt++) {
                            float *d = FMT == 1 || FMT == 3 ? part[h][mt][nt] : acc[h][mt][nt];
                            if (FMT == 3) {
                                mma_e4m3_16832(d, ah[mt], b[h][nt] + 2 * kk);
                                continue;
                            }
                            mma_bf16_16816(d, ah[mt], b[h][nt] + 2 * kk);
                            if (split) mma_bf16_16816(d, al[mt], b[h][nt] + 2 * kk);
                        }
                int kend = k0 + KSTEP * kk + KSTEP;
                if (FMT == 1 && (kend % g.seg[0].bc == 0 || kend >= cols)) /* a scale block's columns end */
                    mg_promote(acc, part, srow, (kend - 1) / g.seg[0].bc, NULL);
            }
            if (FMT == 3 && ((k0 + KSTAGE) % MG_GROUP == 0 || k0 + KSTAGE >= cols)) { /* a 128-column group ends */
                int kg = k0 / MG_GROUP;
                float xv[2][2];
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int hi = 0; hi < 2; hi++) xv[mt][hi] = __ldg(g.xs + (size_t)kg * g.xs_stride + xri[mt][hi]);
                mg_promote(acc, part, srow, kg * MG_GROUP / g.seg[0].bc, xv);
            }
            if (next) mg_store<FMT>(rg, split, sa[(st + 1) & 1], sb[(st + 1) & 1]); /* after the mma work */
        }
        /* the tile's outputs: fragment f of (mt, nt) is pair 32 wm + 16 mt + g (+8 for f >= 2), row
         * 16 wn + 8 nt + 2 tq + (f & 1) of its half */
        float s2[2] = {1.f, 1.f};
        if (FMT == 2)
            for (int h = 0; h < 2; h++) s2[h] = __ldg((const float *)g.seg[SW ? h : 0].s2[e]);
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int f = 0; f < 4; f++) {
                int m = m0 + 32 * wm + 16 * mt + gq + (f >= 2 ? 8 : 0);
                if (m >= cnt) continue;
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    int dr = 16 * wn + 8 * nt + 2 * tq + (f & 1);
                    if (SW) {
                        const CudaMoeSeg *S = &g.seg[0];
                        int r = tile * MG_BN + dr;
                        if (r >= S->rows) continue;
                        float gv = acc[0][mt][nt][f], uv = acc[1][mt][nt][f];
                        if (FMT == 2) gv *= s2[0], uv *= s2[1];
                        act[(size_t)(p0 + m) * S->rows + r] = (gv / (1.0f + expf(-gv))) * uv;
                    } else {
                        const CudaMoeSeg *S = &g.seg[0];
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            int r = tile * 2 * MG_BN + h * MG_BN + dr;
                            float v = acc[h][mt][nt][f];
                            if (FMT == 2) v *= s2[h];
                            if (r < S->rows) S->out[(size_t)(p0 + m) * S->rows + r] = v;
                        }
                    }
                }
            }
    }
}

extern "C" int cuda_moe_gemm_fp8_native(int bc, int cols) {
    return MG_FP8_MMA && bc > 0 && cols > 0 && cols % 16 == 0 && (bc % MG_GROUP == 0 || bc >= cols);
}

extern "C" int cuda_moe_gemm(CudaMoeGemv *g, float *act, void *stream) {
    if (!cuda_moe_args_ok(g) || (g->nseg == 2 && (!act || g->seg[1].rows != g->seg[0].rows))) return -1;
    /* one scale grid for gate and up (the kernel reads seg 0's bc; the rows' br each their own) */
    if ((g->fmt == 1 || g->fmt == 3) && g->nseg == 2 && g->seg[1].bc != g->seg[0].bc) return -1;
    if (g->n_pairs == 0) return 0;
    int sw = g->nseg == 2, span = sw ? MG_BN : 2 * MG_BN;
    g->tiles = (g->seg[0].rows + span - 1) / span;
    g->tiles0 = g->tiles;
    int slots = g->n_experts < g->n_pairs ? g->n_experts : g->n_pairs;
    unsigned blocks = (unsigned)slots * (unsigned)g->tiles;
    void (*k)(CudaMoeGemv, float *) = NULL;
    switch (2 * g->fmt + sw) {
    case 0: k = moe_mma_kernel<0>; break;
    case 1: k = moe_mma_kernel<1>; break;
    case 2: k = moe_mma_kernel<2>; break;
    case 3: k = moe_mma_kernel<3>; break;
    case 4: k = moe_mma_kernel<4>; break;
    case 5: k = moe_mma_kernel<5>; break;
    case 6: k = moe_mma_kernel<6>; break;
    default: k = moe_mma_kernel<7>; break;
    }
    pdl_launch(k, dim3(blocks), dim3(MG_THREADS), 0, (cudaStream_t)stream, *g, act);
    CUDA_CHECK_LAUNCH();
    return 0;
}
