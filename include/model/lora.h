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
 * layers are adapted); F32/BF16/F16 tensors, stored as f32 or bf16
 * (LoraLoadOpts.dtype). Refused with a message naming
 * the field: DoRA (use_dora), modules_to_save, bias other than "none",
 * fan_in_fan_out, rank_pattern / alpha_pattern, target_parameters (MoE
 * experts as 3-D parameters), embedding or lm_head targets, MoE expert
 * projections, a rank above max_rank, and any tensor whose name or shape does
 * not match the model.
 *
 * Memory (the budget): lora_bytes(cfg, rank) = 4 * rank * sum over layers
 * and targets of (in + out) (2 * ... stored as bf16); the adapter holds
 * exactly its own tensors.
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

/* How an adapter is stored (--lora-dtype, vLLM's flag): f32 (the default), or
 * bf16 (values rounded to nearest even at load, half the memory; math in f32
 * either way, so a BF16-exact adapter computes the same bits). */
typedef enum { LORA_DTYPE_F32 = 0, LORA_DTYPE_BF16 = 1 } LoraDtype;
typedef struct LoraLoadOpts {
    int max_rank;       /* --max-lora-rank */
    LoraDtype dtype;    /* --lora-dtype */
} LoraLoadOpts;

typedef struct LoraAdapter {
    int rank;           /* r */
    float alpha;        /* lora_alpha */
    int rslora;         /* use_rslora */
    int n_layers;
    LoraPair *pairs;    /* [n_layers * LT_COUNT]; a == NULL where that linear is not adapted (B transposed) */
    void *arena;        /* every A and B, f32 or bf16 (dtype) */
    size_t bytes;       /* of arena */
    LoraDtype dtype;
    int n_targets;      /* adapted linears */
} LoraAdapter;

/* The PEFT module name of a target ("q_proj", ...). */
const char *lora_target_name(LoraTarget t);
/* Bytes of a rank-r adapter on every supported linear of the model: the
 * budget per adapter slot at --max-lora-rank. */
size_t lora_bytes(const ModelConfig *cfg, int rank);
/* The same stored as dtype (bf16: half). */
size_t lora_bytes_as(const ModelConfig *cfg, int rank, LoraDtype dtype);
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
/* lora_load / lora_from_memory with a storage dtype (the two above: f32). */
int lora_load_opts(LoraAdapter **out, const ModelConfig *cfg, const char *dir, const LoraLoadOpts *o,
                   const StOpener *op, const char *label, Err *err);
int lora_from_memory_opts(LoraAdapter **out, const ModelConfig *cfg, const char *config, size_t config_len,
                          const uint8_t *st_bytes, size_t st_len, const LoraLoadOpts *o, const char *label, Err *err);
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
/* Device backends (no-op on host ones): reserve the adapter memory once, at
 * start-up before the KV cache takes the rest: the lora op's scratch and a
 * pool of max_loras + 1 regions of lora_bytes_as(cfg, max_rank, dtype) (the spare lets
 * an in-place replacement upload next to the adapter it replaces). Then
 * runner_set_lora copies an adapter into a free region (all or nothing: a
 * failed copy returns the error and leaves the slot on its old adapter).
 * Fatal on failure (start-up). */
void runner_reserve_lora(Runner *r, int max_loras, int max_rank, LoraDtype dtype);

#endif
