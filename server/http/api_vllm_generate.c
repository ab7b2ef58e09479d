/*
 * api_vllm_generate.c - POST /inference/v1/generate, vLLM's token-in /
 * token-out route as prime-rl serves it (vllm/entrypoints/serve/disagg
 * protocol.py GenerateRequest / GenerateResponse / GenerateStreamResponse;
 * prime-rl serving_tokens.py, routed_experts.py, kept_tokens.py,
 * weight_version.py; renderers/client.py reads it).
 *
 * Request: token_ids, sampling_params (vLLM SamplingParams names, parsed as
 * /v1/completions parses them; max_tokens absent = the rest of the context),
 * model, stream, stream_options, cache_salt, priority (0 only: no priority
 * scheduling, as vLLM without it), request_id; header X-data-parallel-rank
 * (0 only: one data-parallel rank). Multimodal features and KV transfer are
 * refused (400), not ignored. Masks and routed experts: per request
 * (sampling_params.return_sampling_mask / return_routed_experts), or for
 * every request with vLLM's flags --return-sampling-mask /
 * --enable-return-routed-experts.
 * Response: request_id "generate-tokens-<id>", model, created, choices
 * [{index, logprobs {content [{token "token_id:N", logprob, bytes,
 * top_logprobs}]}, finish_reason, token_ids, routed_experts, and when asked
 * sampling_mask [[ids]] (vLLM) + kept_tokens {ids, counts} (prime-rl, base64
 * int32), weight_versions [[version, first token]] (prime-rl)}], usage with
 * prompt_tokens_details.cached_tokens, prompt_logprobs, kv_transfer_params
 * null, weight_version. routed_experts is prime-rl's {data (base64 raw
 * [T, layers, top_k] uint8, uint16 above 256 experts), shape, start, dtype}
 * for input positions [start, n_prompt + n_out - 1).
 * Streams: one GenerateStreamResponse per step with the new token_ids and
 * logprobs; each choice's last chunk carries finish_reason and its whole
 * routed_experts / masks / weight_versions (vLLM sends these only at the end).
 *
 * Not here: the engine, the OpenAI routes (api_completions.c).
 */
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>

#include "gen.h"
#include "gen_rl.h"
#include "sse.h"
#include "structured.h"

typedef struct VGen {
    Gen g;
    char rid[256];        /* "generate-tokens-" + the client's request_id, or ours */
    int experts_start;    /* sampling_params.routed_experts_prompt_start */
} VGen;

/* SamplingParams fields that change results and that the sampler does not
 * implement: refused with a 400 naming them, never ignored. */
static const char *const UNSUPPORTED_SP[] = {"guided_decoding", "logits_processors", "logprob_token_ids"};

static json_t *tok_key(int32_t id) {
    char k[32];
    snprintf(k, sizeof k, "token_id:%d", id);
    return json_string(k);
}

static json_t *content_json(Gen *g, Choice *c, int from, int to) {
    EngineSeqView v;
    engine_request_seq(c->r, c->seq, &v);
    json_t *content = json_array();
    for (int k = from; k < to; k++) {
        const TokenRecord *r = &v.tokens[k];
        float lp;
        const float *top;
        gen_record_lp(g, r, &lp, &top);
        json_t *e = json_object(), *tl = json_array();
        json_object_set_new(e, "token", tok_key(r->token));
        json_object_set_new(e, "logprob", gen_lp(lp));
        json_object_set_new(e, "bytes", gen_token_bytes(g, r->token));
        for (int j = 0; j < r->n_top && j < g->p.logprobs; j++) {
            json_t *x = json_object();
            json_object_set_new(x, "token", tok_key(r->top_ids[j]));
            json_object_set_new(x, "logprob", gen_lp(top[j]));
            json_object_set_new(x, "bytes", gen_token_bytes(g, r->top_ids[j]));
            json_array_append_new(tl, x);
        }
        json_object_set_new(e, "top_logprobs", tl);
        json_array_append_new(content, e);
    }
    json_t *o = json_object();
    json_object_set_new(o, "content", content);
    return o;
}

