/*
 * delta_model.c - the DeltaTarget lookup over a loaded Model: checkpoint
 * tensor name -> the BF16 storage the forward pass reads (model_tensor).
 * Kept in its own object file so binaries that never apply deltas to a
 * Model do not pull in model.c.
 *
 * Tensors the model converted at load (F16/F32 checkpoints -> BF16 copies)
 * are not patchable in place: model_tensor returns NULL for them and a delta
 * that touches one is refused (422) before anything is written.
 */
#include "delta.h"
#include "model.h"

void *delta_lookup_model(void *ctx, const char *name, Dtype *dt, int64_t *numel) {
    uint16_t *p = model_tensor((Model *)ctx, name, numel);
    if (p) *dt = DT_BF16;
    return p;
}
