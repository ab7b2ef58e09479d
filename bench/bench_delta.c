/*
 * bench_delta.c - in-memory delta apply speed, the part of an update during
 * which a sampler stops serving (commit), against memcpy bandwidth measured
 * in the same run. Not a test: prints numbers, asserts nothing on time.
 *
 *   bench_delta CKPT_DIR step.delta [--threads T]   apply a real delta to a checkpoint mapping
 *   bench_delta --synthetic MB FRAC [--threads T]    one BF16 model of MB MiB in 64 MiB tensors,
 *                                                     FRAC of its elements changed at random positions
 *   bench_delta --requant FRAC                        a quantized sampler's part of an update: the FP8
 *                                                     (128x128, per channel) and NVFP4 re-quantization
 *                                                     of a Qwen3-8B MLP matrix [12288, 4096] (normal
 *                                                     weights, sd 0.02) after FRAC of its elements moved
 *                                                     by an optimizer step's size (1e-4), against
 *                                                     quantizing the matrix from scratch in the same run,
 *                                                     and the share of the quantized bytes that changed
 *                                                     (what a device copy must take)
 */
#include <math.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "delta.h"
#include "quant.h"

static int g_xor; /* --xor: SPARSE_XOR values */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double memcpy_gbs(size_t n) {
    uint8_t *a = xmalloc(n), *b = xmalloc(n);
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = now_s();
        memcpy(b, a, n);
        double t = now_s() - t0;
        if (t < best) best = t;
        a[r] ^= b[n - 1 - (size_t)r];
    }
    free(a);
    free(b);
    return (double)n / best / 1e9;
}

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    CHECK_PTR(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = xmalloc((size_t)sz);
    CHECK(fread(b, 1, (size_t)sz, f) == (size_t)sz, "short read on %s", path);
    fclose(f);
    *n = (size_t)sz;
    return b;
}

/* Write every page of the weights once (same bytes): what a sampler's
 * MAP_PRIVATE mapping looks like after its first update, when writes no
 * longer take copy-on-write faults. */
static void prefault(SafeTensors *st) {
    for (int i = 0; i < st->n; i++)
        for (size_t o = 0; o < st->t[i].nbytes; o += 4096) {
            volatile uint8_t *b = st->t[i].data + o;
            *b = *b;
        }
}

/* prepare + commit on st's weights (once: the next would need the next delta). */
static void run_apply(SafeTensors *st, const uint8_t *d, size_t dn, int threads, size_t model_bytes, double bw) {
    WeightVersion *wv = weight_version_from_safetensors(st, threads);
    DeltaFile *f;
    Err err = {0};
    CHECK(delta_parse(&f, d, dn, &err) == 0, "%s", err.msg);
    wv->version = f->h.base_version;
    wv->fingerprint = f->h.fingerprint;
    delta_file_free(f);
    DeltaTarget tgt = {.lookup = delta_lookup_safetensors, .ctx = st, .n_threads = threads};
    double t0 = now_s();
    DeltaPlan *p;
    CHECK(delta_prepare(&p, d, dn, &tgt, wv, &err) == 0, "%s", err.msg);
    double t1 = now_s();
    DeltaResult res, res2;
    CHECK(delta_commit(p, &tgt, wv, &res, &err) == 0, "%s", err.msg);
    double t2 = now_s();
    CHECK(delta_commit(p, &tgt, wv, &res2, &err) != 0, "a plan commits once");
    /* the re-hash part of the commit, timed alone: the same hashes again */
    double t3 = now_s();
    uint64_t sink = 0;
    for (int i = 0; i < delta_plan_count(p); i++) {
        Dtype dt;
        int64_t numel;
        const DeltaDecoded *u;
        const char *name = delta_plan_tensor(p, i, &dt, &numel, &u);
        const StTensor *t = safetensors_get(st, name);
        sink ^= delta_hash(t->data, t->nbytes);
    }
    double t4 = now_s();
    delta_plan_free(p);
    wv->version = 0;
    printf("model %.1f MB, delta %zu B (%.1fx), %" PRId64 " elements in %d tensors\n", (double)model_bytes / 1e6, dn,
           (double)model_bytes / (double)dn, res.elements_updated, res.tensors_updated);
    printf("prepare (decode + bounds + predicted hashes, engine keeps serving): %.1f ms, %.2f GB/s of model\n",
           (t1 - t0) * 1e3, (double)model_bytes / (t1 - t0) / 1e9);
    printf("commit  (scatter + re-hash of updated tensors; the pause):         %.1f ms, %.2f GB/s of model\n",
           (t2 - t1) * 1e3, (double)model_bytes / (t2 - t1) / 1e9);
    printf("  of which the post-update re-hash (single-threaded, timed again alone): %.1f ms [%llx]\n", (t4 - t3) * 1e3,
           (unsigned long long)(sink & 0xf));
    printf("memcpy bandwidth %.2f GB/s: commit = %.2fx the time of one memcpy of the model\n", bw,
           (t2 - t1) / ((double)model_bytes / (bw * 1e9)));
    weight_version_free(wv);
}

