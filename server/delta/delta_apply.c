/*
 * delta_apply.c - all-or-nothing, in-place application of a delta container
 * to a model's weights (see delta.h for the two phases), plus the model
 * version record (WeightVersion) the admin endpoints report.
 *
 * Verify first (checksum, fingerprint, base version, bounds, and the hash the
 * result will have), then swap new values in (the plan keeps the old ones),
 * re-hash, and swap back on any mismatch. Not here: the wire format
 * (delta_format.c), HTTP (server).
 */
#include "delta.h"
#include "delta_plan.h"

#include "buf.h"
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <xxhash.h>

/* ---- parallel for ---- */

typedef struct ParFor {
    int n, next;
    pthread_mutex_t mu;
    void (*fn)(void *, int);
    void *ctx;
} ParFor;

static void *par_worker(void *arg) {
    ParFor *pf = arg;
    for (;;) {
        pthread_mutex_lock(&pf->mu);
        int i = pf->next++;
        pthread_mutex_unlock(&pf->mu);
        if (i >= pf->n) return NULL;
        pf->fn(pf->ctx, i);
    }
}

void delta_par_for(int n, int n_threads, void (*fn)(void *ctx, int i), void *ctx) {
    if (n_threads > n) n_threads = n;
    if (n_threads <= 1) {
        for (int i = 0; i < n; i++) fn(ctx, i);
        return;
    }
    ParFor pf = {.n = n, .fn = fn, .ctx = ctx};
    pthread_mutex_init(&pf.mu, NULL);
    pthread_t th[64];
    if (n_threads > 64) n_threads = 64;
    int started = 0;
    for (int t = 0; t < n_threads - 1; t++)
        if (pthread_create(&th[started], NULL, par_worker, &pf) == 0) started++;
    par_worker(&pf); /* the caller works too, so progress never depends on thread creation */
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
    pthread_mutex_destroy(&pf.mu);
}

/* ---- fingerprint and WeightVersion ---- */

static void h_le(XXH3_state_t *s, uint64_t v, int n) {
    uint8_t b[8];
    for (int i = 0; i < n; i++) b[i] = (uint8_t)(v >> (8 * i));
    XXH3_64bits_update(s, b, (size_t)n);
}

uint64_t delta_fingerprint(const SafeTensors *st, const uint64_t *tensor_hash) {
    XXH3_state_t *s = XXH3_createState();
    CHECK_PTR(s, "out of memory");
    XXH3_64bits_reset(s);
    XXH3_64bits_update(s, "sampler-delta-fingerprint-v1", 28);
    h_le(s, (uint64_t)st->n, 4);
    for (int i = 0; i < st->n; i++) { /* st->t is sorted by strcmp */
        const StTensor *t = &st->t[i];
        size_t nl = strlen(t->name);
        const char *dn = dtype_name(t->dtype);
        h_le(s, nl, 4);
        XXH3_64bits_update(s, t->name, nl);
        h_le(s, strlen(dn), 1);
        XXH3_64bits_update(s, dn, strlen(dn));
        h_le(s, (uint64_t)t->ndim, 4);
        for (int d = 0; d < t->ndim; d++) h_le(s, (uint64_t)t->shape[d], 8);
        h_le(s, tensor_hash[i], 8);
    }
    uint64_t fp = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    return fp;
}

typedef struct HashJob {
    const SafeTensors *st;
    uint64_t *out;
} HashJob;

static void hash_one(void *ctx, int i) {
    HashJob *j = ctx;
    j->out[i] = XXH3_64bits(j->st->t[i].data, j->st->t[i].nbytes);
}

WeightVersion *weight_version_from_safetensors(const SafeTensors *st, int n_threads) {
    WeightVersion *wv = xcalloc(1, sizeof *wv);
    wv->n = st->n;
    wv->names = xcalloc((size_t)st->n + 1, sizeof(char *));
    wv->hash = xcalloc((size_t)st->n + 1, sizeof(uint64_t));
    wv->dtype = xcalloc((size_t)st->n + 1, sizeof(Dtype));
    wv->ndim = xcalloc((size_t)st->n + 1, sizeof(int));
    wv->shape = xcalloc((size_t)st->n + 1, sizeof *wv->shape);
    for (int i = 0; i < st->n; i++) {
        const StTensor *t = &st->t[i];
        wv->names[i] = xstrdup(t->name);
        wv->dtype[i] = t->dtype;
        wv->ndim[i] = t->ndim;
        for (int d = 0; d < t->ndim && d < DELTA_MAX_DIMS; d++) wv->shape[i][d] = t->shape[d];
    }
    HashJob j = {st, wv->hash};
    delta_par_for(st->n, n_threads, hash_one, &j);
    wv->fingerprint = delta_fingerprint(st, wv->hash);
    return wv;
}

