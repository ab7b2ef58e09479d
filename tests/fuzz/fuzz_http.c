/*
 * fuzz_http.c - libFuzzer target: the HTTP request handlers. Each input is one
 * request in a small text form,
 *
 *     METHOD SP PATH[?QUERY] LF
 *     (Name: value LF)*          headers (Authorization, x-fuzz-disconnect)
 *     LF
 *     body bytes (any)
 *
 * and goes through the server's own access handler (http.c, routes.c: the
 * route table's auth, body limits and JSON parsing) into every endpoint
 * (api_*.c: completions, chat, responses, messages, tokenize, detokenize, models, metrics, health,
 * admin delta/weights/reload/pause/resume/abort, vLLM's /inference/v1/generate
 * and prime-rl's controls, SGLang's /generate and controls) on the bundled tiny model
 * with a real engine, so requests generate. The Server is built by
 * server_create, as sampler-cpu builds it. There are no sockets: this file
 * defines the handful of libmicrohttpd functions http.c calls
 * (MHD_start_daemon, MHD_queue_response, ...) as an in-process double; the
 * executable's definitions win over the shared library's at link time.
 * server_start() hands us the access handler.
 *
 * Besides crashes, leaks and UB, the target aborts when an answer breaks the
 * API contract: a 500 (README: "500 only for bugs"), two answers to one
 * request, a JSON answer that does not parse or an error without an
 * "error" object with a message (OpenAI's, Anthropic's and SGLang's shapes; SGLang's weight
 * route: {"success": false, "message"}), a stream that is not SSE or does not end with [DONE] (the agent
 * dialects: with their terminal named event), or an engine
 * that is not idle again (running/waiting sequences, in-flight count) once the
 * request is over. "x-fuzz-disconnect: K" makes the client go away: streams
 * after K chunks, whole responses before the first engine step.
 * FUZZ_HTTP_VERBOSE=1 prints each request's status (to check the seeds).
 * Costs stay bounded: max_model_len 256, max_tokens <= 4 (clamp_tokens),
 * n <= 4, one forward thread.
 *
 * If http.c starts calling another MHD function on a connection, add its
 * double here (the real one would get our fake connection).
 */
#define _GNU_SOURCE
#include <microhttpd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "log.h"
#include "server.h"

#define FUZZ_API_KEY "fuzz-key"
#define FUZZ_ADMIN "fuzz-admin"
#define MAX_HDR 16

#define FAIL(...) do { fprintf(stderr, "fuzz_http: " __VA_ARGS__); fputc('\n', stderr); abort(); } while (0)

/* ---- the libmicrohttpd double ---- */
struct MHD_Response {
    int status;
    char *buf;                                /* whole body (buffer responses) */
    size_t n;
    MHD_ContentReaderCallback crc;            /* streams */
    void *crc_cls;
    MHD_ContentReaderFreeCallback crfc;
    size_t block;
    int refs;
    char ctype[128];
};

struct MHD_Connection {
    const char *hk[MAX_HDR], *hv[MAX_HDR];    /* headers */
    int n_hdr;
    const char *ak[MAX_HDR], *av[MAX_HDR];    /* GET arguments */
    int n_arg;
    struct MHD_Response *resp;                /* queued answer */
    int n_queued;
    int fd[2];                                /* socketpair: fd[0] is the server's end */
    union MHD_ConnectionInfo info;
};

struct MHD_Daemon { int unused; };

static struct MHD_Daemon g_daemon;
static MHD_AccessHandlerCallback g_dh;
static void *g_dh_cls;
static MHD_RequestCompletedCallback g_done;
static void *g_done_cls;

static void take_option(enum MHD_OPTION o, intptr_t v, void *p) {
    if (o == MHD_OPTION_NOTIFY_COMPLETED) {
        g_done = (MHD_RequestCompletedCallback)v;
        g_done_cls = p;
    }
}

