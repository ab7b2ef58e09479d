/*
 * gen.c - a generation in flight: submit, consume, detokenize, stop strings,
 * and the JSON pieces shared by the endpoints (gen.h).
 */
#define _GNU_SOURCE
#include "gen.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "sse.h"

/* ---- lifecycle ---- */
/* What rendering a prompt's outputs as JSON can take, on top of the engine's
 * storage (engine_request_output_bytes): jansson builds every log-prob entry
 * as an object (token text, log-prob, bytes / rank, decoded_token) and the
 * response is then dumped to a string as well; measured at about 0.6-0.9 KB
 * per entry with Qwen3's tokenizer, counted as GEN_LP_ENTRY_BYTES. An echoed
 * or prompt_logprobs prompt has (N + 1) entries per position, a generated
 * token with logprobs (top + 1). Masks are rendered from their compact form
 * (at most ~15 bytes per stored id: copy, base64, dump), one choice at a
 * time, and are not counted here. */
#define GEN_LP_ENTRY_BYTES 1024
static size_t gen_render_bytes(const EngineRequestParams *ep, int logprobs, int echo) {
    size_t b = 0;
    if (ep->prompt_logprobs >= 0) /* echo's logprobs and prompt_logprobs render the same positions */
        b += (size_t)ep->n_prompt * (size_t)(ep->prompt_logprobs + 1) * GEN_LP_ENTRY_BYTES * (echo ? 2 : 1);
    if (logprobs >= 0)
        b += (size_t)ep->n * (size_t)ep->sampling.max_tokens * (size_t)(ep->top_logprobs + 1) * GEN_LP_ENTRY_BYTES;
    return b;
}

/* The engine request of one prompt. */
static void gen_engine_params(Server *s, const GenParams *gp, const TokIds *pr, int max_len, EngineRequestParams *ep) {
    engine_request_params_default(ep);
    ep->prompt = pr->ids;
    ep->n_prompt = (int)pr->n;
    ep->n = gp->n;
    ep->sampling = gp->sp;
    int rest = max_len - ep->n_prompt;
    if (!gp->max_tokens_set) ep->sampling.max_tokens = gp->sp.max_tokens > 0 && gp->sp.max_tokens < rest ? gp->sp.max_tokens : rest;
    ep->top_logprobs = gp->logprobs > 0 ? gp->logprobs : 0;
    ep->want_raw_logprob = gp->ret_raw_lp;
    ep->want_logprob_value = gp->logprobs >= 0;
    ep->logprobs_mode = (LogprobsMode)s->cfg.logprobs_mode;
    ep->want_mask = gp->ret_mask;
    ep->prompt_logprobs = gp->prompt_logprobs >= 0 ? gp->prompt_logprobs
                        : gp->echo && gp->logprobs >= 0 ? gp->logprobs : -1;
    ep->want_experts = gp->ret_experts && engine_experts_per_token(s->eng) > 0;
    ep->lora_slot = gp->lora - 1;
    ep->extra_output_bytes = gen_render_bytes(ep, gp->logprobs, gp->echo);
    ep->cache_salt = gp->cache_salt;
    ep->extra_output_bytes += gp->extra_render_bytes;
    ep->grammar = gp->grammar; /* the engine takes its own reference */
}

/* vLLM's bad words as token sequences (SamplingParams.update_from_tokenizer):
 * each word with its leading whitespace stripped, and again after one space
 * when that gives a different first token and as many tokens (the word in the
 * middle of a text). */
