/*
 * backend_cpu.c - the CPU backend: the ops of backend.h, parallelised over a
 * thread pool. Work is split by output rows (matmul) or (token, head) pairs
 * (attention) so no reduction crosses threads: results are independent of the
 * thread count and of the batch composition.
 */
#include <math.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>

#include "backend.h"
#include "check.h"
#include "cpu_ops.h"
#include "dtype.h"
#include "kv_cpu.h"
#include "quant.h"
#include "threadpool.h"

typedef struct CpuCtx {
    ThreadPool *tp;
    int n_threads; /* the pool's, the caller included */
    int max_ctx;
    float *scores; /* [n_threads, ATTN_TILE, max_ctx] attention scratch */
    float *xq;     /* [max_tokens, max_cols] quantized activations */
    float *xs;     /* [max_tokens, max_cols / 16 + 1] their scales */
    uint16_t *xb;  /* [max_tokens, max_cols] bf16 activations (act_bf16) */
    int act_bf16;  /* 1: BF16 matmuls round x to bf16 first (--dtype bfloat16) */
    int max_tokens, max_cols;
    /* batched LoRA scratch (cpu_lora), [max_tokens] each unless noted */
    const LoraPair **lora_seg; /* the segments' pairs */
    int *lora_rows;            /* batch row of each segment row */
    int *lora_row0;            /* [max_tokens + 1] first segment row of each segment */
    int *lora_task0;           /* first task of each segment */
    unsigned char *lora_taken;
} CpuCtx;

#define STREAM_TASK_BYTES ((size_t)256 << 10) /* decode steps and quantized formats; else cpu_matmul_task_rows */
#define STREAM_MAX_TOKENS 4 /* up to this many tokens a BF16 matmul streams its weights once, task by task */
#define PREFILL_TASK_MIN 64 /* tokens from which BF16-activation matmuls split by tokens too */

typedef struct MatmulJob {
    float *out;
    const float *x;
    const float *xs; /* activation scales when x was quantized, else NULL */
    const uint16_t *xb; /* x rounded to bf16 [n, cols] when the activations are BF16, else NULL */
    int n;
    const WeightMat *w;
    const uint16_t *bias;
    int task_rows; /* rows per task */
    int task_tokens; /* tokens per task (BF16 activations, prefill: 2-D tasks), else 0: all */
    int row_tasks;   /* tasks per token block */
} MatmulJob;

/* Parallel-for over [0, n) in chunks of grain (elementwise and per-row ops
 * of big steps; a step under two chunks runs on the calling thread: no
 * wake-up for decode). Each index is computed by the same code whatever
 * the chunking, so results do not depend on it. */
typedef void (*RangeFn)(const void *ctx, size_t i0, size_t i1);
typedef struct RangeJob {
    RangeFn fn;
    const void *ctx;
    size_t n, grain;
} RangeJob;

static void range_task(void *p, int task, int thread) {
    (void)thread;
    const RangeJob *j = p;
    size_t i0 = (size_t)task * j->grain, i1 = i0 + j->grain < j->n ? i0 + j->grain : j->n;
    j->fn(j->ctx, i0, i1);
}

static void par_for(CpuCtx *c, size_t n, size_t grain, RangeFn fn, const void *ctx) {
    if (n < 2 * grain) {
        fn(ctx, 0, n);
        return;
    }
    RangeJob j = {fn, ctx, n, grain};
    threadpool_run(c->tp, (int)((n + grain - 1) / grain), range_task, &j);
}

typedef struct ElemArgs {
    float *out;
    const float *a, *b;
    uint16_t *ob;
    const uint16_t *w;
    int dim;
    float eps;
} ElemArgs;

static void act_bf16_range(const void *p, size_t i0, size_t i1) {
    const ElemArgs *e = p;
    cpu_act_to_bf16(e->ob + i0, e->a + i0, i1 - i0);
}
static void swiglu_range(const void *p, size_t i0, size_t i1) {
    const ElemArgs *e = p;
    cpu_swiglu(e->out + i0, e->a + i0, e->b + i0, (int)(i1 - i0));
}
static void add_range(const void *p, size_t i0, size_t i1) {
    const ElemArgs *e = p;
    cpu_add(e->out + i0, e->a + i0, (int)(i1 - i0));
}
static void rmsnorm_range(const void *p, size_t i0, size_t i1) { /* rows */
    const ElemArgs *e = p;
    cpu_rmsnorm(e->out + i0 * e->dim, e->a + i0 * e->dim, e->w, (int)(i1 - i0), e->dim, e->eps);
}