static void synthetic(size_t mb, double frac, int threads, double bw) {
    const size_t tensor_bytes = 64u << 20;
    size_t total = mb << 20;
    int nt = (int)((total + tensor_bytes - 1) / tensor_bytes);
    SafeTensors st = {.n = nt, .t = xcalloc((size_t)nt, sizeof(StTensor))};
    uint8_t **newd = xcalloc((size_t)nt, sizeof(uint8_t *));
    uint64_t s = 88172645463325252ull;
    DeltaRecord *rec = xcalloc((size_t)nt, sizeof(DeltaRecord));
    char name[64];
    double tdiff = 0;
    int64_t nch = 0;
    for (int i = 0; i < nt; i++) {
        StTensor *t = &st.t[i];
        snprintf(name, sizeof name, "layers.%03d.weight", i);
        t->name = xstrdup(name);
        t->dtype = DT_BF16;
        t->ndim = 1;
        t->numel = t->shape[0] = (int64_t)(tensor_bytes / 2);
        t->nbytes = tensor_bytes;
        t->data = xmalloc(tensor_bytes);
        uint16_t *w = (uint16_t *)t->data;
        for (int64_t k = 0; k < t->numel; k++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            w[k] = f32_to_bf16((float)((int64_t)(s >> 40) - (1 << 23)) * (0.02f / (float)(1 << 23)));
        }
        newd[i] = xmalloc(tensor_bytes);
        memcpy(newd[i], t->data, tensor_bytes);
        uint16_t *nw = (uint16_t *)newd[i];
        int64_t want = (int64_t)(frac * (double)t->numel);
        for (int64_t k = 0; k < want; k++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            nw[s % (uint64_t)t->numel] ^= 1; /* one-ulp steps, like small-LR training */
        }
        double t0 = now_s();
        Err err;
        CHECK(delta_encode_tensor(&rec[i], t->name, DT_BF16, 1, t->shape, t->data, newd[i], 3, g_xor, &err) == 0, "%s", err.msg);
        tdiff += now_s() - t0;
        nch += rec[i].n_changed;
    }
    WeightVersion *wv = weight_version_from_safetensors(&st, threads);
    DeltaHeader h = {.fingerprint = wv->fingerprint, .base_version = 0, .target_version = 1};
    weight_version_free(wv);
    size_t dn;
    uint8_t *d = delta_serialize(&h, rec, nt, &dn);
    printf("synthetic: %zu MiB BF16 in %d tensors, %" PRId64 " changed (%.4f%%); encode (1 thread, incl. hash) %.2f GB/s\n",
           mb, nt, nch, 100.0 * (double)nch / (double)(total / 2), (double)total / tdiff / 1e9);
    run_apply(&st, d, dn, threads, total, bw);
    int ok = 1;
    for (int i = 0; i < nt; i++) ok &= memcmp(st.t[i].data, newd[i], tensor_bytes) == 0;
    printf("result bit-identical to the target: %s\n", ok ? "yes" : "NO");
    for (int i = 0; i < nt; i++) {
        delta_record_free(&rec[i]);
        free(st.t[i].name);
        free(st.t[i].data);
        free(newd[i]);
    }
    free(rec);
    free(newd);
    free(st.t);
    free(d);
}