void weight_version_free(WeightVersion *wv) {
    if (!wv) return;
    for (int i = 0; i < wv->n; i++) free(wv->names[i]);
    free(wv->names);
    free(wv->hash);
    free(wv->dtype);
    free(wv->ndim);
    free(wv->shape);
    free(wv);
}

int weight_version_find(const WeightVersion *wv, const char *name) {
    int lo = 0, hi = wv->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(wv->names[mid], name);
        if (c == 0) return mid;
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

static void hex16(char out[17], uint64_t v) { snprintf(out, 17, "%016" PRIx64, v); }

char *weight_version_json(const WeightVersion *wv) {
    json_t *root = json_object(), *t = json_object();
    char h[17];
    json_object_set_new(root, "version", json_integer((json_int_t)wv->version));
    hex16(h, wv->fingerprint);
    json_object_set_new(root, "model_fingerprint", json_string(h));
    for (int i = 0; i < wv->n; i++) {
        hex16(h, wv->hash[i]);
        json_object_set_new(t, wv->names[i], json_string(h));
    }
    json_object_set_new(root, "tensors", t);
    char *s = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(root);
    CHECK_PTR(s, "out of memory");
    return s;
}

char *delta_result_json(const DeltaResult *r) {
    json_t *root = json_object();
    char h[17];
    hex16(h, r->fingerprint);
    json_object_set_new(root, "version", json_integer((json_int_t)r->version));
    json_object_set_new(root, "model_fingerprint", json_string(h));
    json_object_set_new(root, "noop", json_boolean(r->noop));
    json_object_set_new(root, "tensors_updated", json_integer(r->tensors_updated));
    json_object_set_new(root, "elements_updated", json_integer((json_int_t)r->elements_updated));
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    CHECK_PTR(s, "out of memory");
    return s;
}

/* s as a JSON string; bytes that are not printable ASCII escaped as \xNN when
 * s is not valid UTF-8 (a tensor name from the request echoed back), so an
 * error never loses its message. */
static json_t *json_string_lossless(const char *s) {
    json_t *j = json_string(s);
    if (j) return j;
    Buf b = {0};
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char x[8];
        int k = *p < 0x20 || *p >= 0x7f ? snprintf(x, sizeof x, "\\x%02x", *p) : snprintf(x, sizeof x, "%c", *p);
        buf_append(&b, x, (size_t)k);
    }
    buf_append(&b, "", 1);
    j = json_string(b.p);
    buf_free(&b);
    return j;
}

char *delta_error_json(const Err *e, const WeightVersion *wv) {
    /* OpenAI's error shape, like every HTTP error of the server */
    int st = e->code ? e->code : 500;
    const char *type = st == 409 ? "conflict_error" : st == 401 ? "authentication_error" : st == 403 ? "permission_error"
                     : st == 404 ? "not_found_error" : st >= 500 ? "server_error" : "invalid_request_error";
    /* param: the tensor the message names ('name'), else the delta body for the container's own errors */
    json_t *param = NULL;
    const char *q0 = strchr(e->msg, '\''), *q1 = q0 ? strchr(q0 + 1, '\'') : NULL;
    if (q1 && q1 > q0 + 1) {
        char name[DELTA_MAX_NAME + 1];
        size_t n = (size_t)(q1 - q0 - 1) < sizeof name - 1 ? (size_t)(q1 - q0 - 1) : sizeof name - 1;
        memcpy(name, q0 + 1, n);
        name[n] = 0;
        param = json_string_lossless(name);
    } else if (!strncmp(e->msg, "delta:", 6)) {
        param = json_string("delta");
    }
    json_t *root = json_object(), *er = json_object();
    json_object_set_new(er, "message", json_string_lossless(e->msg[0] ? e->msg : "delta refused"));
    json_object_set_new(er, "type", json_string(type));
    json_object_set_new(er, "param", param ? param : json_null());
    json_object_set_new(er, "code", json_string(st == 409 ? "version_conflict" : "invalid_delta"));
    json_object_set_new(root, "error", er);
    json_object_set_new(root, "current_version", json_integer((json_int_t)wv->version));
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    CHECK_PTR(s, "out of memory");
    return s;
}

void *delta_lookup_safetensors(void *ctx, const char *name, Dtype *dt, int64_t *numel) {
    const SafeTensors *st = ctx;
    if (st->n == 0) return NULL;
    const StTensor *t = safetensors_get(st, name);
    if (!t) return NULL;
    *dt = t->dtype;
    *numel = t->numel;
    return t->data;
}

