/*
 * request_parse.c - request body validation into GenParams (request_parse.h):
 * the table of the generation endpoints' fields (GEN_FIELDS) read by one
 * generic loop, and the prompt forms of /v1/completions. Not here: chat
 * messages and templates (api_chat.c), limits that depend on the prompt (gen.c).
 */
#include "request_parse.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

int rp_bool(json_t *o, const char *key, int *v, Err *err) {
    json_t *j = json_object_get(o, key);
    if (!j || json_is_null(j)) return 0;
    ENSURE(err, json_is_boolean(j), 400, "%s: must be a boolean", key);
    *v = json_is_true(j);
    return 1;
}

/* Optional typed fields: 0 when absent or null (leaving *v), 1 when set, <0 with a 400. */
static int rp_int(json_t *o, const char *key, long long lo, long long hi, long long *v, Err *err) {
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

static int rp_num(json_t *o, const char *key, double lo, double hi, double *v, Err *err) {
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
    free(p->allowed_ids);
    for (int i = 0; i < p->n_bad_words; i++) free(p->bad_words[i]);
    free(p->bad_off);
    free(p->bad_ids);
    for (int i = 0; i < p->n_stop; i++) free(p->stop[i]);
    if (p->grammar) grammar_unref(p->grammar);
    memset(p, 0, sizeof *p);
}

/* ---- the request fields ----
 * Every field of the two generation endpoints is one row of GEN_FIELDS, in
 * the order they are validated (the first bad one is the error): its JSON name,
 * type and range, the value it takes when absent, where it goes
 * (offsetof into GenParams: sp.* is the engine's SamplingParams) and any
 * further rule with its message. Numbers, integers and booleans are read by
 * parse_fields from the row alone; the few fields with a shape of their own
 * (stop strings, token-id lists, logit_bias, the two meanings of logprobs) are
 * rows that name their parser. A new sampling parameter is a SamplingParams
 * field, a row here and its use in sampling.c. Messages start with the name
 * ("temperature: must be in [0, 100], got 101"): http.c makes it the "param". */

typedef struct GenCtx { int chat, vocab, max_n, max_logprobs; } GenCtx;

typedef enum { F_INT, F_NUM, F_BOOL, F_OBJECT, F_FN, F_REFUSE } FieldKind;
typedef enum { FOR_BOTH, FOR_CHAT, FOR_COMPLETIONS } FieldFor;
typedef enum { HI_FIXED, HI_MAX_N, HI_MAX_LOGPROBS } FieldHi; /* an integer's upper bound: the server's limits */
typedef enum { X_NONE, X_ABOVE_LO, X_EQUALS_N } FieldRule;  /* a rule past the closed range */
typedef enum { DST_NONE, DST_INT, DST_FLOAT, DST_U64 } FieldDst;

typedef struct GenField {
    const char *name;     /* JSON key; an alias is a row of its own with the same destination (the later wins) */
    FieldKind kind;
    FieldFor only;
    long long ilo, ihi;   /* F_INT: closed range */
    FieldHi hi_from;      /* F_INT: ihi replaced by a server limit */
    double lo, hi;        /* F_NUM: closed range */
    FieldRule rule;       /* X_ABOVE_LO (F_NUM): value > lo; X_EQUALS_N (F_INT): value == the n parsed before */
    const char *rule_msg; /* the message when the rule fails (after "name: ") */
    int has_def;          /* when absent or null: write def (else the destination keeps its initial value) */
    double def;
    FieldDst dst_type;    /* how the value is stored at dst */
    size_t dst;           /* offsetof(GenParams, ...) */
    int has_set;          /* given: the int at set becomes 1 */
    size_t set;
    int (*parse)(json_t *o, const GenCtx *c, GenParams *p, Err *err); /* F_FN: reads its field(s) from o */
    const struct GenField *sub;                                      /* F_OBJECT: the fields inside */
    size_t n_sub;
} GenField;

#define DST_OF(m) _Generic(((GenParams *)0)->m, int: DST_INT, float: DST_FLOAT, uint64_t: DST_U64)
#define TO(m) .dst_type = DST_OF(m), .dst = offsetof(GenParams, m)
#define SETS(m) .has_set = 1, .set = offsetof(GenParams, m)
#define DEF(v) .has_def = 1, .def = (v)
#define INT(key, a, b) .name = key, .kind = F_INT, .ilo = (a), .ihi = (b)
#define NUM(key, a, b) .name = key, .kind = F_NUM, .lo = (a), .hi = (b)
#define BOOL(key) .name = key, .kind = F_BOOL
#define FN(key, fn) .name = key, .kind = F_FN, .parse = fn
/* a vLLM field this server does not implement: 400 naming it unless absent, null or false */
#define REFUSE(key, why) .name = key, .kind = F_REFUSE, .rule_msg = why

static int parse_stop(json_t *body, const GenCtx *c, GenParams *p, Err *err) {
    (void)c;
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

static int parse_stop_ids(json_t *body, const GenCtx *c, GenParams *p, Err *err) {
    json_t *s = json_object_get(body, "stop_token_ids");
    if (!s || json_is_null(s)) return 0;
    ENSURE(err, json_is_array(s), 400, "stop_token_ids: must be a list of token ids");
    ENSURE(err, json_array_size(s) <= SAMPLING_MAX_STOP_IDS, 400, "stop_token_ids: at most %d ids", SAMPLING_MAX_STOP_IDS);
    size_t i;
    json_t *x;
    json_array_foreach(s, i, x) {
        ENSURE(err, json_is_integer(x) && json_integer_value(x) >= 0 && json_integer_value(x) < c->vocab, 400,
               "stop_token_ids: ids must be integers in [0, %d)", c->vocab);
        p->sp.stop_ids[p->sp.n_stop_ids++] = (int32_t)json_integer_value(x);
    }
    return 0;
}

static int parse_bias(json_t *body, const GenCtx *c, GenParams *p, Err *err) {
    int vocab = c->vocab;
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

/* vLLM's allowed_token_ids: a non-empty list of ids in the vocabulary; only
 * these may be sampled (sampling.h) */
static int parse_allowed(json_t *body, const GenCtx *c, GenParams *p, Err *err) {
    json_t *a = json_object_get(body, "allowed_token_ids");
    if (!a || json_is_null(a)) return 0;
    ENSURE(err, json_is_array(a) && json_array_size(a) > 0, 400,
           "allowed_token_ids: must be a non-empty list of token ids");
    ENSURE(err, json_array_size(a) <= (size_t)c->vocab, 400, "allowed_token_ids: at most %d ids", c->vocab);
    p->allowed_ids = malloc(sizeof(int32_t) * json_array_size(a));
    ENSURE(err, p->allowed_ids, 500, "allowed_token_ids: out of memory");
    size_t i;
    json_t *x;
    json_array_foreach(a, i, x) {
        ENSURE(err, json_is_integer(x) && json_integer_value(x) >= 0 && json_integer_value(x) < c->vocab, 400,
               "allowed_token_ids: ids must be integers in [0, %d)", c->vocab);
        p->allowed_ids[i] = (int32_t)json_integer_value(x);
    }
    p->sp.n_allowed = (int)json_array_size(a);
    p->sp.allowed_ids = p->allowed_ids;
    return 0;
}

/* vLLM's bad_words: a list of non-empty strings (tokenized in gen_start) */
static int parse_bad_words(json_t *body, const GenCtx *c, GenParams *p, Err *err) {
    (void)c;
    json_t *a = json_object_get(body, "bad_words");
    if (!a || json_is_null(a)) return 0;
    ENSURE(err, json_is_array(a), 400, "bad_words: must be a list of strings");
    ENSURE(err, json_array_size(a) <= GEN_MAX_BAD_WORDS, 400, "bad_words: at most %d words", GEN_MAX_BAD_WORDS);
    size_t i;
    json_t *x;
    json_array_foreach(a, i, x) {
        ENSURE(err, json_is_string(x) && json_string_length(x) > 0 && json_string_length(x) <= 1024, 400,
               "bad_words: must be a list of non-empty strings of at most 1024 bytes");
        p->bad_words[p->n_bad_words] = strdup(json_string_value(x));
        ENSURE(err, p->bad_words[p->n_bad_words], 500, "bad_words: out of memory");
        p->n_bad_words++;
    }
    return 0;
}

/* Chat: "logprobs": true plus "top_logprobs": N alternatives. */
static int parse_chat_logprobs(json_t *body, const GenCtx *c, GenParams *p, Err *err) {
    int lp = 0, r;
    long long n = 0;
    if ((r = rp_bool(body, "logprobs", &lp, err)) < 0) return r;
    json_t *t = json_object_get(body, "top_logprobs");
    ENSURE(err, !(json_is_integer(t) && json_integer_value(t) == -1), 400,
           "top_logprobs: -1 (the whole vocabulary) is not supported; at most %d alternatives (--max-logprobs), "
           "as vLLM with its default --max-logprobs", c->max_logprobs);
    if ((r = rp_int(body, "top_logprobs", 0, c->max_logprobs, &n, err)) < 0) return r;
    ENSURE(err, !r || lp || n == 0, 400, "top_logprobs: needs logprobs: true");
    p->logprobs = lp ? (int)n : -1;
    return 0;
}

/* Completions: "logprobs": N alternatives (a boolean is the chat form, refused). */
static int parse_completion_logprobs(json_t *body, const GenCtx *c, GenParams *p, Err *err) {
    json_t *l = json_object_get(body, "logprobs");
    if (json_is_boolean(l)) return ERR(err, 400, "logprobs: must be an integer (number of alternatives) for completions");
    ENSURE(err, !(json_is_integer(l) && json_integer_value(l) == -1), 400,
           "logprobs: -1 (the whole vocabulary) is not supported; at most %d alternatives (--max-logprobs), "
           "as vLLM with its default --max-logprobs", c->max_logprobs);
    long long n;
    int r = rp_int(body, "logprobs", 0, c->max_logprobs, &n, err);
    if (r > 0) p->logprobs = (int)n;
    return r < 0 ? r : 0;
}

int request_parse_cache_salt(json_t *body, const char *key, uint64_t *out, Err *err) {
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v)) return 0;
    ENSURE(err, json_is_string(v) && json_string_length(v) > 0, 400, "%s: must be a non-empty string", key);
    uint64_t h = XXH3_64bits(json_string_value(v), json_string_length(v));
    *out = h ? h : 1; /* 0 is "no salt" */
    return 1;
}

static int parse_salt(json_t *body, const GenCtx *c, GenParams *p, Err *err) {
    (void)c;
    int r = request_parse_cache_salt(body, "cache_salt", &p->cache_salt, err);
    return r < 0 ? r : 0;
}

/* vLLM: stream_options with stream false is refused (a non-empty object),
 * and continuous usage comes only with include_usage (should_include_usage) */
static int check_stream_options(json_t *body, const GenCtx *c, GenParams *p, Err *err) {
    (void)c;
    json_t *o = json_object_get(body, "stream_options");
    ENSURE(err, !(json_is_object(o) && json_object_size(o) > 0 && !p->stream), 400,
           "stream_options: can only be defined when stream is true");
    p->continuous_usage &= p->include_usage;
    return 0;
}

/* vLLM: prompt_logprobs are not available in a stream (no chunk carries them;
 * vLLM refuses N > 0 and drops 0 silently, here 0 is refused too) */
static int check_stream_prompt_logprobs(json_t *body, const GenCtx *c, GenParams *p, Err *err) {
    (void)body; (void)c;
    ENSURE(err, !(p->stream && p->prompt_logprobs >= 0), 400,
           "prompt_logprobs: are not available when stream is true");
    return 0;
}

/* truncation_side (vLLM): "left" (default, keep the last tokens) or "right" */
static int parse_truncation_side(json_t *body, const GenCtx *c, GenParams *p, Err *err) {
    (void)c;
    json_t *s = json_object_get(body, "truncation_side");
    if (!s || json_is_null(s)) return 0;
    ENSURE(err, json_is_string(s) && (!strcmp(json_string_value(s), "left") || !strcmp(json_string_value(s), "right")),
           400, "truncation_side: must be \"left\" or \"right\"");
    p->truncate_right = !strcmp(json_string_value(s), "right");
    return 0;
}

static const GenField STREAM_OPTIONS[] = {
    {BOOL("include_usage"), DEF(1), TO(include_usage)}, /* vLLM's StreamOptions default: true once given */
    {BOOL("continuous_usage_stats"), DEF(0), TO(continuous_usage)},
};

static const GenField GEN_FIELDS[] = {
    /* max_tokens absent: the endpoint's default (request_parse_gen) */
    {INT("max_tokens", 1, 1ll << 30), TO(sp.max_tokens), SETS(max_tokens_set)},
    {INT("max_completion_tokens", 1, 1ll << 30), TO(sp.max_tokens), SETS(max_tokens_set)}, /* OpenAI's newer name */
    {NUM("temperature", 0, 100), DEF(1), TO(sp.temperature)},
    {NUM("top_p", 0, 1), .rule = X_ABOVE_LO, .rule_msg = "must be in (0, 1]", DEF(1), TO(sp.top_p)},
    {INT("top_k", -1, 1ll << 31), DEF(0), TO(sp.top_k)}, /* -1 (vLLM) and 0: off */
    {NUM("min_p", 0, 1), DEF(0), TO(sp.min_p)},
    {NUM("presence_penalty", -2, 2), DEF(0), TO(sp.presence_penalty)},
    {NUM("frequency_penalty", -2, 2), DEF(0), TO(sp.frequency_penalty)},
    {NUM("repetition_penalty", 1e-6, 10), DEF(1), TO(sp.repetition_penalty)},
    {INT("n", 1, 0), .hi_from = HI_MAX_N, DEF(1), TO(n)},
    {INT("best_of", 1, 0), .hi_from = HI_MAX_N, .rule = X_EQUALS_N, .rule_msg = "only best_of == n is supported"},
    {INT("seed", INT64_MIN, INT64_MAX), TO(sp.seed), SETS(sp.has_seed)},
    {INT("min_tokens", 0, 1ll << 30), DEF(0), TO(sp.min_tokens)},
    {BOOL("ignore_eos"), DEF(0), TO(sp.ignore_eos)},
    {BOOL("skip_special_tokens"), DEF(1), TO(skip_special)},
    {BOOL("spaces_between_special_tokens"), DEF(0), TO(spaces_between_special)},
    {BOOL("include_stop_str_in_output"), DEF(0), TO(include_stop_str)},
    {FN("stop", parse_stop)},
    {FN("stop_token_ids", parse_stop_ids)},
    {FN("logit_bias", parse_bias)},
    {FN("allowed_token_ids", parse_allowed)},
    {FN("bad_words", parse_bad_words)},
    {FN("logprobs", parse_chat_logprobs), .only = FOR_CHAT},
    {FN("logprobs", parse_completion_logprobs), .only = FOR_COMPLETIONS},
    {BOOL("echo"), .only = FOR_COMPLETIONS, DEF(0), TO(echo)},
    {INT("prompt_logprobs", 0, 0), .hi_from = HI_MAX_LOGPROBS, DEF(-1), TO(prompt_logprobs)},
    {BOOL("stream"), DEF(0), TO(stream)},
    {.name = "stream_options", .kind = F_OBJECT, .sub = STREAM_OPTIONS,
     .n_sub = sizeof STREAM_OPTIONS / sizeof STREAM_OPTIONS[0]},
    {FN("stream_options", check_stream_options)},
    {FN("prompt_logprobs", check_stream_prompt_logprobs)},
    /* RL extensions */
    {BOOL("return_token_ids"), DEF(0), TO(ret_token_ids)},
    {BOOL("return_sampler_logprobs"), DEF(0), TO(ret_sampler_lp)},
    {BOOL("return_raw_logprobs"), DEF(0), TO(ret_raw_lp)},
    {BOOL("return_sampling_mask"), DEF(0), TO(ret_mask)},
    {BOOL("return_routed_experts"), DEF(0), TO(ret_experts)},
    {FN("cache_salt", parse_salt)},
    /* vLLM extras */
    {BOOL("return_tokens_as_token_ids"), DEF(0), TO(ret_tokens_as_ids)},
    {INT("truncate_prompt_tokens", -1, 1ll << 30), TO(truncate_prompt), SETS(truncate_set)}, /* vs max_model_len: gen.c */
    {FN("truncation_side", parse_truncation_side)},
    /* vLLM fields that change results and are not implemented: a 400 naming the field */
    {REFUSE("use_beam_search", "beam search is not supported by this server")},
    {REFUSE("logprob_token_ids", "is not supported by this server")},
    {REFUSE("logits_processors", "is not supported by this server")},
    {REFUSE("prompt_embeds", "is not supported by this server")},
    /* chat: continue_final_message is read with the messages (api_chat.c); echo: vLLM's chat echo */
    {BOOL("echo"), .only = FOR_CHAT, DEF(0), TO(chat_echo)},
    {REFUSE("suffix", "is not supported by this server"), .only = FOR_COMPLETIONS},
    /* structured outputs (issue #21 replaces this line and the next) */
    /* response_format, structured_outputs, guided_*: structured.c (structured_parse) */
    {REFUSE("structural_tag", "structural tags are not supported by this server (response_format, "
            "structured_outputs and guided_* are)")},
};

static void field_store(GenParams *p, const GenField *f, long long iv, double dv) {
    void *d = (char *)p + f->dst;
    int num = f->kind == F_NUM;
    switch (f->dst_type) {
    case DST_INT: *(int *)d = num ? (int)dv : (int)iv; break;
    case DST_FLOAT: *(float *)d = num ? (float)dv : (float)iv; break;
    case DST_U64: *(uint64_t *)d = (uint64_t)iv; break;
    case DST_NONE: break;
    }
}

static int parse_fields(json_t *o, const GenField *fields, size_t n, const GenCtx *c, GenParams *p, Err *err) {
    for (const GenField *f = fields; f < fields + n; f++) {
        if ((f->only == FOR_CHAT && !c->chat) || (f->only == FOR_COMPLETIONS && c->chat)) continue;
        int r = 0;
        long long iv = 0;
        double dv = 0;
        switch (f->kind) {
        case F_FN:
            if ((r = f->parse(o, c, p, err)) < 0) return r;
            continue;
        case F_REFUSE: {
            json_t *j = json_object_get(o, f->name);
            ENSURE(err, !j || json_is_null(j) || json_is_false(j), 400, "%s: %s", f->name, f->rule_msg);
            continue;
        }
        case F_OBJECT: {
            json_t *j = json_object_get(o, f->name);
            if (!j || json_is_null(j)) continue;
            ENSURE(err, json_is_object(j), 400, "%s: must be an object", f->name);
            if ((r = parse_fields(j, f->sub, f->n_sub, c, p, err)) < 0) return r;
            continue;
        }
        case F_BOOL: {
            int b = 0;
            r = rp_bool(o, f->name, &b, err);
            iv = b;
            break;
        }
        case F_INT: {
            long long hi = f->hi_from == HI_MAX_N ? c->max_n : f->hi_from == HI_MAX_LOGPROBS ? c->max_logprobs : f->ihi;
            r = rp_int(o, f->name, f->ilo, hi, &iv, err);
            dv = (double)iv;
            break;
        }
        case F_NUM:
            r = rp_num(o, f->name, f->lo, f->hi, &dv, err);
            break;
        }
        if (r < 0) return r;
        if (!r) {
            if (f->has_def) field_store(p, f, (long long)f->def, f->def);
            continue;
        }
        if (f->rule == X_ABOVE_LO) ENSURE(err, dv > f->lo, 400, "%s: %s", f->name, f->rule_msg);
        if (f->rule == X_EQUALS_N) ENSURE(err, iv == p->n, 400, "%s: %s", f->name, f->rule_msg);
        field_store(p, f, iv, dv);
        if (f->has_set) *(int *)((char *)p + f->set) = 1;
    }
    return 0;
}

int request_parse_gen(json_t *body, int chat, int vocab, int max_n, int max_logprobs, GenParams *p, Err *err) {
    memset(p, 0, sizeof *p);
    sampling_params_default(&p->sp);
    p->logprobs = -1;
    if (chat) p->sp.max_tokens = 0; /* chat's default: the rest of the context; completions': 16 (OpenAI) */
    GenCtx c = {chat, vocab, max_n, max_logprobs};
    return parse_fields(body, GEN_FIELDS, sizeof GEN_FIELDS / sizeof GEN_FIELDS[0], &c, p, err);
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