static json_t *ids_json(Gen *g, Choice *c, int from, int to) {
    EngineSeqView v;
    engine_request_seq(c->r, c->seq, &v);
    json_t *a = json_array();
    for (int k = from; k < to; k++) json_array_append_new(a, json_integer(v.tokens[k].token));
    (void)g;
    return a;
}

/* prime-rl's routed_experts, or null (dense model, not asked). */
static json_t *experts_json(VGen *v, Choice *c, Err *err, int *failed) {
    Gen *g = &v->g;
    int n_pos;
    int32_t *a = gen_rl_experts(g, c, c->n_out, &n_pos, err);
    if (n_pos < 0) { *failed = 1; return json_null(); }
    if (!a) return json_null();
    int top_k = g->s->model->cfg.top_k, E = engine_experts_per_token(g->s->eng);
    int wide = g->s->model->cfg.n_experts > 256, start = v->experts_start < n_pos ? v->experts_start : n_pos;
    size_t n = (size_t)(n_pos - start) * (size_t)E, w = wide ? 2 : 1;
    uint8_t *raw = malloc(n * w + 1);
    if (!raw) { free(a); *failed = 1; ERR(err, 503, "out of memory rendering routed experts"); return json_null(); }
    for (size_t i = 0; i < n; i++) {
        uint32_t x = (uint32_t)a[(size_t)start * E + i];
        if (wide) { raw[2 * i] = (uint8_t)x; raw[2 * i + 1] = (uint8_t)(x >> 8); } /* little-endian */
        else raw[i] = (uint8_t)x;
    }
    Buf b = {0};
    buf_base64(&b, raw, n * w);
    json_t *o = json_object();
    json_object_set_new(o, "data", json_stringn(b.p ? b.p : "", b.n));
    json_object_set_new(o, "shape", json_pack("[i, i, i]", n_pos - start, E / top_k, top_k));
    json_object_set_new(o, "start", json_integer(start));
    json_object_set_new(o, "dtype", json_string(wide ? "uint16" : "uint8"));
    buf_free(&b);
    free(raw);
    free(a);
    return o;
}

/* sampling_mask (vLLM: the kept ids per token) and kept_tokens (prime-rl:
 * base64 int32 ids concatenated, counts per token) of c's records. */
static int add_masks(Gen *g, Choice *c, json_t *ch, Err *err) {
    int64_t *off;
    int32_t *ids;
    int T = c->n_out;
    if (gen_rl_mask_csr(g, c, T, &off, &ids, err) < 0) return -1;
    json_t *m = json_array();
    int32_t *counts = malloc(sizeof(int32_t) * (size_t)(T ? T : 1));
    if (!counts) { free(off); free(ids); json_decref(m); return ERR(err, 503, "out of memory rendering masks"); }
    for (int k = 0; k < T; k++) {
        json_t *row = json_array();
        for (int64_t i = off[k]; i < off[k + 1]; i++) json_array_append_new(row, json_integer(ids[i]));
        json_array_append_new(m, row);
        counts[k] = (int32_t)(off[k + 1] - off[k]);
    }
    Buf b = {0};
    json_t *kt = json_object();
    buf_base64(&b, ids, sizeof(int32_t) * (size_t)off[T]); /* int32 little-endian (x86, ARM) */
    json_object_set_new(kt, "ids", json_stringn(b.p ? b.p : "", b.n));
    b.n = 0;
    buf_base64(&b, counts, sizeof(int32_t) * (size_t)T);
    json_object_set_new(kt, "counts", json_stringn(b.p ? b.p : "", b.n));
    buf_free(&b);
    json_object_set_new(ch, "sampling_mask", m);
    json_object_set_new(ch, "kept_tokens", kt);
    free(off);
    free(ids);
    free(counts);
    return 0;
}

