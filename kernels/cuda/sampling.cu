/*
 * sampling.cu - the device sampler: one block per row samples a token from a
 * row of device logits with the CPU sampler's semantics (sampling.h; the
 * arguments and the tie rule in dev_sample.h), and writes only compact
 * results: token, log-probs, value / rank, top-N, and the kept ids when asked.
 *
 * Per row (SAMP_THREADS threads, every step block-wide):
 *   1. processed logits z into scratch: NaN -> -inf, bans (allowed_token_ids
 *      and grammar bitsets, the ban list), logit_bias in order, penalties from
 *      the row's (id, output count) list, NaN at biased ids -> -inf, then
 *      z / T; argmax (value desc, id asc). The same float operations per
 *      element as sampling.c, so z is bit-identical to the CPU's.
 *   2. greedy (T = 0, or every id banned): the argmax, a point mass.
 *   3. thresholds on z: min_p (min z with exp_poly(z - zmax) >= min_p), top_k (the
 *      k-th largest value by a 4-pass radix select over the ordered float
 *      bits, counts), top_p (the same radix select over fixed-point mass: the
 *      largest value v whose upper set {z >= v} holds >= top_p of the mass of
 *      the set kept so far); the kept set is {z > -inf, z >= thr}. top_p = 1
 *      and min_p = 0 cost nothing; top_k alone is one select.
 *   4. the draw: per-thread contiguous chunks, their masses scanned in double
 *      in a fixed order; the token is the first kept id (ascending) whose
 *      cumulative mass exceeds u * S, u from the counter RNG; the kept ids are
 *      compacted in ascending order in the same pass when asked for.
 *   5. reported values: the raw normaliser, the mode's value and vLLM rank of
 *      the token, the top-N (a count select of the N-th key, then the ids
 *      above it and the lowest ids tied with it).
 * Every sum is deterministic (a fixed reduction tree, integer atomics only):
 * the same logits and parameters give the same result on every run and in
 * every batch.
 * Not here: building rows from SamplingParams (server/engine/sampling_device.c).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "cuda_pdl.cuh"
#include "cuda_sampling.h"
#include "exp_poly.h" /* the CPU sampler's exp, bit for bit */

#define SAMP_THREADS 512
#define SAMP_FX 17592186044416.0 /* 2^44: the fixed point of top_p's mass (e <= 1, vocab < 2^19) */

/* ---- the counter RNG: the same integer function as sampling_uniform ---- */
static __host__ __device__ __forceinline__ uint64_t samp_mix64(uint64_t x) {
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27; x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}
static __host__ __device__ __forceinline__ double samp_uniform(uint64_t seed, uint64_t seq, uint64_t pos) {
    uint64_t h = samp_mix64(seed + 0x9e3779b97f4a7c15ull);
    h = samp_mix64(h ^ (seq * 0xd1b54a32d192ed03ull + 0x632be59bd9b4e019ull));
    h = samp_mix64(h ^ (pos * 0xaef17502108ef2d9ull + 0x8cb92ba72f3d8dd7ull));
    return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}
extern "C" double cuda_sampling_uniform(uint64_t seed, uint64_t seq_index, uint64_t pos) {
    return samp_uniform(seed, seq_index, pos);
}

/* Ascending key = descending value (then the caller breaks ties by id); NaN
 * sorts as -inf and -0 as +0, so equal floats have equal keys. */
static __device__ __forceinline__ uint32_t desc_key(float v) {
    if (isnan(v)) v = -INFINITY;
    if (v == 0.0f) v = 0.0f;
    uint32_t u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ~u;
}
static __device__ __forceinline__ float key_value(uint32_t k) {
    uint32_t u = ~k;
    u = (u & 0x80000000u) ? (u & 0x7fffffffu) : ~u;
    return __uint_as_float(u);
}

/* The device copies of a DevSampleBatch's arrays. */
typedef struct SampDev {
    const DevSampleRow *rows;
    const int32_t *bias_ids;
    const float *bias_val;
    const int32_t *pen_ids, *pen_count, *ban;
    const uint64_t *bits;
} SampDev;

/* What mask_pack_kernel needs of a row besides z: its kept set's threshold. */
typedef struct SampAux {
    float thr;  /* kept = {z > -inf, z >= thr} unless greedy */
    int greedy; /* kept = {token} */
} SampAux;

/* What the reported values of a row need (mode_value, as sampling.c). */
typedef struct SampCtx {
    int greedy, token;
    float zmax, thr, rawmax;
    double log_s, raw_log_s, z_log_s;
} SampCtx;

static __device__ __forceinline__ int is_kept(float zi, float thr) { return zi > -INFINITY && zi >= thr; }

static __device__ __forceinline__ float mode_value(const SampCtx &c, int mode, float zi, float rawi, int i) {
    switch (mode) {
    case 0: return (float)((double)(rawi - c.rawmax) - c.raw_log_s);
    case 1: return rawi;
    case 2:
        if (c.greedy) return c.zmax == -INFINITY ? -INFINITY : (float)((double)(zi - c.zmax) - c.z_log_s);
        return is_kept(zi, c.thr) ? (float)((double)(zi - c.zmax) - c.log_s) : -INFINITY;
    case 3: return c.greedy || is_kept(zi, c.thr) ? zi : -INFINITY;
    case 4:
        if (c.greedy) return i == c.token ? 0.0f : -INFINITY;
        return is_kept(zi, c.thr) ? (float)((double)(zi - c.zmax) - c.log_s) : -INFINITY;
    }
    return NAN;
}

