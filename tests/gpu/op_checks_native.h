/*
 * op_checks_native.h - the op checks of the native FP8 / NVFP4 paths
 * (cuda_native.h), included by op_checks.h and run with its table by both
 * runners (gpu_check on a device, emu_check on the CPU emulation):
 *   quantizers   cuda_quant_act_fp8 / _nvfp4 against quant_act_fp8,
 *                quant_act_fp8_token, quant_act_nvfp4 and quant_nvfp4_block:
 *                every byte (e4m3 codes, e2m1 codes, block scales) and every
 *                f32 scale bitwise equal ("bytes" class);
 *   GEMMs        cuda_gemm_fp8_block / _rowwise / cuda_gemm_nvfp4 on the device
 *                quantizers' output against the CPU w8a8 / w4a4 matmul
 *                (quant_act_* then quant_matmul_*_rows with xs) plus bias, and
 *                the backend's matmul of an act_quant matrix at n >= the
 *                crossover against the CPU backend's ("native" class:
 *                NMSE <= 1e-6, max|d| / max|ref| <= 1e-2). Why that bound: both
 *                sides multiply the same e4m3 / e2m1 values exactly and sum in
 *                f32 in different orders (~1e-7 relative); a Hopper FP8 MMA keeps
 *                fewer accumulator bits between its f32 promotions (~2^-14 of a
 *                128-deep block, NMSE ~1e-8); one wrong block scale, a swapped
 *                scale index or a lost tile is NMSE > 1e-3.
 * A GEMM this binary was not built for (cuda_native_caps: NVFP4 on sm_90,
 * FP8 block scales on sm_100/103) prints "skip" and counts as neither.
 */
#ifndef SAMPLER_OP_CHECKS_NATIVE_H
#define SAMPLER_OP_CHECKS_NATIVE_H

#include "cuda_native.h"

/* TOL_NATIVE and native_act are op_checks.h's (its grouped MoE GEMM rows use them too). */
static void *dev_get(const void *d, size_t bytes) {
    CUDA_CHECK(cudaDeviceSynchronize());
    void *h = xmalloc(bytes ? bytes : 1);
    if (bytes) CUDA_CHECK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
    return h;
}

/* FP8 quantizer: n, cols, per_token (group = cols, else 128). */
static void check_quant_act_fp8(const int *a) {
    int n = a[0], cols = a[1], per_token = a[2], group = per_token ? cols : QUANT_FP8_GROUP;
    int ng = quant_fp8_groups(cols), dng = per_token ? 1 : ng;
    size_t N = (size_t)n * cols;
    float *x = native_act(n, cols), *xq = (float *)xmalloc(sizeof(float) * N),
          *xs = (float *)xmalloc(sizeof(float) * (size_t)n * ng);
    if (per_token) quant_act_fp8_token(xq, xs, x, n, cols);
    else quant_act_fp8(xq, xs, x, n, cols);
    uint8_t *ref_q = (uint8_t *)xmalloc(N);
    for (size_t i = 0; i < N; i++) ref_q[i] = quant_f32_to_e4m3(xq[i]); /* exact: xq holds e4m3 values */
    float *ref_s = (float *)xmalloc(sizeof(float) * (size_t)n * dng);
    for (int t = 0; t < n; t++)
        for (int g = 0; g < dng; g++) ref_s[(size_t)g * n + t] = xs[(size_t)t * ng + g];
    float *dx = (float *)dev_copy(x, sizeof(float) * N);
    uint8_t *dq = (uint8_t *)dev_poisoned(N);
    float *ds = (float *)dev_poisoned(sizeof(float) * (size_t)n * dng);
    CHECK(cuda_quant_act_fp8(dq, ds, dx, n, cols, group, NULL) == 0, "cuda_quant_act_fp8 refused its shape");
    uint8_t *gq = (uint8_t *)dev_get(dq, N);
    float *gs = (float *)dev_get(ds, sizeof(float) * (size_t)n * dng);
    char what[96];
    snprintf(what, sizeof what, "quant_act fp8 %s n %d cols %d: e4m3 codes", per_token ? "per token" : "1x128", n, cols);
    compare_bytes(what, ref_q, gq, N);
    snprintf(what, sizeof what, "quant_act fp8 %s n %d cols %d: scales", per_token ? "per token" : "1x128", n, cols);
    compare_bytes(what, ref_s, gs, sizeof(float) * (size_t)n * dng);
    cudaFree(dx); cudaFree(dq); cudaFree(ds);
    free(x); free(xq); free(xs); free(ref_q); free(ref_s); free(gq); free(gs);
}

