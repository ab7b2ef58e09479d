/*
 * lora.c - reading a PEFT LoRA adapter directory into f32 or bf16 pairs (lora.h).
 * Validates the whole adapter before it allocates its arena: a refused
 * adapter leaves nothing behind. Not here: the slots a batch indexes
 * (forward.c), the server's name registry.
 */
#include "lora.h"

#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dtype.h"

static const char *const TARGET_NAMES[LT_COUNT] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                   "gate_proj", "up_proj", "down_proj"};

const char *lora_target_name(LoraTarget t) { return t >= 0 && t < LT_COUNT ? TARGET_NAMES[t] : "?"; }

/* in / out features of layer l's linear t; 0 when the layer has no such linear (MoE layers' MLP). */
static void target_dims(const ModelConfig *c, int l, LoraTarget t, int *in, int *out) {
    int q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim, moe = model_layer_is_moe(c, l);
    int dims[LT_COUNT][2] = {{c->hidden, q}, {c->hidden, kv}, {c->hidden, kv}, {q, c->hidden},
                             {c->hidden, c->intermediate}, {c->hidden, c->intermediate}, {c->intermediate, c->hidden}};
    *in = dims[t][0];
    *out = dims[t][1];
    if (moe && t >= LT_GATE) *in = *out = 0;
}

size_t lora_bytes_as(const ModelConfig *c, int rank, LoraDtype dtype) {
    size_t n = 0;
    for (int l = 0; l < c->n_layers; l++)
        for (int t = 0; t < LT_COUNT; t++) {
            int in, out;
            target_dims(c, l, (LoraTarget)t, &in, &out);
            n += (size_t)rank * (size_t)(in + out) * (dtype == LORA_DTYPE_BF16 ? 2 : 4);
        }
    return n;
}

size_t lora_bytes(const ModelConfig *c, int rank) { return lora_bytes_as(c, rank, LORA_DTYPE_F32); }

static int open_file(const StOpener *op, const char *path, Err *err) {
    if (op) return op->open(op->ctx, path, err);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ENSURE(err, fd >= 0, 400, "cannot open %s", path);
    return fd;
}

/* A config field that must be absent, null, false, empty or equal to ok. */
static int refuse_set(json_t *root, const char *key, const char *ok, const char *label, const char *why, Err *err) {
    json_t *v = json_object_get(root, key);
    int set = v && !json_is_null(v) && !json_is_false(v) && !(json_is_array(v) && json_array_size(v) == 0) &&
              !(json_is_object(v) && json_object_size(v) == 0) &&
              !(ok && json_is_string(v) && strcmp(json_string_value(v), ok) == 0);
    ENSURE(err, !set, 400, "%s: adapter_config.json sets %s, which is not supported (%s)", label, key, why);
    return 0;
}

typedef struct Config {
    int r;
    double alpha;
    int rslora;
} Config;

