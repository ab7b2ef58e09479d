/*
 * test_delta.c - the delta container and in-place apply: bit-exact round
 * trip, replay, wrong base/fingerprint, every byte of a container corrupted
 * (with and without a recomputed checksum) or truncated, a delta made from
 * other base weights, the restore path of commit, version-only deltas and
 * the version limit, whole-tensor replacement (reload), the payload check of `trainer inspect` against apply,
 * and the fuzz target over mutated containers. Every rejection is checked to leave all weight bits
 * as they were (hash of every weight before and after).
 */
#include "delta.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include "test.h"

#define NT 5

static int g_xor_values; /* encode sparse values as XOR masks (DELTA_SPARSE_XOR) */

/* A small in-memory checkpoint: one storage block per tensor. */
typedef struct Ckpt {
    StTensor t[NT];
    SafeTensors st;
} Ckpt;

static const char *g_names[NT] = {"layers.0.mlp.weight", "layers.0.norm.bias", "lm_head.weight", "model.embed",
                                  "z.f16"};
static const Dtype g_dt[NT] = {DT_BF16, DT_F32, DT_BF16, DT_BF16, DT_F16};
static const int g_ndim[NT] = {2, 1, 1, 2, 2};
static const int64_t g_shape[NT][2] = {{64, 96}, {33, 0}, {128, 0}, {3000, 100}, {7, 3}};

