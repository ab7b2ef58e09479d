/*
 * bench_forward.c - CPU prefill and batch-1 decode speed of the forward pass,
 * with decode as a fraction of the memory-bandwidth roofline measured in the
 * same run: roofline tok/s = copy bandwidth / weight bytes read per token.
 *
 * usage: bench_forward MODEL_DIR [threads] [prompt_len] [decode_tokens] [paths] [reps] [precision]
 * (a Qwen3-0.6B-shaped random model: python3 scripts/make_bench_model.py qwen3-0.6b DIR)
 * precision: bf16 (default), fp8 or nvfp4 (quantized at load, activations
 * quantized too: what `--precision X` runs on the CPU), fp8-wo / nvfp4-wo
 * (weight-only: `--precision X --weight-only`). The roofline then uses the
 * bytes the quantized model reads per token.
 *
 * paths (comma-separated CPU matmul paths, cpu_ops.h: e.g. avx2-v0,avx512):
 * runs prefill + decode `reps` times per path, alternating the paths (the
 * order rotates each repetition) so a shared machine's load falls on all of
 * them alike, and prints the medians with each path's ratio to the first, and
 * the decode logits' agreement between paths (all paths give the same bits).
 * A path named with "+bf16" (e.g. avx512+bf16) runs with BF16 matmul
 * activations (--dtype bfloat16, runner_set_act_bf16).
 *
 * KV dtypes (issue #18 / #23): bench_forward MODEL_DIR threads ctx decode_tokens
 * PATH reps precision KV_DTYPES, e.g. `... 2 4096 16 - 5 bf16 float32,bfloat16`: batch-1
 * decode of decode_tokens tokens at context ctx with the KV cache in each
 * listed dtype (float32, bfloat16, fp8), alternating the dtypes per repetition
 * (medians, ratios to the first). The cache is filled with random rows through
 * the reference store (no prefill: the decode's speed does not depend on the
 * values) and every repetition decodes the same positions again. PATH "-": the
 * default matmul path. The roofline adds the KV bytes read per token. Also
 * printed: the process CPU time per token (median), which a loaded shared
 * machine's preemptions inflate less than the wall time (with 1 thread it is
 * the forward pass's own time: a one-thread pool runs every task on the caller).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cpu_ops.h"
#include "kv_cpu.h"
#include "model.h"
#include "threadpool.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

typedef struct { uint8_t *src, *dst; size_t chunk; } CopyJob;

static void copy_task(void *p, int task, int thread) {
    CopyJob *j = p;
    memcpy(j->dst + (size_t)task * j->chunk, j->src + (size_t)task * j->chunk, j->chunk);
}

/* Multi-threaded memcpy of 1 GiB; bytes read + written per second, best of 5. */
static double copy_bandwidth(int threads) {
    size_t n = (size_t)1 << 30, chunk = (size_t)8 << 20;
    uint8_t *a = malloc(n), *b = malloc(n);
    memset(a, 1, n);
    memset(b, 2, n);
    ThreadPool *tp = threadpool_create(threads);
    CopyJob j = {a, b, chunk};
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_s();
        threadpool_run(tp, (int)(n / chunk), copy_task, &j);
        double bw = 2.0 * n / (now_s() - t0);
        if (bw > best) best = bw;
    }
    threadpool_free(tp);
    free(a);
    free(b);
    return best;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    double c[32];
    memcpy(c, v, sizeof(double) * (size_t)n);
    qsort(c, (size_t)n, sizeof *c, cmp_d);
    return n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
}

static int kv_parse(const char *t, KvDtype *out) {
    for (int d = 0; d < KV_DTYPE_COUNT; d++)
        if (!strcmp(t, kv_dtype_name((KvDtype)d)) || (d == KV_FP8 && !strcmp(t, "fp8"))) {
            *out = (KvDtype)d;
            return 0;
        }
    return -1;
}

