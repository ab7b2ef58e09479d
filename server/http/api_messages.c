/*
 * api_messages.c - the Anthropic Messages API: POST /v1/messages (whole and
 * streamed) and POST /v1/messages/count_tokens. The request (system,
 * messages with text / thinking / tool_use / tool_result blocks, tools,
 * tool_choice, thinking, stop_sequences, max_tokens, temperature, top_p,
 * top_k) becomes a chat body rendered by chat's template code (dialect.h);
 * the output's blocks become thinking / text / tool_use content blocks with
 * stop_reason end_turn, max_tokens, stop_sequence, tool_use (pause_turn for
 * a request aborted by POST /abort_request: a partial turn, as Anthropic uses
 * it). Errors are in Anthropic's shape (the route rows' DIALECT_ANTHROPIC).
 *
 * Not here: images and documents (a text-only server: 400), a final
 * assistant message as prefill (400), thinking signatures (always ""), the
 * thinking budget (accepted, not enforced), prompt caching fields.
 */
#define _GNU_SOURCE
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>

#include "dialect.h"
#include "sse.h"

static const DialectRename RENAMES[] = {{"stop", "stop_sequences"}};
#define N_RENAMES 1
static const char *const TEXT[] = {"text", NULL};

/* ---- the request -> a chat body ---- */
static int is(json_t *j, const char *s) { return json_is_string(j) && !strcmp(json_string_value(j), s); }

/* One user message's blocks: text joined into user messages, each tool_result a tool message, in order. */
static int user_blocks(json_t *content, size_t i, json_t *msgs, Err *err) {
    Buf text = {0};
    int have_text = 0, rc = 0;
    size_t k;
    json_t *b;
    char what[96];
    json_array_foreach(content, k, b) {
        json_t *ty = json_object_get(b, "type");
        snprintf(what, sizeof what, "messages[%zu].content[%zu]", i, k);
        if (is(ty, "text") && json_is_string(json_object_get(b, "text"))) {
            if (have_text) buf_puts(&text, "\n");
            buf_puts(&text, json_string_value(json_object_get(b, "text")));
            have_text = 1;
        } else if (is(ty, "tool_result")) {
            json_t *id = json_object_get(b, "tool_use_id"), *c = json_object_get(b, "content");
            if (!json_is_string(id)) { rc = ERR(err, 400, "%s.tool_use_id: must be a string", what); break; }
            char cw[128];
            snprintf(cw, sizeof cw, "%s.content", what);
            char *t = !c || json_is_null(c) ? strdup("") : dialect_text(c, TEXT, cw, err);
            if (!t) { rc = -1; break; }
            if (have_text) {
                json_array_append_new(msgs, json_pack("{s:s, s:s%}", "role", "user", "content", text.p ? text.p : "", text.n));
                text.n = 0;
                have_text = 0;
            }
            json_array_append_new(msgs, json_pack("{s:s, s:O, s:s}", "role", "tool", "tool_call_id", id, "content", t));
            free(t);
        } else {
            rc = ERR(err, 400, "%s.type: %s blocks are not supported in user messages here (text-only model: text "
                     "and tool_result)", what, json_is_string(ty) ? json_string_value(ty) : "untyped");
            break;
        }
    }
    if (rc == 0 && have_text)
        json_array_append_new(msgs, json_pack("{s:s, s:s%}", "role", "user", "content", text.p ? text.p : "", text.n));
    buf_free(&text);
    return rc;
}

