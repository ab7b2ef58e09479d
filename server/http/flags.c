/*
 * flags.c - the flag table of sampler-cpu and the per-GPU binaries (flags.h)
 * and the two readers of it: flags_parse and flags_help. A row says the
 * flag's name, its metavar (none for a switch), its --help section and text,
 * the CliConfig field it sets and its kind: a string, an integer in a range
 * (int, unsigned, size_t, uint64, seconds as double), an enum (names ->
 * ints), a switch (sets a constant), a repeatable string (array + count) or a
 * custom parser. --help prints the default of each row from a CliConfig
 * fresh from flags_default, i.e. from server_config_default and
 * engine_config_default, the values the code starts from; a row's `unset`
 * says in words what a 0 / NULL default means (resolved later, e.g. from the
 * model). Environment defaults (SAMPLER_API_KEY, SAMPLER_ADMIN_TOKEN) are
 * named in --help, never their values.
 *
 * A new flag = a row here (and its field). Not here: what the flags do.
 */
#include "flags.h"

#include <libgen.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "backend.h"
#include "model.h"
#include "routes.h"
#include "sampling.h"

typedef enum {
    K_STRING,  /* const char *; the argv string itself */
    K_INT,     /* int in [lo, hi] */
    K_UINT,    /* unsigned in [lo, hi] */
    K_SIZE,    /* size_t in [lo, hi] */
    K_U64,     /* uint64_t in [lo, hi] */
    K_SECONDS, /* double, an integer number of seconds in [lo, hi] */
    K_ENUM,    /* int, the value of the named choice */
    K_SWITCH,  /* int set to lo; takes no argument */
    K_LIST,    /* const char *[hi] with an int count at count_off; repeatable */
    K_CUSTOM,  /* parse(c, flag, value); the default from show() */
    K_HELP,    /* print --help, stop */
} FlagKind;

typedef struct Choice {
    const char *name;
    int value;
    int alias; /* 1: accepted, not listed (--tool-call-parser qwen3 = hermes) */
} Choice;

typedef struct Flag {
    const char *name;    /* "--port" */
    const char *alias;   /* "-h", or NULL */
    const char *metavar; /* "N"; NULL: a switch */
    const char *section; /* --help heading */
    FlagKind kind;
    size_t off;          /* offsetof(CliConfig, the field) */
    long long lo, hi;    /* integer kinds: the accepted range; K_SWITCH: lo is the value set; K_LIST: hi = capacity */
    size_t count_off;    /* K_LIST: offsetof the int count */
    const Choice *choices; /* K_ENUM, ended by a NULL name */
    void (*parse)(CliConfig *c, const char *flag, const char *v);          /* K_CUSTOM, fatal on a bad value */
    void (*show)(const CliConfig *d, char *out, size_t cap);               /* K_CUSTOM: the default */
    const char *env;     /* K_STRING: the default comes from this environment variable when it is set */
    const char *unset;   /* the default in words when the field's default is 0 / NULL / empty */
    int show_range;      /* 1: --help names the range */
    int bytes;           /* K_SIZE: a byte count (--help adds KiB / MiB / GiB) */
    const char *help;
} Flag;

/* ---- custom parsers ---- */
static void parse_precision(CliConfig *c, const char *flag, const char *v) {
    CHECK(precision_parse(v, &c->server.load.precision) == 0, "%s: bf16, fp8 or nvfp4, got '%s'", flag, v);
}
static void show_precision(const CliConfig *d, char *out, size_t cap) {
    snprintf(out, cap, "%s", precision_name(d->server.load.precision));
}

/* vLLM's ModelConfig.dtype names; half / float16 are refused by name. */
static void parse_dtype(CliConfig *c, const char *flag, const char *v) {
    int *d = &c->server.act_dtype;
    if (!strcmp(v, "auto")) *d = SERVER_DTYPE_AUTO;
    else if (!strcmp(v, "bfloat16")) *d = SERVER_DTYPE_BF16;
    else if (!strcmp(v, "float32") || !strcmp(v, "float")) *d = SERVER_DTYPE_F32;
    else if (!strcmp(v, "half") || !strcmp(v, "float16"))
        CHECK(0, "%s %s is a vLLM value this server does not implement: use auto (bfloat16 on the CPU backend), "
              "bfloat16 or float32", flag, v);
    else CHECK(0, "%s: auto, bfloat16, float32 or float, got '%s'", flag, v);
}
static void show_dtype(const CliConfig *d, char *out, size_t cap) {
    static const char *const names[] = {"auto", "bfloat16", "float32"};
    snprintf(out, cap, "%s", names[d->server.act_dtype]);
}

/* vLLM's CacheConfig.cache_dtype names; float32 is ours (exact comparisons).
 * vLLM's other values are refused by name rather than as unknown. */
