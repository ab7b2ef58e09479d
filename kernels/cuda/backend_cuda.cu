/*
 * backend_cuda.cu - the CUDA backend: the op table of backend.h over device
 * memory, one stream on device 0, kernels of kernels/cuda/ and cuBLAS.
 *
 * Weights: at creation every tensor of the model's WeightSet (weights.h, the
 * weight registry's list) is copied once into one device arena and its dev
 * slots are set; ops read WeightMat.dev / dev_scale and are handed vectors as
 * device pointers, so nothing is looked up per op. Matmul
 * runs the GEMV kernel for up to CUDA_GEMV_MAX_N tokens (decode) and cuBLAS
 * beyond (prefill); a BF16 (2..8 tokens), FP8 or NVFP4 (1..8) matrix takes the
 * tensor-core GEMV (gemv_mma.cuh) from its WeightMat.mma_min_n on (measured per
 * shape at start-up through backend_cuda_gemv_time; 0: never; FP8 / NVFP4 read x
 * split into f16 pairs, which the norm before q/k/v and gate/up writes: norm_split).
 * FP8/NVFP4 weights: their quantized bytes and scales are
 * copied (not the BF16 master) and every n runs the weight-only kernels of
 * quant_gemv.cu below the matrix's crossover (WeightMat.native_min_n, measured
 * per shape at start-up through backend_cuda_native_time; CUDA_NATIVE_MIN_N
 * when unmeasured); act_quant matrices take the native tensor-core GEMMs of
 * lt_gemm.cu at and above it (routed FP8 experts, from their one crossover,
 * measured through backend_cuda_moe_time: moe_mma.cu's e4m3 grouped GEMM,
 * cu_moe_mlp) where the binary has
 * one for their layout and shape (native_matmul; cuda_native.h), weight-only
 * otherwise.
 * Deltas (weights_changed): BF16 tensors get a verified scatter of the touched
 * elements (scatter.cu), quantized matrices a re-upload of their bytes.
 * LoRA (cu_lora, lora.cu): adapters live in the runner's adapter pool
 * (forward.c, device memory reserved at start-up, uploaded with upload_try);
 * the op groups rows by adapter and launches the shrink and expand kernels.
 * Graphs (graph_*): stream capture of the ops forward.c issues for a decode
 * step, replayed per batch size. Nothing is allocated per step: the bf16
 * activation scratch of the GEMM path is sized by reserve (runner creation),
 * the attention split scratch at creation.
 * Errors inside ops are bugs (the forward pass validated the batch): fatal
 * (CUDA_CHECK). The update path (weights_changed, its scatter and read-back,
 * re-uploads, backend_cuda_read_weight) returns every CUDA error
 * (CUDA_TRY) so that delta_commit can restore the weights.
 * The native NVFP4 GEMM reads its weight scales in cuBLASLt's swizzled
 * layout: a second device copy of them (WeightMat.dev_scale_sw), swizzled
 * from the row-major one (what the delta path writes and verifies) at
 * creation and again after every delta of the matrix.
 * Sampling (sample_reserve / sample): the device sampler of sampling.cu on
 * the backend's stream.
 * SAMPLER_CUDA_OFF (cuda_off_apply, at creation): named kernels replaced by
 * the paths they replaced, for a kernel that misbehaves on a device.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_native.h"
#include "cuda_sampling.h"
extern "C" {
#include "check.h"
#include "log.h"
#include "quant.h"
#include "weights.h"
}
#include "gemv_tile.cuh"

#define LAUNCH_OK(call) CHECK((call) == 0, "bad shape in %s (a bug in the caller)", #call)

#define BLAS_WORKSPACE (32u << 20)

#define UP_SEGS 8                       /* cu_upload's ring: segments of */
#define UP_SEG_BYTES ((size_t)1 << 20)  /* pinned host bytes each */
#define RW_CHUNK ((size_t)4 << 20) /* cu_rewrite's read-back chunk (pinned, CudaCtx.rw_pin) */

typedef struct CudaCtx {
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;
    int resident, sms, max_ctx;
    void *arena;       /* weights copied at creation */
    uint16_t *xbf;     /* [xbf_cap] bf16 GEMM activations */
    size_t xbf_cap;
    void *xsplit;      /* [xsplit_cap] the tensor-core FP8 / NVFP4 GEMV's split of x (cuda_gemv_mma_scratch) */
    size_t xsplit_cap;
    const float *xs_of; /* xsplit holds the split of xs_of [xs_n, xs_cols] f32 (a norm wrote both), or NULL */
    int xs_n, xs_cols;
    int presplit_min_n; /* norms at presplit_min_n..CUDA_GEMV_MAX_N tokens also write xsplit (0: never;
                         * backend_cuda_gemv_presplit) */
    float *part;       /* attention split scratch */
    size_t part_cap;   /* bytes */
    void *sc_dev;      /* delta scatter staging: idx int64 [n], values [n * elem], read-back [n * elem] */
    size_t sc_dev_cap;
    uint64_t q_sparse, q_full; /* quantized matrices' delta updates by path (backend_cuda_update_counts) */
    uint8_t *rw_pin;   /* [RW_CHUNK] pinned: cu_rewrite's read-back lands here by DMA (from pageable memory
                        * the driver stages it through its own buffer, at a fraction of the bandwidth) */
    uint8_t *sc_host;  /* scatter: [max(2 n elem, 8 n)] values sent, values read back (first the indices read
                        * back); quant_update_sparse: the device's scales read back */
    size_t sc_host_cap;
    /* native FP8 / NVFP4 (cuda_native.h), sized by cu_reserve / at creation */
    CudaLt *lt;
    uint8_t *nq;       /* [n, cols] e4m3 or [n, cols / 2] e2m1 activations */
    size_t nq_cap;
    float *ns;         /* FP8 scales [groups, n] or NVFP4 global scales [n] */
    size_t ns_cap;
    uint8_t *nsf;      /* NVFP4 activation block scales, swizzled */
    size_t nsf_cap;
    uint8_t *wsf;      /* NVFP4 weight block scales, swizzled per call (a matrix without dev_scale_sw) */
    size_t wsf_cap;
    void *sw_arena;    /* the native NVFP4 matrices' dev_scale_sw, one allocation (at creation) */
    int native_warned; /* a refused native GEMM was logged */
    /* SAMPLER_CUDA_OFF: take the paths these kernels replaced */
    int off_attn_mma, off_attn_dec_mma, off_moe_mma, off_gemv_mma, off_swiglu, off_moe_unpermute, off_router_route,
        off_add_norm;
    uint32_t *route_done; /* [1] uint32, 0 between launches: the router GEMV's blocks done (cu_moe_router_route) */
    uint32_t *norm_done;  /* [1] uint32, 0 between launches: the residual projection's blocks done
                           * (cu_matmul_add_rmsnorm) */
    uint32_t *moe_done; /* [moe_done_cap / 4] uint32, all 0 between launches: the row tiles' done counts of the
                         * routed experts' down GEMV with the unpermute epilogue (sized by cu_reserve) */
    size_t moe_done_cap;
    int moe_force;     /* backend_cuda_moe_time: 0 the experts' record, 1 weight-only, 2 native FP8 */
    int moe_mma_force; /* backend_cuda_moe_gemv_time: 0 the experts' record, 1 the grouped GEMV, 2 the grouped
                        * mma, at up to CUDA_GEMV_MAX_N tokens */
    /* LoRA (cu_lora; sized by cu_lora_reserve): */
    int lora_tokens, lora_rank; /* rows and rank reserved (0: no LoRA) */
    float *lora_h;              /* [lora_tokens, lora_rank] f32 device: the shrink's output */
    int32_t *lora_rows_d;       /* [lora_tokens] device: rows grouped by segment */
    int32_t *lora_rows;         /* [lora_tokens] host: this call's grouping */
    int32_t *lora_rows_up;      /* [lora_tokens] host: what lora_rows_d holds (lora_rows_up_n of them) */
    int lora_rows_up_n;
    uint8_t *lora_taken;        /* [lora_tokens] host */
    CudaSampler *sampler; /* device sampling scratch (sample_reserve), or NULL */
    /* cu_upload's staging ring: UP_SEGS segments of UP_SEG_BYTES pinned host bytes; up_seg is
     * being filled up to up_off; up_ev[s] marks the copies out of segment s, pending until waited */
    uint8_t *up;                /* [UP_SEGS * UP_SEG_BYTES] pinned host */
    cudaEvent_t up_ev[UP_SEGS];
    unsigned char up_pending[UP_SEGS];
    int up_seg;
    size_t up_off;
} CudaCtx;

static CudaCtx *ctx(Backend *b) { return (CudaCtx *)b->ctx; }
static void *st(Backend *b) { return (void *)ctx(b)->stream; }

/* ---- the norm's split of x (rmsnorm.cu) ----
 * An FP8 / NVFP4 matrix on the tensor-core GEMV reads x as f16 hi + lo pairs that its launch
 * writes into c->xsplit first (one small launch). Before q/k/v and gate/up, x is a norm's output,
 * so the norm writes them instead (norm_split) and records which buffer they are the split of
 * (xs_of, xs_n, xs_cols); a GEMV over that x skips its split (xs_ready). The record is true only
 * while neither xsplit nor that buffer changed, so it is dropped (xs_clear) by a GEMV that splits
 * into xsplit itself, by a matmul whose output overlaps the buffer (xs_wrote), and at the top of
 * every other op that writes device memory, graph launches and boundaries included. Every write
 * goes through these ops: nothing else writes a backend buffer (Backend contract, backend.h). */
static void xs_clear(CudaCtx *c) { c->xs_of = NULL; }
static void xs_set(CudaCtx *c, const float *x, int n, int cols) {
    c->xs_of = x;
    c->xs_n = n;
    c->xs_cols = cols;
}
static int xs_ready(const CudaCtx *c, const float *x, int n, int cols) {
    return c->xs_of && x == c->xs_of && n == c->xs_n && cols == c->xs_cols;
}
static void xs_wrote(CudaCtx *c, const float *out, size_t count) {
    if (c->xs_of && out < c->xs_of + (size_t)c->xs_n * c->xs_cols && c->xs_of < out + count) xs_clear(c);
}
/* The split scratch a norm of out [n, dim] writes beside it, or NULL (and the record dropped). */
static void *norm_split(CudaCtx *c, const float *out, int n, int dim) {
    xs_clear(c);
    if (c->off_gemv_mma || c->presplit_min_n < 1 || n < c->presplit_min_n || n > CUDA_GEMV_MAX_N || dim % 2 ||
        !c->xsplit || cuda_gemv_mma_scratch(n, dim) > c->xsplit_cap)
        return NULL;
    xs_set(c, out, n, dim);
    return c->xsplit;
}

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
    xs_clear(ctx(b));
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    CHECK(e == cudaSuccess, "cudaMalloc of %zu MiB failed: %s\n  fix: lower --max-tokens, the KV cache size or "
          "the context length", bytes >> 20, cudaGetErrorString(e));
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, ctx(b)->stream)); /* ordered before any op on it */
    return p;
}
static void cu_release(Backend *b, void *p) {
    xs_clear(ctx(b));
    CUDA_CHECK(cudaStreamSynchronize(ctx(b)->stream));
    CUDA_CHECK(cudaFree(p));
}
/* Uploads. A copy from pageable memory may return only once the stream
 * reaches it (the driver stages it through its own pinned buffer in chunks),
 * which would stall an async-scheduled host behind the step in flight. So a
 * copy of at most UP_SEG_BYTES (every per-step input: tokens, positions,
 * slots, block tables, output rows) is memcpy'd into a pinned ring and copied
 * from there: the call returns at once and the caller may reuse src. The
 * ring is UP_SEGS segments; moving into a segment waits for the event that
 * closed it UP_SEGS - 1 segments ago (its copies done), which under one step
 * in flight is long complete. Larger copies (weights at load) go pageable.
 * Not inside a capture: forward.c uploads before its graphs. */
