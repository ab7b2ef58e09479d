/*
 * test_cpu_paths.c - every CPU matmul path this machine can run (portable,
 * avx2-v0, avx2, avx512: cpu_ops_force_path) against a scalar model of the
 * reference order written down in cpu_ops.h, bit for bit, and batch
 * invariance on each path: a token's outputs do not depend on how many
 * tokens are in the call, which tokens they are, or how the rows are split
 * into tasks. Shapes cover every tile remainder (rows not a multiple of the
 * row blocks, K not a multiple of 8, token counts around each tile width and
 * panel chunk) and a K wider than the packed panel. Then whole forward passes
 * of fixtures (two sequences in one prefill on scattered blocks, then decode
 * steps) on every path: the logits must be the same bits on all of them (the
 * avx2-v0 path also runs the old attention). The FP8 matmul kernels of each
 * path (quant.h QuantPath, chosen with the CPU path) the same way: against a
 * scalar model of quant.h's order, every scale layout, weight-only and with
 * quantized activations, every special e4m3 byte (zeros, subnormals, +-448),
 * row and column remainders around each tile and step; and FP8 forward passes
 * (quantized at load, w8a8 and weight-only, and a pre-quantized checkpoint)
 * on every path. What it is not: a speed test (bench/bench_matmul.c).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops.h"
#include "dtype.h"
#include "log.h"
#include "model.h"
#include "quant.h"
#include "test.h"

static uint32_t g_rng = 12345;
static float rnd(void) { /* uniform in [-1, 1) */
    g_rng = g_rng * 1664525u + 1013904223u;
    return (float)((g_rng >> 8) & 0xffffff) / 8388608.0f - 1.0f;
}

/* The reference order (cpu_ops.h), scalar. */
static float ref_dot(const uint16_t *w, const float *x, int K) {
    float acc[8] = {0};
    int k = 0;
    for (; k + 8 <= K; k += 8)
        for (int j = 0; j < 8; j++) acc[j] = fmaf(bf16_to_f32(w[k + j]), x[k + j], acc[j]);
    float s = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    for (; k < K; k++) s = fmaf(bf16_to_f32(w[k]), x[k], s);
    return s;
}

/* Runs the matmul over rows in tasks of `split` rows (0: the backend's split). */
static void run(float *out, int ldo, const float *x, int ldx, int n, const WeightMat *w, const uint16_t *bias,
                int split) {
    int tr = split > 0 ? split : cpu_matmul_task_rows(w->cols);
    for (int r0 = 0; r0 < w->rows; r0 += tr)
        cpu_matmul_rows(out, ldo, x, ldx, n, w, bias, r0, r0 + tr < w->rows ? r0 + tr : w->rows);
}

static int g_bad_path; /* first mismatch per path is printed, the rest counted */

static void check_shape(CpuPath p, int rows, int K, int n, int split, int with_bias) {
    int ldx = K + 3, ldo = rows + 5;
    WeightMat w = {.fmt = WF_BF16, .rows = rows, .cols = K};
    w.bf16 = malloc(sizeof(uint16_t) * (size_t)rows * K);
    uint16_t *bias = with_bias ? malloc(sizeof(uint16_t) * (size_t)rows) : NULL;
    float *x = malloc(sizeof(float) * (size_t)n * ldx);
    float *out = malloc(sizeof(float) * (size_t)n * ldo), *one = malloc(sizeof(float) * (size_t)ldo);
    /* Magnitudes spread over a few binades, so any change of order changes bits. */
    for (size_t i = 0; i < (size_t)rows * K; i++) w.bf16[i] = f32_to_bf16(rnd() * (1 + (int)(i % 7) * 3));
    for (int r = 0; bias && r < rows; r++) bias[r] = f32_to_bf16(rnd());
    for (size_t i = 0; i < (size_t)n * ldx; i++) x[i] = rnd() * (1 + (int)(i % 5) * 11);
    for (size_t i = 0; i < (size_t)n * ldo; i++) out[i] = NAN;
    run(out, ldo, x, ldx, n, &w, bias, split);
    int bad = 0, pad_ok = 1;
    for (int t = 0; t < n; t++) {
        for (int r = 0; r < rows; r++) {
            float e = ref_dot(w.bf16 + (size_t)r * K, x + (size_t)t * ldx, K);
            if (bias) e += bf16_to_f32(bias[r]);
            float g = out[(size_t)t * ldo + r];
            if (memcmp(&e, &g, sizeof e)) {
                if (!bad && !g_bad_path)
                    fprintf(stderr, "%s rows %d K %d n %d: out[%d][%d] = %.9g, reference %.9g\n", cpu_ops_path_name(p),
                            rows, K, n, t, r, g, e);
                bad++;
            }
        }
        for (int r = rows; r < ldo; r++) pad_ok &= isnan(out[(size_t)t * ldo + r]);
    }
    T_ASSERT(bad == 0, "%s rows %d K %d n %d split %d: %d outputs differ from the reference order",
             cpu_ops_path_name(p), rows, K, n, split, bad);
    T_ASSERT(pad_ok, "%s rows %d K %d n %d: wrote past the rows", cpu_ops_path_name(p), rows, K, n);
    g_bad_path |= bad != 0;
    /* Batch invariance: each token alone, and the last token inside a batch
     * of other tokens in a different position, give the batch's bits. */
    int inv = 1;
    for (int t = 0; t < n; t += (n > 8 ? 7 : 1)) {
        run(one, ldo, x + (size_t)t * ldx, ldx, 1, &w, bias, 16);
        inv &= !memcmp(one, out + (size_t)t * ldo, sizeof(float) * (size_t)rows);
    }
    if (n > 2) {
        float *x2 = malloc(sizeof(float) * (size_t)3 * ldx), *o2 = malloc(sizeof(float) * (size_t)3 * ldo);
        for (int i = 0; i < 2 * ldx; i++) x2[i] = rnd();
        memcpy(x2 + 2 * ldx, x + (size_t)(n - 1) * ldx, sizeof(float) * (size_t)ldx);
        run(o2, ldo, x2, ldx, 3, &w, bias, 0);
        inv &= !memcmp(o2 + 2 * ldo, out + (size_t)(n - 1) * ldo, sizeof(float) * (size_t)rows);
        free(x2);
        free(o2);
    }
    T_ASSERT(inv, "%s rows %d K %d n %d: a token's outputs depend on its batch", cpu_ops_path_name(p), rows, K, n);
    free(w.bf16);
    free(bias);
    free(x);
    free(out);
    free(one);
}

