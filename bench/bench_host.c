/*
 * bench_host.c - the host path of a GPU server, measured on any CPU: the
 * sampler itself (server/main.c: flags, HTTP, dialects, tokenizer, engine
 * with sampling on the device and async scheduling) over a modeled device
 * whose steps take the time a GPU at its rooflines would take for the step's
 * shapes, and whose sampler returns synthetic per-row results. Whatever the
 * served throughput falls short of the device's is the host's doing: HTTP,
 * JSON, SSE, detokenization, scheduling, publishing (issue 17's "host time <
 * 5% of the step at batch 256").
 *
 *   [BENCH_DEVICE=key=value,...] bench_host SAMPLER FLAGS...
 *   BENCH_DEVICE=help bench_host        (the keys and their defaults)
 *   python3 bench/gpu_served.py --bin build/bench_host --model models/tiny-qwen3 ...
 *
 * Not a server: its tokens, log-probs and masks are made up (the engine's
 * counter RNG of seed, sample and position, sampling_uniform; well formed, so every output path runs), and no
 * forward pass runs at all. The model directory only supplies the
 * vocabulary, tokenizer, chat template and EOS ids; the device model's
 * shapes (default Qwen3-8B on an H200 at its measured rooflines) are
 * BENCH_DEVICE's keys.
 *
 * How it plugs in: a link seam. The binary is server/main.c plus this file,
 * which defines runner_backend_create and its siblings (runner_backend.h),
 * so the linker takes them from here and never pulls
 * server/engine/runner_backend.c out of the engine library. Every other line
 * that runs is the product's.
 *
 * The device: one stream. Each call enqueues work that starts when the device
 * is free or now, whichever is later, and ends after its modeled time;
 * forward and sample_launch return at once (as kernel launches do), and
 * sample_wait / fetch_logits sleep until the work they wait for has ended.
 *   forward: launch + max(bytes / bw, flops / peak), bytes = weights + each
 *     sequence's KV up to its last position in the step, flops = 2 x params
 *     x tokens + attention (attn_flops per position per token);
 *   sample: launch + rows x vocab x 4 bytes x 3 passes / bw.
 * Each step's device time, from its forward's start to its sampled results,
 * goes where a GPU's goes (runner_backend_count_device: /metrics
 * sampler_device_step_seconds_total), so gpu_served.py reports the same
 * device_busy_share for this and for a GPU; the log at exit gives the total.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "dev_sample.h"
#include "engine.h"
#include "log.h"
#include "runner_backend.h"
#include "sampling.h"

/* The modeled device (flags below). */
typedef struct DeviceModel {
    double bw;            /* bytes / s the device reads at */
    double peak;          /* FLOP / s of its dense matmuls */
    double params;        /* matmul parameters (one FMA per token each) */
    double weight_bytes;  /* bytes read per step for the weights */
    double kv_pos_bytes;  /* K + V bytes of one position, all layers */
    double attn_flops;    /* attention FLOPs per (token, context position), all layers */
    double launch_s;      /* fixed cost of a step's launch (graph replay) */
} DeviceModel;

/* Defaults: Qwen3-8B (36 layers, 32 / 8 heads of 128, 8.19B parameters of which 0.62B are the
 * embedding table, not read by a step; BF16 weights and KV) on one H200 at the rooflines of the
 * 2026-11-29 run (bench/RESULTS.md): 4,251 GB/s copy bandwidth, 775 TFLOP/s BF16 GEMM. */
static DeviceModel g_dm = {
    .bw = 4251e9, .peak = 775e12, .params = 7.57e9, .weight_bytes = 2 * 7.57e9,
    .kv_pos_bytes = 36.0 * 2 * 8 * 128 * 2, .attn_flops = 4.0 * 36 * 32 * 128, .launch_s = 20e-6,
};

typedef struct DeviceKey {
    const char *name;
    double *val;
    double scale; /* value x scale = the field's unit */
    const char *help;
} DeviceKey;

static const DeviceKey DEVICE_KEYS[] = {
    {"bw_gbs", &g_dm.bw, 1e9, "read bandwidth, GB/s (default 4251: H200 copy roofline)"},
    {"tflops", &g_dm.peak, 1e12, "dense BF16 matmul rate, TFLOP/s (default 775: H200 cuBLAS roofline)"},
    {"params_b", &g_dm.params, 1e9, "matmul parameters, billions (default 7.57: Qwen3-8B less its embedding)"},
    {"weight_gb", &g_dm.weight_bytes, 1e9, "weight bytes read per step, GB (default 15.14: BF16)"},
    {"kv_pos_kb", &g_dm.kv_pos_bytes, 1e3, "K + V bytes per position, all layers, KB (default 147.456: "
                                           "36 layers x 8 KV heads x 128 x 2 x BF16)"},
    {"attn_kflops", &g_dm.attn_flops, 1e3, "attention FLOPs per token and context position, thousands "
                                           "(default 589.824: 4 x 36 layers x 32 heads x 128)"},
    {"launch_us", &g_dm.launch_s, 1e-6, "fixed cost of each launch, us (default 20)"},
};
enum { N_DEVICE_KEYS = sizeof DEVICE_KEYS / sizeof DEVICE_KEYS[0] };

