/*
 * request_parse.c - request body validation into GenParams (request_parse.h).
 */
#include "request_parse.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int rp_bool(json_t *o, const char *key, int *v, Err *err) {
    json_t *j = json_object_get(o, key);
    if (!j || json_is_null(j)) return 0;
    ENSURE(err, json_is_boolean(j), 400, "%s: must be a boolean", key);
    *v = json_is_true(j);
    return 1;
}

int rp_int(json_t *o, const char *key, long long lo, long long hi, long long *v, Err *err) {
    json_t *j = json_object_get(o, key);
    if (!j || json_is_null(j)) return 0;
    long long x;
    if (json_is_integer(j)) x = json_integer_value(j);
    else if (json_is_real(j) && json_real_value(j) == floor(json_real_value(j)) && fabs(json_real_value(j)) < 9e15)
        x = (long long)json_real_value(j);
    else return ERR(err, 400, "%s: must be an integer", key);
    ENSURE(err, x >= lo && x <= hi, 400, "%s: must be in [%lld, %lld], got %lld", key, lo, hi, x);
    *v = x;
    return 1;
}

int rp_num(json_t *o, const char *key, double lo, double hi, double *v, Err *err) {
    json_t *j = json_object_get(o, key);
    if (!j || json_is_null(j)) return 0;
    ENSURE(err, json_is_number(j), 400, "%s: must be a number", key);
    double x = json_number_value(j);
    ENSURE(err, isfinite(x) && x >= lo && x <= hi, 400, "%s: must be in [%g, %g], got %g", key, lo, hi, x);
    *v = x;
    return 1;
}

void gen_params_free(GenParams *p) {
    free(p->bias_ids);
    free(p->bias);
    for (int i = 0; i < p->n_stop; i++) free(p->stop[i]);
    memset(p, 0, sizeof *p);
}

static int parse_stop(json_t *body, GenParams *p, Err *err) {
    json_t *s = json_object_get(body, "stop");
    if (!s || json_is_null(s)) return 0;
    if (json_is_string(s)) {
        if (json_string_length(s)) p->stop[p->n_stop++] = strdup(json_string_value(s));
    } else {
        ENSURE(err, json_is_array(s), 400, "stop: must be a string or a list of strings");
        ENSURE(err, json_array_size(s) <= GEN_MAX_STOP, 400, "stop: at most %d stop strings", GEN_MAX_STOP);
        size_t i;
        json_t *x;
        json_array_foreach(s, i, x) {
            ENSURE(err, json_is_string(x), 400, "stop: must be a string or a list of strings");
            if (json_string_length(x)) p->stop[p->n_stop++] = strdup(json_string_value(x));
        }
    }
    for (int i = 0; i < p->n_stop; i++) {
        size_t k = strlen(p->stop[i]);
        if (k > p->stop_maxlen) p->stop_maxlen = k;
    }
    return 0;
}

static int parse_stop_ids(json_t *body, int vocab, GenParams *p, Err *err) {
    json_t *s = json_object_get(body, "stop_token_ids");
    if (!s || json_is_null(s)) return 0;
    ENSURE(err, json_is_array(s), 400, "stop_token_ids: must be a list of token ids");
    ENSURE(err, json_array_size(s) <= SAMPLING_MAX_STOP_IDS, 400, "stop_token_ids: at most %d ids", SAMPLING_MAX_STOP_IDS);
    size_t i;
    json_t *x;
    json_array_foreach(s, i, x) {
        ENSURE(err, json_is_integer(x) && json_integer_value(x) >= 0 && json_integer_value(x) < vocab, 400,
               "stop_token_ids: ids must be integers in [0, %d)", vocab);
        p->sp.stop_ids[p->sp.n_stop_ids++] = (int32_t)json_integer_value(x);
    }
    return 0;
}

static int parse_bias(json_t *body, int vocab, GenParams *p, Err *err) {
    json_t *b = json_object_get(body, "logit_bias");
    if (!b || json_is_null(b)) return 0;
    ENSURE(err, json_is_object(b), 400, "logit_bias: must be an object mapping token ids to biases");
    size_t n = json_object_size(b);
    p->bias_ids = malloc(sizeof(int32_t) * (n ? n : 1));
    p->bias = malloc(sizeof(float) * (n ? n : 1));
    ENSURE(err, p->bias_ids && p->bias, 500, "logit_bias: out of memory");
    const char *k;
    json_t *v;
    int i = 0;
    json_object_foreach(b, k, v) {
        char *end;
        long id = strtol(k, &end, 10);
        ENSURE(err, *k && !*end && id >= 0 && id < vocab, 400, "logit_bias: key '%s' is not a token id in [0, %d)", k, vocab);
        ENSURE(err, json_is_number(v), 400, "logit_bias: value of '%s' must be a number", k);
        double x = json_number_value(v);
        ENSURE(err, x >= -100 && x <= 100, 400, "logit_bias: value of '%s' must be in [-100, 100]", k);
        p->bias_ids[i] = (int32_t)id;
        p->bias[i++] = (float)x;
    }
    p->sp.n_logit_bias = i;
    p->sp.logit_bias_ids = p->bias_ids;
    p->sp.logit_bias = p->bias;
    return 0;
}