static void parse_kv_cache_dtype(CliConfig *c, const char *flag, const char *v) {
    int *d = &c->server.engine.kv_cache_dtype;
    if (!strcmp(v, "auto")) *d = ENGINE_KV_AUTO;
    else if (!strcmp(v, "bfloat16")) *d = KV_BF16;
    else if (!strcmp(v, "fp8") || !strcmp(v, "fp8_e4m3")) *d = KV_FP8;
    else if (!strcmp(v, "float32")) *d = KV_F32;
    else if (!strcmp(v, "fp8_e5m2") || !strcmp(v, "fp8_inc") || !strcmp(v, "fp8_ds_mla") || !strcmp(v, "int8") ||
             !strcmp(v, "float16") || !strcmp(v, "nvfp4"))
        CHECK(0, "%s %s is a vLLM value this server does not implement: use auto (bfloat16), bfloat16, "
              "fp8 / fp8_e4m3 or float32", flag, v);
    else CHECK(0, "%s: auto, bfloat16, fp8, fp8_e4m3 or float32, got '%s'", flag, v);
}
static void show_kv_cache_dtype(const CliConfig *d, char *out, size_t cap) {
    int t = d->server.engine.kv_cache_dtype;
    snprintf(out, cap, "%s", t == ENGINE_KV_AUTO ? "auto" : kv_dtype_name((KvDtype)t));
}

static void parse_log_level(CliConfig *c, const char *flag, const char *v) {
    CHECK(log_parse_level(v, &c->log_level) == 0, "%s: debug, info, warn or error, got '%s'", flag, v);
    log_set_level(c->log_level);
}
static void show_log_level(const CliConfig *d, char *out, size_t cap) {
    snprintf(out, cap, "%s", log_level_name(d->log_level));
}

static void parse_prompt_ids(CliConfig *c, const char *flag, const char *s) {
    int n = 0;
    while (*s && n < FLAGS_MAX_PROMPT) {
        char *end;
        long v = strtol(s, &end, 10);
        CHECK(end != s, "%s: expected comma-separated integers, got '%s'", flag, s);
        c->prompt[n++] = (int32_t)v;
        s = *end == ',' ? end + 1 : end;
    }
    c->n_prompt = n;
}

/* vLLM's --lora-dtype names; "auto" is the base weights' dtype (bfloat16) as in vLLM; float16 is not served */
static const Choice LORA_DTYPES[] = {{"float32", 0, 0}, {"bfloat16", 1, 0}, {"auto", 1, 0}, {NULL, 0, 0}};
static const Choice DEVICES[] = {{"gpu", 0, 0}, {"cpu", 1, 0}, {NULL, 0, 0}};
/* vLLM's --logprobs-mode names (sampling.h LogprobsMode); "raw" and "processed" were ours before */
static const Choice LOGPROBS_MODES[] = {{"raw_logprobs", LOGPROBS_RAW, 0}, {"raw_logits", LOGPROBS_RAW_LOGITS, 0},
                                        {"processed_logprobs", LOGPROBS_PROCESSED, 0},
                                        {"processed_logits", LOGPROBS_PROCESSED_LOGITS, 0},
                                        {"sampled", LOGPROBS_SAMPLED, 0}, {"raw", LOGPROBS_RAW, 1},
                                        {"processed", LOGPROBS_SAMPLED, 1}, {NULL, 0, 0}};
static const Choice DEVICE_SAMPLING[] = {{"auto", ENGINE_DEVSAMPLE_AUTO, 0}, {"on", ENGINE_DEVSAMPLE_ON, 0},
                                         {"off", ENGINE_DEVSAMPLE_OFF, 0}, {NULL, 0, 0}};
static const Choice REASONING_PARSERS[] = {{"qwen3", 1, 0}, {"none", 0, 0}, {NULL, 0, 0}};
static const Choice TOOL_PARSERS[] = {{"hermes", 1, 0}, {"qwen3", 1, 1}, {"none", 0, 0}, {NULL, 0, 0}};

#define AT(field) offsetof(CliConfig, field)
#define S_MODEL "model"
#define S_HTTP "HTTP"
#define S_SECURITY "security (docs/delta-format.md, README \"Security\")"
#define S_API "API behaviour"
#define S_ENGINE "engine"
#define S_OTHER "other"

