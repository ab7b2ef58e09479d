/*
 * device_native.c - the start-up choice between the native (quantized
 * activations on tensor cores) and the weight-only GPU paths of --precision
 * fp8 / nvfp4, from what this binary's CUDA code has (cuda_native_caps,
 * cuda_native.h). --weight-only always selects the weight-only path.
 *   fp8, sm_90 binary:        native, the checkpoint's 128x128 block scales.
 *   fp8, sm_100 / sm_103:     native per channel: the weights are quantized per
 *                             output row at load (LoadOptions.fp8_per_channel)
 *                             because cuBLASLt has no 128x128 scales there.
 *   fp8, sm_80:               refused (no FP8 tensor cores), fix: --weight-only.
 *   nvfp4, sm_100 / sm_103:   native VEC16_UE4M3.
 *   nvfp4, sm_80 / sm_90:     refused (no FP4 tensor cores), fix: --weight-only.
 * The CPU backend is unaffected (it runs quantized activations itself).
 * Also here: the per-shape crossover between the two GPU paths of an
 * act_quant matrix (device_native_crossover's ladder and rule, and
 * device_native_calibrate, which measures every distinct shape of the model
 * on the device at start-up and records the result in WeightMat.native_min_n).
 * Not here: the per-matrix path itself and the timing (backend_cuda.cu).
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "cuda_native.h"
#include "device_select.h"
#include "log.h"

#pragma weak cuda_native_caps
#pragma weak backend_cuda_native_kind
#pragma weak backend_cuda_native_time

int device_native_plan(int gpu, int binary_sm, int caps, Precision p, int weight_only, int *fp8_per_channel,
                       Err *err) {
    *fp8_per_channel = 0;
    if (!gpu || p == PREC_BF16 || weight_only) return 0;
    if (p == PREC_FP8) {
        if (caps & CUDA_NATIVE_FP8_BLOCK) return 0;
        if (caps & CUDA_NATIVE_FP8_ROWWISE) {
            *fp8_per_channel = 1;
            return 0;
        }
        return ERR(err, 500, "sampler-sm%d has no FP8 tensor-core GEMM (an sm_8x GPU has no FP8 tensor cores), so "
                   "--precision fp8 with quantized activations cannot run here\n  fix: pass --weight-only (FP8 "
                   "weights dequantized in the GEMV, f32 activations), or run on an H100/H200/B200/B300",
                   binary_sm);
    }
    if (caps & CUDA_NATIVE_NVFP4) return 0;
    return ERR(err, 500, "native NVFP4 (e2m1 activations on FP4 tensor cores) needs a Blackwell GPU and "
               "sampler-sm100 / sampler-sm103; sampler-sm%d has no NVFP4 GEMM\n  fix: pass --weight-only to run "
               "the NVFP4 weights with f32 activations (the weight-only GEMV), or use --precision fp8",
               binary_sm);
}

int device_native_check(const DeviceChoice *d, LoadOptions *load, Err *err) {
    int caps = d->gpu && cuda_native_caps ? cuda_native_caps() : 0, per_channel = 0;
    int rc = device_native_plan(d->gpu, d->binary_sm, caps, load->precision, load->weight_only, &per_channel, err);
    if (rc) return rc;
    load->fp8_per_channel = per_channel;
    if (d->gpu && load->precision != PREC_BF16)
        log_info("device: precision %s on the GPU: %s", precision_name(load->precision),
                 load->weight_only ? "weight-only (--weight-only): f32 activations, weights dequantized in the GEMV"
                 : per_channel ? "native FP8 per channel (weights re-quantized per output row at load: cuBLASLt "
                                 "has no 128x128 block scales on this GPU), weight-only GEMV below the crossover"
                               : "native tensor-core GEMM (activations quantized on the device), weight-only GEMV "
                                 "below the crossover");
    return 0;
}

/* The ladder: 1, 2, 3, 4, 6, 8, 12, ... (2^k and 3 * 2^(k-1)), the batch sizes measured. */
static int ladder_at(int i) { return i < 2 ? i + 1 : (i % 2 ? 4 : 3) << ((i - 2) / 2); }