static uint32_t rng(uint32_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

static void ckpt_init(Ckpt *c, int big) {
    memset(c, 0, sizeof *c);
    uint32_t s = 2463534242u;
    for (int i = 0; i < NT; i++) {
        StTensor *t = &c->t[i];
        t->name = (char *)g_names[i];
        t->dtype = g_dt[i];
        t->ndim = g_ndim[i];
        t->numel = 1;
        for (int d = 0; d < t->ndim; d++) t->numel *= (t->shape[d] = g_shape[i][d]);
        if (i == 3 && !big) t->numel = (t->shape[0] = 30) * 100;
        t->nbytes = (size_t)t->numel * (size_t)dtype_size(t->dtype);
        t->data = xmalloc(t->nbytes);
        for (size_t b = 0; b < t->nbytes; b++) t->data[b] = (uint8_t)rng(&s);
    }
    c->st = (SafeTensors){.n = NT, .t = c->t};
}

static void ckpt_copy(Ckpt *dst, const Ckpt *src) {
    *dst = *src;
    for (int i = 0; i < NT; i++) {
        dst->t[i].data = xmalloc(src->t[i].nbytes);
        memcpy(dst->t[i].data, src->t[i].data, src->t[i].nbytes);
    }
    dst->st.t = dst->t;
}

static void ckpt_set(Ckpt *dst, const Ckpt *src) {
    for (int i = 0; i < NT; i++) memcpy(dst->t[i].data, src->t[i].data, src->t[i].nbytes);
}

static void ckpt_free(Ckpt *c) {
    for (int i = 0; i < NT; i++) free(c->t[i].data);
}

static int ckpt_equal(const Ckpt *a, const Ckpt *b) {
    for (int i = 0; i < NT; i++)
        if (memcmp(a->t[i].data, b->t[i].data, a->t[i].nbytes) != 0) return 0;
    return 1;
}

static uint64_t ckpt_hash(const Ckpt *c) {
    XXH3_state_t *s = XXH3_createState();
    XXH3_64bits_reset(s);
    for (int i = 0; i < NT; i++) XXH3_64bits_update(s, c->t[i].data, c->t[i].nbytes);
    uint64_t h = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    return h;
}

/* A training-like step: a sparse subset of elements gets new bits. Tensor 1
 * is rewritten entirely (dense), tensor 2 is left alone, tensor 3 changes at
 * far-apart positions (multi-byte gaps), the last F16 element changes. */
static void step(Ckpt *c, uint32_t seed) {
    uint32_t s = seed;
    uint16_t *w0 = (uint16_t *)c->t[0].data;
    for (int64_t i = 0; i < c->t[0].numel; i++)
        if (rng(&s) % 100 == 0) w0[i] ^= (uint16_t)(1 + rng(&s) % 7);
    float *b = (float *)c->t[1].data;
    for (int64_t i = 0; i < c->t[1].numel; i++) b[i] = (float)i + 0.5f * (float)seed;
    uint16_t *w3 = (uint16_t *)c->t[3].data;
    int64_t n3 = c->t[3].numel;
    w3[0] ^= 1;
    w3[n3 / 2 + 17] ^= 0x100;
    w3[n3 - 1] ^= 0x8000;
    uint16_t *w4 = (uint16_t *)c->t[4].data;
    w4[20] ^= 0x3;
}

static uint8_t *make_delta(const Ckpt *a, const Ckpt *b, uint64_t fp, uint64_t base, uint64_t target, size_t *size) {
    DeltaRecord r[NT];
    int n = 0;
    for (int i = 0; i < NT; i++) {
        Err err = {0};
        int rc = delta_encode_tensor(&r[n], a->t[i].name, a->t[i].dtype, a->t[i].ndim, a->t[i].shape, a->t[i].data,
                                     b->t[i].data, 3, g_xor_values, &err);
        T_ASSERT(rc == 0, "encode %s: %s", a->t[i].name, err.msg);
        if (r[n].n_changed) n++;
    }
    DeltaHeader h = {.fingerprint = fp, .base_version = base, .target_version = target};
    uint8_t *buf = delta_serialize(&h, r, n, size);
    for (int i = 0; i < n; i++) delta_record_free(&r[i]);
    return buf;
}

static void fix_checksum(uint8_t *buf, size_t size) {
    uint64_t h = XXH3_64bits(buf, size - 8);
    for (int i = 0; i < 8; i++) buf[size - 8 + i] = (uint8_t)(h >> (8 * i));
}

static DeltaTarget target_of(Ckpt *c) {
    return (DeltaTarget){.lookup = delta_lookup_safetensors, .ctx = &c->st, .n_threads = 2};
}

typedef struct Touched {
    int calls;
    int64_t n_idx;
    int dense_calls;
    const char *fail_on;   /* fail the hook for this tensor name */
    int fail_once;         /* ... only the first time (a transient device error) */
    uint64_t seen[8];      /* hash of data at each call */
} Touched;

static int on_touched(void *ctx, const char *name, void *data, Dtype dt, int64_t numel, const int64_t *idx,
                      int64_t n_idx, Err *err) {
    Touched *t = ctx;
    if (t->calls < 8) t->seen[t->calls] = XXH3_64bits(data, (size_t)numel * (size_t)dtype_size(dt));
    t->calls++;
    t->n_idx += n_idx;
    t->dense_calls += idx == NULL;
    if (t->fail_on && strcmp(name, t->fail_on) == 0) {
        if (t->fail_once) t->fail_on = NULL;
        return ERR(err, 422, "requant refused '%s'", name);
    }
    return 0;
}

static void test_round_trip(void) {
    Ckpt v0, v1, v2, live;
    ckpt_init(&v0, 1);
    ckpt_copy(&v1, &v0);
    step(&v1, 1);
    ckpt_copy(&v2, &v1);
    step(&v2, 2);
    ckpt_copy(&live, &v0);
    WeightVersion *wv = weight_version_from_safetensors(&live.st, 2);
    uint64_t fp = wv->fingerprint;
    size_t n01, n12;
    uint8_t *d01 = make_delta(&v0, &v1, fp, 0, 1, &n01), *d12 = make_delta(&v1, &v2, fp, 1, 2, &n12);

    DeltaFile *f;
    Err err = {0};
    T_ASSERT(delta_parse(&f, d01, n01, &err) == 0, "%s", err.msg);
    if (f) {
        T_ASSERT(f->n == 4, "4 changed tensors, got %d", f->n);
        for (int i = 0; i < f->n; i++) {
            const DeltaEntry *e = &f->e[i];
            int want_dense = strcmp(e->name, "layers.0.norm.bias") == 0;
            int sparse = g_xor_values ? DELTA_SPARSE_XOR : DELTA_SPARSE;
            T_ASSERT(e->encoding == (want_dense ? DELTA_DENSE : sparse), "%s encoding %d", e->name, e->encoding);
        }
        delta_file_free(f);
    }

    Touched tc = {0};
    DeltaTarget tgt = target_of(&live);
    tgt.touched = on_touched;
    tgt.touched_ctx = &tc;
    DeltaResult res;
    int rc = delta_apply(d01, n01, &tgt, wv, &res, &err);
    T_ASSERT(rc == 0, "apply 0->1: %s", err.msg);
    T_ASSERT(ckpt_equal(&live, &v1), "weights equal v1 bit for bit");
    T_ASSERT(wv->version == 1 && res.version == 1 && !res.noop && res.tensors_updated == 4, "version 1");
    T_ASSERT(tc.calls == 4 && tc.dense_calls == 1, "touched hook: %d calls, %d dense", tc.calls, tc.dense_calls);
    for (int i = 0; i < NT; i++)
        T_ASSERT(wv->hash[i] == XXH3_64bits(live.t[i].data, live.t[i].nbytes), "hash of %s tracked", wv->names[i]);
    T_ASSERT(wv->fingerprint == fp, "fingerprint stays the lineage's");

    /* replay: no-op success, nothing touched */
    tgt.touched = NULL;
    uint64_t h1 = ckpt_hash(&live);
    tc = (Touched){0};
    rc = delta_apply(d01, n01, &tgt, wv, &res, &err);
    T_ASSERT(rc == 0 && res.noop && wv->version == 1 && ckpt_hash(&live) == h1 && tc.calls == 0, "replay is a no-op");

    /* the next step, through the two phases */
    DeltaPlan *p;
    rc = delta_prepare(&p, d12, n12, &tgt, wv, &err);
    T_ASSERT(rc == 0, "prepare 1->2: %s", err.msg);
    T_ASSERT(ckpt_hash(&live) == h1, "prepare writes nothing");
    if (rc == 0) {
        rc = delta_commit(p, &tgt, wv, &res, &err);
        T_ASSERT(rc == 0 && ckpt_equal(&live, &v2) && wv->version == 2, "commit 1->2: %s", err.msg);
        delta_plan_free(p);
    }
    char *js = weight_version_json(wv);
    T_ASSERT(strstr(js, "\"version\": 2") || strstr(js, "\"version\":2"), "GET json has the version: %s", js);
    free(js);

    /* an old delta is now a conflict (base 0 != 2, target 1 < 2) */
    uint64_t h2 = ckpt_hash(&live);
    rc = delta_apply(d01, n01, &tgt, wv, &res, &err);
    T_ASSERT(rc == -409 && err.code == 409 && res.version == 2 && ckpt_hash(&live) == h2, "stale delta -> 409");
    js = delta_error_json(&err, wv);
    T_ASSERT(strstr(js, "\"current_version\": 2") || strstr(js, "\"current_version\":2"), "409 body: %s", js);
    free(js);

    free(d01);
    free(d12);
    weight_version_free(wv);
    ckpt_free(&v0);
    ckpt_free(&v1);
    ckpt_free(&v2);
    ckpt_free(&live);
}

static void test_conflicts(void) {
    Ckpt v0, v1, live, other;
    ckpt_init(&v0, 0);
    ckpt_copy(&v1, &v0);
    step(&v1, 7);
    ckpt_copy(&live, &v0);
    WeightVersion *wv = weight_version_from_safetensors(&live.st, 1);
    DeltaTarget tgt = target_of(&live);
    DeltaResult res;
    Err err = {0};
    uint64_t h0 = ckpt_hash(&live);
    size_t n;
    uint8_t *d = make_delta(&v0, &v1, wv->fingerprint, 3, 4, &n);
    int rc = delta_apply(d, n, &tgt, wv, &res, &err);
    T_ASSERT(rc == -409 && err.code == 409 && res.version == 0 && ckpt_hash(&live) == h0, "wrong base -> 409");
    free(d);
    d = make_delta(&v0, &v1, wv->fingerprint ^ 1, 0, 1, &n);
    rc = delta_apply(d, n, &tgt, wv, &res, &err);
    T_ASSERT(rc == -409 && ckpt_hash(&live) == h0, "other model's fingerprint -> 409");
    free(d);
    /* right header, made from other base weights: the result hash would differ */
    ckpt_copy(&other, &v0);
    ((uint16_t *)other.t[0].data)[5] ^= 0x10;
    ckpt_set(&v1, &other);
    step(&v1, 7);
    d = make_delta(&other, &v1, wv->fingerprint, 0, 1, &n);
    rc = delta_apply(d, n, &tgt, wv, &res, &err);
    T_ASSERT(rc < 0 && err.code == 422 && ckpt_hash(&live) == h0 && wv->version == 0, "other base content -> 422: %s",
             err.msg);
    free(d);

    /* a touched hook that fails (e.g. re-quantization refused): all weights
     * back, and the hook re-run on the restored tensors it had already seen */
    {
        Touched tc = {.fail_on = "model.embed", .fail_once = 1};
        DeltaTarget th = tgt;
        th.touched = on_touched;
        th.touched_ctx = &tc;
        ckpt_set(&v1, &v0);
        step(&v1, 11);
        d = make_delta(&v0, &v1, wv->fingerprint, 0, 1, &n);
        rc = delta_apply(d, n, &th, wv, &res, &err);
        T_ASSERT(rc == -422 && ckpt_hash(&live) == h0 && wv->version == 0, "failed hook restores: %d %s", rc,
                 err.msg);
        /* plan order (sorted names): mlp.weight, norm.bias, model.embed (fails), z.f16 */
        T_ASSERT(tc.calls == 6, "3 hook calls then 3 re-derivations, got %d", tc.calls);
        T_ASSERT(tc.seen[3] == XXH3_64bits(v0.t[0].data, v0.t[0].nbytes) &&
                     tc.seen[4] == XXH3_64bits(v0.t[1].data, v0.t[1].nbytes) &&
                     tc.seen[5] == XXH3_64bits(v0.t[3].data, v0.t[3].nbytes) &&
                     tc.seen[0] == XXH3_64bits(v1.t[0].data, v1.t[0].nbytes),
                 "the hook saw the new values, then the restored old ones");
        free(d);
    }

    /* commit's restore path: a weight changes between prepare and commit */
    ckpt_set(&v1, &v0);
    step(&v1, 9);
    d = make_delta(&v0, &v1, wv->fingerprint, 0, 1, &n);
    DeltaPlan *p;
    rc = delta_prepare(&p, d, n, &tgt, wv, &err);
    T_ASSERT(rc == 0, "prepare: %s", err.msg);
    if (rc == 0) {
        ((uint16_t *)live.t[3].data)[1] ^= 0x1; /* untouched by the delta, in a touched tensor */
        uint64_t hm = ckpt_hash(&live);
        rc = delta_commit(p, &tgt, wv, &res, &err);
        T_ASSERT(rc < 0 && ckpt_hash(&live) == hm && wv->version == 0, "failed verify restores all: %s", err.msg);
        delta_plan_free(p);
    }
    free(d);
    weight_version_free(wv);
    ckpt_free(&v0);
    ckpt_free(&v1);
    ckpt_free(&live);
    ckpt_free(&other);
}

/* Every byte of the container, flipped three ways, with the checksum left
 * stale and with it recomputed ("lying" fields). A reader cannot refute the
 * target version (any value in (base, 2^62] is a legal claim), and a few zstd bits
 * do not change the decoded bytes; an accepted container must leave the
 * weights exactly at the target, a rejected one exactly as they were. */
static void test_corruption(void) {
    Ckpt v0, v1, live;
    ckpt_init(&v0, 0);
    ckpt_copy(&v1, &v0);
    step(&v1, 3);
    ckpt_copy(&live, &v0);
    WeightVersion *wv0 = weight_version_from_safetensors(&live.st, 1);
    size_t n;
    uint8_t *d = make_delta(&v0, &v1, wv0->fingerprint, 0, 1, &n);
    uint8_t *m = xmalloc(n + 16);
    uint64_t h0 = ckpt_hash(&v0), h1 = ckpt_hash(&v1);
    static const uint8_t masks[3] = {0x01, 0x80, 0xff};
    int bad = 0, accepted = 0, tried = 0;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 3; k++)
            for (int fix = 0; fix < 2; fix++) {
                if (fix && i >= n - 8) continue;
                memcpy(m, d, n);
                m[i] ^= masks[k];
                if (fix) fix_checksum(m, n);
                ckpt_set(&live, &v0);
                WeightVersion wv = *wv0;
                uint64_t hashes[NT];
                memcpy(hashes, wv0->hash, sizeof hashes);
                wv.hash = hashes;
                DeltaTarget tgt = target_of(&live);
                tgt.n_threads = 1;
                DeltaResult res;
                Err err = {0};
                int rc = delta_apply(m, n, &tgt, &wv, &res, &err);
                tried++;
                int is_target = i >= 32 && i < 40;
                if (rc == 0 && fix) {
                    /* a legal claim (target version) or a flip that decodes to
                     * the same content (zstd padding bits): exactly v1 or bust */
                    accepted += is_target;
                    if (ckpt_hash(&live) != h1 || wv.version != res.version || (!is_target && wv.version != 1))
                        bad++;
                } else if (rc == 0 || ckpt_hash(&live) != h0 || wv.version != 0 ||
                           memcmp(hashes, wv0->hash, sizeof hashes) != 0) {
                    if (bad++ < 5) fprintf(stderr, "byte %zu mask %02x fix %d: rc %d\n", i, masks[k], fix, rc);
                }
            }
    T_ASSERT(bad == 0, "%d of %d corruptions accepted or changed weights", bad, tried);
    T_ASSERT(accepted > 0, "target version rewrites are legal claims (%d)", accepted);
    /* truncation and extension */
    bad = 0;
    for (size_t len = 0; len < n + 16; len++) {
        if (len == n) continue;
        memcpy(m, d, n);
        if (len > n) memset(m + n, 0, len - n);
        ckpt_set(&live, &v0);
        WeightVersion wv = *wv0;
        DeltaTarget tgt = target_of(&live);
        DeltaResult res;
        Err err = {0};
        int rc = delta_apply(m, len, &tgt, &wv, &res, &err);
        if (rc == 0 || ckpt_hash(&live) != h0 || wv.version != 0) bad++;
    }
    T_ASSERT(bad == 0, "%d truncations/extensions accepted", bad);
    free(m);
    free(d);
    weight_version_free(wv0);
    ckpt_free(&v0);
    ckpt_free(&v1);
    ckpt_free(&live);
}

