/*
 * quant.h - FP8 and NVFP4: scalar casts, weight quantizers, checkpoint
 * formats, activation quantization, CPU matmul kernels that dequantize
 * inside the loop, and exact re-quantization after a sparse BF16 delta.
 *
 * Not here: which tensors of a model get quantized (the loader decides, see
 * "What stays in BF16"), threading (callers split output rows), GPU kernels.
 *
 * Scalar formats (bit-exact against PyTorch 2.x, scripts/make_quant_goldens.py)
 *   E4M3 (OCP e4m3fn): bias 7, no inf, 0x7f/0xff are NaN, max 448, min
 *     subnormal 2^-9. f32 -> e4m3 rounds to nearest even and SATURATES the
 *     way torch's `.to(torch.float8_e4m3fn)` does (c10 fp8e4m3fn_from_fp32_value):
 *     every finite |x| that rounds above 448, and +-inf, become +-448
 *     (0x7e/0xfe); NaN becomes 0x7f with the input's sign bit (0xff for
 *     -NaN); -0 stays 0x80. (Older torch releases returned NaN instead of saturating;
 *     the goldens pin the behaviour of torch 2.15 that made them.)
 *     e4m3 -> f32 is exact; NaN comes back as sign|0x7f800000|mant<<20 like torch.
 *   E2M1 (FP4): codes 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign.
 *     f32 -> e2m1 is Model Optimizer's _cast_fp4: round to nearest even,
 *     saturate at 6, sign bit = (x < 0) so -0.0 gives +0 but -0.1 gives the
 *     code 0x8 (-0), NaN and +-inf give 6 with sign (x < 0).
 *
 * FP8 weights (QuantFp8): q [rows, cols] e4m3, scale_inv [ceil(rows/br),
 *   ceil(cols/bc)] f32 with w ~= e4m3_to_f32(q) * scale_inv (the Qwen3-FP8 /
 *   DeepSeek-V3 `weight_scale_inv` convention). Per block:
 *     amax = max |w| over the block (exact, from the bf16 values)
 *     scale_inv = amax / 448.0f;  an all-zero block gets scale_inv = 1.0f
 *     q = e4m3_sat(bf16_to_f32(w) / scale_inv)      (f32 division, one rounding)
 *   Layouts: QUANT_FP8_BLOCK128 (br = bc = 128, the default and the official
 *   checkpoint layout), QUANT_FP8_PER_CHANNEL (br = 1, bc = cols),
 *   QUANT_FP8_PER_TENSOR (br = rows, bc = cols).
 *
 * NVFP4 weights (QuantNvfp4), NVIDIA Model Optimizer's formulas
 *   (scripts/nvfp4_reference.py, bit-exact), cols % 16 == 0 required:
 *     amax = max |w| over the tensor;  scale2 = amax / 2688.0f   (6 * 448)
 *     per 16 consecutive elements of a row: s = bamax / (6.0f * scale2);
 *       s == 0 -> 1.0; s < 2^-9 -> 2^-9; scale byte = e4m3_sat(s)
 *     elements: e2m1(bf16_to_f32(w) / (e4m3_to_f32(scale) * scale2))
 *     packed [rows, cols/2]: element 2i in the low nibble of byte i.
 *   An all-zero tensor (where Model Optimizer would produce NaN) is defined as
 *   scale2 = 0, every scale byte e4m3(1.0) = 0x38, every code 0; all-zero
 *   blocks of a non-zero tensor get the same bytes, as in Model Optimizer.
 *
 * Activations (CPU emulation of the native GPU paths), x f32 [n, cols]:
 *   FP8: dynamic per token and per 128-column group (the Qwen3-FP8 recipe):
 *     s = group_amax / 448.0f (all-zero group: 1.0f), xq = e4m3_sat(x / s).
 *   NVFP4: per 16-element block with the weight formulas above, using a
 *     GLOBAL SCALE PER TOKEN, dynamic: g = token_amax / 2688.0f. Dynamic is the
 *     default because it needs no calibration and cannot clip; a ModelOpt
 *     checkpoint's static `input_scale` (calibrated amax / 2688) can be passed
 *     instead (quant_act_nvfp4's static_scale), which then clips at 6 * 448 * g.
 *   Quantized activations are written as f32 holding the exact dequantized
 *   value without its group/global scale (e4m3 value, resp. e2m1 * e4m3 block
 *   scale), so one kernel serves weight-only and quantized-activation paths.
 *
 * Matmul kernels: out[n, rows] f32 = x[n, cols] @ W^T, W dequantized inside
 *   the loop; out has row stride `rows` and only columns [row_begin, row_end)
 *   are written, so a thread pool splits output rows. Batch invariant: every
 *   output element is reduced in one fixed order that depends only on cols
 *   (16 lanes by k mod 16, FMA, a fixed lane tree), never on n or the tile a
 *   token lands in; every path (QuantPath below) gives the same bits. FP8:
 *   per 128-column group g, p_g = sum x*q (16 lanes, from zero, zeros past
 *   the row's end), acc = fma(p_g, scale_inv[*, g] (* xs[t, g]), acc).
 *   NVFP4: acc = sum x * (e2m1 * e4m3 block scale) (exact products),
 *   out = acc * scale2 (* g[t]).
 *   No allocation inside kernels; quantized activations go to caller scratch.
 *
 * What stays in BF16 (the tensors that carry no weight_scale_inv in the
 *   official Qwen3-FP8 / DeepSeek-V3 checkpoints and that Model Optimizer's
 *   default NVFP4 config leaves unquantized): token embeddings, every norm weight
 *   (input/post-attention/final RMSNorm, q_norm/k_norm), MoE router (gate),
 *   lm_head, biases. Quantized: the q/k/v/o projections and the MLP / expert
 *   gate/up/down projections (every nn.Linear inside the decoder layers).
 *
 * Errors: constructors and re-quantization return NULL / <0 with an Err
 * (400 bad input, 409 conflict) and leave their outputs untouched; kernels
 * take validated structs and do not fail.
 */
