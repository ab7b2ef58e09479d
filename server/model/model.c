/*
 * model.c - load a Hugging Face model directory into a Model: map the
 * safetensors, check every tensor of the weight registry's list (name, dtype,
 * shape; weight_registry.h), use BF16 in place and convert F16/F32 to BF16
 * once. Prints a summary. Not here: which tensors an architecture has
 * (arch_tables.c), the forward pass (forward.c), quantization (quant/).
 */
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "log.h"
#include "quant.h"
#include "weight_registry.h"

typedef struct Loader {
    Model *m;
    const char *dir;
    Err *err;
} Loader;

/* Returns bf16 storage for a tensor of exactly the given 1-D or 2-D shape,
 * or NULL with err set. optional: absent tensor is not an error. */
static uint16_t *load_bf16(Loader *L, const char *name, int64_t d0, int64_t d1, int optional) {
    const StTensor *t = safetensors_get(L->m->st, name);
    if (!t) {
        if (!optional) ERR(L->err, 400, "%s: tensor '%s' is missing from the checkpoint", L->dir, name);
        return NULL;
    }
    int nd = d1 ? 2 : 1;
    if (t->ndim != nd || t->shape[0] != d0 || (nd == 2 && t->shape[1] != d1)) {
        ERR(L->err, 400, "%s: tensor '%s' (%s) has shape [%lld%s%lld], config.json implies [%lld%s%lld]",
            L->dir, name, L->m->st->paths[t->file], (long long)t->shape[0], nd == 2 ? ", " : "",
            nd == 2 ? (long long)t->shape[1] : 0ll, (long long)d0, nd == 2 ? ", " : "",
            nd == 2 ? (long long)d1 : 0ll);
        return NULL;
    }
    L->m->n_params += t->numel;
    L->m->weight_bytes += (size_t)t->numel * 2;
    if (t->dtype == DT_BF16 && ((uintptr_t)t->data & 1) == 0) return (uint16_t *)t->data;
    if (t->dtype != DT_BF16 && t->dtype != DT_F16 && t->dtype != DT_F32) {
        ERR(L->err, 400, "%s: tensor '%s' has dtype %s; supported: BF16, F16, F32", L->dir, name,
            dtype_name(t->dtype));
        return NULL;
    }
    uint16_t *out = xmalloc((size_t)t->numel * 2);
    for (int64_t i = 0; i < t->numel; i++) {
        const uint8_t *p = t->data + i * dtype_size(t->dtype);
        if (t->dtype == DT_BF16) memcpy(&out[i], p, 2);
        else if (t->dtype == DT_F16) { uint16_t h; memcpy(&h, p, 2); out[i] = f32_to_bf16(f16_to_f32(h)); }
        else { float f; memcpy(&f, p, 4); out[i] = f32_to_bf16(f); }
    }
    L->m->owned = realloc(L->m->owned, sizeof(void *) * (size_t)(L->m->n_owned + 1));
    CHECK_PTR(L->m->owned, "out of memory");
    L->m->owned[L->m->n_owned++] = out;
    return out;
}

/* A linear stored pre-quantized: FP8 (`weight` F8_E4M3 + `weight_scale_inv`)
 * or NVFP4 (`weight` U8 packed + `weight_scale` + `weight_scale_2` [+ `input_scale`]).
 * There is no BF16 master: deltas cannot be applied to such tensors. */
