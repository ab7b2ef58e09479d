/*
 * http.c - the libmicrohttpd layer of the server (server.h): the daemon (one
 * thread per connection), reading request bodies up to the route's limit,
 * JSON and OpenAI-error answers, streamed responses and client-disconnect
 * detection (a reset or failed write, never a half-close). HTTPS through
 * libmicrohttpd's GnuTLS support (--tls-cert / --tls-key). The route, auth and
 * Content-Length are decided on the first call, before any body byte is read
 * (routes_preflight); delta bodies are spooled to an unlinked file; header
 * memory, idle time, header and body deadlines and the connection count are
 * bounded (http_guard.c) so slow or greedy clients cannot hold the server.
 *
 * Not here: which routes exist, their auth and body classes (routes.c), what
 * each endpoint does (api_*.c), the Server object (server.c).
 */
#define _GNU_SOURCE
#include "server.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "routes.h"

/* ---- answers ---- */
static int status_slot(int status) {
    switch (status) {
    case 200: return 0; case 400: return 1; case 401: return 2; case 403: return 3; case 404: return 4;
    case 409: return 5; case 413: return 6; case 422: return 7; case 429: case 503: return 8; case 500: return 9;
    default: return -1;
    }
}

static void count_status(Server *s, int status) {
    int k = status_slot(status);
    if (k >= 0) atomic_fetch_add(&s->metrics.http_by_status[k], 1);
    else atomic_fetch_add(&s->metrics.http_other, 1);
}

/* The connection this thread serves (libmicrohttpd runs one thread per
 * connection: a handler and its stream's fill run on it), for http_fd_gone. */
static _Thread_local struct {
    int fd;       /* its socket; -1: none yet */
    int answered; /* a response was queued: bytes of it may be on the wire */
    int probed;   /* the half-close probe (an interim 100 Continue) went out */
} conn_tl = { -1, 0, 0 };

