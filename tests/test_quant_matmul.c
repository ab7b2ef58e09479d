/*
 * test_quant_matmul.c - the FP8 / NVFP4 CPU matmul kernels: against float64
 * torch products of the dequantized operands (golden), batch invariance
 * (every output bit independent of n, token position and row split), and
 * bit-identity of the AVX2 and portable paths.
 */
#include <math.h>

#include "quant.h"
#include "quant_golden.h"
#include "quant_ref.h"
#include "test.h"

/* |out - ref| <= 4e-6 * sum_k |x_k w_k| + 1e-30: an f32 reduction over
 * <= 64 sequential roundings (16-lane FMA chains, group scaling, lane tree)
 * has relative error below 64 * 2^-24 = 3.8e-6 of the absolute sum. */
#define MM_TOL 4e-6

static void check_against(const char *what, const float *out, const double *ref, const float *xd, int n,
                          int rows, int cols, const float *wd) {
    int bad = 0;
    double worst = 0;
    for (int t = 0; t < n; t++)
        for (int r = 0; r < rows; r++) {
            double abssum = 0;
            for (int k = 0; k < cols; k++) abssum += fabs((double)xd[(size_t)t * cols + k] * wd[(size_t)r * cols + k]);
            double err = fabs(out[(size_t)t * rows + r] - ref[(size_t)t * rows + r]);
            double bound = MM_TOL * abssum + 1e-30;
            if (err / bound > worst) worst = err / bound;
            bad += !(err <= bound);
        }
    T_ASSERT(bad == 0, "%s: %d of %d outputs outside the bound (worst %.2f x bound)", what, bad, n * rows, worst);
    printf("%-12s worst error / bound = %.3f\n", what, worst);
}

static void test_golden(void) {
    int n = 7, rows = 256, cols = 384, ng = quant_fp8_groups(cols);
    uint16_t *wb = qg_read_n("w_zeroblocks.bf16", (size_t)rows * cols * 2);
    float *x = qg_read_n("act_x.f32", (size_t)n * cols * 4);
    double *r_fwo = qg_read_n("mm_fp8_wo.f64", (size_t)n * rows * 8), *r_faq = qg_read_n("mm_fp8_aq.f64", (size_t)n * rows * 8);
    double *r_nwo = qg_read_n("mm_nvfp4_wo.f64", (size_t)n * rows * 8), *r_naq = qg_read_n("mm_nvfp4_aq.f64", (size_t)n * rows * 8);
    Err e = {0};
    QuantFp8 *f = quant_fp8_from_bf16(wb, rows, cols, QUANT_FP8_BLOCK128, &e);
    QuantNvfp4 *v = quant_nvfp4_from_bf16(wb, rows, cols, &e);
    float *wd = malloc((size_t)rows * cols * 4), *out = malloc((size_t)n * rows * 4);
    float *scratch = malloc(qr_matmul_scratch_floats(n, cols) * 4), *xd = malloc((size_t)n * cols * 4);
    for (int pass = 0; pass < 2; pass++) {
        quant_force_portable(pass);
        const char *p = pass ? "portable" : "simd";
        char what[64];
        for (int r = 0; r < rows; r++) qr_fp8_dequant_row(f, r, wd + (size_t)r * cols);
        qr_matmul_fp8(out, x, f, n, 0, scratch);
        snprintf(what, sizeof what, "fp8 wo %s", p);
        check_against(what, out, r_fwo, x, n, rows, cols, wd);
        qr_matmul_fp8(out, x, f, n, 1, scratch);
        for (int i = 0; i < n * cols; i++) xd[i] = scratch[i] * scratch[(size_t)n * cols + (i / cols) * ng + (i % cols) / 128];
        snprintf(what, sizeof what, "fp8 aq %s", p);
        check_against(what, out, r_faq, xd, n, rows, cols, wd);
        for (int r = 0; r < rows; r++) qr_nvfp4_dequant_row(v, r, wd + (size_t)r * cols);
        qr_matmul_nvfp4(out, x, v, n, 0, scratch);
        snprintf(what, sizeof what, "nvfp4 wo %s", p);
        check_against(what, out, r_nwo, x, n, rows, cols, wd);
        qr_matmul_nvfp4(out, x, v, n, 1, scratch);
        for (int i = 0; i < n * cols; i++) xd[i] = scratch[i] * scratch[(size_t)n * cols + i / cols];
        snprintf(what, sizeof what, "nvfp4 aq %s", p);
        check_against(what, out, r_naq, xd, n, rows, cols, wd);
    }
    quant_force_portable(0);
    quant_fp8_free(f); quant_nvfp4_free(v);
    free(wb); free(x); free(r_fwo); free(r_faq); free(r_nwo); free(r_naq); free(wd); free(out); free(scratch); free(xd);
}

/* Run one format / variant over all tokens and rows at once. */
typedef struct { const QuantFp8 *f; const QuantNvfp4 *v; int aq; } Kern;

