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
 * Not here: the per-matrix and per-shape choice (backend_cuda.cu).
 */
#include <stdio.h>

#include "cuda_native.h"
#include "device_select.h"
#include "log.h"

#pragma weak cuda_native_caps

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