static int queue(HttpReq *q, int status, struct MHD_Response *r) {
    q->status = status;
    q->answered = 1;
    conn_tl.answered = 1;
    if (status == 503 || status == 429) MHD_add_response_header(r, "Retry-After", "1");
    count_status(q->s, status);
    int ret = MHD_queue_response(q->c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

int http_send_text(HttpReq *q, int status, const char *ctype, const char *body, size_t n) {
    struct MHD_Response *r = MHD_create_response_from_buffer(n, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    return queue(q, status, r);
}

int http_send_json(HttpReq *q, int status, json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY | JSON_REAL_PRECISION(9));
    json_decref(j);
    if (!s && status != 503) /* out of memory serialising: the small error body may still fit */
        return http_send_json(q, 503, http_error_json(503, NULL, "out of memory building the response; retry later, "
                                                      "or lower n, max_tokens, logprobs or the masks asked for"));
    if (!s) return http_send_text(q, 503, "text/plain", "out of memory\n", 14);
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
    if (!r) { free(s); return MHD_NO; }
    MHD_add_response_header(r, "Content-Type", "application/json");
    return queue(q, status, r);
}

static void error_kind(int status, const char **type, const char **code) {
    *code = NULL;
    switch (status) {
    case 401: *type = "authentication_error"; *code = "invalid_api_key"; break;
    case 403: *type = "permission_error"; break;
    case 404: *type = "not_found_error"; *code = "model_not_found"; break;
    case 405: *type = "invalid_request_error"; *code = "method_not_allowed"; break;
    case 409: *type = "conflict_error"; break;
    case 413: *type = "invalid_request_error"; *code = "request_too_large"; break;
    case 429: *type = "rate_limit_error"; *code = "rate_limit_exceeded"; break;
    case 503: *type = "server_error"; *code = "overloaded"; break;
    default: *type = status >= 500 ? "server_error" : "invalid_request_error";
    }
}

static json_t *error_json_code(int status, const char *param, const char *code_or_null, int set_code,
                               const char *msg) {
    const char *type, *code;
    error_kind(status, &type, &code);
    if (set_code) code = code_or_null;
    json_t *e = json_object();
    json_t *m = json_string(msg);
    if (!m) { /* not UTF-8 (a name echoed from the request): say so, escaped */
        char safe[768];
        size_t k = 0;
        for (const unsigned char *p = (const unsigned char *)msg; *p && k + 5 < sizeof safe; p++) {
            if (*p < 0x20 || *p >= 0x7f) k += (size_t)snprintf(safe + k, sizeof safe - k, "\\x%02x", *p);
            else safe[k++] = (char)*p;
        }
        safe[k] = 0;
        m = json_string(safe);
    }
    json_object_set_new(e, "message", m);
    json_object_set_new(e, "type", json_string(type));
    json_t *pj = param ? json_string(param) : NULL;
    json_object_set_new(e, "param", pj ? pj : json_null());
    json_object_set_new(e, "code", code ? json_string(code) : json_null());
    json_t *j = json_object();
    json_object_set_new(j, "error", e);
    return j;
}

json_t *http_error_json(int status, const char *param, const char *msg) {
    return error_json_code(status, param, NULL, 0, msg);
}

/* Anthropic's error types by status (docs.anthropic.com "Errors"); 503 is
 * their overloaded_error (they send it as 529; the status here stays 503). */
json_t *http_error_json_anthropic(int status, const char *msg) {
    const char *type = status == 401 ? "authentication_error" : status == 403 ? "permission_error"
                     : status == 404 ? "not_found_error" : status == 413 ? "request_too_large"
                     : status == 429 ? "rate_limit_error" : status == 503 ? "overloaded_error"
                     : status >= 500 ? "api_error" : "invalid_request_error";
    json_t *o = error_json_code(status, NULL, NULL, 0, msg); /* its message, made safe the same way */
    json_t *e = json_object();
    json_object_set_new(e, "type", json_string(type));
    json_object_set(e, "message", json_object_get(json_object_get(o, "error"), "message"));
    json_decref(o);
    json_t *j = json_object();
    json_object_set_new(j, "type", json_string("error"));
    json_object_set_new(j, "error", e);
    return j;
}

/* The error document in the dialect of q's route (the route table's tag; no route: OpenAI). */
static json_t *dialect_error_json(HttpReq *q, int status, const char *param, const char *code, int set_code,
                                  const char *msg) {
    switch (q->route ? q->route->dialect : DIALECT_OPENAI) { /* -Wswitch: a new dialect needs its case */
    case DIALECT_OPENAI: return error_json_code(status, param, code, set_code, msg);
    case DIALECT_SGLANG: { /* SGLang's ORJSONResponse({"error": {"message": ...}}, status) */
        json_t *e = json_object(), *j = json_object();
        json_object_set_new(e, "message", json_string(msg));
        json_object_set_new(j, "error", e);
        return j;
    }
    case DIALECT_ANTHROPIC: return http_error_json_anthropic(status, msg);
    }
    return error_json_code(status, param, code, set_code, msg);
}

__attribute__((format(printf, 6, 0))) static int send_error_v(HttpReq *q, int status, const char *param,
                                                              const char *code, int set_code, const char *fmt,
                                                              va_list ap) {
    char msg[768];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (status >= 500) log_warn("%s %s -> %d: %s", q->method, q->url, status, msg);
    return http_send_json(q, status, dialect_error_json(q, status, param, code, set_code, msg));
}

int http_send_error(HttpReq *q, int status, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int r = send_error_v(q, status, param, NULL, 0, fmt, ap);
    va_end(ap);
    return r;
}

int http_send_error_code(HttpReq *q, int status, const char *param, const char *code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int r = send_error_v(q, status, param, code, 1, fmt, ap);
    va_end(ap);
    return r;
}

int http_send_err(HttpReq *q, const Err *e) {
    /* request_parse writes "param: message"; a param is a plain identifier path */
    char param[128] = {0};
    const char *colon = strstr(e->msg, ": ");
    if (colon && (size_t)(colon - e->msg) < sizeof param && colon > e->msg) {
        size_t k = (size_t)(colon - e->msg);
        int ok = 1;
        for (size_t i = 0; i < k; i++) {
            char ch = e->msg[i];
            ok &= (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' || ch == '[' || ch == ']';
        }
        if (ok) memcpy(param, e->msg, k);
    }
    int status = e->code ? e->code : 500;
    return http_send_error(q, status, param[0] ? param : NULL, "%s", e->msg);
}

int http_conn_fd(HttpReq *q) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(q->c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

int http_check_model(Server *s, json_t *body, Err *err) {
    json_t *m = json_object_get(body, "model");
    if (!m || json_is_null(m)) return 0;
    ENSURE(err, json_is_string(m), 400, "model: must be a string");
    const char *v = json_string_value(m);
    int lora = 0;
    char name[128];
    if (strcmp(v, s->model_name) && strcmp(v, s->model_dir) && lora_model_acquire(s, body, &lora, name, sizeof name,
                                                                                   err) == 0) {
        lora_release(s, lora); /* an adapter's name: the same tokenizer */
        return 0;
    }
    ENSURE(err, !strcmp(v, s->model_name) || !strcmp(v, s->model_dir), 404,
           "The model `%s` does not exist. This server serves `%s`.", v, s->model_name);
    return 0;
}

/* Gone = reset or unwritable (POLLHUP / POLLERR), never merely half-closed: a
 * client that shut down its sending side (shutdown(SHUT_WR), `nc -N`) still
 * reads its answer. A FIN alone cannot tell "half-closed" from "closed", so
 * while nothing of the answer is on the wire (plain HTTP, a whole-response
 * request) a FIN is probed once with an interim "100 Continue" (RFC 9110
 * 15.2: clients parse unexpected 1xx answers): a closed client's kernel
 * answers it with a reset, which the next poll sees; a half-closed one reads
 * and skips it. Streams need no probe: their own writes draw the reset. */
int http_fd_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = { .fd = fd, .events = POLLRDHUP };
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return 1;
    if ((p.revents & POLLRDHUP) && fd == conn_tl.fd && !conn_tl.answered && !conn_tl.probed) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        conn_tl.probed = 1;
        if (send(fd, cont, sizeof cont - 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) return 1;
    }
    return 0;
}

/* ---- streams ---- */
typedef struct Stream {
    StreamFill fill;
    StreamDone done;
    void *ctx;
    Buf out;
    size_t off;
    int state; /* 1 more, 0 ended, -1 error */
} Stream;

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    Stream *st = cls;
    (void)pos;
    while (st->off == st->out.n) {
        if (st->state != 1) return st->state == 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
        st->out.n = st->off = 0;
        st->state = st->fill(st->ctx, &st->out);
    }
    size_t k = st->out.n - st->off < max ? st->out.n - st->off : max;
    memcpy(buf, st->out.p + st->off, k);
    st->off += k;
    return (ssize_t)k;
}

static void stream_free(void *cls) {
    Stream *st = cls;
    st->done(st->ctx);
    buf_free(&st->out);
    free(st);
}

int http_send_stream(HttpReq *q, StreamFill fill, StreamDone done, void *ctx) {
    Stream *st = xcalloc(1, sizeof *st);
    *st = (Stream){ .fill = fill, .done = done, .ctx = ctx, .state = 1 };
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, stream_read, st, stream_free);
    if (!r) { stream_free(st); return MHD_NO; }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    return queue(q, 200, r);
}

/* ---- spooled bodies: a delta is written to an unlinked temporary file as it
 * arrives, then mapped read-only, so an N-byte delta does not cost N bytes of
 * the server's heap (the page cache holds it, reclaimably) ---- */
static const char *spool_dir(void) {
    const char *d = getenv("TMPDIR");
    return d && *d ? d : "/tmp";
}

static int spool_write(HttpReq *q, const char *p, size_t n) {
    if (q->spool_fd < 0) {
        char path[4096];
        snprintf(path, sizeof path, "%s/sampler-delta-XXXXXX", spool_dir());
        int fd = mkstemp(path);
        if (fd < 0) return -1;
        unlink(path); /* gone from the directory at once: freed when closed, whatever happens */
        q->spool_fd = fd;
    }
    while (n) {
        ssize_t k = write(q->spool_fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { if (k == 0) errno = ENOSPC; return -1; }
        p += k;
        n -= (size_t)k;
        q->spooled += (size_t)k;
    }
    return 0;
}

/* The first call of a request comes with its headers and no body byte: the
 * route, auth, method and Content-Length are decided then (routes_preflight),
 * and a refusal is answered at once, so libmicrohttpd reads no byte of the
 * body (an answer queued before the upload closes the connection after it).
 * Only an authorized request to a route that takes a body gets one kept, up
 * to its row's limit. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    Server *s = cls;
    HttpReq *q = *con_cls;
    (void)version;
    if (!q) {
        q = xcalloc(1, sizeof *q);
        q->s = s;
        q->c = c;
        q->method = method;
        q->url = url;
        q->route = routes_for_path(url);
        q->spool_fd = -1;
        *con_cls = q;
        conn_tl.fd = s->cfg.tls_cert ? -1 : http_conn_fd(q); /* no half-close probe inside TLS */
        conn_tl.answered = conn_tl.probed = 0;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        q->conn = ci ? ci->socket_context : NULL;
        int ret;
        if (routes_preflight(q, &ret)) {
            http_guard_phase(s->guard, q->conn, 2, 0);
            return ret == MHD_YES ? MHD_YES : MHD_NO;
        }
        /* the body's deadline scales with what it announced (chunked: the route's limit) */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        size_t n = cl ? (size_t)strtoull(cl, NULL, 10) : q->body_limit;
        http_guard_phase(s->guard, q->conn, 1, n < q->body_limit ? n : q->body_limit);
        return MHD_YES;
    }
    if (q->answered) { /* refused early: nothing more is read or kept */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t have = q->spool_fd >= 0 ? q->spooled : q->body.n;
        if (q->too_large || have + *upload_size > q->body_limit) {
            q->too_large = 1;
            buf_free(&q->body);
        } else if (q->row && routes_spools(q->row)) {
            if (!q->spool_err && spool_write(q, upload, *upload_size) < 0) q->spool_err = errno ? errno : EIO;
        } else {
            buf_append(&q->body, upload, *upload_size);
        }
        *upload_size = 0;
        return MHD_YES;
    }
    http_guard_phase(s->guard, q->conn, 2, 0); /* the body is in: serving has no deadline */
    if (q->spool_err && !q->too_large)
        return http_send_error(q, 507, NULL, "cannot spool the delta body to a temporary file in %s: %s (set "
                               "TMPDIR to a directory with room for --max-delta-bytes)", spool_dir(),
                               strerror(q->spool_err));
    if (q->spool_fd >= 0 && !q->too_large && q->spooled) {
        q->map = mmap(NULL, q->spooled, PROT_READ, MAP_PRIVATE, q->spool_fd, 0);
        if (q->map == MAP_FAILED) {
            q->map = NULL;
            return http_send_error(q, 500, NULL, "cannot map the spooled delta body: %s", strerror(errno));
        }
        q->body = (Buf){ .p = q->map, .n = q->spooled, .cap = 0 };
    }
    return routes_dispatch(q) == MHD_YES ? MHD_YES : MHD_NO;
}

