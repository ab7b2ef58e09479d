/*
 * engine.c - the engine's frame: configuration defaults, create / free, the
 * engine thread's loop and the metrics (engine.h).
 *
 * The loop, on the engine thread: apply the control commands queued since
 * the last step, in order (engine_control.c), then run one step
 * (engine_step.c); sleep on Engine.cv when there is no command and nothing
 * to compute. The engine drives only an EngineBackend: the caller builds it
 * (runner_backend.h for a Runner, or a CUDA / test backend) and frees it
 * after engine_free.
 *
 * Memory: everything per step is preallocated at create; per request, see
 * engine_request.c.
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine_internal.h"
#include "log.h"

const double engine_hist_bounds[ENGINE_HIST_BUCKETS] = {
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, INFINITY};

/* vLLM's buckets: time_to_first_token_seconds, inter_token_latency_seconds, e2e_request_latency_seconds. */
static const double VTTFT[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                               1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double VITL[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                              0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
static const double VE2E[] = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                              30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
const double *const engine_vhist_bounds[ENGINE_N_VHIST] = {VTTFT, VITL, VE2E};
const int engine_vhist_n[ENGINE_N_VHIST] = {(int)(sizeof VTTFT / sizeof VTTFT[0]), (int)(sizeof VITL / sizeof VITL[0]),
                                            (int)(sizeof VE2E / sizeof VE2E[0])};
_Static_assert(sizeof VTTFT / sizeof VTTFT[0] <= ENGINE_VHIST_MAX, "ENGINE_VHIST_MAX too small");

void engine_vhist_add(EngineVHist *h, EngineVHistKind k, double v) { engine_vhist_add_b(h, engine_vhist_bounds[k], engine_vhist_n[k], v); }

void engine_vhist_add_b(EngineVHist *h, const double *b, int n, double v) {
    int i = 0;
    while (i < n && v > b[i]) i++; /* Prometheus buckets are le: v <= bound */
    h->count[i]++;
    h->n++;
    h->sum += v;
}

double engine_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void engine_config_default(EngineConfig *c) {
    memset(c, 0, sizeof *c);
    c->max_running_seqs = 64;
    c->max_batched_tokens = 2048;
    c->max_model_len = 0;
    c->max_waiting = 1024;
    c->block_size = 16;
    c->n_blocks = 0;
    c->kv_mem_mb = 1024;
    c->kv_cache_dtype = ENGINE_KV_AUTO;
    c->enable_prefix_cache = 1;
    c->max_prompt_logprob_rows = 64;
    c->max_request_output_mb = 2048;
    c->max_output_mem_mb = 8192;
    c->n_threads = 0;
    c->verbose = 1;
}

void engine_config_resolve(EngineConfig *c, const ModelConfig *mc) {
    /* auto: the model's dtype. Every checkpoint we load computes from BF16 weights (FP8 / NVFP4
     * precisions keep BF16 masters and activations), so auto is BF16, as vLLM's auto is for them. */
    if (c->kv_cache_dtype == ENGINE_KV_AUTO) c->kv_cache_dtype = KV_BF16;
    CHECK(c->kv_cache_dtype >= 0 && c->kv_cache_dtype < KV_DTYPE_COUNT, "KV cache dtype %d unknown",
          c->kv_cache_dtype);
    size_t per_block = (size_t)mc->n_layers * c->block_size *
                       kv_dtype_bytes_per_pos((KvDtype)c->kv_cache_dtype, mc->n_kv_heads, mc->head_dim);
    if (c->n_blocks <= 0) c->n_blocks = (int)((c->kv_mem_mb << 20) / per_block);
    CHECK(c->n_blocks > 0, "--kv-mem-mb %zu is less than one KV block (%zu bytes)", c->kv_mem_mb, per_block);
    int pool_tokens = c->n_blocks * c->block_size;
    if (c->max_model_len <= 0) {
        c->max_model_len = mc->max_pos < 4096 ? mc->max_pos : 4096;
        if (c->max_model_len > pool_tokens) c->max_model_len = pool_tokens;
    }
}

static void update_gauges(Engine *e) {
    pthread_mutex_lock(&e->mmu);
    e->m.running = e->sch->n_running;
    e->m.waiting = e->sch->n_waiting;
    e->m.kv_blocks_total = block_manager_n_blocks(e->bm);
    e->m.kv_blocks_used = block_manager_n_used(e->bm);
    e->m.kv_blocks_cached = block_manager_n_cached(e->bm);
    e->m.kv_usage = (double)e->m.kv_blocks_used / (double)e->m.kv_blocks_total;
    e->m.prefix_cache_queries = e->sch->lookup_tokens;
    e->m.prefix_cache_hits = e->sch->hit_tokens;
    e->m.preemptions = e->sch->preemptions;
    e->m.weight_version = atomic_load(&e->version);
    e->m.paused = e->paused;
    e->m.step_times = e->st;
    pthread_mutex_unlock(&e->mmu);
}

/* Something to compute (engine-thread state). */
static int has_work(const Engine *e) {
    if (e->steps[!e->cur].live) return 1; /* a step in flight ends at the next engine_step */
    return !e->paused && (e->sch->n_running > 0 || (e->sch->n_waiting > 0 && e->sch->admit));
}

static void *engine_main(void *arg) {
    Engine *e = arg;
    int idle = 0; /* the last step computed nothing: wait for an event */
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stop && !e->cmd_head && (idle || !has_work(e))) {
            pthread_cond_wait(&e->cv, &e->mu);
            idle = 0; /* something happened: plan again */
        }
        int stop = e->stop;
        pthread_mutex_unlock(&e->mu);
        if (stop) break;
        double t_a = engine_now_s(), d_a = e->drained;
        engine_apply_commands(e); /* drains a step in flight before a pause or an exclusive command */
        if (e->paused) engine_step_drain(e);
        double t_b = engine_now_s(), d_b = e->drained;
        idle = e->paused || !engine_step(e);
        double t_c = engine_now_s();
        engine_check_pause_wait(e);
        update_gauges(e);
        /* the host time between two busy steps (less the drains, which are step time);
         * published by the next update_gauges (one iteration late, which a total does not mind) */
        if (!idle) e->st.control += (t_b - t_a) - (d_b - d_a) + (engine_now_s() - t_c);
    }
    /* shutting down: queued commands complete, everything left finishes with FINISH_ABORT */
    engine_drain_commands(e);
    while (e->active) engine_request_abort_now(e, e->active);
    update_gauges(e);
    return NULL;
}

