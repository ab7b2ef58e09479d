/*
 * test_sampling.c - the sampler against a brute-force reference written
 * straight from the documented semantics (sampling.h): full sort of the row,
 * penalties from count arrays, kept set by direct predicates. Logit rows are
 * drawn with many exact ties so the boundary rules are exercised.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops.h" /* cpu_expf: the exp of sampling.h's semantics */
#include "sampling.h"
#include "test.h"

static uint64_t rng_state = 12345;
static double urand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) * 0x1.0p-53;
}
static float nrand(void) {
    double a = urand() + 1e-12, b = urand();
    return (float)(sqrt(-2 * log(a)) * cos(2 * M_PI * b));
}

/* ---- brute-force reference ---- */
typedef struct Ref {
    int greedy;
    int32_t token;
    int n_kept;
    uint8_t *kept;   /* [V] */
    double *p;       /* [V] kept probabilities */
    float *z;        /* [V] processed, temperature-scaled */
} Ref;

static const float *g_z;
static int cmp_desc(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (g_z[x] != g_z[y]) return g_z[x] > g_z[y] ? -1 : 1;
    return x < y ? -1 : 1;
}

static void ref_sample(Ref *r, int V, const float *logits, const SamplingParams *p,
                       const SampleHistory *h, const int32_t *eos, int n_eos, int seq, int pos) {
    float *z = r->z;
    for (int i = 0; i < V; i++) z[i] = isnan(logits[i]) ? -INFINITY : logits[i];
    if (p->n_allowed > 0) /* vLLM: the whitelist before everything else */
        for (int i = 0; i < V; i++) {
            int in = 0;
            for (int j = 0; j < p->n_allowed; j++) in |= p->allowed_ids[j] == i;
            if (!in) z[i] = -INFINITY;
        }
    for (int w = 0; w < p->n_bad_words; w++) { /* vLLM: ban the last token when the output ends with the rest */
        int a = p->bad_word_off[w], L = p->bad_word_off[w + 1] - a, match = L - 1 <= h->n_output;
        for (int j = 0; match && j < L - 1; j++) match = h->output[h->n_output - (L - 1) + j] == p->bad_word_ids[a + j];
        if (match) z[p->bad_word_ids[a + L - 1]] = -INFINITY;
    }
    for (int i = 0; i < p->n_logit_bias; i++) z[p->logit_bias_ids[i]] += p->logit_bias[i];
    if (h->n_output < p->min_tokens) {
        if (!p->ignore_eos) for (int i = 0; i < n_eos; i++) z[eos[i]] = -INFINITY;
        for (int i = 0; i < p->n_stop_ids; i++) z[p->stop_ids[i]] = -INFINITY;
    }
    int *cnt = calloc(V, sizeof(int)), *seen = calloc(V, sizeof(int));
    for (int i = 0; i < h->n_prompt; i++) seen[h->prompt[i]] = 1;
    for (int i = 0; i < h->n_output; i++) { seen[h->output[i]] = 1; cnt[h->output[i]]++; }
    for (int i = 0; i < V; i++) {
        if (seen[i] && p->repetition_penalty != 1.0f)
            z[i] = z[i] > 0 ? z[i] / p->repetition_penalty : z[i] * p->repetition_penalty;
        if (cnt[i] && (p->frequency_penalty != 0 || p->presence_penalty != 0)) {
            z[i] -= p->frequency_penalty * (float)cnt[i];
            z[i] -= p->presence_penalty;
        }
        if (isnan(z[i])) z[i] = -INFINITY;
    }
    free(cnt); free(seen);
    memset(r->kept, 0, V);
    memset(r->p, 0, V * sizeof(double));
    float zmax = -INFINITY;
    int am = 0;
    r->greedy = p->temperature == 0;
    if (!r->greedy) for (int i = 0; i < V; i++) z[i] /= p->temperature;
    for (int i = 0; i < V; i++) if (z[i] > zmax) { zmax = z[i]; am = i; }
    if (r->greedy || zmax == -INFINITY) {
        r->greedy = 1; r->token = am; r->n_kept = 1; r->kept[am] = 1; r->p[am] = 1;
        return;
    }
    /* candidates sorted by (z desc, id asc) */
    int32_t *ord = malloc(V * sizeof(int32_t));
    int n = 0;
    for (int i = 0; i < V; i++) if (z[i] > -INFINITY) ord[n++] = i;
    g_z = z;
    qsort(ord, n, sizeof(int32_t), cmp_desc);
    for (int i = 0; i < n; i++) r->kept[ord[i]] = 1;
    if (p->min_p > 0)
        for (int i = 0; i < n; i++) if (!(cpu_expf(z[ord[i]] - zmax) >= p->min_p)) r->kept[ord[i]] = 0;
    int m = 0; /* compact ord to the kept ones, keeping the order */
    for (int i = 0; i < n; i++) if (r->kept[ord[i]]) ord[m++] = ord[i];
    n = m;
    if (p->top_k > 0 && p->top_k < n) {
        float kth = z[ord[p->top_k - 1]];
        m = 0;
        for (int i = 0; i < n; i++) {
            if (z[ord[i]] >= kth) ord[m++] = ord[i];
            else r->kept[ord[i]] = 0;
        }
        n = m;
    }
    if (p->top_p < 1) {
        double S = 0;
        for (int i = 0; i < V; i++) if (r->kept[i]) S += (double)cpu_expf(z[i] - zmax);
        double cum = 0;
        int j = n - 1;
        for (int i = 0; i < n; i++) {
            cum += (double)cpu_expf(z[ord[i]] - zmax) / S;
            if (cum >= (double)p->top_p) { j = i; break; }
        }
        float v = z[ord[j]];
        for (int i = 0; i < n; i++) if (z[ord[i]] < v) r->kept[ord[i]] = 0;
    }
    free(ord);
    double S = 0;
    r->n_kept = 0;
    for (int i = 0; i < V; i++) if (r->kept[i]) { S += (double)cpu_expf(z[i] - zmax); r->n_kept++; }
    for (int i = 0; i < V; i++) if (r->kept[i]) r->p[i] = (double)cpu_expf(z[i] - zmax) / S;
    double u = sampling_uniform(p->seed, seq, pos) * S, cum = 0;
    r->token = -1;
    int last = -1;
    for (int i = 0; i < V; i++) {
        if (!r->kept[i]) continue;
        last = i;
        cum += (double)cpu_expf(z[i] - zmax);
        if (cum > u) { r->token = i; break; }
    }
    if (r->token < 0) r->token = last;
}

