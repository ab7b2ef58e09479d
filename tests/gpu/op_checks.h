/*
 * op_checks.h - the op checks of the CUDA backend against the CPU backend (the
 * reference ops), ONE table for both places that run them:
 *   tests/gpu/gpu_check.c (C, a real GPU: every row) and
 *   tests/gpu/emu/emu_check.cpp (C++, the CPU emulation of tests/gpu/emu/shim:
 *   the rows not marked OC_GPU; every emulated CUDA thread is a fiber, so big
 *   shapes stay on the GPU).
 * Each check builds fresh random inputs, runs the op on the CPU backend (bc)
 * and on the CUDA backend (bg, device-resident weights: every pointer handed to
 * it is a device pointer) or its launcher, with GPU outputs poisoned with NaN
 * so an unwritten element fails, and compares with a tolerance class:
 *   exact   copies (embed, gather_rows, kv_write at every KV dtype and
 *           rope_kv_write's V rows, unwritten rows and padded slots, add,
 *           add_bias, f32_to_bf16 against dtype.h): bitwise equal
 *   f32     f32 math in another order / libm (rmsnorm, norm_rope, swiglu,
 *           scale_add_rows, attention, the GEMVs, and the cuBLAS GEMM fed the
 *           same bf16-rounded activations as the CPU): NMSE <= 1e-10 and
 *           max|d| / max|ref| <= 3e-5
 *   bf16act the cuBLAS GEMM against f32 activations (rounding x to bf16 costs
 *           ~1e-3 relative per element): NMSE <= 3e-5, rel <= 1e-2
 *   bf16kv / fp8kv rope_kv_write's K rows decoded: the rotation in another f32
 *           order may move one element's bf16 / e4m3 rounding by a step
 *           (2^-8 / 2^-3 relative): NMSE <= 1e-6 / 1e-4, rel <= 1e-2 / 0.13
 *   attn_bf16 tensor-core attention (attention_mma.cu) against the f32 CPU
 *           attention: Q and the softmax weights P are rounded to bf16 (2^-9
 *           relative each) for the mma; the errors are independent per
 *           element and average over head_dim / positions, ~1e-3 relative
 *           per output at worst: NMSE <= 1e-5, rel <= 1e-2
 * A new GPU kernel adds its check function and its rows here, nothing in the
 * two runners. The includer defines nothing of this; it creates bc and bg and
 * calls op_checks_run. Not here: the fixture models and the benchmark (the
 * runners' own parts).
 */
#ifndef SAMPLER_OP_CHECKS_H
#define SAMPLER_OP_CHECKS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_native.h" /* cuda_quant_act_fp8: the native MoE rows */
#ifdef __cplusplus
extern "C" {
#endif
#include "backend.h"
#include "dtype.h"
#include "kv_cpu.h"
#include "quant.h"
#ifdef __cplusplus
}
#endif

static int n_pass, n_fail;

/* ---- random inputs ---- */
static uint64_t rng_state = 0x853c49e6748fea9bull;
static uint64_t rng_u64(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float rng_f(void) { return (float)(rng_u64() >> 40) * (1.0f / 8388608.0f) - 1.0f; } /* [-1, 1) */
static float *rand_f32(size_t n, float scale) {
    float *p = (float *)xmalloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) p[i] = scale * rng_f();
    return p;
}
static uint16_t *rand_bf16(size_t n, float mean, float scale) {
    uint16_t *p = (uint16_t *)xmalloc(sizeof(uint16_t) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) p[i] = f32_to_bf16(mean + scale * rng_f());
    return p;
}

/* ---- device buffers ---- */
static void *dev_copy(const void *h, size_t bytes) {
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, bytes ? bytes : 1));
    if (bytes) CUDA_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaDeviceSynchronize()); /* the backend's stream does not wait for the legacy stream */
    return d;
}
static void *dev_poisoned(size_t bytes) {
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, bytes ? bytes : 1));
    CUDA_CHECK(cudaMemset(d, 0xff, bytes)); /* 0xffffffff is a NaN */
    CUDA_CHECK(cudaDeviceSynchronize());
    return d;
}
/* An NVFP4 matrix's tensor scale in device memory (WeightMat.dev_s2, where the kernels read it):
 * a slot of a ring of 1024 kept for the process, so the checks free nothing; a check holding
 * more live NVFP4 matrices than that would read a later one's scale and fail loudly. */
static void *dev_scale2(const QuantNvfp4 *q) {
    static float *ring;
    static int next;
    if (!ring) CUDA_CHECK(cudaMalloc((void **)&ring, 1024 * sizeof(float)));
    float *d = ring + next++ % 1024;
    CUDA_CHECK(cudaMemcpy(d, &q->scale2, sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaDeviceSynchronize());
    return d;
}
static float *dev_result(const void *d, size_t n) {
    CUDA_CHECK(cudaDeviceSynchronize());
    float *h = (float *)xmalloc(sizeof(float) * (n ? n : 1));
    if (n) CUDA_CHECK(cudaMemcpy(h, d, sizeof(float) * n, cudaMemcpyDeviceToHost));
    return h;
}

/* ---- comparison ---- */
typedef struct Tol { const char *name; double nmse, rel; } Tol;
static const Tol TOL_EXACT = {"exact", 0, 0}, TOL_F32 = {"f32", 1e-10, 3e-5}, TOL_BF16ACT = {"bf16act", 3e-5, 1e-2},
                 TOL_ATTN_BF16 = {"attn_bf16", 1e-5, 1e-2}, TOL_BF16KV = {"bf16kv", 1e-6, 1e-2},
                 TOL_FP8KV = {"fp8kv", 1e-4, 0.13}, TOL_NATIVE = {"native", 1e-6, 1e-2}, /* op_checks_native.h */
                 TOL_BF16FLIP = {"bf16flip", 1e-8, 1e-3}; /* check_moe: see there */

static void compare_op(const char *what, Tol tol, const float *ref, const float *got, size_t n) {
    double se = 0, sr = 0, maxd = 0, maxr = 0;
    size_t bad = 0, diff = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) && !isnan(ref[i])) { bad++; continue; }
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= 0)) diff++; /* NaN-safe: counts NaN vs number and any difference */
        se += d * d;
        sr += (double)ref[i] * ref[i];
        maxd = d > maxd ? d : maxd;
        maxr = fabs(ref[i]) > maxr ? fabs(ref[i]) : maxr;
    }
    double nmse = sr > 0 ? se / sr : se, rel = maxr > 0 ? maxd / maxr : maxd;
    int ok = bad == 0 && (tol.nmse == 0 ? diff == 0 : (nmse <= tol.nmse && rel <= tol.rel));
    ok ? n_pass++ : n_fail++;
    printf("  %-4s %-60s %-7s nmse %.2e rel %.2e unwritten %zu\n", ok ? "ok" : "FAIL", what, tol.name, nmse, rel,
           bad);
}

/* Bytes equal, for caches and codes whose elements are not f32 (bf16, e4m3, e2m1 codes, scales);
 * also used by op_checks_native.h. */
static void compare_bytes(const char *what, const void *ref, const void *got, size_t n) {
    const uint8_t *a = (const uint8_t *)ref, *b = (const uint8_t *)got;
    size_t diff = 0, first = n;
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) {
            if (!diff) first = i;
            diff++;
        }
    diff ? n_fail++ : n_pass++;
    printf("  %-4s %-60s bytes   %zu of %zu differ", diff ? "FAIL" : "ok", what, diff, n);
    if (diff) printf(" (first at %zu: 0x%02x vs 0x%02x)", first, a[first], b[first]);
    printf("\n");
}

static Backend *bc, *bg; /* CPU reference; CUDA with device-resident weights (the includer creates both) */

/* ---- the checks; a: the row's arguments, named at the top of each ---- */

static void check_embed(const int *a) {
    int vocab = a[0], dim = a[1], n = a[2];
    uint16_t *emb = rand_bf16((size_t)vocab * dim, 0, 1);
    int32_t *tok = (int32_t *)xmalloc(sizeof(int32_t) * n);
    for (int i = 0; i < n; i++) tok[i] = (int32_t)(rng_u64() % (uint64_t)vocab);
    float *ref = (float *)xmalloc(sizeof(float) * (size_t)n * dim);
    bc->embed(bc, ref, emb, tok, n, dim);
    uint16_t *demb = (uint16_t *)dev_copy(emb, sizeof(uint16_t) * (size_t)vocab * dim);
    int32_t *dtok = (int32_t *)dev_copy(tok, sizeof(int32_t) * n);
    float *dout = (float *)dev_poisoned(sizeof(float) * (size_t)n * dim);
    bg->embed(bg, dout, demb, dtok, n, dim);
    float *got = dev_result(dout, (size_t)n * dim);
    char what[96];
    snprintf(what, sizeof what, "embed vocab %d dim %d n %d", vocab, dim, n);
    compare_op(what, TOL_EXACT, ref, got, (size_t)n * dim);
    cudaFree(demb); cudaFree(dtok); cudaFree(dout);
    free(emb); free(tok); free(ref); free(got);
}

static void check_rmsnorm(const int *a) {
    int n = a[0], dim = a[1], in_place = a[2];
    float *x = rand_f32((size_t)n * dim, 3), *ref = (float *)xmalloc(sizeof(float) * (size_t)n * dim);
    uint16_t *w = rand_bf16(dim, 1, 0.5f);
    bc->rmsnorm(bc, ref, x, w, n, dim, 1e-6f);
    float *dx = (float *)dev_copy(x, sizeof(float) * (size_t)n * dim);
    float *dout = in_place ? dx : (float *)dev_poisoned(sizeof(float) * (size_t)n * dim);
    uint16_t *dw = (uint16_t *)dev_copy(w, sizeof(uint16_t) * dim);
    bg->rmsnorm(bg, dout, dx, dw, n, dim, 1e-6f);
    float *got = dev_result(dout, (size_t)n * dim);
    char what[96];
    snprintf(what, sizeof what, "rmsnorm n %d dim %d%s", n, dim, in_place ? " in place" : "");
    compare_op(what, TOL_F32, ref, got, (size_t)n * dim);
    if (!in_place) cudaFree(dout);
    cudaFree(dx); cudaFree(dw);
    free(x); free(ref); free(w); free(got);
}

/* The residual add fused with the next norm against cpu add then rmsnorm: the
 * updated residual bitwise, the normed output in the f32 class. */
static void check_add_rmsnorm(const int *a) {
    int n = a[0], dim = a[1];
    size_t N = (size_t)n * dim;
    float *x = rand_f32(N, 3), *y = rand_f32(N, 3), *ref = (float *)xmalloc(sizeof(float) * N);
    uint16_t *w = rand_bf16(dim, 1, 0.5f);
    float *dx = (float *)dev_copy(x, sizeof(float) * N), *dy = (float *)dev_copy(y, sizeof(float) * N);
    float *dout = (float *)dev_poisoned(sizeof(float) * N);
    uint16_t *dw = (uint16_t *)dev_copy(w, sizeof(uint16_t) * dim);
    bc->add(bc, x, y, (int)N);
    bc->rmsnorm(bc, ref, x, w, n, dim, 1e-6f);
    bg->add_rmsnorm(bg, dout, dx, dy, dw, n, dim, 1e-6f);
    float *got = dev_result(dout, N), *gx = dev_result(dx, N);
    char what[96];
    snprintf(what, sizeof what, "add_rmsnorm n %d dim %d: residual", n, dim);
    compare_op(what, TOL_EXACT, x, gx, N);
    snprintf(what, sizeof what, "add_rmsnorm n %d dim %d: normed", n, dim);
    compare_op(what, TOL_F32, ref, got, N);
    cudaFree(dx); cudaFree(dy); cudaFree(dout); cudaFree(dw);
    free(x); free(y); free(ref); free(w); free(got); free(gx);
}

static WeightMat wmat_bf16(int rows, int cols, uint16_t *w) {
    WeightMat m;
    memset(&m, 0, sizeof m);
    m.fmt = WF_BF16;
    m.rows = rows;
    m.cols = cols;
    m.bf16 = w;
    return m;
}

/* One matrix as a model's only tensor (a down_proj, quantizable), for a backend that holds it alone:
 * backend_cuda_create(one_mat_set(&om, &w), ...); om outlives the backend. */
typedef struct OneMat { WeightTensor t; int by_name, by_host; WeightSet ws; } OneMat;
static WeightSet *one_mat_set(OneMat *o, WeightMat *w) {
    memset(o, 0, sizeof *o);
    snprintf(o->t.name, sizeof o->t.name, "model.layers.0.mlp.down_proj.weight");
    o->t.mat = w;
    o->t.ndim = 2;
    o->t.shape[0] = w->rows;
    o->t.shape[1] = w->cols;
    o->t.numel = (int64_t)w->rows * w->cols;
    o->t.quantizable = 1;
    o->ws.t = &o->t;
    o->ws.n = 1;
    o->ws.by_name = &o->by_name;
    o->ws.by_host = &o->by_host;
    return &o->ws;
}

/* A decode GEMV's result got against the same call with its record 0 (tiled): their bits must differ
 * exactly when the tensor-core GEMV should have run (want_differ), so a backend that ignores
 * WeightMat.mma_min_n, either way, fails. */
static void compare_tiled(const char *what, const float *tiled, const float *got, size_t count, int want_differ) {
    int differ = memcmp(tiled, got, sizeof(float) * count) != 0;
    differ == want_differ ? n_pass++ : n_fail++;
    printf("  %-4s %-60s %s the tiled GEMV's bits\n", differ == want_differ ? "ok" : "FAIL", what,
           differ ? "differs from" : "equals");
}

/* BF16 matmul; n selects the GPU path (GEMV up to CUDA_GEMV_MAX_N, else cuBLAS).
 * rounded: feed the CPU the bf16-rounded x the GEMM path uses; misalign: x one
 * float past a 16-byte boundary (the GEMV's scalar path); mma > 0: the matrix's
 * mma_min_n (gemv_mma.cuh from that many tokens; start-up measures it), and the
 * same call with mma_min_n 0 (the tiled GEMV) must give other bits exactly when
 * n >= mma on an aligned x (the record is followed, both ways). */
static void check_matmul(const int *a) {
    int n = a[0], rows = a[1], cols = a[2], bias = a[3], rounded = a[4], misalign = a[5], mma = a[6];
    size_t N = (size_t)n * cols;
    float *x = rand_f32(N, 1), *xr = (float *)xmalloc(sizeof(float) * N);
    for (size_t i = 0; i < N; i++) xr[i] = rounded ? bf16_to_f32(f32_to_bf16(x[i])) : x[i];
    uint16_t *w = rand_bf16((size_t)rows * cols, 0, 0.05f), *b = bias ? rand_bf16(rows, 0, 1) : NULL;
    WeightMat hw = wmat_bf16(rows, cols, w);
    float *ref = (float *)xmalloc(sizeof(float) * (size_t)n * rows);
    bc->matmul(bc, ref, xr, n, &hw, b);
    float *xbuf = (float *)dev_poisoned(sizeof(float) * (N + 1)), *dx = xbuf + (misalign ? 1 : 0);
    CUDA_CHECK(cudaMemcpy(dx, x, sizeof(float) * N, cudaMemcpyHostToDevice));
    float *dout = (float *)dev_poisoned(sizeof(float) * (size_t)n * rows);
    WeightMat dwm = wmat_bf16(rows, cols, (uint16_t *)dev_copy(w, sizeof(uint16_t) * (size_t)rows * cols));
    dwm.dev = dwm.bf16; /* the ops read dev */
    uint16_t *db = bias ? (uint16_t *)dev_copy(b, sizeof(uint16_t) * rows) : NULL;
    dwm.mma_min_n = mma;
    bg->matmul(bg, dout, dx, n, &dwm, db);
    float *got = dev_result(dout, (size_t)n * rows);
    int gemv = n <= CUDA_GEMV_MAX_N;
    char what[160];
    snprintf(what, sizeof what, "matmul %s n %d [%d x %d]%s%s%s", gemv ? n >= 2 && mma >= 2 && n >= mma && !misalign ? "gemv mma" : "gemv" : "cublas", n, rows, cols,
             bias ? " +bias" : "", !gemv && rounded ? " (cpu x->bf16)" : "", misalign ? " misaligned x" : "");
    if (mma) snprintf(what + strlen(what), sizeof what - strlen(what), " (mma_min_n %d)", mma);
    compare_op(what, gemv || rounded ? TOL_F32 : TOL_BF16ACT, ref, got, (size_t)n * rows);
    if (mma && gemv) {
        dwm.mma_min_n = 0;
        bg->matmul(bg, dout, dx, n, &dwm, db);
        float *tiled = dev_result(dout, (size_t)n * rows);
        compare_tiled(what, tiled, got, (size_t)n * rows, n >= mma && !misalign);
        free(tiled);
    }
    cudaFree(xbuf); cudaFree(dout); cudaFree(dwm.bf16); cudaFree(db);
    free(x); free(xr); free(w); free(b); free(ref); free(got);
}

/* check_matmul over n = 1, 2, 3, 8, 9, 64 (both paths; the GEMM path also
 * against the rounded CPU), bias on every other one (shifted by s). */
static void check_matmul_sweep(const int *a) {
    int rows = a[0], cols = a[1], s = a[2];
    const int ns[] = {1, 2, 3, 8, 9, 64};
    for (int i = 0; i < (int)(sizeof ns / sizeof ns[0]); i++) {
        int n = ns[i], bias = (s + i) % 2;
        if (cols == 12288 && n > 9) continue; /* keep the CPU reference quick */
        int r0[6] = {n, rows, cols, bias, 0, 0}, r1[6] = {n, rows, cols, bias, 1, 0};
        check_matmul(r0);
        if (n > CUDA_GEMV_MAX_N) check_matmul(r1);
    }
}

/* Weight-only FP8 (three scale layouts) / NVFP4 GEMV (quant_gemv.cu) against
 * quant_matmul_*_rows(xs = NULL) plus the bias, f32 class: the kernel dequantizes
 * exactly (e4m3/e2m1 times an f32 or e4m3 scale) and sums in f32. n > 8 runs
 * several launches; misalign: x one float past a 16-byte boundary. */
/* A quantized copy of w [rows, cols] bf16 as the CUDA backend reads it (dwm: dev, dev_scale, dev_s2, q),
 * FP8 in layout or NVFP4, with the host quantization kept for the CPU reference (qmat_ref). */
typedef struct QMat {
    WeightMat dwm;
    QuantFp8 dq, *hq8;
    QuantNvfp4 dn, *hq4;
    void *d1, *d2;
} QMat;
static void qmat_make(QMat *m, int nvfp4, QuantFp8Layout layout, const uint16_t *w, int rows, int cols) {
    Err err = {0};
    memset(m, 0, sizeof *m);
    m->dwm = wmat_bf16(rows, cols, NULL);
    m->dwm.fmt = nvfp4 ? WF_NVFP4 : WF_FP8;
    if (nvfp4) {
        QuantNvfp4 *q = m->hq4 = quant_nvfp4_from_bf16(w, rows, cols, &err);
        CHECK(q, "quantize: %s", err.msg);
        m->dn = *q;
        m->dn.packed = (uint8_t *)(m->d1 = dev_copy(q->packed, (size_t)rows * cols / 2));
        m->dn.scale = (uint8_t *)(m->d2 = dev_copy(q->scale, (size_t)rows * cols / QUANT_NVFP4_BLOCK));
        m->dwm.q = &m->dn;
        m->dwm.dev_s2 = dev_scale2(q);
    } else {
        QuantFp8 *q = m->hq8 = quant_fp8_from_bf16(w, rows, cols, layout, &err);
        CHECK(q, "quantize: %s", err.msg);
        m->dq = *q;
        m->dq.q = (uint8_t *)(m->d1 = dev_copy(q->q, (size_t)rows * cols));
        m->dq.scale_inv =
            (float *)(m->d2 = dev_copy(q->scale_inv, sizeof(float) * (size_t)q->scale_rows * q->scale_cols));
        m->dwm.q = &m->dq;
    }
    m->dwm.dev = m->d1;
    m->dwm.dev_scale = m->d2;
}
/* ref [n, rows] = x [n, cols] @ the host quantization^T (quant.h, no bias). */
static void qmat_ref(const QMat *m, float *ref, const float *x, int n) {
    if (m->hq4) quant_matmul_nvfp4_rows(ref, x, NULL, m->hq4, n, 0, m->dwm.rows);
    else quant_matmul_fp8_rows(ref, x, NULL, m->hq8, n, 0, m->dwm.rows);
}
static void qmat_free(QMat *m) {
    cudaFree(m->d1); cudaFree(m->d2);
    if (m->hq4) quant_nvfp4_free(m->hq4);
    if (m->hq8) quant_fp8_free(m->hq8);
}

static void check_qgemv(const int *a) {
    int nvfp4 = a[0], n = a[1], rows = a[2], cols = a[3], bias = a[5], misalign = a[6], mma = a[7];
    QuantFp8Layout layout = (QuantFp8Layout)a[4];
    size_t N = (size_t)n * cols;
    float *x = rand_f32(N, 1), *ref = (float *)xmalloc(sizeof(float) * (size_t)n * rows);
    uint16_t *w = rand_bf16((size_t)rows * cols, 0, 0.05f), *b = bias ? rand_bf16(rows, 0, 1) : NULL;
    QMat qm;
    qmat_make(&qm, nvfp4, layout, w, rows, cols);
    qmat_ref(&qm, ref, x, n);
    WeightMat dwm = qm.dwm;
    if (b)
        for (int t = 0; t < n; t++)
            for (int r = 0; r < rows; r++) ref[(size_t)t * rows + r] += bf16_to_f32(b[r]);
    float *xbuf = (float *)dev_poisoned(sizeof(float) * (N + 1)), *dx = xbuf + (misalign ? 1 : 0);
    CUDA_CHECK(cudaMemcpy(dx, x, sizeof(float) * N, cudaMemcpyHostToDevice));
    float *dout = (float *)dev_poisoned(sizeof(float) * (size_t)n * rows);
    uint16_t *db = bias ? (uint16_t *)dev_copy(b, sizeof(uint16_t) * rows) : NULL;
    if (mma) bg->reserve(bg, CUDA_GEMV_MAX_N, cols); /* the tensor-core FP8 GEMV's split of x */
    dwm.mma_min_n = mma;
    bg->matmul(bg, dout, dx, n, &dwm, db);
    float *got = dev_result(dout, (size_t)n * rows);
    char what[160];
    /* gemv_mma.cuh takes it (the table's FP8 shapes qualify; NVFP4 needs the 16-byte path, cols % 32 == 0) */
    int on_tc = mma && n >= mma && !misalign && (!nvfp4 || cols % 32 == 0);
    snprintf(what, sizeof what, "%s gemv%s n %d [%d x %d]%s%s", nvfp4 ? "nvfp4" : layout == QUANT_FP8_BLOCK128 ? "fp8 block128"
             : layout == QUANT_FP8_PER_CHANNEL ? "fp8 per-channel" : "fp8 per-tensor", on_tc ? " mma" : "", n, rows, cols,
             bias ? " +bias" : "", misalign ? " misaligned x" : "");
    if (mma) snprintf(what + strlen(what), sizeof what - strlen(what), " (mma_min_n %d)", mma);
    compare_op(what, TOL_F32, ref, got, (size_t)n * rows);
    if (mma) { /* the record is followed: other bits than the tiled GEMV's exactly when the tensor cores run */
        dwm.mma_min_n = 0;
        bg->matmul(bg, dout, dx, n, &dwm, db);
        float *tiled = dev_result(dout, (size_t)n * rows);
        compare_tiled(what, tiled, got, (size_t)n * rows, on_tc);
        free(tiled);
    }
    cudaFree(xbuf); cudaFree(dout); cudaFree(db);
    qmat_free(&qm);
    free(x); free(w); free(b); free(ref); free(got);
}

