/*
 * api_responses.c - the OpenAI Responses API: POST /v1/responses, whole and
 * streamed. input (a string, or items: messages, reasoning, function_call,
 * function_call_output) and instructions become chat messages rendered by
 * chat's template code (dialect.h); the output's blocks become reasoning,
 * message and function_call output items, streamed with the Responses event
 * sequence (response.created, response.in_progress, per item
 * output_item.added / content_part.added / *.delta / *.done /
 * output_item.done, response.completed), every event with its
 * sequence_number.
 *
 * Stateless: nothing is stored whatever "store" says (responses answer
 * "store": false), so previous_response_id and conversation are a 400 (send
 * the whole conversation in input) and GET /v1/responses/{id} is a 404.
 * Not here: built-in tools (web search, file search, ...: 400), text.format
 * other than text (400), background mode (400), the OpenAI logprobs of
 * output_text (the RL field sampler_logprobs carries them).
 * input_tokens_details.cached_tokens: the prompt tokens found in the prefix cache.
 */
#define _GNU_SOURCE
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>

#include "dialect.h"
#include "sse.h"

static const DialectRename RENAMES[] = {{"max_tokens", "max_output_tokens"}};
#define N_RENAMES 1
static const char *const IN_TEXT[] = {"input_text", "output_text", "text", NULL};
static const char *const REASONING_TEXT[] = {"reasoning_text", NULL};
static const char *const SUMMARY_TEXT[] = {"summary_text", NULL};

static int is(json_t *j, const char *s) { return json_is_string(j) && !strcmp(json_string_value(j), s); }

/* ---- the request -> a chat body ---- */
typedef struct InState {
    json_t *msgs;
    json_t *asst;   /* the assistant message function_call items join, or NULL (borrowed from msgs) */
    Buf reasoning;  /* reasoning items not yet given to an assistant message */
    int have_reasoning;
} InState;

static json_t *new_assistant(InState *st, const char *text) {
    json_t *m = json_pack("{s:s, s:s}", "role", "assistant", "content", text);
    if (st->have_reasoning) {
        json_object_set_new(m, "reasoning_content", json_stringn(st->reasoning.p ? st->reasoning.p : "", st->reasoning.n));
        st->reasoning.n = 0;
        st->have_reasoning = 0;
    }
    json_array_append_new(st->msgs, m);
    st->asst = m;
    return m;
}

static int input_item(InState *st, json_t *it, size_t i, Err *err) {
    char what[64];
    snprintf(what, sizeof what, "input[%zu]", i);
    ENSURE(err, json_is_object(it), 400, "%s: must be an object", what);
    json_t *ty = json_object_get(it, "type"), *role = json_object_get(it, "role");
    if ((!ty || is(ty, "message")) && json_is_string(role)) {
        const char *r = json_string_value(role);
        int asst = !strcmp(r, "assistant");
        ENSURE(err, asst || !strcmp(r, "user") || !strcmp(r, "system") || !strcmp(r, "developer"), 400,
               "%s.role: must be user, system, developer or assistant", what);
        char cw[80];
        snprintf(cw, sizeof cw, "%s.content", what);
        char *t = dialect_text(json_object_get(it, "content"), IN_TEXT, cw, err);
        if (!t) return -1;
        if (asst) new_assistant(st, t);
        else {
            json_array_append_new(st->msgs, json_pack("{s:s, s:s}", "role", strcmp(r, "developer") ? r : "system", "content", t));
            st->asst = NULL;
        }
        free(t);
        return 0;
    }
    if (is(ty, "reasoning")) {
        json_t *c = json_object_get(it, "content");
        int use_content = json_is_array(c) && json_array_size(c);
        char *t = dialect_text(use_content ? c : json_object_get(it, "summary"),
                               use_content ? REASONING_TEXT : SUMMARY_TEXT, what, err);
        if (!t) return -1;
        buf_puts(&st->reasoning, t);
        st->have_reasoning = 1;
        st->asst = NULL;
        free(t);
        return 0;
    }
    if (is(ty, "function_call")) {
        json_t *id = json_object_get(it, "call_id"), *name = json_object_get(it, "name"), *args = json_object_get(it, "arguments");
        ENSURE(err, json_is_string(id) && json_is_string(name) && json_is_string(args), 400,
               "%s: a function_call needs string call_id, name and arguments", what);
        json_t *m = st->asst ? st->asst : new_assistant(st, "");
        json_t *calls = json_object_get(m, "tool_calls");
        if (!calls) json_object_set_new(m, "tool_calls", calls = json_array());
        json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", id, "type", "function", "function",
                                               "name", name, "arguments", args));
        return 0;
    }
    if (is(ty, "function_call_output")) {
        json_t *id = json_object_get(it, "call_id"), *out = json_object_get(it, "output");
        ENSURE(err, json_is_string(id), 400, "%s.call_id: must be a string", what);
        char cw[80];
        snprintf(cw, sizeof cw, "%s.output", what);
        char *t = dialect_text(out, IN_TEXT, cw, err);
        if (!t) return -1;
        json_array_append_new(st->msgs, json_pack("{s:s, s:O, s:s}", "role", "tool", "tool_call_id", id, "content", t));
        st->asst = NULL;
        free(t);
        return 0;
    }
    return ERR(err, 400, "%s.type: %s items are not supported here (message, reasoning, function_call, "
               "function_call_output)", what, json_is_string(ty) ? json_string_value(ty) : "untyped");
}

