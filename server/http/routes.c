/*
 * routes.c - the route table (routes.h) and the dispatcher that reads it: for
 * each request the row of its path decides the body limit, then the auth
 * class (API key, admin token or none), then the row of its path and method
 * gets the body its class asks for (none, a JSON object, raw delta bytes).
 *
 * Order of the checks, the same for every route, all but the last two made
 * from the headers alone, before a byte of the body is read (routes_preflight):
 * no row for the path (404) -> auth (403 admin disabled / 401) -> the path
 * with another method (404 or 405) -> Content-Length over the row's limit
 * (413 at once when the client waits for "100 Continue"; else its body is
 * dropped as it arrives, nothing kept, and the 413 follows); then, once the body is in (routes_dispatch): over the limit
 * (chunked, 413) -> the body (400) -> the handler. Nothing of a body is kept
 * for a client that has not authenticated.
 * Area rows (handler NULL) make the auth of a whole prefix explicit: an
 * unknown /admin/... path needs the admin token before it learns it is a 404.
 *
 * Not here: the libmicrohttpd daemon and answers (http.c), the endpoints
 * (api_*.c, metrics.c).
 */
#define _GNU_SOURCE
#include "routes.h"

#include "json_scan.h"

#include <errno.h>
#include <limits.h>
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Rows match in order: exact rows before the prefix (area) rows they sit under. */
static const Route ROUTES[] = {
    /* method  path                        prefix handler               auth          body                dialect         other method */
    {"GET",  "/health",                    0, api_health,          AUTH_NONE,    BODY_NONE,          DIALECT_OPENAI, 404},
    {"GET",  "/metrics",                   0, api_metrics,         AUTH_NONE,    BODY_NONE,          DIALECT_OPENAI, 404},
    {"GET",  "/get_load",                  0, api_get_load,        AUTH_NONE,    BODY_NONE,          DIALECT_OPENAI, 404},
    /* the trainer's controls (api_admin.c, api_reload.c) */
    {"POST", "/admin/v1/weights/delta",    0, api_admin_delta,     AUTH_ADMIN,   BODY_DELTA,         DIALECT_OPENAI, 404},
    {"POST", "/admin/v1/lora",             0, api_lora_push,       AUTH_ADMIN,   BODY_DELTA,         DIALECT_OPENAI, 404},
    {"GET",  "/admin/v1/weights",          0, api_admin_weights,   AUTH_ADMIN,   BODY_NONE,          DIALECT_OPENAI, 404},
    {"POST", "/admin/v1/weights/reload",   0, api_admin_reload,    AUTH_ADMIN,   BODY_JSON,          DIALECT_OPENAI, 404},
    {"POST", "/admin/v1/fleet",            0, api_admin_fleet,     AUTH_ADMIN,   BODY_JSON,          DIALECT_OPENAI, 404},
    {"GET",  "/admin/v1/fleet",            0, api_admin_fleet,     AUTH_ADMIN,   BODY_NONE,          DIALECT_OPENAI, 404},
    {NULL,   "/admin/",                    1, NULL,                AUTH_ADMIN,   BODY_NONE,          DIALECT_OPENAI, 404},
    {"POST", "/pause",                     0, api_admin_pause,     AUTH_ADMIN,   BODY_JSON_OR_EMPTY, DIALECT_OPENAI, 404},
    {"POST", "/resume",                    0, api_admin_resume,    AUTH_ADMIN,   BODY_NONE,          DIALECT_OPENAI, 404},
    {"GET",  "/is_paused",                 0, api_admin_is_paused, AUTH_ADMIN,   BODY_NONE,          DIALECT_OPENAI, 404},
    {"POST", "/abort_request",             0, api_admin_abort,     AUTH_ADMIN,   BODY_JSON_OR_EMPTY, DIALECT_OPENAI, 404},
    /* vLLM's LoRA adapter controls (api_lora.c): vLLM's paths, so the /v1/ area's class before the
     * body (the admin token passes it too); the handler then requires the admin token (routes_admin_check) */
    {"POST", "/v1/load_lora_adapter",      0, api_lora_load,       AUTH_API_KEY, BODY_JSON,          DIALECT_OPENAI, 405},
    {"POST", "/v1/unload_lora_adapter",    0, api_lora_unload,     AUTH_API_KEY, BODY_JSON,          DIALECT_OPENAI, 405},
    /* the OpenAI API (api_tokenize.c, api_completions.c, api_chat.c) */
    {"GET",  "/v1/models",                 0, api_models,          AUTH_API_KEY, BODY_NONE,          DIALECT_OPENAI, 404},
    {"GET",  "/v1/models/",                1, api_models,          AUTH_API_KEY, BODY_NONE,          DIALECT_OPENAI, 404},
    {"POST", "/v1/completions",            0, api_completions,     AUTH_API_KEY, BODY_JSON,          DIALECT_OPENAI, 405},
    {"POST", "/v1/chat/completions",       0, api_chat,            AUTH_API_KEY, BODY_JSON,          DIALECT_OPENAI, 405},
    /* the agent dialects (api_responses.c, api_messages.c): chat's machinery, each API's own shapes */
    {"POST", "/v1/responses",              0, api_responses,       AUTH_API_KEY, BODY_JSON,          DIALECT_OPENAI, 405},
    {"GET",  "/v1/responses/",             1, api_responses_get,   AUTH_API_KEY, BODY_NONE,          DIALECT_OPENAI, 404},
    {"POST", "/v1/messages",               0, api_messages,        AUTH_API_KEY, BODY_JSON,          DIALECT_ANTHROPIC, 405},
    {"POST", "/v1/messages/count_tokens",  0, api_messages_count_tokens, AUTH_API_KEY, BODY_JSON,    DIALECT_ANTHROPIC, 405},
    {NULL,   "/v1/",                       1, NULL,                AUTH_API_KEY, BODY_NONE,          DIALECT_OPENAI, 404},
    {"POST", "/tokenize",                  0, api_tokenize,        AUTH_API_KEY, BODY_JSON,          DIALECT_OPENAI, 405},
    {"POST", "/detokenize",                0, api_detokenize,      AUTH_API_KEY, BODY_JSON,          DIALECT_OPENAI, 405},
    /* prime-rl's weight controls (api_control.c) */
    {"POST", "/update_weights",            0, api_update_weights,  AUTH_ADMIN,   BODY_JSON,          DIALECT_OPENAI, 404},
    {"POST", "/update_weight_version",     0, api_update_weight_version, AUTH_ADMIN, BODY_JSON,      DIALECT_OPENAI, 404},
    {"GET",  "/weight_info",               0, api_weight_info,     AUTH_ADMIN,   BODY_NONE,          DIALECT_OPENAI, 404},
    {"GET",  "/liveness",                  0, api_liveness,        AUTH_ADMIN,   BODY_NONE,          DIALECT_OPENAI, 404},
    /* vLLM / prime-rl token-in token-out (api_vllm_generate.c) */
    {"POST", "/inference/v1/generate",     0, api_vllm_generate,   AUTH_API_KEY, BODY_JSON,          DIALECT_OPENAI, 405},
    /* SGLang's native routes (api_sglang.c) */
    {"POST", "/generate",                  0, api_sgl_generate,    AUTH_API_KEY, BODY_JSON,          DIALECT_SGLANG, 405},
    {"GET",  "/get_model_info",            0, api_sgl_model_info,  AUTH_API_KEY, BODY_NONE,          DIALECT_SGLANG, 405},
    {"GET",  "/get_server_info",           0, api_sgl_server_info, AUTH_API_KEY, BODY_NONE,          DIALECT_SGLANG, 405},
    {"GET",  "/health_generate",           0, api_sgl_health_generate, AUTH_API_KEY, BODY_NONE,      DIALECT_SGLANG, 405},
    {"POST", "/update_weights_from_disk",  0, api_sgl_update_weights_from_disk, AUTH_ADMIN, BODY_JSON, DIALECT_SGLANG, 405},
    {"POST", "/pause_generation",          0, api_sgl_pause,       AUTH_ADMIN,   BODY_JSON_OR_EMPTY, DIALECT_SGLANG, 405},
    {"POST", "/continue_generation",       0, api_sgl_continue,    AUTH_ADMIN,   BODY_JSON_OR_EMPTY, DIALECT_SGLANG, 405},
    {"POST", "/flush_cache",               0, api_sgl_flush_cache, AUTH_ADMIN,   BODY_JSON_OR_EMPTY, DIALECT_SGLANG, 405},
    {"GET",  "/flush_cache",               0, api_sgl_flush_cache, AUTH_ADMIN,   BODY_NONE,          DIALECT_SGLANG, 405},
    {"GET",  "/tokenizer_info",            0, api_tokenizer_info,  AUTH_API_KEY, BODY_NONE,          DIALECT_OPENAI, 404},
};
#define N_ROUTES ((int)(sizeof ROUTES / sizeof ROUTES[0]))

