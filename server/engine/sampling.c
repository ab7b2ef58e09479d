/*
 * sampling.c - the token sampler shared by every backend (see sampling.h for
 * the exact semantics). Works on one CPU row of f32 logits; never allocates
 * after sampler_create.
 *
 * Speed: a row of 151936 logits is scanned three times in the common case
 * (copy, scale and max; exp, 8 or 16 at a time, into Sampler.e; the
 * normaliser's sum), the draw reads one block of SUM_BLOCK ids: the
 * normaliser's running sum is kept at every block end (the draw's cumulative
 * sum is the same sequence of additions, so the block holding the crossing is
 * known without a second full pass, and the bits are those of the one-pass
 * draw). Truncation never sorts the whole row: top_k and top-N alternatives
 * keep a k-heap (one compare per id); top_p builds a mass histogram over
 * zmax - z to find the bucket holding the crossing and sorts (radix on packed
 * keys) only the ids at or above it, i.e. about the kept set.
 *
 * Not here: stop conditions, the logits.
 */
#define _GNU_SOURCE /* qsort_r */
#include "sampling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops.h"  /* cpu_exp_shift_to: a row's exponentials */
#include "exp_poly.h" /* exp_poly: one */

#define SUM_BLOCK 2048 /* ids per block of the normaliser's running sums */

struct Sampler {
    int vocab;
    float *z;        /* [vocab] processed logits of the last call */
    int32_t *idx;    /* [vocab] candidate ids for selection */
    float *e;        /* [vocab] cpu_expf(z - zmax) of the last call (0 for -inf); scratch after the draw */
    uint64_t *keys, *tmp; /* [vocab] sort keys (value desc, id asc) and radix scratch */
    int32_t *cnt;    /* [65537] radix counts */
    uint8_t *mark;   /* [vocab] penalty marks, all zero between calls */
    double *part;    /* [ceil(vocab / SUM_BLOCK)] running normaliser at each block's end */
    /* state of the last sampler_sample, for sampler_kept_logprobs */
    int greedy;
    int32_t token;
    float zmax, thr;
    double log_s;
    const uint64_t *gmask; /* [ceil(vocab / 64)] the grammar's allowed ids of this call, or NULL */
};

void sampling_params_default(SamplingParams *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->repetition_penalty = 1.0f;
    p->max_tokens = 16;
}

int sampling_params_check(const SamplingParams *p, int vocab, Err *err) {
    ENSURE(err, isfinite(p->temperature) && p->temperature >= 0, 400,
           "temperature must be >= 0 (got %g)", p->temperature);
    ENSURE(err, p->top_p > 0 && p->top_p <= 1, 400, "top_p must be in (0, 1] (got %g)", p->top_p);
    ENSURE(err, p->min_p >= 0 && p->min_p <= 1, 400, "min_p must be in [0, 1] (got %g)", p->min_p);
    ENSURE(err, isfinite(p->repetition_penalty) && p->repetition_penalty > 0, 400,
           "repetition_penalty must be > 0 (got %g)", p->repetition_penalty);
    ENSURE(err, isfinite(p->presence_penalty) && isfinite(p->frequency_penalty), 400,
           "presence_penalty and frequency_penalty must be finite");
    ENSURE(err, p->n_logit_bias >= 0 && (p->n_logit_bias == 0 || (p->logit_bias_ids && p->logit_bias)),
           400, "logit_bias: %d entries without arrays", p->n_logit_bias);
    for (int i = 0; i < p->n_logit_bias; i++) {
        ENSURE(err, p->logit_bias_ids[i] >= 0 && p->logit_bias_ids[i] < vocab, 400,
               "logit_bias: token id %d out of range [0, %d)", p->logit_bias_ids[i], vocab);
        ENSURE(err, !isnan(p->logit_bias[i]) && p->logit_bias[i] < INFINITY, 400,
               "logit_bias: value for token %d must be a number or -inf", p->logit_bias_ids[i]);
    }
    ENSURE(err, p->n_stop_ids >= 0 && p->n_stop_ids <= SAMPLING_MAX_STOP_IDS, 400,
           "at most %d stop token ids (got %d)", SAMPLING_MAX_STOP_IDS, p->n_stop_ids);
    for (int i = 0; i < p->n_stop_ids; i++)
        ENSURE(err, p->stop_ids[i] >= 0 && p->stop_ids[i] < vocab, 400,
               "stop token id %d out of range [0, %d)", p->stop_ids[i], vocab);
    ENSURE(err, p->n_bad_words >= 0 && (p->n_bad_words == 0 || (p->bad_word_off && p->bad_word_ids)), 400,
           "bad_words: %d entries without arrays", p->n_bad_words);
    for (int w = 0; w < p->n_bad_words; w++) {
        ENSURE(err, p->bad_word_off[w] >= 0 && p->bad_word_off[w + 1] > p->bad_word_off[w], 400,
               "bad_words: word %d has no tokens", w);
        for (int32_t i = p->bad_word_off[w]; i < p->bad_word_off[w + 1]; i++)
            ENSURE(err, p->bad_word_ids[i] >= 0 && p->bad_word_ids[i] < vocab, 400,
                   "bad_words: token id %d out of range [0, %d)", p->bad_word_ids[i], vocab);
    }
    ENSURE(err, p->n_allowed >= 0 && (p->n_allowed == 0 || p->allowed_ids), 400,
           "allowed_token_ids: %d entries without an array", p->n_allowed);
    for (int i = 0; i < p->n_allowed; i++)
        ENSURE(err, p->allowed_ids[i] >= 0 && p->allowed_ids[i] < vocab, 400,
               "allowed_token_ids: token id %d out of range [0, %d)", p->allowed_ids[i], vocab);
    ENSURE(err, p->min_tokens >= 0, 400, "min_tokens must be >= 0 (got %d)", p->min_tokens);
    ENSURE(err, p->max_tokens <= 0 || p->min_tokens <= p->max_tokens, 400,
           "min_tokens (%d) must be <= max_tokens (%d)", p->min_tokens, p->max_tokens);
    return 0;
}

