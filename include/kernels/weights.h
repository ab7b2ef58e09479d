/*
 * weights.h - one linear layer's weight matrix in any of the formats the
 * matrix kernels read: BF16, FP8 block-scaled, NVFP4. HF Linear layout
 * [rows = out_features, cols = in_features]. The BF16 master is kept for
 * quantized formats too (deltas are applied to it, then re-quantized).
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
} WeightMat;

#endif
