/*
 * sampling_checks.h - the device sampler (Backend.sample_launch / sample_wait /
 * tokens_resolve, kernels/cuda/sampling.cu) against the CPU sampler
 * (sampler_sample, the reference), for both runners:
 * tests/gpu/emu/emu_check.cpp (the CPU emulation of CUDA, CI) and
 * tests/gpu/gpu_check.c (a GPU). Random rows, many parameter combinations,
 * rows sharing a logit row (n samples of a prompt), vocab 1000 and 151936 (the
 * real one, a few rows), with the rows built by sampling_device.c from the
 * same SamplingParams / history / SampleWant the CPU gets.
 *
 * Per row: the same token and kept set (size, and the device's packed form
 * bit for bit that of engine_mask_pack over the CPU's kept ids); the log-probs (sampled,
 * raw), the value in the row's log-prob mode and the top-N values within
 * 1e-5 (relative above 1), the same rank and top-N ids. A token or kept-set
 * difference is excused only by a near tie of the tie rule (dev_sample.h),
 * decided on the CPU's own numbers and matched to the difference seen: the
 * draw's u * S within 1e-9 of a cumulative boundary (same kept set, another
 * token); top_p's crossing within 1e-6 of a value boundary of the
 * distribution before top_p (another kept set). min_p has no excuse: both
 * sides compare the same exp_poly bits with it. Excused rows are counted and printed; more than
 * 1 in 50 excused fails (ties that often mean a real difference). Every
 * batch is launched into both slots before either is waited on (both must
 * give the same results), and tokens_resolve must turn placeholders -1 - r
 * into row r's token.
 * The includer defines bg (a CUDA backend) and n_pass / n_fail (op_checks.h).
 */
#ifndef SAMPLER_SAMPLING_CHECKS_H
#define SAMPLER_SAMPLING_CHECKS_H

#ifdef __cplusplus
extern "C" {
#endif
#include "dev_sample.h"
#include "engine.h"
#include "sampling.h"
#include "sampling_device.h"
#ifdef __cplusplus
}
#endif

/* a log-prob-like value: equal (both -inf, both NaN) or within 1e-5, relative above 1 */
static int sc_close(float a, float b) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    if (isinf(a) || isinf(b)) return a == b;
    double m = fabs((double)a) > 1 ? fabs((double)a) : 1;
    return fabs((double)a - b) <= 1e-5 * m;
}