/* ---- the plan ---- */


int delta_plan_count(const DeltaPlan *p) { return p->noop ? 0 : p->n; }

const char *delta_plan_tensor(const DeltaPlan *p, int i, Dtype *dt, int64_t *numel, const DeltaDecoded **upd) {
    *dt = p->t[i].e->dtype;
    *numel = p->t[i].e->numel;
    *upd = &p->t[i].d;
    return p->t[i].e->name;
}

const DeltaHeader *delta_plan_header(const DeltaPlan *p) { return &p->f->h; }

void delta_plan_free(DeltaPlan *p) {
    if (!p) return;
    for (int i = 0; i < p->n; i++) delta_decoded_free(&p->t[i].d);
    free(p->t);
    delta_file_free(p->f);
    free(p);
}

/* XXH3 of the tensor as it would be after the update, without writing it;
 * counts the elements whose bits change. */
uint64_t delta_predicted_hash(const PlanT *t, int64_t *n_diff) {
    const DeltaEntry *e = t->e;
    int es = t->es;
    *n_diff = 0;
    if (!t->d.pos) {
        for (int64_t i = 0; i < e->numel; i++)
            *n_diff += delta_elem_ne(t->data + i * es, t->d.vals + i * es, es);
        return XXH3_64bits(t->d.vals, (size_t)e->numel * (size_t)es);
    }
    enum { CHUNK = 1 << 16 };
    uint8_t buf[CHUNK];
    XXH3_state_t *s = XXH3_createState();
    CHECK_PTR(s, "out of memory");
    XXH3_64bits_reset(s);
    size_t total = (size_t)e->numel * (size_t)es;
    int64_t k = 0;
    for (size_t off = 0; off < total; off += CHUNK) {
        size_t len = total - off < CHUNK ? total - off : CHUNK; /* CHUNK is a multiple of every es */
        memcpy(buf, t->data + off, len);
        int64_t end_el = (int64_t)((off + len) / (size_t)es);
        for (; k < t->d.n && t->d.pos[k] < end_el; k++) {
            uint8_t *dst = buf + (size_t)t->d.pos[k] * es - off;
            *n_diff += delta_elem_ne(dst, t->d.vals + k * es, es);
            delta_elem_cpy(dst, t->d.vals + k * es, es);
        }
        XXH3_64bits_update(s, buf, len);
    }
    uint64_t h = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    return h;
}

/* SPARSE_XOR: masks -> new values, against the live (base) weights
 * (delta_decode has refused zero masks). */
static void resolve_xor(PlanT *t) {
    int es = t->es;
    for (int64_t k = 0; k < t->d.n; k++) {
        uint8_t *v = t->d.vals + (size_t)k * es;
        const uint8_t *w = t->data + (size_t)t->d.pos[k] * es;
        for (int b = 0; b < es; b++) v[b] ^= w[b];
    }
    t->d.xor = 0;
}

/* delta_decode is every check that needs no weights (delta_check_payloads,
 * `trainer inspect`, runs the same); then the ones against the live weights. */
static void prepare_one(void *ctx, int i) {
    PlanT *t = &((DeltaPlan *)ctx)->t[i];
    if ((t->rc = delta_decode(t->e, &t->d, &t->err)) != 0) return;
    if (t->d.xor) resolve_xor(t);
    int64_t n_diff;
    uint64_t h = delta_predicted_hash(t, &n_diff);
    if (h != t->e->hash_after)
        t->rc = ERR(&t->err, 422, "delta: '%s': the update would give hash %016" PRIx64 ", the delta promises %016" PRIx64
                    " (made from other base weights?)", t->e->name, h, t->e->hash_after);
    else if (t->d.pos == NULL && n_diff != t->e->n_changed)
        t->rc = ERR(&t->err, 400, "delta: '%s': dense update changes %" PRId64 " elements, record says %" PRId64,
                    t->e->name, n_diff, t->e->n_changed);
}

static int cmp_data(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)((const PlanT *)a)->data, y = (uintptr_t)((const PlanT *)b)->data;
    return x < y ? -1 : x > y;
}