static __device__ __forceinline__ int bit_set(const uint64_t *bits, int off, int i) {
    return (int)((bits[off + (i >> 6)] >> (i & 63)) & 1u);
}
/* The raw logit as the raw modes see it: cleaned, the grammar's disallowed ids -inf. */
static __device__ __forceinline__ float raw_at(const float *l, const uint64_t *bits, int gram_off, int i) {
    if (gram_off >= 0 && !bit_set(bits, gram_off, i)) return -INFINITY;
    float x = l[i];
    return isnan(x) ? -INFINITY : x;
}

/* ---- block-wide reductions through shared memory (fixed trees: deterministic) ---- */
/* T: double (log-sum-exp sums) or long long (counts); sh [blockDim.x] of T */
template <typename T> static __device__ T bsum(T v, T *sh) {
    int t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) sh[t] += sh[t + s];
        __syncthreads();
    }
    T r = sh[0];
    __syncthreads();
    return r;
}
/* max (op 0) or min (op 1) of floats, NaN ignored */
static __device__ float bext_f(float v, float *sh, int op) {
    int t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) {
            float o = sh[t + s];
            if (op ? (o < sh[t]) : (o > sh[t])) sh[t] = o;
        }
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}
/* (value desc, id asc) best pair; NaN loses to everything */
static __device__ int bargmax(float v, int id, float *shf, long long *shi) {
    int t = threadIdx.x;
    shf[t] = isnan(v) ? -INFINITY : v;
    shi[t] = id;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) {
            float a = shf[t], b = shf[t + s];
            long long ia = shi[t], ib = shi[t + s];
            if (b > a || (b == a && ib < ia)) { shf[t] = b; shi[t] = ib; }
        }
        __syncthreads();
    }
    int r = (int)shi[0];
    __syncthreads();
    return r;
}
/* lowest id >= 0 (op 0) or highest id (op 1) over the threads; -1 if none */
static __device__ int bpick_i(int v, long long *sh, int op) {
    long long big = op ? -1 : 0x7fffffffll;
    long long x = v < 0 ? big : v;
    int t = threadIdx.x;
    sh[t] = x;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) {
            long long o = sh[t + s];
            if (op ? (o > sh[t]) : (o < sh[t])) sh[t] = o;
        }
        __syncthreads();
    }
    long long r = sh[0];
    __syncthreads();
    return r == big ? -1 : (int)r;
}

/* ---- the radix select ----
 * Over the elements a selection admits, keyed by an ascending uint32 key
 * (desc_key: descending value) with integer weights: the smallest key K with
 * W(key <= K) >= target, and W(key < K) in *below. Four passes of 8 bits, the
 * weights summed into a shared histogram with integer atomics (exact, so the
 * result is independent of the order). Returns 0 when the total is < target. */
enum { SEL_TOPK = 0, SEL_TOPP = 1, SEL_TOPN_Z = 2, SEL_TOPN_RAW = 3 };

typedef struct SelIn {
    int kind;
    const float *z, *l;
    const uint64_t *bits;
    int gram_off;
    float thr, zmax;
} SelIn;

/* Whether element i takes part, its key and its weight. */
static __device__ __forceinline__ int sel_elem(const SelIn &s, int i, uint32_t *key, unsigned long long *w) {
    switch (s.kind) {
    case SEL_TOPK: {
        float zi = s.z[i];
        if (!is_kept(zi, s.thr)) return 0;
        *key = desc_key(zi);
        *w = 1;
        return 1;
    }
    case SEL_TOPP: {
        float zi = s.z[i];
        if (!is_kept(zi, s.thr)) return 0;
        *key = desc_key(zi);
        *w = (unsigned long long)((double)exp_poly(zi - s.zmax) * SAMP_FX + 0.5);
        return 1;
    }
    case SEL_TOPN_Z: *key = desc_key(s.z[i]); *w = 1; return 1;
    default: *key = desc_key(raw_at(s.l, s.bits, s.gram_off, i)); *w = 1; return 1;
    }
}

typedef struct SelShared {
    unsigned long long hist[256];
    unsigned long long below, total;
    uint32_t prefix, mask;
    int found;
} SelShared;

