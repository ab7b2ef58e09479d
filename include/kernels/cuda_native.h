/*
 * cuda_native.h - C launchers of the native (quantized-activation) FP8 and
 * NVFP4 paths: device-side activation quantization (kernels/cuda/quant_act.cu)
 * and the cuBLASLt tensor-core GEMMs over it (kernels/cuda/lt_gemm.cu). Each
 * launcher checks shapes and returns 0, or -1 on a bad shape / argument
 * (nothing launched) or an unsupported configuration (cuBLASLt found no
 * algorithm); n == 0 is a no-op. All tensor pointers are device pointers.
 *
 * References (quant.h, bit for bit for the quantizers, a stated tolerance for
 * the GEMMs: tests/gpu/op_checks_native.h):
 *   cuda_quant_act_fp8    quant_act_fp8 (group 128) / quant_act_fp8_token (group = cols)
 *   cuda_quant_act_nvfp4  quant_act_nvfp4
 *   cuda_gemm_fp8_block   quant_matmul_fp8_rows, 128x128 weights, xs from quant_act_fp8
 *   cuda_gemm_fp8_rowwise quant_matmul_fp8_rows, per-channel weights, xs from quant_act_fp8_token
 *   cuda_gemm_nvfp4       quant_matmul_nvfp4_rows, xg from quant_act_nvfp4
 *
 * Which GEMM runs where (cuBLAS 13.0; docs: "Scaling Mode Support Overview";
 * NVIDIA's answers in NVIDIA/CUDALibrarySamples#310 and #270: OUTER_VEC_32F,
 * VEC128_32F and BLK128x128_32F are sm_90 only, sm_100+ has VEC32_UE8M0;
 * PyTorch's scaled_mm limits VEC128/BLK128x128 to sm_90 likewise):
 *   sm_90a   FP8 1x128 activations (VEC128_32F) x 128x128 weights
 *            (BLK128x128_32F): the checkpoint's own scales, no re-quantization.
 *   sm_100a/103a  cuBLASLt has no VEC128/BLK128x128 there (FP8: tensor-wide
 *            scalars or MXFP8 VEC32_UE8M0), so FP8 runs per channel: weights
 *            re-quantized per output row, activations per token, a plain e4m3
 *            GEMM (unit scalar scales, f32 accumulate) and the outer product of
 *            the two scale vectors applied by cuda_scale_outer afterwards.
 *            NVFP4: VEC16_UE4M3 on both operands, compiled for sm_100/103 only
 *            (and the CPU emulation); elsewhere cuda_gemm_nvfp4 returns -1.
 * Output f32 (the activations the next op reads are f32; f32 D keeps the
 * result comparable with the CPU reference without a bf16 rounding). Not
 * verified on a device: whether cuBLASLt 13.0 has f32-D algorithms for the
 * sm_90 block-scaled mode (its samples write bf16). If it has none the
 * heuristic finds nothing, the launcher returns -1, the backend logs it once
 * and runs weight-only, and gpu_check's "gemm fp8 1x128 x 128x128" rows FAIL:
 * then a bf16 D plus a widening pass is the fix.
 *
 * Not here: which path a matrix takes (backend_cuda.cu, native_choice), the
 * weight-only GEMV (cuda_kernels.h).
 */
#ifndef SAMPLER_CUDA_NATIVE_H
#define SAMPLER_CUDA_NATIVE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Tokens at and above which an act_quant matrix takes the tensor-core GEMM when
 * nothing was measured (WeightMat.native_min_n == 0: the op checks, a server
 * started with --native-crossover off the GPU); below it the weight-only GEMV
 * (f32 activations). A server measures each shape's own crossover on its
 * device at start-up (device_native_calibrate, backend_cuda_native_time). */
#define CUDA_NATIVE_MIN_N 16

/* FP8 activations, per token and `group` columns (128, or cols for per token):
 * xq [n, cols] e4m3; scale of (token t, group g) at xs[g * n + t] ("outer-major",
 * cuBLASLt's VEC128_32F layout for the B operand); with group == cols that is
 * xs[t]. s = amax / 448 (1 for an all-zero group), q = e4m3_sat(x / s). */
int cuda_quant_act_fp8(uint8_t *xq, float *xs, const float *x, int n, int cols, int group, void *stream);

/* NVFP4 activations (cols % 16 == 0): xq [n, cols / 2] e2m1 pairs (element 2i
 * in the low nibble); block scales e4m3 of (token t, block b) at
 * sf[cuda_nvfp4_sf_offset(t, b, cols / 16)] when swizzled, else sf[t * cols / 16 + b];
 * xg [n] f32 global scales (static_scale > 0: that one; else amax_t / 2688). The
 * swizzled buffer holds cuda_nvfp4_sf_bytes(n, cols) bytes, padding zeroed. */
int cuda_quant_act_nvfp4(uint8_t *xq, uint8_t *sf, float *xg, const float *x, int n, int cols, float static_scale,
                         int swizzled, void *stream);