static uint64_t sc_rng = 0x2545f4914f6cdd1dull;
static uint64_t sc_u64(void) {
    uint64_t z = (sc_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double sc_unif(void) { return (double)(sc_u64() >> 11) * (1.0 / 9007199254740992.0); }
static int sc_int(int n) { return (int)(sc_u64() % (uint64_t)n); }

/* One logit row: kind 0 gaussian-ish floats, 1 quantized (many exact ties),
 * 2 peaked (one dominant id), 3 with NaN and -inf entries; quantized rows
 * also tie their maximum. */
static void sc_fill_row(float *l, int V, int kind) {
    for (int i = 0; i < V; i++) {
        double g = (sc_unif() + sc_unif() + sc_unif() - 1.5) * 4.0;
        float x = (float)g;
        if (kind == 1) x = floorf(x * 2.0f) / 2.0f;
        if (kind == 3 && sc_int(97) == 0) x = sc_int(2) ? NAN : -INFINITY;
        l[i] = x;
    }
    if (kind == 2) l[sc_int(V)] = 25.0f;
    if (kind == 1) { /* the maximum tied by a few other ids: argmax and top-N tie rules */
        float mx = -INFINITY;
        for (int i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
        for (int k = 0; k < 3; k++) l[sc_int(V)] = mx;
    }
}

/* The parameters and history of one row (storage owned by the case). */
typedef struct ScCase {
    SamplingParams p;
    int32_t bias_ids[8];
    float bias[8];
    int32_t allowed[64];
    int32_t bw_off[4], bw_ids[8];
    int32_t hist[80]; /* prompt then output */
    int n_prompt, n_output;
    int seq_index, pos;
    SampleWant w;
    uint64_t *gram; /* [words] or NULL */
    int logit_row;
} ScCase;

static void sc_make_case(ScCase *c, int V, int logit_row, int words, uint64_t *gram_store) {
    memset(c, 0, sizeof *c);
    SamplingParams *p = &c->p;
    sampling_params_default(p);
    static const float temps[] = {0.0f, 0.7f, 1.0f, 1.3f};
    static const int topks[] = {0, 1, 3, 40, 0, 0};
    static const float topps[] = {1.0f, 0.95f, 0.6f, 0.2f, 1.0f};
    static const float minps[] = {0.0f, 0.0f, 0.02f, 0.3f};
    p->temperature = temps[sc_int(4)];
    p->top_k = topks[sc_int(6)];
    if (sc_int(8) == 0) p->top_k = V - 1;
    p->top_p = topps[sc_int(5)];
    p->min_p = minps[sc_int(4)];
    p->seed = sc_u64();
    c->n_prompt = 1 + sc_int(40);
    c->n_output = sc_int(40);
    for (int i = 0; i < c->n_prompt + c->n_output; i++) c->hist[i] = sc_int(4) ? sc_int(V) : sc_int(30); /* repeats */
    if (sc_int(3) == 0) {
        p->repetition_penalty = sc_int(2) ? 1.3f : 0.8f;
        p->frequency_penalty = sc_int(2) ? 0.4f : 0.0f;
        p->presence_penalty = sc_int(2) ? -0.3f : 0.5f;
    }
    if (sc_int(4) == 0) {
        p->n_logit_bias = 1 + sc_int(8);
        for (int i = 0; i < p->n_logit_bias; i++) {
            c->bias_ids[i] = i == 3 ? c->bias_ids[0] : sc_int(V); /* a repeated id adds twice */
            c->bias[i] = i == 1 ? -INFINITY : (float)(sc_unif() * 10 - 5);
        }
        p->logit_bias_ids = c->bias_ids;
        p->logit_bias = c->bias;
    }
    if (sc_int(8) == 0) {
        p->n_allowed = 1 + sc_int(64);
        for (int i = 0; i < p->n_allowed; i++) c->allowed[i] = sc_int(V);
        p->allowed_ids = c->allowed;
    }
    if (sc_int(6) == 0 && c->n_output > 0) {
        /* a one-token word, and a two-token word matching the output's end */
        p->n_bad_words = 2;
        c->bw_off[0] = 0; c->bw_off[1] = 1; c->bw_off[2] = 3;
        c->bw_ids[0] = sc_int(V);
        c->bw_ids[1] = c->hist[c->n_prompt + c->n_output - 1];
        c->bw_ids[2] = sc_int(V);
        p->bad_word_off = c->bw_off;
        p->bad_word_ids = c->bw_ids;
    }
    if (sc_int(6) == 0) {
        p->min_tokens = c->n_output + 1;
        p->n_stop_ids = 2;
        p->stop_ids[0] = sc_int(V);
        p->stop_ids[1] = sc_int(V);
    }
    c->seq_index = sc_int(8);
    c->pos = c->n_prompt + c->n_output;
    c->w.raw_logprob = sc_int(2);
    c->w.value = sc_int(2);
    c->w.mode = (LogprobsMode)sc_int(5);
    c->w.top_n = sc_int(3) == 0 ? 0 : sc_int(2) ? 5 : SAMPLING_MAX_TOP_N;
    if (sc_int(6) == 0) { /* a grammar: a random half of the ids, always a few */
        for (int i = 0; i < words; i++) gram_store[i] = sc_u64() | (i == 0 ? 0xffull : 0);
        if (V % 64) gram_store[words - 1] &= (1ull << (V % 64)) - 1;
        c->gram = gram_store;
        c->w.allowed = gram_store;
    }
    c->logit_row = logit_row;
}

static int sc_cmp_desc(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x > y ? -1 : x < y;
}

/* Near ties on the CPU's own numbers (the excuses of the header), for the
 * difference seen: set_differs 0 (same kept set, another token): the draw
 * only; 1: top_p's crossing (min_p needs none: exp_poly on both sides).
 * s: a Sampler of V; scratch lp [V], tmp [V]. */
static int sc_near_tie(Sampler *s, const float *row, const ScCase *c, int V, float *lp, double *tmp, int set_differs) {
    SampleHistory h = {c->hist, c->n_prompt, c->hist + c->n_prompt, c->n_output};
    SampleResult r;
    SampleWant w = c->w;
    w.top_n = 0; w.value = 0; w.raw_logprob = 0; w.mask = NULL;
    int32_t eos = 0;
    if (!set_differs) { /* the draw: u against the cumulative kept mass in ascending ids */
        sampler_sample(s, row, &c->p, &h, &eos, 1, c->seq_index, c->pos, &w, &r);
        sampler_kept_logprobs(s, lp);
        double u = sampling_uniform(c->p.seed, (uint64_t)c->seq_index, (uint64_t)c->pos), cum = 0;
        for (int i = 0; i < V; i++) {
            if (lp[i] == -INFINITY) continue;
            cum += exp((double)lp[i]);
            if (fabs(cum - u) <= 1e-9) return 1;
        }
        return 0;
    }
    if (c->p.top_p < 1.0f && c->p.temperature > 0) { /* value boundaries of the distribution before top_p */
        SamplingParams q = c->p;
        q.top_p = 1.0f;
        sampler_sample(s, row, &q, &h, &eos, 1, c->seq_index, c->pos, &w, &r);
        sampler_kept_logprobs(s, lp);
        int n = 0;
        for (int i = 0; i < V; i++) if (lp[i] > -INFINITY) tmp[n++] = lp[i];
        qsort(tmp, (size_t)n, sizeof(double), sc_cmp_desc);
        double cm_ = 0;
        for (int i = 0; i < n; i++) {
            cm_ += exp(tmp[i]);
            if ((i + 1 == n || tmp[i + 1] != tmp[i]) && fabs(cm_ - c->p.top_p) <= 1e-6) return 1;
        }
    }
    return 0;
}

/* One batch: n_rows rows over n_lrows logit rows of V. Returns rows checked. */
static int sc_batch(int V, int n_lrows, int n_rows, int *excused, int *bad_rows) {
    int words = (V + 63) / 64;
    DevSampleCaps caps = {n_rows, V, n_rows * 256, n_rows * 2 * words};
    Err err = {0};
    if (bg->sample_reserve(bg, &caps, &err)) {
        printf("  FAIL sample_reserve: %s\n", err.msg);
        n_fail++;
        return 0;
    }
    float *logits = (float *)xmalloc(sizeof(float) * (size_t)n_lrows * V);
    for (int r = 0; r < n_lrows; r++) sc_fill_row(logits + (size_t)r * V, V, sc_int(4));
    ScCase *cs = (ScCase *)xcalloc((size_t)n_rows, sizeof *cs);
    uint64_t *gram = (uint64_t *)xmalloc(sizeof(uint64_t) * (size_t)n_rows * words);
    DevSampleBuilder *bld = dev_sample_builder_create(&caps);
    dev_sample_builder_reset(bld);
    int32_t eos = 0; /* id 0 is the model's EOS here */
    for (int r = 0; r < n_rows; r++) {
        sc_make_case(&cs[r], V, sc_int(n_lrows), words, gram + (size_t)r * words);
        ScCase *c = &cs[r];
        SampleHistory h = {c->hist, c->n_prompt, c->hist + c->n_prompt, c->n_output};
        c->w.mask = sc_int(3) ? (int32_t *)1 : NULL; /* a flag only: the builder reads no output pointer */
        int k = dev_sample_builder_add(bld, c->logit_row, &c->p, &h, &eos, 1, c->seq_index, c->pos, &c->w);
        if (k != r) { printf("  FAIL builder refused row %d\n", r); n_fail++; }
    }
    float *dl = (float *)dev_copy(logits, sizeof(float) * (size_t)n_lrows * V);
    const DevSampleBatch *bt = dev_sample_builder_batch(bld);
    const int W = DEV_MASK_WORDS(V);
    /* both slots in flight, then both waited on: slot 1's launch must not touch slot 0's results */
    const DevSampleOut *o0 = NULL, *o1 = NULL;
    const int32_t *p0 = NULL, *p1 = NULL;
    int rc = bg->sample_launch(bg, dl, n_lrows, V, bt, 0, &err) || bg->sample_launch(bg, dl, n_lrows, V, bt, 1, &err);
    /* placeholders of the last launch resolved on the device: -1 - r -> row r's token, others kept */
    int32_t *ph = (int32_t *)xmalloc(sizeof(int32_t) * (size_t)(n_rows + 2));
    for (int r = 0; r < n_rows; r++) ph[r] = -1 - (n_rows - 1 - r);
    ph[n_rows] = 5;
    ph[n_rows + 1] = 0;
    int32_t *dph = (int32_t *)dev_copy(ph, sizeof(int32_t) * (size_t)(n_rows + 2));
    int rr = rc ? -1 : bg->tokens_resolve(bg, dph, n_rows + 2, n_rows);
    rc = rc || bg->sample_wait(bg, 1, &o1, &p1, &err) || bg->sample_wait(bg, 0, &o0, &p0, &err);
    if (rc) { printf("  FAIL sample: %s\n", err.msg); n_fail++; }
    int same_slots = !rc && memcmp(o0, o1, sizeof(DevSampleOut) * (size_t)n_rows) == 0 &&
                     (bt->n_masks == 0 || memcmp(p0, p1, sizeof(int32_t) * (size_t)bt->n_masks * W) == 0);
    int resolved = 0;
    if (!rc && rr == 0) {
        CUDA_CHECK(cudaMemcpy(ph, dph, sizeof(int32_t) * (size_t)(n_rows + 2), cudaMemcpyDeviceToHost));
        resolved = ph[n_rows] == 5 && ph[n_rows + 1] == 0;
        for (int r = 0; r < n_rows; r++) resolved &= ph[r] == o0[n_rows - 1 - r].token;
    }
    if (!rc && (!same_slots || !resolved)) {
        printf("  FAIL device sampler: %s\n", !same_slots ? "two slots in flight gave different results"
                                                          : "tokens_resolve did not give the sampled tokens");
        n_fail++;
    }
    CUDA_CHECK(cudaFree(dph));
    free(ph);
    const DevSampleOut *out = o0;
    int32_t *dmask = (int32_t *)xmalloc(sizeof(int32_t) * (size_t)V), *hpack = (int32_t *)xmalloc(sizeof(int32_t) * (size_t)W);
    Sampler *s = sampler_create(V);
    int32_t *cmask = (int32_t *)xmalloc(sizeof(int32_t) * (size_t)V);
    float *lp = (float *)xmalloc(sizeof(float) * (size_t)V);
    double *tmp = (double *)xmalloc(sizeof(double) * (size_t)V);
    int checked = 0;
    for (int r = 0; r < n_rows && !rc; r++) {
        ScCase *c = &cs[r];
        const float *row = logits + (size_t)c->logit_row * V;
        SampleHistory h = {c->hist, c->n_prompt, c->hist + c->n_prompt, c->n_output};
        int32_t top_ids[SAMPLING_MAX_TOP_N], dtop_ids[SAMPLING_MAX_TOP_N];
        float top_lp[SAMPLING_MAX_TOP_N], dtop_lp[SAMPLING_MAX_TOP_N];
        SampleWant w = c->w, dw = c->w;
        w.mask = c->w.mask ? cmask : NULL;
        w.top_ids = top_ids; w.top_logprobs = top_lp;
        dw.top_ids = dtop_ids; dw.top_logprobs = dtop_lp;
        SampleResult cr, dr;
        sampler_sample(s, row, &c->p, &h, &eos, 1, c->seq_index, c->pos, &w, &cr);
        dev_sample_result(&out[r], &dw, &dr);
        const char *why = NULL;
        /* the device's packed set: its ids for the comparison, its bits against engine_mask_pack's */
        int same_pack = 1;
        if (c->w.mask) {
            const DevSampleRow *dr_row = &bt->rows[r];
            const int32_t *dp = p0 + (size_t)dr_row->mask_slot * W;
            int form = -1, len = engine_mask_pack(cmask, cr.n_kept, V, cr.token, hpack, W, &form);
            TokenRecord t;
            memset(&t, 0, sizeof t);
            t.mask_n = out[r].n_kept;
            t.mask_complement = out[r].mask_form;
            t.mask_len = out[r].mask_len;
            t.mask_ids = dp;
            int fl = 0;
            if (dr_row->mask_slot < 0 || out[r].mask_form != dev_mask_form(out[r].n_kept, V, &fl) ||
                out[r].mask_len != fl || engine_mask_expand(&t, V, 0, dmask) != out[r].n_kept)
                same_pack = 0, memset(dmask, 0xff, sizeof(int32_t) * (size_t)V);
            else if (cr.token == dr.token && cr.n_kept == dr.n_kept)
                same_pack = len == out[r].mask_len && form == out[r].mask_form &&
                            memcmp(hpack, dp, sizeof(int32_t) * (size_t)(len > 0 ? len : 0)) == 0;
        }
        int same_set = cr.n_kept == dr.n_kept &&
                       (!c->w.mask || memcmp(cmask, dmask, sizeof(int32_t) * (size_t)cr.n_kept) == 0);
        if (!same_pack) why = "packed kept set";
        else if (cr.token != dr.token || !same_set) {
            int set_differs = !same_set;
            if (sc_near_tie(s, row, c, V, lp, tmp, set_differs)) {
                (*excused)++;
                checked++;
                continue;
            }
            why = cr.token != dr.token ? "token" : "kept set";
        } else if (!sc_close(cr.logprob, dr.logprob)) why = "logprob";
        else if (c->w.raw_logprob && !sc_close(cr.logprob_raw, dr.logprob_raw)) why = "raw logprob";
        else if (c->w.value && (!sc_close(cr.value, dr.value) || cr.rank != dr.rank)) why = "value / rank";
        else
            for (int j = 0; j < c->w.top_n && !why; j++)
                if (top_ids[j] != dtop_ids[j] || !sc_close(top_lp[j], dtop_lp[j])) why = "top-N";
        if (why) {
            if ((*bad_rows)++ < 6)
                printf("       row %d (V %d, T %g, k %d, p %g, min_p %g, pen %g/%g/%g, bias %d, allowed %d, bad %d, "
                       "min_tokens %d, grammar %d, mode %d, top_n %d): %s differs: cpu token %d lp %.7g n_kept %d "
                       "raw %.7g value %.7g rank %d, gpu token %d lp %.7g n_kept %d raw %.7g value %.7g rank %d\n",
                       r, V, c->p.temperature, c->p.top_k, c->p.top_p, c->p.min_p, c->p.repetition_penalty,
                       c->p.frequency_penalty, c->p.presence_penalty, c->p.n_logit_bias, c->p.n_allowed,
                       c->p.n_bad_words, c->p.min_tokens, c->gram != NULL, c->w.mode, c->w.top_n, why, cr.token,
                       cr.logprob, cr.n_kept, cr.logprob_raw, cr.value, cr.rank, dr.token, dr.logprob, dr.n_kept,
                       dr.logprob_raw, dr.value, dr.rank);
        }
        checked++;
    }
    free(dmask);
    free(hpack);
    free(cmask);
    free(lp);
    free(tmp);
    sampler_free(s);
    CUDA_CHECK(cudaFree(dl));
    dev_sample_builder_free(bld);
    free(gram);
    free(cs);
    free(logits);
    return checked;
}

/* A batch over the reserved caps and a row naming a logit row out of range
 * are refused with an error, nothing sampled. */
static void sc_refusals(void) {
    DevSampleCaps caps = {2, 100, 8, 4};
    Err err = {0};
    int ok = bg->sample_reserve(bg, &caps, &err) == 0;
    DevSampleRow rows[3];
    memset(rows, 0, sizeof rows);
    for (int i = 0; i < 3; i++) { rows[i].temperature = 1; rows[i].top_p = 1; rows[i].repetition = 1;
                                  rows[i].allow_off = rows[i].gram_off = -1; }
    DevSampleBatch b = {0};
    b.rows = rows;
    for (int i = 0; i < 3; i++) rows[i].mask_slot = -1;
    const DevSampleOut *out;
    const int32_t *packed;
    float *dl = (float *)dev_poisoned(sizeof(float) * 200);
    b.n_rows = 3;
    ok &= bg->sample_launch(bg, dl, 2, 100, &b, 0, &err) != 0; /* over max_rows */
    b.n_rows = 1;
    rows[0].logit_row = 2;
    ok &= bg->sample_launch(bg, dl, 2, 100, &b, 0, &err) != 0; /* logit row out of range */
    rows[0].logit_row = 0;
    rows[0].n_ban = 1;
    ok &= bg->sample_launch(bg, dl, 2, 100, &b, 0, &err) != 0; /* a list slice past the batch's arrays */
    rows[0].n_ban = 0;
    rows[0].flags = DEV_SAMPLE_MASK;
    ok &= bg->sample_launch(bg, dl, 2, 100, &b, 0, &err) != 0; /* a mask row without its slot */
    rows[0].flags = 0;
    ok &= bg->sample_launch(bg, dl, 2, 100, &b, DEV_SAMPLE_SLOTS, &err) != 0; /* no such slot */
    ok &= bg->sample_wait(bg, 0, &out, &packed, &err) != 0; /* nothing launched */
    /* a good batch from here: a slot launched twice without its wait is refused */
    ok &= bg->sample_launch(bg, dl, 2, 100, &b, 0, &err) == 0 && bg->sample_launch(bg, dl, 2, 100, &b, 0, &err) != 0 &&
          bg->sample_wait(bg, 0, &out, &packed, &err) == 0;
#ifdef EMU_CUDA_RUNTIME_H
    /* the emulation's fault injection: each CUDA call of a reserve fails in turn; the
     * reserve reports it (nothing leaked, nothing used after its free: ASan) and a
     * sample before the next good reserve is refused */
    for (int k = 1; k <= 24; k++) {
        emu_fail_nth(k);
        int rc = bg->sample_reserve(bg, &caps, &err);
        int fired = emu_failed();
        emu_fail_nth(0);
        if (!fired) break;
        ok &= rc != 0 && bg->sample_launch(bg, dl, 2, 100, &b, 0, &err) != 0;
    }
    ok &= bg->sample_reserve(bg, &caps, &err) == 0 && bg->sample_launch(bg, dl, 2, 100, &b, 0, &err) == 0 &&
          bg->sample_wait(bg, 0, &out, &packed, &err) == 0;
#endif
    CUDA_CHECK(cudaFree(dl));
    ok ? n_pass++ : n_fail++;
    printf("  %-4s device sampler refuses a batch over its caps and rows out of range%s\n", ok ? "ok" : "FAIL",
#ifdef EMU_CUDA_RUNTIME_H
           "; a failed reserve is an error"
#else
           ""
#endif
    );
}

/* vocab 1000: batches mixing every parameter; vocab 151936: a few rows (on a
 * GPU, more of them). */
static void sampling_checks_run(int on_gpu) {
    if (!bg->sample_launch || !bg->sample_wait || !bg->tokens_resolve || !bg->sample_reserve) {
        printf("  FAIL the CUDA backend has no sample op\n");
        n_fail++;
        return;
    }
    sc_refusals();
    /* EMU_QUICK (sanitizer builds: one OS thread per emulated CUDA thread): a quarter of the rows */
    int quick = !on_gpu && getenv("EMU_QUICK") != NULL;
    struct { int V, n_lrows, n_rows, batches; } plan[] = {
        {1000, 6, 24, on_gpu ? 40 : quick ? 2 : 10},
        {64, 2, 8, quick ? 1 : 4},
        {151936, 2, on_gpu ? 32 : quick ? 2 : 4, on_gpu ? 4 : 1},
    };
    for (size_t i = 0; i < sizeof plan / sizeof plan[0]; i++) {
        int excused = 0, bad = 0, checked = 0;
        for (int k = 0; k < plan[i].batches; k++)
            checked += sc_batch(plan[i].V, plan[i].n_lrows, plan[i].n_rows, &excused, &bad);
        int ok = bad == 0 && checked == plan[i].n_rows * plan[i].batches && excused * 50 <= checked;
        ok ? n_pass++ : n_fail++;
        printf("  %-4s device sampling vs sampler_sample, vocab %d: %d rows, %d differ, %d near ties excused\n",
               ok ? "ok" : "FAIL", plan[i].V, checked, bad, excused);
    }
}

#endif
