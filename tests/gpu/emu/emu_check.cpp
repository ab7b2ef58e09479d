/*
 * emu_check.cpp - the CUDA backend on the CPU emulation (shim/):
 *   1. the kernels' launchers against the CPU backend's reference ops, with
 *      NaN-poisoned outputs (index, masking, reduction and merge bugs);
 *   2. the fixture models end to end through backend_cuda_create and the
 *      device path of forward.c (host->device weight map, uploads, downloads,
 *      MoE gather/scatter) against transformers and the CPU backend, with the
 *      bounds of tests/gpu/gpu_check.c part 2 (the emulated cuBLAS GEMM is a
 *      plain loop, so only its call and layout are checked here).
 *   3. a CUDA failure injected into every CUDA call of a delta's device update
 *      in turn (shim: emu_fail_nth): the commit fails and restores the host
 *      and device copies bit for bit.
 * Same tolerance classes as tests/gpu/gpu_check.c. Small shapes (every
 * emulated CUDA thread is a thread). Not covered: real cuBLAS, timing, and
 * anything about real device memory or stream ordering.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_kernels.h"
#include "cuda_runtime.h" /* the shim: gemv_tile.cuh is device code */
#include "gemv_tile.cuh"
extern "C" {
#include "backend.h"
#include "delta.h"
#include "dtype.h"
#include "model.h"
#include "quant.h"
#include "safetensors.h"
}

static int n_pass, n_fail;
static uint64_t rs = 0x1234567887654321ull;
static float rf(void) {
    uint64_t z = (rs += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 8388608.0f) - 1.0f;
}
static uint32_t ru(uint32_t n) { return (uint32_t)((rf() + 1.0f) * 0.5f * n) % n; }
static float *vec(size_t n, float s) { float *p = (float *)malloc(sizeof(float) * (n ? n : 1)); for (size_t i = 0; i < n; i++) p[i] = s * rf(); return p; }
static float *nanv(size_t n) { float *p = (float *)malloc(sizeof(float) * (n ? n : 1)); memset(p, 0xff, sizeof(float) * n); return p; }
static uint16_t *bvec(size_t n, float m, float s) { uint16_t *p = (uint16_t *)malloc(2 * (n ? n : 1)); for (size_t i = 0; i < n; i++) p[i] = f32_to_bf16(m + s * rf()); return p; }

static void cmp(const char *what, int exact, const float *ref, const float *got, size_t n) {
    double se = 0, sr = 0, md = 0, mr = 0;
    size_t bad = 0, diff = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) && !isnan(ref[i])) { bad++; continue; }
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= 0)) diff++;
        se += d * d; sr += (double)ref[i] * ref[i];
        md = d > md ? d : md; mr = fabs(ref[i]) > mr ? fabs(ref[i]) : mr;
    }
    double nmse = sr > 0 ? se / sr : se, rel = mr > 0 ? md / mr : md;
    int ok = bad == 0 && (exact ? diff == 0 : nmse <= 1e-10 && rel <= 3e-5);
    ok ? n_pass++ : n_fail++;
    printf("  %-4s %-60s nmse %.2e rel %.2e unwritten %zu\n", ok ? "ok" : "FAIL", what, nmse, rel, bad);
}

static Backend *bc;

static void t_gemv(int n, int rows, int cols, int bias, int misalign) {
    float *xbuf = vec((size_t)n * cols + 1, 1), *x = xbuf + misalign;
    uint16_t *w = bvec((size_t)rows * cols, 0, 0.05f), *b = bias ? bvec(rows, 0, 1) : NULL;
    WeightMat hw = {WF_BF16, rows, cols, w, NULL};
    float *ref = (float *)malloc(sizeof(float) * n * rows), *got = nanv((size_t)n * rows);
    bc->matmul(bc, ref, x, n, &hw, b);
    int rc = cuda_gemv_bf16(got, x, n, w, rows, cols, b, NULL);
    char s[128];
    snprintf(s, sizeof s, "gemv n %d [%d x %d]%s%s rc %d", n, rows, cols, bias ? " +bias" : "", misalign ? " misaligned x" : "", rc);
    cmp(s, 0, ref, got, (size_t)n * rows);
    free(xbuf); free(w); free(b); free(ref); free(got);
}

/* The tiled GEMV's decoders (gemv_tile.cuh; their portable paths, which share the
 * PRMT selectors with the device) against the scalar references, bit for bit: every
 * byte value in every byte of a word through e2m1x8 (both nibbles: all 16 codes in
 * all 8 positions) vs e2m1_to_f32, and every byte through e4m3x4 (NaN for NaN). */
static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static void t_decode(void) {
    size_t bad = 0;
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t u = b | ((b + 85) & 0xffu) << 8 | ((b + 170) & 0xffu) << 16 | ((b + 37) & 0xffu) << 24;
        float w[8];
        e2m1x8(u, w);
        for (int i = 0; i < 8; i++)
            if (f32_bits(w[i]) != f32_bits(e2m1_to_f32(u >> (4 * i) & 0xfu)) && bad++ < 4)
                printf("       e2m1x8 word 0x%08x value %d: 0x%08x, want 0x%08x\n", u, i, f32_bits(w[i]),
                       f32_bits(e2m1_to_f32(u >> (4 * i) & 0xfu)));
        e4m3x4(u, w);
        for (int i = 0; i < 4; i++) {
            float want = e4m3_to_f32(u >> (8 * i) & 0xffu);
            if ((isnan(want) ? !isnan(w[i]) : f32_bits(w[i]) != f32_bits(want)) && bad++ < 4)
                printf("       e4m3x4 word 0x%08x value %d: 0x%08x, want 0x%08x\n", u, i, f32_bits(w[i]), f32_bits(want));
        }
    }
    bad ? n_fail++ : n_pass++;
    printf("  %-4s %-60s mismatches %zu\n", bad ? "FAIL" : "ok", "e2m1x8 / e4m3x4 decode of all 256 bytes vs scalar", bad);
}