static int bad_words_tokenize(Server *s, GenParams *gp, Err *err) {
    int cap = 2 * gp->n_bad_words, nw = 0;
    size_t ni = 0, cap_ids = 0;
    TokIds t[2 * GEN_MAX_BAD_WORDS];
    memset(t, 0, sizeof t);
    int rc = 0;
    for (int w = 0; w < gp->n_bad_words && rc == 0; w++) {
        const char *word = gp->bad_words[w];
        while (*word == ' ' || *word == '\t' || *word == '\n' || *word == '\r') word++;
        char *spaced = NULL;
        if (asprintf(&spaced, " %s", word) < 0) { rc = ERR(err, 500, "bad_words: out of memory"); break; }
        int first = nw;
        for (int k = 0; k < 2 && rc == 0; k++) {
            const char *text = k ? spaced : word;
            TokIds *v = &t[nw];
            if (tokenizer_encode(s->tok, text, strlen(text), false, v, err) < 0) { rc = -1; break; }
            if (k == 0 && v->n == 0) { rc = ERR(err, 400, "bad_words: word %d encodes to no tokens", w); break; }
            if (k == 1 && !(v->n == t[first].n && v->ids[0] != t[first].ids[0])) { tok_ids_free(v); continue; }
            for (size_t i = 0; i < v->n; i++)
                if (v->ids[i] >= s->vocab) rc = ERR(err, 400, "bad_words: word %d encodes to id %d outside the vocab", w, v->ids[i]);
            ni += v->n;
            nw++;
        }
        free(spaced);
    }
    if (rc == 0) {
        cap_ids = ni ? ni : 1;
        gp->bad_off = malloc(sizeof(int32_t) * (size_t)(nw + 1));
        gp->bad_ids = malloc(sizeof(int32_t) * cap_ids);
        if (!gp->bad_off || !gp->bad_ids) rc = ERR(err, 500, "bad_words: out of memory");
    }
    if (rc == 0) {
        size_t o = 0;
        for (int i = 0; i < nw; i++) {
            gp->bad_off[i] = (int32_t)o;
            memcpy(gp->bad_ids + o, t[i].ids, t[i].n * sizeof(int32_t));
            o += t[i].n;
        }
        gp->bad_off[nw] = (int32_t)o;
        gp->sp.n_bad_words = nw;
        gp->sp.bad_word_off = gp->bad_off;
        gp->sp.bad_word_ids = gp->bad_ids;
    }
    for (int i = 0; i < cap; i++) tok_ids_free(&t[i]);
    return rc;
}

int gen_start(Gen *g, Server *s, int fd, GenParams *p, TokIds *prompts, int n_prompts, const char *id_prefix,
              Err *err) {
    memset(g, 0, sizeof *g);
    g->s = s;
    g->fd = fd;
    g->p = *p;
    memset(p, 0, sizeof *p);
    g->prompts = prompts;
    g->n_prompts = n_prompts;
    g->created = server_now_s();
    server_new_id(s, id_prefix, g->id, sizeof g->id);
    snprintf(g->live.id, sizeof g->live.id, "%s", g->id);
    atomic_fetch_add(&s->inflight, 1);
    g->counted = 1;
    gen_render_begin(g);
    ENSURE(err, !atomic_load(&s->shutting_down), 503, "the server is shutting down");
    GenParams *gp = &g->p;
    int max_len = s->max_model_len;
    if (gp->n_bad_words > 0 && bad_words_tokenize(s, gp, err) < 0) return -1;
    if (gp->truncate_set) { /* vLLM's truncate_prompt_tokens: before every length check */
        int k = gp->truncate_prompt == -1 ? max_len : gp->truncate_prompt;
        ENSURE(err, k != 0, 400, "truncate_prompt_tokens: must be -1 (max_model_len) or >= 1");
        ENSURE(err, k <= max_len, 400,
               "truncate_prompt_tokens: %d is greater than max_model_len (%d); select a smaller truncation size",
               k, max_len);
        for (int i = 0; i < n_prompts; i++) {
            TokIds *t = &prompts[i];
            if (k <= 0 || t->n <= (size_t)k) continue;
            if (!gp->truncate_right) memmove(t->ids, t->ids + (t->n - (size_t)k), (size_t)k * sizeof(int32_t));
            t->n = (size_t)k;
        }
    }
    for (int i = 0; i < n_prompts; i++) {
        int np = (int)prompts[i].n;
        ENSURE(err, np < max_len, 400,
               "prompt: this model's maximum context length is %d tokens, but the prompt has %d tokens", max_len, np);
        if (gp->max_tokens_set)
            ENSURE(err, np + gp->sp.max_tokens <= max_len, 400,
                   "max_tokens: this model's maximum context length is %d tokens; the prompt has %d tokens and "
                   "max_tokens is %d (prompt + max_tokens must be <= %d)", max_len, np, gp->sp.max_tokens, max_len);
    }
    ENSURE(err, n_prompts > 0 && gp->n > 0, 400, "prompt: must not be empty");
    ENSURE(err, (long long)n_prompts * gp->n <= GEN_MAX_CHOICES, 400,
           "n: prompts x n is %lld; at most %d choices per request", (long long)n_prompts * gp->n, GEN_MAX_CHOICES);
    g->reqs = calloc((size_t)n_prompts, sizeof *g->reqs);
    g->seen = calloc((size_t)n_prompts, sizeof *g->seen);
    g->n_ch = n_prompts * gp->n;
    g->ch = calloc((size_t)g->n_ch, sizeof *g->ch);
    ENSURE(err, g->reqs && g->seen && g->ch, 500, "out of memory");
    /* the output budget holds for the whole HTTP request: every prompt's
     * outputs together (the engine checks each prompt and the global budget) */
    size_t total = 0, per_req = engine_config(s->eng)->max_request_output_mb;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n_prompts; i++) {
            EngineRequestParams ep;
            gen_engine_params(s, gp, &prompts[i], max_len, &ep);
            if (pass == 0) {
                total += engine_request_output_bytes(s->eng, &ep);
                continue;
            }
            if (i == 0 && n_prompts > 1) /* one prompt: the engine's message is more precise */
                ENSURE(err, total <= per_req << 20, 400,
                       "this request's outputs would need %zu MB for %d prompts, over the per-request budget of "
                       "%zu MB (--max-request-output-mb): lower the number of prompts, n (%d), max_tokens, the "
                       "prompt length, logprobs/prompt_logprobs/echo, or drop return_sampling_mask",
                       (total >> 20) + 1, n_prompts, per_req, gp->n);
            if (engine_submit(s->eng, &ep, &g->reqs[i], err) < 0) return -1;
        }
    g->live.reqs = g->reqs;
    g->live.n_reqs = n_prompts;
    server_live_add(s, &g->live);
    for (int i = 0; i < g->n_ch; i++) {
        Choice *c = &g->ch[i];
        c->index = i;
        c->prompt_i = i / gp->n;
        c->seq = i % gp->n;
        c->r = g->reqs[c->prompt_i];
        c->dec = tok_decoder_create(s->tok, gp->skip_special);
    }
    return 0;
}