static const Flag FLAGS[] = {
    {.name = "--model", .metavar = "DIR", .section = S_MODEL, .kind = K_STRING, .off = AT(server.model_dir),
     .help = "Hugging Face model directory"},
    {.name = "--tokenizer", .metavar = "DIR", .section = S_MODEL, .kind = K_STRING, .off = AT(server.tokenizer_dir),
     .unset = "--model", .help = "tokenizer.json + tokenizer_config.json directory"},
    {.name = "--served-model-name", .metavar = "NAME", .section = S_MODEL, .kind = K_STRING,
     .off = AT(server.served_model_name), .unset = "the base name of --model",
     .help = "the model id clients send and /v1/models lists"},
    {.name = "--precision", .metavar = "P", .section = S_MODEL, .kind = K_CUSTOM, .off = AT(server.load.precision),
     .parse = parse_precision, .show = show_precision,
     .help = "bf16, fp8 (128x128 block scales) or nvfp4 (Model Optimizer): quantize-on-load of a BF16 checkpoint; "
             "a pre-quantized FP8/NVFP4 checkpoint runs at its own precision"},
    {.name = "--device", .metavar = "D", .section = S_MODEL, .kind = K_ENUM, .off = AT(server.force_cpu),
     .choices = DEVICES,
     .help = "gpu (in sampler-smXX: the CUDA backend; fp8/nvfp4 on tensor cores where the GPU has them, else "
             "refused unless --weight-only; sampler-cpu has no GPU code) or cpu (the CPU backend, in every binary)"},
    {.name = "--weight-only", .section = S_MODEL, .kind = K_SWITCH, .off = AT(server.load.weight_only), .lo = 1,
     .help = "keep activations f32 with fp8/nvfp4 weights (the weight-only GEMV; needed for fp8 on A100 and nvfp4 "
             "below Blackwell); without it activations are quantized (the native tensor-core GEMMs on the GPU)"},
    {.name = "--native-crossover", .metavar = "N", .section = S_MODEL, .kind = K_INT,
     .off = AT(server.native_crossover), .lo = 0, .hi = 65535, .show_range = 1,
     .unset = "0: measured on the device at start-up, per shape",
     .help = "GPU, fp8/nvfp4 with quantized activations: batches of N tokens and more take the native tensor-core "
             "GEMM, smaller ones the weight-only GEMV (f32 activations); 0 times both paths for every matrix shape "
             "of the model (and for the routed experts' grouped step) at start-up and logs the table. No effect "
             "on the CPU backend or with --weight-only"},
    {.name = "--delta", .metavar = "FILE", .section = S_MODEL, .kind = K_LIST, .off = AT(server.deltas),
     .hi = SERVER_MAX_DELTAS, .count_off = AT(server.n_deltas), .unset = "none",
     .help = "apply a weight delta at start-up (repeatable, in version order)"},
    {.name = "--lora", .metavar = "ADAPTER", .section = S_MODEL, .kind = K_LIST, .off = AT(server.loras),
     .hi = SERVER_MAX_LORAS, .count_off = AT(server.n_loras), .unset = "none",
     .help = "NAME=DIR: serve the PEFT LoRA adapter in DIR (adapter_config.json + adapter_model.safetensors) as model NAME "
             "(repeatable; more at run time with POST /v1/load_lora_adapter)"},
    {.name = "--enable-lora", .section = S_MODEL, .kind = K_SWITCH, .off = AT(server.enable_lora), .lo = 1,
     .help = "GPU binaries: reserve device memory for --max-loras adapters at --max-lora-rank at start-up (implied "
             "by --lora); without it a GPU server refuses adapters. The CPU backend serves adapters either way"},
    {.name = "--max-loras", .metavar = "N", .section = S_MODEL, .kind = K_INT, .off = AT(server.engine.max_loras),
     .lo = 0, .hi = ENGINE_MAX_LORAS, .show_range = 1,
     .help = "LoRA adapter slots: adapters resident at once, all of which may share one batch"},
    {.name = "--max-lora-rank", .metavar = "R", .section = S_MODEL, .kind = K_INT, .off = AT(server.max_lora_rank),
     .lo = 1, .hi = LORA_MAX_RANK, .show_range = 1,
     .help = "largest adapter rank accepted; adapters take at most max-loras x 4 x R x sum(in + out) bytes"},
    {.name = "--dtype", .metavar = "T", .section = S_MODEL, .kind = K_CUSTOM, .off = AT(server.act_dtype),
     .parse = parse_dtype, .show = show_dtype,
     .help = "activations of the BF16 matmuls (vLLM's flag): bfloat16 (inputs rounded to bf16, vdpbf16ps order; "
             "the CPU backend), float32 / float (f32 inputs: the exact comparisons with transformers), auto = "
             "bfloat16 where it is the faster choice (the CPU backend on a CPU with AVX512_BF16), else float32. "
             "Norms, attention, the residual stream and the logits stay f32 either way"},
    {.name = "--lora-dtype", .metavar = "T", .section = S_MODEL, .kind = K_ENUM, .off = AT(server.lora_dtype),
     .choices = LORA_DTYPES,
     .help = "how adapters are stored: float32 (default) or bfloat16 (auto: the base weights' dtype, bfloat16): "
             "values rounded to nearest even at load, half the memory, math in f32 either way"},
    {.name = "--reload-root", .metavar = "DIR", .section = S_MODEL, .kind = K_LIST, .off = AT(server.reload_roots),
     .hi = SERVER_MAX_RELOAD_ROOTS, .count_off = AT(server.n_reload_roots), .unset = "full reloads disabled",
     .help = "allow POST /admin/v1/weights/reload of checkpoints under DIR (repeatable)"},
    {.name = "--fleet", .section = S_MODEL, .kind = K_SWITCH, .off = AT(server.fleet), .lo = 1,
     .help = "a replica of a fleet: GET /health answers 503 (not ready) until a trainer has told it the fleet's "
             "version (POST /admin/v1/fleet; `trainer push` does) and it serves that version (docs/fleet.md)"},
    {.name = "--weight-version", .metavar = "N", .section = S_MODEL, .kind = K_U64, .off = AT(server.weight_version),
     .lo = 0, .hi = 1ll << 62, .help = "version of the checkpoint in --model"},
    {.name = "--model-fingerprint", .metavar = "HEX", .section = S_MODEL, .kind = K_STRING,
     .off = AT(server.model_fingerprint), .unset = "none",
     .help = "lineage fingerprint, needed when --weight-version > 0 (from `trainer inspect`)"},

    {.name = "--host", .metavar = "ADDR", .section = S_HTTP, .kind = K_STRING, .off = AT(server.host),
     .help = "IPv4 address to listen on (0.0.0.0 for all)"},
    {.name = "--port", .metavar = "N", .section = S_HTTP, .kind = K_INT, .off = AT(server.port), .lo = 0,
     .hi = 65535, .help = "TCP port; 0 picks a free one, printed at start"},
    {.name = "--api-key", .metavar = "KEY", .section = S_HTTP, .kind = K_STRING, .off = AT(server.api_key),
     .env = "SAMPLER_API_KEY", .unset = "no auth",
     .help = "require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on /v1/*, /tokenize, /detokenize"},
    {.name = "--admin-token", .metavar = "TOKEN", .section = S_HTTP, .kind = K_STRING, .off = AT(server.admin_token),
     .env = "SAMPLER_ADMIN_TOKEN", .unset = "disabled",
     .help = "enable the admin endpoints (weights, pause/resume/abort) behind 'Authorization: Bearer TOKEN'"},
    {.name = "--max-body-bytes", .metavar = "N", .section = S_HTTP, .kind = K_SIZE, .off = AT(server.max_body_bytes), .bytes = 1,
     .lo = 1, .hi = 1ll << 40, .help = "largest JSON request body; larger -> 413"},
    {.name = "--max-delta-bytes", .metavar = "N", .section = S_HTTP, .kind = K_SIZE,
     .off = AT(server.max_delta_bytes), .bytes = 1, .lo = 1, .hi = 1ll << 44,
     .help = "largest delta body for POST /admin/v1/weights/delta; larger -> 413"},
    {.name = "--max-connections", .metavar = "N", .section = S_HTTP, .kind = K_INT,
     .off = AT(server.max_connections), .lo = 1, .hi = 1 << 20,
     .help = "concurrent connections; more are closed at accept (or evict one still sending its headers)"},
    {.name = "--connection-timeout", .metavar = "S", .section = S_HTTP, .kind = K_UINT,
     .off = AT(server.connection_timeout_s), .lo = 1, .hi = 86400,
     .help = "close a connection idle for S seconds, e.g. a client that stalls mid-body (a streaming response "
             "waiting on the engine is not idle)"},
    {.name = "--header-timeout", .metavar = "S", .section = S_HTTP, .kind = K_UINT,
     .off = AT(server.header_timeout_s), .lo = 1, .hi = 86400,
     .help = "the request line and headers must arrive within S seconds of the connection (a body within S + its "
             "size at 64 KiB/s), however slowly they trickle; at --max-connections a new connection evicts the "
             "oldest one still sending headers"},
    {.name = "--max-header-bytes", .metavar = "N", .section = S_HTTP, .kind = K_SIZE,
     .off = AT(server.max_header_bytes), .bytes = 1, .lo = 4096, .hi = 1 << 24,
     .help = "per-connection memory for the request line and headers; larger headers -> 431"},

    {.name = "--tls-cert", .metavar = "FILE", .section = S_SECURITY, .kind = K_STRING, .off = AT(server.tls_cert),
     .unset = "plain HTTP", .help = "serve HTTPS with this PEM certificate (chain); needs --tls-key"},
    {.name = "--tls-key", .metavar = "FILE", .section = S_SECURITY, .kind = K_STRING, .off = AT(server.tls_key),
     .help = "the PEM private key (unencrypted) of --tls-cert"},
    {.name = "--delta-key-file", .metavar = "FILE", .section = S_SECURITY, .kind = K_STRING,
     .off = AT(server.delta_key_file), .unset = "unsigned deltas are accepted",
     .help = "require deltas signed with this HMAC-SHA256 key (X-Delta-Signature on POST, FILE.sig next to each "
             "--delta FILE); unsigned or wrongly signed -> 401"},
    {.name = "--shutdown-timeout", .metavar = "S", .section = S_SECURITY, .kind = K_SECONDS,
     .off = AT(server.shutdown_timeout_s), .lo = 0, .hi = 86400,
     .help = "on SIGTERM, seconds to let in-flight requests finish before aborting"},

    {.name = "--max-n", .metavar = "N", .section = S_API, .kind = K_INT, .off = AT(server.max_n), .lo = 1,
     .hi = 1024, .help = "largest n per request"},
    {.name = "--max-logprobs", .metavar = "N", .section = S_API, .kind = K_INT, .off = AT(server.max_logprobs),
     .lo = 0, .hi = SAMPLING_MAX_TOP_N, .show_range = 1,
     .help = "largest logprobs / top_logprobs / prompt_logprobs"},
    {.name = "--logprobs-mode", .metavar = "M", .section = S_API, .kind = K_ENUM, .off = AT(server.logprobs_mode),
     .choices = LOGPROBS_MODES,
     .help = "what the OpenAI logprobs fields report, as vLLM's flag: raw_logprobs (default): log_softmax of the "
             "model's logits before any processing; raw_logits; processed_logprobs: after bias, penalties, "
             "temperature, top-k/p, min-p (greedy: untruncated, untempered); processed_logits; sampled (ours): "
             "the distribution actually sampled from (greedy: 0)"},
    {.name = "--reasoning-parser", .metavar = "P", .section = S_API, .kind = K_ENUM,
     .off = AT(server.reasoning_parser), .choices = REASONING_PARSERS,
     .help = "qwen3: <think>...</think> -> reasoning_content; none"},
    {.name = "--tool-call-parser", .metavar = "P", .section = S_API, .kind = K_ENUM, .off = AT(server.tool_parser),
     .choices = TOOL_PARSERS, .help = "hermes: <tool_call>{...}</tool_call> -> tool_calls; none"},
    {.name = "--return-sampling-mask", .section = S_API, .kind = K_SWITCH, .off = AT(server.return_sampling_mask),
     .lo = 1, .help = "vLLM's flag: every POST /inference/v1/generate answer carries sampling_mask and kept_tokens "
                     "(a request without a bounded support, greedy or top_k in [1, 4096], is then refused with "
                     "400); without it a request asks with sampling_params.return_sampling_mask"},
    {.name = "--enable-return-routed-experts", .section = S_API, .kind = K_SWITCH,
     .off = AT(server.return_routed_experts), .lo = 1,
     .help = "vLLM's flag: every POST /inference/v1/generate answer on a MoE model carries routed_experts; "
             "without it a request asks with sampling_params.return_routed_experts"},
    {.name = "--mask-json-max-ids", .metavar = "N", .section = S_API, .kind = K_INT,
     .off = AT(server.mask_json_max_ids), .lo = 0, .hi = 1 << 30,
     .help = "sampling masks with more ids are sent base64-encoded"},

    {.name = "--max-running-seqs", .metavar = "N", .section = S_ENGINE, .kind = K_INT,
     .off = AT(server.engine.max_running_seqs), .lo = 1, .hi = 1 << 20, .help = "sequences per step"},
    {.name = "--device-sampling", .metavar = "M", .section = S_ENGINE, .kind = K_ENUM,
     .off = AT(server.engine.device_sampling), .choices = DEVICE_SAMPLING,
     .help = "sample every token on the device (GPU binaries; only compact results cross to the host): auto "
             "(default): when the backend can, on: require it (start-up fails on the CPU), off: on the host "
             "(sampling.c). Steps with prompt log-probs sample on the host"},
    {.name = "--async-scheduling", .section = S_ENGINE, .kind = K_SWITCH, .off = AT(server.engine.async_scheduling),
     .lo = ENGINE_ASYNC_ON,
     .help = "vLLM's (default: on whenever tokens are sampled on the device): plan and launch each step before the previous step's tokens reach the host (they are "
             "taken on the device), overlapping the host's scheduling, records and streaming with the GPU's "
             "work; needs device sampling (start-up fails without). The records are the same as without"},
    {.name = "--no-async-scheduling", .section = S_ENGINE, .kind = K_SWITCH,
     .off = AT(server.engine.async_scheduling), .lo = ENGINE_ASYNC_OFF,
     .help = "every step waits for its tokens before the next one is planned"},
    {.name = "--enforce-eager", .section = S_ENGINE, .kind = K_SWITCH, .off = AT(server.enforce_eager), .lo = 1,
     .help = "vLLM's: launch every op eagerly, no CUDA graphs (by default pure decode steps of <= 256 "
             "sequences run as whole-step graphs and other steps of <= 512 tokens as piecewise graphs, "
             "attention eager between them; GPU binaries only, the CPU has no graphs)"},
    {.name = "--no-enforce-eager", .section = S_ENGINE, .kind = K_SWITCH, .off = AT(server.enforce_eager), .lo = 0,
     .help = "vLLM's: CUDA graphs where they apply (the default)"},
    {.name = "--max-batched-tokens", .metavar = "N", .section = S_ENGINE, .kind = K_INT,
     .off = AT(server.engine.max_batched_tokens), .lo = 1, .hi = 1 << 24,
     .help = "tokens per step, prefill chunks + decodes"},
    {.name = "--max-model-len", .metavar = "N", .section = S_ENGINE, .kind = K_INT,
     .off = AT(server.engine.max_model_len), .lo = 2, .hi = 1 << 24,
     .unset = "the least of the model's max_position_embeddings, 4096 and the KV pool",
     .help = "prompt + output tokens per sequence"},
    {.name = "--max-waiting", .metavar = "N", .section = S_ENGINE, .kind = K_INT,
     .off = AT(server.engine.max_waiting), .lo = 1, .hi = 1 << 24,
     .help = "waiting-queue bound in requests; full -> 503"},
    {.name = "--block-size", .metavar = "N", .section = S_ENGINE, .kind = K_INT, .off = AT(server.engine.block_size),
     .lo = 1, .hi = 1 << 12, .help = "tokens per KV block"},
    {.name = "--kv-blocks", .metavar = "N", .section = S_ENGINE, .kind = K_INT, .off = AT(server.engine.n_blocks),
     .lo = 1, .hi = 1 << 30, .unset = "from --kv-mem-mb", .help = "KV pool size in blocks"},
    {.name = "--kv-mem-mb", .metavar = "N", .section = S_ENGINE, .kind = K_SIZE, .off = AT(server.engine.kv_mem_mb),
     .lo = 1, .hi = 1ll << 30, .help = "KV pool size in MiB"},
    {.name = "--kv-cache-dtype", .metavar = "T", .section = S_ENGINE, .kind = K_CUSTOM,
     .off = AT(server.engine.kv_cache_dtype), .parse = parse_kv_cache_dtype, .show = show_kv_cache_dtype,
     .help = "KV cache element type (vLLM's flag): auto = the model's dtype (bfloat16 for our checkpoints), "
             "bfloat16, fp8 / fp8_e4m3 (e4m3 with one f32 scale per position and KV head), or float32 (ours: "
             "exact comparisons)"},
    {.name = "--no-prefix-cache", .section = S_ENGINE, .kind = K_SWITCH, .off = AT(server.engine.enable_prefix_cache),
     .lo = 0, .help = "disable prefix caching"},
    {.name = "--max-prompt-logprob-rows", .metavar = "N", .section = S_ENGINE, .kind = K_INT,
     .off = AT(server.engine.max_prompt_logprob_rows), .lo = 0, .hi = 1 << 20,
     .help = "logits rows per step for prompt log-probs"},
    {.name = "--max-step-rows", .metavar = "N", .section = S_ENGINE, .kind = K_INT,
     .off = AT(server.engine.max_step_rows), .lo = 0, .hi = 1 << 20,
     .unset = "4 per sampling thread, at least 32; with device sampling: every running sequence",
     .help = "logits rows per step (sampled tokens + prompt log-prob rows), shared fairly between requests "
             "so a heavy request (n, masks, prompt_logprobs) cannot slow the others' steps"},
    {.name = "--max-request-output-mb", .metavar = "N", .section = S_ENGINE, .kind = K_SIZE,
     .off = AT(server.engine.max_request_output_mb), .lo = 1, .hi = 1ll << 30,
     .help = "per-request budget in MiB for outputs (masks, log-probs, prompt log-probs, experts; README "
             "\"Output memory\"); over it -> 400 naming what to lower"},
    {.name = "--max-output-mem-mb", .metavar = "N", .section = S_ENGINE, .kind = K_SIZE,
     .off = AT(server.engine.max_output_mem_mb), .lo = 1, .hi = 1ll << 30,
     .help = "budget in MiB for the outputs of all requests in flight; full -> 503"},
    {.name = "--threads", .metavar = "N", .section = S_ENGINE, .kind = K_INT, .off = AT(server.engine.n_threads),
     .lo = 0, .hi = 4096, .unset = "all cores", .help = "forward-pass threads; 0: all cores"},

    {.name = "--log-level", .metavar = "L", .section = S_OTHER, .kind = K_CUSTOM, .off = AT(log_level),
     .parse = parse_log_level, .show = show_log_level, .help = "debug, info, warn or error"},
    {.name = "--prompt-ids", .metavar = "IDS", .section = S_OTHER, .kind = K_CUSTOM, .off = AT(prompt),
     .parse = parse_prompt_ids,
     .help = "one-shot mode, no HTTP: greedy generation from these comma-separated ids (e.g. 1,2,3), prints the "
             "ids"},
    {.name = "--max-tokens", .metavar = "N", .section = S_OTHER, .kind = K_INT, .off = AT(max_tokens), .lo = 1,
     .hi = 1 << 24, .help = "one-shot mode: tokens to generate"},
    {.name = "--help", .alias = "-h", .section = S_OTHER, .kind = K_HELP, .help = "this text"},
};
#define N_FLAGS ((int)(sizeof FLAGS / sizeof FLAGS[0]))