static int parse_config(json_t *root, const char *label, int max_rank, Config *c, Err *err) {
    ENSURE(err, json_is_object(root), 400, "%s: adapter_config.json is not a JSON object", label);
    json_t *pt = json_object_get(root, "peft_type");
    ENSURE(err, !pt || (json_is_string(pt) && strcmp(json_string_value(pt), "LORA") == 0), 400,
           "%s: peft_type must be \"LORA\" (only LoRA adapters are served)", label);
    if (refuse_set(root, "use_dora", NULL, label, "DoRA adapters need a magnitude vector per linear", err) ||
        refuse_set(root, "modules_to_save", NULL, label, "only LoRA pairs are applied; full module copies are not",
                   err) ||
        refuse_set(root, "bias", "none", label, "trained biases are not applied; bias must be \"none\"", err) ||
        refuse_set(root, "fan_in_fan_out", NULL, label, "Conv1D-style (GPT-2) weights", err) ||
        refuse_set(root, "rank_pattern", NULL, label, "one rank for every module", err) ||
        refuse_set(root, "alpha_pattern", NULL, label, "one lora_alpha for every module", err) ||
        refuse_set(root, "target_parameters", NULL, label, "LoRA on MoE expert parameters (peft's ParamWrapper "
                   "over 3-D expert tensors) is not implemented; adapt the attention and dense MLP linears with "
                   "target_modules", err) ||
        refuse_set(root, "lora_bias", NULL, label, "lora_B biases", err) ||
        refuse_set(root, "trainable_token_indices", NULL, label, "trainable tokens", err) ||
        refuse_set(root, "alora_invocation_tokens", NULL, label, "activated LoRA", err) ||
        refuse_set(root, "layer_replication", NULL, label, "replicated layers", err) ||
        refuse_set(root, "use_qalora", NULL, label, "QA-LoRA pooling", err) ||
        refuse_set(root, "use_bdlora", NULL, label, "block-diagonal LoRA", err) ||
        refuse_set(root, "arrow_config", NULL, label, "Arrow routing", err) ||
        refuse_set(root, "kasa_config", NULL, label, "KaSA", err) ||
        refuse_set(root, "velora_config", NULL, label, "VeLoRA", err) ||
        refuse_set(root, "monteclora_config", NULL, label, "MonteCLoRA", err))
        return -1;
    json_t *r = json_object_get(root, "r"), *a = json_object_get(root, "lora_alpha");
    ENSURE(err, json_is_integer(r) && json_integer_value(r) >= 1, 400, "%s: adapter_config.json: r must be an "
           "integer >= 1", label);
    ENSURE(err, json_integer_value(r) <= max_rank, 400, "%s: rank %lld is above --max-lora-rank %d (restart with a "
           "larger --max-lora-rank)", label, (long long)json_integer_value(r), max_rank);
    ENSURE(err, !a || json_is_number(a), 400, "%s: adapter_config.json: lora_alpha must be a number", label);
    json_t *tm = json_object_get(root, "target_modules");
    if (json_is_array(tm)) {
        size_t i;
        json_t *e;
        json_array_foreach(tm, i, e) {
            const char *n = json_string_value(e);
            int ok = 0;
            for (int t = 0; n && t < LT_COUNT; t++) ok |= strcmp(n, TARGET_NAMES[t]) == 0;
            ENSURE(err, ok, 400, "%s: target module '%s' is not supported (supported: q_proj k_proj v_proj o_proj "
                   "gate_proj up_proj down_proj)", label, n ? n : "(not a string)");
        }
    }
    c->r = (int)json_integer_value(r);
    c->alpha = a ? json_number_value(a) : 8.0; /* PEFT's default lora_alpha */
    json_t *rs = json_object_get(root, "use_rslora");
    ENSURE(err, !rs || json_is_boolean(rs), 400, "%s: adapter_config.json: use_rslora must be a boolean", label);
    c->rslora = json_is_true(rs);
    return 0;
}

/* "base_model.model.model.layers.<l>.<self_attn|mlp>.<target>.lora_<A|B>.weight" -> l, t, is_b. */
static int parse_name(const char *name, const ModelConfig *cfg, int *l, LoraTarget *t, int *is_b, const char *label,
                      Err *err) {
    static const char pre[] = "base_model.model.model.layers.";
    ENSURE(err, strncmp(name, pre, sizeof pre - 1) == 0, 400, "%s: tensor '%s' is not a LoRA pair of a decoder "
           "layer (embedding, lm_head and other modules are not supported)", label, name);
    const char *p = name + sizeof pre - 1;
    char *end;
    long li = strtol(p, &end, 10);
    ENSURE(err, end != p && *end == '.' && li >= 0 && li < cfg->n_layers, 400, "%s: tensor '%s': no such layer "
           "(the model has %d)", label, name, cfg->n_layers);
    p = end + 1;
    ENSURE(err, strncmp(p, "mlp.experts.", 12) != 0 && strncmp(p, "mlp.gate.", 9) != 0, 400,
           "%s: tensor '%s': LoRA on MoE experts or the router is not supported", label, name);
    const char *mod = strncmp(p, "self_attn.", 10) == 0 ? p + 10 : strncmp(p, "mlp.", 4) == 0 ? p + 4 : NULL;
    ENSURE(err, mod, 400, "%s: tensor '%s' is not in self_attn or mlp", label, name);
    for (int k = 0; k < LT_COUNT; k++) {
        size_t n = strlen(TARGET_NAMES[k]);
        if (strncmp(mod, TARGET_NAMES[k], n) || mod[n] != '.') continue;
        int attn = k <= LT_O;
        ENSURE(err, attn == (p[0] == 's'), 400, "%s: tensor '%s': %s is not in that block", label, name,
               TARGET_NAMES[k]);
        const char *rest = mod + n + 1;
        ENSURE(err, !strcmp(rest, "lora_A.weight") || !strcmp(rest, "lora_B.weight"), 400,
               "%s: tensor '%s' is not lora_A.weight or lora_B.weight (DoRA magnitudes, embeddings and biases are "
               "not supported)", label, name);
        *l = (int)li;
        *t = (LoraTarget)k;
        *is_b = rest[5] == 'B';
        return 0;
    }
    return ERR(err, 400, "%s: tensor '%s': unsupported module (supported: q_proj k_proj v_proj o_proj gate_proj "
               "up_proj down_proj)", label, name);
}

