/*
 * api_sglang.c - SGLang's native routes as slime and AReaL call them
 * (sglang/srt/managers/io_struct.py GenerateReqInput, sampling_params.py,
 * tokenizer_manager.py meta_info; docs/advanced_features/sglang_for_rl.md):
 *
 *   POST /generate                  (API key)
 *     input_ids (a list, or a list of lists) or text, sampling_params (SGLang
 *     names: max_new_tokens default 128, min_new_tokens, stop, stop_token_ids,
 *     temperature, top_p, top_k, min_p, penalties, ignore_eos,
 *     skip_special_tokens, spaces_between_special_tokens, no_stop_trim, n,
 *     sampling_seed, logit_bias; custom_params is read only by a custom logit
 *     processor and ignored, as SGLang does; an unknown name is a 400 as
 *     SGLang's SamplingParams(**d) raises), return_logprob, logprob_start_len
 *     (-1: outputs only), top_logprobs_num, return_text_in_logprobs,
 *     return_routed_experts, return_sampling_mask, stream, rid, cache_salt /
 *     extra_key (prefix-cache salt). Multimodal inputs, LoRA, sessions,
 *     custom logit processors, PD bootstrap and token_ids_logprob: 400.
 *     -> {"text", "output_ids", "meta_info": {"id", "finish_reason" ({"type":
 *     "stop", "matched": id | string} | {"type": "length", "length"} |
 *     {"type": "abort", "message"}), "prompt_tokens", "completion_tokens",
 *     "cached_tokens", "weight_version" (a string, as SGLang's), "e2e_latency",
 *     with return_logprob "input_token_logprobs" / "output_token_logprobs"
 *     [[logprob, id, text | null]] and with top_logprobs_num
 *     "input_top_logprobs" / "output_top_logprobs"; "routed_experts": base64
 *     int32 [n_prompt + n_out - 1, layers * top_k] (the whole stream, as
 *     SGLang's); "sampling_mask": [[kept ids]] per output token}}; a list of
 *     these for a batch or n > 1. Streams send the cumulative object per step
 *     (SGLang's default, not incremental), experts and masks in the last one,
 *     then "data: [DONE]".
 *   POST /update_weights_from_disk  (admin) {"model_path", "weight_version"?,
 *     "abort_all_requests"?} -> {"success", "message", "num_paused_requests"}
 *     (a full, confined, all-or-nothing reload: admin_reload)
 *   POST /pause_generation {"mode": abort | retract | in_place},
 *   POST /continue_generation, GET|POST /flush_cache       (admin)
 *   GET  /get_model_info, /get_server_info, /health_generate  (API key)
 * Errors on these routes: SGLang's {"error": {"message"}} with the status.
 *
 * Not here: the engine, the OpenAI routes.
 */
#define _GNU_SOURCE
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gen.h"
#include "gen_rl.h"
#include "log.h"
#include "sse.h"

#define SGL_DEFAULT_MAX_NEW_TOKENS 128

/* The route's dialect (DIALECT_SGLANG) gives SGLang's error shape. */
static int sgl_error(HttpReq *q, int status, const char *msg) { return http_send_error(q, status, NULL, "%s", msg); }

static int sgl_err(HttpReq *q, const Err *e) { return sgl_error(q, e->code ? e->code : 500, e->msg); }

static double mono_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

typedef struct SGen {
    Gen g;
    char rid[256];
    int return_logprob, logprob_start, top_n, lp_text, batch;
    double t0;
} SGen;

/* ---- request ---- */
/* SGLang sampling names -> the vLLM names request_parse_gen reads. */
static const char *const SGL_RENAME[][2] = {
    {"max_new_tokens", "max_tokens"}, {"min_new_tokens", "min_tokens"}, {"sampling_seed", "seed"},
    {"no_stop_trim", "include_stop_str_in_output"},
};
static const char *const SGL_SAME[] = {"stop", "stop_token_ids", "temperature", "top_p", "top_k", "min_p",
                                       "frequency_penalty", "presence_penalty", "repetition_penalty", "ignore_eos",
                                       "skip_special_tokens", "spaces_between_special_tokens", "n", "logit_bias"};
static const char *const SGL_IGNORED[] = {"custom_params", "stream_interval"};
static const char *const SGL_REFUSED_SP[] = {"json_schema", "regex", "ebnf", "structural_tag"};
static const char *const SGL_REFUSED[] = {"image_data", "audio_data", "video_data", "input_embeds", "lora_path",
                                          "lora_id", "session_params", "custom_logit_processor", "bootstrap_host",
                                          "bootstrap_room", "token_ids_logprob", "return_hidden_states"};

