/*
 * forward.c - the forward pass of the supported architectures over a Batch
 * (tokens of many sequences at arbitrary positions) with a paged KV cache,
 * written once against the Backend op table. Also the Runner (per-step
 * scratch sized at start-up) and the KV cache pool.
 *
 * Layer: x += o(attn(rope(norm?(q(rms(x)))), ...)); x += mlp(rms(x)), where
 * mlp is SwiGLU or, on MoE layers, the top-k mixture of SwiGLU experts.
 * Not here: sampling, scheduling, block allocation (engine).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu_ops.h"
#include "log.h"
#include "lora.h"
#include "model.h"
#include "quant.h"
#include "weight_registry.h"

#define RUNNER_GRAPH_MAX 256
/* Piecewise-graph buckets (piece_bucket): 1..8 tokens exactly, multiples of 8 up to 256, of 16
 * up to RUNNER_PIECE_MAX (vLLM's default capture sizes), so a step pads by at most 15 tokens. */
#define RUNNER_PIECE_MAX 512
#define RUNNER_PIECE_BUCKETS (8 + 31 + 16)

/* A vector weight as the ops read it: the host copy on a host backend, the
 * backend's copy (WeightVec.dev, set at upload) otherwise; NULL when absent. */
#define VEC(r, v) ((r)->b->host ? (v).host : (v).dev)

struct Runner {
    Model *m;
    Backend *b;
    int max_tokens, max_ctx;
    /* backend memory, sized at creation */
    float *x, *xn, *tmp;     /* [T, hidden] */
    float *q, *att;          /* [T, n_heads * head_dim] */
    float *k, *v;            /* [T, n_kv_heads * head_dim] */
    float *g, *u;            /* [max(T * intermediate, TG * moe_intermediate)] (TG = moe_rows * top_k) */
    float *rope_cs, *rope_sn; /* [max_ctx, head_dim / 2] cos / sin of each position, built at creation */
    float *router;           /* [T, n_experts] */
    float *xg;               /* [max(T, TG), hidden] gathered inputs of the pairs (moe_mlp: also their outputs) */
    float *yg;               /* [T, hidden] one expert's outputs (the per-expert loop) */
    float *hout;             /* [T, hidden] final hidden states of output rows */
    float *logits;           /* [T, vocab] (device backends only) */
    int32_t *d_tokens, *d_pos, *d_seq, *d_slots, *d_rows; /* [T] */
    /* MoE routing (Backend.moe_route's outputs; backend.h MoeRouteArgs) */
    int32_t *mr_ids;         /* [T, n_moe, top_k] every MoE layer's chosen experts (MoeRouteArgs.ids_ld =
                              * n_moe * top_k), the capture's layout: a step's routing is one download */
    int32_t *mr_tok, *mr_of; /* [T * top_k] */
    float *mr_w, *mr_pw;     /* [T * top_k] */
    int32_t *mr_off;         /* [n_experts + 1] */
    int32_t *mr_active;      /* [n_experts] */
    const void **moe_tab;    /* [n_layers, 3, 3 * n_experts] the experts' dev / dev_scale / dev_s2 pointers
                              * (moe_mlp; a delta rewrites what they point at, never the pointers) */
    int32_t *d_bt;           /* [T, bt_stride] */
    /* host memory */
    float *inv_freq;         /* [head_dim / 2] */
    int32_t *h_tok;          /* [T * top_k] host copy of mr_tok (the same on host backends) */
    int32_t *h_off;          /* [n_experts + 1] host copy of mr_off */
    int n_moe;               /* MoE layers of the model */
    int moe_rows;            /* steps of up to this many tokens run moe_mlp: max_tokens, or 0 (never) */
    int32_t *h_slots;        /* [T] cache slot of each token (-1: a padded token) */
    int32_t *h_nblk;         /* [T] step_prepare: blocks of each sequence's table its tokens reach */
    int32_t *h_bt;           /* [T, bt_stride] */
    int bt_stride;           /* ceil(max_ctx / block_size) of the cache in use */
    /* decode graphs (backends with graph_begin): [n] for a pure decode step of n <= RUNNER_GRAPH_MAX
     * sequences on cache graph_kv; seen[n]: ran once eagerly (scratch buffers grown), capture next */
    void *graph[RUNNER_GRAPH_MAX + 1];
    unsigned char graph_seen[RUNNER_GRAPH_MAX + 1];
    const KVCache *graph_kv;
    int graphs_off;          /* a capture failed: eager from then on */
    int graphs_eager;        /* runner_set_graphs(r, 0): --enforce-eager */
    uint64_t graph_captures, graph_replays; /* runner_graph_counts */
    /* piecewise graphs (every other eligible step of <= RUNNER_PIECE_MAX tokens, padded to a
     * bucket; forward_pieces): piece[bucket] is NULL or [n_layers + 1] segment graphs, NULL where
     * not captured yet; piece_seen[bucket]: ran once eagerly at the bucket's size */
    void **piece[RUNNER_PIECE_BUCKETS];
    unsigned char piece_seen[RUNNER_PIECE_BUCKETS];
    const KVCache *piece_kv; /* the cache the piecewise graphs write (their segments hold its pointers) */
    uint64_t piece_captures, piece_replays; /* steps: runner_piece_counts */
    int last_graph;          /* runner_last_graph: how the last model_forward ran (0, 1, 2) */
    int sample_rows;         /* rows of the last device sampling launch (Batch.n_pending's bound) */
    float *h_logits_out;     /* host backends: this step's logits [n_out, vocab] (the caller's) */
    int32_t *experts;        /* optional capture [T, n_moe_layers, top_k] (runner_set_expert_capture) */
    /* LoRA (lora.h): the adapter in each slot; this step's per-token slots (NULL when no
     * token of the step has an adapter: the base path, untouched); per-row pairs of one linear */
    const LoraAdapter *lora[RUNNER_MAX_LORAS];
    const int32_t *lora_tokens; /* [T] host: runner_set_lora_tokens, or NULL */
    const int32_t *tok_lora; /* this step: lora_tokens when a token has an adapter, else NULL */
    const LoraPair **lrows;  /* [T] host */
    /* device backends: the adapter pool (runner_reserve_lora), lora_nreg regions of lora_region
     * bytes; slot s's adapter is a copy in region lora_reg[s] (-1: none), whose pairs (device
     * pointers) are lora_dpairs[region * lora_nslots ...] */
    void *lora_pool;
    size_t lora_region;
    int lora_nreg, lora_max_rank;
    int lora_reg[RUNNER_MAX_LORAS];
    LoraPair *lora_dpairs;   /* [lora_nreg * lora_nslots] host */
    size_t lora_nslots;      /* lora_n_slots of the model */
};

static void graphs_reset(Runner *r) {
    for (int i = 0; i <= RUNNER_GRAPH_MAX; i++) {
        if (r->graph[i]) r->b->graph_free(r->b, r->graph[i]);
        r->graph[i] = NULL;
        r->graph_seen[i] = 0;
    }
    r->graph_kv = NULL;
}

/* Piecewise graphs hold the pointers of the cache piece_kv (the K/V write is in their segments;
 * attention runs outside them): dropped when a step uses another cache, or that one is freed. */
