/*
 * dialect.c - the agent dialects' shared pieces (dialect.h): the translated
 * chat body validated and rendered with chat's code, the token-in path, the
 * ordered block feed over the Qwen3 parser, the RL fields of one choice.
 * Not here: either dialect's shapes (api_responses.c, api_messages.c).
 */
#include "dialect.h"
#include "structured.h"

#include <stdlib.h>
#include <string.h>

void dialect_rename_err(Err *err, const DialectRename *ren, int n_ren) {
    for (int i = 0; i < n_ren; i++) {
        size_t k = strlen(ren[i].chat_name);
        if (strncmp(err->msg, ren[i].chat_name, k) != 0 || err->msg[k] != ':') continue;
        char rest[sizeof err->msg];
        snprintf(rest, sizeof rest, "%s", err->msg + k);
        snprintf(err->msg, sizeof err->msg, "%s%s", ren[i].dialect_name, rest);
        return;
    }
}

/* "prompt_token_ids" of body -> *out (a fresh TokIds), 0 when absent. */
static int token_in(Server *s, json_t *body, TokIds **out, Err *err) {
    json_t *a = json_object_get(body, "prompt_token_ids");
    if (!a || json_is_null(a)) return 0;
    ENSURE(err, json_is_array(a) && json_array_size(a) > 0, 400, "prompt_token_ids: must be a non-empty list of token ids");
    TokIds *p = calloc(1, sizeof *p);
    ENSURE(err, p, 500, "out of memory");
    p->ids = malloc(sizeof(int32_t) * json_array_size(a));
    if (!p->ids) { free(p); return ERR(err, 500, "out of memory"); }
    p->cap = json_array_size(a);
    size_t i;
    json_t *x;
    json_array_foreach(a, i, x) {
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= s->vocab) {
            prompts_free(p, 1);
            return ERR(err, 400, "prompt_token_ids: ids must be integers in [0, %d)", s->vocab);
        }
        p->ids[p->n++] = (int32_t)json_integer_value(x);
    }
    *out = p;
    return 1;
}

/* The one place the dialects' forced tool choice is refused, until chat's
 * constrained decoding for "required" / a named function is wired here: the
 * chat body already carries chat's form of it ("required", {"type":
 * "function", "function": {"name"}}), so wiring it is passing it on. */
int dialect_prepare(Server *s, json_t *body, json_t *chat, const DialectRename *ren, int n_ren, GenParams *p,
                    TokIds **prompt, int *tools_on, Err *err) {
    *prompt = NULL;
    json_t *pl = json_object_get(chat, "prompt_logprobs");
    ENSURE(err, !pl || json_is_null(pl), 400, "prompt_logprobs: not served on this route (it is on /v1/completions and "
           "/v1/chat/completions); the sampled tokens' log-probs: return_sampler_logprobs");
    json_object_del(chat, "n");
    json_object_del(chat, "best_of");
    if (request_parse_gen(chat, 1, s->vocab, s->cfg.max_n, s->cfg.max_logprobs, p, err) < 0 ||
        api_chat_prompt(s, chat, prompt, tools_on, err) < 0) {
        dialect_rename_err(err, ren, n_ren);
        return -1;
    }
    /* a forced tool choice (chat's "required" / named function, converted from
     * the dialect's) becomes a grammar over the tool schemas, as on chat */
    if (structured_parse(s, chat, 1, *tools_on, p, err) < 0) {
        dialect_rename_err(err, ren, n_ren);
        prompts_free(*prompt, 1);
        *prompt = NULL;
        return -1;
    }
    TokIds *ids = NULL;
    int r = token_in(s, body, &ids, err);
    if (r < 0) {
        prompts_free(*prompt, 1);
        *prompt = NULL;
        return -1;
    }
    if (r > 0) {
        prompts_free(*prompt, 1);
        *prompt = ids;
    }
    return 0;
}

