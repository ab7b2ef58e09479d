/*
 * device_select.h - start-up choice of the device, kernels and precision.
 *
 * Every binary holds the CPU backend; the per-GPU binaries (sampler-sm80,
 * -sm90, -sm100, -sm103) also hold the CUDA backend for exactly one GPU
 * architecture. At start-up the binary probes device 0 (compute capability,
 * memory, SM count), refuses a device it was not built for with a message
 * naming the binary that fits, refuses a native (quantized-activation)
 * precision its tensor cores cannot run (device_native_check: NVFP4 below
 * sm_100, FP8 on sm_80; --weight-only runs them weight-only), logs the choice,
 * and, on a GPU, measures each act_quant shape's crossover between the
 * weight-only GEMV and the native GEMM (device_native_calibrate).
 * Not here: the forward pass (model.h), argument parsing (flags.c).
 */
#ifndef SAMPLER_DEVICE_SELECT_H
#define SAMPLER_DEVICE_SELECT_H

#include <stddef.h>

#include "backend.h"
#include "check.h"
#include "model.h"

typedef struct DeviceChoice {
    int gpu;            /* 1: CUDA backend on device 0; 0: CPU backend */
    int binary_sm;      /* architecture this binary's CUDA code targets; 0 in sampler-cpu */
    int major, minor;   /* compute capability of device 0 (0.0 when none / CPU) */
    int sm_count;
    size_t mem_bytes;
    char name[256];     /* device name, or "cpu" */
    Precision precision; /* model.h; precision_parse / precision_name live there */
    int native_crossover; /* --native-crossover: 0 = measured per shape at start-up, N: native from N tokens */
} DeviceChoice;

/* The binary built for compute capability major.minor ("sampler-sm90"), or
 * NULL when no per-GPU binary runs on it. sm_80 code runs on every 8.x
 * device; the arch-specific sm_90a / sm_100a / sm_103a code runs only on
 * exactly 9.0 / 10.0 / 10.3. */
const char *device_binary_for(int major, int minor);

/* 0 when a binary built for binary_sm runs on a major.minor device; else -1
 * with err saying which binary to run instead. */
int device_check_binary(int binary_sm, int major, int minor, Err *err);

/* Start-up: choose the device. force_cpu (a --device cpu flag) or a binary
 * without CUDA code gives the CPU backend; a per-GPU binary otherwise needs a
 * matching device and, today, precision bf16. Returns 0 and logs the choice,
 * or -1 with err saying how to fix it (the caller exits). */
int device_select(DeviceChoice *out, int force_cpu, Precision p, Err *err);

/* The native (quantized-activation) GPU path of --precision fp8 / nvfp4
 * (device_native.c): 0, or -1 with err saying how to fix it (--weight-only)
 * when this binary has no tensor-core GEMM for the precision. Pure: gpu,
 * binary_sm and caps (cuda_native.h bits) as device_select found them;
 * *fp8_per_channel = 1 when FP8 must be quantized per output channel at load. */
int device_native_plan(int gpu, int binary_sm, int caps, Precision p, int weight_only, int *fp8_per_channel,
                       Err *err);
/* device_native_plan for the chosen device; sets load->fp8_per_channel and logs the path. */
int device_native_check(const DeviceChoice *d, LoadOptions *load, Err *err);

/* The crossover between an act_quant matrix's two GPU paths (the weight-only
 * GEMV, the native GEMM), measured: time(ctx, n, ...) gives both paths' us at
 * n tokens (native_us < 0: refused) for the ladder 1, 2, 3, 4, 6, 8, 12, 16,
 * ... up to max_n, every point to 64 and beyond it until native has won at two
 * points in a row there. min_n: the point after the last one native lost (or was
 * refused at), INT_MAX when it lost the last one measured. 0, or -1 when
 * time failed. */
#define NATIVE_XOVER_MAX 32
typedef struct NativeCrossover {
    int min_n;                      /* native from min_n tokens; INT_MAX: weight-only at every size */
    int points;                     /* measured ladder points */
    int n[NATIVE_XOVER_MAX];        /* tokens */
    float wo_us[NATIVE_XOVER_MAX];  /* weight-only GEMV, best of the runs */
    float native_us[NATIVE_XOVER_MAX]; /* quantizer + native GEMM; < 0: refused */
} NativeCrossover;
typedef int (*NativeTimeFn)(void *ctx, int n, float *wo_us, float *native_us);
int device_native_crossover(NativeTimeFn time, void *ctx, int max_n, NativeCrossover *out);
/* device_native_crossover of w on the CUDA backend b (backend_cuda_native_time, best of 5): what
 * device_native_calibrate measures for w's shape. -1 in a binary without CUDA code. */
int device_native_crossover_on(Backend *b, const WeightMat *w, int max_n, NativeCrossover *out);

