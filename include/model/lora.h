/*
 * lora.h - a PEFT LoRA adapter of the loaded model, read from an adapter
 * directory (adapter_config.json + adapter_model.safetensors), held as f32
 * pairs (A, B, scale) per decoder layer and target linear, ready for the
 * forward pass's batched LoRA (backend.h, Backend.lora).
 *
 * Supported: peft_type LORA; r, lora_alpha, use_rslora (scale alpha/sqrt(r)
 * instead of alpha/r); target_modules among q_proj, k_proj, v_proj, o_proj,
 * gate_proj, up_proj, down_proj of the dense layers (a Qwen3-MoE model's
 * mlp_only layers included); layers_to_transform (tensors decide which
 * layers are adapted); F32/BF16/F16 tensors. Refused with a message naming
 * the field: DoRA (use_dora), modules_to_save, bias other than "none",
 * fan_in_fan_out, rank_pattern / alpha_pattern, target_parameters (MoE
 * experts as 3-D parameters), embedding or lm_head targets, MoE expert
 * projections, a rank above max_rank, and any tensor whose name or shape does
 * not match the model.
 *
 * Memory (the budget): lora_bytes(cfg, rank) = 4 * rank * sum over layers
 * and targets of (in + out); the adapter holds exactly its own tensors.
 *
 * A request path (runtime loads): errors come back as Err (400, or the
 * opener's 403), nothing is kept on failure. Not here: which adapter a
 * request uses (the server's registry), the forward pass (forward.c).
 */
#ifndef SAMPLER_LORA_H
#define SAMPLER_LORA_H

#include "backend.h"
#include "model.h"
#include "safetensors.h"

typedef enum { LT_Q = 0, LT_K, LT_V, LT_O, LT_GATE, LT_UP, LT_DOWN, LT_COUNT } LoraTarget;

typedef struct LoraAdapter {
    int rank;           /* r */
    float alpha;        /* lora_alpha */
    int rslora;         /* use_rslora */
    int n_layers;
    LoraPair *pairs;    /* [n_layers * LT_COUNT]; a == NULL where that linear is not adapted (B transposed) */
    float *arena;       /* every A and B, f32 */
    size_t bytes;       /* of arena */
    int n_targets;      /* adapted linears */
} LoraAdapter;

/* The PEFT module name of a target ("q_proj", ...). */
const char *lora_target_name(LoraTarget t);
/* Bytes of a rank-r adapter on every supported linear of the model: the
 * budget per adapter slot at --max-lora-rank. */
size_t lora_bytes(const ModelConfig *cfg, int rank);
/* Read an adapter directory for model cfg. op opens each file (NULL: as the
 * path is); label names the adapter in errors. Returns 0 and *out, or <0
 * with err (nothing allocated). */
int lora_load(LoraAdapter **out, const ModelConfig *cfg, const char *dir, int max_rank, const StOpener *op,
              const char *label, Err *err);
/* The same from memory (trainer push-lora): the adapter_config.json text
 * [config_len] and an adapter_model.safetensors image [st_len], which is
 * only read and need not outlive the call. */
int lora_from_memory(LoraAdapter **out, const ModelConfig *cfg, const char *config, size_t config_len,
                     const uint8_t *st_bytes, size_t st_len, int max_rank, const char *label, Err *err);
void lora_free(LoraAdapter *a);
/* The pair of layer l's linear t, or NULL. */
static inline const LoraPair *lora_pair(const LoraAdapter *a, int l, LoraTarget t) {
    const LoraPair *p = &a->pairs[(size_t)l * LT_COUNT + t];
    return p->a ? p : NULL;
}

/* ---- the runner's adapter slots (forward.c) ----
 * A Batch's lora[i] = s (>= 0) runs token i with the adapter in slot s. Set
 * and clear slots only between forward steps (the engine's exclusive
 * sections); the adapter must outlive its slot. 0, or <0 with err (400: slot
 * out of range, the backend has no LoRA op, the adapter is for another model). */
#define RUNNER_MAX_LORAS 64
int runner_set_lora(Runner *r, int slot, const LoraAdapter *a, Err *err);

#endif
