/*
 * cuda_kernels.h - C launchers of the CUDA kernels (kernels/cuda/). Each
 * launcher checks shapes, launches on the given stream (a cudaStream_t passed
 * as void *) and checks the launch. Every kernel has a CPU reference op
 * (cpu_ops.h / backend_cpu.c) that the op checks of tests/gpu/op_checks.h compare against.
 * All tensor pointers are device pointers. Launchers return 0, or -1 on a bad
 * shape or argument (nothing is launched then); n == 0 is a valid no-op.
 *
 * Not here: the Backend table over these launchers (backend_cuda.cu), device
 * selection (device_select.h).
 */
#ifndef SAMPLER_CUDA_KERNELS_H
#define SAMPLER_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif
#include "check.h" /* Err (C linkage also when a .cu includes it first) */

/* The SAMPLER_GPU_SM this object code was compiled for (80, 90, 100, 103). */
int cuda_binary_sm(void);

/* Device probe for the per-GPU binaries: fills the properties of device 0 and
 * returns 0, or -1 when no CUDA device is usable. */
int cuda_device_probe(int *major, int *minor, int *sm_count, size_t *mem_bytes, char *name,
                      int name_len);

/* x[n, dim] f32 = emb[tokens[i]] (emb: [vocab, dim] bf16; tokens: [n] int32, already range-checked). */
int cuda_embed(float *x, const uint16_t *emb, const int32_t *tokens, int n, int dim, void *stream);

/* out[n, dim] (f32) = x[n, dim] (f32) / rms(x) * w[dim] (bf16); out may alias x.
 * split: NULL, or scratch of cuda_gemv_mma_scratch(n, dim) bytes (16-byte aligned, dim even) that
 * also gets the tensor-core FP8 / NVFP4 GEMV's split of out, the bits that GEMV's own split would
 * write: a GEMV over out with x_split = 1 then skips it. */
int cuda_rmsnorm(float *out, const float *x, const uint16_t *w, int n, int dim, float eps, void *split,
                 void *stream);
/* x[n, dim] += y[n, dim] (f32), then out = rmsnorm(x) * w: the residual add fused with
 * the norm after it, bit-identical to cuda_add then cuda_rmsnorm; out must not alias x. split: as
 * cuda_rmsnorm's. */
int cuda_add_rmsnorm(float *out, float *x, const float *y, const uint16_t *w, int n, int dim, float eps,
                     void *split, void *stream);

/* Decode GEMV: out[n, rows] f32 = x[n, cols] f32 @ W^T (W: [rows, cols] bf16)
 * (+ bias[rows] bf16 or NULL), f32 accumulation, 1 <= n <= CUDA_GEMV_MAX_N.
 * 16-byte weight loads when cols % 8 == 0 and W, x are 16-byte aligned. */
#define CUDA_GEMV_MAX_N 8
int cuda_gemv_bf16(float *out, const float *x, int n, const uint16_t *W, int rows, int cols,
                   const uint16_t *bias, void *stream);
/* cuda_gemv_bf16 on tensor cores (gemv_mma.cuh: x as bf16 hi + lo, f32 class, not the tiled GEMV's
 * bits): 2 <= n <= CUDA_GEMV_MAX_N, cols % 8 == 0, W and x 16-byte aligned; -1 otherwise. */
int cuda_gemv_bf16_mma(float *out, const float *x, int n, const uint16_t *W, int rows, int cols,
                       const uint16_t *bias, void *stream);
/* Scratch bytes the tensor-core FP8 / NVFP4 GEMVs split x [n, cols] into (f16 hi + lo pairs and one scale a
 * token): n cols 4 + n 4. */
size_t cuda_gemv_mma_scratch(int n, int cols);