Sampler *sampler_create(int vocab) {
    cpu_ops_init(); /* the exponentials' CPU path, chosen once here before any thread samples */
    Sampler *s = xcalloc(1, sizeof *s);
    s->vocab = vocab;
    s->z = xmalloc((size_t)vocab * sizeof(float));
    s->idx = xmalloc((size_t)vocab * sizeof(int32_t));
    s->e = xmalloc((size_t)vocab * sizeof(float));
    s->keys = xmalloc((size_t)vocab * sizeof(uint64_t));
    s->tmp = xmalloc((size_t)vocab * sizeof(uint64_t));
    s->cnt = xmalloc(65537 * sizeof(int32_t));
    s->mark = xcalloc((size_t)vocab, 1);
    s->part = xmalloc(((size_t)vocab + SUM_BLOCK - 1) / SUM_BLOCK * sizeof(double));
    return s;
}

void sampler_free(Sampler *s) {
    if (!s) return;
    free(s->z);
    free(s->idx);
    free(s->e);
    free(s->keys);
    free(s->tmp);
    free(s->cnt);
    free(s->mark);
    free(s->part);
    free(s);
}

/* ---- counter-based RNG: splitmix64 finaliser chained over the key ---- */
static uint64_t mix64(uint64_t x) {
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27; x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

double sampling_uniform(uint64_t seed, uint64_t seq_index, uint64_t pos) {
    uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ull);
    h = mix64(h ^ (seq_index * 0xd1b54a32d192ed03ull + 0x632be59bd9b4e019ull));
    h = mix64(h ^ (pos * 0xaef17502108ef2d9ull + 0x8cb92ba72f3d8dd7ull));
    return (double)(h >> 11) * 0x1.0p-53;
}

/* ---- ordering: (value desc, id asc), a strict total order ---- */
static inline int before(const float *z, int32_t a, int32_t b) {
    return z[a] > z[b] || (z[a] == z[b] && a < b);
}

static int cmp_before(const void *a, const void *b, void *ctx) {
    const float *z = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return before(z, x, y) ? -1 : before(z, y, x) ? 1 : 0;
}

static void sort_top(const float *z, int32_t *idx, int m) {
    qsort_r(idx, (size_t)m, sizeof(int32_t), cmp_before, (void *)z);
}

/* e[i] = exp(z[i] - zmax) (exp_poly: sampling.h) for the whole row, 8 or 16 at a time
 * (cpu_exp_shift_to, the same bits on every path); every normaliser then sums e over its ids in
 * id order, in double. */
static inline void exp_row(float *e, const float *z, int V, float zmax) { cpu_exp_shift_to(e, z, V, zmax); }

/* The same for the ids with z[i] >= thr only: the whole row when nothing is truncated, else
 * one by one (top_k keeps a few ids of the vocab). */
static void exp_kept(float *e, const float *z, int V, float zmax, float thr) {
    if (thr == -INFINITY) { exp_row(e, z, V, zmax); return; }
    for (int i = 0; i < V; i++) if (z[i] >= thr) e[i] = exp_poly(z[i] - zmax);
}

/* The k first ids in `before` order among ids with z >= lo (z > -inf),
 * sorted, into out [k]; returns how many there were (<= k). A min-heap on
 * `before` keeps the k best seen so far: one compare per id for small k. */
