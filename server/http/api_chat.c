/*
 * api_chat.c - POST /v1/chat/completions: messages (string or text-part
 * content) rendered with the model's chat template (tools,
 * chat_template_kwargs, add_generation_prompt), then generation; the output
 * is split by the Qwen3 parsers into reasoning, content and tool_calls
 * (tool_parse.h), whole or streamed. Reasoning is sent as current vLLM sends
 * it: message.reasoning / delta.reasoning, with the deprecated
 * reasoning_content beside it (the same text); an input assistant message may
 * carry either name (the template reads reasoning_content).
 */
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>

#include "gen.h"
#include "sse.h"
#include "structured.h"
#include "tool_parse.h"

#include <limits.h>

typedef struct ChatOut {
    ToolParser *tp;
    int n_calls;
} ChatOut;

typedef struct Chat {
    Gen g;
    int tools;            /* tool calls are parsed */
    int max_calls;        /* calls returned per choice: 1 with parallel_tool_calls false (vLLM), else INT_MAX */
    ChatOut *outs;        /* [n_ch] */
    char *echo;           /* echo: the final assistant message's content (vLLM), or NULL */
} Chat;

/* messages -> a copy with text-part content joined into strings. */
static json_t *normalize_messages(json_t *msgs, Err *err) {
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        ERR(err, 400, "messages: must be a non-empty list of message objects");
        return NULL;
    }
    json_t *out = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        json_t *role = json_object_get(m, "role");
        if (!json_is_object(m) || !json_is_string(role)) {
            json_decref(out);
            ERR(err, 400, "messages: message %zu must be an object with a string \"role\"", i);
            return NULL;
        }
        json_t *c = json_deep_copy(m);
        json_t *content = json_object_get(m, "content");
        json_t *rs = json_object_get(m, "reasoning"), *rc = json_object_get(m, "reasoning_content");
        if (json_is_string(rs) && (!rc || json_is_null(rc))) json_object_set(c, "reasoning_content", rs);
        if (json_is_array(content)) {
            Buf b = {0};
            size_t k;
            json_t *part;
            json_array_foreach(content, k, part) {
                json_t *t = json_object_get(part, "text");
                json_t *ty = json_object_get(part, "type");
                if (!json_is_object(part) || !json_is_string(ty) || strcmp(json_string_value(ty), "text") != 0 ||
                    !json_is_string(t)) {
                    buf_free(&b);
                    json_decref(c);
                    json_decref(out);
                    ERR(err, 400, "messages: content parts of message %zu must be {\"type\": \"text\", \"text\": ...}", i);
                    return NULL;
                }
                if (k) buf_puts(&b, "\n");
                buf_append(&b, json_string_value(t), json_string_length(t));
            }
            json_object_set_new(c, "content", json_stringn(b.p ? b.p : "", b.n));
            buf_free(&b);
        } else if (content && !json_is_string(content) && !json_is_null(content)) {
            json_decref(c);
            json_decref(out);
            ERR(err, 400, "messages: content of message %zu must be a string, a list of text parts or null", i);
            return NULL;
        } else if (!content || json_is_null(content)) {
            json_object_set_new(c, "content", json_string(""));
        }
        json_array_append_new(out, c);
    }
    return out;
}

/* continue_final_message (vLLM, transformers' apply_chat_template): the
 * rendered chat ends right after the final message's content, so the model
 * continues that message instead of closing it. As transformers cuts it: at
 * the last occurrence of the content stripped of whitespace, keeping its
 * trailing whitespace when the template kept it. Returns 0 with *text cut. */