static void make_logits(float *l, int V, int mode) {
    for (int i = 0; i < V; i++) {
        float x = nrand() * 3;
        if (mode == 1) x = floorf(x * 2) / 2;       /* heavy ties */
        if (mode == 2) x = floorf(x) * 4;           /* few distinct, peaked */
        l[i] = x;
    }
}

static int32_t g_bad_off[4], g_bad_ids[6]; /* random_params' bad words */

static void random_params(SamplingParams *p, int V, int32_t *bias_ids, float *bias) {
    sampling_params_default(p);
    double t = urand();
    p->temperature = t < 0.15 ? 0.0f : (float)(0.3 + 1.5 * urand());
    if (urand() < 0.5) p->top_k = 1 + (int)(urand() * (urand() < 0.5 ? 10 : V));
    if (urand() < 0.5) p->top_p = (float)(0.05 + 0.95 * urand());
    if (urand() < 0.3) p->min_p = (float)(0.3 * urand());
    if (urand() < 0.3) p->repetition_penalty = (float)(0.7 + urand());
    if (urand() < 0.3) p->frequency_penalty = (float)(urand() - 0.3);
    if (urand() < 0.3) p->presence_penalty = (float)(urand() - 0.3);
    if (urand() < 0.3) {
        p->n_logit_bias = 4;
        for (int i = 0; i < 4; i++) { bias_ids[i] = (int)(urand() * V); bias[i] = (float)(urand() * 10 - 5); }
        bias[3] = -INFINITY;
        p->logit_bias_ids = bias_ids;
        p->logit_bias = bias;
    }
    p->seed = (uint64_t)(urand() * 1e9);
    p->has_seed = 1;
    static int32_t allowed[12];
    if (urand() < 0.2) { /* allowed_token_ids, repeats included */
        p->n_allowed = 1 + (int)(urand() * 12);
        for (int i = 0; i < p->n_allowed; i++) allowed[i] = (int)(urand() * V);
        p->allowed_ids = allowed;
    }
    if (urand() < 0.3) { /* bad words: one token, and longer words whose prefix is often there */
        p->n_bad_words = 3;
        g_bad_off[0] = 0; g_bad_off[1] = 1; g_bad_off[2] = 3; g_bad_off[3] = 6;
        for (int i = 0; i < 6; i++) g_bad_ids[i] = (int)(urand() * V);
        p->bad_word_off = g_bad_off;
        p->bad_word_ids = g_bad_ids;
    }
}