/* cuBLASLt's VEC16_UE4M3 scale layout for an operand of `outer` rows and nb = K/16
 * scales per row: 128 x 4 tiles of 512 bytes, tile (r / 128, b / 4) row-major over
 * ceil(nb / 4) tiles per 128 rows, inside a tile (r % 32) * 16 + (r % 128 / 32) * 4 + b % 4. */
#ifdef __CUDACC__
#define CUDA_NATIVE_HD __host__ __device__ /* the kernels and the host both compute it */
#else
#define CUDA_NATIVE_HD
#endif
static inline CUDA_NATIVE_HD size_t cuda_nvfp4_sf_offset(int r, int b, int nb) {
    size_t tiles_k = (size_t)(nb + 3) / 4;
    return ((size_t)(r / 128) * tiles_k + (size_t)(b / 4)) * 512 + (size_t)(r % 32) * 16 + (size_t)(r % 128 / 32) * 4 +
           (size_t)(b % 4);
}
static inline size_t cuda_nvfp4_sf_bytes(int outer, int cols) {
    return (size_t)((outer + 127) / 128 * 128) * (size_t)((cols / 16 + 3) / 4 * 4);
}
/* Row-major scales src [rows, cols / 16] -> the swizzled layout in dst (padding zeroed). */
int cuda_nvfp4_swizzle(uint8_t *dst, const uint8_t *src, int rows, int cols, void *stream);
/* The same for the update path (a delta's refresh of a matrix's swizzled copy): every CUDA error
 * returned in err instead of fatal. */
struct Err;
int cuda_nvfp4_swizzle_try(uint8_t *dst, const uint8_t *src, int rows, int cols, void *stream, struct Err *err);

/* out[n, rows] = out * alpha * (ad ? ad[0] : 1) * (rs ? rs[t] : 1) * (cs ? cs[r] : 1) (+ bias[rows]
 * bf16); ad: [1] f32 device memory or NULL (a scale read at run time, NVFP4's scale2). */
int cuda_scale_outer(float *out, int n, int rows, const float *rs, const float *cs, float alpha, const float *ad,
                     const uint16_t *bias, void *stream);

/* A cuBLASLt handle, its fixed workspace and a bounded cache of algorithm
 * choices (CUDA_LT_PLANS entries, keyed by kind and shape; a full cache
 * replaces round-robin). Created at backend creation (fatal on failure). */
typedef struct CudaLt CudaLt;
#define CUDA_LT_PLANS 64
CudaLt *cuda_lt_create(void);
void cuda_lt_free(CudaLt *lt);

/* FP8 GEMMs: out[n, rows] f32 = x @ W^T (+ bias), W [rows, cols] e4m3, xq from
 * cuda_quant_act_fp8. block: ws [ceil(rows/128), cols/128] f32 (QuantFp8.scale_inv,
 * 128x128), xs group 128; needs rows % 16 == 0, cols % 512 == 0 (the scale rows'
 * implied pitch is a multiple of 4). rowwise: ws [rows] (per channel), xs [n]
 * (group = cols); rows % 16 == 0, cols % 16 == 0. */
int cuda_gemm_fp8_block(CudaLt *lt, float *out, const uint8_t *xq, const float *xs, int n, const uint8_t *W,
                        const float *ws, int rows, int cols, const uint16_t *bias, void *stream);
int cuda_gemm_fp8_rowwise(CudaLt *lt, float *out, const uint8_t *xq, const float *xs, int n, const uint8_t *W,
                          const float *ws, int rows, int cols, const uint16_t *bias, void *stream);
/* NVFP4: W packed [rows, cols / 2], wsf its swizzled scales (cuda_nvfp4_swizzle),
 * xq / xsf (swizzled) / xg from cuda_quant_act_nvfp4; out = acc * scale2[0] * xg[t]
 * (+ bias), scale2 [1] f32 device memory. rows % 16 == 0, cols % 32 == 0. -1 in binaries not built for sm_100/103. */
int cuda_gemm_nvfp4(CudaLt *lt, float *out, const uint8_t *xq, const uint8_t *xsf, const float *xg, int n,
                    const uint8_t *W, const uint8_t *wsf, const float *scale2, int rows, int cols, const uint16_t *bias,
                    void *stream);

/* Which native GEMMs this binary has: FP8 block (sm_90), FP8 rowwise (sm_90,
 * sm_100, sm_103: any per-channel FP8 matrix), NVFP4 (sm_100/103); the CPU
 * emulation has all three. */
#define CUDA_NATIVE_FP8_BLOCK 1
#define CUDA_NATIVE_FP8_ROWWISE 2
#define CUDA_NATIVE_NVFP4 4
int cuda_native_caps(void);

/* The native GEMM an act_quant matrix takes in this binary (one CUDA_NATIVE_*
 * bit), or 0 (not act_quant, no path for its layout, or a shape the GEMM does
 * not take): the backend's per-matrix choice, also for start-up logs. */
struct WeightMat;
int backend_cuda_native_kind(const struct WeightMat *w);

