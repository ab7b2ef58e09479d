/*
 * apply.c - `trainer apply BASE step.delta -o OUT`: offline application. OUT
 * is a byte copy of BASE (every file: shards, index, config, tokenizer) with
 * the changed tensors' data ranges patched in place through the library's
 * verified, all-or-nothing delta_apply, so OUT is byte-identical to the NEW
 * checkpoint the delta was made from. Written into OUT.tmp.<pid>, fsynced,
 * then renamed: a crash never leaves a half-written OUT.
 */
#define _GNU_SOURCE /* copy_file_range */
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "delta.h"
#include "trainer.h"

static void copy_file(const char *src, const char *dst) {
    int in = open(src, O_RDONLY);
    CHECK(in >= 0, "cannot open %s", src);
    int out = open(dst, O_WRONLY | O_CREAT | O_EXCL, 0644);
    CHECK(out >= 0, "cannot create %s", dst);
    struct stat sb;
    CHECK_SYS(fstat(in, &sb), "stat %s", src);
    off_t left = sb.st_size;
    while (left > 0) {
        ssize_t n = copy_file_range(in, NULL, out, NULL, (size_t)left, 0);
        if (n <= 0) { /* filesystems without copy_file_range: plain copy */
            static uint8_t buf[1 << 20];
            n = read(in, buf, sizeof buf);
            CHECK(n > 0, "read error on %s", src);
            for (ssize_t w = 0; w < n;) {
                ssize_t k = write(out, buf + w, (size_t)(n - w));
                CHECK(k > 0, "write error on %s (disk full?)", dst);
                w += k;
            }
        }
        left -= n;
    }
    close(in);
    close(out);
}

/* Name -> storage inside the writable maps of the copied shards. */
typedef struct OutMaps {
    const SafeTensors *base;
    uint8_t **maps; /* [n_files] MAP_SHARED of OUT.tmp's shards */
} OutMaps;

static void *lookup_out(void *ctx, const char *name, Dtype *dt, int64_t *numel) {
    OutMaps *om = ctx;
    if (om->base->n == 0) return NULL;
    const StTensor *t = safetensors_get(om->base, name);
    if (!t) return NULL;
    *dt = t->dtype;
    *numel = t->numel;
    return om->maps[t->file] + (t->data - om->base->maps[t->file]);
}