static void test_vs_bruteforce(int V, int iters) {
    Sampler *s = sampler_create(V);
    float *l = malloc(V * sizeof(float)), *lp = malloc(V * sizeof(float));
    int32_t *mask = malloc(V * sizeof(int32_t));
    Ref r = { .kept = malloc(V), .p = malloc(V * sizeof(double)), .z = malloc(V * sizeof(float)) };
    int32_t prompt[32], output[32], bias_ids[4], eos[2] = { 1, 2 };
    float bias[4];
    int bad_mask = 0, bad_tok = 0, bad_sum = 0, bad_lp = 0, bad_top = 0, bad_raw = 0, bad_mode = 0;
    for (int it = 0; it < iters; it++) {
        make_logits(l, V, it % 3);
        SamplingParams p;
        random_params(&p, V, bias_ids, bias);
        int np = (int)(urand() * 32), no = (int)(urand() * 32);
        for (int i = 0; i < np; i++) prompt[i] = (int)(urand() * V);
        for (int i = 0; i < no; i++) output[i] = (int)(urand() * V);
        if (urand() < 0.2) { p.min_tokens = 40; p.n_stop_ids = 1; p.stop_ids[0] = 3; }
        if (p.n_bad_words && no >= 2) { /* make the multi-token words' prefixes match the output's end */
            g_bad_ids[1] = output[no - 1];
            if (urand() < 0.5) { g_bad_ids[3] = output[no - 2]; g_bad_ids[4] = output[no - 1]; }
        }
        SampleHistory h = { prompt, np, output, no };
        int32_t top_ids[SAMPLING_MAX_TOP_N];
        float top_lp[SAMPLING_MAX_TOP_N];
        SampleWant w = { .raw_logprob = 1, .mode = LOGPROBS_SAMPLED, .top_n = 8, .top_ids = top_ids,
                         .top_logprobs = top_lp, .mask = mask };
        SampleResult res;
        int seq = it % 4, pos = 100 + it;
        sampler_sample(s, l, &p, &h, eos, 2, seq, pos, &w, &res);
        sampler_kept_logprobs(s, lp);
        ref_sample(&r, V, l, &p, &h, eos, 2, seq, pos);
        /* mask equals the brute-force kept set, ascending */
        int ok = res.n_kept == r.n_kept;
        for (int i = 0, k = 0; ok && i < V; i++) if (r.kept[i]) ok = mask[k++] == i;
        bad_mask += !ok;
        bad_tok += res.token != r.token;
        /* log-probs over the mask sum to 1, and match the reference probabilities */
        double sum = 0, maxerr = 0;
        for (int i = 0; i < V; i++) {
            if (r.kept[i]) {
                sum += exp((double)lp[i]);
                double e = fabs(exp((double)lp[i]) - r.p[i]);
                if (e > maxerr) maxerr = e;
            } else if (lp[i] != -INFINITY) maxerr = 1;
        }
        bad_sum += fabs(sum - 1) > 1e-6;
        bad_lp += maxerr > 1e-6 || fabs(res.logprob - lp[res.token]) > 0;
        /* top-N: ranked by processed z (id asc on ties) */
        int32_t *ord = malloc(V * sizeof(int32_t));
        for (int i = 0; i < V; i++) ord[i] = i;
        float *zz = r.z;
        if (p.temperature == 0) { /* greedy ranks by the pre-temperature z: same as r.z */ }
        g_z = zz;
        qsort(ord, V, sizeof(int32_t), cmp_desc);
        for (int i = 0; i < 8; i++) {
            if (top_ids[i] != ord[i]) bad_top++;
            if (top_lp[i] != lp[top_ids[i]]) bad_top++;
        }
        /* raw log-prob (vLLM raw_logprobs): log_softmax(l) in double, before
         * any processing, temperature included */
        double mx = -INFINITY, S = 0;
        for (int i = 0; i < V; i++) if (l[i] > mx) mx = l[i];
        for (int i = 0; i < V; i++) S += exp(l[i] - mx);
        double want = l[res.token] - mx - log(S);
        bad_raw += fabs(want - res.logprob_raw) > 1e-5;
        /* every mode against the brute force: value, rank and top list */
        double zmx = -INFINITY, zS = 0;
        for (int i = 0; i < V; i++) if (r.z[i] > zmx) zmx = r.z[i];
        for (int i = 0; i < V; i++) if (r.z[i] > -INFINITY) zS += exp(r.z[i] - zmx);
        double *ref_v = malloc(V * sizeof(double));
        int32_t *ord_raw = malloc(V * sizeof(int32_t));
        for (int i = 0; i < V; i++) ord_raw[i] = i;
        g_z = l;
        qsort(ord_raw, V, sizeof(int32_t), cmp_desc);
        for (int mode = LOGPROBS_RAW; mode <= LOGPROBS_SAMPLED; mode++) {
            for (int i = 0; i < V; i++) {
                int greedy = r.greedy;
                switch (mode) {
                case LOGPROBS_RAW: ref_v[i] = l[i] - mx - log(S); break;
                case LOGPROBS_RAW_LOGITS: ref_v[i] = l[i]; break;
                case LOGPROBS_PROCESSED: /* greedy: vLLM's log_softmax of the untruncated processed logits */
                    ref_v[i] = greedy ? (zmx == -INFINITY ? -INFINITY : r.z[i] - zmx - log(zS))
                                      : r.kept[i] ? log(r.p[i]) : -INFINITY; break;
                case LOGPROBS_PROCESSED_LOGITS: ref_v[i] = greedy || r.kept[i] ? r.z[i] : -INFINITY; break;
                default: ref_v[i] = r.kept[i] ? log(r.p[i]) : -INFINITY; break;
                }
            }
            SampleWant wm = { .value = 1, .mode = (LogprobsMode)mode, .top_n = 8, .top_ids = top_ids,
                              .top_logprobs = top_lp };
            SampleResult rm;
            sampler_sample(s, l, &p, &h, eos, 2, seq, pos, &wm, &rm);
            const int32_t *o = mode <= LOGPROBS_RAW_LOGITS ? ord_raw : ord;
            double tol = mode == LOGPROBS_RAW_LOGITS || mode == LOGPROBS_PROCESSED_LOGITS ? 0 : 1e-5;
            int lo = 0, hi = 0;
            for (int i = 0; i < V; i++) {
                lo += ref_v[i] > ref_v[rm.token] + 1e-4;
                hi += ref_v[i] >= ref_v[rm.token] - 1e-4;
            }
            /* below -80 the reference's float exp has underflowed (its log-prob is -inf or
             * rounded): there both need only agree that the value is that small */
#define SAME(v, r) (fabs((v) - (r)) <= tol || (isinf(r) && (v) == (r)) || (mode != LOGPROBS_RAW_LOGITS && \
                    mode != LOGPROBS_PROCESSED_LOGITS && (v) < -80 && (r) < -80))
            bad_mode += rm.token != res.token || !SAME(rm.value, ref_v[rm.token]);
            bad_mode += rm.rank < lo || rm.rank > hi || rm.rank < 1;
            for (int i = 0; i < 8; i++) {
                bad_mode += top_ids[i] != o[i];
                bad_mode += !SAME(top_lp[i], ref_v[top_ids[i]]);
            }
        }
        free(ref_v);
        free(ord_raw);
        free(ord);
    }
    T_ASSERT(bad_mask == 0, "V=%d: %d/%d masks differ from brute force", V, bad_mask, iters);
    T_ASSERT(bad_tok == 0, "V=%d: %d/%d tokens differ from brute force", V, bad_tok, iters);
    T_ASSERT(bad_sum == 0, "V=%d: %d/%d kept log-probs do not sum to 1 within 1e-6", V, bad_sum, iters);
    T_ASSERT(bad_lp == 0, "V=%d: %d/%d log-probs differ from the reference probabilities", V, bad_lp, iters);
    T_ASSERT(bad_top == 0, "V=%d: %d top-N mismatches", V, bad_top);
    T_ASSERT(bad_raw == 0, "V=%d: %d raw log-prob mismatches", V, bad_raw);
    T_ASSERT(bad_mode == 0, "V=%d: %d log-prob mode mismatches (value, rank or top list)", V, bad_mode);
    free(l); free(lp); free(mask); free(r.kept); free(r.p); free(r.z);
    sampler_free(s);
}

