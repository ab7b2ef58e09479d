/*
 * push.c - `trainer push step.delta --to URL ...`: bring a fleet of samplers
 * to the delta's target version. One thread and one libcurl handle per
 * target, all at once; each target's transient failures (transport errors,
 * 5xx, 429) are retried with exponential backoff and jitter until one
 * deadline shared by all. A target that answers 409 because it is behind
 * the delta's base (it was down for some steps) is caught up first: the
 * missing deltas of the trainer's chain (--chain DIR) in order, or a full
 * reload (--reload DIR) when the chain does not reach or is longer than
 * --max-chain. Then each sampler's version and hashes are read back, and
 * the fleet's version is announced to every sampler (POST /admin/v1/fleet:
 * readiness, docs/fleet.md). Prints one row per target (version before and
 * after, bytes sent, seconds, result) and exits non-zero, loudly, unless
 * every sampler ends on the target version with the delta's tensor hashes
 * and all samplers agree on every tensor hash. Endpoint contract:
 * docs/delta-format.md; fleets: docs/fleet.md.
 * HTTPS verifies the sampler's certificate (system CAs, or --cacert FILE);
 * --insecure turns that off, loudly. --key-file signs the deltas
 * (X-Delta-Signature, delta_sign.h) for samplers that require signatures.
 *
 * Not here: the target list and the chain (fleet.c).
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
#include "fleet.h"
#include "trainer.h"

#define MAX_RESPONSE (64u << 20)
#define ANNOUNCE_TIMEOUT_S 5.0

typedef struct Shared {
    const DeltaFile *df;
    const uint8_t *body;
    size_t size;
    const char *sig;      /* "hmac-sha256=<hex>" or NULL */
    const char *token;
    const char *cacert;   /* CA bundle (PEM) or NULL: the system's */
    int insecure;         /* 1: no certificate verification */
    double deadline;      /* absolute, now_s() clock */
    int retries;
    FleetChain *chain;    /* may be empty; its deltas are mapped as targets need them */
    int max_chain;
    const char *reload;   /* checkpoint directory of the target version, as the samplers see it; or NULL */
} Shared;

typedef struct Push {
    const Shared *sh;
    const char *url;
    /* results */
    int ok, noop, attempts, caught_up; /* caught_up: deltas of the chain sent (-1: a full reload) */
    long http;
    int64_t before, version; /* -1 unknown */
    unsigned long long bytes; /* request bodies sent, every attempt */
    double secs;
    char msg[512];
    char ready[128];   /* what the readiness announcement answered */
    json_t *tensors;   /* GET's tensors object */
} Push;

typedef struct Resp {
    char *p;
    size_t n;
} Resp;

static size_t on_data(char *ptr, size_t sz, size_t nm, void *ud) {
    Resp *b = ud;
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

/* One HTTP exchange; returns the status (0 on transport failure, msg set).
 * body NULL: GET. ctype: the body's content type. */
static long http_call(Push *p, const char *path, const void *body, size_t size, const char *ctype, const char *sig,
                      double timeout_s, Resp *resp) {
    const Shared *sh = p->sh;
    char url[2048], auth[1024];
    snprintf(url, sizeof url, "%s%s", p->url, path);
    CURL *c = curl_easy_init();
    CHECK_PTR(c, "curl_easy_init failed");
    struct curl_slist *hdr = NULL;
    if (sh->token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", sh->token);
        hdr = curl_slist_append(hdr, auth);
    }
    hdr = curl_slist_append(hdr, "Expect:");
    char sigh[DELTA_SIG_CHARS + 64], cth[128];
    if (body) {
        if (sig) {
            snprintf(sigh, sizeof sigh, "%s: %s", DELTA_SIG_HEADER, sig);
            hdr = curl_slist_append(hdr, sigh);
        }
        snprintf(cth, sizeof cth, "Content-Type: %s", ctype);
        hdr = curl_slist_append(hdr, cth);
        curl_easy_setopt(c, CURLOPT_POST, 1L);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, (const char *)body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)size);
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, resp);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(timeout_s > 0.001 ? timeout_s * 1000 : 1));
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, sh->insecure ? 0L : 1L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, sh->insecure ? 0L : 2L);
    if (sh->cacert) curl_easy_setopt(c, CURLOPT_CAINFO, sh->cacert);
    long code = 0;
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    else snprintf(p->msg, sizeof p->msg, "%s", curl_easy_strerror(rc));
    curl_off_t up = 0;
    if (body && curl_easy_getinfo(c, CURLINFO_SIZE_UPLOAD_T, &up) == CURLE_OK && up > 0) p->bytes += (unsigned long long)up;
    curl_slist_free_all(hdr);
    curl_easy_cleanup(c);
    return code;
}