struct MHD_Daemon *MHD_start_daemon(unsigned int flags, uint16_t port, MHD_AcceptPolicyCallback apc, void *apc_cls,
                                    MHD_AccessHandlerCallback dh, void *dh_cls, ...) {
    (void)flags; (void)port; (void)apc; (void)apc_cls;
    g_dh = dh;
    g_dh_cls = dh_cls;
    va_list ap;
    va_start(ap, dh_cls);
    for (;;) {
        enum MHD_OPTION o = va_arg(ap, enum MHD_OPTION);
        if (o == MHD_OPTION_END) break;
        if (o == MHD_OPTION_ARRAY) {
            for (const struct MHD_OptionItem *it = va_arg(ap, const struct MHD_OptionItem *);
                 it && it->option != MHD_OPTION_END; it++)
                take_option(it->option, it->value, it->ptr_value);
            continue;
        }
        /* options followed by two arguments (microhttpd.h); every other takes one */
        int two = o == MHD_OPTION_NOTIFY_COMPLETED || o == MHD_OPTION_URI_LOG_CALLBACK ||
                  o == MHD_OPTION_EXTERNAL_LOGGER || o == MHD_OPTION_UNESCAPE_CALLBACK ||
                  o == MHD_OPTION_DIGEST_AUTH_RANDOM || o == MHD_OPTION_NOTIFY_CONNECTION ||
                  o == MHD_OPTION_GNUTLS_PSK_CRED_HANDLER;
        intptr_t v = va_arg(ap, intptr_t);
        void *p = two ? va_arg(ap, void *) : NULL;
        take_option(o, v, p);
    }
    va_end(ap);
    return &g_daemon;
}

const union MHD_DaemonInfo *MHD_get_daemon_info(struct MHD_Daemon *d, enum MHD_DaemonInfoType t, ...) {
    (void)d; (void)t;
    return NULL;
}

MHD_socket MHD_quiesce_daemon(struct MHD_Daemon *d) { (void)d; return MHD_INVALID_SOCKET; }
void MHD_stop_daemon(struct MHD_Daemon *d) { (void)d; }

static struct MHD_Response *response_new(void) {
    struct MHD_Response *r = calloc(1, sizeof *r);
    if (!r) FAIL("out of memory");
    r->refs = 1;
    return r;
}

struct MHD_Response *MHD_create_response_from_buffer(size_t size, void *buffer, enum MHD_ResponseMemoryMode mode) {
    struct MHD_Response *r = response_new();
    r->buf = malloc(size + 1);
    if (!r->buf) FAIL("out of memory");
    if (size) memcpy(r->buf, buffer, size);
    r->buf[size] = 0;
    r->n = size;
    if (mode == MHD_RESPMEM_MUST_FREE) free(buffer);
    return r;
}

struct MHD_Response *MHD_create_response_from_callback(uint64_t size, size_t block_size,
                                                       MHD_ContentReaderCallback crc, void *crc_cls,
                                                       MHD_ContentReaderFreeCallback crfc) {
    (void)size;
    struct MHD_Response *r = response_new();
    r->crc = crc;
    r->crc_cls = crc_cls;
    r->crfc = crfc;
    r->block = block_size ? block_size : 4096;
    return r;
}

enum MHD_Result MHD_add_response_header(struct MHD_Response *r, const char *h, const char *v) {
    if (!h || !v || strpbrk(v, "\r\n")) FAIL("bad response header %s: %s", h ? h : "(null)", v ? v : "(null)");
    if (!strcasecmp(h, "Content-Type")) snprintf(r->ctype, sizeof r->ctype, "%s", v);
    return MHD_YES;
}

void MHD_destroy_response(struct MHD_Response *r) {
    if (!r || --r->refs > 0) return;
    if (r->crfc) r->crfc(r->crc_cls);
    free(r->buf);
    free(r);
}

enum MHD_Result MHD_queue_response(struct MHD_Connection *c, unsigned int status, struct MHD_Response *r) {
    c->n_queued++;
    if (c->resp) return MHD_NO; /* as libmicrohttpd: one answer per request (checked after the handler) */
    r->status = (int)status;
    r->refs++;
    c->resp = r;
    return MHD_YES;
}

static const char *lookup(const char *const *k, const char *const *v, int n, const char *key) {
    for (int i = 0; i < n; i++)
        if (!strcasecmp(k[i], key)) return v[i];
    return NULL;
}

const char *MHD_lookup_connection_value(struct MHD_Connection *c, enum MHD_ValueKind kind, const char *key) {
    if (!key) return NULL;
    if (kind & MHD_HEADER_KIND) return lookup(c->hk, c->hv, c->n_hdr, key);
    if (kind & MHD_GET_ARGUMENT_KIND) return lookup(c->ak, c->av, c->n_arg, key);
    return NULL;
}

