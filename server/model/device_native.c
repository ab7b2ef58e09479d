/*
 * device_native.c - the start-up choice between the native (quantized
 * activations on tensor cores) and the weight-only GPU paths of --precision
 * fp8 / nvfp4, from what this binary's CUDA code has (cuda_native_caps,
 * cuda_native.h). --weight-only always selects the weight-only path.
 *   fp8, sm_90 binary:        native, the checkpoint's 128x128 block scales.
 *   fp8, sm_100 / sm_103:     native per channel: the weights are quantized per
 *                             output row at load (LoadOptions.fp8_per_channel)
 *                             because cuBLASLt has no 128x128 scales there.
 *   fp8, sm_80:               refused (no FP8 tensor cores), fix: --weight-only.
 *   nvfp4, sm_100 / sm_103:   native VEC16_UE4M3.
 *   nvfp4, sm_80 / sm_90:     refused (no FP4 tensor cores), fix: --weight-only.
 * The CPU backend is unaffected (it runs quantized activations itself).
 * Also here: the per-shape crossover between the two GPU paths of an
 * act_quant matrix (device_native_crossover's ladder and rule, and
 * device_native_calibrate, which measures every distinct shape of the model
 * on the device at start-up and records the result in WeightMat.native_min_n).
 * The routed experts of act_quant FP8 MoE models likewise: one crossover for
 * the whole grouped step (weight-only grouped GEMV / GEMM against the native
 * e4m3 grouped GEMM), timed on the first MoE layer with a routed step of n
 * tokens (DeviceMoeBench: random router logits, so pairs spread about evenly
 * over the experts), recorded on every routed expert's matrix.
 * And the same ladder and rule for a BF16, FP8 or NVFP4 matrix's two decode
 * GEMVs, tiled on CUDA cores or on tensor cores (BF16 at 2..8 tokens, FP8 and
 * NVFP4 at 1..8; device_gemv_calibrate, WeightMat.mma_min_n), and for the
 * routed experts' grouped GEMV against the grouped mma up to 8 tokens (one
 * record on every expert matrix, of the first MoE layer's routed step).
 * Not here: the per-matrix path itself and the timing (backend_cuda.cu).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_kernels.h" /* CUDA_GEMV_MAX_N */
#include "cuda_native.h"
#include "device_select.h"
#include "log.h"

#pragma weak cuda_native_caps
#pragma weak backend_cuda_native_kind
#pragma weak backend_cuda_native_time
#pragma weak backend_cuda_moe_time
#pragma weak backend_cuda_gemv_time
#pragma weak backend_cuda_moe_gemv_time
#pragma weak backend_cuda_gemv_presplit

int device_native_plan(int gpu, int binary_sm, int caps, Precision p, int weight_only, int *fp8_per_channel,
                       Err *err) {
    *fp8_per_channel = 0;
    if (!gpu || p == PREC_BF16 || weight_only) return 0;
    if (p == PREC_FP8) {
        if (caps & CUDA_NATIVE_FP8_BLOCK) return 0;
        if (caps & CUDA_NATIVE_FP8_ROWWISE) {
            *fp8_per_channel = 1;
            return 0;
        }
        return ERR(err, 500, "sampler-sm%d has no FP8 tensor-core GEMM (an sm_8x GPU has no FP8 tensor cores), so "
                   "--precision fp8 with quantized activations cannot run here\n  fix: pass --weight-only (FP8 "
                   "weights dequantized in the GEMV, f32 activations), or run on an H100/H200/B200/B300",
                   binary_sm);
    }
    if (caps & CUDA_NATIVE_NVFP4) return 0;
    return ERR(err, 500, "native NVFP4 (e2m1 activations on FP4 tensor cores) needs a Blackwell GPU and "
               "sampler-sm100 / sampler-sm103; sampler-sm%d has no NVFP4 GEMM\n  fix: pass --weight-only to run "
               "the NVFP4 weights with f32 activations (the weight-only GEMV), or use --precision fp8",
               binary_sm);
}