#define ELEM_GRAIN ((size_t)1 << 15) /* elements per chunk: ~10-30 us of work */

static void matmul_task(void *p, int task, int thread) {
    MatmulJob *j = p;
    const WeightMat *w = j->w;
    int rt = j->task_tokens ? task % j->row_tasks : task, t0 = j->task_tokens ? task / j->row_tasks * j->task_tokens : 0;
    int r0 = rt * j->task_rows, r1 = r0 + j->task_rows;
    if (r1 > w->rows) r1 = w->rows;
    if (w->fmt == WF_BF16) {
        if (j->xb) {
            int n = j->task_tokens && j->n - t0 > j->task_tokens ? j->task_tokens : j->n - t0;
            cpu_matmul_rows_bf16(j->out + (size_t)t0 * w->rows, w->rows, j->xb + (size_t)t0 * w->cols, w->cols, n, w,
                                 j->bias, r0, r1);
        }
        else cpu_matmul_rows(j->out, w->rows, j->x, w->cols, j->n, w, j->bias, r0, r1);
        return;
    }
    if (w->fmt == WF_FP8) quant_matmul_fp8_rows(j->out, j->x, j->xs, w->q, j->n, r0, r1);
    else quant_matmul_nvfp4_rows(j->out, j->x, j->xs, w->q, j->n, r0, r1);
    if (j->bias)
        for (int t = 0; t < j->n; t++)
            for (int r = r0; r < r1; r++) j->out[(size_t)t * w->rows + r] += bf16_to_f32(j->bias[r]);
}

/* Rows of a matmul task that streams its weights (a decode step's BF16
 * matmuls, every quantized one): ~256 KB of weights, but at least two tasks
 * per thread, in 8-row blocks. Small tasks (32 rows, 32 KB of FP8 at K = 1024;
 * 64 KB of BF16) restarted each thread's stream every few microseconds and
 * interleaved the two threads' streams: Qwen3-0.6B decode on 2 threads, FP8
 * 28-35 -> 38-45 tok/s, BF16 26-31 -> 30-35 (bench_forward, alternating
 * builds). Which task a row lands in changes no bit. */
static int stream_task_rows(const CpuCtx *c, const WeightMat *w) {
    size_t row_bytes = w->fmt == WF_FP8 ? (size_t)w->cols : w->fmt == WF_BF16 ? 2 * (size_t)w->cols : (size_t)w->cols / 2;
    size_t rows = STREAM_TASK_BYTES / (row_bytes ? row_bytes : 1);
    size_t fair = ((size_t)w->rows + 2 * (size_t)c->n_threads - 1) / (2 * (size_t)c->n_threads);
    if (rows > fair) rows = fair;
    rows = (rows + 7) / 8 * 8;
    return rows < 8 ? 8 : (int)rows;
}

/* Quantized weights with quantized activations (the native GPU paths): x is
 * quantized once per call into scratch, then every row task reads it. */
static void cpu_matmul(Backend *b, float *out, const float *x, int n, const WeightMat *w, const uint16_t *bias) {
    CpuCtx *c = b->ctx;
    /* bf16 prefill and batches: tasks of ~64 KB of weights (work split by bytes, whole output lines) */
    MatmulJob j = {out, x, NULL, NULL, n, w, bias, w->fmt == WF_BF16 && n > STREAM_MAX_TOKENS ? cpu_matmul_task_rows(w->cols) : stream_task_rows(c, w),
                   0, 0};
    int tasks = (w->rows + j.task_rows - 1) / j.task_rows;
    if (w->fmt == WF_BF16 && c->act_bf16) {
        /* once per call, on the calling thread (vcvtneps2bf16: ~0.1 ms for 512 x 1024) */
        ASSERT(n <= c->max_tokens && w->cols <= c->max_cols, "bf16 activations [%d, %d], reserved [%d, %d]", n,
               w->cols, c->max_tokens, c->max_cols);
        ElemArgs e = {.a = x, .ob = c->xb};
        par_for(c, (size_t)n * w->cols, ELEM_GRAIN, act_bf16_range, &e);
        j.xb = c->xb;
        if (n >= PREFILL_TASK_MIN) {
            /* prefill: tasks of B rows x ~B tokens (B x K bf16 ~256 KB of each, both stay in L2; a task
             * over all tokens streams the whole x from L3 once per 64 KB of weights: 355 -> 390
             * GFLOP/s, 3072 x 1024 x 512 tokens, best of 10). The tokens go in floor(n / B) equal
             * tasks (up to 2B tokens each) rather than B and a remainder: 64 tokens of the 3072-wide
             * down projection were 42 + 22 (B = 42), now one 64-token task: Qwen3-0.6B's 64-token
             * prefill 1.04-1.07x on 1 thread, 1.06-1.13x on 2 (5-7 alternating pairs, medians). Which task an output
             * lands in changes no bit. */
            int blk = (int)(((size_t)256 << 10) / (2 * (size_t)w->cols));
            blk = blk < 16 ? 16 : blk > 256 ? 256 : blk;
            int token_tasks = n / blk > 1 ? n / blk : 1;
            j.task_rows = (blk + 15) / 16 * 16;
            j.task_tokens = (n + token_tasks - 1) / token_tasks;
            j.row_tasks = (w->rows + j.task_rows - 1) / j.task_rows;
            tasks = j.row_tasks * ((n + j.task_tokens - 1) / j.task_tokens);
        }
    }
    if (w->fmt != WF_BF16 && w->act_quant) {
        const QuantFp8 *q8 = w->fmt == WF_FP8 ? (const QuantFp8 *)w->q : NULL;
        if (q8 && q8->block_cols >= q8->cols) quant_act_fp8_token(c->xq, c->xs, x, n, w->cols); /* per-channel weights */
        else if (q8) quant_act_fp8(c->xq, c->xs, x, n, w->cols);
        else quant_act_nvfp4(c->xq, c->xs, x, n, w->cols, ((const QuantNvfp4 *)w->q)->input_scale);
        j.x = c->xq;
        j.xs = c->xs;
    }
    threadpool_run(c->tp, tasks, matmul_task, &j);
}

