/*
 * test_quant_requant.c - re-quantization after sparse BF16 deltas equals
 * quantizing the updated master from scratch, bit for bit (FP8 block /
 * channel / tensor, NVFP4), including deltas that raise or lower the NVFP4
 * tensor amax (full recompute, reported), and errors leave state untouched.
 * FP8 blocks whose amax cannot have moved re-quantize only their touched
 * elements: the count of blocks redone whole shows it, and the cases at the
 * edge of that rule (a block amax raised, lowered, tied; an element that
 * rounds to 448 without being the amax; an all-zero block) are each checked
 * against from-scratch quantization.
 */
#include <math.h>
#include <stdlib.h>

#include "quant.h"
#include "quant_golden.h"
#include "test.h"

#define ROWS 200
#define COLS 320

static int same_fp8(const QuantFp8 *a, const QuantFp8 *b) {
    return memcmp(a->q, b->q, (size_t)a->rows * a->cols) == 0 &&
           memcmp(a->scale_inv, b->scale_inv, (size_t)a->scale_rows * a->scale_cols * 4) == 0;
}

static int same_nvfp4(const QuantNvfp4 *a, const QuantNvfp4 *b) {
    return memcmp(a->packed, b->packed, (size_t)a->rows * a->cols / 2) == 0 &&
           memcmp(a->scale, b->scale, (size_t)a->rows * a->cols / 16) == 0 &&
           memcmp(&a->scale2, &b->scale2, 4) == 0 && memcmp(&a->amax, &b->amax, 4) == 0;
}

/* Distinct scale blocks among idx (for the FP8 block count). */
static int distinct_blocks(const QuantFp8 *w, const int64_t *idx, int n) {
    int cnt = 0;
    char *seen = calloc((size_t)w->scale_rows * w->scale_cols, 1);
    for (int i = 0; i < n; i++) {
        int b = (int)(idx[i] / w->cols / w->block_rows) * w->scale_cols + (int)(idx[i] % w->cols) / w->block_cols;
        cnt += !seen[b];
        seen[b] = 1;
    }
    free(seen);
    return cnt;
}

static uint16_t amax_bits(const uint16_t *m) {
    uint16_t a = 0;
    for (int i = 0; i < ROWS * COLS; i++) if ((m[i] & 0x7fff) > a) a = m[i] & 0x7fff;
    return a;
}

/* Apply a random sparse delta (kind 0: small, below the amax; 1: one value
 * above the amax; 2: lower the element(s) holding the amax) and return the
 * touched indices (unsorted, with a duplicate). */
static int make_delta(uint16_t *m, int64_t *idx, int kind) {
    int n = 1 + (int)(qg_uniform() * 60);
    uint16_t a = amax_bits(m);
    for (int i = 0; i < n; i++) {
        do idx[i] = (int64_t)(qg_uniform() * ROWS * COLS);
        while (kind == 0 && (m[idx[i]] & 0x7fff) == a); /* kind 0 leaves the amax holder alone */
        float v = bf16_to_f32(m[idx[i]]) + (float)(qg_normal() * 0.002);
        m[idx[i]] = f32_to_bf16(v);
        if (kind == 0 && (m[idx[i]] & 0x7fff) >= a) m[idx[i]] = (uint16_t)((m[idx[i]] & 0x8000) | 0x3c00); /* 2^-7 */
    }
    idx[n] = idx[0]; /* duplicate */
    n++;
    a = amax_bits(m);
    if (kind == 1) {
        idx[n] = (int64_t)(qg_uniform() * ROWS * COLS);
        m[idx[n]] = f32_to_bf16(bf16_to_f32(a) * 1.5f);
        n++;
    } else if (kind == 2) {
        for (int64_t i = 0; i < ROWS * COLS; i++)
            if ((m[i] & 0x7fff) == a) { m[i] = f32_to_bf16(bf16_to_f32(m[i]) * 0.25f); idx[n++] = i; }
    }
    return n;
}

