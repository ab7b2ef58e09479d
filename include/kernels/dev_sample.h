/*
 * dev_sample.h - the arguments of a backend's device sampling op
 * (Backend.sample, backend.h): a batch of rows of device logits, each with its
 * sampling parameters, sampled on the device; only compact per-row results
 * (token, log-probs, top-N, the kept set's ids when asked for) come back.
 *
 * The semantics are those of the CPU sampler, which stays the reference
 * (server/engine/sampling.c, include/engine/sampling.h): the same processing
 * order and float operations per element, the same truncation thresholds, the
 * same counter RNG keyed by (seed, seq_index, pos), the same reported values.
 * What the engine knows and the kernel does not (a request's history, its
 * bad words, min_tokens, allowed_token_ids, a grammar's allowed set) arrives
 * as per-row lists and bitsets built on the host (sampling_device.h builds
 * them from SamplingParams and the history).
 *
 * Tie rule (where the device may pick another token or kept set than the
 * CPU): every processed logit z is bit-identical to the CPU's, so greedy
 * argmax (lowest id on ties), top_k (k-th largest value, boundary ties all
 * kept) and every comparison of z are identical; so is every exponential
 * (both compute exp_poly, exp_poly.h), hence min_p's kept set. Only these
 * may differ, and only when a decision lies within about 1e-8 (relative) of
 * its boundary, from the order of the sums:
 *   - top_p sums the mass in 2^-44 fixed point (exact, order-free integer
 *     atomics: the same result on every run) while the CPU sums e / S in
 *     double in sorted order: the crossing differs when the cumulative mass
 *     at a value boundary is within ~1e-8 of top_p;
 *   - the draw sums the mass in double in another order (chunks): the token
 *     differs when u * S is within ~1e-12 relative of a cumulative boundary.
 * Log-probs (and every reported value) agree within 1e-5; ranks agree except
 * where two values are within an ulp.
 *
 * Not here: the kernels (kernels/cuda/sampling.cu), the host-side builder
 * (include/engine/sampling_device.h), when the engine uses the op
 * (engine_step.c).
 */
#ifndef SAMPLER_DEV_SAMPLE_H
#define SAMPLER_DEV_SAMPLE_H

#include <stdint.h>

#define DEV_SAMPLE_MAX_TOP_N 20 /* == SAMPLING_MAX_TOP_N */

enum {
    DEV_SAMPLE_RAW = 1,   /* fill DevSampleOut.logprob_raw */
    DEV_SAMPLE_VALUE = 2, /* fill value and rank in `mode` */
    DEV_SAMPLE_MASK = 4,  /* pack the kept set (dev_mask_form) and download it */
};

/* The packed forms of a kept set, the rule every packer follows (the host's
 * engine_mask_pack, the device's mask pack kernel), so a record is the same
 * bits whichever side sampled it: the kept ids when 2 * n_kept <= vocab, else
 * the ids NOT kept, unless that list is longer than the bitmap of
 * DEV_MASK_WORDS(vocab) words (bit id & 31 of word id >> 5 = kept), then the
 * bitmap. Ids ascending. A packed set never needs more than DEV_MASK_WORDS
 * int32s. (engine.h's MASK_FORM_* are these values.) */
enum { DEV_MASK_IDS = 0, DEV_MASK_COMPLEMENT = 1, DEV_MASK_BITMAP = 2 };
#define DEV_MASK_WORDS(vocab) (((vocab) + 31) / 32)
#ifdef __CUDACC__
__host__ __device__
#endif
static inline int dev_mask_form(int n_kept, int vocab, int *len) {
    int comp = 2 * (int64_t)n_kept > vocab, l = comp ? vocab - n_kept : n_kept;
    if (l > DEV_MASK_WORDS(vocab)) {
        *len = DEV_MASK_WORDS(vocab);
        return DEV_MASK_BITMAP;
    }
    *len = l;
    return comp ? DEV_MASK_COMPLEMENT : DEV_MASK_IDS;
}