/* The draw over rows of several normaliser blocks (sampling.c keeps the running
 * sum at every 2048 ids and rescans only the block holding the crossing):
 * tokens equal the one-pass draw of ref_sample for mass spread over blocks,
 * concentrated in one block, blocks all -inf (equal running sums), every
 * truncation mode (top_k leaves the exp to the normaliser pass), and rows
 * with +inf logits (a NaN normaliser: the last kept id, as the one pass). */
static void test_draw_blocks(void) {
    int V = 5 * 2048 + 77;
    Sampler *s = sampler_create(V);
    float *l = malloc(V * sizeof(float));
    int32_t *mask = malloc(V * sizeof(int32_t));
    Ref r = { .kept = malloc(V), .p = malloc(V * sizeof(double)), .z = malloc(V * sizeof(float)) };
    SampleHistory h = { 0 };
    int bad = 0, bad_mask = 0, n = 0, blocks_hit[6] = { 0 };
    for (int it = 0; it < 240; it++) {
        int shape = it % 6;
        for (int i = 0; i < V; i++) {
            float v = nrand();
            if (shape == 1) v = (i / 2048 == (it / 6) % 6) ? 4 + v : v - 4;          /* one heavy block */
            else if (shape == 2) v = (i / 2048) % 2 ? -INFINITY : v;                  /* odd blocks banned */
            else if (shape == 3) v = i == 2047 || i == 2048 || i == 4095 ? 6.0f : -8; /* mass at block edges */
            else if (shape == 4 && i % 997 == 0) v = INFINITY;                       /* NaN normaliser */
            l[i] = v;
        }
        SamplingParams p;
        sampling_params_default(&p);
        p.seed = (uint64_t)it;
        if (shape == 5) p.top_k = 1 + it % 3000;
        if (it % 12 == 7) p.top_p = 0.7f;
        if (it % 12 == 11) p.min_p = 0.01f;
        if (it % 4 == 1) p.temperature = 0.5f;
        for (int d = 0; d < 8; d++, n++) {
            SampleWant w = { .mask = mask };
            SampleResult res;
            sampler_sample(s, l, &p, &h, NULL, 0, d, 100 + d, &w, &res);
            ref_sample(&r, V, l, &p, &h, NULL, 0, d, 100 + d);
            bad += res.token != r.token;
            int ok = res.n_kept == r.n_kept;
            for (int i = 0, k = 0; ok && i < V; i++) if (r.kept[i]) ok = mask[k++] == i;
            bad_mask += !ok;
            if (res.token >= 0 && res.token < V) blocks_hit[res.token / 2048]++;
        }
    }
    T_ASSERT(bad == 0, "block draw: %d of %d tokens differ from the one-pass draw", bad, n);
    T_ASSERT(bad_mask == 0, "block draw: %d of %d masks differ", bad_mask, n);
    for (int b = 0; b < 6; b++) T_ASSERT(blocks_hit[b] > 0, "no draw landed in block %d", b);
    free(l); free(mask); free(r.kept); free(r.p); free(r.z);
    sampler_free(s);
}