const union MHD_ConnectionInfo *MHD_get_connection_info(struct MHD_Connection *c, enum MHD_ConnectionInfoType t, ...) {
    if (t != MHD_CONNECTION_INFO_CONNECTION_FD) return NULL;
    c->info.connect_fd = c->fd[0];
    return &c->info;
}

/* ---- the server, set up once: through server_create, as main.c does ---- */
static Server *g_s;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    log_set_level(LOG_ERROR);
    ServerConfig c;
    server_config_default(&c);
    c.served_model_name = "tiny-qwen3";
    c.force_cpu = 1;
    c.api_key = FUZZ_API_KEY;
    c.admin_token = FUZZ_ADMIN;
    c.max_body_bytes = 3000;      /* the 413 path is reachable from small inputs */
    c.max_delta_bytes = 1 << 20;
    c.max_n = 4;
    c.mask_json_max_ids = 64;     /* both mask encodings */
    c.engine.max_model_len = 256;
    c.engine.kv_mem_mb = 4;
    c.engine.n_threads = 1;
    c.engine.verbose = 0;
    g_s = server_create(&c);
    server_start(g_s);
    CHECK(g_dh != NULL, "server_start did not register an access handler");
    return 0;
}

/* ---- one request ---- */
typedef struct Parsed {
    char *text;              /* owned copy of the head, split in place */
    const char *method, *path;
    const uint8_t *body;
    size_t body_n;
    int disconnect;          /* -1: the client stays; K: goes away after K stream chunks */
} Parsed;

static void url_decode(char *s) {
    char *o = s;
    for (; *s; s++) {
        if (*s == '%' && s[1] && s[2]) {
            char h[3] = {s[1], s[2], 0}, *end;
            long v = strtol(h, &end, 16);
            if (!*end) { *o++ = (char)v; s += 2; continue; }
        }
        *o++ = *s == '+' ? ' ' : *s;
    }
    *o = 0;
}

/* Split the head in place; returns 0 when the input has no request line. */
static int parse_input(const uint8_t *data, size_t size, Parsed *p, struct MHD_Connection *c) {
    const uint8_t *end = NULL;
    for (size_t i = 0; i + 1 < size; i++)
        if (data[i] == '\n' && data[i + 1] == '\n') { end = data + i; break; }
    size_t head_n = end ? (size_t)(end - data) : size;
    if (memchr(data, 0, head_n)) return 0; /* libmicrohttpd never hands out NUL in a header */
    p->text = strndup((const char *)data, head_n);
    p->body = end ? end + 2 : data + size;
    p->body_n = (size_t)(data + size - p->body);
    p->disconnect = -1;
    char *save = NULL, *line = strtok_r(p->text, "\n", &save);
    if (!line) return 0;
    char *sp = strchr(line, ' ');
    if (!sp || sp == line) return 0;
    *sp = 0;
    p->method = line;
    char *url = sp + 1;
    if (!*url) return 0;
    char *q = strchr(url, '?');
    if (q) {
        *q++ = 0;
        for (char *a = strtok(q, "&"); a && c->n_arg < MAX_HDR; a = strtok(NULL, "&")) {
            char *eq = strchr(a, '=');
            if (eq) *eq++ = 0;
            url_decode(a);
            if (eq) url_decode(eq);
            c->ak[c->n_arg] = a;
            c->av[c->n_arg++] = eq ? eq : "";
        }
    }
    url_decode(url);
    p->path = url;
    while ((line = strtok_r(NULL, "\n", &save)) && c->n_hdr < MAX_HDR) {
        char *colon = strchr(line, ':');
        if (!colon) continue;
        *colon = 0;
        char *v = colon + 1;
        while (*v == ' ') v++;
        if (!strcasecmp(line, "x-fuzz-disconnect")) { p->disconnect = atoi(v) < 0 ? 0 : atoi(v) % 64; continue; }
        c->hk[c->n_hdr] = line;
        c->hv[c->n_hdr++] = v;
    }
    return 1;
}