int delta_plan_bind(DeltaPlan *p, const DeltaTarget *tgt, const WeightVersion *wv, Err *err) {
    for (int i = 0; i < p->n; i++) {
        const DeltaEntry *e = &p->f->e[i];
        PlanT *t = &p->t[i];
        t->e = e;
        Dtype dt;
        int64_t numel = -1;
        int k = weight_version_find(wv, e->name);
        ENSURE(err, k >= 0, 422, "delta: tensor '%s' is not in the model", e->name);
        ENSURE(err, wv->dtype[k] == e->dtype && wv->ndim[k] == e->ndim &&
                        memcmp(wv->shape[k], e->shape, sizeof(int64_t) * (size_t)e->ndim) == 0,
               422, "delta: '%s': dtype or shape differs from the model's checkpoint", e->name);
        t->data = tgt->lookup(tgt->ctx, e->name, &dt, &numel);
        ENSURE(err, t->data != NULL, 422, "delta: tensor '%s' is not in the model", e->name);
        ENSURE(err, dt == e->dtype, 422, "delta: '%s' is %s in the delta, %s in the model", e->name,
               dtype_name(e->dtype), dtype_name(dt));
        ENSURE(err, numel == e->numel, 422, "delta: '%s' has %" PRId64 " elements in the delta, %" PRId64 " in the model",
               e->name, e->numel, numel);
        t->es = dtype_size(dt);
    }
    /* Two names on one storage would make restore ambiguous. */
    PlanT *s = xmalloc(sizeof(PlanT) * (size_t)(p->n ? p->n : 1));
    memcpy(s, p->t, sizeof(PlanT) * (size_t)p->n);
    qsort(s, (size_t)p->n, sizeof(PlanT), cmp_data);
    int rc = 0;
    for (int i = 1; i < p->n && rc == 0; i++)
        if (s[i - 1].data + (size_t)s[i - 1].e->numel * (size_t)s[i - 1].es > s[i].data)
            rc = ERR(err, 422, "delta: tensors '%s' and '%s' share storage", s[i - 1].e->name, s[i].e->name);
    free(s);
    return rc;
}