int device_native_crossover(NativeTimeFn time, void *ctx, int max_n, NativeCrossover *out) {
    memset(out, 0, sizeof *out);
    out->min_n = INT_MAX;
    int wins_at_end = 0;
    for (int i = 0; i < NATIVE_XOVER_MAX; i++) {
        int n = ladder_at(i);
        if (n > max_n || n > 65535) break;
        /* past 64 tokens only until native has won at two points in a row there: the weight-only GEMV
         * re-reads the weights for every few tokens (its time grows with n), the GEMM reads them once */
        if (wins_at_end >= 2) break;
        float wo = -1, na = -1;
        if (time(ctx, n, &wo, &na) != 0 || wo < 0) return -1;
        out->n[out->points] = n;
        out->wo_us[out->points] = wo;
        out->native_us[out->points] = na;
        out->points++;
        wins_at_end = n > 64 && na >= 0 && na < wo ? wins_at_end + 1 : 0;
    }
    /* native from the point after the last one it lost (or was refused at); never when it lost the last */
    int last_loss = -1;
    for (int i = 0; i < out->points; i++)
        if (!(out->native_us[i] >= 0 && out->native_us[i] < out->wo_us[i])) last_loss = i;
    if (out->points && last_loss + 1 < out->points) out->min_n = out->n[last_loss + 1];
    return 0;
}

/* The backend's timer as a NativeTimeFn. */
typedef struct { Backend *b; const WeightMat *w; } TimeCtx;
static int time_on_device(void *ctx, int n, float *wo_us, float *native_us) {
    const TimeCtx *t = (const TimeCtx *)ctx;
    return backend_cuda_native_time(t->b, t->w, n, 5, wo_us, native_us);
}
int device_native_crossover_on(Backend *b, const WeightMat *w, int max_n, NativeCrossover *out) {
    if (!backend_cuda_native_time) return -1;
    TimeCtx t = {b, w};
    return device_native_crossover(time_on_device, &t, max_n, out);
}

/* "native from n = 24 (n: weight-only / native us) 1: 10.2 / 31.0, 2: ..." into buf. */
static void crossover_describe(const NativeCrossover *x, char *buf, size_t cap) {
    size_t o = 0;
    if (x->min_n == INT_MAX) o += (size_t)snprintf(buf, cap, "weight-only at every size measured");
    else o += (size_t)snprintf(buf, cap, "native from n = %d", x->min_n);
    for (int i = 0; i < x->points && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%d: %.1f / %.1f", i ? ", " : " (n: weight-only / native us) ",
                              x->n[i], x->wo_us[i], x->native_us[i]);
}

int device_native_calibrate(Backend *b, Model *m, int max_tokens, int fixed) {
    if (!backend_cuda_native_kind || !backend_cuda_native_time || !m->act_quant) return 0;
    enum { MAX_SHAPES = 64 };
    struct { int fmt, kind, rows, cols, min_n; } shapes[MAX_SHAPES];
    int n_shapes = 0, n_mats = 0;
    for (int i = 0; i < m->weights.n; i++) {
        WeightMat *w = m->weights.t[i].vec ? NULL : m->weights.t[i].mat;
        int kind = w ? backend_cuda_native_kind(w) : 0;
        if (!kind || model_is_routed_expert(m, w)) continue; /* experts: the grouped GEMM's own rule */
        n_mats++;
        if (fixed > 0) {
            w->native_min_n = fixed;
            continue;
        }
        int s = 0;
        while (s < n_shapes && !(shapes[s].fmt == (int)w->fmt && shapes[s].kind == kind && shapes[s].rows == w->rows &&
                                 shapes[s].cols == w->cols))
            s++;
        if (s == n_shapes) {
            if (n_shapes == MAX_SHAPES) { /* more distinct shapes than any model we know: the constant */
                w->native_min_n = 0;
                continue;
            }
            NativeCrossover x;
            if (device_native_crossover_on(b, w, max_tokens, &x) != 0) {
                log_warn("native crossover: timing [%d x %d] on the device failed; every act_quant matrix keeps "
                         "the constant (native from %d tokens)", w->rows, w->cols, CUDA_NATIVE_MIN_N);
                for (int j = 0; j < m->weights.n; j++)
                    if (!m->weights.t[j].vec && m->weights.t[j].mat) m->weights.t[j].mat->native_min_n = 0;
                return -1;
            }
            char desc[1024];
            crossover_describe(&x, desc, sizeof desc);
            log_info("native crossover: %s [%d x %d]: %s", w->fmt == WF_FP8 ? "fp8" : "nvfp4", w->rows, w->cols, desc);
            shapes[n_shapes].fmt = (int)w->fmt;
            shapes[n_shapes].kind = kind;
            shapes[n_shapes].rows = w->rows;
            shapes[n_shapes].cols = w->cols;
            shapes[n_shapes].min_n = x.min_n;
            n_shapes++;
        }
        w->native_min_n = shapes[s].min_n;
    }
    if (fixed > 0 && n_mats)
        log_info("native crossover: --native-crossover %d: %d act_quant matrices take the native GEMM from %d tokens",
                 fixed, n_mats, fixed);
    else if (n_mats)
        log_info("native crossover: %d act_quant matrices of %d shapes measured on the device (up to %d tokens)",
                 n_mats, n_shapes, max_tokens);
    return 0;
}