void flags_default(CliConfig *c) {
    memset(c, 0, sizeof *c);
    server_config_default(&c->server);
    c->max_tokens = 16;
    c->log_level = LOG_DEFAULT_LEVEL;
}

static void *field(CliConfig *c, const Flag *f) { return (char *)c + f->off; }
static const void *cfield(const CliConfig *c, const Flag *f) { return (const char *)c + f->off; }

static long long num(const char *flag, const char *v, long long lo, long long hi) {
    char *end;
    long long x = strtoll(v, &end, 10);
    CHECK(*v && !*end && x >= lo && x <= hi, "%s: expected an integer in [%lld, %lld], got '%s'", flag, lo, hi, v);
    return x;
}

/* "a, b or c": the listed choices. */
static void choice_list(const Choice *ch, char *out, size_t cap) {
    int n = 0, k = 0;
    for (const Choice *c = ch; c->name; c++) n += !c->alias;
    out[0] = 0;
    for (const Choice *c = ch; c->name; c++) {
        if (c->alias) continue;
        size_t len = strlen(out);
        snprintf(out + len, cap - len, "%s%s", k == 0 ? "" : k == n - 1 ? " or " : ", ", c->name);
        k++;
    }
}

static void set_value(CliConfig *c, const Flag *f, const char *v) {
    void *p = field(c, f);
    switch (f->kind) {
    case K_STRING: *(const char **)p = v; break;
    case K_INT: *(int *)p = (int)num(f->name, v, f->lo, f->hi); break;
    case K_UINT: *(unsigned *)p = (unsigned)num(f->name, v, f->lo, f->hi); break;
    case K_SIZE: *(size_t *)p = (size_t)num(f->name, v, f->lo, f->hi); break;
    case K_U64: *(uint64_t *)p = (uint64_t)num(f->name, v, f->lo, f->hi); break;
    case K_SECONDS: *(double *)p = (double)num(f->name, v, f->lo, f->hi); break;
    case K_ENUM: {
        for (const Choice *ch = f->choices; ch->name; ch++)
            if (!strcmp(ch->name, v)) { *(int *)p = ch->value; return; }
        char names[256];
        choice_list(f->choices, names, sizeof names);
        CHECK(0, "%s: %s, got '%s'", f->name, names, v);
        break;
    }
    case K_LIST: {
        int *n = (int *)((char *)c + f->count_off);
        CHECK(*n < f->hi, "%s: at most %lld of them", f->name, f->hi);
        ((const char **)p)[(*n)++] = v;
        break;
    }
    case K_CUSTOM: f->parse(c, f->name, v); break;
    case K_SWITCH: case K_HELP: break; /* no value */
    }
}

