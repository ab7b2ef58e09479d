/*
 * api_tokenizer_info.c - GET /tokenizer_info, vLLM's shape (its
 * --enable-tokenizer-info-endpoint route; served here always, under the API
 * key): the tokenizer's configuration (tokenizer_config.json of the tokenizer
 * directory, chat_template included) with "tokenizer_class" always present.
 * Read at each call (a small local file, the size of the configuration), so
 * it is the tokenizer that is loaded only if nobody replaced the file since.
 *
 * Not here: tokenizing (api_tokenize.c), the tokenizer itself (tokenizer/).
 */
#include <stdio.h>
#include <string.h>

#include "server.h"

int api_tokenizer_info(HttpReq *q, json_t *body) {
    (void)body;
    Server *s = q->s;
    const char *dir = s->cfg.tokenizer_dir ? s->cfg.tokenizer_dir : s->model_dir;
    char path[1200];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    if (!o || !json_is_object(o)) {
        json_decref(o);
        o = json_object(); /* a tokenizer.json alone: no configuration to report */
    }
    if (!json_is_string(json_object_get(o, "tokenizer_class")))
        json_object_set_new(o, "tokenizer_class", json_string("PreTrainedTokenizerFast"));
    return http_send_json(q, 200, o);
}