/* Element i of t as f32 (exact for F32, BF16, F16). */
static float elem_f32(const StTensor *t, int64_t i) {
    float v;
    uint16_t h;
    switch (t->dtype) {
    case DT_F32: memcpy(&v, t->data + 4 * i, 4); return v;
    case DT_BF16: memcpy(&h, t->data + 2 * i, 2); return bf16_to_f32(h);
    default: memcpy(&h, t->data + 2 * i, 2); return f16_to_f32(h);
    }
}

/* Element i of t stored at dst[k] as dtype (bf16: round to nearest even; BF16 tensors copy exactly). */
static void put(void *dst, size_t k, const StTensor *t, int64_t i, LoraDtype dtype) {
    if (dtype == LORA_DTYPE_F32) {
        ((float *)dst)[k] = elem_f32(t, i);
        return;
    }
    uint16_t h;
    if (t->dtype == DT_BF16) memcpy(&h, t->data + 2 * i, 2);
    else h = f32_to_bf16(elem_f32(t, i));
    ((uint16_t *)dst)[k] = h;
}

static void store(void *dst, const StTensor *t, LoraDtype dtype) {
    for (int64_t i = 0; i < t->numel; i++) put(dst, (size_t)i, t, i, dtype);
}

/* dst [cols, rows] = the [rows, cols] tensor t transposed, as dtype. */
static void store_transposed(void *dst, const StTensor *t, LoraDtype dtype) {
    int64_t rows = t->shape[0], cols = t->shape[1];
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) put(dst, (size_t)(c * rows + r), t, r * cols + c, dtype);
}

/* Every tensor checked (names, dtypes, shapes, each A with its B) before anything is allocated. */
static int check_tensors(const SafeTensors *st, const ModelConfig *cfg, int r, const char *label, int *n_pairs,
                         const StTensor **found, Err *err) {
    for (int i = 0; i < st->n; i++) {
        const StTensor *t = &st->t[i];
        int l = 0, is_b = 0;
        LoraTarget k = LT_Q;
        if (parse_name(t->name, cfg, &l, &k, &is_b, label, err)) return -1;
        int in, out;
        target_dims(cfg, l, k, &in, &out);
        ENSURE(err, in > 0, 400, "%s: tensor '%s': layer %d is a MoE layer (LoRA on MoE experts is not supported)",
               label, t->name, l);
        ENSURE(err, t->dtype == DT_F32 || t->dtype == DT_BF16 || t->dtype == DT_F16, 400,
               "%s: tensor '%s' is %s (supported: F32, BF16, F16)", label, t->name, dtype_name(t->dtype));
        int64_t want0 = is_b ? out : r, want1 = is_b ? r : in;
        ENSURE(err, t->ndim == 2 && t->shape[0] == want0 && t->shape[1] == want1, 400,
               "%s: tensor '%s' has shape [%lld, %lld], the model needs [%lld, %lld] (r = %d)", label, t->name,
               t->ndim > 0 ? (long long)t->shape[0] : 0, t->ndim > 1 ? (long long)t->shape[1] : 0,
               (long long)want0, (long long)want1, r);
        found[((size_t)l * LT_COUNT + k) * 2 + is_b] = t;
    }
    *n_pairs = 0;
    for (int l = 0; l < cfg->n_layers; l++)
        for (int k = 0; k < LT_COUNT; k++) {
            const StTensor *a = found[((size_t)l * LT_COUNT + k) * 2], *b = found[((size_t)l * LT_COUNT + k) * 2 + 1];
            ENSURE(err, !a == !b, 400, "%s: layer %d %s has lora_%s.weight without lora_%s.weight", label, l,
                   TARGET_NAMES[k], a ? "A" : "B", a ? "B" : "A");
            *n_pairs += a != NULL;
        }
    ENSURE(err, *n_pairs > 0, 400, "%s: adapter_model.safetensors holds no LoRA pair", label);
    return 0;
}