static const Flag *find(const char *a) {
    for (int i = 0; i < N_FLAGS; i++)
        if (!strcmp(FLAGS[i].name, a) || (FLAGS[i].alias && !strcmp(FLAGS[i].alias, a))) return &FLAGS[i];
    return NULL;
}

int flags_parse(CliConfig *c, int argc, char **argv) {
    flags_default(c);
    for (int i = 0; i < N_FLAGS; i++) {
        const char *e = FLAGS[i].env ? getenv(FLAGS[i].env) : NULL;
        if (e) *(const char **)field(c, &FLAGS[i]) = e;
    }
    for (int i = 1; i < argc; i++) {
        const Flag *f = find(argv[i]);
        CHECK(f, "unknown argument '%s' (see --help)", argv[i]);
        if (f->kind == K_HELP) {
            flags_help(stdout, argv[0]);
            return 1;
        }
        if (f->kind == K_SWITCH) {
            *(int *)field(c, f) = (int)f->lo;
            continue;
        }
        CHECK(i + 1 < argc, "%s needs a value: %s %s (see --help)", f->name, f->name, f->metavar);
        set_value(c, f, argv[++i]);
    }
    return 0;
}

/* ---- --help ---- */
/* The default of f in d as text; 0 when --help shows none (switches). */
static int show_default(const Flag *f, const CliConfig *d, char *out, size_t cap) {
    const void *p = cfield(d, f);
    long long v = 0;
    switch (f->kind) {
    case K_STRING: {
        const char *s = *(const char *const *)p;
        if (f->env) snprintf(out, cap, "env %s, else %s", f->env, s ? s : f->unset);
        else if (s || f->unset) snprintf(out, cap, "%s", s ? s : f->unset);
        else return 0;
        return 1;
    }
    case K_INT: v = *(const int *)p; break;
    case K_UINT: v = *(const unsigned *)p; break;
    case K_SIZE: v = (long long)*(const size_t *)p; break;
    case K_U64: v = (long long)*(const uint64_t *)p; break;
    case K_SECONDS: v = (long long)*(const double *)p; break;
    case K_ENUM:
        for (const Choice *ch = f->choices; ch->name; ch++)
            if (!ch->alias && ch->value == *(const int *)p) { snprintf(out, cap, "%s", ch->name); return 1; }
        return 0;
    case K_LIST:
        if (*(const int *)((const char *)d + f->count_off) || !f->unset) return 0;
        snprintf(out, cap, "%s", f->unset);
        return 1;
    case K_CUSTOM:
        if (!f->show) return 0;
        f->show(d, out, cap);
        return 1;
    case K_SWITCH: case K_HELP: return 0;
    }
    if (v == 0 && f->unset) snprintf(out, cap, "%s", f->unset);
    else if (f->bytes && v >= (1ll << 30) && v % (1ll << 30) == 0) snprintf(out, cap, "%lld = %lld GiB", v, v >> 30);
    else if (f->bytes && v >= (1ll << 20) && v % (1ll << 20) == 0) snprintf(out, cap, "%lld = %lld MiB", v, v >> 20);
    else if (f->bytes && v >= (1ll << 10) && v % (1ll << 10) == 0) snprintf(out, cap, "%lld = %lld KiB", v, v >> 10);
    else snprintf(out, cap, "%lld", v);
    return 1;
}