static int is_space(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v'; }

static int continue_final(json_t *msgs, char *text, Err *err) {
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    const char *m = json_string_value(json_object_get(last, "content"));
    size_t n = m ? strlen(m) : 0, a = 0, b = n;
    while (a < n && is_space(m[a])) a++;
    while (b > a && is_space(m[b - 1])) b--;
    size_t tn = strlen(text), k = b - a;
    const char *loc = NULL;
    for (const char *p = text; k && p + k <= text + tn; p++) /* the last occurrence */
        if (!memcmp(p, m + a, k)) loc = p;
    ENSURE(err, k && loc, 400, "continue_final_message: the final message does not appear in the chat after "
                               "applying the chat template (or it is empty)");
    size_t keep = (size_t)(loc - text) + (n - a); /* content with its trailing whitespace, if the template kept it */
    if (keep > tn || memcmp(loc, m + a, n - a) != 0) keep = (size_t)(loc - text) + k;
    text[keep] = 0;
    return 0;
}

/* Render and tokenize the prompt; *tools_on says whether to parse tool calls. */
int api_chat_prompt(Server *s, json_t *body, TokIds **out, int *tools_on, Err *err) {
    json_t *msgs = normalize_messages(json_object_get(body, "messages"), err);
    if (!msgs) return -1;
    json_t *tools = json_object_get(body, "tools");
    int rc = 0;
    char *text = NULL;
    json_t *kwargs = NULL;
    if (tools && !json_is_null(tools) && !json_is_array(tools)) { rc = ERR(err, 400, "tools: must be a list"); goto done; }
    if (tools && json_is_array(tools) && json_array_size(tools) == 0) tools = NULL;
    if (json_is_null(tools)) tools = NULL;
    json_t *tc = json_object_get(body, "tool_choice");
    *tools_on = tools != NULL && s->cfg.tool_parser;
    /* "required" and named functions: structured_parse builds their grammar */
    if (tc && json_is_string(tc) && !strcmp(json_string_value(tc), "none")) *tools_on = 0;
    int add_gen = 1, cont = 0;
    if ((rc = rp_bool(body, "add_generation_prompt", &add_gen, err)) < 0) goto done;
    if ((rc = rp_bool(body, "continue_final_message", &cont, err)) < 0) goto done;
    if (cont && add_gen) {
        rc = ERR(err, 400, "continue_final_message: cannot be used with add_generation_prompt true (set it to false)");
        goto done;
    }
    json_t *kw = json_object_get(body, "chat_template_kwargs");
    if (kw && !json_is_null(kw) && !json_is_object(kw)) { rc = ERR(err, 400, "chat_template_kwargs: must be an object"); goto done; }
    kwargs = kw && json_is_object(kw) ? json_deep_copy(kw) : json_object();
    if ((rc = tokenizer_apply_chat_template(s->tok, msgs, tools, add_gen, kwargs, &text, err)) < 0) {
        if (err->code == 0 || err->code == 500) err->code = 400;
        goto done;
    }
    if (cont && (rc = continue_final(msgs, text, err)) < 0) goto done;
    TokIds *p = calloc(1, sizeof *p);
    if (!p) { rc = ERR(err, 500, "out of memory"); goto done; }
    if ((rc = tokenizer_encode(s->tok, text, strlen(text), false, p, err)) < 0) { free(p); goto done; }
    for (size_t k = 0; k < p->n; k++)
        if (p->ids[k] >= s->vocab) {
            rc = ERR(err, 400, "messages: the chat template produced token %d outside the model's vocab (%d)", p->ids[k], s->vocab);
            prompts_free(p, 1);
            goto done;
        }
    if (p->n == 0) { prompts_free(p, 1); rc = ERR(err, 400, "messages: the rendered prompt is empty"); goto done; }
    *out = p;
done:
    free(text);
    json_decref(kwargs);
    json_decref(msgs);
    return rc;
}

/* vLLM's chat echo: the content of the final message when its role is the
 * assistant's (with continue_final_message, the message being continued). */
static char *echo_text(json_t *body) {
    Err e = {0};
    json_t *msgs = normalize_messages(json_object_get(body, "messages"), &e);
    if (!msgs) return NULL;
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    const char *role = json_string_value(json_object_get(last, "role"));
    const char *t = json_string_value(json_object_get(last, "content"));
    char *out = role && !strcmp(role, "assistant") && t && *t ? strdup(t) : NULL;
    json_decref(msgs);
    return out;
}

static json_t *head(Gen *g, const char *object) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(g->id));
    json_object_set_new(o, "object", json_string(object));
    json_object_set_new(o, "created", json_integer(g->created));
    json_object_set_new(o, "model", json_string(g->p.lora ? g->p.lora_name : g->s->model_name));
    return o;
}

