/*
 * nvfp4_weight.c - NVFP4 weights (E2M1 elements, one E4M3 scale per 16
 * elements of a row, one f32 weight_scale_2 per tensor) with NVIDIA Model
 * Optimizer's scale computation: quantize from a BF16 master, adopt a Model
 * Optimizer checkpoint, re-quantize the 16-element blocks a sparse delta
 * touched. Not here: the matmul (matmul.c), activations (act.c).
 */
#include "quant.h"

#include <math.h>
#include <stdlib.h>

#define BF16_ABS(b) ((uint16_t)((b) & 0x7fff))
#define BF16_NONFINITE(b) (BF16_ABS(b) >= 0x7f80)
#define NVFP4_SCALE2_DIV 2688.0f /* 6 * 448 */

/* Model Optimizer get_weights_scaling_factor + quantize for one block, with
 * f32 operations in its order: s = bamax / (6 * g); s==0 -> 1; clamp at 2^-9;
 * e4m3; codes = e2m1(v / (e4m3(s) * g)). An all-zero block short-cuts to the
 * bytes Model Optimizer produces for it (and defines the g == 0 case). */
uint8_t quant_nvfp4_block(const float *v, float g, uint8_t *codes) {
    float bamax = 0.0f;
    for (int i = 0; i < QUANT_NVFP4_BLOCK; i++) bamax = fmaxf(bamax, fabsf(v[i]));
    if (bamax == 0.0f) {
        memset(codes, 0, QUANT_NVFP4_BLOCK);
        return QUANT_E4M3_ONE;
    }
    float s = bamax / (6.0f * g);
    if (s == 0.0f) s = 1.0f;
    else if (s < 0x1p-9f) s = 0x1p-9f;
    uint8_t sb = quant_f32_to_e4m3(s);
    float d = quant_e4m3_to_f32(sb) * g;
    for (int i = 0; i < QUANT_NVFP4_BLOCK; i++) codes[i] = quant_f32_to_e2m1(v[i] / d);
    return sb;
}

static void nvfp4_quant_block(QuantNvfp4 *w, const uint16_t *m, int r, int b) {
    float v[QUANT_NVFP4_BLOCK];
    uint8_t codes[QUANT_NVFP4_BLOCK];
    const uint16_t *src = m + (size_t)r * w->cols + (size_t)b * QUANT_NVFP4_BLOCK;
    for (int i = 0; i < QUANT_NVFP4_BLOCK; i++) v[i] = bf16_to_f32(src[i]);
    w->scale[(size_t)r * (w->cols / QUANT_NVFP4_BLOCK) + b] = quant_nvfp4_block(v, w->scale2, codes);
    uint8_t *dst = w->packed + (size_t)r * (w->cols / 2) + (size_t)b * (QUANT_NVFP4_BLOCK / 2);
    for (int i = 0; i < QUANT_NVFP4_BLOCK / 2; i++) dst[i] = (uint8_t)(codes[2 * i] | (codes[2 * i + 1] << 4));
}

/* weight_scale_2 = amax / (6 * 448), then every block. */
static void nvfp4_quant_all(QuantNvfp4 *w, const uint16_t *m, uint16_t amax) {
    w->amax = bf16_to_f32(amax);
    w->scale2 = w->amax / NVFP4_SCALE2_DIV;
    int nb = w->cols / QUANT_NVFP4_BLOCK;
    for (int r = 0; r < w->rows; r++)
        for (int b = 0; b < nb; b++) nvfp4_quant_block(w, m, r, b);
}

static QuantNvfp4 *nvfp4_alloc(int rows, int cols, const uint8_t *packed, const uint8_t *scale) {
    QuantNvfp4 *w = xcalloc(1, sizeof *w);
    w->rows = rows;
    w->cols = cols;
    w->owns = packed == NULL;
    w->packed = packed ? (uint8_t *)packed : xmalloc((size_t)rows * (cols / 2));
    w->scale = scale ? (uint8_t *)scale : xmalloc((size_t)rows * (cols / QUANT_NVFP4_BLOCK));
    w->amax = NAN;
    return w;
}

void quant_nvfp4_free(QuantNvfp4 *w) {
    if (!w) return;
    if (w->owns) {
        free(w->packed);
        free(w->scale);
    }
    free(w);
}

size_t quant_nvfp4_bytes(const QuantNvfp4 *w) {
    return (size_t)w->rows * (w->cols / 2) + (size_t)w->rows * (w->cols / QUANT_NVFP4_BLOCK) + sizeof(float);
}

static int check_dims(int64_t rows, int64_t cols, Err *e) {
    ENSURE(e, rows > 0 && cols > 0 && rows <= INT32_MAX && cols <= INT32_MAX, 400,
           "weight shape [%lld, %lld] must be positive and fit in int", (long long)rows, (long long)cols);
    ENSURE(e, cols % QUANT_NVFP4_BLOCK == 0, 400,
           "NVFP4 needs in_features %% 16 == 0, got %lld columns: keep this tensor in BF16 or FP8",
           (long long)cols);
    return 0;
}