/* NVFP4 quantizer: n, cols, static scale (0: dynamic), swizzled scales. */
static void check_quant_act_nvfp4(const int *a) {
    int n = a[0], cols = a[1], swz = a[3], nb = cols / 16;
    float stat = a[2] ? 0.01f : 0.0f;
    size_t N = (size_t)n * cols, sfb = swz ? cuda_nvfp4_sf_bytes(n, cols) : (size_t)n * nb;
    float *x = native_act(n, cols), *xq = (float *)xmalloc(sizeof(float) * N), *xg = (float *)xmalloc(sizeof(float) * n);
    quant_act_nvfp4(xq, xg, x, n, cols, stat);
    uint8_t *ref_p = (uint8_t *)xmalloc(N / 2), *ref_sf = (uint8_t *)xcalloc(sfb, 1), codes[16];
    float *deq = (float *)xmalloc(sizeof(float) * N);
    for (int t = 0; t < n; t++)
        for (int b = 0; b < nb; b++) {
            uint8_t sb = quant_nvfp4_block(x + (size_t)t * cols + (size_t)b * 16, xg[t], codes);
            ref_sf[swz ? cuda_nvfp4_sf_offset(t, b, nb) : (size_t)t * nb + b] = sb;
            for (int i = 0; i < 8; i++)
                ref_p[(size_t)t * cols / 2 + (size_t)b * 8 + i] = (uint8_t)(codes[2 * i] | (codes[2 * i + 1] << 4));
            for (int i = 0; i < 16; i++)
                deq[(size_t)t * cols + b * 16 + i] = quant_e2m1_to_f32(codes[i]) * quant_e4m3_to_f32(sb);
        }
    float *dx = (float *)dev_copy(x, sizeof(float) * N), *dg = (float *)dev_poisoned(sizeof(float) * n);
    uint8_t *dp = (uint8_t *)dev_poisoned(N / 2), *dsf = (uint8_t *)dev_poisoned(sfb);
    CHECK(cuda_quant_act_nvfp4(dp, dsf, dg, dx, n, cols, stat, swz, NULL) == 0, "cuda_quant_act_nvfp4 refused its shape");
    uint8_t *gp = (uint8_t *)dev_get(dp, N / 2), *gsf = (uint8_t *)dev_get(dsf, sfb);
    float *gg = (float *)dev_get(dg, sizeof(float) * n);
    char what[96], tag[48];
    snprintf(tag, sizeof tag, "n %d cols %d%s%s", n, cols, stat > 0 ? " static" : "", swz ? " swizzled" : "");
    snprintf(what, sizeof what, "quant_act nvfp4 %s: the CPU rule's values", tag);
    compare_bytes(what, xq, deq, sizeof(float) * N); /* quant_nvfp4_block is quant_act_nvfp4's rule */
    snprintf(what, sizeof what, "quant_act nvfp4 %s: e2m1 codes", tag);
    compare_bytes(what, ref_p, gp, N / 2);
    snprintf(what, sizeof what, "quant_act nvfp4 %s: block scales", tag);
    compare_bytes(what, ref_sf, gsf, sfb);
    snprintf(what, sizeof what, "quant_act nvfp4 %s: global scales", tag);
    compare_bytes(what, xg, gg, sizeof(float) * n);
    cudaFree(dx); cudaFree(dg); cudaFree(dp); cudaFree(dsf);
    free(x); free(xq); free(xg); free(ref_p); free(ref_sf); free(deq); free(gp); free(gsf); free(gg);
}

enum { NK_FP8_BLOCK = 0, NK_FP8_ROWWISE = 1, NK_NVFP4 = 2 };
static const char *const NK_NAME[] = {"fp8 1x128 x 128x128", "fp8 per-channel", "nvfp4 vec16"};
static const int NK_CAP[] = {CUDA_NATIVE_FP8_BLOCK, CUDA_NATIVE_FP8_ROWWISE, CUDA_NATIVE_NVFP4};

