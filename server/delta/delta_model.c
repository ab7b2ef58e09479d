/*
 * delta_model.c - deltas on a loaded Model: the DeltaTarget lookup
 * (checkpoint tensor name -> the BF16 storage the forward pass reads, via
 * model_tensor over the weight registry) and the touched hook that re-quantizes the FP8/NVFP4 blocks
 * holding touched elements (quant_*_requant: bit-identical to quantizing the
 * updated master from scratch).
 *
 * Tensors the model converted at load (F16/F32 checkpoints -> BF16 copies)
 * and pre-quantized checkpoint tensors (no BF16 master) are not patchable in
 * place: model_tensor returns NULL for them and a delta that touches one is
 * refused (422) before anything is written. Not here: the delta format and
 * apply (delta_format.c, delta_apply.c).
 */
#include <stdlib.h>

#include "delta.h"
#include "model.h"
#include "quant.h"
#include "weight_registry.h"

void *delta_lookup_model(void *ctx, const char *name, Dtype *dt, int64_t *numel) {
    uint16_t *p = model_tensor((Model *)ctx, name, numel);
    if (p) *dt = DT_BF16;
    return p;
}

static int requant(WeightMat *w, const int64_t *idx, size_t n, Err *err) {
    int rc = w->fmt == WF_FP8 ? quant_fp8_requant(w->q, w->bf16, idx, n, err)
                              : quant_nvfp4_requant(w->q, w->bf16, idx, n, err);
    return rc < 0 ? rc : 0;
}

int delta_model_requant(void *ctx, const char *name, void *data, Dtype dt, int64_t numel, const int64_t *idx,
                        int64_t n_idx, Err *err) {
    /* the registered linear whose master is data (norms, embeddings: nothing to re-quantize) */
    const WeightTensor *t = weight_registry_find_host(&((Model *)ctx)->weights, data);
    WeightMat *w = t && !t->vec ? t->mat : NULL;
    if (!w || w->fmt == WF_BF16 || !w->q) return 0;
    if (idx) return requant(w, idx, (size_t)n_idx, err);
    /* Dense update: every element, in bounded chunks. */
    enum { CHUNK = 1 << 16 };
    int64_t *all = malloc(sizeof(int64_t) * CHUNK);
    ENSURE(err, all != NULL, 507, "delta: '%s': out of memory re-quantizing", name);
    int rc = 0;
    for (int64_t s = 0; s < numel && rc == 0; s += CHUNK) {
        int64_t e = s + CHUNK < numel ? s + CHUNK : numel;
        for (int64_t i = s; i < e; i++) all[i - s] = i;
        rc = requant(w, all, (size_t)(e - s), err);
    }
    free(all);
    return rc;
}