int delta_prepare(DeltaPlan **out, const uint8_t *buf, size_t size, const DeltaTarget *tgt,
                  const WeightVersion *wv, Err *err) {
    *out = NULL;
    DeltaFile *f;
    int rc = delta_parse(&f, buf, size, err);
    if (rc) return rc;
    DeltaPlan *p = xcalloc(1, sizeof *p);
    p->f = f;
    const DeltaHeader *h = &f->h;
    if (h->fingerprint != wv->fingerprint) {
        rc = ERR(err, 409, "delta: for model %016" PRIx64 ", this sampler serves model %016" PRIx64,
                 h->fingerprint, wv->fingerprint);
    } else if (h->target_version == wv->version) {
        /* Replay: a success only if it is exactly what we already hold. */
        for (int i = 0; i < f->n && rc == 0; i++) {
            int k = weight_version_find(wv, f->e[i].name);
            if (k < 0 || wv->hash[k] != f->e[i].hash_after)
                rc = ERR(err, 409, "delta: version %" PRIu64 " is already applied with other content ('%s' differs)",
                         wv->version, f->e[i].name);
        }
        p->noop = 1;
    } else if (h->base_version != wv->version) {
        rc = ERR(err, 409, "delta: base version %" PRIu64 " -> %" PRIu64 ", the sampler is at version %" PRIu64,
                 h->base_version, h->target_version, wv->version);
    } else {
        p->n = f->n;
        p->t = xcalloc((size_t)(f->n ? f->n : 1), sizeof(PlanT));
        rc = delta_plan_bind(p, tgt, wv, err);
        if (rc == 0) {
            delta_par_for(p->n, tgt->n_threads, prepare_one, p);
            for (int i = 0; i < p->n && rc == 0; i++)
                if (p->t[i].rc) {
                    if (err) *err = p->t[i].err;
                    rc = p->t[i].rc;
                }
        }
    }
    if (rc) {
        delta_plan_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

/* Exchange the plan's values with the live ones: applying and undoing are the
 * same operation. */
static void swap_one(void *ctx, int i) {
    PlanT *t = &((DeltaPlan *)ctx)->t[i];
    int es = t->es;
    uint8_t tmp[8];
    if (t->d.pos && es == 2) { /* BF16/F16: the common case, without a per-element size switch */
        for (int64_t k = 0; k < t->d.n; k++) {
            uint8_t *w = t->data + (size_t)t->d.pos[k] * 2, *v = t->d.vals + (size_t)k * 2;
            uint16_t x, y;
            memcpy(&x, w, 2);
            memcpy(&y, v, 2);
            memcpy(w, &y, 2);
            memcpy(v, &x, 2);
        }
        return;
    }
    if (t->d.pos) {
        for (int64_t k = 0; k < t->d.n; k++) {
            uint8_t *w = t->data + (size_t)t->d.pos[k] * es, *v = t->d.vals + (size_t)k * es;
            delta_elem_cpy(tmp, w, es);
            delta_elem_cpy(w, v, es);
            delta_elem_cpy(v, tmp, es);
        }
        return;
    }
    uint8_t chunk[1 << 14];
    size_t total = (size_t)t->d.n * (size_t)es;
    for (size_t off = 0; off < total; off += sizeof chunk) {
        size_t len = total - off < sizeof chunk ? total - off : sizeof chunk;
        memcpy(chunk, t->data + off, len);
        memcpy(t->data + off, t->d.vals + off, len);
        memcpy(t->d.vals + off, chunk, len);
    }
}

static void verify_one(void *ctx, int i) {
    PlanT *t = &((DeltaPlan *)ctx)->t[i];
    uint64_t h = XXH3_64bits(t->data, (size_t)t->e->numel * (size_t)t->es);
    t->rc = h == t->e->hash_after ? 0
                                  : ERR(&t->err, 500, "delta: '%s': hash after the update %016" PRIx64 " != %016" PRIx64
                                        " (weights changed during the update?); restored", t->e->name, h, t->e->hash_after);
}

static int call_touched(const DeltaTarget *tgt, const PlanT *t, Err *err) {
    int rc = tgt->touched(tgt->touched_ctx, t->e->name, t->data, t->e->dtype, t->e->numel, t->d.pos,
                          t->d.pos ? t->d.n : t->e->numel, err);
    return rc < 0 ? rc : 0;
}

int delta_commit(DeltaPlan *p, const DeltaTarget *tgt, WeightVersion *wv, DeltaResult *res, Err *err) {
    memset(res, 0, sizeof *res);
    res->version = wv->version;
    res->fingerprint = wv->fingerprint;
    ENSURE(err, !p->committed, 500, "delta: plan already committed");
    if (p->noop) {
        ENSURE(err, wv->version == p->f->h.target_version, 409, "delta: sampler moved to version %" PRIu64, wv->version);
        res->noop = 1;
        p->committed = 1;
        return 0;
    }
    ENSURE(err, wv->version == p->f->h.base_version && wv->fingerprint == p->f->h.fingerprint, 409,
           "delta: base version %" PRIu64 ", the sampler is at version %" PRIu64, p->f->h.base_version, wv->version);
    p->committed = 1;
    delta_par_for(p->n, tgt->n_threads, swap_one, p);
    if (!tgt->skip_verify_after) {
        delta_par_for(p->n, tgt->n_threads, verify_one, p);
        for (int i = 0; i < p->n; i++)
            if (p->t[i].rc) {
                if (err) *err = p->t[i].err;
                delta_par_for(p->n, tgt->n_threads, swap_one, p);
                return p->t[i].rc;
            }
    }
    for (int i = 0; tgt->touched && i < p->n; i++) {
        int rc = call_touched(tgt, &p->t[i], err);
        if (rc == 0) continue;
        /* Undo: old weights back, then the derived copies from them. */
        delta_par_for(p->n, tgt->n_threads, swap_one, p);
        for (int j = 0; j <= i; j++) {
            Err ignored = {0};
            if (call_touched(tgt, &p->t[j], &ignored) != 0 && err) {
                char first[sizeof err->msg];
                memcpy(first, err->msg, sizeof first);
                ERR(err, 500, "%s; re-deriving '%s' after the restore also failed: %s", first, p->t[j].e->name,
                    ignored.msg);
            }
        }
        return rc;
    }
    for (int i = 0; i < p->n; i++) {
        int k = weight_version_find(wv, p->t[i].e->name);
        wv->hash[k] = p->t[i].e->hash_after;
        res->elements_updated += p->t[i].e->n_changed;
    }
    wv->version = p->f->h.target_version;
    res->version = wv->version;
    res->tensors_updated = p->n;
    return 0;
}

int delta_apply(const uint8_t *buf, size_t size, const DeltaTarget *tgt, WeightVersion *wv, DeltaResult *res,
                Err *err) {
    memset(res, 0, sizeof *res);
    res->version = wv->version;
    res->fingerprint = wv->fingerprint;
    DeltaPlan *p;
    int rc = delta_prepare(&p, buf, size, tgt, wv, err);
    if (rc) return rc;
    rc = delta_commit(p, tgt, wv, res, err);
    delta_plan_free(p);
    return rc;
}

int delta_http_post(const uint8_t *body, size_t n, const DeltaTarget *tgt, WeightVersion *wv, char **json) {
    DeltaResult res;
    Err err = {0};
    if (delta_apply(body, n, tgt, wv, &res, &err) == 0) {
        *json = delta_result_json(&res);
        return 200;
    }
    *json = delta_error_json(&err, wv);
    return err.code ? err.code : 500;
}
