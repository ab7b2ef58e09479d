/*
 * model_config.c - config.json / generation_config.json of a Hugging Face
 * model directory -> ModelConfig. Refuses what the forward pass does not
 * implement, listing what is supported, instead of computing wrong logits.
 * Accepts both transformers 4 keys (rope_theta, rope_scaling) and 5 keys
 * (rope_parameters).
 */
#include "model.h"

#include <jansson.h>
#include <stdio.h>

#include "weight_registry.h"

static int get_int(json_t *o, const char *k, int dflt) {
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (int)json_integer_value(v) : dflt;
}

static double get_num(json_t *o, const char *k, double dflt) {
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : dflt;
}

static int get_bool(json_t *o, const char *k, int dflt) {
    json_t *v = json_object_get(o, k);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* eos_token_id may be an int or a list of ints. */
static void add_eos(ModelConfig *c, json_t *v) {
    if (json_is_integer(v)) v = json_pack("[O]", v);
    else if (json_is_array(v)) json_incref(v);
    else return;
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        if (!json_is_integer(e) || c->n_eos >= MODEL_MAX_EOS) continue;
        int id = (int)json_integer_value(e), dup = 0;
        for (int j = 0; j < c->n_eos; j++) dup |= c->eos_ids[j] == id;
        if (!dup) c->eos_ids[c->n_eos++] = id;
    }
    json_decref(v);
}

static int parse_rope(ModelConfig *c, json_t *root, const char *path, Err *err) {
    json_t *rs = json_object_get(root, "rope_scaling");
    json_t *rp = json_object_get(root, "rope_parameters");
    c->rope_theta = (float)get_num(root, "rope_theta", get_num(rp, "rope_theta", 10000.0));
    if (!json_is_object(rs)) rs = rp;
    if (!json_is_object(rs)) return 0;
    json_t *t = json_object_get(rs, "rope_type");
    if (!json_is_string(t)) t = json_object_get(rs, "type");
    const char *type = json_is_string(t) ? json_string_value(t) : "default";
    if (strcmp(type, "default") == 0) return 0;
    ENSURE(err, strcmp(type, "llama3") == 0, 400,
           "%s: rope_scaling type '%s' is not supported (supported: default, llama3)", path, type);
    c->rope_llama3 = 1;
    c->rope_factor = (float)get_num(rs, "factor", 8.0);
    c->rope_low_freq_factor = (float)get_num(rs, "low_freq_factor", 1.0);
    c->rope_high_freq_factor = (float)get_num(rs, "high_freq_factor", 4.0);
    c->rope_orig_max_pos = get_int(rs, "original_max_position_embeddings", 8192);
    ENSURE(err, c->rope_high_freq_factor != c->rope_low_freq_factor && c->rope_factor > 0, 400,
           "%s: llama3 rope_scaling needs factor > 0 and high_freq_factor != low_freq_factor", path);
    return 0;
}

static int parse_arch(ModelConfig *c, json_t *root, const char *path, Err *err) {
    char sup[256];
    json_t *a = json_array_get(json_object_get(root, "architectures"), 0);
    ENSURE(err, json_is_string(a), 400, "%s: no architectures[0]; supported: %s", path, arch_supported(sup, sizeof sup));
    snprintf(c->arch_name, sizeof c->arch_name, "%s", json_string_value(a));
    const ArchTable *t = arch_table_by_name(c->arch_name);
    if (t) {
        c->arch = t->arch;
        return 0;
    }
    return ERR(err, 400, "%s: architecture '%s' is not supported; supported: %s", path, c->arch_name,
               arch_supported(sup, sizeof sup));
}