static uint64_t rq_state = 88172645463325252ull;
static double rq_uniform(void) { /* xorshift64*, (0, 1) */
    rq_state ^= rq_state >> 12;
    rq_state ^= rq_state << 25;
    rq_state ^= rq_state >> 27;
    return ((double)((rq_state * 2685821657736338717ull) >> 11) + 0.5) / 9007199254740992.0;
}
static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static void requant_bench(double frac) {
    int rows = 12288, cols = 4096;
    size_t n = (size_t)rows * cols, k = (size_t)(frac * (double)n);
    uint16_t *m = xmalloc(n * 2);
    for (size_t i = 0; i < n; i++)
        m[i] = f32_to_bf16((float)(0.02 * sqrt(-2 * log(rq_uniform())) * cos(6.283185307179586 * rq_uniform())));
    int64_t *idx = xmalloc(sizeof(int64_t) * (k ? k : 1));
    for (size_t i = 0; i < k; i++) idx[i] = (int64_t)(rq_uniform() * (double)n);
    qsort(idx, k, sizeof *idx, cmp_i64);
    size_t nu = 0;
    for (size_t i = 0; i < k; i++)
        if (!nu || idx[i] != idx[nu - 1]) idx[nu++] = idx[i];
    printf("[%d, %d] bf16 master, %zu elements touched (%.3f%%)\n", rows, cols, nu, 100.0 * (double)nu / (double)n);
    printf("| format | re-quantize ms | from scratch ms | speedup | blocks redone whole | quantized bytes changed |\n");
    printf("| --- | --- | --- | --- | --- | --- |\n");
    for (int f = 0; f < 3; f++) {
        Err e = {0};
        uint16_t *mm = xmalloc(n * 2);
        memcpy(mm, m, n * 2);
        QuantFp8 *q8 = f < 2 ? quant_fp8_from_bf16(mm, rows, cols, f ? QUANT_FP8_PER_CHANNEL : QUANT_FP8_BLOCK128, &e)
                             : NULL;
        QuantNvfp4 *q4 = f == 2 ? quant_nvfp4_from_bf16(mm, rows, cols, &e) : NULL;
        CHECK(q8 || q4, "quantize: %s", e.msg);
        size_t qb = f < 2 ? n : n / 2;
        uint8_t *before = xmalloc(qb);
        memcpy(before, f < 2 ? q8->q : q4->packed, qb);
        for (size_t i = 0; i < nu; i++)
            mm[idx[i]] = f32_to_bf16(bf16_to_f32(mm[idx[i]]) + 1e-4f * (rq_uniform() < 0.5 ? -1.0f : 1.0f));
        double t0 = now_s();
        int rc = f < 2 ? quant_fp8_requant(q8, mm, idx, nu, &e) : quant_nvfp4_requant(q4, mm, idx, nu, &e);
        double t_re = now_s() - t0;
        CHECK(rc >= 0, "requant: %s", e.msg);
        t0 = now_s();
        QuantFp8 *r8 = f < 2 ? quant_fp8_from_bf16(mm, rows, cols, f ? QUANT_FP8_PER_CHANNEL : QUANT_FP8_BLOCK128, &e)
                             : NULL;
        QuantNvfp4 *r4 = f == 2 ? quant_nvfp4_from_bf16(mm, rows, cols, &e) : NULL;
        double t_full = now_s() - t0;
        const uint8_t *after = f < 2 ? q8->q : q4->packed, *ref = f < 2 ? r8->q : r4->packed;
        CHECK(memcmp(after, ref, qb) == 0, "re-quantized bytes differ from quantizing from scratch (a bug)");
        CHECK(f < 2 ? memcmp(q8->scale_inv, r8->scale_inv, sizeof(float) * (size_t)q8->scale_rows * q8->scale_cols) == 0
                    : memcmp(q4->scale, r4->scale, n / QUANT_NVFP4_BLOCK) == 0 && q4->scale2 == r4->scale2,
              "re-quantized scales differ from quantizing from scratch (a bug)");
        size_t changed = 0;
        for (size_t i = 0; i < qb; i++) changed += before[i] != after[i];
        char whole[64];
        if (f < 2) snprintf(whole, sizeof whole, "%d of %d", rc, q8->scale_rows * q8->scale_cols);
        else snprintf(whole, sizeof whole, "%s", rc == QUANT_REQUANT_FULL ? "all (amax moved)" : "touched 16-blocks (most keep their scale)");
        printf("| %s | %.1f | %.1f | %.1fx | %s | %.3f%% |\n", f == 0 ? "fp8 128x128" : f == 1 ? "fp8 per channel" : "nvfp4",
               t_re * 1e3, t_full * 1e3, t_full / t_re, whole, 100.0 * (double)changed / (double)qb);
        quant_fp8_free(q8);
        quant_fp8_free(r8);
        quant_nvfp4_free(q4);
        quant_nvfp4_free(r4);
        free(before);
        free(mm);
    }
    free(idx);
    free(m);
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "--requant") == 0) {
        requant_bench(atof(argv[2]));
        return 0;
    }
    int threads = 2;
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--threads") == 0) threads = atoi(argv[i + 1]);
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--xor") == 0) g_xor = 1;
    double bw = memcpy_gbs(256u << 20);
    if (argc >= 4 && strcmp(argv[1], "--synthetic") == 0) {
        synthetic((size_t)atol(argv[2]), atof(argv[3]), threads, bw);
        return 0;
    }
    CHECK(argc >= 3, "usage: bench_delta CKPT_DIR step.delta [--threads T] | bench_delta --synthetic MB FRAC");
    SafeTensors *st;
    Err err = {0};
    CHECK(safetensors_open(&st, argv[1], &err) == 0, "%s", err.msg);
    size_t dn, model = 0;
    uint8_t *d = read_all(argv[2], &dn);
    for (int i = 0; i < st->n; i++) model += st->t[i].nbytes;
    printf("-- cold mapping (first update after load: copy-on-write page faults)\n");
    run_apply(st, d, dn, threads, model, bw);
    safetensors_free(st);
    CHECK(safetensors_open(&st, argv[1], &err) == 0, "%s", err.msg);
    prefault(st);
    printf("-- warm mapping (pages already private: every later update)\n");
    run_apply(st, d, dn, threads, model, bw);
    free(d);
    safetensors_free(st);
    return 0;
}