static json_t *prompt_ids(Gen *g) {
    json_t *a = json_array();
    for (size_t k = 0; k < g->prompts[0].n; k++) json_array_append_new(a, json_integer(g->prompts[0].ids[k]));
    return a;
}

static json_t *calls_json(Gen *g, ToolCall *calls, int n, int first_index, int with_index) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) {
        json_t *c = json_object(), *f = json_object();
        char id[64];
        server_new_id(g->s, "chatcmpl-tool", id, sizeof id);
        if (with_index) json_object_set_new(c, "index", json_integer(first_index + i));
        json_object_set_new(c, "id", json_string(id));
        json_object_set_new(c, "type", json_string("function"));
        json_object_set_new(f, "name", json_string(calls[i].name));
        json_object_set_new(f, "arguments", json_string(calls[i].arguments));
        json_object_set_new(c, "function", f);
        json_array_append_new(a, c);
    }
    return a;
}

static const char *finish_of(Choice *c, int n_calls) {
    return n_calls > 0 && c->finish && !strcmp(c->finish, "stop") ? "tool_calls" : c->finish;
}

static int respond_whole(HttpReq *q, Chat *ch) {
    Gen *g = &ch->g;
    Err ferr;
    if (gen_failed(g, &ferr)) return http_send_err(q, &ferr);
    json_t *o = head(g, "chat.completion"), *choices = json_array();
    for (int i = 0; i < g->n_ch; i++) {
        Choice *c = &g->ch[i];
        ToolParser *tp = tool_parser_create(g->s->cfg.reasoning_parser, ch->tools);
        tool_parser_max_calls(tp, ch->max_calls);
        tool_parser_push(tp, c->text.p ? c->text.p : "", c->text.n);
        tool_parser_finish(tp);
        Buf content = {0}, reasoning = {0};
        ToolCall *calls;
        int nc = tool_parser_take(tp, &content, &reasoning, &calls);
        json_t *msg = json_object();
        json_object_set_new(msg, "role", json_string("assistant"));
        if (ch->echo) { /* vLLM: full content = the echoed message + the generated content */
            Buf full = {0};
            buf_puts(&full, ch->echo);
            buf_append(&full, content.p ? content.p : "", content.n);
            buf_free(&content);
            content = full;
        }
        json_object_set_new(msg, "content", nc && !content.n ? json_null() : json_stringn(content.p ? content.p : "", content.n));
        json_object_set_new(msg, "reasoning", reasoning.n ? json_stringn(reasoning.p, reasoning.n) : json_null());
        json_object_set_new(msg, "reasoning_content", reasoning.n ? json_stringn(reasoning.p, reasoning.n) : json_null());
        json_object_set_new(msg, "tool_calls", calls_json(g, calls, nc, 0, 0));
        json_t *cj = json_object();
        json_object_set_new(cj, "index", json_integer(c->index));
        json_object_set_new(cj, "message", msg);
        if (g->p.logprobs >= 0) {
            json_t *lp = json_object();
            json_object_set_new(lp, "content", gen_logprobs_chat(g, c, 0, c->n_out));
            json_object_set_new(cj, "logprobs", lp);
        } else {
            json_object_set_new(cj, "logprobs", json_null());
        }
        json_object_set_new(cj, "finish_reason", json_string(finish_of(c, nc)));
        gen_rl_fields(g, c, 0, c->n_out, cj);
        json_object_set_new(cj, "weight_versions", gen_weight_versions(g, c));
        json_array_append_new(choices, cj);
        for (int k = 0; k < nc; k++) tool_call_free(&calls[k]);
        free(calls);
        buf_free(&content);
        buf_free(&reasoning);
        tool_parser_free(tp);
    }
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", gen_usage(g));
    /* vLLM: both keys always there, null when not asked for */
    json_object_set_new(o, "prompt_token_ids", g->p.ret_token_ids ? prompt_ids(g) : json_null());
    json_object_set_new(o, "prompt_logprobs", g->p.prompt_logprobs >= 0 ? gen_prompt_logprobs(g, 0) : json_null());
    json_object_set_new(o, "weight_version", json_integer((json_int_t)server_weight_version(g->s, engine_weight_version(g->s->eng))));
    Err err;
    if (gen_failed(g, &err)) { /* never a 200 with a wrong or missing output */
        json_decref(o);
        return http_send_err(q, &err);
    }
    return http_send_json(q, 200, o);
}

