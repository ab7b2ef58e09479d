/*
 * push.c - `trainer push step.delta --to URL ...`: send one delta to many
 * samplers concurrently (one thread and one libcurl handle each), retrying
 * transient failures (transport errors, 5xx, 429) with exponential backoff
 * and jitter until a deadline, then read back each sampler's version and
 * hashes. Exits non-zero, loudly, unless every sampler ends on the delta's
 * target version with the delta's tensor hashes and all samplers agree on
 * every tensor hash. Endpoint contract: docs/delta-format.md.
 * HTTPS verifies the sampler's certificate (system CAs, or --cacert FILE);
 * --insecure turns that off, loudly. --key-file signs the delta
 * (X-Delta-Signature, delta_sign.h) for samplers that require signatures.
 */
#include <curl/curl.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "delta.h"
#include "delta_sign.h"
#include "trainer.h"

#define MAX_TARGETS 256
#define MAX_RESPONSE (64u << 20)

typedef struct Push {
    const char *url;
    const uint8_t *body;
    size_t size;
    const DeltaFile *df;
    const char *token;
    const char *sig;      /* "hmac-sha256=<hex>" or NULL */
    const char *cacert;   /* CA bundle (PEM) or NULL: the system's */
    int insecure;         /* 1: no certificate verification */
    double deadline;   /* absolute, now_s() clock */
    int retries;
    /* results */
    int ok, noop, attempts;
    long http;
    int64_t version;   /* -1 unknown */
    double secs;
    char msg[512];
    json_t *tensors;   /* GET's tensors object */
} Push;

typedef struct Buf {
    char *p;
    size_t n;
} Buf;

static size_t on_data(char *ptr, size_t sz, size_t nm, void *ud) {
    Buf *b = ud;
    size_t n = sz * nm;
    if (b->n + n > MAX_RESPONSE) return 0;
    char *q = realloc(b->p, b->n + n + 1);
    if (!q) return 0;
    b->p = q;
    memcpy(b->p + b->n, ptr, n);
    b->n += n;
    b->p[b->n] = 0;
    return n;
}

/* One HTTP exchange; returns the status (0 on transport failure, msg set). */
static long http_call(Push *p, const char *path, int post, Buf *resp) {
    char url[2048], auth[1024];
    snprintf(url, sizeof url, "%s%s", p->url, path);
    CURL *c = curl_easy_init();
    CHECK_PTR(c, "curl_easy_init failed");
    struct curl_slist *hdr = NULL;
    if (p->token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", p->token);
        hdr = curl_slist_append(hdr, auth);
    }
    hdr = curl_slist_append(hdr, "Expect:");
    if (post) {
        char sig[DELTA_SIG_CHARS + 64];
        if (p->sig) {
            snprintf(sig, sizeof sig, "%s: %s", DELTA_SIG_HEADER, p->sig);
            hdr = curl_slist_append(hdr, sig);
        }
        hdr = curl_slist_append(hdr, "Content-Type: application/octet-stream");
        curl_easy_setopt(c, CURLOPT_POST, 1L);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, (const char *)p->body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)p->size);
    }
    double left = p->deadline - now_s();
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, resp);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(left > 0.001 ? left * 1000 : 1));
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, p->insecure ? 0L : 1L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, p->insecure ? 0L : 2L);
    if (p->cacert) curl_easy_setopt(c, CURLOPT_CAINFO, p->cacert);
    long code = 0;
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    else snprintf(p->msg, sizeof p->msg, "%s", curl_easy_strerror(rc));
    curl_slist_free_all(hdr);
    curl_easy_cleanup(c);
    return code;
}

static const char *json_err_msg(json_t *j) {
    json_t *e = json_object_get(j, "error");
    const char *m = json_string_value(json_object_get(e, "message"));
    return m ? m : json_string_value(e) ? json_string_value(e) : "(no message)";
}