/* Weight-only quantized matmul (kernels/cuda/quant_gemv.cu), any n >= 0 (up to 8
 * tokens per launch), f32 activations, weights dequantized in the kernel, f32
 * accumulation; reference quant_matmul_*_rows with xs = NULL (quant.h).
 * FP8: out[n, rows] = x[n, cols] @ (e4m3(Q) * scale_inv)^T (+ bias[rows] bf16 or
 * NULL); Q: [rows, cols] e4m3, scale_inv: [ceil(rows / block_rows),
 * ceil(cols / block_cols)] f32. 16-byte loads when cols % 16 == 0, block_cols is
 * a multiple of 16 (or >= cols) and Q, x are 16-byte aligned. */
int cuda_gemv_fp8(float *out, const float *x, int n, const uint8_t *Q, const float *scale_inv, int rows,
                  int cols, int block_rows, int block_cols, const uint16_t *bias, void *stream);
/* cuda_gemv_fp8 on tensor cores (gemv_mma.cuh: e4m3 -> f16 weights, x split into f16 hi + lo in
 * scratch of cuda_gemv_mma_scratch(n, cols) bytes, 16-byte aligned; f32 class, not the tiled GEMV's
 * bits): 1 <= n <= CUDA_GEMV_MAX_N, cols % 16 == 0, block_cols % 64 == 0 or >= cols, Q and x
 * 16-byte aligned, a binary for sm_89+; -1 otherwise. x_split 1: scratch holds x's split already
 * (cuda_rmsnorm / cuda_add_rmsnorm wrote it for this x, n and cols), the launch does not split. */
int cuda_gemv_fp8_mma(float *out, const float *x, int n, const uint8_t *Q, const float *scale_inv, int rows,
                      int cols, int block_rows, int block_cols, const uint16_t *bias, void *scratch, int x_split,
                      void *stream);
/* NVFP4: out[n, rows] = (x @ (e2m1(packed) * e4m3(scale))^T) * scale2[0] (+ bias);
 * packed: [rows, cols / 2] (element 2i in the low nibble), scale: [rows, cols / 16]
 * e4m3, scale2: [1] f32 device memory (read by the kernel), cols % 16 == 0. 16-byte loads when cols % 32 == 0 and packed, x are 16-byte
 * aligned. */
int cuda_gemv_nvfp4(float *out, const float *x, int n, const uint8_t *packed, const uint8_t *scale,
                    const float *scale2, int rows, int cols, const uint16_t *bias, void *stream);
/* cuda_gemv_nvfp4 on tensor cores (gemv_mma.cuh: e2m1 times its block scale -> f16 weights, exact;
 * x split as cuda_gemv_fp8_mma's, in scratch of cuda_gemv_mma_scratch(n, cols) bytes, 16-byte
 * aligned; f32 class, not the tiled GEMV's bits): 1 <= n <= CUDA_GEMV_MAX_N, cols % 32 == 0, packed
 * and x 16-byte aligned, scale 2-byte aligned; -1 otherwise. */
int cuda_gemv_nvfp4_mma(float *out, const float *x, int n, const uint8_t *packed, const uint8_t *scale,
                        const float *scale2, int rows, int cols, const uint16_t *bias, void *scratch, int x_split,
                        void *stream);

/* Prefill GEMM through cuBLAS (handle: a cublasHandle_t already bound to
 * stream with cublasSetStream; -1 if it is bound to another stream):
 * x[n, cols] f32 is rounded to bf16 into xbf[n * cols] (scratch), then
 * out[n, rows] f32 = xbf @ W^T with f32 accumulation (+ bias[rows] bf16 or NULL). */
int cuda_gemm_bf16(void *cublas, float *out, const float *x, uint16_t *xbf, int n,
                   const uint16_t *W, int rows, int cols, const uint16_t *bias, void *stream);

/* Per head of x[n, n_heads * head_dim] f32, in place: optional RMSNorm over
 * head_dim (norm_w [head_dim] bf16 or NULL), then RoPE (rotate_half pairs
 * (i, i + head_dim/2)) with the tables cs, sn: [max_ctx, head_dim / 2] f32 at
 * row pos[t] (int32 [n]) for token t. head_dim even, <= 512. */
int cuda_norm_rope(float *x, int n, int n_heads, int head_dim, const uint16_t *norm_w, float eps,
                   const float *cs, const float *sn, const int32_t *pos, void *stream);