static void cu_upload(Backend *b, void *dst, const void *src, size_t n) {
    CudaCtx *c = ctx(b);
    xs_clear(c);
    if (!n) return;
    if (!c->up || n > UP_SEG_BYTES) {
        CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, c->stream));
        return;
    }
    if (c->up_off + n > UP_SEG_BYTES) { /* close this segment, open the next once its last copies ran */
        CUDA_CHECK(cudaEventRecord(c->up_ev[c->up_seg], c->stream));
        c->up_pending[c->up_seg] = 1;
        c->up_seg = (c->up_seg + 1) % UP_SEGS;
        if (c->up_pending[c->up_seg]) {
            CUDA_CHECK(cudaEventSynchronize(c->up_ev[c->up_seg]));
            c->up_pending[c->up_seg] = 0;
        }
        c->up_off = 0;
    }
    uint8_t *h = c->up + (size_t)c->up_seg * UP_SEG_BYTES + c->up_off;
    memcpy(h, src, n);
    CUDA_CHECK(cudaMemcpyAsync(dst, h, n, cudaMemcpyHostToDevice, c->stream));
    c->up_off += (n + 255) / 256 * 256;
}
static void cu_download(Backend *b, void *dst, const void *src, size_t n) {
    if (n) CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, ctx(b)->stream));
    CUDA_CHECK(cudaStreamSynchronize(ctx(b)->stream));
}
/* Pinned host memory (Backend.host_alloc): a download into it is a DMA the
 * host need not wait for (into pageable memory cudaMemcpyAsync returns only
 * once the copy is done). */
static void *cu_host_alloc(Backend *b, size_t n) {
    (void)b;
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, n ? n : 1);
    CHECK(e == cudaSuccess, "cudaMallocHost of %zu MiB failed: %s\n  fix: lower --max-num-batched-tokens", n >> 20,
          cudaGetErrorString(e));
    memset(p, 0, n);
    return p;
}
static void cu_host_release(Backend *b, void *p) {
    CUDA_CHECK(cudaStreamSynchronize(ctx(b)->stream)); /* no copy into it is still queued */
    CUDA_CHECK(cudaFreeHost(p));
}
static void cu_download_async(Backend *b, void *dst, const void *src, size_t n) {
    if (n) CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, ctx(b)->stream));
}
static void cu_zero(Backend *b, void *p, size_t n) {
    xs_clear(ctx(b));
    if (n) CUDA_CHECK(cudaMemsetAsync(p, 0, n, ctx(b)->stream));
}
/* The device parts of a matrix: what the kernels read, its scales (FP8/NVFP4)
 * and NVFP4's tensor scale. host[i] -> dev[i] of bytes[i]; returns the number
 * of parts (1 to MAT_PARTS). */
#define MAT_PARTS 3
static int mat_parts(WeightMat *w, const void **host, void ***dev, size_t *bytes) {
    dev[0] = &w->dev;
    dev[1] = &w->dev_scale;
    dev[2] = &w->dev_s2;
    if (w->fmt == WF_BF16) {
        host[0] = w->bf16;
        bytes[0] = sizeof(uint16_t) * (size_t)w->rows * w->cols;
        return 1;
    }
    if (w->fmt == WF_FP8) {
        const QuantFp8 *q = (const QuantFp8 *)w->q;
        host[0] = q->q;
        bytes[0] = (size_t)q->rows * q->cols;
        host[1] = q->scale_inv;
        bytes[1] = sizeof(float) * (size_t)q->scale_rows * q->scale_cols;
        return 2;
    }
    const QuantNvfp4 *q = (const QuantNvfp4 *)w->q;
    host[0] = q->packed;
    bytes[0] = (size_t)q->rows * (q->cols / 2);
    host[1] = q->scale;
    bytes[1] = (size_t)q->rows * (q->cols / QUANT_NVFP4_BLOCK);
    host[2] = &q->scale2;
    bytes[2] = sizeof(float);
    return 3;
}

/* Rewrite a device copy from the host (delta path: returns <0 with err, never fatal). */
/* The host staging of the delta paths (sc_host, bytes), grown here only. */
static int sc_host_grow(CudaCtx *c, size_t bytes, Err *err) {
    if (c->sc_host_cap >= bytes) return 0;
    free(c->sc_host);
    c->sc_host = (uint8_t *)malloc(bytes);
    c->sc_host_cap = c->sc_host ? bytes : 0;
    return c->sc_host ? 0 : ERR(err, 500, "out of host memory for %zu bytes of delta staging", bytes);
}

/* A device copy rewritten from the host (a dense delta, a re-quantized
 * matrix's parts), read back in chunks of at most RW_CHUNK and compared byte
 * for byte with what was sent: a copy that did not land as sent fails the
 * update (the commit restores), as the scatter's read-back does. */
static int cu_rewrite(CudaCtx *c, void *dev, const void *host, size_t bytes, Err *err) {
    CUDA_TRY(err, cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, c->stream));
    size_t chunk = bytes < RW_CHUNK ? bytes : RW_CHUNK;
    for (size_t off = 0; off < bytes; off += chunk) {
        size_t n = bytes - off < chunk ? bytes - off : chunk;
        CUDA_TRY(err, cudaMemcpyAsync(c->rw_pin, (const uint8_t *)dev + off, n, cudaMemcpyDeviceToHost, c->stream));
        CUDA_TRY(err, cudaStreamSynchronize(c->stream));
        if (memcmp(c->rw_pin, (const uint8_t *)host + off, n))
            return ERR(err, 500, "the device copy read back after rewriting %zu bytes differs from them (at byte %zu "
                       "onwards)", bytes, off);
    }
    return 0;
}

/* Sparse delta on a registered device copy: upload (idx, values), read the
 * indices back (a wrong index would scatter, and gather back, elsewhere:
 * unseen by the values' check), scatter, gather the touched elements back and
 * compare them with what was sent (the verified copy back). Staging grows on
 * this path only (deltas, never a step). */
static int cu_scatter_verified(Backend *b, void *dev, size_t dev_bytes, const void *host, const int64_t *idx, int64_t n,
                               int elem, Err *err) {
    CudaCtx *c = ctx(b);
    size_t vb = (size_t)n * elem, ib = sizeof(int64_t) * (size_t)n, need = ib + 2 * vb;
    int rc = scratch_grow_try(c, &c->sc_dev, &c->sc_dev_cap, need, err);
    if (rc) return rc;
    if ((rc = sc_host_grow(c, 2 * vb > ib ? 2 * vb : ib, err))) return rc;
    const uint8_t *h = (const uint8_t *)host;
    uint8_t *vals = c->sc_host, *back = c->sc_host + vb;
    int64_t *didx = (int64_t *)c->sc_dev;
    uint8_t *dval = (uint8_t *)c->sc_dev + sizeof(int64_t) * (size_t)n, *dback = dval + vb;
    int64_t numel = (int64_t)(dev_bytes / (size_t)elem);
    CUDA_TRY(err, cudaMemcpyAsync(didx, idx, sizeof(int64_t) * (size_t)n, cudaMemcpyHostToDevice, c->stream));
    CUDA_TRY(err, cudaMemcpyAsync(c->sc_host, didx, ib, cudaMemcpyDeviceToHost, c->stream));
    CUDA_TRY(err, cudaStreamSynchronize(c->stream));
    if (memcmp(c->sc_host, idx, ib))
        return ERR(err, 500, "the indices of a %lld-element delta scatter read back from the device differ from "
                   "those sent; nothing was scattered", (long long)n);
    for (int64_t i = 0; i < n; i++) memcpy(vals + (size_t)i * elem, h + (size_t)idx[i] * elem, (size_t)elem);
    CUDA_TRY(err, cudaMemcpyAsync(dval, vals, vb, cudaMemcpyHostToDevice, c->stream));
    if ((rc = cuda_scatter(dev, numel, didx, dval, n, elem, st(b), err))) return rc;
    if ((rc = cuda_gather(dback, dev, numel, didx, n, elem, st(b), err))) return rc;
    CUDA_TRY(err, cudaMemcpyAsync(back, dback, vb, cudaMemcpyDeviceToHost, c->stream));
    CUDA_TRY(err, cudaStreamSynchronize(c->stream));
    if (memcmp(vals, back, vb))
        return ERR(err, 500, "the device copy read back after a scatter of %lld elements differs from the values sent",
                   (long long)n);
    return 0;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* idx [n] ascending (delta commit's order; duplicates allowed) -> out [<= n]
 * ascending distinct idx[i] / div * mul + add. */
static int64_t map_unique(const int64_t *idx, int64_t n, int64_t div, int64_t mul, int64_t add, int64_t *out) {
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t v = idx[i] / div * mul + add;
        if (!m || out[m - 1] != v) out[m++] = v;
    }
    return m;
}

/* A re-quantized matrix's device copy from the bytes that changed, when few
 * did (admin_touched re-quantized the host copy in place; idx: the touched
 * elements, ascending; the device copy held the host's bytes before it):
 *   FP8: the device's scales are read back; a block whose scale moved may
 *   have every byte changed, a block whose scale stands only its touched
 *   elements (quant_fp8_requant); so the scales are rewritten (verified) and
 *   the bytes of the touched elements and of the moved blocks scattered
 *   (verified);
 *   NVFP4: the device's tensor scale is read back; when it moved every byte
 *   may have (the amax changed: QUANT_REQUANT_FULL), else only the touched
 *   16-element blocks did: their 8 packed bytes (2 words) and scale byte are
 *   scattered (verified).
 * Returns 0, <0 with err, or 1: too many changed (more than a quarter of the
 * bytes' worth of scatter), rewrite it whole. */
static int quant_update_sparse(Backend *b, WeightMat *w, const int64_t *idx, int64_t n, Err *err) {
    CudaCtx *c = ctx(b);
    int64_t numel = (int64_t)w->rows * w->cols;
    if (n <= 0 || (uint64_t)n * 9 > (uint64_t)numel / 4) return 1;
    int rc;
    if (w->fmt == WF_FP8) {
        const QuantFp8 *q = (const QuantFp8 *)w->q;
        int64_t ns = (int64_t)q->scale_rows * q->scale_cols, moved = 0;
        size_t sb = sizeof(float) * (size_t)ns;
        if ((rc = sc_host_grow(c, sb, err))) return rc;
        CUDA_TRY(err, cudaMemcpyAsync(c->sc_host, w->dev_scale, sb, cudaMemcpyDeviceToHost, c->stream));
        CUDA_TRY(err, cudaStreamSynchronize(c->stream));
        const float *old = (const float *)c->sc_host;
        for (int64_t s = 0; s < ns; s++) moved += memcmp(&old[s], &q->scale_inv[s], sizeof(float)) != 0;
        int64_t per = (int64_t)q->block_rows * q->block_cols, total = n + moved * per;
        if ((uint64_t)total * 9 > (uint64_t)numel / 4) return 1;
        if (!moved) { /* the usual step: the touched elements' bytes only, idx as it came */
            rc = cu_rewrite(c, w->dev_scale, q->scale_inv, sb, err);
            return rc ? rc : cu_scatter_verified(b, w->dev, (size_t)numel, q->q, idx, n, 1, err);
        }
        int64_t *all = (int64_t *)malloc(sizeof(int64_t) * (size_t)total);
        if (!all) return ERR(err, 500, "out of host memory for a %lld-index update", (long long)total);
        int64_t m = 0;
        for (int64_t s = 0; s < ns; s++) { /* old is sc_host: read before cu_rewrite reuses it */
            if (!memcmp(&old[s], &q->scale_inv[s], sizeof(float))) continue;
            int r0 = (int)(s / q->scale_cols) * q->block_rows, c0 = (int)(s % q->scale_cols) * q->block_cols;
            for (int r = r0; r < r0 + q->block_rows && r < w->rows; r++)
                for (int cc = c0; cc < c0 + q->block_cols && cc < w->cols; cc++) all[m++] = (int64_t)r * w->cols + cc;
        }
        for (int64_t i = 0; i < n; i++) all[m++] = idx[i];
        qsort(all, (size_t)m, sizeof *all, cmp_i64);
        m = map_unique(all, m, 1, 1, 0, all);
        rc = cu_rewrite(c, w->dev_scale, q->scale_inv, sb, err);
        if (!rc) rc = cu_scatter_verified(b, w->dev, (size_t)numel, q->q, all, m, 1, err);
        free(all);
        return rc;
    }
    const QuantNvfp4 *q = (const QuantNvfp4 *)w->q;
    float s2 = 0;
    CUDA_TRY(err, cudaMemcpyAsync(&s2, w->dev_s2, sizeof s2, cudaMemcpyDeviceToHost, c->stream));
    CUDA_TRY(err, cudaStreamSynchronize(c->stream));
    if (memcmp(&s2, &q->scale2, sizeof s2)) return 1; /* the amax moved: every byte may have */
    int64_t *blk = (int64_t *)malloc(sizeof(int64_t) * 3 * (size_t)n); /* nb <= n blocks, then 2 nb words */
    if (!blk) return ERR(err, 500, "out of host memory for a %lld-index update", (long long)n);
    int64_t nb = map_unique(idx, n, QUANT_NVFP4_BLOCK, 1, 0, blk), nw = 0; /* 16-blocks: their scale bytes */
    int64_t *words = blk + nb;                                             /* then their packed words */
    for (int64_t i = 0; i < nb; i++) {
        words[nw++] = blk[i] * 2;
        words[nw++] = blk[i] * 2 + 1;
    }
    rc = cu_scatter_verified(b, w->dev_scale, (size_t)numel / QUANT_NVFP4_BLOCK, q->scale, blk, nb, 1, err);
    if (!rc) rc = cu_scatter_verified(b, w->dev, (size_t)numel / 2, q->packed, words, nw, 4, err);
    free(blk);
    return rc;
}

/* A BF16 tensor: scatter the touched elements when that moves well under the
 * tensor's bytes, else re-upload it. A quantized matrix's BF16 master is not on
 * the device: the host re-quantized it (admin_touched), so the bytes that
 * changed are scattered (quant_update_sparse) or, when many did or no indices
 * came, its quantized buffers re-uploaded. Returns 0, or <0 with err filled
 * (the caller restores the host weights and calls again, which rewrites the
 * device copy from them). */
static int weights_changed_once(Backend *b, const WeightTensor *t, const int64_t *idx, int64_t n_idx, int elem,
                                Err *err) {
    CudaCtx *c = ctx(b);
    if (c->resident) return ERR(err, 500, "deltas are not supported on a resident backend (benchmarks)");
    if (t->mat && !t->vec && t->mat->fmt != WF_BF16) {
        if (idx && elem == 2 && t->mat->dev && t->mat->dev_scale && (t->mat->fmt != WF_NVFP4 || t->mat->dev_s2)) {
            int rc = quant_update_sparse(b, t->mat, idx, n_idx, err);
            if (rc <= 0) {
                c->q_sparse += rc == 0;
                return rc;
            }
        }
        c->q_full++;
        const void *host[MAT_PARTS];
        void **dev[MAT_PARTS];
        size_t bytes[MAT_PARTS];
        int np = mat_parts(t->mat, host, dev, bytes);
        /* scales first (NVFP4's tensor scale, then the block scales): after a failure part way, the
         * bytes differ from the host's only where a scale differs too, or at touched elements, which
         * is what the restore's quant_update_sparse rewrites */
        for (int i = np - 1; i >= 0; i--) {
            if (!*dev[i]) return ERR(err, 500, "'%s' has no device copy", t->name);
            int rc = cu_rewrite(c, *dev[i], host[i], bytes[i], err);
            if (rc) return rc;
        }
        return 0;
    }
    const void *host = t->vec ? (const void *)t->vec->host : (const void *)t->mat->bf16;
    void *dev = t->vec ? (void *)t->vec->dev : t->mat->dev;
    size_t bytes = sizeof(uint16_t) * (size_t)t->numel;
    if (!dev || !host) return ERR(err, 500, "'%s' has no device copy", t->name);
    if (idx && n_idx > 0 && (elem == 1 || elem == 2 || elem == 4) &&
        (size_t)n_idx * (sizeof(int64_t) + 2 * (size_t)elem) < bytes / 4)
        return cu_scatter_verified(b, dev, bytes, host, idx, n_idx, elem, err);
    return cu_rewrite(c, dev, host, bytes, err);
}
/* The update, then a native NVFP4 matrix's swizzled scales made again from its device scales, whatever
 * the update did (after a failure part way they mirror what the device holds, and the restore's own
 * call refreshes them again): the first error is returned. */
static int cu_weights_changed(Backend *b, const WeightTensor *t, const int64_t *idx, int64_t n_idx, int elem,
                              Err *err) {
    xs_clear(ctx(b));
    int rc = weights_changed_once(b, t, idx, n_idx, elem, err);
    WeightMat *w = t->vec ? NULL : t->mat;
    if (!w || !w->dev_scale_sw) return rc;
    Err e2 = {0};
    CudaCtx *c = ctx(b);
    int r2 = cuda_nvfp4_swizzle_try((uint8_t *)w->dev_scale_sw, (const uint8_t *)w->dev_scale, w->rows, w->cols,
                                    c->stream, &e2);
    if (!r2 && cudaStreamSynchronize(c->stream) != cudaSuccess)
        r2 = ERR(&e2, 500, "'%s': swizzling the NVFP4 scales: %s", t->name, cudaGetErrorString(cudaGetLastError()));
    if (r2 && !rc) {
        *err = e2;
        return r2;
    }
    return rc;
}
static void cu_copy(Backend *b, void *dst, const void *src, size_t n) {
    xs_clear(ctx(b));
    if (n) CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, ctx(b)->stream));
}