static void test_fuzz(void) {
    size_t n;
    uint8_t *seed = delta_fuzz_seed(&n);
    /* the seed is accepted as given and with its (already valid) checksum rewritten */
    T_ASSERT(delta_fuzz_one(seed, n) == 2, "seed");
    uint8_t *m = xmalloc(n);
    uint32_t s = 99;
    int tries = 0, accepted = 0;
    for (int it = 0; it < 20000; it++) {
        memcpy(m, seed, n);
        size_t len = n;
        int flips = 1 + (int)(rng(&s) % 4);
        for (int f = 0; f < flips; f++) m[rng(&s) % n] ^= (uint8_t)(1u << (rng(&s) % 8));
        if (rng(&s) % 4 == 0) len = rng(&s) % n;
        if (rng(&s) % 2) fix_checksum(m, len >= 8 ? len : n);
        /* aborts on a violated invariant: a rejected container changed a weight
         * bit, or an accepted one left the weights off its recorded hashes */
        accepted += delta_fuzz_one(m, len);
        tries += len >= DELTA_HEADER_BYTES + DELTA_TRAILER_BYTES ? 2 : 1;
    }
    /* both outcomes were exercised, so the invariants above were checked on
     * each side: mutations were rejected, and some (a rewritten target
     * version, zstd padding bits) decode to a legal container */
    T_ASSERT(accepted > 0 && accepted < tries, "%d of %d mutated tries accepted", accepted, tries);
    printf("fuzz: %d of %d mutated tries accepted, all invariants held\n", accepted, tries);
    free(m);
    free(seed);
}

