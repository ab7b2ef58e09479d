/*
 * api_reload.c - POST /admin/v1/weights/reload: replace the served weights by
 * those of a checkpoint directory of the same model (config.json describing
 * the same computation, same tensor names, dtypes and shapes), in place,
 * between engine steps, at a version above the current one (at most
 * DELTA_VERSION_MAX).
 *
 * Confinement: the directory and every file the reload opens (config.json,
 * the shard index, every shard) must resolve, symlinks included, inside one
 * of the --reload-root directories; without any, reloading is disabled. Each
 * file is checked on the descriptor actually opened (its realpath is under a
 * root and names that same inode), so a symlink swapped mid-check cannot
 * escape. A path that is missing, not a regular file or directory, or outside
 * every root gets one answer (403, same message shape naming only what the
 * client sent), so the endpoint cannot probe the filesystem.
 *
 * One transaction, as deltas: everything that can refuse the reload runs
 * first while serving (paths, config, layout of every tensor, readable data
 * hashed, the changed tensors staged by delta_prepare_replace); then, between
 * steps, delta_commit swaps them in, re-hashes, re-quantizes and refreshes
 * device copies, and on any failure restores every weight (host master,
 * quantized blocks, device copy) and the version. Memory: the new checkpoint
 * is mapped, and the plan holds per changed tensor what differs (see
 * delta_prepare_replace), which after the swap is the undo log.
 * Not here: sparse deltas (api_admin.c), the admin token check (http.c).
 */
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "delta.h"
#include "log.h"
#include "server.h"

#define RELOAD_MAX_CONFIG_BYTES (1u << 20)

/* 1 when real (a resolved path) is root or below it. */
static int under_root(const char *real, const char *root) {
    char *r = realpath(root, NULL);
    if (!r) return 0;
    size_t n = strlen(r);
    int ok = strncmp(real, r, n) == 0 && (real[n] == 0 || real[n] == '/' || (n == 1 && r[0] == '/'));
    free(r);
    return ok;
}

static int under_any_root(const Server *s, const char *real) {
    for (int i = 0; i < s->cfg.n_reload_roots; i++)
        if (under_root(real, s->cfg.reload_roots[i])) return 1;
    return 0;
}

typedef ReloadConfine Confine;

/* StOpener for the reload: path opened read-only, accepted only when the
 * opened inode is a regular file whose realpath lies inside a root. Missing
 * and forbidden are the same 403. */
int reload_confined_open(void *ctx, const char *path, Err *err) {
    const Confine *c = ctx;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC); /* O_NONBLOCK: a FIFO must not block */
    char *real = fd >= 0 ? realpath(path, NULL) : NULL;
    struct stat a, b;
    int ok = real && under_any_root(c->s, real) && fstat(fd, &a) == 0 && S_ISREG(a.st_mode) && stat(real, &b) == 0 &&
             a.st_dev == b.st_dev && a.st_ino == b.st_ino;
    if (!ok && fd >= 0) log_warn("reload: refused %s (resolves to %s: not a regular file inside --reload-root)", path,
                                 real ? real : "?");
    free(real);
    if (ok) return fd;
    if (fd >= 0) close(fd);
    return ERR(err, 403, "%s: no readable file '%s' inside the --reload-root directories", c->given, base);
}

/* The checkpoint's config.json must describe the served computation. */
static int check_config(Server *s, const Confine *c, const char *dir, Err *err) {
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/config.json", dir);
    int fd = reload_confined_open((void *)c, path, err);
    if (fd < 0) return fd;
    struct stat sb;
    int rc = fstat(fd, &sb) == 0 && sb.st_size <= RELOAD_MAX_CONFIG_BYTES
                 ? 0
                 : ERR(err, 400, "%s: config.json is larger than %u bytes", c->given, RELOAD_MAX_CONFIG_BYTES);
    ModelConfig cfg;
    if (rc == 0) rc = model_config_parse_fd(&cfg, fd, "config.json", err);
    close(fd);
    if (rc) return rc;
    const char *field = model_config_differs(&cfg, &s->model->cfg);
    ENSURE(err, !field, 400, "%s: config.json describes another model than the served one (%s differs)", c->given,
           field);
    return 0;
}

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

/* The tensors whose bytes differ from the served ones, as replacements
 * ([*n] malloc'ed into *out); each must be patchable in place. */
static int changed_tensors(Server *s, const SafeTensors *st, const WeightVersion *nw, const char *dir,
                           DeltaReplace **out, int *n, Err *err) {
    const WeightVersion *wv = s->wv;
    DeltaReplace *r = xcalloc((size_t)wv->n + 1, sizeof *r);
    *out = r;
    *n = 0;
    for (int i = 0; i < wv->n; i++) {
        int j = weight_version_find(nw, wv->names[i]);
        if (j >= 0 && nw->hash[j] == wv->hash[i]) continue;
        const StTensor *t = safetensors_get(st, wv->names[i]);
        Dtype dt;
        int64_t numel;
        ENSURE(err, delta_lookup_model(s->model, wv->names[i], &dt, &numel), 422,
               "%s: tensor '%s' changed, but the sampler converted it at load (F16/F32 -> BF16) or holds it "
               "pre-quantized: it cannot be replaced in place (restart the sampler on this checkpoint)",
               dir, wv->names[i]);
        r[(*n)++] = (DeltaReplace){t->name, t->data, t->dtype, t->ndim, t->shape, t->numel};
    }
    return 0;
}