/* Batched LoRA, Punica-style: rows are grouped by adapter pair (segments)
 * and a task takes up to LORA_ROWS_PER_TASK rows of one segment, so an
 * adapter's A and B come from memory about once per task and stay in cache
 * for its other rows, with one barrier per linear. Each row is exactly
 * cpu_lora_row (cpu_lora_rows: BF16 pairs widen once per task), so the grouping
 * (which depends on the batch) never changes a bit. */
#define LORA_ROWS_PER_TASK 2
#define LORA_INLINE_MACS (1 << 18) /* less work than this runs on the calling thread: no wake-up, no barrier */

typedef struct LoraJob {
    CpuCtx *c;
    float *out;
    const float *x;
    int n_seg;
} LoraJob;

static void lora_task(void *p, int task, int thread) {
    (void)thread;
    const LoraJob *j = p;
    CpuCtx *c = j->c;
    int s = 0;
    while (s + 1 < j->n_seg && c->lora_task0[s + 1] <= task) s++;
    const LoraPair *lp = c->lora_seg[s];
    int r0 = c->lora_row0[s] + (task - c->lora_task0[s]) * LORA_ROWS_PER_TASK, r1 = r0 + LORA_ROWS_PER_TASK;
    if (r1 > c->lora_row0[s + 1]) r1 = c->lora_row0[s + 1];
    cpu_lora_rows(j->out, j->x, c->lora_rows + r0, r1 - r0, lp);
}

static void cpu_lora(Backend *b, float *out, const float *x, int n, const LoraPair *const *pairs) {
    CpuCtx *c = b->ctx;
    ASSERT(n <= c->max_tokens, "LoRA over %d rows, reserved for %d", n, c->max_tokens);
    int n_seg = 0, n_rows = 0, n_tasks = 0;
    size_t macs = 0;
    memset(c->lora_taken, 0, (size_t)n);
    for (int i = 0; i < n; i++) {
        if (!pairs[i] || c->lora_taken[i]) continue;
        const LoraPair *lp = pairs[i];
        c->lora_seg[n_seg] = lp;
        c->lora_row0[n_seg] = n_rows;
        c->lora_task0[n_seg] = n_tasks;
        for (int k = i; k < n; k++)
            if (pairs[k] == lp) {
                c->lora_taken[k] = 1;
                c->lora_rows[n_rows++] = k;
            }
        n_tasks += (n_rows - c->lora_row0[n_seg] + LORA_ROWS_PER_TASK - 1) / LORA_ROWS_PER_TASK;
        macs += (size_t)(n_rows - c->lora_row0[n_seg]) * lp->rank * (size_t)(lp->in + lp->out);
        n_seg++;
    }
    c->lora_row0[n_seg] = n_rows;
    if (!n_seg) return;
    LoraJob j = {c, out, x, n_seg};
    if (macs < LORA_INLINE_MACS)
        for (int t = 0; t < n_tasks; t++) lora_task(&j, t, 0);
    else threadpool_run(c->tp, n_tasks, lora_task, &j);
}