/* cpu_dot_rows / cpu_axpy_rows (attention) give the bits of one cpu_dot /
 * cpu_axpy per row, on the path in use. */
static void check_rows_ops(CpuPath p) {
    static const int ns[] = {5, 8, 16, 24, 32, 56, 61, 64, 128, 131, 200, 256}; /* every register width of the rows forms */
    static const int ms[] = {1, 3, 4, 7, 8, 9, 16, 17};
    int bad_dot = 0, bad_axpy = 0;
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < sizeof ms / sizeof ms[0]; b++) {
            int n = ns[a], m = ms[b];
            size_t ld = (size_t)n + 5;
            float *q = malloc(sizeof(float) * n), *k = malloc(sizeof(float) * m * ld), *c = malloc(sizeof(float) * m);
            float *y1 = malloc(sizeof(float) * n), *y2 = malloc(sizeof(float) * n);
            for (int i = 0; i < n; i++) y1[i] = y2[i] = q[i] = rnd() * 3;
            for (size_t i = 0; i < m * ld; i++) k[i] = rnd() * (1 + (int)(i % 3) * 5);
            for (int i = 0; i < m; i++) c[i] = rnd();
            float *d = malloc(sizeof(float) * m);
            cpu_dot_rows(d, q, k, ld, m, n);
            for (int i = 0; i < m; i++) {
                float e = cpu_dot(q, k + (size_t)i * ld, n);
                bad_dot += memcmp(&e, &d[i], sizeof e) != 0;
            }
            cpu_axpy_rows(y1, c, k, ld, m, n);
            for (int i = 0; i < m; i++) cpu_axpy(y2, c[i], k + (size_t)i * ld, n);
            bad_axpy += memcmp(y1, y2, sizeof(float) * n) != 0;
            free(q); free(k); free(c); free(y1); free(y2); free(d);
        }
    T_ASSERT(bad_dot == 0, "%s: %d cpu_dot_rows results differ from cpu_dot", cpu_ops_path_name(p), bad_dot);
    T_ASSERT(bad_axpy == 0, "%s: %d cpu_axpy_rows results differ from cpu_axpy", cpu_ops_path_name(p), bad_axpy);
    /* the multi-query forms (attention tiles): 1-11 queries over the same rows (whole groups of the
     * AVX2 axpy's 2, 4 or 8 and a rest), each query's results the bits of cpu_dot / cpu_axpy alone */
    int bad_mdot = 0, bad_maxpy = 0;
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < sizeof ms / sizeof ms[0]; b++)
            for (int nq = 1; nq <= 11; nq += 2) {
                int n = ns[a], m = ms[b];
                size_t ld = (size_t)n + 3;
                float *k = malloc(sizeof(float) * m * ld), *qv = malloc(sizeof(float) * nq * n);
                float *dv = malloc(sizeof(float) * nq * m), *cv = malloc(sizeof(float) * nq * m);
                float *y1 = malloc(sizeof(float) * nq * n), *y2 = malloc(sizeof(float) * nq * n);
                float *outs[11], *ys[11];
                const float *qs[11], *cs[11];
                for (size_t i = 0; i < m * ld; i++) k[i] = rnd() * (1 + (int)(i % 3) * 5);
                for (int i = 0; i < nq * n; i++) { qv[i] = rnd() * 3; y1[i] = y2[i] = rnd(); }
                for (int i = 0; i < nq * m; i++) cv[i] = rnd();
                for (int e = 0; e < nq; e++) {
                    outs[e] = dv + (size_t)e * m;
                    qs[e] = qv + (size_t)e * n;
                    ys[e] = y1 + (size_t)e * n;
                    cs[e] = cv + (size_t)e * m;
                }
                cpu_dot_rows_multi(outs, qs, nq, k, ld, m, n);
                cpu_axpy_rows_multi(ys, cs, nq, k, ld, m, n);
                for (int e = 0; e < nq; e++) {
                    for (int i = 0; i < m; i++) {
                        float x = cpu_dot(qs[e], k + (size_t)i * ld, n);
                        bad_mdot += memcmp(&x, &outs[e][i], sizeof x) != 0;
                        cpu_axpy(y2 + (size_t)e * n, cs[e][i], k + (size_t)i * ld, n);
                    }
                }
                bad_maxpy += memcmp(y1, y2, sizeof(float) * nq * n) != 0;
                free(k); free(qv); free(dv); free(cv); free(y1); free(y2);
            }
    /* BF16 rows read in place (a BF16 KV cache) where the path has it: the bits of the widened rows */
    int ran_b = 0, bad_b = 0;
    for (int n = 128; n <= 256; n += 128)
        for (size_t b = 0; b < sizeof ms / sizeof ms[0] && cpu_kv_bf16_direct(n); b++)
            for (int nq = 1; nq <= 7; nq += 3) {
                int m = ms[b] + 8;
                size_t ld = (size_t)n;
                uint16_t *kb = malloc(sizeof(uint16_t) * m * ld);
                float *kf = malloc(sizeof(float) * m * ld), *qv = malloc(sizeof(float) * nq * n);
                float *d1 = malloc(sizeof(float) * nq * m), *d2 = malloc(sizeof(float) * nq * m);
                float *cv = malloc(sizeof(float) * nq * m), *y1 = malloc(sizeof(float) * nq * n);
                float *y2 = malloc(sizeof(float) * nq * n);
                float *o1[8], *o2[8], *ys1[8], *ys2[8];
                const float *qs[8], *cs[8];
                for (size_t i = 0; i < m * ld; i++) kf[i] = bf16_to_f32(kb[i] = f32_to_bf16(rnd() * 4));
                for (int i = 0; i < nq * n; i++) { qv[i] = rnd(); y1[i] = y2[i] = rnd(); }
                for (int i = 0; i < nq * m; i++) cv[i] = rnd();
                for (int e = 0; e < nq; e++) {
                    o1[e] = d1 + (size_t)e * m; o2[e] = d2 + (size_t)e * m;
                    ys1[e] = y1 + (size_t)e * n; ys2[e] = y2 + (size_t)e * n;
                    qs[e] = qv + (size_t)e * n; cs[e] = cv + (size_t)e * m;
                }
                cpu_dot_rows_multi_bf16(o1, qs, nq, kb, ld, m, n);
                cpu_dot_rows_multi(o2, qs, nq, kf, ld, m, n);
                cpu_axpy_rows_multi_bf16(ys1, cs, nq, kb, ld, m, n);
                cpu_axpy_rows_multi(ys2, cs, nq, kf, ld, m, n);
                bad_b += memcmp(d1, d2, sizeof(float) * nq * m) != 0 || memcmp(y1, y2, sizeof(float) * nq * n) != 0;
                ran_b++;
                free(kb); free(kf); free(qv); free(d1); free(d2); free(cv); free(y1); free(y2);
            }
    T_ASSERT(bad_b == 0, "%s: %d of %d BF16-row multi-query results differ from the widened rows'", cpu_ops_path_name(p),
             bad_b, ran_b);
    if (ran_b) printf("path %s: BF16 K/V rows in place checked (%d shapes)\n", cpu_ops_path_name(p), ran_b);
    T_ASSERT(bad_mdot == 0, "%s: %d cpu_dot_rows_multi results differ from cpu_dot", cpu_ops_path_name(p), bad_mdot);
    T_ASSERT(bad_maxpy == 0, "%s: %d cpu_axpy_rows_multi results differ from cpu_axpy", cpu_ops_path_name(p),
             bad_maxpy);
}