static void pieces_reset(Runner *r) {
    for (int i = 0; i < RUNNER_PIECE_BUCKETS; i++) {
        for (int s = 0; r->piece[i] && s <= r->m->cfg.n_layers; s++)
            if (r->piece[i][s]) r->b->graph_free(r->b, r->piece[i][s]);
        free(r->piece[i]);
        r->piece[i] = NULL;
        r->piece_seen[i] = 0;
    }
    r->piece_kv = NULL;
}

static KVCache *kv_alloc(const ModelConfig *c, int n_blocks, int block_size, KvDtype dtype, Backend *b) {
    CHECK(dtype >= KV_F32 && dtype < KV_DTYPE_COUNT, "KV cache dtype %d unknown", (int)dtype);
    KVCache *kv = xcalloc(1, sizeof *kv);
    *kv = (KVCache){.n_layers = c->n_layers, .n_blocks = n_blocks, .block_size = block_size,
                    .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim, .dtype = dtype};
    size_t rows = (size_t)c->n_layers * n_blocks * block_size * c->n_kv_heads;
    size_t n = rows * c->head_dim * kv_dtype_elem(dtype);
    kv->k = b ? b->alloc(b, n) : xcalloc_huge(n);
    kv->v = b ? b->alloc(b, n) : xcalloc_huge(n);
    if (dtype == KV_FP8) {
        kv->k_scale = b ? b->alloc(b, rows * sizeof(float)) : xcalloc(rows, sizeof(float));
        kv->v_scale = b ? b->alloc(b, rows * sizeof(float)) : xcalloc(rows, sizeof(float));
    }
    return kv;
}

KVCache *kvcache_create(const ModelConfig *c, int n_blocks, int block_size) {
    return kv_alloc(c, n_blocks, block_size, KV_F32, NULL);
}

KVCache *kvcache_create_dtype(const ModelConfig *c, int n_blocks, int block_size, KvDtype dtype) {
    return kv_alloc(c, n_blocks, block_size, dtype, NULL);
}

void kvcache_free(KVCache *kv) {
    if (!kv) return;
    free(kv->k);
    free(kv->v);
    free(kv->k_scale);
    free(kv->v_scale);
    free(kv);
}

KVCache *runner_kvcache_create(Runner *r, int n_blocks, int block_size) {
    return kv_alloc(&r->m->cfg, n_blocks, block_size, KV_F32, r->b);
}

KVCache *runner_kvcache_create_dtype(Runner *r, int n_blocks, int block_size, KvDtype dtype) {
    return kv_alloc(&r->m->cfg, n_blocks, block_size, dtype, r->b);
}

int runner_weights_changed(Runner *r, const void *host, size_t bytes, const int64_t *idx, int64_t n_idx, int elem,
                           Err *err) {
    if (!r->b->weights_changed) return 0;
    /* a checkpoint tensor outside the registry has no backend copy: nothing reads it */
    const WeightTensor *t = weight_registry_find_host(&r->m->weights, host);
    /* Every update lands in place, where captured graphs read it: BF16 scatters and re-uploads,
     * FP8 bytes and scales, NVFP4 bytes, scales and tensor scale (WeightMat.dev_s2, which the
     * kernels read at run time; the grouped experts reach theirs through moe_tab's pointers). */
    Err be = {0};
    if (!t || r->b->weights_changed(r->b, t, idx, n_idx, elem, &be) == 0) return 0;
    return ERR(err, 500, "the %s backend could not update its copy of '%s' (%zu bytes): %s:%d: %s", r->b->name,
               t->name, bytes, be.file ? be.file : "?", be.line, be.msg);
}

/* A block of one layer is contiguous in each of K, V and (FP8) their scales. */
void runner_kv_copy_block(Runner *r, KVCache *kv, int src, int dst) {
    size_t rows = (size_t)kv->n_kv_heads * kv->block_size; /* rows of one block */
    size_t blk = rows * kv->head_dim * kv_dtype_elem(kv->dtype), layer = blk * (size_t)kv->n_blocks;
    for (int l = 0; l < kv->n_layers; l++) {
        char *k = (char *)kv->k + l * layer, *v = (char *)kv->v + l * layer;
        r->b->copy(r->b, k + (size_t)dst * blk, k + (size_t)src * blk, blk);
        r->b->copy(r->b, v + (size_t)dst * blk, v + (size_t)src * blk, blk);
        if (kv->dtype != KV_FP8) continue;
        size_t so = (size_t)l * kv->n_blocks * rows;
        r->b->copy(r->b, kv->k_scale + so + (size_t)dst * rows, kv->k_scale + so + (size_t)src * rows,
                   rows * sizeof(float));
        r->b->copy(r->b, kv->v_scale + so + (size_t)dst * rows, kv->v_scale + so + (size_t)src * rows,
                   rows * sizeof(float));
    }
}

void runner_kvcache_free(Runner *r, KVCache *kv) {
    if (kv && kv == r->graph_kv) graphs_reset(r); /* a later cache may reuse the address */
    if (kv && kv == r->piece_kv) pieces_reset(r);
    if (!kv) return;
    r->b->release(r->b, kv->k);
    r->b->release(r->b, kv->v);
    if (kv->k_scale) r->b->release(r->b, kv->k_scale);
    if (kv->v_scale) r->b->release(r->b, kv->v_scale);
    free(kv);
}

#define BALLOC(n, type) ((type *)b->alloc(b, (size_t)(n) * sizeof(type)))

static MoeExperts moe_experts(const Runner *r, int l) {
    const LayerWeights *w = &r->m->layers[l];
    int E = r->m->cfg.n_experts;
    const void **tab = r->moe_tab ? r->moe_tab + (size_t)l * 9 * E : NULL;
    int fp4 = w->egate && w->egate[0].fmt == WF_NVFP4;
    return (MoeExperts){w->egate, w->eup, w->edown, tab, tab ? tab + 3 * E : NULL, tab && fp4 ? tab + 6 * E : NULL};
}

/* Start-up, MoE models: the routing limits, the MoE layer count, and whether
 * the backend's moe_mlp takes every MoE layer's experts (then their pointer
 * tables go to backend memory and every step without LoRA uses it: moe_rows =
 * max_tokens). Its scratch, pair order, sized here for max_tokens T: xg [T *
 * top_k, hidden] (the pairs' inputs, then their outputs) and g, u [T * top_k,
 * moe_intermediate] f32, i.e. 4 T top_k (hidden + 2 moe_intermediate) bytes:
 * for Qwen3-30B-A3B at T = 2048 (hidden 2048, 768, top 8): 224 MiB. */
static void moe_setup(Runner *r) {
    const ModelConfig *c = &r->m->cfg;
    Backend *b = r->b;
    CHECK(c->n_experts <= MOE_MAX_EXPERTS && c->top_k >= 1 && c->top_k <= MOE_MAX_TOPK && c->top_k <= c->n_experts,
          "MoE model with %d experts, top %d: at most %d experts and top %d are supported", c->n_experts, c->top_k,
          MOE_MAX_EXPERTS, MOE_MAX_TOPK);
    int ok = !b->host && b->moe_mlp;
    for (int l = 0; l < c->n_layers; l++) {
        if (!model_layer_is_moe(c, l)) continue;
        r->n_moe++;
        MoeRouteArgs ra = {.n = 1, .n_experts = c->n_experts, .top_k = c->top_k};
        MoeMlpArgs q = {.route = &ra, .ex = moe_experts(r, l), .hidden = c->hidden, .inter = c->moe_intermediate};
        ok = ok && b->moe_mlp(b, &q) == 0;
    }
    if (!ok) return;
    int E = c->n_experts;
    size_t nt = (size_t)c->n_layers * 9 * E;
    const void **h = xcalloc(nt, sizeof *h);
    for (int l = 0; l < c->n_layers; l++)
        if (model_layer_is_moe(c, l)) model_moe_pointers(r->m, l, h + (size_t)l * 9 * E);
    r->moe_tab = b->alloc(b, nt * sizeof *h);
    b->upload(b, (void *)r->moe_tab, h, nt * sizeof *h);
    free(h);
    r->moe_rows = r->max_tokens;
    log_info("moe: the %s backend runs the routed experts of %d layers grouped (steps of up to %d tokens)", b->name,
             r->n_moe, r->moe_rows);
}

