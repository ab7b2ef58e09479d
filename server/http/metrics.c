/*
 * metrics.c - GET /metrics in the Prometheus text format (0.0.4): HTTP
 * answers by status, engine counters and gauges (requests, tokens, running
 * and waiting sequences, KV usage, prefix-cache hits), time-to-first-token
 * and inter-token-latency histograms, the weight version, and the model's
 * forward time and the engine thread's step time by phase (for the share of
 * the step spent outside the model), then the
 * same engine state under vLLM's names (metrics_vllm.c); and GET
 * /health (200 {"status":"ok"}; 503 once shutting down or while not ready:
 * catching up to the fleet's version, fleet.c), the other probe.
 */
#include <stdio.h>
#include <string.h>

#include "server.h"

static const char *STATUS[SERVER_N_STATUS] = {"200", "400", "401", "403", "404", "409", "413", "422", "503", "500"};

static void counter(Buf *b, const char *name, const char *help, unsigned long long v) {
    buf_printf(b, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name, v);
}

static void counter_s(Buf *b, const char *name, const char *help, double seconds) {
    buf_printf(b, "# HELP %s %s\n# TYPE %s counter\n%s %.9f\n", name, help, name, name, seconds);
}

static void gauge(Buf *b, const char *name, const char *help, double v) {
    buf_printf(b, "# HELP %s %s\n# TYPE %s gauge\n%s %.17g\n", name, help, name, name, v);
}

static void hist(Buf *b, const char *name, const char *help, const EngineHist *h) {
    buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    unsigned long long cum = 0;
    for (int i = 0; i < ENGINE_HIST_BUCKETS; i++) {
        cum += h->count[i];
        if (i == ENGINE_HIST_BUCKETS - 1) buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, cum);
        else buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, engine_hist_bounds[i], cum);
    }
    buf_printf(b, "%s_sum %.9g\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->n);
}

int api_health(HttpReq *q, json_t *body) {
    char why[256];
    if (!fleet_ready(q->s, why, sizeof why)) return http_send_error(q, 503, NULL, "%s", why);
    return http_send_text(q, 200, "application/json", "{\"status\":\"ok\"}", 15);
}

