/*
 * test_cpu_bf16.c - the BF16-activation matmul (--dtype bfloat16,
 * cpu_matmul_bf16.c) on every CPU path this machine can run, bit for bit
 * against a scalar model of the order cpu_ops.h writes down (written here
 * again, with the flush rules spelled out by classification rather than by
 * the kernels' magnitude test), and batch invariant on each path. Covers:
 * cpu_act_to_bf16 against the definition (every path; a sweep of the f32
 * bit patterns plus zeros, subnormals, infinities, NaNs, the rounding ties);
 * matmul shapes around every tile remainder (rows, tokens, K % 32, K below
 * 32) and task splits; inputs that exercise FTZ / DAZ (subnormal weights,
 * products and sums that cancel into the subnormal range); whole forward
 * passes of a dense and a MoE fixture with BF16 activations, equal bits on
 * every path; and that the f32-activation default is untouched by it.
 * What it is not: a comparison with transformers (test_forward.c) or a speed
 * test (bench/bench_matmul.c).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops.h"
#include "dtype.h"
#include "log.h"
#include "model.h"
#include "test.h"

static uint32_t g_rng = 777;
static uint32_t rnd_u32(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 17;
    g_rng ^= g_rng << 5;
    return g_rng;
}
static float rnd(void) { return (float)(rnd_u32() >> 8) / 8388608.0f - 1.0f; }

/* ---- the scalar model ---- */

static float flush(float v) { return fpclassify(v) == FP_SUBNORMAL ? copysignf(0.0f, v) : v; }
static float in_bf16(uint16_t h) { return flush(bf16_to_f32(h)); }

static uint16_t model_round(float f) {
    if (fpclassify(f) == FP_SUBNORMAL || f == 0.0f) return signbit(f) ? 0x8000 : 0;
    if (isnan(f)) {
        uint32_t u;
        memcpy(&u, &f, 4);
        return (uint16_t)((u >> 16) | 0x40);
    }
    /* to nearest, ties to even, through double: f's 24 bits, keep 8 */
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t lo = u & 0xffff, hi = u >> 16;
    if (lo > 0x8000 || (lo == 0x8000 && (hi & 1))) hi++;
    return (uint16_t)hi;
}

static float model_dot(const uint16_t *w, const uint16_t *x, int K) {
    float a[16] = {0};
    int K32 = K / 32 * 32;
    for (int k = 0; k < K32; k += 32)
        for (int j = 0; j < 16; j++) {
            a[j] = flush(fmaf(in_bf16(w[k + 2 * j + 1]), in_bf16(x[k + 2 * j + 1]), a[j]));
            a[j] = flush(fmaf(in_bf16(w[k + 2 * j]), in_bf16(x[k + 2 * j]), a[j]));
        }
    float v[8];
    for (int j = 0; j < 8; j++) v[j] = flush(a[j] + a[j + 8]);
    float l = flush(flush(v[0] + v[4]) + flush(v[2] + v[6])), r = flush(flush(v[1] + v[5]) + flush(v[3] + v[7]));
    float s = flush(l + r);
    for (int k = K32; k < K; k++) s = flush(fmaf(in_bf16(w[k]), in_bf16(x[k]), s));
    return s;
}

/* ---- cpu_act_to_bf16 ---- */

static void check_rounding(CpuPath p) {
    enum { N = 4099 }; /* not a multiple of any vector width */
    static float src[N];
    static uint16_t got[N];
    int bad = 0;
    for (uint64_t base = 0; base < (1ull << 32); base += (1ull << 32) / 64) {
        for (int i = 0; i < N; i++) {
            uint32_t u = (uint32_t)(base + (uint64_t)rnd_u32() % ((1ull << 32) / 64));
            if (i % 11 == 0) u = (u & 0xffff0000u) | 0x8000u; /* exact ties */
            if (i % 13 == 0) u &= 0x807fffffu;                /* zero / subnormal */
            memcpy(&src[i], &u, 4);
        }
        float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, FLT_MIN, -FLT_MIN, FLT_MAX, -FLT_MAX,
                           FLT_MIN / 2, -FLT_MIN / 3, 3.4e38f, 1.0f + FLT_EPSILON};
        memcpy(src, special, sizeof special);
        cpu_act_to_bf16(got, src, N);
        for (int i = 0; i < N; i++)
            if (got[i] != model_round(src[i])) {
                if (!bad) {
                    uint32_t u;
                    memcpy(&u, &src[i], 4);
                    fprintf(stderr, "%s: round(%08x) = %04x, model %04x\n", cpu_ops_path_name(p), u, got[i],
                            model_round(src[i]));
                }
                bad++;
            }
    }
    T_ASSERT(bad == 0, "%s: %d activations rounded differently from the definition", cpu_ops_path_name(p), bad);
}

/* ---- the matmul ---- */

