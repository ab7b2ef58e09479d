/*
 * device_select.c - the start-up device and precision choice of device_select.h.
 *
 * The model layer is built once for every binary, but only the per-GPU
 * binaries link the CUDA objects (kernels/cuda/). The CUDA entry points are therefore
 * weak references here: in sampler-cpu they resolve to NULL and the choice is
 * always the CPU backend; in sampler-smXX they are the real functions.
 */
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "cuda_kernels.h"
#include "cuda_native.h"
#include "device_select.h"
#include "log.h"
#include "quant.h" /* QuantFp8: the experts' scale blocks */

#pragma weak cuda_binary_sm
#pragma weak cuda_device_probe
#pragma weak backend_cuda_create
#pragma weak backend_cuda_native_kind
#pragma weak cuda_moe_gemm_fp8_native

const char *device_binary_for(int major, int minor) {
    if (major == 8) return "sampler-sm80";
    if (major == 9 && minor == 0) return "sampler-sm90";
    if (major == 10 && minor == 0) return "sampler-sm100";
    if (major == 10 && minor == 3) return "sampler-sm103";
    return NULL;
}

int device_check_binary(int binary_sm, int major, int minor, Err *err) {
    const char *want = device_binary_for(major, minor);
    if (!want)
        return ERR(err, 500, "the GPU is sm_%d%d, which no sampler binary targets (sampler-sm80: A100 and other "
                   "8.x, sampler-sm90: H100/H200, sampler-sm100: B200, sampler-sm103: B300)\n  fix: run "
                   "sampler-cpu", major, minor);
    char mine[32];
    snprintf(mine, sizeof mine, "sampler-sm%d", binary_sm);
    if (strcmp(mine, want))
        return ERR(err, 500, "this is %s, built for sm_%d%s, but the GPU is sm_%d%d\n  fix: run %s", mine, binary_sm,
                   binary_sm == 80 ? "" : "a", major, minor, want);
    return 0;
}

int device_select(DeviceChoice *out, int force_cpu, Precision p, Err *err) {
    memset(out, 0, sizeof *out);
    out->precision = p;
    snprintf(out->name, sizeof out->name, "cpu");
    int has_cuda = cuda_binary_sm && cuda_device_probe && backend_cuda_create;
    if (force_cpu || !has_cuda) {
        log_info("device: cpu backend (%s), precision %s", force_cpu ? "requested" : "binary without CUDA code",
                 precision_name(p));
        return 0;
    }
    out->binary_sm = cuda_binary_sm();
    if (cuda_device_probe(&out->major, &out->minor, &out->sm_count, &out->mem_bytes, out->name,
                          (int)sizeof out->name) != 0)
        return ERR(err, 500, "sampler-sm%d: no CUDA device found (driver missing, or no GPU visible to this "
                   "process)\n  fix: run sampler-cpu, or pass --device cpu", out->binary_sm);
    int rc = device_check_binary(out->binary_sm, out->major, out->minor, err);
    if (rc) return rc;
    out->gpu = 1;
    if (p == PREC_BF16)
        log_info("device: %s (sm_%d%d, %d SMs, %.1f GiB) with sampler-sm%d; precision bf16: GEMV for <= %d tokens, "
                 "cuBLAS BF16 GEMM (f32 accumulate) beyond, paged flash-decoding attention",
                 out->name, out->major, out->minor, out->sm_count, out->mem_bytes / 1073741824.0, out->binary_sm,
                 CUDA_GEMV_MAX_N);
    else /* native or weight-only: device_native_check decides and logs, the backend counts per matrix */
        log_info("device: %s (sm_%d%d, %d SMs, %.1f GiB) with sampler-sm%d; precision %s: weight-only GEMV below "
                 "each shape's crossover, the native tensor-core GEMM at and above it for act_quant matrices that "
                 "have one (cuda_native.h), paged flash-decoding attention",
                 out->name, out->major, out->minor, out->sm_count, out->mem_bytes / 1073741824.0, out->binary_sm,
                 precision_name(p));
    return 0;
}

/* An act_quant FP8 expert the grouped native GEMM takes (moe_mma.cu fmt 3, cuda_moe_gemm_fp8_native). */
static int expert_native(const WeightMat *w) {
    const QuantFp8 *q = (const QuantFp8 *)w->q;
    return w->fmt == WF_FP8 && w->act_quant && q && cuda_moe_gemm_fp8_native &&
           cuda_moe_gemm_fp8_native(q->block_cols, w->cols);
}

Runner *device_runner_create(const DeviceChoice *d, Model *m, int max_tokens, int max_ctx, int n_threads) {
    if (!d->gpu) return runner_create(m, max_tokens, max_ctx, n_threads);
    Backend *b = backend_cuda_create(&m->weights, m->cfg.head_dim, max_ctx);
    int n_q = 0, n_native = 0, n_ex_native = 0;
    for (int i = 0; i < m->weights.n; i++) {
        const WeightMat *w = m->weights.t[i].vec ? NULL : m->weights.t[i].mat;
        if (!w || w->fmt == WF_BF16) continue;
        n_q++;
        if (model_is_routed_expert(m, w)) n_ex_native += expert_native(w); /* the grouped MoE GEMM, not cuBLASLt */
        else n_native += backend_cuda_native_kind && backend_cuda_native_kind(w) != 0;
    }
    if (n_q)
        log_info("cuda backend: %d %s matrices; %d take the native tensor-core GEMM from their crossover "
                 "(activations quantized on the device)%s, the rest and every smaller batch the weight-only GEMV "
                 "(f32 activations)%s", n_q, precision_name(m->precision), n_native + n_ex_native,
                 n_ex_native ? " (the routed experts' among them: the grouped e4m3 GEMM, one crossover for all)" : "",
                 m->act_quant && n_native + n_ex_native < n_q ? "; the weight-only ones differ from the CPU backend, "
                                                                "which quantizes activations for every matrix" : "");
    device_gemv_calibrate(b, m); /* first: the native crossover times the weight-only GEMV it chose */
    if (n_native || n_ex_native) device_native_calibrate(b, m, max_tokens, d->native_crossover); /* before any graph */
    return runner_create_with(m, b, max_tokens, max_ctx);
}
