/*
 * api_completions.c - POST /v1/completions (OpenAI legacy completions as vLLM
 * serves them): whole responses and SSE streams, echo, logprobs, and the RL
 * fields (gen.h).
 */
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>

#include "gen.h"
#include "sse.h"
#include "structured.h"

static json_t *choice_json(Gen *g, Choice *c, const char *text, size_t n, json_t *logprobs, const char *finish) {
    json_t *o = json_object();
    json_object_set_new(o, "index", json_integer(c->index));
    json_object_set_new(o, "text", json_stringn(text ? text : "", text ? n : 0));
    json_object_set_new(o, "logprobs", logprobs ? logprobs : json_null());
    json_object_set_new(o, "finish_reason", finish ? json_string(finish) : json_null());
    (void)g;
    return o;
}

static char *prompt_text(Gen *g, int pi, size_t *n) {
    char *t = NULL;
    Err e = {0};
    if (tokenizer_decode(g->s->tok, g->prompts[pi].ids, g->prompts[pi].n, false, &t, n, &e) < 0) {
        *n = 0;
        return strdup("");
    }
    return t;
}

/* Logprobs of c's records [from, to), with echo the prompt's entries in front
 * (vLLM: prompt_logprobs of the prompt, then the output's; text_offset runs on
 * through both). */
static json_t *logprobs_json(Gen *g, Choice *c, int with_prompt, int from, int to, long *offset) {
    if (!with_prompt) return gen_logprobs_completions(g, c, from, to, offset);
    json_t *lp = gen_logprobs_completions_prompt(g, c->prompt_i, offset);
    json_t *out = gen_logprobs_completions(g, c, from, to, offset);
    const char *keys[4] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
    for (int i = 0; i < 4; i++) json_array_extend(json_object_get(lp, keys[i]), json_object_get(out, keys[i]));
    json_decref(out);
    return lp;
}

static json_t *head(Gen *g) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(g->id));
    json_object_set_new(o, "object", json_string("text_completion"));
    json_object_set_new(o, "created", json_integer(g->created));
    json_object_set_new(o, "model", json_string(g->p.lora ? g->p.lora_name : g->s->model_name));
    return o;
}

static void add_prompt_ids(Gen *g, Choice *c, json_t *o) {
    json_t *a = json_array();
    for (size_t k = 0; k < g->prompts[c->prompt_i].n; k++) json_array_append_new(a, json_integer(g->prompts[c->prompt_i].ids[k]));
    json_object_set_new(o, "prompt_token_ids", a);
}

static int respond_whole(HttpReq *q, Gen *g) {
    Err ferr;
    if (gen_failed(g, &ferr)) return http_send_err(q, &ferr);
    json_t *o = head(g), *choices = json_array();
    for (int i = 0; i < g->n_ch; i++) {
        Choice *c = &g->ch[i];
        Buf text = {0};
        size_t pn = 0;
        long offset = 0;
        if (g->p.echo) {
            char *pt = prompt_text(g, c->prompt_i, &pn);
            buf_append(&text, pt, pn);
            free(pt);
        }
        buf_append(&text, c->text.p ? c->text.p : "", c->text.n);
        json_t *lp = g->p.logprobs >= 0 ? logprobs_json(g, c, g->p.echo, 0, c->n_out, &offset) : NULL;
        json_t *ch = choice_json(g, c, text.p, text.n, lp, c->finish);
        buf_free(&text);
        /* vLLM: both keys always there, null when not asked for */
        if (g->p.ret_token_ids) add_prompt_ids(g, c, ch);
        else json_object_set_new(ch, "prompt_token_ids", json_null());
        gen_rl_fields(g, c, 0, c->n_out, ch);
        json_object_set_new(ch, "weight_versions", gen_weight_versions(g, c));
        json_object_set_new(ch, "prompt_logprobs",
                            g->p.prompt_logprobs >= 0 ? gen_prompt_logprobs(g, c->prompt_i) : json_null());
        json_array_append_new(choices, ch);
    }
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", gen_usage(g));
    json_object_set_new(o, "weight_version", json_integer((json_int_t)server_weight_version(g->s, engine_weight_version(g->s->eng))));
    Err err;
    if (gen_failed(g, &err)) { /* never a 200 with a wrong or missing output */
        json_decref(o);
        return http_send_err(q, &err);
    }
    return http_send_json(q, 200, o);
}