void engine_metrics(Engine *e, EngineMetrics *out) {
    pthread_mutex_lock(&e->mmu);
    *out = e->m;
    pthread_mutex_unlock(&e->mmu);
}

const EngineConfig *engine_config(const Engine *e) { return &e->cfg; }

int engine_experts_per_token(const Engine *e) { return e->E; }

/* ---- create / free ---- */
static Engine *engine_new(const ModelConfig *mc, const EngineConfig *cfg) {
    Engine *e = xcalloc(1, sizeof *e);
    e->mc = *mc;
    if (cfg) e->cfg = *cfg;
    else engine_config_default(&e->cfg);
    EngineConfig *c = &e->cfg;
    CHECK(c->max_running_seqs > 0, "--max-running-seqs must be > 0 (got %d)", c->max_running_seqs);
    CHECK(c->max_loras >= 0 && c->max_loras <= ENGINE_MAX_LORAS, "--max-loras must be in [0, %d] (got %d)", ENGINE_MAX_LORAS,
          c->max_loras);
    CHECK(c->max_batched_tokens > 0, "--max-batched-tokens must be > 0 (got %d)", c->max_batched_tokens);
    CHECK(c->block_size > 0, "--block-size must be > 0 (got %d)", c->block_size);
    CHECK(c->max_waiting > 0, "--max-waiting must be > 0 (got %d)", c->max_waiting);
    CHECK(c->max_prompt_logprob_rows >= 0, "--max-prompt-logprob-rows must be >= 0");
    CHECK(c->max_step_rows >= 0, "--max-step-rows must be >= 0 (0: automatic)");
    CHECK(c->max_request_output_mb > 0 && c->max_output_mem_mb > 0,
          "--max-request-output-mb and --max-output-mem-mb must be > 0");
    for (int l = 0; l < mc->n_layers; l++) e->n_moe += model_layer_is_moe(mc, l);
    e->E = mc->n_experts > 0 ? e->n_moe * mc->top_k : 0;
    e->resume_cmd.kind = CMD_RESUME;
    return e;
}

