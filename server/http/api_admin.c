/*
 * api_admin.c - the trainer's controls, behind the admin token (the route table, routes.c):
 *   POST /admin/v1/weights/delta   binary delta container -> applied in place
 *   GET  /admin/v1/weights         {"version", "model_fingerprint", "tensors"}
 *   POST /pause[?mode=abort|wait|keep], POST /resume, GET /is_paused
 *   POST /abort_request            {"rid": id} or {"abort_all": true}
 * A delta is validated and decoded while the engine keeps serving
 * (delta_prepare), then committed between two engine steps
 * (engine_run_exclusive): running requests continue, and every token after the
 * commit carries the new weight version. Deltas are serialized by admin_mu.
 * With a delta key (--delta-key-file) the signature (delta_sign.h) is checked
 * first, before any byte of the body is parsed: unsigned or wrongly signed
 * -> 401 and nothing changes. Replays cannot move weights back: versions only
 * move forward (409).
 *
 * Not here: the delta format and apply (delta.h).
 */
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "delta.h"
#include "delta_sign.h"
#include "log.h"
#include "request_parse.h"
#include "server.h"

typedef struct Commit {
    DeltaPlan *plan;
    DeltaTarget *tgt;
    WeightVersion *wv;
    DeltaResult res;
} Commit;

static int commit_fn(void *ctx, Err *err) {
    Commit *c = ctx;
    return delta_commit(c->plan, c->tgt, c->wv, &c->res, err);
}

/* After commit patched a tensor's host BF16 master: re-quantize its touched
 * FP8/NVFP4 blocks, then refresh the device copy (GPU backends). */
int admin_touched(void *ctx, const char *name, void *data, Dtype dt, int64_t numel, const int64_t *idx,
                  int64_t n_idx, Err *err) {
    Server *s = ctx;
    int rc = delta_model_requant(s->model, name, data, dt, numel, idx, n_idx, err);
    if (rc == 0 && s->runner)
        rc = runner_weights_changed(s->runner, data, (size_t)numel * (size_t)dtype_size(dt), idx, n_idx,
                                    (int)dtype_size(dt), err);
    return rc;
}

DeltaTarget admin_delta_target(Server *s) {
    return (DeltaTarget){.lookup = delta_lookup_model, .ctx = s->model, .touched = admin_touched, .touched_ctx = s,
                         .n_threads = 4, .skip_verify_after = 0};
}

int admin_commit(Server *s, DeltaPlan *plan, DeltaTarget *tgt, int bump, DeltaResult *res, Err *err) {
    Commit c = {plan, tgt, s->wv, {0}};
    int rc = engine_run_exclusive(s->eng, commit_fn, &c, bump, err);
    if (rc < 0) return rc;
    *res = c.res;
    server_map_version(s, engine_weight_version(s->eng), s->wv->version);
    return 0;
}

/* Prepare while serving, commit between steps. Caller holds admin_mu. */
static int apply(Server *s, const uint8_t *buf, size_t n, DeltaResult *res, Err *err) {
    DeltaTarget tgt = admin_delta_target(s);
    DeltaPlan *plan = NULL;
    if (delta_prepare(&plan, buf, n, &tgt, s->wv, err) < 0) return -1;
    uint64_t before = s->wv->version;
    int rc = admin_commit(s, plan, &tgt, delta_plan_header(plan)->target_version != before, res, err);
    delta_plan_free(plan);
    if (rc < 0) return rc;
    if (!res->noop && s->wv->version != before)
        log_info("weights: version %llu -> %llu (%d tensors, %lld elements)", (unsigned long long)before,
                 (unsigned long long)s->wv->version, res->tensors_updated, (long long)res->elements_updated);
    return 0;
}

/* 401 in the OpenAI error shape, plus current_version like the other delta errors. */
static int refuse_unsigned(HttpReq *q, const Err *err) {
    Server *s = q->s;
    log_warn("refused a delta: %s", err->msg);
    json_t *j = http_error_json(401, NULL, err->msg);
    json_object_set_new(json_object_get(j, "error"), "code", json_string("invalid_delta_signature"));
    pthread_mutex_lock(&s->admin_mu);
    json_object_set_new(j, "current_version", json_integer((json_int_t)s->wv->version));
    pthread_mutex_unlock(&s->admin_mu);
    return http_send_json(q, 401, j);
}

int api_admin_delta(HttpReq *q, json_t *unused) {
    Server *s = q->s;
    Err err = {0};
    DeltaResult res = {0};
    if (s->cfg.delta_key) {
        const char *sig = MHD_lookup_connection_value(q->c, MHD_HEADER_KIND, DELTA_SIG_HEADER);
        if (delta_verify(s->cfg.delta_key, s->cfg.delta_key_len, (const uint8_t *)q->body.p, q->body.n, sig, &err) < 0)
            return refuse_unsigned(q, &err);
    }
    pthread_mutex_lock(&s->admin_mu);
    int rc = apply(s, (const uint8_t *)q->body.p, q->body.n, &res, &err);
    char *body = rc < 0 ? delta_error_json(&err, s->wv) : delta_result_json(&res);
    pthread_mutex_unlock(&s->admin_mu);
    int status = rc < 0 ? (err.code ? err.code : 500) : 200;
    int ret = http_send_text(q, status, "application/json", body, strlen(body));
    free(body);
    return ret;
}