/* Weight-only FP8 / NVFP4 GEMV (quant_gemv.cu) against quant_matmul_*_rows(xs = NULL) plus
 * the bias the CPU backend adds; fresh random bf16 masters quantized here, f32 class. */
static void t_qgemv(int nvfp4, int n, int rows, int cols, QuantFp8Layout layout, int bias, int misalign) {
    Err err = {};
    float *xbuf = vec((size_t)n * cols + 1, 1), *x = xbuf + misalign;
    uint16_t *w = bvec((size_t)rows * cols, 0, 0.05f), *b = bias ? bvec(rows, 0, 1) : NULL;
    float *ref = (float *)malloc(sizeof(float) * n * rows), *got = nanv((size_t)n * rows);
    int rc;
    char s[160];
    if (nvfp4) {
        QuantNvfp4 *q = quant_nvfp4_from_bf16(w, rows, cols, &err);
        quant_matmul_nvfp4_rows(ref, x, NULL, q, n, 0, rows);
        rc = cuda_gemv_nvfp4(got, x, n, q->packed, q->scale, q->scale2, rows, cols, b, NULL);
        quant_nvfp4_free(q);
    } else {
        QuantFp8 *q = quant_fp8_from_bf16(w, rows, cols, layout, &err);
        quant_matmul_fp8_rows(ref, x, NULL, q, n, 0, rows);
        rc = cuda_gemv_fp8(got, x, n, q->q, q->scale_inv, rows, cols, q->block_rows, q->block_cols, b, NULL);
        quant_fp8_free(q);
    }
    if (b)
        for (int t = 0; t < n; t++)
            for (int r = 0; r < rows; r++) ref[(size_t)t * rows + r] += bf16_to_f32(b[r]);
    snprintf(s, sizeof s, "%s gemv n %d [%d x %d]%s%s%s rc %d", nvfp4 ? "nvfp4" : "fp8", n, rows, cols,
             nvfp4 ? "" : layout == QUANT_FP8_BLOCK128 ? " block128" : layout == QUANT_FP8_PER_CHANNEL ? " per-channel" : " per-tensor",
             bias ? " +bias" : "", misalign ? " misaligned x" : "", rc);
    cmp(s, 0, ref, got, (size_t)n * rows);
    free(xbuf); free(w); free(b); free(ref); free(got);
}

/* Delta scatter (scatter.cu) against the host loop, elem 1/2/4, repeated and
 * out-of-range indices (skipped by scatter, zero bytes from gather). */
static void t_scatter(int64_t numel, int64_t n, int elem) {
    uint8_t *dst = (uint8_t *)malloc((size_t)numel * elem), *ref = (uint8_t *)malloc((size_t)numel * elem);
    uint8_t *val = (uint8_t *)malloc((size_t)n * elem), *back = (uint8_t *)malloc((size_t)n * elem);
    int64_t *idx = (int64_t *)malloc(sizeof(int64_t) * (size_t)n);
    for (int64_t i = 0; i < numel * elem; i++) dst[i] = ref[i] = (uint8_t)ru(256);
    for (int64_t i = 0; i < n; i++) {
        idx[i] = i == 3 ? numel + 5 : i == 4 ? -1 : i * (numel / n) + (int64_t)ru((uint32_t)(numel / n)); /* distinct; two out of range */
        for (int k = 0; k < elem; k++) val[i * elem + k] = (uint8_t)ru(256);
    }
    idx[n - 1] = idx[0]; /* a repeat with the same value: the result must not depend on order */
    memcpy(val + (n - 1) * elem, val, (size_t)elem);
    for (int64_t i = 0; i < n; i++)
        if (idx[i] >= 0 && idx[i] < numel) memcpy(ref + idx[i] * elem, val + i * elem, (size_t)elem);
    int rc = cuda_scatter(dst, numel, idx, val, n, elem, NULL, NULL) | cuda_gather(back, dst, numel, idx, n, elem, NULL, NULL);
    size_t bad = memcmp(dst, ref, (size_t)numel * elem) != 0;
    for (int64_t i = 0; i < n; i++)
        for (int k = 0; k < elem; k++)
            bad += back[i * elem + k] != (idx[i] >= 0 && idx[i] < numel ? val[i * elem + k] : 0);
    int ok = rc == 0 && bad == 0;
    ok ? n_pass++ : n_fail++;
    printf("  %-4s scatter + gather back: %lld of %lld elements of %d bytes (rc %d, %zu wrong)\n", ok ? "ok" : "FAIL",
           (long long)n, (long long)numel, elem, rc, bad);
    free(dst); free(ref); free(val); free(back); free(idx);
}

static void t_rmsnorm(int n, int dim) {
    float *x = vec((size_t)n * dim, 3), *ref = (float *)malloc(sizeof(float) * n * dim), *got = nanv((size_t)n * dim);
    uint16_t *w = bvec(dim, 1, 0.5f);
    bc->rmsnorm(bc, ref, x, w, n, dim, 1e-6f);
    cuda_rmsnorm(got, x, w, n, dim, 1e-6f, NULL);
    char s[96];
    snprintf(s, sizeof s, "rmsnorm n %d dim %d", n, dim);
    cmp(s, 0, ref, got, (size_t)n * dim);
    memcpy(got, x, sizeof(float) * n * dim);
    cuda_rmsnorm(got, got, w, n, dim, 1e-6f, NULL);
    snprintf(s, sizeof s, "rmsnorm n %d dim %d in place", n, dim);
    cmp(s, 0, ref, got, (size_t)n * dim);
    free(x); free(ref); free(got); free(w);
}