/* ---- ops ---- */
static void cu_embed(Backend *b, float *x, const uint16_t *emb, const int32_t *tokens, int n, int dim) {
    xs_clear(ctx(b));
    LAUNCH_OK(cuda_embed(x, emb, tokens, n, dim, st(b)));
}
static void cu_rmsnorm(Backend *b, float *out, const float *x, const uint16_t *w, int n, int dim, float eps) {
    LAUNCH_OK(cuda_rmsnorm(out, x, w, n, dim, eps, norm_split(ctx(b), out, n, dim), st(b)));
}
static void cu_add_rmsnorm(Backend *b, float *out, float *x, const float *y, const uint16_t *w, int n, int dim,
                           float eps) {
    LAUNCH_OK(cuda_add_rmsnorm(out, x, y, w, n, dim, eps, norm_split(ctx(b), out, n, dim), st(b)));
}
/* The native GEMM an act_quant matrix qualifies for in this binary (its
 * layout, its shape), or 0: FP8 128x128 -> CUDA_NATIVE_FP8_BLOCK (cols % 512,
 * rows % 16), FP8 per channel -> CUDA_NATIVE_FP8_ROWWISE (rows, cols % 16),
 * NVFP4 -> CUDA_NATIVE_NVFP4 (rows % 16, cols % 32). */
extern "C" int backend_cuda_native_kind(const WeightMat *w) {
    if (w->fmt == WF_BF16 || !w->act_quant || w->rows % 16) return 0;
    int caps = cuda_native_caps();
    if (w->fmt == WF_FP8) {
        const QuantFp8 *q = (const QuantFp8 *)w->q;
        if (q->block_rows == 128 && q->block_cols == 128 && w->cols % 512 == 0) return caps & CUDA_NATIVE_FP8_BLOCK;
        if (q->block_rows == 1 && q->block_cols >= w->cols && w->cols % 16 == 0) return caps & CUDA_NATIVE_FP8_ROWWISE;
        return 0;
    }
    return w->cols % 32 == 0 ? caps & CUDA_NATIVE_NVFP4 : 0;
}

/* Quantize x on the device and run the tensor-core GEMM (cuda_native.h); -1
 * when the matrix has no native path here or cuBLASLt refused the shape (then
 * the caller runs the weight-only kernel, and the first refusal is logged). */
static int native_matmul(Backend *b, float *out, const float *x, int n, const WeightMat *w, const uint16_t *bias) {
    CudaCtx *c = ctx(b);
    int kind = backend_cuda_native_kind(w), rows = w->rows, cols = w->cols, rc;
    if (!kind || n > 65535) return -1; /* the FP8 quantizer's grid holds up to 65535 tokens */
    if (kind != CUDA_NATIVE_NVFP4) {
        int group = kind == CUDA_NATIVE_FP8_BLOCK ? QUANT_FP8_GROUP : cols;
        scratch_grow(c, (void **)&c->nq, &c->nq_cap, (size_t)n * cols);
        scratch_grow(c, (void **)&c->ns, &c->ns_cap, sizeof(float) * (size_t)n * ((cols + group - 1) / group));
        LAUNCH_OK(cuda_quant_act_fp8(c->nq, c->ns, x, n, cols, group, st(b)));
        const uint8_t *W = (const uint8_t *)w->dev;
        const float *S = (const float *)w->dev_scale;
        rc = kind == CUDA_NATIVE_FP8_BLOCK
                 ? cuda_gemm_fp8_block(c->lt, out, c->nq, c->ns, n, W, S, rows, cols, bias, st(b))
                 : cuda_gemm_fp8_rowwise(c->lt, out, c->nq, c->ns, n, W, S, rows, cols, bias, st(b));
    } else {
        const QuantNvfp4 *q = (const QuantNvfp4 *)w->q;
        scratch_grow(c, (void **)&c->nq, &c->nq_cap, (size_t)n * cols / 2);
        scratch_grow(c, (void **)&c->ns, &c->ns_cap, sizeof(float) * (size_t)n);
        scratch_grow(c, (void **)&c->nsf, &c->nsf_cap, cuda_nvfp4_sf_bytes(n, cols));
        const uint8_t *wsf = (const uint8_t *)w->dev_scale_sw;
        if (!wsf) { /* a matrix uploaded outside backend_cuda_create (the op checks): swizzled per call */
            scratch_grow(c, (void **)&c->wsf, &c->wsf_cap, cuda_nvfp4_sf_bytes(rows, cols));
            LAUNCH_OK(cuda_nvfp4_swizzle(c->wsf, (const uint8_t *)w->dev_scale, rows, cols, st(b)));
            wsf = c->wsf;
        }
        LAUNCH_OK(cuda_quant_act_nvfp4(c->nq, c->nsf, c->ns, x, n, cols, q->input_scale, 1, st(b)));
        rc = cuda_gemm_nvfp4(c->lt, out, c->nq, c->nsf, c->ns, n, (const uint8_t *)w->dev, wsf,
                             (const float *)w->dev_s2, rows, cols, bias, st(b));
    }
    if (rc && !c->native_warned) {
        c->native_warned = 1;
        log_warn("cuda backend: cuBLASLt found no algorithm for a native %s GEMM [%d x %d] at %d tokens; such "
                 "calls run the weight-only kernel (f32 activations)", w->fmt == WF_FP8 ? "fp8" : "nvfp4", rows, cols, n);
    }
    return rc ? -1 : 0;
}

/* The per-shape choice: an act_quant matrix takes the native GEMM from its crossover on
 * (WeightMat.native_min_n, measured at start-up; 0: CUDA_NATIVE_MIN_N). */
static int native_from(const WeightMat *w, int n) {
    return n >= (w->native_min_n > 0 ? w->native_min_n : CUDA_NATIVE_MIN_N);
}
static int native_at(const WeightMat *w, int n) { return w->fmt != WF_BF16 && w->act_quant && native_from(w, n); }
/* A BF16 (2..8 tokens), FP8 or NVFP4 (1..8) matrix at n decode tokens takes the tensor-core GEMV
 * (gemv_mma.cuh) from its measured WeightMat.mma_min_n on (0: never; SAMPLER_CUDA_OFF=gemv_mma:
 * never). FP8 / NVFP4 split x into c->xsplit (reserved for CUDA_GEMV_MAX_N tokens of the widest
 * matrix). */
static int mma_at(const CudaCtx *c, const WeightMat *w, int n) {
    if (c->off_gemv_mma || w->mma_min_n < 1 || n < w->mma_min_n || n > CUDA_GEMV_MAX_N) return 0;
    if (w->fmt == WF_FP8 || w->fmt == WF_NVFP4)
        return c->xsplit && cuda_gemv_mma_scratch(n, w->cols) <= c->xsplit_cap;
    return w->fmt == WF_BF16 && n >= 2;
}
/* An FP8 / NVFP4 matrix's decode GEMV: the tiled one (mma 0, f32 x) or the tensor-core one (mma 1, x split
 * into c->xsplit first unless ready; -1 for a shape it does not take). Shared by plain_matmul and the
 * start-up timer (gemv_run), so both run the same launch. */