static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t len) {
    Server *s = cls;
    (void)addr; (void)len;
    return http_guard_accept(s->guard) ? MHD_YES : MHD_NO; /* MHD_NO: closed at once */
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    Server *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        *socket_context = ci ? http_guard_started(s->guard, ci->connect_fd) : NULL;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        http_guard_closed(s->guard, *socket_context);
        *socket_context = NULL;
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode tc) {
    HttpReq *q = *con_cls;
    Server *s = cls;
    (void)c; (void)tc;
    if (!q) return;
    http_guard_phase(s->guard, q->conn, 0, 0); /* a kept-alive connection waits for its next headers */
    if (q->map) munmap(q->map, q->spooled);
    else buf_free(&q->body);
    if (q->spool_fd >= 0) close(q->spool_fd);
    free(q);
    *con_cls = NULL;
}

/* A PEM file's whole text, NUL-terminated (start-up: fatal with a fix). */
static char *read_pem(const char *flag, const char *path, const char *what) {
    FILE *f = fopen(path, "rb");
    CHECK_PTR(f, "%s %s: cannot open", flag, path);
    Buf b = {0};
    char chunk[4096];
    size_t k;
    while ((k = fread(chunk, 1, sizeof chunk, f)) > 0) {
        CHECK(b.n + k <= (1u << 20), "%s %s: larger than 1 MiB, not a PEM %s", flag, path, what);
        buf_append(&b, chunk, k);
    }
    CHECK(!ferror(f), "%s %s: read error", flag, path);
    fclose(f);
    buf_append(&b, "", 1);
    CHECK(strstr(b.p, "-----BEGIN ") != NULL, "%s %s: not a PEM file (expected a '-----BEGIN ...' %s; "
          "convert DER with `openssl x509 -inform der` / `openssl pkey -inform der`)", flag, path, what);
    return b.p;
}