static int parse_moe(ModelConfig *c, json_t *root, const char *path, Err *err) {
    c->n_experts = get_int(root, "num_experts", get_int(root, "num_local_experts", 0));
    c->top_k = get_int(root, "num_experts_per_tok", 0);
    c->moe_intermediate = get_int(root, "moe_intermediate_size", 0);
    c->norm_topk_prob = get_bool(root, "norm_topk_prob", 0);
    c->decoder_sparse_step = get_int(root, "decoder_sparse_step", 1);
    ENSURE(err, c->n_experts > 0 && c->top_k > 0 && c->top_k <= c->n_experts && c->top_k <= 64 &&
                    c->moe_intermediate > 0 && c->decoder_sparse_step > 0, 400,
           "%s: MoE needs num_experts > 0, 0 < num_experts_per_tok <= min(num_experts, 64), "
           "moe_intermediate_size > 0, decoder_sparse_step > 0", path);
    json_t *ml = json_object_get(root, "mlp_only_layers");
    size_t i;
    json_t *e;
    json_array_foreach(ml, i, e) {
        ENSURE(err, json_is_integer(e) && json_integer_value(e) >= 0 && json_integer_value(e) < c->n_layers,
               400, "%s: mlp_only_layers[%zu] is not a layer index", path, i);
        c->mlp_only[json_integer_value(e)] = 1;
    }
    return 0;
}

/* The pre-quantized formats we read: Qwen3-FP8 / DeepSeek-V3 (fp8, 128x128
 * block scales) and NVIDIA Model Optimizer NVFP4. */
static int parse_quant(ModelConfig *c, json_t *root, const char *path, Err *err) {
    json_t *q = json_object_get(root, "quantization_config");
    if (!json_is_object(q)) return 0;
    json_t *jm = json_object_get(q, "quant_method");
    const char *m = json_is_string(jm) ? json_string_value(jm) : "";
    if (strcmp(m, "fp8") == 0) {
        json_t *bs = json_object_get(q, "weight_block_size");
        ENSURE(err, json_is_array(bs) && json_array_size(bs) == 2 &&
                        json_integer_value(json_array_get(bs, 0)) == 128 &&
                        json_integer_value(json_array_get(bs, 1)) == 128, 400,
               "%s: fp8 quantization_config needs weight_block_size [128, 128] (the Qwen3-FP8 layout)", path);
        c->prequant = PREC_FP8;
        return 0;
    }
    if (strcmp(m, "modelopt") == 0) {
        json_t *ja = json_object_get(q, "quant_algo");
        ENSURE(err, json_is_string(ja) && strcmp(json_string_value(ja), "NVFP4") == 0, 400,
               "%s: modelopt quant_algo '%s' is not supported (supported: NVFP4)", path,
               json_is_string(ja) ? json_string_value(ja) : "?");
        c->prequant = PREC_NVFP4;
        return 0;
    }
    return ERR(err, 400, "%s: quantization_config quant_method '%s' is not supported; supported: fp8 "
               "(128x128 block scales, as Qwen3-FP8), modelopt NVFP4", path, m);
}