/* target < 0: a fraction -target of the total weight (top_p), else an absolute weight. */
static __device__ int radix_select(const SelIn &s, int V, double target, uint32_t *K, unsigned long long *below,
                                   SelShared *sh) {
    int t = threadIdx.x, nt = blockDim.x;
    if (t == 0) { sh->prefix = 0; sh->mask = 0; sh->below = 0; sh->found = 1; sh->total = 0; }
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = t; b < 256; b += nt) sh->hist[b] = 0;
        __syncthreads();
        uint32_t prefix = sh->prefix, mask = sh->mask;
        int last = -1;
        unsigned long long acc = 0;
        for (int i = t; i < V; i += nt) {
            uint32_t key;
            unsigned long long w;
            if (!sel_elem(s, i, &key, &w) || (key & mask) != prefix) continue;
            int d = (int)((key >> shift) & 255u);
            if (d != last) { /* runs of one bucket add once (the first digit is mostly the exponent) */
                if (last >= 0) atomicAdd(&sh->hist[last], acc);
                last = d;
                acc = 0;
            }
            acc += w;
        }
        if (last >= 0) atomicAdd(&sh->hist[last], acc);
        __syncthreads();
        if (t == 0) {
            if (shift == 24) {
                unsigned long long tot = 0;
                for (int d = 0; d < 256; d++) tot += sh->hist[d];
                sh->total = tot;
            }
            double want = target < 0 ? -target * (double)sh->total : target;
            unsigned long long c = sh->below;
            int d = 0;
            for (; d < 256; d++) {
                if ((double)(c + sh->hist[d]) >= want) break;
                c += sh->hist[d];
            }
            if (d == 256) sh->found = 0;
            else {
                sh->prefix |= (uint32_t)d << shift;
                sh->mask |= 255u << shift;
                sh->below = c;
            }
        }
        __syncthreads();
        if (!sh->found) break;
    }
    int found = sh->found;
    *K = sh->prefix;
    *below = sh->below;
    __syncthreads();
    return found;
}

