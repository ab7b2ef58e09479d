/*
 * test_request_parse.c - the request fields of /v1/completions and
 * /v1/chat/completions (server/http/request_parse.c's field table): the value each
 * takes when absent, the value stored when given (aliases included), and the
 * exact 400 message of every wrong type or out-of-range value, which http.c
 * turns into the OpenAI error's "param" (the messages were recorded from the
 * parser before it became a table and must not change). Limits as a server
 * with vocab 1000, --max-n 8 and --max-logprobs 20 would pass them.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "request_parse.h"
#include "test.h"

enum { VOCAB = 1000, MAX_N = 8, MAX_LP = 20 };

static int parse(int chat, const char *body, GenParams *p, Err *err) {
    json_error_t je;
    json_t *b = json_loads(body, 0, &je);
    T_ASSERT(b != NULL, "test body is JSON: %s", body);
    if (!b) return -1;
    memset(err, 0, sizeof *err);
    int rc = request_parse_gen(b, chat, VOCAB, MAX_N, MAX_LP, p, err);
    json_decref(b);
    return rc;
}

/* ---- bad values: status and message, the first bad field in table order ---- */
typedef struct { int chat; const char *body; int status; const char *msg; } Bad;
static const Bad BAD[] = {
    {0, "{\"max_tokens\": 0}", 400, "max_tokens: must be in [1, 1073741824], got 0"},
    {0, "{\"max_tokens\": 1073741825}", 400, "max_tokens: must be in [1, 1073741824], got 1073741825"},
    {0, "{\"max_tokens\": \"x\"}", 400, "max_tokens: must be an integer"},
    {0, "{\"max_tokens\": -3}", 400, "max_tokens: must be in [1, 1073741824], got -3"},
    {0, "{\"max_completion_tokens\": 0}", 400, "max_completion_tokens: must be in [1, 1073741824], got 0"},
    {0, "{\"max_completion_tokens\": \"x\"}", 400, "max_completion_tokens: must be an integer"},
    {0, "{\"temperature\": 100.5}", 400, "temperature: must be in [0, 100], got 100.5"},
    {0, "{\"temperature\": -0.5}", 400, "temperature: must be in [0, 100], got -0.5"},
    {0, "{\"temperature\": \"hot\"}", 400, "temperature: must be a number"},
    {0, "{\"temperature\": 1e+308}", 400, "temperature: must be in [0, 100], got 1e+308"},
    {0, "{\"top_p\": 0}", 400, "top_p: must be in (0, 1]"},
    {0, "{\"top_p\": 1.5}", 400, "top_p: must be in [0, 1], got 1.5"},
    {0, "{\"top_p\": \"x\"}", 400, "top_p: must be a number"},
    {0, "{\"top_p\": -0.1}", 400, "top_p: must be in [0, 1], got -0.1"},
    {0, "{\"top_k\": -2}", 400, "top_k: must be in [-1, 2147483648], got -2"},
    {0, "{\"top_k\": 2147483649}", 400, "top_k: must be in [-1, 2147483648], got 2147483649"},
    {0, "{\"top_k\": \"x\"}", 400, "top_k: must be an integer"},
    {0, "{\"min_p\": 2}", 400, "min_p: must be in [0, 1], got 2"},
    {0, "{\"min_p\": -1}", 400, "min_p: must be in [0, 1], got -1"},
    {0, "{\"min_p\": \"x\"}", 400, "min_p: must be a number"},
    {0, "{\"presence_penalty\": 3}", 400, "presence_penalty: must be in [-2, 2], got 3"},
    {0, "{\"presence_penalty\": -3}", 400, "presence_penalty: must be in [-2, 2], got -3"},
    {0, "{\"presence_penalty\": \"x\"}", 400, "presence_penalty: must be a number"},
    {0, "{\"frequency_penalty\": 2.5}", 400, "frequency_penalty: must be in [-2, 2], got 2.5"},
    {0, "{\"frequency_penalty\": \"x\"}", 400, "frequency_penalty: must be a number"},
    {0, "{\"repetition_penalty\": 0}", 400, "repetition_penalty: must be in [1e-06, 10], got 0"},
    {0, "{\"repetition_penalty\": 1e-07}", 400, "repetition_penalty: must be in [1e-06, 10], got 1e-07"},
    {0, "{\"repetition_penalty\": 11}", 400, "repetition_penalty: must be in [1e-06, 10], got 11"},
    {0, "{\"repetition_penalty\": \"x\"}", 400, "repetition_penalty: must be a number"},
    {0, "{\"n\": 9}", 400, "n: must be in [1, 8], got 9"},
    {0, "{\"n\": 0}", 400, "n: must be in [1, 8], got 0"},
    {0, "{\"n\": \"x\"}", 400, "n: must be an integer"},
    {0, "{\"best_of\": 3}", 400, "best_of: only best_of == n is supported"},
    {0, "{\"best_of\": 9}", 400, "best_of: must be in [1, 8], got 9"},
    {0, "{\"best_of\": 0}", 400, "best_of: must be in [1, 8], got 0"},
    {0, "{\"best_of\": \"x\"}", 400, "best_of: must be an integer"},
    {0, "{\"seed\": \"x\"}", 400, "seed: must be an integer"},
    {0, "{\"min_tokens\": -1}", 400, "min_tokens: must be in [0, 1073741824], got -1"},
    {0, "{\"min_tokens\": 1073741825}", 400, "min_tokens: must be in [0, 1073741824], got 1073741825"},
    {0, "{\"min_tokens\": \"x\"}", 400, "min_tokens: must be an integer"},
    {0, "{\"ignore_eos\": 1}", 400, "ignore_eos: must be a boolean"},
    {0, "{\"skip_special_tokens\": 0}", 400, "skip_special_tokens: must be a boolean"},
    {0, "{\"spaces_between_special_tokens\": \"y\"}", 400, "spaces_between_special_tokens: must be a boolean"},
    {0, "{\"include_stop_str_in_output\": 3}", 400, "include_stop_str_in_output: must be a boolean"},
    {0, "{\"stop\": 5}", 400, "stop: must be a string or a list of strings"},
    {0, "{\"stop_token_ids\": [-1]}", 400, "stop_token_ids: ids must be integers in [0, 1000)"},
    {0, "{\"stop_token_ids\": 5}", 400, "stop_token_ids: must be a list of token ids"},
    {0, "{\"logit_bias\": {\"abc\": 1}}", 400, "logit_bias: key 'abc' is not a token id in [0, 1000)"},
    {0, "{\"logit_bias\": {\"5\": 1000}}", 400, "logit_bias: value of '5' must be in [-100, 100]"},
    {0, "{\"logit_bias\": 3}", 400, "logit_bias: must be an object mapping token ids to biases"},
    {0, "{\"logit_bias\": {\"5\": \"x\"}}", 400, "logit_bias: value of '5' must be a number"},
    {0, "{\"logprobs\": 21}", 400, "logprobs: must be in [0, 20], got 21"},
    {0, "{\"logprobs\": true}", 400, "logprobs: must be an integer (number of alternatives) for completions"},
    {0, "{\"logprobs\": \"x\"}", 400, "logprobs: must be an integer"},
    {0, "{\"logprobs\": -1}", 400, "logprobs: -1 (the whole vocabulary) is not supported; at most 20 alternatives (--max-logprobs), as vLLM with its default --max-logprobs"},
    /* vLLM fields that change results: implemented, or a 400 naming them (never ignored) */
    {0, "{\"stream_options\": {\"include_usage\": true}}", 400, "stream_options: can only be defined when stream is true"},
    {1, "{\"stream\": false, \"stream_options\": {\"continuous_usage_stats\": true}}", 400, "stream_options: can only be defined when stream is true"},
    {1, "{\"echo\": \"x\"}", 400, "echo: must be a boolean"},
    {0, "{\"use_beam_search\": true}", 400, "use_beam_search: beam search is not supported by this server"},
    {0, "{\"allowed_token_ids\": []}", 400, "allowed_token_ids: must be a non-empty list of token ids"},
    {0, "{\"allowed_token_ids\": [1, 1000]}", 400, "allowed_token_ids: ids must be integers in [0, 1000)"},
    {1, "{\"logprob_token_ids\": [1]}", 400, "logprob_token_ids: is not supported by this server"},
    {0, "{\"bad_words\": [\"x\", \"\"]}", 400, "bad_words: must be a list of non-empty strings of at most 1024 bytes"},
    {0, "{\"bad_words\": \"x\"}", 400, "bad_words: must be a list of strings"},
    {0, "{\"suffix\": \"x\"}", 400, "suffix: is not supported by this server"},
    {1, "{\"structural_tag\": {}}", 400, "structural_tag: structural tags are not supported by this server (response_format, structured_outputs and guided_* are)"},
    {0, "{\"stream\": true, \"prompt_logprobs\": 0}", 400, "prompt_logprobs: are not available when stream is true"},
    {0, "{\"truncation_side\": \"middle\"}", 400, "truncation_side: must be \"left\" or \"right\""},
    {0, "{\"truncate_prompt_tokens\": -2}", 400, "truncate_prompt_tokens: must be in [-1, 1073741824], got -2"},
    {0, "{\"echo\": \"x\"}", 400, "echo: must be a boolean"},
    {0, "{\"prompt_logprobs\": 21}", 400, "prompt_logprobs: must be in [0, 20], got 21"},
    {0, "{\"prompt_logprobs\": -1}", 400, "prompt_logprobs: must be in [0, 20], got -1"},
    {0, "{\"prompt_logprobs\": \"x\"}", 400, "prompt_logprobs: must be an integer"},
    {0, "{\"stream\": \"yes\"}", 400, "stream: must be a boolean"},
    {0, "{\"stream_options\": 3}", 400, "stream_options: must be an object"},
    {0, "{\"stream_options\": {\"include_usage\": \"x\"}}", 400, "include_usage: must be a boolean"},
    {0, "{\"stream_options\": {\"continuous_usage_stats\": 2}}", 400, "continuous_usage_stats: must be a boolean"},
    {0, "{\"return_token_ids\": 1}", 400, "return_token_ids: must be a boolean"},
    {0, "{\"return_sampler_logprobs\": \"x\"}", 400, "return_sampler_logprobs: must be a boolean"},
    {0, "{\"return_raw_logprobs\": 2}", 400, "return_raw_logprobs: must be a boolean"},
    {0, "{\"return_sampling_mask\": 0}", 400, "return_sampling_mask: must be a boolean"},
    {0, "{\"return_routed_experts\": \"z\"}", 400, "return_routed_experts: must be a boolean"},
    {1, "{\"max_tokens\": 0}", 400, "max_tokens: must be in [1, 1073741824], got 0"},
    {1, "{\"max_tokens\": 1073741825}", 400, "max_tokens: must be in [1, 1073741824], got 1073741825"},
    {1, "{\"max_tokens\": \"x\"}", 400, "max_tokens: must be an integer"},
    {1, "{\"max_tokens\": -3}", 400, "max_tokens: must be in [1, 1073741824], got -3"},
    {1, "{\"logprobs\": 0}", 400, "logprobs: must be a boolean"},
    {1, "{\"top_logprobs\": 3}", 400, "top_logprobs: needs logprobs: true"},
    {1, "{\"top_logprobs\": 21}", 400, "top_logprobs: must be in [0, 20], got 21"},
    {1, "{\"top_logprobs\": \"x\"}", 400, "top_logprobs: must be an integer"},
    {0, "{\"repetition_penalty\": 1.2, \"prompt_logprobs\": -1, \"seed\": 0, \"stream_options\": {\"continuous_usage_stats\": true}, \"echo\": true, \"return_sampling_mask\": true}", 400, "prompt_logprobs: must be in [0, 20], got -1"},
    {0, "{\"top_p\": 1.5, \"seed\": 1.5, \"spaces_between_special_tokens\": true}", 400, "top_p: must be in [0, 1], got 1.5"},
    {0, "{\"frequency_penalty\": 2, \"max_tokens\": 5.5, \"prompt_logprobs\": 3, \"presence_penalty\": -2, \"ignore_eos\": false, \"repetition_penalty\": 11}", 400, "max_tokens: must be an integer"},
    {0, "{\"skip_special_tokens\": true, \"top_k\": 5, \"return_sampling_mask\": true, \"max_tokens\": \"x\", \"return_sampler_logprobs\": \"x\", \"presence_penalty\": 2}", 400, "max_tokens: must be an integer"},
    {0, "{\"return_raw_logprobs\": true, \"top_logprobs\": 21, \"logprobs\": true, \"presence_penalty\": -2, \"min_p\": 1, \"echo\": \"x\"}", 400, "logprobs: must be an integer (number of alternatives) for completions"},
    {0, "{\"return_sampling_mask\": true, \"top_k\": 2147483649, \"repetition_penalty\": 1e-07}", 400, "top_k: must be in [-1, 2147483648], got 2147483649"},
};