/* ---- streaming ---- */
static void emit(Chat *ch, Buf *out, json_t *delta, Choice *c, int from, int to, const char *finish) {
    Gen *g = &ch->g;
    json_t *cj = json_object();
    json_object_set_new(cj, "index", json_integer(c->index));
    json_object_set_new(cj, "delta", delta);
    if (g->p.logprobs >= 0 && to > from) {
        json_t *lp = json_object();
        json_object_set_new(lp, "content", gen_logprobs_chat(g, c, from, to));
        json_object_set_new(cj, "logprobs", lp);
    } else {
        json_object_set_new(cj, "logprobs", json_null());
    }
    json_object_set_new(cj, "finish_reason", finish ? json_string(finish) : json_null());
    gen_rl_fields(g, c, from, to, cj);
    if (finish) json_object_set_new(cj, "weight_versions", gen_weight_versions(g, c));
    json_t *o = head(g, "chat.completion.chunk"), *arr = json_array();
    json_array_append_new(arr, cj);
    json_object_set_new(o, "choices", arr);
    if (!c->started && g->p.ret_token_ids) json_object_set_new(o, "prompt_token_ids", prompt_ids(g));
    if (g->p.continuous_usage) json_object_set_new(o, "usage", gen_usage(g));
    sse_event_json(out, o);
}

static int fill(void *ctx, Buf *out) {
    Chat *ch = ctx;
    Gen *g = &ch->g;
    for (;;) {
        int all_final = 1;
        for (int i = 0; i < g->n_ch; i++) all_final &= g->ch[i].final_sent;
        if (all_final) {
            if (g->p.include_usage) {
                json_t *o = head(g, "chat.completion.chunk");
                json_object_set_new(o, "choices", json_array());
                json_object_set_new(o, "usage", gen_usage(g));
                sse_event_json(out, o);
            }
            sse_done(out);
            return 0;
        }
        if (gen_step(g, 50) < 0) return -1;
        size_t mark = out->n;
        gen_render_begin(g);
        if (gen_failed(g, NULL)) { gen_stream_error(g, out); return 0; }
        for (int i = 0; i < g->n_ch; i++) {
            Choice *c = &g->ch[i];
            ChatOut *co = &ch->outs[i];
            if (c->final_sent) continue;
            if (!c->started) {
                /* the role chunk comes with the first token, as in vLLM: none during the prefill */
                if (c->n_out == 0 && !c->done) continue;
                json_t *d = json_object();
                json_object_set_new(d, "role", json_string("assistant"));
                json_object_set_new(d, "content", json_string(""));
                emit(ch, out, d, c, 0, 0, NULL);
                c->started = 1;
                if (ch->echo) { /* vLLM: the echoed message as its own chunk after the role */
                    json_t *e = json_object();
                    json_object_set_new(e, "content", json_string(ch->echo));
                    emit(ch, out, e, c, 0, 0, NULL);
                }
            }
            size_t lim = gen_emit_limit(g, c);
            if (lim > c->text_sent) tool_parser_push(co->tp, c->text.p + c->text_sent, lim - c->text_sent);
            int final = c->done && lim == c->text.n;
            if (final) tool_parser_finish(co->tp);
            Buf content = {0}, reasoning = {0};
            ToolCall *calls;
            int nc = tool_parser_take(co->tp, &content, &reasoning, &calls);
            int from = c->n_sent, to = c->n_out;
            int rl = g->p.ret_token_ids || g->p.ret_sampler_lp || g->p.ret_raw_lp || g->p.ret_mask || g->p.ret_experts;
            if (content.n || reasoning.n || nc || final || (to > from && (rl || g->p.logprobs >= 0))) {
                json_t *d = json_object();
                if (reasoning.n) {
                    json_object_set_new(d, "reasoning", json_stringn(reasoning.p, reasoning.n));
                    json_object_set_new(d, "reasoning_content", json_stringn(reasoning.p, reasoning.n));
                }
                if (content.n) json_object_set_new(d, "content", json_stringn(content.p, content.n));
                if (nc) json_object_set_new(d, "tool_calls", calls_json(g, calls, nc, co->n_calls, 1));
                co->n_calls += nc;
                emit(ch, out, d, c, from, to, final ? finish_of(c, co->n_calls) : NULL);
                c->n_sent = to;
                c->final_sent = final;
            }
            c->text_sent = lim;
            for (int k = 0; k < nc; k++) tool_call_free(&calls[k]);
            free(calls);
            buf_free(&content);
            buf_free(&reasoning);
        }
        if (gen_failed(g, NULL)) { out->n = mark; gen_stream_error(g, out); return 0; }
        if (gen_keepalive(g, out) || out->n) return 1;
    }
}

