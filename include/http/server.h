/*
 * server.h - the OpenAI-compatible HTTP server: the Server object (its
 * configuration, what it owns, its shared state), the per-request context the
 * endpoint handlers receive, and the helpers they answer with.
 *
 * Life cycle (main.c; tests/fuzz/fuzz_http.c does the same without sockets):
 *     ServerConfig c; server_config_default(&c); ... set fields ...
 *     Server *s = server_create(&c);  // model, tokenizer, runner, engine, weight version, deltas, TLS files
 *     server_start(s);                // listen
 *     ... wait for SIGTERM ...
 *     server_shutdown(s);             // stop accepting, drain, abort the rest, close
 *     server_free(s);
 *
 * Threads: libmicrohttpd runs one thread per connection; a handler may block
 * on the engine (engine_request_wait) and checks http_fd_gone() while it
 * waits, so a client that resets (or has closed: a probe draws the reset)
 * aborts its request at once; a half-closed client still gets its answer.
 * Files: server.c the object; routes.c the route table (method, path, handler,
 * auth class, body class) and the dispatcher that reads it; http.c the
 * libmicrohttpd layer (daemon, answers, streams); one file per endpoint
 * family (api_completions.c, api_chat.c, api_tokenize.c, api_admin.c,
 * api_reload.c; the foreign dialects: api_vllm_generate.c, api_control.c,
 * api_sglang.c over gen_rl.c; the agent dialects over chat's machinery:
 * api_responses.c, api_messages.c, dialect.c); metrics.c /metrics and /health
 * (metrics_vllm.c the vllm:* series); fleet.c readiness; api_load.c SGLang's
 * /get_load.
 *
 * Not here: the engine (engine.h), tokenization (tokenizer.h), the command
 * line (flags.h).
 */
#ifndef SAMPLER_SERVER_H
#define SAMPLER_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "buf.h"
#include "check.h"
#include "delta.h"
#include "engine.h"
#include "model.h"
#include "tokenizer.h"

struct MHD_Connection;
struct MHD_Daemon;
typedef struct WeightVersion WeightVersion;
typedef struct HttpGuard HttpGuard;

#define SERVER_MAX_DELTAS 64
#define SERVER_MAX_RELOAD_ROOTS 8
#define SERVER_MAX_LORAS 64

