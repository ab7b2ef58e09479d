/*
 * fp8_weight.c - FP8 E4M3 weights with f32 scales per 128x128 block, per
 * output channel or per tensor: quantize from a BF16 master, adopt a
 * Qwen3-FP8 / DeepSeek-V3 checkpoint, re-quantize the blocks a sparse delta
 * touched. Not here: the matmul (matmul.c), activations (act.c).
 */
#include "quant.h"

#include <math.h>
#include <stdlib.h>

#define BF16_ABS(b) ((uint16_t)((b) & 0x7fff))
#define BF16_NONFINITE(b) (BF16_ABS(b) >= 0x7f80)

static int imin(int a, int b) { return a < b ? a : b; }

static int fp8_layout_dims(int rows, int cols, QuantFp8Layout l, int *br, int *bc) {
    switch (l) {
    case QUANT_FP8_BLOCK128: *br = QUANT_FP8_GROUP; *bc = QUANT_FP8_GROUP; return 0;
    case QUANT_FP8_PER_CHANNEL: *br = 1; *bc = cols; return 0;
    case QUANT_FP8_PER_TENSOR: *br = rows; *bc = cols; return 0;
    }
    return -1;
}

/* q is allocated (owned) unless borrowed is given. */
static QuantFp8 *fp8_alloc(int rows, int cols, int br, int bc, const uint8_t *borrowed) {
    QuantFp8 *w = xcalloc(1, sizeof *w);
    w->rows = rows;
    w->cols = cols;
    w->block_rows = br;
    w->block_cols = bc;
    w->scale_rows = (rows + br - 1) / br;
    w->scale_cols = (cols + bc - 1) / bc;
    w->owns_q = borrowed == NULL;
    w->q = borrowed ? (uint8_t *)borrowed : xmalloc((size_t)rows * cols);
    w->scale_inv = xmalloc((size_t)w->scale_rows * w->scale_cols * sizeof(float));
    return w;
}

void quant_fp8_free(QuantFp8 *w) {
    if (!w) return;
    if (w->owns_q) free(w->q);
    free(w->scale_inv);
    free(w);
}

size_t quant_fp8_bytes(const QuantFp8 *w) {
    return (size_t)w->rows * w->cols + (size_t)w->scale_rows * w->scale_cols * sizeof(float);
}

/* One scale block from a finite master: scale_inv = amax / 448 (1 for an
 * all-zero block), q = e4m3_sat(w / scale_inv). */
static void fp8_quant_block(QuantFp8 *w, const uint16_t *m, int bi, int bj) {
    int r0 = bi * w->block_rows, r1 = imin(r0 + w->block_rows, w->rows);
    int c0 = bj * w->block_cols, c1 = imin(c0 + w->block_cols, w->cols);
    uint16_t amax = 0;
    for (int r = r0; r < r1; r++)
        for (int c = c0; c < c1; c++) {
            uint16_t a = BF16_ABS(m[(size_t)r * w->cols + c]);
            if (a > amax) amax = a;
        }
    float s = amax ? bf16_to_f32(amax) / QUANT_FP8_MAX : 1.0f;
    w->scale_inv[(size_t)bi * w->scale_cols + bj] = s;
    for (int r = r0; r < r1; r++)
        for (int c = c0; c < c1; c++) {
            size_t i = (size_t)r * w->cols + c;
            w->q[i] = quant_f32_to_e4m3(bf16_to_f32(m[i]) / s);
        }
}

static int check_dims(int64_t rows, int64_t cols, Err *e) {
    ENSURE(e, rows > 0 && cols > 0 && rows <= INT32_MAX && cols <= INT32_MAX, 400,
           "weight shape [%lld, %lld] must be positive and fit in int", (long long)rows, (long long)cols);
    return 0;
}

QuantFp8 *quant_fp8_from_bf16(const uint16_t *m, int rows, int cols, QuantFp8Layout layout, Err *e) {
    int br, bc;
    if (check_dims(rows, cols, e) < 0) return NULL;
    if (fp8_layout_dims(rows, cols, layout, &br, &bc) < 0) {
        ERR(e, 400, "unknown FP8 layout %d", (int)layout);
        return NULL;
    }
    size_t n = (size_t)rows * cols;
    for (size_t i = 0; i < n; i++)
        if (BF16_NONFINITE(m[i])) {
            ERR(e, 400, "non-finite bf16 weight at row %zu col %zu", i / cols, i % cols);
            return NULL;
        }
    QuantFp8 *w = fp8_alloc(rows, cols, br, bc, NULL);
    for (int bi = 0; bi < w->scale_rows; bi++)
        for (int bj = 0; bj < w->scale_cols; bj++) fp8_quant_block(w, m, bi, bj);
    return w;
}

static int64_t numel(const int64_t *shape, int ndim) {
    int64_t k = 1;
    for (int i = 0; i < ndim; i++) k *= shape[i];
    return k;
}