/* Generation costs ~tens of ms per token under the sanitizers: a JSON object
 * body of a generating endpoint gets max_tokens 4 when it asks for more (or
 * for the default, which for chat is the rest of the context). Values above
 * the context stay, so their 400 is still reached. Other bodies go as given.
 * The token-in/token-out dialects keep the limit inside "sampling_params"
 * (vLLM's max_tokens, SGLang's max_new_tokens, default 128); a
 * sampling_params that is not an object stays, for its 400. */
static int clamp_keys(json_t *o, const char *const *keys, int n_keys, int present) {
    int changed = 0;
    for (int i = 0; i < n_keys; i++) {
        json_t *v = json_object_get(o, keys[i]);
        if (!v || json_is_null(v)) continue;
        present = 1;
        if (json_is_integer(v) && json_integer_value(v) > 4 && json_integer_value(v) <= g_s->max_model_len) {
            json_object_set_new(o, keys[i], json_integer(4));
            changed = 1;
        }
    }
    if (!present) { json_object_set_new(o, keys[0], json_integer(4)); changed = 1; }
    return changed;
}

static char *clamp_tokens(const char *path, const uint8_t *body, size_t n, size_t *out_n) {
    int openai = !strcmp(path, "/v1/completions") || !strcmp(path, "/v1/chat/completions");
    int vllm = !strcmp(path, "/inference/v1/generate"), sgl = !strcmp(path, "/generate");
    /* the agent dialects name it their way; /v1/messages requires it (absent: its 400 stays reachable) */
    int responses = !strcmp(path, "/v1/responses"), messages = !strcmp(path, "/v1/messages");
    if (!openai && !vllm && !sgl && !responses && !messages) return NULL;
    json_error_t je;
    json_t *j = json_loadb((const char *)body, n, 0, &je);
    if (!json_is_object(j)) { json_decref(j); return NULL; }
    static const char *const oa[] = {"max_tokens", "max_completion_tokens"}, *const vl[] = {"max_tokens"},
                             *const sg[] = {"max_new_tokens"}, *const rs[] = {"max_output_tokens"};
    int changed = 0;
    if (openai || messages) {
        changed = clamp_keys(j, oa, 2, messages);
    } else if (responses) {
        changed = clamp_keys(j, rs, 1, 0);
    } else {
        json_t *sp = json_object_get(j, "sampling_params");
        if (!sp && sgl) json_object_set_new(j, "sampling_params", sp = json_object());
        if (json_is_object(sp)) changed = clamp_keys(sp, vllm ? vl : sg, 1, 0);
    }
    char *out = changed ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    if (out) *out_n = strlen(out);
    return out;
}

static void check_error_shape(const char *body, int status) {
    json_error_t je;
    json_t *j = json_loads(body, JSON_ALLOW_NUL, &je); /* "\u0000" is valid JSON (RFC 8259) */
    if (!j) FAIL("%d answer is not JSON: %s", status, body);
    json_t *e = json_object_get(j, "error");
    /* SGLang's weight route answers its own result shape: {"success": false, "message"} */
    int sgl_result = json_is_false(json_object_get(j, "success")) && json_is_string(json_object_get(j, "message"));
    if (!json_is_object(e) && !json_is_string(e) && !sgl_result)
        FAIL("%d answer without \"error\": %s", status, body);
    if (json_is_object(e) && !json_is_string(json_object_get(e, "message")))
        FAIL("%d error without a message: %s", status, body);
    json_decref(j);
}

static void check_whole(struct MHD_Response *r, const char *path) {
    static const int ok[] = {200, 400, 401, 403, 404, 405, 409, 413, 422, 429, 503};
    int allowed = 0;
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) allowed |= r->status == ok[i];
    if (!allowed) FAIL("%s answered %d: %.*s", path, r->status, (int)r->n, r->buf);
    if (strlen(r->buf) != r->n) FAIL("%s answered a NUL byte", path);
    if (!strncmp(r->ctype, "application/json", 16)) {
        json_error_t je;
        json_t *j = json_loadb(r->buf, r->n, JSON_ALLOW_NUL, &je);
        if (!j) FAIL("%s answered JSON that does not parse (%s): %s", path, je.text, r->buf);
        json_decref(j);
        if (r->status >= 400) check_error_shape(r->buf, r->status);
    } else if (r->status >= 400) {
        FAIL("%s error %d not as JSON (%s)", path, r->status, r->ctype);
    }
}

