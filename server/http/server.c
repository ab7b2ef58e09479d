/*
 * server.c - the Server object (server.h): its defaults, the start-up wiring
 * (delta key, TLS files, device, model, runner and engine backend, engine,
 * tokenizer, weight version and lineage, start-up deltas), start, graceful
 * shutdown and free; and the state the handlers share: the engine-version ->
 * checkpoint-version map, the live requests (abort by id) and response ids.
 *
 * Start-up failures are fatal with a message that says how to fix them; the
 * order is that of the checks a user can get wrong cheaply first (key, TLS
 * files) before the slow ones (model load).
 *
 * Not here: the command line (flags.c), routes (routes.c), the
 * libmicrohttpd layer (http.c), endpoints (api_*.c).
 */
#define _GNU_SOURCE
#include "server.h"
#include "structured.h"

#include <arpa/inet.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "delta.h"
#include "delta_sign.h"
#include "device_select.h"
#include "log.h"
#include "lora.h"
#include "runner_backend.h"

void server_config_default(ServerConfig *c) {
    *c = (ServerConfig){
        .model_dir = SAMPLER_SOURCE_DIR "/models/tiny-qwen3", .load = {.precision = PREC_BF16},
        .host = "127.0.0.1", .port = 8000, .max_body_bytes = 8u << 20, .max_delta_bytes = 4ull << 30,
        .max_connections = 1024, .connection_timeout_s = 30, .header_timeout_s = 10, .max_header_bytes = 32u << 10, .shutdown_timeout_s = 30,
        .max_logprobs = SAMPLING_MAX_TOP_N, .max_n = 128, .reasoning_parser = 1, .tool_parser = 1,
        .mask_json_max_ids = 4096, .max_lora_rank = 64,
    };
    engine_config_default(&c->engine);
    c->engine.max_loras = 8;
}

/* The delta key the Server owns: loaded from delta_key_file, or a copy of delta_key. */
static void own_delta_key(Server *s, const ServerConfig *c) {
    s->cfg.delta_key = NULL;
    s->cfg.delta_key_len = 0;
    if (c->delta_key_file) {
        uint8_t *k;
        Err err = {0};
        CHECK(delta_key_load(c->delta_key_file, &k, &s->cfg.delta_key_len, &err) == 0, "--delta-key-file: %s",
              err.msg);
        s->cfg.delta_key = k;
    } else if (c->delta_key) {
        uint8_t *k = xmalloc(c->delta_key_len ? c->delta_key_len : 1);
        memcpy(k, c->delta_key, c->delta_key_len);
        s->cfg.delta_key = k;
        s->cfg.delta_key_len = c->delta_key_len;
    }
}

/* model_dir (resolved) and the served name: --served-model-name, else the directory's base name. */
static void set_names(Server *s) {
    const char *dir = s->cfg.model_dir;
    char *rp = realpath(dir, NULL);
    snprintf(s->model_dir, sizeof s->model_dir, "%s", rp ? rp : dir);
    free(rp);
    if (s->cfg.served_model_name) {
        snprintf(s->model_name, sizeof s->model_name, "%s", s->cfg.served_model_name);
    } else {
        char tmp[sizeof s->model_dir];
        snprintf(tmp, sizeof tmp, "%s", s->model_dir);
        snprintf(s->model_name, sizeof s->model_name, "%s", basename(tmp));
    }
}

/* The weight version of the checkpoint and its lineage fingerprint (--weight-version, --model-fingerprint). */
static void set_weight_version(Server *s) {
    const ServerConfig *c = &s->cfg;
    int threads = c->engine.n_threads > 0 ? c->engine.n_threads : 4;
    s->wv = weight_version_from_safetensors(s->model->st, threads);
    s->wv->version = c->weight_version;
    if (c->model_fingerprint) {
        char *end;
        s->wv->fingerprint = strtoull(c->model_fingerprint, &end, 16);
        CHECK(*c->model_fingerprint && !*end, "--model-fingerprint: expected 16 hex digits, got '%s'",
              c->model_fingerprint);
    }
    CHECK(c->weight_version == 0 || c->model_fingerprint, "--weight-version %llu needs --model-fingerprint (the "
          "lineage's, printed by `trainer inspect` of any delta)", (unsigned long long)c->weight_version);
}