/* Explicit tie rules on a hand-made row. */
static void test_ties(void) {
    int V = 8;
    Sampler *s = sampler_create(V);
    float l[8] = { 1, 3, 2, 3, 2, 2, 0, -1 };
    int32_t mask[8];
    SampleWant w = { .mask = mask };
    SampleResult res;
    SampleHistory h = { 0 };
    SamplingParams p;
    sampling_params_default(&p);
    p.top_k = 3; /* values 3,3,2 -> the 3rd value is 2, tied with ids 2,4,5: all kept */
    sampler_sample(s, l, &p, &h, NULL, 0, 0, 0, &w, &res);
    T_ASSERT(res.n_kept == 5 && mask[0] == 1 && mask[1] == 2 && mask[2] == 3 && mask[3] == 4 &&
             mask[4] == 5, "top_k ties: kept %d", res.n_kept);
    sampling_params_default(&p);
    p.temperature = 0;
    sampler_sample(s, l, &p, &h, NULL, 0, 0, 0, &w, &res);
    T_ASSERT(res.token == 1 && res.logprob == 0 && res.n_kept == 1, "greedy picks the lowest tied id");
    sampler_free(s);
}

/* A sampled token depends only on (logits, history, seed, seq, pos): rows
 * sampled between other rows give the same token. Also the draw follows the
 * kept probabilities (loose chi-square bound over many seeds). */