/* Launches in flight at once (Backend.sample_launch's slot): a step's results
 * stay readable while the next step's are being produced. */
#define DEV_SAMPLE_SLOTS 2

/* One row's parameters (host, packed into the backend's pinned staging). The
 * lists and bitsets are slices of the DevSampleBatch arrays. */
typedef struct DevSampleRow {
    int32_t logit_row;   /* the row of the logits [*, vocab] this row samples from */
    int32_t flags;       /* DEV_SAMPLE_* */
    float temperature;   /* 0 = greedy */
    float top_p;         /* (0, 1]; 1 = off */
    float min_p;         /* [0, 1]; 0 = off */
    int32_t top_k;       /* <= 0 or >= vocab: off */
    float presence, frequency, repetition; /* 0, 0, 1 = off */
    int32_t mode;        /* LogprobsMode (sampling.h) of value, rank and the top list */
    int32_t top_n;       /* 0..DEV_SAMPLE_MAX_TOP_N */
    int32_t seq_index, pos; /* the counter RNG's key with seed */
    uint64_t seed;
    int32_t bias_off, n_bias; /* logit_bias entries, applied in order (duplicates add up in order) */
    int32_t pen_off, n_pen;   /* penalty entries: distinct ids of prompt + output */
    int32_t ban_off, n_ban;   /* ids whose processed logit is -inf (bad words, min_tokens) */
    int32_t allow_off;   /* word offset in bits of allowed_token_ids' bitset, or -1: every id */
    int32_t gram_off;    /* word offset in bits of the grammar's bitset, or -1: none (it also masks raw) */
    int32_t mask_slot;   /* DEV_SAMPLE_MASK: its packed set's slot (0, 1, ... in row order), else -1 */
} DevSampleRow;

/* One step's rows and their lists (host memory, read during the op call). */
typedef struct DevSampleBatch {
    int n_rows;
    int n_masks;               /* rows with DEV_SAMPLE_MASK: their mask_slot are 0 .. n_masks - 1 */
    const DevSampleRow *rows;  /* [n_rows] */
    int n_bias;
    const int32_t *bias_ids;   /* [n_bias] */
    const float *bias_val;     /* [n_bias]; -inf bans */
    int n_pen;
    const int32_t *pen_ids;    /* [n_pen] distinct per row */
    const int32_t *pen_count;  /* [n_pen] occurrences in the output (0: in the prompt only) */
    int n_ban;
    const int32_t *ban;        /* [n_ban] */
    int n_words;
    const uint64_t *bits;      /* [n_words] bitsets of ceil(vocab / 64) words, bit i of word i / 64 = id i allowed */
} DevSampleBatch;

/* One row's result (device-written, copied back). */
typedef struct DevSampleOut {
    int32_t token;
    int32_t n_kept;      /* size of the kept set */
    float logprob;       /* under the sampled distribution (0 for greedy) */
    float logprob_raw;   /* NAN unless DEV_SAMPLE_RAW */
    float value;         /* NAN unless DEV_SAMPLE_VALUE */
    int32_t rank;        /* 0 unless DEV_SAMPLE_VALUE */
    int32_t mask_form;   /* DEV_SAMPLE_MASK: DEV_MASK_* of the packed set (dev_mask_form of n_kept) */
    int32_t mask_len;    /* DEV_SAMPLE_MASK: its int32s, in slot mask_slot of the packed sets */
    int32_t top_ids[DEV_SAMPLE_MAX_TOP_N];  /* [top_n] */
    float top_lp[DEV_SAMPLE_MAX_TOP_N];     /* [top_n] */
} DevSampleOut;

/* Capacities of a backend's sampling staging (Backend.sample_reserve). */
typedef struct DevSampleCaps {
    int max_rows, vocab;
    int max_list;  /* bias + penalty + ban entries per step, all rows together */
    int max_words; /* bitset words per step, all rows together */
} DevSampleCaps;

#endif
