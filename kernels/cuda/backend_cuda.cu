/*
 * backend_cuda.cu - the CUDA backend: the op table of backend.h over device
 * memory, one stream on device 0, kernels of kernels/cuda/ and cuBLAS.
 *
 * Weights: at creation every tensor the forward pass reads is copied once
 * into one device arena; a hash map translates the model's host pointers
 * (what the forward pass hands to the ops) to their device copies. Matmul
 * runs the GEMV kernel for up to CUDA_GEMV_MAX_N tokens (decode) and cuBLAS
 * beyond (prefill). FP8/NVFP4 weights: their quantized bytes and scales are
 * copied (not the BF16 master) and every n runs the weight-only kernels of
 * quant_gemv.cu; act_quant models run weight-only too (logged at creation).
 * Deltas (weights_changed): BF16 tensors get a verified scatter of the touched
 * elements (scatter.cu), quantized matrices a re-upload of their bytes.
 * Graphs (graph_*): stream capture of the ops forward.c issues for a decode
 * step, replayed per batch size. Nothing is allocated per step: the bf16
 * activation scratch of the GEMM path is sized by reserve (runner creation),
 * the attention split scratch at creation.
 * Errors inside ops are bugs (the forward pass validated the batch): fatal
 * (CUDA_CHECK). The update path (weights_changed, its scatter and read-back,
 * re-uploads, backend_cuda_register / _read_weight) returns every CUDA error
 * (CUDA_TRY) so that delta_commit can restore the weights.
 * Not here: quantized activations (native FP8 / NVFP4 tensor cores), device
 * sampling.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cuda_check.h"
#include "cuda_kernels.h"
extern "C" {
#include "check.h"
#include "log.h"
#include "model.h"
#include "quant.h"
}
#include "gemv_tile.cuh"

#define LAUNCH_OK(call) CHECK((call) == 0, "bad shape in %s (a bug in the caller)", #call)

#define BLAS_WORKSPACE (32u << 20)

typedef struct DevEntry {
    const void *host; /* key; NULL = empty slot */
    void *dev;
    size_t bytes;
    int owned;        /* 1: own cudaMalloc (registered later), 0: in the arena */
} DevEntry;

typedef struct CudaCtx {
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;
    int resident, sms, max_ctx;
    DevEntry *map;     /* open addressing, cap a power of two */
    size_t cap, used;
    void *arena;       /* weights copied at creation */
    uint16_t *xbf;     /* [xbf_cap] bf16 GEMM activations */
    size_t xbf_cap;
    float *part;       /* attention split scratch */
    size_t part_cap;   /* floats */
    const WeightMat **qmats; /* [n_qmats] the model's FP8/NVFP4 matrices (delta re-uploads) */
    int n_qmats, cap_qmats;
    void *sc_dev;      /* delta scatter staging: idx int64 [n], values [n * elem], read-back [n * elem] */
    size_t sc_dev_cap;
    uint8_t *sc_host;  /* [2 * n * elem]: values sent, values read back */
    size_t sc_host_cap;
} CudaCtx;

static CudaCtx *ctx(Backend *b) { return (CudaCtx *)b->ctx; }
static void *st(Backend *b) { return (void *)ctx(b)->stream; }

static size_t map_slot(const CudaCtx *c, const void *h) {
    uint64_t x = (uint64_t)(uintptr_t)h;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    size_t i = (size_t)x & (c->cap - 1);
    while (c->map[i].host && c->map[i].host != h) i = (i + 1) & (c->cap - 1);
    return i;
}

static DevEntry *map_find(CudaCtx *c, const void *h) {
    if (!c->cap) return NULL;
    DevEntry *e = &c->map[map_slot(c, h)];
    return e->host ? e : NULL;
}

static DevEntry *map_insert(CudaCtx *c, const void *h) {
    if (2 * (c->used + 1) > c->cap) {
        DevEntry *old = c->map;
        size_t oc = c->cap;
        c->cap = oc ? 2 * oc : 1024;
        c->map = (DevEntry *)xcalloc(c->cap, sizeof(DevEntry));
        for (size_t i = 0; i < oc; i++)
            if (old[i].host) c->map[map_slot(c, old[i].host)] = old[i];
        free(old);
    }
    DevEntry *e = &c->map[map_slot(c, h)];
    if (!e->host) {
        e->host = h;
        c->used++;
    }
    return e;
}