int api_metrics(HttpReq *q, json_t *body) {
    Server *s = q->s;
    EngineMetrics m;
    engine_metrics(s->eng, &m);
    Buf b = {0};
    buf_puts(&b, "# HELP sampler_http_requests_total HTTP answers by status code.\n"
                 "# TYPE sampler_http_requests_total counter\n");
    for (int i = 0; i < SERVER_N_STATUS; i++)
        buf_printf(&b, "sampler_http_requests_total{status=\"%s\"} %llu\n", STATUS[i],
                   (unsigned long long)atomic_load(&s->metrics.http_by_status[i]));
    buf_printf(&b, "sampler_http_requests_total{status=\"other\"} %llu\n", (unsigned long long)atomic_load(&s->metrics.http_other));
    counter(&b, "sampler_requests_submitted_total", "Engine requests accepted.", m.requests_submitted);
    counter(&b, "sampler_requests_rejected_total", "Engine requests refused (bad input or queue full).", m.requests_rejected);
    buf_puts(&b, "# HELP sampler_sequences_finished_total Finished sequences by reason.\n"
                 "# TYPE sampler_sequences_finished_total counter\n");
    buf_printf(&b, "sampler_sequences_finished_total{finish_reason=\"stop\"} %llu\n", (unsigned long long)m.requests_finished_stop);
    buf_printf(&b, "sampler_sequences_finished_total{finish_reason=\"length\"} %llu\n", (unsigned long long)m.requests_finished_length);
    buf_printf(&b, "sampler_sequences_finished_total{finish_reason=\"abort\"} %llu\n", (unsigned long long)m.requests_finished_abort);
    buf_printf(&b, "sampler_sequences_finished_total{finish_reason=\"grammar_dead_end\"} %llu\n",
               (unsigned long long)m.requests_finished_grammar);
    counter(&b, "sampler_prompt_tokens_total", "Prompt tokens submitted (times n).", m.prompt_tokens);
    counter(&b, "sampler_generation_tokens_total", "Tokens generated.", m.generated_tokens);
    counter(&b, "sampler_prefill_tokens_computed_total", "Prompt tokens run through the model (not from the prefix cache).", m.prefill_tokens_computed);
    counter(&b, "sampler_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", m.prefix_cache_queries);
    counter(&b, "sampler_prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", m.prefix_cache_hits);
    gauge(&b, "sampler_prefix_cache_hit_rate", "Prefix-cache hits / queries since start.",
          m.prefix_cache_queries ? (double)m.prefix_cache_hits / (double)m.prefix_cache_queries : 0.0);
    counter(&b, "sampler_preemptions_total", "Sequences preempted for KV space.", m.preemptions);
    counter(&b, "sampler_engine_steps_total", "Engine steps.", m.steps);
    gauge(&b, "sampler_num_requests_running", "Sequences running.", m.running);
    gauge(&b, "sampler_num_requests_waiting", "Sequences waiting.", m.waiting);
    gauge(&b, "sampler_kv_cache_usage_perc", "Fraction of KV blocks referenced by sequences.", m.kv_usage);
    gauge(&b, "sampler_kv_blocks_total", "KV blocks in the pool.", m.kv_blocks_total);
    gauge(&b, "sampler_kv_blocks_used", "KV blocks referenced.", m.kv_blocks_used);
    gauge(&b, "sampler_kv_blocks_cached", "KV blocks held only by the prefix cache.", m.kv_blocks_cached);
    gauge(&b, "sampler_paused", "1 while the engine is paused.", m.paused);
    gauge(&b, "sampler_weight_version", "Version of the weights serving now.", (double)server_weight_version(s, engine_weight_version(s->eng)));
    gauge(&b, "sampler_inflight_requests", "HTTP generations in progress.", atomic_load(&s->inflight));
    counter(&b, "sampler_stream_disconnects_total", "Requests aborted because the client went away.",
            atomic_load(&s->metrics.stream_disconnects));
    gauge(&b, "sampler_model_forward_seconds_total", "Time spent in the model forward pass.",
          (double)atomic_load(&s->metrics.forward_ns) / 1e9);
    counter(&b, "sampler_model_forward_calls_total", "Model forward calls.", atomic_load(&s->metrics.forward_calls));
    counter(&b, "sampler_model_forward_full_graph_calls_total",
            "Model forward calls run as one CUDA graph of the whole step (pure decode; 0 on the CPU).",
            atomic_load(&s->metrics.forward_graphs[0]));
    counter(&b, "sampler_model_forward_piecewise_graph_calls_total",
            "Model forward calls run as piecewise CUDA graphs, attention eager between them (0 on the CPU).",
            atomic_load(&s->metrics.forward_graphs[1]));
    counter_s(&b, "sampler_device_step_seconds_total",
              "Device time of the steps sampled on the device, each from its first op to its sampled results "
              "(0 where not measured: the CPU); 1 - its rate is the share the device waited for the host.",
              (double)atomic_load(&s->metrics.device_ns) / 1e9);
    /* the engine thread's time by phase (EngineStepTimes): the host share of a step is
     * 1 - (forward + device) / (step + control) */
    const EngineStepTimes *st = &m.step_times;
    counter_s(&b, "sampler_step_seconds_total", "Engine steps that computed something: schedule + forward + sample + device sample + publish.", st->step);
    counter_s(&b, "sampler_step_schedule_seconds_total", "Engine steps: planning, batch building, scheduler commit.", st->schedule);
    counter_s(&b, "sampler_step_forward_seconds_total", "Engine steps: the backend's forward (GPU: launches, device work and wait, logits copy).", st->forward);
    counter_s(&b, "sampler_step_sample_seconds_total", "Engine steps: prompt log-probs, forks and sampling of every row (host side).", st->sample);
    counter_s(&b, "sampler_step_device_sample_seconds_total", "Engine steps: device sampling's call (kernels and wait) or a fallback's logits copy.", st->device);
    counter_s(&b, "sampler_step_publish_seconds_total", "Engine steps: stop checks and publishing the records.", st->publish);
    counter(&b, "sampler_async_steps_total", "Steps launched while the previous step's tokens were still on the device (async scheduling).",
            m.async_steps);
    counter_s(&b, "sampler_step_control_seconds_total", "Engine thread between two busy steps: commands, gauges.", st->control);
    hist(&b, "sampler_time_to_first_token_seconds", "Time from submit to the first generated token.", &m.ttft);
    hist(&b, "sampler_inter_token_latency_seconds", "Time between consecutive tokens of a sequence.", &m.itl);
    metrics_vllm(&b, s, &m);
    int ret = http_send_text(q, 200, "text/plain; version=0.0.4", b.p, b.n);
    buf_free(&b);
    return ret;
}
