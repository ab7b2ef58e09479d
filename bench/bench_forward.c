/*
 * bench_forward.c - CPU prefill and batch-1 decode speed of the forward pass,
 * with decode as a fraction of the memory-bandwidth roofline measured in the
 * same run: roofline tok/s = copy bandwidth / weight bytes read per token.
 *
 * usage: bench_forward MODEL_DIR [threads] [prompt_len] [decode_tokens]
 * (a Qwen3-0.6B-shaped random model: python3 scripts/make_bench_model.py qwen3-0.6b DIR)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL_DIR [threads] [prompt_len] [decode_tokens]\n", argv[0]);
        return 2;
    }
    int threads = argc > 2 ? atoi(argv[2]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    int P = argc > 3 ? atoi(argv[3]) : 128, D = argc > 4 ? atoi(argv[4]) : 32;
    Err err = {0};
    Model *m = NULL;
    if (model_load(&m, argv[1], &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
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
    double t0 = now_s();
    if (model_forward(r, kv, &pre, logits, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    double t_pre = now_s() - t0;
    t0 = now_s();
    for (int i = 0; i < D; i++) {
        Batch b = {1, tok + P + i, pos + P + i, seq, 1, tables, 1, &zero};
        model_forward(r, kv, &b, logits, &err);
    }
    double t_dec = now_s() - t0;
    double bw = copy_bandwidth(threads);
    double dec_tps = D / t_dec, roof = bw / (double)m->weight_bytes;
    printf("model %s: %.3fB params, %.2f GB bf16 weights read per decode token, %d threads\n", argv[1],
           m->n_params / 1e9, m->weight_bytes / 1e9, threads);
    printf("copy bandwidth (read+write)  %8.2f GB/s\n", bw / 1e9);
    printf("prefill %4d tokens          %8.1f tok/s\n", P, P / t_pre);
    printf("decode batch 1 (%d tokens)   %8.2f tok/s  (%.1f ms/token)\n", D, dec_tps, 1e3 / dec_tps);
    printf("roofline (bw / weight bytes) %8.2f tok/s\n", roof);
    printf("decode / roofline            %8.1f %%\n", 100.0 * dec_tps / roof);
    free(logits); free(bt); free(tok); free(pos); free(seq);
    kvcache_free(kv);
    runner_free(r);
    model_free(m);
    return 0;
}