typedef struct ServerConfig {
    /* ---- the model (server_create) ---- */
    const char *model_dir;         /* Hugging Face model directory; default: the bundled models/tiny-qwen3 */
    const char *tokenizer_dir;     /* NULL: model_dir */
    const char *served_model_name; /* NULL: the model directory's base name */
    LoadOptions load;              /* precision (default bf16) and weight_only (default 0) */
    int force_cpu;                 /* 1: the CPU backend even in a GPU binary (--device cpu) */
    int native_crossover;          /* --native-crossover: 0 = measured per shape at start-up, N: from N tokens */
    const char *deltas[SERVER_MAX_DELTAS]; /* applied at start-up, in this order */
    int n_deltas;
    uint64_t weight_version;       /* version of the checkpoint in model_dir; default 0 */
    const char *model_fingerprint; /* 16 hex digits; needed when weight_version > 0 */
    EngineConfig engine;           /* engine_config_default; resolved against the model by server_create */
    int engine_only;               /* 1: model + runner + engine only (one-shot mode): no tokenizer, weight
                                      version, start-up deltas or TLS files; the engine does not log */
    /* ---- HTTP ---- */
    const char *host;              /* default 127.0.0.1 */
    int port;                      /* default 8000; 0: pick a free port (printed) */
    const char *api_key;           /* NULL: no auth on /v1 */
    const char *admin_token;       /* NULL: admin endpoints answer 403 */
    size_t max_body_bytes;         /* JSON bodies; default 8 MiB */
    size_t max_delta_bytes;        /* POST /admin/v1/weights/delta; default 4 GiB */
    int max_connections;           /* default 1024 */
    unsigned connection_timeout_s; /* idle seconds before a connection is closed (slow clients); default 30 */
    unsigned header_timeout_s;     /* request line + headers must be in within this (slowloris); default 10 */
    size_t max_header_bytes;       /* per-connection memory for the request line + headers; default 32 KiB */
    const char *tls_cert;          /* PEM certificate (chain) file; NULL: plain HTTP */
    const char *tls_key;           /* PEM private key file; set with tls_cert */
    const char *delta_key_file;    /* HMAC key file deltas must be signed with; server_create loads it */
    const uint8_t *delta_key;      /* [delta_key_len] that key (delta_sign.h); NULL: unsigned ok. In a Server
                                      it is the Server's own copy, wiped and freed by server_free */
    size_t delta_key_len;
    double shutdown_timeout_s;     /* SIGTERM: wait this long for in-flight requests; default 30 */
    /* ---- API behaviour ---- */
    int max_logprobs;              /* top_logprobs / logprobs upper bound; default 20 */
    int max_n;                     /* n upper bound; default 128 */
    int reasoning_parser;          /* 1: split <think> into reasoning_content (qwen3); default 1 */
    int tool_parser;               /* 1: parse <tool_call> blocks (hermes / qwen3); default 1 */
    int logprobs_mode;             /* LogprobsMode of the OpenAI logprobs fields; default LOGPROBS_RAW (vLLM's) */
    int mask_json_max_ids;         /* sampling masks with more ids go out as base64; default 4096 */
    int return_sampling_mask;      /* --return-sampling-mask: /inference/v1/generate always sends masks; default 0 */
    int return_routed_experts;     /* --enable-return-routed-experts: ... and routed experts; default 0 */
    int enforce_eager;             /* --enforce-eager: no CUDA graphs (model.h runner_set_graphs); default 0 */
    const char *reload_roots[SERVER_MAX_RELOAD_ROOTS]; /* --reload-root: directories full reloads may read from */
    int n_reload_roots;            /* 0: POST /admin/v1/weights/reload is disabled (403) */
    int fleet;                     /* 1: not ready until a trainer announced the fleet's version (fleet.c) */
    /* ---- LoRA adapters (api_lora.c); engine.max_loras is --max-loras (default 8) ---- */
    const char *loras[SERVER_MAX_LORAS]; /* --lora NAME=DIR, loaded at start-up */
    int n_loras;
    int enable_lora;               /* --enable-lora: device backends reserve the adapter pool (implied by --lora) */
    int max_lora_rank;             /* largest adapter rank accepted; default 64 */
    int lora_dtype;                /* --lora-dtype: LoraDtype (lora.h), 0 = float32 (default), 1 = bfloat16 */
    int act_dtype;                 /* --dtype: SERVER_DTYPE_* (the activations of the BF16 matmuls) */
} ServerConfig;

/* --dtype (vLLM's flag): auto = bfloat16 where the backend implements BF16
 * activations (the CPU backend), else float32 (the CUDA backend today). */
enum { SERVER_DTYPE_AUTO, SERVER_DTYPE_BF16, SERVER_DTYPE_F32 };

/* Every default above (the engine's from engine_config_default); no environment is read. */
void server_config_default(ServerConfig *c);

/* Server-side counters (the engine keeps its own, see engine_metrics). */
#define SERVER_N_STATUS 10
typedef struct ServerMetrics {
    atomic_ullong http_by_status[SERVER_N_STATUS]; /* see metrics.c: 200 400 401 403 404 409 413 422 429|503 500 */
    atomic_ullong http_other;
    atomic_ullong stream_disconnects;
    atomic_ullong forward_ns;      /* model forward time (timed backend) */
    atomic_ullong forward_calls;
    atomic_ullong forward_graphs[2]; /* forwards through a whole-step CUDA graph, through piecewise graphs */
    atomic_ullong device_ns;       /* device time of the steps sampled on the device (runner_backend_count_device) */
} ServerMetrics;

/* A live HTTP generation, findable by its response id for POST /abort_request. */
typedef struct LiveReq {
    char id[48];
    EngineRequest **reqs;
    int n_reqs;
    struct LiveReq *next, *prev;
} LiveReq;