void http_tls_load(Server *s) {
    CHECK(!s->cfg.tls_cert == !s->cfg.tls_key, "HTTPS needs both --tls-cert FILE and --tls-key FILE (PEM)");
    if (!s->cfg.tls_cert || s->tls_cert_pem) return;
    CHECK(MHD_is_feature_supported(MHD_FEATURE_TLS) == MHD_YES,
          "--tls-cert: this libmicrohttpd was built without TLS (GnuTLS); install a build with HTTPS support "
          "(Debian's libmicrohttpd12 has it) or serve plain HTTP behind a TLS proxy");
    s->tls_cert_pem = read_pem("--tls-cert", s->cfg.tls_cert, "certificate");
    s->tls_key_pem = read_pem("--tls-key", s->cfg.tls_key, "private key");
}

void http_listen(Server *s) {
    /* the JSON library's allocations on request threads: a failure is noted
     * (alloc_failures) so the request answers 503 instead of a partial body */
    json_set_alloc_funcs(alloc_noted, free);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)s->cfg.port) };
    CHECK(inet_pton(AF_INET, s->cfg.host, &a.sin_addr) == 1, "--host '%s' is not an IPv4 address (e.g. 127.0.0.1 or 0.0.0.0)", s->cfg.host);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    struct MHD_OptionItem opt[12];
    int n = 0;
    opt[n++] = (struct MHD_OptionItem){ MHD_OPTION_SOCK_ADDR, 0, &a };
    if (!s->guard) s->guard = http_guard_create(&s->cfg);
    /* libmicrohttpd's cap only stops accepting (the excess waits in the backlog): ours (on_accept) closes */
    opt[n++] = (struct MHD_OptionItem){ MHD_OPTION_CONNECTION_LIMIT, (intptr_t)http_guard_mhd_limit(s->guard), NULL };
    opt[n++] = (struct MHD_OptionItem){ MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)on_connection, s };
    opt[n++] = (struct MHD_OptionItem){ MHD_OPTION_CONNECTION_TIMEOUT, s->cfg.connection_timeout_s, NULL };
    opt[n++] = (struct MHD_OptionItem){ MHD_OPTION_CONNECTION_MEMORY_LIMIT, (intptr_t)s->cfg.max_header_bytes, NULL };
    opt[n++] = (struct MHD_OptionItem){ MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)on_completed, s };
    http_tls_load(s);
    if (s->cfg.tls_cert) {
        flags |= MHD_USE_TLS;
        opt[n++] = (struct MHD_OptionItem){ MHD_OPTION_HTTPS_MEM_CERT, 0, s->tls_cert_pem };
        opt[n++] = (struct MHD_OptionItem){ MHD_OPTION_HTTPS_MEM_KEY, 0, s->tls_key_pem };
    }
    opt[n++] = (struct MHD_OptionItem){ MHD_OPTION_END, 0, NULL };
    s->d = MHD_start_daemon(flags, (uint16_t)s->cfg.port, on_accept, s, on_request, s, MHD_OPTION_ARRAY, opt,
                            MHD_OPTION_END);
    if (!s->d && s->cfg.tls_cert)
        CHECK(0, "cannot start HTTPS on %s:%d: the port may be taken (--port), or --tls-cert %s / --tls-key %s "
              "are not a matching PEM certificate and unencrypted private key (see the libmicrohttpd message above)",
              s->cfg.host, s->cfg.port, s->cfg.tls_cert, s->cfg.tls_key);
    CHECK_PTR(s->d, "cannot listen on %s:%d: is the port taken? pick another with --port", s->cfg.host, s->cfg.port);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->bound_port = di ? di->port : s->cfg.port;
}

void http_quiesce(Server *s) {
    if (!s->d) return;
    MHD_socket fd = MHD_quiesce_daemon(s->d); /* ours to close: new connections are refused from now on */
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void http_close(Server *s) {
    if (s->d) MHD_stop_daemon(s->d);
    s->d = NULL;
    http_guard_free(s->guard); /* after the daemon: every connection has been closed */
    s->guard = NULL;
    if (s->tls_key_pem) explicit_bzero(s->tls_key_pem, strlen(s->tls_key_pem));
    free(s->tls_key_pem);
    free(s->tls_cert_pem);
    s->tls_key_pem = s->tls_cert_pem = NULL;
}