static void test_bad(void) {
    int bad = 0;
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        GenParams p;
        Err err;
        int rc = parse(BAD[i].chat, BAD[i].body, &p, &err);
        if (rc != -BAD[i].status || err.code != BAD[i].status || strcmp(err.msg, BAD[i].msg) != 0) {
            if (bad++ < 10)
                fprintf(stderr, "%s %s: rc %d code %d '%s', want %d '%s'\n", BAD[i].chat ? "chat" : "completions",
                        BAD[i].body, rc, err.code, err.msg, BAD[i].status, BAD[i].msg);
        }
        gen_params_free(&p); /* also after an error (the contract of request_parse_gen) */
    }
    T_ASSERT(bad == 0, "%d of %zu bad bodies got another answer", bad, sizeof BAD / sizeof BAD[0]);
}

/* ---- defaults ---- */
static void test_defaults(void) {
    for (int chat = 0; chat < 2; chat++) {
        GenParams p;
        Err err;
        T_ASSERT(parse(chat, "{}", &p, &err) == 0, "empty body: %s", err.msg);
        SamplingParams d;
        sampling_params_default(&d);
        const SamplingParams *s = &p.sp;
        T_ASSERT(s->temperature == 1 && s->top_p == 1 && s->top_k == 0 && s->min_p == 0 && s->presence_penalty == 0 &&
                     s->frequency_penalty == 0 && s->repetition_penalty == 1 && s->min_tokens == 0 &&
                     !s->ignore_eos && !s->has_seed && s->n_stop_ids == 0 && s->n_logit_bias == 0,
                 "sampling defaults (chat %d)", chat);
        T_ASSERT(s->max_tokens == (chat ? 0 : 16) && !p.max_tokens_set,
                 "max_tokens default: completions 16, chat the rest of the context (got %d)", s->max_tokens);
        T_ASSERT(s->temperature == d.temperature && s->top_p == d.top_p && s->repetition_penalty == d.repetition_penalty,
                 "the table's defaults are sampling_params_default's");
        T_ASSERT(p.n == 1 && p.logprobs == -1 && p.prompt_logprobs == -1 && p.skip_special == 1 && !p.echo &&
                     !p.spaces_between_special && !p.include_stop_str && !p.stream && !p.include_usage &&
                     !p.continuous_usage && !p.ret_token_ids && !p.ret_sampler_lp && !p.ret_raw_lp && !p.ret_mask &&
                     !p.ret_experts && p.n_stop == 0,
                 "request defaults (chat %d)", chat);
        gen_params_free(&p);
    }
}

