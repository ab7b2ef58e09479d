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

#include "backend.h"
#include "cpu_ops.h"
#include "model.h"

struct Runner {
    Model *m;
    Backend *b;
    int max_tokens, max_ctx;
    float *x, *xn, *tmp;     /* [T, hidden] */
    float *q, *att;          /* [T, n_heads * head_dim] */
    float *k, *v;            /* [T, n_kv_heads * head_dim] */
    float *g, *u;            /* [T, max(intermediate, moe_intermediate)] */
    float *cs, *sn;          /* [T, head_dim / 2] */
    float *inv_freq;         /* [head_dim / 2] */
    float *router;           /* [T, n_experts] */
    int32_t *topk_idx;       /* [T, top_k] */
    float *topk_w;           /* [T, top_k] */
    int32_t *ex_tok;         /* [T] tokens routed to the current expert */
    float *ex_w;             /* [T] their routing weights */
    float *xg, *yg;          /* [T, hidden] gathered inputs / expert outputs */
    float *hout;             /* [T, hidden] final hidden states of output rows */
    int32_t *experts;        /* optional capture [T, n_moe_layers, top_k] */
};

KVCache *kvcache_create(const ModelConfig *c, int n_blocks, int block_size) {
    KVCache *kv = xcalloc(1, sizeof *kv);
    *kv = (KVCache){c->n_layers, n_blocks, block_size, c->n_kv_heads, c->head_dim, NULL, NULL};
    size_t n = (size_t)c->n_layers * n_blocks * block_size * c->n_kv_heads * c->head_dim;
    kv->k = xcalloc(n, sizeof(float));
    kv->v = xcalloc(n, sizeof(float));
    return kv;
}

void kvcache_free(KVCache *kv) {
    if (!kv) return;
    free(kv->k);
    free(kv->v);
    free(kv);
}

#define FALLOC(n) ((float *)xcalloc((size_t)(n), sizeof(float)))

Runner *runner_create(Model *m, int max_tokens, int max_ctx, int n_threads) {
    const ModelConfig *c = &m->cfg;
    Runner *r = xcalloc(1, sizeof *r);
    r->m = m;
    r->b = backend_cpu_create(n_threads, max_ctx);
    r->max_tokens = max_tokens;
    r->max_ctx = max_ctx;
    size_t T = (size_t)max_tokens, H = (size_t)c->hidden;
    size_t inter = (size_t)(c->intermediate > c->moe_intermediate ? c->intermediate : c->moe_intermediate);
    r->x = FALLOC(T * H);
    r->xn = FALLOC(T * H);
    r->tmp = FALLOC(T * H);
    r->hout = FALLOC(T * H);
    r->q = FALLOC(T * c->n_heads * c->head_dim);
    r->att = FALLOC(T * c->n_heads * c->head_dim);
    r->k = FALLOC(T * c->n_kv_heads * c->head_dim);
    r->v = FALLOC(T * c->n_kv_heads * c->head_dim);
    r->g = FALLOC(T * inter);
    r->u = FALLOC(T * inter);
    r->cs = FALLOC(T * c->head_dim / 2);
    r->sn = FALLOC(T * c->head_dim / 2);
    r->inv_freq = FALLOC(c->head_dim / 2);
    cpu_rope_inv_freq(r->inv_freq, c->head_dim, c->rope_theta, c->rope_llama3, c->rope_factor,
                      c->rope_low_freq_factor, c->rope_high_freq_factor, c->rope_orig_max_pos);
    if (c->n_experts) {
        r->router = FALLOC(T * c->n_experts);
        r->topk_idx = xcalloc(T * c->top_k, sizeof(int32_t));
        r->topk_w = FALLOC(T * c->top_k);
        r->ex_tok = xcalloc(T, sizeof(int32_t));
        r->ex_w = FALLOC(T);
        r->xg = FALLOC(T * H);
        r->yg = FALLOC(T * H);
    }
    return r;
}

void runner_free(Runner *r) {
    if (!r) return;
    r->b->free(r->b);
    float *bufs[] = {r->x, r->xn, r->tmp, r->hout, r->q, r->att, r->k, r->v, r->g, r->u, r->cs,
                     r->sn, r->inv_freq, r->router, r->topk_w, r->ex_w, r->xg, r->yg};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(r->topk_idx);
    free(r->ex_tok);
    free(r);
}

void runner_set_expert_capture(Runner *r, int32_t *experts) { r->experts = experts; }