static int top_heap(const float *z, int V, int k, float lo, int32_t *out) {
    ASSERT(k > 0, "top_heap of %d ids", k);
    int n = 0;
    /* -inf, then z of the worst kept id once the heap is full: ids come in ascending order,
     * so a later id ties below every kept one and enters only above it (one compare per id) */
    float worst = -INFINITY;
    for (int32_t i = 0; i < V; i++) {
        float zi = z[i];
        if (!(zi > -INFINITY && zi >= lo) || !(zi > worst)) continue;
        if (n < k) { /* sift up */
            int c = n++;
            while (c > 0) {
                int p = (c - 1) / 2;
                if (!before(z, out[p], i)) break;
                out[c] = out[p];
                c = p;
            }
            out[c] = i;
            if (n == k) worst = z[out[0]];
        } else { /* replace the worst, sift down */
            int c = 0;
            for (;;) {
                int l = 2 * c + 1, r = l + 1, w = c;
                int32_t wv = i;
                if (l < n && before(z, wv, out[l])) { w = l; wv = out[l]; }
                if (r < n && before(z, wv, out[r])) { w = r; wv = out[r]; }
                if (w == c) break;
                out[c] = out[w];
                c = w;
            }
            out[c] = i;
            worst = z[out[0]];
        }
    }
    sort_top(z, out, n);
    return n;
}

/* Sort key: ascending key = (z desc, id asc). */
static inline uint64_t order_key(float v, int32_t id) {
    uint32_t u;
    memcpy(&u, &v, 4);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* ascending order of floats */
    return ((uint64_t)(~u) << 32) | (uint32_t)id;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* LSD radix sort, 4 passes of 16 bits; cnt [65537] scratch, tmp [n]. */
static void sort_keys(uint64_t *a, uint64_t *tmp, int32_t *cnt, int n) {
    if (n < 4096) { qsort(a, (size_t)n, sizeof(uint64_t), cmp_u64); return; }
    for (int shift = 0; shift < 64; shift += 16) {
        memset(cnt, 0, 65537 * sizeof(int32_t));
        for (int i = 0; i < n; i++) cnt[((a[i] >> shift) & 0xffff) + 1]++;
        for (int b = 0; b < 65536; b++) cnt[b + 1] += cnt[b];
        for (int i = 0; i < n; i++) tmp[cnt[(a[i] >> shift) & 0xffff]++] = a[i];
        memcpy(a, tmp, (size_t)n * sizeof(uint64_t));
    }
}

/* ---- processing: bias, min_tokens, penalties ---- */
static void apply_penalties(Sampler *s, const SamplingParams *p, const SampleHistory *h) {
    float *z = s->z;
    if (p->repetition_penalty != 1.0f) {
        float r = p->repetition_penalty;
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *ids = pass ? h->output : h->prompt;
            int n = pass ? h->n_output : h->n_prompt;
            for (int i = 0; i < n; i++) {
                int32_t t = ids[i];
                if (t < 0 || t >= s->vocab || (s->mark[t] & 1)) continue;
                s->mark[t] |= 1;
                z[t] = z[t] > 0 ? z[t] / r : z[t] * r;
            }
        }
    }
    if (p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f) {
        /* counts first, so that the penalty is applied once per id as
         * l -= f * count (vLLM multiplies; repeated subtraction would round differently) */
        for (int i = 0; i < h->n_output; i++) {
            int32_t t = h->output[i];
            if (t < 0 || t >= s->vocab) continue;
            if (!(s->mark[t] & 2)) { s->mark[t] |= 2; s->idx[t] = 0; }
            s->idx[t]++;
        }
        for (int i = 0; i < h->n_output; i++) {
            int32_t t = h->output[i];
            if (t < 0 || t >= s->vocab || !(s->mark[t] & 2) || (s->mark[t] & 4)) continue;
            s->mark[t] |= 4;
            z[t] -= p->frequency_penalty * (float)s->idx[t];
            z[t] -= p->presence_penalty;
        }
    }
    /* clear the marks: touch only what we set */
    for (int pass = 0; pass < 2; pass++) {
        const int32_t *ids = pass ? h->output : h->prompt;
        int n = pass ? h->n_output : h->n_prompt;
        for (int i = 0; i < n; i++)
            if (ids[i] >= 0 && ids[i] < s->vocab) s->mark[ids[i]] = 0;
    }
}