/* Host weight pointer -> device copy (NULL stays NULL). */
static const uint16_t *dw(Backend *b, const void *h) {
    CudaCtx *c = ctx(b);
    if (!h || c->resident) return (const uint16_t *)h;
    DevEntry *e = map_find(c, h);
    CHECK(e, "weight at host %p was never copied to the device (a bug: add it to backend_cuda_create)", h);
    return (const uint16_t *)e->dev;
}

static const void *dv(Backend *b, const void *h) { return (const void *)dw(b, h); }

/* Grow a device scratch buffer (sized by cu_reserve / at creation, so a step
 * never gets here; deltas grow their staging here). On an error the buffer is
 * empty (NULL, cap 0) or unchanged, never dangling. */
static int scratch_grow_try(CudaCtx *c, void **p, size_t *cap, size_t bytes, Err *err) {
    if (bytes <= *cap) return 0;
    CUDA_TRY(err, cudaStreamSynchronize(c->stream));
    if (*p) {
        void *old = *p;
        CUDA_TRY(err, cudaFree(old));
        *p = NULL;
        *cap = 0;
    }
    void *np = NULL;
    CUDA_TRY(err, cudaMalloc(&np, bytes));
    *p = np;
    *cap = bytes;
    return 0;
}
static void scratch_grow(CudaCtx *c, void **p, size_t *cap, size_t bytes) {
    Err e = {0};
    CHECK(scratch_grow_try(c, p, cap, bytes, &e) == 0, "device scratch of %zu bytes: %s", bytes, e.msg);
}

/* ---- memory ---- */
static void *cu_alloc(Backend *b, size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    CHECK(e == cudaSuccess, "cudaMalloc of %zu MiB failed: %s\n  fix: lower --max-tokens, the KV cache size or "
          "the context length", bytes >> 20, cudaGetErrorString(e));
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, ctx(b)->stream)); /* ordered before any op on it */
    return p;
}
static void cu_release(Backend *b, void *p) {
    CUDA_CHECK(cudaStreamSynchronize(ctx(b)->stream));
    CUDA_CHECK(cudaFree(p));
}
/* Pageable source: the call returns once the bytes are staged, so the caller may reuse it. */
static void cu_upload(Backend *b, void *dst, const void *src, size_t n) {
    if (n) CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, ctx(b)->stream));
}
static void cu_download(Backend *b, void *dst, const void *src, size_t n) {
    if (n) CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, ctx(b)->stream));
    CUDA_CHECK(cudaStreamSynchronize(ctx(b)->stream));
}
static void cu_zero(Backend *b, void *p, size_t n) {
    if (n) CUDA_CHECK(cudaMemsetAsync(p, 0, n, ctx(b)->stream));
}
extern "C" int backend_cuda_register(Backend *b, const void *host, size_t bytes, Err *err);

/* Sparse delta on a registered device copy: upload (idx, values), scatter, gather
 * the touched elements back and compare them with what was sent (the verified
 * copy back). Staging grows on this path only (deltas, never a step). */
static int cu_scatter_verified(Backend *b, DevEntry *e, const void *host, const int64_t *idx, int64_t n, int elem,
                               Err *err) {
    CudaCtx *c = ctx(b);
    size_t vb = (size_t)n * elem, need = sizeof(int64_t) * (size_t)n + 2 * vb;
    int rc = scratch_grow_try(c, &c->sc_dev, &c->sc_dev_cap, need, err);
    if (rc) return rc;
    if (c->sc_host_cap < 2 * vb) {
        free(c->sc_host);
        c->sc_host = (uint8_t *)malloc(2 * vb);
        c->sc_host_cap = c->sc_host ? 2 * vb : 0;
        if (!c->sc_host) return ERR(err, 500, "out of host memory for a %zu-byte delta scatter", 2 * vb);
    }
    const uint8_t *h = (const uint8_t *)host;
    uint8_t *vals = c->sc_host, *back = c->sc_host + vb;
    for (int64_t i = 0; i < n; i++) memcpy(vals + (size_t)i * elem, h + (size_t)idx[i] * elem, (size_t)elem);
    int64_t *didx = (int64_t *)c->sc_dev;
    uint8_t *dval = (uint8_t *)c->sc_dev + sizeof(int64_t) * (size_t)n, *dback = dval + vb;
    int64_t numel = (int64_t)(e->bytes / (size_t)elem);
    CUDA_TRY(err, cudaMemcpyAsync(didx, idx, sizeof(int64_t) * (size_t)n, cudaMemcpyHostToDevice, c->stream));
    CUDA_TRY(err, cudaMemcpyAsync(dval, vals, vb, cudaMemcpyHostToDevice, c->stream));
    if ((rc = cuda_scatter(e->dev, numel, didx, dval, n, elem, st(b), err))) return rc;
    if ((rc = cuda_gather(dback, e->dev, numel, didx, n, elem, st(b), err))) return rc;
    CUDA_TRY(err, cudaMemcpyAsync(back, dback, vb, cudaMemcpyDeviceToHost, c->stream));
    CUDA_TRY(err, cudaStreamSynchronize(c->stream));
    if (memcmp(vals, back, vb))
        return ERR(err, 500, "the device copy read back after a scatter of %lld elements differs from the values sent",
                   (long long)n);
    return 0;
}