/* The fields a choice gets once it is finished (whole responses, a stream's last chunk). */
static int add_final(VGen *v, Choice *c, json_t *ch, Err *err) {
    int failed = 0;
    json_object_set_new(ch, "routed_experts", experts_json(v, c, err, &failed));
    if (failed) return -1;
    if (v->g.p.ret_mask && add_masks(&v->g, c, ch, err) < 0) return -1;
    json_t *seg = gen_rl_version_segments(&v->g, c, c->n_out);
    if (!json_array_size(seg))
        json_array_append_new(seg, json_pack("[I, i]", (json_int_t)server_weight_version(v->g.s, engine_weight_version(v->g.s->eng)), 0));
    json_object_set_new(ch, "weight_versions", seg);
    return 0;
}

static json_t *head(VGen *v, int whole) {
    json_t *o = json_object();
    json_object_set_new(o, "request_id", json_string(v->rid));
    if (whole) {
        json_object_set_new(o, "model", json_string(v->g.s->model_name));
        json_object_set_new(o, "created", json_integer(v->g.created));
    }
    return o;
}

static int respond_whole(HttpReq *q, VGen *v) {
    Gen *g = &v->g;
    Err err;
    if (gen_failed(g, &err)) return http_send_err(q, &err);
    json_t *o = head(v, 1), *choices = json_array();
    for (int i = 0; i < g->n_ch; i++) {
        Choice *c = &g->ch[i];
        json_t *ch = json_object();
        json_object_set_new(ch, "index", json_integer(c->index));
        json_object_set_new(ch, "logprobs", g->p.logprobs >= 0 ? content_json(g, c, 0, c->n_out) : json_null());
        json_object_set_new(ch, "finish_reason", json_string(c->finish ? c->finish : "stop"));
        json_object_set_new(ch, "token_ids", ids_json(g, c, 0, c->n_out));
        json_array_append_new(choices, ch);
        if (add_final(v, c, ch, &err) < 0) {
            json_decref(o);
            json_decref(choices);
            return http_send_err(q, &err);
        }
    }
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", gen_usage(g));
    json_object_set_new(o, "prompt_logprobs", g->p.prompt_logprobs >= 0 ? gen_prompt_logprobs(g, 0) : json_null());
    json_object_set_new(o, "kv_transfer_params", json_null());
    json_object_set_new(o, "weight_version",
                        json_integer((json_int_t)server_weight_version(g->s, engine_weight_version(g->s->eng))));
    if (gen_failed(g, &err)) {
        json_decref(o);
        return http_send_err(q, &err);
    }
    return http_send_json(q, 200, o);
}

/* ---- streaming ---- */
static int fill(void *ctx, Buf *out) {
    VGen *v = ctx;
    Gen *g = &v->g;
    for (;;) {
        int all_final = 1;
        for (int i = 0; i < g->n_ch; i++) all_final &= g->ch[i].final_sent;
        if (all_final) {
            if (g->p.include_usage) {
                json_t *o = head(v, 0);
                json_object_set_new(o, "choices", json_array());
                json_object_set_new(o, "usage", gen_usage(g));
                sse_event_json(out, o);
            }
            sse_done(out);
            return 0;
        }
        int r = gen_step(g, 50);
        if (r < 0) return -1;
        size_t mark = out->n;
        gen_render_begin(g);
        if (gen_failed(g, NULL)) { gen_stream_error(g, out); return 0; }
        for (int i = 0; i < g->n_ch; i++) {
            Choice *c = &g->ch[i];
            if (c->final_sent) continue;
            int from = c->n_sent, to = c->n_out, final = c->done;
            if (to == from && !final) continue; /* no empty chunks */
            json_t *ch = json_object();
            json_object_set_new(ch, "index", json_integer(c->index));
            json_object_set_new(ch, "logprobs", g->p.logprobs >= 0 ? content_json(g, c, from, to) : json_null());
            json_object_set_new(ch, "finish_reason", final ? json_string(c->finish ? c->finish : "stop") : json_null());
            json_object_set_new(ch, "token_ids", ids_json(g, c, from, to));
            if (final && add_final(v, c, ch, &g->fail) < 0) {
                json_decref(ch);
                g->failed = 1;
                out->n = mark;
                gen_stream_error(g, out);
                return 0;
            }
            json_t *o = head(v, 0), *arr = json_array();
            json_array_append_new(arr, ch);
            json_object_set_new(o, "choices", arr);
            json_object_set_new(o, "usage", g->p.continuous_usage ? gen_usage(g) : json_null());
            sse_event_json(out, o);
            c->started = 1;
            c->n_sent = to;
            c->final_sent = final;
        }
        if (gen_failed(g, NULL)) { out->n = mark; gen_stream_error(g, out); return 0; }
        if (gen_keepalive(g, out) || out->n) return 1;
    }
}