static void process(Sampler *s, const float *logits, const SamplingParams *p, const SampleHistory *h,
                    const int32_t *eos_ids, int n_eos, const uint64_t *allowed) {
    float *z = s->z;
    for (int i = 0; i < s->vocab; i++) z[i] = isnan(logits[i]) ? -INFINITY : logits[i];
    if (p->n_allowed > 0) { /* first, as vLLM: the whitelist (mark bit 8, cleared at once) */
        for (int i = 0; i < p->n_allowed; i++) s->mark[p->allowed_ids[i]] |= 8;
        for (int i = 0; i < s->vocab; i++) if (!(s->mark[i] & 8)) z[i] = -INFINITY;
        for (int i = 0; i < p->n_allowed; i++) s->mark[p->allowed_ids[i]] = 0;
    }
    for (int w = 0; w < p->n_bad_words; w++) { /* vLLM's bad words: on the output only */
        const int32_t *b = p->bad_word_ids + p->bad_word_off[w];
        int L = p->bad_word_off[w + 1] - p->bad_word_off[w];
        if (L - 1 > h->n_output) continue;
        if (L == 1 || !memcmp(h->output + h->n_output - (L - 1), b, (size_t)(L - 1) * sizeof(int32_t)))
            z[b[L - 1]] = -INFINITY;
    }
    for (int i = 0; i < p->n_logit_bias; i++) z[p->logit_bias_ids[i]] += p->logit_bias[i];
    if (h->n_output < p->min_tokens) {
        if (!p->ignore_eos)
            for (int i = 0; i < n_eos; i++)
                if (eos_ids[i] >= 0 && eos_ids[i] < s->vocab) z[eos_ids[i]] = -INFINITY;
        for (int i = 0; i < p->n_stop_ids; i++) z[p->stop_ids[i]] = -INFINITY;
    }
    if (allowed) /* the grammar: whole words of disallowed ids at a time */
        for (int w = 0; w < (s->vocab + 63) / 64; w++) {
            uint64_t m = allowed[w];
            if (m == ~0ull) continue;
            int i0 = w * 64, i1 = i0 + 64 < s->vocab ? i0 + 64 : s->vocab;
            for (int i = i0; i < i1; i++)
                if (!((m >> (i - i0)) & 1)) z[i] = -INFINITY;
        }
    apply_penalties(s, p, h);
    /* NaN can only appear where something was added (inf + -inf bias) */
    for (int i = 0; i < p->n_logit_bias; i++)
        if (isnan(z[p->logit_bias_ids[i]])) z[p->logit_bias_ids[i]] = -INFINITY;
}

/* Truncation thresholds on the temperature-scaled z (sampling.h). Returns
 * thr, the kept set being { i : z_i >= thr, z_i > -inf }. When min_p or top_p
 * need them it fills s->e[i] = exp(z_i - zmax) at least for every kept id
 * and sets *e_filled; otherwise (no truncation, or top_k alone) e is left to
 * the caller's normaliser pass (kept_sum), which fills it first. */
#define TOPP_BUCKETS 2048
#define TOPP_RANGE 32.0f /* buckets cover zmax - z in [0, 32); the last one takes the rest */
static float truncate_thr(Sampler *s, const SamplingParams *p, float zmax, int *e_filled) {
    const float *z = s->z;
    float *e = s->e;
    int V = s->vocab;
    float thr = -INFINITY;
    *e_filled = p->min_p > 0 || p->top_p < 1.0f;
    if (p->min_p > 0) {
        exp_row(e, z, V, zmax);
        float m = INFINITY;
        for (int i = 0; i < V; i++)
            if (z[i] > -INFINITY && e[i] >= p->min_p && z[i] < m) m = z[i];
        thr = m;
    }
    if (p->top_k > 0 && p->top_k < V) {
        int n = top_heap(z, V, p->top_k, thr, s->idx);
        if (n == p->top_k && z[s->idx[n - 1]] > thr) thr = z[s->idx[n - 1]];
    }
    /* e is only read for ids >= thr from here on */
    if (!*e_filled) return thr;
    if (!(p->min_p > 0)) exp_kept(e, z, V, zmax, thr);
    if (p->top_p < 1.0f) {
        /* The exact rule needs the cumulative sum in sorted order up to the
         * crossing. A mass histogram over zmax - z finds the bucket where the
         * crossing lies; only ids in that bucket and above (an upper set of
         * the values, so a prefix of the order) plus one bucket of margin are
         * sorted. If rounding put the crossing lower, retry with everything. */
        double S = 0, mass[TOPP_BUCKETS] = { 0 };
        const float scale = TOPP_BUCKETS / TOPP_RANGE;
        for (int i = 0; i < V; i++) {
            if (!(z[i] > -INFINITY && z[i] >= thr)) continue;
            S += (double)e[i];
            float d = (zmax - z[i]) * scale;
            int b = d < (float)(TOPP_BUCKETS - 1) ? (int)d : TOPP_BUCKETS - 1;
            mass[b] += (double)e[i];
        }
        double want = (double)p->top_p * S * (1 - 1e-9), cum = 0;
        int bmax = TOPP_BUCKETS - 1;
        for (int b = 0; b < TOPP_BUCKETS; b++) {
            cum += mass[b];
            if (cum >= want) { bmax = b + 1 < TOPP_BUCKETS - 1 ? b + 1 : TOPP_BUCKETS - 1; break; }
        }
        for (int pass = 0; pass < 2; pass++) {
            int n = 0;
            for (int i = 0; i < V; i++) {
                if (!(z[i] > -INFINITY && z[i] >= thr)) continue;
                float d = (zmax - z[i]) * scale;
                int b = d < (float)(TOPP_BUCKETS - 1) ? (int)d : TOPP_BUCKETS - 1;
                if (b <= bmax) s->keys[n++] = order_key(z[i], i);
            }
            sort_keys(s->keys, s->tmp, s->cnt, n);
            double c = 0;
            int j = -1;
            for (int i = 0; i < n; i++) {
                c += (double)e[(int32_t)(s->keys[i] & 0xffffffffu)] / S;
                if (c >= (double)p->top_p) { j = i; break; }
            }
            if (j >= 0) {
                float v = z[(int32_t)(s->keys[j] & 0xffffffffu)];
                if (v > thr) thr = v;
                break;
            }
            if (bmax == TOPP_BUCKETS - 1) break; /* rounding left it short: keep everything */
            bmax = TOPP_BUCKETS - 1;
        }
    }
    return thr;
}

