/*
 * main.c - entry point of sampler-cpu and the per-GPU binaries: parse flags,
 * load the model and tokenizer, start the engine and the OpenAI-compatible
 * HTTP server (server.h), and shut down gracefully on SIGTERM / SIGINT.
 *
 * --prompt-ids keeps a one-shot mode (no HTTP): generate from token ids
 * through the engine and print the ids. The GPU binaries detect the device
 * and exit until the GPU backend lands.
 */
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "delta.h"
#include "delta_sign.h"
#include "engine.h"
#include "log.h"
#include "model.h"
#include "server.h"
#include "device_select.h"
#include "runner_backend.h"
#include "tokenizer.h"


static void usage(void) {
    printf(
"usage: sampler-cpu [flags]\n"
"Serves the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models, /tokenize, /detokenize,\n"
"/health, /metrics) plus the trainer's admin endpoints, on one model.\n"
"\n"
"model\n"
"  --model DIR               Hugging Face model directory (default: the bundled models/tiny-qwen3)\n"
"  --tokenizer DIR           tokenizer.json + tokenizer_config.json directory (default: --model)\n"
"  --served-model-name NAME  the model id clients send and /v1/models lists (default: DIR's base name)\n"
"  --precision P             bf16 (default), fp8 (128x128 block scales) or nvfp4 (Model Optimizer):\n"
"                            quantize-on-load of a BF16 checkpoint; a pre-quantized FP8/NVFP4\n"
"                            checkpoint runs at its own precision\n"
"  --device D                gpu (default in sampler-smXX: the CUDA backend; fp8/nvfp4 weight-only) or cpu\n"
"                            (the CPU backend, in every binary)\n"
"  --weight-only             keep activations f32 with fp8/nvfp4 weights (the A100 / Hopper-NVFP4\n"
"                            paths); default quantizes activations like the native GPU path\n"
"  --delta FILE              apply a weight delta at start-up (repeatable, in version order)\n"
"  --reload-root DIR         allow POST /admin/v1/weights/reload of checkpoints under DIR (repeatable;\n"
"                            default: full reloads disabled)\n"
"  --weight-version N        version of the checkpoint in --model (default 0)\n"
"  --model-fingerprint HEX   lineage fingerprint when --weight-version > 0 (from `trainer inspect`)\n"
"\n"
"HTTP\n"
"  --host ADDR               IPv4 address to listen on (default 127.0.0.1; 0.0.0.0 for all)\n"
"  --port N                  TCP port (default 8000; 0 picks a free one, printed at start)\n"
"  --api-key KEY             require 'Authorization: Bearer KEY' on /v1/*, /tokenize, /detokenize\n"
"                            (default: env SAMPLER_API_KEY, else no auth)\n"
"  --admin-token TOKEN       enable the admin endpoints (weights, pause/resume/abort) behind\n"
"                            'Authorization: Bearer TOKEN' (default: env SAMPLER_ADMIN_TOKEN, else disabled)\n"
"  --max-body-bytes N        largest JSON request body (default 8388608); larger -> 413\n"
"  --max-delta-bytes N       largest delta body for POST /admin/v1/weights/delta (default 4 GiB)\n"
"  --max-connections N       concurrent connections (default 1024); more are refused at accept\n"
"  --connection-timeout S    close a connection idle for S seconds, e.g. a client that stalls mid-body\n"
"                            (default 30; a streaming response waiting on the engine is not idle)\n"
"  --max-header-bytes N      per-connection memory for the request line and headers (default 32768);\n"
"                            larger headers -> 431\n"
"\n"
"security (docs/delta-format.md, README \"Security\")\n"
"  --tls-cert FILE           serve HTTPS with this PEM certificate (chain); needs --tls-key\n"
"  --tls-key FILE            the PEM private key (unencrypted) of --tls-cert\n"
"  --delta-key-file FILE     require deltas signed with this HMAC-SHA256 key (X-Delta-Signature on POST,\n"
"                            FILE.sig next to each --delta FILE); unsigned or wrongly signed -> 401\n"
"  --shutdown-timeout S      on SIGTERM, seconds to let in-flight requests finish before aborting (default 30)\n"
"\n"
"API behaviour\n"
"  --max-n N                 largest n per request (default 128)\n"
"  --max-logprobs N          largest logprobs / top_logprobs / prompt_logprobs (default 20, at most 20)\n"
"  --logprobs-mode M         processed: OpenAI logprobs fields report the distribution actually sampled\n"
"                            from (after penalties, temperature, top-k/p, min-p; default); raw: the\n"
"                            model's log_softmax(logits / T)\n"
"  --reasoning-parser P      qwen3: <think>...</think> -> reasoning_content (default); none\n"
"  --tool-call-parser P      hermes: <tool_call>{...}</tool_call> -> tool_calls (default); none\n"
"  --mask-json-max-ids N     sampling masks with more ids are sent base64-encoded (default 4096)\n"
"\n"
"engine\n"
"  --max-running-seqs N      sequences per step (default 64)\n"
"  --max-batched-tokens N    tokens per step, prefill chunks + decodes (default 2048)\n"
"  --max-model-len N         prompt + output tokens per sequence (default min(model max, 4096, KV pool))\n"
"  --max-waiting N           waiting-queue bound in requests; full -> 503 (default 1024)\n"
"  --block-size N            tokens per KV block (default 16)\n"
"  --kv-blocks N             KV pool size in blocks (default: from --kv-mem-mb)\n"
"  --kv-mem-mb N             KV pool size in MiB (default 1024)\n"
"  --no-prefix-cache         disable prefix caching\n"
"  --max-prompt-logprob-rows N  logits rows per step for prompt log-probs (default 256)\n"
"  --max-request-output-mb N  per-request budget for outputs: masks, log-probs, prompt log-probs,\n"
"                            experts (README: memory formula); over it -> 400 (default 2048)\n"
"  --max-output-mem-mb N     budget for the outputs of all requests in flight; full -> 503 (default 8192)\n"
"  --threads N               forward-pass threads (default: all cores)\n"
"\n"
"other\n"
"  --log-level L             debug, info, warn or error (default info)\n"
"  --prompt-ids 1,2,3        one-shot mode, no HTTP: greedy generation from these ids, prints the ids\n"
"  --max-tokens N            one-shot mode: tokens to generate (default 16)\n"
"  -h, --help                this text\n"
"\n"
"SIGTERM / SIGINT: stop accepting, let in-flight requests finish for --shutdown-timeout seconds,\n"
"abort the rest, exit 0.\n");
}