/* Start-up (device_native_calibrate): the two paths a matmul of w at n tokens
 * chooses between, as the backend runs them (the weight-only GEMV; the
 * activation quantizer + the native GEMM), each the best of `reps` runs after
 * one warm-up, timed by CUDA events on the backend's stream, in microseconds.
 * *native_us = -1 when w has no native path or cuBLASLt refused the shape.
 * Allocates and frees its own x [n, cols] f32 and out [n, rows] f32 (start-up
 * only). 0, or -1 on a CUDA error (the caller keeps the constant). */
struct Backend;
int backend_cuda_native_time(struct Backend *b, const struct WeightMat *w, int n, int reps, float *wo_us,
                             float *native_us);

/* The start-up timers below also run both paths once on the same input and compare: a result of
 * the tensor-core path further than CUDA_MMA_AGREE_TOL (max |mma - tiled| / max |tiled|; both paths
 * are f32 class, ~1e-6 apart) from the other's is a kernel or device fault, and the timer reports
 * *mma_us = CUDA_MMA_DISAGREES, so the calibration never picks it. */
#define CUDA_MMA_AGREE_TOL 1e-3
#define CUDA_MMA_DISAGREES (-2.0f)

/* Start-up (device_gemv_calibrate): a BF16, FP8 or NVFP4 matrix w's two decode GEMVs at n (1..8)
 * tokens, the tiled one (gemv_tile.cuh; FP8 / NVFP4: weight-only) and the tensor-core one
 * (gemv_mma.cuh), each the best of `reps` runs after one warm-up, in microseconds, on x / out buffers
 * of its own. *mma_us = -1 when the tensor-core GEMV is off (SAMPLER_CUDA_OFF=gemv_mma), does not take
 * n (BF16 at 1 token) or w's shape (cols % 8, 16 or 32, FP8 block_cols % 64, the sm_80 binary's FP8);
 * CUDA_MMA_DISAGREES when its result on a patterned x is not the tiled one's. presplit (FP8 / NVFP4): w
 * reads a norm's output, whose split of x the norm writes (backend_cuda_gemv_presplit), so the
 * tensor-core side is timed without its own split launch. 0, or -1 on a CUDA error or a matrix without
 * its device copy. */
int backend_cuda_gemv_time(struct Backend *b, const struct WeightMat *w, int n, int reps, int presplit,
                           float *tile_us, float *mma_us);
/* Start-up (device_gemv_calibrate, after the records): the norms at min_n..CUDA_GEMV_MAX_N tokens also
 * write the tensor-core FP8 / NVFP4 GEMV's split of their output (rmsnorm.cu), which the q/k/v and
 * gate/up launches over it then skip (backend_cuda.cu norm_split); 0: never (the default). The same
 * bits either way; min_n: the smallest mma_min_n of an FP8 / NVFP4 matrix. */
void backend_cuda_gemv_presplit(struct Backend *b, int min_n);

/* Start-up (device_native_calibrate): the routed experts of one MoE step, a->x
 * set and routed (moe_route's outputs in a->route), as moe_mlp runs them
 * weight-only (the grouped GEMV, or above CUDA_GEMV_MAX_N tokens the grouped
 * weight-only GEMM) and native (x quantized on the device, the e4m3 grouped
 * GEMM), each the best of `reps` runs after one warm-up, in microseconds, in
 * the buffers of a (out and the scratch are overwritten). *native_us = -1 when
 * these experts have no native path here. -1 for experts that are not
 * act_quant FP8 (nothing to choose) or on a CUDA error. */
struct MoeMlpArgs;
int backend_cuda_moe_time(struct Backend *b, const struct MoeMlpArgs *a, int reps, float *wo_us, float *native_us);
/* Start-up (device_gemv_calibrate): a routed step of at most CUDA_GEMV_MAX_N tokens (a as above),
 * weight-only, through the grouped GEMV (moe_gemm.cu) and through the grouped mma (moe_mma.cu, x as
 * hi + lo: f32 class, as the GEMV), each the best of `reps` runs after one warm-up, in
 * microseconds. *mma_us = -1 when the grouped mma is off (SAMPLER_CUDA_OFF=moe_mma),
 * CUDA_MMA_DISAGREES when its output is not the GEMV's. 0, or -1 on a CUDA error, more than
 * CUDA_GEMV_MAX_N tokens or experts moe_mlp does not take. */
int backend_cuda_moe_gemv_time(struct Backend *b, const struct MoeMlpArgs *a, int reps, float *gemv_us,
                               float *mma_us);

/* Tests and benches: SAMPLER_CUDA_OFF's row `name` (backend_cuda.cu's table) set off (off 1) or back on
 * (0) for b, to compare a path with the one it replaced in one process. attn_vec, pdl and prefetch are
 * process-wide (every backend); a captured graph keeps what its launches were made with. 0, or -1 for
 * a name the table does not have. */
int backend_cuda_off(struct Backend *b, const char *name, int off);

#ifdef __cplusplus
}
#endif
#endif