/* Read a stream as libmicrohttpd does, at most max_chunks reads (< 0: no
 * limit). Returns 1 at its end, -1 when it ended with an error (allowed
 * only when the client is gone), 0 when the limit stopped it. */
static int drain_stream(struct MHD_Response *r, int max_chunks, int gone, Buf *out) {
    char *buf = malloc(r->block);
    if (!buf) FAIL("out of memory");
    int ended = 0;
    for (int k = 0; max_chunks < 0 || k < max_chunks; k++) {
        ssize_t n = r->crc(r->crc_cls, out->n, buf, r->block);
        if (n == MHD_CONTENT_READER_END_OF_STREAM) { ended = 1; break; }
        if (n == MHD_CONTENT_READER_END_WITH_ERROR) {
            if (!gone) FAIL("stream ended with an error while the client stayed");
            ended = -1;
            break;
        }
        if (n < 0 || (size_t)n > r->block) FAIL("stream reader returned %zd", n);
        buf_append(out, buf, (size_t)n);
    }
    free(buf);
    return ended;
}

/* The named-event streams of the agent dialects (/v1/responses, /v1/messages):
 * "event: NAME\ndata: {"type": NAME, ...}" blocks, no [DONE]; a finished
 * stream's last event is its terminal one. */
static void check_named_sse(const Buf *b, int ended) {
    size_t i = 0;
    char last[64] = "";
    while (i < b->n) {
        const char *p = b->p + i;
        const char *e = memmem(p, b->n - i, "\n\n", 2);
        if (!e) {
            if (ended) FAIL("stream ends inside an event: %.*s", (int)(b->n - i), p);
            return;
        }
        size_t n = (size_t)(e - p);
        if (n >= 1 && p[0] == ':') { i += n + 2; continue; } /* comment (keep-alive) */
        const char *nl = memchr(p, '\n', n);
        if (n < 8 || memcmp(p, "event: ", 7) || !nl || (size_t)(e - nl) < 7 || memcmp(nl + 1, "data: ", 6))
            FAIL("not a named SSE event: %.*s", (int)n, p);
        json_error_t je;
        json_t *j = json_loadb(nl + 7, (size_t)(e - nl - 7), JSON_ALLOW_NUL, &je);
        json_t *ty = json_object_get(j, "type");
        size_t k = (size_t)(nl - p) - 7;
        if (!json_is_string(ty) || k >= sizeof last || strlen(json_string_value(ty)) != k ||
            memcmp(json_string_value(ty), p + 7, k))
            FAIL("event data without its name as \"type\": %.*s", (int)n, p);
        json_decref(j);
        memcpy(last, p + 7, k);
        last[k] = 0;
        i += n + 2;
    }
    if (ended && strcmp(last, "message_stop") && strcmp(last, "response.completed") &&
        strcmp(last, "response.incomplete") && strcmp(last, "error"))
        FAIL("stream ended after %s, not a terminal event", last[0] ? last : "nothing");
}

static void check_sse(const Buf *b, int ended) {
    size_t i = 0;
    int done = 0;
    while (i < b->n) {
        const char *p = b->p + i;
        const char *e = memmem(p, b->n - i, "\n\n", 2);
        if (!e) {
            if (ended) FAIL("stream ends inside an event: %.*s", (int)(b->n - i), p);
            return;
        }
        size_t n = (size_t)(e - p);
        if (done) FAIL("event after [DONE]");
        if (n >= 1 && p[0] == ':') { /* comment (keep-alive) */
        } else if (n == 12 && !memcmp(p, "data: [DONE]", 12)) {
            done = 1;
        } else if (n > 6 && !memcmp(p, "data: ", 6)) {
            json_error_t je;
            json_t *j = json_loadb(p + 6, n - 6, JSON_ALLOW_NUL, &je);
            if (!json_is_object(j)) FAIL("stream event is not a JSON object: %.*s", (int)n, p);
            if (!json_object_get(j, "choices") && !json_object_get(j, "error") && !json_object_get(j, "meta_info"))
                FAIL("stream event without choices, meta_info (SGLang) or error: %.*s", (int)n, p);
            json_decref(j);
        } else {
            FAIL("not an SSE event: %.*s", (int)n, p);
        }
        i += n + 2;
    }
    if (ended && !done) FAIL("stream ended without [DONE]");
}