/* Start the scheduler, the block manager and the engine thread over e->be. */
static void engine_start(Engine *e) {
    EngineConfig *c = &e->cfg;
    int pool_tokens = c->n_blocks * c->block_size;
    CHECK(c->max_model_len >= 2, "--max-model-len must be >= 2 (got %d)", c->max_model_len);
    CHECK(c->max_model_len <= pool_tokens,
          "the KV pool (%d blocks of %d tokens = %d tokens) cannot hold one sequence of --max-model-len %d: "
          "raise --kv-mem-mb / --kv-blocks or lower --max-model-len", c->n_blocks, c->block_size, pool_tokens,
          c->max_model_len);
    /* vLLM's build_1_2_5_buckets(max_model_len) for the token-count histograms */
    e->m.vtok_n = 0;
    for (double p10 = 1; e->m.vtok_n < ENGINE_VHIST_MAX; p10 *= 10) {
        int done = 0;
        for (int m = 0; m < 3 && !done; m++) {
            double b = p10 * (m == 0 ? 1 : m == 1 ? 2 : 5);
            if (b > c->max_model_len || e->m.vtok_n == ENGINE_VHIST_MAX) done = 1;
            else e->m.vtok_bounds[e->m.vtok_n++] = b;
        }
        if (done) break;
    }
    e->bm = block_manager_create(c->n_blocks, c->block_size, c->enable_prefix_cache);
    e->n_sample_threads = c->n_threads > 0 ? c->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (e->n_sample_threads < 1) e->n_sample_threads = 1;
    /* Rows are sampled on the host's sampling threads; a row of a 152k vocabulary
     * is ~0.5 ms of one core, so 4 per thread keeps a step short. At least 32:
     * below that a small machine's step at concurrency 32 decodes half the running
     * sequences and streams every weight twice per token (2-core Zen 5, Qwen3-0.6B
     * shape, BF16 activations, conc 32, two alternating pairs: 16 rows 106.8 / 115.6
     * output tok/s, 32 rows 129.2 / 132.8; the rows' sampling, 16 a thread, is ~8 ms
     * of a ~170 ms step). */
    int rows_max = c->max_running_seqs + c->max_prompt_logprob_rows;
    /* Sampling on the device (engine_devsample_init ran before this) costs the host's sampling
     * threads nothing per row, so that budget would only cut a GPU batch: every running sequence
     * gets its row each step (prompt log-prob steps sample on the host and keep their own cap). */
    if (c->max_step_rows == 0)
        c->max_step_rows = e->dev ? rows_max : 4 * e->n_sample_threads < 32 ? 32 : 4 * e->n_sample_threads;
    if (c->max_step_rows > rows_max) c->max_step_rows = rows_max;
    e->sch = scheduler_create(e->bm, c->max_running_seqs, c->max_batched_tokens, c->max_model_len,
                              c->max_prompt_logprob_rows, c->max_step_rows);
    e->stp = threadpool_create(e->n_sample_threads);
    e->samplers = xcalloc(e->n_sample_threads, sizeof(Sampler *));
    e->mask_bufs = xcalloc(e->n_sample_threads, sizeof(int32_t *));
    e->grammar_bits = xcalloc(e->n_sample_threads, sizeof(uint64_t *));
    for (int i = 0; i < e->n_sample_threads; i++) {
        e->samplers[i] = sampler_create(e->mc.vocab);
        e->mask_bufs[i] = xmalloc((size_t)e->mc.vocab * sizeof(int32_t));
        e->grammar_bits[i] = xmalloc((size_t)(e->mc.vocab + 63) / 64 * sizeof(uint64_t));
    }
    for (int k = 0; k < 2; k++) e->steps[k].jobs = xcalloc(c->max_running_seqs, sizeof(SampleJob));
    e->wake = xcalloc(c->max_running_seqs, sizeof(EngineRequest *));
    e->wake_stamp = 1;
    e->rows_cap = c->max_running_seqs + c->max_prompt_logprob_rows;
    e->logits = xmalloc((size_t)e->rows_cap * e->mc.vocab * sizeof(float));
    for (int k = 0; k < 2 && e->E; k++) { /* a device backend's capture lands in them while the host goes on */
        size_t bytes = (size_t)c->max_batched_tokens * e->E * sizeof(int32_t);
        e->steps[k].experts = e->be.host_alloc ? e->be.host_alloc(e->be.ctx, bytes) : xcalloc(1, bytes);
        e->steps[k].pexp = xcalloc(c->max_running_seqs, sizeof(PexpJob));
    }
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->mmu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_cond_init(&e->cv_done, NULL);
    update_gauges(e);
    if (c->verbose)
        log_info("engine: max_running_seqs=%d max_batched_tokens=%d max_step_rows=%d max_model_len=%d "
                 "max_waiting=%d kv_blocks=%d block_size=%d (%d tokens) kv_cache_dtype=%s prefix_cache=%s threads=%d "
                 "output_mb=%zu/request %zu/all",
                 c->max_running_seqs, c->max_batched_tokens, c->max_step_rows, c->max_model_len, c->max_waiting,
                 c->n_blocks,
                 c->block_size, pool_tokens, kv_dtype_name((KvDtype)c->kv_cache_dtype),
                 c->enable_prefix_cache ? "on" : "off", c->n_threads,
                 c->max_request_output_mb, c->max_output_mem_mb);
    CHECK(pthread_create(&e->thr, NULL, engine_main, e) == 0, "cannot start the engine thread");
}