static int parse_config(ModelConfig *c, json_t *root, const char *path, Err *err) {
    int rc = parse_arch(c, root, path, err);
    if (rc) return rc;
    c->hidden = get_int(root, "hidden_size", 0);
    c->n_layers = get_int(root, "num_hidden_layers", 0);
    c->n_heads = get_int(root, "num_attention_heads", 0);
    c->n_kv_heads = get_int(root, "num_key_value_heads", c->n_heads);
    c->head_dim = get_int(root, "head_dim", c->n_heads ? c->hidden / c->n_heads : 0);
    c->intermediate = get_int(root, "intermediate_size", 0);
    c->vocab = get_int(root, "vocab_size", 0);
    c->max_pos = get_int(root, "max_position_embeddings", 4096);
    c->rms_eps = (float)get_num(root, "rms_norm_eps", 1e-6);
    c->tie_embeddings = get_bool(root, "tie_word_embeddings", 0);
    ENSURE(err, c->hidden > 0 && c->n_layers > 0 && c->n_layers <= MODEL_MAX_LAYERS && c->n_heads > 0 &&
                    c->n_kv_heads > 0 && c->n_heads % c->n_kv_heads == 0 && c->head_dim > 0 &&
                    c->head_dim % 2 == 0 && c->head_dim <= 1024 && c->vocab > 0 && c->max_pos > 0,
           400, "%s: need positive hidden_size, num_hidden_layers (<= %d), num_attention_heads, "
           "num_key_value_heads dividing it, even head_dim <= 1024, vocab_size, max_position_embeddings",
           path, MODEL_MAX_LAYERS);
    const ArchTable *at = arch_table(c->arch);
    c->qk_norm = at->qk_norm;
    c->qkv_bias = at->qkv_bias || get_bool(root, "attention_bias", 0);
    c->o_bias = at->attn_bias_o && get_bool(root, "attention_bias", 0);
    json_t *act = json_object_get(root, "hidden_act");
    ENSURE(err, !act || (json_is_string(act) && strcmp(json_string_value(act), "silu") == 0), 400,
           "%s: hidden_act must be 'silu' (SwiGLU)", path);
    ENSURE(err, !get_bool(root, "mlp_bias", 0), 400, "%s: mlp_bias is not supported", path);
    ENSURE(err, !get_bool(root, "use_sliding_window", 0), 400,
           "%s: use_sliding_window is not supported (set it to false)", path);
    if ((rc = parse_rope(c, root, path, err))) return rc;
    if ((rc = parse_quant(c, root, path, err))) return rc;
    if (at->moe && (rc = parse_moe(c, root, path, err))) return rc;
    if (!at->moe) {
        ENSURE(err, c->intermediate > 0, 400, "%s: intermediate_size must be positive", path);
    }
    c->bos_id = get_int(root, "bos_token_id", -1);
    add_eos(c, json_object_get(root, "eos_token_id"));
    return 0;
}

int model_config_load(ModelConfig *c, const char *dir, Err *err) {
    memset(c, 0, sizeof *c);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    ENSURE(err, root != NULL, 400, "%s: cannot read: %s (line %d)", path, je.text, je.line);
    int rc = json_is_object(root) ? parse_config(c, root, path, err)
                                  : ERR(err, 400, "%s: not a JSON object", path);
    json_decref(root);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    json_t *gen = json_load_file(path, 0, &je);
    if (gen) {
        add_eos(c, json_object_get(gen, "eos_token_id"));
        if (c->bos_id < 0) c->bos_id = get_int(gen, "bos_token_id", -1);
        json_decref(gen);
    }
    return 0;
}

int model_config_parse_fd(ModelConfig *c, int fd, const char *label, Err *err) {
    memset(c, 0, sizeof *c);
    json_error_t je;
    json_t *root = json_loadfd(fd, 0, &je);
    ENSURE(err, root != NULL, 400, "%s: cannot read: %s (line %d)", label, je.text, je.line);
    int rc = json_is_object(root) ? parse_config(c, root, label, err) : ERR(err, 400, "%s: not a JSON object", label);
    json_decref(root);
    return rc;
}

const char *model_config_differs(const ModelConfig *a, const ModelConfig *b) {
#define SAME(f) if (a->f != b->f) return #f
    SAME(arch); SAME(hidden); SAME(n_layers); SAME(n_heads); SAME(n_kv_heads); SAME(head_dim);
    SAME(intermediate); SAME(vocab); SAME(max_pos); SAME(rms_eps); SAME(rope_theta); SAME(tie_embeddings);
    SAME(qk_norm); SAME(qkv_bias); SAME(o_bias); SAME(rope_llama3); SAME(rope_factor);
    SAME(rope_low_freq_factor); SAME(rope_high_freq_factor); SAME(rope_orig_max_pos); SAME(n_experts);
    SAME(top_k); SAME(moe_intermediate); SAME(norm_topk_prob); SAME(decoder_sparse_step); SAME(prequant);
#undef SAME
    if (memcmp(a->mlp_only, b->mlp_only, sizeof a->mlp_only) != 0) return "mlp_only_layers";
    return NULL;
}

int model_layer_is_moe(const ModelConfig *c, int l) {
    return c->n_experts > 0 && !c->mlp_only[l] && (l + 1) % c->decoder_sparse_step == 0;
}

int model_moe_index(const ModelConfig *c, int l) {
    int k = 0;
    for (int i = 0; i < l; i++) k += model_layer_is_moe(c, i);
    return k;
}