#ifndef SAMPLER_QUANT_H
#define SAMPLER_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "check.h"
#include "dtype.h"

#define QUANT_FP8_MAX 448.0f
#define QUANT_FP8_GROUP 128 /* activation group and weight block edge */
#define QUANT_NVFP4_BLOCK 16
#define QUANT_E4M3_ONE 0x38 /* e4m3(1.0) */

/* ---- scalar casts ---- */
uint8_t quant_f32_to_e4m3(float f); /* saturating, see above */
static inline float quant_e4m3_to_f32(uint8_t b); /* exact; inline: the kernels decode scales with it */
uint8_t quant_f32_to_e2m1(float f); /* 4-bit code in the low nibble */
static inline float quant_e2m1_to_f32(uint8_t code); /* code 8 decodes to -0.0 */

static inline float quant_e4m3_to_f32(uint8_t b) {
    uint32_t sign = (uint32_t)(b & 0x80) << 24, e = (b >> 3) & 0xf, m = b & 7, u;
    float f;
    if (e == 0xf && m == 7) u = sign | 0x7f800000u | (m << 20); /* NaN, torch's payload */
    else if (e == 0) {                                            /* subnormal: m * 2^-9 */
        f = (float)m * 0x1p-9f;
        memcpy(&u, &f, 4);
        u |= sign;
    } else u = sign | ((e + 120) << 23) | (m << 20);
    memcpy(&f, &u, 4);
    return f;
}