/* A BF16 weight: scatter the touched elements when that moves well under the
 * tensor's bytes, else re-upload it. A quantized matrix's BF16 master is not on
 * the device: the host re-quantized it (admin_touched), so its quantized buffers
 * are re-uploaded. Returns 0, or <0 with err filled (the caller restores the host
 * weights and calls again, which rewrites the device copy from them). */
static int cu_weights_changed(Backend *b, const void *host, size_t bytes, const int64_t *idx, int64_t n_idx,
                              int elem, Err *err) {
    CudaCtx *c = ctx(b);
    for (int i = 0; i < c->n_qmats; i++) {
        const WeightMat *w = c->qmats[i];
        if (w->bf16 != host) continue;
        if (w->fmt == WF_FP8) {
            const QuantFp8 *q = (const QuantFp8 *)w->q;
            int rc = backend_cuda_register(b, q->q, (size_t)q->rows * q->cols, err);
            return rc ? rc : backend_cuda_register(b, q->scale_inv, sizeof(float) * (size_t)q->scale_rows * q->scale_cols, err);
        }
        const QuantNvfp4 *q = (const QuantNvfp4 *)w->q;
        int rc = backend_cuda_register(b, q->packed, (size_t)q->rows * (q->cols / 2), err);
        return rc ? rc : backend_cuda_register(b, q->scale, (size_t)q->rows * (q->cols / QUANT_NVFP4_BLOCK), err);
    }
    DevEntry *e = c->resident ? NULL : map_find(c, host);
    if (e && idx && n_idx > 0 && (elem == 1 || elem == 2 || elem == 4) && bytes <= e->bytes &&
        (size_t)n_idx * (sizeof(int64_t) + 2 * (size_t)elem) < bytes / 4)
        return cu_scatter_verified(b, e, host, idx, n_idx, elem, err);
    return backend_cuda_register(b, host, bytes, err);
}
static void cu_copy(Backend *b, void *dst, const void *src, size_t n) {
    if (n) CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, ctx(b)->stream));
}

/* ---- ops ---- */
static void cu_embed(Backend *b, float *x, const uint16_t *emb, const int32_t *tokens, int n, int dim) {
    LAUNCH_OK(cuda_embed(x, dw(b, emb), tokens, n, dim, st(b)));
}
static void cu_rmsnorm(Backend *b, float *out, const float *x, const uint16_t *w, int n, int dim, float eps) {
    LAUNCH_OK(cuda_rmsnorm(out, x, dw(b, w), n, dim, eps, st(b)));
}
static void cu_add_rmsnorm(Backend *b, float *out, float *x, const float *y, const uint16_t *w, int n, int dim,
                           float eps) {
    LAUNCH_OK(cuda_add_rmsnorm(out, x, y, dw(b, w), n, dim, eps, st(b)));
}
static void cu_matmul(Backend *b, float *out, const float *x, int n, const WeightMat *w, const uint16_t *bias) {
    CudaCtx *c = ctx(b);
    if (w->fmt == WF_FP8) { /* weight-only, also when w->act_quant (see the top of the file) */
        const QuantFp8 *q = (const QuantFp8 *)w->q;
        LAUNCH_OK(cuda_gemv_fp8(out, x, n, (const uint8_t *)dv(b, q->q), (const float *)dv(b, q->scale_inv),
                                q->rows, q->cols, q->block_rows, q->block_cols, dw(b, bias), st(b)));
        return;
    }
    if (w->fmt == WF_NVFP4) {
        const QuantNvfp4 *q = (const QuantNvfp4 *)w->q;
        LAUNCH_OK(cuda_gemv_nvfp4(out, x, n, (const uint8_t *)dv(b, q->packed), (const uint8_t *)dv(b, q->scale),
                                  q->scale2, q->rows, q->cols, dw(b, bias), st(b)));
        return;
    }
    const uint16_t *W = dw(b, w->bf16), *bs = dw(b, bias);
    if (n <= CUDA_GEMV_MAX_N) {
        LAUNCH_OK(cuda_gemv_bf16(out, x, n, W, w->rows, w->cols, bs, st(b)));
        return;
    }
    scratch_grow(c, (void **)&c->xbf, &c->xbf_cap, sizeof(uint16_t) * (size_t)n * w->cols);
    LAUNCH_OK(cuda_gemm_bf16(c->blas, out, x, c->xbf, n, W, w->rows, w->cols, bs, st(b)));
}
/* q/k/v or gate/up at decode sizes: one tiled GEMV launch over all of them when
 * they share a format and qualify (gemv_tile.cuh), else one matmul each. */