/* A single-file safetensors checkpoint written by hand (spec layout). */
static void write_st(const char *path, const Ckpt *c) {
    char hdr[4096];
    size_t hl = 0, off = 0;
    hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "{");
    for (int i = 0; i < NT; i++) { /* g_names are sorted, as the reader sorts */
        const StTensor *t = &c->t[i];
        hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "",
                               t->name, dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++)
            hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "],\"data_offsets\":[%zu,%zu]}", off, off + t->nbytes);
        off += t->nbytes;
    }
    hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "}");
    while (hl % 8) hdr[hl++] = ' ';
    FILE *f = fopen(path, "wb");
    CHECK_PTR(f, "cannot write %s", path);
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(hdr, 1, hl, f);
    for (int i = 0; i < NT; i++) fwrite(c->t[i].data, 1, c->t[i].nbytes, f);
    fclose(f);
}

static uint64_t file_hash(const char *path) {
    FILE *f = fopen(path, "rb");
    CHECK_PTR(f, "cannot read %s", path);
    static uint8_t buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    return XXH3_64bits(buf, n);
}

/* The sampler's path: the delta patches a MAP_PRIVATE checkpoint mapping in
 * place; the files on disk stay as they were, the hashes follow the target. */
static void test_safetensors_mapping(void) {
    char dir[] = "/tmp/test_delta_XXXXXX", p0[256], p1[256];
    CHECK_PTR(mkdtemp(dir), "mkdtemp");
    snprintf(p0, sizeof p0, "%s/v0.safetensors", dir);
    snprintf(p1, sizeof p1, "%s/v1.safetensors", dir);
    Ckpt v0, v1;
    ckpt_init(&v0, 0);
    ckpt_copy(&v1, &v0);
    step(&v1, 5);
    write_st(p0, &v0);
    write_st(p1, &v1);
    uint64_t disk0 = file_hash(p0);
    SafeTensors *s0, *s1;
    Err err = {0};
    T_ASSERT(safetensors_open(&s0, p0, &err) == 0 && safetensors_open(&s1, p1, &err) == 0, "open: %s", err.msg);
    WeightVersion *wv = weight_version_from_safetensors(s0, 2), *wv1 = weight_version_from_safetensors(s1, 2),
                  *wmem = weight_version_from_safetensors(&v0.st, 1);
    T_ASSERT(wv->fingerprint == wmem->fingerprint, "fingerprint depends on content, not storage");
    T_ASSERT(wv->fingerprint != wv1->fingerprint, "fingerprint depends on content");
    size_t n;
    uint8_t *d = make_delta(&v0, &v1, wv->fingerprint, 0, 1, &n);
    DeltaTarget tgt = {.lookup = delta_lookup_safetensors, .ctx = s0, .n_threads = 2};
    char *js;
    int code = delta_http_post(d, n, &tgt, wv, &js);
    T_ASSERT(code == 200 && strstr(js, "\"noop\":false"), "POST: %d %s", code, js);
    free(js);
    int same = 1;
    for (int i = 0; i < s0->n; i++) same &= memcmp(s0->t[i].data, s1->t[i].data, s0->t[i].nbytes) == 0;
    T_ASSERT(same, "mapping now holds v1's tensors");
    T_ASSERT(memcmp(wv->hash, wv1->hash, sizeof(uint64_t) * (size_t)wv->n) == 0, "GET hashes == v1 checkpoint's");
    T_ASSERT(file_hash(p0) == disk0, "the file on disk is untouched (MAP_PRIVATE)");
    code = delta_http_post(d, n, &tgt, wv, &js);
    T_ASSERT(code == 200 && strstr(js, "\"noop\":true"), "replay POST: %d %s", code, js);
    free(js);
    free(d);
    d = make_delta(&v0, &v1, wv->fingerprint, 5, 6, &n);
    code = delta_http_post(d, n, &tgt, wv, &js);
    T_ASSERT(code == 409 && strstr(js, "\"current_version\":1"), "wrong base POST: %d %s", code, js);
    free(js);
    free(d);
    weight_version_free(wv);
    weight_version_free(wv1);
    weight_version_free(wmem);
    safetensors_free(s0);
    safetensors_free(s1);
    unlink(p0);
    unlink(p1);
    rmdir(dir);
    ckpt_free(&v0);
    ckpt_free(&v1);
}