QuantNvfp4 *quant_nvfp4_from_bf16(const uint16_t *m, int rows, int cols, Err *e) {
    if (check_dims(rows, cols, e) < 0) return NULL;
    size_t n = (size_t)rows * cols;
    uint16_t amax = 0;
    for (size_t i = 0; i < n; i++) {
        if (BF16_NONFINITE(m[i])) {
            ERR(e, 400, "non-finite bf16 weight at row %zu col %zu", i / cols, i % cols);
            return NULL;
        }
        if (BF16_ABS(m[i]) > amax) amax = BF16_ABS(m[i]);
    }
    QuantNvfp4 *w = nvfp4_alloc(rows, cols, NULL, NULL);
    nvfp4_quant_all(w, m, amax);
    return w;
}

/* A scalar F32 tensor (shape [] or [1]) read from possibly unaligned memory. */
static int read_scalar(const void *p, Dtype dt, const int64_t *shape, int ndim, const char *name, float *out,
                       Err *e) {
    ENSURE(e, p != NULL, 400, "NVFP4 checkpoint tensor %s missing", name);
    ENSURE(e, dt == DT_F32, 400, "%s must be F32, got %s", name, dtype_name(dt));
    ENSURE(e, ndim == 0 || (ndim == 1 && shape[0] == 1), 400, "%s must be a scalar", name);
    memcpy(out, p, 4);
    ENSURE(e, isfinite(*out) && *out >= 0, 400, "%s = %g is not a finite non-negative scale", name, *out);
    return 0;
}

QuantNvfp4 *quant_nvfp4_from_checkpoint(const uint8_t *weight, Dtype wdt, const int64_t *wshape, int wndim,
                                        const uint8_t *wscale, Dtype sdt, const int64_t *sshape, int sndim,
                                        const void *wscale2, Dtype s2dt, const int64_t *s2shape, int s2ndim,
                                        const void *input_scale, Dtype idt, const int64_t *ishape, int indim,
                                        Err *e) {
    if (!weight || !wscale) { ERR(e, 400, "NVFP4 checkpoint tensor missing (weight or weight_scale)"); return NULL; }
    if (wdt != DT_U8 || wndim != 2) {
        ERR(e, 400, "NVFP4 weight must be U8 [rows, cols/2], got %s with %d dims", dtype_name(wdt), wndim);
        return NULL;
    }
    if (wshape[1] > INT32_MAX / 2) { ERR(e, 400, "NVFP4 weight too wide"); return NULL; }
    if (check_dims(wshape[0], wshape[1] * 2, e) < 0) return NULL;
    int rows = (int)wshape[0], cols = (int)wshape[1] * 2;
    if (sdt != DT_F8_E4M3 || sndim != 2 || sshape[0] != rows || sshape[1] != cols / QUANT_NVFP4_BLOCK) {
        ERR(e, 400, "weight_scale must be F8_E4M3 [%d, %d] for weight [%d, %d] (packed [%d, %d])",
            rows, cols / QUANT_NVFP4_BLOCK, rows, cols, rows, cols / 2);
        return NULL;
    }
    float s2, is = 0.0f;
    if (read_scalar(wscale2, s2dt, s2shape, s2ndim, "weight_scale_2", &s2, e) < 0) return NULL;
    if (input_scale && read_scalar(input_scale, idt, ishape, indim, "input_scale", &is, e) < 0) return NULL;
    size_t ns = (size_t)rows * (cols / QUANT_NVFP4_BLOCK);
    for (size_t i = 0; i < ns; i++)
        if ((wscale[i] & 0x7f) == 0x7f || (wscale[i] & 0x80)) {
            ERR(e, 400, "weight_scale[%zu] = 0x%02x is NaN or negative", i, wscale[i]);
            return NULL;
        }
    QuantNvfp4 *w = nvfp4_alloc(rows, cols, weight, wscale);
    w->scale2 = s2;
    w->input_scale = is;
    return w;
}

/* Old code (magnitude, 0..7) of element c of row r: read before it is rewritten. */
static uint8_t old_code(const QuantNvfp4 *w, int64_t r, int64_t c) {
    return (uint8_t)(w->packed[r * (w->cols / 2) + c / 2] >> (4 * (c % 2))) & 0x7;
}

/* Could element i have been at the old amax? Every such element quantized to
 * code +-6 (0x7 below the sign) in a block scaled by e4m3(448) (0x7e): its
 * block's amax is the tensor's, so s = amax / (6 * amax / 2688) = 448 up to
 * an f32 rounding that e4m3 rounds back to 448, and v / (448 g) = 6 up to one
 * that e2m1 rounds to 6. Read before the element's block is re-quantized. */