/* ---- FP8 (quant.h) ---- */

/* The FP8 reference order of quant.h, scalar: 16 lanes by k mod 16; per
 * 128-column group p = fma(x, w, p) from 0 (zeros past the row's end), then
 * acc = fma(p, scale (* xs), acc); l[i] = a[i] + a[i + 8], m[i] = l[i] +
 * l[i + 4], (m0 + m2) + (m1 + m3). */
static float ref_fp8(const QuantFp8 *w, int r, const float *x, const float *xs, int t) {
    int cols = w->cols, ng = quant_fp8_groups(cols);
    const uint8_t *q = w->q + (size_t)r * cols;
    float acc[16] = {0};
    for (int g = 0; g < ng; g++) {
        float p[16] = {0};
        for (int k = g * 128; k < g * 128 + 128 && k < cols; k += 16)
            for (int l = 0; l < 16; l++) {
                int c = k + l;
                int in = c < cols && c < g * 128 + 128;
                float xv = in ? x[c] : 0.0f, wv = in ? quant_e4m3_to_f32(q[c]) : 0.0f;
                p[l] = fmaf(xv, wv, p[l]);
            }
        float sc = w->scale_inv[(size_t)(r / w->block_rows) * w->scale_cols + g * 128 / w->block_cols];
        if (xs) sc *= xs[(size_t)t * ng + g];
        for (int l = 0; l < 16; l++) acc[l] = fmaf(p[l], sc, acc[l]);
    }
    float l8[8], m4[4];
    for (int i = 0; i < 8; i++) l8[i] = acc[i] + acc[i + 8];
    for (int i = 0; i < 4; i++) m4[i] = l8[i] + l8[i + 4];
    return (m4[0] + m4[2]) + (m4[1] + m4[3]);
}