static int in_list(const char *k, const char *const *l, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(k, l[i])) return 1;
    return 0;
}
#define IN(k, l) in_list(k, l, sizeof l / sizeof l[0])

static int translate_sp(json_t *sp, json_t *out, Err *err) {
    const char *k;
    json_t *v;
    json_object_foreach(sp, k, v) {
        if (IN(k, SGL_IGNORED)) continue;
        ENSURE(err, !IN(k, SGL_REFUSED_SP) || json_is_null(v), 400, "sampling_params.%s: constrained decoding is "
               "not supported by the sampler", k);
        const char *to = NULL;
        for (size_t i = 0; i < sizeof SGL_RENAME / sizeof SGL_RENAME[0]; i++)
            if (!strcmp(k, SGL_RENAME[i][0])) to = SGL_RENAME[i][1];
        if (!to && IN(k, SGL_SAME)) to = k;
        if (!to && IN(k, SGL_REFUSED_SP)) continue;
        ENSURE(err, to, 400, "sampling_params: unexpected keyword argument '%s'", k);
        if (!json_is_null(v)) json_object_set(out, to, v);
    }
    return 0;
}

static int parse_ids(json_t *a, int vocab, TokIds *out, Err *err) {
    size_t n = json_array_size(a), i;
    json_t *x;
    ENSURE(err, n > 0, 400, "input_ids: must not be empty");
    out->ids = malloc(sizeof(int32_t) * n);
    ENSURE(err, out->ids, 503, "out of memory");
    out->cap = n;
    json_array_foreach(a, i, x) {
        ENSURE(err, json_is_integer(x), 400, "input_ids: must be integers");
        json_int_t t = json_integer_value(x);
        ENSURE(err, t >= 0 && t < vocab, 400, "input_ids: token id %lld is out of range [0, %d)", (long long)t, vocab);
        out->ids[out->n++] = (int32_t)t;
    }
    return 0;
}

static int parse_prompts(Server *s, json_t *body, TokIds **out, int *n, int *batch, Err *err) {
    json_t *ids = json_object_get(body, "input_ids"), *text = json_object_get(body, "text");
    int has_ids = ids && !json_is_null(ids), has_text = text && !json_is_null(text);
    ENSURE(err, has_ids != has_text, 400, "Either text or input_ids should be provided.");
    json_t *src = has_ids ? ids : text;
    *batch = json_is_array(src) && (has_text || (json_array_size(src) && json_is_array(json_array_get(src, 0))));
    int m = *batch ? (int)json_array_size(src) : 1;
    ENSURE(err, m > 0 && m <= 1024, 400, "%s: between 1 and 1024 prompts", has_ids ? "input_ids" : "text");
    TokIds *p = calloc((size_t)m, sizeof *p);
    ENSURE(err, p, 503, "out of memory");
    *out = p;
    *n = m;
    for (int i = 0; i < m; i++) {
        json_t *x = *batch ? json_array_get(src, (size_t)i) : src;
        if (has_ids) {
            ENSURE(err, json_is_array(x), 400, "input_ids: must be a list of token ids or a list of lists");
            if (parse_ids(x, s->vocab, &p[i], err) < 0) return -1;
        } else {
            ENSURE(err, json_is_string(x) && json_string_length(x), 400, "text: must be a non-empty string");
            if (tokenizer_encode(s->tok, json_string_value(x), json_string_length(x), true, &p[i], err) < 0) return -1;
            ENSURE(err, p[i].n > 0, 400, "text: encodes to no tokens");
        }
    }
    return 0;
}