int api_admin_weights(HttpReq *q, json_t *unused) {
    Server *s = q->s;
    pthread_mutex_lock(&s->admin_mu);
    char *body = weight_version_json(s->wv);
    pthread_mutex_unlock(&s->admin_mu);
    int ret = http_send_text(q, 200, "application/json", body, strlen(body));
    free(body);
    return ret;
}

void admin_apply_delta_file(Server *s, const char *path) {
    FILE *f = fopen(path, "rb");
    CHECK_PTR(f, "--delta %s: cannot open: %s", path, strerror(errno));
    CHECK(fseek(f, 0, SEEK_END) == 0, "--delta %s: cannot seek", path);
    long n = ftell(f);
    CHECK(n >= 0, "--delta %s: cannot size", path);
    rewind(f);
    uint8_t *buf = xmalloc((size_t)n + 1);
    CHECK(fread(buf, 1, (size_t)n, f) == (size_t)n, "--delta %s: short read", path);
    fclose(f);
    Err err = {0};
    if (s->cfg.delta_key) {
        char sig_path[4096], sig[256] = {0};
        snprintf(sig_path, sizeof sig_path, "%s.sig", path);
        FILE *g = fopen(sig_path, "rb");
        CHECK_PTR(g, "--delta %s: cannot open its signature %s (--delta-key-file requires signed deltas)\n"
                  "  fix: `trainer sign %s --key-file KEY` with the sampler's key", path, sig_path, path);
        size_t k = fread(sig, 1, sizeof sig - 1, g);
        fclose(g);
        sig[k] = 0;
        CHECK(delta_verify(s->cfg.delta_key, s->cfg.delta_key_len, buf, (size_t)n, sig, &err) == 0,
              "--delta %s: %s\n  fix: sign it with the key of --delta-key-file (`trainer sign`)", path, err.msg);
    }
    DeltaResult res;
    pthread_mutex_lock(&s->admin_mu);
    int rc = apply(s, buf, (size_t)n, &res, &err);
    pthread_mutex_unlock(&s->admin_mu);
    free(buf);
    CHECK(rc == 0, "--delta %s: %s\n  fix: pass the deltas in version order, made for this model", path, err.msg);
}

static json_t *pause_state(Server *s) {
    json_t *o = json_object();
    json_object_set_new(o, "is_paused", json_boolean(engine_is_paused(s->eng)));
    return o;
}

/* A boolean query argument: 1 / 0, or def when absent; -1 when unreadable. */
static int query_bool(HttpReq *q, const char *key, int def) {
    const char *v = MHD_lookup_connection_value(q->c, MHD_GET_ARGUMENT_KIND, key);
    if (!v) return def;
    if (!strcasecmp(v, "true") || !strcmp(v, "1")) return 1;
    if (!strcasecmp(v, "false") || !strcmp(v, "0")) return 0;
    return -1;
}

/* mode (abort | wait | keep, "in_place" = keep) and clear_cache (vLLM's
 * /pause: default true: the prefix cache is flushed once paused) as query
 * arguments or in a JSON body. */
int api_admin_pause(HttpReq *q, json_t *body) {
    Server *s = q->s;
    const char *m = MHD_lookup_connection_value(q->c, MHD_GET_ARGUMENT_KIND, "mode");
    json_t *bm = json_object_get(body, "mode");
    if (bm && !json_is_null(bm)) {
        if (!json_is_string(bm)) return http_send_error(q, 400, "mode", "mode: must be abort, wait or keep");
        m = json_string_value(bm);
    }
    PauseMode mode = PAUSE_ABORT;
    if (!m || !strcmp(m, "abort")) mode = PAUSE_ABORT;
    else if (!strcmp(m, "wait")) mode = PAUSE_WAIT;
    else if (!strcmp(m, "keep") || !strcmp(m, "in_place")) mode = PAUSE_KEEP;
    else return http_send_error(q, 400, "mode", "mode: must be abort, wait or keep");
    Err err = {0};
    int clear = query_bool(q, "clear_cache", 1);
    if (clear < 0) return http_send_error(q, 400, "clear_cache", "clear_cache: must be true or false");
    if (rp_bool(body, "clear_cache", &clear, &err) < 0) return http_send_err(q, &err);
    if (engine_pause(s->eng, mode, &err) < 0) return http_send_err(q, &err);
    if (clear && engine_flush_prefix_cache(s->eng, &err) < 0) return http_send_err(q, &err);
    return http_send_json(q, 200, pause_state(s));
}

int api_admin_resume(HttpReq *q, json_t *body) {
    engine_resume(q->s->eng);
    return http_send_json(q, 200, pause_state(q->s));
}

int api_admin_is_paused(HttpReq *q, json_t *body) { return http_send_json(q, 200, pause_state(q->s)); }

int api_admin_abort(HttpReq *q, json_t *body) {
    Server *s = q->s;
    json_t *rid = json_object_get(body, "rid");
    json_t *all = json_object_get(body, "abort_all");
    int n;
    if (json_is_true(all)) n = server_live_abort(s, NULL);
    else if (json_is_string(rid)) n = server_live_abort(s, json_string_value(rid));
    else return http_send_error(q, 400, "rid", "rid: give the response id to abort, or \"abort_all\": true");
    json_t *o = json_object();
    json_object_set_new(o, "aborted", json_integer(n));
    return http_send_json(q, 200, o);
}
