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
 * avx2-v0 path also runs the old attention). What it is not: a speed test
 * (bench/bench_matmul.c).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops.h"
#include "dtype.h"
#include "log.h"
#include "model.h"
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
    static const int ns[] = {5, 8, 64, 128, 131, 200, 256};
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
}

/* Logits of a fixed batch on the path in use: all prefill rows of two
 * sequences, then two decode steps. Returns a malloc'd [n_rows, vocab]. */
static float *forward_logits(const char *dir, int *n_floats) {
    Err err = {0};
    Model *m = NULL;
    if (model_load(&m, dir, &err)) {
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
    Batch b = {2 * P, tok, pos, seq, 2, tables, 2 * P, rows};
    T_ASSERT(model_forward(r, kv, &b, lg, &err) == 0, "prefill %s: %s", dir, err.msg);
    for (int s = 0; s < 2; s++) {
        int32_t t2[2] = {s + 5, s + 9}, p2[2] = {P + s, P + s}, q2[2] = {0, 1}, r2[2] = {0, 1};
        Batch d = {2, t2, p2, q2, 2, tables, 2, r2};
        T_ASSERT(model_forward(r, kv, &d, lg + (size_t)(2 * P + 2 * s) * V, &err) == 0, "decode %s: %s", dir, err.msg);
    }
    *n_floats = (2 * P + 4) * V;
    kvcache_free(kv);
    runner_free(r);
    model_free(m);
    return lg;
}

static void check_forward_paths(void) {
    static const char *const fx[] = {"tests/fixtures/qwen3_gqa2", "tests/fixtures/llama31", "tests/fixtures/qwen3_moe"};
    CpuPath def = cpu_ops_path();
    for (size_t i = 0; i < sizeof fx / sizeof fx[0]; i++) {
        cpu_ops_force_path(CPU_PATH_PORTABLE);
        int n0 = 0, n = 0;
        float *ref = forward_logits(fx[i], &n0);
        for (int p = CPU_PATH_PORTABLE + 1; ref && p < CPU_PATH_COUNT; p++) {
            if (cpu_ops_force_path((CpuPath)p)) continue;
            float *got = forward_logits(fx[i], &n);
            T_ASSERT(got && n == n0 && !memcmp(ref, got, sizeof(float) * (size_t)n0),
                     "%s: logits on path %s differ from the portable path", fx[i], cpu_ops_path_name((CpuPath)p));
            free(got);
        }
        free(ref);
    }
    cpu_ops_force_path(def);
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
        printf("path %s: checked\n", cpu_ops_path_name((CpuPath)p));
        ran++;
    }
    T_ASSERT(ran >= 1, "at least one path ran");
    check_forward_paths();
    cpu_ops_force_path(def);
    return T_DONE();
}
