/*
 * metrics_vllm.c - the vllm:* series of GET /metrics: the engine's state and
 * counters under vLLM's v1 names, types, label sets ({model_name, engine})
 * and histogram buckets (vllm/v1/metrics/loggers.py), so dashboards and
 * orchestrators written for vLLM (prime-rl's adaptive concurrency reads KV
 * usage, preemptions and the waiting queue) read a sampler unchanged.
 *
 * Meanings where ours differ in unit: vLLM counts requests; the sampler's
 * engine schedules sequences (a request with n=4 is four), so the running /
 * waiting gauges and request_success count sequences, as vLLM's do for its
 * child requests of n > 1. TTFT is one sample per request (submit to the
 * first token of any of its sequences, as sampler_time_to_first_token_seconds),
 * inter-token latency one per later token of each sequence, e2e and the
 * prompt / generation token counts one per sequence (at its finish, any
 * finish reason; buckets 1, 2, 5, 10, ... up to max_model_len as vLLM's).
 *
 * Not here: the sampler_* series and /health (metrics.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

/* The label set every vllm:* series carries, with the model name escaped
 * for the exposition format (backslash, quote, newline). */
static void labels(char *out, size_t cap, const char *model) {
    size_t n = 0;
    n += (size_t)snprintf(out, cap, "model_name=\"");
    for (const char *p = model; *p && n + 3 < cap; p++) {
        if (*p == '\\' || *p == '"') { out[n++] = '\\'; out[n++] = *p; }
        else if (*p == '\n') { out[n++] = '\\'; out[n++] = 'n'; }
        else out[n++] = *p;
    }
    out[n] = 0;
    snprintf(out + n, cap - n, "\",engine=\"0\"");
}

static void head(Buf *b, const char *name, const char *type, const char *help) {
    buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void gauge(Buf *b, const char *lab, const char *name, const char *help, double v) {
    head(b, name, "gauge", help);
    buf_printf(b, "%s{%s} %.17g\n", name, lab, v);
}

static void counter(Buf *b, const char *lab, const char *name, const char *help, unsigned long long v) {
    head(b, name, "counter", help);
    buf_printf(b, "%s{%s} %llu\n", name, lab, v);
}

/* A bucket bound as Python's prometheus_client writes it (vLLM's exposition):
 * the shortest decimal that reads back as the same double, with ".0" on
 * whole numbers: 0.005, 1.0, 2560.0. */
static void fmt_le(char *out, size_t cap, double v) {
    for (int prec = 0; prec <= 17; prec++) { /* the bounds here lie in [1e-3, 1e7]: fixed notation, as repr */
        snprintf(out, cap, "%.*f", prec, v);
        if (strtod(out, NULL) == v) break;
    }
    if (!strchr(out, '.')) strncat(out, ".0", cap - strlen(out) - 1);
}

static void hist_b(Buf *b, const char *lab, const char *name, const char *help, const EngineVHist *h,
                   const double *bound, int n) {
    head(b, name, "histogram", help);
    unsigned long long cum = 0;
    for (int i = 0; i < n; i++) {
        cum += h->count[i];
        char le[32];
        fmt_le(le, sizeof le, bound[i]);
        buf_printf(b, "%s_bucket{%s,le=\"%s\"} %llu\n", name, lab, le, cum);
    }
    cum += h->count[n];
    buf_printf(b, "%s_bucket{%s,le=\"+Inf\"} %llu\n", name, lab, cum);
    buf_printf(b, "%s_sum{%s} %.9g\n%s_count{%s} %llu\n", name, lab, h->sum, name, lab, (unsigned long long)h->n);
}

static void hist(Buf *b, const char *lab, const char *name, const char *help, const EngineVHist *h,
                 EngineVHistKind k) {
    hist_b(b, lab, name, help, h, engine_vhist_bounds[k], engine_vhist_n[k]);
}

void metrics_vllm(Buf *b, Server *s, const EngineMetrics *m) {
    char lab[640];
    labels(lab, sizeof lab, s->model_name);
    gauge(b, lab, "vllm:num_requests_running", "Number of requests in model execution batches.", m->running);
    gauge(b, lab, "vllm:num_requests_waiting", "Number of requests waiting to be processed.", m->waiting);
    gauge(b, lab, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", m->kv_usage);
    counter(b, lab, "vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.",
            m->prefix_cache_queries);
    counter(b, lab, "vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.",
            m->prefix_cache_hits);
    counter(b, lab, "vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", m->preemptions);
    counter(b, lab, "vllm:prompt_tokens_total", "Number of prefill tokens processed.", m->prompt_tokens);
    counter(b, lab, "vllm:generation_tokens_total", "Number of generation tokens processed.", m->generated_tokens);
    head(b, "vllm:request_success_total", "counter", "Count of successfully processed requests.");
    buf_printf(b, "vllm:request_success_total{%s,finished_reason=\"stop\"} %llu\n", lab,
               (unsigned long long)m->requests_finished_stop);
    buf_printf(b, "vllm:request_success_total{%s,finished_reason=\"length\"} %llu\n", lab,
               (unsigned long long)m->requests_finished_length);
    buf_printf(b, "vllm:request_success_total{%s,finished_reason=\"abort\"} %llu\n", lab,
               (unsigned long long)m->requests_finished_abort);
    hist(b, lab, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", &m->vttft,
         ENGINE_VHIST_TTFT);
    hist(b, lab, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", &m->vitl,
         ENGINE_VHIST_ITL);
    hist(b, lab, "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", &m->ve2e,
         ENGINE_VHIST_E2E);
    hist_b(b, lab, "vllm:request_prompt_tokens", "Number of prefill tokens processed.", &m->vprompt, m->vtok_bounds,
           m->vtok_n);
    hist_b(b, lab, "vllm:request_generation_tokens", "Number of generation tokens processed.", &m->vgen,
           m->vtok_bounds, m->vtok_n);
}