/* The normaliser S = sum of e_i over the kept ids in id order, one double
 * addition per id (the order every draw and log-prob of this file uses), with
 * e_i = exp(z_i - zmax) computed here unless truncate_thr did (fill_e = 0).
 * s->part[b] gets the running sum after block b; *nk the kept count, *last
 * the highest kept id (-1 if none). */
static double kept_sum(Sampler *s, float thr, float zmax, int fill_e, int *nk, int32_t *last) {
    const float *z = s->z;
    float *e = s->e;
    int V = s->vocab, n = 0;
    int32_t l = -1;
    double S = 0;
    if (fill_e) exp_kept(e, z, V, zmax, thr);
    for (int b = 0; b * SUM_BLOCK < V; b++) {
        int i1 = (b + 1) * SUM_BLOCK < V ? (b + 1) * SUM_BLOCK : V;
        for (int i = b * SUM_BLOCK; i < i1; i++) {
            if (!(z[i] > -INFINITY && z[i] >= thr)) continue;
            S += (double)e[i];
            n++;
            l = i;
        }
        s->part[b] = S;
    }
    *nk = n;
    *last = l;
    return S;
}

/* The first kept id whose running sum exceeds u, or -1: the block is found on
 * s->part (running sums only grow: every e_i >= 0, and a NaN never compares
 * above), then rescanned from the sum before it with the same additions. */
static int32_t draw_from_parts(const Sampler *s, float thr, double u) {
    const float *z = s->z, *e = s->e;
    int V = s->vocab, nb = (V + SUM_BLOCK - 1) / SUM_BLOCK;
    for (int b = 0; b < nb; b++) {
        if (!(s->part[b] > u)) continue;
        double cum = b ? s->part[b - 1] : 0;
        int i1 = (b + 1) * SUM_BLOCK < V ? (b + 1) * SUM_BLOCK : V;
        for (int i = b * SUM_BLOCK; i < i1; i++) {
            if (!(z[i] > -INFINITY && z[i] >= thr)) continue;
            cum += (double)e[i];
            if (cum > u) return i;
        }
        return -1; /* unreachable: the block's own sum exceeded u */
    }
    return -1;
}

/* ---- reported values: the log-prob modes (sampling.h) ---- */
static inline float clean(float x) { return isnan(x) ? -INFINITY : x; }

/* The raw logit of id i as the raw modes see it: the model's, cleaned, with a
 * grammar's disallowed ids at -inf. vLLM applies the structured-output bitmask
 * to the logits before its sampler, so its raw log-probs are renormalised over
 * the grammar's allowed set (allowed_token_ids and bad words, applied inside
 * the sampler after the raw log-probs, are not). */
static inline float raw_at(const Sampler *s, const float *logits, int32_t i) {
    if (s->gmask && !((s->gmask[i >> 6] >> (i & 63)) & 1)) return -INFINITY;
    return clean(logits[i]);
}

/* Normalisers a mode needs, computed once per call. */
typedef struct ModeNorm {
    float rawmax; double raw_log_s;  /* of l_raw (raw modes, raw_logprob) */
    double z_log_s;                  /* greedy processed: log sum exp(z - zmax) over the whole vocab */
} ModeNorm;

