/*
 * model.h - a loaded causal LM (config + weights) and its forward pass over a
 * batch of tokens from many sequences, reading and writing a paged KV cache.
 *
 * Architectures: Qwen3ForCausalLM, Qwen3MoeForCausalLM, LlamaForCausalLM
 * (incl. Llama 3.1 rope scaling), Qwen2ForCausalLM. Weights come from a
 * Hugging Face directory (safetensors.h), BF16 used in place from the
 * mapping (F16/F32 converted at load).
 *
 * The forward pass is batch invariant on the CPU backend: a token's logits do
 * not depend on which other tokens share its batch (fixed reduction order per
 * output element). Not here: scheduling and sampling (engine), tokenization.
 */
#ifndef SAMPLER_MODEL_H
#define SAMPLER_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "check.h"
#include "kv_dtype.h"
#include "safetensors.h"
#include "weights.h"

typedef enum { ARCH_QWEN3 = 0, ARCH_QWEN3_MOE, ARCH_LLAMA, ARCH_QWEN2 } Arch;

/* Weight precision of the decoder-layer linears (quant.h says which tensors
 * stay BF16). FP8 = 128x128 block scales; NVFP4 = Model Optimizer layout. */
typedef enum { PREC_BF16 = 0, PREC_FP8, PREC_NVFP4 } Precision;

typedef struct LoadOptions {
    Precision precision;  /* quantize on load from a BF16 checkpoint */
    int weight_only;      /* 1: keep activations f32 (A100 / Hopper-NVFP4 paths);
                             0: quantize activations like the native GPU path */
    int fp8_per_channel;  /* quantize-on-load FP8 per output row instead of 128x128 blocks
                             (the native FP8 path on sm_100/103: device_native_check) */
} LoadOptions;

/* "bf16" | "fp8" | "nvfp4" -> Precision; -1 if unknown. */
int precision_parse(const char *s, Precision *out);
const char *precision_name(Precision p);

#define MODEL_MAX_LAYERS 256
#define MODEL_MAX_EOS 8

typedef struct ModelConfig {
    Arch arch;
    char arch_name[64];
    int hidden;            /* hidden_size */
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;          /* may differ from hidden / n_heads */
    int intermediate;      /* dense MLP width */
    int vocab;             /* rows of the embedding */
    int max_pos;           /* max_position_embeddings */
    float rms_eps;
    float rope_theta;
    int tie_embeddings;
    int qk_norm;           /* Qwen3: RMSNorm on q and k per head before RoPE */
    int qkv_bias;          /* Qwen2 (and Llama attention_bias) */
    int o_bias;            /* Llama attention_bias also biases o_proj */
    /* rope_scaling {rope_type: llama3} */
    int rope_llama3;
    float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_orig_max_pos;
    /* MoE */
    int n_experts;         /* 0 for dense */
    int top_k;
    int moe_intermediate;
    int norm_topk_prob;
    int decoder_sparse_step;
    uint8_t mlp_only[MODEL_MAX_LAYERS]; /* 1 where mlp_only_layers lists the layer */
    /* pre-quantized checkpoint (quantization_config): PREC_FP8 (quant_method
     * fp8, 128x128 blocks), PREC_NVFP4 (modelopt NVFP4), else PREC_BF16 */
    int prequant;
    /* special tokens (config.json / generation_config.json), -1 if absent */
    int bos_id;
    int n_eos;
    int eos_ids[MODEL_MAX_EOS];
} ModelConfig;

/* Parse config.json (+ generation_config.json if present) of a model directory.
 * Start-up path: unsupported values are an error that lists what is supported. */
int model_config_load(ModelConfig *cfg, const char *dir, Err *err);
/* config.json alone from an open fd (label names it in errors); no
 * generation_config.json. The reload endpoint reads it this way. */
int model_config_parse_fd(ModelConfig *cfg, int fd, const char *label, Err *err);
/* NULL when a and b describe the same computation (architecture, every
 * dimension and numeric setting the forward pass reads; special tokens are
 * not compared), else the name of the first field that differs. */
