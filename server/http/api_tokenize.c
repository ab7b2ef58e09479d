/*
 * api_tokenize.c - GET /v1/models, POST /tokenize and POST /detokenize in
 * vLLM's shapes: {"prompt"} or {"messages"} in, {"count", "max_model_len",
 * "tokens"[, "token_strs"]} out; {"tokens"} in, {"prompt"} out.
 */
#include <stdlib.h>
#include <string.h>

#include "gen.h"
#include "server.h"

static json_t *model_card(Server *s) {
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(s->model_name));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer(s->created));
    json_object_set_new(m, "owned_by", json_string("sampler"));
    json_object_set_new(m, "root", json_string(s->model_dir));
    json_object_set_new(m, "parent", json_null());
    json_object_set_new(m, "max_model_len", json_integer(s->max_model_len));
    return m;
}

int api_models(HttpReq *q, json_t *body) {
    Server *s = q->s;
    if (!strncmp(q->url, "/v1/models/", 11)) {
        if (strcmp(q->url + 11, s->model_name) == 0) return http_send_json(q, 200, model_card(s));
        json_t *card = lora_model_card(s, q->url + 11);
        if (!card) return http_send_error(q, 404, "model", "The model `%s` does not exist.", q->url + 11);
        return http_send_json(q, 200, card);
    }
    json_t *o = json_object(), *d = json_array();
    json_array_append_new(d, model_card(s));
    lora_model_cards(s, d); /* each with "parent": the base model */
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "data", d);
    return http_send_json(q, 200, o);
}

int api_tokenize(HttpReq *q, json_t *body) {
    Server *s = q->s;
    Err err = {0};
    if (http_check_model(s, body, &err) < 0) return http_send_err(q, &err);
    int strs = 0, add_special = 1, tools_on;
    if (rp_bool(body, "return_token_strs", &strs, &err) < 0 || rp_bool(body, "add_special_tokens", &add_special, &err) < 0)
        return http_send_err(q, &err);
    TokIds *ids = NULL;
    json_t *prompt = json_object_get(body, "prompt");
    if (json_object_get(body, "messages")) {
        if (api_chat_prompt(s, body, &ids, &tools_on, &err) < 0) return http_send_err(q, &err);
    } else {
        if (!json_is_string(prompt)) return http_send_error(q, 400, "prompt", "prompt: must be a string (or send messages)");
        ids = calloc(1, sizeof *ids);
        if (tokenizer_encode(s->tok, json_string_value(prompt), json_string_length(prompt), add_special, ids, &err) < 0) {
            prompts_free(ids, 1);
            return http_send_err(q, &err);
        }
    }
    json_t *o = json_object(), *t = json_array(), *ts = strs ? json_array() : json_null();
    for (size_t k = 0; k < ids->n; k++) {
        json_array_append_new(t, json_integer(ids->ids[k]));
        if (strs) {
            const char *x = tokenizer_id_to_token(s->tok, ids->ids[k]);
            json_array_append_new(ts, x ? json_string(x) : json_null());
        }
    }
    json_object_set_new(o, "count", json_integer((json_int_t)ids->n));
    json_object_set_new(o, "max_model_len", json_integer(s->max_model_len));
    json_object_set_new(o, "tokens", t);
    json_object_set_new(o, "token_strs", ts);
    prompts_free(ids, 1);
    return http_send_json(q, 200, o);
}

int api_detokenize(HttpReq *q, json_t *body) {
    Server *s = q->s;
    Err err = {0};
    if (http_check_model(s, body, &err) < 0) return http_send_err(q, &err);
    json_t *t = json_object_get(body, "tokens");
    if (!json_is_array(t)) return http_send_error(q, 400, "tokens", "tokens: must be a list of token ids");
    size_t n = json_array_size(t), k;
    int32_t *ids = malloc(sizeof(int32_t) * (n ? n : 1));
    json_t *x;
    json_array_foreach(t, k, x) {
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= s->vocab) {
            free(ids);
            return http_send_error(q, 400, "tokens", "tokens: ids must be integers in [0, %d)", s->vocab);
        }
        ids[k] = (int32_t)json_integer_value(x);
    }
    char *text = NULL;
    size_t len;
    int rc = tokenizer_decode(s->tok, ids, n, false, &text, &len, &err);
    free(ids);
    if (rc < 0) return http_send_err(q, &err);
    json_t *o = json_object();
    json_object_set_new(o, "prompt", json_stringn(text, len));
    free(text);
    return http_send_json(q, 200, o);
}