static void t_add_rmsnorm(int n, int dim) {
    size_t N = (size_t)n * dim;
    float *x = vec(N, 3), *y = vec(N, 3), *gx = (float *)malloc(sizeof(float) * N), *ref = (float *)malloc(sizeof(float) * N),
          *got = nanv(N);
    uint16_t *w = bvec(dim, 1, 0.5f);
    memcpy(gx, x, sizeof(float) * N);
    bc->add(bc, x, y, N);
    bc->rmsnorm(bc, ref, x, w, n, dim, 1e-6f);
    int rc = cuda_add_rmsnorm(got, gx, y, w, n, dim, 1e-6f, NULL);
    char s[96];
    snprintf(s, sizeof s, "add_rmsnorm n %d dim %d residual rc %d", n, dim, rc);
    cmp(s, 1, x, gx, N);
    snprintf(s, sizeof s, "add_rmsnorm n %d dim %d normed", n, dim);
    cmp(s, 0, ref, got, N);
    free(x); free(y); free(gx); free(ref); free(got); free(w);
}

static void t_norm_rope(int n, int heads, int hd, int norm) {
    size_t N = (size_t)n * heads * hd, h2 = hd / 2;
    float *x = vec(N, 2), *ref = (float *)malloc(sizeof(float) * N), *cs = vec(n * h2, 1), *sn = vec(n * h2, 1);
    memcpy(ref, x, sizeof(float) * N);
    uint16_t *w = norm ? bvec(hd, 1, 0.5f) : NULL;
    bc->norm_rope(bc, ref, n, heads, hd, w, 1e-6f, cs, sn);
    cuda_norm_rope(x, n, heads, hd, w, 1e-6f, cs, sn, NULL);
    char s[96];
    snprintf(s, sizeof s, "norm_rope n %d heads %d hd %d%s", n, heads, hd, norm ? " +norm" : "");
    cmp(s, 0, ref, x, N);
    free(x); free(ref); free(cs); free(sn); free(w);
}

static void t_attention(int n_seqs, const int *toks, const int *last, int nh, int nkv, int hd, int bs, int sms) {
    int max_pos = 0, n = 0;
    for (int s = 0; s < n_seqs; s++) { max_pos = last[s] > max_pos ? last[s] : max_pos; n += toks[s]; }
    int stride = max_pos / bs + 1, nb = n_seqs * stride + 2;
    size_t slot = (size_t)nkv * hd, cache = (size_t)nb * bs * slot, N = (size_t)n * nh * hd;
    float *kc = vec(cache, 1), *vc = vec(cache, 1), *q = vec(N, 1), *ref = (float *)malloc(sizeof(float) * N), *got = nanv(N);
    int32_t *bt = (int32_t *)malloc(sizeof(int32_t) * nb), *pos = (int32_t *)malloc(4 * n), *seq = (int32_t *)malloc(4 * n);
    for (int i = 0; i < nb; i++) bt[i] = i;
    for (int i = nb - 1; i > 0; i--) { int j = (int)ru(i + 1), t = bt[i]; bt[i] = bt[j]; bt[j] = t; }
    for (int s = 0, k = 0; s < n_seqs; s++)
        for (int i = 0; i < toks[s]; i++, k++) { pos[k] = last[s] - toks[s] + 1 + i; seq[k] = s; }
    AttnArgs a = {ref, q, kc, vc, pos, seq, bt, stride, n, nh, nkv, hd, bs, 1.0f / sqrtf((float)hd)};
    bc->attention(bc, &a);
    a.out = got;
    int splits = cuda_attention_splits(n, nh, nkv, max_pos + 1, sms);
    float *part = nanv((size_t)splits * N / hd * (hd + 2));
    int rc = cuda_attention(&a, part, splits, NULL);
    char s[128];
    snprintf(s, sizeof s, "attention tokens %d pos<=%d heads %d/%d hd %d bs %d splits %d rc %d", n, max_pos, nh, nkv, hd, bs, splits, rc);
    cmp(s, 0, ref, got, N);
    free(kc); free(vc); free(q); free(ref); free(got); free(bt); free(pos); free(seq); free(part);
}

static void t_rows(int n_src, int n, int dim) {
    size_t S = (size_t)n_src * dim, N = (size_t)n * dim;
    float *src = vec(S, 1), *k = vec(N, 1), *v = vec(N, 1), *w = vec(n, 1);
    int32_t *rows = (int32_t *)malloc(4 * n), *slots = (int32_t *)malloc(4 * n);
    for (int i = 0; i < n; i++) { rows[i] = (int32_t)ru(n_src); slots[i] = (i * 7 + 3) % n_src; }
    float *ref = (float *)malloc(sizeof(float) * S), *got = nanv(S), *ref2 = (float *)malloc(sizeof(float) * S), *got2 = (float *)malloc(sizeof(float) * S);
    char s[96];
    bc->gather_rows(bc, ref, src, rows, n, dim);
    cuda_gather_rows(got, src, rows, n, dim, NULL);
    snprintf(s, sizeof s, "gather_rows n %d dim %d", n, dim);
    cmp(s, 1, ref, got, N);
    memcpy(ref, src, sizeof(float) * S); memcpy(got, src, sizeof(float) * S);
    bc->scale_add_rows(bc, ref, k, rows, w, n, dim);
    cuda_scale_add_rows(got, k, rows, w, n, dim, NULL);
    snprintf(s, sizeof s, "scale_add_rows n %d dim %d", n, dim);
    cmp(s, 0, ref, got, S);
    memcpy(ref, src, sizeof(float) * S); memcpy(got, src, sizeof(float) * S);
    memcpy(ref2, src, sizeof(float) * S); memcpy(got2, src, sizeof(float) * S);
    bc->kv_write(bc, ref, ref2, k, v, slots, n, dim);
    cuda_kv_write(got, got2, k, v, slots, n, dim, NULL);
    snprintf(s, sizeof s, "kv_write n %d slot %d", n, dim);
    cmp(s, 1, ref, got, S);
    cmp(s, 1, ref2, got2, S);
    free(src); free(k); free(v); free(w); free(rows); free(slots); free(ref); free(got); free(ref2); free(got2);
}

