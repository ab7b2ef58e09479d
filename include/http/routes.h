/*
 * routes.h - the HTTP route table: one row per route (method, path or path
 * prefix, handler, auth class, body class, error dialect). The dispatcher, the
 * auth check and the body-size limit all read the row; nothing else lists
 * routes. A new endpoint = its handler (api_*.c), its declaration (server.h),
 * a row in routes.c and a test.
 *
 * Not here: the libmicrohttpd layer (http.c), what endpoints do (api_*.c).
 */
#ifndef SAMPLER_ROUTES_H
#define SAMPLER_ROUTES_H

#include <stddef.h>

#include "server.h"

typedef enum {
    AUTH_NONE,    /* anyone (probes: /health, /metrics) */
    AUTH_API_KEY, /* --api-key when one is set (Authorization: Bearer, or x-api-key as Anthropic's clients
                     send it), else anyone -> 401 */
    AUTH_ADMIN,   /* Bearer --admin-token; without one the route is disabled -> 403; wrong -> 401 */
} RouteAuth;

typedef enum {
    BODY_NONE,          /* the handler reads no body (one is read up to --max-body-bytes and ignored) */
    BODY_JSON,          /* a JSON object, up to --max-body-bytes; empty or not an object -> 400 */
    BODY_JSON_OR_EMPTY, /* the same, but an empty body is {} */
    BODY_DELTA,         /* raw bytes in q->body, up to --max-delta-bytes: spooled to an unlinked file in
                           $TMPDIR (default /tmp) as it arrives, then mapped read-only */
} RouteBody;

typedef enum {
    DIALECT_OPENAI,    /* errors {"error": {"message", "type", "param", "code"}} (http_error_json); vLLM's too */
    DIALECT_SGLANG,    /* errors {"error": {"message"}} (SGLang's), the dispatcher's as the handlers' */
    DIALECT_ANTHROPIC, /* errors {"type": "error", "error": {"type", "message"}} (http_error_json_anthropic) */
} RouteDialect;

typedef int (*RouteHandler)(HttpReq *q, json_t *body);

struct Route {
    const char *method;   /* "GET" / "POST"; NULL: any (an area row, handler NULL) */
    const char *path;     /* exact path, or a prefix when it ends in '/' and prefix is set */
    int prefix;           /* 1: path is a prefix ("/admin/": everything below it) */
    RouteHandler handler; /* NULL: an area row: auth applies to every path below it, then 404 */
    RouteAuth auth;
    RouteBody body;
    RouteDialect dialect;
    int other_method;     /* the status for this path with another method: 405 ("needs POST") or 404 */
};

/* The table, in match order; *n rows. */
const Route *routes_table(int *n);
/* The first row whose path matches (any method), or NULL: it sets the auth
 * class and the body limit of the request. */
const Route *routes_for_path(const char *path);
/* Body bytes a request to row r may send (r NULL: --max-body-bytes). */
size_t routes_body_limit(const Route *r, const ServerConfig *c);
/* 1: row r's body goes to an unlinked temporary file, mapped read-only for the
 * handler (BODY_DELTA), not to the heap. */
int routes_spools(const Route *r);
/* The headers of q are in, no body byte yet: refuse what the headers already
 * decide (no route 404, auth 401/403, method 404/405, Content-Length over the
 * row's limit 413): answer, set *ret (MHD result) and return 1. Else set
 * q->row and q->body_limit and return 0. */
int routes_preflight(HttpReq *q, int *ret);
/* Answer q once its body is in (q->row set by routes_preflight): over the
 * limit (413), the body its class asks for (400), the handler. Returns the
 * MHD result. */
int routes_dispatch(HttpReq *q);
/* For a handler of an API-key route that is an admin control (vLLM's LoRA
 * routes under /v1/): 1 and the 403/401 answered (*ret its MHD result)
 * unless the request carries the admin token; 0 to go on. */
int routes_admin_check(HttpReq *q, int *ret);

#endif
