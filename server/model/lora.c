/*
 * lora.c - reading a PEFT LoRA adapter directory into f32 or bf16 pairs (lora.h).
 * Validates the whole adapter before it allocates its arena: a refused
 * adapter leaves nothing behind. Not here: the slots a batch indexes
 * (forward.c), the server's name registry.
 */
#include "lora.h"

#include <fcntl.h>
#include <jansson.h>
#include <ctype.h>
#include <math.h>
#include <regex.h>
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

/* in / out features of a routed expert's linear t (gate, up, down) on layer l; 0 on dense layers. */
static void expert_dims(const ModelConfig *c, int l, LoraTarget t, int *in, int *out) {
    int moe = model_layer_is_moe(c, l), I = c->moe_intermediate, H = c->hidden;
    *in = !moe ? 0 : t == LT_DOWN ? I : H;
    *out = !moe ? 0 : t == LT_DOWN ? H : I;
}

size_t lora_bytes_as(const ModelConfig *c, int rank, LoraDtype dtype) {
    size_t n = 0, es = dtype == LORA_DTYPE_BF16 ? 2 : 4;
    for (int l = 0; l < c->n_layers; l++) {
        for (int t = 0; t < LT_COUNT; t++) {
            int in, out;
            target_dims(c, l, (LoraTarget)t, &in, &out);
            n += (size_t)rank * (size_t)(in + out) * es;
        }
        for (int t = LT_GATE; t <= LT_DOWN; t++) {
            int in, out;
            expert_dims(c, l, (LoraTarget)t, &in, &out);
            n += (size_t)c->n_experts * (size_t)rank * (size_t)(in + out) * es;
        }
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

/* target_parameters (peft's ParamWrapper): only the routed experts' two fused parameters, named as peft
 * matches them (a suffix of "model.layers.<l>.mlp.experts.<param>"). */
static int check_target_parameters(json_t *root, const ModelConfig *cfg, const char *label, Err *err) {
    json_t *tp = json_object_get(root, "target_parameters");
    if (!tp || json_is_null(tp) || (json_is_array(tp) && json_array_size(tp) == 0)) return 0;
    ENSURE(err, json_is_array(tp), 400, "%s: adapter_config.json: target_parameters must be a list", label);
    ENSURE(err, cfg->n_experts > 0, 400, "%s: adapter_config.json sets target_parameters (MoE expert parameters), "
           "but the model is dense", label);
    size_t i;
    json_t *e;
    json_array_foreach(tp, i, e) {
        const char *n = json_string_value(e), *dot = n ? strrchr(n, '.') : NULL, *leaf = dot ? dot + 1 : n;
        int ok = n && (!strcmp(leaf, "gate_up_proj") || !strcmp(leaf, "down_proj"));
        if (ok && dot) { /* "...experts.<param>" */
            size_t k = (size_t)(dot - n);
            ok = k >= 7 && !strncmp(dot - 7, "experts", 7) && (k == 7 || dot[-8] == '.');
        }
        ENSURE(err, ok, 400, "%s: target parameter '%s' is not supported (supported: the MoE experts' gate_up_proj "
               "and down_proj, e.g. \"mlp.experts.gate_up_proj\")", label, n ? n : "(not a string)");
    }
    return 0;
}

/* rank_pattern / alpha_pattern (peft): key regex -> value, the first key (in the file's order) that
 * matches a module's name wins, matched as peft does: re.match(rf"(.*\.)?({key})$", name) with name
 * "model.layers.<l>.<self_attn|mlp>.<target>", "model.layers.<l>.mlp.experts.<e>.<target>" (per-expert
 * pairs) or "model.layers.<l>.mlp.experts.<gate_up_proj|down_proj>" (peft's target_parameters). peft on
 * transformers 5 writes {".*\.gate_up_proj": 2r} / {..: 2 alpha} itself when it fuses gate_proj and
 * up_proj. Keys are Python regexes; only the part of the syntax POSIX ERE reads alike is accepted. */
#define LORA_MAX_PATTERNS 64
typedef struct Pattern {
    regex_t re;
    double v;
} Pattern;

typedef struct Config {
    int r;
    double alpha;
    int rslora;
    Pattern rp[LORA_MAX_PATTERNS], ap[LORA_MAX_PATTERNS];
    int n_rp, n_ap;
} Config;

static void config_free(Config *c) {
    for (int i = 0; i < c->n_rp; i++) regfree(&c->rp[i].re);
    for (int i = 0; i < c->n_ap; i++) regfree(&c->ap[i].re);
    c->n_rp = c->n_ap = 0;
}

/* A Python regex that means the same as POSIX ERE: literals, '.', classes, groups without '(?',
 * '|', greedy '*' '+' '?' '{m,n}', and backslash only before a metacharacter. */
static int pattern_ok(const char *p) {
    for (const char *q = p; *q; q++) {
        if (*q == '\\') {
            if (!q[1] || !strchr(".[](){}*+?|^$\\-", q[1])) return 0;
            q++;
            continue;
        }
        if (*q == '(' && q[1] == '?') return 0;
        if (*q == '?' && q > p && strchr("*+?}", q[-1])) return 0; /* lazy quantifiers */
        if (*q == '+' && q > p && strchr("*+?}", q[-1])) return 0; /* possessive */
        if (!(isalnum((unsigned char)*q) || strchr("_-.*+?|()[]^${},:/", *q))) return 0;
    }
    return 1;
}

static int parse_patterns(json_t *root, const char *key, int is_rank, int max_rank, Config *c, const char *label,
                          Err *err) {
    json_t *o = json_object_get(root, key);
    if (!o || json_is_null(o)) return 0;
    ENSURE(err, json_is_object(o), 400, "%s: adapter_config.json: %s must be an object", label, key);
    ENSURE(err, json_object_size(o) <= LORA_MAX_PATTERNS, 400, "%s: adapter_config.json: %s has %zu keys (at most "
           "%d)", label, key, json_object_size(o), LORA_MAX_PATTERNS);
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        ENSURE(err, pattern_ok(k), 400, "%s: %s key '%s' uses regex syntax that is not supported (literals, '.', "
               "classes, groups, '|', '*', '+', '?', '{m,n}', backslash before a metacharacter)", label, key, k);
        if (is_rank) {
            ENSURE(err, json_is_integer(v) && json_integer_value(v) >= 1, 400, "%s: %s['%s'] must be an integer >= "
                   "1", label, key, k);
            ENSURE(err, json_integer_value(v) <= max_rank, 400, "%s: %s['%s'] = %lld is above --max-lora-rank %d "
                   "(restart with a larger --max-lora-rank)", label, key, k, (long long)json_integer_value(v),
                   max_rank);
        } else {
            ENSURE(err, json_is_number(v), 400, "%s: %s['%s'] must be a number", label, key, k);
        }
        size_t n = strlen(k) + 16;
        char *re = malloc(n);
        ENSURE(err, re, 503, "%s: out of memory", label);
        snprintf(re, n, "^(.*\\.)?(%s)$", k);
        Pattern *pt = is_rank ? &c->rp[c->n_rp] : &c->ap[c->n_ap];
        int rc = regcomp(&pt->re, re, REG_EXTENDED | REG_NOSUB);
        free(re);
        ENSURE(err, rc == 0, 400, "%s: %s key '%s' is not a valid regular expression", label, key, k);
        pt->v = json_number_value(v);
        if (is_rank) c->n_rp++;
        else c->n_ap++;
    }
    return 0;
}

/* The value of the first pattern matching name, else dflt. */
static double pattern_value(const Pattern *p, int n, const char *name, double dflt) {
    for (int i = 0; i < n; i++)
        if (regexec(&p[i].re, name, 0, NULL, 0) == 0) return p[i].v;
    return dflt;
}

/* peft's module name of a pair: e < 0 a layer's own linear t, e >= 0 expert e's, fused >= 0 the experts'
 * fused parameter (0 gate_up_proj, 1 down_proj). */
static const char *module_key(char *buf, size_t n, int l, int e, LoraTarget t, int fused) {
    if (fused >= 0) snprintf(buf, n, "model.layers.%d.mlp.experts.%s", l, fused ? "down_proj" : "gate_up_proj");
    else if (e >= 0) snprintf(buf, n, "model.layers.%d.mlp.experts.%d.%s", l, e, lora_target_name(t));
    else snprintf(buf, n, "model.layers.%d.%s.%s", l, t <= LT_O ? "self_attn" : "mlp", lora_target_name(t));
    return buf;
}
static int key_rank(const Config *c, const char *key) { return (int)pattern_value(c->rp, c->n_rp, key, c->r); }
static float key_scale(const Config *c, const char *key) {
    double r = key_rank(c, key), alpha = pattern_value(c->ap, c->n_ap, key, c->alpha);
    return (float)(c->rslora ? alpha / sqrt(r) : alpha / r);
}

static int parse_config(json_t *root, const ModelConfig *cfg, const char *label, int max_rank, Config *c, Err *err) {
    ENSURE(err, json_is_object(root), 400, "%s: adapter_config.json is not a JSON object", label);
    json_t *pt = json_object_get(root, "peft_type");
    ENSURE(err, !pt || (json_is_string(pt) && strcmp(json_string_value(pt), "LORA") == 0), 400,
           "%s: peft_type must be \"LORA\" (only LoRA adapters are served)", label);
    if (refuse_set(root, "use_dora", NULL, label, "DoRA adapters need a magnitude vector per linear", err) ||
        refuse_set(root, "modules_to_save", NULL, label, "only LoRA pairs are applied; full module copies are not",
                   err) ||
        refuse_set(root, "bias", "none", label, "trained biases are not applied; bias must be \"none\"", err) ||
        refuse_set(root, "fan_in_fan_out", NULL, label, "Conv1D-style (GPT-2) weights", err) ||
        check_target_parameters(root, cfg, label, err) ||
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
    if (parse_patterns(root, "rank_pattern", 1, max_rank, c, label, err) ||
        parse_patterns(root, "alpha_pattern", 0, max_rank, c, label, err)) {
        config_free(c);
        return -1;
    }
    return 0;
}

/* What a tensor name names. */
typedef enum { TN_DENSE, TN_EXPERT, TN_FUSED } TensorKindLora;
typedef struct TensorName {
    TensorKindLora kind;
    int l;        /* layer */
    int e;        /* TN_EXPERT: the expert */
    int depth;    /* TN_FUSED: base_layer. segments (peft's ParamWrapper nesting) */
    LoraTarget t; /* TN_DENSE / TN_EXPERT */
    int is_b;
} TensorName;
#define FUSED_MAX_DEPTH 2 /* Qwen3MoeExperts has two parameters */

/* ".<gate|up|down|...>_proj.lora_<A|B>.weight" at mod: the target among [t0, t1], or -1. */
static int match_target(const char *mod, int t0, int t1, int *is_b) {
    for (int k = t0; k <= t1; k++) {
        size_t n = strlen(TARGET_NAMES[k]);
        if (strncmp(mod, TARGET_NAMES[k], n) || mod[n] != '.') continue;
        const char *rest = mod + n + 1;
        if (strcmp(rest, "lora_A.weight") && strcmp(rest, "lora_B.weight")) return -2;
        *is_b = rest[5] == 'B';
        return k;
    }
    return -1;
}

/* "base_model.model.model.layers.<l>." then "<self_attn|mlp>.<target>.lora_<A|B>.weight" (TN_DENSE),
 * "mlp.experts.<e>.<gate|up|down>_proj.lora_<A|B>.weight" (TN_EXPERT) or
 * "mlp.experts.[base_layer.]*lora_<A|B>.weight" (TN_FUSED). */
static int parse_name(const char *name, const ModelConfig *cfg, TensorName *tn, const char *label, Err *err) {
    static const char pre[] = "base_model.model.model.layers.";
    ENSURE(err, strncmp(name, pre, sizeof pre - 1) == 0, 400, "%s: tensor '%s' is not a LoRA pair of a decoder "
           "layer (embedding, lm_head and other modules are not supported)", label, name);
    const char *p = name + sizeof pre - 1;
    char *end;
    long li = strtol(p, &end, 10);
    ENSURE(err, end != p && *end == '.' && li >= 0 && li < cfg->n_layers, 400, "%s: tensor '%s': no such layer "
           "(the model has %d)", label, name, cfg->n_layers);
    memset(tn, 0, sizeof *tn);
    tn->l = (int)li;
    p = end + 1;
    ENSURE(err, strncmp(p, "mlp.gate.", 9) != 0, 400, "%s: tensor '%s': LoRA on the MoE router is not supported",
           label, name);
    if (strncmp(p, "mlp.experts.", 12) == 0) {
        const char *q = p + 12;
        ENSURE(err, model_layer_is_moe(cfg, tn->l), 400, "%s: tensor '%s': layer %d is not a MoE layer", label, name,
               tn->l);
        if (*q >= '0' && *q <= '9') {
            long e = strtol(q, &end, 10);
            ENSURE(err, *end == '.' && e >= 0 && e < cfg->n_experts, 400, "%s: tensor '%s': no such expert (the "
                   "model has %d)", label, name, cfg->n_experts);
            int k = match_target(end + 1, LT_GATE, LT_DOWN, &tn->is_b);
            ENSURE(err, k >= 0, 400, "%s: tensor '%s': an expert's LoRA pair is gate_proj, up_proj or down_proj "
                   ".lora_A.weight / .lora_B.weight", label, name);
            tn->kind = TN_EXPERT;
            tn->e = (int)e;
            tn->t = (LoraTarget)k;
            return 0;
        }
        while (strncmp(q, "base_layer.", 11) == 0) {
            tn->depth++;
            q += 11;
        }
        ENSURE(err, (!strcmp(q, "lora_A.weight") || !strcmp(q, "lora_B.weight")) && tn->depth < FUSED_MAX_DEPTH,
               400, "%s: tensor '%s' is not a LoRA pair of the experts' fused parameters (peft's target_parameters: "
               "mlp.experts[.base_layer].lora_A.weight / lora_B.weight)", label, name);
        tn->kind = TN_FUSED;
        tn->is_b = q[5] == 'B';
        return 0;
    }
    const char *mod = strncmp(p, "self_attn.", 10) == 0 ? p + 10 : strncmp(p, "mlp.", 4) == 0 ? p + 4 : NULL;
    ENSURE(err, mod, 400, "%s: tensor '%s' is not in self_attn or mlp", label, name);
    int k = match_target(mod, 0, LT_COUNT - 1, &tn->is_b);
    ENSURE(err, k != -2, 400, "%s: tensor '%s' is not lora_A.weight or lora_B.weight (DoRA magnitudes, embeddings "
           "and biases are not supported)", label, name);
    ENSURE(err, k >= 0, 400, "%s: tensor '%s': unsupported module (supported: q_proj k_proj v_proj o_proj gate_proj "
           "up_proj down_proj, and the MoE experts')", label, name);
    ENSURE(err, (k <= LT_O) == (p[0] == 's'), 400, "%s: tensor '%s': %s is not in that block", label, name,
           TARGET_NAMES[k]);
    tn->kind = TN_DENSE;
    tn->t = (LoraTarget)k;
    return 0;
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

/* A fused pair (peft ParamWrapper over a 3-D expert parameter): A [r*E, in], B [out, r*E]. */
typedef struct Fused {
    const StTensor *a, *b;
} Fused;
enum { FU_GATE_UP = 0, FU_DOWN = 1 };

/* Expert e's A of a fused pair: rows [e*r, (e+1)*r) of A, [r, in]. */
static void store_fused_a(void *dst, const StTensor *a, int r, int e, LoraDtype dtype) {
    int64_t in = a->shape[1], base = (int64_t)e * r * in;
    for (int64_t k = 0; k < (int64_t)r * in; k++) put(dst, (size_t)k, a, base + k, dtype);
}

/* Expert e's B of a fused pair, output rows [o0, o0 + outs), transposed: dst [r, outs] with
 * dst[k][o] = B[o0 + o][k * E + e] (peft: B.reshape(out, r, E)). */
static void store_fused_bt(void *dst, const StTensor *b, int r, int E, int e, int o0, int outs, LoraDtype dtype) {
    int64_t cols = b->shape[1];
    for (int k = 0; k < r; k++)
        for (int o = 0; o < outs; o++)
            put(dst, (size_t)k * outs + o, b, (int64_t)(o0 + o) * cols + (int64_t)k * E + e, dtype);
}

static const char *shape_str(const StTensor *t, char *buf, size_t n) {
    snprintf(buf, n, "[%lld, %lld]", t->ndim > 0 ? (long long)t->shape[0] : 0,
             t->ndim > 1 ? (long long)t->shape[1] : 0);
    return buf;
}

/* Every tensor checked (names, dtypes, shapes, each A with its B, the fused pairs told apart by shape)
 * before anything is allocated. found [n_slots * 2]: per slot its A and B; fused [n_layers * 2]. */
static int check_tensors(const SafeTensors *st, const ModelConfig *cfg, const Config *c, const char *label,
                         int *n_pairs, const StTensor **found, Fused *fused, Err *err) {
    int L = cfg->n_layers, E = cfg->n_experts, H = cfg->hidden, I = cfg->moe_intermediate;
    Fused *byd = calloc((size_t)L * FUSED_MAX_DEPTH + 1, sizeof *byd); /* per (layer, depth) */
    ENSURE(err, byd, 503, "%s: out of memory", label);
    char s1[64], s2[64], key[128];
    int rc = -1;
    for (int i = 0; i < st->n; i++) {
        const StTensor *t = &st->t[i];
        TensorName tn;
        if (parse_name(t->name, cfg, &tn, label, err)) goto out;
        if (!(t->dtype == DT_F32 || t->dtype == DT_BF16 || t->dtype == DT_F16)) {
            ERR(err, 400, "%s: tensor '%s' is %s (supported: F32, BF16, F16)", label, t->name, dtype_name(t->dtype));
            goto out;
        }
        if (tn.kind == TN_FUSED) {
            Fused *f = &byd[(size_t)tn.l * FUSED_MAX_DEPTH + tn.depth];
            if (tn.is_b) f->b = t;
            else f->a = t;
            continue;
        }
        int in, out;
        if (tn.kind == TN_DENSE) target_dims(cfg, tn.l, tn.t, &in, &out);
        else expert_dims(cfg, tn.l, tn.t, &in, &out);
        if (in <= 0) {
            ERR(err, 400, "%s: tensor '%s': layer %d is a MoE layer (its experts are adapted as "
                "mlp.experts.<e>.%s or through target_parameters)", label, t->name, tn.l, TARGET_NAMES[tn.t]);
            goto out;
        }
        int r = key_rank(c, module_key(key, sizeof key, tn.l, tn.kind == TN_EXPERT ? tn.e : -1, tn.t, -1));
        int64_t want0 = tn.is_b ? out : r, want1 = tn.is_b ? r : in;
        if (!(t->ndim == 2 && t->shape[0] == want0 && t->shape[1] == want1)) {
            ERR(err, 400, "%s: tensor '%s' has shape %s, the model needs [%lld, %lld] (r = %d)", label, t->name,
                shape_str(t, s1, sizeof s1), (long long)want0, (long long)want1, r);
            goto out;
        }
        found[lora_slot(L, E, tn.l, tn.kind == TN_EXPERT ? tn.e : -1, tn.t) * 2 + tn.is_b] = t;
    }
    *n_pairs = 0;
    for (int l = 0; l < L; l++) {
        for (int d = 0; d < FUSED_MAX_DEPTH; d++) {
            const Fused *f = &byd[(size_t)l * FUSED_MAX_DEPTH + d];
            if (!f->a && !f->b) continue;
            if (!f->a || !f->b) {
                ERR(err, 400, "%s: layer %d: mlp.experts.%slora_%s.weight without its lora_%s.weight", label, l,
                    d ? "base_layer." : "", f->a ? "A" : "B", f->a ? "B" : "A");
                goto out;
            }
            /* which parameter: the one whose shapes these are, each at its own rank (rank_pattern) */
            int rg = key_rank(c, module_key(key, sizeof key, l, -1, LT_GATE, FU_GATE_UP));
            int rd = key_rank(c, module_key(key, sizeof key, l, -1, LT_DOWN, FU_DOWN));
            int which = -1;
            int64_t dims[2][3] = {{(int64_t)rg * E, H, 2 * (int64_t)I}, {(int64_t)rd * E, I, H}}; /* rows, in, out */
            for (int w = 0; w < 2 && which < 0 && f->a->ndim == 2 && f->b->ndim == 2; w++)
                if (f->a->shape[0] == dims[w][0] && f->a->shape[1] == dims[w][1] && f->b->shape[0] == dims[w][2] &&
                    f->b->shape[1] == dims[w][0])
                    which = w;
            if (which < 0) {
                ERR(err, 400, "%s: layer %d: the fused expert pair %s has shapes %s / %s; the model needs [%d, %d] / "
                    "[%d, %d] (gate_up_proj, r = %d) or [%d, %d] / [%d, %d] (down_proj, r = %d) (%d experts)", label,
                    l, f->a->name, shape_str(f->a, s1, sizeof s1), shape_str(f->b, s2, sizeof s2), rg * E, H, 2 * I,
                    rg * E, rg, rd * E, I, H, rd * E, rd, E);
                goto out;
            }
            if (fused[(size_t)l * 2 + which].a) {
                ERR(err, 400, "%s: layer %d: two fused pairs adapt the experts' %s", label, l,
                    which == FU_GATE_UP ? "gate_up_proj" : "down_proj");
                goto out;
            }
            fused[(size_t)l * 2 + which] = *f;
            *n_pairs += E * (which == FU_GATE_UP ? 2 : 1);
        }
        for (int k = 0; k < LT_COUNT + 3 * E; k++) { /* layer l's own linears, then expert e's three */
            int e = k < LT_COUNT ? -1 : (k - LT_COUNT) / 3;
            LoraTarget t = k < LT_COUNT ? (LoraTarget)k : (LoraTarget)(LT_GATE + (k - LT_COUNT) % 3);
            size_t s = lora_slot(L, E, l, e, t);
            const StTensor *ta = found[s * 2], *tb = found[s * 2 + 1];
            if (!ta != !tb) {
                char ex[32] = "";
                if (e >= 0) snprintf(ex, sizeof ex, "expert %d ", e);
                ERR(err, 400, "%s: layer %d %s%s has lora_%s.weight without lora_%s.weight", label, l, ex,
                    TARGET_NAMES[t], ta ? "A" : "B", ta ? "B" : "A");
                goto out;
            }
            int fu = e < 0 ? -1 : t == LT_DOWN ? FU_DOWN : FU_GATE_UP;
            if (ta && fu >= 0 && fused[(size_t)l * 2 + fu].a) {
                ERR(err, 400, "%s: layer %d expert %d %s is adapted twice (per expert and through the fused "
                    "parameters)", label, l, e, TARGET_NAMES[t]);
                goto out;
            }
            *n_pairs += ta != NULL;
        }
    }
    if (*n_pairs == 0) {
        ERR(err, 400, "%s: adapter_model.safetensors holds no LoRA pair", label);
        goto out;
    }
    rc = 0;
out:
    free(byd);
    return rc;
}

static int build(LoraAdapter **out, const ModelConfig *cfg, const SafeTensors *st, const Config *c,
                 LoraDtype dtype, const char *label, Err *err) {
    int L = cfg->n_layers, E = cfg->n_experts;
    char key[128];
    size_t n_slots = lora_n_slots(L, E);
    const StTensor **found = calloc(n_slots * 2, sizeof *found);
    Fused *fused = calloc((size_t)L * 2, sizeof *fused);
    if (!found || !fused) {
        free(found);
        free(fused);
        return ERR(err, 503, "%s: out of memory", label);
    }
    int n_pairs = 0;
    if (check_tensors(st, cfg, c, label, &n_pairs, found, fused, err)) {
        free(found);
        free(fused);
        return -1;
    }
    size_t floats = 0, es = dtype == LORA_DTYPE_BF16 ? 2 : 4;
    const StTensor *wide = NULL;
    for (size_t i = 0; i < n_slots * 2; i++) {
        floats += found[i] ? (size_t)found[i]->numel : 0;
        if (found[i] && i % 2 == 0 && found[i]->shape[1] > LORA_BF16_MAX_IN) wide = found[i];
    }
    for (int i = 0; i < L * 2; i++) {
        if (!fused[i].a) continue;
        /* gate_up: its A twice (gate's and up's pairs), B split between them */
        floats += (size_t)fused[i].a->numel * (i % 2 == FU_GATE_UP ? 2 : 1) + (size_t)fused[i].b->numel;
        if (fused[i].a->shape[1] > LORA_BF16_MAX_IN) wide = fused[i].a;
    }
    if (dtype == LORA_DTYPE_BF16 && wide) {
        ERR(err, 400, "%s: tensor '%s' has %lld in-features, above the %d of BF16 storage (use --lora-dtype "
            "float32)", label, wide->name, (long long)wide->shape[1], LORA_BF16_MAX_IN);
        free(found);
        free(fused);
        return -1;
    }
    LoraAdapter *a = calloc(1, sizeof *a);
    if (a) a->pairs = calloc(n_slots, sizeof *a->pairs);
    if (a) a->arena = malloc(floats * es);
    if (!a || !a->pairs || !a->arena) {
        lora_free(a);
        free(found);
        free(fused);
        return ERR(err, 503, "%s: out of memory for %zu adapter bytes", label, floats * es);
    }
    a->rank = 0; /* the largest pair's, below */
    a->alpha = (float)c->alpha;
    a->rslora = c->rslora;
    a->n_layers = L;
    a->n_experts = E;
    a->bytes = floats * es;
    a->dtype = dtype;
    a->n_targets = n_pairs;
    char *p = a->arena;
    for (size_t i = 0; i < n_slots; i++) {
        const StTensor *ta = found[2 * i], *tb = found[2 * i + 1];
        if (!ta) continue;
        LoraPair *lp = &a->pairs[i];
        int l, e;
        LoraTarget t;
        lora_slot_target(L, E, i, &l, &e, &t); /* for the module name of its scale */
        store(p, ta, dtype);
        lp->a = p;
        p += (size_t)ta->numel * es;
        store_transposed(p, tb, dtype);
        lp->b = p;
        p += (size_t)tb->numel * es;
        lp->bf16 = dtype == LORA_DTYPE_BF16;
        lp->rank = (int)ta->shape[0];
        lp->in = (int)ta->shape[1];
        lp->out = (int)tb->shape[0];
        lp->scale = key_scale(c, module_key(key, sizeof key, l, e, t, -1));
        a->rank = lp->rank > a->rank ? lp->rank : a->rank;
    }
    for (int l = 0; l < L; l++)
        for (int fu = 0; fu < 2; fu++) {
            const Fused *f = &fused[(size_t)l * 2 + fu];
            if (!f->a) continue;
            int in = (int)f->a->shape[1], outs = fu == FU_DOWN ? (int)f->b->shape[0] : (int)f->b->shape[0] / 2;
            int r = (int)(f->a->shape[0] / E);
            float scale = key_scale(c, module_key(key, sizeof key, l, -1, fu == FU_DOWN ? LT_DOWN : LT_GATE, fu));
            a->rank = r > a->rank ? r : a->rank;
            for (int e = 0; e < E; e++)
                for (int h = 0; h < (fu == FU_GATE_UP ? 2 : 1); h++) {
                    LoraTarget t = fu == FU_DOWN ? LT_DOWN : h ? LT_UP : LT_GATE;
                    LoraPair *lp = &a->pairs[lora_slot(L, E, l, e, t)];
                    store_fused_a(p, f->a, r, e, dtype);
                    lp->a = p;
                    p += (size_t)r * in * es;
                    store_fused_bt(p, f->b, r, E, e, h * outs, outs, dtype);
                    lp->b = p;
                    p += (size_t)r * outs * es;
                    lp->bf16 = dtype == LORA_DTYPE_BF16;
                    lp->rank = r;
                    lp->in = in;
                    lp->out = outs;
                    lp->scale = scale;
                }
        }
    ASSERT(p == (char *)a->arena + a->bytes, "lora: arena filled to %zu of %zu bytes", (size_t)(p - (char *)a->arena),
           a->bytes);
    free(found);
    free(fused);
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
    int rc = parse_config(root, cfg, label, max_rank, &c, err);
    json_decref(root);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    SafeTensors *st = NULL;
    rc = op ? safetensors_open_with(&st, path, op, err) : safetensors_open(&st, path, err);
    if (rc == 0) {
        rc = build(out, cfg, st, &c, o->dtype, label, err);
        safetensors_free(st);
    }
    config_free(&c);
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
    int rc = parse_config(root, cfg, label, max_rank, &c, err);
    json_decref(root);
    if (rc) return rc;
    SafeTensors st = {0}; /* parse only reads the image */
    rc = safetensors_parse(&st, 0, (uint8_t *)st_bytes, st_len, label, err);
    if (rc == 0) rc = build(out, cfg, &st, &c, o->dtype, label, err);
    config_free(&c);
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
