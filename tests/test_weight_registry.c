/*
 * test_weight_registry.c - the registry built from the architecture tables
 * against the fixture checkpoints: every entry is a checkpoint tensor of its
 * shape, every checkpoint tensor is an entry (a missing table row fails
 * here), names and storage find their entry, and the quantizable flag is the
 * quantization policy (quant_should_quantize): quantize-on-load turns
 * exactly those entries into FP8 / NVFP4 and leaves every other one BF16.
 */
#include <string.h>

#include "quant.h"
#include "test.h"
#include "weight_registry.h"

/* Tensors of a pre-quantized checkpoint that belong to an entry's matrix. */
static int aux_tensor(const char *name) {
    static const char *sfx[] = {".weight_scale_inv", ".weight_scale", ".weight_scale_2", ".input_scale"};
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof sfx / sizeof *sfx; i++) {
        size_t m = strlen(sfx[i]);
        if (n > m && strcmp(name + n - m, sfx[i]) == 0) return 1;
    }
    return 0;
}

static void check_model(const char *dir, int quantize) {
    Err err = {0};
    Model *m = NULL;
    T_ASSERT(model_load(&m, dir, &err) == 0, "%s: %s", dir, err.msg);
    if (!m) return;
    const ModelConfig *c = &m->cfg;
    const WeightSet *ws = &m->weights;
    int want_q = 0;
    for (int l = 0; l < c->n_layers; l++) want_q += 4 + (model_layer_is_moe(c, l) ? 3 * c->n_experts : 3);
    int n_q = 0;
    for (int i = 0; i < ws->n; i++) {
        const WeightTensor *t = &ws->t[i];
        const StTensor *st = safetensors_get(m->st, t->name);
        T_ASSERT(st != NULL, "%s: entry '%s' is not in the checkpoint", dir, t->name);
        if (st && !c->prequant)
            T_ASSERT(st->ndim == t->ndim && st->shape[0] == t->shape[0] && (t->ndim == 1 || st->shape[1] == t->shape[1]),
                     "%s: '%s' shape differs from the checkpoint", dir, t->name);
        T_ASSERT(t->mat || t->vec, "%s: '%s' fills nothing", dir, t->name);
        T_ASSERT(t->quantizable == (t->mat && quant_should_quantize(t->name, t->ndim)),
                 "%s: '%s' quantizable %d is not the policy's", dir, t->name, t->quantizable);
        T_ASSERT(weight_registry_find(ws, t->name) == t, "%s: find('%s') is not its entry", dir, t->name);
        if (weight_tensor_bf16(t))
            T_ASSERT(weight_registry_find_host(ws, weight_tensor_bf16(t)) == t, "%s: find_host('%s')", dir, t->name);
        n_q += t->quantizable;
    }
    T_ASSERT(n_q == want_q, "%s: %d quantizable entries, want %d (q/k/v/o and the MLP / expert linears)", dir, n_q,
             want_q);
    for (int i = 0; i < m->st->n; i++)
        T_ASSERT(aux_tensor(m->st->t[i].name) || weight_registry_find(ws, m->st->t[i].name),
                 "%s: checkpoint tensor '%s' has no row in the architecture's table", dir, m->st->t[i].name);
    T_ASSERT(weight_registry_find(ws, "model.layers.0.no_such.weight") == NULL, "unknown name found");
    if (quantize) {
        T_ASSERT(model_quantize(m, PREC_FP8, 1, &err) == 0, "%s: quantize: %s", dir, err.msg);
        for (int i = 0; i < ws->n; i++) {
            const WeightTensor *t = &ws->t[i];
            const WeightMat *w = t->vec ? NULL : t->mat;
            T_ASSERT(t->quantizable ? w && w->fmt == WF_FP8 && w->q : !w || w->fmt == WF_BF16,
                     "%s fp8: '%s' (quantizable %d) has the wrong format", dir, t->name, t->quantizable);
        }
    }
    model_free(m);
}

int main(void) {
    for (Arch a = ARCH_QWEN3; a <= ARCH_QWEN2; a++) T_ASSERT(arch_table(a) != NULL, "arch %d has no table", a);
    check_model("tests/fixtures/qwen3_gqa2", 1);
    check_model("tests/fixtures/qwen3_mha_sharded", 1);
    check_model("tests/fixtures/qwen3_moe", 1);
    check_model("tests/fixtures/qwen3_moe_nonorm", 1);
    check_model("tests/fixtures/llama31", 1);
    check_model("tests/fixtures/qwen2", 1);
    check_model("tests/fixtures/llama31_fp8", 0);
    check_model("tests/fixtures/llama31_nvfp4", 0);
    return T_DONE();
}