/* The norm's split of x for the FP8 / NVFP4 tensor-core GEMV (rmsnorm.cu, backend_cuda.cu norm_split).
 * kind 0: rmsnorm, 1: add_rmsnorm, 2: rmsnorm in place. Checked:
 *   - the launchers: the norm's split is byte for byte what the GEMV's own split writes, and a GEMV
 *     told x_split = 1 reads the scratch as it is (zeroed: all-zero output), so it really skips;
 *   - the backend, presplit on (backend_cuda_gemv_presplit): the norm then the matmul over its output
 *     give the bits of the same ops with presplit off, and the CPU's in the f32 class;
 *   - the record is dropped when it must be: a matmul over another x of the same shape (which splits
 *     into the same scratch) or an upload into the normed buffer between the norm and the matmul,
 *     each followed by the matmul over the normed buffer, gives that buffer's product, not a stale one. */
static void check_norm_split(const int *a) {
    int nvfp4 = a[0] == 2, n = a[1], rows = a[2], cols = a[3], kind = a[4];
    size_t N = (size_t)n * cols, NO = (size_t)n * rows;
    float *x = rand_f32(N, 3), *y = rand_f32(N, 3), *x2 = rand_f32(N, 1), *xn = (float *)xmalloc(sizeof(float) * N);
    float *ref = (float *)xmalloc(sizeof(float) * NO), *ref2 = (float *)xmalloc(sizeof(float) * NO);
    uint16_t *nw = rand_bf16(cols, 1, 0.5f), *w = rand_bf16((size_t)rows * cols, 0, 0.05f);
    QMat qm;
    qmat_make(&qm, nvfp4, QUANT_FP8_BLOCK128, w, rows, cols);
    memcpy(xn, x, sizeof(float) * N);
    if (kind == 1) bc->add(bc, xn, y, (int)N);
    bc->rmsnorm(bc, xn, xn, nw, n, cols, 1e-6f);
    qmat_ref(&qm, ref, xn, n);
    qmat_ref(&qm, ref2, x2, n);
    float *dx = (float *)dev_copy(x, sizeof(float) * N), *dy = (float *)dev_copy(y, sizeof(float) * N);
    float *dn = kind == 2 ? dx : (float *)dev_poisoned(sizeof(float) * N), *dx2 = (float *)dev_copy(x2, sizeof(float) * N);
    float *dout = (float *)dev_poisoned(sizeof(float) * NO);
    uint16_t *dnw = (uint16_t *)dev_copy(nw, sizeof(uint16_t) * cols);
    size_t sb = cuda_gemv_mma_scratch(n, cols);
    void *s1 = dev_poisoned(sb), *s2 = dev_poisoned(sb);
    char what[160], tag[96];
    snprintf(tag, sizeof tag, "%s [%d x %d] n %d after %s", nvfp4 ? "nvfp4" : "fp8", rows, cols, n,
             kind == 1 ? "add_rmsnorm" : kind == 2 ? "rmsnorm in place" : "rmsnorm");
    /* the launchers */
    int lrc = kind == 1 ? cuda_add_rmsnorm(dn, dx, dy, dnw, n, cols, 1e-6f, s1, NULL)
                        : cuda_rmsnorm(dn, dx, dnw, n, cols, 1e-6f, s1, NULL);
    const QuantFp8 *q8 = &qm.dq;
    int grc = nvfp4 ? cuda_gemv_nvfp4_mma(dout, dn, n, (const uint8_t *)qm.d1, (const uint8_t *)qm.d2,
                                          (const float *)qm.dwm.dev_s2, rows, cols, NULL, s2, 0, NULL)
                    : cuda_gemv_fp8_mma(dout, dn, n, (const uint8_t *)qm.d1, (const float *)qm.d2, rows, cols,
                                        q8->block_rows, q8->block_cols, NULL, s2, 0, NULL);
    CHECK(lrc == 0 && grc == 0, "norm split launchers refused (rc %d, %d)", lrc, grc);
    CUDA_CHECK(cudaDeviceSynchronize());
    uint8_t *h1 = (uint8_t *)xmalloc(sb), *h2 = (uint8_t *)xmalloc(sb);
    CUDA_CHECK(cudaMemcpy(h1, s1, sb, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(h2, s2, sb, cudaMemcpyDeviceToHost));
    snprintf(what, sizeof what, "%s: the norm's split = the GEMV's own", tag);
    compare_bytes(what, h2, h1, sb);
    CUDA_CHECK(cudaMemset(s1, 0, sb));
    grc = nvfp4 ? cuda_gemv_nvfp4_mma(dout, dn, n, (const uint8_t *)qm.d1, (const uint8_t *)qm.d2,
                                      (const float *)qm.dwm.dev_s2, rows, cols, NULL, s1, 1, NULL)
                : cuda_gemv_fp8_mma(dout, dn, n, (const uint8_t *)qm.d1, (const float *)qm.d2, rows, cols,
                                    q8->block_rows, q8->block_cols, NULL, s1, 1, NULL);
    float *zero = (float *)calloc(NO, sizeof(float)), *got = dev_result(dout, NO);
    snprintf(what, sizeof what, "%s: x_split 1 reads a zeroed scratch as it is", tag);
    compare_op(what, TOL_EXACT, zero, got, grc == 0 ? NO : 0);
    if (grc) n_fail++;
    free(got);

    /* the backend: presplit off, then on, then the two ways the record must be dropped */
    WeightMat dwm = qm.dwm;
    dwm.mma_min_n = 1;
    bg->reserve(bg, CUDA_GEMV_MAX_N, cols);
    float *outs[4] = {0};
    for (int mode = 0; mode < 4; mode++) {
        backend_cuda_gemv_presplit(bg, mode ? 1 : 0);
        CUDA_CHECK(cudaMemcpy(dx, x, sizeof(float) * N, cudaMemcpyHostToDevice)); /* the add updated it */
        if (kind == 1) bg->add_rmsnorm(bg, dn, dx, dy, dnw, n, cols, 1e-6f);
        else bg->rmsnorm(bg, dn, dx, dnw, n, cols, 1e-6f);
        if (mode == 2) bg->matmul(bg, dout, dx2, n, &dwm, NULL); /* splits x2 into the same scratch */
        if (mode == 3) bg->upload(bg, dn, x2, sizeof(float) * N);
        bg->matmul(bg, dout, dn, n, &dwm, NULL);
        outs[mode] = dev_result(dout, NO);
    }
    backend_cuda_gemv_presplit(bg, 0);
    snprintf(what, sizeof what, "%s, presplit off, vs cpu", tag);
    compare_op(what, TOL_F32, ref, outs[0], NO);
    snprintf(what, sizeof what, "%s, presplit on = off", tag);
    compare_op(what, TOL_EXACT, outs[0], outs[1], NO);
    snprintf(what, sizeof what, "%s, a matmul over another x between", tag);
    compare_op(what, TOL_EXACT, outs[0], outs[2], NO);
    snprintf(what, sizeof what, "%s, an upload into it between, vs cpu", tag);
    compare_op(what, TOL_F32, ref2, outs[3], NO);
    for (int i = 0; i < 4; i++) free(outs[i]);
    cudaFree(dx); cudaFree(dy); cudaFree(dx2); cudaFree(dout); cudaFree(dnw); cudaFree(s1); cudaFree(s2);
    if (kind != 2) cudaFree(dn);
    qmat_free(&qm);
    free(x); free(y); free(x2); free(xn); free(ref); free(ref2); free(nw); free(w); free(h1); free(h2); free(zero);
}

/* check_qgemv at FP8 block128 and (cols % 16 == 0) NVFP4 over n = 1, 2, 3, 11,
 * 19, bias on every other one (shifted by s), skipping CPU references over 4e8 MACs. */
static void check_qgemv_sweep(const int *a) {
    int rows = a[0], cols = a[1], s = a[2];
    for (int n = 1; n <= 19; n += (n < 3 ? 1 : 8)) {
        int bias = (s + n) % 2;
        if (rows * (double)cols * n > 4e8) continue;
        int f[7] = {0, n, rows, cols, QUANT_FP8_BLOCK128, bias, 0}, v[7] = {1, n, rows, cols, QUANT_FP8_BLOCK128, bias, 0};
        check_qgemv(f);
        if (cols % 16 == 0) check_qgemv(v);
    }
}

/* Several matrices over one x in one launch (matmul_multi: q/k/v, gate/up) against
 * the CPU's matmul of each, f32 class; fmt 0 bf16, 1 fp8 (128x128), 2 nvfp4. */
static void check_matmul_multi(const int *a) {
    int fmt = a[0], n = a[1], count = a[2], cols = a[6], mma = a[7]; /* mma: every matrix's mma_min_n */
    const int *rows = a + 3;
    Err err = {0};
    float *x = rand_f32((size_t)n * cols, 1), *dx = (float *)dev_copy(x, sizeof(float) * (size_t)n * cols);
    float *outs[3], *refs[3];
    WeightMat hw[3], dwm[3];
    const WeightMat *wp[3];
    const uint16_t *db[3];
    QuantFp8 dq[3];
    QuantNvfp4 dn[3];
    void *dev[9] = {0};
    uint16_t *hb[3];
    for (int i = 0; i < count; i++) {
        uint16_t *w = rand_bf16((size_t)rows[i] * cols, 0, 0.05f);
        hb[i] = i == 1 ? rand_bf16(rows[i], 0, 1) : NULL; /* a bias on one of them */
        refs[i] = (float *)xmalloc(sizeof(float) * (size_t)n * rows[i]);
        hw[i] = wmat_bf16(rows[i], cols, w);
        dwm[i] = hw[i];
        if (fmt == 1) {
            QuantFp8 *q = quant_fp8_from_bf16(w, rows[i], cols, QUANT_FP8_BLOCK128, &err);
            CHECK(q, "quantize: %s", err.msg);
            hw[i].fmt = dwm[i].fmt = WF_FP8;
            hw[i].q = q;
            dq[i] = *q;
            dq[i].q = (uint8_t *)(dev[3 * i] = dev_copy(q->q, (size_t)rows[i] * cols));
            dq[i].scale_inv = (float *)(dev[3 * i + 1] = dev_copy(q->scale_inv, sizeof(float) * (size_t)q->scale_rows * q->scale_cols));
            dwm[i].q = &dq[i];
            dwm[i].dev = dev[3 * i];
            dwm[i].dev_scale = dev[3 * i + 1];
        } else if (fmt == 2) {
            QuantNvfp4 *q = quant_nvfp4_from_bf16(w, rows[i], cols, &err);
            CHECK(q, "quantize: %s", err.msg);
            hw[i].fmt = dwm[i].fmt = WF_NVFP4;
            hw[i].q = q;
            dn[i] = *q;
            dn[i].packed = (uint8_t *)(dev[3 * i] = dev_copy(q->packed, (size_t)rows[i] * cols / 2));
            dn[i].scale = (uint8_t *)(dev[3 * i + 1] = dev_copy(q->scale, (size_t)rows[i] * cols / 16));
            dwm[i].q = &dn[i];
            dwm[i].dev = dev[3 * i];
            dwm[i].dev_scale = dev[3 * i + 1];
            dwm[i].dev_s2 = dev_scale2(q);
        } else {
            dwm[i].bf16 = (uint16_t *)(dev[3 * i] = dev_copy(w, sizeof(uint16_t) * (size_t)rows[i] * cols));
            dwm[i].dev = dev[3 * i];
        }
        bc->matmul(bc, refs[i], x, n, &hw[i], hb[i]);
        db[i] = hb[i] ? (const uint16_t *)(dev[3 * i + 2] = dev_copy(hb[i], sizeof(uint16_t) * rows[i])) : NULL;
        outs[i] = (float *)dev_poisoned(sizeof(float) * (size_t)n * rows[i]);
        dwm[i].mma_min_n = mma;
        if (mma) bg->reserve(bg, CUDA_GEMV_MAX_N, cols);
        wp[i] = &dwm[i];
    }
    bg->matmul_multi(bg, outs, dx, n, wp, db, count);
    float *tiled[3] = {NULL, NULL, NULL};
    if (mma) { /* the same launch with every record 0 (the tiled GEMV) into fresh outputs */
        float *outs2[3];
        for (int i = 0; i < count; i++) {
            dwm[i].mma_min_n = 0;
            outs2[i] = (float *)dev_poisoned(sizeof(float) * (size_t)n * rows[i]);
        }
        bg->matmul_multi(bg, outs2, dx, n, wp, db, count);
        for (int i = 0; i < count; i++) {
            tiled[i] = dev_result(outs2[i], (size_t)n * rows[i]);
            cudaFree(outs2[i]);
        }
    }
    for (int i = 0; i < count; i++) {
        float *got = dev_result(outs[i], (size_t)n * rows[i]);
        if (tiled[i]) { /* the fused launch followed the record (every segment on tensor cores) */
            char tw[64];
            snprintf(tw, sizeof tw, "%s matmul_multi %d/%d n %d mma", fmt == 0 ? "bf16" : fmt == 1 ? "fp8" : "nvfp4",
                     i + 1, count, n);
            compare_tiled(tw, tiled[i], got, (size_t)n * rows[i], 1);
            free(tiled[i]);
        }
        char what[96];
        snprintf(what, sizeof what, "%s matmul_multi %d/%d n %d [%d x %d]%s%s", fmt == 0 ? "bf16" : fmt == 1 ? "fp8" : "nvfp4",
                 i + 1, count, n, rows[i], cols, hb[i] ? " +bias" : "", mma ? " mma" : "");
        compare_op(what, TOL_F32, refs[i], got, (size_t)n * rows[i]);
        free(got);
        cudaFree(outs[i]);
        free(refs[i]);
        free(hw[i].bf16);
        free(hb[i]);
        if (fmt == 1) quant_fp8_free((QuantFp8 *)hw[i].q);
        if (fmt == 2) quant_nvfp4_free((QuantNvfp4 *)hw[i].q);
    }
    for (int i = 0; i < 9; i++) cudaFree(dev[i]);
    cudaFree(dx);
    free(x);
}

/* A random [rows, cols] weight in format fmt (0 bf16, 1 fp8 128x128 blocks, 2 nvfp4) of scale sc:
 * hw the host matrix the CPU ops read, dw its device copy (dq / dn: its device quantization
 * block; dev[2]: the device buffers to free). */
static void test_weight(int fmt, int rows, int cols, float sc, WeightMat *hw, WeightMat *dw, QuantFp8 *dq,
                        QuantNvfp4 *dn, void **dev) {
    Err err = {0};
    uint16_t *w = rand_bf16((size_t)rows * cols, 0, sc);
    *hw = wmat_bf16(rows, cols, w);
    *dw = *hw;
    dev[1] = NULL;
    if (fmt == 1) {
        QuantFp8 *q = quant_fp8_from_bf16(w, rows, cols, QUANT_FP8_BLOCK128, &err);
        CHECK(q, "quantize: %s", err.msg);
        hw->fmt = dw->fmt = WF_FP8;
        hw->q = q;
        *dq = *q;
        dq->q = (uint8_t *)(dev[0] = dev_copy(q->q, (size_t)rows * cols));
        dq->scale_inv = (float *)(dev[1] = dev_copy(q->scale_inv, sizeof(float) * (size_t)q->scale_rows * q->scale_cols));
        dw->q = dq;
    } else if (fmt == 2) {
        QuantNvfp4 *q = quant_nvfp4_from_bf16(w, rows, cols, &err);
        CHECK(q, "quantize: %s", err.msg);
        hw->fmt = dw->fmt = WF_NVFP4;
        hw->q = q;
        *dn = *q;
        dn->packed = (uint8_t *)(dev[0] = dev_copy(q->packed, (size_t)rows * cols / 2));
        dn->scale = (uint8_t *)(dev[1] = dev_copy(q->scale, (size_t)rows * cols / 16));
        dw->q = dn;
        dw->dev_s2 = dev_scale2(q);
    } else {
        dw->bf16 = (uint16_t *)(dev[0] = dev_copy(w, sizeof(uint16_t) * (size_t)rows * cols));
    }
    dw->dev = dev[0];
    dw->dev_scale = dev[1];
}

static void test_weight_free(int fmt, WeightMat *hw, void **dev) {
    free(hw->bf16);
    if (fmt == 1) quant_fp8_free((QuantFp8 *)hw->q);
    if (fmt == 2) quant_nvfp4_free((QuantNvfp4 *)hw->q);
    cudaFree(dev[0]);
    cudaFree(dev[1]);
}

/* matmul_swiglu (backend.h; matmul_swiglu.cu at n <= 8, the fallback above) of gate / up [rows,
 * cols] in format fmt against the CPU ops it stands for (matmul gate, matmul up, swiglu: f32
 * class; bf16act for BF16 beyond 8 tokens, cuBLAS), and bitwise against the CUDA backend's own composition (matmul_multi + swiglu: the
 * epilogue uses swiglu's expression on the same sums). */
static void check_matmul_swiglu(const int *a) {
    int fmt = a[0], n = a[1], rows = a[2], cols = a[3], mma = a[4]; /* mma: gate's and up's mma_min_n */
    size_t NX = (size_t)n * cols, NO = (size_t)n * rows;
    float *x = rand_f32(NX, 1), *dx = (float *)dev_copy(x, sizeof(float) * NX);
    WeightMat hg, hu, dg, du;
    QuantFp8 qg, qu;
    QuantNvfp4 ng, nu;
    void *devg[2], *devu[2];
    test_weight(fmt, rows, cols, 0.2f, &hg, &dg, &qg, &ng, devg); /* gate values of a few units: silu's bend */
    test_weight(fmt, rows, cols, 0.05f, &hu, &du, &qu, &nu, devu);
    float *g = (float *)xmalloc(sizeof(float) * NO), *u = (float *)xmalloc(sizeof(float) * NO),
          *ref = (float *)xmalloc(sizeof(float) * NO);
    bc->matmul(bc, g, x, n, &hg, NULL);
    bc->matmul(bc, u, x, n, &hu, NULL);
    bc->swiglu(bc, ref, g, u, (int)NO);
    float *dout = (float *)dev_poisoned(sizeof(float) * NO), *dgs = (float *)dev_poisoned(sizeof(float) * NO),
          *dus = (float *)dev_poisoned(sizeof(float) * NO), *dout2 = (float *)dev_poisoned(sizeof(float) * NO);
    dg.mma_min_n = du.mma_min_n = mma;
    if (mma) bg->reserve(bg, CUDA_GEMV_MAX_N, cols);
    bg->matmul_swiglu(bg, dout, dx, n, &dg, &du, dgs, dus);
    float *outs[2] = {dgs, dus};
    const WeightMat *ws[2] = {&dg, &du};
    const uint16_t *bs[2] = {NULL, NULL};
    float *got = dev_result(dout, NO);
    bg->matmul_multi(bg, outs, dx, n, ws, bs, 2);
    bg->swiglu(bg, dout2, dgs, dus, (int)NO);
    float *got2 = dev_result(dout2, NO);
    char what[128];
    const char *fn = fmt == 0 ? "bf16" : fmt == 1 ? "fp8" : "nvfp4";
    snprintf(what, sizeof what, "%s matmul_swiglu n %d [%d x %d]%s%s", fn, n, rows, cols, n <= CUDA_GEMV_MAX_N ? "" : " (unfused)",
             mma ? " mma" : "");
    compare_op(what, fmt == 0 && n > CUDA_GEMV_MAX_N ? TOL_BF16ACT : TOL_F32, ref, got, NO); /* cuBLAS: bf16 x */
    snprintf(what, sizeof what, "%s matmul_swiglu n %d [%d x %d] = gate/up + swiglu", fn, n, rows, cols);
    compare_bytes(what, got2, got, sizeof(float) * NO);
    test_weight_free(fmt, &hg, devg);
    test_weight_free(fmt, &hu, devu);
    cudaFree(dx); cudaFree(dout); cudaFree(dgs); cudaFree(dus); cudaFree(dout2);
    free(x); free(g); free(u); free(ref); free(got); free(got2);
}

/* matmul_add_rmsnorm (backend.h; matmul_add_norm.cu): the residual projection w [rows, cols] in format
 * fmt of in [n, cols], added into the residual x [n, rows], then the next norm. Against the CPU ops it
 * stands for (matmul, add, rmsnorm: f32 class), and bitwise against the same backend's two ops (matmul
 * into y, add_rmsnorm): x and out, on a second launch too with the blocks run last to first on the
 * emulation (another block norms), one kernel fewer (the emulation counts them). split: the norm's
 * split of out is asked for (presplit on); an NVFP4 tensor-core GEMV over out after each path then
 * reads it without splitting and must give the same bits. mma: w's tensor-core record (FP8 / NVFP4 take
 * that tile, after their own split of in, in the scratch the norm's split then overwrites; the two
 * ops take it too, so a fused op on the other tile fails the bits). n > 1: the fused op refuses
 * (nothing launched, nothing written). */
static void check_matmul_add_rmsnorm(const int *a) {
    int fmt = a[0], n = a[1], rows = a[2], cols = a[3], bias_on = a[4], split = a[5], mma = a[6];
    size_t NX = (size_t)n * rows, NI = (size_t)n * cols;
    float *x = rand_f32(NX, 3), *in = rand_f32(NI, 1), *y = (float *)xmalloc(sizeof(float) * NX);
    float *ref = (float *)xmalloc(sizeof(float) * NX), *xr = (float *)xmalloc(sizeof(float) * NX);
    uint16_t *nw = rand_bf16(rows, 1, 0.5f), *bias = bias_on ? rand_bf16(rows, 0, 0.5f) : NULL;
    WeightMat hw, dw, h2, d2;
    QuantFp8 q8, q28;
    QuantNvfp4 q4, q24;
    void *dev[2], *dev2[2];
    test_weight(fmt, rows, cols, 0.05f, &hw, &dw, &q8, &q4, dev);
    if (split) test_weight(2, 16, rows, 0.05f, &h2, &d2, &q28, &q24, dev2); /* the GEMV after: NVFP4, tensor cores */
    d2.mma_min_n = 1;
    dw.mma_min_n = mma;
    bc->matmul(bc, y, in, n, &hw, bias);
    memcpy(xr, x, sizeof(float) * NX);
    bc->add(bc, xr, y, (int)NX);
    bc->rmsnorm(bc, ref, xr, nw, n, rows, 1e-6f);
    float *din = (float *)dev_copy(in, sizeof(float) * NI), *dx = (float *)dev_copy(x, sizeof(float) * NX);
    float *dout = (float *)dev_poisoned(sizeof(float) * NX), *dy = (float *)dev_poisoned(sizeof(float) * NX);
    float *dnext = (float *)dev_poisoned(sizeof(float) * (size_t)n * 16);
    uint16_t *dnw = (uint16_t *)dev_copy(nw, sizeof(uint16_t) * rows);
    uint16_t *dbias = bias ? (uint16_t *)dev_copy(bias, sizeof(uint16_t) * rows) : NULL;
    bg->reserve(bg, CUDA_GEMV_MAX_N, rows > cols ? rows : cols);
    backend_cuda_gemv_presplit(bg, split ? 1 : 0);
    float *gx[3], *go[3], *gn[3];
    int rc[2] = {0, 0};
    long kern[3] = {-1, -1, -1}, kn[3] = {-1, -1, -1}; /* the emulation counts kernels; a GPU does not */
    for (int run = 0; run < 3; run++) { /* the fused op twice, then the two ops */
        CUDA_CHECK(cudaMemcpy(dx, x, sizeof(float) * NX, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemset(dout, 0xff, sizeof(float) * NX));
        CUDA_CHECK(cudaDeviceSynchronize());
#ifdef CUDA_EMULATION
        long k0 = emu_kernels_run();
        emu_blocks_reverse(run == 1); /* the second launch with another block last */
#endif
        if (run < 2) {
            rc[run] = bg->matmul_add_rmsnorm(bg, dout, dx, din, n, &dw, dbias, dnw, 1e-6f);
        } else {
            bg->matmul(bg, dy, din, n, &dw, dbias);
            bg->add_rmsnorm(bg, dout, dx, dy, dnw, n, rows, 1e-6f);
        }
#ifdef CUDA_EMULATION
        kern[run] = emu_kernels_run() - k0;
        emu_blocks_reverse(0);
        k0 = emu_kernels_run();
#endif
        if (split) bg->matmul(bg, dnext, dout, n, &d2, NULL); /* reads the norm's split of out */
#ifdef CUDA_EMULATION
        kn[run] = emu_kernels_run() - k0;
#endif
        gx[run] = dev_result(dx, NX);
        go[run] = dev_result(dout, NX);
        gn[run] = split ? dev_result(dnext, (size_t)n * 16) : NULL;
    }
    backend_cuda_gemv_presplit(bg, 0);
    const char *fn = fmt == 0 ? "bf16" : fmt == 1 ? "fp8" : "nvfp4";
    char what[160];
    snprintf(what, sizeof what, "%s matmul_add_rmsnorm n %d [%d x %d]%s%s%s", fn, n, rows, cols, bias ? " bias" : "",
             split ? " split" : "", mma ? " mma" : "");
    if (n > 1) { /* refused: nothing launched, nothing written */
        int untouched = !memcmp(gx[0], x, sizeof(float) * NX);
        for (size_t i = 0; i < NX; i++) untouched &= isnan(go[0][i]);
        int ok = rc[0] != 0 && rc[1] != 0 && untouched && kern[0] <= 0;
        printf("  %s %s: refused (more than one token), nothing written\n", ok ? "ok  " : "FAIL", what);
        ok ? n_pass++ : n_fail++;
    } else {
        int same = rc[0] == 0 && rc[1] == 0 && kern[2] - kern[0] == (kern[0] < 0 ? 0 : 1);
        for (int run = 0; run < 2; run++) {
            same &= !memcmp(gx[run], gx[2], sizeof(float) * NX) && !memcmp(go[run], go[2], sizeof(float) * NX);
            if (split) same &= !memcmp(gn[run], gn[2], sizeof(float) * (size_t)n * 16) && kn[run] == kn[2];
        }
        printf("  %s %s: the bits of matmul then add_rmsnorm in x and out%s, on a second launch too (%ld kernels, %ld "
               "without it; -1: not counted on a GPU)\n", same ? "ok  " : "FAIL", what,
               split ? " and the next GEMV's" : "", kern[0], kern[2]);
        same ? n_pass++ : n_fail++;
        char lab[192];
        snprintf(lab, sizeof lab, "%s: residual", what);
        compare_op(lab, TOL_F32, xr, gx[0], NX);
        snprintf(lab, sizeof lab, "%s: normed", what);
        compare_op(lab, TOL_F32, ref, go[0], NX);
    }
    for (int run = 0; run < 3; run++) {
        free(gx[run]); free(go[run]); free(gn[run]);
    }
    test_weight_free(fmt, &hw, dev);
    if (split) test_weight_free(2, &h2, dev2);
    cudaFree(din); cudaFree(dx); cudaFree(dout); cudaFree(dy); cudaFree(dnext); cudaFree(dnw);
    if (dbias) cudaFree(dbias);
    free(x); free(in); free(y); free(ref); free(xr); free(nw); free(bias);
}

/* Delta scatter and its read-back (scatter.cu) against the host loop: distinct
 * indices (plus one repeat of the same value and two out of range), exact. */
static void check_scatter(const int *a) {
    int64_t numel = a[0], n = a[1];
    int elem = a[2];
    size_t bytes = (size_t)numel * elem;
    uint8_t *h = (uint8_t *)xmalloc(bytes), *ref = (uint8_t *)xmalloc(bytes);
    uint8_t *val = (uint8_t *)xmalloc((size_t)n * elem), *back = (uint8_t *)xmalloc((size_t)n * elem);
    int64_t *idx = (int64_t *)xmalloc(sizeof(int64_t) * (size_t)n);
    for (size_t i = 0; i < bytes; i++) h[i] = ref[i] = (uint8_t)rng_u64();
    for (int64_t i = 0; i < n; i++) {
        idx[i] = i == 3 ? numel + 5 : i == 4 ? -1 : i * (numel / n) + (int64_t)(rng_u64() % (uint64_t)(numel / n));
        for (int k = 0; k < elem; k++) val[i * elem + k] = (uint8_t)rng_u64();
    }
    idx[n - 1] = idx[0]; /* a repeat with the same value: the result must not depend on order */
    memcpy(val + (n - 1) * elem, val, (size_t)elem);
    for (int64_t i = 0; i < n; i++)
        if (idx[i] >= 0 && idx[i] < numel) memcpy(ref + idx[i] * elem, val + i * elem, (size_t)elem);
    void *dd = dev_copy(h, bytes), *didx = dev_copy(idx, sizeof(int64_t) * (size_t)n), *dval = dev_copy(val, (size_t)n * elem);
    void *dback = dev_poisoned((size_t)n * elem);
    Err err = {0};
    int rc = cuda_scatter(dd, numel, (const int64_t *)didx, dval, n, elem, NULL, &err) |
             cuda_gather(dback, dd, numel, (const int64_t *)didx, n, elem, NULL, &err);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(h, dd, bytes, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(back, dback, (size_t)n * elem, cudaMemcpyDeviceToHost));
    size_t bad = memcmp(h, ref, bytes) != 0;
    for (int64_t i = 0; i < n; i++)
        for (int k = 0; k < elem; k++) bad += back[i * elem + k] != (idx[i] >= 0 && idx[i] < numel ? val[i * elem + k] : 0);
    int ok = rc == 0 && bad == 0;
    ok ? n_pass++ : n_fail++;
    char what[96];
    snprintf(what, sizeof what, "delta scatter + read-back %lld of %lld x %d B", (long long)n, (long long)numel, elem);
    printf("  %-4s %-60s %-7s %zu wrong%s%s\n", ok ? "ok" : "FAIL", what, "exact", bad, rc ? "; " : "", rc ? err.msg : "");
    cudaFree(dd); cudaFree(didx); cudaFree(dval); cudaFree(dback);
    free(h); free(ref); free(val); free(back); free(idx);
}

/* RoPE tables [n_pos, hd / 2] of random angles and n positions into them (position 0,
 * repeats, the last row): what forward.c's tables and Step.pos are. */
static void rope_inputs(int n, int n_pos, int hd, float **cs, float **sn, int32_t **pos) {
    size_t h2 = (size_t)hd / 2;
    *cs = (float *)xmalloc(sizeof(float) * n_pos * h2);
    *sn = (float *)xmalloc(sizeof(float) * n_pos * h2);
    for (size_t i = 0; i < n_pos * h2; i++) {
        float t = 100.f * rng_f();
        (*cs)[i] = cosf(t);
        (*sn)[i] = sinf(t);
    }
    *pos = (int32_t *)xmalloc(sizeof(int32_t) * (n ? n : 1));
    for (int i = 0; i < n; i++) (*pos)[i] = (int32_t)(rng_u64() % (uint64_t)n_pos);
    if (n > 0) (*pos)[0] = 0;
    if (n > 1) (*pos)[n - 1] = n_pos - 1;
    if (n > 2) (*pos)[1] = (*pos)[2];
}

static void check_norm_rope(const int *a) {
    int n = a[0], heads = a[1], hd = a[2], norm = a[3], n_pos = 3 * n + 5;
    size_t N = (size_t)n * heads * hd, h2 = (size_t)hd / 2;
    float *x = rand_f32(N, 2), *ref = (float *)xmalloc(sizeof(float) * N), *cs, *sn;
    int32_t *pos;
    memcpy(ref, x, sizeof(float) * N);
    rope_inputs(n, n_pos, hd, &cs, &sn, &pos);
    uint16_t *w = norm ? rand_bf16(hd, 1, 0.5f) : NULL;
    bc->norm_rope(bc, ref, n, heads, hd, w, 1e-6f, cs, sn, pos);
    float *dx = (float *)dev_copy(x, sizeof(float) * N), *dcs = (float *)dev_copy(cs, sizeof(float) * n_pos * h2),
          *dsn = (float *)dev_copy(sn, sizeof(float) * n_pos * h2);
    int32_t *dpos = (int32_t *)dev_copy(pos, sizeof(int32_t) * n);
    uint16_t *dw = norm ? (uint16_t *)dev_copy(w, sizeof(uint16_t) * hd) : NULL;
    bg->norm_rope(bg, dx, n, heads, hd, dw, 1e-6f, dcs, dsn, dpos);
    float *got = dev_result(dx, N);
    char what[96];
    snprintf(what, sizeof what, "norm_rope n %d heads %d hd %d%s", n, heads, hd, norm ? " +qk-norm" : "");
    compare_op(what, TOL_F32, ref, got, N);
    cudaFree(dx); cudaFree(dcs); cudaFree(dsn); cudaFree(dpos); cudaFree(dw);
    free(x); free(ref); free(cs); free(sn); free(pos); free(w); free(got);
}

/* Paged attention over shuffled blocks: n_seqs (<= 4) sequences, sequence s
 * contributes toks[s] tokens ending at position last[s]. sms 0: through the
 * backend (its own split choice; the tensor-core kernel where
 * cuda_attention_mma_fits, then in the attn_bf16 class; the grouped-head decode
 * kernel splits Q and P into bf16 hi + lo, f32 class); sms > 0: the launcher
 * with the splits a device of that many SMs gets (1: unsplit, large: prefill
 * tokens split); sms -1: the tensor-core launcher cuda_attention_mma; sms
 * -k (1 < k < 100): cuda_attention_mma_split with k splits; sms -100 - k:
 * the grouped-head decode launcher cuda_attention_dec_mma with k splits (the
 * backend takes it itself for G > 4, sms 0). */
static void check_attention(const int *a) {
    int n_seqs = a[0], nh = a[1], nkv = a[2], hd = a[3], bs = a[4], sms = a[5];
    KvDtype kvt = (KvDtype)a[14];
    const int *toks = a + 6, *last = a + 10;
    int max_pos = 0, n = 0;
    for (int s = 0; s < n_seqs; s++) {
        max_pos = last[s] > max_pos ? last[s] : max_pos;
        n += toks[s];
    }
    int stride = max_pos / bs + 1, n_blocks = n_seqs * stride + 3;
    size_t slot = (size_t)nkv * hd, cache = (size_t)n_blocks * bs * slot, n_rows = cache / hd;
    size_t cache_bytes = cache * kv_dtype_elem(kvt);
    float *kf = rand_f32(cache, 1), *vf = rand_f32(cache, 1), *q = rand_f32((size_t)n * nh * hd, 1);
    /* the caches in kvt, stored by the reference (kv_cpu.h); FP8 rows of mixed magnitudes */
    void *kc = xmalloc(cache_bytes), *vc = xmalloc(cache_bytes);
    float *ks = (float *)xmalloc(sizeof(float) * n_rows), *vs = (float *)xmalloc(sizeof(float) * n_rows);
    for (size_t r = 0; r < n_rows; r++) {
        float mag = kvt == KV_FP8 ? (float)(1 + r % 7) * 0.3f : 1.f;
        for (int d = 0; d < hd; d++) { kf[r * hd + d] *= mag; vf[r * hd + d] *= mag; }
        cpu_kv_store_row(kc, ks, kvt, r, kf + r * hd, hd);
        cpu_kv_store_row(vc, vs, kvt, r, vf + r * hd, hd);
    }
    /* every block id used once, shuffled */
    int32_t *perm = (int32_t *)xmalloc(sizeof(int32_t) * n_blocks), *bt = (int32_t *)xmalloc(sizeof(int32_t) * n_seqs * stride);
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = (int)(rng_u64() % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    memcpy(bt, perm, sizeof(int32_t) * n_seqs * stride);
    int32_t *pos = (int32_t *)xmalloc(sizeof(int32_t) * n), *seq = (int32_t *)xmalloc(sizeof(int32_t) * n);
    for (int s = 0, k = 0; s < n_seqs; s++)
        for (int i = 0; i < toks[s]; i++, k++) {
            pos[k] = last[s] - toks[s] + 1 + i;
            seq[k] = s;
        }
    size_t N = (size_t)n * nh * hd;
    float *ref = (float *)xmalloc(sizeof(float) * N);
    AttnArgs h = {ref, q, kc, vc, pos, seq, bt, stride, n, nh, nkv, hd, bs, 1.0f / sqrtf((float)hd), kvt,
                  kvt == KV_FP8 ? ks : NULL, kvt == KV_FP8 ? vs : NULL, n_seqs};
    bc->attention(bc, &h);
    AttnArgs d = h;
    d.out = (float *)dev_poisoned(sizeof(float) * N);
    d.q = (float *)dev_copy(q, sizeof(float) * N);
    d.k_cache = dev_copy(kc, cache_bytes);
    d.v_cache = dev_copy(vc, cache_bytes);
    if (kvt == KV_FP8) {
        d.k_scale = (float *)dev_copy(ks, sizeof(float) * n_rows);
        d.v_scale = (float *)dev_copy(vs, sizeof(float) * n_rows);
    }
    d.pos = (int32_t *)dev_copy(pos, sizeof(int32_t) * n);
    d.seq = (int32_t *)dev_copy(seq, sizeof(int32_t) * n);
    d.block_table = (int32_t *)dev_copy(bt, sizeof(int32_t) * n_seqs * stride);
    int splits = 1, rc = 0, dec = sms <= -100 || (sms == 0 && !cuda_attention_mma_fits(&d) && cuda_attention_dec_mma_fits(&d));
    int mma = !dec && (sms < 0 || (sms == 0 && cuda_attention_mma_fits(&d))); /* the prefill kernel */
    float *part = NULL;
    if (sms <= -100) {
        splits = -100 - sms;
        part = (float *)dev_poisoned(sizeof(float) * (size_t)splits * n * nh * (hd + 2));
        rc = cuda_attention_dec_mma(&d, part, splits, NULL);
    } else if (sms == -1) {
        rc = cuda_attention_mma(&d, NULL);
    } else if (sms < 0) {
        splits = -sms;
        part = (float *)dev_poisoned(sizeof(float) * (size_t)splits * n * nh * (hd + 2));
        rc = cuda_attention_mma_split(&d, part, splits, NULL);
    } else if (sms > 0) {
        splits = cuda_attention_splits(n, nh, nkv, max_pos + 1, sms);
        part = (float *)dev_poisoned(sizeof(float) * (size_t)splits * n * nh * (hd + 2));
        rc = cuda_attention(&d, part, splits, NULL);
    } else {
        int dev_sms = 0;
        CUDA_CHECK(cudaDeviceGetAttribute(&dev_sms, cudaDevAttrMultiProcessorCount, 0));
        splits = cuda_attention_splits(n, nh, nkv, 2048, dev_sms);
        bg->attention(bg, &d);
    }
    float *got = dev_result(d.out, N);
    char what[128];
    snprintf(what, sizeof what, "attention seqs %d tokens %d pos<=%d heads %d/%d hd %d bs %d %s%d kv %s%s", n_seqs,
             n, max_pos, nh, nkv, hd, bs, dec ? "dec-mma " : mma ? "mma " : "splits ", (mma && sms >= -1) || (dec && !sms) ? sms : splits, kv_dtype_name(kvt),
             rc ? " LAUNCH REFUSED" : "");
    compare_op(what, mma ? TOL_ATTN_BF16 : TOL_F32, ref, got, N); /* dec: Q and P as bf16 hi + lo */
    cudaFree(d.out); cudaFree((void *)d.q); cudaFree((void *)d.k_cache); cudaFree((void *)d.v_cache);
    cudaFree((void *)d.pos); cudaFree((void *)d.seq); cudaFree((void *)d.block_table); cudaFree(part);
    if (kvt == KV_FP8) { cudaFree((void *)d.k_scale); cudaFree((void *)d.v_scale); }
    free(kc); free(vc); free(kf); free(vf); free(ks); free(vs);
    free(q); free(perm); free(bt); free(pos); free(seq); free(ref); free(got);
}

static void check_elementwise(const int *a) {
    int n = a[0];
    float *g = rand_f32(n, 8), *u = rand_f32(n, 2), *ref = (float *)xmalloc(sizeof(float) * n);
    bc->swiglu(bc, ref, g, u, n);
    float *dg = (float *)dev_copy(g, sizeof(float) * n), *du = (float *)dev_copy(u, sizeof(float) * n),
          *dout = (float *)dev_poisoned(sizeof(float) * n);
    bg->swiglu(bg, dout, dg, du, n);
    float *got = dev_result(dout, n);
    char what[96];
    snprintf(what, sizeof what, "swiglu n %d", n);
    compare_op(what, TOL_F32, ref, got, n);
    free(got);
    memcpy(ref, g, sizeof(float) * n);
    bc->add(bc, ref, u, n);
    bg->add(bg, dg, du, n);
    got = dev_result(dg, n);
    snprintf(what, sizeof what, "add n %d", n);
    compare_op(what, TOL_EXACT, ref, got, n);
    cudaFree(dg); cudaFree(du); cudaFree(dout);
    free(g); free(u); free(ref); free(got);
}

/* The GEMM path's helpers (launchers only, no backend op): f32 -> bf16 against
 * dtype.h's f32_to_bf16, and out[n, rows] += bias[rows]; both exact. */
static void check_gemm_helpers(const int *a) {
    int n = a[0], rows = a[1];
    size_t N = (size_t)n * rows;
    float *x = rand_f32(N, 8), *ref = (float *)xmalloc(sizeof(float) * N), *got = (float *)xmalloc(sizeof(float) * N);
    uint16_t *hb = (uint16_t *)xmalloc(sizeof(uint16_t) * N), *bias = rand_bf16(rows, 0, 1);
    float *dx = (float *)dev_copy(x, sizeof(float) * N);
    uint16_t *dh = (uint16_t *)dev_poisoned(sizeof(uint16_t) * N), *dbias = (uint16_t *)dev_copy(bias, sizeof(uint16_t) * rows);
    int rc = cuda_f32_to_bf16(dh, dx, N, NULL);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(hb, dh, sizeof(uint16_t) * N, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < N; i++) {
        ref[i] = bf16_to_f32(f32_to_bf16(x[i]));
        got[i] = bf16_to_f32(hb[i]);
    }
    char what[96];
    snprintf(what, sizeof what, "f32_to_bf16 n %zu vs dtype.h%s", N, rc ? " LAUNCH REFUSED" : "");
    compare_op(what, TOL_EXACT, ref, got, N);
    for (int t = 0; t < n; t++)
        for (int r = 0; r < rows; r++) ref[(size_t)t * rows + r] = x[(size_t)t * rows + r] + bf16_to_f32(bias[r]);
    rc = cuda_add_bias(dx, dbias, n, rows, NULL);
    free(got);
    got = dev_result(dx, N);
    snprintf(what, sizeof what, "add_bias n %d rows %d%s", n, rows, rc ? " LAUNCH REFUSED" : "");
    compare_op(what, TOL_EXACT, ref, got, N);
    cudaFree(dx); cudaFree(dh); cudaFree(dbias);
    free(x); free(ref); free(got); free(hb); free(bias);
}

static void check_rows(const int *a) {
    int n_src = a[0], n = a[1], dim = a[2];
    size_t S = (size_t)n_src * dim, N = (size_t)n * dim;
    float *src = rand_f32(S, 1), *k = rand_f32(N, 1), *v = rand_f32(N, 1), *w = rand_f32(n, 1);
    int32_t *rows = (int32_t *)xmalloc(sizeof(int32_t) * n), *slots = (int32_t *)xmalloc(sizeof(int32_t) * n);
    for (int i = 0; i < n; i++) {
        rows[i] = (int32_t)(rng_u64() % (uint64_t)n_src); /* may repeat: order matters */
        slots[i] = (int32_t)((i * 7 + 3) % n_src);        /* distinct when n <= n_src, gcd(7, n_src) = 1 */
    }
    char what[96];
    /* gather_rows */
    float *ref = (float *)xmalloc(sizeof(float) * (S > N ? S : N));
    bc->gather_rows(bc, ref, src, rows, n, dim);
    float *dsrc = (float *)dev_copy(src, sizeof(float) * S), *dout = (float *)dev_poisoned(sizeof(float) * N);
    int32_t *drows = (int32_t *)dev_copy(rows, sizeof(int32_t) * n), *dslots = (int32_t *)dev_copy(slots, sizeof(int32_t) * n);
    bg->gather_rows(bg, dout, dsrc, drows, n, dim);
    float *got = dev_result(dout, N);
    snprintf(what, sizeof what, "gather_rows n %d dim %d", n, dim);
    compare_op(what, TOL_EXACT, ref, got, N);
    free(got);
    /* scale_add_rows into a copy of src, repeated rows included */
    memcpy(ref, src, sizeof(float) * S);
    bc->scale_add_rows(bc, ref, k, rows, w, n, dim);
    float *dk = (float *)dev_copy(k, sizeof(float) * N), *dw = (float *)dev_copy(w, sizeof(float) * n);
    bg->scale_add_rows(bg, dsrc, dk, drows, dw, n, dim);
    got = dev_result(dsrc, S);
    snprintf(what, sizeof what, "scale_add_rows n %d dim %d (repeats)", n, dim);
    compare_op(what, TOL_F32, ref, got, S);
    cudaFree(dsrc); cudaFree(dout); cudaFree(drows); cudaFree(dslots); cudaFree(dk); cudaFree(dw);
    free(src); free(k); free(v); free(w); free(rows); free(slots); free(ref); free(got);
}

/* Slots of n tokens in a cache of n_blocks blocks of bs: distinct (a stride coprime to the slots
 * used); with padding (the last n_pad tokens: -1, not written) none in block 0, where a write at
 * slot -1 of a kv head above 0 lands (head 0's lands before the cache). */
static int32_t *kv_test_slots(int n, int n_pad, int bs, int n_blocks) {
    int32_t *slots = (int32_t *)xmalloc(sizeof(int32_t) * (n ? n : 1));
    size_t first = n_pad ? (size_t)bs : 0, avail = (size_t)n_blocks * bs - first, p = 7;
    for (;;) {
        size_t x = p, y = avail;
        while (y) { size_t t = x % y; x = y; y = t; }
        if (x == 1) break;
        p += 2;
    }
    if ((size_t)(n - n_pad) > avail) {
        fprintf(stderr, "kv_test_slots: %d tokens in %zu slots\n", n - n_pad, avail);
        exit(1);
    }
    for (int i = 0; i < n; i++) slots[i] = i >= n - n_pad ? -1 : (int32_t)(first + ((size_t)i * p + 3) % avail);
    return slots;
}

/* kv_write of n tokens into random caches of n_blocks blocks at dtype kvt:
 * written rows (and FP8 scales) bit for bit as the CPU's, the rest untouched
 * (the last n_pad tokens have slot -1: nothing written).
 * Inputs of mixed magnitudes (FP8: tiny rows hit subnormals, big ones the
 * saturation bound), one all-zero row (FP8 scale 1.0), one NaN. */
static void check_kv_write(const int *a) {
    int n = a[0], nkv = a[1], hd = a[2], bs = a[3], n_blocks = a[4], n_pad = a[6];
    KvDtype kvt = (KvDtype)a[5];
    size_t rows = (size_t)n_blocks * nkv * bs, elems = rows * hd, bytes = elems * kv_dtype_elem(kvt);
    size_t N = (size_t)n * nkv * hd;
    float *k = rand_f32(N, 1), *v = rand_f32(N, 1);
    for (size_t i = 0; i < N; i++) {
        float mag = ldexpf(1.f, (int)(i / hd % 13) - 6); /* 2^-6 .. 2^6 per row */
        k[i] *= mag;
        v[i] *= mag * 3.f;
    }
    if (N >= (size_t)hd) memset(k, 0, sizeof(float) * hd);
    if (N > 2) v[N - 2] = NAN;
    int32_t *slots = kv_test_slots(n, n_pad, bs, n_blocks);
    unsigned char *kc = (unsigned char *)xmalloc(bytes), *vc = (unsigned char *)xmalloc(bytes);
    float *ksc = rand_f32(rows, 1), *vsc = rand_f32(rows, 1);
    for (size_t i = 0; i < bytes; i++) { kc[i] = (unsigned char)rng_u64(); vc[i] = (unsigned char)rng_u64(); }
    void *dkc = dev_copy(kc, bytes), *dvc = dev_copy(vc, bytes);
    float *dks = (float *)dev_copy(ksc, sizeof(float) * rows), *dvs = (float *)dev_copy(vsc, sizeof(float) * rows);
    float *dk = (float *)dev_copy(k, sizeof(float) * N), *dv = (float *)dev_copy(v, sizeof(float) * N);
    int32_t *dslots = (int32_t *)dev_copy(slots, sizeof(int32_t) * n);
    int fp8 = kvt == KV_FP8;
    KvWriteArgs h = {kc, vc, fp8 ? ksc : NULL, fp8 ? vsc : NULL, k, v, slots, n, nkv, hd, bs, kvt};
    KvWriteArgs d = {dkc, dvc, fp8 ? dks : NULL, fp8 ? dvs : NULL, dk, dv, dslots, n, nkv, hd, bs, kvt};
    bc->kv_write(bc, &h);
    bg->kv_write(bg, &d);
    CUDA_CHECK(cudaDeviceSynchronize());
    unsigned char *got = (unsigned char *)xmalloc(bytes);
    char what[128];
    for (int c = 0; c < 2; c++) {
        CUDA_CHECK(cudaMemcpy(got, c ? dvc : dkc, bytes, cudaMemcpyDeviceToHost));
        snprintf(what, sizeof what, "kv_write n %d (%d padded) kv heads %d hd %d bs %d kv %s (%s)", n, n_pad, nkv,
                 hd, bs, kv_dtype_name(kvt), c ? "v" : "k");
        compare_bytes(what, c ? vc : kc, got, bytes);
    }
    if (fp8) {
        float *gs = dev_result(dks, rows);
        snprintf(what, sizeof what, "kv_write n %d kv heads %d hd %d scales (k)", n, nkv, hd);
        compare_bytes(what, ksc, gs, sizeof(float) * rows);
        free(gs);
        gs = dev_result(dvs, rows);
        snprintf(what, sizeof what, "kv_write n %d kv heads %d hd %d scales (v)", n, nkv, hd);
        compare_bytes(what, vsc, gs, sizeof(float) * rows);
        free(gs);
    }
    cudaFree(dkc); cudaFree(dvc); cudaFree(dks); cudaFree(dvs); cudaFree(dk); cudaFree(dv); cudaFree(dslots);
    free(k); free(v); free(slots); free(kc); free(vc); free(ksc); free(vsc); free(got);
}

/* rope_kv_write (RopeKvArgs) of n tokens (the last n_pad with slot -1) with q heads, nkv kv heads,
 * the KV layout of check_kv_write at dtype kvt, +/- QK-norm, positions into a table of 3n+5 rows:
 * first the CPU op against the composition it fuses (norm_rope q, norm_rope k, kv_write on the
 * CPU: bitwise, every cache byte and scale), then the CUDA op against the CPU op: q and the k
 * rows in the f32 class after decoding (an f32 rounding of the rotation may move a bf16 / e4m3
 * rounding by one step: per dtype below), v, the FP8 v scales and every unwritten cache row
 * bitwise. kv.k is read only: checked unchanged on both. */
static void check_rope_kv_write(const int *a) {
    int n = a[0], heads = a[1], nkv = a[2], hd = a[3], bs = a[4], n_blocks = a[5], norm = a[7], n_pad = a[8];
    KvDtype kvt = (KvDtype)a[6];
    int fp8 = kvt == KV_FP8, n_pos = 3 * n + 5;
    size_t rows = (size_t)n_blocks * nkv * bs, elems = rows * hd, bytes = elems * kv_dtype_elem(kvt);
    size_t NQ = (size_t)n * heads * hd, N = (size_t)n * nkv * hd, h2 = (size_t)hd / 2;
    float *q = rand_f32(NQ, 2), *k = rand_f32(N, 2), *v = rand_f32(N, 1), *cs, *sn;
    for (size_t i = 0; i < N; i++) v[i] *= ldexpf(1.f, (int)(i / hd % 13) - 6);
    int32_t *pos, *slots = kv_test_slots(n, n_pad, bs, n_blocks);
    rope_inputs(n, n_pos, hd, &cs, &sn, &pos);
    uint16_t *qw = norm ? rand_bf16(hd, 1, 0.5f) : NULL, *kw = norm ? rand_bf16(hd, 1, 0.5f) : NULL;
    unsigned char *kc = (unsigned char *)xmalloc(bytes), *vc = (unsigned char *)xmalloc(bytes);
    for (size_t i = 0; i < bytes; i++) { kc[i] = (unsigned char)rng_u64(); vc[i] = (unsigned char)rng_u64(); }
    float *ksc = rand_f32(rows, 1), *vsc = rand_f32(rows, 1);
    void *dkc = dev_copy(kc, bytes), *dvc = dev_copy(vc, bytes);
    float *dks = (float *)dev_copy(ksc, sizeof(float) * rows), *dvs = (float *)dev_copy(vsc, sizeof(float) * rows);
    float *dq = (float *)dev_copy(q, sizeof(float) * NQ), *dk = (float *)dev_copy(k, sizeof(float) * N),
          *dv = (float *)dev_copy(v, sizeof(float) * N), *dcs = (float *)dev_copy(cs, sizeof(float) * n_pos * h2),
          *dsn = (float *)dev_copy(sn, sizeof(float) * n_pos * h2);
    int32_t *dpos = (int32_t *)dev_copy(pos, sizeof(int32_t) * n), *dslots = (int32_t *)dev_copy(slots, sizeof(int32_t) * n);
    uint16_t *dqw = norm ? (uint16_t *)dev_copy(qw, sizeof(uint16_t) * hd) : NULL,
             *dkw = norm ? (uint16_t *)dev_copy(kw, sizeof(uint16_t) * hd) : NULL;
    /* the composition on copies */
    unsigned char *kc2 = (unsigned char *)xmalloc(bytes), *vc2 = (unsigned char *)xmalloc(bytes);
    memcpy(kc2, kc, bytes); memcpy(vc2, vc, bytes);
    float *ksc2 = (float *)xmalloc(sizeof(float) * rows), *vsc2 = (float *)xmalloc(sizeof(float) * rows);
    memcpy(ksc2, ksc, sizeof(float) * rows); memcpy(vsc2, vsc, sizeof(float) * rows);
    float *q2 = (float *)xmalloc(sizeof(float) * NQ), *k2 = (float *)xmalloc(sizeof(float) * N);
    memcpy(q2, q, sizeof(float) * NQ); memcpy(k2, k, sizeof(float) * N);
    bc->norm_rope(bc, q2, n, heads, hd, qw, 1e-6f, cs, sn, pos);
    bc->norm_rope(bc, k2, n, nkv, hd, kw, 1e-6f, cs, sn, pos);
    KvWriteArgs hw = {kc2, vc2, fp8 ? ksc2 : NULL, fp8 ? vsc2 : NULL, k2, v, slots, n, nkv, hd, bs, kvt};
    bc->kv_write(bc, &hw);
    /* the fused CPU op (the reference) and the CUDA op */
    float *kref = (float *)xmalloc(sizeof(float) * N);
    memcpy(kref, k, sizeof(float) * N);
    RopeKvArgs h = {{kc, vc, fp8 ? ksc : NULL, fp8 ? vsc : NULL, k, v, slots, n, nkv, hd, bs, kvt},
                    q, heads, qw, kw, 1e-6f, cs, sn, pos};
    RopeKvArgs d = {{dkc, dvc, fp8 ? dks : NULL, fp8 ? dvs : NULL, dk, dv, dslots, n, nkv, hd, bs, kvt},
                    dq, heads, dqw, dkw, 1e-6f, dcs, dsn, dpos};
    bc->rope_kv_write(bc, &h);
    bg->rope_kv_write(bg, &d);
    char what[192], tag[96];
    snprintf(tag, sizeof tag, "n %d (%d pad) h %d/%d hd %d kv %s%s", n, n_pad, heads, nkv, hd, kv_dtype_name(kvt),
             norm ? " +qkn" : "");
    snprintf(what, sizeof what, "rope_kv_write cpu = composed: q %s", tag);
    compare_bytes(what, q2, q, sizeof(float) * NQ);
    snprintf(what, sizeof what, "rope_kv_write cpu = composed: caches %s", tag);
    size_t cd = (size_t)(memcmp(kc, kc2, bytes) != 0) + (memcmp(vc, vc2, bytes) != 0) +
                (size_t)(fp8 && (memcmp(ksc, ksc2, sizeof(float) * rows) || memcmp(vsc, vsc2, sizeof(float) * rows))) +
                (memcmp(k, kref, sizeof(float) * N) != 0);
    cd ? n_fail++ : n_pass++;
    printf("  %-4s %-60s bytes   %zu of 4 parts differ\n", cd ? "FAIL" : "ok", what, cd);
    float *got = dev_result(dq, NQ);
    snprintf(what, sizeof what, "rope_kv_write q %s", tag);
    compare_op(what, TOL_F32, q, got, NQ);
    free(got);
    got = dev_result(dk, N);
    snprintf(what, sizeof what, "rope_kv_write k untouched %s", tag);
    compare_bytes(what, k, got, sizeof(float) * N);
    free(got);
    unsigned char *gk = (unsigned char *)xmalloc(bytes), *gv = (unsigned char *)xmalloc(bytes);
    CUDA_CHECK(cudaMemcpy(gk, dkc, bytes, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(gv, dvc, bytes, cudaMemcpyDeviceToHost));
    float *gks = dev_result(dks, rows), *gvs = dev_result(dvs, rows);
    snprintf(what, sizeof what, "rope_kv_write v cache %s", tag);
    compare_bytes(what, vc, gv, bytes);
    if (fp8) {
        snprintf(what, sizeof what, "rope_kv_write v scales %s", tag);
        compare_bytes(what, vsc, gvs, sizeof(float) * rows);
    }
    /* k: the written rows decoded (cpu_kv_rows) in a class per dtype, every other row bitwise */
    unsigned char *written = (unsigned char *)xcalloc(rows, 1);
    for (int t = 0; t < n; t++)
        for (int hh = 0; slots[t] >= 0 && hh < nkv; hh++)
            written[((size_t)(slots[t] / bs) * nkv + hh) * bs + slots[t] % bs] = 1;
    size_t nw = 0, kdiff = 0, es = kv_dtype_elem(kvt);
    float *rk = (float *)xmalloc(sizeof(float) * N + 4), *gkf = (float *)xmalloc(sizeof(float) * N + 4);
    float buf[512];
    for (size_t rw = 0; rw < rows; rw++) {
        if (!written[rw]) {
            kdiff += memcmp(kc + rw * hd * es, gk + rw * hd * es, hd * es) != 0 ||
                     (fp8 && memcmp(&ksc[rw], &gks[rw], sizeof(float)) != 0);
            continue;
        }
        memcpy(rk + nw * hd, cpu_kv_rows(buf, kc, ksc, kvt, rw, 1, hd), sizeof(float) * hd);
        memcpy(gkf + nw * hd, cpu_kv_rows(buf, gk, gks, kvt, rw, 1, hd), sizeof(float) * hd);
        nw++;
    }
    snprintf(what, sizeof what, "rope_kv_write k cache unwritten rows %s", tag);
    kdiff ? n_fail++ : n_pass++;
    printf("  %-4s %-60s bytes   %zu of %zu rows differ\n", kdiff ? "FAIL" : "ok", what, kdiff, rows - nw);
    /* one bf16 step is 2^-8 relative, one e4m3 step 2^-3: a flip of one element of the rows */
    Tol tk = kvt == KV_F32 ? TOL_F32 : kvt == KV_BF16 ? TOL_BF16KV : TOL_FP8KV;
    snprintf(what, sizeof what, "rope_kv_write k cache %s", tag);
    compare_op(what, tk, rk, gkf, nw * hd);
    cudaFree(dkc); cudaFree(dvc); cudaFree(dks); cudaFree(dvs); cudaFree(dq); cudaFree(dk); cudaFree(dv);
    cudaFree(dcs); cudaFree(dsn); cudaFree(dpos); cudaFree(dslots); cudaFree(dqw); cudaFree(dkw);
    free(q); free(k); free(v); free(cs); free(sn); free(pos); free(slots); free(qw); free(kw); free(kc); free(vc);
    free(ksc); free(vsc); free(kc2); free(vc2); free(ksc2); free(vsc2); free(q2); free(k2); free(kref);
    free(gk); free(gv); free(gks); free(gvs); free(written); free(rk); free(gkf);
}

/* The batched LoRA (backend.h lora; lora.cu): rows of up to three adapters and
 * of the base (NULL pair) interleaved, A and B f32 or bf16. The CUDA op against
 * the CPU op (f32 class: the shrink sums in another order), the base rows
 * bitwise untouched, and the first three adapted rows bitwise equal to the
 * same row run alone on the GPU (a mixed batch never changes a row's bits). */
static void check_lora(const int *a) {
    int n = a[0], in = a[1], od = a[2], na = a[3], bf = a[7];
    const int ranks[3] = {a[4], a[5], a[6]};
    bc->reserve(bc, 64, 16);
    if (bg->lora_reserve) bg->lora_reserve(bg, 64, 64);
    LoraPair hp[3], dp[3];
    void *hbuf[6], *dbuf[6];
    for (int k = 0; k < na; k++) {
        size_t ne[2] = {(size_t)ranks[k] * in, (size_t)ranks[k] * od};
        for (int w = 0; w < 2; w++) {
            size_t bytes = ne[w] * (bf ? 2 : 4);
            hbuf[2 * k + w] = bf ? (void *)rand_bf16(ne[w], 0, 0.2f) : (void *)rand_f32(ne[w], 0.2f);
            dbuf[2 * k + w] = dev_copy(hbuf[2 * k + w], bytes);
        }
        hp[k] = (LoraPair){hbuf[2 * k], hbuf[2 * k + 1], ranks[k], in, od, 0.5f + 0.25f * k, bf};
        dp[k] = hp[k];
        dp[k].a = dbuf[2 * k];
        dp[k].b = dbuf[2 * k + 1];
    }
    const LoraPair *hr[64], *dr[64];
    for (int i = 0; i < n; i++) {
        int k = (i * 7 + 3) % (na + 1); /* k == na: a base row */
        hr[i] = k < na ? &hp[k] : NULL;
        dr[i] = k < na ? &dp[k] : NULL;
    }
    size_t X = (size_t)n * in, O = (size_t)n * od;
    float *x = rand_f32(X, 1), *base = rand_f32(O, 1), *ref = (float *)xmalloc(sizeof(float) * O);
    memcpy(ref, base, sizeof(float) * O);
    bc->lora(bc, ref, x, n, hr);
    float *dx = (float *)dev_copy(x, sizeof(float) * X), *dout = (float *)dev_copy(base, sizeof(float) * O);
    bg->lora(bg, dout, dx, n, dr);
    float *got = dev_result(dout, O);
    char what[120];
    snprintf(what, sizeof what, "lora n %d in %d out %d, %d adapters r %d/%d/%d + base rows%s", n, in, od, na,
             ranks[0], na > 1 ? ranks[1] : 0, na > 2 ? ranks[2] : 0, bf ? ", bf16" : "");
    compare_op(what, TOL_F32, ref, got, O);
    /* base rows untouched; every row alone */
    float *alone = (float *)xmalloc(sizeof(float) * O), *bref = (float *)xmalloc(sizeof(float) * O),
          *bgot = (float *)xmalloc(sizeof(float) * O);
    size_t nb = 0;
    int n_alone = 0;
    for (int i = 0; i < n; i++) {
        if (hr[i] && n_alone++ >= 3) { /* three rows alone are enough (emulated launches are slow) */
            memcpy(alone + (size_t)i * od, got + (size_t)i * od, sizeof(float) * od);
        } else if (hr[i]) {
            float *d1 = (float *)dev_copy(base + (size_t)i * od, sizeof(float) * od);
            bg->lora(bg, d1, dx + (size_t)i * in, 1, &dr[i]);
            float *g1 = dev_result(d1, od);
            memcpy(alone + (size_t)i * od, g1, sizeof(float) * od);
            free(g1);
            cudaFree(d1);
        } else {
            memcpy(alone + (size_t)i * od, got + (size_t)i * od, sizeof(float) * od);
            memcpy(bref + nb, base + (size_t)i * od, sizeof(float) * od);
            memcpy(bgot + nb, got + (size_t)i * od, sizeof(float) * od);
            nb += (size_t)od;
        }
    }
    snprintf(what, sizeof what, "lora n %d: base rows untouched", n);
    compare_op(what, TOL_EXACT, bref, bgot, nb);
    snprintf(what, sizeof what, "lora n %d: adapted rows alone, same bits", n);
    compare_op(what, TOL_EXACT, alone, got, O);
    for (int k = 0; k < 2 * na; k++) { free(hbuf[k]); cudaFree(dbuf[k]); }
    cudaFree(dx); cudaFree(dout);
    free(x); free(base); free(ref); free(got); free(alone); free(bref); free(bgot);
}

/* Weights of 128-column block k scaled by 2^(k % 3) (exact in bf16): the blocks'
 * scales differ, so a scale read from the wrong column block shows. */
static uint16_t *bf16_col_blocks(uint16_t *w, int rows, int cols) {
    for (size_t i = 0; i < (size_t)rows * cols; i++)
        w[i] = f32_to_bf16(ldexpf(bf16_to_f32(w[i]), (int)(i % (size_t)cols) / 128 % 3));
    return w;
}

/* Activations over many magnitudes (token t scaled by 2^(t*7 % 40 - 24): e4m3
 * subnormals and saturation-free rounding everywhere), one all-zero group. */
static float *native_act(int n, int cols) {
    float *x = rand_f32((size_t)n * cols, 1);
    for (int t = 0; t < n; t++) {
        float s = ldexpf(1.0f, (t * 7) % 40 - 24);
        for (int c = 0; c < cols; c++) x[(size_t)t * cols + c] *= s;
    }
    if (n > 1)
        for (int c = 0; c < (cols < 16 ? cols : 16); c++) x[cols + c] = 0.0f; /* token 1, first 16 columns */
    return x;
}

/* The grouped GEMM alone (moe_mma.cu cuda_moe_gemm) against the CPU matmul of
 * each expert's rows: routing made by hand (offsets and the active list as
 * moe_route writes them) with uneven experts: empty ones, one with a partial
 * last pair tile, 9 pairs (the fewest a BF16 expert rounds x to bf16 at), 8
 * and 1 (x as bf16 hi + lo, f32 class), E slots for fewer active experts; rows
 * not a multiple of the tiles, a
 * K tail (bf16 cols % 32), FP8 128 x 128 blocks crossing row and column tiles
 * (the f32 scale flush per 128 columns). sw: gate and up with the SwiGLU
 * epilogue vs the CPU's two matmuls and swiglu. BF16 experts of more than
 * CUDA_GEMV_MAX_N pairs get the bf16-rounded x on the CPU too: f32 class.
 * fmt 3, native FP8 (a[5]: 0 128x128 blocks, 1 per channel): x quantized on
 * the device (cuda_quant_act_fp8, checked bitwise above) by the backend's rule
 * (per token when the blocks span cols, else per 128 columns), gate / up
 * reading token rows through x_row as cu_moe_mlp does (down: pair rows),
 * against the CPU backend's matmul of the act_quant matrix (quant_act_fp8 +
 * quant_matmul_fp8_rows): the "native" class (op_checks_native.h). A machine
 * whose binary has no FP8 mma prints skip. a[6] > 0 (fmt 0..2): the grouped
 * GEMV instead (moe_gemm.cu cuda_moe_gemv, f32 x at every pair count) with
 * max_cnt = a[6], below the experts' counts: passes of 1, 2 or 4 pairs; with
 * swiglu (max_cnt 1 or 2) cuda_moe_gemv_swiglu, also against the bits of
 * cuda_moe_gemv then cuda_swiglu. */
static void check_moe_gemm(const int *a) {
    static const int pats[][8] = {{0, 70, 9, 0, 8, 1, 17, 0}, {0, 0, 0, 129, 0, 0, 0, 0}, {64, 64, 1, 2, 3, 4, 5, 6}};
    enum { E = 8 };
    int rows = a[0], cols = a[1], fmt = a[2], sw = a[3], nat = fmt == 3, wfmt = nat ? 1 : fmt, gemv = a[6];
    CHECK(!gemv || (!nat && (!sw || gemv <= 2)), "check_moe_gemm: the GEMV rows take fmt 0..2, swiglu at max_cnt "
                                                 "1 or 2 (a table bug)");
    if (nat && !cuda_moe_gemm_fp8_native(a[5] ? cols : QUANT_FP8_GROUP, cols)) {
        printf("  skip moe_gemm fp8 native [%d x %d]: this binary has no FP8 mma (sm_80)\n", rows, cols);
        return;
    }
    const int *cnt = pats[a[4]];
    int32_t off[E + 1], act[E];
    int na = 0;
    off[0] = 0;
    for (int e = 0; e < E; e++) {
        off[e + 1] = off[e] + cnt[e];
        if (cnt[e]) act[na++] = e;
    }
    for (int i = na; i < E; i++) act[i] = -1;
    int NK = off[E], nw = sw ? 2 : 1;
    char what[128];
    if (nat) bc->reserve(bc, NK, cols); /* the CPU matmul's quantized-x scratch */
    WeightMat *hm = (WeightMat *)xcalloc((size_t)2 * E, sizeof(WeightMat));
    const void **tab = (const void **)xcalloc((size_t)4 * E, sizeof(void *)); /* [2][E] w, [2][E] s */
    const void *s2p[2 * E] = {NULL};                                          /* nvfp4: [2][E] dev_s2 */
    void **dmem = (void **)xcalloc((size_t)4 * E, sizeof(void *));
    for (int j = 0; j < nw; j++)
        for (int e = 0; e < E; e++) {
            WeightMat *h = &hm[j * E + e];
            *h = wmat_bf16(rows, cols, rand_bf16((size_t)rows * cols, 0, 0.05f * (1.0f + 0.25f * (float)(e % 4))));
            if (nat) bf16_col_blocks(h->bf16, rows, cols);
            Err err = {0};
            if (wfmt == 1) {
                QuantFp8 *q = quant_fp8_from_bf16(h->bf16, rows, cols, nat && a[5] ? QUANT_FP8_PER_CHANNEL :
                                                  QUANT_FP8_BLOCK128, &err);
                CHECK(q, "quantize: %s", err.msg);
                h->fmt = WF_FP8;
                h->act_quant = nat; /* the CPU reference quantizes x */
                h->q = q;
                dmem[j * E + e] = dev_copy(q->q, (size_t)rows * cols);
                dmem[2 * E + j * E + e] = dev_copy(q->scale_inv, sizeof(float) * (size_t)q->scale_rows * q->scale_cols);
            } else if (fmt == 2) {
                QuantNvfp4 *q = quant_nvfp4_from_bf16(h->bf16, rows, cols, &err);
                CHECK(q, "quantize: %s", err.msg);
                h->fmt = WF_NVFP4;
                h->q = q;
                dmem[j * E + e] = dev_copy(q->packed, (size_t)rows * cols / 2);
                dmem[2 * E + j * E + e] = dev_copy(q->scale, (size_t)rows * cols / 16);
                s2p[j * E + e] = dev_scale2(q);
            } else {
                dmem[j * E + e] = dev_copy(h->bf16, sizeof(uint16_t) * (size_t)rows * cols);
            }
            tab[j * E + e] = dmem[j * E + e];
            tab[2 * E + j * E + e] = dmem[2 * E + j * E + e];
        }
    /* the reference: each expert's rows through the CPU matmul (and swiglu); with swiglu (not the
     * GEMV's passes of 2 pairs): pair p reads token row xrow[p] of x [ntok, cols] (x_row, as pair_tok) */
    int ntok = sw && gemv != 2 ? 37 : NK;
    int32_t *xrow = (int32_t *)xmalloc(sizeof(int32_t) * ((size_t)NK + 1));
    for (int p = 0; p < NK; p++) xrow[p] = ntok == NK ? p : (int32_t)(((size_t)p * 7 + 3) % (size_t)ntok);
    float *x = nat ? native_act(ntok, cols) : rand_f32((size_t)ntok * cols, 1);
    float *ref = (float *)xmalloc(sizeof(float) * ((size_t)NK * rows + 1));
    float *xr = (float *)xmalloc(sizeof(float) * ((size_t)NK * cols + 1));
    float *u = (float *)xmalloc(sizeof(float) * ((size_t)NK * rows + 1));
    for (int e = 0; e < E; e++) {
        if (!cnt[e]) continue;
        int r16 = fmt == 0 && cnt[e] > CUDA_GEMV_MAX_N && !gemv;
        for (size_t i = 0; i < (size_t)cnt[e] * cols; i++) {
            float v = x[(size_t)xrow[off[e] + i / cols] * cols + i % cols];
            xr[i] = r16 ? bf16_to_f32(f32_to_bf16(v)) : v;
        }
        float *o = ref + (size_t)off[e] * rows;
        bc->matmul(bc, o, xr, cnt[e], &hm[e], NULL);
        if (sw) {
            bc->matmul(bc, u, xr, cnt[e], &hm[E + e], NULL);
            bc->swiglu(bc, o, o, u, cnt[e] * rows);
        }
    }
    const void **dtab = (const void **)dev_copy(tab, sizeof(void *) * (size_t)4 * E);
    float *dx = (float *)dev_copy(x, sizeof(float) * (size_t)ntok * cols);
    const void **ds2 = (const void **)dev_copy(s2p, sizeof s2p); /* [2][E] pointers to each dev_s2 */
    int32_t *doff = (int32_t *)dev_copy(off, sizeof off), *dact = (int32_t *)dev_copy(act, sizeof act);
    float *dout[2], *dact_out = (float *)dev_poisoned(sizeof(float) * ((size_t)NK * rows + 1));
    CudaMoeGemv g;
    memset(&g, 0, sizeof g);
    for (int j = 0; j < nw; j++) {
        dout[j] = (float *)dev_poisoned(sizeof(float) * ((size_t)NK * rows + 1));
        CudaMoeSeg *S = &g.seg[j];
        S->out = dout[j];
        S->w = dtab + (size_t)j * E;
        S->s = fmt ? dtab + 2 * E + (size_t)j * E : NULL;
        S->s2 = fmt == 2 ? ds2 + (size_t)j * E : NULL;
        S->rows = rows;
        S->br = wfmt == 1 ? ((const QuantFp8 *)hm[j * E].q)->block_rows : 0;
        S->bc = wfmt == 1 ? ((const QuantFp8 *)hm[j * E].q)->block_cols : 0;
    }
    g.nseg = nw;
    g.x = nat ? NULL : dx;
    g.cols = cols;
    uint8_t *dxq = NULL;
    float *dxs = NULL;
    int32_t *dxrow = NULL;
    if (nat) { /* the backend's quantization of x (cu_moe_mlp's moe_fp8_group rule) */
        int per_tok = g.seg[0].bc >= cols, group = per_tok ? cols : QUANT_FP8_GROUP;
        dxq = (uint8_t *)dev_poisoned((size_t)ntok * cols);
        dxs = (float *)dev_poisoned(sizeof(float) * (size_t)ntok * quant_fp8_groups(cols));
        CHECK(cuda_quant_act_fp8(dxq, dxs, dx, ntok, cols, group, NULL) == 0, "cuda_quant_act_fp8 refused");
        g.xq = dxq;
        g.xs = dxs;
        g.xs_stride = per_tok ? 0 : ntok;
    }
    if (ntok != NK) g.x_row = dxrow = (int32_t *)dev_copy(xrow, sizeof(int32_t) * (size_t)NK);
    g.offsets = doff;
    g.active = dact;
    g.n_experts = E;
    g.n_pairs = NK;
    g.fmt = fmt;
    g.max_cnt = gemv;
    int rc = gemv && sw ? cuda_moe_gemv_swiglu(&g, dact_out, NULL)
             : gemv     ? cuda_moe_gemv(&g, NULL)
                        : cuda_moe_gemm(&g, sw ? dact_out : NULL, NULL);
    float *got = dev_result(sw ? dact_out : dout[0], (size_t)NK * rows);
    if (gemv && sw) { /* the fused epilogue's promise: the bits of the two launches it replaces (over x
                       * gathered into pair order where the fused launch read it through x_row) */
        float *xg = (float *)xmalloc(sizeof(float) * (size_t)NK * cols);
        for (size_t i = 0; i < (size_t)NK * cols; i++) xg[i] = x[(size_t)xrow[i / cols] * cols + i % cols];
        float *dxg = (float *)dev_copy(xg, sizeof(float) * (size_t)NK * cols);
        g.x = dxg;
        g.x_row = NULL;
        int rc2 = cuda_moe_gemv(&g, NULL);
        rc2 = rc2 ? rc2 : cuda_swiglu(dout[0], dout[0], dout[1], (size_t)NK * rows, NULL);
        float *two = dev_result(dout[0], (size_t)NK * rows);
        int same = !rc && !rc2 && !memcmp(got, two, sizeof(float) * (size_t)NK * rows);
        printf("  %s moe_gemv %s swiglu epilogue max_cnt %d [%d x %d]%s: the bits of cuda_moe_gemv then cuda_swiglu\n",
               same ? "ok  " : "FAIL", fmt == 2 ? "nvfp4" : fmt ? "fp8" : "bf16", gemv, rows, cols,
               dxrow ? " (x through x_row)" : "");
        same ? n_pass++ : n_fail++;
        free(two);
        free(xg);
        cudaFree(dxg);
    }
    char gv[24] = "";
    if (gemv) snprintf(gv, sizeof gv, " gemv max_cnt %d", gemv);
    snprintf(what, sizeof what, "moe_gemm %s%s%s [%d x %d] pairs %d %d %d %d %d %d %d %d%s",
             nat ? (a[5] ? "fp8 native per-channel" : "fp8 native") : fmt == 2 ? "nvfp4" : fmt ? "fp8" : "bf16",
             sw ? " swiglu" : "", gv, rows, cols, cnt[0], cnt[1], cnt[2], cnt[3], cnt[4], cnt[5], cnt[6], cnt[7],
             rc ? " REFUSED" : "");
    compare_op(what, nat ? TOL_NATIVE : TOL_F32, ref, got, (size_t)NK * rows);
    if (dxq) cudaFree(dxq);
    if (dxs) cudaFree(dxs);
    if (dxrow) cudaFree(dxrow);
    free(xrow);
    free(got);
    for (int i = 0; i < 4 * E; i++)
        if (dmem[i]) cudaFree(dmem[i]);
    for (int i = 0; i < nw * E; i++) {
        if (hm[i].q && wfmt == 1) quant_fp8_free((QuantFp8 *)hm[i].q);
        if (hm[i].q && fmt == 2) quant_nvfp4_free((QuantNvfp4 *)hm[i].q);
        free(hm[i].bf16);
    }
    for (int j = 0; j < nw; j++) cudaFree(dout[j]);
    cudaFree(dact_out); cudaFree((void *)dtab); cudaFree(dx); cudaFree((void *)ds2); cudaFree(doff); cudaFree(dact);
    free(hm); free((void *)tab); free(dmem); free(x); free(xr); free(ref); free(u);
}

/* ---- the table ---- */
/* moe_mlp with the residual add and the next norm (MoeMlpArgs.resid, one token, the down GEMV's path):
 * against moe_mlp into out then add_rmsnorm, forward.c's two ops, byte for byte in the residual, the
 * normed row and, split on (presplit), an NVFP4 tensor-core GEMV over it that reads the norm's split;
 * one kernel fewer, and again with the blocks run last to first (the other tiles and blocks count
 * last: the counters are back at 0 after a launch); with SAMPLER_CUDA_OFF=matmul_add_rmsnorm the
 * op's own two launches, the same bits. Values: x + the CPU's expert sum, and its RMSNorm, f32
 * class. ma: check_moe's (taken, out = its result's buffer). */
static void moe_add_norm_check(MoeMlpArgs *ma, int H, int I, int K, int E, int fmt, int split,
                               const float *moe_ref) {
    float *res = rand_f32((size_t)H, 3), *xr = (float *)xmalloc(sizeof(float) * H), *nref = (float *)xmalloc(sizeof(float) * H);
    uint16_t *nw = rand_bf16((size_t)H, 1, 0.5f);
    memcpy(xr, res, sizeof(float) * H);
    bc->add(bc, xr, moe_ref, H);
    bc->rmsnorm(bc, nref, xr, nw, 1, H, 1e-6f);
    WeightMat h2, d2;
    QuantFp8 q28;
    QuantNvfp4 q24;
    void *dev2[2];
    if (split) test_weight(2, 16, H, 0.05f, &h2, &d2, &q28, &q24, dev2); /* the GEMV after: NVFP4, tensor cores */
    d2.mma_min_n = 1;
    float *dres = (float *)dev_poisoned(sizeof(float) * H), *dnorm = (float *)dev_poisoned(sizeof(float) * H);
    float *dnext = (float *)dev_poisoned(sizeof(float) * 16);
    uint16_t *dnw = (uint16_t *)dev_copy(nw, sizeof(uint16_t) * H);
    backend_cuda_gemv_presplit(bg, split ? 1 : 0);
    float *gx[4], *go[4], *gn[4];
    int rc[4];
    long kern[4] = {-1, -1, -1, -1}, kn[4] = {-1, -1, -1, -1}; /* the emulation counts kernels; a GPU does not */
    for (int run = 0; run < 4; run++) { /* fused twice, the op's own two launches (off), then forward.c's */
        CUDA_CHECK(cudaMemcpy(dres, res, sizeof(float) * H, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemset(dnorm, 0xff, sizeof(float) * H));
        CUDA_CHECK(cudaDeviceSynchronize());
        CHECK(backend_cuda_off(bg, "matmul_add_rmsnorm", run == 2) == 0, "no matmul_add_rmsnorm in SAMPLER_CUDA_OFF");
        MoeMlpArgs m = *ma;
        if (run < 3) {
            m.resid = dres;
            m.norm_out = dnorm;
            m.norm_w = dnw;
            m.eps = 1e-6f;
        }
#ifdef CUDA_EMULATION
        long k0 = emu_kernels_run();
        emu_blocks_reverse(run == 1);
#endif
        rc[run] = bg->moe_mlp(bg, &m);
        if (run == 3) bg->add_rmsnorm(bg, dnorm, dres, m.out, dnw, 1, H, 1e-6f);
#ifdef CUDA_EMULATION
        kern[run] = emu_kernels_run() - k0;
        emu_blocks_reverse(0);
        k0 = emu_kernels_run();
#endif
        if (split) bg->matmul(bg, dnext, dnorm, 1, &d2, NULL); /* reads the norm's split of dnorm */
#ifdef CUDA_EMULATION
        kn[run] = emu_kernels_run() - k0;
#endif
        gx[run] = dev_result(dres, H);
        go[run] = dev_result(dnorm, H);
        gn[run] = split ? dev_result(dnext, 16) : NULL;
    }
    CHECK(backend_cuda_off(bg, "matmul_add_rmsnorm", 0) == 0, "no matmul_add_rmsnorm in SAMPLER_CUDA_OFF");
    backend_cuda_gemv_presplit(bg, 0);
    int same = rc[0] == 0 && rc[1] == 0 && rc[2] == 0 && rc[3] == 0 && kern[3] - kern[0] == (kern[0] < 0 ? 0 : 1) &&
               kern[2] == kern[3];
    for (int run = 0; run < 3; run++) {
        same &= !memcmp(gx[run], gx[3], sizeof(float) * H) && !memcmp(go[run], go[3], sizeof(float) * H);
        if (split) same &= !memcmp(gn[run], gn[3], sizeof(float) * 16) && kn[run] == kn[3];
    }
    char what[160], lab[192];
    snprintf(what, sizeof what, "moe_mlp %s n 1 E %d top %d [%d x %d] + add_rmsnorm%s",
             fmt == 2 ? "nvfp4" : fmt ? "fp8" : "bf16", E, K, I, H, split ? " split" : "");
    printf("  %s %s: the bits of moe_mlp then add_rmsnorm in x and out%s, on a second launch and with "
           "SAMPLER_CUDA_OFF=matmul_add_rmsnorm too (%ld kernels, %ld without it; -1: not counted on a GPU)\n",
           same ? "ok  " : "FAIL", what, split ? " and the next GEMV's" : "", kern[0], kern[3]);
    same ? n_pass++ : n_fail++;
    snprintf(lab, sizeof lab, "%s: residual", what);
    compare_op(lab, TOL_F32, xr, gx[0], H);
    snprintf(lab, sizeof lab, "%s: normed", what);
    compare_op(lab, TOL_F32, nref, go[0], H);
    for (int run = 0; run < 4; run++) {
        free(gx[run]); free(go[run]); free(gn[run]);
    }
    if (split) test_weight_free(2, &h2, dev2);
    cudaFree(dres); cudaFree(dnorm); cudaFree(dnext); cudaFree(dnw);
    free(res); free(xr); free(nref); free(nw);
}

/* MoE (moe_route.cu, moe_gemm.cu): moe_route against cpu_moe_route, then
 * moe_mlp against forward.c's per-expert loop over the CPU ops. Router logits
 * are ranks spaced scale / E apart (ties: two experts per rank, exact ties the
 * lower id must win on both), so no p is within an ulp of another's: ids,
 * offsets, pair lists and active experts bytes equal, weights f32 class; the
 * expert MLP's output f32 class (the reference rounds a BF16 expert's inputs to
 * bf16 where the device runs the mma: more than CUDA_GEMV_MAX_N pairs). Steps of
 * more than 8 tokens run the grouped GEMM (moe_mma.cu); skew makes one expert
 * take every token and half the experts none. */
static void check_moe(const int *a) {
    int n = a[0], E = a[1], K = a[2], norm = a[3], H = a[4], I = a[5], fmt = a[6], ties = a[7]; /* fmt: 0 bf16, 1 fp8, 2 nvfp4 */
    /* fmt 3 (4: per channel): fp8 experts marked act_quant; at least CUDA_NATIVE_MIN_N tokens on a
     * binary with the FP8 mma they run native (x quantized on the device), and the CPU reference
     * quantizes x too (per token for per-channel weights, else per 128 columns: its rule) */
    int aq = fmt >= 3, pc = fmt == 4;
    int nat = aq && n >= CUDA_NATIVE_MIN_N && cuda_moe_gemm_fp8_native(pc ? H : QUANT_FP8_GROUP, H) &&
              cuda_moe_gemm_fp8_native(pc ? I : QUANT_FP8_GROUP, I);
    if (aq) fmt = 1;
    if (nat) bc->reserve(bc, n * K, H > I ? H : I); /* the CPU matmul's quantized-x scratch */
    int skew = a[8]; /* 1: expert 1 first for every token, experts >= E / 2 never chosen (K <= E / 2) */
    int NK = n * K;
    char what[128];
    float *lg = (float *)xmalloc(sizeof(float) * (size_t)n * E);
    int *perm = (int *)xmalloc(sizeof(int) * E);
    for (int t = 0; t < n; t++) {
        for (int e = 0; e < E; e++) perm[e] = e;
        for (int e = E - 1; e > 0; e--) {
            int j = (int)(rng_u64() % (uint64_t)(e + 1)), v = perm[e];
            perm[e] = perm[j];
            perm[j] = v;
        }
        for (int e = 0; e < E; e++) lg[(size_t)t * E + e] = 8.0f * (float)(ties ? perm[e] / 2 : perm[e]) / (float)E - 4.0f;
        for (int e = 0; skew && e < E; e++) /* expert 1 just above the rest (weights alike), the upper half far below */
            lg[(size_t)t * E + e] = e == 1 ? 4.0f : e >= E / 2 ? lg[(size_t)t * E + e] - 8.0f : lg[(size_t)t * E + e];
    }
    /* routing: host buffers for the CPU, poisoned device buffers for the GPU */
    int32_t *hi[5];
    float *hf[2];
    size_t ni[5] = {(size_t)NK, (size_t)E + 1, (size_t)NK, (size_t)NK, (size_t)E}; /* ids, offsets, tok, of, active */
    for (int i = 0; i < 5; i++) hi[i] = (int32_t *)xmalloc(sizeof(int32_t) * ni[i]);
    for (int i = 0; i < 2; i++) hf[i] = (float *)xmalloc(sizeof(float) * NK); /* weights, pair_w */
    MoeRouteArgs rc = {lg, hi[0], hf[0], hi[1], hi[2], hf[1], hi[3], hi[4], n, E, K, norm, 0};
    bc->moe_route(bc, &rc);
    /* the device writes its ids in rows of LD (forward.c's layout: every MoE layer's ids of a token in
     * one row): the top_k of each row equal the CPU's, the LD - top_k slots between stay untouched */
    int LD = K + 3;
    void *di[5], *df[2];
    for (int i = 0; i < 5; i++) di[i] = dev_poisoned(sizeof(int32_t) * (i ? ni[i] : (size_t)n * LD));
    for (int i = 0; i < 2; i++) df[i] = dev_poisoned(sizeof(float) * NK);
    float *dlg = (float *)dev_copy(lg, sizeof(float) * (size_t)n * E);
    MoeRouteArgs rg = {dlg, (int32_t *)di[0], (float *)df[0], (int32_t *)di[1], (int32_t *)di[2], (float *)df[1],
                       (int32_t *)di[3], (int32_t *)di[4], n, E, K, norm, LD};
    bg->moe_route(bg, &rg);
    const char *names[5] = {"ids", "offsets", "pair_tok", "pair_of", "active"};
    {   /* the rows of LD: compacted to [n, top_k]; every slot between must still read -1 (the poison) */
        int32_t *wide = (int32_t *)dev_result(di[0], (size_t)n * LD), untouched = 1;
        for (int t = 0; t < n; t++)
            for (int j = 0; j < LD; j++) {
                if (j < K) wide[t * K + j] = wide[(size_t)t * LD + j]; /* t * K + j <= t * LD + j: in place */
                else untouched &= wide[(size_t)t * LD + j] == -1;
            }
        snprintf(what, sizeof what, "moe_route ids (rows of %d) n %d E %d top %d%s%s", LD, n, E, K,
                 norm ? " norm" : "", ties ? " ties" : "");
        compare_bytes(what, hi[0], wide, sizeof(int32_t) * ni[0]);
        free(wide);
        untouched ? n_pass++ : n_fail++;
        if (!untouched) printf("  FAIL %s: wrote between the rows' top_k\n", what);
    }
    for (int i = 1; i < 5; i++) {
        float *got = dev_result(di[i], ni[i]); /* int32 bytes */
        snprintf(what, sizeof what, "moe_route %s n %d E %d top %d%s%s", names[i], n, E, K, norm ? " norm" : "",
                 ties ? " ties" : "");
        compare_bytes(what, hi[i], got, sizeof(int32_t) * ni[i]);
        free(got);
    }
    for (int i = 0; i < 2; i++) {
        float *got = dev_result(df[i], NK);
        snprintf(what, sizeof what, "moe_route %s n %d E %d top %d", i ? "pair_w" : "weights", n, E, K);
        compare_op(what, TOL_F32, hf[i], got, NK);
        free(got);
    }
    /* experts: host matrices for the CPU, device copies + pointer tables for the GPU */
    WeightMat *hm = (WeightMat *)xcalloc((size_t)3 * E, sizeof(WeightMat));
    WeightMat *dm = (WeightMat *)xcalloc((size_t)3 * E, sizeof(WeightMat));
    const void **tab = (const void **)xcalloc((size_t)9 * E, sizeof(void *)); /* [3][3 E] dev, dev_scale, dev_s2 */
    for (int j = 0; j < 3; j++)
        for (int e = 0; e < E; e++) {
            int rows = j < 2 ? I : H, cols = j < 2 ? H : I;
            WeightMat *h = &hm[j * E + e], *d = &dm[j * E + e];
            /* magnitudes differ per expert, so do their scales (a scale read for the wrong expert shows) */
            *h = wmat_bf16(rows, cols, rand_bf16((size_t)rows * cols, 0, 0.05f * (1.0f + 0.25f * (float)(e % 4))));
            if (aq) bf16_col_blocks(h->bf16, rows, cols);
            *d = *h;
            if (fmt == 2) {
                Err err = {0};
                QuantNvfp4 *q = quant_nvfp4_from_bf16(h->bf16, rows, cols, &err);
                CHECK(q, "quantize: %s", err.msg);
                h->fmt = d->fmt = WF_NVFP4;
                h->q = d->q = q;
                d->dev = dev_copy(q->packed, (size_t)rows * cols / 2);
                d->dev_scale = dev_copy(q->scale, (size_t)rows * cols / 16);
                d->dev_s2 = dev_scale2(q);
            } else if (fmt == 1) {
                Err err = {0};
                QuantFp8 *q = quant_fp8_from_bf16(h->bf16, rows, cols, pc ? QUANT_FP8_PER_CHANNEL : QUANT_FP8_BLOCK128,
                                                  &err);
                CHECK(q, "quantize: %s", err.msg);
                h->fmt = d->fmt = WF_FP8;
                h->q = d->q = q;
                d->dev = dev_copy(q->q, (size_t)rows * cols);
                d->dev_scale = dev_copy(q->scale_inv, sizeof(float) * (size_t)q->scale_rows * q->scale_cols);
                d->act_quant = aq;
                h->act_quant = nat;
            } else {
                d->dev = dev_copy(h->bf16, sizeof(uint16_t) * (size_t)rows * cols);
            }
            tab[j * E + e] = d->dev;
            tab[3 * E + j * E + e] = d->dev_scale;
            tab[6 * E + j * E + e] = d->dev_s2;
        }
    /* the reference: forward.c's per-expert loop on the CPU ops */
    float *x = rand_f32((size_t)n * H, 1), *ref = (float *)xcalloc((size_t)n * H, sizeof(float));
    float *xg = (float *)xmalloc(sizeof(float) * (size_t)NK * H), *yg = (float *)xmalloc(sizeof(float) * (size_t)NK * H);
    float *g = (float *)xmalloc(sizeof(float) * (size_t)NK * I), *u = (float *)xmalloc(sizeof(float) * (size_t)NK * I);
    int any16 = 0; /* some expert's SwiGLU output rounded to bf16 for its down GEMM */
    for (int e = 0; e < E; e++) {
        int o = hi[1][e], cnt = hi[1][e + 1] - o;
        if (!cnt) continue;
        bc->gather_rows(bc, xg, x, hi[2] + o, cnt, H);
        int r16 = fmt == 0 && cnt > CUDA_GEMV_MAX_N; /* the mma's bf16 x (moe_mma.cu), as cuBLAS's */
        any16 |= r16;
        for (size_t i = 0; r16 && i < (size_t)cnt * H; i++) xg[i] = bf16_to_f32(f32_to_bf16(xg[i]));
        bc->matmul(bc, g, xg, cnt, &hm[e], NULL);
        bc->matmul(bc, u, xg, cnt, &hm[E + e], NULL);
        bc->swiglu(bc, g, g, u, cnt * I);
        for (size_t i = 0; r16 && i < (size_t)cnt * I; i++) g[i] = bf16_to_f32(f32_to_bf16(g[i]));
        bc->matmul(bc, yg, g, cnt, &hm[2 * E + e], NULL);
        bc->scale_add_rows(bc, ref, yg, hi[2] + o, hf[1] + o, cnt, H);
    }
    const void **dtab = (const void **)dev_copy(tab, sizeof(void *) * (size_t)9 * E);
    float *dx = (float *)dev_copy(x, sizeof(float) * (size_t)n * H), *dout = (float *)dev_poisoned(sizeof(float) * (size_t)n * H);
    float *dxg = (float *)dev_poisoned(sizeof(float) * (size_t)NK * H), *dyg = (float *)dev_poisoned(sizeof(float) * (size_t)NK * H);
    float *dg = (float *)dev_poisoned(sizeof(float) * (size_t)NK * I), *du = (float *)dev_poisoned(sizeof(float) * (size_t)NK * I);
    MoeMlpArgs ma = {dout, dx, &rg, {dm, dm + E, dm + 2 * E, dtab, dtab + 3 * E, fmt == 2 ? dtab + 6 * E : NULL}, dxg, dyg, dg,
                     du, H, I, NULL, NULL, NULL, 0.f}; /* no residual add + norm (moe_add_norm_check) */
    bg->reserve(bg, n, H > I ? H : I); /* as a runner: the unpermute epilogue's tile counters among the rest */
    int taken = bg->moe_mlp(bg, &ma);
    float *got = dev_result(dout, (size_t)n * H);
    if (!taken && n <= CUDA_GEMV_MAX_N) { /* the GEMV path's down GEMV with the unpermute epilogue (the tensor-core
                                          * paths take no epilogue: the same launches either way) */
        float *again[2];
        long kern[2] = {-1, 0}; /* kernels each run launched (the emulation counts them; a GPU does not) */
        for (int off = 1; off >= 0; off--) { /* the two launches it replaces; then the epilogue once more: its
                                              * tile counters back at 0 after a launch, or out is not written
                                              * (on the emulation with the blocks run last to first) */
            CHECK(backend_cuda_off(bg, "moe_unpermute", off) == 0, "no moe_unpermute in SAMPLER_CUDA_OFF's table");
            ma.out = (float *)dev_poisoned(sizeof(float) * (size_t)n * H);
#ifdef CUDA_EMULATION
            long k0 = emu_kernels_run();
            emu_blocks_reverse(!off); /* the epilogue again with another block of each tile last */
            bg->moe_mlp(bg, &ma);
            emu_blocks_reverse(0);
            kern[off] = emu_kernels_run() - k0;
#else
            bg->moe_mlp(bg, &ma);
#endif
            again[off] = dev_result(ma.out, (size_t)n * H);
            cudaFree(ma.out);
        }
        /* one launch fewer with the epilogue: else this would compare the two launches with themselves */
        int same = !memcmp(got, again[1], sizeof(float) * (size_t)n * H) &&
                   !memcmp(got, again[0], sizeof(float) * (size_t)n * H) && kern[1] - kern[0] == 1;
        printf("  %s moe_mlp n %d E %d top %d [%d x %d]: the down GEMV's unpermute epilogue gives the bits of the two "
               "launches, and again on a second launch (%ld kernels, %ld without it; -1, 0: not counted on a GPU)\n", same ? "ok  " : "FAIL", n, E,
               K, I, H, kern[0], kern[1]);
        same ? n_pass++ : n_fail++;
        free(again[0]);
        free(again[1]);
        ma.out = dout;
    }
    if (!taken && n == 1) moe_add_norm_check(&ma, H, I, K, E, fmt, a[9], ref);
    snprintf(what, sizeof what, "moe_mlp %s n %d E %d top %d [%d x %d]%s",
             nat ? (pc ? "fp8 native per-channel" : "fp8 native") : aq ? "fp8 act_quant (weight-only)" : fmt == 2 ? "nvfp4" : fmt ? "fp8" : "bf16", n, E,
             K, I, H, taken ? " REFUSED" : "");
    /* any16: the SwiGLU outputs g come from f32 gate/up sums in two orders before both sides round
     * them to bf16, so a g within an f32 ulp of a bf16 midpoint (~1e-4 of them: 1 or 2 in a
     * 70-token step of top 4 x 40) rounds the other way on one side: a 2^-8 step of that element,
     * measured NMSE 6.4e-10 / max rel 8.1e-5 for one. bf16flip admits a few of those and nothing
     * systematic (g left unrounded on one side: every element 2^-9 off, NMSE ~1e-6). */
    compare_op(what, nat ? TOL_NATIVE : any16 ? TOL_BF16FLIP : TOL_F32, ref, got, (size_t)n * H);
    free(got);
    for (int i = 0; i < 3 * E; i++) {
        cudaFree(dm[i].dev);
        if (dm[i].dev_scale) cudaFree(dm[i].dev_scale);
        if (hm[i].q && fmt == 1) quant_fp8_free((QuantFp8 *)hm[i].q);
        if (hm[i].q && fmt == 2) quant_nvfp4_free((QuantNvfp4 *)hm[i].q);
        free(hm[i].bf16);
    }
    for (int i = 0; i < 5; i++) { cudaFree(di[i]); free(hi[i]); }
    for (int i = 0; i < 2; i++) { cudaFree(df[i]); free(hf[i]); }
    cudaFree(dlg); cudaFree((void *)dtab); cudaFree(dx); cudaFree(dout); cudaFree(dxg); cudaFree(dyg); cudaFree(dg);
    cudaFree(du);
    free(lg); free(perm); free(hm); free(dm); free((void *)tab); free(x); free(ref); free(xg); free(yg); free(g);
    free(u);
}

/* moe_router_route (moe_route.cu cuda_moe_router_route through the CUDA backend): the router's BF16
 * GEMV with the routing as its epilogue, against the same backend's two ops (matmul, then moe_route)
 * byte for byte in every output (logits, ids, weights, offsets, pair lists, active experts), on a
 * second launch too (its block counter back at 0, or nothing would route; on the emulation with the
 * blocks run last to first, so another block routes), one kernel fewer (the emulation counts them); its logits against the CPU matmul (f32 class). More than 256 experts
 * (a[5] = 1): refused, nothing written, the caller runs the two. */
typedef struct { float *lg, *w, *pw; int32_t *ids, *off, *tok, *of, *act; } RouteBufs;
static MoeRouteArgs route_bufs(RouteBufs *d, int n, int E, int K, int norm) {
    size_t NK = (size_t)n * K;
    d->lg = (float *)dev_poisoned(sizeof(float) * (size_t)n * E);
    d->w = (float *)dev_poisoned(sizeof(float) * NK);
    d->pw = (float *)dev_poisoned(sizeof(float) * NK);
    d->ids = (int32_t *)dev_poisoned(sizeof(int32_t) * NK);
    d->off = (int32_t *)dev_poisoned(sizeof(int32_t) * ((size_t)E + 1));
    d->tok = (int32_t *)dev_poisoned(sizeof(int32_t) * NK);
    d->of = (int32_t *)dev_poisoned(sizeof(int32_t) * NK);
    d->act = (int32_t *)dev_poisoned(sizeof(int32_t) * (size_t)E);
    MoeRouteArgs ra = {d->lg, d->ids, d->w, d->off, d->tok, d->pw, d->of, d->act, n, E, K, norm, 0};
    return ra;
}
/* Every output of a routing as one host array of floats / int32 bits: logits, ids, weights, offsets,
 * pair_tok, pair_w, pair_of, active; RouteBufs freed. */
static float *route_result(RouteBufs *d, int n, int E, int K, size_t *count) {
    size_t NK = (size_t)n * K, parts[8] = {(size_t)n * E, NK, NK, (size_t)E + 1, NK, NK, NK, (size_t)E};
    const void *src[8] = {d->lg, d->ids, d->w, d->off, d->tok, d->pw, d->of, d->act};
    size_t total = 0;
    for (int i = 0; i < 8; i++) total += parts[i];
    float *h = (float *)xmalloc(sizeof(float) * total);
    for (int i = 0, o = 0; i < 8; o += (int)parts[i], i++) {
        float *r = dev_result(src[i], parts[i]);
        memcpy(h + o, r, sizeof(float) * parts[i]);
        free(r);
        cudaFree((void *)src[i]);
    }
    *count = total;
    return h;
}
static void check_moe_router_route(const int *a) {
    int n = a[0], E = a[1], K = a[2], norm = a[3], H = a[4], refuse = a[5];
    char what[128];
    WeightMat w = wmat_bf16(E, H, rand_bf16((size_t)E * H, 0, 0.05f));
    w.dev = dev_copy(w.bf16, sizeof(uint16_t) * (size_t)E * H);
    float *x = rand_f32((size_t)n * H, 1), *ref = (float *)xmalloc(sizeof(float) * (size_t)n * E);
    float *dx = (float *)dev_copy(x, sizeof(float) * (size_t)n * H);
    bc->matmul(bc, ref, x, n, &w, NULL);
    RouteBufs d[3];
    float *got[3];
    size_t cnt = 0;
    long kern[3] = {-1, -1, -1}; /* the emulation counts kernels; a GPU does not */
    int rc[2] = {0, 0};
    for (int run = 0; run < 3; run++) { /* the fused op twice, then the two ops */
        MoeRouteArgs ra = route_bufs(&d[run], n, E, K, norm);
#ifdef CUDA_EMULATION
        long k0 = emu_kernels_run();
        emu_blocks_reverse(run == 1); /* the second launch with another block last */
#endif
        if (run < 2) {
            rc[run] = bg->moe_router_route(bg, &ra, dx, &w);
        } else {
            bg->matmul(bg, d[run].lg, dx, n, &w, NULL);
            bg->moe_route(bg, &ra);
        }
#ifdef CUDA_EMULATION
        kern[run] = emu_kernels_run() - k0;
        emu_blocks_reverse(0);
#endif
        got[run] = route_result(&d[run], n, E, K, &cnt);
    }
    snprintf(what, sizeof what, "moe_router_route n %d E %d top %d%s [%d x %d]", n, E, K, norm ? " norm" : "", E, H);
    if (refuse) { /* refused: nothing launched, nothing written (still the poison) */
        int untouched = 1;
        for (size_t i = 0; i < cnt; i++) untouched &= ((uint32_t *)got[0])[i] == 0xffffffffu;
        int ok = rc[0] != 0 && rc[1] != 0 && untouched && kern[0] <= 0;
        printf("  %s %s: refused (more than 256 experts), nothing written\n", ok ? "ok  " : "FAIL", what);
        ok ? n_pass++ : n_fail++;
    } else {
        int same = rc[0] == 0 && rc[1] == 0 && !memcmp(got[0], got[2], sizeof(float) * cnt) &&
                   !memcmp(got[1], got[2], sizeof(float) * cnt) && kern[2] - kern[0] == (kern[0] < 0 ? 0 : 1);
        printf("  %s %s: the bits of matmul then moe_route in every output, on a second launch too (%ld kernels, %ld "
               "without it; -1: not counted on a GPU)\n", same ? "ok  " : "FAIL", what, kern[0], kern[2]);
        same ? n_pass++ : n_fail++;
        compare_op(what, TOL_F32, ref, got[0], (size_t)n * E); /* the logits, first in the outputs */
    }
    for (int run = 0; run < 3; run++) free(got[run]);
    cudaFree(w.dev);
    cudaFree(dx);
    free(w.bf16);
    free(x);
    free(ref);
}

/* Where a row runs: OC_ALL everywhere; OC_FULL on the GPU and the whole emulation, not in its
 * quick subset (EMU_QUICK, ASan's first half of the emulation: one row of each kernel and format);
 * OC_GPU on the GPU only (too big for the emulation). */
enum { OC_ALL = 0, OC_GPU = 1, OC_FULL = 2 };
typedef struct OpCheck {
    void (*fn)(const int *a);
    int where; /* OC_ALL, OC_FULL or OC_GPU */
    int a[15];
} OpCheck;

#define FP8B QUANT_FP8_BLOCK128
#define FP8C QUANT_FP8_PER_CHANNEL
#define FP8T QUANT_FP8_PER_TENSOR
static const OpCheck OP_CHECKS[] = {
    /* vocab, dim, n */
    {check_embed, OC_GPU, {1000, 4096, 7}},
    {check_embed, OC_ALL, {512, 72, 3}},
    {check_embed, OC_ALL, {50, 72, 5}},
    /* n, dim, in_place */
    {check_rmsnorm, OC_GPU, {5, 4096, 0}}, {check_rmsnorm, OC_GPU, {5, 4096, 1}},
    {check_rmsnorm, OC_ALL, {3, 72, 0}}, {check_rmsnorm, OC_ALL, {3, 72, 1}},
    {check_rmsnorm, OC_ALL, {2, 100, 0}}, {check_rmsnorm, OC_ALL, {2, 100, 1}},
    {check_rmsnorm, OC_ALL, {2, 1000, 0}}, {check_rmsnorm, OC_ALL, {2, 1000, 1}},
    /* n, dim */
    {check_add_rmsnorm, OC_GPU, {5, 4096}},
    {check_add_rmsnorm, OC_ALL, {3, 72}},
    {check_add_rmsnorm, OC_ALL, {2, 1500}},
    /* rows, cols, s (bias phase): n = 1, 2, 3, 8, 9, 64 */
    {check_matmul_sweep, OC_GPU, {4096, 4096, 0}}, {check_matmul_sweep, OC_GPU, {1024, 4096, 1}},
    {check_matmul_sweep, OC_GPU, {4096, 12288, 2}}, {check_matmul_sweep, OC_GPU, {257, 136, 3}},
    {check_matmul_sweep, OC_GPU, {100, 100, 4}}, {check_matmul_sweep, OC_GPU, {96, 72, 5}},
    /* n, rows, cols, bias, rounded (GEMM path: the CPU fed bf16 x), misaligned x */
    {check_matmul, OC_ALL, {1, 37, 384, 1, 0, 0}}, {check_matmul, OC_ALL, {2, 37, 640, 0, 0, 0}},
    {check_matmul, OC_ALL, {3, 37, 128, 1, 0, 0}}, {check_matmul, OC_ALL, {4, 37, 384, 0, 0, 0}},
    {check_matmul, OC_ALL, {5, 37, 640, 1, 0, 0}}, {check_matmul, OC_ALL, {6, 37, 128, 0, 0, 0}},
    {check_matmul, OC_ALL, {7, 37, 384, 1, 0, 0}}, {check_matmul, OC_ALL, {8, 37, 640, 0, 0, 0}},
    {check_matmul, OC_ALL, {2, 40, 136, 1, 0, 0}},
    {check_matmul, OC_ALL, {2, 5, 2056, 1, 0, 0}}, /* gemv_tile: slices of > 32 chunks, a partial tile */
    {check_matmul, OC_ALL, {3, 33, 100, 0, 0, 0}},
    {check_matmul, OC_ALL, {1, 20, 64, 1, 0, 1}},
    {check_matmul, OC_ALL, {11, 40, 72, 1, 1, 0}}, /* the cuBLAS path's call and layout */
    /* gemv_mma.cuh: partial 16-row tiles, slices of whole 16-chunk groups and tails, bias, the record */
    {check_matmul, OC_ALL, {2, 37, 384, 1, 0, 0, 2}}, {check_matmul, OC_ALL, {3, 37, 2056, 0, 0, 0, 2}},
    {check_matmul, OC_ALL, {5, 16, 1032, 1, 0, 0, 2}}, {check_matmul, OC_ALL, {8, 37, 1024, 1, 0, 0, 2}},
    {check_matmul, OC_ALL, {8, 5, 2056, 0, 0, 0, 2}}, {check_matmul, OC_ALL, {7, 33, 64, 1, 0, 0, 6}},
    {check_matmul, OC_ALL, {3, 33, 512, 1, 0, 0, 4}}, /* below its record: the tiled GEMV */
    {check_matmul, OC_ALL, {4, 20, 64, 1, 0, 1, 2}},  /* misaligned x: the scalar GEMV */
    {check_matmul, OC_ALL, {1, 37, 384, 1, 0, 0, 2}}, /* one token: never on tensor cores */
    {check_matmul, OC_GPU, {8, 4096, 4096, 0, 0, 0, 2}}, {check_matmul, OC_GPU, {4, 151936, 4096, 1, 0, 0, 2}},
    /* rows, cols, s: FP8 block128 (+ NVFP4 when cols % 16 == 0), n = 1, 2, 3, 11, 19 */
    {check_qgemv_sweep, OC_GPU, {4096, 4096, 0}}, {check_qgemv_sweep, OC_GPU, {12288, 4096, 1}},
    {check_qgemv_sweep, OC_GPU, {4096, 12288, 2}}, {check_qgemv_sweep, OC_GPU, {130, 272, 3}},
    {check_qgemv_sweep, OC_GPU, {33, 100, 4}},
    /* nvfp4, n, rows, cols, fp8 layout, bias, misaligned x */
    {check_qgemv, OC_GPU, {0, 4, 1024, 4096, FP8C, 1, 0}},
    {check_qgemv, OC_GPU, {0, 2, 1024, 4096, FP8T, 0, 0}},
    {check_qgemv, OC_ALL, {0, 3, 21, 200, FP8C, 0, 0}},
    /* FP8 on tensor cores (gemv_mma.cuh): block128 groups in slices, per-channel / per-tensor single
     * blocks with a partial group, bias, the record both ways, a misaligned x (the tiled GEMV) */
    {check_qgemv, OC_ALL, {0, 1, 37, 384, FP8B, 1, 0, 1}}, {check_qgemv, OC_ALL, {0, 3, 37, 640, FP8B, 0, 0, 1}},
    {check_qgemv, OC_ALL, {0, 8, 33, 2048, FP8B, 1, 0, 1}}, {check_qgemv, OC_ALL, {0, 2, 21, 208, FP8C, 1, 0, 1}},
    {check_qgemv, OC_ALL, {0, 5, 16, 256, FP8T, 0, 0, 1}}, {check_qgemv, OC_ALL, {0, 6, 20, 1024, FP8B, 1, 0, 4}},
    {check_qgemv, OC_ALL, {0, 3, 20, 512, FP8B, 1, 0, 4}}, /* below its record */
    {check_qgemv, OC_ALL, {0, 4, 20, 256, FP8B, 1, 1, 1}}, /* misaligned x */
    {check_qgemv, OC_ALL, {0, 2, 16, 16448, FP8B, 0, 0, 1}}, /* x split: a row wider than the held float4s */
    /* NVFP4 on tensor cores: one token, partial 16-row tiles, slices of tails only / one whole group
     * pair / groups and a tail, bias, the record both ways, a misaligned x and cols % 32 == 16 (the
     * scalar GEMV) */
    {check_qgemv, OC_ALL, {1, 1, 37, 384, 0, 1, 0, 1}}, {check_qgemv, OC_ALL, {1, 2, 20, 256, 0, 1, 0, 1}},
    {check_qgemv, OC_ALL, {1, 3, 33, 2048, 0, 0, 0, 1}}, {check_qgemv, OC_ALL, {1, 8, 21, 2080, 0, 1, 0, 1}},
    {check_qgemv, OC_ALL, {1, 5, 16, 256, 0, 0, 0, 2}}, {check_qgemv, OC_ALL, {1, 7, 40, 4160, 0, 1, 0, 6}},
    {check_qgemv, OC_ALL, {1, 3, 20, 512, 0, 1, 0, 4}}, /* below its record */
    {check_qgemv, OC_ALL, {1, 4, 20, 256, 0, 1, 1, 1}}, /* misaligned x */
    {check_qgemv, OC_ALL, {1, 2, 20, 272, 0, 1, 0, 1}}, /* cols % 32 == 16 */
    {check_qgemv, OC_FULL, {1, 1, 16, 16416, 0, 0, 0, 1}}, /* x split: a row wider than the held float4s */
    {check_qgemv, OC_GPU, {1, 1, 4096, 4096, 0, 0, 0, 1}}, {check_qgemv, OC_GPU, {1, 8, 12288, 4096, 0, 1, 0, 1}},
    {check_qgemv, OC_GPU, {0, 1, 4096, 4096, FP8B, 0, 0, 1}}, {check_qgemv, OC_GPU, {0, 8, 12288, 4096, FP8B, 1, 0, 1}},
    {check_qgemv, OC_GPU, {0, 1, 1024, 4096, FP8C, 0, 0, 1}},
    /* fmt, n, rows, cols, bias, split (the norm's split for an NVFP4 tensor-core GEMV after it), mma
     * (w's tensor-core record: refused): the residual projection with the add and the norm */
    {check_matmul_add_rmsnorm, OC_ALL, {0, 1, 256, 384, 1, 0, 0}},
    {check_matmul_add_rmsnorm, OC_ALL, {0, 1, 258, 136, 0, 0, 0}}, /* a partial tile; the norm's scalar loads */
    {check_matmul_add_rmsnorm, OC_FULL, {0, 1, 4100, 256, 1, 0, 0}}, /* past 4096: the norm reads x again */
    {check_matmul_add_rmsnorm, OC_ALL, {1, 1, 256, 512, 1, 1, 0}},
    {check_matmul_add_rmsnorm, OC_ALL, {2, 1, 256, 256, 0, 1, 0}},
    {check_matmul_add_rmsnorm, OC_FULL, {2, 1, 288, 512, 1, 0, 0}},
    {check_matmul_add_rmsnorm, OC_ALL, {0, 2, 256, 384, 0, 0, 0}}, /* refused: two tokens */
    {check_matmul_add_rmsnorm, OC_ALL, {1, 1, 256, 384, 1, 0, 1}}, /* on the tensor-core tile */
    {check_matmul_add_rmsnorm, OC_ALL, {2, 1, 288, 512, 0, 1, 1}}, /* and the norm's split in its scratch */
    {check_matmul_add_rmsnorm, OC_FULL, {1, 1, 40, 256, 0, 0, 1}}, /* a partial 16-row tile */
    {check_matmul_add_rmsnorm, OC_GPU, {0, 1, 4096, 4096, 0, 0, 0}},
    {check_matmul_add_rmsnorm, OC_GPU, {0, 1, 4096, 12288, 0, 0, 0}},
    {check_matmul_add_rmsnorm, OC_GPU, {1, 1, 4096, 4096, 1, 1, 0}},
    {check_matmul_add_rmsnorm, OC_GPU, {1, 1, 4096, 12288, 0, 1, 1}},
    {check_matmul_add_rmsnorm, OC_GPU, {2, 1, 5120, 17408, 0, 0, 0}},
    /* fmt (1 fp8 128x128, 2 nvfp4), n, rows, cols, kind (0 rmsnorm, 1 add_rmsnorm, 2 rmsnorm in place):
     * the norm's split of x for the tensor-core GEMV (cols > 1024: the norm's threads loop) */
    {check_norm_split, OC_ALL, {1, 1, 40, 256, 1}}, {check_norm_split, OC_FULL, {1, 3, 24, 2080, 0}},
    {check_norm_split, OC_FULL, {2, 2, 33, 256, 2}}, {check_norm_split, OC_FULL, {2, 8, 20, 384, 1}},
    {check_norm_split, OC_FULL, {1, 2, 16, 16448, 1}}, /* wider than the GEMV's split holds in registers */
    {check_norm_split, OC_GPU, {1, 1, 4096, 4096, 1}}, {check_norm_split, OC_GPU, {2, 8, 4096, 4096, 1}},
    /* FP8: 16-byte path (cols % 16 == 0), scalar path (ragged cols, misaligned x), > 8 tokens */
    {check_qgemv, OC_ALL, {0, 1, 37, 384, FP8B, 1, 0}}, {check_qgemv, OC_ALL, {0, 2, 37, 640, FP8B, 0, 0}},
    {check_qgemv, OC_ALL, {0, 3, 37, 128, FP8B, 1, 0}}, {check_qgemv, OC_ALL, {0, 4, 37, 384, FP8B, 0, 0}},
    {check_qgemv, OC_ALL, {0, 5, 37, 640, FP8B, 1, 0}}, {check_qgemv, OC_ALL, {0, 6, 37, 128, FP8B, 0, 0}},
    {check_qgemv, OC_ALL, {0, 7, 37, 384, FP8B, 1, 0}}, {check_qgemv, OC_ALL, {0, 8, 37, 640, FP8B, 0, 0}},
    {check_qgemv, OC_ALL, {0, 19, 130, 272, FP8B, 1, 0}},
    {check_qgemv, OC_ALL, {0, 3, 9, 2064, FP8B, 1, 0}}, /* the unrolled loop (cols / 16 > 96) and its tail */
    {check_qgemv, OC_ALL, {0, 1, 5, 4096, FP8C, 0, 0}},
    {check_qgemv, OC_ALL, {0, 2, 5, 4112, FP8B, 1, 0}}, /* slices of > 32 chunks, a partial tile */
    {check_qgemv, OC_ALL, {0, 3, 33, 100, FP8B, 0, 0}},
    {check_qgemv, OC_ALL, {0, 2, 20, 144, FP8B, 1, 1}},
    {check_qgemv, OC_ALL, {0, 4, 21, 200, FP8C, 0, 0}},
    {check_qgemv, OC_ALL, {0, 2, 21, 96, FP8T, 1, 0}},
    /* NVFP4: 16-byte path (cols % 32 == 0), byte path (cols % 32 == 16, misaligned x), > 8 tokens */
    {check_qgemv, OC_ALL, {1, 1, 37, 384, FP8B, 1, 0}}, {check_qgemv, OC_ALL, {1, 2, 37, 640, FP8B, 0, 0}},
    {check_qgemv, OC_ALL, {1, 3, 37, 128, FP8B, 1, 0}}, {check_qgemv, OC_ALL, {1, 4, 37, 384, FP8B, 0, 0}},
    {check_qgemv, OC_ALL, {1, 5, 37, 640, FP8B, 1, 0}}, {check_qgemv, OC_ALL, {1, 6, 37, 128, FP8B, 0, 0}},
    {check_qgemv, OC_ALL, {1, 7, 37, 384, FP8B, 1, 0}}, {check_qgemv, OC_ALL, {1, 8, 37, 640, FP8B, 0, 0}},
    {check_qgemv, OC_ALL, {1, 11, 40, 272, FP8B, 1, 0}},
    {check_qgemv, OC_ALL, {1, 2, 9, 4128, FP8B, 1, 0}},
    {check_qgemv, OC_ALL, {1, 2, 5, 8224, FP8B, 1, 0}}, /* slices of > 32 chunks, a partial tile */
    {check_qgemv, OC_ALL, {1, 3, 33, 144, FP8B, 0, 0}},
    {check_qgemv, OC_ALL, {1, 2, 20, 64, FP8B, 1, 1}},
    /* fmt (0 bf16, 1 fp8, 2 nvfp4), n, count, rows[3], cols */
    {check_matmul_multi, OC_GPU, {0, 1, 3, 4096, 1024, 1024, 4096}}, /* q/k/v */
    {check_matmul_multi, OC_GPU, {0, 5, 2, 12288, 12288, 0, 4096}}, /* gate/up */
    {check_matmul_multi, OC_ALL, {0, 2, 3, 130, 33, 7, 512}},        /* partial tiles */
    {check_matmul_multi, OC_ALL, {0, 6, 3, 130, 33, 7, 512, 2}},     /* on tensor cores */
    {check_matmul_multi, OC_ALL, {1, 1, 3, 130, 33, 7, 512, 1}},
    {check_matmul_multi, OC_ALL, {1, 5, 2, 40, 40, 0, 1024, 1}},
    {check_matmul_multi, OC_GPU, {0, 8, 3, 4096, 1024, 1024, 4096, 2}},
    {check_matmul_multi, OC_GPU, {1, 1, 3, 4096, 1024, 1024, 4096}},
    {check_matmul_multi, OC_GPU, {1, 5, 2, 12288, 12288, 0, 4096}},
    {check_matmul_multi, OC_ALL, {1, 2, 3, 130, 33, 7, 512}},
    {check_matmul_multi, OC_GPU, {2, 1, 3, 4096, 1024, 1024, 4096}},
    {check_matmul_multi, OC_GPU, {2, 5, 2, 12288, 12288, 0, 4096}},
    {check_matmul_multi, OC_ALL, {2, 2, 3, 130, 33, 7, 512}},
    {check_matmul_multi, OC_ALL, {2, 1, 3, 130, 33, 7, 512, 1}}, /* NVFP4 on tensor cores */
    {check_matmul_multi, OC_ALL, {2, 8, 2, 40, 40, 0, 1024, 1}},
    {check_matmul_multi, OC_GPU, {2, 1, 3, 4096, 1024, 1024, 4096, 1}},
    /* fmt (0 bf16, 1 fp8, 2 nvfp4), n, rows, cols: gate/up + SwiGLU, fused at n <= 8 */
    {check_matmul_swiglu, OC_GPU, {0, 1, 12288, 4096}}, /* Qwen3-8B */
    {check_matmul_swiglu, OC_GPU, {1, 5, 12288, 4096}},
    {check_matmul_swiglu, OC_GPU, {2, 8, 12288, 4096}},
    {check_matmul_swiglu, OC_ALL, {0, 1, 37, 384}},  /* a partial row tile */
    {check_matmul_swiglu, OC_ALL, {0, 3, 40, 200}},
    {check_matmul_swiglu, OC_ALL, {0, 8, 9, 640}},
    {check_matmul_swiglu, OC_ALL, {0, 8, 37, 1024, 2}}, /* on tensor cores */
    {check_matmul_swiglu, OC_ALL, {0, 3, 40, 200, 2}},
    {check_matmul_swiglu, OC_ALL, {1, 1, 37, 384, 1}}, {check_matmul_swiglu, OC_ALL, {1, 7, 20, 640, 1}},
    {check_matmul_swiglu, OC_GPU, {1, 1, 12288, 4096, 1}},
    {check_matmul_swiglu, OC_GPU, {0, 8, 12288, 4096, 2}},
    {check_matmul_swiglu, OC_ALL, {0, 2, 20, 100}},  /* cols % 8: the scalar GEMVs + swiglu */
    {check_matmul_swiglu, OC_ALL, {0, 11, 20, 64}},  /* n > 8: cuBLAS + swiglu */
    {check_matmul_swiglu, OC_ALL, {1, 1, 37, 384}},
    {check_matmul_swiglu, OC_ALL, {1, 4, 21, 640}},
    {check_matmul_swiglu, OC_ALL, {1, 11, 21, 128}},
    {check_matmul_swiglu, OC_ALL, {2, 1, 37, 384}},
    {check_matmul_swiglu, OC_ALL, {2, 6, 37, 640}},
    {check_matmul_swiglu, OC_ALL, {2, 2, 20, 272}},  /* cols % 32 == 16: the byte-path GEMVs + swiglu */
    {check_matmul_swiglu, OC_ALL, {2, 1, 37, 384, 1}}, {check_matmul_swiglu, OC_ALL, {2, 6, 20, 640, 1}}, /* NVFP4 mma */
    {check_matmul_swiglu, OC_ALL, {2, 2, 20, 272, 1}}, /* cols % 32 == 16: not on tensor cores */
    {check_matmul_swiglu, OC_GPU, {2, 1, 12288, 4096, 1}},
    /* numel, n, elem bytes */
    {check_scatter, OC_GPU, {4096 * 4096, 40000, 2}},
    {check_scatter, OC_ALL, {1000, 40, 2}},
    {check_scatter, OC_ALL, {70000, 300, 1}},
    {check_scatter, OC_ALL, {513, 9, 4}},
    /* n, heads, head_dim, qk-norm */
    {check_norm_rope, OC_GPU, {5, 32, 128, 1}},
    {check_norm_rope, OC_ALL, {5, 8, 128, 0}},
    {check_norm_rope, OC_ALL, {3, 3, 24, 1}},
    {check_norm_rope, OC_ALL, {3, 4, 24, 1}},
    {check_norm_rope, OC_ALL, {2, 3, 128, 0}},
    {check_norm_rope, OC_ALL, {2, 8, 12, 0}},
    {check_norm_rope, OC_ALL, {2, 2, 256, 1}},
    /* n_seqs, heads, kv heads, head_dim, block size, sms (0: the backend), toks[4], last[4] */
    {check_attention, OC_GPU, {1, 32, 8, 128, 16, 0, 1, 0, 0, 0, 700}}, /* decode, split */
    {check_attention, OC_GPU, {4, 32, 8, 128, 16, 0, 1, 1, 1, 1, 0, 33, 517, 1023}},
    {check_attention, OC_ALL, {2, 4, 1, 16, 4, 0, 5, 1, 0, 0, 40, 9}},
    {check_attention, OC_GPU, {1, 32, 8, 128, 16, 0, 300, 0, 0, 0, 299}}, /* prefill, no split */
    {check_attention, OC_ALL, {2, 3, 3, 24, 4, 0, 20, 12, 0, 0, 19, 60}},
    {check_attention, OC_ALL, {1, 8, 1, 12, 4, 0, 7, 0, 0, 0, 77}},
    {check_attention, OC_ALL, {2, 4, 1, 256, 16, 0, 1, 3, 0, 0, 200, 2}},
    {check_attention, OC_GPU, {1, 64, 4, 128, 16, 0, 64, 0, 0, 0, 130}}, /* G = 16: four head groups */
    {check_attention, OC_ALL, {1, 8, 2, 128, 16, 2, 1, 0, 0, 0, 70}},    /* decode, split */
    {check_attention, OC_ALL, {4, 4, 1, 16, 4, 2, 1, 1, 1, 1, 0, 5, 40, 95}},
    {check_attention, OC_ALL, {2, 8, 1, 12, 4, 2, 2, 1, 0, 0, 9, 3}},     /* G = 8: two groups */
    {check_attention, OC_ALL, {1, 3, 3, 24, 4, 1, 12, 0, 0, 0, 40}},      /* unsplit (the batch fills the GPU) */
    {check_attention, OC_ALL, {1, 16, 1, 32, 4, 1, 3, 0, 0, 0, 20}},      /* G = 16 */
    {check_attention, OC_ALL, {1, 4, 1, 256, 8, 2, 1, 0, 0, 0, 33}},
    {check_attention, OC_ALL, {1, 4, 2, 16, 4, 1000, 40, 0, 0, 0, 39}},   /* prefill tokens on the split path */
    /* the same arguments, a[14] the KV dtype (kv_dtype.h; 0 above: f32) */
    {check_attention, OC_GPU, {1, 32, 8, 128, 16, 0, 1, 0, 0, 0, 700, 0, 0, 0, KV_BF16}},
    {check_attention, OC_GPU, {1, 32, 8, 128, 16, 0, 300, 0, 0, 0, 299, 0, 0, 0, KV_FP8}},
    {check_attention, OC_ALL, {1, 8, 2, 128, 16, 2, 1, 0, 0, 0, 70, 0, 0, 0, KV_BF16}},
    {check_attention, OC_ALL, {1, 8, 2, 128, 16, 2, 1, 0, 0, 0, 70, 0, 0, 0, KV_FP8}},
    {check_attention, OC_ALL, {4, 4, 1, 16, 4, 2, 1, 1, 1, 1, 0, 5, 40, 95, KV_BF16}},
    {check_attention, OC_ALL, {2, 3, 3, 24, 4, 0, 20, 12, 0, 0, 19, 60, 0, 0, KV_FP8}},
    {check_attention, OC_ALL, {1, 4, 1, 256, 8, 2, 1, 0, 0, 0, 33, 0, 0, 0, KV_FP8}},
    {check_attention, OC_ALL, {1, 4, 2, 16, 4, 1000, 40, 0, 0, 0, 39, 0, 0, 0, KV_BF16}},
    /* attention.cu's vector kernel (BF16 / FP8 at head_dim 64, 128, 256: workers of head_dim / 8 lanes, 4
     * positions a step): contexts of 1 and 4 positions (most workers empty), a tail of 2, partial head
     * groups (G = 3, 12), block sizes 4 .. 32, split and unsplit, several tokens of one sequence */
    {check_attention, OC_ALL, {4, 16, 4, 128, 16, 2, 1, 1, 1, 1, 0, 3, 37, 130, KV_BF16}},
    {check_attention, OC_ALL, {4, 16, 4, 128, 16, 2, 1, 1, 1, 1, 0, 3, 37, 130, KV_FP8}},
    {check_attention, OC_ALL, {2, 12, 1, 64, 8, 1, 1, 1, 0, 0, 61, 6, 0, 0, KV_FP8}},
    {check_attention, OC_ALL, {2, 12, 1, 64, 8, 3, 1, 1, 0, 0, 61, 6, 0, 0, KV_BF16}},
    {check_attention, OC_ALL, {1, 6, 2, 256, 4, 3, 1, 0, 0, 0, 98, 0, 0, 0, KV_BF16}},
    {check_attention, OC_ALL, {3, 4, 4, 128, 32, 1000, 1, 2, 1, 0, 200, 51, 5, 0, KV_FP8}},
    {check_attention, OC_FULL, {1, 8, 2, 128, 16, 2, 1, 0, 0, 0, 8191, 0, 0, 0, KV_BF16}},
    /* tensor cores (attention_mma.cu; sms 0: the backend chooses it, -1: its launcher): tiles of 64 query
     * rows, partial tiles, chunks deep in a context, two sequences in one tile, decode rows in a tile */
    {check_attention, OC_ALL, {1, 4, 1, 64, 16, 0, 70, 0, 0, 0, 69, 0, 0, 0, KV_BF16}},         /* G = 4 */
    {check_attention, OC_ALL, {2, 2, 2, 128, 16, 0, 40, 33, 0, 0, 139, 32, 0, 0, KV_BF16}},     /* G = 1 */
    {check_attention, OC_ALL, {1, 8, 1, 128, 8, 0, 20, 0, 0, 0, 150, 0, 0, 0, KV_BF16}},        /* G = 8 */
    {check_attention, OC_ALL, {2, 4, 1, 64, 16, 0, 17, 50, 0, 0, 80, 49, 0, 0, KV_FP8}},
    {check_attention, OC_ALL, {3, 2, 1, 128, 4, -1, 30, 1, 1, 0, 45, 70, 3, 0, KV_FP8}}, /* 3 runs: CUDA cores */
    {check_attention, OC_ALL, {3, 4, 1, 64, 16, 0, 100, 1, 1, 0, 99, 40, 70, 0, KV_BF16}}, /* tile 1: 3 runs */
    {check_attention, OC_ALL, {2, 4, 1, 64, 16, 0, 40, 1, 0, 0, 39, 30, 0, 0, KV_BF16}},   /* a decode row, 2 runs */
    {check_attention, OC_ALL, {1, 8, 2, 128, 16, 0, 200, 0, 0, 0, 399, 0, 0, 0, KV_BF16}},     /* 4 tiles at 200.. */
    {check_attention, OC_ALL, {2, 4, 4, 64, 16, 0, 100, 64, 0, 0, 163, 63, 0, 0, KV_FP8}},     /* a whole tile */
    {check_attention, OC_ALL, {4, 4, 1, 64, 16, 0, 30, 1, 1, 1, 29, 40, 50, 60, KV_BF16}}, /* < 16 per seq: CUDA cores */
    {check_attention, OC_GPU, {1, 32, 8, 128, 16, 0, 300, 0, 0, 0, 299, 0, 0, 0, KV_BF16}},
    {check_attention, OC_GPU, {2, 32, 8, 128, 16, 0, 512, 300, 0, 0, 1023, 299, 0, 0, KV_BF16}},
    {check_attention, OC_GPU, {1, 16, 16, 64, 16, 0, 257, 0, 0, 0, 256, 0, 0, 0, KV_BF16}},
    {check_attention, OC_GPU, {4, 32, 8, 128, 16, -1, 1, 1, 1, 1, 0, 33, 517, 1023, KV_BF16}}, /* decode rows */
    /* long contexts (issue 18): decode 32k positions deep on the split path, a prefill chunk at the
     * end of 8k / 32k positions on the tensor cores */
    {check_attention, OC_FULL, {1, 4, 1, 16, 16, 2, 1, 0, 0, 0, 32767, 0, 0, 0, KV_BF16}},
    {check_attention, OC_FULL, {1, 4, 2, 64, 16, 0, 20, 0, 0, 0, 8191, 0, 0, 0, KV_BF16}},
    /* the tensor-core kernel split over positions (sms -k: k splits): deep, short, two runs per tile,
     * three runs (CUDA cores after the merge), FP8, more splits than position tiles */
    {check_attention, OC_ALL, {1, 4, 2, 64, 16, -5, 20, 0, 0, 0, 8191, 0, 0, 0, KV_BF16}},
    {check_attention, OC_ALL, {2, 4, 1, 128, 16, -3, 40, 33, 0, 0, 700, 32, 0, 0, KV_BF16}},
    {check_attention, OC_ALL, {3, 2, 1, 128, 4, -4, 30, 1, 1, 0, 45, 70, 3, 0, KV_FP8}},
    {check_attention, OC_ALL, {1, 8, 2, 64, 16, -2, 70, 0, 0, 0, 300, 0, 0, 0, KV_FP8}},
    {check_attention, OC_ALL, {1, 4, 1, 64, 16, -9, 17, 0, 0, 0, 100, 0, 0, 0, KV_BF16}},
    {check_attention, OC_GPU, {2, 32, 8, 128, 16, 0, 1, 1, 0, 0, 32767, 12000, 0, 0, KV_BF16}},
    {check_attention, OC_GPU, {2, 32, 8, 128, 16, 0, 1, 1, 0, 0, 32767, 12000, 0, 0, KV_FP8}},
    /* grouped-head decode on tensor cores (attention_dec_mma.cu; sms 0: the backend takes it for G > 4,
     * -100 - k: its launcher with k splits): one position, tiles that end mid-way, a prefill run among
     * decode rows, more workers than tiles, G = 5 and 16, G = 2 through the launcher, FP8, block size 4,
     * 8k positions (the hi + lo split's f32 class holds over a long sum) */
    {check_attention, OC_ALL, {4, 8, 1, 128, 16, 0, 1, 1, 1, 1, 0, 33, 517, 130, KV_BF16}},
    {check_attention, OC_ALL, {2, 16, 2, 64, 8, -103, 1, 1, 0, 0, 200, 47, 0, 0, KV_FP8}},
    {check_attention, OC_FULL, {1, 16, 1, 128, 16, -105, 1, 0, 0, 0, 40, 0, 0, 0, KV_BF16}},
    {check_attention, OC_FULL, {2, 5, 1, 64, 4, 0, 3, 1, 0, 0, 20, 9, 0, 0, KV_BF16}},
    {check_attention, OC_FULL, {3, 4, 2, 128, 16, -101, 1, 1, 1, 0, 15, 16, 64, 0, KV_FP8}}, /* a tile starts at pos 64 */
    {check_attention, OC_FULL, {2, 8, 1, 64, 16, -102, 2, 1, 0, 0, 700, 301, 0, 0, KV_FP8}},
    {check_attention, OC_FULL, {1, 8, 1, 128, 16, -104, 1, 0, 0, 0, 8191, 0, 0, 0, KV_FP8}}, /* f32 class 8k deep */
    {check_attention, OC_GPU, {4, 32, 4, 128, 16, 0, 1, 1, 1, 1, 32767, 12000, 511, 4095, KV_BF16}}, /* Qwen3-30B-A3B */
    {check_attention, OC_GPU, {4, 32, 4, 128, 16, 0, 1, 1, 1, 1, 32767, 12000, 511, 4095, KV_FP8}},
    {check_attention, OC_GPU, {1, 32, 8, 128, 16, 0, 64, 0, 0, 0, 32767, 0, 0, 0, KV_BF16}},
    {check_attention, OC_GPU, {1, 32, 8, 128, 16, -16, 64, 0, 0, 0, 32767, 0, 0, 0, KV_FP8}},
    /* n, kv heads, head_dim, block size, n_blocks, KV dtype */
    {check_kv_write, OC_GPU, {64, 8, 128, 16, 8, KV_F32}},
    {check_kv_write, OC_GPU, {64, 8, 128, 16, 8, KV_BF16}},
    {check_kv_write, OC_GPU, {64, 8, 128, 16, 8, KV_FP8}},
    {check_kv_write, OC_ALL, {20, 2, 72, 4, 6, KV_F32}},
    {check_kv_write, OC_ALL, {20, 2, 72, 4, 6, KV_BF16}},
    {check_kv_write, OC_ALL, {20, 2, 72, 4, 6, KV_FP8}},
    {check_kv_write, OC_ALL, {13, 5, 24, 4, 4, KV_FP8}}, /* more kv heads than warps */
    {check_kv_write, OC_ALL, {3, 1, 256, 16, 2, KV_BF16}},
    /* the same, a[6] padded tokens (slot -1) at the end */
    {check_kv_write, OC_ALL, {20, 2, 72, 4, 6, KV_F32, 5}},
    {check_kv_write, OC_ALL, {13, 5, 24, 4, 4, KV_FP8, 3}},
    {check_kv_write, OC_ALL, {4, 2, 64, 16, 2, KV_BF16, 4}}, /* all padded */
    /* n, heads, kv heads, head_dim, block size, n_blocks, KV dtype, qk-norm, padded tokens */
    {check_rope_kv_write, OC_GPU, {64, 32, 8, 128, 16, 8, KV_BF16, 1, 0}},
    {check_rope_kv_write, OC_GPU, {64, 32, 8, 128, 16, 8, KV_FP8, 1, 7}},
    {check_rope_kv_write, OC_GPU, {1, 32, 8, 128, 16, 8, KV_F32, 0, 0}},   /* decode */
    {check_rope_kv_write, OC_ALL, {20, 4, 2, 72, 4, 7, KV_F32, 1, 0}},
    {check_rope_kv_write, OC_ALL, {20, 4, 2, 72, 4, 7, KV_BF16, 0, 3}},
    {check_rope_kv_write, OC_ALL, {20, 4, 2, 72, 4, 7, KV_FP8, 1, 3}},
    {check_rope_kv_write, OC_ALL, {13, 5, 5, 24, 4, 5, KV_FP8, 0, 0}},  /* more kv heads than warps */
    {check_rope_kv_write, OC_ALL, {3, 2, 1, 512, 16, 2, KV_BF16, 1, 1}}, /* 16 elements a lane */
    {check_rope_kv_write, OC_ALL, {5, 8, 2, 128, 16, 3, KV_F32, 1, 2}},
    {check_rope_kv_write, OC_ALL, {2, 3, 3, 12, 4, 3, KV_BF16, 1, 2}},   /* head_dim < 32, all padded */
    /* n (swiglu, add) */
    {check_elementwise, OC_ALL, {10001}},
    {check_elementwise, OC_ALL, {1000}},
    /* n, rows */
    {check_gemm_helpers, OC_ALL, {3, 40}},
    {check_gemm_helpers, OC_ALL, {1, 1000}},
    /* n_src, n, dim */
    {check_rows, OC_GPU, {64, 40, 4096}},
    {check_rows, OC_ALL, {37, 20, 72}},
    /* n, experts, top_k, norm, hidden, moe_inter, fmt (0 bf16, 1 fp8, 2 nvfp4, 3 / 4 fp8 act_quant
     * 128x128 / per channel), ties, skew */
    {check_moe, OC_GPU, {1, 128, 8, 1, 2048, 768, 0, 0, 0}},  /* Qwen3-30B-A3B decode */
    {check_moe, OC_GPU, {64, 128, 8, 1, 2048, 768, 0, 1, 0}},
    {check_moe, OC_GPU, {16, 32, 8, 1, 2048, 768, 1, 0, 0}},
    {check_moe, OC_GPU, {512, 128, 8, 1, 2048, 768, 0, 0, 0}},  /* a Qwen3-30B-A3B prefill: 32 pairs an expert */
    {check_moe, OC_GPU, {512, 128, 8, 1, 2048, 768, 1, 0, 1}},  /* fp8, skewed: 512 pairs on expert 1 */
    {check_moe, OC_GPU, {512, 128, 8, 1, 2048, 768, 2, 0, 0}},  /* nvfp4 */
    {check_moe, OC_GPU, {512, 128, 8, 1, 2048, 768, 3, 0, 0}},  /* fp8 native (act_quant) */
    {check_moe, OC_ALL, {1, 8, 2, 1, 64, 40, 0, 0, 0}},         /* the qwen3_moe fixture's shape */
    {check_moe, OC_ALL, {1, 16, 4, 1, 64, 32, 1, 0, 0, 1}},     /* fp8, + add_rmsnorm and its split */
    {check_moe, OC_ALL, {1, 16, 4, 1, 96, 32, 2, 0, 0, 1}},     /* nvfp4, the same */
    {check_moe, OC_FULL, {1, 8, 2, 1, 1032, 32, 0, 0, 0, 0}},   /* a row past 1024: the norm reads it twice */
    {check_moe, OC_FULL, {17, 8, 2, 0, 64, 56, 0, 1, 0}},        /* qwen3_moe_nonorm's, exact ties */
    {check_moe, OC_FULL, {80, 8, 2, 1, 32, 16, 0, 0, 0}},        /* n > 64: two routing launches; the mma */
    {check_moe, OC_ALL, {5, 128, 8, 1, 64, 32, 1, 1, 0}},       /* 128 experts, fp8 */
    {check_moe, OC_FULL, {3, 40, 32, 0, 32, 16, 1, 0, 0}},       /* top 32 of 40 experts, E not a multiple of 32 */
    {check_moe, OC_ALL, {6, 8, 2, 1, 64, 32, 2, 0, 0}},         /* nvfp4 experts */
    {check_moe, OC_ALL, {2, 16, 4, 1, 64, 32, 1, 0, 0}},        /* fp8, 2 tokens: the GEMV's 2-pair tile */
    {check_moe, OC_FULL, {19, 16, 4, 0, 96, 64, 2, 1, 0}},       /* nvfp4, > 8 pairs an expert: the mma */
    {check_moe, OC_ALL, {70, 16, 4, 1, 64, 40, 0, 0, 1}},       /* skewed: 70 pairs on one expert, 8 empty */
    {check_moe, OC_FULL, {70, 16, 4, 1, 160, 48, 1, 0, 1}},      /* fp8, skewed, two 128-column scale blocks */
    {check_moe, OC_FULL, {40, 16, 4, 1, 96, 64, 2, 1, 1}},       /* nvfp4, skewed */
    {check_moe, OC_ALL, {20, 8, 2, 1, 64, 32, 3, 0, 0}},        /* fp8 native: the qwen3_moe_fp4 fixture's shape */
    {check_moe, OC_FULL, {70, 16, 4, 1, 160, 48, 3, 0, 1}},      /* fp8 native, skewed, two x groups (one short) */
    {check_moe, OC_FULL, {9, 8, 2, 1, 256, 32, 3, 0, 0}},        /* act_quant below CUDA_NATIVE_MIN_N: the mma weight-only */
    {check_moe, OC_ALL, {24, 8, 2, 1, 256, 160, 4, 0, 0}},      /* fp8 native per channel: x per token over 256 / 160 */
    {check_moe, OC_GPU, {64, 128, 8, 1, 2048, 768, 2, 0, 0}},   /* Qwen3-30B-A3B at nvfp4 */
    /* rows, cols, fmt, swiglu, pair pattern (check_moe_gemm's pats) */
    /* n, E, top_k, norm, hidden, refused */
    {check_moe_router_route, OC_GPU, {1, 128, 8, 1, 2048, 0}}, /* Qwen3-30B-A3B decode */
    {check_moe_router_route, OC_ALL, {1, 8, 2, 1, 64, 0}},     /* the qwen3_moe fixture's */
    {check_moe_router_route, OC_ALL, {3, 128, 8, 1, 64, 0}},
    {check_moe_router_route, OC_FULL, {8, 256, 8, 0, 128, 0}}, /* the most experts, the most tokens */
    {check_moe_router_route, OC_ALL, {2, 42, 32, 0, 32, 0}},   /* a partial row tile, top 32 */
    {check_moe_router_route, OC_ALL, {2, 300, 4, 1, 64, 1}},   /* refused */
    {check_moe_gemm, OC_ALL, {72, 40, 0, 0, 0}},
    {check_moe_gemm, OC_ALL, {72, 136, 0, 0, 2}}, /* bf16, 5 stages: both buffers reused (a K tail of 8) */
    {check_moe_gemm, OC_FULL, {72, 40, 0, 1, 0}},
    {check_moe_gemm, OC_FULL, {136, 64, 0, 0, 1}},
    {check_moe_gemm, OC_ALL, {136, 160, 1, 0, 0}},
    {check_moe_gemm, OC_FULL, {72, 160, 1, 1, 1}},
    {check_moe_gemm, OC_FULL, {72, 96, 2, 0, 0}},
    /* fmt 3, native FP8: the sixth is the weights' layout (0 128x128, 1 per channel) */
    {check_moe_gemm, OC_ALL, {136, 160, 3, 0, 0, 0}},   /* two x groups, the second 32 wide; pair rows */
    {check_moe_gemm, OC_ALL, {72, 96, 3, 1, 1, 1}},     /* per channel (per-token x), swiglu, token rows */
    {check_moe_gemm, OC_FULL, {72, 256, 3, 1, 2, 0}},   /* two full groups, swiglu, token rows */
    {check_moe_gemm, OC_FULL, {200, 384, 3, 0, 1, 0}},  /* three groups, 129 pairs on one expert */
    {check_moe_gemm, OC_ALL, {40, 96, 2, 1, 2}},
    /* the grouped GEMV with its tile sized below the experts' counts (a[6] = max_cnt: passes of 2, 1, 4) */
    {check_moe_gemm, OC_ALL, {72, 40, 0, 0, 0, 0, 2}},
    {check_moe_gemm, OC_ALL, {136, 160, 1, 0, 2, 0, 1}},
    {check_moe_gemm, OC_ALL, {72, 96, 2, 0, 0, 0, 3}},
    /* the GEMV's SwiGLU epilogue (cuda_moe_gemv_swiglu): passes of 1 and 2 pairs */
    {check_moe_gemm, OC_ALL, {72, 40, 0, 1, 0, 0, 1}},
    {check_moe_gemm, OC_ALL, {136, 160, 1, 1, 2, 0, 2}},
    {check_moe_gemm, OC_FULL, {72, 96, 2, 1, 0, 0, 2}},
    {check_moe_gemm, OC_GPU, {768, 2048, 1, 1, 2, 0, 1}}, /* Qwen3-30B-A3B gate/up, one token */
    {check_moe_gemm, OC_GPU, {768, 2048, 0, 1, 2}},
    {check_moe_gemm, OC_GPU, {2048, 768, 1, 0, 0}},
    {check_moe_gemm, OC_GPU, {768, 2048, 2, 1, 1}},
    {check_moe_gemm, OC_GPU, {768, 2048, 3, 1, 2, 0}},  /* Qwen3-30B-A3B gate/up, fp8 native */
    {check_moe_gemm, OC_GPU, {2048, 768, 3, 0, 0, 0}},  /* its down, fp8 native */
    /* n, in, out, adapters, ranks[3], bf16 */
    {check_lora, OC_GPU, {16, 4096, 1024, 3, 16, 64, 8, 0}},  /* Qwen3-8B k_proj */
    {check_lora, OC_GPU, {5, 12288, 4096, 2, 32, 16, 0, 1}},  /* down_proj, bf16 */
    {check_lora, OC_ALL, {9, 72, 100, 3, 4, 8, 2, 0}},        /* ragged widths, tiles of 1..4 rows */
    {check_lora, OC_ALL, {1, 136, 40, 1, 16, 0, 0, 0}},        /* one decode row */
    {check_lora, OC_ALL, {13, 100, 300, 2, 33, 1, 0, 1}},      /* rank over a warp group, rank 1, bf16 */
    {check_lora, OC_ALL, {6, 40, 72, 1, 64, 0, 0, 0}},         /* rank 64 */
};
#undef FP8B
#undef FP8C
#undef FP8T

#include "op_checks_native.h" /* the native FP8 / NVFP4 paths: their checks and OP_CHECKS_NATIVE */

/* Every row (on_gpu) or the rows the emulation can afford. */
/* Backend.upload through the CUDA backend's pinned staging ring (backend_cuda.cu
 * cu_upload: 8 segments of 1 MiB): 24 uploads of 700 KB (one a segment, so the
 * ring wraps twice), the host source rewritten before each, no synchronize
 * until all are issued, then each destination read back. On a GPU the stream
 * is first held ~1.4 ms behind two 1 GiB device copies, so a segment reused
 * before its copy ran would show as wrong bytes; the emulation runs copies at
 * once and instead counts the copies that read pinned bytes an earlier copy
 * not yet waited for also read (emu_pinned_hazards). */
static void check_upload_ring(int on_gpu) {
    enum { K = 24 };
    size_t n = 700 * 1024;
    uint8_t *h = (uint8_t *)xmalloc(n), *back = (uint8_t *)xmalloc(n);
    void *d[K], *big[2] = {NULL, NULL};
    for (int i = 0; i < K; i++) d[i] = dev_poisoned(n);
    if (on_gpu) {
        for (int i = 0; i < 2; i++) CUDA_CHECK(cudaMalloc(&big[i], (size_t)1 << 30));
        bg->copy(bg, big[1], big[0], (size_t)1 << 30);
        bg->copy(bg, big[0], big[1], (size_t)1 << 30);
    }
#ifdef CUDA_EMULATION
    long hz0 = emu_pinned_hazards();
#endif
    for (int i = 0; i < K; i++) {
        for (size_t j = 0; j < n; j++) h[j] = (uint8_t)(i * 131 + j * 7 + (j >> 11));
        bg->upload(bg, d[i], h, n);
    }
    size_t bad = 0;
    for (int i = 0; i < K; i++) {
        bg->download(bg, back, d[i], n);
        for (size_t j = 0; j < n; j++) bad += back[j] != (uint8_t)(i * 131 + j * 7 + (j >> 11));
    }
    long hz = 0;
#ifdef CUDA_EMULATION
    hz = emu_pinned_hazards() - hz0;
#endif
    int ok = bad == 0 && hz == 0;
    ok ? n_pass++ : n_fail++;
    printf("  %-4s %-60s %-7s %zu wrong, %ld pinned rewrites before a wait\n", ok ? "ok" : "FAIL",
           "upload ring: 24 x 700 KB, source rewritten, no sync between", "exact", bad, hz);
    for (int i = 0; i < K; i++) cudaFree(d[i]);
    for (int i = 0; i < 2; i++) if (big[i]) cudaFree(big[i]);
    free(h); free(back);
}

/* on_gpu: every row; else (the emulation) OC_ALL rows, and OC_FULL rows unless quick. */
static int op_check_runs(int where, int on_gpu, int quick) {
    return on_gpu || where == OC_ALL || (where == OC_FULL && !quick);
}
/* The table's rows as one numbering (what gpu_check's "ops@ROW" steps count):
 * row 0 the upload ring, then OP_CHECKS, then OP_CHECKS_NATIVE. */
#define OP_CHECKS_N (sizeof OP_CHECKS / sizeof OP_CHECKS[0])
#define OP_CHECKS_NATIVE_N (sizeof OP_CHECKS_NATIVE / sizeof OP_CHECKS_NATIVE[0])
static size_t op_checks_row_count(void) { return 1 + OP_CHECKS_N + OP_CHECKS_NATIVE_N; }

/* Runs the rows from `from` on that this platform runs; before(row), when not
 * NULL, is called before each (gpu_check's watchdog and progress). */
static void op_checks_run_from(int on_gpu, int quick, size_t from, void (*before)(size_t row)) {
    for (size_t row = from; row < op_checks_row_count(); row++) {
        if (row == 0) {
            if (before) before(row);
            check_upload_ring(on_gpu);
            continue;
        }
        const OpCheck *c = row <= OP_CHECKS_N ? &OP_CHECKS[row - 1] : &OP_CHECKS_NATIVE[row - 1 - OP_CHECKS_N];
        if (!op_check_runs(c->where, on_gpu, quick)) continue;
        if (before) before(row);
        c->fn(c->a);
    }
}
static void op_checks_run(int on_gpu, int quick) { op_checks_run_from(on_gpu, quick, 0, NULL); }

#endif