/* The RoPE tables [max_ctx, head_dim / 2]: row p holds cosf / sinf of p * inv_freq[i], the f32
 * product, once for the runner's life (norm_rope reads the row of each token's position). */
static void rope_tables(Runner *r) {
    Backend *b = r->b;
    size_t h2 = (size_t)r->m->cfg.head_dim / 2, n = (size_t)r->max_ctx * h2;
    float *cs = xmalloc(sizeof(float) * (n ? n : 1)), *sn = xmalloc(sizeof(float) * (n ? n : 1));
    for (int p = 0; p < r->max_ctx; p++)
        for (size_t i = 0; i < h2; i++) {
            float a = (float)p * r->inv_freq[i];
            cs[(size_t)p * h2 + i] = cosf(a);
            sn[(size_t)p * h2 + i] = sinf(a);
        }
    r->rope_cs = BALLOC(n, float);
    r->rope_sn = BALLOC(n, float);
    b->upload(b, r->rope_cs, cs, sizeof(float) * n);
    b->upload(b, r->rope_sn, sn, sizeof(float) * n);
    free(cs);
    free(sn);
}

Runner *runner_create(Model *m, int max_tokens, int max_ctx, int n_threads) {
    return runner_create_with(m, backend_cpu_create(n_threads, max_ctx), max_tokens, max_ctx);
}

Runner *runner_create_with(Model *m, Backend *b, int max_tokens, int max_ctx) {
    const ModelConfig *c = &m->cfg;
    for (int i = 0; !b->host && i < m->weights.n; i++) {
        const WeightTensor *t = &m->weights.t[i];
        CHECK((!t->vec || t->vec->dev) && (!t->mat || t->mat->dev), "the %s backend has no copy of '%s' (a bug in "
              "its upload)", b->name, t->name);
    }
    Runner *r = xcalloc(1, sizeof *r);
    r->b = b;
    r->m = m;
    r->max_tokens = max_tokens;
    r->max_ctx = max_ctx;
    size_t T = (size_t)max_tokens, H = (size_t)c->hidden, h2 = (size_t)c->head_dim / 2;
    size_t inter = (size_t)(c->intermediate > c->moe_intermediate ? c->intermediate : c->moe_intermediate);
    r->x = BALLOC(T * H, float);
    r->xn = BALLOC(T * H, float);
    r->tmp = BALLOC(T * H, float);
    r->hout = BALLOC(T * H, float);
    r->q = BALLOC(T * c->n_heads * c->head_dim, float);
    r->att = BALLOC(T * c->n_heads * c->head_dim, float);
    r->k = BALLOC(T * c->n_kv_heads * c->head_dim, float);
    r->v = BALLOC(T * c->n_kv_heads * c->head_dim, float);
    if (c->n_experts) moe_setup(r);
    size_t TG = (size_t)r->moe_rows * (c->top_k > 0 ? c->top_k : 1), gu = T * inter;
    if (TG * c->moe_intermediate > gu) gu = TG * c->moe_intermediate;
    r->g = BALLOC(gu, float);
    r->u = BALLOC(gu, float);
    r->h_slots = xcalloc(T, sizeof(int32_t));
    r->h_nblk = xcalloc(T, sizeof(int32_t));
    r->inv_freq = xcalloc(h2, sizeof(float));
    r->lrows = xcalloc(T, sizeof *r->lrows);
    for (int i = 0; i < RUNNER_MAX_LORAS; i++) r->lora_reg[i] = -1;
    int max_cols = c->hidden > c->n_heads * c->head_dim ? c->hidden : c->n_heads * c->head_dim;
    if ((int)inter > max_cols) max_cols = (int)inter;
    b->reserve(b, max_tokens, max_cols);
    cpu_rope_inv_freq(r->inv_freq, c->head_dim, c->rope_theta, c->rope_llama3, c->rope_factor,
                      c->rope_low_freq_factor, c->rope_high_freq_factor, c->rope_orig_max_pos);
    rope_tables(r);
    if (!b->host) {
        r->logits = BALLOC(T * c->vocab, float);
        r->d_tokens = BALLOC(T, int32_t);
        r->d_pos = BALLOC(T, int32_t);
        r->d_seq = BALLOC(T, int32_t);
        r->d_slots = BALLOC(T, int32_t);
        r->d_rows = BALLOC(T, int32_t);
    }
    if (c->n_experts) {
        size_t NK = T * c->top_k, rows = T > TG ? T : TG; /* TG: 0 without moe_mlp */
        r->router = BALLOC(T * c->n_experts, float);
        r->mr_ids = BALLOC(NK * (r->n_moe ? r->n_moe : 1), int32_t);
        r->mr_tok = BALLOC(NK, int32_t);
        r->mr_of = BALLOC(NK, int32_t);
        r->mr_w = BALLOC(NK, float);
        r->mr_pw = BALLOC(NK, float);
        r->mr_off = BALLOC(c->n_experts + 1, int32_t);
        r->mr_active = BALLOC(c->n_experts, int32_t);
        r->h_tok = b->host ? r->mr_tok : xcalloc(NK, sizeof(int32_t));
        r->h_off = b->host ? r->mr_off : xcalloc(c->n_experts + 1, sizeof(int32_t));
        r->xg = BALLOC(rows * H, float);
        r->yg = BALLOC(T * H, float);
    }
    return r;
}

void runner_free(Runner *r) {
    if (!r) return;
    Backend *b = r->b;
    graphs_reset(r);
    pieces_reset(r);
    void *dev[] = {r->x, r->xn, r->tmp, r->hout, r->q, r->att, r->k, r->v, r->g, r->u, r->rope_cs, r->rope_sn,
                   r->router, r->xg, r->yg, r->logits, r->d_tokens, r->d_pos, r->d_seq, r->d_slots,
                   r->d_rows, r->d_bt, r->mr_ids, r->mr_tok, r->mr_of, r->mr_w, r->mr_pw, r->mr_off,
                   r->mr_active, (void *)r->moe_tab};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) b->release(b, dev[i]);
    if (!b->host) {
        free(r->h_tok);
        free(r->h_off);
    }
    void *host[] = {r->h_nblk, r->inv_freq, r->h_slots, r->h_bt, (void *)r->lrows};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
    if (r->lora_pool) b->release(b, r->lora_pool);
    free(r->lora_dpairs);
    b->free(b);
    free(r);
}

void runner_set_expert_capture(Runner *r, int32_t *experts) { r->experts = experts; }

void runner_set_lora_tokens(Runner *r, const int32_t *lora) { r->lora_tokens = lora; }