static void cpu_embed_op(Backend *b, float *x, const uint16_t *emb, const int32_t *tokens, int n, int dim) {
    for (int i = 0; i < n; i++) cpu_embed(x + (size_t)i * dim, emb, tokens[i], dim);
}

static void cpu_rmsnorm_op(Backend *b, float *out, const float *x, const uint16_t *w, int n, int dim, float eps) {
    ElemArgs e = {.out = out, .a = x, .w = w, .dim = dim, .eps = eps};
    par_for(b->ctx, (size_t)n, ELEM_GRAIN / (size_t)(dim > 0 ? dim : 1) + 1, rmsnorm_range, &e);
}

typedef struct NormRopeArgs {
    float *x;
    int n_heads, head_dim;
    const uint16_t *norm_w;
    float eps;
    const float *cs, *sn; /* [max_ctx, head_dim / 2] tables */
    const int32_t *pos;   /* [n] table row of each token */
} NormRopeArgs;

/* One head row v [head_dim] in place: the RMSNorm (if norm_w) and RoPE at table row p. */
static void norm_rope_row(float *v, const NormRopeArgs *a, int32_t p) {
    size_t h2 = (size_t)a->head_dim / 2;
    if (a->norm_w) cpu_rmsnorm(v, v, a->norm_w, 1, a->head_dim, a->eps);
    cpu_rope(v, a->cs + (size_t)p * h2, a->sn + (size_t)p * h2, a->head_dim);
}

static void norm_rope_range(const void *p, size_t t0, size_t t1) { /* tokens */
    const NormRopeArgs *a = p;
    for (size_t t = t0; t < t1; t++)
        for (int h = 0; h < a->n_heads; h++) norm_rope_row(a->x + (t * a->n_heads + h) * a->head_dim, a, a->pos[t]);
}

static void cpu_norm_rope(Backend *b, float *x, int n, int n_heads, int head_dim, const uint16_t *norm_w,
                          float eps, const float *cs, const float *sn, const int32_t *pos) {
    NormRopeArgs a = {x, n_heads, head_dim, norm_w, eps, cs, sn, pos};
    par_for(b->ctx, (size_t)n, ELEM_GRAIN / (size_t)(n_heads * head_dim > 0 ? n_heads * head_dim : 1) + 1,
            norm_rope_range, &a);
}

/* Tokens [t0, t1) of rope_kv_write's cache part: each k row normed and rotated on the
 * stack (norm_rope_row: norm_rope's bits), stored with its v row (cpu_kv_store_row:
 * kv_write's bits); slots are distinct, so tokens store in any order. */
typedef struct RopeKvJob {
    const RopeKvArgs *a;
    NormRopeArgs k;
} RopeKvJob;

static void rope_kv_range(const void *p, size_t t0, size_t t1) {
    const RopeKvJob *j = p;
    const KvWriteArgs *w = &j->a->kv;
    int nkv = w->n_kv_heads, hd = w->head_dim, bs = w->block_size;
    float buf[KV_CPU_CHUNK];
    for (size_t t = t0; t < t1; t++) {
        if (w->slots[t] < 0) continue;
        size_t blk = (size_t)(w->slots[t] / bs), off = (size_t)(w->slots[t] % bs);
        for (int h = 0; h < nkv; h++) {
            size_t row = (blk * nkv + h) * bs + off, src = (t * nkv + h) * hd;
            memcpy(buf, w->k + src, sizeof(float) * (size_t)hd);
            norm_rope_row(buf, &j->k, j->a->pos[t]);
            cpu_kv_store_row(w->k_cache, w->k_scale, w->dtype, row, buf, hd);
            cpu_kv_store_row(w->v_cache, w->v_scale, w->dtype, row, w->v + src, hd);
        }
    }
}

static void cpu_rope_kv_write(Backend *b, const RopeKvArgs *a) {
    const KvWriteArgs *w = &a->kv;
    int hd = w->head_dim;
    ASSERT(hd > 0 && hd % 2 == 0 && hd <= KV_CPU_CHUNK, "rope_kv_write: head_dim %d", hd);
    cpu_norm_rope(b, a->q, w->n, a->n_heads, hd, a->q_norm, a->eps, a->cs, a->sn, a->pos);
    RopeKvJob j = {a, {NULL, w->n_kv_heads, hd, a->k_norm, a->eps, a->cs, a->sn, a->pos}};
    par_for(b->ctx, (size_t)w->n, ELEM_GRAIN / (size_t)(w->n_kv_heads * hd > 0 ? w->n_kv_heads * hd : 1) + 1,
            rope_kv_range, &j);
}