/* One assistant message's blocks: thinking -> reasoning_content, text -> content, tool_use -> tool_calls. */
static int assistant_blocks(json_t *content, size_t i, json_t *msgs, Err *err) {
    Buf text = {0}, think = {0};
    int have_think = 0, rc = 0;
    json_t *calls = json_array();
    size_t k;
    json_t *b;
    json_array_foreach(content, k, b) {
        json_t *ty = json_object_get(b, "type");
        if (is(ty, "text") && json_is_string(json_object_get(b, "text"))) {
            buf_puts(&text, json_string_value(json_object_get(b, "text")));
        } else if (is(ty, "thinking") && json_is_string(json_object_get(b, "thinking"))) {
            buf_puts(&think, json_string_value(json_object_get(b, "thinking")));
            have_think = 1;
        } else if (is(ty, "redacted_thinking")) {
            /* an encrypted block of Anthropic's: nothing of it can be rendered */
        } else if (is(ty, "tool_use")) {
            json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name"), *in = json_object_get(b, "input");
            if (!json_is_string(id) || !json_is_string(name) || !json_is_object(in)) {
                rc = ERR(err, 400, "messages[%zu].content[%zu]: a tool_use block needs a string id and name and an "
                         "object input", i, k);
                break;
            }
            json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", id, "type", "function",
                                                   "function", "name", name, "arguments", in));
        } else {
            rc = ERR(err, 400, "messages[%zu].content[%zu].type: must be text, thinking, redacted_thinking or "
                     "tool_use in an assistant message", i, k);
            break;
        }
    }
    if (rc == 0) {
        json_t *m = json_pack("{s:s, s:s%}", "role", "assistant", "content", text.p ? text.p : "", text.n);
        if (have_think) json_object_set_new(m, "reasoning_content", json_stringn(think.p ? think.p : "", think.n));
        if (json_array_size(calls)) json_object_set(m, "tool_calls", calls);
        json_array_append_new(msgs, m);
    }
    json_decref(calls);
    buf_free(&text);
    buf_free(&think);
    return rc;
}

static json_t *chat_messages(json_t *body, Err *err) {
    json_t *ms = json_object_get(body, "messages"), *sys = json_object_get(body, "system");
    if (!json_is_array(ms) || json_array_size(ms) == 0) {
        ERR(err, 400, "messages: must be a non-empty list of {\"role\", \"content\"}");
        return NULL;
    }
    json_t *out = json_array();
    if (sys && !json_is_null(sys)) {
        char *t = dialect_text(sys, TEXT, "system", err);
        if (!t) { json_decref(out); return NULL; }
        json_array_append_new(out, json_pack("{s:s, s:s}", "role", "system", "content", t));
        free(t);
    }
    size_t i;
    json_t *m;
    json_array_foreach(ms, i, m) {
        json_t *role = json_object_get(m, "role"), *c = json_object_get(m, "content");
        int user = is(role, "user"), asst = is(role, "assistant"), rc = 0;
        if (!user && !asst) rc = ERR(err, 400, "messages[%zu].role: must be \"user\" or \"assistant\"", i);
        else if (json_is_string(c)) json_array_append_new(out, json_pack("{s:O, s:O}", "role", role, "content", c));
        else if (!json_is_array(c)) rc = ERR(err, 400, "messages[%zu].content: must be a string or a list of blocks", i);
        else rc = user ? user_blocks(c, i, out, err) : assistant_blocks(c, i, out, err);
        if (rc == 0 && asst && i + 1 == json_array_size(ms))
            rc = ERR(err, 400, "messages: a final assistant message (prefill) is not supported here; end with a user "
                     "message");
        if (rc < 0) { json_decref(out); return NULL; }
    }
    return out;
}

static json_t *chat_tools(json_t *tools, Err *err) {
    if (!tools || json_is_null(tools)) return NULL;
    if (!json_is_array(tools)) { ERR(err, 400, "tools: must be a list"); return NULL; }
    json_t *out = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *ty = json_object_get(t, "type"), *name = json_object_get(t, "name"), *sch = json_object_get(t, "input_schema");
        if (ty && !json_is_null(ty) && !is(ty, "custom")) {
            ERR(err, 400, "tools[%zu].type: %s: only client tools ({name, description, input_schema}) are served here",
                i, json_is_string(ty) ? json_string_value(ty) : "?");
            json_decref(out);
            return NULL;
        }
        if (!json_is_string(name) || !json_is_object(sch)) {
            ERR(err, 400, "tools[%zu]: needs a string name and an object input_schema", i);
            json_decref(out);
            return NULL;
        }
        json_t *f = json_pack("{s:O}", "name", name), *d = json_object_get(t, "description");
        if (json_is_string(d)) json_object_set(f, "description", d); /* chat's key order: the template dumps it */
        json_object_set(f, "parameters", sch);
        json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", f));
    }
    return out;
}

