/*
 * bench_matmul.c - the CPU bf16 matmul paths (cpu_ops.h) against each other
 * in one run, through the CPU backend (its task split and thread pool), on
 * Qwen3-0.6B's matrix shapes with random weights:
 *   decode  n = 1 over 8 layers' matrices (~240 MB, well past the L3): GB/s of
 *           weights, and as a fraction of a plain multi-threaded read;
 *   batch   n = 2, 4, 8, 16 on the same weights: tokens/s of the matmuls;
 *   prefill n = 512 over one layer's matrices: GFLOP/s.
 * Repetitions alternate the paths (ABAB...) so a shared machine's load hits
 * them alike; the medians are printed with ratios to the first path given.
 *
 * usage: bench_matmul [threads] [reps] [paths, comma-separated; default avx2-v0 and the others available] [format]
 * A path named with "+bf16" (avx512+bf16) runs with BF16 activations (--dtype bfloat16).
 * format: bf16 (default), fp8 (weights quantized to FP8 128x128 blocks, activations quantized
 * too: --precision fp8) or fp8-wo (weight-only); decode GB/s then counts the FP8 bytes. The FP8
 * kernels follow the path (quant.h QuantPath).
 * What it is not: a forward-pass benchmark (bench_forward.c runs the model).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "cpu_ops.h"
#include "dtype.h"
#include "quant.h"
#include "threadpool.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct { const uint64_t *p; size_t n; uint64_t *sink; } ReadJob;

static void read_task(void *ctx, int task, int thread) {
    ReadJob *j = ctx;
    size_t per = j->n / 64, i0 = (size_t)task * per;
    uint64_t s = 0;
    for (size_t i = i0; i < i0 + per; i += 4) s += j->p[i] ^ j->p[i + 1] ^ j->p[i + 2] ^ j->p[i + 3];
    j->sink[task * 8] = s;
}

/* Plain read bandwidth of `bytes`, best of 3, on the pool's threads. */
static double read_bw(ThreadPool *tp, const void *buf, size_t bytes) {
    uint64_t sink[64 * 8];
    ReadJob j = {buf, bytes / 8, sink};
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now_s();
        threadpool_run(tp, 64, read_task, &j);
        double bw = (double)bytes / (now_s() - t0);
        if (bw > best) best = bw;
    }
    return best;
}