/* ---- streaming ---- */
static int fill(void *ctx, Buf *out) {
    Gen *g = ctx;
    for (;;) {
        int all_final = 1;
        for (int i = 0; i < g->n_ch; i++) all_final &= g->ch[i].final_sent;
        if (all_final) {
            if (g->p.include_usage) {
                json_t *o = head(g);
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
            /* echo with logprobs: the first chunk carries the prompt's entries, so it
             * waits for the prefill to publish them (vLLM sends them with the first token) */
            int echo_lp = !c->started && g->p.echo && g->p.logprobs >= 0;
            if (echo_lp && !c->done && gen_prompt_logprobs_n(g, c->prompt_i) < (int)g->prompts[c->prompt_i].n)
                continue;
            Buf text = {0};
            if (!c->started && g->p.echo) {
                size_t pn;
                char *pt = prompt_text(g, c->prompt_i, &pn);
                buf_append(&text, pt, pn);
                free(pt);
            }
            size_t lim = gen_emit_limit(g, c);
            if (lim > c->text_sent) buf_append(&text, c->text.p + c->text_sent, lim - c->text_sent);
            int from = c->n_sent, to = c->n_out;
            int final = c->done && lim == c->text.n;
            int rl = g->p.ret_token_ids || g->p.ret_sampler_lp || g->p.ret_raw_lp || g->p.ret_mask || g->p.ret_experts;
            /* no empty chunks (vLLM skips them too): nothing to say until the choice has text,
             * tokens whose fields are asked for, or its end (a long prefill, siblings of n) */
            if (text.n == 0 && !final && !(to > from && (rl || g->p.logprobs >= 0))) { buf_free(&text); continue; }
            json_t *lp = g->p.logprobs >= 0 && (to > from || echo_lp)
                             ? logprobs_json(g, c, echo_lp, from, to, &c->lp_offset) : NULL;
            json_t *ch = choice_json(g, c, text.p, text.n, lp, final ? c->finish : NULL);
            buf_free(&text);
            if (!c->started && g->p.ret_token_ids) add_prompt_ids(g, c, ch);
            gen_rl_fields(g, c, from, to, ch);
            if (final) json_object_set_new(ch, "weight_versions", gen_weight_versions(g, c));
            json_t *o = head(g), *arr = json_array();
            json_array_append_new(arr, ch);
            json_object_set_new(o, "choices", arr);
            if (g->p.continuous_usage) json_object_set_new(o, "usage", gen_usage(g));
            sse_event_json(out, o);
            c->started = 1;
            c->text_sent = lim;
            c->n_sent = to;
            c->final_sent = final;
        }
        if (gen_failed(g, NULL)) { out->n = mark; gen_stream_error(g, out); return 0; }
        if (gen_keepalive(g, out) || out->n) return 1;
    }
}

static void done(void *ctx) {
    Gen *g = ctx;
    gen_free(g);
    free(g);
}

int api_completions(HttpReq *q, json_t *body) {
    Server *s = q->s;
    Err err = {0};
    int lora = 0;
    char lora_name[128] = "";
    if (lora_model_acquire(s, body, &lora, lora_name, sizeof lora_name, &err) < 0) return http_send_err(q, &err);
    GenParams p;
    if (request_parse_gen(body, 0, s->vocab, s->cfg.max_n, s->cfg.max_logprobs, &p, &err) < 0) {
        gen_params_free(&p);
        lora_release(s, lora);
        return http_send_err(q, &err);
    }
    p.lora = lora; /* gen_free gives it back; the error paths before gen_start do */
    memcpy(p.lora_name, lora_name, sizeof p.lora_name);
    TokIds *prompts;
    int n_prompts;
    if (request_parse_prompts(json_object_get(body, "prompt"), s->tok, s->vocab, &prompts, &n_prompts, &err) < 0) {
        lora_release(s, p.lora);
        gen_params_free(&p);
        return http_send_err(q, &err);
    }
    if (structured_parse(s, body, 0, 0, &p, &err) < 0) {
        prompts_free(prompts, n_prompts);
        gen_params_free(&p);
        return http_send_err(q, &err);
    }
    Gen *g = calloc(1, sizeof *g);
    if (gen_start(g, s, http_conn_fd(q), &p, prompts, n_prompts, "cmpl", &err) < 0) {
        gen_free(g);
        free(g);
        return http_send_err(q, &err);
    }
    if (g->p.stream) return http_send_stream(q, fill, done, g);
    int r;
    while ((r = gen_step(g, 100)) == 0) {}
    if (r < 0) {
        done(g);
        return MHD_NO;
    }
    int ret = respond_whole(q, g);
    done(g);
    return ret;
}