/* Random e4m3 bytes (never NaN), a fifth of them special: +-0, subnormals, +-448. */
static uint8_t rnd_e4m3(void) {
    static const uint8_t special[] = {0x00, 0x80, 0x01, 0x81, 0x03, 0x07, 0x87, 0x08, 0x7e, 0xfe};
    g_rng = g_rng * 1664525u + 1013904223u;
    uint32_t v = g_rng >> 8;
    if (v % 5 == 0) return special[(v >> 4) % sizeof special];
    uint8_t b = (uint8_t)(v >> 12);
    return (b & 0x7f) == 0x7f ? (uint8_t)(b ^ 1) : b;
}

static int g_fp8_bad_path;
/* 1: check_fp8_shape draws x on the e4m3 grid (what quant_act_fp8 hands the
 * kernels with xs: +-0, subnormals down to 2^-9, 448) and scales from 2^-30 to
 * 2^121, so the scaled decode's (fp8_matmul_x86.c, tile512's S) extremes are
 * reached: p' at its smallest, sc 2^8 past FLT_MAX (its other branch) and
 * products that overflow. */
static int g_fp8_edges;

/* One FP8 shape on path p: every output against ref_fp8, bit for bit, tasks of
 * `split` rows (as the backend splits), weight-only (xs NULL) or with xs. */
static void check_fp8_shape(QuantPath p, int rows, int cols, int n, QuantFp8Layout lay, int with_xs, int split) {
    int sr = lay == QUANT_FP8_BLOCK128 ? (rows + 127) / 128 : lay == QUANT_FP8_PER_CHANNEL ? rows : 1;
    int sc = lay == QUANT_FP8_BLOCK128 ? (cols + 127) / 128 : 1, ng = quant_fp8_groups(cols);
    uint8_t *q = malloc((size_t)rows * cols);
    float *sinv = malloc(sizeof(float) * (size_t)sr * sc), *x = malloc(sizeof(float) * (size_t)n * cols);
    float *xs = malloc(sizeof(float) * (size_t)n * ng), *out = malloc(sizeof(float) * (size_t)n * rows);
    for (size_t i = 0; i < (size_t)rows * cols; i++) q[i] = rnd_e4m3();
    for (int i = 0; i < sr * sc; i++) sinv[i] = (rnd() + 1.5f) * 0.01f;
    for (size_t i = 0; i < (size_t)n * cols; i++) x[i] = rnd() * (1 + (int)(i % 5) * 11);
    for (int i = 0; i < n * ng; i++) xs[i] = rnd() + 1.25f;
    if (g_fp8_edges) {
        static const float big[] = {0x1p100f, 0.015f, 0x1p99f, 3.0f};
        static const float xsv[] = {0x1p21f, 1.25f, 0x1p-30f, 0x1p20f, 0x1.fffffep20f};
        for (int i = 0; i < sr * sc; i++) sinv[i] = big[i % 4];
        for (size_t i = 0; i < (size_t)n * cols; i++) x[i] = quant_e4m3_to_f32(rnd_e4m3());
        for (int i = 0; i < n * ng; i++) xs[i] = xsv[i % 5];
    }
    int64_t wshape[2] = {rows, cols}, sshape[2] = {sr, sc};
    int sndim = lay == QUANT_FP8_PER_TENSOR ? 0 : lay == QUANT_FP8_PER_CHANNEL ? 1 : 2;
    Err e = {0};
    QuantFp8 *w = quant_fp8_from_checkpoint(q, DT_F8_E4M3, wshape, 2, sinv, DT_F32, sshape, sndim, &e);
    T_ASSERT(w != NULL, "fp8 %dx%d layout %d: %s", rows, cols, (int)lay, e.msg);
    if (!w) goto done;
    for (size_t i = 0; i < (size_t)n * rows; i++) out[i] = NAN;
    for (int r0 = 0; r0 < rows; r0 += split)
        quant_matmul_fp8_rows(out, x, with_xs ? xs : NULL, w, n, r0, r0 + split < rows ? r0 + split : rows);
    int bad = 0;
    for (int t = 0; t < n; t++)
        for (int r = 0; r < rows; r++) {
            float ex = ref_fp8(w, r, x + (size_t)t * cols, with_xs ? xs : NULL, t), g = out[(size_t)t * rows + r];
            if (memcmp(&ex, &g, sizeof ex)) {
                if (!bad && !g_fp8_bad_path)
                    fprintf(stderr, "fp8 %s rows %d cols %d n %d layout %d xs %d: out[%d][%d] = %.9g, reference %.9g\n",
                            quant_path_name(p), rows, cols, n, (int)lay, with_xs, t, r, g, ex);
                bad++;
            }
        }
    T_ASSERT(bad == 0, "fp8 %s rows %d cols %d n %d layout %d xs %d split %d: %d outputs differ from the reference order",
             quant_path_name(p), rows, cols, n, (int)lay, with_xs, split, bad);
    g_fp8_bad_path |= bad != 0;
    quant_fp8_free(w);
done:
    free(q); free(sinv); free(x); free(xs); free(out);
}

