/*
 * http_guard.c - deadlines and the connection cap of the HTTP layer, which
 * libmicrohttpd 0.9.x does not have: its idle timeout restarts on every byte,
 * so a client trickling one header byte at a time held a connection forever,
 * and its connection limit leaves the excess waiting in the listen backlog.
 *
 *   header deadline  request line + headers within --header-timeout seconds
 *                    of the connection's start (or of the previous answer on
 *                    a kept-alive connection, then at least
 *                    --connection-timeout);
 *   body deadline    the announced body (or the route's limit when chunked)
 *                    within --header-timeout + bytes / 64 KiB/s;
 *   the cap          at --max-connections, a new connection evicts the oldest
 *                    one still sending its headers (it has not authenticated)
 *                    or, when none is, is closed at once.
 * A watchdog thread checks the deadlines four times a second and shuts a late
 * socket down (shutdown(SHUT_RDWR)): libmicrohttpd's thread sees the close and
 * frees the connection. Memory: one HttpConn (~64 bytes) per connection.
 *
 * Not here: the daemon and its callbacks (http.c).
 */
#define _GNU_SOURCE
#include "server.h"

#include <microhttpd.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define GUARD_MIN_BODY_RATE (64u << 10) /* bytes per second a body may not fall below, on average */
#define GUARD_CAP_SLACK 64               /* libmicrohttpd's own cap: ours plus the evicted still closing */

typedef enum { PHASE_HEADERS, PHASE_BODY, PHASE_SERVING } ConnPhase;

typedef struct HttpConn {
    int fd;
    ConnPhase phase;
    double deadline;  /* monotonic seconds; 0: none (serving, or already shut down) */
    double started;   /* when this phase began */
    struct HttpConn *next, *prev;
} HttpConn;

struct HttpGuard {
    pthread_mutex_t mu;
    HttpConn *conns;
    int n;
    int cap;             /* --max-connections */
    double header_s;     /* --header-timeout */
    double idle_s;       /* --connection-timeout */
    pthread_t th;
    pthread_cond_t wake; /* CLOCK_MONOTONIC; signalled by http_guard_free: shutdown waits no tick */
    int stop;
};

static double mono(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void cut(HttpConn *c) {
    shutdown(c->fd, SHUT_RDWR);
    c->deadline = 0;
    c->phase = PHASE_SERVING; /* never evicted twice */
}

/* Every 250 ms: cut the connections past their deadline. */
static void *watchdog(void *arg) {
    HttpGuard *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        t.tv_nsec += 250 * 1000 * 1000;
        if (t.tv_nsec >= 1000000000) { t.tv_sec++; t.tv_nsec -= 1000000000; }
        while (!g->stop && pthread_cond_timedwait(&g->wake, &g->mu, &t) == 0) {} /* to the tick, or stop */
        if (g->stop) break;
        double now = mono();
        for (HttpConn *c = g->conns; c; c = c->next)
            if (c->deadline > 0 && now > c->deadline) cut(c);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

HttpGuard *http_guard_create(const ServerConfig *cfg) {
    HttpGuard *g = xcalloc(1, sizeof *g);
    pthread_mutex_init(&g->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g->wake, &ca);
    pthread_condattr_destroy(&ca);
    g->cap = cfg->max_connections;
    g->header_s = cfg->header_timeout_s;
    g->idle_s = cfg->connection_timeout_s;
    CHECK(pthread_create(&g->th, NULL, watchdog, g) == 0, "cannot start the HTTP watchdog thread");
    return g;
}

void http_guard_free(HttpGuard *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    g->stop = 1;
    pthread_cond_signal(&g->wake);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->th, NULL);
    while (g->conns) {
        HttpConn *c = g->conns;
        g->conns = c->next;
        free(c);
    }
    pthread_cond_destroy(&g->wake);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

unsigned http_guard_mhd_limit(const HttpGuard *g) { return (unsigned)g->cap + GUARD_CAP_SLACK; }

int http_guard_accept(HttpGuard *g) {
    int ok = 1;
    pthread_mutex_lock(&g->mu);
    if (g->n >= g->cap) {
        HttpConn *old = NULL;
        for (HttpConn *c = g->conns; c; c = c->next)
            if (c->phase == PHASE_HEADERS && c->deadline > 0 && (!old || c->started < old->started)) old = c;
        if (old && g->n < g->cap + GUARD_CAP_SLACK / 2) cut(old); /* it closes on its own thread */
        else ok = 0;
    }
    pthread_mutex_unlock(&g->mu);
    return ok;
}

void *http_guard_started(HttpGuard *g, int fd) {
    HttpConn *c = xcalloc(1, sizeof *c);
    c->fd = fd;
    c->phase = PHASE_HEADERS;
    c->started = mono();
    c->deadline = c->started + g->header_s;
    pthread_mutex_lock(&g->mu);
    c->next = g->conns;
    if (g->conns) g->conns->prev = c;
    g->conns = c;
    g->n++;
    pthread_mutex_unlock(&g->mu);
    return c;
}

void http_guard_closed(HttpGuard *g, void *conn) {
    HttpConn *c = conn;
    if (!c) return;
    pthread_mutex_lock(&g->mu);
    if (c->prev) c->prev->next = c->next;
    else g->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    g->n--;
    pthread_mutex_unlock(&g->mu);
    free(c);
}

void http_guard_phase(HttpGuard *g, void *conn, int phase, size_t body_bytes) {
    HttpConn *c = conn;
    if (!c) return;
    pthread_mutex_lock(&g->mu);
    if (c->deadline > 0 || c->phase != PHASE_SERVING) { /* not cut */
        double now = mono();
        c->phase = (ConnPhase)phase;
        c->started = now;
        switch (c->phase) {
        case PHASE_HEADERS: /* the next request on a kept-alive connection */
            c->deadline = now + (g->idle_s > g->header_s ? g->idle_s : g->header_s);
            break;
        case PHASE_BODY: c->deadline = now + g->header_s + (double)body_bytes / GUARD_MIN_BODY_RATE; break;
        case PHASE_SERVING: c->deadline = 0; break;
        }
    }
    pthread_mutex_unlock(&g->mu);
}