static const char *json_err_msg(json_t *j) {
    json_t *e = json_object_get(j, "error");
    const char *m = json_string_value(json_object_get(e, "message"));
    return m ? m : json_string_value(e) ? json_string_value(e) : "(no message)";
}

/* POST body to path until an answer that is not transient, the retries or
 * the deadline; returns the status with *out the parsed answer (or NULL). */
static long post_retried(Push *p, const char *path, const void *body, size_t size, const char *ctype, const char *sig,
                         json_t **out) {
    const Shared *sh = p->sh;
    unsigned seed = (unsigned)(uintptr_t)p ^ (unsigned)time(NULL);
    long code = 0;
    *out = NULL;
    for (int a = 0; a <= sh->retries; a++) {
        p->attempts++;
        Resp r = {0};
        p->msg[0] = 0;
        code = http_call(p, path, body, size, ctype, sig, sh->deadline - now_s(), &r);
        p->http = code;
        json_t *j = r.p ? json_loadb(r.p, r.n, 0, NULL) : NULL;
        free(r.p);
        int transient = code == 0 || code == 429 || code >= 500;
        if (!transient) {
            *out = j;
            return code;
        }
        if (code) snprintf(p->msg, sizeof p->msg, "HTTP %ld: %s", code, j ? json_err_msg(j) : "(no JSON body)");
        json_decref(j);
        double delay = 0.2 * (double)(1 << (a < 5 ? a : 5));
        if (delay > 5) delay = 5;
        delay *= 0.5 + 0.5 * (double)rand_r(&seed) / RAND_MAX;
        if (a == sh->retries) break;
        if (now_s() + delay >= sh->deadline) {
            strncat(p->msg, " (deadline reached)", sizeof p->msg - strlen(p->msg) - 1);
            break;
        }
        usleep((useconds_t)(delay * 1e6));
    }
    return code;
}

/* Read back the sampler's view and hold it to the delta's promises. */
static void verify_get(Push *p) {
    const DeltaFile *df = p->sh->df;
    Resp r = {0};
    long code = http_call(p, "/admin/v1/weights", NULL, 0, NULL, NULL, p->sh->deadline - now_s(), &r);
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
    snprintf(want, sizeof want, "%016" PRIx64, df->h.fingerprint);
    p->version = json_is_integer(v) ? json_integer_value(v) : -1;
    p->ok = 0;
    if (p->version != (int64_t)df->h.target_version)
        snprintf(p->msg, sizeof p->msg, "GET reports version %" PRId64 ", expected %" PRIu64, p->version,
                 df->h.target_version);
    else if (!fp || strcmp(fp, want) != 0)
        snprintf(p->msg, sizeof p->msg, "GET reports model fingerprint %s, expected %s", fp ? fp : "(none)", want);
    else if (!json_is_object(t))
        snprintf(p->msg, sizeof p->msg, "GET has no tensors object");
    else {
        p->ok = 1;
        for (int i = 0; i < df->n && p->ok; i++) {
            const char *h = json_string_value(json_object_get(t, df->e[i].name));
            snprintf(want, sizeof want, "%016" PRIx64, df->e[i].hash_after);
            if (!h || strcmp(h, want) != 0) {
                snprintf(p->msg, sizeof p->msg, "tensor '%s': sampler hash %s, delta says %s", df->e[i].name,
                         h ? h : "(missing)", want);
                p->ok = 0;
            }
        }
        p->tensors = json_incref(t);
    }
    json_decref(j);
    free(r.p);
}

