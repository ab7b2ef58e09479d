/*
 * main.c - entry point of sampler-cpu and the per-GPU binaries.
 *
 * Today: loads the model and runs a one-shot greedy generation from token
 * ids (--prompt-ids), printing the generated ids. The HTTP server replaces
 * this entry once it lands. The GPU binaries detect the device and exit
 * until the GPU backend lands.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "log.h"
#include "model.h"

#ifdef SAMPLER_GPU_SM
#include "cuda_kernels.h"
static int gpu_refuse(void) {
    int major, minor, sms;
    size_t mem;
    char name[256];
    if (cuda_device_probe(&major, &minor, &sms, &mem, name, sizeof name) != 0)
        fprintf(stderr, "sampler-sm%d: no CUDA device found; run sampler-cpu instead\n", SAMPLER_GPU_SM);
    else
        fprintf(stderr, "sampler-sm%d: found %s (sm_%d%d, %d SMs, %zu MiB); the GPU backend is not "
                "implemented yet: run sampler-cpu\n", SAMPLER_GPU_SM, name, major, minor, sms, mem >> 20);
    return 2;
}
#endif

#ifndef SAMPLER_GPU_SM
static void usage(void) {
    printf("usage: sampler-cpu [--model DIR] [--prompt-ids 1,2,3] [--max-tokens N] [--threads N]\n"
           "  --model DIR        Hugging Face model directory (default: the bundled models/tiny-qwen3)\n"
           "  --prompt-ids LIST  comma-separated prompt token ids (default: 9707,11,1879)\n"
           "  --max-tokens N     tokens to generate greedily (default 16)\n"
           "  --threads N        CPU threads (default: all cores)\n");
}

static int parse_ids(const char *s, int32_t *ids, int max) {
    int n = 0;
    while (*s && n < max) {
        char *end;
        long v = strtol(s, &end, 10);
        CHECK(end != s, "--prompt-ids: expected comma-separated integers, got '%s'", s);
        ids[n++] = (int32_t)v;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int generate(const char *dir, const int32_t *prompt, int n_prompt, int max_new, int threads) {
    Err err = {0};
    Model *m = NULL;
    CHECK(model_load(&m, dir, &err) == 0, "%s\n  fix: pass --model with a Hugging Face model directory", err.msg);
    int max_ctx = n_prompt + max_new, bs = 16, nb = (max_ctx + bs - 1) / bs;
    Runner *r = runner_create(m, n_prompt, max_ctx, threads);
    KVCache *kv = kvcache_create(&m->cfg, nb, bs);
    int32_t *bt = xmalloc(sizeof(int32_t) * (size_t)nb), *pos = xmalloc(sizeof(int32_t) * (size_t)max_ctx);
    int32_t *seq = xcalloc((size_t)max_ctx, sizeof(int32_t)), *toks = xmalloc(sizeof(int32_t) * (size_t)max_ctx);
    for (int i = 0; i < nb; i++) bt[i] = i;
    for (int i = 0; i < max_ctx; i++) pos[i] = i;
    memcpy(toks, prompt, sizeof(int32_t) * (size_t)n_prompt);
    const int32_t *tables[1] = {bt};
    float *logits = xmalloc(sizeof(float) * (size_t)m->cfg.vocab);
    int n = n_prompt;
    int32_t last = n_prompt - 1, zero = 0;
    Batch b = {n_prompt, toks, pos, seq, 1, tables, 1, &last};
    double t0 = now_s(), t1 = 0;
    printf("generated:");
    for (int step = 0; step < max_new; step++) {
        CHECK(model_forward(r, kv, &b, logits, &err) == 0, "%s", err.msg);
        if (step == 0) t1 = now_s();
        int best = 0;
        for (int i = 1; i < m->cfg.vocab; i++) best = logits[i] > logits[best] ? i : best;
        toks[n] = best;
        printf(" %d", best);
        fflush(stdout);
        b = (Batch){1, toks + n, pos + n, seq, 1, tables, 1, &zero};
        n++;
        int stop = 0;
        for (int e = 0; e < m->cfg.n_eos; e++) stop |= best == m->cfg.eos_ids[e];
        if (stop) break;
    }
    double t2 = now_s();
    printf("\nprefill %d tokens %.1f ms; decode %d tokens %.1f tok/s\n", n_prompt, (t1 - t0) * 1e3,
           n - n_prompt - 1, (n - n_prompt - 1) / (t2 - t1));
    free(logits); free(bt); free(pos); free(seq); free(toks);
    kvcache_free(kv);
    runner_free(r);
    model_free(m);
    return 0;
}

#endif

int main(int argc, char **argv) {
#ifdef SAMPLER_GPU_SM
    (void)argc; (void)argv;
    return gpu_refuse();
#else
    const char *dir = SAMPLER_SOURCE_DIR "/models/tiny-qwen3";
    int32_t prompt[4096] = {9707, 11, 1879};
    int n_prompt = 3, max_new = 16, threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(); return 0; }
        else if (!strcmp(a, "--model") && more) dir = argv[++i];
        else if (!strcmp(a, "--prompt-ids") && more) n_prompt = parse_ids(argv[++i], prompt, 4096);
        else if (!strcmp(a, "--max-tokens") && more) max_new = atoi(argv[++i]);
        else if (!strcmp(a, "--threads") && more) threads = atoi(argv[++i]);
        else { fprintf(stderr, "unknown or incomplete argument '%s'\n", a); usage(); return 2; }
    }
    CHECK(n_prompt > 0 && max_new > 0, "need at least one prompt id and --max-tokens > 0");
    return generate(dir, prompt, n_prompt, max_new, threads);
#endif
}