int device_native_check(const DeviceChoice *d, LoadOptions *load, Err *err) {
    int caps = d->gpu && cuda_native_caps ? cuda_native_caps() : 0, per_channel = 0;
    int rc = device_native_plan(d->gpu, d->binary_sm, caps, load->precision, load->weight_only, &per_channel, err);
    if (rc) return rc;
    load->fp8_per_channel = per_channel;
    if (d->gpu && load->precision != PREC_BF16)
        log_info("device: precision %s on the GPU: %s", precision_name(load->precision),
                 load->weight_only ? "weight-only (--weight-only): f32 activations, weights dequantized in the GEMV"
                 : per_channel ? "native FP8 per channel (weights re-quantized per output row at load: cuBLASLt "
                                 "has no 128x128 block scales on this GPU), weight-only GEMV below the crossover"
                               : "native tensor-core GEMM (activations quantized on the device), weight-only GEMV "
                                 "below the crossover");
    return 0;
}

/* The ladder: 1, 2, 3, 4, 6, 8, 12, ... (2^k and 3 * 2^(k-1)), the batch sizes measured. */
static int ladder_at(int i) { return i < 2 ? i + 1 : (i % 2 ? 4 : 3) << ((i - 2) / 2); }

int device_native_crossover(NativeTimeFn time, void *ctx, int max_n, NativeCrossover *out) {
    memset(out, 0, sizeof *out);
    out->min_n = INT_MAX;
    int wins_at_end = 0;
    for (int i = 0; i < NATIVE_XOVER_MAX; i++) {
        int n = ladder_at(i);
        if (n > max_n || n > 65535) break;
        /* past 64 tokens only until native has won at two points in a row there: the weight-only GEMV
         * re-reads the weights for every few tokens (its time grows with n), the GEMM reads them once */
        if (wins_at_end >= 2) break;
        float wo = -1, na = -1;
        if (time(ctx, n, &wo, &na) != 0 || wo < 0) return -1;
        out->n[out->points] = n;
        out->wo_us[out->points] = wo;
        out->native_us[out->points] = na;
        out->points++;
        wins_at_end = n > 64 && na >= 0 && na < wo ? wins_at_end + 1 : 0;
    }
    /* native from the point after the last one it lost (or was refused at); never when it lost the last */
    int last_loss = -1;
    for (int i = 0; i < out->points; i++)
        if (!(out->native_us[i] >= 0 && out->native_us[i] < out->wo_us[i])) last_loss = i;
    if (out->points && last_loss + 1 < out->points) out->min_n = out->n[last_loss + 1];
    return 0;
}

int device_timing_reps = 5;

/* The backend's timer as a NativeTimeFn. */
typedef struct { Backend *b; const WeightMat *w; } TimeCtx;
static int time_on_device(void *ctx, int n, float *wo_us, float *native_us) {
    const TimeCtx *t = (const TimeCtx *)ctx;
    return backend_cuda_native_time(t->b, t->w, n, device_timing_reps, wo_us, native_us);
}
int device_native_crossover_on(Backend *b, const WeightMat *w, int max_n, NativeCrossover *out) {
    if (!backend_cuda_native_time) return -1;
    TimeCtx t = {b, w};
    return device_native_crossover(time_on_device, &t, max_n, out);
}

/* "native from n = 24 (n: weight-only / native us) 1: 10.2 / 31.0, 2: ..." into buf (a, b: the
 * two paths' names, "weight-only" and "native" for the native GEMM). */
static void crossover_describe_as(const NativeCrossover *x, const char *a, const char *b, char *buf, size_t cap) {
    size_t o = 0;
    if (x->min_n == INT_MAX) o += (size_t)snprintf(buf, cap, "%s at every size measured", a);
    else o += (size_t)snprintf(buf, cap, "%s from n = %d", b, x->min_n);
    if (o < cap) o += (size_t)snprintf(buf + o, cap - o, " (n: %s / %s us)", a, b);
    for (int i = 0; i < x->points && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%d: %.1f / %.1f", i ? ", " : " ", x->n[i], x->wo_us[i],
                              x->native_us[i]);
}
static void crossover_describe(const NativeCrossover *x, char *buf, size_t cap) {
    crossover_describe_as(x, "weight-only", "native", buf, cap);
}

/* ---- the routed experts ---- */

