/*
 * backend.h - the table of ops the forward pass runs, one implementation per
 * device. The CPU backend (kernels/cpu/backend_cpu.c) is the reference; the
 * CUDA backend fills the same table with kernel launchers over device memory.
 * Tensors are row-major; shapes are given per argument. Weights: a WeightMat
 * (the op reads bf16 / q on a host backend, dev / dev_scale on a device
 * backend) and bf16 vectors passed as pointers into the backend's memory
 * (forward.c picks WeightVec.host or .dev); no op translates host pointers.
 * Backend memory is written only through these ops (upload, copy, zero and
 * the compute ops), never by other code between them: a backend may keep
 * state derived from its buffers' contents across ops (the CUDA backend's
 * split of a norm's output for the next GEMVs, backend_cuda.cu norm_split)
 * and drops it in the ops that write.
 */
#ifndef SAMPLER_BACKEND_H
#define SAMPLER_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "dev_sample.h"
#include "kv_dtype.h"
#include "weights.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Paged attention of one layer for a batch. All pointers are backend memory.
 * The cache layout and element types: kv_dtype.h. */
typedef struct AttnArgs {
    float *out;              /* [n_tokens, n_heads * head_dim] f32 */
    const float *q;          /* [n_tokens, n_heads * head_dim] f32, RoPE applied */
    const void *k_cache;     /* [n_blocks, n_kv_heads, block_size, head_dim] kv_dtype, this layer */
    const void *v_cache;     /* same */
    const int32_t *pos;      /* [n_tokens] */
    const int32_t *seq;      /* [n_tokens] */
    const int32_t *block_table; /* [n_seqs, bt_stride] physical block ids */
    int bt_stride;
    int n_tokens, n_heads, n_kv_heads, head_dim, block_size;
    float scale;             /* 1/sqrt(head_dim) */
    KvDtype kv_dtype;        /* element type of k_cache / v_cache */
    const float *k_scale;    /* [n_blocks, n_kv_heads, block_size] f32 when KV_FP8, else NULL */
    const float *v_scale;    /* same */
    int n_seqs;              /* sequences in the batch (0: unknown); a launcher's choice of kernel, not a shape */
} AttnArgs;

/* One layer's K/V write for a step (kv_dtype.h: layout and the rounding
 * contract every backend implements bit for bit). */
typedef struct KvWriteArgs {
    void *k_cache, *v_cache; /* [n_blocks, n_kv_heads, block_size, head_dim] dtype, this layer */
    float *k_scale, *v_scale; /* [n_blocks, n_kv_heads, block_size] f32 when KV_FP8, else NULL */
    const float *k, *v;      /* [n, n_kv_heads * head_dim] f32 */
    const int32_t *slots;    /* [n] block id * block_size + offset in the block; < 0: a padded token, not written
                              * (vLLM's PAD_SLOT_ID) */
    int n, n_kv_heads, head_dim, block_size;
    KvDtype dtype;
} KvWriteArgs;

/* One layer's q/k norm + RoPE fused with its K/V write (rope_kv_write): q in
 * place exactly as norm_rope does it; each token's k row normed and rotated by
 * the same operations in registers and stored with its v row as kv_write
 * stores them (kv.k itself is not written: nothing reads it afterwards).
 * Tokens with kv.slots[i] < 0 store nothing (their q rows are still rotated).
 * The composition norm_rope(q), norm_rope(k), kv_write gives the same bits on
 * the CPU (the reference). */
typedef struct RopeKvArgs {
    KvWriteArgs kv;          /* kv.k: [n, n_kv_heads * head_dim] f32 before norm / RoPE (read only) */
    float *q;                /* [n, n_heads * head_dim] f32, in place */
    int n_heads;
    const uint16_t *q_norm, *k_norm; /* [head_dim] bf16 each, or NULL: no QK-norm */
    float eps;
    const float *cs, *sn;    /* [max_ctx, head_dim / 2] f32 RoPE tables: cos / sin of position p in row p */
    const int32_t *pos;      /* [n] int32 each token's position (its table row) */
} RopeKvArgs;

/* One LoRA adapter's pair on one linear (lora.h builds them): the update of
 * that linear's output is B (scale * A x). B is kept transposed so the
 * expand is rank axpys over contiguous rows. Host memory on host backends,
 * device memory on device backends (forward.c uploads each adapter to the
 * region of the adapter pool it reserved at start-up). */