/* (token, head) pairs of one attention task: the query heads of one kv head
 * times consecutive tokens, so each block of K and V is read once for up to
 * this many queries while it is in L1. */
#define ATTN_TILE 16

typedef struct AttnJob {
    const AttnArgs *a;
    CpuCtx *c;
    int tq;     /* tokens per task */
    int gh;     /* query heads per task (all G of a kv head unless G > ATTN_TILE) */
    int chunks; /* ceil(G / gh) */
} AttnJob;

/* Tokens [t0, t1) of one sequence (one block table) x query heads [g0, g1)
 * of the G of kv head kvh. Per (token, head) the operations are exactly those of attending
 * alone: scores over positions 0..pos (cpu_dot_rows: cpu_dot's bits), softmax,
 * then the weighted V sum in position order (cpu_axpy_rows: cpu_axpy's bits);
 * only the interleaving between queries changes, so the result is the same
 * for any tile, batch or thread count. */
/* Blocks of one head are n_kv_heads * block_size rows apart (and scattered by
 * the block table), so the hardware prefetcher stops at each one: prefetch
 * block bi + 1's rows of this head (and its FP8 scales) while block bi runs. */
static void attn_prefetch(const AttnArgs *a, const void *cache, const float *scale, const int32_t *bt, int bi,
                          int nblk, int kvh) {
    if (bi + 1 >= nblk) return;
    size_t row0 = ((size_t)bt[bi + 1] * a->n_kv_heads + kvh) * a->block_size;
    size_t elem = kv_dtype_elem(a->kv_dtype), bytes = (size_t)a->block_size * a->head_dim * elem;
    const char *p = (const char *)cache + row0 * a->head_dim * elem;
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, 3);
    if (scale) __builtin_prefetch(scale + row0, 0, 3);
}