struct DeviceMoeBench {
    Backend *b;
    int max_n, hidden, inter;
    const void **tab;            /* backend memory [9 E]: model_moe_pointers of the layer */
    float *x, *out, *xg, *g, *u; /* backend memory: x / out [max_n, hidden], xg [max_n top_k, hidden],
                                  * g / u [max_n top_k, inter] f32 */
    float *logits;               /* backend memory [max_n, n_experts] f32 router logits */
    MoeRouteArgs ra;             /* its ids, weights, offsets, pair lists, active: backend memory, max_n tokens */
    MoeExperts ex;
};

/* A fixed pseudo-random pattern in [-1, 1) (xorshift), the same for every run. */
static void fill_pattern(float *v, size_t n, uint32_t seed) {
    uint32_t s = seed | 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        v[i] = (float)(s >> 8) / 8388608.0f - 1.0f;
    }
}

DeviceMoeBench *device_moe_bench_create(Backend *b, const Model *m, int layer, int max_n) {
    const ModelConfig *c = &m->cfg;
    CHECK(!b->host && b->moe_route && b->moe_mlp && model_layer_is_moe(c, layer) && max_n >= 1,
          "device_moe_bench_create: a device backend and an MoE layer (a bug in the caller)");
    DeviceMoeBench *mb = xcalloc(1, sizeof *mb);
    int E = c->n_experts, K = c->top_k, H = c->hidden, I = c->moe_intermediate;
    size_t NK = (size_t)max_n * K, big = (size_t)max_n * (H > E ? H : E);
    mb->b = b;
    mb->max_n = max_n;
    mb->hidden = H;
    mb->inter = I;
    /* the scratch a runner reserves (before it exists at start-up), so the path timed is the one its
     * steps take (the down GEMV's unpermute epilogue needs its counters) */
    if (b->reserve) b->reserve(b, max_n, H > I ? H : I);
    const void **h = xcalloc((size_t)9 * E, sizeof *h);
    model_moe_pointers(m, layer, h);
    mb->tab = b->alloc(b, (size_t)9 * E * sizeof *h);
    b->upload(b, (void *)mb->tab, h, (size_t)9 * E * sizeof *h);
    free(h);
    const LayerWeights *w = &m->layers[layer];
    mb->ex = (MoeExperts){w->egate, w->eup, w->edown, mb->tab, mb->tab + 3 * E,
                          w->egate[0].fmt == WF_NVFP4 ? mb->tab + 6 * E : NULL};
    float *host = xmalloc(sizeof(float) * big);
    mb->x = b->alloc(b, sizeof(float) * (size_t)max_n * H);
    fill_pattern(host, (size_t)max_n * H, 1);
    b->upload(b, mb->x, host, sizeof(float) * (size_t)max_n * H);
    mb->logits = b->alloc(b, sizeof(float) * (size_t)max_n * E);
    fill_pattern(host, (size_t)max_n * E, 2);
    b->upload(b, mb->logits, host, sizeof(float) * (size_t)max_n * E);
    free(host);
    mb->out = b->alloc(b, sizeof(float) * (size_t)max_n * H);
    mb->xg = b->alloc(b, sizeof(float) * NK * H);
    mb->g = b->alloc(b, sizeof(float) * NK * I);
    mb->u = b->alloc(b, sizeof(float) * NK * I);
    mb->ra = (MoeRouteArgs){.logits = mb->logits, .n_experts = E, .top_k = K, .norm = c->norm_topk_prob};
    mb->ra.ids = b->alloc(b, sizeof(int32_t) * NK);
    mb->ra.weights = b->alloc(b, sizeof(float) * NK);
    mb->ra.offsets = b->alloc(b, sizeof(int32_t) * (size_t)(E + 1));
    mb->ra.pair_tok = b->alloc(b, sizeof(int32_t) * NK);
    mb->ra.pair_w = b->alloc(b, sizeof(float) * NK);
    mb->ra.pair_of = b->alloc(b, sizeof(int32_t) * NK);
    mb->ra.active = b->alloc(b, sizeof(int32_t) * (size_t)E);
    return mb;
}