static int quant_gemv(Backend *b, float *out, const float *x, int n, const WeightMat *w, const uint16_t *bias,
                      int mma, int ready) {
    CudaCtx *c = ctx(b);
    const uint8_t *W8 = (const uint8_t *)w->dev;
    if (w->fmt == WF_FP8) {
        const QuantFp8 *q = (const QuantFp8 *)w->q;
        const float *S = (const float *)w->dev_scale;
        return mma ? cuda_gemv_fp8_mma(out, x, n, W8, S, w->rows, w->cols, q->block_rows, q->block_cols, bias,
                                       c->xsplit, ready, st(b))
                   : cuda_gemv_fp8(out, x, n, W8, S, w->rows, w->cols, q->block_rows, q->block_cols, bias, st(b));
    }
    const uint8_t *SF = (const uint8_t *)w->dev_scale;
    const float *s2 = (const float *)w->dev_s2;
    return mma ? cuda_gemv_nvfp4_mma(out, x, n, W8, SF, s2, w->rows, w->cols, bias, c->xsplit, ready, st(b))
               : cuda_gemv_nvfp4(out, x, n, W8, SF, s2, w->rows, w->cols, bias, st(b));
}
/* Everything but the native GEMM: the weight-only GEMVs of FP8 / NVFP4 (f32 x), BF16's GEMV or cuBLAS. */
static void plain_matmul(Backend *b, float *out, const float *x, int n, const WeightMat *w, const uint16_t *bias) {
    CudaCtx *c = ctx(b);
    if (w->fmt == WF_FP8 || w->fmt == WF_NVFP4) { /* weight-only, also when w->act_quant (see the top of the file) */
        int ready = xs_ready(c, x, n, w->cols);
        if (mma_at(c, w, n) && quant_gemv(b, out, x, n, w, bias, 1, ready) == 0) { /* -1: a shape it does not take */
            if (!ready) xs_clear(c); /* it split x into xsplit */
            return;
        }
        LAUNCH_OK(quant_gemv(b, out, x, n, w, bias, 0, 0));
        return;
    }
    const uint16_t *W = (const uint16_t *)w->dev, *bs = bias;
    if (n <= CUDA_GEMV_MAX_N) {
        if (!(mma_at(c, w, n) && cuda_gemv_bf16_mma(out, x, n, W, w->rows, w->cols, bs, st(b)) == 0)) /* -1: shape */
            LAUNCH_OK(cuda_gemv_bf16(out, x, n, W, w->rows, w->cols, bs, st(b)));
        return;
    }
    scratch_grow(c, (void **)&c->xbf, &c->xbf_cap, sizeof(uint16_t) * (size_t)n * w->cols);
    LAUNCH_OK(cuda_gemm_bf16(c->blas, out, x, c->xbf, n, W, w->rows, w->cols, bs, st(b)));
}
static void cu_matmul(Backend *b, float *out, const float *x, int n, const WeightMat *w, const uint16_t *bias) {
    xs_wrote(ctx(b), out, (size_t)n * w->rows); /* both paths write out */
    if (native_at(w, n) && native_matmul(b, out, x, n, w, bias) == 0) return;
    plain_matmul(b, out, x, n, w, bias);
}

/* Start-up timing (backend_cuda_native_time, backend_cuda_moe_time): run(b, arg, native), the
 * best of reps runs after one warm-up (cuBLASLt's heuristic, the first launch), in us by CUDA
 * events on the backend's stream. 0 with *us; 0 with *us = -1 when run refused (returned nonzero);
 * -1 on a CUDA error. */
typedef int (*TimedRun)(Backend *b, const void *arg, int native);
static int time_best(Backend *b, TimedRun run, const void *arg, int native, int reps, float *us) {
    cudaStream_t s = ctx(b)->stream;
    cudaEvent_t e0 = NULL, e1 = NULL;
    int rc = -1;
    *us = -1;
    if (cudaEventCreateWithFlags(&e0, cudaEventDefault) != cudaSuccess ||
        cudaEventCreateWithFlags(&e1, cudaEventDefault) != cudaSuccess)
        goto done;
    for (int r = -1; r < reps; r++) {
        float ms = 0;
        if (cudaEventRecord(e0, s) != cudaSuccess) goto done;
        if (run(b, arg, native) != 0) {
            *us = -1;
            break;
        }
        if (cudaEventRecord(e1, s) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess ||
            cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)
            goto done;
        if (r >= 0 && (*us < 0 || 1e3f * ms < *us)) *us = 1e3f * ms;
    }
    rc = 0;
done:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return rc;
}

/* Start-up (cuda_native.h): both paths of cu_matmul for w at n tokens, timed on time_pair's x; bias
 * none (a per-row add, the same in both). */
typedef struct {
    float *out;
    const float *x;
    int n;
    const WeightMat *w;
    int presplit; /* gemv_run: the tensor-core side reads x split beforehand (a norm writes it) */
} MatmulRun;
static int matmul_run(Backend *b, const void *arg, int native) {
    const MatmulRun *m = (const MatmulRun *)arg;
    if (native) return native_matmul(b, m->out, m->x, m->n, m->w, NULL); /* nonzero: no native path here */
    plain_matmul(b, m->out, m->x, m->n, m->w, NULL);
    return 0;
}
/* max |got - ref| / max |ref| over count floats (1 when ref is all zero and got is not). A NaN or an
 * infinity in one where the other has a finite value or another kind of non-finite value is 1 too (no
 * two correct f32-class paths give that); the same kind in both (a NaN weight's row: gpu_check's random
 * e4m3 bytes have some) is left out. */
static double rel_diff(const float *ref, const float *got, size_t count) {
    double mx = 0, d = 0;
    for (size_t i = 0; i < count; i++) {
        if (!isfinite(ref[i]) || !isfinite(got[i])) {
            if (isnan(ref[i]) != isnan(got[i]) || (!isnan(ref[i]) && ref[i] != got[i])) return 1.0;
            continue;
        }
        mx = fmax(mx, fabs((double)ref[i]));
        d = fmax(d, fabs((double)got[i] - ref[i]));
    }
    return mx > 0 ? d / mx : d > 0 ? 1.0 : 0.0;
}
/* run(b, m, 0) and run(b, m, 1) for w at n tokens, each timed by time_best, on x [n, cols] / out
 * [n, rows] f32 of their own, x a fixed pattern in [-1, 1) (the times do not depend on its values; a
 * constant would hide a permuted fragment from the comparison). rel: when given and both ran, the
 * last outputs' rel_diff (run 0's the reference), else -1. */
static int time_pair(Backend *b, const WeightMat *w, int n, int reps, TimedRun run, int presplit, float *us0,
                     float *us1, double *rel) {
    CudaCtx *c = ctx(b);
    size_t nx = (size_t)n * w->cols, no = (size_t)n * w->rows;
    float *x = NULL, *out = NULL, *hx = (float *)malloc(sizeof(float) * nx);
    float *h0 = rel ? (float *)malloc(sizeof(float) * no) : NULL, *h1 = rel ? (float *)malloc(sizeof(float) * no) : NULL;
    CHECK(hx && (!rel || (h0 && h1)), "out of host memory for a start-up timing");
    if (rel) *rel = -1;
    uint32_t st = 0x9e3779b9u;
    for (size_t i = 0; i < nx; i++) { /* xorshift */
        st ^= st << 13;
        st ^= st >> 17;
        st ^= st << 5;
        hx[i] = (float)(st >> 8) / 8388608.0f - 1.0f;
    }
    int rc = -1;
    if (cudaMalloc((void **)&x, sizeof(float) * nx) != cudaSuccess ||
        cudaMalloc((void **)&out, sizeof(float) * no) != cudaSuccess ||
        cudaMemcpyAsync(x, hx, sizeof(float) * nx, cudaMemcpyHostToDevice, c->stream) != cudaSuccess)
        goto done;
    {
        MatmulRun m = {out, x, n, w, presplit};
        if (time_best(b, run, &m, 0, reps, us0) ||
            (rel && cudaMemcpyAsync(h0, out, sizeof(float) * no, cudaMemcpyDeviceToHost, c->stream)) ||
            time_best(b, run, &m, 1, reps, us1) ||
            (rel && cudaMemcpyAsync(h1, out, sizeof(float) * no, cudaMemcpyDeviceToHost, c->stream)))
            goto done;
    }
    rc = cudaStreamSynchronize(c->stream) == cudaSuccess ? 0 : -1;
    if (!rc && rel && *us0 >= 0 && *us1 >= 0) *rel = rel_diff(h0, h1, no);
done:
    xs_clear(c); /* gemv_run's record of x, freed here */
    cudaFree(x);
    cudaFree(out);
    free(hx); free(h0); free(h1);
    if (rc) (void)cudaGetLastError(); /* a failed cudaMalloc must not surface at the next launch check */
    return rc;
}
extern "C" int backend_cuda_native_time(Backend *b, const WeightMat *w, int n, int reps, float *wo_us,
                                        float *native_us) {
    *wo_us = *native_us = -1;
    if (n < 1 || reps < 1 || w->fmt == WF_BF16 || !w->dev) return -1;
    return time_pair(b, w, n, reps, matmul_run, 0, wo_us, native_us, NULL);
}

/* Start-up (cuda_native.h): a BF16, FP8 or NVFP4 matrix's two decode GEMVs at n tokens, the tiled one
 * (mma 0) and the tensor-core one (mma 1; refused: nonzero, when off or n / the shape does not
 * qualify). */
static int gemv_run(Backend *b, const void *arg, int mma) {
    const MatmulRun *r = (const MatmulRun *)arg;
    const WeightMat *w = r->w;
    CudaCtx *c = ctx(b);
    if (mma && c->off_gemv_mma) return -1;
    if (w->fmt == WF_FP8 || w->fmt == WF_NVFP4) {
        if (!mma) return quant_gemv(b, r->out, r->x, r->n, w, NULL, 0, 0);
        /* presplit: the first (warm-up) run splits the timer's x, the timed ones find it split, as
         * the launches after a norm do; else every run splits it */
        int ready = r->presplit && xs_ready(c, r->x, r->n, w->cols);
        if (!ready) {
            xs_clear(c);
            scratch_grow(c, &c->xsplit, &c->xsplit_cap, cuda_gemv_mma_scratch(r->n, w->cols)); /* start-up only */
        }
        int rc = quant_gemv(b, r->out, r->x, r->n, w, NULL, 1, ready);
        if (rc == 0 && r->presplit) xs_set(c, r->x, r->n, w->cols); /* the timer's own x: time_pair drops it */
        return rc;
    }
    const uint16_t *W = (const uint16_t *)w->dev;
    if (!mma) return cuda_gemv_bf16(r->out, r->x, r->n, W, w->rows, w->cols, NULL, st(b));
    return cuda_gemv_bf16_mma(r->out, r->x, r->n, W, w->rows, w->cols, NULL, st(b));
}
extern "C" int backend_cuda_gemv_time(Backend *b, const WeightMat *w, int n, int reps, int presplit, float *tile_us,
                                      float *mma_us) {
    *tile_us = *mma_us = -1;
    if (n < 1 || n > CUDA_GEMV_MAX_N || reps < 1 || !w->dev || (w->fmt != WF_BF16 && !w->q) ||
        (w->fmt == WF_NVFP4 && (!w->dev_scale || !w->dev_s2)))
        return -1;
    double rel;
    if (time_pair(b, w, n, reps, gemv_run, presplit && w->fmt != WF_BF16, tile_us, mma_us, &rel)) return -1;
    if (rel > CUDA_MMA_AGREE_TOL) *mma_us = CUDA_MMA_DISAGREES; /* the same patterned x, both paths' outputs */
    return 0;
}
extern "C" void backend_cuda_gemv_presplit(Backend *b, int min_n) {
    ctx(b)->presplit_min_n = min_n > 0 ? min_n : 0;
    xs_clear(ctx(b));
}
/* The tiled GEMV's segments for count matrices over x (gemv_tile.cuh) and their format: 1 when they
 * share a format, fit one launch at n tokens and take no native GEMM, else 0. */