/* log S, S the double sum in id order of e[i] = exp(z[i] - zmax) over the ids with z[i] > -inf
 * (none: -inf); e [V] receives the exponentials (e may be z). The normaliser of every log-prob
 * but the kept set's (kept_sum, which keeps its running sums for the draw). */
static double log_norm(float *e, const float *z, int V, float zmax) {
    double S = 0;
    if (zmax > -INFINITY) { /* else no id to sum */
        exp_row(e, z, V, zmax);
        for (int i = 0; i < V; i++) if (z[i] > -INFINITY) S += (double)e[i];
    }
    return log(S);
}

/* Uses s->e as scratch (the draw is done with it by now). */
static void raw_norm(Sampler *s, const float *logits, int V, ModeNorm *m) {
    float *r = s->e, mx = -INFINITY;
    for (int i = 0; i < V; i++) { r[i] = raw_at(s, logits, i); if (r[i] > mx) mx = r[i]; }
    m->rawmax = mx;
    m->raw_log_s = log_norm(r, r, V, mx);
}

static inline int kept(const Sampler *s, int32_t i) { return s->z[i] > -INFINITY && s->z[i] >= s->thr; }

static float mode_value(const Sampler *s, const float *logits, LogprobsMode mode, const ModeNorm *m, int32_t i) {
    float zi = s->z[i];
    switch (mode) {
    case LOGPROBS_RAW: return (float)((double)(raw_at(s, logits, i) - m->rawmax) - m->raw_log_s);
    case LOGPROBS_RAW_LOGITS: return raw_at(s, logits, i);
    case LOGPROBS_PROCESSED:
        if (s->greedy) /* everything banned (the argmax fallback): an empty distribution, all -inf */
            return s->zmax == -INFINITY ? -INFINITY : (float)((double)(zi - s->zmax) - m->z_log_s);
        return kept(s, i) ? (float)((double)(zi - s->zmax) - s->log_s) : -INFINITY;
    case LOGPROBS_PROCESSED_LOGITS: return s->greedy || kept(s, i) ? zi : -INFINITY;
    case LOGPROBS_SAMPLED:
        if (s->greedy) return i == s->token ? 0.0f : -INFINITY;
        return kept(s, i) ? (float)((double)(zi - s->zmax) - s->log_s) : -INFINITY;
    }
    return NAN;
}

/* The normalisers of the last sampler_sample's row that a report in mode needs (raw: the raw
 * log-prob too; report: a value, rank or top list). Uses s->e as scratch. */
static void mode_norm(Sampler *s, const float *logits, LogprobsMode mode, int raw, int report, ModeNorm *m) {
    *m = (ModeNorm){ 0 };
    int V = s->vocab;
    if (raw || (report && mode == LOGPROBS_RAW)) raw_norm(s, logits, V, m);
    if (report && mode == LOGPROBS_PROCESSED && s->greedy) m->z_log_s = log_norm(s->e, s->z, V, s->zmax);
}

static int32_t rank_of(const float *z, int V, float zmax, double ls, float v);
static float lp_threshold(float zmax, double ls, float v);

/* ids i with x[i] >= t (a NaN counts as below) */
static int32_t count_ge(const float *x, int V, float t) {
    int32_t n = 0;
    for (int i = 0; i < V; i++) n += x[i] >= t;
    return n;
}

/* The raw row's ids (raw_at) >= t, t > -inf. */
static int32_t count_raw_ge(const Sampler *s, const float *logits, float t) {
    if (!s->gmask) return count_ge(logits, s->vocab, t); /* raw_at's NaN -> -inf: below t either way */
    int32_t n = 0;
    for (int i = 0; i < s->vocab; i++) n += raw_at(s, logits, i) >= t;
    return n;
}

/* The ids whose value in mode is >= v, one mode_value per id: the definition (and the reference). */
static int32_t rank_brute(const Sampler *s, const float *logits, LogprobsMode mode, const ModeNorm *m, float v) {
    int32_t rank = 0;
    for (int32_t i = 0; i < s->vocab; i++) rank += mode_value(s, logits, mode, m, i) >= v;
    return rank;
}

/* vLLM's rank of v, the token's value in mode: the ids whose mode_value is >= v, counted on
 * mode_value's floats exactly as one mode_value per id would (sampler_rank_reference, which
 * test_sampling checks this against). A value is a monotone function of the row it comes from
 * (rank_of's lp, or the logit itself) above the kept threshold and -inf below it, so for a finite
 * v the count is one compare per id against a threshold: lp_threshold's t, raised to the kept
 * threshold thr where ids below it are -inf. v not finite (a token whose value is -inf or NaN),
 * and the degenerate rows where no value is finite: counted id by id. */
