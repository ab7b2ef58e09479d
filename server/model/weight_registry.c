/*
 * weight_registry.c - the flat list of a model's tensors (Model.weights),
 * built from its architecture's table (arch_tables.c): expands the per-layer
 * and per-expert rows into checkpoint names and shapes, points each entry at
 * the field it fills, and indexes the list by name and by storage for delta
 * lookups. The quantizable flag of every entry comes from
 * quant_should_quantize, the one quantization policy; the table's own flag is
 * checked against it so a table cannot drift from the tested policy.
 * Not here: reading tensors (model.c), uploading them (backends).
 */
#include "weight_registry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"

static int dim_of(const ModelConfig *c, WeightDim d) {
    switch (d) {
    case DIM_HIDDEN: return c->hidden;
    case DIM_VOCAB: return c->vocab;
    case DIM_Q: return c->n_heads * c->head_dim;
    case DIM_KV: return c->n_kv_heads * c->head_dim;
    case DIM_HEAD: return c->head_dim;
    case DIM_INTER: return c->intermediate;
    case DIM_MOE_INTER: return c->moe_intermediate;
    case DIM_EXPERTS: return c->n_experts;
    case DIM_NONE: break;
    }
    return 0;
}

static int present(const ModelConfig *c, const TensorKind *k, int l) {
    switch (k->when) {
    case WHEN_ALWAYS: return 1;
    case WHEN_QKV_BIAS: return c->qkv_bias;
    case WHEN_O_BIAS: return c->o_bias;
    case WHEN_QK_NORM: return c->qk_norm;
    case WHEN_UNTIED: return !c->tie_embeddings;
    case WHEN_DENSE: return !model_layer_is_moe(c, l);
    case WHEN_MOE: return model_layer_is_moe(c, l);
    }
    return 0;
}

/* pattern with its n "%d"s replaced by args[0..n) in order (the table's
 * patterns are data, not printf formats); the length written, or -1 when the
 * pattern's "%d" count is not n or the name does not fit in cap. */
static int expand_name(char *out, size_t cap, const char *pattern, const int *args, int n) {
    size_t o = 0;
    int used = 0;
    for (const char *p = pattern; *p; p++) {
        char num[16];
        const char *piece = p;
        size_t k = 1;
        if (p[0] == '%' && p[1] == 'd') {
            if (used == n) return -1;
            k = (size_t)snprintf(num, sizeof num, "%d", args[used++]);
            piece = num;
            p++;
        }
        if (o + k >= cap) return -1;
        memcpy(out + o, piece, k);
        o += k;
    }
    out[o] = 0;
    return used == n ? (int)o : -1;
}

static void add(Model *m, int *cap, const TensorKind *k, void *field, int l, int e) {
    WeightSet *ws = &m->weights;
    if (ws->n == *cap) {
        *cap = *cap ? 2 * *cap : 256;
        ws->t = realloc(ws->t, sizeof(WeightTensor) * (size_t)*cap);
        CHECK_PTR(ws->t, "out of memory");
    }
    WeightTensor *t = &ws->t[ws->n++];
    memset(t, 0, sizeof *t);
    int args[2] = {l, e};
    int len = expand_name(t->name, sizeof t->name, k->pattern, args, k->scope == WS_EXPERT ? 2 : k->scope == WS_LAYER);
    CHECK(len > 0 && (size_t)len < sizeof t->name, "tensor name '%s' too long or with the wrong number of %%d "
          "(a bug in arch_tables.c)", k->pattern);
    t->shape[0] = dim_of(&m->cfg, k->rows);
    t->shape[1] = dim_of(&m->cfg, k->cols);
    t->ndim = k->cols == DIM_NONE ? 1 : 2;
    t->numel = t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1);
    t->quantizable = k->kind == WK_MATRIX && quant_should_quantize(t->name, t->ndim);
    CHECK(t->quantizable == k->quantizable, "arch_tables.c marks '%s' %squantizable but quant_should_quantize "
          "says otherwise (a bug: the table must follow the policy)", t->name, k->quantizable ? "" : "not ");
    if (k->kind == WK_MATRIX) {
        t->mat = field;
        *t->mat = (WeightMat){.fmt = WF_BF16, .rows = (int)t->shape[0], .cols = (int)t->shape[1]};
    } else {
        t->vec = field;
        if (k->ties_lm_head && m->cfg.tie_embeddings) {
            t->mat = &m->lm_head;
            *t->mat = (WeightMat){.fmt = WF_BF16, .rows = (int)t->shape[0], .cols = (int)t->shape[1]};
        }
    }
}