void runner_reserve_lora(Runner *r, int max_loras, int max_rank, LoraDtype dtype) {
    Backend *b = r->b;
    if (b->host || !b->lora || max_loras <= 0 || r->lora_pool) return;
    if (max_rank > LORA_MAX_RANK) max_rank = LORA_MAX_RANK;
    CHECK(max_loras <= RUNNER_MAX_LORAS && max_rank >= 1, "LoRA pool: %d slots of rank %d (at most %d slots)",
          max_loras, max_rank, RUNNER_MAX_LORAS);
    b->lora_reserve(b, r->max_tokens, max_rank);
    /* one region per slot and one spare: an in-place replacement uploads beside the adapter it replaces */
    r->lora_region = (lora_bytes_as(&r->m->cfg, max_rank, dtype) + 255) / 256 * 256;
    r->lora_nreg = max_loras + 1;
    r->lora_max_rank = max_rank;
    /* logged before the allocation: if it does not fit, the fatal error follows this line */
    log_info("lora: %s adapter pool of %d regions x %.1f MiB (--max-loras %d + 1 for in-place replacement, "
             "rank <= %d%s) + %.1f MiB scratch; too large: lower --max-loras / --max-lora-rank or use --lora-dtype "
             "bfloat16", b->name, max_loras + 1, r->lora_region / 1048576.0, max_loras, max_rank,
             r->m->cfg.n_experts ? ", every routed expert's linears included" : "",
             4.0 * r->max_tokens * (max_rank + 1) / 1048576.0);
    r->lora_pool = b->alloc(b, r->lora_region * (size_t)r->lora_nreg);
    r->lora_nslots = lora_n_slots(r->m->cfg.n_layers, r->m->cfg.n_experts);
    r->lora_dpairs = xcalloc((size_t)r->lora_nreg * r->lora_nslots, sizeof *r->lora_dpairs);
}

/* Device backends: copy adapter a into a free region of the pool and rebase its
 * pairs there. 0 and *reg, or <0 with err (the pool, the slots and every other
 * region unchanged). */
static int lora_upload(Runner *r, const LoraAdapter *a, int *reg, Err *err) {
    ENSURE(err, r->lora_pool, 400, "the %s backend needs its LoRA memory reserved at start-up (start the server "
           "with --enable-lora and --max-loras >= 1)", r->b->name);
    ENSURE(err, a->bytes <= r->lora_region && a->rank <= r->lora_max_rank, 400, "the adapter (%zu bytes, rank %d) "
           "exceeds a pool region (%zu bytes, rank %d)", a->bytes, a->rank, r->lora_region, r->lora_max_rank);
    int g = -1;
    for (int i = 0; i < r->lora_nreg && g < 0; i++) {
        int used = 0;
        for (int s = 0; s < RUNNER_MAX_LORAS; s++) used |= r->lora_reg[s] == i;
        if (!used) g = i;
    }
    ENSURE(err, g >= 0, 503, "the LoRA pool's %d regions are all in use (more slots than --max-loras)", r->lora_nreg);
    char *dev = (char *)r->lora_pool + (size_t)g * r->lora_region;
    if (r->b->upload_try(r->b, dev, a->arena, a->bytes, err)) return -1;
    size_t np = r->lora_nslots;
    ASSERT(np == lora_n_slots(a->n_layers, a->n_experts), "lora_upload: the adapter's slots are another model's");
    LoraPair *dp = r->lora_dpairs + (size_t)g * np;
    for (size_t i = 0; i < np; i++) {
        dp[i] = a->pairs[i];
        if (!a->pairs[i].a) continue;
        dp[i].a = dev + ((const char *)a->pairs[i].a - (const char *)a->arena);
        dp[i].b = dev + ((const char *)a->pairs[i].b - (const char *)a->arena);
    }
    *reg = g;
    return 0;
}

int runner_set_lora(Runner *r, int slot, const LoraAdapter *a, Err *err) {
    ENSURE(err, slot >= 0 && slot < RUNNER_MAX_LORAS, 400, "LoRA slot %d outside [0, %d)", slot, RUNNER_MAX_LORAS);
    ENSURE(err, !a || r->b->lora, 400, "the %s backend does not serve LoRA adapters (use the CPU backend)",
           r->b->name);
    ENSURE(err, !a || (a->n_layers == r->m->cfg.n_layers && a->n_experts == r->m->cfg.n_experts), 400,
           "the adapter has %d layers and %d experts, the model %d and %d", a ? a->n_layers : 0,
           a ? a->n_experts : 0, r->m->cfg.n_layers, r->m->cfg.n_experts);
    int reg = -1;
    if (a && !r->b->host && lora_upload(r, a, &reg, err)) return -1; /* the slot keeps its adapter */
    r->lora[slot] = a;
    r->lora_reg[slot] = reg; /* the old region (in-place replacement) is free again */
    return 0;
}

/* Which linears an MLP's LoRA pairs are: layer l's own (e < 0) or its
 * routed expert e's, whose rows are the gathered tokens map[0..n) (host). */
typedef struct LoraAt {
    int l, e;
    const int32_t *map; /* [n] row -> the step's token; NULL: the identity */
} LoraAt;

/* out[i] += the LoRA of linear t at `at` for row i's token's adapter. No-op on
 * steps without adapters (the base path keeps its exact bits). */
static void lora_apply(Runner *r, float *out, const float *x, int n, LoraAt at, LoraTarget t) {
    if (!r->tok_lora) return;
    const ModelConfig *c = &r->m->cfg;
    size_t slot = lora_slot(c->n_layers, c->n_experts, at.l, at.e, t);
    int any = 0;
    for (int i = 0; i < n; i++) {
        int s = r->tok_lora[at.map ? at.map[i] : i];
        const LoraPair *p = s >= 0 ? lora_slot_pair(r->lora[s], slot) : NULL;
        if (p && r->lora_reg[s] >= 0) /* a device backend: the same pair in the adapter's pool region */
            p = &r->lora_dpairs[(size_t)r->lora_reg[s] * r->lora_nslots + slot];
        r->lrows[i] = p;
        any |= r->lrows[i] != NULL;
    }
    if (any) r->b->lora(r->b, out, x, n, r->lrows);
}

/* Host array -> what the backend's ops read: itself on a host backend, else
 * a copy in the given backend buffer. */
static const void *to_backend(Runner *r, void *dbuf, const void *h, size_t bytes) {
    if (r->b->host) return h;
    r->b->upload(r->b, dbuf, h, bytes);
    return dbuf;
}