/* Anthropic's tool_choice -> chat's (structured_parse turns any / tool into a
 * grammar over the tools); disable_parallel_tool_use -> parallel_tool_calls. */
static int chat_tool_choice(json_t *tc, json_t *chat, Err *err) {
    if (!tc || json_is_null(tc)) return 0;
    json_t *ty = json_object_get(tc, "type"), *dp = json_object_get(tc, "disable_parallel_tool_use");
    ENSURE(err, !dp || json_is_null(dp) || json_is_boolean(dp), 400,
           "tool_choice.disable_parallel_tool_use: must be a boolean");
    if (json_is_true(dp)) json_object_set_new(chat, "parallel_tool_calls", json_false());
    if (is(ty, "auto") || is(ty, "none")) json_object_set(chat, "tool_choice", ty);
    else if (is(ty, "any")) json_object_set_new(chat, "tool_choice", json_string("required"));
    else if (is(ty, "tool") && json_is_string(json_object_get(tc, "name")))
        json_object_set_new(chat, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name",
                                                           json_object_get(tc, "name")));
    else return ERR(err, 400, "tool_choice: must be {\"type\": \"auto\" | \"any\" | \"none\"} or {\"type\": \"tool\", "
                    "\"name\": ...}");
    return 0;
}

/* thinking -> enable_thinking (Anthropic's default is off); chat_template_kwargs given wins. */
static int chat_thinking(json_t *body, json_t *kwargs, Err *err) {
    json_t *th = json_object_get(body, "thinking");
    int on = 0;
    if (th && !json_is_null(th)) {
        json_t *ty = json_object_get(th, "type");
        if (is(ty, "enabled") || is(ty, "adaptive")) on = 1;
        else ENSURE(err, is(ty, "disabled"), 400, "thinking.type: must be \"enabled\", \"adaptive\" or \"disabled\"");
    }
    if (!json_object_get(kwargs, "enable_thinking")) json_object_set_new(kwargs, "enable_thinking", json_boolean(on));
    return 0;
}

static const char *const DROP[] = {"messages", "system", "tools", "tool_choice", "stop", "stop_sequences", "thinking",
                                   "logprobs", "top_logprobs", "echo", "stream_options", "max_completion_tokens",
                                   "add_generation_prompt", "metadata", NULL};

/* The chat body of an Anthropic request (need_max: max_tokens is required, as Anthropic has it). */
static json_t *to_chat(json_t *body, int need_max, Err *err) {
    if (need_max && !json_object_get(body, "max_tokens")) {
        ERR(err, 400, "max_tokens: is required");
        return NULL;
    }
    json_t *chat = json_copy(body);
    for (int i = 0; DROP[i]; i++) json_object_del(chat, DROP[i]);
    json_t *msgs = chat_messages(body, err), *tools = NULL;
    if (!msgs) goto fail;
    json_object_set_new(chat, "messages", msgs);
    json_t *tl = json_object_get(body, "tools");
    if (tl && !json_is_null(tl) && !(tools = chat_tools(tl, err))) goto fail;
    if (tools) json_object_set_new(chat, "tools", tools);
    if (chat_tool_choice(json_object_get(body, "tool_choice"), chat, err) < 0) goto fail;
    json_t *ss = json_object_get(body, "stop_sequences");
    if (ss && !json_is_null(ss) && !json_is_array(ss)) { ERR(err, 400, "stop_sequences: must be a list of strings"); goto fail; }
    if (ss && !json_is_null(ss)) json_object_set(chat, "stop", ss);
    json_t *kw = json_object_get(body, "chat_template_kwargs");
    if (kw && !json_is_null(kw) && !json_is_object(kw)) { ERR(err, 400, "chat_template_kwargs: must be an object"); goto fail; }
    json_t *kwargs = json_is_object(kw) ? json_deep_copy(kw) : json_object();
    json_object_set_new(chat, "chat_template_kwargs", kwargs);
    if (chat_thinking(body, kwargs, err) < 0) goto fail;
    return chat;
fail:
    json_decref(chat);
    return NULL;
}