/* A SPARSE_XOR record whose mask is zero claims a change that is none; its
 * hash is the unchanged tensor's, so only the mask check can refuse it. */
static void test_zero_xor_mask(void) {
    Ckpt v0;
    ckpt_init(&v0, 0);
    WeightVersion *wv = weight_version_from_safetensors(&v0.st, 1);
    uint8_t raw[3] = {5, 0, 0}; /* position 5, then the two planes of a zero BF16 mask */
    DeltaRecord r = {.name = "layers.0.mlp.weight", .dtype = DT_BF16, .encoding = DELTA_SPARSE_XOR, .ndim = 2,
                     .shape = {64, 96}, .numel = 64 * 96, .n_changed = 1, .raw_bytes = 3,
                     .hash_after = XXH3_64bits(v0.t[0].data, v0.t[0].nbytes)};
    uint8_t z[64];
    r.comp_bytes = ZSTD_compress(z, sizeof z, raw, 3, 3);
    r.payload = z;
    DeltaHeader h = {.fingerprint = wv->fingerprint, .base_version = 0, .target_version = 1};
    size_t n;
    uint8_t *d = delta_serialize(&h, &r, 1, &n);
    DeltaTarget tgt = target_of(&v0);
    DeltaResult res;
    Err err = {0};
    uint64_t h0 = ckpt_hash(&v0);
    int rc = delta_apply(d, n, &tgt, wv, &res, &err);
    T_ASSERT(rc < 0 && err.code == 400 && strstr(err.msg, "zero") && ckpt_hash(&v0) == h0 && wv->version == 0,
             "zero XOR mask refused: %d %s", rc, err.msg);
    {
        DeltaFile *f;
        Err ec = {0};
        T_ASSERT(delta_parse(&f, d, n, &ec) == 0, "parse: %s", ec.msg);
        T_ASSERT(f && delta_check_payloads(f, 1, &ec) == -400 && strstr(ec.msg, "zero"),
                 "the payload check (trainer inspect) refuses it too: %s", ec.msg);
        delta_file_free(f);
    }
    raw[1] = 1; /* a real mask, and the hash of the result: accepted */
    uint16_t want = ((uint16_t *)v0.t[0].data)[5] ^ 1;
    ((uint16_t *)v0.t[0].data)[5] ^= 1;
    r.hash_after = XXH3_64bits(v0.t[0].data, v0.t[0].nbytes);
    ((uint16_t *)v0.t[0].data)[5] ^= 1;
    r.comp_bytes = ZSTD_compress(z, sizeof z, raw, 3, 3);
    free(d);
    d = delta_serialize(&h, &r, 1, &n);
    rc = delta_apply(d, n, &tgt, wv, &res, &err);
    T_ASSERT(rc == 0 && wv->version == 1 && ((uint16_t *)v0.t[0].data)[5] == want && ckpt_hash(&v0) != h0,
             "hand-made XOR record applies: %s", err.msg);
    free(d);
    weight_version_free(wv);
    ckpt_free(&v0);
}