const char *model_config_differs(const ModelConfig *a, const ModelConfig *b);
/* 1 when layer l uses the sparse MoE block. */
int model_layer_is_moe(const ModelConfig *cfg, int l);
/* The MoE layers before layer l (layer l's index among them when it is one). */
int model_moe_index(const ModelConfig *cfg, int l);

/* The tensors of one decoder layer. Which are present, their names and
 * shapes: the architecture's table (weight_registry.h, arch_tables.c). */
typedef struct LayerWeights {
    WeightVec attn_norm;        /* [hidden] bf16 */
    WeightVec mlp_norm;         /* [hidden] bf16 */
    WeightMat q, k, v, o;       /* q [nh*hd, hidden], k/v [nkv*hd, hidden], o [hidden, nh*hd] */
    WeightVec q_bias, k_bias, v_bias, o_bias; /* [rows] bf16, host NULL if absent */
    WeightVec q_norm, k_norm;   /* [head_dim] bf16, Qwen3 only */
    WeightMat gate, up, down;   /* dense: gate/up [inter, hidden], down [hidden, inter] */
    WeightMat router;           /* MoE: [n_experts, hidden] */
    WeightMat *egate, *eup, *edown; /* MoE: [n_experts] of [moe_inter, hidden] / [hidden, moe_inter] */
} LayerWeights;

typedef struct Model {
    ModelConfig cfg;
    SafeTensors *st;            /* the mapping the weights point into */
    WeightVec embed;            /* [vocab, hidden] bf16 */
    WeightVec final_norm;       /* [hidden] bf16 */
    WeightMat lm_head;          /* [vocab, hidden]; aliases embed when tied */
    LayerWeights *layers;       /* [n_layers] */
    WeightSet weights;          /* every tensor above, one entry each (weight_registry.h) */
    void **owned;               /* converted (F16/F32 -> BF16) buffers we must free */
    int n_owned;
    int64_t n_params;
    size_t weight_bytes;        /* bf16 bytes of all weights */
    Precision precision;
    int act_quant;              /* 1: matmuls quantize activations (see LoadOptions) */
    size_t compute_bytes;       /* bytes the forward pass reads per decode token */
} Model;

/* Load a model directory. Start-up path: errors name the file and tensor. */
int model_load(Model **out, const char *dir, Err *err); /* BF16 */
int model_load_opts(Model **out, const char *dir, const LoadOptions *opt, Err *err);
/* Quantize every decoder-layer linear (model_quant.c) to p, PREC_FP8 or PREC_NVFP4 (asserted:
 * a BF16 model is not quantized); BF16 masters are kept. */
int model_quantize(Model *m, Precision p, int weight_only, Err *err);
/* model_quantize with FP8 per output channel (QUANT_FP8_PER_CHANNEL) when fp8_per_channel. */
int model_quantize_layout(Model *m, Precision p, int weight_only, int fp8_per_channel, Err *err);
void model_quant_free(Model *m);
void model_free(Model *m);
/* 1 when w is a routed expert's matrix (one of the layers' egate / eup / edown arrays). */
int model_is_routed_expert(const Model *m, const WeightMat *w);
/* MoE layer l's routed experts as a device moe_mlp reads them (MoeExperts.w / s / s2, backend.h):
 * t [9 * n_experts] = gate, up, down dev [3][E], their dev_scale [3][E], their dev_s2 [3][E]. */
void model_moe_pointers(const Model *m, int l, const void **t);
/* Every weight tensor by its checkpoint name, for deltas and hashing:
 * returns the bf16 storage the forward pass reads, or NULL. */
uint16_t *model_tensor(Model *m, const char *name, int64_t *numel);