static json_t *chat_messages(json_t *body, Err *err) {
    json_t *in = json_object_get(body, "input"), *ins = json_object_get(body, "instructions");
    if (!json_is_string(in) && !(json_is_array(in) && json_array_size(in))) {
        ERR(err, 400, "input: must be a string or a non-empty list of items");
        return NULL;
    }
    InState st = {json_array(), NULL, {0}, 0};
    int rc = 0;
    if (ins && !json_is_null(ins)) {
        if (!json_is_string(ins)) rc = ERR(err, 400, "instructions: must be a string");
        else json_array_append_new(st.msgs, json_pack("{s:s, s:O}", "role", "system", "content", ins));
    }
    if (rc == 0 && json_is_string(in)) json_array_append_new(st.msgs, json_pack("{s:s, s:O}", "role", "user", "content", in));
    size_t i;
    json_t *it;
    if (json_is_array(in))
        json_array_foreach(in, i, it) if (rc == 0) rc = input_item(&st, it, i, err);
    buf_free(&st.reasoning);
    if (rc < 0) {
        json_decref(st.msgs);
        return NULL;
    }
    return st.msgs;
}

static json_t *chat_tools(json_t *tools, Err *err) {
    if (!tools || json_is_null(tools)) return NULL;
    if (!json_is_array(tools)) { ERR(err, 400, "tools: must be a list"); return NULL; }
    json_t *out = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *ty = json_object_get(t, "type"), *name = json_object_get(t, "name");
        if (!is(ty, "function") || !json_is_string(name)) {
            ERR(err, 400, "tools[%zu]: only function tools {\"type\": \"function\", \"name\", \"parameters\"} are "
                "served here%s%s", i, json_is_string(ty) ? ", not " : "", json_is_string(ty) ? json_string_value(ty) : "");
            json_decref(out);
            return NULL;
        }
        json_t *f = json_pack("{s:O}", "name", name);
        json_t *d = json_object_get(t, "description"), *pa = json_object_get(t, "parameters");
        if (json_is_string(d)) json_object_set(f, "description", d);
        if (json_is_object(pa)) json_object_set(f, "parameters", pa);
        json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", f));
    }
    return out;
}

/* The Responses tool_choice -> chat's (whose own check answers what is not served yet). */
static int chat_tool_choice(json_t *tc, json_t *chat, Err *err) {
    if (!tc || json_is_null(tc)) return 0;
    if (json_is_string(tc)) { json_object_set(chat, "tool_choice", tc); return 0; }
    json_t *name = json_object_get(tc, "name");
    ENSURE(err, is(json_object_get(tc, "type"), "function") && json_is_string(name), 400,
           "tool_choice: must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}");
    json_object_set_new(chat, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name));
    return 0;
}

static const char *const DROP[] = {"input", "instructions", "tools", "tool_choice", "max_output_tokens", "max_tokens",
                                   "max_completion_tokens", "logprobs", "top_logprobs", "echo", "stream_options",
                                   "reasoning", "text", "store", "include", "metadata", "parallel_tool_calls",
                                   "truncation", "messages", "add_generation_prompt", "previous_response_id", NULL};