/* Reject anything that would index outside the runner, the cache or the vocab. */
static int batch_check(const Runner *r, const KVCache *kv, const Batch *b, Err *err) {
    const ModelConfig *c = &r->m->cfg;
    ENSURE(err, b->n_tokens > 0 && b->n_tokens <= r->max_tokens, 400, "batch of %d tokens (max %d)",
           b->n_tokens, r->max_tokens);
    ENSURE(err, b->n_seqs > 0 && b->n_seqs <= r->max_tokens, 400, "batch of %d sequences (max %d)",
           b->n_seqs, r->max_tokens);
    ENSURE(err, b->n_out >= 0 && b->n_out <= b->n_tokens, 400, "n_out %d out of range", b->n_out);
    ENSURE(err, kv->n_layers == c->n_layers && kv->n_kv_heads == c->n_kv_heads && kv->head_dim == c->head_dim,
           400, "KV cache shape does not match the model");
    ENSURE(err, b->n_pending >= 0 && b->n_pending <= r->sample_rows, 400,
           "the batch names %d rows of the last device sampling, which had %d", b->n_pending, r->sample_rows);
    for (int i = 0; i < b->n_tokens; i++) {
        ENSURE(err, (b->tokens[i] >= 0 && b->tokens[i] < c->vocab) || (b->tokens[i] < 0 && -1 - b->tokens[i] < b->n_pending),
               400, "token id %d outside the vocabulary (%d) and the %d pending rows", b->tokens[i], c->vocab,
               b->n_pending);
        ENSURE(err, b->pos[i] >= 0 && b->pos[i] < r->max_ctx, 400, "position %d outside [0, %d)", b->pos[i],
               r->max_ctx);
        ENSURE(err, b->seq[i] >= 0 && b->seq[i] < b->n_seqs, 400, "sequence index %d out of range", b->seq[i]);
        const int32_t *bt = b->block_table[b->seq[i]];
        for (int j = 0; j <= b->pos[i] / kv->block_size; j++)
            ENSURE(err, bt[j] >= 0 && bt[j] < kv->n_blocks, 400, "block table entry %d of sequence %d is %d "
                   "(pool has %d blocks)", j, b->seq[i], bt[j], kv->n_blocks);
    }
    const int32_t *lt = r->lora_tokens;
    for (int i = 0; lt && i < b->n_tokens; i++)
        ENSURE(err, lt[i] >= -1 && lt[i] < RUNNER_MAX_LORAS && (lt[i] < 0 || r->lora[lt[i]]), 400,
               "token %d names LoRA slot %d, which holds no adapter", i, lt[i]);
    for (int i = 0; i < b->n_out; i++)
        ENSURE(err, b->out_rows[i] >= 0 && b->out_rows[i] < b->n_tokens, 400, "out row %d out of range",
               b->out_rows[i]);
    return 0;
}

/* Per-step inputs in backend memory: tokens, positions (the RoPE tables' rows),
 * cache slots and the flattened block tables. */
typedef struct Step {
    const int32_t *tokens, *pos, *seq, *slots, *bt, *rows;
    int n_seqs;
} Step;

/* N >= n_tokens: tokens [n_tokens, N) are token 0 at position 0 with slot -1 (a piecewise
 * step's padding: rotated by the table's row 0, never written to the cache). */
static void step_prepare(Runner *r, const KVCache *kv, const Batch *b, Step *st, int N) {
    Backend *be = r->b;
    int n = b->n_tokens, bs = kv->block_size;
    int stride = (r->max_ctx + bs - 1) / bs;
    if (stride != r->bt_stride) { /* first step, or a cache with another block size */
        free(r->h_bt);
        if (r->d_bt) be->release(be, r->d_bt);
        r->h_bt = xcalloc((size_t)r->max_tokens * stride, sizeof(int32_t));
        r->d_bt = be->host ? NULL : be->alloc(be, (size_t)r->max_tokens * stride * sizeof(int32_t));
        r->bt_stride = stride;
    }
    /* each sequence's table once, up to the last block its tokens reach (a prefill chunk's tokens
     * share one table: copying it per token was O(tokens x blocks)) */
    for (int s = 0; s < b->n_seqs; s++) r->h_nblk[s] = 0;
    for (int t = 0; t < n; t++) {
        const int32_t *bt = b->block_table[b->seq[t]];
        int p = b->pos[t];
        r->h_slots[t] = bt[p / bs] * bs + p % bs;
        if (p / bs + 1 > r->h_nblk[b->seq[t]]) r->h_nblk[b->seq[t]] = p / bs + 1;
    }
    for (int s = 0; s < b->n_seqs; s++)
        if (r->h_nblk[s])
            memcpy(r->h_bt + (size_t)s * stride, b->block_table[s], sizeof(int32_t) * (size_t)r->h_nblk[s]);
    ASSERT(N >= n && (N == n || (!be->host && N <= r->max_tokens)), "step_prepare: padding %d tokens to %d", n, N);
    for (int t = n; t < N; t++) r->h_slots[t] = -1;
    size_t ni = sizeof(int32_t) * (size_t)n;
    st->tokens = to_backend(r, r->d_tokens, b->tokens, ni);
    st->pos = to_backend(r, r->d_pos, b->pos, ni);
    st->seq = to_backend(r, r->d_seq, b->seq, ni);
    st->slots = to_backend(r, r->d_slots, r->h_slots, sizeof(int32_t) * (size_t)N);
    st->bt = to_backend(r, r->d_bt, r->h_bt, sizeof(int32_t) * (size_t)b->n_seqs * stride);
    st->rows = to_backend(r, r->d_rows, b->out_rows, sizeof(int32_t) * (size_t)b->n_out);
    st->n_seqs = b->n_seqs;
    if (N > n) {
        be->zero(be, r->d_tokens + n, sizeof(int32_t) * (size_t)(N - n));
        be->zero(be, r->d_pos + n, sizeof(int32_t) * (size_t)(N - n));
    }
}

/* Attention of layer l on the normed input xn, in three parts: the
 * projections, RoPE and the K/V cache write (attn_pre), attention proper
 * (attn_core, the only op whose launch shape depends on the positions and the
 * block tables), and the output projection o with the residual add and the next norm
 * (segment_ops: proj_add_norm). */
static KvWriteArgs kv_args(Runner *r, KVCache *kv, int l, const Step *st, int n) {
    size_t rows_off = (size_t)l * kv->n_blocks * kv->block_size * kv->n_kv_heads; /* layer l's first row */
    size_t byte_off = rows_off * kv->head_dim * kv_dtype_elem(kv->dtype);
    return (KvWriteArgs){.k_cache = (char *)kv->k + byte_off, .v_cache = (char *)kv->v + byte_off,
                         .k_scale = kv->k_scale ? kv->k_scale + rows_off : NULL,
                         .v_scale = kv->v_scale ? kv->v_scale + rows_off : NULL, .k = r->k, .v = r->v,
                         .slots = st->slots, .n = n, .n_kv_heads = kv->n_kv_heads, .head_dim = kv->head_dim,
                         .block_size = kv->block_size, .dtype = kv->dtype};
}

static void attn_pre(Runner *r, KVCache *kv, int l, const Step *st, int n) {
    const ModelConfig *c = &r->m->cfg;
    const LayerWeights *w = &r->m->layers[l];
    Backend *be = r->b;
    if (be->matmul_multi) {
        float *outs[3] = {r->q, r->k, r->v};
        const WeightMat *ws[3] = {&w->q, &w->k, &w->v};
        const uint16_t *bs[3] = {VEC(r, w->q_bias), VEC(r, w->k_bias), VEC(r, w->v_bias)};
        be->matmul_multi(be, outs, r->xn, n, ws, bs, 3);
    } else {
        be->matmul(be, r->q, r->xn, n, &w->q, VEC(r, w->q_bias));
        be->matmul(be, r->k, r->xn, n, &w->k, VEC(r, w->k_bias));
        be->matmul(be, r->v, r->xn, n, &w->v, VEC(r, w->v_bias));
    }
    LoraAt at = {l, -1, NULL};
    lora_apply(r, r->q, r->xn, n, at, LT_Q);
    lora_apply(r, r->k, r->xn, n, at, LT_K);
    lora_apply(r, r->v, r->xn, n, at, LT_V);
    RopeKvArgs ra = {.kv = kv_args(r, kv, l, st, n), .q = r->q, .n_heads = c->n_heads, .q_norm = VEC(r, w->q_norm),
                     .k_norm = VEC(r, w->k_norm), .eps = c->rms_eps, .cs = r->rope_cs, .sn = r->rope_sn,
                     .pos = st->pos};
    if (be->rope_kv_write) {
        be->rope_kv_write(be, &ra);
        return;
    }
    be->norm_rope(be, r->q, n, c->n_heads, c->head_dim, ra.q_norm, c->rms_eps, ra.cs, ra.sn, st->pos);
    be->norm_rope(be, r->k, n, c->n_kv_heads, c->head_dim, ra.k_norm, c->rms_eps, ra.cs, ra.sn, st->pos);
    be->kv_write(be, &ra.kv);
}