static CudaLt *oc_lt;

/* The native GEMM launchers on the device quantizers' output: kind, n, rows, cols, bias. */
static void check_native_gemm(const int *a) {
    int kind = a[0], n = a[1], rows = a[2], cols = a[3], bias = a[4];
    char what[128];
    snprintf(what, sizeof what, "gemm %s n %d [%d x %d]%s", NK_NAME[kind], n, rows, cols, bias ? " +bias" : "");
    if (!(cuda_native_caps() & NK_CAP[kind])) {
        printf("  skip %-60s (this binary has no such GEMM: cuda_native.h)\n", what);
        return;
    }
    if (!oc_lt) oc_lt = cuda_lt_create();
    Err err = {0};
    size_t N = (size_t)n * cols;
    float *x = rand_f32(N, 2), *ref = (float *)xmalloc(sizeof(float) * (size_t)n * rows);
    float *xq = (float *)xmalloc(sizeof(float) * N), *xs = (float *)xmalloc(sizeof(float) * (size_t)n * quant_fp8_groups(cols));
    uint16_t *w = rand_bf16((size_t)rows * cols, 0, 0.05f), *b = bias ? rand_bf16(rows, 0, 1) : NULL;
    float *dx = (float *)dev_copy(x, sizeof(float) * N), *dout = (float *)dev_poisoned(sizeof(float) * (size_t)n * rows);
    uint16_t *db = bias ? (uint16_t *)dev_copy(b, sizeof(uint16_t) * rows) : NULL;
    void *d[7] = {0};
    int rc;
    if (kind != NK_NVFP4) {
        QuantFp8 *q = quant_fp8_from_bf16(w, rows, cols, kind == NK_FP8_BLOCK ? QUANT_FP8_BLOCK128 : QUANT_FP8_PER_CHANNEL, &err);
        CHECK(q, "quantize: %s", err.msg);
        if (kind == NK_FP8_BLOCK) quant_act_fp8(xq, xs, x, n, cols);
        else quant_act_fp8_token(xq, xs, x, n, cols);
        quant_matmul_fp8_rows(ref, xq, xs, q, n, 0, rows);
        int group = kind == NK_FP8_BLOCK ? QUANT_FP8_GROUP : cols, dng = (cols + group - 1) / group;
        d[0] = dev_copy(q->q, (size_t)rows * cols);
        d[1] = dev_copy(q->scale_inv, sizeof(float) * (size_t)q->scale_rows * q->scale_cols);
        d[2] = dev_poisoned(N);
        d[3] = dev_poisoned(sizeof(float) * (size_t)n * dng);
        CHECK(cuda_quant_act_fp8((uint8_t *)d[2], (float *)d[3], dx, n, cols, group, NULL) == 0, "quant_act refused");
        rc = kind == NK_FP8_BLOCK
                 ? cuda_gemm_fp8_block(oc_lt, dout, (uint8_t *)d[2], (float *)d[3], n, (uint8_t *)d[0], (float *)d[1],
                                       rows, cols, db, NULL)
                 : cuda_gemm_fp8_rowwise(oc_lt, dout, (uint8_t *)d[2], (float *)d[3], n, (uint8_t *)d[0],
                                         (float *)d[1], rows, cols, db, NULL);
        quant_fp8_free(q);
    } else {
        QuantNvfp4 *q = quant_nvfp4_from_bf16(w, rows, cols, &err);
        CHECK(q, "quantize: %s", err.msg);
        quant_act_nvfp4(xq, xs, x, n, cols, 0.0f);
        quant_matmul_nvfp4_rows(ref, xq, xs, q, n, 0, rows);
        d[0] = dev_copy(q->packed, (size_t)rows * cols / 2);
        d[1] = dev_copy(q->scale, (size_t)rows * cols / 16);
        d[2] = dev_poisoned(cuda_nvfp4_sf_bytes(rows, cols));
        d[3] = dev_poisoned(N / 2);
        d[4] = dev_poisoned(cuda_nvfp4_sf_bytes(n, cols));
        d[5] = dev_poisoned(sizeof(float) * n);
        d[6] = dev_copy(&q->scale2, sizeof(float)); /* the kernels read scale2 from the device */
        CHECK(cuda_nvfp4_swizzle((uint8_t *)d[2], (uint8_t *)d[1], rows, cols, NULL) == 0, "swizzle refused");
        CHECK(cuda_quant_act_nvfp4((uint8_t *)d[3], (uint8_t *)d[4], (float *)d[5], dx, n, cols, 0.0f, 1, NULL) == 0,
              "quant_act refused");
        rc = cuda_gemm_nvfp4(oc_lt, dout, (uint8_t *)d[3], (uint8_t *)d[4], (float *)d[5], n, (uint8_t *)d[0],
                             (uint8_t *)d[2], (const float *)d[6], rows, cols, db, NULL);
        quant_nvfp4_free(q);
    }
    if (b)
        for (int t = 0; t < n; t++)
            for (int r = 0; r < rows; r++) ref[(size_t)t * rows + r] += bf16_to_f32(b[r]);
    if (rc) {
        n_fail++;
        printf("  FAIL %-60s the launcher returned %d (cuBLASLt found no algorithm, or a shape check)\n", what, rc);
    } else {
        float *got = dev_result(dout, (size_t)n * rows);
        compare_op(what, TOL_NATIVE, ref, got, (size_t)n * rows);
        free(got);
    }
    for (int i = 0; i < 7; i++) cudaFree(d[i]);
    cudaFree(dx); cudaFree(dout); cudaFree(db);
    free(x); free(ref); free(xq); free(xs); free(w); free(b);
}