/* ---- the device: one stream of modeled work ---- */
typedef struct FakeDevice {
    Runner *r;            /* the CPU runner server.c made (owned: freed with the backend); never run */
    int vocab;
    int max_tokens;       /* max_batched_tokens */
    int32_t *seq_max;     /* [max_tokens] scratch: each sequence's last position in a step */
    double free_at;       /* when the device's queue runs dry (CLOCK_MONOTONIC seconds) */
    double slot_done[DEV_SAMPLE_SLOTS]; /* when each sampling slot's results are on the host */
    DevSampleOut *out[DEV_SAMPLE_SLOTS];  /* [max_rows] */
    int32_t *packed[DEV_SAMPLE_SLOTS];    /* [max_rows, DEV_MASK_WORDS(vocab)] */
    int max_rows;
    atomic_ullong *ns, *calls;
    unsigned long long steps, tokens, rows; /* totals, engine thread only (logged at exit) */
    double fwd_start;     /* when the last forward's device work began */
    double slot_begin[DEV_SAMPLE_SLOTS]; /* when each sampling slot's step began */
    double step_s;        /* device time of the steps sampled on the device, begin to results */
    atomic_ullong *device_ns; /* step_s in ns for /metrics, or NULL */
} FakeDevice;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void sleep_until(double t) {
    struct timespec ts = { (time_t)t, (long)((t - floor(t)) * 1e9) };
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {}
}

/* Queue dt seconds of device work issued now; returns when it ends. */
static double device_enqueue(FakeDevice *d, double dt) {
    double t = now_s();
    d->free_at = (d->free_at > t ? d->free_at : t) + dt;
    return d->free_at;
}

static double forward_time(FakeDevice *d, const Batch *b) {
    for (int s = 0; s < b->n_seqs; s++) d->seq_max[s] = -1;
    double attn = 0, kv = 0;
    for (int i = 0; i < b->n_tokens; i++) {
        int s = b->seq[i];
        if (b->pos[i] > d->seq_max[s]) d->seq_max[s] = b->pos[i];
        attn += (double)(b->pos[i] + 1);
    }
    for (int s = 0; s < b->n_seqs; s++) kv += (double)(d->seq_max[s] + 1);
    double mem = (g_dm.weight_bytes + kv * g_dm.kv_pos_bytes) / g_dm.bw;
    double math = (2 * g_dm.params * b->n_tokens + attn * g_dm.attn_flops) / g_dm.peak;
    return g_dm.launch_s + (mem > math ? mem : math);
}

static int fake_forward(void *ctx, const Batch *b, float *logits, Err *err) {
    FakeDevice *d = ctx;
    double t0 = now_s();
    if (b->n_tokens > d->max_tokens || b->n_seqs > d->max_tokens)
        return ERR(err, 500, "batch of %d tokens over the %d the backend was made for", b->n_tokens, d->max_tokens);
    double dt = forward_time(d, b), end = device_enqueue(d, dt);
    d->fwd_start = end - dt;
    d->steps++;
    d->tokens += (unsigned long long)b->n_tokens;
    if (logits) { /* the host samples this step (prompt log-probs, a fallback): the copy waits for the step */
        sleep_until(end);
        memset(logits, 0, (size_t)b->n_out * (size_t)d->vocab * sizeof(float));
    }
    if (d->ns) atomic_fetch_add(d->ns, (unsigned long long)((now_s() - t0) * 1e9));
    if (d->calls) atomic_fetch_add(d->calls, 1);
    return 0;
}

static void fake_copy_block(void *ctx, int src, int dst) { (void)device_enqueue(ctx, 2e-6); }

static int bit_set(const uint64_t *bits, int off, int id) { return off < 0 || ((bits[off + id / 64] >> (id % 64)) & 1); }

/* The made-up token of a row: an ordinary id from the hash, moved forward to the first id the row's
 * allowed_token_ids and grammar sets allow and no ban names (the engine checks what it publishes). */