static void cu_matmul_multi(Backend *b, float *const *outs, const float *x, int n, const WeightMat *const *ws,
                            const uint16_t *const *biases, int count) {
    GemvMulti m = {};
    int fmt = ws[0]->fmt == WF_BF16 ? 0 : ws[0]->fmt == WF_FP8 ? 1 : 2, ok = count <= GT_MAX_SEG && n <= CUDA_GEMV_MAX_N;
    for (int i = 0; ok && i < count; i++) {
        const WeightMat *w = ws[i];
        const uint16_t *bias = dw(b, biases[i]);
        ok = w->fmt == ws[0]->fmt;
        if (w->fmt == WF_BF16) {
            m.seg[i] = gemv_args(outs[i], x, dw(b, w->bf16), bias, w->rows, w->cols);
        } else if (w->fmt == WF_FP8) {
            const QuantFp8 *q = (const QuantFp8 *)w->q;
            m.seg[i] = gemv_args_fp8(outs[i], x, (const uint8_t *)dv(b, q->q), (const float *)dv(b, q->scale_inv),
                                     q->block_rows, q->block_cols, bias, w->rows, w->cols);
        } else {
            const QuantNvfp4 *q = (const QuantNvfp4 *)w->q;
            m.seg[i] = gemv_args_nvfp4(outs[i], x, (const uint8_t *)dv(b, q->packed), (const uint8_t *)dv(b, q->scale),
                                       q->scale2, bias, w->rows, w->cols);
        }
    }
    m.nseg = count;
    if (ok && cuda_gemv_multi(&m, n, fmt, st(b)) == 0) return;
    for (int i = 0; i < count; i++) cu_matmul(b, outs[i], x, n, ws[i], biases[i]);
}
static void cu_norm_rope(Backend *b, float *x, int n, int n_heads, int head_dim, const uint16_t *norm_w, float eps,
                         const float *cs, const float *sn) {
    LAUNCH_OK(cuda_norm_rope(x, n, n_heads, head_dim, dw(b, norm_w), eps, cs, sn, st(b)));
}
static void cu_attention(Backend *b, const AttnArgs *a) {
    CudaCtx *c = ctx(b);
    int splits = cuda_attention_splits(a->n_tokens, a->n_heads, a->n_kv_heads, c->max_ctx, c->sms);
    if (splits > 1)
        scratch_grow(c, (void **)&c->part, &c->part_cap,
                sizeof(float) * (size_t)splits * a->n_tokens * a->n_heads * (a->head_dim + 2));
    LAUNCH_OK(cuda_attention(a, c->part, splits, st(b)));
}
static void cu_swiglu(Backend *b, float *out, const float *g, const float *u, int n) {
    LAUNCH_OK(cuda_swiglu(out, g, u, (size_t)n, st(b)));
}
static void cu_add(Backend *b, float *x, const float *y, int n) { LAUNCH_OK(cuda_add(x, y, (size_t)n, st(b))); }
static void cu_kv_write(Backend *b, float *kc, float *vc, const float *k, const float *v, const int32_t *slots,
                        int n, int se) {
    LAUNCH_OK(cuda_kv_write(kc, vc, k, v, slots, n, se, st(b)));
}
static void cu_gather_rows(Backend *b, float *dst, const float *src, const int32_t *rows, int n, int dim) {
    LAUNCH_OK(cuda_gather_rows(dst, src, rows, n, dim, st(b)));
}
static void cu_scale_add_rows(Backend *b, float *dst, const float *src, const int32_t *rows, const float *w, int n,
                              int dim) {
    LAUNCH_OK(cuda_scale_add_rows(dst, src, rows, w, n, dim, st(b)));
}