/* quant_act_fp8 on the path in use against the scalar formula of quant.h
 * (quant_f32_to_e4m3 of x / s), xq and xs bit for bit: random groups of
 * several magnitudes, and groups with amax 448 (s = 1, so x / s = x) full of
 * rounding ties (normal, subnormal, into 2^-6, into 448), +-0, tiny
 * negatives, an all-zero group and a group whose scale underflows. (x / s
 * never exceeds 448 by more than two roundings, so the saturation above 448
 * cannot be reached from here; cast.c's tests cover it.) */
static void check_act_fp8(QuantPath p) {
    static const float ties[] = {1.0625f, 1.1875f, -1.0625f, 0x1.4p-8f, 0x1.ep-7f, 0x1p-10f, 0x1p-6f, 0x1.fp-7f,
                                 447.0f, -447.5f, 0x1.8p-9f, 0x1.4p-9f, -0.0f, -1e-10f, 0.0f, 3e-3f};
    static const int colss[] = {8, 100, 128, 200, 1003};
    int bad = 0;
    for (size_t ci = 0; ci < sizeof colss / sizeof colss[0]; ci++) {
        int cols = colss[ci], ng = quant_fp8_groups(cols), n = 3;
        float *x = malloc(sizeof(float) * (size_t)n * cols), *xq = malloc(sizeof(float) * (size_t)n * cols);
        float *xs = malloc(sizeof(float) * (size_t)n * ng);
        for (int t = 0; t < n; t++)
            for (int c = 0; c < cols; c++) {
                float *v = &x[(size_t)t * cols + c];
                int g = c / 128;
                if (t == 0) *v = rnd() * (float)(1 << (g % 4 * 5)) * 1e-3f;
                else if (t == 1) *v = c % 128 == 0 ? 448.0f : ties[c % (sizeof ties / sizeof ties[0])];
                else *v = g == 0 ? 0.0f : g == 1 ? rnd() * 1e-42f : rnd() * 30;
            }
        quant_act_fp8(xq, xs, x, n, cols);
        for (int t = 0; t < n; t++)
            for (int g = 0; g < ng; g++) {
                int c0 = g * 128, c1 = c0 + 128 < cols ? c0 + 128 : cols;
                float amax = 0;
                for (int c = c0; c < c1; c++) amax = fmaxf(amax, fabsf(x[(size_t)t * cols + c]));
                float sc = amax > 0 ? amax / 448.0f : 1.0f;
                bad += memcmp(&sc, &xs[(size_t)t * ng + g], sizeof sc) != 0;
                for (int c = c0; c < c1; c++) {
                    float e = quant_e4m3_to_f32(quant_f32_to_e4m3(x[(size_t)t * cols + c] / sc));
                    if (memcmp(&e, &xq[(size_t)t * cols + c], sizeof e)) {
                        if (!bad)
                            fprintf(stderr, "act fp8 %s cols %d: x[%d][%d] = %a -> %a, reference %a\n", quant_path_name(p),
                                    cols, t, c, x[(size_t)t * cols + c], xq[(size_t)t * cols + c], e);
                        bad++;
                    }
                }
            }
        free(x); free(xq); free(xs);
    }
    T_ASSERT(bad == 0, "act fp8 %s: %d values or scales differ from quant_f32_to_e4m3", quant_path_name(p), bad);
}

