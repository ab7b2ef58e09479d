/*
 * diff.c - `trainer diff OLD NEW -o step.delta`: bit-exact difference of two
 * checkpoints of the same model as a delta container. Streams over the
 * memory-mapped shards (only the compressed records are kept), one tensor
 * per task on a thread pool, largest tensors first. Two identical checkpoints
 * give a version-only delta (no records, the header's version_only flag set).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <xxhash.h>

#include "delta.h"
#include "trainer.h"

typedef struct DiffJob {
    const SafeTensors *a, *b;
    int *order;          /* [n] tensor indices, largest first */
    DeltaRecord *rec;    /* [n] by tensor index */
    uint64_t *old_hash;  /* [n] or NULL when the fingerprint is given */
    int level, xor_values;
} DiffJob;

static void diff_one(void *ctx, int k) {
    DiffJob *j = ctx;
    int i = j->order[k];
    const StTensor *ta = &j->a->t[i], *tb = &j->b->t[i]; /* same sorted names (check_same_structure) */
    Err err = {0};
    CHECK(delta_encode_tensor(&j->rec[i], ta->name, ta->dtype, ta->ndim, ta->shape, ta->data, tb->data, j->level, j->xor_values,
                              &err) == 0, "%s", err.msg);
    if (j->old_hash) j->old_hash[i] = XXH3_64bits(ta->data, ta->nbytes);
}

static const SafeTensors *g_sort_st;
static int cmp_size_desc(const void *x, const void *y) {
    size_t a = g_sort_st->t[*(const int *)x].nbytes, b = g_sort_st->t[*(const int *)y].nbytes;
    return a < b ? 1 : a > b ? -1 : 0;
}

/* Same tensor names, dtypes and shapes: a delta never changes structure. */
static void check_same_structure(const SafeTensors *a, const SafeTensors *b, const char *pa, const char *pb) {
    CHECK(a->n == b->n, "%s has %d tensors, %s has %d: not two checkpoints of one model", pa, a->n, pb, b->n);
    for (int i = 0; i < a->n; i++) {
        const StTensor *ta = &a->t[i], *tb = &b->t[i];
        CHECK(strcmp(ta->name, tb->name) == 0, "tensor '%s' of %s is not in %s", ta->name, pa, pb);
        CHECK(ta->dtype == tb->dtype && ta->ndim == tb->ndim &&
                  memcmp(ta->shape, tb->shape, sizeof(int64_t) * (size_t)ta->ndim) == 0,
              "tensor '%s' differs in dtype or shape between %s and %s", ta->name, pa, pb);
    }
}