/* Runner creation: the GEMM path's bf16 copy of x for up to max_tokens x max_cols. */
static void cu_reserve(Backend *b, int max_tokens, int max_cols) {
    CudaCtx *c = ctx(b);
    scratch_grow(c, (void **)&c->xbf, &c->xbf_cap, sizeof(uint16_t) * (size_t)max_tokens * max_cols);
}

static void cu_free(Backend *b) {
    CudaCtx *c = ctx(b);
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    for (size_t i = 0; i < c->cap; i++)
        if (c->map[i].host && c->map[i].owned) CUDA_CHECK(cudaFree(c->map[i].dev));
    free(c->map);
    free(c->qmats);
    void *bufs[] = {c->arena, c->xbf, c->part, c->blas_ws, c->sc_dev};
    free(c->sc_host);
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) CUDA_CHECK(cudaFree(bufs[i]));
    cublasDestroy(c->blas);
    CUDA_CHECK(cudaStreamDestroy(c->stream));
    free(c);
    free(b);
}

/* ---- graphs (forward.c captures pure decode steps) ----
 * Thread-local capture: another thread's CUDA call cannot invalidate it. A
 * failed capture or instantiation returns NULL and clears the error, so the
 * caller can run the ops eagerly instead. */
static int cu_graph_begin(Backend *b) {
    return cudaStreamBeginCapture(ctx(b)->stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess ? 0 : -1;
}
static void *cu_graph_end(Backend *b) {
    cudaGraph_t g = NULL;
    cudaGraphExec_t e = NULL;
    if (cudaStreamEndCapture(ctx(b)->stream, &g) != cudaSuccess || !g) {
        (void)cudaGetLastError();
        return NULL;
    }
    cudaError_t rc = cudaGraphInstantiate(&e, g, 0);
    CUDA_CHECK(cudaGraphDestroy(g));
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return (void *)e;
}
static void cu_graph_launch(Backend *b, void *g) {
    CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)g, ctx(b)->stream));
}
static void cu_graph_free(Backend *b, void *g) {
    CUDA_CHECK(cudaStreamSynchronize(ctx(b)->stream));
    CUDA_CHECK(cudaGraphExecDestroy((cudaGraphExec_t)g));
}

static Backend *cuda_backend_new(int head_dim, int max_ctx, int resident) {
    int n = 0;
    CHECK(cudaGetDeviceCount(&n) == cudaSuccess && n > 0, "no CUDA device: run sampler-cpu instead");
    CUDA_CHECK(cudaSetDevice(0));
    CudaCtx *c = (CudaCtx *)xcalloc(1, sizeof *c);
    c->resident = resident;
    c->max_ctx = max_ctx;
    CUDA_CHECK(cudaDeviceGetAttribute(&c->sms, cudaDevAttrMultiProcessorCount, 0));
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cublasCreate(&c->blas));
    CUDA_CHECK(cublasSetStream(c->blas, c->stream));
    /* A fixed workspace: cuBLAS then never allocates during a step. */
    CUDA_CHECK(cudaMalloc(&c->blas_ws, BLAS_WORKSPACE));
    CUDA_CHECK(cublasSetWorkspace(c->blas, c->blas_ws, BLAS_WORKSPACE));
    /* Worst-case split scratch (splits only when the batch is under 2 blocks per SM). */
    size_t rows = (size_t)2 * c->sms * CUDA_ATTN_GROUP;
    c->part_cap = sizeof(float) * 64 * rows * (size_t)(head_dim + 2);
    CUDA_CHECK(cudaMalloc((void **)&c->part, c->part_cap));
    Backend *b = (Backend *)xcalloc(1, sizeof *b);
    b->name = "cuda";
    b->ctx = c;
    b->host = 0;
    b->alloc = cu_alloc;
    b->release = cu_release;
    b->upload = cu_upload;
    b->download = cu_download;
    b->zero = cu_zero;
    b->copy = cu_copy;
    b->weights_changed = cu_weights_changed;
    b->embed = cu_embed;
    b->rmsnorm = cu_rmsnorm;
    b->add_rmsnorm = cu_add_rmsnorm;
    b->matmul = cu_matmul;
    b->matmul_multi = cu_matmul_multi;
    b->norm_rope = cu_norm_rope;
    b->attention = cu_attention;
    b->swiglu = cu_swiglu;
    b->add = cu_add;
    b->kv_write = cu_kv_write;
    b->gather_rows = cu_gather_rows;
    b->scale_add_rows = cu_scale_add_rows;
    b->reserve = cu_reserve;
    b->graph_begin = cu_graph_begin;
    b->graph_end = cu_graph_end;
    b->graph_launch = cu_graph_launch;
    b->graph_free = cu_graph_free;
    b->free = cu_free;
    return b;
}

