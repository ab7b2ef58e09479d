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
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cpu_ops.h"
#include "model.h"
#include "threadpool.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
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

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL_DIR [threads] [prompt_len] [decode_tokens]\n", argv[0]);
        return 2;
    }
    int threads = argc > 2 ? atoi(argv[2]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    int P = argc > 3 ? atoi(argv[3]) : 128, D = argc > 4 ? atoi(argv[4]) : 32;
    Err err = {0};
    Model *m = NULL;
    LoadOptions lo = {PREC_BF16, 0};
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

    /* Touch every weight page once so the first timed step is not a page-in. */
    Batch warm = {1, tok, pos, seq, 1, tables, 1, &zero};
    model_forward(r, kv, &warm, logits, &err);

    Batch pre = {P, tok, pos, seq, 1, tables, 1, &last};
    int paths[CPU_PATH_COUNT], np = 0, reps = argc > 6 ? atoi(argv[6]) : 5;
    if (argc > 5) {
        char *list = strdup(argv[5]);
        for (char *t = strtok(list, ","); t; t = strtok(NULL, ","))
            for (int p = 0; p < CPU_PATH_COUNT; p++)
                if (!strcmp(t, cpu_ops_path_name((CpuPath)p))) {
                    if (cpu_ops_path_available((CpuPath)p)) paths[np++] = p;
                    else fprintf(stderr, "path %s: not available on this CPU, skipped\n", t);
                }
        free(list);
        if (!np) { fprintf(stderr, "no runnable path in %s\n", argv[5]); return 2; }
    } else {
        paths[np++] = cpu_ops_path();
        reps = 1;
    }
    if (reps < 1) reps = 1;
    if (reps > 32) reps = 32;
    double t_pre[CPU_PATH_COUNT][32], t_dec[CPU_PATH_COUNT][32];
    float *first = malloc(sizeof(float) * m->cfg.vocab);
    int same = 1;
    for (int rep = 0; rep < reps; rep++)
        for (int pi = 0; pi < np; pi++) {
            int p = paths[(pi + rep) % np];
            cpu_ops_force_path((CpuPath)p);
            double t0 = now_s();
            if (model_forward(r, kv, &pre, logits, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
            t_pre[p][rep] = now_s() - t0;
            t0 = now_s();
            for (int i = 0; i < D; i++) {
                Batch b = {1, tok + P + i, pos + P + i, seq, 1, tables, 1, &zero};
                model_forward(r, kv, &b, logits, &err);
            }
            t_dec[p][rep] = now_s() - t0;
            if (rep == 0 && pi == 0) memcpy(first, logits, sizeof(float) * m->cfg.vocab);
            else same &= !memcmp(first, logits, sizeof(float) * m->cfg.vocab);
        }
    double bw = copy_bandwidth(threads);
    double pre_tps[CPU_PATH_COUNT], dec_tps[CPU_PATH_COUNT], roof = bw / (double)m->compute_bytes;
    for (int pi = 0; pi < np; pi++) {
        int p = paths[pi];
        pre_tps[p] = P / median(t_pre[p], reps);
        dec_tps[p] = D / median(t_dec[p], reps);
    }
    printf("model %s (%s): %.3fB params, %.2f GB of weights read per decode token, %d threads\n", argv[1], prec,
           m->n_params / 1e9, m->compute_bytes / 1e9, threads);
    printf("copy bandwidth (read+write)  %8.2f GB/s\n", bw / 1e9);
    for (int pi = 0; pi < np; pi++) {
        int p = paths[pi], p0 = paths[0];
        printf("[%s]%s\n", cpu_ops_path_name((CpuPath)p), reps > 1 ? " (medians)" : "");
        printf("prefill %4d tokens          %8.1f tok/s", P, pre_tps[p]);
        if (pi) printf("   %.2fx %s", pre_tps[p] / pre_tps[p0], cpu_ops_path_name((CpuPath)p0));
        printf("\ndecode batch 1 (%d tokens)   %8.2f tok/s  (%.1f ms/token)", D, dec_tps[p], 1e3 / dec_tps[p]);
        if (pi) printf("   %.2fx %s", dec_tps[p] / dec_tps[p0], cpu_ops_path_name((CpuPath)p0));
        printf("\nroofline (bw / weight bytes) %8.2f tok/s\n", roof);
        printf("decode / roofline            %8.1f %%\n", 100.0 * dec_tps[p] / roof);
    }
    if (np > 1 || reps > 1) printf("last decode logits bit-identical across paths and repetitions: %s\n", same ? "yes" : "NO");
    free(first);
    free(logits); free(bt); free(tok); free(pos); free(seq);
    kvcache_free(kv);
    runner_free(r);
    model_free(m);
    return 0;
}