/* Read back the sampler's view and hold it to the delta's promises. */
static void verify_get(Push *p) {
    Buf r = {0};
    long code = http_call(p, "/admin/v1/weights", 0, &r);
    json_t *j = code == 200 && r.p ? json_loadb(r.p, r.n, 0, NULL) : NULL;
    if (!j) {
        snprintf(p->msg, sizeof p->msg, "GET /admin/v1/weights failed (HTTP %ld)", code);
        p->ok = 0;
        free(r.p);
        return;
    }
    json_t *v = json_object_get(j, "version"), *t = json_object_get(j, "tensors");
    const char *fp = json_string_value(json_object_get(j, "model_fingerprint"));
    char want[17];
    snprintf(want, sizeof want, "%016" PRIx64, p->df->h.fingerprint);
    p->version = json_is_integer(v) ? json_integer_value(v) : -1;
    p->ok = 0;
    if (p->version != (int64_t)p->df->h.target_version)
        snprintf(p->msg, sizeof p->msg, "GET reports version %" PRId64 ", expected %" PRIu64, p->version,
                 p->df->h.target_version);
    else if (!fp || strcmp(fp, want) != 0)
        snprintf(p->msg, sizeof p->msg, "GET reports model fingerprint %s, expected %s", fp ? fp : "(none)", want);
    else if (!json_is_object(t))
        snprintf(p->msg, sizeof p->msg, "GET has no tensors object");
    else {
        p->ok = 1;
        for (int i = 0; i < p->df->n && p->ok; i++) {
            const char *h = json_string_value(json_object_get(t, p->df->e[i].name));
            snprintf(want, sizeof want, "%016" PRIx64, p->df->e[i].hash_after);
            if (!h || strcmp(h, want) != 0) {
                snprintf(p->msg, sizeof p->msg, "tensor '%s': sampler hash %s, delta says %s", p->df->e[i].name,
                         h ? h : "(missing)", want);
                p->ok = 0;
            }
        }
        p->tensors = json_incref(t);
    }
    json_decref(j);
    free(r.p);
}

static void *push_one(void *arg) {
    Push *p = arg;
    double t0 = now_s();
    unsigned seed = (unsigned)(uintptr_t)p ^ (unsigned)time(NULL);
    p->version = -1;
    for (int a = 0; a <= p->retries; a++) {
        p->attempts = a + 1;
        Buf r = {0};
        p->msg[0] = 0;
        long code = http_call(p, "/admin/v1/weights/delta", 1, &r);
        p->http = code;
        json_t *j = r.p ? json_loadb(r.p, r.n, 0, NULL) : NULL;
        free(r.p);
        if (code == 200) {
            json_t *v = json_object_get(j, "version");
            p->noop = json_is_true(json_object_get(j, "noop"));
            p->version = json_is_integer(v) ? json_integer_value(v) : -1;
            json_decref(j);
            verify_get(p);
            break;
        }
        if (code == 409) {
            json_t *v = json_object_get(j, "current_version");
            p->version = json_is_integer(v) ? json_integer_value(v) : -1;
            snprintf(p->msg, sizeof p->msg, "conflict: %s", j ? json_err_msg(j) : "(no body)");
            json_decref(j);
            break;
        }
        int transient = code == 0 || code == 429 || code >= 500;
        if (code) snprintf(p->msg, sizeof p->msg, "HTTP %ld: %s", code, j ? json_err_msg(j) : "(no JSON body)");
        json_decref(j);
        if (!transient) break;
        double delay = 0.2 * (double)(1 << (a < 5 ? a : 5));
        if (delay > 5) delay = 5;
        delay *= 0.5 + 0.5 * (double)rand_r(&seed) / RAND_MAX;
        if (a == p->retries) break;
        if (now_s() + delay >= p->deadline) {
            strncat(p->msg, " (deadline reached)", sizeof p->msg - strlen(p->msg) - 1);
            break;
        }
        usleep((useconds_t)(delay * 1e6));
    }
    p->secs = now_s() - t0;
    return NULL;
}

