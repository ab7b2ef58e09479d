/*
 * safetensors.c - validated reader of safetensors files and sharded
 * checkpoint directories, memory-mapped or read into private memory (see
 * safetensors.h).
 *
 * File layout: u64 little-endian header length N, N bytes of JSON
 * {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
 * then the data; offsets are relative to the end of the header.
 */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER (100u << 20) /* the reference implementation's limit */

static int cmp_tensor(const void *a, const void *b) {
    return strcmp(((const StTensor *)a)->name, ((const StTensor *)b)->name);
}

/* Validate one header entry and append it to st->t. */
static int parse_entry(SafeTensors *st, int file, const char *key, json_t *v, uint8_t *data,
                       size_t data_size, const char *label, Err *err) {
    ENSURE(err, json_is_object(v), 400, "%s: tensor '%s': entry is not an object", label, key);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    ENSURE(err, json_is_string(jd) && json_is_array(js) && json_is_array(jo) && json_array_size(jo) == 2,
           400, "%s: tensor '%s': needs dtype, shape and data_offsets[2]", label, key);
    StTensor t = {0};
    ENSURE(err, dtype_from_name(json_string_value(jd), &t.dtype) == 0, 400,
           "%s: tensor '%s': unsupported dtype '%s'", label, key, json_string_value(jd));
    ENSURE(err, json_array_size(js) <= ST_MAX_DIMS, 400, "%s: tensor '%s': more than %d dims", label,
           key, ST_MAX_DIMS);
    t.ndim = (int)json_array_size(js);
    uint64_t numel = 1;
    for (int i = 0; i < t.ndim; i++) {
        json_t *d = json_array_get(js, (size_t)i);
        ENSURE(err, json_is_integer(d) && json_integer_value(d) >= 0 && json_integer_value(d) < (1ll << 40),
               400, "%s: tensor '%s': bad shape[%d]", label, key, i);
        t.shape[i] = json_integer_value(d);
        ENSURE(err, t.shape[i] == 0 || numel <= (UINT64_MAX >> 8) / (uint64_t)t.shape[i], 400,
               "%s: tensor '%s': shape overflows", label, key);
        numel *= (uint64_t)t.shape[i];
    }
    json_t *b = json_array_get(jo, 0), *e = json_array_get(jo, 1);
    ENSURE(err, json_is_integer(b) && json_is_integer(e), 400, "%s: tensor '%s': offsets not integers",
           label, key);
    json_int_t ib = json_integer_value(b), ie = json_integer_value(e);
    ENSURE(err, ib >= 0 && ie >= ib && (uint64_t)ie <= data_size, 400,
           "%s: tensor '%s': data_offsets [%lld, %lld] outside the %zu data bytes (truncated file?)",
           label, key, (long long)ib, (long long)ie, data_size);
    ENSURE(err, numel * (uint64_t)dtype_size(t.dtype) == (uint64_t)(ie - ib), 400,
           "%s: tensor '%s': %llu elements of %s need %llu bytes, offsets give %lld", label, key,
           (unsigned long long)numel, dtype_name(t.dtype),
           (unsigned long long)(numel * (uint64_t)dtype_size(t.dtype)), (long long)(ie - ib));
    t.numel = (int64_t)numel;
    t.data = data + ib;
    t.nbytes = (size_t)(ie - ib);
    t.file = file;
    t.name = xstrdup(key);
    st->t = realloc(st->t, sizeof(StTensor) * (size_t)(st->n + 1));
    CHECK_PTR(st->t, "out of memory");
    st->t[st->n++] = t;
    return 0;
}