/* ---- the kernel: one block per row ---- */
__global__ void __launch_bounds__(SAMP_THREADS)
sample_kernel(const float *logits, int V, SampDev d, float *zbuf, SampAux *aux, DevSampleOut *outs) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    __shared__ double shd[SAMP_THREADS];
    __shared__ long long shi[SAMP_THREADS], shi2[SAMP_THREADS];
    __shared__ float shf[SAMP_THREADS];
    __shared__ SelShared sel;
    __shared__ double s_scalar[2];
    __shared__ int32_t cand_id[DEV_SAMPLE_MAX_TOP_N];
    __shared__ uint32_t cand_key[DEV_SAMPLE_MAX_TOP_N];

    const int row = blockIdx.x, t = threadIdx.x, nt = blockDim.x;
    const DevSampleRow P = d.rows[row];
    const float *l = logits + (size_t)P.logit_row * V;
    float *z = zbuf + (size_t)row * V;
    const int greedy0 = P.temperature == 0.0f;
    const float T = greedy0 ? 1.0f : P.temperature;
    const int sparse = P.n_bias > 0 || P.n_pen > 0 || P.n_ban > 0 || P.allow_off >= 0 || P.gram_off >= 0;

    /* 1. processed logits */
    float best = -INFINITY;
    int best_i = 0x7fffffff;
    if (!sparse) {
        for (int i = t; i < V; i += nt) {
            float x = l[i];
            x = isnan(x) ? -INFINITY : greedy0 ? x : x / T;
            z[i] = x;
            if (x > best || (x == best && i < best_i)) { best = x; best_i = i; }
        }
    } else {
        for (int i = t; i < V; i += nt) {
            float x = l[i];
            x = isnan(x) ? -INFINITY : x;
            if ((P.allow_off >= 0 && !bit_set(d.bits, P.allow_off, i)) ||
                (P.gram_off >= 0 && !bit_set(d.bits, P.gram_off, i)))
                x = -INFINITY;
            z[i] = x;
        }
        __syncthreads();
        /* a banned id stays -inf whatever is added (a bias is < +inf), so the
         * bans commute with the bias as sampling.c orders them */
        for (int j = t; j < P.n_ban; j += nt) z[d.ban[P.ban_off + j]] = -INFINITY;
        __syncthreads();
        if (t == 0) /* in order: a repeated id adds its biases one after another */
            for (int j = 0; j < P.n_bias; j++) z[d.bias_ids[P.bias_off + j]] += d.bias_val[P.bias_off + j];
        __syncthreads();
        for (int j = t; j < P.n_pen; j += nt) { /* distinct ids */
            int id = d.pen_ids[P.pen_off + j], cnt = d.pen_count[P.pen_off + j];
            float x = z[id];
            if (P.repetition != 1.0f) x = x > 0 ? x / P.repetition : x * P.repetition;
            if ((P.frequency != 0.0f || P.presence != 0.0f) && cnt > 0) {
                x -= P.frequency * (float)cnt;
                x -= P.presence;
            }
            z[id] = x;
        }
        __syncthreads();
        for (int j = t; j < P.n_bias; j += nt) {
            int id = d.bias_ids[P.bias_off + j];
            if (isnan(z[id])) z[id] = -INFINITY;
        }
        __syncthreads();
        for (int i = t; i < V; i += nt) {
            float x = z[i];
            if (!greedy0) x = x / T;
            z[i] = x;
            if (x > best || (x == best && i < best_i)) { best = x; best_i = i; }
        }
    }
    const int am = bargmax(best, best_i, shf, shi); /* also orders the z writes before the reads below */
    const float zmax = z[am];

    SampCtx c;
    c.greedy = greedy0 || zmax == -INFINITY;
    c.token = am;
    c.zmax = zmax;
    c.thr = zmax;
    c.log_s = 0;
    c.rawmax = 0;
    c.raw_log_s = 0;
    c.z_log_s = 0;
    int n_kept = 1;
    float logprob = 0.0f;

    if (!c.greedy) {
        /* 3. thresholds */
        float thr = -INFINITY;
        if (P.min_p > 0) {
            float m = INFINITY;
            for (int i = t; i < V; i += nt) {
                float zi = z[i];
                if (zi > -INFINITY && exp_poly(zi - zmax) >= P.min_p && zi < m) m = zi;
            }
            thr = bext_f(m, shf, 1);
        }
        SelIn si;
        si.z = z;
        si.l = l;
        si.bits = d.bits;
        si.gram_off = P.gram_off;
        si.zmax = zmax;
        uint32_t K;
        unsigned long long below;
        if (P.top_k > 0 && P.top_k < V) {
            si.kind = SEL_TOPK;
            si.thr = thr;
            if (radix_select(si, V, (double)P.top_k, &K, &below, &sel)) {
                float v = key_value(K);
                if (v > thr) thr = v;
            }
        }
        if (P.top_p < 1.0f) {
            si.kind = SEL_TOPP;
            si.thr = thr;
            if (radix_select(si, V, -(double)P.top_p, &K, &below, &sel)) {
                float v = key_value(K);
                if (v > thr) thr = v;
            }
        }
        c.thr = thr;
        /* 4. the draw: contiguous chunks, their masses scanned in a fixed order */
        const int C = (V + nt - 1) / nt, lo = t * C, hi = lo + C < V ? lo + C : V;
        double part = 0;
        long long cnt = 0;
        for (int i = lo; i < hi; i++) {
            float zi = z[i];
            if (is_kept(zi, thr)) { part += (double)exp_poly(zi - zmax); cnt++; }
        }
        shd[t] = part;
        shi[t] = cnt;
        __syncthreads();
        if (t == 0) {
            double run = 0;
            long long rc = 0;
            for (int k = 0; k < nt; k++) {
                double p = shd[k];
                long long q = shi[k];
                shd[k] = run;
                shi[k] = rc;
                run += p;
                rc += q;
            }
            s_scalar[0] = run;
            shi2[0] = rc;
        }
        __syncthreads();
        const double S = s_scalar[0];
        n_kept = (int)shi2[0];
        double cum = shd[t];
        __syncthreads();
        const double u = samp_uniform(P.seed, (uint64_t)P.seq_index, (uint64_t)P.pos) * S;
        int tok = -1, last = -1;
        for (int i = lo; i < hi; i++) {
            float zi = z[i];
            if (!is_kept(zi, thr)) continue;
            last = i;
            if (tok < 0) {
                cum += (double)exp_poly(zi - zmax);
                if (cum > u) tok = i;
            }
        }
        tok = bpick_i(tok, shi, 0);
        last = bpick_i(last, shi, 1);
        if (tok < 0) tok = last;
        c.token = tok;
        c.log_s = log(S);
        logprob = (float)((double)(z[tok] - zmax) - c.log_s);
    }

    /* 5. reported values */
    const int report = (P.flags & DEV_SAMPLE_VALUE) || P.top_n > 0;
    if ((P.flags & DEV_SAMPLE_RAW) || (report && P.mode == 0)) {
        float m = -INFINITY;
        for (int i = t; i < V; i += nt) {
            float r = raw_at(l, d.bits, P.gram_off, i);
            if (r > m) m = r;
        }
        c.rawmax = bext_f(m, shf, 0);
        double s = 0;
        for (int i = t; i < V; i += nt) {
            float r = raw_at(l, d.bits, P.gram_off, i);
            if (r > -INFINITY) s += (double)exp_poly(r - c.rawmax);
        }
        c.raw_log_s = log(bsum(s, shd));
    }
    if (report && P.mode == 2 && c.greedy) {
        double s = 0;
        for (int i = t; i < V; i += nt) {
            float zi = z[i];
            if (zi > -INFINITY) s += (double)exp_poly(zi - zmax);
        }
        c.z_log_s = log(bsum(s, shd));
    }
    float value = NAN;
    int rank = 0;
    if (P.flags & DEV_SAMPLE_VALUE) {
        value = mode_value(c, P.mode, z[c.token], raw_at(l, d.bits, P.gram_off, c.token), c.token);
        long long n = 0;
        for (int i = t; i < V; i += nt) n += mode_value(c, P.mode, z[i], raw_at(l, d.bits, P.gram_off, i), i) >= value;
        rank = (int)bsum(n, shi);
    }
    int top_n = P.top_n < V ? P.top_n : V;
    if (top_n > 0) {
        SelIn si;
        si.kind = P.mode == 0 || P.mode == 1 ? SEL_TOPN_RAW : SEL_TOPN_Z;
        si.z = z;
        si.l = l;
        si.bits = d.bits;
        si.gram_off = P.gram_off;
        si.thr = c.thr;
        si.zmax = zmax;
        uint32_t K = 0;
        unsigned long long below = 0;
        radix_select(si, V, (double)top_n, &K, &below, &sel); /* always found: every id takes part */
        /* the ids with key < K (below of them) and the lowest ids with key == K */
        const int C = (V + nt - 1) / nt, lo = t * C, hi = lo + C < V ? lo + C : V;
        long long nl = 0, ne = 0;
        for (int i = lo; i < hi; i++) {
            uint32_t k;
            unsigned long long w;
            sel_elem(si, i, &k, &w);
            nl += k < K;
            ne += k == K;
        }
        shi[t] = nl;
        shi2[t] = ne;
        __syncthreads();
        if (t == 0) {
            long long a = 0, b = 0;
            for (int k = 0; k < nt; k++) {
                long long x = shi[k], y = shi2[k];
                shi[k] = a;
                shi2[k] = b;
                a += x;
                b += y;
            }
        }
        __syncthreads();
        long long pl = shi[t], pe = shi2[t];
        for (int i = lo; i < hi; i++) {
            uint32_t k;
            unsigned long long w;
            sel_elem(si, i, &k, &w);
            if (k < K) { cand_id[pl] = i; cand_key[pl] = k; pl++; }
            else if (k == K) {
                long long r = (long long)below + pe++;
                if (r < top_n) { cand_id[r] = i; cand_key[r] = k; }
            }
        }
        __syncthreads();
        if (t == 0) {
            for (int a = 1; a < top_n; a++) /* (key asc, id asc): at most 20 */
                for (int b = a; b > 0 && (cand_key[b] < cand_key[b - 1] ||
                                          (cand_key[b] == cand_key[b - 1] && cand_id[b] < cand_id[b - 1])); b--) {
                    int32_t ti = cand_id[b]; cand_id[b] = cand_id[b - 1]; cand_id[b - 1] = ti;
                    uint32_t tk = cand_key[b]; cand_key[b] = cand_key[b - 1]; cand_key[b - 1] = tk;
                }
            DevSampleOut *o = &outs[row];
            for (int j = 0; j < top_n; j++) {
                int id = cand_id[j];
                o->top_ids[j] = id;
                o->top_lp[j] = mode_value(c, P.mode, z[id], raw_at(l, d.bits, P.gram_off, id), id);
            }
        }
    }
    if (t == 0) {
        DevSampleOut *o = &outs[row];
        o->token = c.token;
        o->n_kept = n_kept;
        o->logprob = logprob;
        o->logprob_raw = (P.flags & DEV_SAMPLE_RAW)
                             ? (float)((double)(raw_at(l, d.bits, P.gram_off, c.token) - c.rawmax) - c.raw_log_s)
                             : NAN;
        o->value = value;
        o->rank = rank;
        o->mask_form = -1;
        o->mask_len = 0;
        aux[row].thr = c.thr;
        aux[row].greedy = c.greedy;
    }
}

