/*
 * bench_delta_quant.h - a quantized matrix's update on the device after a
 * sparse delta (issue 19's "deltas on quantized devices"), the two paths of
 * backend_cuda.cu's cu_weights_changed: the changed bytes scattered
 * (quant_update_sparse) and the whole re-upload, both read back and verified.
 * One matrix (FP8 128x128 or NVFP4) of normal weights (sd 0.02) is quantized
 * on load and copied to the device; frac of its elements move by 1e-4 (an
 * optimizer step's size), the host re-quantizes (timed), the device takes
 * the touched indices (timed: the sparse path, which must be the one taken);
 * then another such step reaches the device with no indices (timed: the
 * whole path). After each, every device byte (quantized bytes, scales,
 * NVFP4's tensor scale) must equal the host's.
 * gpu_check: [12288, 4096] (a Qwen3-8B MLP matrix) at 0.1% and 1%, rows
 * delta_<fmt>_12288x4096_<frac>_{host_requant_ms, device_sparse_ms,
 * device_whole_ms}; emu_check: [256, 512], correctness only.
 * Not here: the delta format and commit (server/delta), the fault paths
 * (emu_check's t_delta_fault). The includer provides n_pass / n_fail,
 * rng_u64 and wmat_bf16 (op_checks.h).
 */
#ifndef SAMPLER_BENCH_DELTA_QUANT_H
#define SAMPLER_BENCH_DELTA_QUANT_H

#include <math.h>
#include <time.h>

static double dq_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* (0, 1) from op_checks.h's generator. */
static double dq_uniform(void) { return ((double)(rng_u64() >> 11) + 0.5) / 9007199254740992.0; }

/* Device bytes [n] at d == host bytes h. */
static int dq_same(const void *d, const void *h, size_t n) {
    void *got = xmalloc(n ? n : 1);
    int same = cudaMemcpy(got, d, n, cudaMemcpyDeviceToHost) == cudaSuccess && memcmp(got, h, n) == 0;
    free(got);
    return same;
}

static int dq_device_is_host(const WeightMat *w) {
    size_t n = (size_t)w->rows * w->cols;
    if (w->fmt == WF_FP8) {
        const QuantFp8 *q = (const QuantFp8 *)w->q;
        return dq_same(w->dev, q->q, n) &&
               dq_same(w->dev_scale, q->scale_inv, sizeof(float) * (size_t)q->scale_rows * q->scale_cols);
    }
    const QuantNvfp4 *q = (const QuantNvfp4 *)w->q;
    return dq_same(w->dev, q->packed, n / 2) && dq_same(w->dev_scale, q->scale, n / QUANT_NVFP4_BLOCK) &&
           dq_same(w->dev_s2, &q->scale2, sizeof(float));
}

/* One optimizer-sized step on frac of m's elements: idx [*n] ascending, distinct. */
static void dq_step(uint16_t *m, size_t numel, double frac, int64_t *idx, int64_t *n) {
    int64_t k = (int64_t)(frac * (double)numel), cnt = 0;
    for (int64_t i = 0; i < (int64_t)numel && cnt < k; i++) /* a random subset of exactly ~k, in order */
        if (dq_uniform() * (double)(numel - (size_t)i) < (double)(k - cnt)) idx[cnt++] = i;
    for (int64_t i = 0; i < cnt; i++)
        m[idx[i]] = f32_to_bf16(bf16_to_f32(m[idx[i]]) + (dq_uniform() < 0.5 ? -1e-4f : 1e-4f));
    *n = cnt;
}

static int dq_requant(WeightMat *w, const int64_t *idx, int64_t n, Err *err) {
    if (w->fmt == WF_FP8) return quant_fp8_requant((QuantFp8 *)w->q, w->bf16, idx, (size_t)n, err) < 0 ? -1 : 0;
    return quant_nvfp4_requant((QuantNvfp4 *)w->q, w->bf16, idx, (size_t)n, err) < 0 ? -1 : 0;
}