void gen_free(Gen *g) {
    if (g->live.reqs) server_live_remove(g->s, &g->live);
    for (int i = 0; i < g->n_prompts && g->reqs; i++)
        if (g->reqs[i]) engine_request_release(g->reqs[i]);
    for (int i = 0; i < g->n_ch && g->ch; i++) {
        tok_decoder_free(g->ch[i].dec);
        buf_free(&g->ch[i].text);
    }
    free(g->ch);
    free(g->reqs);
    free(g->seen);
    prompts_free(g->prompts, g->n_prompts);
    lora_release(g->s, g->p.lora); /* after the releases: their aborts are queued ahead of any slot change */
    g->p.lora = 0;
    gen_params_free(&g->p);
    if (g->counted) atomic_fetch_sub(&g->s->inflight, 1);
    g->counted = 0;
    g->reqs = NULL;
    g->ch = NULL;
    g->prompts = NULL;
}

/* ---- consuming ---- */
/* Earliest stop-string match in text[from..n): position and length. */
static int find_stop(const Gen *g, const Buf *t, size_t from, size_t *pos, size_t *len, const char **which) {
    int hit = 0;
    for (int i = 0; i < g->p.n_stop; i++) {
        const char *m = memmem(t->p + from, t->n - from, g->p.stop[i], strlen(g->p.stop[i]));
        if (m && (!hit || (size_t)(m - t->p) < *pos)) {
            hit = 1;
            *pos = (size_t)(m - t->p);
            *len = strlen(g->p.stop[i]);
            *which = g->p.stop[i];
        }
    }
    return hit;
}

/* Append a decoded piece; 1 when it completed a stop string (text truncated, c->stop_str set). */
static int add_text(Gen *g, Choice *c, const char *s, size_t n) {
    size_t old = c->text.n;
    buf_append(&c->text, s, n);
    if (!g->p.n_stop || n == 0) return 0;
    size_t back = g->p.stop_maxlen - 1, from = old > back ? old - back : 0, pos = 0, len = 0;
    if (!find_stop(g, &c->text, from, &pos, &len, &c->stop_str)) return 0;
    c->text.n = g->p.include_stop_str ? pos + len : pos;
    c->text.p[c->text.n] = 0;
    return 1;
}

/* Reasoning tokens, as the qwen3 parser splits the text (tool_parse.h): when
 * the output starts with <think>, every token up to the one that completes
 * </think> (all of them while it is not closed). */
#define THINK_OPEN "<think>"
#define THINK_CLOSE "</think>"
static void count_reasoning(Choice *c, int k, size_t old_n) {
    size_t n = c->text.n, lo = strlen(THINK_OPEN);
    if (c->reasoning_done) return;
    if (memcmp(c->text.p ? c->text.p : "", THINK_OPEN, n < lo ? n : lo) != 0) {
        c->reasoning_done = 1;
        c->reasoning_tokens = 0;
        return;
    }
    c->reasoning_tokens = k + 1;
    size_t back = strlen(THINK_CLOSE) - 1, from = old_n > back ? old_n - back : 0;
    if (n >= lo && memmem(c->text.p + from, n - from, THINK_CLOSE, strlen(THINK_CLOSE))) c->reasoning_done = 1;
}