static int32_t value_rank(const Sampler *s, const float *logits, LogprobsMode mode, const ModeNorm *m, float v) {
    const float *z = s->z;
    int V = s->vocab;
    if (isfinite(v)) switch (mode) {
    case LOGPROBS_RAW:
        if (isfinite(m->rawmax)) return count_raw_ge(s, logits, lp_threshold(m->rawmax, m->raw_log_s, v));
        break;
    case LOGPROBS_RAW_LOGITS: return count_raw_ge(s, logits, v);
    case LOGPROBS_PROCESSED:
    case LOGPROBS_SAMPLED:
        if (s->greedy && mode == LOGPROBS_SAMPLED) return 1; /* 0 at the token, -inf elsewhere */
        if (!isfinite(s->zmax)) break;
        if (s->greedy) return rank_of(z, V, s->zmax, m->z_log_s, v);
        float t = lp_threshold(s->zmax, s->log_s, v);
        return count_ge(z, V, t > s->thr ? t : s->thr); /* kept: z >= thr (and > -inf: t is) */
    case LOGPROBS_PROCESSED_LOGITS: return count_ge(z, V, v); /* v = z[token] >= thr: z >= v is kept too */
    }
    return rank_brute(s, logits, mode, m, v);
}

int32_t sampler_rank_reference(Sampler *s, const float *logits, LogprobsMode mode, float v) {
    ModeNorm m;
    mode_norm(s, logits, mode, 0, 1, &m);
    return rank_brute(s, logits, mode, &m, v);
}

/* The top-N in the mode's order: the raw modes rank by l_raw, the others by
 * the processed z (which orders the kept set like its log-probs, and the
 * masked ids, all -inf there, by their logit before masking). Uses s->e as
 * scratch for the cleaned raw row (the draw is done with it by now). */
static void fill_top(Sampler *s, const float *logits, const SampleWant *w, const ModeNorm *m) {
    int V = s->vocab, top_n = w->top_n < V ? w->top_n : V;
    const float *key = s->z;
    if (w->mode == LOGPROBS_RAW || w->mode == LOGPROBS_RAW_LOGITS) {
        for (int i = 0; i < V; i++) s->e[i] = raw_at(s, logits, i);
        key = s->e;
    }
    int n = top_heap(key, V, top_n, -INFINITY, s->idx);
    for (int i = 0; i < V && n < top_n; i++) if (key[i] == -INFINITY) s->idx[n++] = i; /* -inf ties: id asc */
    for (int i = 0; i < top_n; i++) {
        w->top_ids[i] = s->idx[i];
        w->top_logprobs[i] = mode_value(s, logits, w->mode, m, s->idx[i]);
    }
}

int sampler_sample(Sampler *s, const float *logits, const SamplingParams *p,
                   const SampleHistory *h, const int32_t *eos_ids, int n_eos,
                   int seq_index, int pos, const SampleWant *want, SampleResult *out) {
    int V = s->vocab;
    float *z = s->z;
    s->greedy = p->temperature == 0.0f;
    s->gmask = want ? want->allowed : NULL;
    float T = s->greedy ? 1.0f : p->temperature; /* sampling only: no reported value is tempered but z */
    int sparse = p->n_logit_bias > 0 || p->n_allowed > 0 || p->n_bad_words > 0 || h->n_output < p->min_tokens || p->repetition_penalty != 1.0f ||
                 p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f ||
                 (want && want->allowed);
    int32_t am = 0;
    if (sparse) {
        process(s, logits, p, h, eos_ids, n_eos, want ? want->allowed : NULL);
        if (!s->greedy) z[0] = z[0] / T;
        float zm = z[0]; /* z[am], in a register: no load on the loop's dependency chain */
        for (int i = 1; i < V; i++) {
            if (!s->greedy) z[i] = z[i] / T;
            if (z[i] > zm) { zm = z[i]; am = i; }
        }
    } else { /* nothing sparse to apply: copy, clean, scale and find the max in one pass */
        float zm = -INFINITY;
        for (int i = 0; i < V; i++) {
            float x = logits[i];
            x = isnan(x) ? -INFINITY : s->greedy ? x : x / T;
            z[i] = x;
            if (x > zm) { zm = x; am = i; }
        }
    }
    float zmax = z[am];
    s->zmax = zmax;
    if (s->greedy || zmax == -INFINITY) {
        /* a point mass on the argmax (lowest id on ties); also the fallback when
         * everything was banned */
        s->greedy = 1;
        s->token = am;
        s->thr = zmax;
        s->log_s = 0;
        out->token = am;
        out->logprob = 0.0f;
        out->n_kept = 1;
        if (want && want->mask) want->mask[0] = am;
    } else {
        int e_filled, nk;
        int32_t last;
        float thr = truncate_thr(s, p, zmax, &e_filled);
        double S = kept_sum(s, thr, zmax, !e_filled, &nk, &last);
        double u = sampling_uniform(p->seed, (uint64_t)seq_index, (uint64_t)pos) * S;
        int32_t tok = draw_from_parts(s, thr, u);
        int32_t *mask = want ? want->mask : NULL;
        if (mask) {
            int k = 0;
            for (int i = 0; i < V; i++)
                if (z[i] > -INFINITY && z[i] >= thr) mask[k++] = i;
        }
        if (tok < 0) tok = last;
        s->token = tok;
        s->thr = thr;
        s->log_s = log(S);
        out->token = tok;
        out->logprob = (float)((double)(z[tok] - zmax) - s->log_s);
        out->n_kept = nk;
    }
    out->logprob_raw = NAN;
    out->value = NAN;
    out->rank = 0;
    if (!want) return 0;
    ModeNorm m;
    mode_norm(s, logits, want->mode, want->raw_logprob, want->value || want->top_n > 0, &m);
    if (want->raw_logprob)
        out->logprob_raw = (float)((double)(raw_at(s, logits, out->token) - m.rawmax) - m.raw_log_s);
    if (want->value) {
        out->value = mode_value(s, logits, want->mode, &m, out->token);
        out->rank = value_rank(s, logits, want->mode, &m, out->value);
    }
    if (want->top_n > 0) fill_top(s, logits, want, &m);
    return 0;
}