int safetensors_parse(SafeTensors *st, int file, uint8_t *buf, size_t size, const char *label, Err *err) {
    ENSURE(err, size >= 8, 400, "%s: shorter than the 8-byte header length", label);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    ENSURE(err, hlen <= ST_MAX_HEADER && hlen <= size - 8, 400,
           "%s: header length %llu exceeds the file (%zu bytes): truncated or not safetensors", label,
           (unsigned long long)hlen, size);
    json_error_t je;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    ENSURE(err, root != NULL, 400, "%s: header is not valid JSON: %s (offset %d)", label, je.text, je.position);
    if (!json_is_object(root)) {
        json_decref(root);
        return ERR(err, 400, "%s: header is not a JSON object", label);
    }
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) continue;
        rc = parse_entry(st, file, key, v, buf + 8 + hlen, size - 8 - (size_t)hlen, label, err);
        if (rc) break;
    }
    json_decref(root);
    return rc;
}

static int open_plain(void *ctx, const char *path, Err *err) {
    (void)ctx;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ENSURE(err, fd >= 0, 404, "%s: cannot open: %s", path, strerror(errno));
    return fd;
}

static const StOpener plain_opener = {open_plain, NULL, 0};
static const StOpener private_opener = {open_plain, NULL, 1};

/* size bytes of fd into fresh private anonymous memory (huge pages where the
 * kernel gives them: a weight stream then walks far fewer TLB entries). A
 * file that shrinks or grows while it is read is an error: the image would
 * not be one version of the file. */
static int read_private(int fd, size_t size, const char *path, void **out, Err *err) {
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ENSURE(err, m != MAP_FAILED, 503, "%s: cannot allocate %zu bytes to read it into: %s", path, size, strerror(errno));
#ifdef MADV_HUGEPAGE
    (void)madvise(m, size, MADV_HUGEPAGE);
#endif
    size_t off = 0;
    while (off < size) {
        size_t want = size - off < ((size_t)1 << 30) ? size - off : ((size_t)1 << 30);
        ssize_t got = pread(fd, (uint8_t *)m + off, want, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            munmap(m, size);
            return got < 0 ? ERR(err, 500, "%s: read: %s", path, strerror(errno))
                           : ERR(err, 409, "%s: the file shrank while it was read (written by another process?)", path);
        }
        off += (size_t)got;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || (size_t)sb.st_size != size) {
        munmap(m, size);
        return ERR(err, 409, "%s: the file changed size while it was read (written by another process?)", path);
    }
    *out = m;
    return 0;
}

static int map_file(SafeTensors *st, const char *path, const StOpener *op, Err *err) {
    int fd = op->open(op->ctx, path, err);
    if (fd < 0) return fd;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return ERR(err, 500, "%s: fstat: %s", path, strerror(errno));
    }
    size_t size = (size_t)sb.st_size;
    void *m = NULL;
    if (size && op->copy) {
        int rc = read_private(fd, size, path, &m, err);
        close(fd);
        if (rc) return rc;
    } else {
        m = size ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0) : NULL;
        close(fd);
        ENSURE(err, size == 0 || m != MAP_FAILED, 500, "%s: mmap: %s", path, strerror(errno));
    }
    int i = st->n_files++;
    st->paths = realloc(st->paths, sizeof(char *) * (size_t)st->n_files);
    st->maps = realloc(st->maps, sizeof(uint8_t *) * (size_t)st->n_files);
    st->sizes = realloc(st->sizes, sizeof(size_t) * (size_t)st->n_files);
    CHECK(st->paths && st->maps && st->sizes, "out of memory");
    st->paths[i] = xstrdup(path);
    st->maps[i] = m;
    st->sizes[i] = size;
    return safetensors_parse(st, i, m, size, path, err);
}

/* Sharded checkpoint: map every distinct shard named in the index and check
 * that each tensor the index promises is in the shard it names. */