static inline float quant_e2m1_to_f32(uint8_t code) {
    static const float v[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return (code & 8) ? -v[code & 7] : v[code & 7];
}

/* 1 if a checkpoint tensor (HF name, ndim) is quantized under --precision fp8|nvfp4:
 * the 2-D `*_proj.weight` inside `.layers.`; 0 for what stays BF16 (see above).
 * The loader's choice: the weight registry derives each entry's quantizable
 * flag from this (and checks the architecture tables against it). */
int quant_should_quantize(const char *name, int ndim);

/* ---- FP8 weights ---- */
typedef enum { QUANT_FP8_BLOCK128 = 0, QUANT_FP8_PER_CHANNEL, QUANT_FP8_PER_TENSOR } QuantFp8Layout;

typedef struct QuantFp8 {
    int rows, cols;             /* HF Linear layout: [out_features, in_features] */
    int block_rows, block_cols; /* scale block: 128x128, 1 x cols or rows x cols */
    int scale_rows, scale_cols; /* ceil(rows / block_rows), ceil(cols / block_cols) */
    uint8_t *q;                 /* [rows, cols] e4m3 */
    float *scale_inv;           /* [scale_rows, scale_cols] f32, always owned */
    int owns_q;                 /* 0: q points into a mapped checkpoint (read-only) */
} QuantFp8;

/* Quantize a bf16 master [rows, cols]. NULL + Err on bad shape or non-finite w. */
QuantFp8 *quant_fp8_from_bf16(const uint16_t *w, int rows, int cols, QuantFp8Layout layout, Err *e);
/* Qwen3-FP8 / DeepSeek-V3 checkpoint tensors: `weight` F8_E4M3 [rows, cols] (borrowed,
 * must outlive the struct) and `weight_scale_inv` F32 or BF16 [ceil(rows/128),
 * ceil(cols/128)] (copied). Shapes and dtypes validated; NULL + Err otherwise. */
QuantFp8 *quant_fp8_from_checkpoint(const uint8_t *weight, Dtype wdt, const int64_t *wshape, int wndim,
                                    const void *scale_inv, Dtype sdt, const int64_t *sshape, int sndim,
                                    Err *e);
void quant_fp8_free(QuantFp8 *w);
/* Bytes held for q and scales (for memory reports). */
size_t quant_fp8_bytes(const QuantFp8 *w);

/* ---- NVFP4 weights ---- */
typedef struct QuantNvfp4 {
    int rows, cols;     /* cols % 16 == 0 */
    uint8_t *packed;    /* [rows, cols/2] e2m1 pairs, element 2i in the low nibble */
    uint8_t *scale;     /* [rows, cols/16] e4m3 block scales */
    float scale2;       /* weight_scale_2 f32 */
    float amax;         /* tensor amax scale2 came from; NAN when loaded pre-quantized */
    float input_scale;  /* checkpoint static activation global scale; 0 = none (dynamic) */
    int owns;           /* 0: packed/scale point into a mapped checkpoint */
} QuantNvfp4;

QuantNvfp4 *quant_nvfp4_from_bf16(const uint16_t *w, int rows, int cols, Err *e);
/* Model Optimizer checkpoint: `weight` U8 [rows, cols/2], `weight_scale` F8_E4M3
 * [rows, cols/16] (both borrowed), `weight_scale_2` F32 scalar, `input_scale` F32
 * scalar or NULL (copied). NULL + Err on any mismatch. */
QuantNvfp4 *quant_nvfp4_from_checkpoint(const uint8_t *weight, Dtype wdt, const int64_t *wshape, int wndim,
                                        const uint8_t *wscale, Dtype sdt, const int64_t *sshape, int sndim,
                                        const void *wscale2, Dtype s2dt, const int64_t *s2shape, int s2ndim,
                                        const void *input_scale, Dtype idt, const int64_t *ishape, int indim,
                                        Err *e);
void quant_nvfp4_free(QuantNvfp4 *w);
size_t quant_nvfp4_bytes(const QuantNvfp4 *w);
/* One 16-element NVFP4 block with global scale g (weights and activations):
 * writes 16 codes (unpacked, one per byte) and returns the e4m3 scale byte. */
uint8_t quant_nvfp4_block(const float *v, float g, uint8_t *codes);

/* ---- activations (x f32 [n, cols], finite) ---- */
static inline int quant_fp8_groups(int cols) { return (cols + QUANT_FP8_GROUP - 1) / QUANT_FP8_GROUP; }
/* xq [n, cols] f32 e4m3 values; xs [n, quant_fp8_groups(cols)] f32 scales. */
void quant_act_fp8(float *xq, float *xs, const float *x, int n, int cols);
/* Per token (one group of all cols: the native FP8 path with per-channel weights,
 * cuda_native.h): s_t = token amax / 448 (1 if all zero), xq = e4m3_sat(x / s_t);
 * xs [n, quant_fp8_groups(cols)] holds s_t in every group of token t, so
 * quant_matmul_fp8_rows consumes it unchanged. */
void quant_act_fp8_token(float *xq, float *xs, const float *x, int n, int cols);
/* xq [n, cols] f32 e2m1 * block-scale values; xg [n] f32 global scales.
 * static_scale > 0 replaces the dynamic per-token scale. cols % 16 == 0. */
void quant_act_nvfp4(float *xq, float *xg, const float *x, int n, int cols, float static_scale);

/* ---- matmul kernels: out[t * rows + r] for t < n, row_begin <= r < row_end ---- */
/* x [n, cols] f32; xs NULL: weight-only (x as is); xs [n, groups] from quant_act_fp8
 * (then x is its xq: e4m3 values, which the AVX-512 decode step relies on for
 * its bits, fp8_matmul_x86.c). */
void quant_matmul_fp8_rows(float *out, const float *x, const float *xs, const QuantFp8 *w, int n,
                           int row_begin, int row_end);
/* xg NULL: weight-only; xg [n] from quant_act_nvfp4 (then x is its xq). */
void quant_matmul_nvfp4_rows(float *out, const float *x, const float *xg, const QuantNvfp4 *w, int n,
                             int row_begin, int row_end);
/* The FP8 matmul paths, numbered like the CPU backend's matmul paths
 * (cpu_ops.h CpuPath, which forces the matching one here): all give the bits
 * of the order above (tests/test_cpu_paths.c, tests/test_quant_matmul.c).
 *   PORTABLE  plain C (fmaf), everywhere
 *   AVX2_V0   AVX2+FMA+F16C, the kernel before issue #23 (e4m3 -> f16 -> f32)
 *   AVX2      AVX2+FMA (quant/fp8_matmul_x86.c): e4m3 decoded by shift, mask
 *             and a power-of-two multiply; in place for < 4 tokens, packed f32
 *             panels for more
 *   AVX512    AVX-512F, the same with one zmm per 16 lanes
 * NVFP4 runs its AVX2+FMA+F16C kernel on every path but PORTABLE (when the CPU
 * has F16C). The default is the best path the CPU has. */
typedef enum QuantPath {
    QUANT_PATH_PORTABLE,
    QUANT_PATH_AVX2_V0,
    QUANT_PATH_AVX2,
    QUANT_PATH_AVX512,
    QUANT_PATH_COUNT
} QuantPath;
int quant_path_available(QuantPath p);
const char *quant_path_name(QuantPath p);
QuantPath quant_path(void);
/* 0, or -1 (path unchanged) when p cannot run here. Not while a matmul runs. */
int quant_force_path(QuantPath p);
/* 1 if a vector path is in use. quant_force_portable(1) selects the portable
 * path, (0) the default one (tests compare both; results are bit-identical). */
int quant_simd_active(void);
void quant_force_portable(int on);

/* ---- re-quantization after a sparse delta ----
 * master [rows, cols] bf16 is the updated BF16 master; idx [n_idx] the flat
 * indices (r * cols + c) of touched elements, any order, duplicates allowed.
 * The result equals quantizing master from scratch, bit for bit. On error
 * (index out of range, non-finite touched value, borrowed checkpoint memory)
 * nothing is modified. */
typedef enum { QUANT_REQUANT_BLOCKS = 0, QUANT_REQUANT_FULL = 1 } QuantRequant;
/* Both requant functions first check every touched index: in [0, n) and a
 * finite master value there. 0, or <0 with Err (400). */
int quant_check_touched(const uint16_t *master, int64_t n, const int64_t *idx, size_t n_idx, Err *e);
/* FP8: re-quantizes the touched elements of each scale block whose amax
 * cannot have changed (its scale stands), and whole every other scale block
 * holding a touched element (for per-tensor scales that block is the tensor).
 * Returns the number of blocks re-quantized whole (>= 0) or <0. */
int quant_fp8_requant(QuantFp8 *w, const uint16_t *master, const int64_t *idx, size_t n_idx, Err *e);
/* NVFP4: re-quantizes the touched 16-element blocks and returns
 * QUANT_REQUANT_BLOCKS, unless the tensor amax (hence weight_scale_2) changed:
 * then the whole tensor is recomputed and QUANT_REQUANT_FULL returned.
 * O(touched) unless a touched element's new value exceeds the amax or its old
 * code could have been the amax's (+-6 under a 448 block scale): only then is
 * the tensor scanned for the amax. */
int quant_nvfp4_requant(QuantNvfp4 *w, const uint16_t *master, const int64_t *idx, size_t n_idx, Err *e);

#endif