typedef struct Server {
    ServerConfig cfg;
    char model_name[256];
    char model_dir[1024];
    Model *model;
    Tokenizer *tok;
    Engine *eng;
    EngineBackend be;              /* the engine's backend over runner (runner_backend.h); owns runner */
    Runner *runner;                /* the engine backend's runner (weights live on its device) */
    int act_bf16;                  /* --dtype resolved: 1 = BF16 matmul activations */
    int vocab;                     /* the model's vocab (token ids must be below it) */
    int max_model_len;
    WeightVersion *wv;             /* per-tensor hashes and lineage; under admin_mu */
    pthread_mutex_t admin_mu;
    ServerMetrics metrics;
    atomic_int shutting_down;
    atomic_ullong fleet_version;   /* the fleet's version as the trainer announced it (fleet.c);
                                      FLEET_UNKNOWN until then with cfg.fleet, else 0 */
    atomic_int inflight;
    atomic_ullong next_id;
    int64_t created;
    uint64_t *version_map;         /* [n_versions] engine version -> checkpoint version; under live_mu */
    int n_versions, cap_versions;
    pthread_mutex_t live_mu;
    LiveReq *live;
    struct MHD_Daemon *d;
    HttpGuard *guard;              /* deadlines and the connection cap (http_guard.c) */
    int bound_port;
    char *tls_cert_pem, *tls_key_pem; /* the files' contents while the daemon runs */
    struct LoraSlot *lora_slots;   /* [cfg.engine.max_loras] adapters by slot (api_lora.c); under lora_mu */
    pthread_mutex_t lora_mu;
    /* structured outputs (structured.h): built on the first structured request, under grammar_mu */
    GrammarVocab *gvocab;
    GrammarCache *grammars;
    pthread_mutex_t grammar_mu;
} Server;

/* Start-up path (fatal with a message that says how to fix it): load the
 * delta key and the TLS files (first, so a typo fails fast), choose the
 * device, load the model, create the runner, backend and engine, then (unless
 * engine_only) the tokenizer, the weight version and its lineage, and apply
 * the start-up deltas. The strings of c must outlive the Server; the delta key
 * is copied. Starts the engine thread and the runner's pool (block the signals
 * the caller waits for before calling it). */
Server *server_create(const ServerConfig *c);
/* Listen (fatal if the address is taken, or the TLS files are rejected), log
 * what is served and the security warnings (plain HTTP admin on a
 * non-loopback address, unauthenticated deltas). */
void server_start(Server *s);
/* SIGTERM: stop accepting, let in-flight requests finish for
 * cfg.shutdown_timeout_s, abort the rest, close every connection. */
void server_shutdown(Server *s);
/* Stops the daemon if it still runs, frees the engine, backend, runner,
 * tokenizer, weight version and model, and wipes the delta key. NULL is ok. */
void server_free(Server *s);

/* ---- the libmicrohttpd layer (http.c), for server.c ---- */
/* Check the TLS flags and read the PEM files (fatal with a fix). */
void http_tls_load(Server *s);
/* Start the daemon on cfg.host:cfg.port; sets s->bound_port. Fatal on failure. */
void http_listen(Server *s);
/* Stop accepting new connections; open ones go on. */
void http_quiesce(Server *s);
/* Close every connection and stop the daemon (idempotent); wipes the key PEM. */
void http_close(Server *s);

/* ---- deadlines and the connection cap (http_guard.c), for http.c ---- */
HttpGuard *http_guard_create(const ServerConfig *cfg);
void http_guard_free(HttpGuard *g);
/* The limit to give libmicrohttpd (ours plus room for evicted connections still closing). */
unsigned http_guard_mhd_limit(const HttpGuard *g);
/* At accept: 1 admit (evicting the oldest connection still in its headers
 * when at --max-connections), 0 close it at once. */
int http_guard_accept(HttpGuard *g);
/* A connection began (header deadline armed) / ended; the handle is its socket context. */
void *http_guard_started(HttpGuard *g, int fd);
void http_guard_closed(HttpGuard *g, void *conn);
/* phase 0: awaiting the next request's headers; 1: receiving body_bytes of
 * body; 2: serving (no deadline). */
void http_guard_phase(HttpGuard *g, void *conn, int phase, size_t body_bytes);

/* ---- per request ---- */
typedef struct Route Route;
typedef struct HttpReq {
    Server *s;
    const Route *route;            /* the route table row of the path (routes.h); NULL: no route */
    const Route *row;              /* the row of path and method, once routes_preflight accepted it */
    size_t body_limit;             /* bytes of body kept; more -> too_large (413) */
    struct MHD_Connection *c;
    void *conn;                    /* the connection's guard handle (http_guard.c); NULL: none */
    const char *method, *url;
    Buf body;                      /* the kept body; a spooled one is a read-only mapping here (cap 0) */
    int spool_fd;                  /* BODY_DELTA: the unlinked temporary file the body is written to; -1 none */
    size_t spooled;                /* bytes written to it */
    int spool_err;                 /* errno of a failed spool write (answered 507 once the body is in) */
    void *map;                     /* its read-only mapping once complete (munmap at the end); NULL none */
    int too_large;
    int answered;                  /* a response was queued */
    int counted;                   /* inflight incremented */
    int status;                    /* what was answered, for metrics */
} HttpReq;