static void attn_core(Runner *r, KVCache *kv, int l, const Step *st, int n) {
    const ModelConfig *c = &r->m->cfg;
    KvWriteArgs w_kv = kv_args(r, kv, l, st, n);
    AttnArgs a = {.out = r->att, .q = r->q, .k_cache = w_kv.k_cache, .v_cache = w_kv.v_cache, .pos = st->pos,
                  .seq = st->seq, .block_table = st->bt, .bt_stride = r->bt_stride, .n_tokens = n,
                  .n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
                  .block_size = kv->block_size, .scale = 1.0f / sqrtf((float)c->head_dim),
                  .kv_dtype = kv->dtype, .k_scale = w_kv.k_scale, .v_scale = w_kv.v_scale, .n_seqs = st->n_seqs};
    r->b->attention(r->b, &a);
}

/* A block's output projection w of in into tmp, with its LoRA update. */
static void proj(Runner *r, const WeightMat *w, const float *in, const uint16_t *bias, int n, LoraAt at, LoraTarget t) {
    r->b->matmul(r->b, r->tmp, in, n, w, bias);
    lora_apply(r, r->tmp, in, n, at, t);
}

/* The residual add of a block's output (tmp) and the norm of the next block's input. */
static void add_norm(Runner *r, const uint16_t *norm_w, int n) {
    const ModelConfig *c = &r->m->cfg;
    Backend *be = r->b;
    if (be->add_rmsnorm) {
        be->add_rmsnorm(be, r->xn, r->x, r->tmp, norm_w, n, c->hidden, c->rms_eps);
        return;
    }
    be->add(be, r->x, r->tmp, n * c->hidden);
    be->rmsnorm(be, r->xn, r->x, norm_w, n, c->hidden, c->rms_eps);
}

/* proj then add_norm: one op where the backend fuses them (the same bits), not on a LoRA step
 * (its update joins the projection's output before the add). */
static void proj_add_norm(Runner *r, const WeightMat *w, const float *in, const uint16_t *bias,
                          const uint16_t *norm_w, int n, LoraAt at, LoraTarget t) {
    Backend *be = r->b;
    if (be->matmul_add_rmsnorm && !r->tok_lora &&
        be->matmul_add_rmsnorm(be, r->xn, r->x, in, n, w, bias, norm_w, r->m->cfg.rms_eps) == 0)
        return;
    proj(r, w, in, bias, n, at, t);
    add_norm(r, norm_w, n);
}

/* An MLP's first half: g = silu(in @ gate^T) * (in @ up^T), LoRA updates included. at: whose LoRA
 * pairs apply (a layer's MLP or one of its routed experts). */
static void mlp_act(Runner *r, const WeightMat *gate, const WeightMat *up, const float *in, int n, LoraAt at) {
    Backend *be = r->b;
    if (be->matmul_swiglu && !r->tok_lora) { /* LoRA updates g and u between the matmuls and the swiglu */
        be->matmul_swiglu(be, r->g, in, n, gate, up, r->g, r->u);
        return;
    }
    if (be->matmul_multi) {
        float *outs[2] = {r->g, r->u};
        const WeightMat *ws[2] = {gate, up};
        const uint16_t *bs[2] = {NULL, NULL};
        be->matmul_multi(be, outs, in, n, ws, bs, 2);
    } else {
        be->matmul(be, r->g, in, n, gate, NULL);
        be->matmul(be, r->u, in, n, up, NULL);
    }
    lora_apply(r, r->g, in, n, at, LT_GATE);
    lora_apply(r, r->u, in, n, at, LT_UP);
    be->swiglu(be, r->g, r->g, r->u, n * gate->rows);
}

/* The whole MLP into out (a routed expert's, on the path that runs them one by one). */
static void dense_mlp(Runner *r, const WeightMat *gate, const WeightMat *up, const WeightMat *down,
                      const float *in, float *out, int n, LoraAt at) {
    mlp_act(r, gate, up, in, n, at);
    r->b->matmul(r->b, out, r->g, n, down, NULL);
    lora_apply(r, out, r->g, n, at, LT_DOWN);
}

/* Backend array -> host memory: itself on a host backend, else a download
 * into h (synchronous). */
static const void *from_backend(Runner *r, void *h, const void *dbuf, size_t bytes) {
    if (r->b->host) return dbuf;
    r->b->download(r->b, h, dbuf, bytes);
    return h;
}

/* HF Qwen3MoE: the backend's moe_route (softmax over all experts in f32, top-k,
 * optional renormalisation, the pairs sorted by expert; backend.h), then the
 * experts. Experts run in index order over the tokens routed to them, so a
 * token's sum over its experts has the same order whatever else is in the
 * batch. A device backend's moe_mlp runs every expert of the layer with no
 * host read (graph-capturable), at any step size; otherwise (the CPU
 * reference, LoRA steps, experts it does not take) the per-expert offsets
 * come to the host and each expert runs through the plain ops. next_norm
 * (not on the last layer): the backend's op may take the residual add and that
 * norm too (MoeMlpArgs.resid); 1 when it did, 0 when the caller runs add_norm. */
static int moe_mlp(Runner *r, int l, int n, const uint16_t *next_norm) {
    const ModelConfig *c = &r->m->cfg;
    const LayerWeights *w = &r->m->layers[l];
    Backend *be = r->b;
    int H = c->hidden, K = c->top_k, E = c->n_experts, NK = n * K;
    MoeRouteArgs ra = {.logits = r->router, .ids = r->mr_ids + (size_t)model_moe_index(c, l) * K,
                       .weights = r->mr_w, .offsets = r->mr_off, .pair_tok = r->mr_tok, .pair_w = r->mr_pw,
                       .pair_of = r->mr_of, .active = r->mr_active, .n = n, .n_experts = E, .top_k = K,
                       .norm = c->norm_topk_prob, .ids_ld = r->n_moe * K};
    if (!be->moe_router_route || be->moe_router_route(be, &ra, r->xn, &w->router)) { /* fused: the same bits */
        be->matmul(be, r->router, r->xn, n, &w->router, NULL);
        be->moe_route(be, &ra);
    }
    if (n <= r->moe_rows && !r->tok_lora) {
        MoeMlpArgs ma = {.out = r->tmp, .x = r->xn, .route = &ra, .ex = moe_experts(r, l), .xg = r->xg,
                         .yg = r->xg, .g = r->g, .u = r->u, .hidden = H, .inter = c->moe_intermediate,
                         .resid = next_norm ? r->x : NULL, .norm_out = r->xn, .norm_w = next_norm,
                         .eps = c->rms_eps};
        if (be->moe_mlp(be, &ma) == 0) return next_norm != NULL;
    }
    const int32_t *off = from_backend(r, r->h_off, r->mr_off, sizeof(int32_t) * (size_t)(E + 1));
    const int32_t *map = r->tok_lora ? from_backend(r, r->h_tok, r->mr_tok, sizeof(int32_t) * (size_t)NK) : NULL;
    ASSERT(off[E] == NK, "moe: %d routed pairs, want %d", off[E], NK);
    be->zero(be, r->tmp, sizeof(float) * (size_t)n * H);
    for (int e = 0; e < E; e++) {
        int cnt = off[e + 1] - off[e];
        if (!cnt) continue;
        const int32_t *rows = r->mr_tok + off[e];
        const float *wts = r->mr_pw + off[e];
        be->gather_rows(be, r->xg, r->xn, rows, cnt, H);
        LoraAt at = {l, e, map ? map + off[e] : NULL}; /* expert e's pairs, rows = its gathered tokens */
        dense_mlp(r, &w->egate[e], &w->eup[e], &w->edown[e], r->xg, r->yg, cnt, at);
        be->scale_add_rows(be, r->tmp, r->yg, rows, wts, cnt, H);
    }
    return 0;
}