int request_parse_gen(json_t *body, int chat, int vocab, int max_n, int max_logprobs, GenParams *p, Err *err) {
    memset(p, 0, sizeof *p);
    sampling_params_default(&p->sp);
    p->n = 1;
    p->logprobs = -1;
    p->prompt_logprobs = -1;
    p->skip_special = 1;
    long long iv;
    double dv;
    int r;
#define TRY(x) do { if ((r = (x)) < 0) return r; } while (0) /* r: 1 when the field was set */
    TRY(rp_int(body, "max_tokens", 1, 1ll << 30, &iv, err));
    if (r) p->sp.max_tokens = (int)iv, p->max_tokens_set = 1;
    TRY(rp_int(body, "max_completion_tokens", 1, 1ll << 30, &iv, err));
    if (r) p->sp.max_tokens = (int)iv, p->max_tokens_set = 1;
    if (chat && !p->max_tokens_set) p->sp.max_tokens = 0; /* the rest of the context */
    dv = 1;
    TRY(rp_num(body, "temperature", 0, 100, &dv, err));
    p->sp.temperature = (float)dv;
    dv = 1;
    TRY(rp_num(body, "top_p", 0, 1, &dv, err));
    ENSURE(err, dv > 0, 400, "top_p: must be in (0, 1]");
    p->sp.top_p = (float)dv;
    iv = 0;
    TRY(rp_int(body, "top_k", -1, 1ll << 31, &iv, err));
    p->sp.top_k = iv > 0 ? (int)iv : 0;
    dv = 0;
    TRY(rp_num(body, "min_p", 0, 1, &dv, err));
    p->sp.min_p = (float)dv;
    dv = 0;
    TRY(rp_num(body, "presence_penalty", -2, 2, &dv, err));
    p->sp.presence_penalty = (float)dv;
    dv = 0;
    TRY(rp_num(body, "frequency_penalty", -2, 2, &dv, err));
    p->sp.frequency_penalty = (float)dv;
    dv = 1;
    TRY(rp_num(body, "repetition_penalty", 1e-6, 10, &dv, err));
    p->sp.repetition_penalty = (float)dv;
    iv = 1;
    TRY(rp_int(body, "n", 1, max_n, &iv, err));
    p->n = (int)iv;
    TRY(rp_int(body, "best_of", 1, max_n, &iv, err));
    ENSURE(err, !r || iv == p->n, 400, "best_of: only best_of == n is supported");
    TRY(rp_int(body, "seed", INT64_MIN, INT64_MAX, &iv, err));
    if (r) p->sp.has_seed = 1, p->sp.seed = (uint64_t)iv;
    iv = 0;
    TRY(rp_int(body, "min_tokens", 0, 1ll << 30, &iv, err));
    p->sp.min_tokens = (int)iv;
    TRY(rp_bool(body, "ignore_eos", &p->sp.ignore_eos, err));
    TRY(rp_bool(body, "skip_special_tokens", &p->skip_special, err));
    TRY(rp_bool(body, "spaces_between_special_tokens", &p->spaces_between_special, err));
    TRY(rp_bool(body, "include_stop_str_in_output", &p->include_stop_str, err));
    TRY(parse_stop(body, p, err));
    TRY(parse_stop_ids(body, vocab, p, err));
    TRY(parse_bias(body, vocab, p, err));
    if (chat) {
        int lp = 0;
        TRY(rp_bool(body, "logprobs", &lp, err));
        iv = 0;
        TRY(rp_int(body, "top_logprobs", 0, max_logprobs, &iv, err));
        ENSURE(err, !r || lp || iv == 0, 400, "top_logprobs: needs logprobs: true");
        p->logprobs = lp ? (int)iv : -1;
    } else {
        json_t *l = json_object_get(body, "logprobs");
        if (json_is_boolean(l)) return ERR(err, 400, "logprobs: must be an integer (number of alternatives) for completions");
        TRY(rp_int(body, "logprobs", 0, max_logprobs, &iv, err));
        if (r) p->logprobs = (int)iv;
        TRY(rp_bool(body, "echo", &p->echo, err));
    }
    TRY(rp_int(body, "prompt_logprobs", 0, max_logprobs, &iv, err));
    if (r) p->prompt_logprobs = (int)iv;
    TRY(rp_bool(body, "stream", &p->stream, err));
    json_t *so = json_object_get(body, "stream_options");
    if (so && !json_is_null(so)) {
        ENSURE(err, json_is_object(so), 400, "stream_options: must be an object");
        TRY(rp_bool(so, "include_usage", &p->include_usage, err));
        TRY(rp_bool(so, "continuous_usage_stats", &p->continuous_usage, err));
    }
    TRY(rp_bool(body, "return_token_ids", &p->ret_token_ids, err));
    TRY(rp_bool(body, "return_sampler_logprobs", &p->ret_sampler_lp, err));
    TRY(rp_bool(body, "return_raw_logprobs", &p->ret_raw_lp, err));
    TRY(rp_bool(body, "return_sampling_mask", &p->ret_mask, err));
    TRY(rp_bool(body, "return_routed_experts", &p->ret_experts, err));
#undef TRY
    return 0;
}