/* Versions: a container without tensors moves the version only with the
 * version_only flag (and the flag with tensors is a lie); versions end at
 * DELTA_VERSION_MAX = 2^62; unknown flag bits are refused. Every refusal is a
 * 400 naming the problem and leaves weights and version as they were. */
static void test_versions(void) {
    Ckpt v0;
    ckpt_init(&v0, 0);
    WeightVersion *wv = weight_version_from_safetensors(&v0.st, 1);
    DeltaTarget tgt = target_of(&v0);
    DeltaResult res;
    Err err = {0};
    uint64_t h0 = ckpt_hash(&v0), fp = wv->fingerprint;
    size_t n;
    DeltaHeader h = {.fingerprint = fp, .base_version = 0, .target_version = 1};
    uint8_t *d = delta_serialize(&h, NULL, 0, &n);
    int rc = delta_apply(d, n, &tgt, wv, &res, &err);
    T_ASSERT(rc == -400 && err.code == 400 && strstr(err.msg, "no tensors") && strstr(err.msg, "version_only") &&
                 wv->version == 0 && ckpt_hash(&v0) == h0,
             "zero tensors without the flag -> 400 naming it: %d %s", rc, err.msg);
    char *js;
    int code = delta_http_post(d, n, &tgt, wv, &js);
    T_ASSERT(code == 400 && strstr(js, "version_only") && strstr(js, "\"current_version\":0"), "POST: %d %s", code,
             js);
    free(js);
    free(d);

    h.flags = DELTA_FLAG_VERSION_ONLY;
    d = delta_serialize(&h, NULL, 0, &n);
    rc = delta_apply(d, n, &tgt, wv, &res, &err);
    T_ASSERT(rc == 0 && wv->version == 1 && res.version == 1 && !res.noop && res.tensors_updated == 0 &&
                 ckpt_hash(&v0) == h0,
             "version-only delta moves the version, no weight: %s", err.msg);
    rc = delta_apply(d, n, &tgt, wv, &res, &err);
    T_ASSERT(rc == 0 && res.noop && wv->version == 1, "its replay is a no-op: %s", err.msg);
    free(d);

    /* the flag on a delta with tensors */
    Ckpt v1;
    ckpt_copy(&v1, &v0);
    step(&v1, 4);
    d = make_delta(&v0, &v1, fp, 1, 2, &n);
    uint8_t *m = xmalloc(n);
    memcpy(m, d, n);
    m[12] |= DELTA_FLAG_VERSION_ONLY;
    fix_checksum(m, n);
    rc = delta_apply(m, n, &tgt, wv, &res, &err);
    T_ASSERT(rc == -400 && strstr(err.msg, "version_only") && wv->version == 1 && ckpt_hash(&v0) == h0,
             "version_only with tensors -> 400: %s", err.msg);
    memcpy(m, d, n);
    m[12] |= 2; /* not a known flag */
    fix_checksum(m, n);
    rc = delta_apply(m, n, &tgt, wv, &res, &err);
    T_ASSERT(rc == -400 && strstr(err.msg, "unknown flags") && wv->version == 1, "unknown flag -> 400: %s", err.msg);
    free(m);
    free(d);

    /* the version limit: up to 2^62 applies, beyond it is refused at parse */
    h = (DeltaHeader){.fingerprint = fp, .flags = DELTA_FLAG_VERSION_ONLY, .base_version = 1};
    const uint64_t over[] = {DELTA_VERSION_MAX + 1, 1ull << 63, UINT64_MAX};
    for (int i = 0; i < 3; i++) {
        h.target_version = over[i];
        d = delta_serialize(&h, NULL, 0, &n);
        rc = delta_apply(d, n, &tgt, wv, &res, &err);
        T_ASSERT(rc == -400 && strstr(err.msg, "2^62") && wv->version == 1,
                 "target %llu -> 400 naming the limit: %s", (unsigned long long)over[i], err.msg);
        free(d);
    }
    h.target_version = DELTA_VERSION_MAX;
    d = delta_serialize(&h, NULL, 0, &n);
    rc = delta_apply(d, n, &tgt, wv, &res, &err);
    T_ASSERT(rc == 0 && wv->version == DELTA_VERSION_MAX, "target 2^62 applies: %s", err.msg);
    free(d);
    js = weight_version_json(wv);
    T_ASSERT(strstr(js, "\"version\":4611686018427387904"), "2^62 is exact in the JSON: %s", js);
    free(js);
    weight_version_free(wv);
    ckpt_free(&v0);
    ckpt_free(&v1);
}

/* delta_check_payloads (what `trainer inspect` runs) against apply, over
 * every byte of a container flipped with the checksum recomputed: whatever
 * it refuses, apply refuses; whatever apply refuses with 400, it refuses
 * too, except the one 400 check that needs the base weights (a dense
 * record's changed count). It needs no weights, so it sees no 409/422. */