/* The ops of a step between two attentions: segment 0 is the embedding, the
 * first norm and layer 0's attn_pre; segment s (1 <= s <= n_layers) is layer
 * s-1's output projection and MLP and, below the last layer, layer s's attn_pre (its
 * K/V write into kv included). They read only runner buffers, the weights, the
 * RoPE tables and st's token / position / slot copies, and write kv at those
 * slots: a graph of one replays any step of the same token count on kv. */
static void segment_ops(Runner *r, KVCache *kv, const Step *st, int s, int n) {
    const Model *m = r->m;
    const ModelConfig *c = &m->cfg;
    Backend *be = r->b;
    int H = c->hidden;
    if (s == 0) {
        be->embed(be, r->x, VEC(r, m->embed), st->tokens, n, H);
        be->rmsnorm(be, r->xn, r->x, VEC(r, m->layers[0].attn_norm), n, H, c->rms_eps);
        attn_pre(r, kv, 0, st, n);
        return;
    }
    int l = s - 1, last = l + 1 == c->n_layers;
    const LayerWeights *w = &m->layers[l];
    LoraAt at = {l, -1, NULL};
    const uint16_t *next_norm = last ? NULL : VEC(r, m->layers[l + 1].attn_norm);
    proj_add_norm(r, &w->o, r->att, VEC(r, w->o_bias), VEC(r, w->mlp_norm), n, at, LT_O);
    if (model_layer_is_moe(c, l)) {
        if (!moe_mlp(r, l, n, next_norm) && !last) add_norm(r, next_norm, n);
    } else {
        mlp_act(r, &w->gate, &w->up, r->xn, n, at);
        if (!last) proj_add_norm(r, &w->down, r->g, NULL, next_norm, n, at, LT_DOWN);
        else proj(r, &w->down, r->g, NULL, n, at, LT_DOWN);
    }
    if (!last) attn_pre(r, kv, l + 1, st, n);
    else be->add(be, r->x, r->tmp, n * H);
}

/* The output rows: gather, final norm, lm_head. */
static void tail_ops(Runner *r, const Step *st, int n_out) {
    const Model *m = r->m;
    Backend *be = r->b;
    int H = m->cfg.hidden;
    be->gather_rows(be, r->hout, r->x, st->rows, n_out, H);
    be->rmsnorm(be, r->hout, r->hout, VEC(r, m->final_norm), n_out, H, m->cfg.rms_eps);
    be->matmul(be, be->host ? r->h_logits_out : r->logits, r->hout, n_out, &m->lm_head, NULL);
}

/* Everything after the uploads: the ops read only runner buffers, the cache and
 * st's device copies, so a graph of them replays any step of the same shape. */
static void forward_ops(Runner *r, KVCache *kv, const Step *st, int n, int n_out) {
    int L = r->m->cfg.n_layers;
    for (int s = 0; s <= L; s++) {
        segment_ops(r, kv, st, s, n);
        if (s < L) attn_core(r, kv, s, st, n);
    }
    tail_ops(r, st, n_out);
}

/* Whether steps may run as graphs here: a backend with graphs, no failed
 * capture, not --enforce-eager, MoE experts grouped on the device. A routed-
 * expert capture changes no op of the step (moe_route writes every layer's
 * ids into mr_ids either way; model_forward downloads them after the ops), so
 * capturing steps replay the same graphs. */
static int graphs_apply(const Runner *r) {
    return r->b->graph_begin && !r->graphs_off && !r->graphs_eager && (!r->m->cfg.n_experts || r->moe_rows);
}

/* A pure decode step (one token per sequence, each an output row) on a
 * graph-capable backend runs as a graph: the first step of a shape runs
 * eagerly (scratch grows to its size), the second is captured, later ones
 * replay it, saving a launch per op (~600 per step for 36 layers). MoE models
 * only when moe_mlp takes their experts (no host read of the routing). */
static int graph_eligible(const Runner *r, const Batch *b) {
    return graphs_apply(r) && b->n_tokens == b->n_seqs &&
           b->n_out == b->n_tokens && b->n_tokens <= RUNNER_GRAPH_MAX && !r->tok_lora;
}

static void forward_graph(Runner *r, KVCache *kv, const Step *st, int n) {
    Backend *be = r->b;
    if (kv != r->graph_kv) {
        graphs_reset(r);
        r->graph_kv = kv;
    }
    if (r->graph[n]) {
        be->graph_launch(be, r->graph[n]);
        r->graph_replays++;
        r->last_graph = 1;
        return;
    }
    if (!r->graph_seen[n] || be->graph_begin(be) != 0) {
        r->graph_seen[n] = 1;
        forward_ops(r, kv, st, n, n);
        return;
    }
    forward_ops(r, kv, st, n, n);
    r->graph[n] = be->graph_end(be);
    if (r->graph[n]) {
        be->graph_launch(be, r->graph[n]);
        r->graph_captures++;
        r->last_graph = 1;
        return;
    }
    log_warn("%s backend: capturing a decode step of %d tokens failed; decoding without graphs", be->name, n);
    r->graphs_off = 1;
    forward_ops(r, kv, st, n, n);
}

/* Piecewise graphs (vLLM's piecewise CUDA graphs): any other step of n <=
 * RUNNER_PIECE_MAX tokens (prefill chunks, mixed prefill + decode, decode
 * beyond RUNNER_GRAPH_MAX) on a graph-capable backend, without LoRA, MoE
 * models when moe_mlp takes their experts. The step is padded to its
 * bucket's N tokens: the segments (segment_ops, the K/V writes included) run
 * as graphs of N tokens, attn_core and tail_ops eagerly on the real n tokens
 * and n_out rows (their launch shapes depend on the positions and sequences).
 * Padded tokens are token 0 at position 0 with slot -1 (no K/V write: vLLM's
 * PAD_SLOT_ID) and their attention rows zero, not whatever an earlier step
 * left there: finite, and the same every time, so a step's
 * results depend on its inputs alone (an MoE step's padded tokens route, and
 * set the experts' row counts). No op mixes rows: the real rows' values are
 * what the unpadded step computes, up to the kernels the larger shape picks.
 * Returns the bucket index and N, or -1: eager. */