/* Answer with a JSON document (steals the reference). Returns an MHD result. */
int http_send_json(HttpReq *q, int status, json_t *j);
int http_send_text(HttpReq *q, int status, const char *ctype, const char *body, size_t n);
/* OpenAI error shape {"error": {"message", "type", "param", "code"}}; type and
 * code derive from status; param may be NULL. */
json_t *http_error_json(int status, const char *param, const char *msg);
/* Anthropic's error shape {"type": "error", "error": {"type", "message"}}
 * (the routes tagged DIALECT_ANTHROPIC answer their errors with it). */
json_t *http_error_json_anthropic(int status, const char *msg);
int http_send_error(HttpReq *q, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The same with an explicit code (NULL: the status's default). */
int http_send_error_code(HttpReq *q, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Error from an Err whose message may start with "param: " (request_parse). */
int http_send_err(HttpReq *q, const Err *e);
/* The connection's socket, and whether its client is gone (poll, no wait):
 * reset or unwritable; a FIN alone is probed once (http.c), never "gone". */
int http_conn_fd(HttpReq *q);
int http_fd_gone(int fd);
/* "model" of a request body: absent or the served name (or the model
 * directory) or a LoRA adapter's name (the same tokenizer); else 404 (400 for
 * a wrong type). Generation endpoints use lora_model_acquire instead. */
int http_check_model(Server *s, json_t *body, Err *err);
/* A streamed response: fill(ctx, out) appends the next bytes to out and
 * returns 1 while more may come, 0 at the end, -1 on client loss; done(ctx)
 * runs once the connection no longer needs the stream (abort + free). */
typedef int (*StreamFill)(void *ctx, Buf *out);
typedef void (*StreamDone)(void *ctx);
int http_send_stream(HttpReq *q, StreamFill fill, StreamDone done, void *ctx);

/* The checkpoint (delta) version of weights the engine calls version e:
 * the engine counts updates 0, 1, 2, ...; deltas may start later and skip. */
uint64_t server_weight_version(Server *s, uint64_t e);
/* Record that engine version e now serves checkpoint version v. */
void server_map_version(Server *s, uint64_t e, uint64_t v);

/* Fresh id like "cmpl-0001a2b3c4d5e6f7". */
void server_new_id(Server *s, const char *prefix, char *out, size_t cap);
int64_t server_now_s(void);
void server_live_add(Server *s, LiveReq *l);
void server_live_remove(Server *s, LiveReq *l);
/* Abort the live request with this id (all of them when id is NULL); returns how many. */
int server_live_abort(Server *s, const char *id);

/* ---- endpoints: one row each in routes.c ----
 * Every handler has the route table's shape: body is the parsed JSON object
 * for the JSON body classes and NULL otherwise (raw bytes stay in q->body);
 * the handler answers (http_send_*) and returns the MHD result. */
int api_health(HttpReq *q, json_t *body);
int api_metrics(HttpReq *q, json_t *body);
/* Append the vllm:* series (metrics_vllm.c) for the engine state m. */
void metrics_vllm(Buf *b, Server *s, const EngineMetrics *m);
int api_models(HttpReq *q, json_t *body);
int api_completions(HttpReq *q, json_t *body);
int api_chat(HttpReq *q, json_t *body);
int api_tokenize(HttpReq *q, json_t *body);
int api_detokenize(HttpReq *q, json_t *body);
int api_tokenizer_info(HttpReq *q, json_t *body);
int api_admin_delta(HttpReq *q, json_t *body);
int api_admin_weights(HttpReq *q, json_t *body);
int api_admin_reload(HttpReq *q, json_t *body);
int api_admin_pause(HttpReq *q, json_t *body);
int api_admin_resume(HttpReq *q, json_t *body);
int api_admin_is_paused(HttpReq *q, json_t *body);
int api_admin_abort(HttpReq *q, json_t *body);
/* prime-rl's weight controls (api_control.c) */
int api_update_weights(HttpReq *q, json_t *body);
int api_update_weight_version(HttpReq *q, json_t *body);
int api_weight_info(HttpReq *q, json_t *body);
int api_liveness(HttpReq *q, json_t *body);
/* vLLM / prime-rl token-in token-out (api_vllm_generate.c) */
int api_vllm_generate(HttpReq *q, json_t *body);
/* SGLang's native routes (api_sglang.c) */
int api_sgl_generate(HttpReq *q, json_t *body);
int api_sgl_update_weights_from_disk(HttpReq *q, json_t *body);
int api_sgl_pause(HttpReq *q, json_t *body);
int api_sgl_continue(HttpReq *q, json_t *body);
int api_sgl_flush_cache(HttpReq *q, json_t *body);
int api_sgl_model_info(HttpReq *q, json_t *body);
int api_sgl_server_info(HttpReq *q, json_t *body);
int api_sgl_health_generate(HttpReq *q, json_t *body);
int api_admin_fleet(HttpReq *q, json_t *body);
int api_get_load(HttpReq *q, json_t *body);

/* ---- readiness (fleet.c) ---- */
#define FLEET_UNKNOWN UINT64_MAX
/* 1 when the server should take traffic: not shutting down and serving at
 * least the fleet's version (never, with --fleet, before a trainer said it).
 * why (may be NULL) gets the reason when not. */
int fleet_ready(Server *s, char *why, size_t cap);
int api_responses(HttpReq *q, json_t *body);        /* api_responses.c: the OpenAI Responses API */
int api_responses_get(HttpReq *q, json_t *body);    /* GET /v1/responses/{id}: 404, nothing is stored */
int api_messages(HttpReq *q, json_t *body);         /* api_messages.c: the Anthropic Messages API */
int api_messages_count_tokens(HttpReq *q, json_t *body);
int api_lora_load(HttpReq *q, json_t *body);
int api_lora_unload(HttpReq *q, json_t *body);
int api_lora_push(HttpReq *q, json_t *body);

/* messages (+ tools, chat_template_kwargs, add_generation_prompt) of a body
 * rendered and tokenized; *tools_on: tool calls should be parsed. */
int api_chat_prompt(Server *s, json_t *body, TokIds **out, int *tools_on, Err *err);
/* The delta touched hook (ctx = Server): re-quantize FP8/NVFP4 blocks holding
 * touched elements (idx NULL: all) and refresh the device copy. */
/* The DeltaTarget a delta or a reload applies to: the served model, with
 * admin_touched as its hook. */
DeltaTarget admin_delta_target(Server *s);
/* Commit plan between two engine steps (engine_run_exclusive; bump: the
 * version moves, which invalidates the prefix cache) and record the
 * checkpoint version the engine now serves. Caller holds admin_mu. Returns 0,
 * or <0 with err and every weight as it was (delta_commit restores). */
int admin_commit(Server *s, DeltaPlan *plan, DeltaTarget *tgt, int bump, DeltaResult *res, Err *err);
int admin_touched(void *ctx, const char *name, void *data, Dtype dt, int64_t numel, const int64_t *idx,
                  int64_t n_idx, Err *err);

/* A full, all-or-nothing reload of checkpoint directory path (confined to
 * --reload-root, api_reload.c) at weight version version (above the current
 * one). Caller holds admin_mu. 0, or <0 with err and every weight as it was. */
int admin_reload(Server *s, const char *path, uint64_t version, DeltaResult *res, Err *err);
/* StOpener.open confining every file to --reload-root (api_reload.c); ctx: a ReloadConfine. */
typedef struct ReloadConfine {
    const Server *s;
    const char *given;   /* the path as the client sent it: the only path errors name */
} ReloadConfine;
int reload_confined_open(void *ctx, const char *path, Err *err);

/* ---- LoRA adapters (api_lora.c) ----
 * A slot per adapter (cfg.engine.max_loras of them, the runner's slots);
 * requests hold a reference from lora_model_acquire to lora_release, and an
 * unloaded adapter stays in its slot until the last one let go. */
/* Start-up: the slots, and every --lora NAME=DIR loaded (fatal with a fix). */
void lora_startup(Server *s);
/* After engine_free: free every adapter. */
void lora_shutdown(Server *s);
/* "model" of a body: absent / the served name -> *lora = 0 (the base); an
 * adapter's name -> *lora = its slot + 1, with a reference the caller gives
 * back with lora_release, and its name copied to name[cap]; else 404 (400 for a
 * wrong type). */
int lora_model_acquire(Server *s, json_t *body, int *lora, char *name, size_t cap, Err *err);
/* Give back a reference (lora 0: nothing). Frees an unloaded adapter's slot
 * when it was the last (between engine steps). */
void lora_release(Server *s, int lora);
/* The adapters' model cards (/v1/models), appended to list. */
void lora_model_cards(Server *s, json_t *list);
/* A card for /v1/models/NAME, or NULL when no adapter has that name. */
json_t *lora_model_card(Server *s, const char *name);

/* Start-up: apply a delta file (--delta), fatal on error. */
void admin_apply_delta_file(Server *s, const char *path);

#endif