static void t_elementwise(int n, int vocab, int dim) {
    float *g = vec(n, 8), *u = vec(n, 2), *ref = (float *)malloc(sizeof(float) * n), *got = nanv(n);
    bc->swiglu(bc, ref, g, u, n);
    cuda_swiglu(got, g, u, n, NULL);
    cmp("swiglu", 0, ref, got, n);
    memcpy(ref, g, sizeof(float) * n); memcpy(got, g, sizeof(float) * n);
    bc->add(bc, ref, u, n);
    cuda_add(got, u, n, NULL);
    cmp("add", 1, ref, got, n);
    uint16_t *emb = bvec((size_t)vocab * dim, 0, 1), *hb = (uint16_t *)malloc(2 * n);
    int32_t tok[5];
    for (int i = 0; i < 5; i++) tok[i] = (int32_t)ru(vocab);
    float *er = (float *)malloc(sizeof(float) * 5 * dim), *eg = nanv(5 * dim);
    bc->embed(bc, er, emb, tok, 5, dim);
    cuda_embed(eg, emb, tok, 5, dim, NULL);
    cmp("embed", 1, er, eg, 5 * dim);
    cuda_f32_to_bf16(hb, g, n, NULL);
    size_t bad = 0;
    for (int i = 0; i < n; i++) bad += hb[i] != f32_to_bf16(g[i]);
    bad ? n_fail++ : n_pass++;
    printf("  %-4s f32_to_bf16 equals dtype.h f32_to_bf16 (%zu differ)\n", bad ? "FAIL" : "ok", bad);
    float *o = vec(3 * 40, 1), *o2 = (float *)malloc(sizeof(float) * 120);
    uint16_t *bias = bvec(40, 0, 1);
    memcpy(o2, o, sizeof(float) * 120);
    for (int t = 0; t < 3; t++) for (int r = 0; r < 40; r++) o2[t * 40 + r] += bf16_to_f32(bias[r]);
    cuda_add_bias(o, bias, 3, 40, NULL);
    cmp("add_bias", 1, o2, o, 120);
    free(g); free(u); free(ref); free(got); free(emb); free(hb); free(er); free(eg); free(o); free(o2); free(bias);
}

/* ---- 2. fixture models ---- */
static void (*cpu_mm)(Backend *, float *, const float *, int, const WeightMat *, const uint16_t *);
/* The CPU matmul rounding its input to bf16 where the GPU path does (cuBLAS, n > CUDA_GEMV_MAX_N). */
static void mm_bf16act(Backend *b, float *out, const float *x, int n, const WeightMat *w, const uint16_t *bias) {
    if (n <= CUDA_GEMV_MAX_N || w->fmt != WF_BF16) { /* FP8/NVFP4: the GPU runs f32 x for every n */
        cpu_mm(b, out, x, n, w, bias);
        return;
    }
    size_t N = (size_t)n * w->cols;
    float *xr = (float *)malloc(sizeof(float) * N);
    for (size_t i = 0; i < N; i++) xr[i] = bf16_to_f32(f32_to_bf16(x[i]));
    cpu_mm(b, out, xr, n, w, bias);
    free(xr);
}

static void logit_check(const char *what, const float *ref, const float *got, int rows, int V, double max_abs, double max_kl) {
    double ma = 0, mk = 0;
    for (int r = 0; r < rows; r++) {
        const float *a = ref + (size_t)r * V, *b = got + (size_t)r * V;
        double xa = -INFINITY, xb = -INFINITY, sa = 0, sb = 0, kl = 0;
        for (int i = 0; i < V; i++) {
            double d = fabs((double)a[i] - b[i]);
            if (!(d <= ma)) ma = d;
            xa = a[i] > xa ? a[i] : xa;
            xb = b[i] > xb ? b[i] : xb;
        }
        for (int i = 0; i < V; i++) { sa += exp(a[i] - xa); sb += exp(b[i] - xb); }
        for (int i = 0; i < V; i++) {
            double la = a[i] - xa - log(sa), lb = b[i] - xb - log(sb);
            kl += exp(la) * (la - lb);
        }
        if (!(kl <= mk)) mk = kl;
    }
    int ok = ma <= max_abs && mk <= max_kl;
    ok ? n_pass++ : n_fail++;
    printf("  %-4s %-58s max|dlogit| %.2e KL %.2e\n", ok ? "ok" : "FAIL", what, ma, mk);
}

/* prec != PREC_BF16: the decoder linears quantized weight-only on load (model_quantize), the
 * same Model on both backends; compared with the CPU only (transformers is BF16). */
