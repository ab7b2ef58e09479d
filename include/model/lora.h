/*
 * lora.h - a PEFT LoRA adapter of the loaded model, read from an adapter
 * directory (adapter_config.json + adapter_model.safetensors), held as f32
 * pairs (A, B, scale) per decoder layer and target linear, ready for the
 * forward pass's batched LoRA (backend.h, Backend.lora).
 *
 * Supported: peft_type LORA; r, lora_alpha, use_rslora (scale alpha/sqrt(r)
 * instead of alpha/r); rank_pattern / alpha_pattern (a rank and alpha per
 * pair, peft's regex keys: lora.c); target_modules among q_proj, k_proj, v_proj, o_proj,
 * gate_proj, up_proj, down_proj of the dense layers (a Qwen3-MoE model's
 * mlp_only layers included); layers_to_transform (tensors decide which
 * layers are adapted); F32/BF16/F16 tensors, stored as f32 or bf16
 * (LoraLoadOpts.dtype). The routed experts of MoE layers in both layouts
 * vLLM reads:
 *   - per expert ("2-D", what peft writes on transformers 4's expert
 *     modules, vLLM's default): mlp.experts.<e>.<gate|up|down>_proj.
 *     lora_<A|B>.weight, [r, in] / [out, r], any subset of experts;
 *   - fused ("3-D", peft's target_parameters on transformers 5's
 *     Qwen3MoeExperts, ParamWrapper): mlp.experts[.base_layer]*.lora_<A|B>.
 *     weight, one pair per 3-D parameter (gate_up_proj [E, 2I, H], down_proj
 *     [E, H, I]; the nesting depth is peft's wrapping order, so the pair is
 *     told apart by its shapes): A [r*E, in] (expert e's rows e*r..), B
 *     [out, r*E] (expert e's rank k in column k*E + e); gate_up's B rows
 *     [0, I) adapt gate_proj and [I, 2I) up_proj with one shared A.
 * Each expert's linears are held as ordinary pairs (lora_expert_pair), so
 * the 3-D layout costs the A it shares twice. Refused with a message naming
 * the field: DoRA (use_dora), modules_to_save, bias other than "none",
 * fan_in_fan_out, target_parameters other than
 * the experts' gate_up_proj / down_proj, embedding or lm_head targets, the
 * router (mlp.gate), a rank above max_rank, and any tensor whose name or
 * shape does not match the model.
 *
 * Memory (the budget): lora_bytes(cfg, rank) = 4 * rank * sum over layers
 * and adaptable linears (each routed expert's three included) of (in + out)
 * (2 * ... stored as bf16); the adapter holds exactly its own pairs.
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
    int n_experts;      /* the model's routed experts (0: a dense model) */
    LoraPair *pairs;    /* [lora_n_slots]: the dense linears [n_layers * LT_COUNT], then the experts'
                           [n_layers * n_experts * 3] (gate, up, down); a == NULL where not adapted */
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
/* Pair slots of a model: the dense linears of every layer, then three per
 * routed expert of every layer (MoE layers use theirs). */
static inline size_t lora_n_slots(int n_layers, int n_experts) {
    return (size_t)n_layers * LT_COUNT + (size_t)n_layers * (size_t)n_experts * 3;
}
/* Slot of layer l's linear t; e >= 0: of routed expert e (t among gate, up, down). */
static inline size_t lora_slot(int n_layers, int n_experts, int l, int e, LoraTarget t) {
    if (e < 0) return (size_t)l * LT_COUNT + t;
    return (size_t)n_layers * LT_COUNT + ((size_t)l * n_experts + e) * 3 + (size_t)(t - LT_GATE);
}
/* lora_slot's inverse: the layer, expert (-1: the layer's own linear) and target of a slot. */
static inline void lora_slot_target(int n_layers, int n_experts, size_t slot, int *l, int *e, LoraTarget *t) {
    size_t dense = (size_t)n_layers * LT_COUNT;
    *l = slot < dense ? (int)(slot / LT_COUNT) : (int)((slot - dense) / 3 / (size_t)n_experts);
    *e = slot < dense ? -1 : (int)((slot - dense) / 3 % (size_t)n_experts);
    *t = slot < dense ? (LoraTarget)(slot % LT_COUNT) : (LoraTarget)(LT_GATE + (slot - dense) % 3);
}
/* The pair in a slot, or NULL where that linear is not adapted. */
static inline const LoraPair *lora_slot_pair(const LoraAdapter *a, size_t slot) {
    const LoraPair *p = &a->pairs[slot];
    return p->a ? p : NULL;
}
/* The pair of layer l's linear t, or NULL. */
static inline const LoraPair *lora_pair(const LoraAdapter *a, int l, LoraTarget t) {
    return lora_slot_pair(a, lora_slot(a->n_layers, a->n_experts, l, -1, t));
}
/* The pair of layer l's expert e, linear t (LT_GATE, LT_UP or LT_DOWN), or NULL. */
static inline const LoraPair *lora_expert_pair(const LoraAdapter *a, int l, int e, LoraTarget t) {
    return lora_slot_pair(a, lora_slot(a->n_layers, a->n_experts, l, e, t));
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