static int load_prequant(Loader *L, WeightMat *w, const StTensor *t, const char *name) {
    Model *m = L->m;
    char pre[256], nm[300];
    snprintf(pre, sizeof pre, "%.*s", (int)(strlen(name) - strlen("weight")), name);
#define AUX(suffix) (snprintf(nm, sizeof nm, "%s%s", pre, suffix), safetensors_get(m->st, nm))
    Err *e = L->err;
    if (t->dtype == DT_F8_E4M3) {
        const StTensor *s = AUX("weight_scale_inv");
        ENSURE(e, s, 400, "%s: FP8 tensor '%s' has no '%sweight_scale_inv'", L->dir, name, pre);
        QuantFp8 *q = quant_fp8_from_checkpoint(t->data, t->dtype, t->shape, t->ndim, s->data, s->dtype,
                                                s->shape, s->ndim, e);
        if (!q) return -400;
        ENSURE(e, q->rows == w->rows && q->cols == w->cols, 400, "%s: '%s' is [%d, %d], config implies [%d, %d]",
               L->dir, name, q->rows, q->cols, w->rows, w->cols);
        w->fmt = WF_FP8;
        w->q = q;
        m->compute_bytes += quant_fp8_bytes(q);
    } else {
        const StTensor *s = AUX("weight_scale"), *s2 = AUX("weight_scale_2"), *is = AUX("input_scale");
        ENSURE(e, s && s2, 400, "%s: NVFP4 tensor '%s' needs '%sweight_scale' and '%sweight_scale_2'", L->dir,
               name, pre, pre);
        QuantNvfp4 *q = quant_nvfp4_from_checkpoint(
            t->data, t->dtype, t->shape, t->ndim, s->data, s->dtype, s->shape, s->ndim, s2->data, s2->dtype,
            s2->shape, s2->ndim, is ? is->data : NULL, is ? is->dtype : DT_F32, is ? is->shape : NULL,
            is ? is->ndim : 0, e);
        if (!q) return -400;
        ENSURE(e, q->rows == w->rows && q->cols == w->cols, 400, "%s: '%s' is [%d, %d], config implies [%d, %d]",
               L->dir, name, q->rows, q->cols, w->rows, w->cols);
        w->fmt = WF_NVFP4;
        w->q = q;
        m->compute_bytes += quant_nvfp4_bytes(q);
    }
#undef AUX
    m->n_params += (int64_t)w->rows * w->cols;
    m->weight_bytes += (size_t)w->rows * w->cols * 2;
    return 0;
}

/* One registry entry: a matrix (BF16, or stored pre-quantized), or a BF16
 * vector / embedding. Counts its parameters and the bytes a decode token reads. */
static int load_entry(Loader *L, WeightTensor *t) {
    Model *m = L->m;
    int64_t d1 = t->ndim == 2 ? t->shape[1] : 0;
    if (t->mat && !t->vec) {
        WeightMat *w = t->mat;
        const StTensor *st = safetensors_get(m->st, t->name);
        if (st && m->cfg.prequant && (st->dtype == DT_F8_E4M3 || st->dtype == DT_U8))
            return load_prequant(L, w, st, t->name);
        w->bf16 = load_bf16(L, t->name, t->shape[0], d1, 0);
        if (!w->bf16) return -400;
        m->compute_bytes += (size_t)w->rows * w->cols * 2;
        t->patchable = w->bf16 == (const uint16_t *)st->data;
        return 0;
    }
    const uint16_t *p = load_bf16(L, t->name, t->shape[0], d1, 0);
    if (!p) return -400;
    t->vec->host = p;
    t->patchable = p == (const uint16_t *)safetensors_get(m->st, t->name)->data;
    if (t->mat) { /* tied: lm_head reads the embedding */
        t->mat->bf16 = (uint16_t *)p;
        m->compute_bytes += (size_t)t->mat->rows * t->mat->cols * 2;
    }
    return 0;
}

/* Every tensor of the architecture's table, in table order (so the first
 * missing or misshapen one is the one reported). */
static int load_weights(Loader *L) {
    Model *m = L->m;
    weight_registry_build(m);
    for (int i = 0; i < m->weights.n; i++)
        if (load_entry(L, &m->weights.t[i])) return -400;
    weight_registry_index(&m->weights);
    return 0;
}

static const char *arch_summary(const ModelConfig *c, char *buf, size_t n) {
    if (c->n_experts)
        snprintf(buf, n, "%d experts top-%d%s", c->n_experts, c->top_k, c->norm_topk_prob ? " (normalized)" : "");
    else
        snprintf(buf, n, "dense");
    return buf;
}

int precision_parse(const char *s, Precision *out) {
    static const char *names[] = {"bf16", "fp8", "nvfp4"};
    for (int i = 0; i < 3; i++)
        if (strcmp(s, names[i]) == 0) { *out = (Precision)i; return 0; }
    return -1;
}

const char *precision_name(Precision p) {
    return p == PREC_FP8 ? "fp8" : p == PREC_NVFP4 ? "nvfp4" : "bf16";
}

/* A pre-quantized checkpoint runs at its own precision: asking for another
 * quantized precision is refused rather than silently re-quantized. */