static int piece_bucket(const Runner *r, const Batch *b, int *N) {
    int n = b->n_tokens, idx, pad;
    if (!graphs_apply(r) || r->tok_lora || n > RUNNER_PIECE_MAX) return -1;
    if (n <= 8) idx = n - 1, pad = n;
    else if (n <= 256) idx = 8 + (n + 7) / 8 - 2, pad = (n + 7) / 8 * 8;
    else idx = 39 + (n + 15) / 16 - 17, pad = (n + 15) / 16 * 16;
    ASSERT(idx >= 0 && idx < RUNNER_PIECE_BUCKETS && pad >= n, "piece_bucket: %d tokens -> bucket %d", n, idx);
    if (pad > r->max_tokens) pad = r->max_tokens; /* the same N for every n of this bucket */
    if (r->m->cfg.n_experts && pad > r->moe_rows) return -1;
    *N = pad;
    return idx;
}

static void forward_pieces(Runner *r, KVCache *kv, const Step *st, int n, int N, int idx, int n_out) {
    const ModelConfig *c = &r->m->cfg;
    Backend *be = r->b;
    int L = c->n_layers, qd = c->n_heads * c->head_dim;
    if (kv != r->piece_kv) {
        pieces_reset(r);
        r->piece_kv = kv;
    }
    if (!r->piece[idx]) r->piece[idx] = xcalloc((size_t)L + 1, sizeof(void *));
    void **g = r->piece[idx];
    int captured = 0, replayed = 0;
    for (int s = 0; s <= L; s++) {
        if (g[s]) {
            be->graph_launch(be, g[s]);
            replayed = 1;
        } else if (r->piece_seen[idx] && !r->graphs_off && be->graph_begin(be) == 0) {
            segment_ops(r, kv, st, s, N);
            g[s] = be->graph_end(be);
            if (g[s]) {
                be->graph_launch(be, g[s]);
                captured = 1;
            } else {
                log_warn("%s backend: capturing segment %d of a %d-token step failed; running without graphs",
                         be->name, s, N);
                r->graphs_off = 1;
                segment_ops(r, kv, st, s, N);
            }
        } else {
            segment_ops(r, kv, st, s, N);
        }
        if (s == L) break;
        attn_core(r, kv, s, st, n);
        if (N > n) be->zero(be, r->att + (size_t)n * qd, sizeof(float) * (size_t)(N - n) * qd);
    }
    tail_ops(r, st, n_out);
    r->piece_seen[idx] = 1;
    r->piece_captures += captured;
    r->piece_replays += replayed && !captured;
    if (captured || replayed) r->last_graph = 2;
}

int model_forward(Runner *r, KVCache *kv, const Batch *b, float *logits, Err *err) {
    int rc = batch_check(r, kv, b, err);
    if (rc) return rc;
    const ModelConfig *c = &r->m->cfg;
    Backend *be = r->b;
    Step st;
    if (be->step_begin) be->step_begin(be); /* before the step's uploads: its device work starts here */
    r->tok_lora = NULL;
    for (int i = 0; r->lora_tokens && i < b->n_tokens; i++)
        if (r->lora_tokens[i] >= 0) r->tok_lora = r->lora_tokens;
    int full = graph_eligible(r, b), N = b->n_tokens, piece = full ? -1 : piece_bucket(r, b, &N);
    step_prepare(r, kv, b, &st, N);
    if (b->n_pending > 0 && be->tokens_resolve(be, (int32_t *)st.tokens, b->n_tokens, b->n_pending))
        return ERR(err, 500, "the %s backend could not take the pending tokens of the last sampling", be->name);
    r->h_logits_out = logits;
    r->last_graph = 0;
    if (full) forward_graph(r, kv, &st, b->n_tokens);
    else if (piece >= 0) forward_pieces(r, kv, &st, b->n_tokens, N, piece, b->n_out);
    else forward_ops(r, kv, &st, b->n_tokens, b->n_out);
    ASSERT(logits || !be->host, "model_forward: a host backend needs a logits buffer");
    if (r->experts && r->n_moe) { /* rows [0, n) of mr_ids: the capture's layout (padded rows beyond) */
        size_t bytes = sizeof(int32_t) * (size_t)b->n_tokens * r->n_moe * c->top_k;
        if (be->host) memcpy(r->experts, r->mr_ids, bytes);
        else if (be->download_async && logits == NULL) be->download_async(be, r->experts, r->mr_ids, bytes);
        else be->download(be, r->experts, r->mr_ids, bytes);
    }
    if (!be->host && logits) be->download(be, logits, r->logits, sizeof(float) * (size_t)b->n_out * c->vocab);
    return 0;
}

void *runner_host_alloc(Runner *r, size_t bytes) {
    Backend *b = r->b;
    return b->host_alloc && !b->host ? b->host_alloc(b, bytes) : xcalloc(1, bytes ? bytes : 1);
}

void runner_host_free(Runner *r, void *p) {
    Backend *b = r->b;
    if (!p) return;
    if (b->host_alloc && !b->host) b->host_release(b, p);
    else free(p);
}

/* ---- device sampling over the last step's logits (model.h) ---- */
int runner_set_act_bf16(Runner *r, int on) {
    if (!r->b->set_act_bf16) return on ? -1 : 0;
    r->b->set_act_bf16(r->b, on);
    return 0;
}

int runner_graph_counts(const Runner *r, uint64_t *captures, uint64_t *replays) {
    *captures = r->graph_captures;
    *replays = r->graph_replays;
    return graphs_apply(r);
}

int runner_last_graph(const Runner *r) { return r->last_graph; }

void runner_set_graphs(Runner *r, int on) { r->graphs_eager = !on; }

void runner_piece_counts(const Runner *r, uint64_t *captures, uint64_t *replays) {
    *captures = r->piece_captures;
    *replays = r->piece_replays;
}

int runner_act_bf16_fast(const Runner *r) { return r->b->set_act_bf16 && r->b->act_bf16_fast; }

int runner_sample_reserve(Runner *r, const DevSampleCaps *caps, Err *err) {
    Backend *be = r->b;
    if (be->host || !be->sample_launch || !be->sample_wait || !be->tokens_resolve || !be->sample_reserve)
        return ERR(err, 500, "the %s backend does not sample on the device", be->name);
    return be->sample_reserve(be, caps, err) ? -1 : 0;
}

int runner_sample_launch(Runner *r, int n_out, const DevSampleBatch *b, int slot, Err *err) {
    Backend *be = r->b;
    if (be->host || !be->sample_launch) return ERR(err, 500, "the %s backend does not sample on the device", be->name);
    r->sample_rows = 0; /* a failed launch leaves nothing a batch may name */
    if (be->sample_launch(be, r->logits, n_out, r->m->cfg.vocab, b, slot, err)) return -1;
    r->sample_rows = b->n_rows;
    return 0;
}

int runner_sample_wait(Runner *r, int slot, const DevSampleOut **out, const int32_t **packed, Err *err) {
    Backend *be = r->b;
    if (be->host || !be->sample_wait) return ERR(err, 500, "the %s backend does not sample on the device", be->name);
    return be->sample_wait(be, slot, out, packed, err) ? -1 : 0;
}

double runner_device_seconds(const Runner *r) { return r->b->device_seconds ? r->b->device_seconds(r->b) : -1; }

void runner_fetch_logits(Runner *r, float *logits, int n_out) {
    Backend *be = r->b;
    if (!be->host) be->download(be, logits, r->logits, sizeof(float) * (size_t)n_out * r->m->cfg.vocab);
}