/* ---- the output ---- */
typedef struct Msg {
    Gen g;
    ToolParser *tp;
    int cur;          /* the open block's kind (streaming), -1: none */
    int index;        /* content blocks begun */
    int n_calls;
    json_t *content;  /* whole: the content blocks */
    Buf *out;         /* streaming: this fill's bytes */
    int started, final_sent;
} Msg;

static json_t *usage(Gen *g) {
    return json_pack("{s:I, s:I}", "input_tokens", (json_int_t)g->prompts[0].n, "output_tokens",
                     (json_int_t)g->ch[0].n_out);
}

/* Arguments as a tool_use input (an object), or NULL when they are not one. */
static json_t *call_input(const ToolCall *c) {
    json_t *in = json_loads(c->arguments, 0, NULL);
    if (json_is_object(in)) return in;
    json_decref(in);
    return NULL;
}

/* A call whose arguments are no object cannot be a tool_use: it stays text, as an unparsed call does. */
static char *call_text(const ToolCall *c) {
    json_t *j = json_pack("{s:s}", "name", c->name);
    json_t *a = json_loads(c->arguments, JSON_DECODE_ANY, NULL);
    json_object_set_new(j, "arguments", a ? a : json_string(c->arguments));
    char *s = json_dumps(j, JSON_PRESERVE_ORDER | JSON_COMPACT);
    json_decref(j);
    char *out = NULL;
    if (s && asprintf(&out, "<tool_call>%s</tool_call>", s) < 0) out = NULL;
    free(s);
    return out;
}

static void ev(Msg *m, const char *name, json_t *j) { sse_event_named(m->out, name, j); }

static void close_block(Msg *m) {
    if (m->cur < 0) return;
    ev(m, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", m->index - 1));
    m->cur = -1;
}

static void open_block(Msg *m, int kind, json_t *block) {
    close_block(m);
    ev(m, "content_block_start", json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", m->index, "content_block", block));
    m->index++;
    m->cur = kind;
}

static void delta(Msg *m, json_t *d) {
    ev(m, "content_block_delta", json_pack("{s:s, s:i, s:o}", "type", "content_block_delta", "index", m->index - 1, "delta", d));
}

static void on_stream(void *ctx, BlockKind k, const char *text, size_t n, const ToolCall *call) {
    Msg *m = ctx;
    json_t *in = k == BLOCK_CALL ? call_input(call) : NULL;
    char *ct = k == BLOCK_CALL && !in ? call_text(call) : NULL;
    if (ct) { k = BLOCK_TEXT; text = ct; n = strlen(ct); }
    if (k == BLOCK_THINKING) {
        if (m->cur != BLOCK_THINKING) open_block(m, k, json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "", "signature", ""));
        delta(m, json_pack("{s:s, s:s%}", "type", "thinking_delta", "thinking", text, n));
    } else if (k == BLOCK_TEXT) {
        if (m->cur != BLOCK_TEXT) open_block(m, k, json_pack("{s:s, s:s}", "type", "text", "text", ""));
        delta(m, json_pack("{s:s, s:s%}", "type", "text_delta", "text", text, n));
    } else {
        char id[48];
        dialect_id(m->g.s, "toolu", id, sizeof id);
        open_block(m, k, json_pack("{s:s, s:s, s:s, s:{}}", "type", "tool_use", "id", id, "name", call->name, "input"));
        delta(m, json_pack("{s:s, s:s}", "type", "input_json_delta", "partial_json", call->arguments));
        close_block(m);
        m->n_calls++;
    }
    json_decref(in);
    free(ct);
}

static void on_whole(void *ctx, BlockKind k, const char *text, size_t n, const ToolCall *call) {
    Msg *m = ctx;
    json_t *in = k == BLOCK_CALL ? call_input(call) : NULL;
    char *ct = k == BLOCK_CALL && !in ? call_text(call) : NULL;
    if (ct) { k = BLOCK_TEXT; text = ct; n = strlen(ct); }
    size_t last_i = json_array_size(m->content);
    json_t *last = last_i ? json_array_get(m->content, last_i - 1) : NULL;
    const char *key = k == BLOCK_THINKING ? "thinking" : "text";
    if (k == BLOCK_CALL) {
        char id[48];
        dialect_id(m->g.s, "toolu", id, sizeof id);
        json_array_append_new(m->content, json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", id, "name",
                                                    call->name, "input", in));
        in = NULL;
        m->n_calls++;
    } else if (last && is(json_object_get(last, "type"), key)) {
        Buf b = {0};
        buf_puts(&b, json_string_value(json_object_get(last, key)));
        buf_append(&b, text, n);
        json_object_set_new(last, key, json_stringn(b.p, b.n));
        buf_free(&b);
    } else if (k == BLOCK_THINKING) {
        json_array_append_new(m->content, json_pack("{s:s, s:s%, s:s}", "type", "thinking", "thinking", text, n, "signature", ""));
    } else {
        json_array_append_new(m->content, json_pack("{s:s, s:s%}", "type", "text", "text", text, n));
    }
    json_decref(in);
    free(ct);
}