/* ---- paged KV cache (element types and layout: kv_dtype.h) ---- */
typedef struct KVCache {
    int n_layers, n_blocks, block_size, n_kv_heads, head_dim;
    KvDtype dtype;
    void *k;        /* [n_layers, n_blocks, n_kv_heads, block_size, head_dim] dtype */
    void *v;        /* same layout */
    float *k_scale; /* [n_layers, n_blocks, n_kv_heads, block_size] f32 when KV_FP8, else NULL */
    float *v_scale; /* same */
} KVCache;

/* Host caches for the CPU backend. kvcache_create is f32 (the exact
 * comparisons of the tests); kvcache_create_dtype takes the element type. */
KVCache *kvcache_create(const ModelConfig *cfg, int n_blocks, int block_size);
KVCache *kvcache_create_dtype(const ModelConfig *cfg, int n_blocks, int block_size, KvDtype dtype);
void kvcache_free(KVCache *kv);

/* One forward step: n_tokens tokens from n_seqs sequences. Token i belongs to
 * sequence seq[i] at position pos[i]; its K/V are written to slot pos[i] of
 * that sequence's block table, and it attends to positions 0..pos[i] of the
 * same sequence (earlier positions must already be in the cache, or be
 * earlier tokens of this batch). */
typedef struct Batch {
    int n_tokens;
    const int32_t *tokens;       /* [n_tokens]; t < 0 (only with n_pending > 0): the token sampled in row -1 - t of
                                    the last runner_sample_launch, still on the device (async scheduling) */
    const int32_t *pos;          /* [n_tokens] */
    const int32_t *seq;          /* [n_tokens] in [0, n_seqs) */
    int n_seqs;
    const int32_t *const *block_table; /* [n_seqs] -> [ceil((max pos + 1) / block_size)] block ids */
    int n_out;
    const int32_t *out_rows;     /* [n_out] token indices whose logits are wanted */
    int n_pending;               /* rows of the last runner_sample_launch tokens may name (0: none) */
} Batch;

/* Per-runner scratch sized at load time for up to max_tokens tokens per step
 * and max_ctx positions per sequence. Nothing is allocated per step. */
typedef struct Runner Runner;
Runner *runner_create(Model *m, int max_tokens, int max_ctx, int n_threads);
/* The same on any backend (backend.h); the runner takes ownership of b and
 * frees it in runner_free. max_ctx must match the backend's. */
struct Backend;
Runner *runner_create_with(Model *m, struct Backend *b, int max_tokens, int max_ctx);
/* A KV cache in the runner's backend memory (device memory on a GPU); free it
 * with runner_kvcache_free before runner_free. kvcache_create is the host-only
 * equivalent for the CPU backend. */
KVCache *runner_kvcache_create(Runner *r, int n_blocks, int block_size); /* f32 */
KVCache *runner_kvcache_create_dtype(Runner *r, int n_blocks, int block_size, KvDtype dtype);
/* A delta changed host weights [host, host + bytes): refresh the backend's
 * copy (no-op on the CPU backend, which reads the host weights). idx: the
 * touched element indices [n_idx] of elem bytes, or NULL for "any". Returns 0,
 * or -1 with err (500) when the device copy could not be updated. */
int runner_weights_changed(Runner *r, const void *host, size_t bytes, const int64_t *idx, int64_t n_idx, int elem,
                           Err *err);
/* --dtype: on = 1 rounds the activations of every BF16 matmul to bf16 (the
 * CPU backend's cpu_matmul_rows_bf16), 0 keeps them f32. Returns -1 when the
 * backend has only f32 activations (the CUDA backend today). Between steps. */
int runner_set_act_bf16(Runner *r, int on);
/* 1 when BF16 activations are the faster choice on r's backend (the CPU
 * backend on a CPU whose vdpbf16ps runs the order natively): --dtype auto. */
int runner_act_bf16_fast(const Runner *r);
/* Copy all layers' K/V of block src into block dst (backend memory). */
void runner_kv_copy_block(Runner *r, KVCache *kv, int src, int dst);
void runner_kvcache_free(Runner *r, KVCache *kv);
void runner_free(Runner *r);
/* logits: [n_out, vocab] f32. Returns 0, or <0 with err on a bad batch. On a
 * device backend logits may be NULL: the step's logits stay in device memory
 * for runner_sample / runner_fetch_logits (until the next forward). */