void weight_registry_build(Model *m) {
    const ModelConfig *c = &m->cfg;
    const ArchTable *at = arch_table(c->arch);
    CHECK(at, "architecture %s has no tensor table in arch_tables.c", c->arch_name);
    int cap = 0;
    m->weights = (WeightSet){0};
    m->lm_head = (WeightMat){.fmt = WF_BF16, .rows = c->vocab, .cols = c->hidden};
    m->layers = xcalloc((size_t)c->n_layers, sizeof(LayerWeights));
    for (int i = 0; i < at->n; i++)
        if (at->kinds[i].scope == WS_MODEL && present(c, &at->kinds[i], 0))
            add(m, &cap, &at->kinds[i], (char *)m + at->kinds[i].off, 0, 0);
    for (int l = 0; l < c->n_layers; l++) {
        LayerWeights *lw = &m->layers[l];
        for (int i = 0; i < at->n; i++) {
            const TensorKind *k = &at->kinds[i];
            if (k->scope == WS_MODEL || !present(c, k, l)) continue;
            if (k->scope == WS_LAYER) {
                add(m, &cap, k, (char *)lw + k->off, l, 0);
                continue;
            }
            /* a run of expert rows: per expert, each row of the run */
            int j = i;
            while (j < at->n && at->kinds[j].scope == WS_EXPERT) j++;
            for (int r = i; r < j; r++) {
                WeightMat **arr = (WeightMat **)((char *)lw + at->kinds[r].off);
                *arr = xcalloc((size_t)c->n_experts, sizeof(WeightMat));
            }
            for (int e = 0; e < c->n_experts; e++)
                for (int r = i; r < j; r++)
                    add(m, &cap, &at->kinds[r], &(*(WeightMat **)((char *)lw + at->kinds[r].off))[e], l, e);
            i = j - 1;
        }
    }
}

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const WeightTensor *const *)a)->name, (*(const WeightTensor *const *)b)->name);
}

static int cmp_host(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)weight_tensor_bf16(*(const WeightTensor *const *)a),
              y = (uintptr_t)weight_tensor_bf16(*(const WeightTensor *const *)b);
    return x < y ? -1 : x > y;
}

/* out[i] = index of the i-th entry in cmp order. */
static int *sorted_index(const WeightSet *ws, int (*cmp)(const void *, const void *)) {
    WeightTensor **p = xcalloc((size_t)ws->n + 1, sizeof *p);
    int *out = xcalloc((size_t)ws->n + 1, sizeof(int));
    for (int i = 0; i < ws->n; i++) p[i] = &ws->t[i];
    qsort(p, (size_t)ws->n, sizeof *p, cmp);
    for (int i = 0; i < ws->n; i++) out[i] = (int)(p[i] - ws->t);
    free(p);
    return out;
}

void weight_registry_index(WeightSet *ws) {
    free(ws->by_name);
    free(ws->by_host);
    ws->by_name = sorted_index(ws, cmp_name);
    ws->by_host = sorted_index(ws, cmp_host);
}

void weight_registry_free(Model *m) {
    if (m->layers) {
        for (int l = 0; l < m->cfg.n_layers; l++) {
            free(m->layers[l].egate);
            free(m->layers[l].eup);
            free(m->layers[l].edown);
        }
    }
    free(m->layers);
    m->layers = NULL;
    free(m->weights.t);
    free(m->weights.by_name);
    free(m->weights.by_host);
    m->weights = (WeightSet){0};
}

WeightTensor *weight_registry_find(const WeightSet *ws, const char *name) {
    if (!ws->by_name) return NULL;
    int lo = 0, hi = ws->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(ws->t[ws->by_name[mid]].name, name);
        if (c == 0) return &ws->t[ws->by_name[mid]];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

WeightTensor *weight_registry_find_host(const WeightSet *ws, const void *host) {
    if (!ws->by_host || !host) return NULL;
    int lo = 0, hi = ws->n - 1;
    uintptr_t h = (uintptr_t)host;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        uintptr_t x = (uintptr_t)weight_tensor_bf16(&ws->t[ws->by_host[mid]]);
        if (x == h) return &ws->t[ws->by_host[mid]];
        if (x < h) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

uint16_t *weight_tensor_bf16(const WeightTensor *t) {
    if (t->vec) return (uint16_t *)t->vec->host;
    return t->mat ? t->mat->bf16 : NULL;
}