/* ---- weights ---- */
typedef struct WeightList {
    const void **host;
    size_t *bytes;
    int n, cap;
} WeightList;

static void wl_add(WeightList *l, const void *h, size_t bytes) {
    if (!h) return;
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->host = (const void **)realloc(l->host, sizeof(void *) * (size_t)l->cap);
        l->bytes = (size_t *)realloc(l->bytes, sizeof(size_t) * (size_t)l->cap);
        CHECK(l->host && l->bytes, "out of host memory");
    }
    l->host[l->n] = h;
    l->bytes[l->n++] = bytes;
}

/* BF16: the matrix. FP8/NVFP4: the quantized bytes and scales only (the BF16
 * master stays on the host for deltas); the matrix is remembered for re-uploads. */
static void wl_mat(WeightList *l, CudaCtx *c, const WeightMat *w) {
    if (w->fmt == WF_BF16) {
        wl_add(l, w->bf16, sizeof(uint16_t) * (size_t)w->rows * w->cols);
        return;
    }
    if (w->fmt == WF_FP8) {
        const QuantFp8 *q = (const QuantFp8 *)w->q;
        wl_add(l, q->q, (size_t)q->rows * q->cols);
        wl_add(l, q->scale_inv, sizeof(float) * (size_t)q->scale_rows * q->scale_cols);
    } else {
        const QuantNvfp4 *q = (const QuantNvfp4 *)w->q;
        wl_add(l, q->packed, (size_t)q->rows * (q->cols / 2));
        wl_add(l, q->scale, (size_t)q->rows * (q->cols / QUANT_NVFP4_BLOCK));
    }
    if (c->n_qmats == c->cap_qmats) {
        c->cap_qmats = c->cap_qmats ? 2 * c->cap_qmats : 256;
        c->qmats = (const WeightMat **)realloc(c->qmats, sizeof(WeightMat *) * (size_t)c->cap_qmats);
        CHECK(c->qmats, "out of host memory");
    }
    c->qmats[c->n_qmats++] = w;
}

/* Every tensor forward.c hands to an op. */
static void collect_weights(WeightList *l, CudaCtx *cc, const Model *m) {
    const ModelConfig *c = &m->cfg;
    size_t H = (size_t)c->hidden * 2, hd = (size_t)c->head_dim * 2;
    wl_add(l, m->embed, (size_t)c->vocab * H);
    wl_add(l, m->final_norm, H);
    wl_mat(l, cc, &m->lm_head);
    for (int i = 0; i < c->n_layers; i++) {
        const LayerWeights *w = &m->layers[i];
        wl_add(l, w->attn_norm, H);
        wl_add(l, w->mlp_norm, H);
        const WeightMat *mats[] = {&w->q, &w->k, &w->v, &w->o, &w->gate, &w->up, &w->down, &w->router};
        for (size_t j = 0; j < sizeof mats / sizeof mats[0]; j++) wl_mat(l, cc, mats[j]);
        wl_add(l, w->q_bias, (size_t)w->q.rows * 2);
        wl_add(l, w->k_bias, (size_t)w->k.rows * 2);
        wl_add(l, w->v_bias, (size_t)w->v.rows * 2);
        wl_add(l, w->o_bias, (size_t)w->o.rows * 2);
        wl_add(l, w->q_norm, hd);
        wl_add(l, w->k_norm, hd);
        if (model_layer_is_moe(c, i))
            for (int e = 0; e < c->n_experts; e++) {
                wl_mat(l, cc, &w->egate[e]);
                wl_mat(l, cc, &w->eup[e]);
                wl_mat(l, cc, &w->edown[e]);
            }
    }
}