Engine *engine_create(const ModelConfig *mc, const EngineBackend *be, const EngineConfig *cfg) {
    Engine *e = engine_new(mc, cfg);
    CHECK(e->cfg.n_blocks > 0, "the engine needs EngineConfig.n_blocks > 0 (its backend's KV pool size)");
    CHECK(be && be->forward && be->copy_block, "a backend needs forward and copy_block");
    e->be = *be;
    engine_config_resolve(&e->cfg, mc);
    CHECK(e->cfg.device_sampling != ENGINE_DEVSAMPLE_ON || (be->sample_launch && be->sample_wait && be->fetch_logits),
          "--device-sampling on, but this backend cannot sample on the device\n  fix: run a GPU binary "
          "(sampler-smXX) or pass --device-sampling auto or off");
    engine_devsample_init(e);
    CHECK(e->cfg.async_scheduling != ENGINE_ASYNC_ON || e->dev,
          "--async-scheduling needs sampling on the device, which this engine does not do\n  fix: run a GPU "
          "binary (sampler-smXX) with --device-sampling auto or on, or drop --async-scheduling");
    e->async = e->dev && e->cfg.async_scheduling != ENGINE_ASYNC_OFF;
    if (e->cfg.verbose && e->dev) log_info("engine: async scheduling %s", e->async ? "on" : "off");
    engine_start(e);
    return e;
}

void engine_free(Engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thr, NULL);
    /* every request was retired (its abort dropped) and nothing blocks after stop */
    ASSERT(!e->cmd_head && !e->active, "commands or requests left after the engine thread stopped");
    scheduler_free(e->sch);
    block_manager_free(e->bm);
    for (int i = 0; i < e->n_sample_threads; i++) {
        sampler_free(e->samplers[i]);
        free(e->mask_bufs[i]);
        free(e->grammar_bits[i]);
    }
    free(e->samplers); free(e->mask_bufs); free(e->grammar_bits); free(e->wake);
    free(e->steps[0].jobs); free(e->steps[1].jobs);
    engine_devsample_free(e);
    threadpool_free(e->stp);
    free(e->logits);
    for (int k = 0; k < 2; k++) {
        if (e->be.host_alloc) e->be.host_free(e->be.ctx, e->steps[k].experts);
        else free(e->steps[k].experts);
        free(e->steps[k].pexp);
    }
    pthread_mutex_destroy(&e->mu);
    pthread_mutex_destroy(&e->mmu);
    pthread_cond_destroy(&e->cv);
    pthread_cond_destroy(&e->cv_done);
    free(e);
}
