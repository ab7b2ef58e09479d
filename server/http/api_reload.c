/*
 * api_reload.c - POST /admin/v1/weights/reload: replace the served weights by
 * those of a checkpoint directory of the same model (same tensor names, dtypes
 * and shapes), in place, between engine steps, at a version above the
 * current one. The directory must resolve (symlinks included) inside one of
 * the --reload-root directories; without any, reloading is disabled.
 *
 * Order, so that a refused reload changes nothing: resolve and check the
 * path, map the checkpoint, check every tensor and hash it (all while
 * serving); then, between steps, copy the tensors whose hash changed and
 * re-quantize / refresh device copies through the delta touched hook.
 * Not here: sparse deltas (api_admin.c), the admin token check (http.c).
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "delta.h"
#include "log.h"
#include "server.h"

/* 1 when real (a resolved path) is root or below it. */
static int under_root(const char *real, const char *root) {
    char *r = realpath(root, NULL);
    if (!r) return 0;
    size_t n = strlen(r);
    int ok = strncmp(real, r, n) == 0 && (real[n] == 0 || real[n] == '/' || (n == 1 && r[0] == '/'));
    free(r);
    return ok;
}

typedef struct Reload {
    Server *s;
    const SafeTensors *st;
    const WeightVersion *nw; /* hashes of the new checkpoint */
    uint64_t version;
    int updated;
} Reload;

/* Every served tensor must exist in the new checkpoint with the same dtype and shape. */
static int check_layout(const WeightVersion *wv, const SafeTensors *st, const char *dir, Err *err) {
    for (int i = 0; i < wv->n; i++) {
        const StTensor *t = safetensors_get(st, wv->names[i]);
        ENSURE(err, t, 400, "%s: tensor '%s' is missing", dir, wv->names[i]);
        int same = t->dtype == wv->dtype[i] && t->ndim == wv->ndim[i];
        for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == wv->shape[i][d];
        ENSURE(err, same, 400, "%s: tensor '%s' has another dtype or shape than the served model", dir,
               wv->names[i]);
    }
    return 0;
}

static int reload_commit(void *ctx, Err *err) {
    Reload *r = ctx;
    WeightVersion *wv = r->s->wv;
    for (int i = 0; i < wv->n; i++) {
        int j = weight_version_find(r->nw, wv->names[i]);
        if (j < 0 || r->nw->hash[j] == wv->hash[i]) continue;
        const StTensor *t = safetensors_get(r->st, wv->names[i]);
        Dtype dt;
        int64_t numel;
        void *dst = delta_lookup_model(r->s->model, wv->names[i], &dt, &numel);
        /* check_layout and the lookup at prepare time make this unreachable */
        ENSURE(err, dst && numel == t->numel && dt == t->dtype, 500, "tensor '%s' is not patchable", wv->names[i]);
        memcpy(dst, t->data, t->nbytes);
        int rc = admin_touched(r->s, wv->names[i], dst, dt, numel, NULL, 0, err);
        if (rc) return rc;
        wv->hash[i] = r->nw->hash[j];
        r->updated++;
    }
    wv->version = r->version;
    return 0;
}

/* Everything that can refuse the reload, before any weight is touched. */
static int reload_prepare(Server *s, json_t *body, char **real, SafeTensors **st, WeightVersion **nw,
                          uint64_t *version, Err *err) {
    json_t *jp = json_object_get(body, "path"), *jv = json_object_get(body, "version");
    ENSURE(err, json_is_string(jp), 400, "reload needs \"path\": a checkpoint directory");
    ENSURE(err, json_is_integer(jv) && json_integer_value(jv) > 0, 400,
           "reload needs \"version\": the checkpoint's weight version (an integer above the current one)");
    *version = (uint64_t)json_integer_value(jv);
    ENSURE(err, *version > s->wv->version, 409, "version %llu is not above the current version %llu",
           (unsigned long long)*version, (unsigned long long)s->wv->version);
    ENSURE(err, s->cfg.n_reload_roots > 0, 403, "reloading is disabled: start the server with --reload-root DIR");
    *real = realpath(json_string_value(jp), NULL);
    ENSURE(err, *real, 404, "%s: no such directory", json_string_value(jp));
    int ok = 0;
    for (int i = 0; i < s->cfg.n_reload_roots && !ok; i++) ok = under_root(*real, s->cfg.reload_roots[i]);
    ENSURE(err, ok, 403, "%s is outside the directories allowed by --reload-root", json_string_value(jp));
    int rc = safetensors_open(st, *real, err);
    if (rc) return rc;
    if ((rc = check_layout(s->wv, *st, *real, err))) return rc;
    for (int i = 0; i < s->wv->n; i++) {
        Dtype dt;
        int64_t numel;
        ENSURE(err, delta_lookup_model(s->model, s->wv->names[i], &dt, &numel) || s->wv->dtype[i] != DT_BF16, 409,
               "tensor '%s' was converted at load and cannot be replaced in place", s->wv->names[i]);
    }
    *nw = weight_version_from_safetensors(*st, 2);
    return 0;
}

int api_admin_reload(HttpReq *q, json_t *body) {
    Server *s = q->s;
    Err err = {0};
    char *real = NULL;
    SafeTensors *st = NULL;
    WeightVersion *nw = NULL;
    uint64_t version = 0;
    pthread_mutex_lock(&s->admin_mu);
    uint64_t before = s->wv->version;
    int rc = reload_prepare(s, body, &real, &st, &nw, &version, &err);
    Reload r = {s, st, nw, version, 0};
    if (rc == 0) rc = engine_run_exclusive(s->eng, reload_commit, &r, 1, &err);
    if (rc == 0) {
        server_map_version(s, engine_weight_version(s->eng), s->wv->version);
        log_info("weights: reloaded %s: version %llu -> %llu (%d tensors changed)", real,
                 (unsigned long long)before, (unsigned long long)s->wv->version, r.updated);
    }
    char *out = NULL;
    if (rc == 0) {
        char fp[17];
        snprintf(fp, sizeof fp, "%016llx", (unsigned long long)s->wv->fingerprint);
        json_t *o = json_pack("{s:I, s:s, s:i}", "version", (json_int_t)s->wv->version, "model_fingerprint", fp,
                              "tensors_updated", r.updated);
        out = json_dumps(o, JSON_COMPACT);
        json_decref(o);
    } else {
        out = delta_error_json(&err, s->wv);
    }
    pthread_mutex_unlock(&s->admin_mu);
    weight_version_free(nw);
    safetensors_free(st);
    free(real);
    int status = rc == 0 ? 200 : (err.code ? err.code : 500);
    int ret = http_send_text(q, status, "application/json", out, strlen(out));
    free(out);
    return ret;
}
