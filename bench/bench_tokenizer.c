/*
 * bench_tokenizer.c - one-thread encode throughput (MB/s) of the tokenizer
 * on the golden corpus, document by document, plus decode throughput and the
 * load time. The best of the repeats, and the first pass alone (the
 * whole-token cache filling: Bpe.whole). bench/tokenizer_vs_hf.py runs this
 * and HF `tokenizers` in the same run and prints the ratios.
 *
 *   bench_tokenizer [model_dir] [corpus.bin.zst] [repeats] [first_doc]
 * first_doc 10 skips the corpus' ten pathological long runs (5000 spaces,
 * 3000 letters, ...), which dominate the time of both implementations.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zstd.h>

#include "tokenizer.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "tests/data/tokenizers/qwen3";
    const char *path = argc > 2 ? argv[2] : "tests/data/tokenizers/corpus.bin.zst";
    int reps = argc > 3 ? atoi(argv[3]) : 3;
    uint32_t first = argc > 4 ? (uint32_t)atoi(argv[4]) : 0;
    Err e = {0};
    double t0 = now();
    Tokenizer *t = tokenizer_load(dir, &e);
    CHECK(t, "%s", e.msg);
    double t_load = now() - t0;
    FILE *f = fopen(path, "rb");
    CHECK(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *z = xmalloc((size_t)n);
    CHECK(fread(z, 1, (size_t)n, f) == (size_t)n, "read %s", path);
    fclose(f);
    unsigned long long sz = ZSTD_getFrameContentSize(z, (size_t)n);
    char *buf = xmalloc(sz);
    ZSTD_DCtx *dc = ZSTD_createDCtx();
    ZSTD_DCtx_setParameter(dc, ZSTD_d_windowLogMax, 27);
    CHECK(ZSTD_decompressDCtx(dc, buf, sz, z, (size_t)n) == sz, "bad corpus %s", path);
    ZSTD_freeDCtx(dc);
    uint32_t nd;
    memcpy(&nd, buf, 4);
    const char **doc = xmalloc(nd * sizeof *doc);
    uint32_t *len = xmalloc(nd * sizeof *len);
    size_t off = 4, bytes = 0;
    for (uint32_t i = 0; i < nd; i++) {
        memcpy(&len[i], buf + off, 4);
        doc[i] = buf + off + 4;
        off += 4 + len[i];
        if (i >= first) bytes += len[i];
    }
    TokIds ids = {0};
    size_t ntok = 0;
    double best = 1e30, first_pass = 0;
    for (int r = 0; r < reps; r++) {
        ntok = 0;
        double s = now();
        for (uint32_t i = first; i < nd; i++) {
            ids.n = 0;
            CHECK(tokenizer_encode(t, doc[i], len[i], false, &ids, &e) == 0, "%s", e.msg);
            ntok += ids.n;
        }
        double el = now() - s;
        if (el < best) best = el;
        if (r == 0) first_pass = el;
    }
    /* decode throughput over the same ids, one document at a time */
    double dbest = 1e30;
    for (int r = 0; r < reps; r++) {
        double el = 0;
        for (uint32_t i = first; i < nd; i++) {
            ids.n = 0;
            tokenizer_encode(t, doc[i], len[i], false, &ids, &e);
            double s = now();
            char *out;
            size_t ol;
            tokenizer_decode(t, ids.ids, ids.n, false, &out, &ol, &e);
            el += now() - s;
            free(out);
        }
        if (el < dbest) dbest = el;
    }
    printf("model %s: load %.2f s, corpus docs %u..%u, %.2f MB, %zu tokens\n", dir, t_load, first, nd, bytes / 1e6, ntok);
    printf("load_s %.4f\n", t_load);
    printf("encode_mb_s %.2f\n", bytes / 1e6 / best);
    printf("encode_first_pass_mb_s %.2f\n", bytes / 1e6 / first_pass);
    printf("decode_mb_s %.2f\n", bytes / 1e6 / dbest);
    tok_ids_free(&ids);
    free(doc);
    free(len);
    free(buf);
    free(z);
    tokenizer_free(t);
    return 0;
}
