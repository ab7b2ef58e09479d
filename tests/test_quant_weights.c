/*
 * test_quant_weights.c - FP8 (128x128 block, per channel, per tensor) and
 * NVFP4 weight quantization bit-exact against the torch references of
 * scripts/make_quant_goldens.py / scripts/nvfp4_reference.py (Model
 * Optimizer formulas), activation quantization against the same script, and
 * the checkpoint constructors' shape validation.
 */
#include <math.h>

#include "quant.h"
#include "quant_golden.h"
#include "test.h"

static int count_diff(const uint8_t *a, const uint8_t *b, size_t n, size_t *first) {
    int d = 0;
    for (size_t i = n; i-- > 0;)
        if (a[i] != b[i]) { d++; *first = i; }
    return d;
}

static void test_weight_case(const char *name, int rows, int cols) {
    char f[256];
    size_t n = (size_t)rows * cols, first = 0;
    snprintf(f, sizeof f, "w_%s.bf16", name);
    uint16_t *w = qg_read_n(f, n * 2);
    static const char *lay[3] = {"block128", "channel", "tensor"};
    static const QuantFp8Layout lv[3] = {QUANT_FP8_BLOCK128, QUANT_FP8_PER_CHANNEL, QUANT_FP8_PER_TENSOR};
    for (int l = 0; l < 3; l++) {
        Err e = {0};
        QuantFp8 *q = quant_fp8_from_bf16(w, rows, cols, lv[l], &e);
        T_ASSERT(q != NULL, "fp8 %s %s: %s", lay[l], name, e.msg);
        if (!q) continue;
        size_t ns = (size_t)q->scale_rows * q->scale_cols;
        snprintf(f, sizeof f, "fp8_%s_%s.q.u8", lay[l], name);
        uint8_t *gq = qg_read_n(f, n);
        snprintf(f, sizeof f, "fp8_%s_%s.s.f32", lay[l], name);
        float *gs = qg_read_n(f, ns * 4);
        int dq = count_diff(q->q, gq, n, &first);
        T_ASSERT(dq == 0, "fp8 %s %s: %d q bytes differ, first at %zu: 0x%02x vs torch 0x%02x", lay[l], name, dq,
                 first, q->q[first], gq[first]);
        int ds = 0;
        for (size_t i = 0; i < ns; i++) ds += qg_bits(q->scale_inv[i]) != qg_bits(gs[i]);
        T_ASSERT(ds == 0, "fp8 %s %s: %d of %zu scales differ", lay[l], name, ds, ns);
        free(gq); free(gs);
        quant_fp8_free(q);
    }
    Err e = {0};
    QuantNvfp4 *q = quant_nvfp4_from_bf16(w, rows, cols, &e);
    T_ASSERT(q != NULL, "nvfp4 %s: %s", name, e.msg);
    if (q) {
        snprintf(f, sizeof f, "nvfp4_%s.packed.u8", name);
        uint8_t *gp = qg_read_n(f, n / 2);
        snprintf(f, sizeof f, "nvfp4_%s.scale.u8", name);
        uint8_t *gs = qg_read_n(f, n / 16);
        snprintf(f, sizeof f, "nvfp4_%s.scale2.f32", name);
        float *g2 = qg_read_n(f, 4);
        int dp = count_diff(q->packed, gp, n / 2, &first);
        T_ASSERT(dp == 0, "nvfp4 %s: %d packed bytes differ, first at %zu: 0x%02x vs ref 0x%02x", name, dp, first,
                 q->packed[first], gp[first]);
        int ds = count_diff(q->scale, gs, n / 16, &first);
        T_ASSERT(ds == 0, "nvfp4 %s: %d scale bytes differ, first at %zu: 0x%02x vs ref 0x%02x", name, ds, first,
                 q->scale[first], gs[first]);
        T_ASSERT(qg_bits(q->scale2) == qg_bits(g2[0]), "nvfp4 %s: scale2 %a vs ref %a", name, q->scale2, g2[0]);
        free(gp); free(gs); free(g2);
        quant_nvfp4_free(q);
    }
    free(w);
}