static void t_model(const char *dir, int n_decode, Precision prec) {
    Err err = {};
    Model *m = NULL;
    SafeTensors *ref = NULL;
    char path[512], what[160];
    snprintf(path, sizeof path, "%s/ref.safetensors", dir);
    if (model_load(&m, dir, &err) || (prec != PREC_BF16 && model_quantize(m, prec, 1, &err)) ||
        safetensors_open(&ref, path, &err)) {
        printf("  FAIL %s: %s\n", dir, err.msg);
        n_fail++;
        return;
    }
    int V = m->cfg.vocab;
    Backend *cpu = backend_cpu_create(1, 128);
    cpu_mm = cpu->matmul;
    cpu->matmul = mm_bf16act;
    Backend *gb = backend_cuda_create(m, 128);
    Runner *rc = runner_create_with(m, cpu, 128, 128), *rg = runner_create_with(m, gb, 128, 128);
    KVCache *kvc = runner_kvcache_create(rc, 80, 4), *kvg = runner_kvcache_create(rg, 80, 4);
    const StTensor *t0 = safetensors_get(ref, "seq0.tokens"), *t1 = safetensors_get(ref, "seq1.tokens");
    const StTensor *lp = safetensors_get(ref, "seq0.prefill_logits"), *ld = safetensors_get(ref, "seq0.decode_logits");
    /* EMU_QUICK (sanitizers: one OS thread per CUDA thread, every warp shuffle a
     * pthread barrier): the first 3 positions only (causal, so the reference rows
     * still apply) and no mixed step */
    int quick = getenv("EMU_QUICK") != NULL;
    int T0 = (int)t0->numel, T1 = t1 && !quick ? (int)t1->numel : 0;
    if (quick && T0 > 3) T0 = 3;
    int32_t bt0[32], bt1[32], pos[128], seq[128], rows[128], tok[128];
    for (int i = 0; i < 32; i++) { bt0[i] = 1 + 2 * i; bt1[i] = 78 - 2 * i; }
    const int32_t *tables[2] = {bt0, bt1};
    float *oc = (float *)malloc(sizeof(float) * 128 * V), *og = (float *)malloc(sizeof(float) * 128 * V);
    /* prefill of seq0 */
    for (int i = 0; i < T0; i++) { pos[i] = i; seq[i] = 0; rows[i] = i; }
    Batch b = {T0, (const int32_t *)t0->data, pos, seq, 1, tables, T0, rows};
    int rc1 = model_forward(rc, kvc, &b, oc, &err), rc2 = model_forward(rg, kvg, &b, og, &err);
    if (rc1 || rc2) { printf("  FAIL %s prefill: %s\n", dir, err.msg); n_fail++; }
    const char *pn = precision_name(prec);
    if (prec == PREC_BF16) {
        snprintf(what, sizeof what, "%s prefill %d vs transformers", dir, T0);
        logit_check(what, (const float *)lp->data, og, T0, V, 0.2, 1e-3);
    }
    snprintf(what, sizeof what, "%s %s prefill %d vs cpu (bf16 act)", dir, pn, T0);
    logit_check(what, oc, og, T0, V, 1e-3, 1e-7);
    /* decode steps of seq0 */
    for (int i = 0; i < n_decode && ld && i < T0; i++) {
        int32_t zero = 0;
        Batch b1 = {1, (const int32_t *)t0->data + i, pos + i, seq, 1, tables, 1, &zero};
        rc1 = model_forward(rc, kvc, &b1, oc, &err);
        rc2 = model_forward(rg, kvg, &b1, og, &err);
        if (rc1 || rc2) { printf("  FAIL %s decode: %s\n", dir, err.msg); n_fail++; }
        if (prec == PREC_BF16) {
            snprintf(what, sizeof what, "%s decode pos %d vs transformers", dir, i);
            logit_check(what, (const float *)ld->data + (size_t)i * V, og, 1, V, 1e-3, 1e-7);
        }
        snprintf(what, sizeof what, "%s %s decode pos %d vs cpu", dir, pn, i);
        logit_check(what, oc, og, 1, V, 1e-3, 1e-7);
    }
    /* two sequences in one step (seq1 prefill + the next seq0 token), a few output rows */
    if (T1 && T1 + 1 <= 128) {
        int k = 0;
        for (int i = 0; i < T1; i++, k++) { tok[k] = ((const int32_t *)t1->data)[i]; pos[k] = i; seq[k] = 1; }
        tok[k] = ((const int32_t *)t0->data)[T0 - 1]; pos[k] = T0 - 1; seq[k] = 0; k++;
        int32_t outr[3] = {0, T1 - 1, T1};
        Batch b2 = {k, tok, pos, seq, 2, tables, 3, outr};
        rc1 = model_forward(rc, kvc, &b2, oc, &err);
        rc2 = model_forward(rg, kvg, &b2, og, &err);
        if (rc1 || rc2) { printf("  FAIL %s mixed: %s\n", dir, err.msg); n_fail++; }
        snprintf(what, sizeof what, "%s %s mixed step of %d tokens vs cpu", dir, pn, k);
        logit_check(what, oc, og, 3, V, 0.1, 3e-4); /* cuBLAS path: see gpu_check.c MAX_ABS_FLIP */
    }
    /* A sparse delta on layer 0's o_proj master, as admin_touched applies it: BF16 scatters the
     * touched elements into the device copy (verified read-back); FP8/NVFP4 re-quantize on the
     * host and re-upload the quantized bytes. Then the prefill again vs the cpu. */
    {
        WeightMat *w = &m->layers[0].o;
        for (int i = 0; i < T0; i++) { pos[i] = i; seq[i] = 0; rows[i] = i; } /* the mixed step reused them */
        float *before = (float *)malloc(sizeof(float) * (size_t)T0 * V);
        rc1 = model_forward(rc, kvc, &b, before, &err);
        int64_t idx[24];
        for (int i = 0; i < 24; i++) {
            idx[i] = (int64_t)ru((uint32_t)((size_t)w->rows * w->cols));
            w->bf16[idx[i]] = f32_to_bf16(i % 2 ? 0.75f : -0.75f);
        }
        for (int i = 1; i < 24; i++) /* increasing, unique, as delta commit passes them */
            for (int j = i; j > 0 && idx[j - 1] > idx[j]; j--) { int64_t t = idx[j]; idx[j] = idx[j - 1]; idx[j - 1] = t; }
        int n_idx = 1;
        for (int i = 1; i < 24; i++) if (idx[i] != idx[n_idx - 1]) idx[n_idx++] = idx[i];
        int rq = prec == PREC_BF16 ? 0
                 : prec == PREC_FP8 ? quant_fp8_requant((QuantFp8 *)w->q, w->bf16, idx, n_idx, &err)
                                    : quant_nvfp4_requant((QuantNvfp4 *)w->q, w->bf16, idx, n_idx, &err);
        size_t wb = sizeof(uint16_t) * (size_t)w->rows * w->cols;
        int ru1 = runner_weights_changed(rg, w->bf16, wb, idx, n_idx, 2, &err);
        rc1 |= model_forward(rc, kvc, &b, oc, &err);
        rc2 = model_forward(rg, kvg, &b, og, &err);
        if (rq < 0 || ru1 || rc1 || rc2) { printf("  FAIL %s delta: %s\n", dir, err.msg); n_fail++; }
        if (prec == PREC_BF16) { /* the device copy must now hash like the host master */
            uint16_t *dev = (uint16_t *)malloc(wb);
            int same = backend_cuda_read_weight(gb, w->bf16, dev, wb) == 0 && memcmp(dev, w->bf16, wb) == 0;
            same ? n_pass++ : n_fail++;
            printf("  %-4s %s bf16 delta: device copy equals the host master after the scatter\n", same ? "ok" : "FAIL", dir);
            free(dev);
        }
        double moved = 0;
        for (size_t i = 0; i < (size_t)T0 * V; i++) moved = fmax(moved, fabs((double)oc[i] - before[i]));
        int ok = moved > 1e-2; /* else a stale device copy would pass unnoticed */
        ok ? n_pass++ : n_fail++;
        printf("  %-4s %s %s delta on layer 0 o_proj moved the cpu logits by %.2e\n", ok ? "ok" : "FAIL", dir, pn, moved);
        snprintf(what, sizeof what, "%s %s prefill after the delta vs cpu", dir, pn);
        logit_check(what, oc, og, T0, V, prec == PREC_BF16 ? 0.1 : 1e-3, prec == PREC_BF16 ? 3e-4 : 1e-7);
        free(before);
    }
    free(oc);
    free(og);
    runner_kvcache_free(rg, kvg);
    runner_kvcache_free(rc, kvc);
    runner_free(rg);
    runner_free(rc);
    safetensors_free(ref);
    model_free(m);
}


