/*
 * weights.h - the weight tensors the kernels read, as a backend sees them:
 * one linear layer's matrix in any of the formats the matrix kernels read
 * (BF16, FP8 block-scaled, NVFP4), a BF16 vector (norm, bias, embedding), and
 * the flat list of a model's tensors (WeightSet) that a device backend
 * uploads once and whose `dev` slots the ops then read. HF Linear layout
 * [rows = out_features, cols = in_features]. The BF16 master is kept for
 * quantized formats too (deltas are applied to it, then re-quantized).
 * Not here: which tensors an architecture has and how they are loaded
 * (weight_registry.h), the kernels.
 */
#ifndef SAMPLER_WEIGHTS_H
#define SAMPLER_WEIGHTS_H

#include <stdint.h>

typedef enum { WF_BF16 = 0, WF_FP8 = 1, WF_NVFP4 = 2 } WeightFormat;

typedef struct WeightMat {
    WeightFormat fmt;
    int rows, cols;
    uint16_t *bf16;  /* [rows, cols] bf16: the master (also the compute copy for WF_BF16) */
    void *q;         /* quantized form (quant.h: QuantFp8 / QuantNvfp4), NULL for WF_BF16 */
    int act_quant;   /* quantized formats: 1 = quantize activations too (native GPU path) */
    /* act_quant matrices on the CUDA backend: tokens from which a matmul takes the native tensor-core
     * GEMM (below: the weight-only GEMV). 0: CUDA_NATIVE_MIN_N; INT_MAX: never. Set at start-up,
     * measured per shape on the device (device_native_calibrate) or from --native-crossover. Routed
     * experts: one value on all of them, of the grouped step (the backend reads the first gate's) */
    int native_min_n;
    /* Matrices on the CUDA backend: tokens (BF16 2..8, FP8 / NVFP4 1..8) from which a decode-size
     * matmul takes the tensor-core GEMV (gemv_mma.cuh) instead of the tiled one (FP8 / NVFP4: its
     * weight-only GEMV, below native_min_n). 0: never. Set at start-up, measured per shape on the
     * device (device_gemv_calibrate); a fused q/k/v or gate/up launch follows its first matrix's.
     * Routed experts: one value on all of them, the tokens from which a step up to CUDA_GEMV_MAX_N
     * takes the grouped mma (moe_mma.cu) instead of the grouped GEMV (the backend reads the first
     * gate's) */
    int mma_min_n;
    /* A device backend's copy of what the kernels read (NULL on host backends):
     * WF_BF16 bf16 [rows, cols]; WF_FP8 e4m3 [rows, cols]; WF_NVFP4 u8 [rows, cols / 2] (e2m1 pairs) */
    void *dev;
    /* WF_FP8 f32 [scale_rows, scale_cols] (QuantFp8.scale_inv); WF_NVFP4 e4m3 [rows, cols / 16]; else NULL */
    void *dev_scale;
    /* WF_NVFP4 f32 [1] (QuantNvfp4.scale2): the kernels read it from here at run time, so a delta
     * that re-quantizes the matrix (a new tensor scale) reaches captured graphs; else NULL */
    void *dev_s2;
    /* WF_NVFP4 matrices the CUDA backend's native GEMM takes: dev_scale in cuBLASLt's swizzled layout,
     * e4m3 [cuda_nvfp4_sf_bytes(rows, cols)] (padding zero), made at upload and after every delta of
     * the matrix (the GEMM reads it, so nothing is swizzled per call); else NULL */
    void *dev_scale_sw;
} WeightMat;

/* A BF16 tensor that is not a linear's matrix. Ops are handed the pointer in
 * the backend's memory: host on a host backend, dev on a device backend. */
typedef struct WeightVec {
    const uint16_t *host; /* [numel] bf16, NULL when the model has no such tensor */
    const uint16_t *dev;  /* [numel] bf16, a device backend's copy; NULL until uploaded */
} WeightVec;

/* One registered tensor: exactly one of mat / vec is set, except a tied
 * embedding, which fills both (vec = the embedding, mat = lm_head over the
 * same storage). */
typedef struct WeightTensor {
    char name[96];      /* checkpoint name, e.g. "model.layers.3.mlp.up_proj.weight" */
    WeightMat *mat;     /* the matrix it fills, or NULL */
    WeightVec *vec;     /* the bf16 vector / embedding it fills, or NULL */
    int ndim;           /* 1 or 2 */
    int64_t shape[2];   /* [rows, cols] or [n, 0] */
    int64_t numel;
    int quantizable;    /* quant_should_quantize(name): quantize-on-load turns it into FP8/NVFP4 */
    int patchable;      /* 1: its bf16 storage is the checkpoint's mapping (deltas write it in place) */
} WeightTensor;

/* Every tensor of a model, in load order. */
typedef struct WeightSet {
    WeightTensor *t;    /* [n] */
    int n;
    int *by_name;       /* [n] indices into t sorted by name (weight_registry.c) */
    int *by_host;       /* [n] indices into t sorted by bf16 storage address */
} WeightSet;

#endif