/* Tell the sampler the fleet's version (readiness, docs/fleet.md); a sampler
 * without the endpoint (404) is noted, not failed. */
static void announce(Push *p, uint64_t version) {
    char body[64];
    int n = snprintf(body, sizeof body, "{\"version\": %" PRIu64 "}", version);
    Resp r = {0};
    char keep[sizeof p->msg];
    memcpy(keep, p->msg, sizeof keep);
    unsigned long long bytes = p->bytes;
    long code = http_call(p, "/admin/v1/fleet", body, (size_t)n, "application/json", NULL, ANNOUNCE_TIMEOUT_S, &r);
    p->bytes = bytes; /* the table counts weights traffic */
    memcpy(p->msg, keep, sizeof keep);
    json_t *j = code == 200 && r.p ? json_loadb(r.p, r.n, 0, NULL) : NULL;
    if (j) snprintf(p->ready, sizeof p->ready, "%s", json_is_true(json_object_get(j, "ready")) ? "ready" : "NOT ready");
    else if (code == 404) snprintf(p->ready, sizeof p->ready, "no readiness endpoint");
    else snprintf(p->ready, sizeof p->ready, "announce failed (HTTP %ld)", code);
    json_decref(j);
    free(r.p);
}

/* p is behind the delta's base (at version cv): send what it missed. 0 when
 * it reached the base (chain) or the target (reload: *at_target set). */
static int catch_up(Push *p, uint64_t cv, int *at_target) {
    const Shared *sh = p->sh;
    const DeltaFile *df = sh->df;
    *at_target = 0;
    int idx[FLEET_MAX_CHAIN];
    int n = sh->chain->n ? fleet_chain_path(sh->chain, cv, df->h.base_version, idx,
                                            sh->max_chain < FLEET_MAX_CHAIN ? sh->max_chain : FLEET_MAX_CHAIN)
                         : -1;
    announce(p, df->h.base_version); /* not ready while it catches up */
    if (n >= 0) {
        for (int i = 0; i < n; i++) {
            const FleetLink *k = &sh->chain->link[idx[i]];
            const uint8_t *kb;
            size_t ks;
            const char *ksig;
            if (fleet_chain_body(sh->chain, idx[i], &kb, &ks, &ksig, p->msg, sizeof p->msg) < 0) return -1;
            json_t *j;
            long code = post_retried(p, "/admin/v1/weights/delta", kb, ks, "application/octet-stream", ksig, &j);
            if (code != 200) {
                char prev[sizeof p->msg];
                snprintf(prev, sizeof prev, "%s", p->msg[0] ? p->msg : "(no JSON body)");
                snprintf(p->msg, sizeof p->msg, "catching up from version %" PRIu64 ": %.160s (%" PRIu64 " -> %" PRIu64
                         ") answered HTTP %ld: %.200s", cv, k->path, k->base, k->target, code, j ? json_err_msg(j) : prev);
                json_decref(j);
                return -1;
            }
            json_decref(j);
            p->caught_up++;
        }
        return 0;
    }
    if (!sh->reload) {
        snprintf(p->msg, sizeof p->msg, "sampler at version %" PRIu64 ", behind the delta's base %" PRIu64 ": %s", cv,
                 df->h.base_version, sh->chain->n ? "the chain (--chain) has no path from there within --max-chain "
                 "and there is no --reload" : "give --chain DIR (the earlier deltas) or --reload DIR to catch it up");
        return -1;
    }
    json_t *b = json_object();
    json_object_set_new(b, "path", json_string(sh->reload));
    json_object_set_new(b, "version", json_integer((json_int_t)df->h.target_version));
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    json_t *j;
    long code = post_retried(p, "/admin/v1/weights/reload", s, strlen(s), "application/json", NULL, &j);
    free(s);
    if (code != 200) {
        char prev[sizeof p->msg];
        snprintf(prev, sizeof prev, "%s", p->msg[0] ? p->msg : "(no JSON body)");
        snprintf(p->msg, sizeof p->msg, "catching up from version %" PRIu64 " by a full reload of %.160s: HTTP %ld: %.200s",
                 cv, sh->reload, code, j ? json_err_msg(j) : prev);
        json_decref(j);
        return -1;
    }
    json_decref(j);
    p->caught_up = -1;
    *at_target = 1;
    return 0;
}