static void done(void *ctx) {
    VGen *v = ctx;
    gen_free(&v->g);
    free(v);
}

/* ---- the request ---- */
static int parse_token_ids(json_t *a, int vocab, TokIds **out, Err *err) {
    ENSURE(err, json_is_array(a), 400, "token_ids: is required: a list of token ids");
    size_t n = json_array_size(a);
    ENSURE(err, n > 0, 400, "token_ids: must not be empty");
    TokIds *p = calloc(1, sizeof *p);
    ENSURE(err, p, 503, "out of memory");
    p->ids = malloc(sizeof(int32_t) * n);
    if (!p->ids) { free(p); return ERR(err, 503, "out of memory"); }
    p->cap = n;
    *out = p;
    size_t i;
    json_t *x;
    json_array_foreach(a, i, x) {
        ENSURE(err, json_is_integer(x), 400, "token_ids: must be integers");
        json_int_t t = json_integer_value(x);
        ENSURE(err, t >= 0, 400, "token_ids: must not contain negative values");
        ENSURE(err, t < vocab, 400, "token_ids: token id %lld is out of vocabulary (size %d)", (long long)t, vocab);
        p->ids[p->n++] = (int32_t)t;
    }
    return 0;
}

static int parse_request(HttpReq *q, json_t *body, VGen *v, GenParams *p, TokIds **prompt, Err *err) {
    Server *s = q->s;
    if (http_check_model(s, body, err) < 0) return -1;
    const char *refused[] = {"features", "kv_transfer_params", "ec_transfer_params"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        json_t *x = json_object_get(body, refused[i]);
        ENSURE(err, !x || json_is_null(x), 400, "%s: not supported by the sampler (text-only, one node)", refused[i]);
    }
    json_t *sp = json_object_get(body, "sampling_params");
    ENSURE(err, json_is_object(sp), 400, "sampling_params: is required: an object of vLLM sampling parameters");
    for (size_t i = 0; i < sizeof UNSUPPORTED_SP / sizeof UNSUPPORTED_SP[0]; i++) {
        json_t *x = json_object_get(sp, UNSUPPORTED_SP[i]);
        ENSURE(err, !x || json_is_null(x), 400, "sampling_params.%s: not supported by the sampler", UNSUPPORTED_SP[i]);
    }
    /* allowed_token_ids, bad_words, truncate_prompt_tokens: request_parse_gen and gen_start, as on
     * /v1/completions; structured_outputs: structured_parse (vLLM's StructuredOutputsParams) */
    if (request_parse_gen(sp, 0, s->vocab, s->cfg.max_n, s->cfg.max_logprobs, p, err) < 0) return -1;
    if (structured_parse(s, sp, 0, 0, p, err) < 0) return -1;
    p->echo = 0; /* not SamplingParams fields: stream is the request's (below), echo /v1/completions' */
    p->ret_mask |= s->cfg.return_sampling_mask;    /* vLLM's engine-wide flags */
    p->ret_experts |= s->cfg.return_routed_experts;
    if (!p->max_tokens_set) p->sp.max_tokens = 0; /* the rest of the context, as vLLM's server-side default */
    long long start = 0;
    json_t *js = json_object_get(sp, "routed_experts_prompt_start");
    if (js && !json_is_null(js)) {
        ENSURE(err, json_is_integer(js) && json_integer_value(js) >= 0, 400,
               "sampling_params.routed_experts_prompt_start: must be an integer >= 0");
        start = json_integer_value(js);
    }
    v->experts_start = start > (1 << 30) ? 1 << 30 : (int)start;
    /* the request's own fields */
    int stream = 0;
    if (rp_bool(body, "stream", &stream, err) < 0) return -1;
    p->stream = stream;
    json_t *so = json_object_get(body, "stream_options");
    if (so && !json_is_null(so)) {
        ENSURE(err, json_is_object(so), 400, "stream_options: must be an object");
        ENSURE(err, stream, 400, "stream_options: only with stream: true");
        if (rp_bool(so, "include_usage", &p->include_usage, err) < 0) return -1;
        if (rp_bool(so, "continuous_usage_stats", &p->continuous_usage, err) < 0) return -1;
    }
    if (request_parse_cache_salt(body, "cache_salt", &p->cache_salt, err) < 0) return -1;
    json_t *pr = json_object_get(body, "priority");
    if (pr && !json_is_null(pr)) {
        ENSURE(err, json_is_integer(pr), 400, "priority: must be an integer");
        ENSURE(err, json_integer_value(pr) == 0, 400, "priority: got priority %lld but priority scheduling is not "
               "enabled (the sampler schedules in arrival order)", (long long)json_integer_value(pr));
    }
    const char *rank = MHD_lookup_connection_value(q->c, MHD_HEADER_KIND, "X-data-parallel-rank");
    if (rank) {
        char *end;
        long r = strtol(rank, &end, 10);
        ENSURE(err, *rank && !*end, 400, "X-data-parallel-rank: must be an integer");
        ENSURE(err, r == 0, 400, "X-data-parallel-rank: data_parallel_rank %ld is out of range [0, 1)", r);
    }
    json_t *rid = json_object_get(body, "request_id");
    if (rid && !json_is_null(rid)) {
        ENSURE(err, json_is_string(rid) && json_string_length(rid) <= 200, 400,
               "request_id: must be a string of at most 200 bytes");
        snprintf(v->rid, sizeof v->rid, "generate-tokens-%s", json_string_value(rid));
    }
    if (gen_rl_mask_check(p, s->max_model_len, "sampling_params.return_sampling_mask", err) < 0) return -1;
    return parse_token_ids(json_object_get(body, "token_ids"), s->vocab, prompt, err);
}

int api_vllm_generate(HttpReq *q, json_t *body) {
    Server *s = q->s;
    Err err = {0};
    VGen *v = calloc(1, sizeof *v);
    if (!v) return http_send_error(q, 503, NULL, "out of memory");
    GenParams p;
    memset(&p, 0, sizeof p);
    TokIds *prompt = NULL;
    if (parse_request(q, body, v, &p, &prompt, &err) < 0) {
        gen_params_free(&p);
        prompts_free(prompt, 1);
        free(v);
        return http_send_err(q, &err);
    }
    Gen *g = &v->g;
    if (gen_start(g, s, http_conn_fd(q), &p, prompt, 1, "gen", &err) < 0) {
        gen_free(g);
        free(v);
        return http_send_err(q, &err);
    }
    if (!v->rid[0]) snprintf(v->rid, sizeof v->rid, "generate-tokens-%s", g->id);
    if (g->p.stream) return http_send_stream(q, fill, done, v);
    int r;
    while ((r = gen_step(g, 100)) == 0) {}
    if (r < 0) {
        done(v);
        return MHD_NO;
    }
    int ret = respond_whole(q, v);
    done(v);
    return ret;
}