/* The backend's matmul of an act_quant matrix (the per-shape choice: native at
 * n >= CUDA_NATIVE_MIN_N where the matrix qualifies) against the CPU backend's
 * matmul of the same matrix: kind, n, rows, cols, bias. */
static void check_native_backend(const int *a) {
    int kind = a[0], n = a[1], rows = a[2], cols = a[3], bias = a[4];
    char what[128];
    snprintf(what, sizeof what, "backend matmul act_quant %s n %d [%d x %d]%s", NK_NAME[kind], n, rows, cols,
             bias ? " +bias" : "");
    if (!(cuda_native_caps() & NK_CAP[kind])) {
        printf("  skip %-60s (this binary has no such GEMM: cuda_native.h)\n", what);
        return;
    }
    Err err = {0};
    size_t N = (size_t)n * cols;
    float *x = rand_f32(N, 2), *ref = (float *)xmalloc(sizeof(float) * (size_t)n * rows);
    uint16_t *w = rand_bf16((size_t)rows * cols, 0, 0.05f), *b = bias ? rand_bf16(rows, 0, 1) : NULL;
    WeightMat hw = wmat_bf16(rows, cols, w), dw;
    hw.act_quant = 1;
    QuantFp8 dq;
    QuantNvfp4 dn;
    void *d1, *d2;
    if (kind != NK_NVFP4) {
        QuantFp8 *q = quant_fp8_from_bf16(w, rows, cols, kind == NK_FP8_BLOCK ? QUANT_FP8_BLOCK128 : QUANT_FP8_PER_CHANNEL, &err);
        CHECK(q, "quantize: %s", err.msg);
        hw.fmt = WF_FP8;
        hw.q = q;
        dq = *q;
        dq.q = (uint8_t *)(d1 = dev_copy(q->q, (size_t)rows * cols));
        dq.scale_inv = (float *)(d2 = dev_copy(q->scale_inv, sizeof(float) * (size_t)q->scale_rows * q->scale_cols));
        dw = hw;
        dw.q = &dq;
    } else {
        QuantNvfp4 *q = quant_nvfp4_from_bf16(w, rows, cols, &err);
        CHECK(q, "quantize: %s", err.msg);
        hw.fmt = WF_NVFP4;
        hw.q = q;
        dn = *q;
        dn.packed = (uint8_t *)(d1 = dev_copy(q->packed, (size_t)rows * cols / 2));
        dn.scale = (uint8_t *)(d2 = dev_copy(q->scale, (size_t)rows * cols / 16));
        dw = hw;
        dw.q = &dn;
        dw.dev_s2 = dev_scale2(q);
    }
    dw.bf16 = NULL;
    dw.dev = d1;
    dw.dev_scale = d2;
    bc->reserve(bc, n, cols);
    bc->matmul(bc, ref, x, n, &hw, b);
    float *dx = (float *)dev_copy(x, sizeof(float) * N), *dout = (float *)dev_poisoned(sizeof(float) * (size_t)n * rows);
    uint16_t *db = bias ? (uint16_t *)dev_copy(b, sizeof(uint16_t) * rows) : NULL;
    bg->matmul(bg, dout, dx, n, &dw, db);
    float *got = dev_result(dout, (size_t)n * rows);
    compare_op(what, TOL_NATIVE, ref, got, (size_t)n * rows);
    if (kind != NK_NVFP4) quant_fp8_free((QuantFp8 *)hw.q);
    else quant_nvfp4_free((QuantNvfp4 *)hw.q);
    cudaFree(d1); cudaFree(d2); cudaFree(dx); cudaFree(dout); cudaFree(db);
    free(x); free(ref); free(w); free(b); free(got);
}