static int gemv_multi_build(const CudaCtx *c, GemvMulti *m, int *fmt, float *const *outs, const float *x, int n,
                            const WeightMat *const *ws, const uint16_t *const *biases, int count) {
    *m = GemvMulti{};
    *fmt = ws[0]->fmt == WF_BF16 ? 0 : ws[0]->fmt == WF_FP8 ? 1 : 2;
    int ok = count <= GT_MAX_SEG && n <= CUDA_GEMV_MAX_N;
    for (int i = 0; ok && i < count; i++) {
        const WeightMat *w = ws[i];
        const uint16_t *bias = biases[i];
        ok = w->fmt == ws[0]->fmt && !native_at(w, n); /* a native GEMM: one matmul each */
        if (w->fmt == WF_BF16) {
            m->seg[i] = gemv_args(outs[i], x, (const uint16_t *)w->dev, bias, w->rows, w->cols);
        } else if (w->fmt == WF_FP8) {
            const QuantFp8 *q = (const QuantFp8 *)w->q;
            m->seg[i] = gemv_args_fp8(outs[i], x, (const uint8_t *)w->dev, (const float *)w->dev_scale,
                                      q->block_rows, q->block_cols, bias, w->rows, w->cols);
        } else {
            m->seg[i] = gemv_args_nvfp4(outs[i], x, (const uint8_t *)w->dev, (const uint8_t *)w->dev_scale,
                                        (const float *)w->dev_s2, bias, w->rows, w->cols);
        }
    }
    m->nseg = count;
    m->mma = mma_at(c, ws[0], n); /* the first matrix's choice (q of q/k/v, gate of gate/up) */
    if (m->mma && *fmt >= 1) {
        m->xs = gemv_mma_split_at(c->xsplit, n, ws[0]->cols);
        m->xs.ready = xs_ready(c, x, n, ws[0]->cols); /* a norm wrote it (norm_split) */
    }
    if (m->mma && gemv_multi_check(m, n, *fmt)) m->mma = 0; /* a shape the tensor-core tile does not take */
    return ok;
}

/* After a launch of m: its split into xsplit (unless a norm's was ready) and its outputs (swiglu: out
 * instead of the segments') drop the norm's record as they must. */
static void multi_wrote(CudaCtx *c, const GemvMulti *m, int n, int fmt, const float *swiglu_out) {
    if (m->mma && fmt >= 1 && !m->xs.ready) xs_clear(c);
    if (swiglu_out) xs_wrote(c, swiglu_out, (size_t)n * m->seg[0].rows);
    for (int i = 0; !swiglu_out && i < m->nseg; i++) xs_wrote(c, m->seg[i].out, (size_t)n * m->seg[i].rows);
}
/* q/k/v or gate/up at decode sizes: one tiled GEMV launch over all of them when
 * they share a format and qualify (gemv_tile.cuh), else one matmul each. */
static void cu_matmul_multi(Backend *b, float *const *outs, const float *x, int n, const WeightMat *const *ws,
                            const uint16_t *const *biases, int count) {
    GemvMulti m;
    int fmt;
    if (gemv_multi_build(ctx(b), &m, &fmt, outs, x, n, ws, biases, count) && cuda_gemv_multi(&m, n, fmt, st(b)) == 0) {
        multi_wrote(ctx(b), &m, n, fmt, NULL);
        return;
    }
    for (int i = 0; i < count; i++) cu_matmul(b, outs[i], x, n, ws[i], biases[i]);
}
/* The residual projection with the add and the next norm as its epilogue (matmul_add_norm.cu), at one
 * token on the decode GEMV cu_matmul would run (the tiled one, or FP8 / NVFP4 on tensor cores from the
 * matrix's record; not a native GEMM): the bits of cu_matmul into a buffer then cu_add_rmsnorm, the
 * norm's split included (norm_split, written after the GEMV has read its own x's split in xsplit). */
static int cu_matmul_add_rmsnorm(Backend *b, float *out, float *x, const float *in, int n, const WeightMat *w,
                                 const uint16_t *bias, const uint16_t *norm_w, float eps) {
    CudaCtx *c = ctx(b);
    GemvMulti m;
    int fmt;
    float *outs[1] = {out}; /* not written: the seg's out must be set */
    const WeightMat *ws[1] = {w};
    const uint16_t *bs[1] = {bias};
    if (c->off_add_norm || n != 1 || !w->dev || !gemv_multi_build(c, &m, &fmt, outs, in, n, ws, bs, 1)) return -1;
    GemvAddNorm an = {x, out, norm_w, eps, norm_split(c, out, n, w->rows), c->norm_done};
    if (cuda_gemv_add_rmsnorm(&m, &an, n, fmt, st(b))) {
        xs_clear(c);
        return -1;
    }
    return 0;
}
static void cu_swiglu(Backend *b, float *out, const float *g, const float *u, int n) {
    xs_clear(ctx(b));
    LAUNCH_OK(cuda_swiglu(out, g, u, (size_t)n, st(b)));
}
/* gate/up and SwiGLU: at decode sizes one launch with the epilogue (matmul_swiglu.cu; g and u
 * untouched), else matmul_multi into g, u and swiglu (out may alias g). */
static void cu_matmul_swiglu(Backend *b, float *out, const float *x, int n, const WeightMat *gate,
                             const WeightMat *up, float *g, float *u) {
    GemvMulti m;
    int fmt;
    float *outs[2] = {g, u};
    const WeightMat *ws[2] = {gate, up};
    const uint16_t *bs[2] = {NULL, NULL};
    if (gemv_multi_build(ctx(b), &m, &fmt, outs, x, n, ws, bs, 2) && cuda_gemv_swiglu(&m, out, n, fmt, st(b)) == 0) {
        multi_wrote(ctx(b), &m, n, fmt, out);
        return;
    }
    cu_matmul_multi(b, outs, x, n, ws, bs, 2);
    cu_swiglu(b, out, g, u, n * gate->rows);
}
static void cu_norm_rope(Backend *b, float *x, int n, int n_heads, int head_dim, const uint16_t *norm_w, float eps,
                         const float *cs, const float *sn, const int32_t *pos) {
    xs_clear(ctx(b));
    LAUNCH_OK(cuda_norm_rope(x, n, n_heads, head_dim, norm_w, eps, cs, sn, pos, st(b)));
}
static void cu_rope_kv_write(Backend *b, const RopeKvArgs *a) {
    xs_clear(ctx(b));
    LAUNCH_OK(cuda_rope_kv_write(a, st(b)));
}
/* The split partials of one attention call ([splits, n_tokens * n_heads, head_dim + 2] f32, the
 * merge's input), in c->part; nothing for an unsplit call. */
static float *attn_part(CudaCtx *c, const AttnArgs *a, int splits) {
    if (splits > 1)
        scratch_grow(c, (void **)&c->part, &c->part_cap,
                     sizeof(float) * (size_t)splits * a->n_tokens * a->n_heads * (a->head_dim + 2));
    return c->part;
}
static void cu_attention(Backend *b, const AttnArgs *a) {
    CudaCtx *c = ctx(b);
    xs_clear(c);
    if (!c->off_attn_mma && cuda_attention_mma_fits(a)) {
        int ms = cuda_attention_mma_splits(a->n_tokens, a->n_heads, c->max_ctx, c->sms);
        LAUNCH_OK(cuda_attention_mma_split(a, attn_part(c, a, ms), ms, st(b)));
        return;
    }
    if (!c->off_attn_dec_mma && cuda_attention_dec_mma_fits(a)) {
        int ds = cuda_attention_dec_mma_splits(a->n_tokens, a->n_kv_heads, c->max_ctx, c->sms);
        LAUNCH_OK(cuda_attention_dec_mma(a, attn_part(c, a, ds), ds, st(b)));
        return;
    }
    int splits = cuda_attention_splits(a->n_tokens, a->n_heads, a->n_kv_heads, c->max_ctx, c->sms);
    LAUNCH_OK(cuda_attention(a, attn_part(c, a, splits), splits, st(b)));
}
static void cu_add(Backend *b, float *x, const float *y, int n) {
    xs_clear(ctx(b));
    LAUNCH_OK(cuda_add(x, y, (size_t)n, st(b)));
}
static void cu_kv_write(Backend *b, const KvWriteArgs *a) {
    xs_clear(ctx(b));
    LAUNCH_OK(cuda_kv_write(a, st(b)));
}
static void cu_gather_rows(Backend *b, float *dst, const float *src, const int32_t *rows, int n, int dim) {
    xs_clear(ctx(b));
    LAUNCH_OK(cuda_gather_rows(dst, src, rows, n, dim, st(b)));
}
static void cu_scale_add_rows(Backend *b, float *dst, const float *src, const int32_t *rows, const float *w, int n,
                              int dim) {
    xs_clear(ctx(b));
    LAUNCH_OK(cuda_scale_add_rows(dst, src, rows, w, n, dim, st(b)));
}

static void cu_moe_route(Backend *b, const MoeRouteArgs *a) {
    xs_clear(ctx(b));
    LAUNCH_OK(cuda_moe_route(a, st(b)));
}
/* The router's matmul with the routing as its epilogue (moe_route.cu), where the router takes the
 * tiled BF16 GEMV at n (cu_matmul's path at 1 token, and at 2-8 below its tensor-core record): the
 * bits of cu_matmul then cu_moe_route. */
static int cu_moe_router_route(Backend *b, const MoeRouteArgs *a, const float *x, const WeightMat *w) {
    CudaCtx *c = ctx(b);
    if (c->off_router_route || w->fmt != WF_BF16 || !w->dev || w->rows != a->n_experts || mma_at(c, w, a->n))
        return -1;
    xs_clear(c);
    return cuda_moe_router_route(a, x, (const uint16_t *)w->dev, w->cols, c->route_done, st(b));
}

/* Expert kind j (0 gate, 1 up, 2 down) of every expert: one format (BF16, FP8
 * with one scale block, or NVFP4), the layer's shape, 16-byte aligned. */
static int moe_kind_ok(const MoeMlpArgs *a, const WeightMat *m, int rows, int cols, CudaMoeSeg *sg) {
    int E = a->route->n_experts;
    const QuantFp8 *q0 = m[0].fmt == WF_FP8 ? (const QuantFp8 *)m[0].q : NULL;
    for (int e = 0; e < E; e++) {
        const QuantFp8 *q = (const QuantFp8 *)m[e].q;
        if (m[e].fmt != m[0].fmt || m[e].rows != rows || m[e].cols != cols || !m[e].dev || ((uintptr_t)m[e].dev & 15))
            return 0;
        if (q0 && (!q || !m[e].dev_scale || q->block_rows != q0->block_rows || q->block_cols != q0->block_cols))
            return 0;
        if (m[e].fmt == WF_NVFP4 && (!m[e].q || !m[e].dev_scale || ((uintptr_t)m[e].dev_scale & 1))) return 0;
    }
    sg->rows = rows;
    sg->br = q0 ? q0->block_rows : 0;
    sg->bc = q0 ? q0->block_cols : 0;
    return !q0 || sg->bc % 16 == 0 || sg->bc >= cols;
}

/* gather -> grouped gate/up -> swiglu -> grouped down -> weighted unpermute,
 * five launches sized by n * top_k (moe_gemm.cu; at 1-2 tokens gate/up take the
 * SwiGLU epilogue, at one token without the gather, and down takes the unpermute
 * as its epilogue up to CUDA_GEMV_MAX_N tokens: two launches at one token,
 * three at two, four at 3-8); above CUDA_GEMV_MAX_N tokens
 * four: gather, the grouped GEMM of gate/up with the SwiGLU in its epilogue and
 * of down (moe_mma.cu), the unpermute. yg may be xg (x is dead after gate/up).
 * Native FP8 (act_quant FP8 experts where moe_native_fp8 holds, steps of at least
 * their record's tokens: the first gate's native_min_n, measured at start-up by
 * device_native_calibrate as for one matrix; 0: CUDA_NATIVE_MIN_N): quantize x
 * (the n token rows, into xg: n hidden bytes + its scales, within xg's
 * 4 n top_k hidden), the e4m3 GEMM of gate/up reading the token rows through
 * pair_tok (no gather), quantize the SwiGLU output (into u, unused there:
 * n top_k inter bytes + scales), the e4m3 GEMM of down, the unpermute. The x
 * groups follow the CPU backend's rule (cpu_matmul): per token when the
 * weights' scale blocks span every column, else per 128 columns. */