static json_t *to_chat(json_t *body, Err *err) {
    json_t *prev = json_object_get(body, "previous_response_id"), *conv = json_object_get(body, "conversation");
    json_t *bg = json_object_get(body, "background"), *text = json_object_get(body, "text");
    if (prev && !json_is_null(prev)) {
        ERR(err, 400, "previous_response_id: this server stores no responses (stateless): send the whole "
            "conversation in input");
        return NULL;
    }
    if (conv && !json_is_null(conv)) {
        ERR(err, 400, "conversation: this server stores no conversations (stateless): send them in input");
        return NULL;
    }
    if (json_is_true(bg)) { ERR(err, 400, "background: background responses are not supported (stateless)"); return NULL; }
    json_t *fmt = json_object_get(text, "format");
    if (fmt && !json_is_null(fmt) && !is(json_object_get(fmt, "type"), "text")) {
        ERR(err, 400, "text.format: only {\"type\": \"text\"} is served here");
        return NULL;
    }
    json_t *tl = json_object_get(body, "top_logprobs");
    if (tl && !json_is_null(tl) && !(json_is_integer(tl) && json_integer_value(tl) == 0)) {
        ERR(err, 400, "top_logprobs: the OpenAI log-probs of output_text are not served here; the sampled tokens' "
            "log-probs come with return_sampler_logprobs: true");
        return NULL;
    }
    json_t *chat = json_copy(body);
    for (int i = 0; DROP[i]; i++) json_object_del(chat, DROP[i]);
    json_t *mo = json_object_get(body, "max_output_tokens");
    if (mo) json_object_set(chat, "max_tokens", mo);
    json_t *msgs = chat_messages(body, err), *tools = NULL;
    if (!msgs) goto fail;
    json_object_set_new(chat, "messages", msgs);
    json_t *tj = json_object_get(body, "tools");
    if (tj && !json_is_null(tj) && !(tools = chat_tools(tj, err))) goto fail;
    if (tools) json_object_set_new(chat, "tools", tools);
    if (chat_tool_choice(json_object_get(body, "tool_choice"), chat, err) < 0) goto fail;
    json_t *ptc = json_object_get(body, "parallel_tool_calls"); /* a forced choice's grammar reads it */
    if (ptc && !json_is_null(ptc)) json_object_set(chat, "parallel_tool_calls", ptc);
    json_t *kw = json_object_get(body, "chat_template_kwargs");
    if (kw && !json_is_null(kw) && !json_is_object(kw)) { ERR(err, 400, "chat_template_kwargs: must be an object"); goto fail; }
    json_t *kwargs = json_is_object(kw) ? json_deep_copy(kw) : json_object();
    /* reasoning.effort "none": no thinking (Qwen3's enable_thinking false); otherwise the template's default */
    if (is(json_object_get(json_object_get(body, "reasoning"), "effort"), "none") && !json_object_get(kwargs, "enable_thinking"))
        json_object_set_new(kwargs, "enable_thinking", json_false());
    json_object_set_new(chat, "chat_template_kwargs", kwargs);
    return chat;
fail:
    json_decref(chat);
    return NULL;
}

/* ---- the output ---- */
typedef struct Resp {
    Gen g;
    json_t *body;     /* the request (echoed fields) */
    ToolParser *tp;
    json_t *output;   /* the output items so far */
    int cur;          /* the kind of the open item (reasoning / message), -1: none */
    int n_calls;
    int seq;          /* streaming: the next sequence_number */
    Buf *out;         /* streaming: this fill's bytes; NULL: whole */
    int started, final_sent;
} Resp;

static void ev(Resp *r, const char *type, json_t *j) {
    if (!r->out) { json_decref(j); return; }
    json_t *o = json_pack("{s:s}", "type", type);
    json_object_update(o, j);
    json_decref(j);
    json_object_set_new(o, "sequence_number", json_integer(r->seq++));
    sse_event_named(r->out, type, o);
}