void sampler_kept_logprobs(Sampler *s, float *out) {
    for (int i = 0; i < s->vocab; i++) {
        const float zi = s->z[i];
        if (s->greedy) out[i] = i == s->token ? 0.0f : -INFINITY;
        else out[i] = (zi > -INFINITY && zi >= s->thr) ? (float)((double)(zi - s->zmax) - s->log_s)
                                                       : -INFINITY;
    }
}

/* Floats in their order as unsigned keys (-inf lowest, NaNs outside [-inf, +inf]), and back. */
static inline uint32_t float_key(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
static inline float key_float(uint32_t k) {
    uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* The least float t with lp(t) = (float)((double)(t - zmax) - ls) >= v, zmax and v finite and
 * v <= lp(zmax): bisected over the floats' order (<= 32 steps). lp is monotone in t (each step
 * rounds monotonically), so lp(x) >= v exactly when x >= t. t > -inf (lp(-inf) = -inf < v). */
static float lp_threshold(float zmax, double ls, float v) {
    uint32_t lo = float_key(-INFINITY), hi = float_key(zmax);
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if ((float)((double)(key_float(mid) - zmax) - ls) >= v) hi = mid;
        else lo = mid + 1;
    }
    return key_float(lo);
}

/* How many ids have a log-prob >= v, counted on the log-probs themselves as vLLM counts
 * them: lp(x) = (float)((double)(x - zmax) - ls) over z [V]; lp(z[i]) >= v exactly when
 * z[i] >= lp_threshold's t: one compare per id instead of two conversions. Where lp is not
 * monotone (zmax not finite: x - zmax is NaN) or v is not finite, counted directly. */
static int32_t rank_of(const float *z, int V, float zmax, double ls, float v) {
    if (!isfinite(zmax) || !isfinite(v)) {
        int32_t n = 0;
        for (int i = 0; i < V; i++) n += (float)((double)(z[i] - zmax) - ls) >= v;
        return n;
    }
    return count_ge(z, V, lp_threshold(zmax, ls, v));
}

float sampler_logprob_of(Sampler *s, const float *logits, int32_t id,
                         int top_n, int32_t *top_ids, float *top_logprobs, int32_t *rank) {
    int V = s->vocab;
    float *z = s->z;
    float zmax = -INFINITY;
    for (int i = 0; i < V; i++) {
        z[i] = isnan(logits[i]) ? -INFINITY : logits[i];
        if (z[i] > zmax) zmax = z[i];
    }
    double ls = log_norm(s->e, z, V, zmax);
    if (top_n > 0) {
        if (top_n > V) top_n = V;
        int n = top_heap(z, V, top_n, -INFINITY, s->idx);
        for (int i = 0; i < V && n < top_n; i++) if (z[i] == -INFINITY) s->idx[n++] = i;
        for (int i = 0; i < top_n; i++) {
            top_ids[i] = s->idx[i];
            top_logprobs[i] = (float)((double)(z[s->idx[i]] - zmax) - ls);
        }
    }
    float v = (float)((double)(z[id] - zmax) - ls);
    if (rank) *rank = rank_of(z, V, zmax, ls, v);
    return v;
}