static void *push_one(void *arg) {
    Push *p = arg;
    const Shared *sh = p->sh;
    const DeltaFile *df = sh->df;
    double t0 = now_s();
    p->version = p->before = -1;
    int round = 0;
    if (sh->chain->n || sh->reload) {
        /* able to catch up: learn the version first, so a replica that is behind is not sent the delta
         * twice (a 409 comes only after the whole body is in) */
        Resp r = {0};
        long code = http_call(p, "/admin/v1/fleet", NULL, 0, NULL, NULL, ANNOUNCE_TIMEOUT_S, &r);
        json_t *j = code == 200 && r.p ? json_loadb(r.p, r.n, 0, NULL) : NULL;
        json_t *v = json_object_get(j, "version");
        free(r.p);
        p->msg[0] = 0;
        if (json_is_integer(v) && json_integer_value(v) >= 0 &&
            (uint64_t)json_integer_value(v) < df->h.base_version) {
            uint64_t cv = (uint64_t)json_integer_value(v);
            int at_target = 0;
            p->before = (int64_t)cv;
            json_decref(j);
            round = 1;
            if (catch_up(p, cv, &at_target) < 0 || at_target) {
                if (at_target) verify_get(p);
                goto done;
            }
        } else json_decref(j);
    }
    for (; round < 2; round++) {
        json_t *j;
        long code = post_retried(p, "/admin/v1/weights/delta", sh->body, sh->size, "application/octet-stream", sh->sig,
                                 &j);
        if (code == 200) {
            json_t *v = json_object_get(j, "version");
            p->noop = json_is_true(json_object_get(j, "noop"));
            if (p->before < 0) p->before = (int64_t)(p->noop ? df->h.target_version : df->h.base_version);
            p->version = json_is_integer(v) ? json_integer_value(v) : -1;
            json_decref(j);
            verify_get(p);
            break;
        }
        if (code == 409) {
            json_t *v = json_object_get(j, "current_version");
            int64_t cv = json_is_integer(v) ? json_integer_value(v) : -1;
            if (p->before < 0) p->before = cv;
            p->version = cv;
            int at_target = 0;
            if (round == 0 && cv >= 0 && (uint64_t)cv < df->h.base_version && (sh->chain->n || sh->reload)) {
                json_decref(j);
                if (catch_up(p, (uint64_t)cv, &at_target) < 0) break;
                if (at_target) {
                    verify_get(p);
                    break;
                }
                continue; /* at the base now: the delta itself */
            }
            snprintf(p->msg, sizeof p->msg, "conflict: sampler at version %" PRId64 ": %s", cv,
                     j ? json_err_msg(j) : "(no body)");
            json_decref(j);
            break;
        }
        if (j || (code && code < 500 && code != 429)) /* a transient failure's message is post_retried's */
            snprintf(p->msg, sizeof p->msg, "HTTP %ld: %s", code, j ? json_err_msg(j) : "(no JSON body)");
        json_decref(j);
        break;
    }
done:
    if (p->ok) announce(p, df->h.target_version);
    p->secs = now_s() - t0;
    return NULL;
}

static void *announce_one(void *arg) {
    Push *p = arg;
    announce(p, p->sh->df->h.target_version);
    return NULL;
}