typedef struct Reload {
    char *real;          /* resolved directory */
    SafeTensors *st;     /* the new checkpoint, mapped */
    WeightVersion *nw;   /* its hashes */
    DeltaReplace *rep;   /* [n_rep] */
    int n_rep;
    DeltaPlan *plan;
    uint64_t version;
} Reload;

/* Everything that can refuse the reload, before any weight is touched. */
static int reload_prepare(Server *s, const char *given, uint64_t version, const DeltaTarget *tgt, Reload *r,
                          Err *err) {
    r->version = version;
    ENSURE(err, r->version <= DELTA_VERSION_MAX, 400, "version %llu is above the largest weight version %llu",
           (unsigned long long)r->version, (unsigned long long)DELTA_VERSION_MAX);
    ENSURE(err, r->version > s->wv->version, 409, "version %llu is not above the current version %llu",
           (unsigned long long)r->version, (unsigned long long)s->wv->version);
    ENSURE(err, s->cfg.n_reload_roots > 0, 403, "reloading is disabled: start the server with --reload-root DIR");
    Confine c = {s, given};
    r->real = realpath(given, NULL);
    struct stat sb;
    int ok = r->real && under_any_root(s, r->real) && stat(r->real, &sb) == 0 && S_ISDIR(sb.st_mode);
    ENSURE(err, ok, 403, "%s: no checkpoint directory there inside the --reload-root directories", given);
    int rc = check_config(s, &c, r->real, err);
    if (rc) return rc;
    StOpener op = {reload_confined_open, &c, 0};
    if ((rc = safetensors_open_with(&r->st, r->real, &op, err))) return rc;
    if ((rc = check_layout(s->wv, r->st, given, err))) return rc;
    r->nw = weight_version_from_safetensors(r->st, tgt->n_threads);
    if ((rc = changed_tensors(s, r->st, r->nw, given, &r->rep, &r->n_rep, err))) return rc;
    return delta_prepare_replace(&r->plan, r->rep, r->n_rep, r->version, tgt, s->wv, err);
}

static void reload_free(Reload *r) {
    delta_plan_free(r->plan);
    free(r->rep);
    weight_version_free(r->nw);
    safetensors_free(r->st);
    free(r->real);
}

int admin_reload(Server *s, const char *path, uint64_t version, DeltaResult *res, Err *err) {
    Reload r = {0};
    DeltaTarget tgt = admin_delta_target(s);
    uint64_t before = s->wv->version;
    int rc = reload_prepare(s, path, version, &tgt, &r, err);
    if (rc == 0) rc = admin_commit(s, r.plan, &tgt, 1, res, err);
    if (rc == 0)
        log_info("weights: reloaded %s: version %llu -> %llu (%d tensors changed)", r.real,
                 (unsigned long long)before, (unsigned long long)s->wv->version, res->tensors_updated);
    reload_free(&r);
    return rc;
}

int api_admin_reload(HttpReq *q, json_t *body) {
    Server *s = q->s;
    Err err = {0};
    DeltaResult res = {0};
    json_t *jp = json_object_get(body, "path"), *jv = json_object_get(body, "version");
    int rc = 0;
    if (!json_is_string(jp)) rc = ERR(&err, 400, "reload needs \"path\": a checkpoint directory");
    else if (!json_is_integer(jv) || json_integer_value(jv) <= 0)
        rc = ERR(&err, 400, "reload needs \"version\": the checkpoint's weight version (an integer above the current one)");
    pthread_mutex_lock(&s->admin_mu);
    if (rc == 0) rc = admin_reload(s, json_string_value(jp), (uint64_t)json_integer_value(jv), &res, &err);
    char *out = NULL;
    if (rc == 0) {
        char fp[17];
        snprintf(fp, sizeof fp, "%016llx", (unsigned long long)s->wv->fingerprint);
        json_t *o = json_pack("{s:I, s:s, s:i}", "version", (json_int_t)s->wv->version, "model_fingerprint", fp,
                              "tensors_updated", res.tensors_updated);
        out = json_dumps(o, JSON_COMPACT);
        json_decref(o);
    } else {
        out = delta_error_json(&err, s->wv);
    }
    pthread_mutex_unlock(&s->admin_mu);
    int status = rc == 0 ? 200 : (err.code ? err.code : 500);
    int ret = http_send_text(q, status, "application/json", out, strlen(out));
    free(out);
    return ret;
}