/* What one take of the parser released, in output order. */
static void take(ToolParser *tp, BlockFn fn, void *ctx) {
    Buf content = {0}, reasoning = {0};
    ToolCall *calls;
    int nc = tool_parser_take(tp, &content, &reasoning, &calls);
    if (reasoning.n) fn(ctx, BLOCK_THINKING, reasoning.p, reasoning.n, NULL);
    if (content.n) fn(ctx, BLOCK_TEXT, content.p, content.n, NULL);
    for (int k = 0; k < nc; k++) {
        fn(ctx, BLOCK_CALL, NULL, 0, &calls[k]);
        tool_call_free(&calls[k]);
    }
    free(calls);
    buf_free(&content);
    buf_free(&reasoning);
}

void dialect_feed(ToolParser *tp, const char *s, size_t n, int finish, BlockFn fn, void *ctx) {
    size_t i = 0;
    while (i < n) {
        const char *gt = memchr(s + i, '>', n - i);
        size_t k = gt ? (size_t)(gt - (s + i)) + 1 : n - i;
        tool_parser_push(tp, s + i, k);
        take(tp, fn, ctx);
        i += k;
    }
    if (finish) {
        tool_parser_finish(tp);
        take(tp, fn, ctx);
    }
}

int dialect_rl_fields(Gen *g, json_t *obj) {
    GenParams *p = &g->p;
    if (!(p->ret_token_ids || p->ret_sampler_lp || p->ret_raw_lp || p->ret_mask || p->ret_experts)) return 0;
    Choice *c = &g->ch[0];
    if (p->ret_token_ids) {
        json_t *a = json_array();
        for (size_t k = 0; k < g->prompts[0].n; k++) json_array_append_new(a, json_integer(g->prompts[0].ids[k]));
        json_object_set_new(obj, "prompt_token_ids", a);
    }
    gen_rl_fields(g, c, 0, c->n_out, obj);
    json_object_set_new(obj, "weight_versions", gen_weight_versions(g, c));
    json_object_set_new(obj, "weight_version",
                        json_integer((json_int_t)server_weight_version(g->s, engine_weight_version(g->s->eng))));
    return 1;
}

/* The id of text when it is exactly one token, else -1. */
static int32_t single_token(Gen *g, const char *text) {
    TokIds t = {0};
    Err e = {0};
    int32_t id = -1;
    if (tokenizer_encode(g->s->tok, text, strlen(text), false, &t, &e) == 0 && t.n == 1) id = t.ids[0];
    tok_ids_free(&t);
    return id;
}

int dialect_reasoning_tokens(Gen *g) {
    Choice *c = &g->ch[0];
    if (!g->s->cfg.reasoning_parser || c->n_out == 0) return 0;
    int32_t open = single_token(g, "<think>"), close = single_token(g, "</think>");
    EngineSeqView v;
    engine_request_seq(c->r, c->seq, &v);
    if (open < 0 || v.tokens[0].token != open) return 0;
    for (int k = 0; k < c->n_out; k++)
        if (v.tokens[k].token == close) return k + 1;
    return c->n_out;
}

void dialect_id(Server *s, const char *prefix, char *out, size_t cap) {
    server_new_id(s, prefix, out, cap);
    char *dash = strchr(out, '-');
    if (dash) *dash = '_';
}

char *dialect_text(json_t *content, const char *const *types, const char *what, Err *err) {
    if (json_is_string(content)) return strdup(json_string_value(content));
    if (!json_is_array(content)) {
        ERR(err, 400, "%s: must be a string or a list of text parts", what);
        return NULL;
    }
    Buf b = {0};
    size_t k;
    json_t *part;
    json_array_foreach(content, k, part) {
        json_t *ty = json_object_get(part, "type"), *t = json_object_get(part, "text");
        int ok = 0;
        for (int i = 0; types[i] && json_is_string(ty); i++) ok |= !strcmp(json_string_value(ty), types[i]);
        if (!ok || !json_is_string(t)) {
            buf_free(&b);
            ERR(err, 400, "%s[%zu]: must be a text part {\"type\": \"%s\", \"text\": ...} (%s)", what, k, types[0],
                json_is_string(ty) ? json_string_value(ty) : "no type");
            return NULL;
        }
        if (k) buf_puts(&b, "\n");
        buf_append(&b, json_string_value(t), json_string_length(t));
    }
    char *out = strndup(b.p ? b.p : "", b.n);
    buf_free(&b);
    return out;
}