static int moe_native_fp8(const WeightMat *w, int NK, const CudaMoeSeg *sg, int H, int I) {
    return w->fmt == WF_FP8 && w->act_quant && NK <= 65535 && cuda_moe_gemm_fp8_native(sg[0].bc, H) &&
           cuda_moe_gemm_fp8_native(sg[2].bc, I);
}
/* The activation layout for FP8 weights of scale blocks bc over cols: its group, and xs_stride for n rows. */
static int moe_fp8_group(int bc, int cols, int n, int *stride) {
    *stride = bc >= cols ? 0 : n;
    return bc >= cols ? cols : QUANT_FP8_GROUP;
}
/* MoeMlpArgs' residual add and norm after the experts wrote out (cu_moe_mlp's path without them fused). */
static int moe_add_norm(Backend *b, const MoeMlpArgs *a) {
    if (a->resid) cu_add_rmsnorm(b, a->norm_out, a->resid, a->out, a->norm_w, a->route->n, a->hidden, a->eps);
    return 0;
}
static int cu_moe_mlp(Backend *b, const MoeMlpArgs *a) {
    xs_clear(ctx(b));
    const MoeRouteArgs *ra = a->route;
    int E = ra->n_experts, K = ra->top_k, H = a->hidden, I = a->inter, NK = ra->n * K;
    const WeightMat *ws[3] = {a->ex.gate, a->ex.up, a->ex.down};
    if (!ws[0] || !ws[1] || !ws[2] || E < 1) return -1;
    if (ws[0][0].fmt != WF_BF16 && ws[0][0].fmt != WF_FP8 && ws[0][0].fmt != WF_NVFP4) return -1;
    int fmt = ws[0][0].fmt == WF_FP8 ? 1 : ws[0][0].fmt == WF_NVFP4 ? 2 : 0;
    CudaMoeSeg sg[3] = {};
    if (!moe_kind_ok(a, ws[0], I, H, &sg[0]) || !moe_kind_ok(a, ws[1], I, H, &sg[1]) ||
        !moe_kind_ok(a, ws[2], H, I, &sg[2]) || ws[1][0].fmt != ws[0][0].fmt || ws[2][0].fmt != ws[0][0].fmt ||
        sg[0].br != sg[1].br || sg[0].bc != sg[1].bc || H % (8 << fmt) || I % (8 << fmt))
        return -1;
    if (!a->x) return 0;
    CHECK(a->out && a->ex.w && (!fmt || a->ex.s) && (fmt != 2 || a->ex.s2) && a->xg && a->yg && a->g && a->u,
          "moe_mlp: missing buffers");
    float *outs[3] = {a->g, a->u, a->yg};
    for (int j = 0; j < 3; j++) {
        sg[j].out = outs[j];
        sg[j].w = a->ex.w + (size_t)j * E;
        sg[j].s = fmt ? a->ex.s + (size_t)j * E : NULL;
        sg[j].s2 = fmt == 2 ? a->ex.s2 + (size_t)j * E : NULL;
    }
    /* An expert's pairs are at most n (a token's top_k experts are distinct): a step of more than
     * CUDA_GEMV_MAX_N tokens runs the tensor-core grouped GEMM for every expert (moe_mma.cu: a BF16
     * expert of more than CUDA_GEMV_MAX_N pairs rounds x to bf16, as cu_matmul's cuBLAS path would
     * for its rows; the others keep f32 class); a step of up to CUDA_GEMV_MAX_N tokens the GEMVs
     * (one pass each, f32 x), or the same grouped GEMM from the experts' record on (the first
     * gate's mma_min_n, measured at start-up by device_gemv_calibrate; 0: never), where every
     * expert has at most CUDA_GEMV_MAX_N pairs, so x is carried as hi + lo: f32 class too. */
    CudaCtx *c = ctx(b);
    int small_mma = c->moe_mma_force ? c->moe_mma_force == 2 : ws[0][0].mma_min_n > 0 && ra->n >= ws[0][0].mma_min_n;
    int mma = !c->off_moe_mma && (ra->n > CUDA_GEMV_MAX_N || small_mma);
    int native = !c->off_moe_mma && moe_native_fp8(&ws[0][0], NK, sg, H, I) && /* moe_mma.cu's fmt 3 */
                 (c->moe_force ? c->moe_force == 2 : native_from(&ws[0][0], ra->n));
    CudaMoeGemv gu = {};
    gu.seg[0] = sg[0];
    gu.seg[1] = sg[1];
    gu.nseg = 2;
    gu.x = a->xg;
    gu.cols = H;
    gu.offsets = ra->offsets;
    gu.active = ra->active;
    gu.n_experts = E;
    gu.n_pairs = NK;
    gu.max_cnt = ra->n;
    gu.fmt = fmt;
    CudaMoeGemv dn = gu;
    dn.seg[0] = sg[2];
    dn.nseg = 1;
    dn.x = a->g;
    dn.cols = I;
    if (native) {
        uint8_t *q = (uint8_t *)a->xg, *q2 = (uint8_t *)a->u;
        float *qs = (float *)(q + ((size_t)ra->n * H + 15) / 16 * 16), *qs2 = (float *)(q2 + ((size_t)NK * I + 15) / 16 * 16);
        int group = moe_fp8_group(sg[0].bc, H, ra->n, &gu.xs_stride);
        LAUNCH_OK(cuda_quant_act_fp8(q, qs, a->x, ra->n, H, group, st(b)));
        gu.fmt = dn.fmt = 3;
        gu.x = dn.x = NULL;
        gu.xq = q;
        gu.xs = qs;
        gu.x_row = ra->pair_tok;
        LAUNCH_OK(cuda_moe_gemm(&gu, a->g, st(b)));
        group = moe_fp8_group(sg[2].bc, I, NK, &dn.xs_stride);
        LAUNCH_OK(cuda_quant_act_fp8(q2, qs2, a->g, NK, I, group, st(b)));
        dn.xq = q2;
        dn.xs = qs2;
        LAUNCH_OK(cuda_moe_gemm(&dn, NULL, st(b)));
    } else {
        /* gate/up read the token rows of x through pair_tok where the kernel takes it (the grouped GEMM;
         * the GEMV's SwiGLU epilogue at one token), else a gathered copy in pair order: the same values */
        gu.x = a->x;
        gu.x_row = ra->pair_tok;
        if (mma) { /* gate/up with the SwiGLU epilogue into g (u unused) */
            LAUNCH_OK(cuda_moe_gemm(&gu, a->g, st(b)));
            LAUNCH_OK(cuda_moe_gemm(&dn, NULL, st(b)));
        } else {
            /* the GEMV reads x through pair_tok only in its SwiGLU epilogue at one token
             * (cuda_moe_gemv_swiglu's rule); else the pairs' rows are gathered first */
            if (ra->n > 1 || c->off_swiglu) {
                LAUNCH_OK(cuda_gather_rows(a->xg, a->x, ra->pair_tok, NK, H, st(b)));
                gu.x = a->xg;
                gu.x_row = NULL;
            }
            /* gate/up with the SwiGLU epilogue in one launch at 1-2 tokens (the same bits), else two */
            if (c->off_swiglu || cuda_moe_gemv_swiglu(&gu, a->g, st(b))) {
                LAUNCH_OK(cuda_moe_gemv(&gu, st(b)));
                LAUNCH_OK(cuda_swiglu(a->g, a->g, a->u, (size_t)NK * I, st(b)));
            }
            /* down with the unpermute as its epilogue (the same bits), at one token with the residual
             * add and the next norm after it too (the norm's split as cu_add_rmsnorm writes it), else
             * two launches and the add + norm */
            CudaMoeUnpermute un = {a->out, ra->pair_of, ra->weights, ra->n, K, c->moe_done,
                                   (int)(c->moe_done_cap / sizeof(uint32_t))};
            int fuse = a->resid && ra->n == 1 && !c->off_add_norm;
            if (fuse)
                un.add_norm = GemvAddNorm{a->resid, a->norm_out, a->norm_w, a->eps,
                                          norm_split(c, a->norm_out, 1, H), c->norm_done};
            if (!c->off_moe_unpermute && !cuda_moe_gemv_unpermute(&dn, &un, st(b)))
                return fuse ? 0 : moe_add_norm(b, a);
            xs_clear(c);
            LAUNCH_OK(cuda_moe_gemv(&dn, st(b)));
        }
    }
    LAUNCH_OK(cuda_moe_unpermute(a->out, a->yg, ra->pair_of, ra->weights, ra->n, K, H, st(b)));
    return moe_add_norm(b, a);
}

/* Start-up (cuda_native.h): cu_moe_mlp of a routed step, weight-only and native, timed. */
static int moe_run(Backend *b, const void *arg, int native) {
    ctx(b)->moe_force = native ? 2 : 1;
    return cu_moe_mlp(b, (const MoeMlpArgs *)arg);
}
extern "C" int backend_cuda_moe_time(Backend *b, const MoeMlpArgs *a, int reps, float *wo_us, float *native_us) {
    CudaCtx *c = ctx(b);
    *wo_us = *native_us = -1;
    const WeightMat *g = a->ex.gate;
    if (reps < 1 || !a->x || !g || g[0].fmt != WF_FP8 || !g[0].act_quant) return -1;
    int E = a->route->n_experts, NK = a->route->n * a->route->top_k;
    CudaMoeSeg sg[3] = {};
    if (E < 1 || !moe_kind_ok(a, a->ex.gate, a->inter, a->hidden, &sg[0]) ||
        !moe_kind_ok(a, a->ex.down, a->hidden, a->inter, &sg[2]))
        return -1;
    int can = !c->off_moe_mma && moe_native_fp8(&g[0], NK, sg, a->hidden, a->inter);
    int rc = time_best(b, moe_run, a, 0, reps, wo_us) || *wo_us < 0 ||
             (can && time_best(b, moe_run, a, 1, reps, native_us)) ? -1 : 0;
    c->moe_force = 0;
    if (!rc) rc = cudaStreamSynchronize(c->stream) == cudaSuccess ? 0 : -1;
    if (rc) (void)cudaGetLastError();
    return rc;
}

/* Start-up (cuda_native.h): cu_moe_mlp of a routed step of at most CUDA_GEMV_MAX_N tokens, the
 * grouped GEMV and the grouped mma, timed (weight-only: the native path is not taken here). */
static int moe_gemv_run(Backend *b, const void *arg, int mma) {
    ctx(b)->moe_mma_force = mma ? 2 : 1;
    return cu_moe_mlp(b, (const MoeMlpArgs *)arg);
}
extern "C" int backend_cuda_moe_gemv_time(Backend *b, const MoeMlpArgs *a, int reps, float *gemv_us, float *mma_us) {
    CudaCtx *c = ctx(b);
    *gemv_us = *mma_us = -1;
    if (reps < 1 || !a->x || !a->ex.gate || a->route->n < 1 || a->route->n > CUDA_GEMV_MAX_N) return -1;
    int rc = 0, force = c->moe_force;
    size_t no = (size_t)a->route->n * a->hidden;
    float *h0 = (float *)malloc(sizeof(float) * no), *h1 = (float *)malloc(sizeof(float) * no);
    CHECK(h0 && h1, "out of host memory for the MoE start-up check");
    c->moe_force = 1; /* weight-only, whatever the native record says */
    rc = time_best(b, moe_gemv_run, a, 0, reps, gemv_us) || *gemv_us < 0 ? -1 : 0; /* -1 too: experts it refuses */
    /* the last run's out of each path (the routing is the caller's, fixed): they must agree */
    if (!rc) rc = cudaMemcpyAsync(h0, a->out, sizeof(float) * no, cudaMemcpyDeviceToHost, c->stream) ? -1 : 0;
    if (!rc && !c->off_moe_mma && time_best(b, moe_gemv_run, a, 1, reps, mma_us)) rc = -1;
    if (!rc && *mma_us >= 0)
        rc = cudaMemcpyAsync(h1, a->out, sizeof(float) * no, cudaMemcpyDeviceToHost, c->stream) ? -1 : 0;
    c->moe_force = force;
    c->moe_mma_force = 0;
    if (!rc) rc = cudaStreamSynchronize(c->stream) == cudaSuccess ? 0 : -1;
    if (!rc && *mma_us >= 0 && rel_diff(h0, h1, no) > CUDA_MMA_AGREE_TOL) *mma_us = CUDA_MMA_DISAGREES;
    if (rc) (void)cudaGetLastError();
    free(h0);
    free(h1);
    return rc;
}

/* The batched LoRA of one linear (backend.h): rows grouped by pair on the host
 * (in order of first appearance, as cpu_lora), the grouping uploaded only when
 * it differs from the last one (the linears of a step normally share it, so
 * about one small copy per step), then cuda_lora's shrink and expand. */