#define LORA_MAX_RANK 256
#define LORA_BF16_MAX_IN 32768 /* in-features of a BF16-stored pair (the CPU op widens a row of A on its stack) */
typedef struct LoraPair {
    const void *a;    /* [rank, in] f32, or bf16 when bf16 (PEFT lora_A.weight) */
    const void *b;    /* [rank, out] f32 / bf16 (PEFT lora_B.weight [out, rank], transposed) */
    int rank, in, out;
    float scale;      /* lora_alpha / rank, or lora_alpha / sqrt(rank) with use_rslora */
    int bf16;         /* 1: a and b hold bf16 bits (--lora-dtype bfloat16), widened exactly; f32 math either way */
} LoraPair;

/* MoE routing of one layer (HF Qwen3MoE; moe_route): per token t, p =
 * softmax(logits[t]) in f32 (the max, expf(l - max) summed in expert order,
 * each divided by the sum), the top_k experts by p (ties: the lower id), their
 * p as weights, divided by their sum (in k order) when norm; then the (t, k)
 * pairs counting-sorted by expert, tokens ascending within an expert. Every
 * pointer is backend memory; sizes are bounded by n * top_k, so nothing needs
 * a host read of the counts (a device step stays capturable in a graph). */
#define MOE_MAX_EXPERTS 512
#define MOE_MAX_TOPK 32
typedef struct MoeRouteArgs {
    const float *logits; /* [n, n_experts] f32 router logits (read only) */
    int32_t *ids;        /* [n, ids_ld] int32 chosen experts, p descending, in each row's first top_k */
    float *weights;      /* [n, top_k] f32 their routing weights */
    int32_t *offsets;    /* [n_experts + 1] int32: expert e's pairs are [offsets[e], offsets[e + 1]) */
    int32_t *pair_tok;   /* [n * top_k] int32 token of each pair, by expert, tokens ascending */
    float *pair_w;       /* [n * top_k] f32 weight of each pair */
    int32_t *pair_of;    /* [n * top_k] int32 pair index of (t, k): pair_tok[pair_of[t * top_k + k]] == t */
    int32_t *active;     /* [n_experts] int32 experts with pairs, ascending, then -1 */
    int n, n_experts, top_k, norm; /* n_experts <= MOE_MAX_EXPERTS, top_k <= min(MOE_MAX_TOPK, n_experts) */
    int ids_ld;          /* ids' row stride in int32s, >= top_k; 0: top_k. forward.c writes every MoE layer's
                          * ids into one [n, n_moe_layers, top_k] array (the routed-expert capture's layout) */
} MoeRouteArgs;

/* One MoE layer's routed experts as a device op reads them; forward.c uploads
 * the pointer tables once at runner creation (a delta rewrites dev in place). */
typedef struct MoeExperts {
    const WeightMat *gate, *up, *down; /* [n_experts] host: shapes, format, quantization blocks */
    const void *const *w;              /* [3, n_experts] backend memory: gate[e].dev, up[e].dev, down[e].dev */
    const void *const *s;              /* [3, n_experts] backend memory: their dev_scale (NULL for BF16) */
    const void *const *s2;             /* [3, n_experts] backend memory: NVFP4's dev_s2 of each ([1] f32, read at
                                        * run time: a delta rewrites it in place); NULL otherwise */
} MoeExperts;

/* The routed experts' SwiGLU MLPs of one layer after moe_route (moe_mlp):
 * out[t] = sum over t's pairs in expert order of w * down_e(silu(gate_e x[t]) * up_e x[t]). */
typedef struct MoeMlpArgs {
    float *out;                /* [n, hidden] f32 (overwritten) */
    const float *x;            /* [n, hidden] f32; NULL: only ask whether the op takes these experts */
    const MoeRouteArgs *route; /* moe_route's outputs for x: n, n_experts, top_k and the pair lists */
    MoeExperts ex;
    float *xg, *yg;            /* [n * top_k, hidden] f32 scratch: the pairs' inputs and outputs (yg may be xg) */
    float *g, *u;              /* [n * top_k, inter] f32 scratch (xg and u: the op may keep other data there,
                                * e.g. quantized activations) */
    int hidden, inter;
    /* Optional (resid NULL: out only): then the residual add and the next norm, resid += out and
     * norm_out = rmsnorm(resid) * norm_w, the bits of add_rmsnorm(norm_out, resid, out, norm_w, n,
     * hidden, eps) after the op on this backend (CUDA fuses them at one token; out then holds
     * anything). norm_out may be x, aliases neither resid nor out. */
    float *resid;              /* [n, hidden] f32 */
    float *norm_out;           /* [n, hidden] f32 */
    const uint16_t *norm_w;    /* [hidden] bf16 */
    float eps;
} MoeMlpArgs;