QuantFp8 *quant_fp8_from_checkpoint(const uint8_t *weight, Dtype wdt, const int64_t *wshape, int wndim,
                                    const void *scale_inv, Dtype sdt, const int64_t *sshape, int sndim,
                                    Err *e) {
    if (!weight || !scale_inv) { ERR(e, 400, "FP8 checkpoint tensor missing (weight or weight_scale_inv)"); return NULL; }
    if (wdt != DT_F8_E4M3 || wndim != 2) {
        ERR(e, 400, "FP8 weight must be F8_E4M3 with 2 dims, got %s with %d dims", dtype_name(wdt), wndim);
        return NULL;
    }
    if (check_dims(wshape[0], wshape[1], e) < 0) return NULL;
    int rows = (int)wshape[0], cols = (int)wshape[1];
    if (sdt != DT_F32 && sdt != DT_BF16) {
        ERR(e, 400, "weight_scale_inv must be F32 or BF16, got %s", dtype_name(sdt));
        return NULL;
    }
    int64_t ns = sndim >= 0 && sndim <= 2 ? numel(sshape, sndim) : -1;
    int br, bc;
    int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
    if (sndim == 2 && sshape[0] == sr && sshape[1] == sc) fp8_layout_dims(rows, cols, QUANT_FP8_BLOCK128, &br, &bc);
    else if (ns == 1) fp8_layout_dims(rows, cols, QUANT_FP8_PER_TENSOR, &br, &bc);
    else if (sndim >= 1 && ns == rows && sshape[0] == rows) fp8_layout_dims(rows, cols, QUANT_FP8_PER_CHANNEL, &br, &bc);
    else {
        ERR(e, 400, "weight_scale_inv shape does not fit weight [%d, %d]: want [%lld, %lld] (128x128 blocks), "
            "[%d, 1] or a scalar", rows, cols, (long long)sr, (long long)sc, rows);
        return NULL;
    }
    /* Scales may sit unaligned in the mapped file: copy them out. */
    const uint8_t *sb = scale_inv;
    for (int64_t i = 0; i < ns; i++) {
        float s;
        if (sdt == DT_F32) memcpy(&s, sb + 4 * i, 4);
        else { uint16_t h; memcpy(&h, sb + 2 * i, 2); s = bf16_to_f32(h); }
        if (!(s >= 0 && isfinite(s))) {
            ERR(e, 400, "weight_scale_inv[%lld] = %g is not a finite non-negative scale", (long long)i, s);
            return NULL;
        }
    }
    size_t n = (size_t)rows * cols;
    for (size_t i = 0; i < n; i++)
        if ((weight[i] & 0x7f) == 0x7f) {
            ERR(e, 400, "FP8 weight holds NaN (0x%02x) at row %zu col %zu", weight[i], i / cols, i % cols);
            return NULL;
        }
    QuantFp8 *w = fp8_alloc(rows, cols, br, bc, weight);
    for (int64_t i = 0; i < ns; i++) {
        if (sdt == DT_F32) memcpy(&w->scale_inv[i], sb + 4 * i, 4);
        else { uint16_t h; memcpy(&h, sb + 2 * i, 2); w->scale_inv[i] = bf16_to_f32(h); }
    }
    return w;
}

int quant_check_touched(const uint16_t *m, int64_t n, const int64_t *idx, size_t n_idx, Err *e) {
    for (size_t i = 0; i < n_idx; i++) {
        ENSURE(e, idx[i] >= 0 && idx[i] < n, 400, "touched index %lld out of range [0, %lld)",
               (long long)idx[i], (long long)n);
        ENSURE(e, !BF16_NONFINITE(m[idx[i]]), 400, "non-finite master value at index %lld", (long long)idx[i]);
    }
    return 0;
}

/* The block amax a scale was made from (fp8_quant_block: s = amax / 448 in
 * f32, amax a bf16), or -1 when s is not of that form or is ambiguous (1.0:
 * an all-zero block, or amax 448). */
static int fp8_scale_amax(float s) {
    if (!(s > 0) || s == 1.0f || !isfinite(s)) return -1;
    uint16_t a = f32_to_bf16(s * QUANT_FP8_MAX);
    return bf16_to_f32(a) / QUANT_FP8_MAX == s ? (int)BF16_ABS(a) : -1;
}

/* Validate everything first. Then per touched element: its block keeps its
 * scale when its amax cannot have moved: the new |value| is at most the amax
 * the scale was made from, and the old byte is not +-448 (e4m3 0x7e): the
 * amax element quantizes to exactly +-448, so an element that did not is
 * below the amax, and the amax element is untouched. Such a block needs only
 * its touched elements re-quantized (e4m3(v / s), what a from-scratch pass
 * computes for them; every other byte stands): O(touched), not O(block).
 * Otherwise the block's scale is marked NaN and the block re-quantized whole,
 * once. No allocation; the same bits as quantizing master from scratch. */
int quant_fp8_requant(QuantFp8 *w, const uint16_t *m, const int64_t *idx, size_t n_idx, Err *e) {
    ENSURE(e, w->owns_q, 409, "FP8 tensor [%d, %d] borrows read-only checkpoint memory; cannot re-quantize",
           w->rows, w->cols);
    int rc = quant_check_touched(m, (int64_t)w->rows * w->cols, idx, n_idx, e);
    if (rc) return rc;
    for (size_t i = 0; i < n_idx; i++) { /* reads only the old bytes and scales: nothing is rewritten yet */
        int r = (int)(idx[i] / w->cols), c = (int)(idx[i] % w->cols);
        float *sp = &w->scale_inv[(size_t)(r / w->block_rows) * w->scale_cols + c / w->block_cols];
        int amax = isnan(*sp) ? -1 : fp8_scale_amax(*sp);
        if (amax < 0 || (w->q[idx[i]] & 0x7f) == 0x7e || BF16_ABS(m[idx[i]]) > amax) *sp = NAN;
    }
    int count = 0;
    for (size_t i = 0; i < n_idx; i++) {
        int r = (int)(idx[i] / w->cols), c = (int)(idx[i] % w->cols);
        int bi = r / w->block_rows, bj = c / w->block_cols;
        float sc = w->scale_inv[(size_t)bi * w->scale_cols + bj];
        if (isnan(sc)) {
            fp8_quant_block(w, m, bi, bj);
            count++;
        } else {
            w->q[idx[i]] = quant_f32_to_e4m3(bf16_to_f32(m[idx[i]]) / sc);
        }
    }
    return count;
}