static void usage_fail(void) {
    CHECK(0, "usage: trainer push step.delta (--to URL ... | --targets FILE | --router URL) [--admin-token T]\n"
          "       [--deadline S] [--retries N] [--chain DIR] [--max-chain K] [--reload DIR] [--key-file K] ...");
}

int cmd_push(int argc, char **argv) {
    const char *path = NULL, *token = getenv("SAMPLER_ADMIN_TOKEN"), *router_key = NULL;
    const char *cacert = NULL, *key_file = NULL, *chain_dir = NULL, *reload = NULL;
    static FleetTargets T;
    int retries = 5, insecure = 0, max_chain = 16;
    double deadline = 120;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
        if (strcmp(a, "--to") == 0 && more) fleet_add_url(&T, argv[++i]);
        else if (strcmp(a, "--targets") == 0 && more) fleet_add_file(&T, argv[++i]);
        else if (strcmp(a, "--router") == 0 && more) fleet_add_router(&T, argv[++i], router_key);
        else if (strcmp(a, "--router-key") == 0 && more) router_key = argv[++i];
        else if (strcmp(a, "--admin-token") == 0 && more) token = argv[++i];
        else if (strcmp(a, "--deadline") == 0 && more) deadline = atof(argv[++i]);
        else if (strcmp(a, "--retries") == 0 && more) retries = atoi(argv[++i]);
        else if (strcmp(a, "--chain") == 0 && more) chain_dir = argv[++i];
        else if (strcmp(a, "--max-chain") == 0 && more) max_chain = atoi(argv[++i]);
        else if (strcmp(a, "--reload") == 0 && more) reload = argv[++i];
        else if (strcmp(a, "--cacert") == 0 && more) cacert = argv[++i];
        else if (strcmp(a, "--key-file") == 0 && more) key_file = argv[++i];
        else if (strcmp(a, "--insecure") == 0) insecure = 1;
        else if (a[0] != '-' && !path) path = a;
        else CHECK(0, "trainer push: unknown or incomplete argument '%s'", a);
    }
    if (!path || T.n == 0) usage_fail();
    CHECK(max_chain >= 0, "--max-chain must be >= 0");
    CHECK(deadline > 0, "--deadline must be > 0 seconds");
    size_t size;
    uint8_t *buf = read_file(path, &size);
    DeltaFile *df;
    Err err = {0};
    CHECK(delta_parse(&df, buf, size, &err) == 0, "%s: %s (not pushed)", path, err.msg);
    char sig[DELTA_SIG_CHARS + 1];
    uint8_t *key = NULL;
    size_t nk = 0;
    if (key_file) {
        CHECK(delta_key_load(key_file, &key, &nk, &err) == 0, "--key-file: %s", err.msg);
        CHECK(delta_sign(key, nk, buf, size, sig, &err) == 0, "%s: %s", path, err.msg);
    }
    FleetChain chain = {0};
    if (chain_dir) fleet_chain_load(&chain, chain_dir, df->h.fingerprint, key, nk);
    if (cacert) {
        FILE *f = fopen(cacert, "rb");
        CHECK_PTR(f, "--cacert %s: cannot open (a PEM file of the CA certificates to trust)", cacert);
        fclose(f);
    }
    if (insecure)
        fprintf(stderr, "trainer push: WARNING: --insecure: TLS certificates are NOT verified; anyone on the path "
                "can read the admin token and impersonate the samplers\n");
    int n = T.n;
    for (int i = 0; i < n; i++)
        if (strncmp(T.url[i], "http://", 7) == 0 && !strstr(T.url[i], "://127.") && !strstr(T.url[i], "://localhost"))
            fprintf(stderr, "trainer push: warning: %s is plain HTTP: the admin token and the delta travel in clear "
                    "text (use https://)\n", T.url[i]);
    double t0 = now_s();
    Shared sh = {.df = df, .body = buf, .size = size, .sig = key_file ? sig : NULL, .token = token, .cacert = cacert,
                 .insecure = insecure, .deadline = t0 + deadline, .retries = retries, .chain = &chain,
                 .max_chain = max_chain, .reload = reload};
    Push *ps = xcalloc((size_t)n, sizeof(Push));
    pthread_t *th = xcalloc((size_t)n, sizeof(pthread_t));
    for (int i = 0; i < n; i++) {
        ps[i] = (Push){.sh = &sh, .url = T.url[i]};
        CHECK(pthread_create(&th[i], NULL, push_one, &ps[i]) == 0, "cannot start a thread");
    }
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    int n_ok = 0;
    json_t *ref = NULL;
    const char *ref_url = NULL;
    for (int i = 0; i < n; i++) {
        Push *p = &ps[i];
        if (p->ok && p->tensors) {
            if (!ref) {
                ref = p->tensors;
                ref_url = p->url;
            } else if (!json_equal(ref, p->tensors)) {
                p->ok = 0;
                snprintf(p->msg, sizeof p->msg, "tensor hashes differ from %s's", ref_url);
            }
        }
        n_ok += p->ok;
    }
    /* the fleet is at the target once any sampler is: the others are told, so a reachable one left behind
     * stops answering ready and the routers route around it */
    int *ann = xcalloc((size_t)n, sizeof(int));
    if (n_ok > 0)
        for (int i = 0; i < n; i++)
            if (!ps[i].ok) {
                CHECK(pthread_create(&th[i], NULL, announce_one, &ps[i]) == 0, "cannot start a thread");
                ann[i] = 1;
            }
    for (int i = 0; i < n; i++)
        if (ann[i]) pthread_join(th[i], NULL);
    free(ann);
    unsigned long long total = 0;
    for (int i = 0; i < n; i++) total += ps[i].bytes;
    printf("push %s (%zu bytes, version %" PRIu64 " -> %" PRIu64 ") to %d samplers in %.3f s, %llu bytes sent\n", path,
           size, df->h.base_version, df->h.target_version, n, now_s() - t0, total);
    printf("  %-40s %-8s %7s %7s %12s %8s %4s %8s  %s\n", "target", "result", "before", "after", "bytes", "seconds",
           "http", "attempts", "notes");
    for (int i = 0; i < n; i++) {
        Push *p = &ps[i];
        char before[24], after[24], notes[sizeof p->msg + 256] = "";
        snprintf(before, sizeof before, p->before >= 0 ? "%" PRId64 : "?", p->before);
        snprintf(after, sizeof after, p->version >= 0 ? "%" PRId64 : "?", p->version);
        if (p->caught_up > 0) snprintf(notes, sizeof notes, "caught up with %d chain deltas; ", p->caught_up);
        else if (p->caught_up < 0) snprintf(notes, sizeof notes, "caught up by a full reload; ");
        if (p->ready[0]) snprintf(notes + strlen(notes), sizeof notes - strlen(notes), "%s; ", p->ready);
        snprintf(notes + strlen(notes), sizeof notes - strlen(notes), "%s", p->msg);
        size_t nl = strlen(notes);
        while (nl > 0 && (notes[nl - 1] == ' ' || notes[nl - 1] == ';')) notes[--nl] = 0;
        printf("  %-40s %-8s %7s %7s %12llu %8.3f %4ld %8d  %s\n", p->url,
               p->ok ? (p->noop ? "noop" : "ok") : "FAILED", before, after, p->bytes, p->secs, p->http, p->attempts,
               notes);
    }
    if (n_ok != n)
        fprintf(stderr, "trainer push: FAILED: %d of %d samplers are not on version %" PRIu64
                " with the delta's hashes; see the lines above\n", n - n_ok, n, df->h.target_version);
    else printf("all %d samplers on version %" PRIu64 " with identical hashes\n", n, df->h.target_version);
    for (int i = 0; i < n; i++) json_decref(ps[i].tensors);
    free(ps);
    free(th);
    fleet_chain_free(&chain);
    if (key) {
        explicit_bzero(key, nk);
        free(key);
    }
    delta_file_free(df);
    free(buf);
    return n_ok == n ? 0 : 1;
}