static json_t *usage(Resp *r) {
    Gen *g = &r->g;
    json_int_t in = (json_int_t)g->prompts[0].n, out = g->ch[0].n_out;
    int cached = g->reqs && g->reqs[0] ? engine_request_cached_tokens(g->reqs[0]) : 0;
    return json_pack("{s:I, s:{s:i}, s:I, s:{s:i}, s:I}", "input_tokens", in, "input_tokens_details", "cached_tokens",
                     cached,
                     "output_tokens", out, "output_tokens_details", "reasoning_tokens", dialect_reasoning_tokens(g),
                     "total_tokens", in + out);
}

static json_t *echo(Resp *r, const char *key, json_t *dflt) {
    json_t *v = json_object_get(r->body, key);
    if (v && !json_is_null(v)) { json_decref(dflt); return json_incref(v); }
    return dflt;
}

/* The response object; status "in_progress" / "completed" / "incomplete". */
static json_t *response_json(Resp *r, const char *status) {
    Gen *g = &r->g;
    GenParams *p = &g->p;
    Choice *c = &g->ch[0];
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:n}", "id", g->id, "object", "response", "created_at",
                          (json_int_t)g->created, "status", status, "error");
    json_t *inc = json_null();
    if (!strcmp(status, "incomplete"))
        inc = !strcmp(c->finish, "length") ? json_pack("{s:s}", "reason", "max_output_tokens") : json_pack("{s:n}", "reason");
    json_object_set_new(o, "incomplete_details", inc);
    json_object_set_new(o, "instructions", echo(r, "instructions", json_null()));
    json_object_set_new(o, "max_output_tokens", echo(r, "max_output_tokens", json_null()));
    json_object_set_new(o, "model", json_string(g->s->model_name));
    json_object_set_new(o, "output", json_deep_copy(r->output));
    json_object_set_new(o, "parallel_tool_calls", echo(r, "parallel_tool_calls", json_true()));
    json_object_set_new(o, "previous_response_id", json_null());
    json_t *rs = json_object_get(r->body, "reasoning");
    json_object_set_new(o, "reasoning", json_pack("{s:O, s:n}", "effort", json_is_object(rs) && json_object_get(rs, "effort")
                                                  ? json_object_get(rs, "effort") : json_null(), "summary"));
    json_object_set_new(o, "store", json_false());
    json_object_set_new(o, "temperature", json_real(p->sp.temperature));
    json_object_set_new(o, "text", json_pack("{s:{s:s}}", "format", "type", "text"));
    json_object_set_new(o, "tool_choice", echo(r, "tool_choice", json_string("auto")));
    json_object_set_new(o, "tools", echo(r, "tools", json_array()));
    json_object_set_new(o, "top_p", json_real(p->sp.top_p));
    json_object_set_new(o, "truncation", json_string("disabled"));
    json_object_set_new(o, "usage", strcmp(status, "in_progress") ? usage(r) : json_null());
    json_object_set_new(o, "user", echo(r, "user", json_null()));
    json_object_set_new(o, "metadata", echo(r, "metadata", json_object()));
    if (strcmp(status, "in_progress")) dialect_rl_fields(g, o);
    return o;
}

static const char *final_status(Resp *r) {
    const char *f = r->g.ch[0].finish;
    return f && !strcmp(f, "stop") ? "completed" : "incomplete";
}

/* The open item (the last of output) is done: its *.done events. */
static void close_item(Resp *r) {
    if (r->cur < 0) return;
    size_t oi = json_array_size(r->output) - 1;
    json_t *it = json_array_get(r->output, oi);
    Choice *c = &r->g.ch[0];
    int cut = c->done && c->finish && strcmp(c->finish, "stop"); /* the last item of a truncated output */
    json_object_set_new(it, "status", json_string(cut ? "incomplete" : "completed"));
    json_t *part = json_array_get(json_object_get(it, "content"), 0);
    const char *id = json_string_value(json_object_get(it, "id"));
    const char *done = r->cur == BLOCK_THINKING ? "response.reasoning_text.done" : "response.output_text.done";
    json_t *d = json_pack("{s:s, s:I, s:i, s:O}", "item_id", id, "output_index", (json_int_t)oi, "content_index", 0,
                          "text", json_object_get(part, "text"));
    if (r->cur == BLOCK_TEXT) json_object_set_new(d, "logprobs", json_array());
    ev(r, done, d);
    ev(r, "response.content_part.done", json_pack("{s:s, s:I, s:i, s:O}", "item_id", id, "output_index", (json_int_t)oi,
                                                  "content_index", 0, "part", part));
    ev(r, "response.output_item.done", json_pack("{s:I, s:O}", "output_index", (json_int_t)oi, "item", it));
    r->cur = -1;
}