/* The kept set of each DEV_SAMPLE_MASK row packed by dev_mask_form's rule
 * into its slot of packed [n_masks, DEV_MASK_WORDS(V)] int32 (the host
 * reference: engine_mask_pack), from the processed logits z [n_rows, V] f32
 * and each row's threshold (kept = {z > -inf, z >= thr}; greedy: {token});
 * the id lists through a block-wide scan of per-thread contiguous chunks, so
 * they come out ascending. One block per batch row; outs [n_rows] (their
 * token and n_kept from sample_kernel) get the form and length. */
static __global__ void __launch_bounds__(SAMP_THREADS)
mask_pack_kernel(int V, const DevSampleRow *rows, const float *zbuf, const SampAux *aux, DevSampleOut *outs,
                 int32_t *packed) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    __shared__ long long shi[SAMP_THREADS];
    const int row = blockIdx.x, t = threadIdx.x, nt = blockDim.x, W = DEV_MASK_WORDS(V);
    const DevSampleRow P = rows[row];
    if (!(P.flags & DEV_SAMPLE_MASK) || P.mask_slot < 0) return;
    const float *z = zbuf + (size_t)row * V;
    const float thr = aux[row].thr;
    const int greedy = aux[row].greedy, token = outs[row].token;
    int len;
    const int form = dev_mask_form(outs[row].n_kept, V, &len);
    int32_t *dst = packed + (size_t)P.mask_slot * W;
#define KEPT(i) (greedy ? (i) == token : is_kept(z[(i)], thr))
    if (form == DEV_MASK_BITMAP) {
        for (int w = t; w < W; w += nt) {
            uint32_t bits = 0;
            for (int b = 0; b < 32; b++) {
                int i = w * 32 + b;
                if (i < V && KEPT(i)) bits |= 1u << b;
            }
            dst[w] = (int32_t)bits;
        }
    } else {
        const int want = form == DEV_MASK_IDS; /* list the kept ids, or the others */
        const int C = (V + nt - 1) / nt, lo = t * C, hi = lo + C < V ? lo + C : V;
        long long cnt = 0;
        for (int i = lo; i < hi; i++) cnt += KEPT(i) == want;
        shi[t] = cnt;
        __syncthreads();
        if (t == 0)
            for (long long k = 0, run = 0; k < nt; k++) {
                long long q = shi[k];
                shi[k] = run;
                run += q;
            }
        __syncthreads();
        long long at = shi[t];
        for (int i = lo; i < hi; i++)
            if (KEPT(i) == want && at < len) dst[at++] = i;
    }
#undef KEPT
    if (t == 0) {
        outs[row].mask_form = form;
        outs[row].mask_len = len;
    }
}