/* ---- 3. a CUDA failure while a delta updates the device copy ----
 * The touched hook of the server (api_admin.c admin_touched: re-quantize, then
 * runner_weights_changed) over the emulated backend, and a delta of three kinds
 * of update: a sparse o_proj (BF16: the verified scatter), every 8th element of
 * down_proj (too many for a scatter: a re-upload with indices) and a dense
 * final norm (a re-upload); at FP8/NVFP4 the two matrices re-upload their
 * quantized bytes. Each fallible CUDA call of the commit fails once in turn
 * (the k-th, k = 1, 2, ... until the commit runs out of calls): the commit must
 * fail, keep the version, and leave every touched buffer (BF16 master,
 * quantized host bytes, device copies) bit-identical to before. Then the commit
 * with no failure succeeds and the device copies equal the host. */
typedef struct FaultCtx { Model *m; Runner *r; } FaultCtx;
static int fault_touched(void *ctx, const char *name, void *data, Dtype dt, int64_t numel, const int64_t *idx,
                         int64_t n_idx, Err *err) {
    FaultCtx *f = (FaultCtx *)ctx;
    int rc = delta_model_requant(f->m, name, data, dt, numel, idx, n_idx, err);
    if (rc == 0)
        rc = runner_weights_changed(f->r, data, (size_t)numel * (size_t)dtype_size(dt), idx, n_idx, (int)dtype_size(dt), err);
    return rc;
}

typedef struct FaultBuf { const void *host; size_t bytes; int dev; uint8_t *h0, *d0; } FaultBuf;
static void fault_bufs_add(FaultBuf *b, int *n, const void *host, size_t bytes, int dev) {
    b[*n] = FaultBuf{host, bytes, dev, (uint8_t *)malloc(bytes), (uint8_t *)malloc(bytes)};
    (*n)++;
}
static void fault_bufs_mat(FaultBuf *b, int *n, const WeightMat *w) {
    size_t rows = (size_t)w->rows, cols = (size_t)w->cols;
    fault_bufs_add(b, n, w->bf16, 2 * rows * cols, w->fmt == WF_BF16);
    if (w->fmt == WF_FP8) {
        const QuantFp8 *q = (const QuantFp8 *)w->q;
        fault_bufs_add(b, n, q->q, rows * cols, 1);
        fault_bufs_add(b, n, q->scale_inv, sizeof(float) * (size_t)q->scale_rows * q->scale_cols, 1);
    } else if (w->fmt == WF_NVFP4) {
        const QuantNvfp4 *q = (const QuantNvfp4 *)w->q;
        fault_bufs_add(b, n, q->packed, rows * cols / 2, 1);
        fault_bufs_add(b, n, q->scale, rows * cols / QUANT_NVFP4_BLOCK, 1);
    }
}
/* Buffers differing from the snapshot (snap = 1: take it; host and device). */
static int fault_bufs_diff(Backend *gb, FaultBuf *b, int n, int snap) {
    int bad = 0;
    for (int i = 0; i < n; i++) {
        uint8_t *d = (uint8_t *)malloc(b[i].bytes);
        int rd = b[i].dev ? backend_cuda_read_weight(gb, b[i].host, d, b[i].bytes) : 0;
        if (snap) {
            memcpy(b[i].h0, b[i].host, b[i].bytes);
            memcpy(b[i].d0, b[i].dev ? d : (const uint8_t *)b[i].host, b[i].bytes);
            bad += rd != 0;
        } else {
            bad += rd != 0 || memcmp(b[i].h0, b[i].host, b[i].bytes) != 0 ||
                   (b[i].dev && memcmp(b[i].d0, d, b[i].bytes) != 0);
        }
        free(d);
    }
    return bad;
}
static int fault_bufs_device_is_host(Backend *gb, FaultBuf *b, int n) {
    int bad = 0;
    for (int i = 0; i < n; i++) {
        if (!b[i].dev) continue;
        uint8_t *d = (uint8_t *)malloc(b[i].bytes);
        bad += backend_cuda_read_weight(gb, b[i].host, d, b[i].bytes) != 0 || memcmp(d, b[i].host, b[i].bytes) != 0;
        free(d);
    }
    return bad;
}