static int parse_request(Server *s, json_t *body, SGen *v, GenParams *p, TokIds **prompts, int *n_prompts, Err *err) {
    for (size_t i = 0; i < sizeof SGL_REFUSED / sizeof SGL_REFUSED[0]; i++) {
        json_t *x = json_object_get(body, SGL_REFUSED[i]);
        ENSURE(err, !x || json_is_null(x) || json_is_false(x), 400, "%s: not supported by the sampler",
               SGL_REFUSED[i]);
    }
    json_t *sp = json_object_get(body, "sampling_params");
    ENSURE(err, !sp || json_is_null(sp) || json_is_object(sp), 400, "sampling_params: must be an object");
    json_t *vp = json_object();
    int rc = sp && json_is_object(sp) ? translate_sp(sp, vp, err) : 0;
    if (rc == 0) rc = request_parse_gen(vp, 0, s->vocab, s->cfg.max_n, s->cfg.max_logprobs, p, err);
    json_decref(vp);
    if (rc < 0) return rc;
    if (!p->max_tokens_set) p->sp.max_tokens = SGL_DEFAULT_MAX_NEW_TOKENS; /* capped by the context (gen_start) */
    int stream = 0;
    if (rp_bool(body, "stream", &stream, err) < 0 || rp_bool(body, "return_logprob", &v->return_logprob, err) < 0 ||
        rp_bool(body, "return_text_in_logprobs", &v->lp_text, err) < 0 ||
        rp_bool(body, "return_routed_experts", &p->ret_experts, err) < 0 ||
        rp_bool(body, "return_sampling_mask", &p->ret_mask, err) < 0)
        return -1;
    p->stream = stream;
    json_t *ls = json_object_get(body, "logprob_start_len"), *tn = json_object_get(body, "top_logprobs_num");
    v->logprob_start = -1;
    if (ls && !json_is_null(ls)) {
        ENSURE(err, json_is_integer(ls) && json_integer_value(ls) >= -1, 400, "logprob_start_len: must be an integer >= -1");
        v->logprob_start = (int)(json_integer_value(ls) > (1 << 30) ? 1 << 30 : json_integer_value(ls));
    }
    if (tn && !json_is_null(tn)) {
        ENSURE(err, json_is_integer(tn) && json_integer_value(tn) >= 0 && json_integer_value(tn) <= s->cfg.max_logprobs,
               400, "top_logprobs_num: must be an integer in [0, %d]", s->cfg.max_logprobs);
        v->top_n = (int)json_integer_value(tn);
    }
    p->logprobs = v->return_logprob ? v->top_n : -1;
    p->prompt_logprobs = v->return_logprob && v->logprob_start >= 0 ? v->top_n : -1;
    if (request_parse_cache_salt(body, "cache_salt", &p->cache_salt, err) < 0 ||
        request_parse_cache_salt(body, "extra_key", &p->cache_salt, err) < 0)
        return -1;
    json_t *rid = json_object_get(body, "rid");
    if (rid && !json_is_null(rid)) {
        ENSURE(err, json_is_string(rid) && json_string_length(rid) <= 200, 400,
               "rid: must be a string of at most 200 bytes");
        snprintf(v->rid, sizeof v->rid, "%s", json_string_value(rid));
    }
    if (gen_rl_mask_check(p, s->max_model_len, "return_sampling_mask", err) < 0) return -1;
    return parse_prompts(s, body, prompts, n_prompts, &v->batch, err);
}

/* ---- response ---- */
static json_t *lp_entry(Gen *g, SGen *v, float lp, int32_t id, int null_lp) {
    json_t *e = json_array();
    json_array_append_new(e, null_lp ? json_null() : gen_lp(lp));
    json_array_append_new(e, json_integer(id));
    if (v->lp_text) {
        char *t = gen_token_text(g, id);
        json_array_append_new(e, json_string(t ? t : ""));
        free(t);
    } else {
        json_array_append_new(e, json_null());
    }
    return e;
}