/* row: gpu_check's named-row sink, or NULL (no rows, emu_check). */
static void dq_run(int rows, int cols, WeightFormat fmt, double frac, void (*row)(const char *, double)) {
    Err err = {0};
    size_t numel = (size_t)rows * cols;
    uint16_t *m = (uint16_t *)xmalloc(numel * 2);
    for (size_t i = 0; i < numel; i++)
        m[i] = f32_to_bf16((float)(0.02 * sqrt(-2 * log(dq_uniform())) * cos(6.283185307179586 * dq_uniform())));
    WeightMat w = wmat_bf16(rows, cols, m); /* op_checks.h; then the quantized form */
    w.fmt = fmt;
    w.q = fmt == WF_FP8 ? (void *)quant_fp8_from_bf16(m, rows, cols, QUANT_FP8_BLOCK128, &err)
                        : (void *)quant_nvfp4_from_bf16(m, rows, cols, &err);
    CHECK(w.q, "bench_delta_quant: quantize: %s", err.msg);
    OneMat om;
    Backend *b = backend_cuda_create(one_mat_set(&om, &w), 128, 128);
    int64_t *idx = (int64_t *)xmalloc(sizeof(int64_t) * (size_t)(frac * (double)numel + 1));
    int64_t n = 0;
    uint64_t s0, f0, s1, f1, s2, f2;
    backend_cuda_update_counts(b, &s0, &f0);
    dq_step(m, numel, frac, idx, &n);
    double t0 = dq_now();
    int rc = dq_requant(&w, idx, n, &err);
    double host_ms = (dq_now() - t0) * 1e3;
    t0 = dq_now();
    rc |= rc ? 0 : b->weights_changed(b, &om.t, idx, n, 2, &err); /* returns once verified (synchronous) */
    double sparse_ms = (dq_now() - t0) * 1e3;
    backend_cuda_update_counts(b, &s1, &f1);
    int same1 = dq_device_is_host(&w);
    dq_step(m, numel, frac, idx, &n);
    rc |= rc ? 0 : dq_requant(&w, idx, n, &err);
    t0 = dq_now();
    rc |= rc ? 0 : b->weights_changed(b, &om.t, NULL, 0, 2, &err);
    double whole_ms = (dq_now() - t0) * 1e3;
    backend_cuda_update_counts(b, &s2, &f2);
    int same2 = dq_device_is_host(&w);
    int ok = rc == 0 && same1 && same2 && s1 == s0 + 1 && f1 == f0 && f2 == f1 + 1;
    ok ? n_pass++ : n_fail++;
    const char *fn = fmt == WF_FP8 ? "fp8" : "nvfp4";
    printf("  %-4s delta on a quantized [%d, %d] %s matrix, %.2f%% of it moved by 1e-4: host re-quantize %.2f ms, "
           "device by its changed bytes %.2f ms%s, whole %.2f ms; device == host after each: %s%s%s\n",
           ok ? "ok" : "FAIL", rows, cols, fn, 100 * frac, host_ms, sparse_ms,
           s1 == s0 + 1 ? "" : " (NOT the sparse path)", whole_ms, same1 && same2 ? "yes" : "NO", rc ? "; " : "",
           rc ? err.msg : "");
    if (row && ok) {
        char name[96], fr[16];
        snprintf(fr, sizeof fr, "%gpct", 100 * frac);
        for (char *p = fr; *p; p++)
            if (*p == '.') *p = 'p';
        const char *what[3] = {"host_requant_ms", "device_sparse_ms", "device_whole_ms"};
        double v[3] = {host_ms, sparse_ms, whole_ms};
        for (int i = 0; i < 3; i++) {
            snprintf(name, sizeof name, "delta_%s_%dx%d_%s_%s", fn, rows, cols, fr, what[i]);
            row(name, v[i]);
        }
    }
    b->free(b);
    if (fmt == WF_FP8) quant_fp8_free((QuantFp8 *)w.q);
    else quant_nvfp4_free((QuantNvfp4 *)w.q);
    free(idx);
    free(m);
}

#endif