/* tokens[i] < 0 names row -1 - tokens[i] of the last launch's results: its token. */
static __global__ void resolve_kernel(int32_t *tokens, int n, const DevSampleOut *outs) {
    pdl_wait(); /* launched by pdl_launch (cuda_pdl.cuh): before any memory access */
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && tokens[i] < 0) tokens[i] = outs[-1 - tokens[i]].token;
}

/* ---- the sampler object: scratch and staging sized once ----
 * Device buffers are single: the stream orders a launch's kernels and copies
 * after the previous launch's, and the resolve of the next step's tokens
 * (which reads out) before the next launch writes it. Host buffers are one
 * per slot: the host writes slot s's batch while the previous launch (the
 * other slot) may still wait for its upload, and reads slot s's results
 * while the next launch's download may already be running. */
typedef struct SampSlot {
    uint8_t *stage_h;     /* [stage_bytes] pinned: the packed batch */
    DevSampleOut *out_h;  /* [max_rows] pinned: the results */
    int32_t *packed_h;    /* [max_rows, W] pinned: the packed kept sets */
    cudaEvent_t done;     /* recorded after the downloads (timing: the step's device time ends here) */
    int n_rows, launched; /* the launch's rows; 1 between launch and wait */
    int begin;            /* its step's mark in CudaSampler.mark, or -1: none (device time not counted) */
} SampSlot;

/* Step marks (cuda_sampler_step_begin): a ring, since a mark is read only at
 * its step's wait, while at most one later step has marked its own. */
#define SAMP_MARKS 4

struct CudaSampler {
    DevSampleCaps caps;
    float *z;          /* [max_rows, vocab] f32 device: processed logits */
    SampAux *aux;      /* [max_rows] device */
    int32_t *packed;   /* [max_rows, W] int32 device, W = DEV_MASK_WORDS(vocab) */
    DevSampleOut *out; /* [max_rows] device */
    uint8_t *stage_d;  /* [stage_bytes] device */
    size_t stage_bytes;
    SampSlot slot[DEV_SAMPLE_SLOTS];
    int last_rows;     /* rows of the last launch (resolve's bound) */
    cudaEvent_t mark[SAMP_MARKS]; /* timing events: where a step's device work began */
    int mark_next;     /* the ring's next mark */
    int mark_open;     /* the mark of the step not yet launched, or -1 */
    double busy_s;     /* device seconds of the waited steps, mark to done (cuda_sampler_busy_s) */
};

static size_t al8(size_t x) { return (x + 7) & ~(size_t)7; }
static size_t stage_need(int rows, int n_list, int n_words) {
    return al8(sizeof(DevSampleRow) * (size_t)rows) + 5 * al8(sizeof(int32_t) * (size_t)n_list) +
           sizeof(uint64_t) * (size_t)n_words;
}

extern "C" CudaSampler *cuda_sampler_create(const DevSampleCaps *caps, Err *err) {
    if (!caps || caps->max_rows <= 0 || caps->vocab <= 0 || caps->max_list < 0 || caps->max_words < 0) {
        ERR(err, 500, "device sampler: bad capacities");
        return NULL;
    }
    CudaSampler *s = (CudaSampler *)calloc(1, sizeof *s);
    if (!s) { ERR(err, 500, "device sampler: out of host memory"); return NULL; }
    s->caps = *caps;
    size_t rv = (size_t)caps->max_rows * caps->vocab, rw = (size_t)caps->max_rows * DEV_MASK_WORDS(caps->vocab);
    s->stage_bytes = stage_need(caps->max_rows, caps->max_list, caps->max_words);
    size_t out_b = sizeof(DevSampleOut) * (size_t)caps->max_rows;
    int ok = cudaMalloc((void **)&s->z, sizeof(float) * rv) == cudaSuccess &&
             cudaMalloc((void **)&s->aux, sizeof(SampAux) * (size_t)caps->max_rows) == cudaSuccess &&
             cudaMalloc((void **)&s->packed, sizeof(int32_t) * rw) == cudaSuccess &&
             cudaMalloc((void **)&s->out, out_b) == cudaSuccess &&
             cudaMalloc((void **)&s->stage_d, s->stage_bytes) == cudaSuccess;
    for (int k = 0; ok && k < DEV_SAMPLE_SLOTS; k++) {
        SampSlot *q = &s->slot[k];
        ok = cudaMallocHost((void **)&q->stage_h, s->stage_bytes) == cudaSuccess &&
             cudaMallocHost((void **)&q->out_h, out_b) == cudaSuccess &&
             cudaMallocHost((void **)&q->packed_h, sizeof(int32_t) * rw) == cudaSuccess &&
             cudaEventCreateWithFlags(&q->done, cudaEventDefault) == cudaSuccess;
        q->begin = -1;
    }
    for (int k = 0; ok && k < SAMP_MARKS; k++) ok = cudaEventCreateWithFlags(&s->mark[k], cudaEventDefault) == cudaSuccess;
    s->mark_open = -1;
    if (!ok) {
        (void)cudaGetLastError();
        double dev = (4.0 * rv + 4.0 * rw + (double)s->stage_bytes) / 1048576.0,
               pin = DEV_SAMPLE_SLOTS * ((double)s->stage_bytes + (double)out_b + 4.0 * rw) / 1048576.0;
        cuda_sampler_free(s);
        ERR(err, 500, "device sampler: %.1f MiB of device scratch and %.1f MiB of pinned host memory for %d rows "
            "of %d logits could not be allocated", dev, pin, caps->max_rows, caps->vocab);
        return NULL;
    }
    return s;
}