static void add_logprobs(SGen *v, Choice *c, int n, json_t *mi) {
    Gen *g = &v->g;
    EngineSeqView sv;
    engine_request_seq(c->r, c->seq, &sv);
    json_t *out = json_array(), *otop = json_array();
    for (int k = 0; k < n; k++) {
        const TokenRecord *r = &sv.tokens[k];
        float lp;
        const float *top;
        gen_record_lp(g, r, &lp, &top);
        /* the token's own entry: the log-prob under the distribution it was
         * drawn from (SGLang's log(probs) after temperature; equal when top-k /
         * top-p / min-p truncate nothing), whatever --logprobs-mode says; the
         * top lists follow the mode (README, differences) */
        lp = r->logprob;
        json_array_append_new(out, lp_entry(g, v, lp, r->token, 0));
        json_t *t = json_array();
        for (int j = 0; j < r->n_top && j < v->top_n; j++) json_array_append_new(t, lp_entry(g, v, top[j], r->top_ids[j], 0));
        json_array_append_new(otop, t);
    }
    json_t *in = json_array(), *itop = json_array();
    if (v->logprob_start >= 0) {
        const float *plp, *top_lp;
        const int32_t *top_ids;
        int np = engine_request_prompt_logprobs(g->reqs[c->prompt_i], &plp, &top_ids, &top_lp);
        const TokIds *pr = &g->prompts[c->prompt_i];
        for (int k = v->logprob_start; k < np && k < (int)pr->n; k++) {
            json_array_append_new(in, lp_entry(g, v, k ? plp[k] : 0, pr->ids[k], k == 0));
            if (k == 0 || !top_ids) { json_array_append_new(itop, k == 0 ? json_null() : json_array()); continue; }
            json_t *t = json_array();
            for (int j = 0; j < v->top_n; j++)
                json_array_append_new(t, lp_entry(g, v, top_lp[(size_t)k * v->top_n + j], top_ids[(size_t)k * v->top_n + j], 0));
            json_array_append_new(itop, t);
        }
    }
    json_object_set_new(mi, "input_token_logprobs", in);
    json_object_set_new(mi, "output_token_logprobs", out);
    if (v->top_n > 0) {
        json_object_set_new(mi, "input_top_logprobs", itop);
        json_object_set_new(mi, "output_top_logprobs", otop);
    } else {
        json_decref(itop);
        json_decref(otop);
    }
}

/* The stop string that ended c (the earliest match in its whole decoded
 * output, the rule gen.c applies), or NULL. */
static char *matched_stop(Gen *g, Choice *c) {
    EngineSeqView sv;
    engine_request_seq(c->r, c->seq, &sv);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(sv.n_tokens ? sv.n_tokens : 1));
    if (!ids) return NULL;
    for (int k = 0; k < c->n_out; k++) ids[k] = sv.tokens[k].token;
    char *t = NULL;
    size_t n = 0;
    Err e = {0};
    int rc = tokenizer_decode(g->s->tok, ids, (size_t)c->n_out, g->p.skip_special, &t, &n, &e);
    free(ids);
    if (rc < 0 || !t) return NULL;
    const char *best = NULL;
    size_t at = 0;
    for (int i = 0; i < g->p.n_stop; i++) {
        const char *m = memmem(t, n, g->p.stop[i], strlen(g->p.stop[i]));
        if (m && (!best || (size_t)(m - t) < at)) { best = g->p.stop[i]; at = (size_t)(m - t); }
    }
    free(t);
    return best ? strdup(best) : NULL;
}

static json_t *finish_json(Gen *g, Choice *c) {
    if (!c->done) return json_null();
    json_t *f = json_object();
    EngineSeqView sv;
    engine_request_seq(c->r, c->seq, &sv);
    if (!strcmp(c->finish, "length")) {
        json_object_set_new(f, "type", json_string("length"));
        json_object_set_new(f, "length", json_integer(c->n_out));
    } else if (!strcmp(c->finish, "abort")) {
        json_object_set_new(f, "type", json_string("abort"));
        json_object_set_new(f, "message", json_string("aborted"));
    } else {
        json_object_set_new(f, "type", json_string("stop"));
        char *m = sv.finish == FINISH_STOP && sv.stop_token >= 0 ? NULL : matched_stop(g, c);
        json_object_set_new(f, "matched", m ? json_string(m) : sv.stop_token >= 0 ? json_integer(sv.stop_token)
                                                                                 : json_null());
        free(m);
    }
    return f;
}

static json_t *weight_version_str(Server *s) {
    char b[32];
    snprintf(b, sizeof b, "%llu", (unsigned long long)server_weight_version(s, engine_weight_version(s->eng)));
    return json_string(b);
}

/* Routed experts of the whole stream (SGLang: base64 int32, [n_prompt + n_out - 1, layers * top_k]). */
static int add_experts(Gen *g, Choice *c, json_t *mi, Err *err) {
    int n_pos;
    int32_t *a = gen_rl_experts(g, c, c->n_out, &n_pos, err);
    if (n_pos < 0) return -1;
    if (!a) return 0;
    Buf b = {0};
    buf_base64(&b, a, sizeof(int32_t) * (size_t)n_pos * (size_t)engine_experts_per_token(g->s->eng));
    json_object_set_new(mi, "routed_experts", json_stringn(b.p ? b.p : "", b.n));
    buf_free(&b);
    free(a);
    return 0;
}