static const OpCheck OP_CHECKS_NATIVE[] = {
    /* n, cols, per token */
    {check_quant_act_fp8, OC_ALL, {3, 300, 0}}, /* a ragged last group */
    {check_quant_act_fp8, OC_ALL, {2, 1024, 0}},
    {check_quant_act_fp8, OC_ALL, {4, 200, 1}},
    {check_quant_act_fp8, OC_ALL, {40, 128, 0}},
    {check_quant_act_fp8, OC_GPU, {256, 12288, 0}},
    {check_quant_act_fp8, OC_GPU, {256, 4096, 1}},
    /* n, cols, static scale, swizzled */
    {check_quant_act_nvfp4, OC_ALL, {3, 64, 0, 0}},
    {check_quant_act_nvfp4, OC_ALL, {3, 64, 1, 0}},
    {check_quant_act_nvfp4, OC_ALL, {130, 96, 0, 1}}, /* a second 128-row tile; 6 scales padded to 8 */
    {check_quant_act_nvfp4, OC_ALL, {5, 272, 1, 1}},
    {check_quant_act_nvfp4, OC_GPU, {256, 12288, 0, 1}},
    /* kind, n, rows, cols, bias */
    {check_native_gemm, OC_ALL, {NK_FP8_BLOCK, 3, 32, 512, 0}},
    {check_native_gemm, OC_ALL, {NK_FP8_BLOCK, 17, 144, 1024, 1}}, /* a partial 128-row scale block */
    {check_native_gemm, OC_ALL, {NK_FP8_ROWWISE, 5, 32, 144, 1}},
    {check_native_gemm, OC_ALL, {NK_NVFP4, 3, 32, 64, 0}},
    {check_native_gemm, OC_ALL, {NK_NVFP4, 130, 144, 96, 1}}, /* second tiles on both operands, padded scales */
    {check_native_gemm, OC_GPU, {NK_FP8_BLOCK, 64, 4096, 4096, 0}},
    {check_native_gemm, OC_GPU, {NK_FP8_BLOCK, 256, 12288, 4096, 1}},
    {check_native_gemm, OC_GPU, {NK_FP8_BLOCK, 33, 4096, 12288, 0}},
    {check_native_gemm, OC_GPU, {NK_FP8_ROWWISE, 64, 4096, 4096, 1}},
    {check_native_gemm, OC_GPU, {NK_NVFP4, 64, 4096, 4096, 0}},
    {check_native_gemm, OC_GPU, {NK_NVFP4, 256, 12288, 4096, 1}},
    /* kind, n (>= CUDA_NATIVE_MIN_N), rows, cols, bias */
    {check_native_backend, OC_ALL, {NK_FP8_BLOCK, 20, 32, 512, 1}},
    {check_native_backend, OC_ALL, {NK_FP8_ROWWISE, 16, 48, 160, 0}},
    {check_native_backend, OC_ALL, {NK_NVFP4, 18, 32, 96, 1}},
    {check_native_backend, OC_GPU, {NK_FP8_BLOCK, 128, 4096, 4096, 1}},
};

#endif