static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    char p[4096];
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        path_join(p, sizeof p, dir, de->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

int cmd_apply(int argc, char **argv) {
    const char *base_dir = NULL, *delta_path = NULL, *out = NULL, *fp_hex = NULL;
    int threads = default_threads();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
        if (strcmp(a, "-o") == 0 && more) out = argv[++i];
        else if (strcmp(a, "--fingerprint") == 0 && more) fp_hex = argv[++i];
        else if (strcmp(a, "--threads") == 0 && more) threads = atoi(argv[++i]);
        else if (a[0] != '-' && !base_dir) base_dir = a;
        else if (a[0] != '-' && !delta_path) delta_path = a;
        else CHECK(0, "trainer apply: unknown or incomplete argument '%s'", a);
    }
    CHECK(base_dir && delta_path && out, "usage: trainer apply BASE step.delta -o OUT");
    struct stat sb;
    CHECK(stat(out, &sb) != 0, "%s exists: choose a new output directory (apply never overwrites)", out);
    CHECK(stat(base_dir, &sb) == 0 && S_ISDIR(sb.st_mode), "%s is not a checkpoint directory", base_dir);
    double t0 = now_s();
    size_t dsize;
    uint8_t *dbuf = read_file(delta_path, &dsize);
    DeltaFile *df;
    Err err = {0};
    CHECK(delta_parse(&df, dbuf, dsize, &err) == 0, "%s: %s", delta_path, err.msg);
    SafeTensors *st;
    CHECK(safetensors_open(&st, base_dir, &err) == 0, "%s", err.msg);

    char tmp[4096];
    int tl = snprintf(tmp, sizeof tmp, "%s.tmp.%d", out, (int)getpid());
    CHECK(tl > 0 && (size_t)tl < sizeof tmp, "output path too long");
    CHECK_SYS(mkdir(tmp, 0755), "cannot create %s", tmp);
    DIR *d = opendir(base_dir);
    CHECK_PTR(d, "cannot list %s", base_dir);
    struct dirent *de;
    char src[4096], dst[4096];
    uint64_t copied = 0;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        path_join(src, sizeof src, base_dir, de->d_name);
        path_join(dst, sizeof dst, tmp, de->d_name);
        CHECK(stat(src, &sb) == 0, "cannot stat %s", src);
        if (!S_ISREG(sb.st_mode)) {
            remove_tree(tmp);
            CHECK(0, "%s is not a regular file: checkpoints with subdirectories are not supported", src);
        }
        copy_file(src, dst);
        copied += (uint64_t)sb.st_size;
    }
    closedir(d);
    double t1 = now_s();

    /* Map the copied shards writable; same offsets as the base's. */
    OutMaps om = {.base = st, .maps = xcalloc((size_t)st->n_files + 1, sizeof(uint8_t *))};
    for (int f = 0; f < st->n_files; f++) {
        char p[4096], pcopy[4096];
        snprintf(pcopy, sizeof pcopy, "%s", st->paths[f]);
        path_join(p, sizeof p, tmp, basename(pcopy));
        int fd = open(p, O_RDWR);
        CHECK(fd >= 0, "cannot open %s", p);
        om.maps[f] = st->sizes[f] ? mmap(NULL, st->sizes[f], PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : NULL;
        CHECK(st->sizes[f] == 0 || om.maps[f] != MAP_FAILED, "mmap %s", p);
        close(fd);
    }
    WeightVersion *wv = weight_version_from_safetensors(st, threads);
    wv->version = df->h.base_version;
    if (fp_hex) wv->fingerprint = parse_hex64(fp_hex);
    else if (df->h.base_version > 0) wv->fingerprint = df->h.fingerprint; /* lineage root not at hand */
    DeltaTarget tgt = {.lookup = lookup_out, .ctx = &om, .n_threads = threads};
    DeltaResult res;
    int rc = delta_apply(dbuf, dsize, &tgt, wv, &res, &err);
    double t2 = now_s();
    for (int f = 0; f < st->n_files; f++)
        if (om.maps[f]) {
            CHECK_SYS(msync(om.maps[f], st->sizes[f], MS_SYNC), "msync");
            munmap(om.maps[f], st->sizes[f]);
        }
    if (rc != 0) {
        remove_tree(tmp);
        CHECK(0, "%s does not apply to %s: %s (nothing written)", delta_path, base_dir, err.msg);
    }
    d = opendir(tmp);
    CHECK_PTR(d, "cannot list %s", tmp);
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' && (de->d_name[1] == 0 || strcmp(de->d_name, "..") == 0)) continue;
        path_join(dst, sizeof dst, tmp, de->d_name);
        int fd = open(dst, O_RDONLY);
        CHECK(fd >= 0 && fsync(fd) == 0, "fsync %s", dst);
        close(fd);
    }
    closedir(d);
    fsync_dir(tmp);
    CHECK_SYS(rename(tmp, out), "rename %s -> %s", tmp, out);
    char ocopy[4096];
    snprintf(ocopy, sizeof ocopy, "%s", out);
    fsync_dir(dirname(ocopy));
    double t3 = now_s();
    printf("applied %s: version %" PRIu64 " -> %" PRIu64 ", %d tensors, %" PRId64 " elements updated\n", delta_path,
           df->h.base_version, res.version, res.tensors_updated, res.elements_updated);
    printf("wrote %s (%" PRIu64 " bytes); time %.3f s (copy %.3f, verify+apply %.3f, sync %.3f)\n", out, copied,
           t3 - t0, t1 - t0, t2 - t1, t3 - t2);
    weight_version_free(wv);
    free(om.maps);
    safetensors_free(st);
    delta_file_free(df);
    free(dbuf);
    return 0;
}