void device_moe_bench_route(DeviceMoeBench *mb, int n, MoeMlpArgs *a) {
    CHECK(n >= 1 && n <= mb->max_n, "device_moe_bench_route: %d tokens, %d reserved (a bug in the caller)", n,
          mb->max_n);
    mb->ra.n = n;
    mb->b->moe_route(mb->b, &mb->ra);
    *a = (MoeMlpArgs){.out = mb->out, .x = mb->x, .route = &mb->ra, .ex = mb->ex, .xg = mb->xg, .yg = mb->xg,
                      .g = mb->g, .u = mb->u, .hidden = mb->hidden, .inter = mb->inter};
}

void device_moe_bench_free(DeviceMoeBench *mb) {
    if (!mb) return;
    Backend *b = mb->b;
    void *bufs[] = {(void *)mb->tab, mb->x, mb->out, mb->xg, mb->g, mb->u, mb->logits, mb->ra.ids, mb->ra.weights,
                    mb->ra.offsets, mb->ra.pair_tok, mb->ra.pair_w, mb->ra.pair_of, mb->ra.active};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) b->release(b, bufs[i]);
    free(mb);
}

/* The backend's MoE timer as a NativeTimeFn: route n tokens, time both paths. */
static int time_moe(void *ctx, int n, float *wo_us, float *native_us) {
    DeviceMoeBench *mb = (DeviceMoeBench *)ctx;
    MoeMlpArgs a;
    device_moe_bench_route(mb, n, &a);
    return backend_cuda_moe_time(mb->b, &a, device_timing_reps, wo_us, native_us);
}

int device_moe_crossover_on(Backend *b, const Model *m, int layer, int max_n, NativeCrossover *out) {
    if (!backend_cuda_moe_time) return -1;
    DeviceMoeBench *mb = device_moe_bench_create(b, m, layer, max_n);
    int rc = device_native_crossover(time_moe, mb, max_n, out);
    device_moe_bench_free(mb);
    return rc;
}

/* The backend's GEMV-vs-mma MoE timer as a NativeTimeFn. */
static int time_moe_gemv(void *ctx, int n, float *gemv_us, float *mma_us) {
    DeviceMoeBench *mb = (DeviceMoeBench *)ctx;
    MoeMlpArgs a;
    device_moe_bench_route(mb, n, &a);
    return backend_cuda_moe_gemv_time(mb->b, &a, device_timing_reps, gemv_us, mma_us);
}

int device_moe_gemv_crossover_on(Backend *b, const Model *m, int layer, NativeCrossover *out) {
    if (!backend_cuda_moe_gemv_time) return -1;
    DeviceMoeBench *mb = device_moe_bench_create(b, m, layer, CUDA_GEMV_MAX_N);
    MoeMlpArgs a;
    device_moe_bench_route(mb, 1, &a);
    if (!b->moe_mlp || b->moe_mlp(b, &a) != 0) { /* experts the device does not group: nothing to choose */
        memset(out, 0, sizeof *out);
        out->min_n = INT_MAX;
        device_moe_bench_free(mb);
        return 1;
    }
    int rc = device_native_crossover(time_moe_gemv, mb, CUDA_GEMV_MAX_N, out);
    device_moe_bench_free(mb);
    return rc;
}

/* Every routed expert matrix of the model gets native_min_n (mma 0) or mma_min_n (mma 1) = min_n. */
static void experts_record(Model *m, int mma, int min_n) {
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const LayerWeights *w = &m->layers[l];
        for (int e = 0; w->egate && e < m->cfg.n_experts; e++) {
            WeightMat *ms[3] = {&w->egate[e], &w->eup[e], &w->edown[e]};
            for (int j = 0; j < 3; j++) *(mma ? &ms[j]->mma_min_n : &ms[j]->native_min_n) = min_n;
        }
    }
}