/* RopeKvArgs (backend.h; device pointers): norm_rope of q in place, and of k in
 * registers stored with v into the cache as cuda_kv_write stores them, one
 * launch (rope_kv_write.cu). head_dim even, <= 512. */
int cuda_rope_kv_write(const RopeKvArgs *a, void *stream);

/* Paged attention (AttnArgs in backend.h; all its pointers are device
 * pointers): online softmax, GQA. head_dim <= CUDA_ATTN_MAX_HEAD_DIM.
 * n_splits > 1 splits each token's positions over that many blocks
 * (flash-decoding) and needs part: [n_splits, n_tokens * n_heads, head_dim + 2]
 * f32 scratch; n_splits == 1 writes out directly (part may be NULL). */
#define CUDA_ATTN_MAX_HEAD_DIM 256
#define CUDA_ATTN_GROUP 4   /* query heads of one KV head handled per block */
#define CUDA_ATTN_CHUNK 32  /* positions per split chunk */
int cuda_attention(const AttnArgs *a, float *part, int n_splits, void *stream);
/* 0: BF16 / FP8 caches take the warp-a-position kernel (attn_kernel) even where
 * the vector kernel fits; 1 (the default): the vector kernel. For gpu_check's
 * A/B of the two (bench_attn_decode) and nothing else; host state, read at
 * each launch, not thread-safe. */
void cuda_attention_vec_enable(int on);
/* Programmatic dependent launch of every kernel of a step (cuda_pdl.cuh): enabled by default
 * where the binary (sm_90+) and device 0 (compute capability 9+) both have it; off for the process
 * with cuda_pdl_enable(0) (SAMPLER_CUDA_OFF=pdl). */
void cuda_pdl_enable(int on);
int cuda_pdl_enabled(void);
/* The decode GEMVs' L2 prefetch of their first weight lines before their pdl_wait (cuda_pdl.cuh):
 * on by default, off for the process with cuda_gemv_prefetch_enable(0) (SAMPLER_CUDA_OFF=prefetch).
 * Read at each launch (relaxed: a flag); the results are the same bits either way. */
void cuda_gemv_prefetch_enable(int on);
int cuda_gemv_prefetch_enabled(void);
/* How many splits cuda_attention should use for a batch on a device with
 * sm_count SMs and contexts up to max_ctx (1 when the batch fills the GPU). */
int cuda_attention_splits(int n_tokens, int n_heads, int n_kv_heads, int max_ctx, int sm_count);
/* Prefill attention on tensor cores (attention_mma.cu): the same contract as
 * cuda_attention for BF16 / FP8 KV caches and head_dim 64 or 128, Q and P
 * rounded to bf16 in the products (op_checks.h's attn_bf16 class) for the
 * tiles of CUDA_ATTN_MMA_TILE tokens it takes (attn_tiles.cuh: at most two
 * sequences in the tile); the tokens of the other tiles (decode tokens of a
 * mixed batch) go to cuda_attention_untiled in the same call. _fits: 1 when a
 * is such a call and prefill-shaped (n_seqs known, at least CUDA_ATTN_MMA_MIN_Q
 * query tokens per sequence on average), the choice the CUDA backend's
 * attention op makes. Returns 0, or -1 on a bad shape. */
#define CUDA_ATTN_MMA_MIN_Q 16
#define CUDA_ATTN_MMA_TILE 64
int cuda_attention_mma_fits(const AttnArgs *a);
int cuda_attention_mma(const AttnArgs *a, void *stream);
/* The same with each tile's positions split over n_splits blocks (long
 * contexts: a chunk of a few tiles deep in a 32k context is otherwise a few
 * blocks walking 32k positions each). Block z takes the 64-position KV tiles
 * z, z + n_splits, ...; part: [n_splits, n_tokens * n_heads, head_dim + 2]
 * (unnormalised acc..., max, sum) device scratch when n_splits > 1, merged by
 * cuda_attention_merge. Any n_splits >= 1 gives the result (the split changes
 * only the summation order); _mma_splits is the choice for a device of
 * sm_count SMs and contexts up to max_ctx (1 when the tiles fill the GPU). */