static int add_mask(Gen *g, Choice *c, json_t *mi, Err *err) {
    int64_t *off;
    int32_t *ids;
    if (gen_rl_mask_csr(g, c, c->n_out, &off, &ids, err) < 0) return -1;
    json_t *m = json_array();
    for (int k = 0; k < c->n_out; k++) {
        json_t *row = json_array();
        for (int64_t i = off[k]; i < off[k + 1]; i++) json_array_append_new(row, json_integer(ids[i]));
        json_array_append_new(m, row);
    }
    json_object_set_new(mi, "sampling_mask", m);
    free(off);
    free(ids);
    return 0;
}

/* One output object; final: c is finished and this is its last rendering. */
static json_t *output_json(SGen *v, Choice *c, int final, Err *err) {
    Gen *g = &v->g;
    EngineSeqView sv;
    engine_request_seq(c->r, c->seq, &sv);
    json_t *o = json_object(), *ids = json_array(), *mi = json_object();
    size_t lim = final ? c->text.n : gen_emit_limit(g, c);
    json_object_set_new(o, "text", json_stringn(c->text.p ? c->text.p : "", c->text.p ? lim : 0));
    for (int k = 0; k < c->n_out; k++) json_array_append_new(ids, json_integer(sv.tokens[k].token));
    json_object_set_new(o, "output_ids", ids);
    if (v->batch || g->n_ch > 1) json_object_set_new(o, "index", json_integer(c->index));
    char id[300];
    if (g->n_ch > 1) snprintf(id, sizeof id, "%s_%d", v->rid, c->index);
    else snprintf(id, sizeof id, "%s", v->rid);
    json_object_set_new(mi, "id", json_string(id));
    json_object_set_new(mi, "finish_reason", final ? finish_json(g, c) : json_null());
    json_object_set_new(mi, "prompt_tokens", json_integer((json_int_t)g->prompts[c->prompt_i].n));
    json_object_set_new(mi, "completion_tokens", json_integer(c->n_out));
    json_object_set_new(mi, "cached_tokens", json_integer(engine_request_cached_tokens(c->r)));
    json_object_set_new(mi, "weight_version", weight_version_str(g->s));
    json_object_set_new(mi, "e2e_latency", json_real(mono_s() - v->t0));
    if (v->return_logprob) add_logprobs(v, c, c->n_out, mi);
    json_object_set_new(o, "meta_info", mi);
    if (final && ((g->p.ret_experts && add_experts(g, c, mi, err) < 0) || (g->p.ret_mask && add_mask(g, c, mi, err) < 0))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static int respond_whole(HttpReq *q, SGen *v) {
    Gen *g = &v->g;
    Err err;
    if (gen_failed(g, &err)) return sgl_err(q, &err);
    json_t *list = json_array();
    for (int i = 0; i < g->n_ch; i++) {
        json_t *o = output_json(v, &g->ch[i], 1, &err);
        if (!o) { json_decref(list); return sgl_err(q, &err); }
        json_array_append_new(list, o);
    }
    if (gen_failed(g, &err)) { json_decref(list); return sgl_err(q, &err); }
    if (!v->batch && g->n_ch == 1) {
        json_t *o = json_incref(json_array_get(list, 0));
        json_decref(list);
        return http_send_json(q, 200, o);
    }
    return http_send_json(q, 200, list);
}

static void sgl_stream_error(Gen *g, Buf *out) {
    json_t *o = json_object(), *e = json_object();
    json_object_set_new(e, "message", json_string(g->fail.msg));
    json_object_set_new(o, "error", e);
    log_warn("stream %s failed -> %d: %s", g->id, g->fail.code, g->fail.msg);
    sse_event_json(out, o);
    sse_done(out);
}

static int fill(void *ctx, Buf *out) {
    SGen *v = ctx;
    Gen *g = &v->g;
    for (;;) {
        int all = 1;
        for (int i = 0; i < g->n_ch; i++) all &= g->ch[i].final_sent;
        if (all) { sse_done(out); return 0; }
        int r = gen_step(g, 50);
        if (r < 0) return -1;
        size_t mark = out->n;
        gen_render_begin(g);
        if (gen_failed(g, NULL)) { sgl_stream_error(g, out); return 0; }
        for (int i = 0; i < g->n_ch; i++) {
            Choice *c = &g->ch[i];
            if (c->final_sent) continue;
            int final = c->done;
            if (c->n_out == c->n_sent && !final) continue;
            json_t *o = output_json(v, c, final, &g->fail);
            if (!o) { g->failed = 1; out->n = mark; sgl_stream_error(g, out); return 0; }
            sse_event_json(out, o);
            c->n_sent = c->n_out;
            c->final_sent = final;
        }
        if (gen_failed(g, NULL)) { out->n = mark; sgl_stream_error(g, out); return 0; }
        if (gen_keepalive(g, out) || out->n) return 1;
    }
}

static void done(void *ctx) {
    SGen *v = ctx;
    gen_free(&v->g);
    free(v);
}

int api_sgl_generate(HttpReq *q, json_t *body) {
    Server *s = q->s;
    Err err = {0};
    SGen *v = calloc(1, sizeof *v);
    if (!v) return sgl_error(q, 503, "out of memory");
    v->t0 = mono_s();
    GenParams p;
    memset(&p, 0, sizeof p);
    TokIds *prompts = NULL;
    int n_prompts = 0;
    if (parse_request(s, body, v, &p, &prompts, &n_prompts, &err) < 0) {
        gen_params_free(&p);
        prompts_free(prompts, n_prompts);
        free(v);
        return sgl_err(q, &err);
    }
    Gen *g = &v->g;
    if (gen_start(g, s, http_conn_fd(q), &p, prompts, n_prompts, "sgl", &err) < 0) {
        gen_free(g);
        free(v);
        return sgl_err(q, &err);
    }
    if (!v->rid[0]) snprintf(v->rid, sizeof v->rid, "%s", g->id);
    if (g->p.stream) return http_send_stream(q, fill, done, v);
    int r;
    while ((r = gen_step(g, 100)) == 0) {}
    if (r < 0) { done(v); return MHD_NO; }
    int ret = respond_whole(q, v);
    done(v);
    return ret;
}

/* ---- controls ---- */
static int sgl_result(HttpReq *q, int ok, const char *msg, int status) {
    json_t *o = json_object();
    json_object_set_new(o, "success", json_boolean(ok));
    json_object_set_new(o, "message", json_string(msg));
    return http_send_json(q, ok ? 200 : status, o);
}

int api_sgl_update_weights_from_disk(HttpReq *q, json_t *body) {
    Server *s = q->s;
    Err err = {0};
    json_t *mp = json_object_get(body, "model_path"), *wv = json_object_get(body, "weight_version");
    if (!json_is_string(mp) || !json_string_length(mp)) return sgl_result(q, 0, "model_path: is required", 400);
    uint64_t v = 0;
    int set = 0;
    if (wv && !json_is_null(wv)) {
        char *end = NULL;
        const char *t = json_is_string(wv) ? json_string_value(wv) : NULL;
        unsigned long long x = t ? strtoull(t, &end, 10) : 0;
        if (json_is_integer(wv) && json_integer_value(wv) >= 0) x = (unsigned long long)json_integer_value(wv);
        else if (!t || !*t || *end || *t == '-') return sgl_result(q, 0, "weight_version: the sampler's weight versions are integers", 400);
        v = x;
        set = 1;
    }
    int abort_all = 0;
    if (rp_bool(body, "abort_all_requests", &abort_all, &err) < 0) return sgl_result(q, 0, err.msg, 400);
    if (abort_all) server_live_abort(s, NULL);
    DeltaResult res = {0};
    pthread_mutex_lock(&s->admin_mu);
    if (!set) v = s->wv->version + 1;
    int rc = admin_reload(s, json_string_value(mp), v, &res, &err);
    pthread_mutex_unlock(&s->admin_mu);
    if (rc < 0) return sgl_result(q, 0, err.msg, err.code ? err.code : 500);
    json_t *o = json_object();
    json_object_set_new(o, "success", json_true());
    json_object_set_new(o, "message", json_string("Succeeded to update model weights."));
    json_object_set_new(o, "num_paused_requests", json_integer(0));
    return http_send_json(q, 200, o);
}

int api_sgl_pause(HttpReq *q, json_t *body) {
    json_t *m = json_object_get(body, "mode");
    const char *mode = json_is_string(m) ? json_string_value(m) : m && !json_is_null(m) ? "" : "abort";
    PauseMode pm;
    if (!strcmp(mode, "abort")) pm = PAUSE_ABORT;
    else if (!strcmp(mode, "retract") || !strcmp(mode, "in_place")) pm = PAUSE_KEEP;
    else return sgl_error(q, 400, "mode: must be abort, retract or in_place");
    Err err = {0};
    if (engine_pause(q->s->eng, pm, &err) < 0) return sgl_err(q, &err);
    return sgl_result(q, 1, "Generation paused.", 200);
}

int api_sgl_continue(HttpReq *q, json_t *body) {
    (void)body;
    engine_resume(q->s->eng);
    return sgl_result(q, 1, "Generation continued.", 200);
}

int api_sgl_flush_cache(HttpReq *q, json_t *body) {
    (void)body;
    Err err = {0};
    if (engine_flush_prefix_cache(q->s->eng, &err) < 0) return sgl_err(q, &err);
    static const char msg[] = "Cache flushed.\nPlease check backend logs for more details. (When there are running "
                              "or waiting requests, the operation will not be performed.)\n";
    return http_send_text(q, 200, "text/plain", msg, sizeof msg - 1);
}

int api_sgl_model_info(HttpReq *q, json_t *body) {
    (void)body;
    Server *s = q->s;
    json_t *o = json_object();
    json_object_set_new(o, "model_path", json_string(s->model_dir));
    json_object_set_new(o, "tokenizer_path", json_string(s->cfg.tokenizer_dir ? s->cfg.tokenizer_dir : s->model_dir));
    json_object_set_new(o, "is_generation", json_true());
    json_object_set_new(o, "preferred_sampling_params", json_null());
    json_object_set_new(o, "weight_version", weight_version_str(s));
    json_object_set_new(o, "has_image_understanding", json_false());
    json_object_set_new(o, "has_audio_understanding", json_false());
    json_object_set_new(o, "model_type", json_string(s->model->cfg.arch_name));
    json_object_set_new(o, "architectures", json_pack("[s]", s->model->cfg.arch_name));
    return http_send_json(q, 200, o);
}

int api_sgl_server_info(HttpReq *q, json_t *body) {
    (void)body;
    Server *s = q->s;
    const EngineConfig *ec = engine_config(s->eng);
    json_t *o = json_object();
    json_object_set_new(o, "model_path", json_string(s->model_dir));
    json_object_set_new(o, "tokenizer_path", json_string(s->cfg.tokenizer_dir ? s->cfg.tokenizer_dir : s->model_dir));
    json_object_set_new(o, "served_model_name", json_string(s->model_name));
    json_object_set_new(o, "context_length", json_integer(s->max_model_len));
    json_object_set_new(o, "max_total_num_tokens", json_integer((json_int_t)ec->n_blocks * ec->block_size));
    json_object_set_new(o, "page_size", json_integer(ec->block_size));
    json_object_set_new(o, "max_running_requests", json_integer(ec->max_running_seqs));
    json_object_set_new(o, "chunked_prefill_size", json_integer(ec->max_batched_tokens));
    json_object_set_new(o, "disable_radix_cache", json_boolean(!ec->enable_prefix_cache));
    json_object_set_new(o, "weight_version", weight_version_str(s));
    json_object_set_new(o, "version", json_string("sampler"));
    return http_send_json(q, 200, o);
}

/* One greedy token through the engine: 200 with an empty body, 503 when it cannot. */
int api_sgl_health_generate(HttpReq *q, json_t *body) {
    (void)body;
    Server *s = q->s;
    Err err = {0};
    GenParams p;
    json_t *sp = json_pack("{s:i, s:f}", "max_tokens", 1, "temperature", 0.0);
    int rc = request_parse_gen(sp, 0, s->vocab, s->cfg.max_n, s->cfg.max_logprobs, &p, &err);
    json_decref(sp);
    TokIds *pr = calloc(1, sizeof *pr);
    if (rc < 0 || !pr || !(pr->ids = malloc(sizeof(int32_t)))) {
        gen_params_free(&p);
        prompts_free(pr, 1);
        return sgl_error(q, 503, "health check could not start a generation");
    }
    pr->ids[0] = 0;
    pr->n = pr->cap = 1;
    Gen g;
    if (gen_start(&g, s, http_conn_fd(q), &p, pr, 1, "health", &err) < 0) {
        gen_free(&g);
        return sgl_err(q, &err);
    }
    int r;
    while ((r = gen_step(&g, 100)) == 0) {}
    int ok = r > 0 && !gen_failed(&g, &err) && g.ch[0].n_out == 1;
    gen_free(&g);
    if (r < 0) return MHD_NO;
    return ok ? http_send_text(q, 200, "text/plain", "", 0) : sgl_error(q, 503, "health generation failed");
}