/* Every FP8 path this machine runs, selected as the backend does (with the CPU path). */
static void check_fp8_paths(void) {
    /* rows around the 8/4/2-row blocks; cols: below one step, tails inside a
     * group and after whole groups, group remainders, and one past the panel
     * (33000 > 32768: in place whatever the token count). */
    static const int shapes[][2] = {{37, 8}, {9, 16}, {19, 200}, {13, 1003}, {33, 384}, {4, 1024}, {3, 33000}};
    static const int ns[] = {1, 2, 3, 4, 5, 7, 13};
    CpuPath def = cpu_ops_path();
    int ran = 0;
    for (int cp = 0; cp < CPU_PATH_COUNT; cp++) {
        if (cpu_ops_force_path((CpuPath)cp)) continue;
        QuantPath p = quant_path();
        T_ASSERT(cp == CPU_PATH_PORTABLE ? p == QUANT_PATH_PORTABLE : p != QUANT_PATH_PORTABLE,
                 "cpu path %s runs fp8 path %s", cpu_ops_path_name((CpuPath)cp), quant_path_name(p));
        T_ASSERT(strcmp(quant_path_name(p), cpu_ops_path_name((CpuPath)cp)) == 0 || !quant_path_available((QuantPath)cp),
                 "cpu path %s runs fp8 path %s", cpu_ops_path_name((CpuPath)cp), quant_path_name(p));
        g_fp8_bad_path = 0;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
                int rows = shapes[s][0], cols = shapes[s][1], n = ns[i];
                if (cols > 4096 && n > 5) continue;
                for (int lay = 0; lay < 3; lay++)
                    for (int with_xs = 0; with_xs < 2; with_xs++) /* decode (n = 1): both; else alternating */
                        if (n == 1 || with_xs == (int)((i + lay) & 1))
                            check_fp8_shape(p, rows, cols, n, (QuantFp8Layout)lay, with_xs, lay == 1 ? 5 : 32);
            }
        g_fp8_edges = 1;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int n = 1; n <= 2; n++)
                for (int lay = 0; lay < 3; lay++) check_fp8_shape(p, shapes[s][0], shapes[s][1], n, (QuantFp8Layout)lay, 1, 32);
        g_fp8_edges = 0;
        check_act_fp8(p);
        printf("fp8 path %s: checked\n", quant_path_name(p));
        ran++;
    }
    T_ASSERT(ran >= 1, "at least one fp8 path ran");
    cpu_ops_force_path(def);
}

/* Logits of a fixed batch on the path in use: all prefill rows of two
 * sequences, then two decode steps. Returns a malloc'd [n_rows, vocab]. */
static float *forward_logits(const char *dir, const LoadOptions *lo, int *n_floats) {
    Err err = {0};
    Model *m = NULL;
    if (model_load_opts(&m, dir, lo, &err)) {
        T_ASSERT(0, "load %s: %s", dir, err.msg);
        return NULL;
    }
    enum { P = 37, BS = 16 };
    int V = m->cfg.vocab;
    Runner *r = runner_create(m, 2 * P, 64, 2);
    KVCache *kv = kvcache_create(&m->cfg, 8, BS);
    int32_t bt0[4] = {5, 2, 7, 0}, bt1[4] = {1, 6, 3, 4};
    const int32_t *tables[2] = {bt0, bt1};
    int32_t tok[2 * P], pos[2 * P], seq[2 * P], rows[2 * P];
    for (int i = 0; i < 2 * P; i++) {
        tok[i] = (i * 7919 + 13) % V;
        pos[i] = i % P;
        seq[i] = i / P;
        rows[i] = i;
    }
    float *lg = malloc(sizeof(float) * (size_t)(2 * P + 4) * V);
    Batch b = {2 * P, tok, pos, seq, 2, tables, 2 * P, rows, 0};
    T_ASSERT(model_forward(r, kv, &b, lg, &err) == 0, "prefill %s: %s", dir, err.msg);
    for (int s = 0; s < 2; s++) {
        int32_t t2[2] = {s + 5, s + 9}, p2[2] = {P + s, P + s}, q2[2] = {0, 1}, r2[2] = {0, 1};
        Batch d = {2, t2, p2, q2, 2, tables, 2, r2, 0};
        T_ASSERT(model_forward(r, kv, &d, lg + (size_t)(2 * P + 2 * s) * V, &err) == 0, "decode %s: %s", dir, err.msg);
    }
    *n_floats = (2 * P + 4) * V;
    kvcache_free(kv);
    runner_free(r);
    model_free(m);
    return lg;
}