static void run(float *out, int ldo, const uint16_t *x, int ldx, int n, const WeightMat *w, const uint16_t *bias,
                int split) {
    int tr = split > 0 ? split : cpu_matmul_task_rows(w->cols);
    for (int r0 = 0; r0 < w->rows; r0 += tr)
        cpu_matmul_rows_bf16(out, ldo, x, ldx, n, w, bias, r0, r0 + tr < w->rows ? r0 + tr : w->rows);
}

/* kind 0: magnitudes over a few binades; 1: FTZ / DAZ stress (subnormal
 * weights, tiny products, activations that cancel the weights). */
static void check_shape(CpuPath p, int rows, int K, int n, int split, int with_bias, int kind) {
    int ldx = K + 5, ldo = rows + 3;
    WeightMat w = {.fmt = WF_BF16, .rows = rows, .cols = K};
    w.bf16 = malloc(sizeof(uint16_t) * (size_t)rows * K);
    uint16_t *bias = with_bias ? malloc(sizeof(uint16_t) * (size_t)rows) : NULL;
    uint16_t *x = malloc(sizeof(uint16_t) * (size_t)n * ldx);
    float *out = malloc(sizeof(float) * (size_t)n * ldo), *one = malloc(sizeof(float) * (size_t)ldo);
    /* kind 1: rows r % 3 == 0 hold weights near 2^-70 (against tokens near 2^-60
     * their products and sums land in the subnormal range: FTZ decides the bits),
     * rows r % 3 == 1 two thirds of subnormal weights, the rest near 2^-125 (against tokens near 2^40 DAZ
     * decides: read as zero, or a normal product) */
    for (size_t i = 0; i < (size_t)rows * K; i++) {
        uint16_t v = f32_to_bf16(rnd() * (1 + (int)(i % 7) * 3));
        int r = (int)(i / (size_t)K);
        if (kind == 1 && r % 3 == 0) v = (uint16_t)((v & 0x807f) | ((127 - 72 + rnd_u32() % 5) << 7));
        if (kind == 1 && r % 3 == 1) v = (uint16_t)((v & 0x807f) | (i % 3 ? 0 : (1 + rnd_u32() % 3) << 7));
        w.bf16[i] = v;
    }
    for (int r = 0; bias && r < rows; r++) bias[r] = f32_to_bf16(rnd());
    for (size_t i = 0; i < (size_t)n * ldx; i++) {
        float f = rnd() * (1 + (int)(i % 5) * 11);
        int t = (int)(i / (size_t)ldx);
        if (kind == 1) f = ldexpf(f, t % 2 ? 40 : -60);
        x[i] = model_round(f);
    }
    for (size_t i = 0; i < (size_t)n * ldo; i++) out[i] = NAN;
    run(out, ldo, x, ldx, n, &w, bias, split);
    int bad = 0, pad_ok = 1;
    for (int t = 0; t < n; t++) {
        for (int r = 0; r < rows; r++) {
            float e = model_dot(w.bf16 + (size_t)r * K, x + (size_t)t * ldx, K);
            if (bias) e += bf16_to_f32(bias[r]);
            float g = out[(size_t)t * ldo + r];
            if (memcmp(&e, &g, sizeof e)) {
                if (!bad)
                    fprintf(stderr, "%s rows %d K %d n %d kind %d: out[%d][%d] = %a, model %a\n", cpu_ops_path_name(p),
                            rows, K, n, kind, t, r, g, e);
                bad++;
            }
        }
        for (int r = rows; r < ldo; r++) pad_ok &= isnan(out[(size_t)t * ldo + r]);
    }
    T_ASSERT(bad == 0, "%s rows %d K %d n %d split %d kind %d: %d outputs differ from the reference order",
             cpu_ops_path_name(p), rows, K, n, split, kind, bad);
    T_ASSERT(pad_ok, "%s rows %d K %d n %d: wrote past the rows", cpu_ops_path_name(p), rows, K, n);
    int inv = 1;
    for (int t = 0; t < n; t += (n > 8 ? 7 : 1)) {
        run(one, ldo, x + (size_t)t * ldx, ldx, 1, &w, bias, 16);
        inv &= !memcmp(one, out + (size_t)t * ldo, sizeof(float) * (size_t)rows);
    }
    T_ASSERT(inv, "%s rows %d K %d n %d: a token's outputs depend on its batch", cpu_ops_path_name(p), rows, K, n);
    free(w.bf16);
    free(bias);
    free(x);
    free(out);
    free(one);
}

/* ---- forward passes ---- */

