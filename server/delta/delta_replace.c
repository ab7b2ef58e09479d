/*
 * delta_replace.c - whole-tensor replacement as a delta plan: what a full
 * reload (POST /admin/v1/weights/reload) commits. Each replaced tensor
 * becomes a plan entry holding only what differs from the live tensor (its
 * changed positions and new values, or the whole tensor when that is
 * smaller), so delta_commit applies, re-hashes, re-derives and restores it
 * exactly like a delta: one transaction, one undo mechanism.
 *
 * Memory: per changed tensor min(n_changed * (8 + es), numel * es) bytes,
 * the new values before the commit's swap and the overwritten ones after
 * (the undo log); unchanged tensors cost nothing. The new bytes are read in
 * place (a mapping). Not here: which files are read (server/http), the
 * container format (delta_format.c).
 */
#include <inttypes.h>
#include <stdlib.h>
#include <xxhash.h>

#include "delta.h"
#include "delta_plan.h"

typedef struct ReplaceJob {
    DeltaPlan *p;
    DeltaEntry *e;            /* [n] the plan's entries, written per tensor */
    const DeltaReplace *r;    /* [n] */
} ReplaceJob;

static int64_t count_diff(const uint8_t *a, const uint8_t *b, int64_t n, int es) {
    int64_t d = 0;
    if (es == 2) {
        const uint16_t *x = (const void *)a, *y = (const void *)b;
        if (((uintptr_t)a | (uintptr_t)b) % 2 == 0) {
            for (int64_t i = 0; i < n; i++) d += x[i] != y[i];
            return d;
        }
    }
    for (int64_t i = 0; i < n; i++) d += delta_elem_ne(a + i * es, b + i * es, es);
    return d;
}

/* Plan entry i from the new bytes: hash them, keep what differs, and check
 * that the plan reproduces exactly that hash (the bytes did not change under us). */
static void build_one(void *ctx, int i) {
    ReplaceJob *j = ctx;
    PlanT *t = &j->p->t[i];
    DeltaEntry *e = &j->e[i];
    const uint8_t *src = j->r[i].data;
    int es = t->es;
    size_t bytes = (size_t)e->numel * (size_t)es;
    e->hash_after = XXH3_64bits(src, bytes);
    int64_t nd = count_diff(t->data, src, e->numel, es);
    e->n_changed = nd;
    if (nd == 0) return;
    if ((uint64_t)nd * (uint64_t)(8 + es) < (uint64_t)bytes) {
        e->encoding = DELTA_SPARSE;
        t->d.pos = malloc(sizeof(int64_t) * (size_t)nd);
        t->d.vals = malloc((size_t)nd * (size_t)es);
        if (!t->d.pos || !t->d.vals) {
            t->rc = ERR(&t->err, 507, "reload: '%s': out of memory for %" PRId64 " changed elements", e->name, nd);
            return;
        }
        int64_t k = 0;
        for (int64_t x = 0; x < e->numel && k <= nd; x++)
            if (delta_elem_ne(t->data + x * es, src + x * es, es)) {
                if (k < nd) {
                    t->d.pos[k] = x;
                    delta_elem_cpy(t->d.vals + k * es, src + x * es, es);
                }
                k++;
            }
        t->d.n = nd;
        if (k != nd) {
            t->rc = ERR(&t->err, 409, "reload: '%s' changed while it was being read", e->name);
            return;
        }
    } else {
        e->encoding = DELTA_DENSE;
        t->d.vals = malloc(bytes ? bytes : 1);
        if (!t->d.vals) {
            t->rc = ERR(&t->err, 507, "reload: '%s': out of memory for %zu bytes", e->name, bytes);
            return;
        }
        memcpy(t->d.vals, src, bytes);
        t->d.n = e->numel;
    }
    int64_t nd2;
    if (delta_predicted_hash(t, &nd2) != e->hash_after || nd2 != nd)
        t->rc = ERR(&t->err, 409, "reload: '%s' changed while it was being read", e->name);
}

int delta_prepare_replace(DeltaPlan **out, const DeltaReplace *r, int n, uint64_t target_version,
                          const DeltaTarget *tgt, const WeightVersion *wv, Err *err) {
    *out = NULL;
    ENSURE(err, target_version > wv->version && target_version <= DELTA_VERSION_MAX, 400,
           "reload: version %" PRIu64 " must be above the current %" PRIu64 " and at most %llu", target_version,
           wv->version, (unsigned long long)DELTA_VERSION_MAX);
    DeltaFile *f = xcalloc(1, sizeof *f);
    f->h = (DeltaHeader){.format_version = DELTA_FORMAT_VERSION, .flags = n ? 0 : DELTA_FLAG_VERSION_ONLY,
                         .fingerprint = wv->fingerprint, .base_version = wv->version,
                         .target_version = target_version, .n_tensors = (uint32_t)n};
    f->n = n;
    f->e = xcalloc((size_t)(n ? n : 1), sizeof(DeltaEntry));
    DeltaPlan *p = xcalloc(1, sizeof *p);
    p->f = f;
    p->n = n;
    p->t = xcalloc((size_t)(n ? n : 1), sizeof(PlanT));
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        DeltaEntry *e = &f->e[i];
        e->name = xstrdup(r[i].name);
        e->dtype = r[i].dtype;
        e->encoding = DELTA_DENSE;
        if (r[i].ndim < 0 || r[i].ndim > DELTA_MAX_DIMS) rc = ERR(err, 422, "reload: '%s': %d dims", r[i].name, r[i].ndim);
        e->ndim = rc ? 0 : r[i].ndim;
        for (int d = 0; d < e->ndim; d++) e->shape[d] = r[i].shape[d];
        e->numel = r[i].numel;
    }
    if (rc == 0) rc = delta_plan_bind(p, tgt, wv, err);
    if (rc == 0) {
        ReplaceJob j = {p, f->e, r};
        delta_par_for(n, tgt->n_threads, build_one, &j);
        for (int i = 0; i < n && rc == 0; i++)
            if (p->t[i].rc) {
                if (err) *err = p->t[i].err;
                rc = p->t[i].rc;
            }
    }
    if (rc) {
        delta_plan_free(p);
        return rc;
    }
    /* Unchanged tensors leave the plan (their entries stay in f for the free). */
    int m = 0;
    for (int i = 0; i < n; i++)
        if (p->t[i].e->n_changed) p->t[m++] = p->t[i];
    p->n = m;
    *out = p;
    return 0;
}