#define HELP_WIDTH 112
#define HELP_INDENT 28

/* text from column col (the cursor, where a word may start) word-wrapped to
 * HELP_WIDTH, continuing at column indent; ends the line. */
static void wrap(FILE *out, const char *text, int col, int indent) {
    int fresh = 1; /* nothing on this line since col */
    for (const char *w = text; *w;) {
        if (*w == ' ') { w++; continue; }
        int n = (int)strcspn(w, " ");
        if (!fresh && col + 1 + n > HELP_WIDTH) {
            fprintf(out, "\n%*s", indent, "");
            col = indent;
        } else if (!fresh) {
            fputc(' ', out);
            col++;
        }
        fwrite(w, 1, (size_t)n, out);
        col += n;
        w += n;
        fresh = 0;
    }
    fputc('\n', out);
}

/* "/a, /b, /c" of the routes with a handler, admin ones or the others. */
static void route_list(char *out, size_t cap, int admin) {
    int n;
    const Route *r = routes_table(&n);
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        if (!r[i].handler || r[i].prefix || (r[i].auth == AUTH_ADMIN) != admin) continue;
        if (i && !strcmp(r[i - 1].path, r[i].path)) continue; /* the same path with another method */
        size_t len = strlen(out);
        snprintf(out + len, cap - len, "%s%s", len ? ", " : "", r[i].path);
    }
}