#define LAYERS 8
#define NMAT 7

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1, reps = argc > 2 ? atoi(argv[2]) : 5;
    int paths[2 * CPU_PATH_COUNT], acts[2 * CPU_PATH_COUNT] = {0}, np = 0; /* "avx512+bf16": BF16 activations */
    cpu_ops_init();
    CpuPath def = cpu_ops_path();
    const char *fmt = argc > 4 ? argv[4] : "bf16";
    int fp8 = !strncmp(fmt, "fp8", 3), act_quant = fp8 && strcmp(fmt, "fp8-wo") != 0;
    if (argc > 3 && strcmp(argv[3], "-")) {
        char *list = strdup(argv[3]);
        for (char *tok = strtok(list, ","); tok && np < 2 * CPU_PATH_COUNT; tok = strtok(NULL, ",")) {
            char *plus = strchr(tok, '+');
            int act = plus && !strcmp(plus, "+bf16");
            if (plus) *plus = 0;
            for (int p = 0; p < CPU_PATH_COUNT; p++)
                if (!strcmp(tok, cpu_ops_path_name((CpuPath)p)) && cpu_ops_path_available((CpuPath)p)) {
                    acts[np] = act;
                    paths[np++] = p;
                }
        }
        free(list);
    } else {
        paths[np++] = CPU_PATH_AVX2_V0;
        for (int p = CPU_PATH_AVX2; p < CPU_PATH_COUNT; p++)
            if (cpu_ops_path_available((CpuPath)p)) paths[np++] = p;
    }
    if (np == 0 || !cpu_ops_path_available((CpuPath)paths[0])) {
        fprintf(stderr, "no runnable path given\n");
        return 2;
    }
    /* Qwen3-0.6B: hidden 1024, 16 q heads and 8 kv heads of 128, MLP 3072. */
    static const int shape[NMAT][2] = {{2048, 1024}, {1024, 1024}, {1024, 1024}, {1024, 2048},
                                       {3072, 1024}, {3072, 1024}, {1024, 3072}};
    WeightMat w[LAYERS][NMAT];
    size_t wbytes = 0, layer_flops = 0;
    uint32_t rng = 1;
    for (int l = 0; l < LAYERS; l++)
        for (int m = 0; m < NMAT; m++) {
            size_t numel = (size_t)shape[m][0] * shape[m][1];
            w[l][m] = (WeightMat){.fmt = WF_BF16, .rows = shape[m][0], .cols = shape[m][1]};
            w[l][m].bf16 = aligned_alloc(64, (numel * 2 + 63) / 64 * 64);
            for (size_t i = 0; i < numel; i++) {
                rng = rng * 1664525u + 1013904223u;
                w[l][m].bf16[i] = f32_to_bf16(((float)(rng >> 9) / 8388608.0f - 1.0f) * 0.02f);
            }
            wbytes += numel * 2;
            if (fp8) {
                Err e = {0};
                QuantFp8 *q = quant_fp8_from_bf16(w[l][m].bf16, shape[m][0], shape[m][1], QUANT_FP8_BLOCK128, &e);
                if (!q) { fprintf(stderr, "%s\n", e.msg); return 1; }
                w[l][m].fmt = WF_FP8;
                w[l][m].q = q;
                w[l][m].act_quant = act_quant;
                wbytes += quant_fp8_bytes(q) - numel * 2;
            }
            if (l == 0) layer_flops += 2 * numel;
        }
    int P = 512, maxc = 3072;
    float *x = malloc(sizeof(float) * (size_t)P * maxc), *out = malloc(sizeof(float) * (size_t)P * maxc);
    for (size_t i = 0; i < (size_t)P * maxc; i++) x[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    Backend *b = backend_cpu_create(threads, 16);
    b->reserve(b, P, maxc);
    ThreadPool *tp = threadpool_create(threads);
    void *rbuf = malloc(wbytes);
    memset(rbuf, 1, wbytes);
    enum { DEC, B2, B4, B8, B16, PRE, NM };
    static const char *const mname[NM] = {"decode n=1 GB/s", "batch n=2 tok/s", "batch n=4 tok/s",
                                          "batch n=8 tok/s", "batch n=16 tok/s", "prefill n=512 GFLOP/s"};
    static const int mn[NM] = {1, 2, 4, 8, 16, 512};
    double (*res)[NM][64] = calloc(2 * CPU_PATH_COUNT, sizeof *res), rd[64];
    if (reps > 64) reps = 64;
    for (int rep = 0; rep < reps; rep++) {
        rd[rep] = read_bw(tp, rbuf, wbytes);
        for (int pi = 0; pi < np; pi++) {
            int ri = (pi + rep) % np, p = paths[ri]; /* rotate the order too */
            cpu_ops_force_path((CpuPath)p);
            b->set_act_bf16(b, acts[ri]);
            for (int mi = 0; mi < NM; mi++) {
                int n = mn[mi], L = mi == PRE ? 1 : LAYERS;
                double t0 = now_s();
                for (int l = 0; l < L; l++)
                    for (int m = 0; m < NMAT; m++) b->matmul(b, out, x, n, &w[l][m], NULL);
                double dt = now_s() - t0;
                res[ri][mi][rep] = mi == DEC ? wbytes / dt / 1e9 : mi == PRE ? layer_flops * (double)n / dt / 1e9 : n / dt;
            }
        }
    }
    double rdm = median(rd, reps) / 1e9;
    printf("threads %d, reps %d (medians), %s weights, plain read %.2f GB/s over %.0f MB; default path %s\n", threads,
           reps, fmt, rdm, wbytes / 1e6, cpu_ops_path_name(def));
    printf("%-22s", "measure");
    char nm[2 * CPU_PATH_COUNT][24];
    for (int pi = 0; pi < np; pi++)
        snprintf(nm[pi], sizeof nm[pi], "%s%s", cpu_ops_path_name((CpuPath)paths[pi]), acts[pi] ? "+bf16" : "");
    for (int pi = 0; pi < np; pi++) printf(" %12s", nm[pi]);
    for (int pi = 1; pi < np; pi++) printf(" %9s/%s", nm[pi], "ref");
    printf("\n");
    for (int mi = 0; mi < NM; mi++) {
        double med[2 * CPU_PATH_COUNT];
        printf("%-22s", mname[mi]);
        for (int pi = 0; pi < np; pi++) printf(" %12.2f", med[pi] = median(res[pi][mi], reps));
        for (int pi = 1; pi < np; pi++) printf(" %13.2fx", med[pi] / med[0]);
        if (mi == DEC) printf("   (%.0f%% of read for the last path)", 100.0 * med[np - 1] / rdm);
        printf("\n");
    }
    b->free(b);
    threadpool_free(tp);
    for (int l = 0; l < LAYERS; l++)
        for (int m = 0; m < NMAT; m++) {
            if (fp8) quant_fp8_free(w[l][m].q);
            free(w[l][m].bf16);
        }
    free(rbuf);
    free(res);
    free(x);
    free(out);
    return 0;
}
