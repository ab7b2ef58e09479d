/*
 * inspect.c - `trainer inspect` (per-tensor stats of a delta, after every
 * check of it that needs no base weights: exit 1 on a corrupt one), `trainer
 * fingerprint` (a checkpoint's lineage fingerprint and per-tensor hashes, in
 * the sampler's GET /admin/v1/weights JSON) and `trainer membw` (memory-copy
 * bandwidth, the reference the benchmarks divide by).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "delta.h"
#include "trainer.h"

int cmd_inspect(int argc, char **argv) {
    CHECK(argc == 2, "usage: trainer inspect step.delta");
    size_t size;
    uint8_t *buf = read_file(argv[1], &size);
    DeltaFile *f;
    Err err = {0};
    CHECK(delta_parse(&f, buf, size, &err) == 0, "%s: %s", argv[1], err.msg);
    /* The payloads too, as a sampler's apply decodes them; only the checks
     * against base weights (result hashes) need `trainer apply`. */
    CHECK(delta_check_payloads(f, default_threads(), &err) == 0, "%s: %s (the container is corrupt)", argv[1],
          err.msg);
    printf("format %u, model fingerprint %016" PRIx64 ", version %" PRIu64 " -> %" PRIu64 ", %d tensors%s, %zu bytes, "
           "checksum %016" PRIx64 "\n", f->h.format_version, f->h.fingerprint, f->h.base_version, f->h.target_version,
           f->n, (f->h.flags & DELTA_FLAG_VERSION_ONLY) ? " (version only)" : "", size, f->checksum);
    printf("%-48s %-5s %-16s %-6s %12s %12s %9s %10s %10s %6s %s\n", "tensor", "dtype", "shape", "enc", "changed",
           "numel", "frac%", "raw", "zstd", "B/chg", "xxh3_after");
    uint64_t tch = 0, traw = 0, tcomp = 0;
    for (int i = 0; i < f->n; i++) {
        const DeltaEntry *e = &f->e[i];
        char shape[64] = "[";
        for (int d = 0; d < e->ndim; d++) {
            size_t l = strlen(shape);
            snprintf(shape + l, sizeof shape - l, "%s%" PRId64, d ? "," : "", e->shape[d]);
        }
        strncat(shape, "]", sizeof shape - strlen(shape) - 1);
        printf("%-48s %-5s %-16s %-6s %12" PRId64 " %12" PRId64 " %9.4f %10" PRIu64 " %10" PRIu64 " %6.2f %016" PRIx64 "\n",
               e->name, dtype_name(e->dtype), shape, e->encoding == DELTA_DENSE ? "dense" : e->encoding == DELTA_SPARSE_XOR ? "sxor" : "sparse", e->n_changed,
               e->numel, 100.0 * (double)e->n_changed / (double)e->numel, e->raw_bytes, e->comp_bytes,
               (double)e->comp_bytes / (double)e->n_changed, e->hash_after);
        tch += (uint64_t)e->n_changed;
        traw += e->raw_bytes;
        tcomp += e->comp_bytes;
    }
    printf("total: %" PRIu64 " changed elements, payload %" PRIu64 " raw -> %" PRIu64 " zstd bytes (%.2f B/changed)\n",
           tch, traw, tcomp, tch ? (double)tcomp / (double)tch : 0.0);
    delta_file_free(f);
    free(buf);
    return 0;
}

int cmd_fingerprint(int argc, char **argv) {
    const char *dir = NULL, *fp_hex = NULL;
    uint64_t version = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--version") == 0 && i + 1 < argc) version = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--fingerprint") == 0 && i + 1 < argc) fp_hex = argv[++i];
        else if (argv[i][0] != '-' && !dir) dir = argv[i];
        else CHECK(0, "trainer fingerprint: unknown argument '%s'", argv[i]);
    }
    CHECK(dir, "usage: trainer fingerprint DIR [--version N] [--fingerprint HEX]");
    SafeTensors *st;
    Err err = {0};
    CHECK(safetensors_open(&st, dir, &err) == 0, "%s", err.msg);
    WeightVersion *wv = weight_version_from_safetensors(st, default_threads());
    wv->version = version;
    if (fp_hex) wv->fingerprint = parse_hex64(fp_hex);
    char *js = weight_version_json(wv);
    printf("%s\n", js);
    free(js);
    weight_version_free(wv);
    safetensors_free(st);
    return 0;
}

int cmd_membw(int argc, char **argv) {
    size_t mb = 512;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--mb") == 0 && i + 1 < argc) mb = (size_t)atol(argv[++i]);
    size_t n = mb << 20;
    uint8_t *a = xmalloc(n), *b = xmalloc(n);
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = now_s();
        memcpy(b, a, n);
        double t = now_s() - t0;
        if (t < best) best = t;
        a[r] = b[n - 1 - (size_t)r]; /* keep the copies observable */
    }
    printf("memcpy %zu MiB: best %.4f s, %.2f GB/s (bytes copied / time; read+write traffic is twice that)\n", mb,
           best, (double)n / best / 1e9);
    free(a);
    free(b);
    return 0;
}