static float *forward_logits(const char *dir, int act_bf16, int *n_floats) {
    Err err = {0};
    Model *m = NULL;
    if (model_load(&m, dir, &err)) {
        T_ASSERT(0, "load %s: %s", dir, err.msg);
        return NULL;
    }
    enum { P = 37, BS = 16 };
    int V = m->cfg.vocab;
    Runner *r = runner_create(m, 2 * P, 64, 2);
    T_ASSERT(runner_set_act_bf16(r, act_bf16) == 0, "CPU runner takes --dtype");
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
    float *lg = malloc(sizeof(float) * (size_t)(2 * P + 2) * V);
    Batch b = {2 * P, tok, pos, seq, 2, tables, 2 * P, rows, 0};
    T_ASSERT(model_forward(r, kv, &b, lg, &err) == 0, "prefill %s: %s", dir, err.msg);
    int32_t t2[2] = {5, 9}, p2[2] = {P, P}, q2[2] = {0, 1}, r2[2] = {0, 1};
    Batch d = {2, t2, p2, q2, 2, tables, 2, r2, 0};
    T_ASSERT(model_forward(r, kv, &d, lg + (size_t)(2 * P) * V, &err) == 0, "decode %s: %s", dir, err.msg);
    /* batch invariance across the backend's task shapes: the 74-token prefill splits its matmuls by
     * tokens too (PREFILL_TASK_MIN), the second sequence alone (37 tokens) by rows only */
    float *alone = malloc(sizeof(float) * (size_t)P * V);
    int32_t bt2[4] = {2, 0, 1, 3};
    const int32_t *tables2[1] = {bt2};
    int32_t zero[P];
    memset(zero, 0, sizeof zero);
    Batch b2 = {P, tok + P, pos + P, zero, 1, tables2, P, rows, 0};
    T_ASSERT(model_forward(r, kv, &b2, alone, &err) == 0, "prefill alone %s: %s", dir, err.msg);
    T_ASSERT(!memcmp(alone, lg + (size_t)P * V, sizeof(float) * (size_t)P * V),
             "%s: a sequence's logits depend on the prefill it shares", dir);
    free(alone);
    *n_floats = (2 * P + 2) * V;
    kvcache_free(kv);
    runner_free(r);
    model_free(m);
    return lg;
}

static void check_forward_paths(void) {
    static const char *const dirs[] = {"tests/fixtures/qwen3_gqa2", "tests/fixtures/qwen3_moe",
                                       "tests/fixtures/qwen2"};
    CpuPath def = cpu_ops_path();
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        cpu_ops_force_path(CPU_PATH_PORTABLE);
        int n0 = 0, n = 0, nf = 0;
        float *ref = forward_logits(dirs[i], 1, &n0);
        float *f32 = forward_logits(dirs[i], 0, &nf);
        /* the mode is real: BF16 activations move the logits (by ~1e-2, test_forward.c) */
        T_ASSERT(ref && f32 && nf == n0 && memcmp(ref, f32, sizeof(float) * (size_t)n0), "%s: --dtype changes nothing",
                 dirs[i]);
        for (int p = CPU_PATH_PORTABLE + 1; ref && p < CPU_PATH_COUNT; p++) {
            if (cpu_ops_force_path((CpuPath)p)) continue;
            float *got = forward_logits(dirs[i], 1, &n);
            T_ASSERT(got && n == n0 && !memcmp(ref, got, sizeof(float) * (size_t)n0),
                     "%s: BF16-activation logits on path %s differ from the portable path", dirs[i],
                     cpu_ops_path_name((CpuPath)p));
            free(got);
        }
        free(ref);
        free(f32);
    }
    cpu_ops_force_path(def);
}

int main(void) {
    log_set_level(LOG_WARN);
    printf("default path: %s, vdpbf16ps %s\n", cpu_ops_init(), cpu_ops_bf16_native() ? "native" : "emulated");
    static const int shapes[][2] = {{37, 32}, {64, 1024}, {19, 1003}, {40, 96}, {33, 7}, {9, 31}, {16, 33}, {9, 16392}};
    static const int ns[] = {1, 2, 3, 4, 5, 6, 7, 13, 48, 49, 61, 100};
    int ran = 0;
    for (int p = 0; p < CPU_PATH_COUNT; p++) {
        if (!cpu_ops_path_available((CpuPath)p)) {
            printf("path %s: not available on this CPU, skipped\n", cpu_ops_path_name((CpuPath)p));
            continue;
        }
        T_ASSERT(cpu_ops_force_path((CpuPath)p) == 0, "force %s", cpu_ops_path_name((CpuPath)p));
        check_rounding((CpuPath)p);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
                int rows = shapes[s][0], K = shapes[s][1], n = ns[i];
                if (K > 4096 && n > 8) continue;
                check_shape((CpuPath)p, rows, K, n, 0, (int)(i & 1), (int)(s & 1));
                if (n == 5 || n == 61) check_shape((CpuPath)p, rows, K, n, 11, 0, 1 - (int)(s & 1));
            }
        printf("path %s%s: checked\n", cpu_ops_path_name((CpuPath)p),
               p == CPU_PATH_AVX512 && cpu_ops_bf16_native() ? " (vdpbf16ps)" : "");
        ran++;
    }
    T_ASSERT(ran >= 1, "at least one path ran");
    check_forward_paths();
    return T_DONE();
}