static void check_forward_paths(void) {
    /* BF16 fixtures, then FP8: quantized at load (activations quantized, the
     * default, and weight-only) and a pre-quantized checkpoint. */
    static const struct { const char *dir; Precision prec; int weight_only; } fx[] = {
        {"tests/fixtures/qwen3_gqa2", PREC_BF16, 0}, {"tests/fixtures/llama31", PREC_BF16, 0},
        {"tests/fixtures/qwen3_moe", PREC_BF16, 0},  {"tests/fixtures/qwen3_gqa2", PREC_FP8, 0},
        {"tests/fixtures/qwen3_moe", PREC_FP8, 1},   {"tests/fixtures/llama31_fp8", PREC_FP8, 0},
        {"tests/fixtures/llama31_fp8", PREC_FP8, 1}};
    CpuPath def = cpu_ops_path();
    for (size_t i = 0; i < sizeof fx / sizeof fx[0]; i++) {
        LoadOptions lo = {fx[i].prec, fx[i].weight_only, 0};
        cpu_ops_force_path(CPU_PATH_PORTABLE);
        int n0 = 0, n = 0;
        float *ref = forward_logits(fx[i].dir, &lo, &n0);
        for (int p = CPU_PATH_PORTABLE + 1; ref && p < CPU_PATH_COUNT; p++) {
            if (cpu_ops_force_path((CpuPath)p)) continue;
            float *got = forward_logits(fx[i].dir, &lo, &n);
            T_ASSERT(got && n == n0 && !memcmp(ref, got, sizeof(float) * (size_t)n0),
                     "%s (%s%s): logits on path %s differ from the portable path", fx[i].dir,
                     precision_name(fx[i].prec), fx[i].weight_only ? ", weight-only" : "",
                     cpu_ops_path_name((CpuPath)p));
            free(got);
        }
        free(ref);
    }
    cpu_ops_force_path(def);
}

/* cpu_expf (cpu_ops.h) against double exp: every 97th float of [-87, 88]
 * (about 21M values across the whole range of exponents), within 2 ulp of the
 * float nearest to exp; and its clamps. */
static void check_expf_accuracy(void) {
    double worst = 0;
    float worst_x = 0;
    uint32_t lim[2] = {0x42b00000u /* 88 */, 0xc2ae0000u /* -87 */};
    for (int sgn = 0; sgn < 2; sgn++)
        for (uint32_t u = sgn ? 0x80000000u : 0; u <= lim[sgn]; u += 97) {
            float x;
            memcpy(&x, &u, 4);
            double e = exp((double)x);
            float f = cpu_expf(x), ef = (float)e;
            double ulp = nextafterf(ef, INFINITY) - ef;
            double err = fabs((double)f - e) / ulp;
            if (err > worst) worst = err, worst_x = x;
        }
    printf("cpu_expf: max error %.3f ulp (at x = %.9g)\n", worst, worst_x);
    T_ASSERT(worst <= 2.0, "cpu_expf within 2 ulp of exp (worst %.3f at %.9g)", worst, worst_x);
    T_ASSERT(cpu_expf(0.f) == 1.0f && cpu_expf(-0.f) == 1.0f, "exp(0) = 1");
    T_ASSERT(cpu_expf(-INFINITY) == 0.f && cpu_expf(-87.01f) == 0.f && cpu_expf(-1e30f) == 0.f, "below -87: 0");
    T_ASSERT(cpu_expf(INFINITY) == INFINITY && cpu_expf(88.01f) == INFINITY, "above 88: +inf");
    T_ASSERT(isnan(cpu_expf(NAN)), "exp(NaN) is NaN");
    T_ASSERT(cpu_expf(-87.f) > 0.f && isnormal(cpu_expf(-87.f)) && isfinite(cpu_expf(88.f)), "the range ends are normal");
}

/* cpu_exp_shift and cpu_swiglu on path p: the bits of the scalar definition
 * for every element, lengths 1..70 (every vector tail), random values across
 * the clamps, infinities and NaNs. */