static void test_check_payloads(void) {
    Ckpt v0, v1, live;
    ckpt_init(&v0, 0);
    ckpt_copy(&v1, &v0);
    step(&v1, 8);
    ckpt_copy(&live, &v0);
    WeightVersion *wv0 = weight_version_from_safetensors(&live.st, 1);
    size_t n;
    uint8_t *d = make_delta(&v0, &v1, wv0->fingerprint, 0, 1, &n);
    uint8_t *m = xmalloc(n);
    int bad = 0, refused = 0, payload_refused = 0;
    static const uint8_t masks[3] = {0x01, 0x80, 0xff};
    for (size_t i = 0; i + 8 < n; i++)
        for (int k = 0; k < 3; k++) {
            memcpy(m, d, n);
            m[i] ^= masks[k];
            fix_checksum(m, n);
            DeltaFile *f;
            Err ec = {0}, ea = {0};
            int crc = delta_parse(&f, m, n, &ec);
            if (crc == 0) {
                crc = delta_check_payloads(f, 2, &ec);
                payload_refused += crc != 0;
                delta_file_free(f);
            }
            ckpt_set(&live, &v0);
            WeightVersion wv = *wv0;
            uint64_t hashes[NT];
            memcpy(hashes, wv0->hash, sizeof hashes);
            wv.hash = hashes;
            DeltaTarget tgt = target_of(&live);
            DeltaResult res;
            int arc = delta_apply(m, n, &tgt, &wv, &res, &ea);
            refused += crc != 0;
            int base_only = arc == -400 && strstr(ea.msg, "dense update changes") != NULL;
            if ((crc != 0 && arc == 0) || (arc == -400 && crc == 0 && !base_only)) {
                if (bad++ < 5)
                    fprintf(stderr, "byte %zu mask %02x: check %d (%s), apply %d (%s)\n", i, masks[k], crc, ec.msg,
                            arc, ea.msg);
            }
        }
    T_ASSERT(bad == 0, "%d containers where the payload check and apply disagree", bad);
    T_ASSERT(payload_refused > 0 && refused > payload_refused, "payload check refused %d of %d (parse the rest)",
             payload_refused, refused);
    free(m);
    free(d);
    weight_version_free(wv0);
    ckpt_free(&v0);
    ckpt_free(&v1);
    ckpt_free(&live);
}

/* Sparse exactly when its uncompressed payload is smaller than the dense one. */
static void test_encoding_choice(void) {
    uint8_t a[7] = {0}, b[7] = {0};
    int64_t shape[1] = {7};
    DeltaRecord r;
    Err err = {0};
    for (int k = 1; k <= 7; k++) {
        b[k - 1] = (uint8_t)(1 + k);
        T_ASSERT(delta_encode_tensor(&r, "t", DT_U8, 1, shape, a, b, 3, 0, &err) == 0, "%s", err.msg);
        int want = 2 * k < 7 ? DELTA_SPARSE : DELTA_DENSE; /* k 1-byte gaps + k values vs 7 */
        T_ASSERT(r.n_changed == k && r.encoding == want, "%d changes: encoding %d, want %d", k, r.encoding, want);
        T_ASSERT(r.raw_bytes == (uint64_t)(want == DELTA_SPARSE ? 2 * k : 7), "%d changes: raw %llu", k,
                 (unsigned long long)r.raw_bytes);
        delta_record_free(&r);
    }
}

/* Whole-tensor replacement (a full reload) through the same plan: unchanged
 * tensors leave it, few changes are kept sparse and a rewrite dense (the undo
 * log holds only what is overwritten), a failing touched hook (a device
 * update) restores every weight, derived copy and the version, and a good
 * commit lands exactly on the new checkpoint. Bad versions and shapes are
 * refused before any write. */