Server *server_create(const ServerConfig *c) {
    Server *s = xcalloc(1, sizeof *s);
    s->cfg = *c;
    atomic_store(&s->fleet_version, c->fleet ? FLEET_UNKNOWN : 0);
    pthread_mutex_init(&s->admin_mu, NULL);
    pthread_mutex_init(&s->live_mu, NULL);
    structured_init(s);
    own_delta_key(s, c);
    if (!c->engine_only) http_tls_load(s);

    EngineConfig *ec = &s->cfg.engine;
    Err err = {0};
    DeviceChoice dev;
    CHECK(device_select(&dev, c->force_cpu, c->load.precision, &err) == 0, "%s", err.msg);
    dev.native_crossover = c->native_crossover;
    if (c->native_crossover && (!dev.gpu || c->load.precision == PREC_BF16 || c->load.weight_only))
        log_info("--native-crossover %d: no effect (it chooses between the GPU's weight-only and native paths of "
                 "fp8 / nvfp4 with quantized activations)", c->native_crossover);
    CHECK(device_native_check(&dev, &s->cfg.load, &err) == 0, "%s", err.msg);
    CHECK(model_load_opts(&s->model, c->model_dir, &s->cfg.load, &err) == 0,
          "%s\n  fix: pass --model with a Hugging Face model directory (and a --precision it supports)", err.msg);
    engine_config_resolve(ec, &s->model->cfg);
    s->runner = device_runner_create(&dev, s->model, ec->max_batched_tokens, ec->max_model_len, ec->n_threads);
    /* --dtype: auto takes BF16 activations where they are the faster choice (the CPU backend with
     * AVX512_BF16); elsewhere f32 (an AVX2-only CPU emulates the BF16 order at ~0.5x the f32 speed) */
    s->act_bf16 = c->act_dtype == SERVER_DTYPE_BF16 ||
                  (c->act_dtype == SERVER_DTYPE_AUTO && runner_act_bf16_fast(s->runner));
    CHECK(runner_set_act_bf16(s->runner, s->act_bf16) == 0, "--dtype bfloat16: this backend computes with f32 "
          "activations only\n  fix: pass --dtype float32 (or auto)");
    if (c->enforce_eager) runner_set_graphs(s->runner, 0);
    /* device backends, before the KV cache: the adapter pool, only when LoRA was asked for (vLLM's
     * --enable-lora): at --max-lora-rank on every linear a MoE model's experts make it large */
    if (c->enable_lora || c->n_loras > 0)
        runner_reserve_lora(s->runner, ec->max_loras, c->max_lora_rank, (LoraDtype)c->lora_dtype);
    s->be = runner_backend_create(s->model, s->runner, ec, &s->metrics.forward_ns, &s->metrics.forward_calls,
                                  s->metrics.forward_graphs);
    runner_backend_count_device(&s->be, &s->metrics.device_ns);
    s->vocab = s->model->cfg.vocab;
    if (c->engine_only) {
        ec->verbose = 0;
        s->eng = engine_create(&s->model->cfg, &s->be, ec);
        s->max_model_len = engine_config(s->eng)->max_model_len;
        return s;
    }

    s->tok = tokenizer_load(c->tokenizer_dir ? c->tokenizer_dir : c->model_dir, &err);
    CHECK_PTR(s->tok, "%s\n  fix: the model directory needs tokenizer.json (or pass --tokenizer DIR)", err.msg);
    set_names(s);
    s->created = server_now_s();
    set_weight_version(s);
    s->eng = engine_create(&s->model->cfg, &s->be, ec);
    s->max_model_len = engine_config(s->eng)->max_model_len;
    server_map_version(s, 0, s->wv->version);
    for (int i = 0; i < c->n_deltas; i++) admin_apply_delta_file(s, c->deltas[i]);
    lora_startup(s);
    return s;
}

