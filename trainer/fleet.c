/*
 * fleet.c - what `trainer push` needs to know about a fleet besides the
 * delta: its targets (--to URLs, a --targets file, or the worker list of a
 * vllm-router / sglang-router, GET /workers) and the trainer's chain of
 * earlier deltas (--chain DIR) that brings a replica which missed some steps
 * back to the delta's base version. Only the chain files' headers are read
 * up front; a delta is mapped (page cache, not heap) the first time a
 * target needs it and shared by all. Start-up regime: anything wrong exits
 * with a message that says how to fix it. Design: docs/fleet.md.
 *
 * Not here: sending (push.c).
 */
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "delta.h"
#include "delta_sign.h"
#include "fleet.h"
#include "trainer.h"

static void add(FleetTargets *t, const char *url) {
    CHECK(t->n < FLEET_MAX_TARGETS, "at most %d push targets", FLEET_MAX_TARGETS);
    char *u = xstrdup(url);
    size_t l = strlen(u);
    while (l > 0 && (u[l - 1] == '/' || u[l - 1] == '\n' || u[l - 1] == '\r' || u[l - 1] == ' ')) u[--l] = 0;
    CHECK(strncmp(u, "http://", 7) == 0 || strncmp(u, "https://", 8) == 0,
          "push target '%s' is not an http:// or https:// URL", u);
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->url[i], u)) { free(u); return; } /* listed twice: pushed once */
    t->url[t->n++] = u;
}

void fleet_add_url(FleetTargets *t, const char *url) { add(t, url); }

void fleet_add_file(FleetTargets *t, const char *path) {
    FILE *f = fopen(path, "r");
    CHECK_PTR(f, "--targets %s: cannot open (a file with one sampler URL per line, # comments)", path);
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        char *hash = strchr(p, '#');
        if (hash) *hash = 0;
        size_t l = strlen(p);
        while (l > 0 && (p[l - 1] == '\n' || p[l - 1] == '\r' || p[l - 1] == ' ' || p[l - 1] == '\t')) p[--l] = 0;
        if (*p) add(t, p);
    }
    fclose(f);
}

typedef struct Resp {
    char *p;
    size_t n;
} Resp;

static size_t on_data(char *ptr, size_t sz, size_t nm, void *ud) {
    Resp *b = ud;
    size_t n = sz * nm;
    if (b->n + n > (8u << 20)) return 0;
    char *q = realloc(b->p, b->n + n + 1);
    if (!q) return 0;
    b->p = q;
    memcpy(b->p + b->n, ptr, n);
    b->n += n;
    b->p[b->n] = 0;
    return n;
}

static json_t *get_json(const char *base, const char *path, const char *key, long *code) {
    char url[2048], auth[1024];
    snprintf(url, sizeof url, "%s%s", base, path);
    CURL *c = curl_easy_init();
    CHECK_PTR(c, "curl_easy_init failed");
    struct curl_slist *hdr = NULL;
    if (key) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", key);
        hdr = curl_slist_append(hdr, auth);
    }
    Resp r = {0};
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 10L);
    *code = 0;
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, code);
    curl_slist_free_all(hdr);
    curl_easy_cleanup(c);
    json_t *j = *code == 200 && r.p ? json_loadb(r.p, r.n, 0, NULL) : NULL;
    free(r.p);
    return j;
}

void fleet_add_router(FleetTargets *t, const char *router, const char *key) {
    char base[2048];
    snprintf(base, sizeof base, "%s", router);
    size_t l = strlen(base);
    while (l > 0 && base[l - 1] == '/') base[--l] = 0;
    long code;
    int seen = 0;
    /* GET /workers: {"workers": [{"url": ...}, ...]} (vllm-router, sglang-router) */
    json_t *j = get_json(base, "/workers", key, &code);
    json_t *w = json_object_get(j, "workers");
    if (json_is_array(w)) {
        size_t i;
        json_t *x;
        json_array_foreach(w, i, x) {
            const char *u = json_string_value(json_object_get(x, "url"));
            if (u) {
                add(t, u);
                seen++;
            }
        }
    } else {
        /* GET /list_workers: {"urls": [...]} (older routers) */
        json_decref(j);
        j = get_json(base, "/list_workers", key, &code);
        json_t *u = json_object_get(j, "urls");
        CHECK(json_is_array(u), "--router %s: neither GET /workers nor GET /list_workers gave a worker list (HTTP "
              "%ld): is it a vllm-router or sglang-router URL?", router, code);
        size_t i;
        json_t *x;
        json_array_foreach(u, i, x) if (json_is_string(x)) {
            add(t, json_string_value(x));
            seen++;
        }
    }
    json_decref(j);
    CHECK(seen > 0, "--router %s lists no workers", router);
}

