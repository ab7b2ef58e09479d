/*
 * bench_precision.c - the precision report: for one model directory, per
 * precision (bf16, fp8, nvfp4; activations quantized as on the native GPU
 * path, and weight-only), the per-token KL(BF16 || X) mean and max and top-1
 * agreement over a prefill of T tokens, the bytes read per decode token, and
 * CPU decode tokens/s. Prints a markdown table (README "Choosing a precision").
 *
 * usage: bench_precision MODEL_DIR [T=64] [decode_tokens=8] [threads]
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "logit_stats.h"
#include "model.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Prefill logits of every position, then D timed decode steps. */
static float *run(Model *m, int T, int D, int threads, double *dec_tps) {
    int ctx = T + D;
    Runner *r = runner_create(m, T, ctx, threads);
    KVCache *kv = kvcache_create(&m->cfg, (ctx + 15) / 16, 16);
    int32_t *bt = malloc(sizeof(int32_t) * ((ctx + 15) / 16)), *tok = malloc(sizeof(int32_t) * ctx);
    int32_t *pos = malloc(sizeof(int32_t) * ctx), *seq = calloc(ctx, sizeof(int32_t)), *rows = malloc(sizeof(int32_t) * T);
    for (int i = 0; i < (ctx + 15) / 16; i++) bt[i] = i;
    for (int i = 0; i < ctx; i++) { pos[i] = i; tok[i] = (int32_t)((i * 2654435761u) % (unsigned)m->cfg.vocab); }
    for (int i = 0; i < T; i++) rows[i] = i;
    const int32_t *tables[1] = {bt};
    float *logits = malloc(sizeof(float) * (size_t)T * m->cfg.vocab);
    Err err = {0};
    Batch b = {T, tok, pos, seq, 1, tables, T, rows, 0};
    if (model_forward(r, kv, &b, logits, &err)) { fprintf(stderr, "%s\n", err.msg); exit(1); }
    int32_t zero = 0;
    float *step = malloc(sizeof(float) * m->cfg.vocab);
    double t0 = now_s();
    for (int i = 0; i < D; i++) {
        Batch d = {1, tok + T + i, pos + T + i, seq, 1, tables, 1, &zero, 0};
        model_forward(r, kv, &d, step, &err);
    }
    *dec_tps = D / (now_s() - t0);
    free(step);
    free(bt); free(tok); free(pos); free(seq); free(rows);
    kvcache_free(kv);
    runner_free(r);
    return logits;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: %s MODEL_DIR [T] [decode_tokens] [threads]\n", argv[0]); return 2; }
    int T = argc > 2 ? atoi(argv[2]) : 64, D = argc > 3 ? atoi(argv[3]) : 8;
    int threads = argc > 4 ? atoi(argv[4]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    struct { Precision p; int wo; const char *name; } cfgs[] = {
        {PREC_BF16, 0, "bf16"}, {PREC_FP8, 0, "fp8 (w8a8, 128x128 / per-token-group)"},
        {PREC_FP8, 1, "fp8 weight-only"}, {PREC_NVFP4, 0, "nvfp4 (w4a4, 16-blocks)"},
        {PREC_NVFP4, 1, "nvfp4 weight-only"}};
    float *ref = NULL;
    printf("model %s, %d prompt tokens, %d decode tokens, %d threads\n\n", argv[1], T, D, threads);
    printf("| precision | KL mean | KL max | top-1 agree | weight bytes read / token | CPU decode tok/s |\n");
    printf("| --- | --- | --- | --- | --- | --- |\n");
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        Err err = {0};
        Model *m = NULL;
        LoadOptions o = {cfgs[i].p, cfgs[i].wo, 0};
        if (model_load_opts(&m, argv[1], &o, &err)) {
            printf("| %s | refused: %s | | | | |\n", cfgs[i].name, err.msg);
            continue;
        }
        double tps;
        float *lg = run(m, T, D, threads, &tps);
        LogitStats s = i == 0 ? (LogitStats){0, 0, 1, 0} : logit_stats(ref, lg, T, m->cfg.vocab);
        printf("| %s | %.2e | %.2e | %.3f | %.1f MB | %.2f |\n", cfgs[i].name, s.mean_kl, s.max_kl, s.top1,
               m->compute_bytes / 1e6, tps);
        fflush(stdout);
        if (i == 0) ref = lg;
        else free(lg);
        model_free(m);
    }
    free(ref);
    return 0;
}