static void test_activations(int n, int cols) {
    float *x = qg_read_n("act_x.f32", (size_t)n * cols * 4);
    int ng = quant_fp8_groups(cols);
    uint8_t *gq = qg_read_n("act_fp8.q.u8", (size_t)n * cols);
    float *gs = qg_read_n("act_fp8.s.f32", (size_t)n * ng * 4);
    float *xq = malloc((size_t)n * cols * 4), *xs = malloc((size_t)n * ng * 4), *xg = malloc((size_t)n * 4);
    quant_act_fp8(xq, xs, x, n, cols);
    int d = 0;
    for (int i = 0; i < n * cols; i++) d += qg_bits(xq[i]) != qg_bits(quant_e4m3_to_f32(gq[i]));
    for (int i = 0; i < n * ng; i++) d += qg_bits(xs[i]) != qg_bits(gs[i]);
    T_ASSERT(d == 0, "fp8 activations: %d values differ from torch", d);
    uint8_t *gp = qg_read_n("act_nvfp4.packed.u8", (size_t)n * cols / 2);
    uint8_t *gsc = qg_read_n("act_nvfp4.scale.u8", (size_t)n * cols / 16);
    float *gg = qg_read_n("act_nvfp4.g.f32", (size_t)n * 4);
    quant_act_nvfp4(xq, xg, x, n, cols, 0.0f);
    d = 0;
    for (int t = 0; t < n; t++) d += qg_bits(xg[t]) != qg_bits(gg[t]);
    T_ASSERT(d == 0, "nvfp4 activation global scales: %d differ", d);
    d = 0;
    for (int i = 0; i < n * cols; i++) {
        uint8_t code = (i & 1) ? gp[i / 2] >> 4 : gp[i / 2] & 0xf;
        float want = quant_e2m1_to_f32(code) * quant_e4m3_to_f32(gsc[i / 16]);
        d += qg_bits(xq[i]) != qg_bits(want);
    }
    T_ASSERT(d == 0, "nvfp4 activations: %d values differ from the reference", d);
    /* A static global scale (checkpoint input_scale) clips instead of adapting. */
    quant_act_nvfp4(xq, xg, x, n, cols, 1e-4f);
    T_ASSERT(xg[0] == 1e-4f && xg[n - 1] == 1e-4f, "static scale used");
    float mx = 0;
    for (int i = 0; i < n * cols; i++) mx = fmaxf(mx, fabsf(xq[i]));
    T_ASSERT(mx <= 6.0f * 448.0f, "static-scale activations saturate at 6*448, max %g", mx);
    free(x); free(gq); free(gs); free(xq); free(xs); free(xg); free(gp); free(gsc); free(gg);
}