static void attn_run(const AttnArgs *a, float *scores, int max_ctx, int t0, int t1, int kvh, int g0, int g1) {
    int G = a->n_heads / a->n_kv_heads, hd = a->head_dim, bs = a->block_size;
    const int32_t *bt = a->block_table + (size_t)a->seq[t0] * a->bt_stride;
    /* f32 caches are read in place (a whole block); other types are decoded
     * chunk rows at a time into buf. Per row the dot and axpy are the same
     * operations either way, so the chunking changes no bit. */
    float buf[KV_CPU_CHUNK];
    ASSERT(hd <= KV_CPU_CHUNK, "head_dim %d > %d", hd, KV_CPU_CHUNK);
    int chunk = a->kv_dtype == KV_F32 ? bs : KV_CPU_CHUNK / hd;
    int nmax = 0;
    for (int t = t0; t < t1; t++) nmax = a->pos[t] + 1 > nmax ? a->pos[t] + 1 : nmax;
    ASSERT(nmax <= max_ctx, "attention over %d positions, the scratch holds %d (max_ctx)", nmax, max_ctx);
    const float *qs[ATTN_TILE], *cs[ATTN_TILE]; /* the tile's (token, head) rows: (t1 - t0) * (g1 - g0) <= ATTN_TILE */
    float *ss[ATTN_TILE], *os[ATTN_TILE];
    /* BF16 caches: rows read in place and widened in registers where the path can (the same values),
     * for one group of queries (decode); a larger tile decodes the chunk once into buf instead of
     * widening it again for every group of four (scores) or two (values) */
    int bf16_direct = a->kv_dtype == KV_BF16 && cpu_kv_bf16_direct(hd);
    ASSERT((t1 - t0) * (g1 - g0) <= ATTN_TILE, "attention tile %d x %d", t1 - t0, g1 - g0);
#define Q(t, g) (a->q + ((size_t)(t) * a->n_heads + (size_t)kvh * G + (g)) * hd)
#define OUT(t, g) (a->out + ((size_t)(t) * a->n_heads + (size_t)kvh * G + (g)) * hd)
#define S(t, g) (scores + ((size_t)((t) - t0) * (g1 - g0) + (g) - g0) * max_ctx)
    int nblk = (nmax + bs - 1) / bs;
    for (int i0 = 0; i0 < nmax; i0 += bs) {
        size_t row0 = ((size_t)bt[i0 / bs] * a->n_kv_heads + kvh) * bs;
        int mb = nmax - i0 < bs ? nmax - i0 : bs;
        attn_prefetch(a, a->k_cache, a->k_scale, bt, i0 / bs, nblk, kvh);
        for (int c0 = 0; c0 < mb; c0 += chunk) {
            int mc = mb - c0 < chunk ? mb - c0 : chunk;
            const float *k = NULL;
            /* the queries that see all mc rows share their loads; the others (the diagonal) alone */
            int nq = 0;
            for (int t = t0; t < t1; t++) {
                int n = a->pos[t] + 1;
                if (n <= i0 + c0) continue;
                int m = n - i0 - c0 < mc ? n - i0 - c0 : mc;
                for (int g = g0; g < g1; g++) {
                    if (m < mc) {
                        if (!k) k = cpu_kv_rows(buf, a->k_cache, a->k_scale, a->kv_dtype, row0 + c0, mc, hd);
                        cpu_dot_rows(S(t, g) + i0 + c0, Q(t, g), k, hd, m, hd);
                    } else {
                        qs[nq] = Q(t, g);
                        ss[nq++] = S(t, g) + i0 + c0;
                    }
                }
            }
            if (!nq) continue;
            if (bf16_direct && nq <= 4) cpu_dot_rows_multi_bf16(ss, qs, nq, (const uint16_t *)a->k_cache + (row0 + c0) * hd, hd, mc, hd);
            else {
                if (!k) k = cpu_kv_rows(buf, a->k_cache, a->k_scale, a->kv_dtype, row0 + c0, mc, hd);
                cpu_dot_rows_multi(ss, qs, nq, k, hd, mc, hd);
            }
        }
    }
    for (int t = t0; t < t1; t++)
        for (int g = g0; g < g1; g++) {
            float *s = S(t, g);
            int n = a->pos[t] + 1;
            float mx = cpu_scale_max(s, n, a->scale);
            float sum = 0.f;
            cpu_exp_shift(s, n, mx);
            for (int i = 0; i < n; i++) sum += s[i]; /* in position order, on every path */
            cpu_scale(s, n, 1.0f / sum);
            float *out = OUT(t, g);
            for (int d = 0; d < hd; d++) out[d] = 0.f;
        }
    for (int i0 = 0; i0 < nmax; i0 += bs) {
        size_t row0 = ((size_t)bt[i0 / bs] * a->n_kv_heads + kvh) * bs;
        int mb = nmax - i0 < bs ? nmax - i0 : bs;
        attn_prefetch(a, a->v_cache, a->v_scale, bt, i0 / bs, nblk, kvh);
        for (int c0 = 0; c0 < mb; c0 += chunk) {
            int mc = mb - c0 < chunk ? mb - c0 : chunk;
            const float *v = NULL;
            int nq = 0;
            for (int t = t0; t < t1; t++) {
                int n = a->pos[t] + 1;
                if (n <= i0 + c0) continue;
                int m = n - i0 - c0 < mc ? n - i0 - c0 : mc;
                for (int g = g0; g < g1; g++) {
                    if (m < mc) {
                        if (!v) v = cpu_kv_rows(buf, a->v_cache, a->v_scale, a->kv_dtype, row0 + c0, mc, hd);
                        cpu_axpy_rows(OUT(t, g), S(t, g) + i0 + c0, v, hd, m, hd);
                    } else {
                        os[nq] = OUT(t, g);
                        cs[nq++] = S(t, g) + i0 + c0;
                    }
                }
            }
            if (!nq) continue;
            if (bf16_direct && nq <= 2) cpu_axpy_rows_multi_bf16(os, cs, nq, (const uint16_t *)a->v_cache + (row0 + c0) * hd, hd, mc, hd);
            else {
                if (!v) v = cpu_kv_rows(buf, a->v_cache, a->v_scale, a->kv_dtype, row0 + c0, mc, hd);
                cpu_axpy_rows_multi(os, cs, nq, v, hd, mc, hd);
            }
        }
    }
#undef Q
#undef OUT
#undef S
}

/* The attention before issue #23, run with the avx2-v0 matmul path so the
 * benchmarks can measure the whole old backend: one (token, head) per task,
 * scores over positions 0..pos, softmax, weighted V sum; the same bits. */