int cuda_attention_mma_split(const AttnArgs *a, float *part, int n_splits, void *stream);
int cuda_attention_mma_splits(int n_tokens, int n_heads, int max_ctx, int sm_count);
/* Decode attention on tensor cores for grouped heads (attention_dec_mma.cu):
 * the same contract as cuda_attention for BF16 / FP8 caches, head_dim 64 or
 * 128 and G = n_heads / n_kv_heads <= CUDA_ATTN_DEC_MMA_MAX_G (the G heads of
 * a KV head are the rows of one m16n8k16 tile), Q and P as bf16 hi + lo in the
 * products (two mmas each: op_checks.h's f32 class). Any token layout (each token
 * alone). n_splits > 1 needs part as cuda_attention does; _splits is the
 * choice for a device of sm_count SMs. _fits: 1 when the CUDA backend's
 * attention op takes it for a call that is not prefill-shaped: G >=
 * CUDA_ATTN_DEC_MMA_MIN_G (vLLM's rule for FlashInfer's tensor-core decode,
 * G > 4; the vector kernel below that). Returns 0, or -1 on a bad shape. */
#define CUDA_ATTN_DEC_MMA_MIN_G 5
#define CUDA_ATTN_DEC_MMA_MAX_G 16
int cuda_attention_dec_mma_fits(const AttnArgs *a);
int cuda_attention_dec_mma(const AttnArgs *a, float *part, int n_splits, void *stream);
int cuda_attention_dec_mma_splits(int n_tokens, int n_kv_heads, int max_ctx, int sm_count);
/* out[rows, hd] f32 = the merge of part [n_splits, rows, hd + 2] (flash-decoding's second kernel). */
int cuda_attention_merge(float *out, const float *part, int rows, int hd, int n_splits, void *stream);
/* cuda_attention (unsplit) of the tokens whose tile cuda_attention_mma does
 * not take; the others' output is left as it is. */
int cuda_attention_untiled(const AttnArgs *a, void *stream);

/* out[n] = silu(g[n]) * u[n] (f32; out may alias g or u). */
int cuda_swiglu(float *out, const float *g, const float *u, size_t n, void *stream);
/* x[n] += y[n] (f32). */
int cuda_add(float *x, const float *y, size_t n, void *stream);
/* out[n] bf16 = round-to-nearest-even(x[n] f32). */
int cuda_f32_to_bf16(uint16_t *out, const float *x, size_t n, void *stream);
/* out[n, rows] f32 += bias[rows] bf16. */
int cuda_add_bias(float *out, const uint16_t *bias, int n, int rows, void *stream);

/* The KV write of one layer (KvWriteArgs in backend.h, device pointers; kv_write.cu). */
int cuda_kv_write(const KvWriteArgs *a, void *stream);
/* dst[i] = src[rows[i]] for i < n; rows of dim f32. */
int cuda_gather_rows(float *dst, const float *src, const int32_t *rows, int n, int dim, void *stream);
/* dst[rows[i]] += w[i] * src[i] for i < n, in order of i (rows may repeat). */
int cuda_scale_add_rows(float *dst, const float *src, const int32_t *rows, const float *w, int n,
                        int dim, void *stream);

/* ---- MoE (moe_route.cu, moe_gemm.cu) ----
 * Routing of one layer (backend.h MoeRouteArgs, device pointers): top-k, then
 * the pairs sorted by expert; reference cpu_moe_route. One launch up to 64
 * tokens, two above, sized by n. */
int cuda_moe_route(const MoeRouteArgs *a, void *stream);
/* The router's matmul and that routing in one launch: a->logits [n, n_experts] f32 = x [n, cols] f32 @
 * W^T (W [n_experts, cols] bf16, the router) by the tiled GEMV (the bits of cuda_gemv_bf16's tile
 * path), then cuda_moe_route's outputs from them, the same bits. The last block to finish routes
 * (counted in *done, a device uint32 that is 0 between launches and put back to 0). Takes 1 <= n <=
 * CUDA_GEMV_MAX_N, n_experts <= 256, cols % 8 == 0, W and x 16-byte aligned: 0, or -1 without a
 * launch (the caller runs the two). */