static void t_delta_fault(const char *dir, Precision prec) {
    Err err = {};
    Model *m = NULL;
    LoadOptions o = {prec, 1};
    const char *pn = precision_name(prec);
    if (model_load_opts(&m, dir, &o, &err)) {
        printf("  FAIL %s: %s\n", dir, err.msg);
        n_fail++;
        return;
    }
    Backend *gb = backend_cuda_create(m, 128);
    Runner *r = runner_create_with(m, gb, 16, 128);
    WeightVersion *wv = weight_version_from_safetensors(m->st, 1);
    const char *names[3] = {"model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.o_proj.weight",
                            "model.norm.weight"};
    DeltaRecord rec[3];
    int64_t o_idx[24], n_o = 0;
    for (int t = 0; t < 3; t++) {
        const StTensor *st = safetensors_get(m->st, names[t]);
        Dtype dt;
        int64_t numel = 0;
        uint16_t *cur = (uint16_t *)delta_lookup_model(m, names[t], &dt, &numel);
        if (!st || !cur || dt != DT_BF16) {
            printf("  FAIL %s: no BF16 tensor %s\n", dir, names[t]);
            n_fail++;
            return;
        }
        uint16_t *nw = (uint16_t *)malloc(2 * (size_t)numel);
        memcpy(nw, cur, 2 * (size_t)numel);
        if (t == 0)
            for (int64_t i = 0; i < numel; i += 8) nw[i] = f32_to_bf16(bf16_to_f32(nw[i]) + 0.25f);
        else if (t == 2)
            for (int64_t i = 0; i < numel; i++) nw[i] = f32_to_bf16(bf16_to_f32(nw[i]) * 1.5f + 0.125f);
        else
            for (int i = 0; i < 24; i++) {
                int64_t j = (int64_t)i * (numel / 24) + 5;
                nw[j] = f32_to_bf16(i % 2 ? 0.75f : -0.75f);
                if (nw[j] != cur[j]) o_idx[n_o++] = j;
            }
        if (delta_encode_tensor(&rec[t], names[t], dt, st->ndim, st->shape, cur, nw, 3, 0, &err)) {
            printf("  FAIL %s: encode: %s\n", dir, err.msg);
            n_fail++;
            return;
        }
        free(nw);
    }
    DeltaHeader h = {};
    h.fingerprint = wv->fingerprint;
    h.target_version = 1;
    size_t size = 0;
    uint8_t *buf = delta_serialize(&h, rec, 3, &size);
    FaultBuf bufs[12];
    int nb = 0;
    fault_bufs_mat(bufs, &nb, &m->layers[0].down);
    fault_bufs_mat(bufs, &nb, &m->layers[0].o);
    fault_bufs_add(bufs, &nb, m->final_norm, 2 * (size_t)m->cfg.hidden, 1);
    /* grow the scatter's staging once (a no-op update of the same elements), so
     * every try below makes the same sequence of CUDA calls */
    int warm = m->layers[0].o.fmt != WF_BF16 ||
               runner_weights_changed(r, m->layers[0].o.bf16, 2 * (size_t)m->layers[0].o.rows * m->layers[0].o.cols,
                                      o_idx, n_o, 2, &err) == 0;
    int bad = !warm + fault_bufs_diff(gb, bufs, nb, 1);
    FaultCtx fc = {m, r};
    DeltaTarget tgt = {};
    tgt.lookup = delta_lookup_model;
    tgt.ctx = m;
    tgt.touched = fault_touched;
    tgt.touched_ctx = &fc;
    tgt.n_threads = 1;
    int injected = 0, wrong = 0, final_rc = -1;
    char first_err[640] = "";
    for (long k = 1; k < 1000; k++) {
        DeltaPlan *plan = NULL;
        DeltaResult res;
        Err e = {};
        if (delta_prepare(&plan, buf, size, &tgt, wv, &e)) {
            snprintf(first_err, sizeof first_err, "; prepare: %s", e.msg);
            wrong++;
            break;
        }
        emu_fail_nth(k);
        int rc = delta_commit(plan, &tgt, wv, &res, &e);
        int fired = emu_failed();
        emu_fail_nth(0);
        delta_plan_free(plan);
        if (!fired) {
            final_rc = rc;
            if (rc) snprintf(first_err, sizeof first_err, "; %s", e.msg);
            break;
        }
        injected++;
        int diff = fault_bufs_diff(gb, bufs, nb, 0);
        if (rc == 0 || wv->version != 0 || diff) { /* the state moved: later tries would not start from it */
            wrong++;
            snprintf(first_err, sizeof first_err, "; call %ld failed: commit rc %d, version %llu, %d buffers changed",
                     k, rc, (unsigned long long)wv->version, diff);
            break;
        }
        if (injected == 1) {
            printf("       (the first failure: %s)\n", e.msg);
        }
    }
    int synced = final_rc == 0 && wv->version == 1 && fault_bufs_device_is_host(gb, bufs, nb) == 0 &&
                 fault_bufs_diff(gb, bufs, nb, 0) > 0;
    int ok = !bad && !wrong && injected >= 8 && synced;
    ok ? n_pass++ : n_fail++;
    printf("  %-4s %s %s delta: %d CUDA calls of the device update failed in turn, each commit failed and restored "
           "host + device (%d wrong); the commit with no failure: %s%s\n", ok ? "ok" : "FAIL", dir, pn, injected, wrong,
           synced ? "applied, device == host" : "NOT applied or device != host", first_err);
    for (int i = 0; i < nb; i++) { free(bufs[i].h0); free(bufs[i].d0); }
    for (int t = 0; t < 3; t++) delta_record_free(&rec[t]);
    free(buf);
    weight_version_free(wv);
    runner_free(r);
    model_free(m);
}