/* One MoE layer's routed step on a device backend (start-up timing, checks):
 * backend memory for up to max_n tokens (x, out, the routing, moe_mlp's
 * scratch), x and the router logits a fixed pseudo-random pattern in [-1, 1)
 * (random logits spread the pairs about evenly over the experts). route: n
 * tokens through b->moe_route, *a ready for b->moe_mlp (a->out [n, hidden] in
 * backend memory, valid until the next route or free). Fatal when memory runs
 * out (start-up). */
typedef struct DeviceMoeBench DeviceMoeBench;
DeviceMoeBench *device_moe_bench_create(Backend *b, const Model *m, int layer, int max_n);
void device_moe_bench_route(DeviceMoeBench *mb, int n, MoeMlpArgs *a);
void device_moe_bench_free(DeviceMoeBench *mb);
/* device_native_crossover of MoE layer `layer`'s routed step (backend_cuda_moe_time on a
 * DeviceMoeBench, best of 5), up to max_n tokens. -1 in a binary without CUDA code. */
int device_moe_crossover_on(Backend *b, const Model *m, int layer, int max_n, NativeCrossover *out);
/* The same for the grouped GEMV against the grouped mma at up to CUDA_GEMV_MAX_N tokens
 * (backend_cuda_moe_gemv_time; "native" in out is the mma). 1 (out: no points, min_n INT_MAX)
 * when the backend's moe_mlp does not take these experts (they run one by one: nothing to choose). */
int device_moe_gemv_crossover_on(Backend *b, const Model *m, int layer, NativeCrossover *out);
/* The routed experts' ladder stops here (scratch of 4 max_n top_k (hidden + 2 moe_inter) bytes;
 * native that has not won by then is not taken). */
#define DEVICE_MOE_XOVER_MAX_N 1024

/* Start-up, on a GPU: every act_quant matrix that has a native GEMM gets its
 * WeightMat.native_min_n: fixed > 0 sets it; 0 measures each distinct shape on
 * the device (backend_cuda_native_time, up to max_tokens) and logs its table.
 * Routed act_quant FP8 experts: one crossover for all of them, of the grouped
 * step (device_moe_crossover_on on the first MoE layer, up to
 * min(max_tokens, DEVICE_MOE_XOVER_MAX_N)), on every expert's matrix (the
 * backend reads the first gate's). 0, or -1 when timing failed (the matrices
 * concerned then keep the constant). A no-op off the GPU and for weight-only
 * models. */
int device_native_calibrate(Backend *b, Model *m, int max_tokens, int fixed);

/* Every start-up timing point above and below is the best of device_timing_reps runs after one warm-up
 * (5). The CUDA emulation's checks set 1: its timings mean nothing there, only the records they lead to
 * and the paths those records pick are checked. */
extern int device_timing_reps;

/* Start-up, on a GPU: every BF16, FP8 and NVFP4 matrix (not the routed experts) gets its
 * WeightMat.mma_min_n, the tokens from which its decode GEMV runs on tensor cores (gemv_mma.cuh)
 * rather than tiled on CUDA cores: each distinct format and shape timed both ways at 1, 2, 3, 4, 6, 8
 * tokens (backend_cuda_gemv_time) with device_native_crossover's rule, its table logged; 0 (never)
 * where the tensor cores lost at 8. The routed experts likewise, one record for all of them: the
 * first MoE layer's routed step (a DeviceMoeBench) through the grouped GEMV and the grouped mma
 * (backend_cuda_moe_gemv_time). 0, or -1 when timing failed (every matrix, or every expert, then
 * keeps the tiled GEMV). A no-op off the GPU. Before device_native_calibrate, whose weight-only side
 * it sets. An FP8 / NVFP4 matrix that reads a norm's output (q/k/v, gate/up) is timed with x split
 * beforehand, and the norms then write that split (backend_cuda_gemv_presplit, from the smallest
 * such record): its launch makes none of its own. */
int device_gemv_calibrate(Backend *b, Model *m);
/* The same over an explicit list of matrices (each one with a device copy): for matrices
 * a model's WeightSet does not list (gpu_check's quantized bench copies). norm_fed[i] (or NULL:
 * none): mats[i] reads a norm's output. */
int device_gemv_calibrate_mats(Backend *b, WeightMat *const *mats, const unsigned char *norm_fed, int n);
/* Its routed-experts half alone: the grouped GEMV or the grouped mma (moe_mlp at up to
 * CUDA_GEMV_MAX_N tokens), measured on the first MoE layer with device experts, one record on every
 * expert matrix. 0 (also: no such layer), or -1 when timing failed (record 0: the grouped GEMV). */
int device_gemv_calibrate_experts(Backend *b, Model *m);

/* A Runner on the chosen device (GPU: weights copied to the device once).
 * Its KV cache comes from runner_kvcache_create (model.h). */
Runner *device_runner_create(const DeviceChoice *d, Model *m, int max_tokens, int max_ctx, int n_threads);

#endif