/* Reject anything that would index outside the runner, the cache or the vocab. */
static int batch_check(const Runner *r, const KVCache *kv, const Batch *b, Err *err) {
    const ModelConfig *c = &r->m->cfg;
    ENSURE(err, b->n_tokens > 0 && b->n_tokens <= r->max_tokens, 400, "batch of %d tokens (max %d)",
           b->n_tokens, r->max_tokens);
    ENSURE(err, b->n_out >= 0 && b->n_out <= b->n_tokens, 400, "n_out %d out of range", b->n_out);
    for (int i = 0; i < b->n_tokens; i++) {
        ENSURE(err, b->tokens[i] >= 0 && b->tokens[i] < c->vocab, 400, "token id %d outside the vocabulary (%d)",
               b->tokens[i], c->vocab);
        ENSURE(err, b->pos[i] >= 0 && b->pos[i] < r->max_ctx, 400, "position %d outside [0, %d)", b->pos[i],
               r->max_ctx);
        ENSURE(err, b->seq[i] >= 0 && b->seq[i] < b->n_seqs, 400, "sequence index %d out of range", b->seq[i]);
        const int32_t *bt = b->block_table[b->seq[i]];
        ENSURE(err, bt[b->pos[i] / kv->block_size] >= 0 && bt[b->pos[i] / kv->block_size] < kv->n_blocks, 400,
               "block table entry out of range");
    }
    for (int i = 0; i < b->n_out; i++)
        ENSURE(err, b->out_rows[i] >= 0 && b->out_rows[i] < b->n_tokens, 400, "out row %d out of range",
               b->out_rows[i]);
    return 0;
}

static void rope_tables(Runner *r, const Batch *b) {
    int h2 = r->m->cfg.head_dim / 2;
    for (int t = 0; t < b->n_tokens; t++)
        for (int i = 0; i < h2; i++) {
            float a = (float)b->pos[t] * r->inv_freq[i];
            r->cs[(size_t)t * h2 + i] = cosf(a);
            r->sn[(size_t)t * h2 + i] = sinf(a);
        }
}

static void kv_write(const Runner *r, KVCache *kv, int l, const Batch *b) {
    size_t slot = (size_t)kv->n_kv_heads * kv->head_dim;
    size_t layer_off = (size_t)l * kv->n_blocks * kv->block_size * slot;
    for (int t = 0; t < b->n_tokens; t++) {
        int p = b->pos[t];
        size_t off = layer_off + ((size_t)b->block_table[b->seq[t]][p / kv->block_size] * kv->block_size +
                                  (size_t)(p % kv->block_size)) * slot;
        memcpy(kv->k + off, r->k + (size_t)t * slot, slot * sizeof(float));
        memcpy(kv->v + off, r->v + (size_t)t * slot, slot * sizeof(float));
    }
}

static void attention_block(Runner *r, KVCache *kv, int l, const Batch *b) {
    const ModelConfig *c = &r->m->cfg;
    const LayerWeights *w = &r->m->layers[l];
    Backend *be = r->b;
    int n = b->n_tokens;
    be->rmsnorm(be, r->xn, r->x, w->attn_norm, n, c->hidden, c->rms_eps);
    be->matmul(be, r->q, r->xn, n, &w->q, w->q_bias);
    be->matmul(be, r->k, r->xn, n, &w->k, w->k_bias);
    be->matmul(be, r->v, r->xn, n, &w->v, w->v_bias);
    be->norm_rope(be, r->q, n, c->n_heads, c->head_dim, w->q_norm, c->rms_eps, r->cs, r->sn);
    be->norm_rope(be, r->k, n, c->n_kv_heads, c->head_dim, w->k_norm, c->rms_eps, r->cs, r->sn);
    kv_write(r, kv, l, b);
    size_t layer_off = (size_t)l * kv->n_blocks * kv->block_size * kv->n_kv_heads * kv->head_dim;
    AttnArgs a = {r->att, r->q, kv->k + layer_off, kv->v + layer_off, b->pos, b->seq, b->block_table,
                  n, c->n_heads, c->n_kv_heads, c->head_dim, kv->block_size, 1.0f / sqrtf((float)c->head_dim)};
    be->attention(be, &a);
    be->matmul(be, r->tmp, r->att, n, &w->o, w->o_bias);
    be->add(be, r->x, r->tmp, n * c->hidden);
}