static void on_block(void *ctx, BlockKind k, const char *text, size_t n, const ToolCall *call) {
    Resp *r = ctx;
    char id[48];
    if (k == BLOCK_CALL) {
        close_item(r);
        char call_id[48];
        dialect_id(r->g.s, "fc", id, sizeof id);
        dialect_id(r->g.s, "call", call_id, sizeof call_id);
        json_t *it = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "id", id, "type", "function_call", "status", "in_progress",
                               "call_id", call_id, "name", call->name, "arguments", "");
        size_t oi = json_array_size(r->output);
        ev(r, "response.output_item.added", json_pack("{s:I, s:O}", "output_index", (json_int_t)oi, "item", it));
        ev(r, "response.function_call_arguments.delta", json_pack("{s:s, s:I, s:s}", "item_id", id, "output_index",
                                                                  (json_int_t)oi, "delta", call->arguments));
        ev(r, "response.function_call_arguments.done", json_pack("{s:s, s:I, s:s, s:s}", "item_id", id, "output_index",
                                                                 (json_int_t)oi, "name", call->name, "arguments",
                                                                 call->arguments));
        json_object_set_new(it, "arguments", json_string(call->arguments));
        json_object_set_new(it, "status", json_string("completed"));
        ev(r, "response.output_item.done", json_pack("{s:I, s:O}", "output_index", (json_int_t)oi, "item", it));
        json_array_append_new(r->output, it);
        r->n_calls++;
        return;
    }
    int think = k == BLOCK_THINKING;
    if (r->cur != (int)k) {
        close_item(r);
        dialect_id(r->g.s, think ? "rs" : "msg", id, sizeof id);
        json_t *it = think ? json_pack("{s:s, s:s, s:[], s:[], s:s}", "id", id, "type", "reasoning", "summary", "content",
                                       "status", "in_progress")
                           : json_pack("{s:s, s:s, s:s, s:s, s:[]}", "id", id, "type", "message", "role", "assistant",
                                       "status", "in_progress", "content");
        size_t oi = json_array_size(r->output);
        ev(r, "response.output_item.added", json_pack("{s:I, s:O}", "output_index", (json_int_t)oi, "item", it));
        json_t *part = think ? json_pack("{s:s, s:s}", "type", "reasoning_text", "text", "")
                             : json_pack("{s:s, s:s, s:[], s:[]}", "type", "output_text", "text", "", "annotations", "logprobs");
        ev(r, "response.content_part.added", json_pack("{s:s, s:I, s:i, s:O}", "item_id", id, "output_index",
                                                       (json_int_t)oi, "content_index", 0, "part", part));
        json_array_append_new(json_object_get(it, "content"), part);
        json_array_append_new(r->output, it);
        r->cur = (int)k;
    }
    size_t oi = json_array_size(r->output) - 1;
    json_t *it = json_array_get(r->output, oi);
    json_t *part = json_array_get(json_object_get(it, "content"), 0);
    Buf b = {0};
    buf_puts(&b, json_string_value(json_object_get(part, "text")));
    buf_append(&b, text, n);
    json_object_set_new(part, "text", json_stringn(b.p, b.n));
    buf_free(&b);
    json_t *d = json_pack("{s:O, s:I, s:i, s:s%}", "item_id", json_object_get(it, "id"), "output_index", (json_int_t)oi,
                          "content_index", 0, "delta", text, n);
    if (!think) json_object_set_new(d, "logprobs", json_array());
    ev(r, think ? "response.reasoning_text.delta" : "response.output_text.delta", d);
}

static int respond_whole(HttpReq *q, Resp *r) {
    Gen *g = &r->g;
    Err err;
    if (gen_failed(g, &err)) return http_send_err(q, &err);
    Choice *c = &g->ch[0];
    dialect_feed(r->tp, c->text.p ? c->text.p : "", c->text.n, 1, on_block, r);
    close_item(r);
    json_t *o = response_json(r, final_status(r));
    if (gen_failed(g, &err)) { /* never a 200 with a wrong or missing output */
        json_decref(o);
        return http_send_err(q, &err);
    }
    return http_send_json(q, 200, o);
}