/* ---- given values land in their field ---- */
typedef struct { int chat; const char *body; size_t off; char type; double want; } Good; /* type: i int, f float, u u64 */
#define SP(f) offsetof(GenParams, sp.f)
#define GP(f) offsetof(GenParams, f)
static const Good GOOD[] = {
    {0, "{\"max_tokens\": 7}", SP(max_tokens), 'i', 7},
    {0, "{\"max_tokens\": 5.0}", SP(max_tokens), 'i', 5}, /* an integral real is an integer */
    {0, "{\"max_tokens\": 7}", GP(max_tokens_set), 'i', 1},
    {1, "{\"max_completion_tokens\": 9}", SP(max_tokens), 'i', 9},
    {1, "{\"max_completion_tokens\": 9}", GP(max_tokens_set), 'i', 1},
    {0, "{\"max_tokens\": 3, \"max_completion_tokens\": 9}", SP(max_tokens), 'i', 9}, /* the alias wins */
    {0, "{\"temperature\": 0}", SP(temperature), 'f', 0},
    {0, "{\"temperature\": 100}", SP(temperature), 'f', 100},
    {0, "{\"temperature\": null}", SP(temperature), 'f', 1}, /* null is absent */
    {0, "{\"top_p\": 0.25}", SP(top_p), 'f', 0.25},
    {0, "{\"top_k\": 5}", SP(top_k), 'i', 5},
    {0, "{\"top_k\": 3.0}", SP(top_k), 'i', 3},
    {0, "{\"min_p\": 0.5}", SP(min_p), 'f', 0.5},
    {0, "{\"presence_penalty\": -2}", SP(presence_penalty), 'f', -2},
    {0, "{\"frequency_penalty\": 1.5}", SP(frequency_penalty), 'f', 1.5},
    {0, "{\"repetition_penalty\": 1.25}", SP(repetition_penalty), 'f', 1.25},
    {0, "{\"n\": 8}", GP(n), 'i', 8},
    {0, "{\"n\": 3, \"best_of\": 3}", GP(n), 'i', 3},
    {0, "{\"seed\": 12}", SP(seed), 'u', 12},
    {0, "{\"seed\": 12}", SP(has_seed), 'i', 1},
    {0, "{\"seed\": -1}", SP(seed), 'u', 18446744073709551615.0},
    {0, "{\"min_tokens\": 4}", SP(min_tokens), 'i', 4},
    {0, "{\"ignore_eos\": true}", SP(ignore_eos), 'i', 1},
    {0, "{\"skip_special_tokens\": false}", GP(skip_special), 'i', 0},
    {0, "{\"spaces_between_special_tokens\": true}", GP(spaces_between_special), 'i', 1},
    {0, "{\"include_stop_str_in_output\": true}", GP(include_stop_str), 'i', 1},
    {0, "{\"stop\": [\"ab\", \"\", \"cde\"]}", GP(n_stop), 'i', 2},
    {0, "{\"stop\": [\"ab\", \"\", \"cde\"]}", GP(stop_maxlen), 'z', 3},
    {0, "{\"stop_token_ids\": [1, 999]}", SP(n_stop_ids), 'i', 2},
    {0, "{\"logit_bias\": {\"5\": -100, \"6\": 2.5}}", SP(n_logit_bias), 'i', 2},
    {0, "{\"logprobs\": 5}", GP(logprobs), 'i', 5},
    {1, "{\"logprobs\": true, \"top_logprobs\": 3}", GP(logprobs), 'i', 3},
    {1, "{\"logprobs\": true}", GP(logprobs), 'i', 0},
    {1, "{\"logprobs\": false, \"top_logprobs\": 0}", GP(logprobs), 'i', -1},
    {0, "{\"echo\": true}", GP(echo), 'i', 1},
    {1, "{\"echo\": true}", GP(echo), 'i', 0}, /* completions' echo; chat's is its own */
    {1, "{\"echo\": true}", GP(chat_echo), 'i', 1},
    {0, "{\"prompt_logprobs\": 0}", GP(prompt_logprobs), 'i', 0},
    {0, "{\"prompt_logprobs\": 20}", GP(prompt_logprobs), 'i', 20},
    {0, "{\"stream\": true}", GP(stream), 'i', 1},
    {0, "{\"stream\": true, \"stream_options\": {\"include_usage\": true}}", GP(include_usage), 'i', 1},
    {0, "{\"stream\": true, \"stream_options\": {\"continuous_usage_stats\": true}}", GP(continuous_usage), 'i', 1},
    {0, "{\"stream\": true, \"stream_options\": {\"include_usage\": false}}", GP(include_usage), 'i', 0},
    {0, "{\"stream\": true, \"stream_options\": {\"include_usage\": false, \"continuous_usage_stats\": true}}", GP(continuous_usage), 'i', 0},
    {0, "{\"stream\": true, \"stream_options\": {}}", GP(include_usage), 'i', 1}, /* vLLM: StreamOptions() has include_usage true */
    {0, "{\"return_tokens_as_token_ids\": true}", GP(ret_tokens_as_ids), 'i', 1},
    {0, "{\"allowed_token_ids\": [3, 999, 4]}", SP(n_allowed), 'i', 3},
    {0, "{\"bad_words\": [\"a b\", \"c\"]}", GP(n_bad_words), 'i', 2},
    {0, "{\"truncate_prompt_tokens\": 5}", GP(truncate_prompt), 'i', 5},
    {0, "{\"truncation_side\": \"right\"}", GP(truncate_right), 'i', 1},
    {0, "{\"use_beam_search\": false}", GP(n), 'i', 1},
    {0, "{\"stream_options\": null}", GP(include_usage), 'i', 0},
    {0, "{\"return_token_ids\": true}", GP(ret_token_ids), 'i', 1},
    {0, "{\"return_sampler_logprobs\": true}", GP(ret_sampler_lp), 'i', 1},
    {0, "{\"return_raw_logprobs\": true}", GP(ret_raw_lp), 'i', 1},
    {0, "{\"return_sampling_mask\": true}", GP(ret_mask), 'i', 1},
    {0, "{\"return_routed_experts\": true}", GP(ret_experts), 'i', 1},
    {0, "{\"unknown_field\": [1, 2]}", GP(n), 'i', 1}, /* unknown fields are ignored, as vLLM does */
};