static int by_base(const void *a, const void *b) {
    const FleetLink *x = a, *y = b;
    return x->base < y->base ? -1 : x->base > y->base;
}

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* The header fields the chain needs (docs/delta-format.md, "Container");
 * the rest of the file is checked by the sampler that receives it. */
static int read_header(const char *path, uint64_t *fp, uint64_t *base, uint64_t *target, size_t *size) {
    FILE *f = fopen(path, "rb");
    CHECK_PTR(f, "--chain: cannot open %s", path);
    uint8_t h[DELTA_HEADER_BYTES];
    size_t n = fread(h, 1, sizeof h, f);
    CHECK(fseek(f, 0, SEEK_END) == 0, "--chain: cannot seek %s", path);
    long sz = ftell(f);
    fclose(f);
    if (n != sizeof h || memcmp(h, DELTA_MAGIC, 8) != 0) return -1;
    *fp = le64(h + 16);
    *base = le64(h + 24);
    *target = le64(h + 32);
    *size = (size_t)sz;
    return sz == (long)(DELTA_HEADER_BYTES + le64(h + 48) + DELTA_TRAILER_BYTES) && *target > *base ? 0 : -1;
}

void fleet_chain_load(FleetChain *c, const char *dir, uint64_t fingerprint, const uint8_t *key, size_t nk) {
    DIR *d = opendir(dir);
    CHECK_PTR(d, "--chain %s: cannot open the directory (the trainer's earlier deltas, *.delta)", dir);
    c->key = key;
    c->nk = nk;
    pthread_mutex_init(&c->mu, NULL);
    c->loaded = 1;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 7 || strcmp(e->d_name + l - 6, ".delta") != 0) continue;
        char path[4096];
        path_join(path, sizeof path, dir, e->d_name);
        FleetLink k = {0};
        uint64_t fp;
        CHECK(read_header(path, &fp, &k.base, &k.target, &k.size) == 0,
              "--chain: %s is not a delta container (bad magic, size or versions): remove it from %s", path, dir);
        if (fp != fingerprint) continue; /* another model's delta in the same directory: not part of this chain */
        k.path = xstrdup(path);
        c->link = realloc(c->link, (size_t)(c->n + 1) * sizeof *c->link);
        CHECK_PTR(c->link, "out of memory");
        c->link[c->n++] = k;
    }
    closedir(d);
    qsort(c->link, (size_t)c->n, sizeof *c->link, by_base);
}

int fleet_chain_body(FleetChain *c, int i, const uint8_t **body, size_t *size, const char **sig, char *msg,
                     size_t cap) {
    FleetLink *k = &c->link[i];
    int rc = 0;
    pthread_mutex_lock(&c->mu);
    if (!k->body) {
        int fd = open(k->path, O_RDONLY);
        void *m = fd >= 0 ? mmap(NULL, k->size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
        if (fd >= 0) close(fd);
        if (m == MAP_FAILED) {
            snprintf(msg, cap, "cannot map %s: %s", k->path, strerror(errno));
            rc = -1;
        } else {
            k->body = m;
            Err err = {0};
            if (c->key && delta_sign(c->key, c->nk, k->body, k->size, k->sig, &err) < 0) {
                snprintf(msg, cap, "cannot sign %s: %s", k->path, err.msg);
                rc = -1;
            }
        }
    }
    pthread_mutex_unlock(&c->mu);
    *body = k->body;
    *size = k->size;
    *sig = c->key ? k->sig : NULL;
    return rc;
}

int fleet_chain_path(const FleetChain *c, uint64_t from, uint64_t to, int *idx, int cap) {
    int n = 0;
    uint64_t v = from;
    while (v < to) {
        int found = -1;
        /* the longest step from v that does not pass `to`: fewest deltas to send */
        for (int i = 0; i < c->n; i++)
            if (c->link[i].base == v && c->link[i].target <= to &&
                (found < 0 || c->link[i].target > c->link[found].target))
                found = i;
        if (found < 0 || n == cap) return -1;
        idx[n++] = found;
        v = c->link[found].target;
    }
    return n;
}

void fleet_chain_free(FleetChain *c) {
    for (int i = 0; i < c->n; i++) {
        if (c->link[i].body) munmap((void *)c->link[i].body, c->link[i].size);
        free(c->link[i].path);
    }
    if (c->loaded) pthread_mutex_destroy(&c->mu);
    c->loaded = 0;
    free(c->link);
    c->link = NULL;
    c->n = 0;
}