static void attn_task_v0(void *p, int task, int thread) {
    AttnJob *j = p;
    const AttnArgs *a = j->a;
    int t = task / a->n_heads, h = task % a->n_heads;
    int kvh = h / (a->n_heads / a->n_kv_heads), hd = a->head_dim, bs = a->block_size;
    const float *q = a->q + ((size_t)t * a->n_heads + h) * hd;
    float *out = a->out + ((size_t)t * a->n_heads + h) * hd;
    float *s = j->c->scores + (size_t)thread * j->c->max_ctx;
    const int32_t *bt = a->block_table + (size_t)a->seq[t] * a->bt_stride;
    int n = a->pos[t] + 1;
    float buf[KV_CPU_CHUNK];
    ASSERT(hd <= KV_CPU_CHUNK, "head_dim %d > %d", hd, KV_CPU_CHUNK);
    ASSERT(n <= j->c->max_ctx, "attention over %d positions, the scratch holds %d (max_ctx)", n, j->c->max_ctx);
#define ROW(i) (((size_t)bt[(i) / bs] * a->n_kv_heads + kvh) * bs + (i) % bs)
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) {
        const float *k = cpu_kv_rows(buf, a->k_cache, a->k_scale, a->kv_dtype, ROW(i), 1, hd);
        s[i] = cpu_dot(q, k, hd) * a->scale;
        if (s[i] > mx) mx = s[i];
    }
    float sum = 0.f;
    cpu_exp_shift(s, n, mx);
    for (int i = 0; i < n; i++) sum += s[i];
    float inv = 1.0f / sum;
    for (int d = 0; d < hd; d++) out[d] = 0.f;
    for (int i = 0; i < n; i++) {
        const float *v = cpu_kv_rows(buf, a->v_cache, a->v_scale, a->kv_dtype, ROW(i), 1, hd);
        cpu_axpy(out, s[i] * inv, v, hd);
    }
#undef ROW
}

/* One task: a tile of tokens x one kv head, split into runs of one sequence. */
static void attn_task(void *p, int task, int thread) {
    AttnJob *j = p;
    const AttnArgs *a = j->a;
    int nkv = a->n_kv_heads, chunk = task % j->chunks, kvh = task / j->chunks % nkv;
    int t0 = task / j->chunks / nkv * j->tq, g0 = chunk * j->gh, G = a->n_heads / nkv;
    int g1 = g0 + j->gh < G ? g0 + j->gh : G;
    int t1 = t0 + j->tq < a->n_tokens ? t0 + j->tq : a->n_tokens;
    float *scores = j->c->scores + (size_t)thread * ATTN_TILE * j->c->max_ctx;
    for (int ta = t0; ta < t1;) {
        int tb = ta + 1;
        while (tb < t1 && a->seq[tb] == a->seq[ta]) tb++;
        attn_run(a, scores, j->c->max_ctx, ta, tb, kvh, g0, g1);
        ta = tb;
    }
}

static void cpu_attention(Backend *b, const AttnArgs *a) {
    CpuCtx *c = b->ctx;
    if (cpu_ops_path() == CPU_PATH_AVX2_V0) {
        AttnJob j0 = {a, c, 1, 1, 1};
        threadpool_run(c->tp, a->n_tokens * a->n_heads, attn_task_v0, &j0);
        return;
    }
    int G = a->n_heads / a->n_kv_heads;
    ASSERT(G >= 1 && G * a->n_kv_heads == a->n_heads, "heads %d / kv heads %d", a->n_heads, a->n_kv_heads);
    int gh = G < ATTN_TILE ? G : ATTN_TILE;
    AttnJob j = {a, c, ATTN_TILE / gh, gh, (G + gh - 1) / gh};
    int tiles = (a->n_tokens + j.tq - 1) / j.tq;
    threadpool_run(c->tp, tiles * a->n_kv_heads * j.chunks, attn_task, &j);
}

static void cpu_swiglu_op(Backend *b, float *out, const float *g, const float *u, int n) {
    ElemArgs e = {.out = out, .a = g, .b = u};
    par_for(b->ctx, (size_t)n, ELEM_GRAIN, swiglu_range, &e);
}

static void cpu_add_op(Backend *b, float *x, const float *y, int n) {
    ElemArgs e = {.out = x, .a = y};
    par_for(b->ctx, (size_t)n, ELEM_GRAIN, add_range, &e);
}

static void cpu_kv_write(Backend *b, const KvWriteArgs *a) {
    int nkv = a->n_kv_heads, hd = a->head_dim, bs = a->block_size;
    for (int i = 0; i < a->n; i++) {
        if (a->slots[i] < 0) continue; /* a padded token */
        size_t blk = (size_t)(a->slots[i] / bs), off = (size_t)(a->slots[i] % bs);
        for (int h = 0; h < nkv; h++) {
            size_t row = (blk * nkv + h) * bs + off, src = ((size_t)i * nkv + h) * hd;
            cpu_kv_store_row(a->k_cache, a->k_scale, a->dtype, row, a->k + src, hd);
            cpu_kv_store_row(a->v_cache, a->v_scale, a->dtype, row, a->v + src, hd);
        }
    }
}