static void run(const Kern *k, float *out, const float *x, const float *xs, int n, int rb, int re) {
    if (k->f) quant_matmul_fp8_rows(out, x, k->aq ? xs : NULL, k->f, n, rb, re);
    else quant_matmul_nvfp4_rows(out, x, k->aq ? xs : NULL, k->v, n, rb, re);
}

static void test_invariance(const Kern *k, const char *what, int n, int rows, int cols, const float *x) {
    int ng = quant_fp8_groups(cols);
    float *xq = malloc((size_t)n * cols * 4), *xs = malloc((size_t)n * (ng + 1) * 4);
    if (k->aq && k->f) quant_act_fp8(xq, xs, x, n, cols);
    else if (k->aq) quant_act_nvfp4(xq, xs, x, n, cols, 0.0f);
    else memcpy(xq, x, (size_t)n * cols * 4);
    int sstride = k->f ? ng : 1;
    float *full = malloc((size_t)n * rows * 4), *part = malloc((size_t)n * rows * 4), *one = malloc((size_t)rows * 4);
    run(k, full, xq, xs, n, 0, rows);
    /* token by token (n = 1) and at every offset of a smaller batch */
    int bad = 0;
    for (int t = 0; t < n; t++) {
        run(k, one, xq + (size_t)t * cols, xs + (size_t)t * sstride, 1, 0, rows);
        bad += memcmp(one, full + (size_t)t * rows, (size_t)rows * 4) != 0;
    }
    T_ASSERT(bad == 0, "%s: %d tokens differ when run alone", what, bad);
    for (int start = 1; start < 4; start++) {
        int m = n - start;
        run(k, part, xq + (size_t)start * cols, xs + (size_t)start * sstride, m, 0, rows);
        T_ASSERT(memcmp(part, full + (size_t)start * rows, (size_t)m * rows * 4) == 0,
                 "%s: batch of %d at offset %d differs", what, m, start);
    }
    /* row split into uneven ranges, outputs outside the range untouched */
    for (size_t i = 0; i < (size_t)n * rows; i++) part[i] = NAN;
    int cuts[] = {0, 1, 7, 20, rows};
    for (int c = 0; c + 1 < 5; c++) {
        if (cuts[c] >= rows) break;
        int re = cuts[c + 1] < rows ? cuts[c + 1] : rows;
        run(k, part, xq, xs, n, cuts[c], re);
        int outside = 0;
        for (int t = 0; t < n; t++)
            for (int r = re; r < rows; r++) outside += !isnan(part[(size_t)t * rows + r]);
        T_ASSERT(outside == 0, "%s: rows [%d, %d) wrote %d outputs outside", what, cuts[c], re, outside);
    }
    T_ASSERT(memcmp(part, full, (size_t)n * rows * 4) == 0, "%s: row split differs", what);
    /* portable path: same bits */
    quant_force_portable(1);
    run(k, part, xq, xs, n, 0, rows);
    quant_force_portable(0);
    T_ASSERT(memcmp(part, full, (size_t)n * rows * 4) == 0, "%s: portable and SIMD paths differ", what);
    free(xq); free(xs); free(full); free(part); free(one);
}

static void test_batch_invariance(void) {
    int n = 13, rows = 37, cols = 400, colsv = 416;
    uint16_t *w = malloc((size_t)rows * colsv * 2);
    float *x = malloc((size_t)n * colsv * 4);
    for (int i = 0; i < rows * colsv; i++) w[i] = f32_to_bf16((float)(qg_normal() * 0.05));
    for (int i = 0; i < n * colsv; i++) x[i] = (float)(qg_normal() * (1 + i % 7));
    Err e = {0};
    QuantFp8 *fb = quant_fp8_from_bf16(w, rows, cols, QUANT_FP8_BLOCK128, &e);
    QuantFp8 *fc = quant_fp8_from_bf16(w, rows, cols, QUANT_FP8_PER_CHANNEL, &e);
    QuantFp8 *ft = quant_fp8_from_bf16(w, rows, cols, QUANT_FP8_PER_TENSOR, &e);
    QuantNvfp4 *v = quant_nvfp4_from_bf16(w, rows, colsv, &e);
    Kern ks[] = {{fb, NULL, 0}, {fb, NULL, 1}, {fc, NULL, 0}, {fc, NULL, 1}, {ft, NULL, 0}, {ft, NULL, 1},
                 {NULL, v, 0}, {NULL, v, 1}};
    const char *names[] = {"fp8 block wo", "fp8 block aq", "fp8 channel wo", "fp8 channel aq",
                           "fp8 tensor wo", "fp8 tensor aq", "nvfp4 wo", "nvfp4 aq"};
    for (int i = 0; i < 8; i++) test_invariance(&ks[i], names[i], n, rows, ks[i].f ? cols : colsv, x);
    printf("SIMD kernels %s\n", quant_simd_active() ? "active (compared with portable)" : "unavailable: portable only");
    quant_fp8_free(fb); quant_fp8_free(fc); quant_fp8_free(ft); quant_nvfp4_free(v);
    free(w); free(x);
}

int main(void) {
    test_golden();
    test_batch_invariance();
    return T_DONE();
}