/* The routed experts' crossover (act_quant FP8 experts; others: nothing to choose). */
static int experts_calibrate(Backend *b, Model *m, int max_tokens, int fixed) {
    int layer = -1;
    for (int l = 0; layer < 0 && l < m->cfg.n_layers; l++)
        if (model_layer_is_moe(&m->cfg, l) && m->layers[l].egate && m->layers[l].egate[0].fmt == WF_FP8 &&
            m->layers[l].egate[0].act_quant)
            layer = l;
    if (layer < 0 || b->host || !b->moe_mlp) return 0;
    if (fixed > 0) {
        experts_record(m, 0, fixed);
        log_info("native crossover: --native-crossover %d: the routed experts take the native grouped GEMM from "
                 "%d tokens", fixed, fixed);
        return 0;
    }
    NativeCrossover x;
    int max_n = max_tokens < DEVICE_MOE_XOVER_MAX_N ? max_tokens : DEVICE_MOE_XOVER_MAX_N;
    if (device_moe_crossover_on(b, m, layer, max_n, &x) != 0) {
        experts_record(m, 0, 0);
        log_warn("native crossover: timing the routed experts on the device failed; they keep the constant "
                 "(native from %d tokens)", CUDA_NATIVE_MIN_N);
        return -1;
    }
    experts_record(m, 0, x.min_n);
    char desc[1024];
    crossover_describe(&x, desc, sizeof desc);
    log_info("native crossover: fp8 routed experts (%d of [%d x %d] / [%d x %d], top %d; layer %d, random routing): "
             "%s", m->cfg.n_experts, m->cfg.moe_intermediate, m->cfg.hidden, m->cfg.hidden, m->cfg.moe_intermediate,
             m->cfg.top_k, layer, desc);
    return 0;
}

int device_native_calibrate(Backend *b, Model *m, int max_tokens, int fixed) {
    if (!backend_cuda_native_kind || !backend_cuda_native_time || !m->act_quant) return 0;
    int ex_rc = experts_calibrate(b, m, max_tokens, fixed);
    enum { MAX_SHAPES = 64 };
    struct { int fmt, kind, rows, cols, min_n; } shapes[MAX_SHAPES];
    int n_shapes = 0, n_mats = 0;
    for (int i = 0; i < m->weights.n; i++) {
        WeightMat *w = m->weights.t[i].vec ? NULL : m->weights.t[i].mat;
        int kind = w ? backend_cuda_native_kind(w) : 0;
        if (!kind || model_is_routed_expert(m, w)) continue; /* experts: the grouped GEMM's own rule */
        n_mats++;
        if (fixed > 0) {
            w->native_min_n = fixed;
            continue;
        }
        int s = 0;
        while (s < n_shapes && !(shapes[s].fmt == (int)w->fmt && shapes[s].kind == kind && shapes[s].rows == w->rows &&
                                 shapes[s].cols == w->cols))
            s++;
        if (s == n_shapes) {
            if (n_shapes == MAX_SHAPES) { /* more distinct shapes than any model we know: the constant */
                w->native_min_n = 0;
                continue;
            }
            NativeCrossover x;
            if (device_native_crossover_on(b, w, max_tokens, &x) != 0) {
                log_warn("native crossover: timing [%d x %d] on the device failed; every act_quant matrix keeps "
                         "the constant (native from %d tokens)", w->rows, w->cols, CUDA_NATIVE_MIN_N);
                for (int j = 0; j < m->weights.n; j++)
                    if (!m->weights.t[j].vec && m->weights.t[j].mat) m->weights.t[j].mat->native_min_n = 0;
                return -1;
            }
            char desc[1024];
            crossover_describe(&x, desc, sizeof desc);
            log_info("native crossover: %s [%d x %d]: %s", w->fmt == WF_FP8 ? "fp8" : "nvfp4", w->rows, w->cols, desc);
            shapes[n_shapes].fmt = (int)w->fmt;
            shapes[n_shapes].kind = kind;
            shapes[n_shapes].rows = w->rows;
            shapes[n_shapes].cols = w->cols;
            shapes[n_shapes].min_n = x.min_n;
            n_shapes++;
        }
        w->native_min_n = shapes[s].min_n;
    }
    if (fixed > 0 && n_mats)
        log_info("native crossover: --native-crossover %d: %d act_quant matrices take the native GEMM from %d tokens",
                 fixed, n_mats, fixed);
    else if (n_mats)
        log_info("native crossover: %d act_quant matrices of %d shapes measured on the device (up to %d tokens)",
                 n_mats, n_shapes, max_tokens);
    return ex_rc;
}

/* ---- BF16 / FP8 / NVFP4 decode GEMVs: tiled or on tensor cores ---- */