static void cpu_gather_rows(Backend *b, float *dst, const float *src, const int32_t *rows, int n, int dim) {
    for (int i = 0; i < n; i++)
        memcpy(dst + (size_t)i * dim, src + (size_t)rows[i] * dim, sizeof(float) * (size_t)dim);
}

static void cpu_moe_route_op(Backend *b, const MoeRouteArgs *a) { cpu_moe_route(a); }

static void cpu_scale_add_rows(Backend *b, float *dst, const float *src, const int32_t *rows, const float *w,
                               int n, int dim) {
    for (int i = 0; i < n; i++) cpu_axpy(dst + (size_t)rows[i] * dim, w[i], src + (size_t)i * dim, dim);
}

/* Large buffers (the KV cache above all: attention walks its scattered 4 KiB runs) on huge pages. */
static void *cpu_alloc(Backend *b, size_t bytes) {
    return bytes >= ((size_t)2 << 20) ? xcalloc_huge(bytes) : xcalloc(1, bytes);
}
static void cpu_release(Backend *b, void *p) { free(p); }
static void cpu_copy(Backend *b, void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
static void cpu_zero(Backend *b, void *p, size_t n) { memset(p, 0, n); }

static void cpu_reserve(Backend *b, int max_tokens, int max_cols) {
    CpuCtx *c = b->ctx;
    free(c->xq);
    free(c->xs);
    c->xq = xcalloc((size_t)max_tokens * max_cols, sizeof(float));
    c->xs = xcalloc((size_t)max_tokens * (max_cols / 16 + 1), sizeof(float));
    free(c->xb);
    c->xb = xcalloc((size_t)max_tokens * max_cols, sizeof(uint16_t));
    c->max_cols = max_cols;
    void *lora[] = {(void *)c->lora_seg, c->lora_rows, c->lora_row0, c->lora_task0, c->lora_taken};
    for (size_t i = 0; i < sizeof lora / sizeof lora[0]; i++) free(lora[i]);
    size_t T = (size_t)max_tokens;
    c->max_tokens = max_tokens;
    c->lora_seg = xcalloc(T, sizeof *c->lora_seg);
    c->lora_rows = xcalloc(T, sizeof(int));
    c->lora_row0 = xcalloc(T + 1, sizeof(int));
    c->lora_task0 = xcalloc(T, sizeof(int));
    c->lora_taken = xcalloc(T, 1);
}

static void cpu_set_act_bf16(Backend *b, int on) { ((CpuCtx *)b->ctx)->act_bf16 = on; }

static void cpu_free(Backend *b) {
    CpuCtx *c = b->ctx;
    free(c->xb);
    free(c->xq);
    free(c->xs);
    void *lora[] = {(void *)c->lora_seg, c->lora_rows, c->lora_row0, c->lora_task0, c->lora_taken};
    for (size_t i = 0; i < sizeof lora / sizeof lora[0]; i++) free(lora[i]);
    threadpool_free(c->tp);
    free(c->scores);
    free(c);
    free(b);
}

Backend *backend_cpu_create(int n_threads, int max_ctx) {
    if (n_threads <= 0) n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads < 1) n_threads = 1;
    cpu_ops_init();
    CpuCtx *c = xcalloc(1, sizeof *c);
    c->tp = threadpool_create(n_threads);
    c->n_threads = n_threads;
    c->max_ctx = max_ctx;
    c->scores = xmalloc(sizeof(float) * (size_t)n_threads * ATTN_TILE * (size_t)max_ctx);
    Backend *b = xcalloc(1, sizeof *b);
    *b = (Backend){.name = "cpu", .ctx = c, .host = 1, .alloc = cpu_alloc, .release = cpu_release,
                   .upload = cpu_copy, .download = cpu_copy, .zero = cpu_zero, .copy = cpu_copy, .embed = cpu_embed_op,
                   .rmsnorm = cpu_rmsnorm_op, .matmul = cpu_matmul, .norm_rope = cpu_norm_rope,
                   .rope_kv_write = cpu_rope_kv_write,
                   .attention = cpu_attention, .swiglu = cpu_swiglu_op, .add = cpu_add_op,
                   .kv_write = cpu_kv_write, .gather_rows = cpu_gather_rows,
                   .scale_add_rows = cpu_scale_add_rows, .reserve = cpu_reserve, .lora = cpu_lora,
                   .moe_route = cpu_moe_route_op,
                   .set_act_bf16 = cpu_set_act_bf16, .act_bf16_fast = cpu_ops_bf16_native(),
                   .free = cpu_free};
    return b;
}
