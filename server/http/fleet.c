/*
 * fleet.c - readiness of a replica in a fleet of samplers behind a router
 * (docs/fleet.md): GET /health answers 200 only while the server should take
 * traffic, and POST /admin/v1/fleet {"version": N} is how a trainer tells a
 * replica the version the fleet serves.
 *
 * Ready = not shutting down and serving a version >= the fleet's. A replica
 * is not listening while it loads, so routers see it down then; a replica
 * that is behind (restarted from an older checkpoint, or missed deltas)
 * answers 503 on /health from the moment the trainer announces a newer
 * version until the deltas (or a full reload) that bring it there are in, so
 * routers route around it meanwhile. With --fleet a replica starts not
 * ready and stays so until a trainer has announced the fleet's version: a
 * restarted replica never serves its stale start-up weights as if current.
 * Pausing does not make a replica unready (a pause is the trainer's own
 * short stop); liveness is "the process answers HTTP at all" (/metrics).
 *
 * Not here: catching up itself (the trainer sends the missing deltas:
 * trainer/push.c), the delta endpoint (api_admin.c).
 */
#include <inttypes.h>
#include <stdio.h>

#include "server.h"

static uint64_t serving(Server *s) { return server_weight_version(s, engine_weight_version(s->eng)); }

int fleet_ready(Server *s, char *why, size_t cap) {
    if (atomic_load(&s->shutting_down)) {
        if (why) snprintf(why, cap, "shutting down");
        return 0;
    }
    uint64_t f = atomic_load(&s->fleet_version), v = serving(s);
    if (f == FLEET_UNKNOWN) {
        if (why) snprintf(why, cap, "not ready: --fleet and no trainer has announced the fleet's version yet "
                          "(serving version %" PRIu64 "; `trainer push` announces it)", v);
        return 0;
    }
    if (v < f) {
        if (why) snprintf(why, cap, "not ready: catching up (serving version %" PRIu64 ", the fleet is at %" PRIu64 ")",
                          v, f);
        return 0;
    }
    return 1;
}

static json_t *state(Server *s) {
    uint64_t f = atomic_load(&s->fleet_version);
    json_t *o = json_object();
    json_object_set_new(o, "version", json_integer((json_int_t)serving(s)));
    json_object_set_new(o, "fleet_version", f == FLEET_UNKNOWN ? json_null() : json_integer((json_int_t)f));
    json_object_set_new(o, "ready", json_boolean(fleet_ready(s, NULL, 0)));
    return o;
}

int api_admin_fleet(HttpReq *q, json_t *body) {
    Server *s = q->s;
    if (body) {
        json_t *v = json_object_get(body, "version");
        if (!json_is_integer(v) || json_integer_value(v) < 0 || (uint64_t)json_integer_value(v) > (1ull << 62))
            return http_send_error(q, 400, "version", "version: the fleet's weight version, an integer in [0, 2^62]");
        atomic_store(&s->fleet_version, (uint64_t)json_integer_value(v));
    }
    return http_send_json(q, 200, state(s));
}
