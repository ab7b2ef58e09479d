/*
 * test_quant_policy.c - the BF16 keep-list on real Qwen3 / Qwen3-MoE tensor
 * names: projections quantized; embeddings, lm_head, norms, router and biases
 * kept (the tensors without weight_scale_inv in the official Qwen3-FP8 files).
 */
#include "quant.h"
#include "test.h"

int main(void) {
    static const char *quant[] = {
        "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight", "model.layers.27.self_attn.o_proj.weight",
        "model.layers.3.mlp.gate_proj.weight", "model.layers.3.mlp.up_proj.weight",
        "model.layers.3.mlp.down_proj.weight", "model.layers.5.mlp.experts.17.gate_proj.weight",
        "model.layers.5.mlp.experts.127.down_proj.weight", "model.layers.5.mlp.shared_expert.up_proj.weight",
    };
    static const char *keep[] = {
        "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
        "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight",
        "model.layers.5.mlp.gate.weight", "model.layers.5.mlp.shared_expert_gate.weight",
        "model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.q_proj.weight_scale_inv",
    };
    for (size_t i = 0; i < sizeof quant / sizeof *quant; i++)
        T_ASSERT(quant_should_quantize(quant[i], 2), "%s should be quantized", quant[i]);
    for (size_t i = 0; i < sizeof keep / sizeof *keep; i++)
        T_ASSERT(!quant_should_quantize(keep[i], 2), "%s should stay BF16 (even if 2-D)", keep[i]);
    T_ASSERT(!quant_should_quantize("model.layers.0.self_attn.q_proj.weight", 1), "1-D never quantized");
    return T_DONE();
}