static const char *stop_reason(Msg *m) {
    Choice *c = &m->g.ch[0];
    if (!c->finish) return NULL;
    if (!strcmp(c->finish, "length")) return "max_tokens";
    if (!strcmp(c->finish, "abort")) return "pause_turn";
    if (m->n_calls) return "tool_use";
    return c->stop_str ? "stop_sequence" : "end_turn";
}

static json_t *message_head(Msg *m, json_t *content, const char *reason) {
    Choice *c = &m->g.ch[0];
    json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", m->g.id, "type", "message", "role", "assistant",
                          "model", m->g.s->model_name, "content", content);
    json_object_set_new(o, "stop_reason", reason ? json_string(reason) : json_null());
    json_object_set_new(o, "stop_sequence", reason && c->stop_str && !m->n_calls ? json_string(c->stop_str) : json_null());
    return o;
}

static int respond_whole(HttpReq *q, Msg *m) {
    Gen *g = &m->g;
    Err err;
    if (gen_failed(g, &err)) return http_send_err(q, &err);
    Choice *c = &g->ch[0];
    m->content = json_array();
    dialect_feed(m->tp, c->text.p ? c->text.p : "", c->text.n, 1, on_whole, m);
    json_t *o = message_head(m, m->content, stop_reason(m));
    json_object_set_new(o, "usage", usage(g));
    dialect_rl_fields(g, o);
    if (gen_failed(g, &err)) { /* never a 200 with a wrong or missing output */
        json_decref(o);
        return http_send_err(q, &err);
    }
    return http_send_json(q, 200, o);
}

static void stream_error(Msg *m) {
    Gen *g = &m->g;
    ev(m, "error", http_error_json_anthropic(g->fail.code ? g->fail.code : 500, g->fail.msg));
}