static void cu_lora(Backend *b, float *out, const float *x, int n, const LoraPair *const *pairs) {
    CudaCtx *c = ctx(b);
    xs_clear(c);
    CHECK(n <= c->lora_tokens, "LoRA over %d rows, %d reserved (lora_reserve; a bug in the caller)", n,
          c->lora_tokens);
    CudaLoraSegs sg;
    int n_rows = 0, in = 0, od = 0;
    sg.n_seg = 0;
    memset(c->lora_taken, 0, (size_t)n);
    for (int i = 0; i < n; i++) {
        if (!pairs[i] || c->lora_taken[i]) continue;
        const LoraPair *lp = pairs[i];
        CHECK(sg.n_seg < CUDA_LORA_MAX_SEG && lp->rank <= c->lora_rank && (!in || (lp->in == in && lp->out == od)),
              "LoRA call with a pair of rank %d (reserved %d) or mismatched shapes (a bug in the caller)", lp->rank,
              c->lora_rank);
        in = lp->in;
        od = lp->out;
        int s = sg.n_seg++;
        sg.a[s] = lp->a;
        sg.b[s] = lp->b;
        sg.scale[s] = lp->scale;
        sg.rank[s] = lp->rank;
        sg.bf16[s] = lp->bf16;
        sg.row0[s] = n_rows;
        for (int k = i; k < n; k++)
            if (pairs[k] == lp) {
                c->lora_taken[k] = 1;
                c->lora_rows[n_rows++] = k;
            }
    }
    sg.row0[sg.n_seg] = n_rows;
    if (!sg.n_seg) return;
    if (n_rows != c->lora_rows_up_n || memcmp(c->lora_rows, c->lora_rows_up, sizeof(int32_t) * (size_t)n_rows)) {
        /* pageable source: staged before the call returns, so lora_rows may change after it */
        CUDA_CHECK(cudaMemcpyAsync(c->lora_rows_d, c->lora_rows, sizeof(int32_t) * (size_t)n_rows,
                                   cudaMemcpyHostToDevice, c->stream));
        memcpy(c->lora_rows_up, c->lora_rows, sizeof(int32_t) * (size_t)n_rows);
        c->lora_rows_up_n = n_rows;
    }
    LAUNCH_OK(cuda_lora(out, x, n, in, od, c->lora_h, c->lora_rank, c->lora_rows_d, &sg, st(b)));
}
/* Start-up: the lora op's scratch, 4 x (max_rank + 1) device bytes per row. */
static void cu_lora_reserve(Backend *b, int max_tokens, int max_rank) {
    CudaCtx *c = ctx(b);
    CHECK(max_tokens > 0 && max_rank >= 1 && max_rank <= LORA_MAX_RANK, "lora_reserve(%d, %d): bad sizes",
          max_tokens, max_rank);
    if (max_tokens <= c->lora_tokens && max_rank <= c->lora_rank) return;
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    if (c->lora_h) CUDA_CHECK(cudaFree(c->lora_h));
    if (c->lora_rows_d) CUDA_CHECK(cudaFree(c->lora_rows_d));
    size_t hb = sizeof(float) * (size_t)max_tokens * max_rank;
    cudaError_t e = cudaMalloc((void **)&c->lora_h, hb);
    if (e == cudaSuccess) e = cudaMalloc((void **)&c->lora_rows_d, sizeof(int32_t) * (size_t)max_tokens);
    CHECK(e == cudaSuccess, "LoRA scratch of %.1f MiB on the GPU: %s\n  fix: lower --max-lora-rank or "
          "--max-num-batched-tokens", hb / 1048576.0, cudaGetErrorString(e));
    c->lora_rows = (int32_t *)realloc(c->lora_rows, sizeof(int32_t) * (size_t)max_tokens);
    c->lora_rows_up = (int32_t *)realloc(c->lora_rows_up, sizeof(int32_t) * (size_t)max_tokens);
    c->lora_taken = (uint8_t *)realloc(c->lora_taken, (size_t)max_tokens);
    CHECK(c->lora_rows && c->lora_rows_up && c->lora_taken, "out of host memory for the LoRA scratch");
    c->lora_rows_up_n = -1;
    c->lora_tokens = max_tokens;
    c->lora_rank = max_rank;
}
/* The update path's copy (adapters): every error returned. */
static int cu_upload_try(Backend *b, void *dst, const void *src, size_t n, Err *err) {
    CudaCtx *c = ctx(b);
    xs_clear(c);
    if (n) CUDA_TRY(err, cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, c->stream));
    CUDA_TRY(err, cudaStreamSynchronize(c->stream));
    return 0;
}

/* Runner creation: the GEMM path's bf16 copy of x for up to max_tokens x max_cols. */
static void cu_reserve(Backend *b, int max_tokens, int max_cols) {
    CudaCtx *c = ctx(b);
    xs_clear(c);
    scratch_grow(c, (void **)&c->xbf, &c->xbf_cap, sizeof(uint16_t) * (size_t)max_tokens * max_cols);
    scratch_grow(c, &c->xsplit, &c->xsplit_cap,
                 cuda_gemv_mma_scratch(max_tokens < CUDA_GEMV_MAX_N ? max_tokens : CUDA_GEMV_MAX_N, max_cols));
    /* the unpermute epilogue's counters: a row tile per CUDA_MOE_TILE_ROWS columns of the widest
     * activation (>= hidden, the down GEMV's rows) */
    size_t done = sizeof(uint32_t) * (((size_t)max_cols + CUDA_MOE_TILE_ROWS - 1) / CUDA_MOE_TILE_ROWS);
    if (done > c->moe_done_cap) {
        scratch_grow(c, (void **)&c->moe_done, &c->moe_done_cap, done);
        CUDA_CHECK(cudaMemsetAsync(c->moe_done, 0, done, c->stream));
    }
    if (cuda_native_caps()) { /* native activations (from any measured crossover): the worst case of both formats */
        scratch_grow(c, (void **)&c->nq, &c->nq_cap, (size_t)max_tokens * max_cols);
        scratch_grow(c, (void **)&c->ns, &c->ns_cap, sizeof(float) * (size_t)max_tokens * quant_fp8_groups(max_cols));
        if (cuda_native_caps() & CUDA_NATIVE_NVFP4)
            scratch_grow(c, (void **)&c->nsf, &c->nsf_cap, cuda_nvfp4_sf_bytes(max_tokens, max_cols));
    }
}

/* ---- sampling on the device (sampling.cu) ---- */
static int cu_sample_reserve(Backend *b, const DevSampleCaps *caps, Err *err) {
    CudaCtx *c = ctx(b);
    cudaError_t se = cudaStreamSynchronize(c->stream); /* on any error: no reservation (sample refuses) */
    cuda_sampler_free(c->sampler);
    c->sampler = NULL;
    if (se != cudaSuccess) return ERR(err, 500, "device sampling: cudaStreamSynchronize: %s", cudaGetErrorString(se));
    c->sampler = cuda_sampler_create(caps, err);
    return c->sampler ? 0 : -1;
}
static int cu_sample_launch(Backend *b, const float *logits, int n_logit_rows, int vocab,
                            const DevSampleBatch *batch, int slot, Err *err) {
    CudaCtx *c = ctx(b);
    xs_clear(c);
    if (!c->sampler) return ERR(err, 500, "device sampling was not reserved (sample_reserve)");
    return cuda_sampler_launch(c->sampler, logits, n_logit_rows, vocab, batch, slot, st(b), err) ? -1 : 0;
}
static int cu_sample_wait(Backend *b, int slot, const DevSampleOut **out, const int32_t **packed, Err *err) {
    CudaCtx *c = ctx(b);
    if (!c->sampler) return ERR(err, 500, "device sampling was not reserved (sample_reserve)");
    return cuda_sampler_wait(c->sampler, slot, out, packed, err) ? -1 : 0;
}
static void cu_step_begin(Backend *b) {
    CudaCtx *c = ctx(b);
    if (c->sampler) (void)cuda_sampler_step_begin(c->sampler, st(b));
}
static double cu_device_seconds(Backend *b) { return ctx(b)->sampler ? cuda_sampler_busy_s(ctx(b)->sampler) : -1; }
static int cu_tokens_resolve(Backend *b, int32_t *tokens, int n, int n_src) {
    CudaCtx *c = ctx(b);
    xs_clear(c);
    return c->sampler ? cuda_sampler_resolve(c->sampler, tokens, n, n_src, st(b)) : -1;
}

static void cu_free(Backend *b) {
    CudaCtx *c = ctx(b);
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    cuda_sampler_free(c->sampler);
    if (c->up) CUDA_CHECK(cudaFreeHost(c->up));
    if (c->rw_pin) CUDA_CHECK(cudaFreeHost(c->rw_pin));
    for (int i = 0; c->up && i < UP_SEGS; i++) CUDA_CHECK(cudaEventDestroy(c->up_ev[i]));
    void *bufs[] = {c->arena, c->xbf, c->xsplit, c->part, c->blas_ws, c->sc_dev, c->nq, c->ns, c->nsf, c->wsf,
                    c->sw_arena, c->lora_h, c->lora_rows_d, c->moe_done, c->route_done, c->norm_done};
    cuda_lt_free(c->lt);
    free(c->sc_host);
    free(c->lora_rows);
    free(c->lora_rows_up);
    free(c->lora_taken);
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
    xs_clear(ctx(b));
    return cudaStreamBeginCapture(ctx(b)->stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess ? 0 : -1;
}
static void *cu_graph_end(Backend *b) {
    xs_clear(ctx(b));
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
    xs_clear(ctx(b));
    CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)g, ctx(b)->stream));
}
static void cu_graph_free(Backend *b, void *g) {
    CUDA_CHECK(cudaStreamSynchronize(ctx(b)->stream));
    CUDA_CHECK(cudaGraphExecDestroy((cudaGraphExec_t)g));
}

/* ---- SAMPLER_CUDA_OFF ----
 * SAMPLER_CUDA_OFF=NAME[,NAME...] (or "all"): kernels this process does not
 * use, each replaced by the path it was written to replace, for a kernel that
 * misbehaves on some device or driver, and for a second GPU check after one
 * died (tests/gpu/README.md). Read at each backend's creation (start-up); an
 * unknown name stops it with the list. Every fallback is a path the op checks
 * and fixtures cover, so results stay in their tolerance class (the MoE GEMV
 * keeps x in f32 where the grouped GEMM rounds it to bf16). attn_vec, pdl and
 * prefetch are process-wide (cuda_attention_vec_enable, cuda_pdl_enable,
 * cuda_gemv_prefetch_enable); the others are per backend. */
typedef struct CudaOff {
    const char *name, *instead;
    void (*apply)(Backend *b, int off);
} CudaOff;
static void off_attn_vec(Backend *, int off) { cuda_attention_vec_enable(!off); }
static void off_pdl(Backend *, int off) { cuda_pdl_enable(!off); }
static void off_prefetch(Backend *, int off) { cuda_gemv_prefetch_enable(!off); }
static void off_attn_mma(Backend *b, int off) { ctx(b)->off_attn_mma = off; }
static void off_attn_dec_mma(Backend *b, int off) { ctx(b)->off_attn_dec_mma = off; }
static void off_moe_mma(Backend *b, int off) { ctx(b)->off_moe_mma = off; }
static void off_gemv_mma(Backend *b, int off) { ctx(b)->off_gemv_mma = off; }
static void off_rope_kv(Backend *b, int off) { b->rope_kv_write = off ? NULL : cu_rope_kv_write; }
static void off_swiglu(Backend *b, int off) {
    b->matmul_swiglu = off ? NULL : cu_matmul_swiglu;
    ctx(b)->off_swiglu = off; /* the routed experts' (cu_moe_mlp) */
}
static void off_moe_unpermute(Backend *b, int off) { ctx(b)->off_moe_unpermute = off; }
static void off_router_route(Backend *b, int off) { ctx(b)->off_router_route = off; }
static void off_add_norm(Backend *b, int off) { ctx(b)->off_add_norm = off; }
static void off_moe_mlp(Backend *b, int off) { b->moe_mlp = off ? NULL : cu_moe_mlp; }
static void off_graphs(Backend *b, int off) { b->graph_begin = off ? NULL : cu_graph_begin; }
static const CudaOff CUDA_OFF[] = {
    {"attn_vec", "decode attention on the warp-a-position kernel (attention.cu attn_kernel)", off_attn_vec},
    {"attn_mma", "prefill attention on CUDA cores (attention.cu)", off_attn_mma},
    {"attn_dec_mma", "grouped-head (G > 4) decode attention on CUDA cores (attention.cu)", off_attn_dec_mma},
    {"moe_mma", "routed experts on the grouped GEMV at every batch, weight-only (moe_gemm.cu)", off_moe_mma},
    {"gemv_mma", "BF16 / FP8 / NVFP4 decode GEMVs on CUDA cores (gemv_tile.cuh) whatever start-up measured",
     off_gemv_mma},
    {"rope_kv_write", "norm_rope then kv_write, two launches", off_rope_kv},
    {"matmul_swiglu", "gate/up then swiglu, two launches (dense and the routed experts' GEMV)", off_swiglu},
    {"moe_unpermute", "the routed experts' down GEMV then the weighted unpermute, two launches", off_moe_unpermute},
    {"moe_router_route", "the MoE router's GEMV then the routing, two launches", off_router_route},
    {"matmul_add_rmsnorm",
     "the residual projection (o, down, the routed experts' down) then the residual add + RMSNorm, two launches",
     off_add_norm},
    {"moe_mlp", "routed experts one matmul at a time, eager (forward.c)", off_moe_mlp},
    {"graphs", "no CUDA graphs (as --enforce-eager)", off_graphs},
    {"pdl", "each kernel of a step starts only once the one before it ended (no programmatic dependent launch)",
     off_pdl},
    {"prefetch", "the decode GEMVs prefetch no weights into L2 before they wait for the kernel before them",
     off_prefetch},
};
#define N_CUDA_OFF ((int)(sizeof CUDA_OFF / sizeof CUDA_OFF[0]))