static int host_is_loopback(const char *host) {
    struct in_addr a;
    return inet_pton(AF_INET, host, &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

void server_start(Server *s) {
    uint64_t version = s->wv->version; /* read before listening: a delta may update it from then on */
    http_listen(s);
    const ServerConfig *c = &s->cfg;
    if (c->admin_token && !c->tls_cert && !host_is_loopback(c->host))
        log_warn("WARNING: the admin endpoints (weights, pause, abort) are reachable over plain HTTP on %s: the "
                 "admin token and the deltas cross the network in clear text; use --tls-cert/--tls-key, "
                 "a private network, or --host 127.0.0.1", c->host);
    if (c->admin_token && !c->delta_key)
        log_info("deltas are unauthenticated (admin token only): pass --delta-key-file to require signed deltas");
    log_info("serving %s (%s) on %s://%s:%d  (max_model_len %d, dtype %s, weight version %llu%s%s%s)", s->model_name,
             s->model_dir, c->tls_cert ? "https" : "http", c->host, s->bound_port, s->max_model_len,
             s->act_bf16 ? "bfloat16" : "float32", (unsigned long long)version, c->api_key ? ", API key required" : "",
             c->admin_token ? ", admin endpoints on" : "", c->delta_key ? ", signed deltas required" : "");
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

void server_shutdown(Server *s) {
    atomic_store(&s->shutting_down, 1);
    http_quiesce(s);
    log_info("shutting down: %d request(s) in flight, waiting up to %.0f s", atomic_load(&s->inflight),
             s->cfg.shutdown_timeout_s);
    double t0 = now_s();
    while (atomic_load(&s->inflight) > 0 && now_s() - t0 < s->cfg.shutdown_timeout_s) usleep(20000);
    if (atomic_load(&s->inflight) > 0) {
        log_warn("shutting down: aborting %d request(s)", atomic_load(&s->inflight));
        server_live_abort(s, NULL);
        t0 = now_s();
        while (atomic_load(&s->inflight) > 0 && now_s() - t0 < 5) usleep(20000);
    }
    http_close(s);
}

void server_free(Server *s) {
    if (!s) return;
    http_close(s);
    engine_free(s->eng);
    runner_backend_free(&s->be); /* and the runner */
    lora_shutdown(s);
    weight_version_free(s->wv);
    tokenizer_free(s->tok);
    model_free(s->model);
    if (s->cfg.delta_key) {
        explicit_bzero((void *)s->cfg.delta_key, s->cfg.delta_key_len);
        free((void *)s->cfg.delta_key);
    }
    free(s->version_map);
    pthread_mutex_destroy(&s->admin_mu);
    pthread_mutex_destroy(&s->live_mu);
    structured_free(s);
    free(s);
}

/* ---- shared state ---- */
int64_t server_now_s(void) { return (int64_t)time(NULL); }

void server_new_id(Server *s, const char *prefix, char *out, size_t cap) {
    uint64_t k = atomic_fetch_add(&s->next_id, 1);
    /* mix so ids do not look sequential across restarts */
    uint64_t x = (k + (uint64_t)s->created * 0x9E3779B97F4A7C15ull) * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 31;
    snprintf(out, cap, "%s-%016llx", prefix, (unsigned long long)x);
}

uint64_t server_weight_version(Server *s, uint64_t e) {
    pthread_mutex_lock(&s->live_mu);
    uint64_t v = e < (uint64_t)s->n_versions ? s->version_map[e] : e;
    pthread_mutex_unlock(&s->live_mu);
    return v;
}

void server_map_version(Server *s, uint64_t e, uint64_t v) {
    pthread_mutex_lock(&s->live_mu);
    while ((uint64_t)s->n_versions <= e) {
        if (s->n_versions == s->cap_versions) {
            s->cap_versions = s->cap_versions ? 2 * s->cap_versions : 64;
            s->version_map = realloc(s->version_map, sizeof(uint64_t) * (size_t)s->cap_versions);
            CHECK_PTR(s->version_map, "out of memory");
        }
        s->version_map[s->n_versions] = s->n_versions ? s->version_map[s->n_versions - 1] : 0;
        s->n_versions++;
    }
    s->version_map[e] = v;
    pthread_mutex_unlock(&s->live_mu);
}

/* ---- live requests (abort by id) ---- */
void server_live_add(Server *s, LiveReq *l) {
    pthread_mutex_lock(&s->live_mu);
    l->prev = NULL;
    l->next = s->live;
    if (s->live) s->live->prev = l;
    s->live = l;
    pthread_mutex_unlock(&s->live_mu);
}

void server_live_remove(Server *s, LiveReq *l) {
    pthread_mutex_lock(&s->live_mu);
    if (l->prev) l->prev->next = l->next;
    else if (s->live == l) s->live = l->next;
    if (l->next) l->next->prev = l->prev;
    l->next = l->prev = NULL;
    pthread_mutex_unlock(&s->live_mu);
}

int server_live_abort(Server *s, const char *id) {
    int n = 0;
    pthread_mutex_lock(&s->live_mu);
    for (LiveReq *l = s->live; l; l = l->next) {
        if (id && strcmp(id, l->id) != 0) continue;
        for (int i = 0; i < l->n_reqs; i++) if (l->reqs[i]) engine_abort(s->eng, l->reqs[i]);
        n++;
    }
    pthread_mutex_unlock(&s->live_mu);
    return n;
}