int cuda_moe_router_route(const MoeRouteArgs *a, const float *x, const uint16_t *W, int cols, uint32_t *done,
                          void *stream);
/* Grouped GEMV over every active expert in one launch: for each expert e with
 * pairs [offsets[e], offsets[e + 1]), out[p, rows] = x[p, cols] @ W_e^T (f32
 * accumulation, gemv_tile.cuh), for one or two matrices over the same x (gate
 * and up). Grid: min(n_experts, n_pairs) slots of active[] x row tiles.
 * fmt 0 bf16, 1 fp8 e4m3 (f32 scale_inv blocks br x bc: bc % 16 == 0 or
 * bc >= cols); cols % (8 << fmt) == 0; x and every W_e 16-byte aligned.
 * fmt 3 (cuda_moe_gemm only, where cuda_moe_gemm_fp8_native(bc, cols)): FP8
 * weights times e4m3 activations, the native FP8 path (x unused; xq, xs,
 * x_row instead), xq 16-byte aligned. */
typedef struct CudaMoeSeg {
    float *out;             /* [n_pairs, rows] f32, pair order */
    const void *const *w;   /* [n_experts] device pointers: expert e's [rows, cols] bf16 / e4m3, or nvfp4
                             * [rows, cols / 2] e2m1 pairs */
    const void *const *s;   /* [n_experts] fp8: expert e's scale_inv [ceil(rows / br), ceil(cols / bc)] f32;
                             * nvfp4: its block scales [rows, cols / 16] e4m3 */
    const void *const *s2;  /* nvfp4: [n_experts] device pointers: expert e's scale2 ([1] f32, WeightMat.dev_s2) */
    int rows, br, bc;
} CudaMoeSeg;
typedef struct CudaMoeGemv {
    CudaMoeSeg seg[2];
    int nseg;               /* 1 or 2 */
    const float *x;         /* [n_pairs, cols] f32, pair order (fmt 0..2), or [tokens, cols] read through x_row */
    const uint8_t *xq;      /* fmt 3: [x rows, cols] e4m3 activations (cuda_quant_act_fp8) */
    const float *xs;        /* fmt 3: their scales, row r's 128-column group k at xs[k * xs_stride + r] */
    const int32_t *x_row;   /* [n_pairs] int32 row of x / xq pair p reads (moe_route's pair_tok: the token
                             * rows, no gather), or NULL: row p. cuda_moe_gemm takes it at any fmt,
                             * cuda_moe_gemv_swiglu at max_cnt 1, cuda_moe_gemv never */
    int xs_stride;          /* fmt 3: rows quantized in 128-column groups, or 0: one scale a row (bc >= cols) */
    int cols;
    const int32_t *offsets; /* [n_experts + 1] int32 (moe_route) */
    const int32_t *active;  /* [n_experts] int32 experts with pairs, then -1 (moe_route) */
    int n_experts, n_pairs, fmt; /* fmt: 0 bf16, 1 fp8, 2 nvfp4 (gemv_tile.cuh's FMT), 3 fp8 x e4m3 */
    int max_cnt;            /* cuda_moe_gemv: the most pairs one expert may have (a step's tokens: a token's
                             * experts are distinct), or 0: unknown. It sizes the GEMV's tile (1, 2, 4 or 8
                             * pairs a pass: a decode step of one token gets the registers of a one-pair
                             * tile); any value gives the same result, an expert of more pairs takes more passes */
    int tiles0, tiles;      /* set by the launcher: row tiles of seg 0, of all */
} CudaMoeGemv;
int cuda_moe_gemv(CudaMoeGemv *g, void *stream);
/* nseg 2 (gate, up: the same rows) with the SwiGLU epilogue: act [n_pairs, rows] f32 = silu(gate) *
 * up, the bits of cuda_moe_gemv then cuda_swiglu, one launch instead of two; the segments' out are not
 * written. Takes max_cnt 1 or 2 (decode steps of one or two tokens), fmt 0..2, and at max_cnt 1 x
 * through x_row (the token rows, so no gather either): 0, or -1 without a launch (the caller gathers
 * and runs the two). */