static double mono_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* After a request: nothing may stay behind in the engine or the server. */
static void check_idle(void) {
    Server *s = g_s;
    if (engine_is_paused(s->eng)) engine_resume(s->eng);
    EngineMetrics m;
    double t0 = mono_s();
    for (;;) {
        engine_metrics(s->eng, &m);
        if (m.running == 0 && m.waiting == 0 && atomic_load(&s->inflight) == 0 && m.kv_blocks_used == 0) break;
        if (mono_s() - t0 > 10)
            FAIL("engine not idle after the request: running %d waiting %d kv used %d inflight %d", m.running,
                 m.waiting, m.kv_blocks_used, atomic_load(&s->inflight));
        usleep(1000);
    }
    if (s->live) FAIL("a live request is still registered");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct MHD_Connection c = { .fd = {-1, -1} };
    Parsed p = {0};
    if (!parse_input(data, size, &p, &c)) { free(p.text); return 0; }
    if (p.disconnect >= 0 && socketpair(AF_UNIX, SOCK_STREAM, 0, c.fd) != 0) FAIL("socketpair");
    if (p.disconnect == 0) { /* the client is gone before the handler looks */
        close(c.fd[1]);
        c.fd[1] = -1;
    }
    size_t clamped_n = 0;
    char *clamped = clamp_tokens(p.path, p.body, p.body_n, &clamped_n);
    if (clamped) { p.body = (const uint8_t *)clamped; p.body_n = clamped_n; }
    void *con_cls = NULL;
    size_t zero = 0;
    enum MHD_Result ok = g_dh(g_dh_cls, &c, p.path, p.method, "HTTP/1.1", NULL, &zero, &con_cls);
    /* the body as libmicrohttpd delivers it: in pieces (here up to 1000 bytes) */
    for (size_t off = 0; ok == MHD_YES && off < p.body_n;) {
        size_t n = p.body_n - off < 1000 ? p.body_n - off : 1000, left = n;
        ok = g_dh(g_dh_cls, &c, p.path, p.method, "HTTP/1.1", (const char *)p.body + off, &left, &con_cls);
        if (left > n) FAIL("handler grew upload_data_size");
        if (ok == MHD_YES && left == n) FAIL("handler consumed no upload data");
        off += n - left;
    }
    if (ok == MHD_YES) ok = g_dh(g_dh_cls, &c, p.path, p.method, "HTTP/1.1", NULL, &zero, &con_cls);
    if (c.n_queued > 1) FAIL("%s %s: %d answers queued for one request", p.method, p.path, c.n_queued);
    if (ok == MHD_YES && !c.resp) FAIL("%s %s: handler returned MHD_YES without an answer", p.method, p.path);
    if (getenv("FUZZ_HTTP_VERBOSE"))
        fprintf(stderr, "%s %s -> %d%s %.200s\n", p.method, p.path, c.resp ? c.resp->status : 0,
                c.resp && c.resp->crc ? " (stream)" : "", c.resp && c.resp->buf ? c.resp->buf : "");
    if (c.resp) {
        struct MHD_Response *r = c.resp;
        if (r->crc) {
            if (r->status != 200 || strcmp(r->ctype, "text/event-stream")) FAIL("stream answered %d %s", r->status, r->ctype);
            Buf out = {0};
            int gone = p.disconnect == 0;
            int ended = drain_stream(r, p.disconnect, gone, &out);
            if (ended == 0) {
                /* the client goes away mid-stream; libmicrohttpd may read once
                 * more before it notices, then frees the stream */
                close(c.fd[1]);
                c.fd[1] = -1;
                int more = drain_stream(r, 1, 1, &out);
                if (more) ended = more;
            }
            if (!strcmp(p.path, "/v1/responses") || !strcmp(p.path, "/v1/messages")) check_named_sse(&out, ended == 1);
            else check_sse(&out, ended == 1);
            buf_free(&out);
        } else {
            check_whole(r, p.path);
        }
        MHD_destroy_response(r);
    }
    if (g_done) g_done(g_done_cls, &c, &con_cls, MHD_REQUEST_TERMINATED_COMPLETED_OK);
    if (c.fd[0] >= 0) close(c.fd[0]);
    if (c.fd[1] >= 0) close(c.fd[1]);
    free(p.text);
    free(clamped);
    check_idle();
    return 0;
}