/* Decode at context ctx per KV dtype (the header comment). */
static int bench_kv(Model *m, int threads, int ctx, int D, int reps, const char *list) {
    const ModelConfig *c = &m->cfg;
    KvDtype dts[KV_DTYPE_COUNT];
    int nd = 0;
    char *l = strdup(list);
    for (char *t = strtok(l, ","); t && nd < KV_DTYPE_COUNT; t = strtok(NULL, ","))
        if (kv_parse(t, &dts[nd]) == 0) nd++;
        else { fprintf(stderr, "unknown KV dtype %s (float32, bfloat16, fp8)\n", t); return 2; }
    free(l);
    if (!nd) return 2;
    int total = ctx + D, bs = 16, nb = (total + bs - 1) / bs;
    Runner *r = runner_create(m, 1, total, threads);
    KVCache *kv[KV_DTYPE_COUNT];
    size_t rows = (size_t)c->n_layers * nb * bs * c->n_kv_heads;
    float *row = malloc(sizeof(float) * c->head_dim);
    uint64_t z = 0x9e3779b97f4a7c15ull;
    for (int d = 0; d < nd; d++) {
        kv[d] = kvcache_create_dtype(c, nb, bs, dts[d]);
        for (size_t i = 0; i < rows; i++) {
            for (int j = 0; j < c->head_dim; j++) {
                z = z * 6364136223846793005ull + 1442695040888963407ull;
                row[j] = (float)((double)(z >> 40) / (double)(1 << 24) - 0.5);
            }
            cpu_kv_store_row(kv[d]->k, kv[d]->k_scale, dts[d], i, row, c->head_dim);
            cpu_kv_store_row(kv[d]->v, kv[d]->v_scale, dts[d], i, row, c->head_dim);
        }
    }
    free(row);
    int32_t *bt = malloc(sizeof(int32_t) * nb), *tok = malloc(sizeof(int32_t) * total);
    int32_t *pos = malloc(sizeof(int32_t) * total), *seq = calloc(total, sizeof(int32_t)), zero = 0;
    for (int i = 0; i < nb; i++) bt[i] = i;
    for (int i = 0; i < total; i++) { pos[i] = i; tok[i] = (i * 7919) % c->vocab; }
    const int32_t *tables[1] = {bt};
    float *logits = malloc(sizeof(float) * c->vocab);
    Err err = {0};
    for (int d = 0; d < nd; d++) { /* warm: weights and this cache paged in */
        Batch b = {1, tok + ctx, pos + ctx, seq, 1, tables, 1, &zero, 0};
        if (model_forward(r, kv[d], &b, logits, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    }
    double t[KV_DTYPE_COUNT][32], tc[KV_DTYPE_COUNT][32];
    for (int rep = 0; rep < reps; rep++)
        for (int k = 0; k < nd; k++) {
            int d = (k + rep) % nd;
            double t0 = now_s(), c0 = cpu_s();
            for (int i = 0; i < D; i++) {
                Batch b = {1, tok + ctx + i, pos + ctx + i, seq, 1, tables, 1, &zero, 0};
                model_forward(r, kv[d], &b, logits, &err);
            }
            t[d][rep] = now_s() - t0;
            tc[d][rep] = cpu_s() - c0;
        }
    double bw = copy_bandwidth(threads);
    printf("model: %.3fB params, %.2f GB bf16 weights per token, %d threads, path %s, context %d, %d tokens x %d reps\n",
           m->n_params / 1e9, m->weight_bytes / 1e9, threads, cpu_ops_path_name(cpu_ops_path()), ctx, D, reps);
    printf("copy bandwidth (read+write)  %8.2f GB/s\n", bw / 1e9);
    double tps0 = 0;
    for (int d = 0; d < nd; d++) {
        double tps = D / median(t[d], reps);
        double kvb = (double)c->n_layers * (ctx + D / 2.0) * kv_dtype_bytes_per_pos(dts[d], c->n_kv_heads, c->head_dim);
        if (!d) tps0 = tps;
        double cms = 1e3 * median(tc[d], reps) / D, cms0 = 1e3 * median(tc[0], reps) / D;
        printf("kv %-9s decode %8.2f tok/s (%.1f ms/token)  %.2fx %s  cpu %.1f ms/token (%.2fx)  KV read %.1f "
               "MB/token  roofline %.2f tok/s (%.0f %%)\n", kv_dtype_name(dts[d]), tps, 1e3 / tps, tps / tps0,
               kv_dtype_name(dts[0]), cms, cms0 / cms, kvb / 1e6, bw / (m->weight_bytes + kvb),
               100.0 * tps / (bw / (m->weight_bytes + kvb)));
    }
    for (int d = 0; d < nd; d++) kvcache_free(kv[d]);
    free(bt); free(tok); free(pos); free(seq); free(logits);
    runner_free(r);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL_DIR [threads] [prompt_len] [decode_tokens]\n", argv[0]);
        return 2;
    }
    int threads = argc > 2 ? atoi(argv[2]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    int P = argc > 3 ? atoi(argv[3]) : 128, D = argc > 4 ? atoi(argv[4]) : 32;
    Err err = {0};
    Model *m = NULL;
    LoadOptions lo = {PREC_BF16, 0, 0};
    const char *prec = argc > 7 ? argv[7] : "bf16";
    char pname[16];
    snprintf(pname, sizeof pname, "%s", prec);
    size_t pl = strlen(pname);
    if (pl > 3 && !strcmp(pname + pl - 3, "-wo")) {
        lo.weight_only = 1;
        pname[pl - 3] = 0;
    }
    if (precision_parse(pname, &lo.precision)) {
        fprintf(stderr, "precision %s: want bf16, fp8, nvfp4, fp8-wo or nvfp4-wo\n", prec);
        return 2;
    }
    if (model_load_opts(&m, argv[1], &lo, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    if (argc > 8) { /* the KV dtype mode: argv[8] lists the dtypes */
        if (strcmp(argv[5], "-")) {
            int ok = 0;
            for (int p = 0; p < CPU_PATH_COUNT; p++)
                if (!strcmp(argv[5], cpu_ops_path_name((CpuPath)p)) && cpu_ops_path_available((CpuPath)p)) {
                    cpu_ops_force_path((CpuPath)p);
                    ok = 1;
                }
            if (!ok) { fprintf(stderr, "path %s not available\n", argv[5]); return 2; }
        }
        int reps = atoi(argv[6]);
        int rc = bench_kv(m, threads, P, D, reps < 1 ? 1 : reps > 32 ? 32 : reps, argv[8]);
        model_free(m);
        return rc;
    }
    int ctx = P + D, bs = 16, nb = (ctx + bs - 1) / bs;
    Runner *r = runner_create(m, P, ctx, threads);
    KVCache *kv = kvcache_create(&m->cfg, nb, bs);
    int32_t *bt = malloc(sizeof(int32_t) * nb), *tok = malloc(sizeof(int32_t) * ctx);
    int32_t *pos = malloc(sizeof(int32_t) * ctx), *seq = calloc(ctx, sizeof(int32_t));
    for (int i = 0; i < nb; i++) bt[i] = i;
    for (int i = 0; i < ctx; i++) { pos[i] = i; tok[i] = (i * 7919) % m->cfg.vocab; }
    const int32_t *tables[1] = {bt};
    float *logits = malloc(sizeof(float) * m->cfg.vocab);
    int32_t last = P - 1, zero = 0;

    Batch pre = {P, tok, pos, seq, 1, tables, 1, &last, 0};
    /* a run: a path and the activation dtype ("avx512+bf16": --dtype bfloat16) */
    enum { MAX_RUNS = 2 * CPU_PATH_COUNT };
    int paths[MAX_RUNS], acts[MAX_RUNS], np = 0, reps = argc > 6 ? atoi(argv[6]) : 5;
    if (argc > 5) {
        char *list = strdup(argv[5]);
        for (char *t = strtok(list, ","); t && np < MAX_RUNS; t = strtok(NULL, ",")) {
            char *plus = strchr(t, '+');
            int act = plus && !strcmp(plus, "+bf16");
            if (plus) *plus = 0;
            for (int p = 0; p < CPU_PATH_COUNT; p++)
                if (!strcmp(t, cpu_ops_path_name((CpuPath)p))) {
                    if (cpu_ops_path_available((CpuPath)p)) { paths[np] = p; acts[np++] = act; }
                    else fprintf(stderr, "path %s: not available on this CPU, skipped\n", t);
                }
        }
        free(list);
        if (!np) { fprintf(stderr, "no runnable path in %s\n", argv[5]); return 2; }
    } else {
        paths[np] = cpu_ops_path();
        acts[np++] = 0;
        reps = 1;
    }
    if (reps < 1) reps = 1;
    if (reps > 32) reps = 32;
    /* Warm-up on the first run's path and activation dtype, as llama-bench
     * does before it times (a full prompt run, then a decode token): touches
     * every weight page, and the runner's scratch and the KV blocks a P-token
     * prefill writes, so the first timed prefill is not page faults. A
     * server's steps run warm too: its scratch is reused. */
    cpu_ops_force_path((CpuPath)paths[0]);
    runner_set_act_bf16(r, acts[0]);
    model_forward(r, kv, &pre, logits, &err);
    Batch warm = {1, tok + P, pos + P, seq, 1, tables, 1, &zero, 0};
    if (D > 0) model_forward(r, kv, &warm, logits, &err);
    double t_pre[MAX_RUNS][32], t_dec[MAX_RUNS][32];
    float *first[2] = {malloc(sizeof(float) * m->cfg.vocab), malloc(sizeof(float) * m->cfg.vocab)};
    int same = 1, have[2] = {0, 0};
    for (int rep = 0; rep < reps; rep++)
        for (int k = 0; k < np; k++) {
            int pi = (k + rep) % np, p = paths[pi], a = acts[pi];
            cpu_ops_force_path((CpuPath)p);
            runner_set_act_bf16(r, a);
            double t0 = now_s();
            if (model_forward(r, kv, &pre, logits, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
            t_pre[pi][rep] = now_s() - t0;
            t0 = now_s();
            for (int i = 0; i < D; i++) {
                Batch b = {1, tok + P + i, pos + P + i, seq, 1, tables, 1, &zero, 0};
                model_forward(r, kv, &b, logits, &err);
            }
            t_dec[pi][rep] = now_s() - t0;
            /* bit-identical across paths and repetitions, per activation dtype */
            if (!have[a]) memcpy(first[a], logits, sizeof(float) * m->cfg.vocab);
            else same &= !memcmp(first[a], logits, sizeof(float) * m->cfg.vocab);
            have[a] = 1;
        }
    double bw = copy_bandwidth(threads);
    double pre_tps[MAX_RUNS], dec_tps[MAX_RUNS], roof = bw / (double)m->compute_bytes;
    for (int pi = 0; pi < np; pi++) {
        pre_tps[pi] = P / median(t_pre[pi], reps);
        dec_tps[pi] = D / median(t_dec[pi], reps);
    }
    printf("model %s (%s): %.3fB params, %.2f GB of weights read per decode token, %d threads\n", argv[1], prec,
           m->n_params / 1e9, m->compute_bytes / 1e9, threads);
    printf("copy bandwidth (read+write)  %8.2f GB/s\n", bw / 1e9);
    char name[MAX_RUNS][40];
    for (int pi = 0; pi < np; pi++)
        snprintf(name[pi], sizeof name[pi], "%s%s", cpu_ops_path_name((CpuPath)paths[pi]), acts[pi] ? "+bf16" : "");
    for (int pi = 0; pi < np; pi++) {
        printf("[%s]%s\n", name[pi], reps > 1 ? " (medians)" : "");
        printf("prefill %4d tokens          %8.1f tok/s", P, pre_tps[pi]);
        if (pi) printf("   %.2fx %s", pre_tps[pi] / pre_tps[0], name[0]);
        printf("\ndecode batch 1 (%d tokens)   %8.2f tok/s  (%.1f ms/token)", D, dec_tps[pi], 1e3 / dec_tps[pi]);
        if (pi) printf("   %.2fx %s", dec_tps[pi] / dec_tps[0], name[0]);
        printf("\nroofline (bw / weight bytes) %8.2f tok/s\n", roof);
        printf("decode / roofline            %8.1f %%\n", 100.0 * dec_tps[pi] / roof);
    }
    if (np > 1 || reps > 1)
        printf("last decode logits bit-identical across paths and repetitions (per activation dtype): %s\n",
               same ? "yes" : "NO");
    free(first[0]);
    free(first[1]);
    free(logits); free(bt); free(tok); free(pos); free(seq);
    kvcache_free(kv);
    runner_free(r);
    model_free(m);
    return 0;
}