const Route *routes_table(int *n) {
    *n = N_ROUTES;
    return ROUTES;
}

static int path_matches(const Route *r, const char *path) {
    return r->prefix ? !strncmp(path, r->path, strlen(r->path)) : !strcmp(path, r->path);
}

const Route *routes_for_path(const char *path) {
    for (int i = 0; i < N_ROUTES; i++)
        if (path_matches(&ROUTES[i], path)) return &ROUTES[i];
    return NULL;
}

size_t routes_body_limit(const Route *r, const ServerConfig *c) {
    return r && r->body == BODY_DELTA ? c->max_delta_bytes : c->max_body_bytes;
}

int routes_spools(const Route *r) { return r->body == BODY_DELTA; }

/* The row for path and method among those whose path matches, or NULL. */
static const Route *for_method(const char *path, const char *method) {
    for (int i = 0; i < N_ROUTES; i++) {
        const Route *r = &ROUTES[i];
        if (r->handler && r->method && !strcmp(r->method, method) && path_matches(r, path)) return r;
    }
    return NULL;
}

static const char *bearer(HttpReq *q) {
    const char *h = MHD_lookup_connection_value(q->c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return NULL;
    h += 7;
    while (*h == ' ') h++;
    return h;
}

static int authorized(HttpReq *q, const char *secret) {
    const char *b = bearer(q);
    return b && secret_equal(secret, b);
}

/* The API key as Anthropic's clients send it (x-api-key), for the API-key routes. */
static int authorized_x_api_key(HttpReq *q, const char *secret) {
    const char *k = MHD_lookup_connection_value(q->c, MHD_HEADER_KIND, "x-api-key");
    return k && secret_equal(secret, k);
}

/* Refuse (answer and return 1) unless q may use a route of class a. */
static int refused(HttpReq *q, RouteAuth a, int *ret) {
    const ServerConfig *c = &q->s->cfg;
    switch (a) {
    case AUTH_NONE: return 0;
    case AUTH_ADMIN:
        if (!c->admin_token)
            *ret = http_send_error(q, 403, NULL, "admin endpoints are disabled: start the server with --admin-token");
        else if (!authorized(q, c->admin_token))
            *ret = http_send_error(q, 401, NULL, "missing or wrong admin token (Authorization: Bearer <admin token>)");
        else return 0;
        return 1;
    case AUTH_API_KEY: /* the admin token is trusted with everything the API key opens */
        if (!c->api_key || authorized(q, c->api_key) || authorized_x_api_key(q, c->api_key) ||
            (c->admin_token && authorized(q, c->admin_token)))
            return 0;
        *ret = http_send_error(q, 401, NULL, "Incorrect API key provided (Authorization: Bearer <api key>, or "
                               "x-api-key: <api key>)");
        return 1;
    }
    return 0;
}

int routes_admin_check(HttpReq *q, int *ret) { return refused(q, AUTH_ADMIN, ret); }

/* The JSON object of the body, or NULL with *sent set when a 400 went out. */
static json_t *parse_body(HttpReq *q, int *sent) {
    json_error_t je;
    *sent = 0;
    if (q->body.n == 0) {
        *sent = 1;
        http_send_error(q, 400, NULL, "the request body is empty: send a JSON object");
        return NULL;
    }
    JsonScan sc;
    int bad = json_scan(q->body.p, q->body.n, &sc);
    if (bad) {
        *sent = 1;
        if (bad == 413)
            http_send_error(q, 413, NULL, "the JSON body has more than %u values (the server's limit per request "
                            "body): send fewer", JSON_SCAN_MAX_VALUES);
        else
            http_send_error(q, 400, NULL, "the JSON body nests deeper than %d levels (the server's limit)",
                            JSON_SCAN_MAX_DEPTH);
        return NULL;
    }
    json_t *j = json_loadb(q->body.p, q->body.n, 0, &je);
    if (!j) {
        *sent = 1;
        http_send_error(q, 400, NULL, "malformed JSON at line %d column %d: %s", je.line, je.column, je.text);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        *sent = 1;
        http_send_error(q, 400, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return j;
}

/* The Content-Length header's value; -1 when absent (chunked) or unreadable
 * (libmicrohttpd refuses a malformed one with 400 before our first call). */
static long long content_length(HttpReq *q) {
    const char *h = MHD_lookup_connection_value(q->c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (!h || !*h) return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(h, &end, 10);
    if (*end || errno || v > (unsigned long long)LLONG_MAX) return LLONG_MAX;
    return (long long)v;
}

int routes_preflight(HttpReq *q, int *ret) {
    const Route *area = q->route;
    if (!area) {
        *ret = http_send_error_code(q, 404, NULL, "route_not_found", "no route %s %s: see the README for the "
                                    "endpoints", q->method, q->url);
        return 1;
    }
    if (refused(q, area->auth, ret)) return 1;
    const Route *r = for_method(q->url, q->method);
    if (!r) {
        if (area->handler && area->other_method == 405)
            *ret = http_send_error_code(q, 405, NULL, "method_not_allowed", "%s needs %s", q->url, area->method);
        else
            *ret = http_send_error_code(q, 404, NULL, "route_not_found", "no route %s %s: see the README for the "
                                        "endpoints", q->method, q->url);
        return 1;
    }
    q->row = r;
    q->body_limit = routes_body_limit(r, &q->s->cfg);
    long long n = content_length(q);
    const char *expect = MHD_lookup_connection_value(q->c, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
    if (n >= 0 && (unsigned long long)n > q->body_limit && !(expect && !strcasecmp(expect, "100-continue"))) {
        /* an authenticated client already sending: its body is read and dropped as it comes (nothing is
         * kept), so it reads the 413 instead of a reset mid-upload */
        q->too_large = 1;
    } else if (n >= 0 && (unsigned long long)n > q->body_limit) {
        *ret = http_send_error(q, 413, NULL, "request body of %lld bytes is larger than the limit of %zu bytes "
                               "(%s)", n, q->body_limit, r->body == BODY_DELTA ? "--max-delta-bytes"
                                                                                : "--max-body-bytes");
        return 1;
    }
    return 0;
}

int routes_dispatch(HttpReq *q) {
    const Route *r = q->row;
    ASSERT(r != NULL, "routes_preflight answers every request without a row");
    if (q->too_large)
        return http_send_error(q, 413, NULL, "request body larger than the limit of %zu bytes (%s)", q->body_limit,
                               r->body == BODY_DELTA ? "--max-delta-bytes" : "--max-body-bytes");
    json_t *body = NULL;
    if (r->body == BODY_JSON || (r->body == BODY_JSON_OR_EMPTY && q->body.n)) {
        int sent;
        if (!(body = parse_body(q, &sent))) return sent ? MHD_YES : MHD_NO;
    } else if (r->body == BODY_JSON_OR_EMPTY) {
        body = json_object();
    }
    int ret = r->handler(q, body);
    json_decref(body);
    return ret;
}
