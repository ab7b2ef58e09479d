/*
 * arch_tables.c - each supported architecture as data: its config.json
 * name, the config rules that differ between architectures, and its tensor
 * table, one row per tensor kind in load order (weight_registry.h says what a
 * row holds). Adding an architecture whose layer computes like these is an
 * entry of `tables` (plus its Arch value in model.h); a new tensor kind is a
 * row here and the field it fills in LayerWeights / Model.
 * Not here: building the list from a table (weight_registry.c), loading.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "weight_registry.h"

#define L_ "model.layers.%d."
#define MODEL_ROW(pat, kind, r, c, when, field, tie) \
    {pat, WS_MODEL, kind, r, c, when, 0, offsetof(Model, field), tie}
#define LAYER_ROW(pat, kind, r, c, when, q, field) \
    {L_ pat, WS_LAYER, kind, r, c, when, q, offsetof(LayerWeights, field), 0}
#define EXPERT_ROW(pat, r, c, field) \
    {L_ "mlp.experts.%d." pat, WS_EXPERT, WK_MATRIX, r, c, WHEN_MOE, 1, offsetof(LayerWeights, field), 0}

/* embedding, final norm, lm_head (absent when tied to the embedding) */
#define TOP_ROWS                                                                                          \
    MODEL_ROW("model.embed_tokens.weight", WK_VECTOR, DIM_VOCAB, DIM_HIDDEN, WHEN_ALWAYS, embed, 1),      \
    MODEL_ROW("model.norm.weight", WK_VECTOR, DIM_HIDDEN, DIM_NONE, WHEN_ALWAYS, final_norm, 0),          \
    MODEL_ROW("lm_head.weight", WK_MATRIX, DIM_VOCAB, DIM_HIDDEN, WHEN_UNTIED, lm_head, 0)

#define NORM_ROWS                                                                                          \
    LAYER_ROW("input_layernorm.weight", WK_VECTOR, DIM_HIDDEN, DIM_NONE, WHEN_ALWAYS, 0, attn_norm),      \
    LAYER_ROW("post_attention_layernorm.weight", WK_VECTOR, DIM_HIDDEN, DIM_NONE, WHEN_ALWAYS, 0, mlp_norm)

#define ATTN_ROWS                                                                                          \
    LAYER_ROW("self_attn.q_proj.weight", WK_MATRIX, DIM_Q, DIM_HIDDEN, WHEN_ALWAYS, 1, q),                \
    LAYER_ROW("self_attn.k_proj.weight", WK_MATRIX, DIM_KV, DIM_HIDDEN, WHEN_ALWAYS, 1, k),               \
    LAYER_ROW("self_attn.v_proj.weight", WK_MATRIX, DIM_KV, DIM_HIDDEN, WHEN_ALWAYS, 1, v),               \
    LAYER_ROW("self_attn.o_proj.weight", WK_MATRIX, DIM_HIDDEN, DIM_Q, WHEN_ALWAYS, 1, o),                \
    LAYER_ROW("self_attn.q_proj.bias", WK_BIAS, DIM_Q, DIM_NONE, WHEN_QKV_BIAS, 0, q_bias),               \
    LAYER_ROW("self_attn.k_proj.bias", WK_BIAS, DIM_KV, DIM_NONE, WHEN_QKV_BIAS, 0, k_bias),              \
    LAYER_ROW("self_attn.v_proj.bias", WK_BIAS, DIM_KV, DIM_NONE, WHEN_QKV_BIAS, 0, v_bias)

#define O_BIAS_ROW LAYER_ROW("self_attn.o_proj.bias", WK_BIAS, DIM_HIDDEN, DIM_NONE, WHEN_O_BIAS, 0, o_bias)

#define QK_NORM_ROWS                                                                                       \
    LAYER_ROW("self_attn.q_norm.weight", WK_VECTOR, DIM_HEAD, DIM_NONE, WHEN_QK_NORM, 0, q_norm),         \
    LAYER_ROW("self_attn.k_norm.weight", WK_VECTOR, DIM_HEAD, DIM_NONE, WHEN_QK_NORM, 0, k_norm)

#define DENSE_MLP_ROWS                                                                                     \
    LAYER_ROW("mlp.gate_proj.weight", WK_MATRIX, DIM_INTER, DIM_HIDDEN, WHEN_DENSE, 1, gate),             \
    LAYER_ROW("mlp.up_proj.weight", WK_MATRIX, DIM_INTER, DIM_HIDDEN, WHEN_DENSE, 1, up),                 \
    LAYER_ROW("mlp.down_proj.weight", WK_MATRIX, DIM_HIDDEN, DIM_INTER, WHEN_DENSE, 1, down)

/* the router stays BF16 (quant policy); experts interleave gate/up/down per expert */
#define MOE_ROWS                                                                                           \
    LAYER_ROW("mlp.gate.weight", WK_MATRIX, DIM_EXPERTS, DIM_HIDDEN, WHEN_MOE, 0, router),                \
    EXPERT_ROW("gate_proj.weight", DIM_MOE_INTER, DIM_HIDDEN, egate),                                     \
    EXPERT_ROW("up_proj.weight", DIM_MOE_INTER, DIM_HIDDEN, eup),                                         \
    EXPERT_ROW("down_proj.weight", DIM_HIDDEN, DIM_MOE_INTER, edown)

static const TensorKind qwen3[] = {TOP_ROWS, NORM_ROWS, ATTN_ROWS, O_BIAS_ROW, QK_NORM_ROWS, DENSE_MLP_ROWS};
static const TensorKind qwen3_moe[] = {TOP_ROWS, NORM_ROWS, ATTN_ROWS, O_BIAS_ROW, QK_NORM_ROWS, DENSE_MLP_ROWS,
                                       MOE_ROWS};
static const TensorKind llama[] = {TOP_ROWS, NORM_ROWS, ATTN_ROWS, O_BIAS_ROW, DENSE_MLP_ROWS};
static const TensorKind qwen2[] = {TOP_ROWS, NORM_ROWS, ATTN_ROWS, DENSE_MLP_ROWS};

#define TABLE(rows) rows, (int)(sizeof rows / sizeof rows[0])
static const ArchTable tables[] = {
    /* arch, hf_name, qk_norm, qkv_bias, attn_bias_o, moe, rows */
    {ARCH_QWEN3, "Qwen3ForCausalLM", 1, 0, 1, 0, TABLE(qwen3)},
    {ARCH_QWEN3_MOE, "Qwen3MoeForCausalLM", 1, 0, 1, 1, TABLE(qwen3_moe)},
    {ARCH_LLAMA, "LlamaForCausalLM", 0, 0, 1, 0, TABLE(llama)},
    {ARCH_QWEN2, "Qwen2ForCausalLM", 0, 1, 0, 0, TABLE(qwen2)},
};
#define N_TABLES (sizeof tables / sizeof tables[0])

const ArchTable *arch_table(Arch arch) {
    for (size_t i = 0; i < N_TABLES; i++)
        if (tables[i].arch == arch) return &tables[i];
    return NULL;
}

const ArchTable *arch_table_by_name(const char *name) {
    for (size_t i = 0; i < N_TABLES; i++)
        if (strcmp(tables[i].hf_name, name) == 0) return &tables[i];
    return NULL;
}

const char *arch_supported(char *buf, size_t n) {
    size_t used = 0;
    buf[0] = 0;
    for (size_t i = 0; i < N_TABLES && used < n; i++) {
        int w = snprintf(buf + used, n - used, "%s%s", i ? ", " : "", tables[i].hf_name);
        if (w < 0) break;
        used += (size_t)w;
    }
    return buf;
}