static void test_errors(void) {
    Err e = {0};
    uint16_t w[4 * 24] = {0};
    T_ASSERT(quant_nvfp4_from_bf16(w, 4, 24, &e) == NULL && e.code == 400, "cols %% 16 != 0 rejected: %s", e.msg);
    T_ASSERT(quant_fp8_from_bf16(w, 0, 24, QUANT_FP8_BLOCK128, &e) == NULL, "empty shape rejected");
    w[5] = 0x7f80; /* +inf */
    T_ASSERT(quant_fp8_from_bf16(w, 4, 24, QUANT_FP8_BLOCK128, &e) == NULL && strstr(e.msg, "non-finite"), "inf rejected: %s", e.msg);
    w[5] = 0;

    /* Qwen3-FP8 style checkpoint buffers. */
    uint8_t q[130 * 260] = {0};
    float s[2 * 3] = {1, 2, 3, 4, 5, 6};
    int64_t wsh[2] = {130, 260}, ssh[2] = {2, 3}, bad[2] = {2, 2};
    QuantFp8 *f = quant_fp8_from_checkpoint(q, DT_F8_E4M3, wsh, 2, s, DT_F32, ssh, 2, &e);
    T_ASSERT(f && f->block_rows == 128 && f->scale_cols == 3 && f->scale_inv[5] == 6 && !f->owns_q,
             "block checkpoint adopted: %s", e.msg);
    if (f) {
        T_ASSERT(quant_fp8_requant(f, (uint16_t *)q, (int64_t[]){0}, 1, &e) < 0 && e.code == 409,
                 "borrowed tensor refuses requant");
        quant_fp8_free(f);
    }
    T_ASSERT(!quant_fp8_from_checkpoint(q, DT_F8_E4M3, wsh, 2, s, DT_F32, bad, 2, &e), "bad scale shape: %s", e.msg);
    T_ASSERT(!quant_fp8_from_checkpoint(q, DT_BF16, wsh, 2, s, DT_F32, ssh, 2, &e), "bad weight dtype: %s", e.msg);
    T_ASSERT(!quant_fp8_from_checkpoint(q, DT_F8_E4M3, wsh, 1, s, DT_F32, ssh, 2, &e), "bad weight ndim");
    T_ASSERT(!quant_fp8_from_checkpoint(q, DT_F8_E4M3, wsh, 2, s, DT_I32, ssh, 2, &e), "bad scale dtype");
    T_ASSERT(!quant_fp8_from_checkpoint(q, DT_F8_E4M3, wsh, 2, NULL, DT_F32, ssh, 2, &e), "missing scale");
    s[1] = NAN;
    T_ASSERT(!quant_fp8_from_checkpoint(q, DT_F8_E4M3, wsh, 2, s, DT_F32, ssh, 2, &e), "NaN scale: %s", e.msg);
    s[1] = 2;
    q[77] = 0x7f;
    T_ASSERT(!quant_fp8_from_checkpoint(q, DT_F8_E4M3, wsh, 2, s, DT_F32, ssh, 2, &e), "NaN weight: %s", e.msg);
    q[77] = 0;
    f = quant_fp8_from_checkpoint(q, DT_F8_E4M3, wsh, 2, s, DT_F32, NULL, 0, &e);
    T_ASSERT(f && f->block_rows == 130 && f->block_cols == 260, "scalar scale = per tensor");
    quant_fp8_free(f);

    /* Model Optimizer NVFP4 checkpoint buffers. */
    uint8_t pk[8 * 16] = {0}, sc[8 * 2];
    memset(sc, 0x38, sizeof sc);
    float s2 = 0.5f, is = 0.25f;
    int64_t psh[2] = {8, 16}, scsh[2] = {8, 2}, one[1] = {1}, badsc[2] = {8, 4};
    QuantNvfp4 *v = quant_nvfp4_from_checkpoint(pk, DT_U8, psh, 2, sc, DT_F8_E4M3, scsh, 2, &s2, DT_F32, NULL, 0,
                                                &is, DT_F32, one, 1, &e);
    T_ASSERT(v && v->cols == 32 && v->scale2 == 0.5f && v->input_scale == 0.25f && isnan(v->amax),
             "nvfp4 checkpoint adopted: %s", e.msg);
    quant_nvfp4_free(v);
    T_ASSERT(!quant_nvfp4_from_checkpoint(pk, DT_U8, psh, 2, sc, DT_F8_E4M3, badsc, 2, &s2, DT_F32, NULL, 0, NULL,
                                          DT_F32, NULL, 0, &e), "bad weight_scale shape: %s", e.msg);
    T_ASSERT(!quant_nvfp4_from_checkpoint(pk, DT_U8, psh, 2, sc, DT_U8, scsh, 2, &s2, DT_F32, NULL, 0, NULL,
                                          DT_F32, NULL, 0, &e), "bad weight_scale dtype");
    T_ASSERT(!quant_nvfp4_from_checkpoint(pk, DT_U8, psh, 2, sc, DT_F8_E4M3, scsh, 2, NULL, DT_F32, NULL, 0, NULL,
                                          DT_F32, NULL, 0, &e), "missing weight_scale_2: %s", e.msg);
    T_ASSERT(!quant_nvfp4_from_checkpoint(pk, DT_U8, psh, 2, sc, DT_F8_E4M3, scsh, 2, &s2, DT_F32, badsc, 2, NULL,
                                          DT_F32, NULL, 0, &e), "non-scalar weight_scale_2");
    int64_t psh_bad[2] = {8, 12}; /* 24 columns: not a multiple of 16 */
    T_ASSERT(!quant_nvfp4_from_checkpoint(pk, DT_U8, psh_bad, 2, sc, DT_F8_E4M3, scsh, 2, &s2, DT_F32, NULL, 0,
                                          NULL, DT_F32, NULL, 0, &e), "cols %% 16: %s", e.msg);
}

int main(void) {
    size_t nb;
    char *txt = qg_read("cases.txt", &nb);
    txt = realloc(txt, nb + 1);
    txt[nb] = 0;
    int ncase = 0;
    for (char *line = strtok(txt, "\n"); line; line = strtok(NULL, "\n")) {
        char name[64];
        int rows, cols;
        if (sscanf(line, "weight %63s %d %d", name, &rows, &cols) == 3) {
            test_weight_case(name, rows, cols);
            ncase++;
        } else if (sscanf(line, "act %d %d", &rows, &cols) == 2) {
            test_activations(rows, cols);
        }
    }
    T_ASSERT(ncase >= 6, "%d weight cases", ncase);
    free(txt);
    test_errors();
    return T_DONE();
}
