/*
 * model_quant.c - quantize-on-load: turn every decoder-layer linear of a
 * BF16 model into FP8 (128x128 block scales) or NVFP4 (Model Optimizer)
 * weights: the registry entries quant_should_quantize (quant/policy.c) marks.
 * Embeddings, norms, the MoE router, lm_head and biases stay BF16, as in the
 * official Qwen3-FP8 and Model Optimizer NVFP4 checkpoints.
 *
 * The BF16 master stays mapped: sparse deltas patch it, then the touched
 * blocks are re-quantized (quant_*_requant). Not here: the kernels (quant/).
 */
#include <assert.h>
#include <stdlib.h>

#include "log.h"
#include "model.h"
#include "quant.h"
#include "weight_registry.h"

static int quantize_mat(Model *m, WeightMat *w, Precision p, int act_quant, QuantFp8Layout layout, Err *err) {
    w->act_quant = act_quant;
    if (p == PREC_FP8) {
        QuantFp8 *q = quant_fp8_from_bf16(w->bf16, w->rows, w->cols, layout, err);
        if (!q) return -(err->code ? err->code : 400);
        w->q = q;
        w->fmt = WF_FP8;
        m->compute_bytes -= (size_t)w->rows * w->cols * 2;
        m->compute_bytes += quant_fp8_bytes(q);
    } else { /* PREC_NVFP4 (model_quantize_layout asserts one of the two) */
        if (w->cols % QUANT_NVFP4_BLOCK)
            return ERR(err, 400, "nvfp4 needs every linear's input width to be a multiple of 16; a "
                       "[%d, %d] weight is not (use --precision fp8 or bf16)", w->rows, w->cols);
        QuantNvfp4 *q = quant_nvfp4_from_bf16(w->bf16, w->rows, w->cols, err);
        if (!q) return -(err->code ? err->code : 400);
        w->q = q;
        w->fmt = WF_NVFP4;
        m->compute_bytes -= (size_t)w->rows * w->cols * 2;
        m->compute_bytes += quant_nvfp4_bytes(q);
    }
    return 0;
}

/* The registry's quantizable entries (quant_should_quantize, the policy)
 * are the ones quantized, in load order. */
int model_quantize(Model *m, Precision p, int weight_only, Err *err) {
    return model_quantize_layout(m, p, weight_only, 0, err);
}

int model_quantize_layout(Model *m, Precision p, int weight_only, int fp8_per_channel, Err *err) {
    int rc = 0;
    QuantFp8Layout layout = fp8_per_channel ? QUANT_FP8_PER_CHANNEL : QUANT_FP8_BLOCK128;
    /* a BF16 model is not quantized: every caller skips the call (quantize_mat's else is NVFP4) */
    assert(p == PREC_FP8 || p == PREC_NVFP4);
    m->precision = p; /* from here model_quant_free releases what was quantized */
    for (int i = 0; i < m->weights.n && !rc; i++)
        if (m->weights.t[i].quantizable) rc = quantize_mat(m, m->weights.t[i].mat, p, !weight_only, layout, err);
    if (rc) return rc;
    m->act_quant = !weight_only;
    log_info("quantized decoder linears to %s%s (%s activations); embeddings, norms, router, lm_head stay bf16",
             precision_name(p), p == PREC_FP8 && fp8_per_channel ? " per output channel" : "",
             weight_only ? "f32, weight-only" : "quantized");
    return 0;
}

/* Frees every quantized form, also after a load that failed half-way. */
void model_quant_free(Model *m) {
    for (int i = 0; i < m->weights.n; i++) {
        WeightMat *w = m->weights.t[i].mat;
        if (!w || m->weights.t[i].vec) continue;
        if (w->fmt == WF_FP8) quant_fp8_free(w->q);
        else if (w->fmt == WF_NVFP4) quant_nvfp4_free(w->q);
        w->q = NULL;
        w->fmt = WF_BF16;
    }
}