/* The first size at which the timed tensor-core path disagreed with the other (CUDA_MMA_DISAGREES), or 0. */
static int mma_disagrees(const NativeCrossover *x) {
    for (int i = 0; i < x->points; i++)
        if (x->native_us[i] == CUDA_MMA_DISAGREES) return x->n[i];
    return 0;
}

typedef struct { Backend *b; const WeightMat *w; int presplit; } GemvTimeCtx;
static int time_gemv(void *ctx, int n, float *tile_us, float *mma_us) {
    const GemvTimeCtx *t = (const GemvTimeCtx *)ctx;
    return backend_cuda_gemv_time(t->b, t->w, n, device_timing_reps, t->presplit, tile_us, mma_us);
}

int device_gemv_calibrate_mats(Backend *b, WeightMat *const *mats, const unsigned char *norm_fed, int n) {
    if (!backend_cuda_gemv_time || b->host) return 0;
    enum { MAX_SHAPES = 64 };
    struct { int fmt, rows, cols, presplit, min_n; } shapes[MAX_SHAPES];
    int n_shapes = 0, n_mats = 0, n_mma = 0, presplit_min = 0;
    for (int i = 0; i < n; i++) {
        WeightMat *w = mats[i];
        if (!w->dev) continue;
        int pre = norm_fed && norm_fed[i] && w->fmt != WF_BF16, s = 0; /* FP8 / NVFP4 after a norm */
        while (s < n_shapes && !(shapes[s].fmt == (int)w->fmt && shapes[s].rows == w->rows &&
                                 shapes[s].cols == w->cols && shapes[s].presplit == pre))
            s++;
        if (s == n_shapes) {
            if (n_shapes == MAX_SHAPES) { /* more distinct shapes than any model we know: the tiled GEMV */
                w->mma_min_n = 0;
                continue;
            }
            NativeCrossover x;
            GemvTimeCtx t = {b, w, pre};
            if (device_native_crossover(time_gemv, &t, CUDA_GEMV_MAX_N, &x) != 0) {
                log_warn("gemv: timing [%d x %d] on the device failed; every matrix keeps the tiled GEMV",
                         w->rows, w->cols);
                for (int j = 0; j < n; j++) mats[j]->mma_min_n = 0;
                if (backend_cuda_gemv_presplit) backend_cuda_gemv_presplit(b, 0);
                return -1;
            }
            char desc[1024];
            const char *fn = w->fmt == WF_FP8 ? "fp8" : w->fmt == WF_NVFP4 ? "nvfp4" : "bf16";
            crossover_describe_as(&x, "tiled", "tensor cores", desc, sizeof desc);
            log_info("gemv: %s [%d x %d]%s at decode sizes: %s", fn, w->rows, w->cols,
                     pre ? " (after a norm: x split by it)" : "", desc);
            int bad_n = mma_disagrees(&x);
            if (bad_n) {
                log_warn("gemv: %s [%d x %d]: the tensor-core GEMV's result is not the tiled GEMV's at n = %d (more "
                         "than %g apart, relative): a kernel or device fault; this shape keeps the tiled GEMV",
                         fn, w->rows, w->cols, bad_n, CUDA_MMA_AGREE_TOL);
                x.min_n = INT_MAX;
            }
            shapes[n_shapes].fmt = (int)w->fmt;
            shapes[n_shapes].rows = w->rows;
            shapes[n_shapes].cols = w->cols;
            shapes[n_shapes].presplit = pre;
            shapes[n_shapes].min_n = x.min_n == INT_MAX ? 0 : x.min_n;
            n_shapes++;
        }
        w->mma_min_n = shapes[s].min_n;
        n_mats++;
        n_mma += w->mma_min_n > 0;
        if (pre && w->mma_min_n > 0 && (!presplit_min || w->mma_min_n < presplit_min)) presplit_min = w->mma_min_n;
    }
    /* the norms write the split from the smallest step at which a matrix after them takes the tensor cores:
     * each of those was timed without its own split, so it must not pay one */
    if (backend_cuda_gemv_presplit) backend_cuda_gemv_presplit(b, presplit_min);
    if (presplit_min)
        log_info("gemv: the norms write the FP8 / NVFP4 tensor-core GEMV's split of x from n = %d on (q/k/v and "
                 "gate/up launch no split of their own)", presplit_min);
    if (n_mats)
        log_info("gemv: %d BF16 / FP8 / NVFP4 matrices of %d shapes measured on the device; %d take the tensor-core "
                 "GEMV from their crossover (x as bf16 or f16 hi + lo), the rest the tiled GEMV at every decode size",
                 n_mats, n_shapes, n_mma);
    return 0;
}