static int parse_ids(const char *s, int32_t *ids, int max) {
    int n = 0;
    while (*s && n < max) {
        char *end;
        long v = strtol(s, &end, 10);
        CHECK(end != s, "--prompt-ids: expected comma-separated integers, got '%s'", s);
        ids[n++] = (int32_t)v;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

static long long num(const char *flag, const char *v, long long lo, long long hi) {
    char *end;
    long long x = strtoll(v, &end, 10);
    CHECK(*v && !*end && x >= lo && x <= hi, "%s: expected an integer in [%lld, %lld], got '%s'", flag, lo, hi, v);
    return x;
}

static int oneshot(Engine *e, const int32_t *prompt, int n_prompt, int max_new) {
    EngineRequestParams p;
    engine_request_params_default(&p);
    p.prompt = prompt;
    p.n_prompt = n_prompt;
    p.sampling.temperature = 0;
    p.sampling.max_tokens = max_new;
    EngineRequest *r;
    Err err = {0};
    CHECK(engine_submit(e, &p, &r, &err) == 0, "%s", err.msg);
    uint64_t seen = 0;
    while (!engine_request_done(r)) engine_request_wait(r, &seen, 1000);
    EngineSeqView v;
    engine_request_seq(r, 0, &v);
    printf("generated:");
    for (int i = 0; i < v.n_tokens; i++) printf(" %d", v.tokens[i].token);
    printf("\nfinish: %s\n", finish_reason_name(v.finish));
    engine_request_release(r);
    return 0;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* SIGTERM: stop accepting, drain, abort the rest. */
static void shutdown_gracefully(Server *s) {
    atomic_store(&s->shutting_down, 1);
    server_quiesce(s);
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
    server_stop(s);
}

int main(int argc, char **argv) {
    static Server S;
    Server *s = &S;
    server_config_default(&s->cfg);
    EngineConfig ec;
    engine_config_default(&ec);
    const char *dir = SAMPLER_SOURCE_DIR "/models/tiny-qwen3", *tok_dir = NULL, *deltas[64];
    int n_deltas = 0, n_prompt = 0, max_new = 16;
    long long base_version = 0;
    const char *fingerprint = NULL;
    static int32_t prompt[8192];
    LoadOptions lo = {PREC_BF16, 0};
    int force_cpu = 0;
    s->cfg.api_key = getenv("SAMPLER_API_KEY");
    s->cfg.admin_token = getenv("SAMPLER_ADMIN_TOKEN");
    Err err = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(); return 0; }
        if (!strcmp(a, "--no-prefix-cache")) { ec.enable_prefix_cache = 0; continue; }
        if (!strcmp(a, "--weight-only")) { lo.weight_only = 1; continue; }
        if (!strcmp(a, "--device")) {
            CHECK(i + 1 < argc && (!strcmp(argv[i + 1], "cpu") || !strcmp(argv[i + 1], "gpu")),
                  "--device: cpu or gpu");
            force_cpu = !strcmp(argv[++i], "cpu");
            continue;
        }
        CHECK(i + 1 < argc && !strncmp(a, "--", 2), "unknown or incomplete argument '%s' (see --help)", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--tokenizer")) tok_dir = v;
        else if (!strcmp(a, "--served-model-name")) snprintf(s->model_name, sizeof s->model_name, "%s", v);
        else if (!strcmp(a, "--precision"))
            CHECK(precision_parse(v, &lo.precision) == 0, "--precision: bf16, fp8 or nvfp4, got '%s'", v);
        else if (!strcmp(a, "--reload-root")) {
            CHECK(s->cfg.n_reload_roots < 8, "at most 8 --reload-root directories");
            s->cfg.reload_roots[s->cfg.n_reload_roots++] = v;
        } else if (!strcmp(a, "--delta")) { CHECK(n_deltas < 64, "at most 64 --delta files"); deltas[n_deltas++] = v; }
        else if (!strcmp(a, "--weight-version")) base_version = num(a, v, 0, 1ll << 62);
        else if (!strcmp(a, "--model-fingerprint")) fingerprint = v;
        else if (!strcmp(a, "--host")) s->cfg.host = v;
        else if (!strcmp(a, "--port")) s->cfg.port = (int)num(a, v, 0, 65535);
        else if (!strcmp(a, "--api-key")) s->cfg.api_key = v;
        else if (!strcmp(a, "--admin-token")) s->cfg.admin_token = v;
        else if (!strcmp(a, "--max-body-bytes")) s->cfg.max_body_bytes = (size_t)num(a, v, 1, 1ll << 40);
        else if (!strcmp(a, "--max-delta-bytes")) s->cfg.max_delta_bytes = (size_t)num(a, v, 1, 1ll << 44);
        else if (!strcmp(a, "--max-connections")) s->cfg.max_connections = (int)num(a, v, 1, 1 << 20);
        else if (!strcmp(a, "--connection-timeout")) s->cfg.connection_timeout_s = (unsigned)num(a, v, 1, 86400);
        else if (!strcmp(a, "--max-header-bytes")) s->cfg.max_header_bytes = (size_t)num(a, v, 4096, 1 << 24);
        else if (!strcmp(a, "--tls-cert")) s->cfg.tls_cert = v;
        else if (!strcmp(a, "--tls-key")) s->cfg.tls_key = v;
        else if (!strcmp(a, "--delta-key-file")) {
            uint8_t *k;
            CHECK(delta_key_load(v, &k, &s->cfg.delta_key_len, &err) == 0, "--delta-key-file: %s", err.msg);
            s->cfg.delta_key = k;
        }
        else if (!strcmp(a, "--shutdown-timeout")) s->cfg.shutdown_timeout_s = (double)num(a, v, 0, 86400);
        else if (!strcmp(a, "--max-n")) s->cfg.max_n = (int)num(a, v, 1, 1024);
        else if (!strcmp(a, "--max-logprobs")) s->cfg.max_logprobs = (int)num(a, v, 0, SAMPLING_MAX_TOP_N);
        else if (!strcmp(a, "--logprobs-mode")) {
            CHECK(!strcmp(v, "processed") || !strcmp(v, "raw"), "--logprobs-mode: processed or raw, got '%s'", v);
            s->cfg.logprobs_raw = !strcmp(v, "raw");
        } else if (!strcmp(a, "--reasoning-parser")) {
            CHECK(!strcmp(v, "qwen3") || !strcmp(v, "none"), "--reasoning-parser: qwen3 or none, got '%s'", v);
            s->cfg.reasoning_parser = !strcmp(v, "qwen3");
        } else if (!strcmp(a, "--tool-call-parser")) {
            CHECK(!strcmp(v, "hermes") || !strcmp(v, "qwen3") || !strcmp(v, "none"), "--tool-call-parser: hermes or none, got '%s'", v);
            s->cfg.tool_parser = strcmp(v, "none") != 0;
        } else if (!strcmp(a, "--mask-json-max-ids")) s->cfg.mask_json_max_ids = (int)num(a, v, 0, 1 << 30);
        else if (!strcmp(a, "--max-running-seqs")) ec.max_running_seqs = (int)num(a, v, 1, 1 << 20);
        else if (!strcmp(a, "--max-batched-tokens")) ec.max_batched_tokens = (int)num(a, v, 1, 1 << 24);
        else if (!strcmp(a, "--max-model-len")) ec.max_model_len = (int)num(a, v, 2, 1 << 24);
        else if (!strcmp(a, "--max-waiting")) ec.max_waiting = (int)num(a, v, 1, 1 << 24);
        else if (!strcmp(a, "--block-size")) ec.block_size = (int)num(a, v, 1, 1 << 12);
        else if (!strcmp(a, "--kv-blocks")) ec.n_blocks = (int)num(a, v, 1, 1 << 30);
        else if (!strcmp(a, "--kv-mem-mb")) ec.kv_mem_mb = (size_t)num(a, v, 1, 1ll << 30);
        else if (!strcmp(a, "--max-prompt-logprob-rows")) ec.max_prompt_logprob_rows = (int)num(a, v, 0, 1 << 20);
        else if (!strcmp(a, "--max-request-output-mb")) ec.max_request_output_mb = (size_t)num(a, v, 1, 1ll << 30);
        else if (!strcmp(a, "--max-output-mem-mb")) ec.max_output_mem_mb = (size_t)num(a, v, 1, 1ll << 30);
        else if (!strcmp(a, "--threads")) ec.n_threads = (int)num(a, v, 0, 4096);
        else if (!strcmp(a, "--log-level")) {
            LogLevel l;
            CHECK(log_parse_level(v, &l) == 0, "--log-level: debug, info, warn or error, got '%s'", v);
            log_set_level(l);
        } else if (!strcmp(a, "--prompt-ids")) n_prompt = parse_ids(v, prompt, 8192);
        else if (!strcmp(a, "--max-tokens")) max_new = (int)num(a, v, 1, 1 << 24);
        else CHECK(0, "unknown argument '%s' (see --help)", a);
    }

    if (n_prompt == 0) server_tls_load(s);
    /* Before any thread starts (the runner's pool is created below): every
     * thread inherits the mask, so SIGTERM/SIGINT reach only main's sigwait. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    if (n_prompt == 0) pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    DeviceChoice dev;
    CHECK(device_select(&dev, force_cpu, lo.precision, &err) == 0, "%s", err.msg);
    CHECK(model_load_opts(&s->model, dir, &lo, &err) == 0,
          "%s\n  fix: pass --model with a Hugging Face model directory (and a --precision it supports)", err.msg);
    engine_config_resolve(&ec, &s->model->cfg);
    s->runner = device_runner_create(&dev, s->model, ec.max_batched_tokens, ec.max_model_len, ec.n_threads);
    EngineBackend be = runner_backend_create(s->model, s->runner, &ec, &s->metrics.forward_ns,
                                             &s->metrics.forward_calls);
    if (n_prompt > 0) {
        ec.verbose = 0;
        Engine *e = engine_create(&s->model->cfg, &be, &ec);
        int rc = oneshot(e, prompt, n_prompt, max_new);
        engine_free(e);
        runner_backend_free(&be);
        model_free(s->model);
        return rc;
    }
    s->tok = tokenizer_load(tok_dir ? tok_dir : dir, &err);
    CHECK_PTR(s->tok, "%s\n  fix: the model directory needs tokenizer.json (or pass --tokenizer DIR)", err.msg);
    char *rp = realpath(dir, NULL);
    snprintf(s->model_dir, sizeof s->model_dir, "%s", rp ? rp : dir);
    if (!s->model_name[0]) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s", s->model_dir);
        snprintf(s->model_name, sizeof s->model_name, "%s", basename(tmp));
    }
    free(rp);
    s->vocab = s->model->cfg.vocab;
    s->created = server_now_s();
    pthread_mutex_init(&s->admin_mu, NULL);
    pthread_mutex_init(&s->live_mu, NULL);
    s->wv = weight_version_from_safetensors(s->model->st, ec.n_threads > 0 ? ec.n_threads : 4);
    s->wv->version = (uint64_t)base_version;
    if (fingerprint) {
        char *end;
        s->wv->fingerprint = strtoull(fingerprint, &end, 16);
        CHECK(*fingerprint && !*end, "--model-fingerprint: expected 16 hex digits, got '%s'", fingerprint);
    }
    CHECK(base_version == 0 || fingerprint, "--weight-version %lld needs --model-fingerprint (the lineage's, "
          "printed by `trainer inspect` of any delta)", base_version);

    s->eng = engine_create(&s->model->cfg, &be, &ec);
    s->max_model_len = engine_config(s->eng)->max_model_len;
    server_map_version(s, 0, s->wv->version);
    for (int i = 0; i < n_deltas; i++) admin_apply_delta_file(s, deltas[i]);
    uint64_t version0 = s->wv->version; /* HTTP threads may update it once started */
    server_start(s);
    const char *scheme = s->cfg.tls_cert ? "https" : "http";
    log_info("serving %s (%s) on %s://%s:%d  (max_model_len %d, weight version %llu%s%s%s)", s->model_name,
             s->model_dir, scheme, s->cfg.host, s->bound_port, s->max_model_len, (unsigned long long)version0,
             s->cfg.api_key ? ", API key required" : "", s->cfg.admin_token ? ", admin endpoints on" : "",
             s->cfg.delta_key ? ", signed deltas required" : "");
    printf("listening on %s://%s:%d\n", scheme, s->cfg.host, s->bound_port);
    fflush(stdout);

    int sig = 0;
    sigwait(&set, &sig);
    log_info("received %s", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    shutdown_gracefully(s);
    engine_free(s->eng);
    runner_backend_free(&be);
    weight_version_free(s->wv);
    tokenizer_free(s->tok);
    model_free(s->model);
    if (s->cfg.delta_key) {
        explicit_bzero((void *)s->cfg.delta_key, s->cfg.delta_key_len);
        free((void *)s->cfg.delta_key);
    }
    log_info("bye");
    return 0;
}