int cuda_moe_gemv_swiglu(CudaMoeGemv *g, float *act, void *stream);
/* 1 when g satisfies the rules above (both grouped launchers check them first), else 0. */
int cuda_moe_args_ok(const CudaMoeGemv *g);
/* The same grouped linears on tensor cores (moe_mma.cu), for steps of more than
 * CUDA_GEMV_MAX_N tokens. Weights decoded exactly; x rounded to bf16 for a BF16
 * expert of more than CUDA_GEMV_MAX_N pairs (as cuda_gemm_bf16), else carried as
 * bf16 hi + lo (f32 class, the GEMV's class). Takes the shapes cuda_moe_gemv takes (nseg 2: the same rows and
 * FP8 bc). nseg 2 (gate, up): act [n_pairs, rows] f32 = silu(gate) * up, the
 * segments' out not written; nseg 1: seg[0].out, act unused. 0, or -1 without
 * a launch. */
int cuda_moe_gemm(CudaMoeGemv *g, float *act, void *stream);
/* 1 when this binary's cuda_moe_gemm takes fmt 3 for FP8 weights of scale
 * blocks bc columns wide over cols: it has the FP8 mma.sync (sm_89+: the
 * sm_90 / 100 / 103 binaries and the CPU emulation), cols % 16 == 0, and the
 * blocks are whole 128-column groups (bc % 128 == 0 or bc >= cols); else 0.
 * The one rule its callers (cu_moe_mlp, the start-up log, the tests) share.
 * fmt 3 is quant_matmul_fp8_rows with quant_act_fp8's xs: per 128 columns k
 * of a row, the e4m3 products summed on tensor cores, then acc += sum * (ws * xs). */
int cuda_moe_gemm_fp8_native(int bc, int cols);
/* out[t, dim] = sum over k in ascending pair_of order of weights[t, k] * y[pair_of[t, k], dim]
 * (y [n * top_k, dim] f32 in pair order; pair_of, weights [n, top_k]). */
int cuda_moe_unpermute(float *out, const float *y, const int32_t *pair_of, const float *weights, int n, int top_k,
                       int dim, void *stream);
/* The down GEMV with that unpermute as its epilogue, one launch instead of two: cuda_moe_gemv of g (nseg
 * 1: y = seg[0].out [n_pairs, rows], still written), then out as cuda_moe_unpermute over y, the same
 * bits. The row tile's last block sums it (counted in tile_done, which it puts back to 0). Takes what
 * cuda_moe_gemv takes with nseg 1, n <= CUDA_GEMV_MAX_N tokens, n_pairs = n top_k, tile_cap >= the row
 * tiles (rows / CUDA_MOE_TILE_ROWS, rounded up): 0, or -1 without a launch (the caller runs the two). */
#define CUDA_MOE_TILE_ROWS 4 /* the grouped GEMV's rows a block (gemv_tile.cuh's GT_ROWS; moe_gemm.cu asserts it) */
/* The residual add and the next RMSNorm that a GEMV at one token takes as its epilogue (cuda_gemv_add_rmsnorm:
 * o, a dense MLP's down; CudaMoeUnpermute: the routed experts' down): x += the GEMV's row, then out =
 * rmsnorm(x) * w and, split non-NULL, out's split, the bits of cuda_add_rmsnorm(out, x, row, w, 1,
 * rows, eps, split) after the GEMV alone. */