int main(void) {
    bc = backend_cpu_create(1, 4096);
    printf("== CUDA kernels on the CPU emulation vs the CPU reference ops ==\n");
    t_scatter(1000, 40, 2);
    t_scatter(70000, 300, 1);
    t_scatter(513, 9, 4);
    t_elementwise(1000, 50, 72);
    t_rows(37, 20, 72);
    t_rmsnorm(3, 72);
    t_rmsnorm(2, 1000);
    t_add_rmsnorm(3, 72);
    t_add_rmsnorm(2, 1500);
    t_norm_rope(3, 4, 24, 1);
    t_norm_rope(2, 3, 128, 0);
    t_norm_rope(2, 2, 256, 1);
    t_decode();
    for (int n = 1; n <= 8; n++) t_gemv(n, 37, 128 + 256 * (n % 3), n % 2, 0);
    t_gemv(2, 40, 136, 1, 0);
    t_gemv(2, 5, 2056, 1, 0); /* gemv_tile: slices of > 32 chunks (the two-deep loop), 5 rows (a partial tile) */
    t_gemv(3, 33, 100, 0, 0);
    t_gemv(1, 20, 64, 1, 1);
    /* FP8: 16-byte path (cols % 16 == 0), scalar path (ragged cols, misaligned x), >8 tokens (several launches) */
    for (int n = 1; n <= 8; n++) t_qgemv(0, n, 37, 128 + 256 * (n % 3), QUANT_FP8_BLOCK128, n % 2, 0);
    t_qgemv(0, 19, 130, 272, QUANT_FP8_BLOCK128, 1, 0);
    t_qgemv(0, 3, 9, 2064, QUANT_FP8_BLOCK128, 1, 0);  /* the unrolled loop (cols / 16 > 96) and its tail */
    t_qgemv(0, 1, 5, 4096, QUANT_FP8_PER_CHANNEL, 0, 0);
    t_qgemv(0, 2, 5, 4112, QUANT_FP8_BLOCK128, 1, 0); /* slices of > 32 chunks, a partial tile */
    t_qgemv(0, 3, 33, 100, QUANT_FP8_BLOCK128, 0, 0);
    t_qgemv(0, 2, 20, 144, QUANT_FP8_BLOCK128, 1, 1);
    t_qgemv(0, 4, 21, 200, QUANT_FP8_PER_CHANNEL, 0, 0);
    t_qgemv(0, 2, 21, 96, QUANT_FP8_PER_TENSOR, 1, 0);
    /* NVFP4: 16-byte path (cols % 32 == 0), byte path (cols % 32 == 16, misaligned x), >8 tokens */
    for (int n = 1; n <= 8; n++) t_qgemv(1, n, 37, 128 + 256 * (n % 3), QUANT_FP8_BLOCK128, n % 2, 0);
    t_qgemv(1, 11, 40, 272, QUANT_FP8_BLOCK128, 1, 0);
    t_qgemv(1, 2, 9, 4128, QUANT_FP8_BLOCK128, 1, 0);
    t_qgemv(1, 2, 5, 8224, QUANT_FP8_BLOCK128, 1, 0); /* slices of > 32 chunks, a partial tile */
    t_qgemv(1, 3, 33, 144, QUANT_FP8_BLOCK128, 0, 0);
    t_qgemv(1, 2, 20, 64, QUANT_FP8_BLOCK128, 1, 1);
    const int one[] = {1}, two[] = {2, 1}, four[] = {1, 1, 1, 1};
    t_attention(1, one, (const int[]){70}, 8, 2, 128, 16, 2); /* decode, split */
    t_attention(4, four, (const int[]){0, 5, 40, 95}, 4, 1, 16, 4, 2);
    t_attention(2, two, (const int[]){9, 3}, 8, 1, 12, 4, 2);       /* G = 8: two groups */
    t_attention(1, (const int[]){12}, (const int[]){40}, 3, 3, 24, 4, 1); /* unsplit (batch fills the GPU) */
    t_attention(1, (const int[]){3}, (const int[]){20}, 16, 1, 32, 4, 1); /* G = 16 */
    t_attention(1, one, (const int[]){33}, 4, 1, 256, 8, 2);
    t_attention(1, (const int[]){40}, (const int[]){39}, 4, 2, 16, 4, 1000); /* prefill tokens on the split path */
    bc->free(bc);
    printf("== fixture models through backend_cuda on the emulation ==\n");
    /* EMU_QUICK (sanitizer builds, where every CUDA thread is an OS thread): one bf16 fixture, one decode step */
    int quick = getenv("EMU_QUICK") != NULL;
    const char *dirs[] = {"tests/fixtures/qwen3_moe", "tests/fixtures/qwen2", "tests/fixtures/qwen3_gqa2",
                          "tests/fixtures/qwen3_mha_sharded", "tests/fixtures/qwen3_moe_nonorm", "tests/fixtures/llama31"};
    for (size_t i = 0; i < (quick ? 1 : sizeof dirs / sizeof dirs[0]); i++) t_model(dirs[i], quick ? 1 : 3, PREC_BF16);
    /* weight-only FP8 / NVFP4 (llama31: every linear width a multiple of 16) vs the CPU at the same precision */
    if (!quick) t_model("tests/fixtures/qwen3_moe", 3, PREC_FP8); /* MoE experts at fp8 */
    t_model("tests/fixtures/qwen2", quick ? 1 : 3, PREC_FP8);
    t_model("tests/fixtures/llama31", quick ? 1 : 3, PREC_NVFP4);
    printf("== a CUDA failure during a delta's device update: the commit fails and restores ==\n");
    t_delta_fault("tests/fixtures/qwen2", PREC_BF16);
    t_delta_fault("tests/fixtures/qwen2", PREC_FP8);
    t_delta_fault("tests/fixtures/llama31", PREC_NVFP4);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