static void stream_error(Resp *r) {
    Gen *g = &r->g;
    int status = g->fail.code ? g->fail.code : 500;
    json_t *e = http_error_json(status, NULL, g->fail.msg), *in = json_object_get(e, "error");
    ev(r, "error", json_pack("{s:O, s:O, s:n}", "code", json_object_get(in, "code"), "message",
                             json_object_get(in, "message"), "param"));
    json_decref(e);
}

static int fill(void *ctx, Buf *out) {
    Resp *r = ctx;
    Gen *g = &r->g;
    Choice *c = &g->ch[0];
    r->out = out;
    if (r->final_sent) return 0;
    if (!r->started) {
        ev(r, "response.created", json_pack("{s:o}", "response", response_json(r, "in_progress")));
        ev(r, "response.in_progress", json_pack("{s:o}", "response", response_json(r, "in_progress")));
        r->started = 1;
        return 1;
    }
    for (;;) {
        if (gen_step(g, 50) < 0) return -1;
        size_t mark = out->n;
        gen_render_begin(g);
        if (gen_failed(g, NULL)) { stream_error(r); r->final_sent = 1; return 1; }
        size_t lim = gen_emit_limit(g, c);
        int final = c->done && lim == c->text.n;
        /* nothing decoded yet: text.p is NULL */
        dialect_feed(r->tp, c->text.p ? c->text.p + c->text_sent : "", lim - c->text_sent, final, on_block, r);
        c->text_sent = lim;
        if (final) {
            close_item(r);
            const char *st = final_status(r);
            ev(r, !strcmp(st, "completed") ? "response.completed" : "response.incomplete",
               json_pack("{s:o}", "response", response_json(r, st)));
            r->final_sent = 1;
        }
        if (gen_failed(g, NULL)) { out->n = mark; stream_error(r); r->final_sent = 1; return 1; }
        if (gen_keepalive(g, out) || out->n) return 1;
    }
}

static void resp_free(Resp *r) {
    tool_parser_free(r->tp);
    json_decref(r->output);
    json_decref(r->body);
    gen_free(&r->g);
    free(r);
}

static void done(void *ctx) { resp_free(ctx); }

int api_responses(HttpReq *q, json_t *body) {
    Server *s = q->s;
    Err err = {0};
    GenParams p;
    memset(&p, 0, sizeof p);
    TokIds *prompt = NULL;
    int tools_on = 0;
    if (http_check_model(s, body, &err) < 0) return http_send_err(q, &err);
    json_t *chat = to_chat(body, &err);
    if (!chat) return http_send_err(q, &err);
    int rc = dialect_prepare(s, body, chat, RENAMES, N_RENAMES, &p, &prompt, &tools_on, &err);
    json_decref(chat);
    if (rc < 0) {
        gen_params_free(&p);
        return http_send_err(q, &err);
    }
    Resp *r = calloc(1, sizeof *r);
    if (!r) {
        gen_params_free(&p);
        prompts_free(prompt, 1);
        return http_send_error(q, 503, NULL, "out of memory");
    }
    r->cur = -1;
    r->body = json_incref(body);
    r->output = json_array();
    r->tp = tool_parser_create(s->cfg.reasoning_parser, tools_on);
    if (json_is_false(json_object_get(body, "parallel_tool_calls"))) tool_parser_max_calls(r->tp, 1); /* as vLLM */
    if (gen_start(&r->g, s, http_conn_fd(q), &p, prompt, 1, "resp", &err) < 0) {
        dialect_rename_err(&err, RENAMES, N_RENAMES);
        resp_free(r);
        return http_send_err(q, &err);
    }
    if (r->g.p.stream) return http_send_stream(q, fill, done, r);
    int rr;
    while ((rr = gen_step(&r->g, 100)) == 0) {}
    if (rr < 0) {
        resp_free(r);
        return MHD_NO;
    }
    int ret = respond_whole(q, r);
    resp_free(r);
    return ret;
}

int api_responses_get(HttpReq *q, json_t *body) {
    (void)body;
    return http_send_error_code(q, 404, NULL, "response_not_found", "%s: this server stores no responses "
                                "(stateless, \"store\" is always false): keep the response you got", q->url);
}