static int open_index(SafeTensors *st, const char *dir, const char *index_path, const StOpener *op, Err *err) {
    json_error_t je;
    int fd = op->open(op->ctx, index_path, err);
    if (fd < 0) return fd;
    json_t *root = json_loadfd(fd, JSON_REJECT_DUPLICATES, &je);
    close(fd);
    ENSURE(err, root != NULL, 400, "%s: invalid JSON: %s (line %d)", index_path, je.text, je.line);
    json_t *wm = json_object_get(root, "weight_map");
    int rc = 0;
    if (!json_is_object(wm)) {
        rc = ERR(err, 400, "%s: no weight_map object", index_path);
        goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        const char *shard = json_string_value(v);
        if (!shard || strchr(shard, '/') || strcmp(shard, "..") == 0 || !*shard) {
            rc = ERR(err, 400, "%s: tensor '%s': bad shard file name", index_path, key);
            goto out;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, shard);
        int have = 0;
        for (int i = 0; i < st->n_files; i++) have |= strcmp(st->paths[i], path) == 0;
        if (!have && (rc = map_file(st, path, op, err)) != 0) goto out;
    }
    qsort(st->t, (size_t)st->n, sizeof(StTensor), cmp_tensor);
    json_object_foreach(wm, key, v) {
        const StTensor *t = safetensors_get(st, key);
        const char *shard = json_string_value(v);
        size_t sl = strlen(shard);
        if (!t) {
            rc = ERR(err, 400, "%s: tensor '%s' is listed but missing from %s", index_path, key, shard);
            goto out;
        }
        const char *p = st->paths[t->file];
        size_t pl = strlen(p);
        if (pl < sl || strcmp(p + pl - sl, shard) != 0) {
            rc = ERR(err, 400, "%s: tensor '%s' is listed in %s but found in %s", index_path, key, shard, p);
            goto out;
        }
    }
out:
    json_decref(root);
    return rc;
}

int safetensors_open(SafeTensors **out, const char *path, Err *err) {
    return safetensors_open_with(out, path, &plain_opener, err);
}

int safetensors_open_private(SafeTensors **out, const char *path, Err *err) {
    return safetensors_open_with(out, path, &private_opener, err);
}

int safetensors_open_with(SafeTensors **out, const char *path, const StOpener *op, Err *err) {
    *out = NULL;
    SafeTensors *st = xcalloc(1, sizeof *st);
    struct stat sb;
    int rc;
    if (stat(path, &sb) != 0) {
        rc = ERR(err, 404, "%s: %s", path, strerror(errno));
    } else if (S_ISDIR(sb.st_mode)) {
        char p[4096];
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", path);
        /* lstat: an index that is there (even as a dangling or refused
         * symlink) is the checkpoint; only a missing one means "one file" */
        struct stat lb;
        if (lstat(p, &lb) == 0) rc = open_index(st, path, p, op, err);
        else {
            snprintf(p, sizeof p, "%s/model.safetensors", path);
            rc = map_file(st, p, op, err);
        }
    } else {
        rc = map_file(st, path, op, err);
    }
    if (rc == 0) {
        qsort(st->t, (size_t)st->n, sizeof(StTensor), cmp_tensor);
        for (int i = 1; i < st->n && rc == 0; i++)
            if (strcmp(st->t[i - 1].name, st->t[i].name) == 0)
                rc = ERR(err, 400, "%s: tensor '%s' appears in two shards", path, st->t[i].name);
    }
    if (rc) {
        safetensors_free(st);
        return rc;
    }
    *out = st;
    return 0;
}

const StTensor *safetensors_get(const SafeTensors *st, const char *name) {
    StTensor key = {.name = (char *)name};
    return bsearch(&key, st->t, (size_t)st->n, sizeof(StTensor), cmp_tensor);
}

void safetensors_free(SafeTensors *st) {
    if (!st) return;
    for (int i = 0; i < st->n; i++) free(st->t[i].name);
    for (int i = 0; i < st->n_files; i++) {
        if (st->maps[i]) munmap(st->maps[i], st->sizes[i]);
        free(st->paths[i]);
    }
    free(st->t);
    free(st->paths);
    free(st->maps);
    free(st->sizes);
    free(st);
}
