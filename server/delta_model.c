/*
 * delta_model.c - the DeltaTarget lookup over a loaded Model: checkpoint
 * tensor name -> the BF16 storage the forward pass reads (model_tensor).
 * Kept in its own object file so binaries that never apply deltas to a
 * Model do not pull in model.c.
 *
 * Tensors the model converted at load (F16/F32 checkpoints -> BF16 copies)
 * report BF16 and so refuse deltas made in the checkpoint's dtype (422):
 * a delta must be applied to the bits it was computed from.
 */
#include "delta.h"
#include "model.h"

void *delta_lookup_model(void *ctx, const char *name, Dtype *dt, int64_t *numel) {
    uint16_t *p = model_tensor((Model *)ctx, name, numel);
    if (p) *dt = DT_BF16;
    return p;
}