static void choice_advance(Gen *g, Choice *c) {
    if (c->done) return;
    EngineSeqView v;
    engine_request_seq(c->r, c->seq, &v);
    for (int k = c->n_seen; k < v.n_tokens && !c->done; k++) {
        const char *piece;
        size_t n;
        tok_decoder_push(c->dec, v.tokens[k].token, &piece, &n);
        c->n_out = k + 1;
        c->n_seen = k + 1;
        size_t old_n = c->text.n;
        int hit = add_text(g, c, piece, n);
        if (g->count_reasoning) count_reasoning(c, k, old_n);
        if (hit) {
            c->done = 1;
            c->finish = "stop";
        }
    }
    if (!c->done && v.finish != FINISH_NONE && c->n_seen == v.n_tokens) {
        const char *piece;
        size_t n;
        tok_decoder_flush(c->dec, &piece, &n);
        add_text(g, c, piece, n);
        c->done = 1;
        c->finish = finish_reason_name(v.finish);
    }
    if (c->done && c->finish && !strcmp(c->finish, "stop") && v.finish == FINISH_NONE) {
        /* stopped by a stop string: abort the engine request once none of its
         * samples needs more tokens */
        int all = 1;
        for (int i = 0; i < g->n_ch; i++) all &= g->ch[i].r != c->r || g->ch[i].done;
        if (all) engine_abort(g->s->eng, c->r);
    }
}

void gen_render_begin(Gen *g) { g->alloc0 = alloc_failures(); }

int gen_failed(Gen *g, Err *err) {
    if (!g->failed && alloc_failures() != g->alloc0) {
        g->failed = 1;
        ERR(&g->fail, 503, "out of memory building the response; retry later, or lower n, max_tokens, "
            "logprobs/prompt_logprobs/echo or drop return_sampling_mask");
    }
    for (int i = 0; !g->failed && g->reqs && i < g->n_prompts; i++)
        if (g->reqs[i] && engine_request_failed(g->reqs[i], &g->fail)) g->failed = 1;
    if (!g->failed) return 0;
    if (err) *err = g->fail;
    for (int k = 0; k < g->n_prompts; k++) engine_abort(g->s->eng, g->reqs[k]);
    return 1;
}

void gen_stream_error(Gen *g, Buf *out) {
    int status = g->fail.code ? g->fail.code : 500;
    log_warn("stream %s failed -> %d: %s", g->id, status, g->fail.msg);
    sse_event_json(out, http_error_json(status, NULL, g->fail.msg));
}

/* Rendering could not allocate: the request fails (never a partial answer). */
static json_t *render_failed(Gen *g, const char *what) {
    if (!g->failed) {
        g->failed = 1;
        ERR(&g->fail, 503, "out of memory rendering %s; retry later, or lower n or max_tokens", what);
    }
    return json_null();
}

int gen_step(Gen *g, int timeout_ms) {
    if (gen_failed(g, NULL)) return 1;
    int pending = -1;
    for (int i = 0; i < g->n_ch; i++)
        if (!g->ch[i].done) { pending = g->ch[i].prompt_i; break; }
    if (pending < 0) return 1;
    int t = g->n_prompts > 1 && timeout_ms > 5 ? 5 : timeout_ms;
    engine_request_wait(g->reqs[pending], &g->seen[pending], t);
    for (int i = 0; i < g->n_ch; i++) choice_advance(g, &g->ch[i]);
    for (int i = 0; i < g->n_ch; i++)
        if (!g->ch[i].done) {
            if (http_fd_gone(g->fd)) {
                g->client_gone = 1;
                atomic_fetch_add(&g->s->metrics.stream_disconnects, 1);
                for (int k = 0; k < g->n_prompts; k++) engine_abort(g->s->eng, g->reqs[k]);
                return -1;
            }
            return 0;
        }
    return 1;
}

static double mono_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int gen_keepalive(Gen *g, Buf *out) {
    double now = mono_s();
    if (out->n || g->last_out == 0) {
        g->last_out = now;
        return 0;
    }
    if (now - g->last_out < 15.0) return 0;
    g->last_out = now;
    buf_puts(out, ": keep-alive\n\n");
    return 1;
}

size_t gen_emit_limit(const Gen *g, const Choice *c) {
    if (c->done || !g->p.n_stop) return c->text.n;
    size_t back = g->p.stop_maxlen - 1;
    if (c->text.n <= c->text_sent + back) return c->text_sent;
    return buf_utf8_floor(c->text.p, c->text.n - back);
}