static void test_replace(void) {
    Ckpt v0, v1, live;
    ckpt_init(&v0, 1);
    ckpt_copy(&v1, &v0);
    step(&v1, 7);
    ckpt_copy(&live, &v0);
    WeightVersion *wv = weight_version_from_safetensors(&live.st, 1);
    WeightVersion *want = weight_version_from_safetensors(&v1.st, 1);
    uint64_t h0 = ckpt_hash(&v0);
    DeltaReplace r[NT];
    for (int i = 0; i < NT; i++)
        r[i] = (DeltaReplace){v1.t[i].name, v1.t[i].data, v1.t[i].dtype, v1.t[i].ndim, v1.t[i].shape, v1.t[i].numel};
    DeltaTarget tgt = target_of(&live);
    Touched tc = {.fail_on = "model.embed", .fail_once = 1};
    tgt.touched = on_touched;
    tgt.touched_ctx = &tc;
    Err err = {0};
    DeltaPlan *p = NULL;

    T_ASSERT(delta_prepare_replace(&p, r, NT, 0, &tgt, wv, &err) != 0 && err.code == 400, "version 0 accepted");
    T_ASSERT(p == NULL, "plan on error");
    err = (Err){0};
    T_ASSERT(delta_prepare_replace(&p, r, NT, DELTA_VERSION_MAX + 1, &tgt, wv, &err) != 0 && err.code == 400,
             "version above DELTA_VERSION_MAX accepted");
    DeltaReplace bad[NT];
    memcpy(bad, r, sizeof bad);
    int64_t wrong[2] = {96, 64};
    bad[0].shape = wrong;
    err = (Err){0};
    T_ASSERT(delta_prepare_replace(&p, bad, NT, 1, &tgt, wv, &err) != 0 && err.code == 422, "wrong shape: %s", err.msg);
    T_ASSERT(ckpt_hash(&live) == h0 && tc.calls == 0, "a refused replacement changed weights");

    T_ASSERT(delta_prepare_replace(&p, r, NT, 1, &tgt, wv, &err) == 0, "prepare: %s", err.msg);
    T_ASSERT(ckpt_hash(&live) == h0, "prepare wrote weights");
    T_ASSERT(delta_plan_count(p) == NT - 1, "unchanged tensor kept: %d entries", delta_plan_count(p));
    for (int i = 0; i < delta_plan_count(p); i++) {
        Dtype dt;
        int64_t numel;
        const DeltaDecoded *u;
        const char *name = delta_plan_tensor(p, i, &dt, &numel, &u);
        T_ASSERT(strcmp(name, "lm_head.weight") != 0, "unchanged lm_head in the plan");
        if (strcmp(name, "layers.0.mlp.weight") == 0 || strcmp(name, "model.embed") == 0)
            T_ASSERT(u->pos && u->n < numel / 10, "%s: %lld of %lld kept, not sparse", name, (long long)u->n,
                     (long long)numel);
        if (strcmp(name, "layers.0.norm.bias") == 0) T_ASSERT(!u->pos && u->n == numel, "rewrite not dense");
    }
    DeltaResult res;
    err = (Err){0};
    T_ASSERT(delta_commit(p, &tgt, wv, &res, &err) != 0 && err.code == 422, "hook failure not reported: %s", err.msg);
    T_ASSERT(ckpt_equal(&live, &v0), "weights not restored after a failing hook");
    T_ASSERT(wv->version == 0 && res.version == 0, "version moved on failure");
    for (int i = 0; i < NT; i++)
        T_ASSERT(wv->hash[i] == XXH3_64bits(v0.t[i].data, v0.t[i].nbytes), "hash of %s moved on failure", wv->names[i]);
    /* hook order: 0 mlp, 1 norm.bias, 2 embed (fails); then re-derived from the restored values */
    T_ASSERT(tc.calls == 6, "%d hook calls", tc.calls);
    T_ASSERT(tc.seen[3] == XXH3_64bits(v0.t[0].data, v0.t[0].nbytes) &&
                 tc.seen[4] == XXH3_64bits(v0.t[1].data, v0.t[1].nbytes) &&
                 tc.seen[5] == XXH3_64bits(v0.t[3].data, v0.t[3].nbytes),
             "derived copies re-made from other data than the restored weights");
    delta_plan_free(p);

    tc = (Touched){0};
    T_ASSERT(delta_prepare_replace(&p, r, NT, 1, &tgt, wv, &err) == 0, "prepare: %s", err.msg);
    T_ASSERT(delta_commit(p, &tgt, wv, &res, &err) == 0, "commit: %s", err.msg);
    T_ASSERT(ckpt_equal(&live, &v1) && wv->version == 1 && res.tensors_updated == NT - 1, "not at the new checkpoint");
    for (int i = 0; i < NT; i++) T_ASSERT(wv->hash[i] == want->hash[i], "hash of %s", wv->names[i]);
    delta_plan_free(p);
    weight_version_free(wv);
    weight_version_free(want);
    ckpt_free(&v0);
    ckpt_free(&v1);
    ckpt_free(&live);
}

/* Error bodies are OpenAI error objects: message (even for a tensor name that
 * is not UTF-8), type, param (the named tensor, else "delta"), code. */
static void test_error_json_shape(void) {
    WeightVersion wv0 = {0};
    wv0.version = 3;
    struct { const char *name; int code; const char *param; const char *ecode; } cases[] = {
        {"bad\xff\xfename", 422, NULL, "invalid_delta"},
        {"model.norm.weight", 400, "model.norm.weight", "invalid_delta"},
        {NULL, 409, "delta", "version_conflict"},
    };
    for (int i = 0; i < 3; i++) {
        Err err = {0};
        if (cases[i].name) ERR(&err, cases[i].code, "delta: '%s': no such tensor in the model", cases[i].name);
        else ERR(&err, cases[i].code, "delta: base version 0 -> 1, the sampler is at version 3");
        char *js = delta_error_json(&err, &wv0);
        json_error_t je;
        json_t *j = json_loads(js, 0, &je);
        json_t *e = json_object_get(j, "error");
        T_ASSERT(json_is_string(json_object_get(e, "message")) && json_string_length(json_object_get(e, "message")) > 0,
                 "error %d has a message: %s", i, js);
        T_ASSERT(json_is_string(json_object_get(e, "type")), "error %d has a type: %s", i, js);
        T_ASSERT(json_is_string(json_object_get(e, "param")), "error %d has a param: %s", i, js);
        if (cases[i].param)
            T_ASSERT(!strcmp(json_string_value(json_object_get(e, "param")), cases[i].param), "param: %s", js);
        T_ASSERT(json_is_string(json_object_get(e, "code")) &&
                 !strcmp(json_string_value(json_object_get(e, "code")), cases[i].ecode), "code: %s", js);
        T_ASSERT(json_integer_value(json_object_get(j, "current_version")) == 3, "current_version: %s", js);
        json_decref(j);
        free(js);
    }
}

int main(void) {
    for (g_xor_values = 0; g_xor_values < 2; g_xor_values++) { /* SPARSE, then SPARSE_XOR values */
        test_round_trip();
        test_conflicts();
        test_corruption();
    }
    g_xor_values = 0;
    test_zero_xor_mask();
    test_encoding_choice();
    test_versions();
    test_error_json_shape();
    for (g_xor_values = 0; g_xor_values < 2; g_xor_values++) test_check_payloads();
    g_xor_values = 0;
    test_safetensors_mapping();
    test_replace();
    test_fuzz();
    return T_DONE();
}