int device_gemv_calibrate_experts(Backend *b, Model *m) {
    int layer = -1;
    for (int l = 0; layer < 0 && l < m->cfg.n_layers; l++)
        if (model_layer_is_moe(&m->cfg, l) && m->layers[l].egate && m->layers[l].egate[0].dev) layer = l;
    if (layer < 0 || !backend_cuda_moe_gemv_time || b->host || !b->moe_mlp) return 0;
    NativeCrossover x;
    int rc = device_moe_gemv_crossover_on(b, m, layer, &x);
    if (rc == 1) {
        experts_record(m, 1, 0);
        log_info("gemv: the routed experts are not grouped on the device (moe_mlp does not take their format or "
                 "shapes): they run one matmul at a time, nothing to choose");
        return 0;
    }
    if (rc != 0) {
        experts_record(m, 1, 0);
        log_warn("gemv: timing the routed experts on the device failed; they keep the grouped GEMV up to %d tokens",
                 CUDA_GEMV_MAX_N);
        return -1;
    }
    const WeightMat *g = &m->layers[layer].egate[0];
    const char *fn = g->fmt == WF_FP8 ? "fp8" : g->fmt == WF_NVFP4 ? "nvfp4" : "bf16";
    char desc[1024];
    crossover_describe_as(&x, "grouped GEMV", "grouped mma", desc, sizeof desc);
    log_info("gemv: %s routed experts (%d of [%d x %d] / [%d x %d], top %d; layer %d, random routing) at decode "
             "sizes: %s", fn, m->cfg.n_experts, m->cfg.moe_intermediate, m->cfg.hidden, m->cfg.hidden,
             m->cfg.moe_intermediate, m->cfg.top_k, layer, desc);
    int bad_n = mma_disagrees(&x);
    if (bad_n) {
        log_warn("gemv: %s routed experts: the grouped mma's output is not the grouped GEMV's at n = %d (more than "
                 "%g apart, relative): a kernel or device fault; the experts keep the grouped GEMV up to %d tokens",
                 fn, bad_n, CUDA_MMA_AGREE_TOL, CUDA_GEMV_MAX_N);
        x.min_n = INT_MAX;
    }
    experts_record(m, 1, x.min_n == INT_MAX ? 0 : x.min_n);
    return 0;
}

/* 1: w reads a norm's output (forward.c: q/k/v after the attention norm, gate/up after the MLP norm,
 * the router, lm_head after the final norm); 0: o (the attention's output) and down (the SwiGLU's). */
static int mat_norm_fed(const Model *m, const WeightMat *w) {
    for (int l = 0; l < m->cfg.n_layers; l++)
        if (w == &m->layers[l].o || w == &m->layers[l].down) return 0;
    return 1;
}

int device_gemv_calibrate(Backend *b, Model *m) {
    size_t cap = (size_t)(m->weights.n ? m->weights.n : 1);
    WeightMat **mats = xmalloc(sizeof *mats * cap);
    unsigned char *norm_fed = xmalloc(cap);
    int n = 0;
    for (int i = 0; i < m->weights.n; i++) {
        WeightMat *w = m->weights.t[i].mat; /* a tied lm_head too (its vec is the embedding) */
        if (!w || model_is_routed_expert(m, w)) continue; /* experts: moe_gemm.cu / moe_mma.cu, below */
        norm_fed[n] = (unsigned char)mat_norm_fed(m, w);
        mats[n++] = w;
    }
    int rc = device_gemv_calibrate_mats(b, mats, norm_fed, n);
    free(mats);
    free(norm_fed);
    int erc = device_gemv_calibrate_experts(b, m);
    return rc ? rc : erc;
}