/* ---- JSON pieces ---- */
json_t *gen_usage(const Gen *g) {
    long long pt = 0, ct = 0;
    for (int i = 0; i < g->n_prompts; i++) pt += (long long)g->prompts[i].n;
    for (int i = 0; i < g->n_ch; i++) ct += g->ch[i].n_out;
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(pt));
    json_object_set_new(u, "total_tokens", json_integer(pt + ct));
    json_object_set_new(u, "completion_tokens", json_integer(ct));
    long long cached = 0;
    for (int i = 0; i < g->n_prompts; i++) cached += engine_request_cached_tokens(g->reqs[i]);
    json_t *pd = json_object();
    json_object_set_new(pd, "cached_tokens", json_integer(cached));
    json_object_set_new(u, "prompt_tokens_details", pd);
    if (g->count_reasoning) {
        long long rt = 0;
        for (int i = 0; i < g->n_ch; i++) rt += g->ch[i].reasoning_tokens;
        json_t *cd = json_object();
        json_object_set_new(cd, "reasoning_tokens", json_integer(rt));
        json_object_set_new(u, "completion_tokens_details", cd);
    }
    return u;
}

json_t *gen_lp(float x) {
    if (isnan(x)) return json_null();
    return json_real(isinf(x) || x < -9999.0f ? -9999.0 : (double)x);
}

char *gen_token_text(Gen *g, int32_t id) {
    char *out = NULL;
    size_t n;
    Err e = {0};
    if (tokenizer_decode(g->s->tok, &id, 1, false, &out, &n, &e) < 0 || !out) {
        alloc_failure_note(); /* the only way decode fails: the request fails (gen_failed) */
        out = strdup("");
    }
    return out;
}

/* A token as the logprobs fields name it: its text, or with
 * return_tokens_as_token_ids "token_id:N" (vLLM), for tokens whose text is
 * not valid UTF-8 on its own. malloc'd, as gen_token_text. */
static char *lp_token(Gen *g, int32_t id) {
    if (!g->p.ret_tokens_as_ids) return gen_token_text(g, id);
    char *s = NULL;
    if (asprintf(&s, "token_id:%d", (int)id) < 0) {
        alloc_failure_note();
        return strdup("");
    }
    return s;
}

static json_t *token_bytes(Gen *g, int32_t id) {
    const char *b;
    size_t n = 0;
    json_t *a = json_array();
    if (tokenizer_token_bytes(g->s->tok, id, &b, &n) == 0)
        for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer((unsigned char)b[i]));
    return a;
}