typedef struct Backend Backend;
struct Err; /* check.h */
struct Backend {
    const char *name;
    void *ctx;
    int host;  /* 1: ops take host pointers (upload/download are never called) */
    /* memory: zeroed allocation, release, host<->backend copies */
    void *(*alloc)(Backend *b, size_t bytes);
    void (*release)(Backend *b, void *p);
    void (*upload)(Backend *b, void *dst, const void *src, size_t bytes);
    void (*download)(Backend *b, void *dst, const void *src, size_t bytes);
    void (*zero)(Backend *b, void *p, size_t bytes);
    /* Optional (device backends; NULL: download instead): host memory the
     * device copies into without staging (pinned), zeroed, fatal when it
     * cannot be had (start-up only), and its release; download_async queues
     * dst (host_alloc memory) = src (backend memory) behind the ops queued so
     * far and returns at once: dst holds it once a later wait returned (a
     * download, sample_wait of a launch queued after it) and must not be read
     * before. */
    void *(*host_alloc)(Backend *b, size_t bytes);
    void (*host_release)(Backend *b, void *p);
    void (*download_async)(Backend *b, void *dst, const void *src, size_t bytes);
    /* Registered tensor t's host storage changed (a delta; a quantized matrix
     * was re-quantized on the host): refresh its device copy. idx: the touched
     * element indices [n_idx] (elem bytes each), or NULL when every element may
     * have changed. Returns 0, or <0 with err filled when the device copy could
     * not be brought up to date (never exits: the delta's commit then restores).
     * NULL when the ops read host weights. */
    int (*weights_changed)(Backend *b, const WeightTensor *t, const int64_t *idx, int64_t n_idx, int elem,
                           struct Err *err);
    /* dst = src, both backend memory, not overlapping */
    void (*copy)(Backend *b, void *dst, const void *src, size_t bytes);
    /* x[n, dim] f32 = emb[tokens[i]] (bf16 [vocab, dim]) */
    void (*embed)(Backend *b, float *x, const uint16_t *emb, const int32_t *tokens, int n, int dim);
    /* out[n, dim] = rmsnorm(x[n, dim]) * w[dim] (bf16); out may alias x */
    void (*rmsnorm)(Backend *b, float *out, const float *x, const uint16_t *w, int n, int dim, float eps);
    /* Optional: outs[i] = matmul(x, ws[i]) + biases[i] for i < count (<= 3 matrices with
     * the same cols over the same x, e.g. q/k/v or gate/up) in as few launches as the
     * backend can; the same results as count matmul calls. */
    void (*matmul_multi)(Backend *b, float *const *outs, const float *x, int n, const WeightMat *const *ws,
                         const uint16_t *const *biases, int count);
    /* Optional: x[n, dim] += y, then out = rmsnorm(x) * w, the same bits as add then
     * rmsnorm (NULL: forward.c issues those two); out does not alias x or y. */
    void (*add_rmsnorm)(Backend *b, float *out, float *x, const float *y, const uint16_t *w, int n, int dim,
                        float eps);
    /* out[n, w->rows] = x[n, w->cols] @ W^T (+ bias[w->rows] bf16) */
    void (*matmul)(Backend *b, float *out, const float *x, int n, const WeightMat *w, const uint16_t *bias);
    /* Optional (NULL: forward.c issues matmul then add_rmsnorm): the residual projection with the
     * residual add and the next norm, x[n, w->rows] += in[n, w->cols] @ W^T (+ bias), then out =
     * rmsnorm(x) * norm_w, the bits of matmul into a buffer then add_rmsnorm on this backend. 0, or -1
     * when it does not take this step (CUDA: n > 1, a native GEMM, the shape; nothing issued): the
     * caller runs the two. out aliases neither x nor in. */
    int (*matmul_add_rmsnorm)(Backend *b, float *out, float *x, const float *in, int n, const WeightMat *w,
                              const uint16_t *bias, const uint16_t *norm_w, float eps);
    /* per head: optional RMSNorm (norm_w [head_dim] bf16 or NULL) then RoPE with
     * the cos/sin tables cs, sn [max_ctx, head_dim/2] f32 at row pos[t] (int32 [n])
     * for token t; x [n, n_heads * head_dim] in place */
    void (*norm_rope)(Backend *b, float *x, int n, int n_heads, int head_dim, const uint16_t *norm_w,
                      float eps, const float *cs, const float *sn, const int32_t *pos);
    /* Optional (NULL: forward.c issues norm_rope on q and k, then kv_write):
     * RopeKvArgs, one launch on a device backend */
    void (*rope_kv_write)(Backend *b, const RopeKvArgs *a);
    void (*attention)(Backend *b, const AttnArgs *a);
    /* out[n] = silu(g[n]) * u[n] */
    void (*swiglu)(Backend *b, float *out, const float *g, const float *u, int n);
    /* Optional (NULL: matmul_multi or matmul of gate and up into g, u, then swiglu,
     * the CPU reference): out[n, gate->rows] = silu(x @ gate^T) * (x @ up^T) for
     * two matrices of the same shape without biases, the values of those ops; g, u
     * [n, gate->rows] f32 scratch the op may use (a device backend's fused GEMV at
     * decode sizes writes out only); out may alias g. */
    void (*matmul_swiglu)(Backend *b, float *out, const float *x, int n, const WeightMat *gate,
                          const WeightMat *up, float *g, float *u);
    /* x[n] += y[n] */
    void (*add)(Backend *b, float *x, const float *y, int n);
    /* store token i's k/v rows at slot slots[i] of the caches, converted to their dtype (slots[i] < 0: skipped) */
    void (*kv_write)(Backend *b, const KvWriteArgs *a);
    /* dst[i] = src[rows[i]], i < n; rows of dim f32 */
    void (*gather_rows)(Backend *b, float *dst, const float *src, const int32_t *rows, int n, int dim);
    /* dst[rows[i]] += w[i] * src[i], i < n, applied in order of i */
    void (*scale_add_rows)(Backend *b, float *dst, const float *src, const int32_t *rows, const float *w,
                           int n, int dim);
    /* MoE routing (MoeRouteArgs): the host routing's bits on the CPU (the reference) */
    void (*moe_route)(Backend *b, const MoeRouteArgs *a);
    /* Optional (NULL: matmul of the router into a->logits, then moe_route, the CPU reference):
     * both in one, a->logits [n, router->rows] = x [n, router->cols] @ router^T then the routing,
     * the bits of those two ops on this backend. 0, or -1 when it does not take this step (size,
     * format, the router's path at n; nothing issued): the caller runs the two. */
    int (*moe_router_route)(Backend *b, const MoeRouteArgs *a, const float *x, const WeightMat *router);
    /* Optional (NULL: forward.c runs each expert with the ops above, the CPU
     * reference): every routed expert of a layer in a few launches whose sizes
     * depend on n * top_k only. 0, or -1 when it does not take these experts
     * (format, shape, alignment; nothing issued): the caller runs them one by one. */
    int (*moe_mlp)(Backend *b, const MoeMlpArgs *a);
    /* Optional (NULL: this backend serves no LoRA adapters): the batched LoRA
     * of one linear, Punica's shrink then expand per row: for each i < n with
     * pairs[i] != NULL, h = scale * A x[i] (rank values), then
     * out[i] += h[j] * B^T[j] for j = 0..rank-1 in order. Rows without a pair are
     * untouched, so a batch mixing adapters and the base computes each row as
     * it would alone (fixed reduction order per element). x [n, pairs->in] f32,
     * out [n, pairs->out] f32 (contiguous rows). */
    void (*lora)(Backend *b, float *out, const float *x, int n, const LoraPair *const *pairs);
    /* Optional (device backends with lora): size the lora op's scratch for up
     * to max_tokens rows of rank <= max_rank; start-up (fatal on failure). The
     * op refuses (fatal) a call beyond it, so call it before any adapter. */
    void (*lora_reserve)(Backend *b, int max_tokens, int max_rank);
    /* Optional (device backends): dst (backend memory) = src [bytes] (host) on
     * the update path: 0 once ops issued after the call see the bytes and src
     * may be reused, or <0 with err filled (never fatal; dst then holds
     * anything, the caller does not use it). */
    int (*upload_try)(Backend *b, void *dst, const void *src, size_t bytes, struct Err *err);
    /* Size per-step scratch (e.g. quantized activations) for up to max_tokens
     * rows of up to max_cols; called once at runner creation. */
    void (*reserve)(Backend *b, int max_tokens, int max_cols);
    /* Optional (NULL: f32 activations only): on = 1 makes every matmul of BF16
     * weights round its activations to bf16 first and run in the order of
     * cpu_ops.h's cpu_matmul_rows_bf16 (--dtype bfloat16), 0 restores f32
     * activations (the default). Between steps only. */
    void (*set_act_bf16)(Backend *b, int on);
    int act_bf16_fast; /* 1: BF16 activations are the faster choice here (--dtype auto takes them) */
    /* Optional (NULL on the CPU): record the ops issued between graph_begin and
     * graph_end instead of running them, and replay the recording. graph_begin
     * returns 0 or -1 (nothing recorded); graph_end returns the replayable graph
     * or NULL (the ops issued since graph_begin did not run: issue them again). */
    int (*graph_begin)(Backend *b);
    void *(*graph_end)(Backend *b);
    void (*graph_launch)(Backend *b, void *graph);
    void (*graph_free)(Backend *b, void *graph);
    /* Optional (NULL: the engine samples on the host, sampling.c): sampling on
     * the device (dev_sample.h: the CPU sampler's semantics, the tie rule).
     * sample_reserve (start-up) sizes the scratch and the pinned staging for
     * caps; 0, or -1 with err filled.
     * sample_launch queues the sampling of batch (host; copied, reusable on
     * return) over logits [n_logit_rows, vocab] f32 in backend memory into
     * slot (< DEV_SAMPLE_SLOTS, not launched since its last wait) and does not
     * wait: 0, or -1 with err filled (over the caps, a bad row, a device
     * error: nothing may be used, the caller samples those rows on the host).
     * sample_wait waits for slot's launch only (ops queued after it go on):
     * *out [n_rows] results, *packed the packed kept sets (row r's at
     * r.mask_slot * DEV_MASK_WORDS(vocab), out[r].mask_len int32s of form
     * out[r].mask_form), valid until slot's next launch; 0, or -1 with err.
     * tokens_resolve queues, for the next ops, tokens[i] (backend int32 [n])
     * < 0 -> the token of row -1 - tokens[i] of the last launch (n_src rows;
     * every such index below n_src: the caller checks); 0, or -1. */
    int (*sample_reserve)(Backend *b, const DevSampleCaps *caps, struct Err *err);
    int (*sample_launch)(Backend *b, const float *logits, int n_logit_rows, int vocab, const DevSampleBatch *batch,
                         int slot, struct Err *err);
    int (*sample_wait)(Backend *b, int slot, const DevSampleOut **out, const int32_t **packed, struct Err *err);
    int (*tokens_resolve)(Backend *b, int32_t *tokens, int n, int n_src);
    /* Optional (NULL: not measured): step_begin marks, before any op of a
     * forward step, where the step's device work begins; device_seconds is
     * the device time of the steps whose sampling sample_wait has returned,
     * each from its mark to its sampled results, summed. A gap inside a step
     * (eager launches the device waited for) counts, the time between steps
     * does not: over a window, 1 - device_seconds / window is the share the
     * device sat idle waiting for the host. */
    void (*step_begin)(Backend *b);
    double (*device_seconds)(Backend *b);
    void (*free)(Backend *b);
};