static int build(LoraAdapter **out, const ModelConfig *cfg, const SafeTensors *st, const Config *c,
                 LoraDtype dtype, const char *label, Err *err) {
    size_t n_slots = (size_t)cfg->n_layers * LT_COUNT;
    const StTensor **found = calloc(n_slots * 2, sizeof *found);
    ENSURE(err, found, 503, "%s: out of memory", label);
    int n_pairs = 0;
    if (check_tensors(st, cfg, c->r, label, &n_pairs, found, err)) {
        free(found);
        return -1;
    }
    size_t floats = 0, es = dtype == LORA_DTYPE_BF16 ? 2 : 4;
    for (size_t i = 0; i < n_slots * 2; i++) {
        floats += found[i] ? (size_t)found[i]->numel : 0;
        if (dtype == LORA_DTYPE_BF16 && found[i] && i % 2 == 0 && found[i]->shape[1] > LORA_BF16_MAX_IN) {
            ERR(err, 400, "%s: tensor '%s' has %lld in-features, above the %d of BF16 storage (use --lora-dtype "
                "float32)", label, found[i]->name, (long long)found[i]->shape[1], LORA_BF16_MAX_IN);
            free(found);
            return -1;
        }
    }
    LoraAdapter *a = calloc(1, sizeof *a);
    if (a) a->pairs = calloc(n_slots, sizeof *a->pairs);
    if (a) a->arena = malloc(floats * es);
    if (!a || !a->pairs || !a->arena) {
        lora_free(a);
        free(found);
        return ERR(err, 503, "%s: out of memory for %zu adapter bytes", label, floats * es);
    }
    a->rank = c->r;
    a->alpha = (float)c->alpha;
    a->rslora = c->rslora;
    a->n_layers = cfg->n_layers;
    a->bytes = floats * es;
    a->dtype = dtype;
    a->n_targets = n_pairs;
    float scale = (float)(c->rslora ? c->alpha / sqrt((double)c->r) : c->alpha / c->r);
    char *p = a->arena;
    for (size_t i = 0; i < n_slots; i++) {
        const StTensor *ta = found[2 * i], *tb = found[2 * i + 1];
        if (!ta) continue;
        LoraPair *lp = &a->pairs[i];
        store(p, ta, dtype);
        lp->a = p;
        p += (size_t)ta->numel * es;
        store_transposed(p, tb, dtype);
        lp->b = p;
        p += (size_t)tb->numel * es;
        lp->bf16 = dtype == LORA_DTYPE_BF16;
        lp->rank = c->r;
        lp->in = (int)ta->shape[1];
        lp->out = (int)tb->shape[0];
        lp->scale = scale;
    }
    free(found);
    *out = a;
    return 0;
}

int lora_load(LoraAdapter **out, const ModelConfig *cfg, const char *dir, int max_rank, const StOpener *op,
              const char *label, Err *err) {
    LoraLoadOpts o = {max_rank, LORA_DTYPE_F32};
    return lora_load_opts(out, cfg, dir, &o, op, label, err);
}

int lora_load_opts(LoraAdapter **out, const ModelConfig *cfg, const char *dir, const LoraLoadOpts *o,
                   const StOpener *op, const char *label, Err *err) {
    *out = NULL;
    int max_rank = o->max_rank > LORA_MAX_RANK ? LORA_MAX_RANK : o->max_rank;
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    int fd = open_file(op, path, err);
    if (fd < 0) return -1;
    json_error_t je;
    json_t *root = json_loadfd(fd, 0, &je);
    close(fd);
    ENSURE(err, root, 400, "%s: adapter_config.json: %s (line %d)", label, je.text, je.line);
    Config c = {0};
    int rc = parse_config(root, label, max_rank, &c, err);
    json_decref(root);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    SafeTensors *st = NULL;
    rc = op ? safetensors_open_with(&st, path, op, err) : safetensors_open(&st, path, err);
    if (rc) return rc;
    rc = build(out, cfg, st, &c, o->dtype, label, err);
    safetensors_free(st);
    return rc;
}

int lora_from_memory(LoraAdapter **out, const ModelConfig *cfg, const char *config, size_t config_len,
                     const uint8_t *st_bytes, size_t st_len, int max_rank, const char *label, Err *err) {
    LoraLoadOpts o = {max_rank, LORA_DTYPE_F32};
    return lora_from_memory_opts(out, cfg, config, config_len, st_bytes, st_len, &o, label, err);
}

int lora_from_memory_opts(LoraAdapter **out, const ModelConfig *cfg, const char *config, size_t config_len,
                          const uint8_t *st_bytes, size_t st_len, const LoraLoadOpts *o, const char *label, Err *err) {
    *out = NULL;
    int max_rank = o->max_rank > LORA_MAX_RANK ? LORA_MAX_RANK : o->max_rank;
    json_error_t je;
    json_t *root = json_loadb(config, config_len, JSON_REJECT_DUPLICATES, &je);
    ENSURE(err, root, 400, "%s: adapter_config.json: %s (offset %d)", label, je.text, je.position);
    Config c = {0};
    int rc = parse_config(root, label, max_rank, &c, err);
    json_decref(root);
    if (rc) return rc;
    SafeTensors st = {0}; /* parse only reads the image */
    rc = safetensors_parse(&st, 0, (uint8_t *)st_bytes, st_len, label, err);
    if (rc == 0) rc = build(out, cfg, &st, &c, o->dtype, label, err);
    for (int i = 0; i < st.n; i++) free(st.t[i].name);
    free(st.t);
    return rc;
}

void lora_free(LoraAdapter *a) {
    if (!a) return;
    free(a->arena);
    free(a->pairs);
    free(a);
}