int cmd_diff(int argc, char **argv) {
    const char *old_dir = NULL, *new_dir = NULL, *out = NULL, *fp_hex = NULL;
    uint64_t base = 0, target = 0;
    int level = 3, threads = default_threads(), have_target = 0, xor_values = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
        if (strcmp(a, "-o") == 0 && more) out = argv[++i];
        else if (strcmp(a, "--base-version") == 0 && more) base = strtoull(argv[++i], NULL, 10);
        else if (strcmp(a, "--target-version") == 0 && more) target = strtoull(argv[++i], NULL, 10), have_target = 1;
        else if (strcmp(a, "--fingerprint") == 0 && more) fp_hex = argv[++i];
        else if (strcmp(a, "--level") == 0 && more) level = atoi(argv[++i]);
        else if (strcmp(a, "--values") == 0 && more) {
            const char *v = argv[++i];
            CHECK(strcmp(v, "raw") == 0 || strcmp(v, "xor") == 0, "--values takes raw or xor, not '%s'", v);
            xor_values = strcmp(v, "xor") == 0;
        }
        else if (strcmp(a, "--threads") == 0 && more) threads = atoi(argv[++i]);
        else if (a[0] != '-' && !old_dir) old_dir = a;
        else if (a[0] != '-' && !new_dir) new_dir = a;
        else CHECK(0, "trainer diff: unknown or incomplete argument '%s' (see `trainer` for usage)", a);
    }
    CHECK(old_dir && new_dir && out, "usage: trainer diff OLD NEW -o step.delta [--base-version N] ...");
    if (!have_target) target = base + 1;
    CHECK(target > base, "--target-version %" PRIu64 " must be after --base-version %" PRIu64, target, base);
    CHECK(target <= DELTA_VERSION_MAX, "--target-version %" PRIu64 " is beyond the largest version 2^62 = %" PRIu64
          " (docs/delta-format.md)", target, (uint64_t)DELTA_VERSION_MAX);
    CHECK(base == 0 || fp_hex, "--base-version %" PRIu64 " > 0 needs --fingerprint HEX: the lineage fingerprint of "
          "version 0 (shown by `trainer inspect` of an earlier delta or `trainer fingerprint` of the version-0 "
          "checkpoint)", base);
    double t0 = now_s();
    SafeTensors *a, *b;
    Err err = {0};
    CHECK(safetensors_open(&a, old_dir, &err) == 0, "%s", err.msg);
    CHECK(safetensors_open(&b, new_dir, &err) == 0, "%s", err.msg);
    check_same_structure(a, b, old_dir, new_dir);
    int same_layout = a->n_files == b->n_files;
    for (int i = 0; i < a->n && same_layout; i++)
        same_layout = a->t[i].data - a->maps[a->t[i].file] == b->t[i].data - b->maps[b->t[i].file] &&
                      strcmp(strrchr(a->paths[a->t[i].file], '/') ? strrchr(a->paths[a->t[i].file], '/') : "",
                             strrchr(b->paths[b->t[i].file], '/') ? strrchr(b->paths[b->t[i].file], '/') : "") == 0;
    if (!same_layout)
        fprintf(stderr, "note: %s and %s lay their tensors out differently (shards or offsets): `trainer apply` will "
                "give NEW's tensor bytes in OLD's file layout, not NEW's files byte for byte\n", old_dir, new_dir);

    DiffJob j = {.a = a, .b = b, .level = level, .xor_values = xor_values};
    j.order = xmalloc(sizeof(int) * (size_t)(a->n + 1));
    j.rec = xcalloc((size_t)a->n + 1, sizeof(DeltaRecord));
    if (!fp_hex) j.old_hash = xcalloc((size_t)a->n + 1, sizeof(uint64_t));
    for (int i = 0; i < a->n; i++) j.order[i] = i;
    g_sort_st = a;
    qsort(j.order, (size_t)a->n, sizeof(int), cmp_size_desc);
    double t1 = now_s();
    delta_par_for(a->n, threads, diff_one, &j);
    double t2 = now_s();

    DeltaHeader h = {.base_version = base, .target_version = target};
    h.fingerprint = fp_hex ? parse_hex64(fp_hex) : delta_fingerprint(a, j.old_hash);
    int n = 0;
    uint64_t total_bytes = 0, nch = 0, numel = 0, n_dense = 0;
    for (int i = 0; i < a->n; i++) {
        total_bytes += a->t[i].nbytes;
        numel += (uint64_t)a->t[i].numel;
        if (j.rec[i].n_changed) {
            nch += (uint64_t)j.rec[i].n_changed;
            n_dense += j.rec[i].encoding == DELTA_DENSE;
            j.rec[n++] = j.rec[i];
        }
    }
    if (n == 0) { /* nothing changed: say so in the header, or samplers refuse an empty delta */
        h.flags |= DELTA_FLAG_VERSION_ONLY;
        fprintf(stderr, "note: %s and %s are identical: a version-only delta (version_only flag set)\n", old_dir,
                new_dir);
    }
    size_t size;
    uint8_t *buf = delta_serialize(&h, j.rec, n, &size);
    write_file_atomic(out, buf, size);
    double t3 = now_s();
    printf("delta %s: version %" PRIu64 " -> %" PRIu64 ", model fingerprint %016" PRIx64 "\n", out, base, target,
           h.fingerprint);
    printf("tensors changed %d of %d (%" PRIu64 " dense)\n", n, a->n, n_dense);
    printf("elements changed %" PRIu64 " of %" PRIu64 " (%.6f%%)\n", nch, numel, numel ? 100.0 * (double)nch / (double)numel : 0.0);
    printf("bytes before %" PRIu64 " (checkpoint tensors), after %zu (delta), ratio %.1fx\n", total_bytes, size,
           size ? (double)total_bytes / (double)size : 0.0);
    printf("time %.3f s (open %.3f, diff %.3f, write %.3f), diff throughput %.2f GB/s of checkpoint, %d threads\n",
           t3 - t0, t1 - t0, t2 - t1, t3 - t2, (double)total_bytes / (t2 - t1) / 1e9, threads);
    free(buf);
    for (int i = 0; i < n; i++) delta_record_free(&j.rec[i]);
    free(j.rec);
    free(j.order);
    free(j.old_hash);
    safetensors_free(a);
    safetensors_free(b);
    return 0;
}