static int32_t pick_token(const FakeDevice *d, const DevSampleBatch *bt, const DevSampleRow *row, uint64_t h) {
    int lo = d->vocab > 2000 ? 1000 : 0, hi = d->vocab > 2000 ? d->vocab - 1000 : d->vocab;
    int32_t t = lo + (int32_t)(h % (uint64_t)(hi - lo));
    for (int k = 0; k < d->vocab; k++, t = (t + 1) % d->vocab) {
        if (!bit_set(bt->bits, row->allow_off, t) || !bit_set(bt->bits, row->gram_off, t)) continue;
        int banned = 0;
        for (int i = 0; i < row->n_ban && !banned; i++) banned = bt->ban[row->ban_off + i] == t;
        for (int i = 0; i < row->n_bias && !banned; i++)
            banned = bt->bias_ids[row->bias_off + i] == t && isinf(bt->bias_val[row->bias_off + i]);
        if (!banned) return t;
    }
    return -1;
}

/* Pack the kept set [a, a + n) as the device does (dev_mask_form's rule); returns its length. */
static int pack_range(int a, int n, int vocab, int32_t *dst, int *form) {
    int len;
    *form = dev_mask_form(n, vocab, &len);
    if (*form == DEV_MASK_IDS) {
        for (int i = 0; i < n; i++) dst[i] = a + i;
    } else if (*form == DEV_MASK_COMPLEMENT) {
        int w = 0;
        for (int id = 0; id < a; id++) dst[w++] = id;
        for (int id = a + n; id < vocab; id++) dst[w++] = id;
    } else {
        memset(dst, 0, (size_t)len * sizeof(int32_t));
        for (int id = a; id < a + n; id++) dst[id >> 5] |= (int32_t)(1u << (id & 31));
    }
    return len;
}

static int fake_sample_launch(void *ctx, int n_out, const DevSampleBatch *bt, int slot, Err *err) {
    FakeDevice *d = ctx;
    if (bt->n_rows > d->max_rows || slot < 0 || slot >= DEV_SAMPLE_SLOTS)
        return ERR(err, 500, "%d sampling rows over the %d reserved (slot %d)", bt->n_rows, d->max_rows, slot);
    int words = DEV_MASK_WORDS(d->vocab);
    for (int i = 0; i < bt->n_rows; i++) {
        const DevSampleRow *row = &bt->rows[i];
        DevSampleOut *o = &d->out[slot][i];
        uint64_t h = (uint64_t)(sampling_uniform(row->seed, (uint64_t)row->seq_index, (uint64_t)row->pos) * 0x1p53);
        o->token = pick_token(d, bt, row, h);
        if (o->token < 0) return ERR(err, 500, "row %d allows no token", i);
        int constrained = row->allow_off >= 0 || row->gram_off >= 0 || row->n_ban > 0;
        int n = row->temperature == 0 || constrained ? 1
                : row->top_k > 0 && row->top_k < d->vocab ? row->top_k
                : row->top_p < 1 ? 64 : d->vocab;
        o->n_kept = n;
        o->logprob = row->temperature == 0 || n == 1 ? 0.0f : -(float)(h % 1000) / 100.0f;
        o->logprob_raw = row->flags & DEV_SAMPLE_RAW ? o->logprob - 0.25f : NAN;
        o->value = row->flags & DEV_SAMPLE_VALUE ? o->logprob : NAN;
        o->rank = row->flags & DEV_SAMPLE_VALUE ? 1 + (int32_t)(h % 7) : 0;
        for (int k = 0; k < row->top_n; k++) {
            o->top_ids[k] = (o->token + k) % d->vocab;
            o->top_lp[k] = -0.1f * (float)(k + 1);
        }
        o->mask_form = o->mask_len = 0;
        if (row->mask_slot >= 0) {
            int a = o->token - (int)(h % (uint64_t)n);
            if (a < 0) a = 0;
            if (a + n > d->vocab) a = d->vocab - n;
            o->mask_len = pack_range(a, n, d->vocab, d->packed[slot] + (size_t)row->mask_slot * words, &o->mask_form);
        }
    }
    double dt = g_dm.launch_s + (double)bt->n_rows * d->vocab * 4.0 * 3 / g_dm.bw;
    d->slot_done[slot] = device_enqueue(d, dt);
    d->slot_begin[slot] = d->fwd_start;
    d->rows += (unsigned long long)bt->n_rows;
    (void)n_out;
    return 0;
}

static int fake_sample_wait(void *ctx, int slot, const DevSampleOut **out, const int32_t **packed, Err *err) {
    FakeDevice *d = ctx;
    sleep_until(d->slot_done[slot]);
    d->step_s += d->slot_done[slot] - d->slot_begin[slot];
    if (d->device_ns) atomic_store(d->device_ns, (unsigned long long)(d->step_s * 1e9));
    *out = d->out[slot];
    *packed = d->packed[slot];
    return 0;
}