int model_forward(Runner *r, KVCache *kv, const Batch *b, float *logits, Err *err);
/* Sampling on the device (Backend.sample_launch / sample_wait, dev_sample.h)
 * over the logits [n_out, vocab] of the last model_forward, into one of
 * DEV_SAMPLE_SLOTS slots: launch queues it and returns, wait blocks until
 * that launch's results are on the host (out [n_rows], packed kept sets;
 * valid until the slot's next launch). The next model_forward may name the
 * last launch's tokens before its wait (Batch.n_pending). runner_sample_reserve
 * (start-up) sizes it; all return -1 with err when the backend cannot (a host
 * backend, no sample op, a batch over the caps, a device error). */
struct DevSampleCaps;
struct DevSampleBatch;
struct DevSampleOut;
int runner_sample_reserve(Runner *r, const struct DevSampleCaps *caps, Err *err);
int runner_sample_launch(Runner *r, int n_out, const struct DevSampleBatch *b, int slot, Err *err);
int runner_sample_wait(Runner *r, int slot, const struct DevSampleOut **out, const int32_t **packed, Err *err);
/* Steps captured as a CUDA graph (each also ran through it) and steps that
 * replayed one, since creation (0 on a backend without graphs). Returns 1
 * when steps can run as graphs here (a backend with graphs, no failed
 * capture, MoE experts grouped on the device), else 0. */
int runner_graph_counts(const Runner *r, uint64_t *captures, uint64_t *replays);
/* Steps that captured piecewise graphs (forward.c forward_pieces: a step that is not pure decode,
 * padded to a token bucket, attention eager between the graphs) and steps that replayed them only. */
void runner_piece_counts(const Runner *r, uint64_t *captures, uint64_t *replays);
/* How the last model_forward ran: 0 eagerly, 1 through a whole-step graph, 2 through piecewise
 * graphs (each captured or replayed). */
int runner_last_graph(const Runner *r);
/* on = 0: every later step runs eagerly, no graph captured or replayed (vLLM's --enforce-eager);
 * on = 1 (the default): graphs where runner_graph_counts says they apply. */
void runner_set_graphs(Runner *r, int on);
/* The backend's device time of the steps sampled on the device (Backend.device_seconds: each step
 * from its first op to its sampled results, summed), or -1 where it is not measured (the CPU). */
double runner_device_seconds(const Runner *r);
/* Copy the last step's device logits [n_out, vocab] to the host (no-op on a host backend). */
void runner_fetch_logits(Runner *r, float *logits, int n_out);
/* Routed-expert capture for the next forwards (NULL: none): experts [n_tokens, n_moe_layers, top_k]
 * int32, each (token, MoE layer) row in routing order. It changes no op of a step (graphs apply as
 * without it). It holds the step's ids once model_forward returned with a logits buffer (or on a
 * host backend); a device step without one (logits left on the device) queues their download into
 * experts behind the step's ops: from runner_host_alloc memory it lands while the host goes on, and
 * is there once runner_sample_wait of a launch queued after the forward, or runner_fetch_logits,
 * returned; from other memory the forward waits for it. */
void runner_set_expert_capture(Runner *r, int32_t *experts);
/* Host memory a device copies into without staging (pinned on a device backend, where available;
 * plain memory otherwise), zeroed; fatal when it cannot be had (start-up only). runner_host_free
 * releases it (NULL: nothing). */
void *runner_host_alloc(Runner *r, size_t bytes);
void runner_host_free(Runner *r, void *p);
/* LoRA adapter slot per token of the next forwards (lora.h: runner_set_lora):
 * lora [n_tokens of each batch] int32, -1 the base model; NULL (default):
 * every token is the base model. The caller keeps it valid and in step with
 * the batches it passes. */
void runner_set_lora_tokens(Runner *r, const int32_t *lora);

#endif