static void check_exp_ops(CpuPath p) {
    enum { N = 70 };
    float in[N], s[N], g[N], u[N], o[N];
    int bad_exp = 0, bad_swiglu = 0;
    for (int n = 1; n <= N; n++) {
        for (int i = 0; i < n; i++) {
            in[i] = rnd() * (i % 3 == 0 ? 120.f : 8.f);
            g[i] = rnd() * (i % 4 == 0 ? 100.f : 6.f);
            u[i] = rnd() * 2;
        }
        if (n > 5) in[1] = -INFINITY, in[4] = NAN, g[2] = INFINITY, g[3] = -INFINITY, g[5] = NAN;
        float mx = n % 2 ? 3.5f : -1.25f;
        memcpy(s, in, sizeof(float) * n);
        cpu_exp_shift(s, n, mx);
        cpu_swiglu(o, g, u, n);
        for (int i = 0; i < n; i++) {
            float e = cpu_expf(in[i] - mx), w = (g[i] / (1.0f + cpu_expf(-g[i]))) * u[i];
            bad_exp += memcmp(&e, &s[i], 4) != 0;
            bad_swiglu += memcmp(&w, &o[i], 4) != 0;
        }
    }
    /* cpu_scale_max / cpu_scale (the softmax's scale, max and normalisation):
     * the products' bits, and the scalar loop's maximum, NaNs skipped; with
     * zeros of both signs as the largest value the maximum is a zero, either sign */
    int bad_max = 0;
    for (int n = 0; n <= N; n++) {
        for (int i = 0; i < n; i++) in[i] = rnd() * (i % 3 == 0 ? 50.f : 3.f);
        if (n > 6 && n % 3 == 0) in[n / 2] = NAN, in[n - 1] = INFINITY * (n % 2 ? 1 : -1);
        if (n > 6 && n % 3 == 1)
            for (int i = 0; i < n; i++) in[i] = i % 5 == 0 ? (i % 2 ? -0.0f : 0.0f) : -fabsf(in[i]) - 1.0f;
        if (n > 6 && n % 3 == 2) for (int i = 0; i < n; i++) in[i] = i == n - 2 ? NAN : -INFINITY;
        float c = n % 2 ? 0.088388f : 1.75f, mx = -INFINITY;
        for (int i = 0; i < n; i++) {
            float v = in[i] * c;
            if (v > mx) mx = v;
        }
        memcpy(s, in, sizeof(float) * (n ? n : 1));
        float got = cpu_scale_max(s, n, c);
        bad_max += !(got == mx || (isnan(got) && isnan(mx))) || (got == 0 && !(mx == 0));
        for (int i = 0; i < n; i++) {
            float v = in[i] * c;
            bad_max += memcmp(&v, &s[i], 4) != 0;
        }
        memcpy(s, in, sizeof(float) * (n ? n : 1));
        cpu_scale(s, n, 1.0f / 3.0f);
        for (int i = 0; i < n; i++) {
            float v = in[i] * (1.0f / 3.0f);
            bad_max += memcmp(&v, &s[i], 4) != 0;
        }
    }
    T_ASSERT(bad_max == 0, "path %s: cpu_scale_max / cpu_scale give the scalar results (%d differ)", cpu_ops_path_name(p), bad_max);
    T_ASSERT(bad_exp == 0, "path %s: cpu_exp_shift gives cpu_expf's bits (%d differ)", cpu_ops_path_name(p), bad_exp);
    T_ASSERT(bad_swiglu == 0, "path %s: cpu_swiglu gives the scalar bits (%d differ)", cpu_ops_path_name(p), bad_swiglu);
}

int main(void) {
    log_set_level(LOG_WARN);
    printf("default path: %s\n", cpu_ops_init());
    CpuPath def = cpu_ops_path();
    T_ASSERT(cpu_ops_path_available(CPU_PATH_PORTABLE), "portable path always available");
    T_ASSERT(cpu_ops_force_path(CPU_PATH_COUNT) == -1, "a path that does not exist is refused");
    T_ASSERT(cpu_ops_path() == def, "a refused force leaves the path unchanged");
    static const int shapes[][2] = {{37, 8}, {64, 1024}, {19, 1003}, {40, 24}, {33, 7}, {16, 5}, {9, 16392}, {40, 12000}};
    static const int ns[] = {1, 2, 3, 4, 5, 6, 7, 8, 13, 61, 130};
    int ran = 0;
    for (int p = 0; p < CPU_PATH_COUNT; p++) {
        if (!cpu_ops_path_available((CpuPath)p)) {
            printf("path %s: not available on this CPU, skipped\n", cpu_ops_path_name((CpuPath)p));
            continue;
        }
        T_ASSERT(cpu_ops_force_path((CpuPath)p) == 0, "force %s", cpu_ops_path_name((CpuPath)p));
        g_bad_path = 0;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
                int rows = shapes[s][0], K = shapes[s][1], n = ns[i];
                if (K > 4096 && n > 8) continue; /* the wide-K case needs few tokens */
                check_shape((CpuPath)p, rows, K, n, 0, (int)(i & 1));
                if (n == 5 || n == 61) check_shape((CpuPath)p, rows, K, n, 11, 0); /* odd task splits */
            }
        check_rows_ops((CpuPath)p);
        check_exp_ops((CpuPath)p);
        printf("path %s: checked\n", cpu_ops_path_name((CpuPath)p));
        ran++;
    }
    T_ASSERT(ran >= 1, "at least one path ran");
    check_expf_accuracy();
    check_fp8_paths();
    check_forward_paths();
    cpu_ops_force_path(def);
    return T_DONE();
}