int main(void) {
    uint16_t *m = malloc((size_t)ROWS * COLS * 2);
    for (int i = 0; i < ROWS * COLS; i++) m[i] = f32_to_bf16((float)(qg_normal() * 0.02));
    m[5 * COLS + 7] = f32_to_bf16(0.3f); /* a unique amax */
    int64_t idx[4096];
    Err e = {0};
    QuantFp8Layout lay[3] = {QUANT_FP8_BLOCK128, QUANT_FP8_PER_CHANNEL, QUANT_FP8_PER_TENSOR};
    QuantFp8 *f[3];
    for (int l = 0; l < 3; l++) f[l] = quant_fp8_from_bf16(m, ROWS, COLS, lay[l], &e);
    QuantNvfp4 *v = quant_nvfp4_from_bf16(m, ROWS, COLS, &e);

    int kinds[] = {0, 0, 0, 0, 0, 1, 0, 0, 2, 0, 1, 0, 2, 0, 0};
    int fp8_bad = 0, fp8_count_bad = 0, nv_bad = 0, kind_bad = 0, full = 0, fast[3] = {0, 0, 0};
    for (size_t round = 0; round < sizeof kinds / sizeof kinds[0]; round++) {
        int n = make_delta(m, idx, kinds[round]);
        for (int l = 0; l < 3; l++) {
            int got = quant_fp8_requant(f[l], m, idx, (size_t)n, &e);
            QuantFp8 *ref = quant_fp8_from_bf16(m, ROWS, COLS, lay[l], &e);
            fp8_bad += !same_fp8(f[l], ref);
            int touched = distinct_blocks(f[l], idx, n);
            fp8_count_bad += got < 0 || got > touched;
            fast[l] += touched - got; /* blocks that kept their scale */
            quant_fp8_free(ref);
        }
        int got = quant_nvfp4_requant(v, m, idx, (size_t)n, &e);
        QuantNvfp4 *ref = quant_nvfp4_from_bf16(m, ROWS, COLS, &e);
        nv_bad += !same_nvfp4(v, ref);
        kind_bad += got != (kinds[round] ? QUANT_REQUANT_FULL : QUANT_REQUANT_BLOCKS);
        full += got == QUANT_REQUANT_FULL;
        quant_nvfp4_free(ref);
    }
    T_ASSERT(fp8_bad == 0, "%d FP8 re-quantizations differ from scratch", fp8_bad);
    T_ASSERT(fp8_count_bad == 0, "%d FP8 block counts out of [0, touched blocks]", fp8_count_bad);
    /* most random touches leave their block's amax alone (per tensor: the kind-0 rounds) */
    T_ASSERT(fast[0] >= 30 && fast[1] >= 100 && fast[2] >= 8, "blocks that kept their scale: %d %d %d", fast[0], fast[1],
             fast[2]);
    {   /* the edges of the keep-the-scale rule, one FP8 128x128 block each, against from scratch (on a
         * copy of the master: f[] stay in step with m for the checks after) */
        uint16_t *m2 = malloc((size_t)ROWS * COLS * 2);
        memcpy(m2, m, (size_t)ROWS * COLS * 2);
        uint16_t *mm = m;
        m = m2;
        QuantFp8 *g = quant_fp8_from_bf16(m, ROWS, COLS, QUANT_FP8_BLOCK128, &e);
        int edge_bad = 0, edge_full = 0;
        for (int c = 0; c < 6; c++) {
            int r0 = 0, c0 = 128; /* block (0, 1) */
            int64_t ix[3];
            int k = 0;
            uint16_t a = 0;
            int64_t at = 0;
            for (int r = r0; r < r0 + 128; r++)
                for (int cc = c0; cc < c0 + 128; cc++)
                    if ((m[r * COLS + cc] & 0x7fff) > a) { a = m[r * COLS + cc] & 0x7fff; at = r * COLS + cc; }
            float amax = bf16_to_f32(a);
            if (c == 0) { m[at] = f32_to_bf16(amax * 0.5f); ix[k++] = at; }                       /* amax lowered */
            if (c == 1) { ix[k] = r0 * COLS + c0 + 3; m[ix[k++]] = f32_to_bf16(amax * 1.25f); }  /* amax raised */
            if (c == 2) { ix[k] = (r0 + 1) * COLS + c0 + 9; m[ix[k++]] = a; }                   /* a tie at amax */
            if (c == 3) { ix[k] = (r0 + 2) * COLS + c0 + 5; m[ix[k++]] = f32_to_bf16(amax * 0.985f); } /* rounds to 448 */
            if (c == 4) { ix[k] = (r0 + 2) * COLS + c0 + 5; m[ix[k++]] = f32_to_bf16(amax * 0.5f); } /* was 448, not amax */
            if (c == 5) { /* an all-zero block (1, 2) gets one value, then loses it */
                for (int r = 128; r < ROWS; r++)
                    for (int cc = 256; cc < COLS; cc++) m[r * COLS + cc] = 0;
                quant_fp8_free(g);
                g = quant_fp8_from_bf16(m, ROWS, COLS, QUANT_FP8_BLOCK128, &e);
                ix[k] = 130 * COLS + 260;
                m[ix[k++]] = f32_to_bf16(0.01f);
            }
            int got = quant_fp8_requant(g, m, ix, (size_t)k, &e);
            QuantFp8 *ref = quant_fp8_from_bf16(m, ROWS, COLS, QUANT_FP8_BLOCK128, &e);
            edge_bad += !same_fp8(g, ref);
            edge_full += got;
            quant_fp8_free(ref);
        }
        quant_fp8_free(g);
        m = mm;
        free(m2);
        /* whole: lowered, raised, the old 448 of case 3, the zero block; kept: the tie (the amax stands)
         * and case 3 (0.985 amax: below it, and its old byte was not 448) */
        T_ASSERT(edge_bad == 0, "%d FP8 edge cases differ from scratch", edge_bad);
        T_ASSERT(edge_full == 4, "FP8 edge cases redid %d blocks whole, want 4", edge_full);
    }
    {   /* NVFP4's amax rule at its edges (on a copy of the master, against from scratch): a touched
         * element only counts as a possible amax holder when its old code was +-6 in a block scaled
         * by 448; one that was, without being the amax, lowered (the amax stands: blocks); the amax
         * holder itself lowered (full); a tie written at the amax (stands: blocks); a touch far below */
        uint16_t *m2 = malloc((size_t)ROWS * COLS * 2);
        memcpy(m2, m, (size_t)ROWS * COLS * 2);
        uint16_t a = amax_bits(m2);
        int64_t at = 0;
        while ((m2[at] & 0x7fff) != a) at++;
        int64_t nb = at / 16 * 16, near = nb + (at % 16 == 0 ? 1 : 0); /* another element of the amax's block */
        m2[near] = f32_to_bf16(bf16_to_f32(a) * 0.95f); /* quantizes to 6 under a 448 scale */
        QuantNvfp4 *g = quant_nvfp4_from_bf16(m2, ROWS, COLS, &e);
        int ecase_bad = 0, kinds_got[4];
        for (int c = 0; c < 4; c++) {
            int64_t ix[1];
            if (c == 0) { ix[0] = near; m2[near] = f32_to_bf16(bf16_to_f32(a) * 0.5f); }
            if (c == 1) { ix[0] = 17; m2[17] = f32_to_bf16(bf16_to_f32(m2[17]) + 0.001f); }
            if (c == 2) { ix[0] = 2 * COLS + 3; m2[ix[0]] = a; } /* a tie: now two holders */
            if (c == 3) { ix[0] = at; m2[at] = f32_to_bf16(bf16_to_f32(a) * 0.25f); } /* one of them lowered */
            kinds_got[c] = quant_nvfp4_requant(g, m2, ix, 1, &e);
            QuantNvfp4 *ref = quant_nvfp4_from_bf16(m2, ROWS, COLS, &e);
            ecase_bad += !same_nvfp4(g, ref);
            quant_nvfp4_free(ref);
        }
        T_ASSERT(ecase_bad == 0, "%d NVFP4 edge cases differ from scratch", ecase_bad);
        T_ASSERT(kinds_got[0] == QUANT_REQUANT_BLOCKS && kinds_got[1] == QUANT_REQUANT_BLOCKS &&
                 kinds_got[2] == QUANT_REQUANT_BLOCKS && kinds_got[3] == QUANT_REQUANT_BLOCKS,
                 "NVFP4 edge kinds %d %d %d %d, want blocks in each (the amax stands throughout)", kinds_got[0],
                 kinds_got[1], kinds_got[2], kinds_got[3]);
        int64_t ix2[1] = {2 * COLS + 3}; /* the last holder lowered: the amax moves */
        m2[ix2[0]] = f32_to_bf16(bf16_to_f32(a) * 0.25f);
        int k = quant_nvfp4_requant(g, m2, ix2, 1, &e);
        QuantNvfp4 *ref = quant_nvfp4_from_bf16(m2, ROWS, COLS, &e);
        T_ASSERT(k == QUANT_REQUANT_FULL && same_nvfp4(g, ref), "NVFP4: the last amax holder lowered: kind %d, %s", k,
                 same_nvfp4(g, ref) ? "same" : "DIFFERS from scratch");
        quant_nvfp4_free(ref);
        quant_nvfp4_free(g);
        free(m2);
    }
    T_ASSERT(nv_bad == 0, "%d NVFP4 re-quantizations differ from scratch", nv_bad);
    T_ASSERT(kind_bad == 0, "%d NVFP4 rounds reported the wrong kind (blocks vs full)", kind_bad);
    T_ASSERT(full == 4, "amax changes (2 up, 2 down) forced %d full recomputes", full);

    /* Errors leave everything untouched. */
    QuantNvfp4 *vs = quant_nvfp4_from_bf16(m, ROWS, COLS, &e);
    QuantFp8 *fs = quant_fp8_from_bf16(m, ROWS, COLS, QUANT_FP8_BLOCK128, &e);
    int64_t badidx[3] = {3, ROWS * COLS, 9};
    uint16_t keep = m[3];
    m[3] = f32_to_bf16(50.0f); /* would raise the amax if applied */
    T_ASSERT(quant_nvfp4_requant(v, m, badidx, 3, &e) < 0 && e.code == 400, "out-of-range index: %s", e.msg);
    T_ASSERT(quant_fp8_requant(f[0], m, badidx, 3, &e) < 0 && e.code == 400, "out-of-range index (fp8)");
    T_ASSERT(same_nvfp4(v, vs) && same_fp8(f[0], fs), "state untouched after a bad index");
    m[3] = 0x7fc0; /* NaN */
    T_ASSERT(quant_nvfp4_requant(v, m, badidx, 1, &e) < 0 && strstr(e.msg, "non-finite"), "NaN: %s", e.msg);
    T_ASSERT(quant_fp8_requant(f[0], m, badidx, 1, &e) < 0, "NaN (fp8)");
    T_ASSERT(same_nvfp4(v, vs) && same_fp8(f[0], fs), "state untouched after a NaN");
    m[3] = keep;
    T_ASSERT(quant_nvfp4_requant(v, m, idx, 0, &e) == QUANT_REQUANT_BLOCKS && same_nvfp4(v, vs), "empty delta");
    T_ASSERT(quant_fp8_requant(f[0], m, idx, 0, &e) == 0 && same_fp8(f[0], fs), "empty delta (fp8)");

    /* A pre-quantized (checkpoint) tensor has no known amax: requant recomputes it all. */
    int64_t psh[2] = {ROWS, COLS / 2}, ssh[2] = {ROWS, COLS / 16};
    QuantNvfp4 *ck = quant_nvfp4_from_checkpoint(vs->packed, DT_U8, psh, 2, vs->scale, DT_F8_E4M3, ssh, 2,
                                                 &vs->scale2, DT_F32, NULL, 0, NULL, DT_F32, NULL, 0, &e);
    T_ASSERT(ck && quant_nvfp4_requant(ck, m, idx, 1, &e) == -409, "borrowed NVFP4 refuses requant: %s", e.msg);
    quant_nvfp4_free(ck);

    quant_nvfp4_free(vs); quant_fp8_free(fs);
    for (int l = 0; l < 3; l++) quant_fp8_free(f[l]);
    quant_nvfp4_free(v);
    free(m);
    return T_DONE();
}
