/*
 * weight_registry.h - which tensors an architecture has, as data, and the
 * one flat list of a loaded model's tensors built from it. Each architecture
 * is a table of tensor kinds (arch_tables.c): checkpoint name pattern, shape
 * rule from the ModelConfig, matrix / vector / bias, when it is present
 * (qkv_bias, qk_norm, o_bias, untied, MoE / dense layer, per expert) and
 * whether it is quantizable (checked against quant_should_quantize, the one
 * quantization policy). The Model's WeightSet (weights.h) is what loading,
 * quantize-on-load, pre-quantized finish, delta lookup and re-quantization,
 * reload and device upload iterate; nothing else walks LayerWeights.
 * Not here: reading a tensor's bytes (model.c), the quantizers (quant/).
 */
#ifndef SAMPLER_WEIGHT_REGISTRY_H
#define SAMPLER_WEIGHT_REGISTRY_H

#include <stddef.h>

#include "model.h"

typedef enum { WS_MODEL = 0, WS_LAYER, WS_EXPERT } WeightScope;       /* the name takes 0, 1 or 2 %d */
typedef enum { WK_MATRIX = 0, WK_VECTOR, WK_BIAS } WeightKind;         /* WeightMat, WeightVec, WeightVec */
typedef enum {
    WHEN_ALWAYS = 0,
    WHEN_QKV_BIAS,   /* cfg.qkv_bias */
    WHEN_O_BIAS,     /* cfg.o_bias */
    WHEN_QK_NORM,    /* cfg.qk_norm */
    WHEN_UNTIED,     /* !cfg.tie_embeddings */
    WHEN_DENSE,      /* layer without the sparse MoE block */
    WHEN_MOE,        /* model_layer_is_moe */
} WeightWhen;
/* A shape dimension in terms of the config; DIM_NONE = no second dimension. */
typedef enum { DIM_NONE = 0, DIM_HIDDEN, DIM_VOCAB, DIM_Q, DIM_KV, DIM_HEAD, DIM_INTER, DIM_MOE_INTER, DIM_EXPERTS } WeightDim;

typedef struct TensorKind {
    const char *pattern;   /* checkpoint name, %d = layer (then expert) */
    WeightScope scope;
    WeightKind kind;
    WeightDim rows, cols;  /* shape [rows, cols]; cols DIM_NONE: 1-D [rows] */
    WeightWhen when;
    int quantizable;       /* must equal quant_should_quantize(name, ndim) (checked at load) */
    size_t off;            /* WS_MODEL: offset of the field in Model; WS_LAYER: in LayerWeights;
                            * WS_EXPERT: of the WeightMat * [n_experts] field in LayerWeights */
    int ties_lm_head;      /* the embedding: with tie_embeddings its entry fills lm_head too */
} TensorKind;

/* An architecture: its config.json name, the config rules that differ
 * between architectures, and its tensor table. */
typedef struct ArchTable {
    Arch arch;
    const char *hf_name;     /* config.json architectures[0] */
    int qk_norm;             /* RMSNorm on q and k per head before RoPE */
    int qkv_bias;            /* q/k/v always biased (else only with attention_bias) */
    int attn_bias_o;         /* attention_bias also biases o_proj */
    int moe;                 /* sparse MoE keys in config.json (num_experts, ...) */
    const TensorKind *kinds;
    int n;
} ArchTable;

/* The table of an architecture (arch_tables.c); NULL if it has none. */
const ArchTable *arch_table(Arch arch);
/* The table whose hf_name is name, or NULL. */
const ArchTable *arch_table_by_name(const char *name);
/* "A, B, ..." of every supported hf_name, into buf[n]; returns buf. */
const char *arch_supported(char *buf, size_t n);

/* Build m->weights from m->cfg's table: one entry per tensor present, in load
 * order (model tensors, then per layer; experts interleaved gate/up/down per
 * expert), pointing at the fields it fills (allocates the expert arrays).
 * Start-up path: a table whose quantizable flag disagrees with the policy is
 * a bug and fatal. */
void weight_registry_build(Model *m);
/* Index the entries by name and by storage (after the tensors are loaded). */
void weight_registry_index(WeightSet *ws);
void weight_registry_free(Model *m);
/* The entry of checkpoint tensor name, or NULL. */
WeightTensor *weight_registry_find(const WeightSet *ws, const char *name);
/* The entry whose bf16 storage (matrix master or vector) starts at host, or NULL. */
WeightTensor *weight_registry_find_host(const WeightSet *ws, const void *host);
/* The bf16 storage of an entry: the matrix master, else the vector (NULL for
 * a pre-quantized matrix, which has none). */
uint16_t *weight_tensor_bf16(const WeightTensor *t);

#endif