static int fill(void *ctx, Buf *out) {
    Msg *m = ctx;
    Gen *g = &m->g;
    Choice *c = &g->ch[0];
    m->out = out;
    if (m->final_sent) return 0;
    if (!m->started) {
        json_t *msg = message_head(m, json_array(), NULL);
        json_object_set_new(msg, "usage", json_pack("{s:I, s:i}", "input_tokens", (json_int_t)g->prompts[0].n, "output_tokens", 0));
        ev(m, "message_start", json_pack("{s:s, s:o}", "type", "message_start", "message", msg));
        ev(m, "ping", json_pack("{s:s}", "type", "ping"));
        m->started = 1;
        return 1;
    }
    for (;;) {
        if (gen_step(g, 50) < 0) return -1;
        size_t mark = out->n;
        gen_render_begin(g);
        if (gen_failed(g, NULL)) { stream_error(m); m->final_sent = 1; return 1; }
        size_t lim = gen_emit_limit(g, c);
        int final = c->done && lim == c->text.n;
        /* nothing decoded yet: text.p is NULL */
        dialect_feed(m->tp, c->text.p ? c->text.p + c->text_sent : "", lim - c->text_sent, final, on_stream, m);
        c->text_sent = lim;
        if (final) {
            close_block(m);
            json_t *d = json_object();
            const char *reason = stop_reason(m);
            json_object_set_new(d, "stop_reason", json_string(reason));
            json_object_set_new(d, "stop_sequence", c->stop_str && !m->n_calls ? json_string(c->stop_str) : json_null());
            json_t *md = json_pack("{s:s, s:o, s:o}", "type", "message_delta", "delta", d, "usage", usage(g));
            dialect_rl_fields(g, md); /* the RL fields of the whole output, on the last data event */
            ev(m, "message_delta", md);
            ev(m, "message_stop", json_pack("{s:s}", "type", "message_stop"));
            m->final_sent = 1;
        }
        if (gen_failed(g, NULL)) { out->n = mark; stream_error(m); m->final_sent = 1; return 1; }
        if (gen_keepalive(g, out) || out->n) return 1;
    }
}

static void msg_free(Msg *m) {
    tool_parser_free(m->tp);
    gen_free(&m->g);
    free(m);
}

static void done(void *ctx) { msg_free(ctx); }

/* Translate and prepare body: the chat body's params and prompt. */
static int prepare(Server *s, json_t *body, int need_max, GenParams *p, TokIds **prompt, int *tools_on, Err *err) {
    memset(p, 0, sizeof *p);
    json_t *chat = to_chat(body, need_max, err);
    if (!chat) return -1;
    int r = dialect_prepare(s, body, chat, RENAMES, N_RENAMES, p, prompt, tools_on, err);
    json_decref(chat);
    return r;
}

int api_messages(HttpReq *q, json_t *body) {
    Server *s = q->s;
    Err err = {0};
    GenParams p;
    TokIds *prompt = NULL;
    int tools_on = 0;
    if (http_check_model(s, body, &err) < 0) return http_send_err(q, &err);
    if (prepare(s, body, 1, &p, &prompt, &tools_on, &err) < 0) {
        gen_params_free(&p);
        return http_send_err(q, &err);
    }
    Msg *m = calloc(1, sizeof *m);
    if (!m) {
        gen_params_free(&p);
        prompts_free(prompt, 1);
        return http_send_error(q, 503, NULL, "out of memory");
    }
    m->cur = -1;
    m->tp = tool_parser_create(s->cfg.reasoning_parser, tools_on);
    json_t *tc = json_object_get(body, "tool_choice"); /* validated by prepare */
    if (json_is_true(json_object_get(tc, "disable_parallel_tool_use"))) tool_parser_max_calls(m->tp, 1);
    if (gen_start(&m->g, s, http_conn_fd(q), &p, prompt, 1, "msg", &err) < 0) {
        dialect_rename_err(&err, RENAMES, N_RENAMES);
        msg_free(m);
        return http_send_err(q, &err);
    }
    if (m->g.p.stream) return http_send_stream(q, fill, done, m);
    int r;
    while ((r = gen_step(&m->g, 100)) == 0) {}
    if (r < 0) {
        msg_free(m);
        return MHD_NO;
    }
    int ret = respond_whole(q, m);
    msg_free(m);
    return ret;
}

int api_messages_count_tokens(HttpReq *q, json_t *body) {
    Server *s = q->s;
    Err err = {0};
    GenParams p;
    TokIds *prompt = NULL;
    int tools_on = 0;
    if (http_check_model(s, body, &err) < 0) return http_send_err(q, &err);
    int r = prepare(s, body, 0, &p, &prompt, &tools_on, &err);
    gen_params_free(&p);
    if (r < 0) return http_send_err(q, &err);
    json_int_t n = (json_int_t)prompt->n;
    prompts_free(prompt, 1);
    return http_send_json(q, 200, json_pack("{s:I}", "input_tokens", n));
}