int cmd_push(int argc, char **argv) {
    const char *path = NULL, *token = getenv("SAMPLER_ADMIN_TOKEN"), *urls[MAX_TARGETS];
    const char *cacert = NULL, *key_file = NULL;
    int n = 0, retries = 5, insecure = 0;
    double deadline = 120;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
        if (strcmp(a, "--to") == 0 && more) {
            CHECK(n < MAX_TARGETS, "at most %d --to targets", MAX_TARGETS);
            urls[n++] = argv[++i];
        } else if (strcmp(a, "--admin-token") == 0 && more) token = argv[++i];
        else if (strcmp(a, "--deadline") == 0 && more) deadline = atof(argv[++i]);
        else if (strcmp(a, "--retries") == 0 && more) retries = atoi(argv[++i]);
        else if (strcmp(a, "--cacert") == 0 && more) cacert = argv[++i];
        else if (strcmp(a, "--key-file") == 0 && more) key_file = argv[++i];
        else if (strcmp(a, "--insecure") == 0) insecure = 1;
        else if (a[0] != '-' && !path) path = a;
        else CHECK(0, "trainer push: unknown or incomplete argument '%s'", a);
    }
    CHECK(path && n > 0, "usage: trainer push step.delta --to URL [--to URL ...] [--admin-token T] ...");
    size_t size;
    uint8_t *buf = read_file(path, &size);
    DeltaFile *df;
    Err err = {0};
    CHECK(delta_parse(&df, buf, size, &err) == 0, "%s: %s (not pushed)", path, err.msg);
    char sig[DELTA_SIG_CHARS + 1];
    if (key_file) {
        uint8_t *key;
        size_t nk;
        CHECK(delta_key_load(key_file, &key, &nk, &err) == 0, "--key-file: %s", err.msg);
        CHECK(delta_sign(key, nk, buf, size, sig, &err) == 0, "%s: %s", path, err.msg);
        explicit_bzero(key, nk);
        free(key);
    }
    if (cacert) {
        FILE *f = fopen(cacert, "rb");
        CHECK_PTR(f, "--cacert %s: cannot open (a PEM file of the CA certificates to trust)", cacert);
        fclose(f);
    }
    if (insecure)
        fprintf(stderr, "trainer push: WARNING: --insecure: TLS certificates are NOT verified; anyone on the path "
                "can read the admin token and impersonate the samplers\n");
    for (int i = 0; i < n; i++)
        if (strncmp(urls[i], "http://", 7) == 0 && !strstr(urls[i], "://127.") && !strstr(urls[i], "://localhost"))
            fprintf(stderr, "trainer push: warning: %s is plain HTTP: the admin token and the delta travel in clear "
                    "text (use https://)\n", urls[i]);
    Push *ps = xcalloc((size_t)n, sizeof(Push));
    pthread_t *th = xcalloc((size_t)n, sizeof(pthread_t));
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        char *u = xstrdup(urls[i]);
        size_t l = strlen(u);
        while (l > 0 && u[l - 1] == '/') u[--l] = 0;
        ps[i] = (Push){.url = u, .body = buf, .size = size, .df = df, .token = token, .deadline = t0 + deadline,
                       .sig = key_file ? sig : NULL, .cacert = cacert, .insecure = insecure,
                       .retries = retries};
        CHECK(pthread_create(&th[i], NULL, push_one, &ps[i]) == 0, "cannot start a thread");
    }
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    int n_ok = 0;
    json_t *ref = NULL;
    printf("push %s (%zu bytes, version %" PRIu64 " -> %" PRIu64 ") to %d samplers in %.3f s\n", path, size,
           df->h.base_version, df->h.target_version, n, now_s() - t0);
    for (int i = 0; i < n; i++) {
        Push *p = &ps[i];
        if (p->ok && p->tensors) {
            if (!ref) ref = p->tensors;
            else if (!json_equal(ref, p->tensors)) {
                p->ok = 0;
                snprintf(p->msg, sizeof p->msg, "tensor hashes differ from %s's", ps[0].url);
            }
        }
        n_ok += p->ok;
        printf("  %-40s %-8s version %-6" PRId64 " http %ld attempts %d time %.3f s%s%s\n", p->url,
               p->ok ? (p->noop ? "noop" : "ok") : "FAILED", p->version, p->http, p->attempts, p->secs,
               p->msg[0] ? "  " : "", p->msg);
    }
    if (n_ok != n)
        fprintf(stderr, "trainer push: FAILED: %d of %d samplers are not on version %" PRIu64
                " with the delta's hashes; see the lines above\n", n - n_ok, n, df->h.target_version);
    else printf("all %d samplers on version %" PRIu64 " with identical hashes\n", n, df->h.target_version);
    for (int i = 0; i < n; i++) {
        json_decref(ps[i].tensors);
        free((char *)ps[i].url);
    }
    free(ps);
    free(th);
    delta_file_free(df);
    free(buf);
    return n_ok == n ? 0 : 1;
}