static void fake_fetch_logits(void *ctx, float *logits, int n_out) {
    FakeDevice *d = ctx;
    sleep_until(d->free_at);
    memset(logits, 0, (size_t)n_out * (size_t)d->vocab * sizeof(float));
}

/* ---- start-up: BENCH_DEVICE's keys ---- */
static void device_model_parse(const char *spec) {
    if (!strcmp(spec, "help")) {
        printf("BENCH_DEVICE=key=value,... (bench_host's modeled device):\n");
        for (int k = 0; k < N_DEVICE_KEYS; k++) printf("  %-12s %s\n", DEVICE_KEYS[k].name, DEVICE_KEYS[k].help);
        exit(0);
    }
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *save = NULL, *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        CHECK(eq, "BENCH_DEVICE: '%s' is not key=value\n  fix: BENCH_DEVICE=help lists the keys", kv);
        *eq = 0;
        int k = 0;
        while (k < N_DEVICE_KEYS && strcmp(kv, DEVICE_KEYS[k].name)) k++;
        CHECK(k < N_DEVICE_KEYS, "BENCH_DEVICE: unknown key '%s'\n  fix: BENCH_DEVICE=help lists the keys", kv);
        char *end = NULL;
        double v = strtod(eq + 1, &end);
        CHECK(end != eq + 1 && !*end && v >= 0, "BENCH_DEVICE: %s=%s is not a number >= 0", kv, eq + 1);
        *DEVICE_KEYS[k].val = v * DEVICE_KEYS[k].scale;
    }
    CHECK(g_dm.bw > 0 && g_dm.peak > 0, "BENCH_DEVICE: bw_gbs and tflops must be > 0");
}

/* ---- the link seam (runner_backend.h) ---- */
EngineBackend runner_backend_create(Model *m, Runner *r, EngineConfig *c, atomic_ullong *ns, atomic_ullong *calls,
                                    atomic_ullong *graphs) {
    const char *spec = getenv("BENCH_DEVICE");
    if (spec) device_model_parse(spec);
    engine_config_resolve(c, &m->cfg);
    FakeDevice *d = xcalloc(1, sizeof *d);
    d->r = r;
    d->vocab = m->cfg.vocab;
    d->max_tokens = c->max_batched_tokens;
    d->seq_max = xcalloc((size_t)d->max_tokens, sizeof(int32_t));
    DevSampleCaps caps;
    engine_devsample_caps(c, d->vocab, &caps);
    d->max_rows = caps.max_rows;
    for (int k = 0; k < DEV_SAMPLE_SLOTS; k++) {
        d->out[k] = xcalloc((size_t)d->max_rows, sizeof(DevSampleOut));
        d->packed[k] = xcalloc((size_t)d->max_rows * DEV_MASK_WORDS(d->vocab), sizeof(int32_t));
    }
    d->ns = ns;
    d->calls = calls;
    (void)graphs;
    EngineBackend be = {d, fake_forward, fake_copy_block, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    if (c->device_sampling != ENGINE_DEVSAMPLE_OFF) {
        be.sample_launch = fake_sample_launch;
        be.sample_wait = fake_sample_wait;
        be.fetch_logits = fake_fetch_logits;
    }
    log_info("bench_host: a modeled device (%.0f GB/s, %.0f TFLOP/s, %.2fB params, %.1f GB weights, %.1f KB KV "
             "per position); made-up tokens", g_dm.bw / 1e9, g_dm.peak / 1e12, g_dm.params / 1e9,
             g_dm.weight_bytes / 1e9, g_dm.kv_pos_bytes / 1e3);
    return be;
}

void runner_backend_count_device(EngineBackend *be, atomic_ullong *device_ns) {
    ((FakeDevice *)be->ctx)->device_ns = device_ns;
}

Runner *runner_backend_runner(const EngineBackend *be) { return ((const FakeDevice *)be->ctx)->r; }

void runner_backend_free(EngineBackend *be) {
    FakeDevice *d = be->ctx;
    if (!d) return;
    log_info("bench_host: %.3f s of device time on the steps sampled on the device; %llu steps, %llu tokens, %llu "
             "sampled rows", d->step_s, d->steps, d->tokens, d->rows);
    for (int k = 0; k < DEV_SAMPLE_SLOTS; k++) {
        free(d->out[k]);
        free(d->packed[k]);
    }
    free(d->seq_max);
    runner_free(d->r);
    free(d);
    be->ctx = NULL;
}