static void test_seeded(void) {
    int V = 64;
    Sampler *s = sampler_create(V);
    float l[64], other[64];
    make_logits(l, V, 0);
    SampleHistory h = { 0 };
    SamplingParams p;
    sampling_params_default(&p);
    p.top_k = 10;
    int32_t toks[50];
    SampleResult res;
    for (int i = 0; i < 50; i++) {
        p.seed = 7;
        sampler_sample(s, l, &p, &h, NULL, 0, i % 3, i, NULL, &res);
        toks[i] = res.token;
    }
    int diff = 0;
    for (int i = 49; i >= 0; i--) { /* other order, other rows in between */
        make_logits(other, V, 1);
        SamplingParams q = p;
        q.seed = 99;
        sampler_sample(s, other, &q, &h, NULL, 0, 0, i, NULL, &res);
        p.seed = 7;
        sampler_sample(s, l, &p, &h, NULL, 0, i % 3, i, NULL, &res);
        diff += res.token != toks[i];
    }
    T_ASSERT(diff == 0, "%d seeded tokens changed when other rows were sampled around them", diff);
    /* different seq index -> different stream */
    int same = 0;
    for (int i = 0; i < 50; i++) {
        sampler_sample(s, l, &p, &h, NULL, 0, 5, i, NULL, &res);
        same += res.token == toks[i];
    }
    T_ASSERT(same < 50, "seq index does not change the stream");
    /* frequencies */
    float lp[64];
    int N = 20000, cnt[64] = { 0 };
    for (int i = 0; i < N; i++) {
        p.seed = (uint64_t)i;
        sampler_sample(s, l, &p, &h, NULL, 0, 0, 0, NULL, &res);
        cnt[res.token]++;
    }
    sampler_kept_logprobs(s, lp);
    double chi = 0;
    int df = -1;
    for (int i = 0; i < V; i++) {
        double e = N * exp(lp[i]);
        if (e > 0) { chi += (cnt[i] - e) * (cnt[i] - e) / e; df++; }
        else T_ASSERT(cnt[i] == 0, "id %d outside the kept set was drawn", i);
    }
    T_ASSERT(chi < df + 6 * sqrt(2.0 * df) + 10, "draw frequencies off: chi2 %.1f with %d dof", chi, df);
    sampler_free(s);
}