static long utf8_chars(const char *s) {
    long n = 0;
    for (; s && *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* The OpenAI logprobs of a record: its value and top list in the server's
 * --logprobs-mode (the engine computed both in that mode). */
static void rec_lp(const Gen *g, const TokenRecord *r, float *lp, const float **top) {
    (void)g;
    *lp = r->value;
    *top = r->top_logprobs;
}

void gen_record_lp(const Gen *g, const TokenRecord *r, float *lp, const float **top) { rec_lp(g, r, lp, top); }

json_t *gen_token_bytes(Gen *g, int32_t id) { return token_bytes(g, id); }

/* One position's completions top_logprobs, built as vLLM builds it: the
 * position's own token (id, text, lp) first, then the top ids in rank order
 * with its own id skipped, the first logprobs + 1 of these; keyed by decoded
 * text, where a later entry replaces an earlier one of the same text (vLLM's
 * dict comprehension). Sampled and echoed prompt tokens alike. */
static json_t *completions_top(Gen *g, int32_t id, const char *text, float lp, const int32_t *top_ids,
                               const float *top_lp, int n_top) {
    json_t *d = json_object();
    json_object_set_new(d, text, gen_lp(lp));
    for (int j = 0, kept = 1; j < n_top && kept < g->p.logprobs + 1; j++) {
        if (top_ids[j] == id) continue;
        char *a = lp_token(g, top_ids[j]);
        json_object_set_new(d, a, gen_lp(top_lp[j]));
        free(a);
        kept++;
    }
    return d;
}

static json_t *completions_lp_object(json_t *toks, json_t *lps, json_t *tops, json_t *offs) {
    json_t *o = json_object();
    json_object_set_new(o, "text_offset", offs);
    json_object_set_new(o, "token_logprobs", lps);
    json_object_set_new(o, "tokens", toks);
    json_object_set_new(o, "top_logprobs", tops);
    return o;
}

json_t *gen_logprobs_completions(Gen *g, Choice *c, int from, int to, long *offset) {
    EngineSeqView v;
    engine_request_seq(c->r, c->seq, &v);
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    for (int k = from; k < to; k++) {
        const TokenRecord *r = &v.tokens[k];
        float lp;
        const float *top;
        rec_lp(g, r, &lp, &top);
        char *t = gen_token_text(g, r->token), *name = lp_token(g, r->token);
        json_array_append_new(toks, json_string(name));
        json_array_append_new(lps, gen_lp(lp));
        json_array_append_new(offs, json_integer(*offset));
        *offset += utf8_chars(t);
        json_array_append_new(tops, completions_top(g, r->token, name, lp, r->top_ids, top, r->n_top));
        free(t);
        free(name);
    }
    return completions_lp_object(toks, lps, tops, offs);
}

int gen_prompt_logprobs_n(Gen *g, int pi) {
    return engine_request_prompt_logprobs(g->reqs[pi], NULL, NULL, NULL);
}

json_t *gen_logprobs_completions_prompt(Gen *g, int pi, long *offset) {
    const float *plp, *top_lp;
    const int32_t *top_ids;
    int n = engine_request_prompt_logprobs(g->reqs[pi], &plp, &top_ids, &top_lp);
    /* the engine's top-N per prompt position (gen_start): prompt_logprobs, else logprobs */
    int N = g->p.prompt_logprobs >= 0 ? g->p.prompt_logprobs : g->p.logprobs;
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    for (int k = 0; k < n; k++) {
        int32_t id = g->prompts[pi].ids[k];
        char *t = gen_token_text(g, id), *name = lp_token(g, id);
        json_array_append_new(toks, json_string(name));
        json_array_append_new(offs, json_integer(*offset));
        *offset += utf8_chars(t);
        free(t);
        t = name;
        if (k == 0) { /* no context before the first token: null, as in vLLM */
            json_array_append_new(lps, json_null());
            json_array_append_new(tops, json_null());
        } else {
            json_array_append_new(lps, gen_lp(plp[k]));
            json_array_append_new(tops, completions_top(g, id, t, plp[k], top_ids ? top_ids + (size_t)k * N : NULL,
                                                        top_lp ? top_lp + (size_t)k * N : NULL, top_ids ? N : 0));
        }
        free(t);
    }
    return completions_lp_object(toks, lps, tops, offs);
}

json_t *gen_logprobs_chat(Gen *g, Choice *c, int from, int to) {
    EngineSeqView v;
    engine_request_seq(c->r, c->seq, &v);
    json_t *content = json_array();
    for (int k = from; k < to; k++) {
        const TokenRecord *r = &v.tokens[k];
        float lp;
        const float *top;
        rec_lp(g, r, &lp, &top);
        char *t = lp_token(g, r->token);
        json_t *e = json_object();
        json_object_set_new(e, "token", json_string(t));
        json_object_set_new(e, "logprob", gen_lp(lp));
        json_object_set_new(e, "bytes", token_bytes(g, r->token));
        json_t *tl = json_array();
        for (int j = 0; j < r->n_top && j < g->p.logprobs; j++) {
            char *a = lp_token(g, r->top_ids[j]);
            json_t *x = json_object();
            json_object_set_new(x, "token", json_string(a));
            json_object_set_new(x, "logprob", gen_lp(top[j]));
            json_object_set_new(x, "bytes", token_bytes(g, r->top_ids[j]));
            json_array_append_new(tl, x);
            free(a);
        }
        json_object_set_new(e, "top_logprobs", tl);
        json_array_append_new(content, e);
        free(t);
    }
    return content;
}

/* Sampling masks of records [from, to): CSR over per-token id lists: a token
 * whose kept set is larger than half the vocab lists the excluded ids instead
 * (complement flag 1), whatever form the engine stores it in (ids, excluded
 * ids or a bitmap: engine_mask_expand). Binary (base64, little-endian) above
 * a size limit. A record without a mask cannot be published (engine_mask_pack),
 * so every list here is the exact set its token was drawn from. */
static json_t *mask_json(Gen *g, const TokenRecord *recs, int from, int to) {
    int vocab = g->s->vocab, T = to - from;
    int64_t *off = malloc(sizeof(int64_t) * (size_t)(T + 1));
    uint8_t *comp = malloc((size_t)(T ? T : 1));
    int64_t total = 0;
    for (int k = 0; k < T; k++) {
        const TokenRecord *r = &recs[from + k];
        total += r->mask_ids ? engine_mask_expand(r, vocab, 2 * (int64_t)r->mask_n > vocab, NULL) : 0;
    }
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(total ? total : 1));
    if (!off || !comp || !ids) {
        free(off); free(comp); free(ids);
        return NULL;
    }
    int64_t w = 0;
    for (int k = 0; k < T; k++) {
        const TokenRecord *r = &recs[from + k];
        int ex = 2 * (int64_t)r->mask_n > vocab;
        off[k] = w;
        comp[k] = (uint8_t)(r->mask_ids && ex);
        if (r->mask_ids) w += engine_mask_expand(r, vocab, ex, ids + w);
    }
    off[T] = w;
    json_t *o = json_object();
    int bin = w > g->s->cfg.mask_json_max_ids;
    json_object_set_new(o, "encoding", json_string(bin ? "csr_base64" : "csr"));
    json_object_set_new(o, "vocab_size", json_integer(vocab));
    json_object_set_new(o, "n_tokens", json_integer(T));
    if (bin) {
        Buf b = {0};
        buf_base64(&b, off, sizeof(int64_t) * (size_t)(T + 1));
        json_object_set_new(o, "offsets", json_stringn(b.p, b.n));
        b.n = 0;
        buf_base64(&b, ids, sizeof(int32_t) * (size_t)w);
        json_object_set_new(o, "ids", json_stringn(b.p ? b.p : "", b.n));
        b.n = 0;
        buf_base64(&b, comp, (size_t)T);
        json_object_set_new(o, "complement", json_stringn(b.p ? b.p : "", b.n));
        buf_free(&b);
    } else {
        json_t *a = json_array(), *i = json_array(), *cp = json_array();
        for (int k = 0; k <= T; k++) json_array_append_new(a, json_integer(off[k]));
        for (int64_t k = 0; k < w; k++) json_array_append_new(i, json_integer(ids[k]));
        for (int k = 0; k < T; k++) json_array_append_new(cp, json_integer(comp[k]));
        json_object_set_new(o, "offsets", a);
        json_object_set_new(o, "ids", i);
        json_object_set_new(o, "complement", cp);
    }
    free(off); free(comp); free(ids);
    return o;
}

/* Routed experts of the forward steps behind records [from, to) (record i:
 * input position n_prompt - 1 + i), and in the chunk that carries record 0
 * (from == 0 and to > 0, or a choice finished without records) also the
 * prompt's positions 0..n_prompt-2, so a trainer can replay the routing of
 * every input position. The prompt's routing goes out once and whole: the
 * engine publishes all of it before record 0 (engine_step: prompt outputs,
 * then samples), so an earlier chunk (a stream's first, while a long prompt
 * is still being prefilled in chunks) carries none of it, a record 0 without
 * all of it fails the request rather than send a part, and a choice aborted
 * before its first record sends the prompt's routing only if it is whole. */
static json_t *experts_json(Gen *g, Choice *c, const TokenRecord *recs, int from, int to) {
    int E = engine_experts_per_token(g->s->eng);
    if (E <= 0) return json_null();
    int top_k = g->s->model->cfg.top_k;
    json_t *o = json_object(), *ids = json_array();
    json_object_set_new(o, "num_moe_layers", json_integer(E / top_k));
    json_object_set_new(o, "top_k", json_integer(top_k));
    json_object_set_new(o, "n_tokens", json_integer(to - from));
    for (int k = from; k < to; k++)
        for (int j = 0; j < E; j++) json_array_append_new(ids, json_integer(recs[k].experts ? recs[k].experts[j] : -1));
    json_object_set_new(o, "ids", ids);
    const int32_t *pe = NULL;
    int n = from == 0 ? engine_request_prompt_experts(c->r, &pe) : 0, want = (int)g->prompts[c->prompt_i].n - 1;
    if (from == 0 && (to > 0 || (c->done && n == want))) {
        if (n != want && !g->failed) {
            g->failed = 1;
            ERR(&g->fail, 500, "the routing of %d of the %d prompt positions is missing: refusing to send a part",
                want - n, want);
        }
        json_t *p = json_array();
        for (int64_t k = 0; pe && k < (int64_t)n * E; k++) json_array_append_new(p, json_integer(pe[k]));
        json_object_set_new(o, "prompt_n_tokens", json_integer(pe ? n : 0));
        json_object_set_new(o, "prompt_ids", p);
    }
    return o;
}

void gen_rl_fields(Gen *g, Choice *c, int from, int to, json_t *obj) {
    EngineSeqView v;
    engine_request_seq(c->r, c->seq, &v);
    if (g->p.ret_token_ids) {
        json_t *a = json_array();
        for (int k = from; k < to; k++) json_array_append_new(a, json_integer(v.tokens[k].token));
        json_object_set_new(obj, "token_ids", a);
    }
    if (g->p.ret_sampler_lp) {
        json_t *a = json_array(), *w = json_array();
        for (int k = from; k < to; k++) {
            json_array_append_new(a, gen_lp(v.tokens[k].logprob));
            json_array_append_new(w, json_integer((json_int_t)server_weight_version(g->s, v.tokens[k].weight_version)));
        }
        json_object_set_new(obj, "sampler_logprobs", a);
        json_object_set_new(obj, "token_weight_versions", w);
        if (g->p.lora) {
            json_t *av = json_array();
            for (int k = from; k < to; k++) json_array_append_new(av, json_integer((json_int_t)v.tokens[k].adapter_version));
            json_object_set_new(obj, "token_adapter_versions", av);
        }
    }
    if (g->p.ret_raw_lp) {
        json_t *a = json_array();
        for (int k = from; k < to; k++) json_array_append_new(a, gen_lp(v.tokens[k].logprob_raw));
        json_object_set_new(obj, "raw_logprobs", a);
    }
    if (g->p.ret_mask) {
        json_t *m = mask_json(g, v.tokens, from, to);
        json_object_set_new(obj, "sampling_mask", m ? m : render_failed(g, "sampling masks"));
    }
    if (g->p.ret_experts) json_object_set_new(obj, "routed_experts", experts_json(g, c, v.tokens, from, to));
    if (g->p.ret_sampler_lp || g->p.ret_mask || g->p.ret_raw_lp || g->p.ret_token_ids) {
        /* structured outputs: true when every token here was drawn under the
         * grammar's mask (sampler_logprobs and sampling_mask are then those of
         * the constrained distribution; raw_logprobs are not constrained) */
        int all = g->p.grammar != NULL;
        for (int k = from; k < to && all; k++) all = v.tokens[k].grammar;
        json_object_set_new(obj, "grammar_mask_applied", json_boolean(all));
    }
}

json_t *gen_weight_versions(Gen *g, Choice *c) {
    EngineSeqView v;
    engine_request_seq(c->r, c->seq, &v);
    json_t *a = json_array();
    uint64_t last = 0;
    int any = 0;
    for (int k = 0; k < c->n_out; k++) {
        uint64_t x = server_weight_version(g->s, v.tokens[k].weight_version);
        if (any && x == last) continue;
        size_t i;
        json_t *e;
        int dup = 0;
        json_array_foreach(a, i, e) dup |= (uint64_t)json_integer_value(e) == x;
        if (!dup) json_array_append_new(a, json_integer((json_int_t)x));
        last = x;
        any = 1;
    }
    return a;
}

json_t *gen_prompt_logprobs(Gen *g, int pi) {
    const float *lp, *top_lp;
    const int32_t *top_ids;
    int n = engine_request_prompt_logprobs(g->reqs[pi], &lp, &top_ids, &top_lp);
    const int32_t *ranks = engine_request_prompt_ranks(g->reqs[pi]);
    int N = g->p.prompt_logprobs >= 0 ? g->p.prompt_logprobs : g->p.logprobs;
    json_t *a = json_array();
    for (int k = 0; k < n; k++) {
        if (k == 0) { json_array_append_new(a, json_null()); continue; }
        int32_t id = g->prompts[pi].ids[k];
        json_t *d = json_object();
        char key[16];
        int rank = ranks ? ranks[k] : 0; /* vLLM's: ids with log-prob >= the token's, in the whole vocab */
        json_t *e = json_object();
        char *t = gen_token_text(g, id);
        json_object_set_new(e, "logprob", gen_lp(lp[k]));
        json_object_set_new(e, "rank", rank ? json_integer(rank) : json_null());
        json_object_set_new(e, "decoded_token", json_string(t));
        free(t);
        snprintf(key, sizeof key, "%d", id);
        json_object_set_new(d, key, e);
        for (int j = 0; j < N && top_ids; j++) {
            int32_t tid = top_ids[(size_t)k * N + j];
            snprintf(key, sizeof key, "%d", tid);
            if (json_object_get(d, key)) continue;
            json_t *x = json_object();
            char *tt = gen_token_text(g, tid);
            json_object_set_new(x, "logprob", gen_lp(top_lp[(size_t)k * N + j]));
            json_object_set_new(x, "rank", json_integer(j + 1));
            json_object_set_new(x, "decoded_token", json_string(tt));
            free(tt);
            json_object_set_new(d, key, x);
        }
        json_array_append_new(a, d);
    }
    return a;
}