static int was_amax_candidate(const QuantNvfp4 *w, int64_t i) {
    int64_t r = i / w->cols, c = i % w->cols;
    return old_code(w, r, c) == 0x7 && w->scale[r * (w->cols / QUANT_NVFP4_BLOCK) + c / QUANT_NVFP4_BLOCK] == 0x7e;
}

/* Can touched element i's 16-block keep its scale (and every untouched code)?
 * Then i's new code (sign included), else -1. A block's scale is a function
 * of the block's amax alone (quant_nvfp4_block), and the
 * amax holder's code is +-6 (0x7) whenever any code of the block is: codes
 * grow with |v|. So when (1) some old code of the block is 0x7 (else: an
 * all-zero block, or a scale clamped where nothing reached 6; redo it), (2) i's
 * old code was not (the holder, and with it the amax, is untouched; other
 * touched elements of the block are asked in turn), and (3) i's new value
 * codes below 0x7 under the old scale (|v| <= 5 d, while the holder, coded 6,
 * has |v| > 5 d: ties round to 4), the block's amax is unchanged and only i's
 * code moves. The tensor scale g is unchanged here (amax_changed said so). */
static int code_keeps(const QuantNvfp4 *w, const uint16_t *m, int64_t i) {
    int64_t r = i / w->cols, c = i % w->cols, c0 = c / QUANT_NVFP4_BLOCK * QUANT_NVFP4_BLOCK;
    if (old_code(w, r, c) == 0x7) return -1;
    int has6 = 0;
    for (int k = 0; k < QUANT_NVFP4_BLOCK && !has6; k++) has6 = old_code(w, r, c0 + k) == 0x7;
    if (!has6) return -1;
    uint8_t sb = w->scale[r * (w->cols / QUANT_NVFP4_BLOCK) + c / QUANT_NVFP4_BLOCK];
    uint8_t code = quant_f32_to_e2m1(bf16_to_f32(m[i]) / (quant_e4m3_to_f32(sb) * w->scale2));
    return (code & 0x7) == 0x7 ? -1 : code;
}

/* Did the tensor amax change? It grew if a touched value exceeds it. It can
 * only have shrunk if a touched element was at it (was_amax_candidate: else
 * the amax elements are untouched and still attain it); then it shrank if no
 * element still attains it (scan with early exit). O(touched) in the common
 * case, where no touched element was near the amax. */
static int amax_changed(const QuantNvfp4 *w, const uint16_t *m, const int64_t *idx, size_t n_idx,
                        uint16_t *new_amax) {
    size_t n = (size_t)w->rows * w->cols;
    uint16_t old = f32_to_bf16(w->amax), top = 0;
    int candidate = 0;
    for (size_t i = 0; i < n_idx; i++) {
        if (BF16_ABS(m[idx[i]]) > top) top = BF16_ABS(m[idx[i]]);
        candidate |= was_amax_candidate(w, idx[i]);
    }
    if (isnan(w->amax) || top > old) goto rescan;
    if (!candidate) return 0;
    for (size_t i = 0; i < n; i++)
        if (BF16_ABS(m[i]) == old) return 0;
rescan:
    *new_amax = 0;
    for (size_t i = 0; i < n; i++)
        if (BF16_ABS(m[i]) > *new_amax) *new_amax = BF16_ABS(m[i]);
    return *new_amax != old || isnan(w->amax);
}

int quant_nvfp4_requant(QuantNvfp4 *w, const uint16_t *m, const int64_t *idx, size_t n_idx, Err *e) {
    ENSURE(e, w->owns, 409, "NVFP4 tensor [%d, %d] borrows read-only checkpoint memory; cannot re-quantize",
           w->rows, w->cols);
    int rc = quant_check_touched(m, (int64_t)w->rows * w->cols, idx, n_idx, e);
    if (rc) return rc;
    uint16_t amax;
    if (amax_changed(w, m, idx, n_idx, &amax)) {
        nvfp4_quant_all(w, m, amax);
        return QUANT_REQUANT_FULL;
    }
    /* One pass: a touched element whose 16-block keeps its scale (code_keeps) gets its own code
     * under that scale; any other redoes its block whole from the master, which holds every touched
     * value. A block's kept elements never change what code_keeps reads for the next ones (their old
     * and new codes are both below 0x7), and an element met after its block was redone, or a second
     * time, is asked against the new state, which is from-scratch already: either answer writes the
     * same bits. */
    for (size_t i = 0; i < n_idx; i++) {
        int64_t r = idx[i] / w->cols, c = idx[i] % w->cols;
        int code = code_keeps(w, m, idx[i]);
        if (code < 0) {
            nvfp4_quant_block(w, m, (int)r, (int)(c / QUANT_NVFP4_BLOCK));
            continue;
        }
        uint8_t *p = w->packed + r * (w->cols / 2) + c / 2;
        *p = c % 2 ? (uint8_t)((*p & 0x0f) | (code << 4)) : (uint8_t)((*p & 0xf0) | code);
    }
    return QUANT_REQUANT_BLOCKS;
}