void flags_help(FILE *out, const char *prog) {
    CliConfig *d = xmalloc(sizeof *d);
    flags_default(d);
    char *tmp = prog ? strdup(prog) : NULL, api[1024], admin[1024], text[2560];
    fprintf(out, "usage: %s [flags]\n", tmp ? basename(tmp) : "sampler-cpu");
    free(tmp);
    route_list(api, sizeof api, 0);
    route_list(admin, sizeof admin, 1);
    snprintf(text, sizeof text, "Serves one model: the OpenAI API and probes (%s) plus the trainer's admin "
             "endpoints (%s; --admin-token).", api, admin);
    wrap(out, text, 0, 0);
    const char *section = NULL;
    for (int i = 0; i < N_FLAGS; i++) {
        const Flag *f = &FLAGS[i];
        if (!section || strcmp(section, f->section)) {
            fprintf(out, "\n%s\n", f->section);
            section = f->section;
        }
        char head[96], def[256], rng[64] = "";
        snprintf(head, sizeof head, "%s%s%s%s%s", f->alias ? f->alias : "", f->alias ? ", " : "", f->name,
                 f->metavar ? " " : "", f->metavar ? f->metavar : "");
        int col = fprintf(out, "  %s", head);
        col += fprintf(out, "%*s", col < HELP_INDENT ? HELP_INDENT - col : 1, "");
        if (f->show_range) snprintf(rng, sizeof rng, " (%lld to %lld)", f->lo, f->hi);
        int has_def = show_default(f, d, def, sizeof def);
        snprintf(text, sizeof text, "%s%s%s%s%s", f->help, rng, has_def ? " (default: " : "", has_def ? def : "",
                 has_def ? ")" : "");
        wrap(out, text, col, HELP_INDENT);
    }
    fputc('\n', out);
    wrap(out, "SIGTERM / SIGINT: stop accepting, let in-flight requests finish for --shutdown-timeout seconds, "
              "abort the rest, exit 0.", 0, 0);
    free(d);
}