static void test_good(void) {
    int bad = 0;
    for (size_t i = 0; i < sizeof GOOD / sizeof GOOD[0]; i++) {
        const Good *g = &GOOD[i];
        GenParams p;
        Err err;
        if (parse(g->chat, g->body, &p, &err) != 0) {
            if (bad++ < 10) fprintf(stderr, "%s: %s\n", g->body, err.msg);
            gen_params_free(&p);
            continue;
        }
        const char *f = (const char *)&p + g->off;
        double got = g->type == 'i' ? *(const int *)f : g->type == 'f' ? *(const float *)f
                   : g->type == 'u' ? (double)*(const uint64_t *)f : (double)*(const size_t *)f;
        if (got != g->want && bad++ < 10) fprintf(stderr, "%s: got %.17g, want %.17g\n", g->body, got, g->want);
        gen_params_free(&p);
    }
    T_ASSERT(bad == 0, "%d of %zu given values not stored as sent", bad, sizeof GOOD / sizeof GOOD[0]);
    /* the arrays */
    GenParams p;
    Err err;
    T_ASSERT(parse(0, "{\"stop\": \"x y\", \"stop_token_ids\": [7, 3], \"logit_bias\": {\"5\": -1.5}}", &p, &err) == 0,
             "%s", err.msg);
    T_ASSERT(p.n_stop == 1 && !strcmp(p.stop[0], "x y") && p.sp.stop_ids[0] == 7 && p.sp.stop_ids[1] == 3 &&
                 p.sp.n_logit_bias == 1 && p.sp.logit_bias_ids[0] == 5 && p.sp.logit_bias[0] == -1.5f,
             "stop, stop_token_ids and logit_bias contents");
    gen_params_free(&p);
}

int main(void) {
    test_bad();
    test_defaults();
    test_good();
    return T_DONE();
}