/* CPU backend with n_threads threads (<= 0: one per core) and scratch for
 * attention over up to max_ctx positions. */
Backend *backend_cpu_create(int n_threads, int max_ctx);

/* ---- CUDA backend (kernels/cuda/backend_cuda.cu; only linked into the
 * per-GPU binaries sampler-sm*, see device_select.h for the safe entry) ----
 * Ops take device pointers for activations, caches, step inputs and vectors,
 * and read a WeightMat's dev / dev_scale. Runs on device 0 on one stream; FP8
 * and NVFP4 matrices run weight-only (their quantized bytes on the device,
 * the BF16 master on the host). */
/* Copy every tensor of ws to one device arena and set each entry's dev slots
 * (WeightVec.dev, WeightMat.dev / dev_scale). head_dim sizes the attention
 * scratch. Start-up: fatal on error. */
Backend *backend_cuda_create(WeightSet *ws, int head_dim, int max_ctx);
/* For models built directly in device memory (benchmarks): the caller sets
 * the dev slots of the WeightMats it passes and hands vectors as device
 * pointers; deltas are not supported. */
Backend *backend_cuda_create_resident(int head_dim, int max_ctx); /* head_dim <= 0: the largest supported */
/* Copy w's device BF16 copy [bytes] back into dst (checks that a delta reached
 * the device: hash it against the host master). -1 if w has none or bytes
 * exceeds it. */
int backend_cuda_read_weight(Backend *b, const WeightMat *w, void *dst, size_t bytes);
/* Delta updates of quantized matrices since creation: by their changed bytes (scattered, verified) and
 * rewritten whole (many changed, an NVFP4 amax moved, or no indices). */
void backend_cuda_update_counts(Backend *b, uint64_t *sparse, uint64_t *full);

#ifdef __cplusplus
}
#endif
#endif
