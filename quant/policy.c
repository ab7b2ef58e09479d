/*
 * policy.c - which checkpoint tensors a quantized sampler quantizes: the 2-D
 * `*_proj.weight` Linear weights inside the decoder layers (attention q/k/v/o,
 * MLP and expert gate/up/down). Everything else stays BF16, as in the official
 * Qwen3-FP8 checkpoints and Model Optimizer's default NVFP4 export: token
 * embeddings, lm_head, every norm, the MoE router (`mlp.gate.weight`,
 * `shared_expert_gate`), biases. Not here: the quantizers themselves.
 */
#include "quant.h"

#include <string.h>

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

int quant_should_quantize(const char *name, int ndim) {
    return ndim == 2 && strstr(name, ".layers.") != NULL && ends_with(name, "_proj.weight") &&
           strstr(name, "norm") == NULL;
}