static void test_params_check(void) {
    SamplingParams p;
    Err e = { 0 };
    sampling_params_default(&p);
    T_ASSERT(sampling_params_check(&p, 100, &e) == 0, "defaults are valid");
    p.top_p = 0;
    T_ASSERT(sampling_params_check(&p, 100, &e) < 0 && e.code == 400, "top_p 0 rejected");
    sampling_params_default(&p);
    p.n_stop_ids = 1; p.stop_ids[0] = 100;
    T_ASSERT(sampling_params_check(&p, 100, &e) < 0 && e.code == 400, "stop id out of range rejected");
    sampling_params_default(&p);
    p.temperature = -1;
    T_ASSERT(sampling_params_check(&p, 100, &e) < 0, "negative temperature rejected");
}

/* sampler_logprob_of (prompt log-probs) against its definition: lp_i = (float)((double)(z_i -
 * zmax) - log S), S the double sum of cpu_expf(z_i - zmax) (sampling.h's exp), z the row with NaN as -inf; the rank is
 * the count of lp_i >= lp_id (as vLLM counts it), the top-N the N best ids (lp desc, id asc).
 * Rows: gaussian, heavy ties, few values, many floats a few ulps apart (distinct logits whose
 * log-probs round together: the rank's threshold search), with -inf / NaN / all -inf / +inf. */
static void test_logprob_of(int V, int iters) {
    Sampler *s = sampler_create(V);
    float *l = malloc(sizeof(float) * (size_t)V), *z = malloc(sizeof(float) * (size_t)V),
          *lp = malloc(sizeof(float) * (size_t)V);
    int32_t top_ids[20], want_ids[20];
    float top_lp[20];
    int bad = 0, merged = 0;
    for (int it = 0; it < iters; it++) {
        int mode = it % 6;
        if (mode < 3) make_logits(l, V, mode);
        else if (mode == 3) /* logits 1e-9 apart near 1e-3: distinct, their log-probs (~ -log V, ulp ~5e-7) not */
            for (int i = 0; i < V; i++) l[i] = 1e-3f + (float)(int)(urand() * 64) * 1e-9f;
        else if (mode == 4) { /* -inf and NaN among gaussian logits */
            make_logits(l, V, 0);
            for (int i = 0; i < V; i++) if (urand() < 0.2) l[i] = urand() < 0.5 ? -INFINITY : NAN;
        } else { /* all -inf, or one +inf */
            for (int i = 0; i < V; i++) l[i] = -INFINITY;
            if (it % 12 == 11) { make_logits(l, V, 0); l[(int)(urand() * V)] = INFINITY; }
        }
        float zmax = -INFINITY;
        for (int i = 0; i < V; i++) { z[i] = isnan(l[i]) ? -INFINITY : l[i]; if (z[i] > zmax) zmax = z[i]; }
        double S = 0;
        for (int i = 0; i < V; i++) if (z[i] > -INFINITY) S += (double)cpu_expf(z[i] - zmax);
        double ls = log(S);
        for (int i = 0; i < V; i++) lp[i] = (float)((double)(z[i] - zmax) - ls);
        int n_top = V < 20 ? V : 20;
        for (int k = 0; k < n_top; k++) { /* selection by (z desc, id asc): lp's order, its ties by id */
            int32_t best = -1;
            for (int32_t i = 0; i < V; i++) {
                int used = 0;
                for (int j = 0; j < k; j++) used |= want_ids[j] == i;
                if (!used && (best < 0 || z[i] > z[best])) best = i;
            }
            want_ids[k] = best;
        }
        for (int i = 1; i < V && mode == 3; i++) merged += z[i] != z[0] && lp[i] == lp[0];
        for (int q = 0; q < 4; q++) {
            int32_t id = q == 0 ? want_ids[0] : (int32_t)(urand() * V);
            int32_t rank = -1, want_rank = 0;
            for (int i = 0; i < V; i++) want_rank += lp[i] >= lp[id];
            float v = sampler_logprob_of(s, l, id, n_top, top_ids, top_lp, &rank);
            int ok = (memcmp(&v, &lp[id], 4) == 0 || (isnan(v) && isnan(lp[id]))) && rank == want_rank;
            for (int k = 0; k < n_top; k++)
                ok &= top_ids[k] == want_ids[k] && (memcmp(&top_lp[k], &lp[want_ids[k]], 4) == 0 ||
                                                    (isnan(top_lp[k]) && isnan(lp[want_ids[k]])));
            if (!ok && bad++ < 5)
                T_ASSERT(0, "V %d row %d (mode %d) id %d: lp %g rank %d, want %g rank %d", V, it, mode, id, v,
                         rank, lp[id], want_rank);
        }
    }
    T_ASSERT(bad == 0, "V %d: %d sampler_logprob_of results differ from the definition", V, bad);
    T_ASSERT(merged > 0, "V %d: no row had distinct logits with equal log-probs (the rank's hard case)", V);
    free(l);
    free(z);
    free(lp);
    sampler_free(s);
}