#define ARENA_ALIGN 256

extern "C" Backend *backend_cuda_create(Model *m, int max_ctx) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    Backend *b = cuda_backend_new(m->cfg.head_dim, max_ctx, 0);
    CudaCtx *c = ctx(b);
    WeightList l = {0};
    collect_weights(&l, c, m);
    /* Two passes: offsets in one arena (aliases such as a tied lm_head map once), then copies. */
    size_t total = 0;
    for (int i = 0; i < l.n; i++) {
        DevEntry *e = map_insert(c, l.host[i]);
        if (e->bytes) {
            CHECK(e->bytes == l.bytes[i], "weight %p listed with two sizes (%zu, %zu)", l.host[i], e->bytes,
                  l.bytes[i]);
            continue;
        }
        e->bytes = l.bytes[i];
        e->dev = (void *)(uintptr_t)total; /* offset for now */
        total += (l.bytes[i] + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    }
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    cudaError_t err = cudaMalloc(&c->arena, total ? total : 1);
    CHECK(err == cudaSuccess, "the model's %.2f GiB of weights do not fit in the %.2f GiB free on the GPU: "
          "%s\n  fix: use a GPU with more memory or a smaller model", total / 1073741824.0,
          free_b / 1073741824.0, cudaGetErrorString(err));
    for (size_t i = 0; i < c->cap; i++) {
        DevEntry *e = &c->map[i];
        if (!e->host) continue;
        e->dev = (char *)c->arena + (uintptr_t)e->dev;
        CUDA_CHECK(cudaMemcpyAsync(e->dev, e->host, e->bytes, cudaMemcpyHostToDevice, c->stream));
    }
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    free(l.host);
    free(l.bytes);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (c->n_qmats)
        log_info("cuda backend: %d %s matrices run the weight-only kernel (f32 activations, weights dequantized "
                 "in the GEMV)%s", c->n_qmats, precision_name(m->precision),
                 m->act_quant ? "; quantized activations (native FP8/NVFP4 tensor cores) are not implemented on "
                                "the GPU yet, so this model runs weight-only here, unlike the CPU backend" : "");
    log_info("cuda backend: %zu weight tensors, %.2f GiB copied to the device in %.2f s; %d SMs",
             c->used, total / 1073741824.0, (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9, c->sms);
    return b;
}

extern "C" Backend *backend_cuda_create_resident(const ModelConfig *cfg, int max_ctx) {
    return cuda_backend_new(cfg ? cfg->head_dim : CUDA_ATTN_MAX_HEAD_DIM, max_ctx, 1);
}

extern "C" int backend_cuda_register(Backend *b, const void *host, size_t bytes, Err *err) {
    CudaCtx *c = ctx(b);
    if (c->resident || !host) return ERR(err, 500, "backend_cuda_register: %s", c->resident ? "resident backend" : "no tensor");
    DevEntry *e = map_find(c, host);
    if (e && bytes > e->bytes)
        return ERR(err, 500, "backend_cuda_register: %zu bytes, the device copy has %zu", bytes, e->bytes);
    if (!e) {
        void *dev = NULL; /* allocated before the entry exists: a failure leaves the map as it was */
        CUDA_TRY(err, cudaMalloc(&dev, bytes ? bytes : 1));
        e = map_insert(c, host);
        e->bytes = bytes;
        e->owned = 1;
        e->dev = dev;
    }
    CUDA_TRY(err, cudaMemcpyAsync(e->dev, host, bytes, cudaMemcpyHostToDevice, c->stream));
    CUDA_TRY(err, cudaStreamSynchronize(c->stream));
    return 0;
}

extern "C" int backend_cuda_read_weight(Backend *b, const void *host, void *dst, size_t bytes) {
    CudaCtx *c = ctx(b);
    DevEntry *e = c->resident ? NULL : map_find(c, host);
    if (!e || bytes > e->bytes) return -1;
    CUDA_TRY(NULL, cudaMemcpyAsync(dst, e->dev, bytes, cudaMemcpyDeviceToHost, c->stream));
    CUDA_TRY(NULL, cudaStreamSynchronize(c->stream));
    return 0;
}