extern "C" int backend_cuda_off(Backend *b, const char *name, int off) {
    for (int i = 0; i < N_CUDA_OFF; i++)
        if (!strcmp(CUDA_OFF[i].name, name)) {
            CUDA_OFF[i].apply(b, off);
            return 0;
        }
    return -1;
}

static void cuda_off_apply(Backend *b) {
    const char *env = getenv("SAMPLER_CUDA_OFF");
    int off[N_CUDA_OFF] = {0};
    for (const char *p = env; p && *p;) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        int all = l == 3 && !strncmp(p, "all", 3), found = all;
        for (int i = 0; i < N_CUDA_OFF; i++)
            if (all || (strlen(CUDA_OFF[i].name) == l && !strncmp(p, CUDA_OFF[i].name, l))) off[i] = found = 1;
        if (!found && l) {
            char names[256] = "";
            for (int i = 0; i < N_CUDA_OFF; i++)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", CUDA_OFF[i].name);
            CHECK(0, "SAMPLER_CUDA_OFF: no kernel named '%.*s'\n  fix: use all or a comma list of %s", (int)l, p, names);
        }
        p = e ? e + 1 : NULL;
    }
    for (int i = 0; i < N_CUDA_OFF; i++) {
        CUDA_OFF[i].apply(b, off[i]);
        if (off[i]) log_info("cuda backend: %s off (SAMPLER_CUDA_OFF): %s", CUDA_OFF[i].name, CUDA_OFF[i].instead);
    }
    if (cuda_pdl_enabled())
        log_info("cuda backend: programmatic dependent launch on (a step's kernel launches overlap the tail of "
                 "the kernel before them; SAMPLER_CUDA_OFF=pdl turns it off)");
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
    if (cuda_native_caps()) c->lt = cuda_lt_create();
    /* Worst-case split scratch. CUDA cores: splits (<= 64) only when the batch is under 2 blocks
     * per SM (rows <= 2 sms GROUP). Tensor cores: only under 1 block (64 rows x a head) per SM,
     * and splits x blocks <= 2 sms + blocks (cuda_attention_mma_splits), so splits x rows <= 64 x 3 sms.
     * Grouped decode (attention_dec_mma.cu): splits x blocks <= 8 sms + blocks < 12 sms, rows = G <= 16
     * a block, so splits x rows < 192 sms, within the CUDA-core bound. */
    size_t rows = (size_t)2 * c->sms * CUDA_ATTN_GROUP, mma_rows = (size_t)64 * 3 * c->sms;
    c->part_cap = sizeof(float) * (64 * rows > mma_rows ? 64 * rows : mma_rows) * (size_t)(head_dim + 2);
    CUDA_CHECK(cudaMalloc((void **)&c->part, c->part_cap));
    CUDA_CHECK(cudaMalloc((void **)&c->route_done, sizeof(uint32_t)));
    CUDA_CHECK(cudaMemsetAsync(c->route_done, 0, sizeof(uint32_t), c->stream));
    CUDA_CHECK(cudaMalloc((void **)&c->norm_done, sizeof(uint32_t)));
    CUDA_CHECK(cudaMemsetAsync(c->norm_done, 0, sizeof(uint32_t), c->stream));
    CUDA_CHECK(cudaMallocHost((void **)&c->up, UP_SEGS * UP_SEG_BYTES));
    CUDA_CHECK(cudaMallocHost((void **)&c->rw_pin, RW_CHUNK));
    for (int i = 0; i < UP_SEGS; i++) CUDA_CHECK(cudaEventCreateWithFlags(&c->up_ev[i], cudaEventDisableTiming));
    Backend *b = (Backend *)xcalloc(1, sizeof *b);
    b->name = "cuda";
    b->ctx = c;
    b->host = 0;
    b->alloc = cu_alloc;
    b->release = cu_release;
    b->upload = cu_upload;
    b->download = cu_download;
    b->host_alloc = cu_host_alloc;
    b->host_release = cu_host_release;
    b->download_async = cu_download_async;
    b->zero = cu_zero;
    b->copy = cu_copy;
    b->weights_changed = cu_weights_changed;
    b->embed = cu_embed;
    b->rmsnorm = cu_rmsnorm;
    b->add_rmsnorm = cu_add_rmsnorm;
    b->matmul_add_rmsnorm = cu_matmul_add_rmsnorm;
    b->matmul = cu_matmul;
    b->matmul_multi = cu_matmul_multi;
    b->norm_rope = cu_norm_rope;
    b->rope_kv_write = cu_rope_kv_write;
    b->attention = cu_attention;
    b->swiglu = cu_swiglu;
    b->matmul_swiglu = cu_matmul_swiglu;
    b->add = cu_add;
    b->kv_write = cu_kv_write;
    b->gather_rows = cu_gather_rows;
    b->scale_add_rows = cu_scale_add_rows;
    b->moe_route = cu_moe_route;
    b->moe_router_route = cu_moe_router_route;
    b->moe_mlp = cu_moe_mlp;
    b->reserve = cu_reserve;
    b->lora = cu_lora;
    b->lora_reserve = cu_lora_reserve;
    b->upload_try = cu_upload_try;
    b->graph_begin = cu_graph_begin;
    b->graph_end = cu_graph_end;
    b->graph_launch = cu_graph_launch;
    b->graph_free = cu_graph_free;
    b->sample_reserve = cu_sample_reserve;
    b->sample_launch = cu_sample_launch;
    b->sample_wait = cu_sample_wait;
    b->tokens_resolve = cu_tokens_resolve;
    b->step_begin = cu_step_begin;
    b->device_seconds = cu_device_seconds;
    b->free = cu_free;
    cuda_off_apply(b);
    return b;
}

/* ---- weights ---- */
#define ARENA_ALIGN 256

/* Every part of every tensor of ws: fn(host, dev slot, bytes). */
template <typename F> static void ws_parts(WeightSet *ws, F fn) {
    for (int i = 0; i < ws->n; i++) {
        WeightTensor *t = &ws->t[i];
        if (t->vec) { /* a tied lm_head (t->mat) reads the same bf16 copy: set after the upload */
            fn((const void *)t->vec->host, (void **)&t->vec->dev, sizeof(uint16_t) * (size_t)t->numel);
            continue;
        }
        const void *host[MAT_PARTS];
        void **dev[MAT_PARTS];
        size_t bytes[MAT_PARTS];
        int np = mat_parts(t->mat, host, dev, bytes);
        for (int p = 0; p < np; p++) fn(host[p], dev[p], bytes[p]);
    }
}

extern "C" Backend *backend_cuda_create(WeightSet *ws, int head_dim, int max_ctx) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    Backend *b = cuda_backend_new(head_dim, max_ctx, 0);
    CudaCtx *c = ctx(b);
    /* Two passes: offsets in one arena, then the copies. */
    size_t total = 0;
    int n_parts = 0;
    ws_parts(ws, [&](const void *, void **, size_t bytes) {
        total += (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
        n_parts++;
    });
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    cudaError_t err = cudaMalloc(&c->arena, total ? total : 1);
    CHECK(err == cudaSuccess, "the model's %.2f GiB of weights do not fit in the %.2f GiB free on the GPU: "
          "%s\n  fix: use a GPU with more memory or a smaller model", total / 1073741824.0,
          free_b / 1073741824.0, cudaGetErrorString(err));
    size_t off = 0;
    ws_parts(ws, [&](const void *host, void **dev, size_t bytes) {
        CHECK(host, "a registered weight has no host data to copy (a bug in the loader)");
        *dev = (char *)c->arena + off;
        off += (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
        CUDA_CHECK(cudaMemcpyAsync(*dev, host, bytes, cudaMemcpyHostToDevice, c->stream));
    });
    for (int i = 0; i < ws->n; i++)
        if (ws->t[i].vec && ws->t[i].mat) ws->t[i].mat->dev = (void *)ws->t[i].vec->dev;
    /* the native NVFP4 matrices' scales, swizzled once into cuBLASLt's layout (dev_scale_sw; refreshed
     * by every delta of the matrix): 1/16 byte an element more, no swizzle per GEMM */
    auto sw_bytes = [](const WeightMat *w) -> size_t { /* a native NVFP4 matrix's share of sw_arena, else 0 */
        if (!w || backend_cuda_native_kind(w) != CUDA_NATIVE_NVFP4) return 0;
        return (cuda_nvfp4_sf_bytes(w->rows, w->cols) + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    };
    size_t swb = 0;
    for (int i = 0; i < ws->n; i++) swb += sw_bytes(ws->t[i].vec ? NULL : ws->t[i].mat);
    if (swb) {
        err = cudaMalloc(&c->sw_arena, swb);
        CHECK(err == cudaSuccess, "the native NVFP4 matrices' swizzled scales (%.1f MiB) do not fit on the GPU: %s\n"
              "  fix: use a GPU with more memory, or --weight-only", swb / 1048576.0, cudaGetErrorString(err));
        size_t so = 0;
        for (int i = 0; i < ws->n; i++) {
            WeightMat *w = ws->t[i].vec ? NULL : ws->t[i].mat;
            size_t bytes = sw_bytes(w);
            if (!bytes) continue;
            w->dev_scale_sw = (char *)c->sw_arena + so;
            so += bytes;
            LAUNCH_OK(cuda_nvfp4_swizzle((uint8_t *)w->dev_scale_sw, (const uint8_t *)w->dev_scale, w->rows, w->cols,
                                         c->stream));
        }
    }
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    char sw[96] = "";
    if (swb) snprintf(sw, sizeof sw, ", + %.1f MiB of NVFP4 scales swizzled for the native GEMM", swb / 1048576.0);
    log_info("cuda backend: %d weight tensors (%d buffers), %.2f GiB copied to the device in %.2f s%s; %d SMs", ws->n,
             n_parts, total / 1073741824.0, (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9, sw, c->sms);
    return b;
}

extern "C" Backend *backend_cuda_create_resident(int head_dim, int max_ctx) {
    return cuda_backend_new(head_dim > 0 ? head_dim : CUDA_ATTN_MAX_HEAD_DIM, max_ctx, 1);
}

extern "C" void backend_cuda_update_counts(Backend *b, uint64_t *sparse, uint64_t *full) {
    *sparse = ctx(b)->q_sparse;
    *full = ctx(b)->q_full;
}

extern "C" int backend_cuda_read_weight(Backend *b, const WeightMat *w, void *dst, size_t bytes) {
    CudaCtx *c = ctx(b);
    if (c->resident || w->fmt != WF_BF16 || !w->dev || bytes > sizeof(uint16_t) * (size_t)w->rows * w->cols) return -1;
    CUDA_TRY(NULL, cudaMemcpyAsync(dst, w->dev, bytes, cudaMemcpyDeviceToHost, c->stream));
    CUDA_TRY(NULL, cudaStreamSynchronize(c->stream));
    return 0;
}
