/*
 * api_control.c - prime-rl's weight controls on a vLLM server, behind the
 * admin token (prime-rl src/prime_rl/inference/vllm/server.py and
 * weight_version.py; the pause/resume routes are api_admin.c's):
 *   POST /update_weights {"weight_dir", "version"?, "skip_prefix_cache_reset"?}
 *        a full, all-or-nothing reload of the checkpoint directory, confined
 *        to --reload-root exactly as /admin/v1/weights/reload (admin_reload);
 *        at "version" (or "weight_version"), else the current version + 1.
 *        -> {"status": "ok", "weight_version"}. The prefix cache is always
 *        invalidated (its K/V belong to the old weights), whatever
 *        skip_prefix_cache_reset says.
 *   POST /update_weight_version {"version"}
 *        the sampler's versions name the weights they were computed with:
 *        the label moves only with the weights (deltas, reloads), so this
 *        confirms the current version (200) and refuses any other (409).
 *   GET  /weight_info   {"weight_version", "model_fingerprint", "model_dir", "model"}
 *   GET  /liveness      {"status": "ok"} while the server serves
 * Errors are vLLM's (the OpenAI shape). Serialized with deltas by admin_mu.
 *
 * Not here: the reload itself (api_reload.c), deltas (api_admin.c).
 */
#include <stdio.h>
#include <string.h>

#include "delta.h"
#include "request_parse.h"
#include "server.h"

static int version_field(json_t *body, uint64_t *v, int *set, Err *err) {
    const char *keys[2] = {"version", "weight_version"};
    *set = 0;
    for (int i = 0; i < 2; i++) {
        json_t *j = json_object_get(body, keys[i]);
        if (!j || json_is_null(j)) continue;
        ENSURE(err, json_is_integer(j) && json_integer_value(j) >= 0, 400, "%s: must be an integer >= 0", keys[i]);
        ENSURE(err, !*set || *v == (uint64_t)json_integer_value(j), 400, "version and weight_version differ");
        *v = (uint64_t)json_integer_value(j);
        *set = 1;
    }
    return 0;
}

int api_update_weights(HttpReq *q, json_t *body) {
    Server *s = q->s;
    Err err = {0};
    json_t *dir = json_object_get(body, "weight_dir");
    if (!json_is_string(dir) || !json_string_length(dir))
        return http_send_error(q, 400, "weight_dir", "weight_dir: is required: the checkpoint directory to load");
    uint64_t v = 0;
    int set, skip = 0; /* accepted: the reload bumps the version, which invalidates the cache anyway */
    if (version_field(body, &v, &set, &err) < 0 || rp_bool(body, "skip_prefix_cache_reset", &skip, &err) < 0)
        return http_send_err(q, &err);
    DeltaResult res = {0};
    pthread_mutex_lock(&s->admin_mu);
    if (!set) v = s->wv->version + 1;
    int rc = admin_reload(s, json_string_value(dir), v, &res, &err);
    uint64_t now = s->wv->version;
    pthread_mutex_unlock(&s->admin_mu);
    if (rc < 0) return http_send_err(q, &err);
    json_t *o = json_object();
    json_object_set_new(o, "status", json_string("ok"));
    json_object_set_new(o, "weight_version", json_integer((json_int_t)now));
    json_object_set_new(o, "tensors_updated", json_integer(res.tensors_updated));
    return http_send_json(q, 200, o);
}

int api_update_weight_version(HttpReq *q, json_t *body) {
    Server *s = q->s;
    Err err = {0};
    uint64_t v = 0;
    int set;
    if (version_field(body, &v, &set, &err) < 0) return http_send_err(q, &err);
    if (!set) return http_send_error(q, 400, "version", "version: is required");
    pthread_mutex_lock(&s->admin_mu);
    uint64_t now = s->wv->version;
    pthread_mutex_unlock(&s->admin_mu);
    if (v != now)
        return http_send_error(q, 409, "version", "version: the served weights are version %llu; a version moves only "
                               "with the weights (POST /update_weights, /admin/v1/weights/delta), never as a label "
                               "alone", (unsigned long long)now);
    json_t *o = json_object();
    json_object_set_new(o, "status", json_string("ok"));
    json_object_set_new(o, "weight_version", json_integer((json_int_t)now));
    return http_send_json(q, 200, o);
}

int api_weight_info(HttpReq *q, json_t *body) {
    (void)body;
    Server *s = q->s;
    char fp[17];
    pthread_mutex_lock(&s->admin_mu);
    uint64_t v = s->wv->version;
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)s->wv->fingerprint);
    pthread_mutex_unlock(&s->admin_mu);
    json_t *o = json_object();
    json_object_set_new(o, "weight_version", json_integer((json_int_t)v));
    json_object_set_new(o, "model_fingerprint", json_string(fp));
    json_object_set_new(o, "model_dir", json_string(s->model_dir)); /* the start-up checkpoint */
    json_object_set_new(o, "model", json_string(s->model_name));
    return http_send_json(q, 200, o);
}

int api_liveness(HttpReq *q, json_t *body) {
    (void)body;
    int down = atomic_load(&q->s->shutting_down);
    json_t *o = json_object();
    json_object_set_new(o, "status", json_string(down ? "shutting_down" : "ok"));
    return http_send_json(q, down ? 503 : 200, o);
}