static void chat_free(Chat *ch) {
    for (int i = 0; ch->outs && i < ch->g.n_ch; i++) tool_parser_free(ch->outs[i].tp);
    free(ch->outs);
    free(ch->echo);
    gen_free(&ch->g);
    free(ch);
}

static void done(void *ctx) { chat_free(ctx); }

int api_chat(HttpReq *q, json_t *body) {
    Server *s = q->s;
    Err err = {0};
    int lora = 0;
    char lora_name[128] = "";
    if (lora_model_acquire(s, body, &lora, lora_name, sizeof lora_name, &err) < 0) return http_send_err(q, &err);
    GenParams p;
    if (request_parse_gen(body, 1, s->vocab, s->cfg.max_n, s->cfg.max_logprobs, &p, &err) < 0) {
        gen_params_free(&p);
        lora_release(s, lora);
        return http_send_err(q, &err);
    }
    p.lora = lora; /* gen_free gives it back; the error paths before gen_start do */
    memcpy(p.lora_name, lora_name, sizeof p.lora_name);
    TokIds *prompt = NULL;
    int tools_on = 0;
    if (api_chat_prompt(s, body, &prompt, &tools_on, &err) < 0) {
        lora_release(s, p.lora);
        gen_params_free(&p);
        return http_send_err(q, &err);
    }
    if (structured_parse(s, body, 1, tools_on, &p, &err) < 0) {
        prompts_free(prompt, 1);
        gen_params_free(&p);
        return http_send_err(q, &err);
    }
    Chat *ch = calloc(1, sizeof *ch);
    ch->tools = tools_on;
    ch->max_calls = json_is_false(json_object_get(body, "parallel_tool_calls")) ? 1 : INT_MAX;
    if (p.chat_echo) ch->echo = echo_text(body);
    if (gen_start(&ch->g, s, http_conn_fd(q), &p, prompt, 1, "chatcmpl", &err) < 0) {
        chat_free(ch);
        return http_send_err(q, &err);
    }
    Gen *g = &ch->g;
    g->count_reasoning = s->cfg.reasoning_parser;
    if (g->p.stream) {
        ch->outs = calloc((size_t)g->n_ch, sizeof *ch->outs);
        for (int i = 0; i < g->n_ch; i++) {
            ch->outs[i].tp = tool_parser_create(s->cfg.reasoning_parser, tools_on);
            tool_parser_max_calls(ch->outs[i].tp, ch->max_calls);
        }
        return http_send_stream(q, fill, done, ch);
    }
    int r;
    while ((r = gen_step(g, 100)) == 0) {}
    if (r < 0) {
        chat_free(ch);
        return MHD_NO;
    }
    int ret = respond_whole(q, ch);
    chat_free(ch);
    return ret;
}
