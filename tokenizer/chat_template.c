/*
 * chat_template.c - the public face of the Jinja interpreter, and
 * transformers' apply_chat_template on top of it: the same context
 * (messages without None-valued keys, reasoning_content aliases, tools,
 * documents, add_generation_prompt, the named special tokens, kwargs).
 * Not here: the interpreter itself (jinja_*.c).
 */
#include <stdlib.h>

#include "jinja.h"
#include "tok_internal.h"

struct ChatTemplate { Node *root; };

ChatTemplate *chat_template_compile(const char *source, Err *e) {
    Node *root = jinja_parse(source, e);
    if (!root) return NULL;
    ChatTemplate *t = xcalloc(1, sizeof *t);
    t->root = root;
    return t;
}

void chat_template_free(ChatTemplate *t) {
    if (!t) return;
    jinja_node_free(t->root);
    free(t);
}

int chat_template_render(const ChatTemplate *t, json_t *context, char **out, Err *e) {
    return jinja_render(t->root, context, out, e);
}

/* transformers' _normalize_chat_messages + _alias_reasoning_fields. */
static json_t *normalize_messages(json_t *messages) {
    json_t *out = json_array(), *m;
    size_t i;
    json_array_foreach(messages, i, m) {
        if (!json_is_object(m)) { json_array_append(out, m); continue; }
        json_t *c = json_object(), *v;
        const char *k;
        json_object_foreach(m, k, v) if (!json_is_null(v)) json_object_set(c, k, v);
        static const char *fields[] = {"reasoning_content", "thinking", "reasoning"};
        json_t *reason = NULL;
        for (int f = 0; f < 3 && !reason; f++) reason = json_object_get(c, fields[f]);
        if (reason) {
            json_t *a = json_object();
            json_object_set(a, "thinking", reason);
            json_object_update(a, c);
            json_object_set(a, "reasoning_content", reason);
            json_decref(c);
            c = a;
        }
        json_array_append_new(out, c);
    }
    return out;
}

int tokenizer_apply_chat_template(const Tokenizer *t, json_t *messages, json_t *tools,
                                  bool add_generation_prompt, json_t *kwargs, char **out, Err *e) {
    if (!t->chat) return ERR(e, 400, "this model's tokenizer_config.json has no chat_template");
    return tokenizer_apply_template(t, t->chat, messages, tools, add_generation_prompt, kwargs, out, e);
}

int tokenizer_apply_template(const Tokenizer *t, const ChatTemplate *tpl, json_t *messages, json_t *tools,
                             bool add_generation_prompt, json_t *kwargs, char **out, Err *e) {
    if (!json_is_array(messages) || !json_array_size(messages)) return ERR(e, 400, "messages must be a non-empty array");
    for (size_t i = 0; i < json_array_size(messages); i++)
        if (!json_is_object(json_array_get(messages, i))) return ERR(e, 400, "messages[%zu] is not an object", i);
    json_t *ctx = json_object();
    const char *names[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
    const char *vals[] = {t->bos, t->eos, t->unk, t->pad};
    for (int i = 0; i < 4; i++)
        if (vals[i]) json_object_set_new(ctx, names[i], json_string(vals[i]));
    if (kwargs && json_is_object(kwargs)) json_object_update(ctx, kwargs);
    json_object_set_new(ctx, "messages", normalize_messages(messages));
    json_object_set(ctx, "tools", tools ? tools : json_null());
    json_object_set_new(ctx, "documents", json_null());
    json_object_set_new(ctx, "add_generation_prompt", json_boolean(add_generation_prompt));
    int rc = chat_template_render(tpl, ctx, out, e);
    json_decref(ctx);
    return rc;
}