typedef struct GemvAddNorm {
    float *x;          /* [1, rows] f32: the residual, updated in place; not the GEMV's input */
    float *out;        /* [1, rows] f32: rmsnorm(x) * w; not x, not the GEMV's input */
    const uint16_t *w; /* [rows] bf16: the norm's weight */
    float eps;
    void *split;       /* NULL, or scratch of cuda_gemv_mma_scratch(1, rows) bytes (16-byte aligned, rows even):
                        * out's split for the FP8 / NVFP4 tensor-core GEMV after it (rmsnorm.cu's) */
    uint32_t *done;    /* [1] device counter, 0 between launches (the last block puts it back) */
} GemvAddNorm;
typedef struct CudaMoeUnpermute {
    float *out;             /* [n, seg[0].rows] f32 */
    const int32_t *pair_of; /* [n, top_k] int32 (moe_route) */
    const float *weights;   /* [n, top_k] f32 (moe_route) */
    int n, top_k;
    uint32_t *tile_done;    /* [tile_cap] uint32 device, all 0 between launches */
    int tile_cap;
    /* Optional, at n = 1 (add_norm.x NULL: out written): the token's unpermuted row is added into
     * add_norm.x instead of stored in out (not out), and the launch's last row tile norms it. */
    GemvAddNorm add_norm;
} CudaMoeUnpermute;
int cuda_moe_gemv_unpermute(CudaMoeGemv *g, const CudaMoeUnpermute *u, void *stream);

/* Sparse delta on a device weight copy (scatter.cu): dst[idx[i]] = val[i] for i < n,
 * elements of elem bytes (1, 2, 4); dst: [numel]; idx: [n] int64 (device); val: [n]
 * (device). Indices outside [0, numel) are skipped. The update path: a bad argument or
 * a failed launch returns <0 with err (may be NULL) filled, never exits. */
int cuda_scatter(void *dst, int64_t numel, const int64_t *idx, const void *val, int64_t n, int elem, void *stream,
                 Err *err);
/* out[i] = src[idx[i]] (the read-back that verifies a scatter); zero bytes out of range. Errors as cuda_scatter. */
int cuda_gather(void *out, const void *src, int64_t numel, const int64_t *idx, int64_t n, int elem, void *stream,
                Err *err);

/* p[n] bf16 = mean + scale * u, u uniform in [-1, 1) from a counter hash of
 * (seed, index): random weights made directly in device memory (benchmarks). */
int cuda_fill_bf16(uint16_t *p, size_t n, uint64_t seed, float mean, float scale, void *stream);

/* ---- batched LoRA (lora.cu): Punica / S-LoRA's SGMV shrink then expand ----
 * Rows of one call are grouped into segments, one per distinct adapter pair:
 * rows[row0[s] .. row0[s + 1]) (device, [n] int32, batch rows) use pair s. For
 * each such row i: h = scale[s] * A_s x[i] (shrink, into h [n, h_stride] f32,
 * indexed by the row's position in rows), then out[i] += B_s^T h (expand, j in
 * order, one fmaf per j: cpu_axpy's arithmetic). Rows in no segment are not
 * touched. A [rank, in] and B^T [rank, out] are f32 or bf16 (bf16[s]: values
 * widened exactly, f32 math). Each row's result is computed by the same lanes
 * in the same order whatever else is in the call: a mixed batch gives each
 * row the bits it gets alone. 0, or -1 on a bad shape (nothing launched). */
#define CUDA_LORA_MAX_SEG 64
typedef struct CudaLoraSegs {
    const void *a[CUDA_LORA_MAX_SEG];  /* [rank, in] f32 or bf16, device */
    const void *b[CUDA_LORA_MAX_SEG];  /* [rank, out] f32 or bf16 (B transposed), device */
    float scale[CUDA_LORA_MAX_SEG];
    int rank[CUDA_LORA_MAX_SEG];       /* 1..h_stride */
    int bf16[CUDA_LORA_MAX_SEG];
    int row0[CUDA_LORA_MAX_SEG + 1];   /* segment s: positions row0[s] .. row0[s + 1] of rows */
    int tile0[CUDA_LORA_MAX_SEG + 1];  /* first row tile of segment s (set by cuda_lora) */
    int n_seg;
} CudaLoraSegs;
int cuda_lora(float *out, const float *x, int n, int in, int out_dim, float *h, int h_stride, const int32_t *rows,
              CudaLoraSegs *segs, void *stream);

#ifdef __cplusplus
}
#endif
#endif