extern "C" void cuda_sampler_free(CudaSampler *s) {
    if (!s) return;
    void *dev[] = {s->z, s->aux, s->packed, s->out, s->stage_d};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) cudaFree(dev[i]);
    for (int k = 0; k < DEV_SAMPLE_SLOTS; k++) {
        SampSlot *q = &s->slot[k];
        if (q->done) cudaEventDestroy(q->done);
        if (q->stage_h) cudaFreeHost(q->stage_h);
        if (q->out_h) cudaFreeHost(q->out_h);
        if (q->packed_h) cudaFreeHost(q->packed_h);
    }
    for (int k = 0; k < SAMP_MARKS; k++)
        if (s->mark[k]) cudaEventDestroy(s->mark[k]);
    free(s);
}

extern "C" const DevSampleCaps *cuda_sampler_caps(const CudaSampler *s) { return &s->caps; }

/* Every offset and id of the batch against its arrays and the vocab (a bad
 * one would read or write out of bounds on the device). */
static int batch_check(const CudaSampler *s, int n_logit_rows, int V, const DevSampleBatch *b, Err *err) {
    const DevSampleCaps *c = &s->caps;
    if (V != c->vocab) return ERR(err, 500, "device sampler: vocab %d, sized for %d", V, c->vocab);
    if (b->n_rows < 0 || b->n_rows > c->max_rows)
        return ERR(err, 500, "device sampler: %d rows, sized for %d", b->n_rows, c->max_rows);
    int n_list = b->n_bias + b->n_pen + b->n_ban;
    if (b->n_bias < 0 || b->n_pen < 0 || b->n_ban < 0 || n_list > c->max_list || b->n_words < 0 ||
        b->n_words > c->max_words)
        return ERR(err, 500, "device sampler: %d list entries and %d bitset words, sized for %d and %d", n_list,
                   b->n_words, c->max_list, c->max_words);
    int W = (V + 63) / 64;
    for (int r = 0; r < b->n_rows; r++) {
        const DevSampleRow *p = &b->rows[r];
        if (p->logit_row < 0 || p->logit_row >= n_logit_rows || p->top_n < 0 || p->top_n > DEV_SAMPLE_MAX_TOP_N ||
            p->mode < 0 || p->mode > 4 || !(p->temperature >= 0) || !(p->top_p > 0 && p->top_p <= 1) ||
            !(p->min_p >= 0 && p->min_p <= 1) || !(p->repetition > 0))
            return ERR(err, 500, "device sampler: row %d has a bad logit row or parameter", r);
        if (p->n_bias < 0 || p->bias_off < 0 || p->bias_off > b->n_bias - p->n_bias || p->n_pen < 0 ||
            p->pen_off < 0 || p->pen_off > b->n_pen - p->n_pen || p->n_ban < 0 || p->ban_off < 0 ||
            p->ban_off > b->n_ban - p->n_ban || (p->allow_off >= 0 && p->allow_off > b->n_words - W) ||
            (p->gram_off >= 0 && p->gram_off > b->n_words - W))
            return ERR(err, 500, "device sampler: row %d has a list or bitset out of range", r);
    }
    for (int i = 0; i < b->n_bias; i++)
        if (b->bias_ids[i] < 0 || b->bias_ids[i] >= V) return ERR(err, 500, "device sampler: bias id out of range");
    for (int i = 0; i < b->n_pen; i++)
        if (b->pen_ids[i] < 0 || b->pen_ids[i] >= V) return ERR(err, 500, "device sampler: penalty id out of range");
    for (int i = 0; i < b->n_ban; i++)
        if (b->ban[i] < 0 || b->ban[i] >= V) return ERR(err, 500, "device sampler: banned id out of range");
    return 0;
}