static void dense_mlp(Runner *r, const WeightMat *gate, const WeightMat *up, const WeightMat *down,
                      const float *in, float *out, int n) {
    Backend *be = r->b;
    be->matmul(be, r->g, in, n, gate, NULL);
    be->matmul(be, r->u, in, n, up, NULL);
    be->swiglu(be, r->g, r->g, r->u, n * gate->rows);
    be->matmul(be, out, r->g, n, down, NULL);
}

/* HF Qwen3MoE routing: softmax over all experts in f32, top-k (ties: lower
 * index first), optional renormalisation over the k chosen. */
static void route(Runner *r, int n, int moe_layer) {
    const ModelConfig *c = &r->m->cfg;
    int E = c->n_experts, K = c->top_k;
    for (int t = 0; t < n; t++) {
        float *p = r->router + (size_t)t * E, mx = -INFINITY, sum = 0.f;
        for (int e = 0; e < E; e++) mx = p[e] > mx ? p[e] : mx;
        for (int e = 0; e < E; e++) sum += (p[e] = expf(p[e] - mx));
        for (int e = 0; e < E; e++) p[e] /= sum;
        int32_t *idx = r->topk_idx + (size_t)t * K;
        float *wk = r->topk_w + (size_t)t * K, wsum = 0.f;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++) taken |= idx[j] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            idx[k] = best;
            wsum += (wk[k] = p[best]);
        }
        if (c->norm_topk_prob)
            for (int k = 0; k < K; k++) wk[k] /= wsum;
        if (r->experts) {
            int n_moe = 0;
            for (int l = 0; l < c->n_layers; l++) n_moe += model_layer_is_moe(c, l);
            memcpy(r->experts + ((size_t)t * n_moe + moe_layer) * K, idx, sizeof(int32_t) * (size_t)K);
        }
    }
}

/* Experts run in index order over the tokens routed to them, so a token's
 * sum over its experts has the same order whatever else is in the batch. */
static void moe_mlp(Runner *r, int l, int moe_layer, int n) {
    const ModelConfig *c = &r->m->cfg;
    const LayerWeights *w = &r->m->layers[l];
    Backend *be = r->b;
    int H = c->hidden, K = c->top_k;
    be->matmul(be, r->router, r->xn, n, &w->router, NULL);
    route(r, n, moe_layer);
    memset(r->tmp, 0, sizeof(float) * (size_t)n * H);
    for (int e = 0; e < c->n_experts; e++) {
        int cnt = 0;
        for (int t = 0; t < n; t++)
            for (int k = 0; k < K; k++)
                if (r->topk_idx[(size_t)t * K + k] == e) {
                    r->ex_tok[cnt] = t;
                    r->ex_w[cnt++] = r->topk_w[(size_t)t * K + k];
                }
        if (!cnt) continue;
        for (int i = 0; i < cnt; i++)
            memcpy(r->xg + (size_t)i * H, r->xn + (size_t)r->ex_tok[i] * H, sizeof(float) * (size_t)H);
        dense_mlp(r, &w->egate[e], &w->eup[e], &w->edown[e], r->xg, r->yg, cnt);
        for (int i = 0; i < cnt; i++)
            cpu_axpy(r->tmp + (size_t)r->ex_tok[i] * H, r->ex_w[i], r->yg + (size_t)i * H, H);
    }
}

int model_forward(Runner *r, KVCache *kv, const Batch *b, float *logits, Err *err) {
    int rc = batch_check(r, kv, b, err);
    if (rc) return rc;
    const Model *m = r->m;
    const ModelConfig *c = &m->cfg;
    Backend *be = r->b;
    int n = b->n_tokens, H = c->hidden, moe_layer = 0;
    be->embed(be, r->x, m->embed, b->tokens, n, H);
    rope_tables(r, b);
    for (int l = 0; l < c->n_layers; l++) {
        attention_block(r, kv, l, b);
        be->rmsnorm(be, r->xn, r->x, m->layers[l].mlp_norm, n, H, c->rms_eps);
        if (model_layer_is_moe(c, l)) moe_mlp(r, l, moe_layer++, n);
        else dense_mlp(r, &m->layers[l].gate, &m->layers[l].up, &m->layers[l].down, r->xn, r->tmp, n);
        be->add(be, r->x, r->tmp, n * H);
    }
    for (int i = 0; i < b->n_out; i++)
        memcpy(r->hout + (size_t)i * H, r->x + (size_t)b->out_rows[i] * H, sizeof(float) * (size_t)H);
    be->rmsnorm(be, r->hout, r->hout, m->final_norm, b->n_out, H, c->rms_eps);
    be->matmul(be, logits, r->hout, b->n_out, &m->lm_head, NULL);
    return 0;
}
