/*
 * test_routes.c - the route table's invariants (routes.h), which the
 * dispatcher relies on, and the lookups it makes: every path's row sets its
 * auth class and body limit; no row is shadowed by an earlier one; rows
 * that share a path share an auth class and a body class (auth and the limit
 * are decided by the first row of the path, before the method is known);
 * area rows (no handler) are prefixes that cover the routes of their class.
 * The answers themselves (statuses, messages) are tested over HTTP in
 * tests/py (test_server_errors.py, test_server_admin.py) and by fuzz_http.
 */
#include <string.h>

#include "routes.h"
#include "test.h"

/* 1 when row a matches every path row b matches (b can never be reached after a). */
static int covers(const Route *a, const Route *b) {
    if (a->prefix) return !strncmp(b->path, a->path, strlen(a->path));
    return !b->prefix && !strcmp(a->path, b->path);
}

int main(void) {
    int n;
    const Route *r = routes_table(&n);
    T_ASSERT(n > 10, "%d rows", n);
    ServerConfig c;
    server_config_default(&c);

    for (int i = 0; i < n; i++) {
        const Route *a = &r[i];
        T_ASSERT(a->path && a->path[0] == '/', "row %d: path", i);
        T_ASSERT(!a->prefix || a->path[strlen(a->path) - 1] == '/', "%s: a prefix ends in '/'", a->path);
        T_ASSERT(a->other_method == 404 || a->other_method == 405, "%s: other_method %d", a->path, a->other_method);
        if (!a->handler) {
            T_ASSERT(a->prefix && !a->method && a->body == BODY_NONE, "%s: an area row is a prefix for any method",
                     a->path);
            T_ASSERT(a->auth != AUTH_NONE, "%s: an area row exists to state an auth class", a->path);
        } else {
            T_ASSERT(a->method && (!strcmp(a->method, "GET") || !strcmp(a->method, "POST")), "%s: method", a->path);
            T_ASSERT(strcmp(a->method, "GET") || a->body == BODY_NONE, "%s: a GET route reads no body", a->path);
        }
        const Route *f = routes_for_path(a->path);
        T_ASSERT(f != NULL, "%s: found", a->path);
        /* the first row of an exact route's path is a route of that path (an area row before it would
         * turn its 405 into a 404) */
        if (f && a->handler && !a->prefix)
            T_ASSERT(f->handler && !f->prefix && !strcmp(f->path, a->path), "%s: its first row is %s", a->path,
                     f->path);
        for (int j = 0; j < i; j++) {
            const Route *b = &r[j];
            /* an earlier row that takes every path of a, for a's method, makes a dead */
            int same_method = !b->method || !a->method || !strcmp(a->method, b->method);
            T_ASSERT(!(b->handler && covers(b, a) && same_method), "%s %s is shadowed by %s", a->method, a->path,
                     b->path);
            if (covers(b, a) || covers(a, b)) {
                T_ASSERT(a->auth == b->auth, "%s and %s share paths but not an auth class", a->path, b->path);
                if (a->handler && b->handler)
                    T_ASSERT(routes_body_limit(a, &c) == routes_body_limit(b, &c),
                             "%s and %s share paths but not a body limit", a->path, b->path);
            }
        }
    }

    /* the lookups the dispatcher and the body reader make */
    const Route *d = routes_for_path("/admin/v1/weights/delta");
    T_ASSERT(d && d->body == BODY_DELTA && d->auth == AUTH_ADMIN, "delta row");
    T_ASSERT(routes_body_limit(d, &c) == c.max_delta_bytes, "the delta route gets --max-delta-bytes");
    T_ASSERT(routes_body_limit(routes_for_path("/v1/completions"), &c) == c.max_body_bytes, "JSON limit");
    T_ASSERT(routes_body_limit(NULL, &c) == c.max_body_bytes, "no route: --max-body-bytes");
    T_ASSERT(routes_for_path("/nope") == NULL && routes_for_path("/v1") == NULL && routes_for_path("/admin") == NULL,
             "unknown paths have no row");
    const Route *u = routes_for_path("/admin/unknown");
    T_ASSERT(u && !u->handler && u->auth == AUTH_ADMIN, "unknown /admin/ paths need the admin token");
    u = routes_for_path("/v1/unknown");
    T_ASSERT(u && !u->handler && u->auth == AUTH_API_KEY, "unknown /v1/ paths need the API key");
    u = routes_for_path("/v1/models/tiny-qwen3");
    T_ASSERT(u && u->handler == api_models, "/v1/models/ID");
    T_ASSERT(routes_for_path("/health")->auth == AUTH_NONE && routes_for_path("/metrics")->auth == AUTH_NONE,
             "probes need no auth");
    const char *admin[] = {"/pause", "/resume", "/is_paused", "/abort_request", "/admin/v1/weights",
                           "/admin/v1/weights/reload"};
    for (size_t i = 0; i < sizeof admin / sizeof admin[0]; i++)
        T_ASSERT(routes_for_path(admin[i])->auth == AUTH_ADMIN, "%s is an admin route", admin[i]);
    const char *api[] = {"/v1/models", "/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"};
    for (size_t i = 0; i < sizeof api / sizeof api[0]; i++)
        T_ASSERT(routes_for_path(api[i])->auth == AUTH_API_KEY, "%s needs the API key", api[i]);
    return T_DONE();
}