void prompts_free(TokIds *p, int n) {
    if (!p) return;
    for (int i = 0; i < n; i++) tok_ids_free(&p[i]);
    free(p);
}

static int ids_from_array(json_t *a, int vocab, TokIds *out, Err *err) {
    size_t i;
    json_t *x;
    ENSURE(err, json_array_size(a) > 0, 400, "prompt: a token id list must not be empty");
    out->ids = malloc(sizeof(int32_t) * json_array_size(a));
    ENSURE(err, out->ids, 500, "prompt: out of memory");
    out->cap = json_array_size(a);
    json_array_foreach(a, i, x) {
        ENSURE(err, json_is_integer(x), 400, "prompt: token ids must be integers");
        json_int_t v = json_integer_value(x);
        ENSURE(err, v >= 0 && v < vocab, 400, "prompt: token id %lld is out of range [0, %d)", (long long)v, vocab);
        out->ids[out->n++] = (int32_t)v;
    }
    return 0;
}

static int ids_from_text(const Tokenizer *t, json_t *s, TokIds *out, Err *err) {
    ENSURE(err, json_string_length(s) > 0, 400, "prompt: must not be empty");
    if (tokenizer_encode(t, json_string_value(s), json_string_length(s), true, out, err) < 0) return -1;
    ENSURE(err, out->n > 0, 400, "prompt: encodes to no tokens");
    return 0;
}

int request_parse_prompts(json_t *prompt, const Tokenizer *t, int vocab, TokIds **out, int *n, Err *err) {
    *out = NULL;
    *n = 0;
    ENSURE(err, prompt && !json_is_null(prompt), 400, "prompt: is required");
    int m = json_is_array(prompt) ? (int)json_array_size(prompt) : 1;
    ENSURE(err, json_is_string(prompt) || json_is_array(prompt), 400,
           "prompt: must be a string, a list of strings, a list of token ids or a list of lists");
    ENSURE(err, m > 0, 400, "prompt: must not be empty");
    json_t *first = json_is_array(prompt) ? json_array_get(prompt, 0) : prompt;
    int flat_ids = json_is_array(prompt) && json_is_integer(first);
    if (flat_ids) m = 1;
    ENSURE(err, m <= 1024, 400, "prompt: at most 1024 prompts per request");
    TokIds *p = calloc((size_t)m, sizeof *p);
    ENSURE(err, p, 500, "prompt: out of memory");
    int rc = 0;
    if (json_is_string(prompt)) rc = ids_from_text(t, prompt, &p[0], err);
    else if (flat_ids) rc = ids_from_array(prompt, vocab, &p[0], err);
    else {
        for (int i = 0; i < m && rc == 0; i++) {
            json_t *x = json_array_get(prompt, (size_t)i);
            if (json_is_string(x)) rc = ids_from_text(t, x, &p[i], err);
            else if (json_is_array(x)) rc = ids_from_array(x, vocab, &p[i], err);
            else rc = ERR(err, 400, "prompt: must be a string, a list of strings, a list of token ids or a list of lists");
        }
    }
    if (rc < 0) { prompts_free(p, m); return rc; }
    for (int i = 0; i < m; i++)
        for (size_t k = 0; k < p[i].n; k++)
            if (p[i].ids[k] >= vocab) {
                int bad = p[i].ids[k];
                prompts_free(p, m);
                return ERR(err, 400, "prompt: the tokenizer produced id %d outside the model's vocab (%d)", bad, vocab);
            }
    *out = p;
    *n = m;
    return 0;
}