/* SampleResult.rank in every mode against sampler_rank_reference (each id's value on its own, the
 * count of values >= the token's): equal exactly, on the rows of test_logprob_of (ties, logits a few
 * ulps apart whose log-probs round together, -inf / NaN / all -inf / +inf), greedy and sampled, with
 * truncation, and with a grammar's allowed set (a bitset) half the time. */
static void test_value_rank(int V, int iters) {
    Sampler *s = sampler_create(V);
    float *l = malloc(sizeof(float) * (size_t)V);
    uint64_t *allowed = malloc(sizeof(uint64_t) * (size_t)((V + 63) / 64));
    int32_t bias_ids[4], eos[2] = { 1, 2 };
    float bias[4];
    int bad = 0, finite_ranks = 0;
    for (int it = 0; it < iters; it++) {
        int kind = it % 6;
        if (kind < 3) make_logits(l, V, kind);
        else if (kind == 3)
            for (int i = 0; i < V; i++) l[i] = 1e-3f + (float)(int)(urand() * 64) * 1e-9f;
        else if (kind == 4) {
            make_logits(l, V, 0);
            for (int i = 0; i < V; i++) if (urand() < 0.2) l[i] = urand() < 0.5 ? -INFINITY : NAN;
        } else {
            for (int i = 0; i < V; i++) l[i] = -INFINITY;
            if (it % 12 == 11) { make_logits(l, V, 0); l[(int)(urand() * V)] = INFINITY; }
        }
        SamplingParams p;
        random_params(&p, V, bias_ids, bias);
        SampleHistory h = { 0 };
        int use_allowed = urand() < 0.5;
        for (int w = 0; w < (V + 63) / 64; w++)
            allowed[w] = ((uint64_t)(urand() * 4294967296.0) << 32) | (uint64_t)(urand() * 4294967296.0);
        for (int mode = LOGPROBS_RAW; mode <= LOGPROBS_SAMPLED; mode++) {
            SampleWant w = { .value = 1, .mode = (LogprobsMode)mode, .allowed = use_allowed ? allowed : NULL };
            SampleResult r;
            sampler_sample(s, l, &p, &h, eos, 2, 0, 10 + it, &w, &r);
            int32_t want = sampler_rank_reference(s, l, (LogprobsMode)mode, r.value);
            finite_ranks += isfinite(r.value);
            if (r.rank != want && bad++ < 5)
                T_ASSERT(0, "V %d row %d (kind %d, mode %d, T %g, allowed %d): rank %d, reference %d (value %g)", V,
                         it, kind, mode, p.temperature, use_allowed, r.rank, want, r.value);
        }
    }
    T_ASSERT(bad == 0, "V %d: %d ranks differ from sampler_rank_reference", V, bad);
    T_ASSERT(finite_ranks > iters, "V %d: only %d finite values", V, finite_ranks);
    free(l);
    free(allowed);
    sampler_free(s);
}

int main(void) {
    test_logprob_of(50, 600);
    test_logprob_of(1000, 120);
    test_value_rank(50, 600);
    test_value_rank(1000, 120);
    test_ties();
    test_params_check();
    test_vs_bruteforce(50, 3000);
    test_vs_bruteforce(1000, 600);
    test_vs_bruteforce(151936, 12);
    test_seeded();
    test_draw_blocks();
    return T_DONE();
}