extern "C" int cuda_sampler_launch(CudaSampler *s, const float *logits, int n_logit_rows, int vocab,
                                   const DevSampleBatch *b, int slot, void *stream, Err *err) {
    if (!s || !b || (b->n_rows > 0 && (!logits || !b->rows)) || slot < 0 || slot >= DEV_SAMPLE_SLOTS)
        return ERR(err, 500, "device sampler: missing argument");
    SampSlot *q = &s->slot[slot];
    if (q->launched) return ERR(err, 500, "device sampler: slot %d launched twice without a wait", slot);
    int rc = batch_check(s, n_logit_rows, vocab, b, err);
    if (rc) return rc;
    int n_masks = 0;
    for (int r = 0; r < b->n_rows; r++) {
        int m = b->rows[r].mask_slot, want = (b->rows[r].flags & DEV_SAMPLE_MASK) != 0;
        if (want != (m >= 0) || (want && m != n_masks))
            return ERR(err, 500, "device sampler: row %d has mask slot %d (want %d)", r, m, want ? n_masks : -1);
        n_masks += want;
    }
    if (n_masks != b->n_masks) return ERR(err, 500, "device sampler: %d mask rows, the batch says %d", n_masks, b->n_masks);
    q->n_rows = b->n_rows;
    q->begin = s->mark_open; /* this launch ends the step that mark began */
    s->mark_open = -1;
    if (b->n_rows == 0) { /* nothing to run: waiting on it returns at once */
        q->launched = 1;
        return 0;
    }
    cudaStream_t st = (cudaStream_t)stream;
    /* pack: rows, bias ids, bias values, penalty ids, counts, bans, bitsets */
    uint8_t *h = q->stage_h;
    size_t off = 0;
    SampDev dv;
#define PACK(field, type, src, n)                                                    \
    do {                                                                             \
        size_t nb_ = sizeof(type) * (size_t)(n);                                     \
        if (nb_) memcpy(h + off, (src), nb_);                                        \
        dv.field = (const type *)(s->stage_d + off);                                 \
        off += al8(nb_);                                                             \
    } while (0)
    PACK(rows, DevSampleRow, b->rows, b->n_rows);
    PACK(bias_ids, int32_t, b->bias_ids, b->n_bias);
    PACK(bias_val, float, b->bias_val, b->n_bias);
    PACK(pen_ids, int32_t, b->pen_ids, b->n_pen);
    PACK(pen_count, int32_t, b->pen_count, b->n_pen);
    PACK(ban, int32_t, b->ban, b->n_ban);
    PACK(bits, uint64_t, b->bits, b->n_words);
#undef PACK
    CUDA_TRY(err, cudaMemcpyAsync(s->stage_d, h, off, cudaMemcpyHostToDevice, st));
    pdl_launch(sample_kernel, dim3(b->n_rows), dim3(SAMP_THREADS), 0, st, logits, vocab, dv, s->z, s->aux, s->out);
    CUDA_TRY_LAUNCH(err);
    if (n_masks) {
        pdl_launch(mask_pack_kernel, dim3(b->n_rows), dim3(SAMP_THREADS), 0, st, vocab, dv.rows, s->z, s->aux, s->out,
                   s->packed);
        CUDA_TRY_LAUNCH(err);
    }
    /* the compact results into this slot's pinned buffers, then the slot's event */
    CUDA_TRY(err, cudaMemcpyAsync(q->out_h, s->out, sizeof(DevSampleOut) * (size_t)b->n_rows, cudaMemcpyDeviceToHost, st));
    if (n_masks)
        CUDA_TRY(err, cudaMemcpyAsync(q->packed_h, s->packed, sizeof(int32_t) * (size_t)n_masks * DEV_MASK_WORDS(vocab),
                                      cudaMemcpyDeviceToHost, st));
    CUDA_TRY(err, cudaEventRecord(q->done, st));
    q->launched = 1;
    s->last_rows = b->n_rows;
    return 0;
}

extern "C" int cuda_sampler_wait(CudaSampler *s, int slot, const DevSampleOut **out, const int32_t **packed, Err *err) {
    if (!s || slot < 0 || slot >= DEV_SAMPLE_SLOTS) return ERR(err, 500, "device sampler: missing argument");
    SampSlot *q = &s->slot[slot];
    if (!q->launched) return ERR(err, 500, "device sampler: slot %d waited on without a launch", slot);
    q->launched = 0;
    if (q->n_rows > 0) CUDA_TRY(err, cudaEventSynchronize(q->done));
    float ms = 0;
    if (q->n_rows > 0 && q->begin >= 0) {
        if (cudaEventElapsedTime(&ms, s->mark[q->begin], q->done) == cudaSuccess) s->busy_s += 1e-3 * ms;
        else (void)cudaGetLastError(); /* a measurement only: not this launch's error, nor a later launch's */
    }
    const int V = s->caps.vocab, W = DEV_MASK_WORDS(V);
    for (int r = 0; r < q->n_rows; r++) { /* what the host will index with */
        const DevSampleOut *o = &q->out_h[r];
        if (o->token < 0 || o->token >= V || o->n_kept < 1 || o->n_kept > V || o->mask_len < 0 || o->mask_len > W)
            return ERR(err, 500, "device sampler: row %d reported token %d, %d kept, a packed set of %d", r, o->token,
                       o->n_kept, o->mask_len);
    }
    *out = q->out_h;
    *packed = q->packed_h;
    return 0;
}

extern "C" int cuda_sampler_step_begin(CudaSampler *s, void *stream) {
    if (!s) return -1;
    if (cudaEventRecord(s->mark[s->mark_next], (cudaStream_t)stream) != cudaSuccess) {
        (void)cudaGetLastError();
        s->mark_open = -1;
        return -1;
    }
    s->mark_open = s->mark_next;
    s->mark_next = (s->mark_next + 1) % SAMP_MARKS;
    return 0;
}

extern "C" double cuda_sampler_busy_s(const CudaSampler *s) { return s ? s->busy_s : -1; }

extern "C" int cuda_sampler_resolve(CudaSampler *s, int32_t *tokens, int n, int n_src, void *stream) {
    if (!s || n < 0 || n_src < 1 || n_src > s->last_rows) return -1;
    if (n == 0) return 0;
    pdl_launch(resolve_kernel, dim3((n + 255) / 256), dim3(256), 0, (cudaStream_t)stream, tokens, n, s->out);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}
