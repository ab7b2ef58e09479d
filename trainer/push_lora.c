/*
 * push_lora.c - `trainer push-lora DIR --name NAME --to URL ...`: send a PEFT
 * LoRA adapter directory (adapter_config.json + adapter_model.safetensors) to
 * running samplers' POST /admin/v1/lora, the RL-with-LoRA update: megabytes
 * after each optimizer step instead of a model. --inplace replaces the
 * adapter of that name (its version moves by one); without it a name already
 * served is refused. --key-file signs the body (X-Delta-Signature,
 * delta_sign.h) for samplers started with --delta-key-file, as deltas are.
 * Transport errors, 5xx and 429 are retried (--retries, default 3) with
 * exponential backoff; exits non-zero unless every sampler answered 200.
 *
 * Body: "SLORA\x01\0\0", u32 LE n, n bytes of JSON {"lora_name",
 * "load_inplace", "adapter_config"}, then the adapter_model.safetensors
 * bytes (docs/lora.md, "Pushed adapters"). Not here: the adapter's checks
 * (the sampler's lora.c does them all and answers 400 naming what is wrong).
 */
#include <curl/curl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "delta_sign.h"
#include "trainer.h"

#define MAX_TARGETS 256

typedef struct Resp {
    char p[4096];
    size_t n;
} Resp;

static size_t on_data(char *ptr, size_t sz, size_t nm, void *ud) {
    Resp *r = ud;
    size_t n = sz * nm, k = n < sizeof r->p - 1 - r->n ? n : sizeof r->p - 1 - r->n;
    memcpy(r->p + r->n, ptr, k);
    r->n += k;
    r->p[r->n] = 0;
    return n;
}

static long post(const char *url, const uint8_t *body, size_t n, const char *token, const char *sig,
                 const char *cacert, int insecure, Resp *resp, char *msg, size_t cap) {
    CURL *c = curl_easy_init();
    CHECK_PTR(c, "curl_easy_init failed");
    char u[2048], auth[1024], sh[DELTA_SIG_CHARS + 64];
    snprintf(u, sizeof u, "%s/admin/v1/lora", url);
    struct curl_slist *hdr = curl_slist_append(NULL, "Expect:");
    hdr = curl_slist_append(hdr, "Content-Type: application/octet-stream");
    if (token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        hdr = curl_slist_append(hdr, auth);
    }
    if (sig) {
        snprintf(sh, sizeof sh, "%s: %s", DELTA_SIG_HEADER, sig);
        hdr = curl_slist_append(hdr, sh);
    }
    curl_easy_setopt(c, CURLOPT_URL, u);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, (const char *)body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)n);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, resp);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 600000L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, insecure ? 0L : 1L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, insecure ? 0L : 2L);
    if (cacert) curl_easy_setopt(c, CURLOPT_CAINFO, cacert);
    long code = 0;
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    else snprintf(msg, cap, "%s", curl_easy_strerror(rc));
    curl_slist_free_all(hdr);
    curl_easy_cleanup(c);
    return code;
}

/* The body for DIR (fatal on a missing or unreadable file). */
static uint8_t *build_body(const char *dir, const char *name, int inplace, size_t *n) {
    char path[4096];
    path_join(path, sizeof path, dir, "adapter_config.json");
    json_error_t je;
    json_t *cfg = json_load_file(path, 0, &je);
    CHECK(cfg && json_is_object(cfg), "%s: not a JSON object: %s (line %d)", path, je.text, je.line);
    json_t *h = json_pack("{s:s, s:b, s:O}", "lora_name", name, "load_inplace", inplace, "adapter_config", cfg);
    char *hs = json_dumps(h, JSON_COMPACT);
    CHECK_PTR(hs, "out of memory");
    json_decref(h);
    json_decref(cfg);
    path_join(path, sizeof path, dir, "adapter_model.safetensors");
    size_t ns = 0;
    uint8_t *st = read_file(path, &ns);
    size_t hn = strlen(hs);
    *n = 12 + hn + ns;
    uint8_t *b = xmalloc(*n);
    memcpy(b, "SLORA\x01\0\0", 8);
    for (int i = 0; i < 4; i++) b[8 + i] = (uint8_t)(hn >> (8 * i));
    memcpy(b + 12, hs, hn);
    memcpy(b + 12 + hn, st, ns);
    free(hs);
    free(st);
    return b;
}

int cmd_push_lora(int argc, char **argv) {
    const char *dir = NULL, *name = NULL, *token = getenv("SAMPLER_ADMIN_TOKEN"), *urls[MAX_TARGETS];
    const char *key_file = NULL, *cacert = NULL;
    int n_urls = 0, inplace = 0, insecure = 0, retries = 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
        if (strcmp(a, "--to") == 0 && more) {
            CHECK(n_urls < MAX_TARGETS, "at most %d --to", MAX_TARGETS);
            urls[n_urls++] = argv[++i];
        } else if (strcmp(a, "--name") == 0 && more) name = argv[++i];
        else if (strcmp(a, "--admin-token") == 0 && more) token = argv[++i];
        else if (strcmp(a, "--key-file") == 0 && more) key_file = argv[++i];
        else if (strcmp(a, "--cacert") == 0 && more) cacert = argv[++i];
        else if (strcmp(a, "--retries") == 0 && more) retries = atoi(argv[++i]);
        else if (strcmp(a, "--inplace") == 0) inplace = 1;
        else if (strcmp(a, "--insecure") == 0) insecure = 1;
        else if (a[0] != '-' && !dir) dir = a;
        else CHECK(0, "push-lora: unknown or incomplete argument '%s'", a);
    }
    CHECK(dir && name && n_urls > 0, "usage: trainer push-lora DIR --name NAME --to URL [--to URL ...] [--inplace] "
          "[--admin-token T] [--key-file K] [--retries N] [--cacert FILE] [--insecure]");
    if (insecure) fprintf(stderr, "push-lora: --insecure: the samplers' certificates are NOT verified\n");
    size_t n = 0;
    uint8_t *body = build_body(dir, name, inplace, &n);
    char sig[DELTA_SIG_CHARS + 1], *sigp = NULL;
    if (key_file) {
        uint8_t *key;
        size_t nk;
        Err err = {0};
        CHECK(delta_key_load(key_file, &key, &nk, &err) == 0, "--key-file: %s", err.msg);
        CHECK(delta_sign(key, nk, body, n, sig, &err) == 0, "signing: %s", err.msg);
        memset(key, 0, nk);
        free(key);
        sigp = sig;
    }
    int failed = 0;
    for (int t = 0; t < n_urls; t++) {
        long code = 0;
        Resp r = {{0}, 0};
        char msg[512] = "";
        for (int k = 0; k <= retries; k++) {
            r.n = 0;
            r.p[0] = 0;
            double t0 = now_s();
            code = post(urls[t], body, n, token, sigp, cacert, insecure, &r, msg, sizeof msg);
            if (code == 200) {
                printf("%s: %s (%zu bytes, %.0f ms)\n", urls[t], r.p, n, 1e3 * (now_s() - t0));
                break;
            }
            if (code != 0 && code != 429 && code < 500) break; /* the sampler refused it: retrying cannot help */
            if (k < retries) usleep((useconds_t)(200000u << k));
        }
        if (code != 200) {
            fprintf(stderr, "%s: push-lora failed (HTTP %ld): %s\n", urls[t], code, code ? r.p : msg);
            failed = 1;
        }
    }
    free(body);
    return failed;
}