static int check_precision(Model *m, const LoadOptions *opt, const char *dir, Err *err) {
    Precision pq = (Precision)m->cfg.prequant;
    if (pq == PREC_BF16 || opt->precision == PREC_BF16 || opt->precision == pq) return 0;
    return ERR(err, 400, "%s is a pre-quantized %s checkpoint; it cannot run at --precision %s (use %s, or "
               "a BF16 checkpoint)", dir, precision_name(pq), precision_name(opt->precision), precision_name(pq));
}

static void finish_prequant(Model *m, const LoadOptions *opt) {
    m->precision = (Precision)m->cfg.prequant;
    m->act_quant = !opt->weight_only;
    for (int i = 0; i < m->weights.n; i++)
        if (m->weights.t[i].quantizable) m->weights.t[i].mat->act_quant = m->act_quant;
    log_info("pre-quantized %s checkpoint (%s activations)", precision_name(m->precision),
             opt->weight_only ? "f32, weight-only" : "quantized");
}

int model_load(Model **out, const char *dir, Err *err) {
    LoadOptions o = {PREC_BF16, 0, 0};
    return model_load_opts(out, dir, &o, err);
}

int model_load_opts(Model **out, const char *dir, const LoadOptions *opt, Err *err) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    *out = NULL;
    Model *m = xcalloc(1, sizeof *m);
    int rc = model_config_load(&m->cfg, dir, err);
    if (!rc) rc = safetensors_open_private(&m->st, dir, err); /* served weights: not a mapping (safetensors.h) */
    Loader L = {m, dir, err};
    if (!rc) rc = check_precision(m, opt, dir, err);
    if (!rc) rc = load_weights(&L);
    if (!rc && m->cfg.prequant) finish_prequant(m, opt);
    else if (!rc && opt->precision != PREC_BF16) rc = model_quantize_layout(m, opt->precision, opt->weight_only, opt->fp8_per_channel, err);
    if (rc) {
        model_free(m);
        return rc;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const ModelConfig *c = &m->cfg;
    char moe[96];
    log_info("model %s: %s, %d layers, hidden %d, heads %d/%d kv, head_dim %d, vocab %d, %s, "
             "%.3fM params, %.1f MiB bf16, %s (%.1f MiB read per token), tied=%d, loaded in %.3f s",
             dir, c->arch_name, c->n_layers, c->hidden, c->n_heads, c->n_kv_heads, c->head_dim, c->vocab,
             arch_summary(c, moe, sizeof moe), m->n_params / 1e6, m->weight_bytes / 1048576.0,
             precision_name(m->precision), m->compute_bytes / 1048576.0, c->tie_embeddings, (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
    *out = m;
    return 0;
}

int model_is_routed_expert(const Model *m, const WeightMat *w) {
    for (int l = 0; m->cfg.n_experts && l < m->cfg.n_layers; l++) {
        const WeightMat *tabs[3] = {m->layers[l].egate, m->layers[l].eup, m->layers[l].edown};
        for (int j = 0; j < 3; j++)
            if (tabs[j] && w >= tabs[j] && w < tabs[j] + m->cfg.n_experts) return 1;
    }
    return 0;
}

void model_moe_pointers(const Model *m, int l, const void **t) {
    const LayerWeights *w = &m->layers[l];
    int E = m->cfg.n_experts;
    for (int e = 0; e < E; e++) {
        const WeightMat *m3[3] = {&w->egate[e], &w->eup[e], &w->edown[e]};
        for (int j = 0; j < 3; j++) {
            t[j * E + e] = m3[j]->dev;
            t[3 * E + j * E + e] = m3[j]->dev_scale;
            t[6 * E + j * E + e] = m3[j]->dev_s2; /* NVFP4's tensor scale, else NULL */
        }
    }
}

void model_free(Model *m) {
    if (!m) return;
    model_quant_free(m);
    weight_registry_free(m);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    safetensors_free(m->st);
    free(m);
}

/* Registered tensors: their bf16 storage when it is the mapping (converted
 * and pre-quantized tensors have none to patch). A checkpoint tensor the
 * architecture does not read: its mapping when it is aligned BF16. */
uint16_t *model_tensor(Model *m, const char *name, int64_t *numel) {
    const StTensor *t = safetensors_get(m->st, name);
    if (!t) return NULL;
    if (numel) *numel = t->numel;
    const WeightTensor *w = weight_registry_find(&m->weights, name);
    if (w) return w->patchable ? weight_tensor_bf16(w) : NULL;
    if (t->dtype == DT_BF16 && ((uintptr_t)t->data & 1) == 0) return (uint16_t *)t->data;
    return NULL;
}
