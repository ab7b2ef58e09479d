/*
 * sampling_device.c - rows of a DevSampleBatch from sampler_sample's
 * arguments (sampling_device.h), and results back. The lists reproduce
 * sampling.c's processing (process, apply_penalties) element for element;
 * the order of the float operations is the kernel's (sampling.cu).
 *
 * Not here: the kernels, the reference (sampling.c).
 */
#include "sampling_device.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct DevSampleBuilder {
    DevSampleCaps caps;
    int words;             /* ceil(vocab / 64) */
    DevSampleBatch batch;  /* points into the arrays below */
    DevSampleRow *rows;    /* [max_rows] */
    int32_t *bias_ids;     /* [max_list] */
    float *bias_val;       /* [max_list] */
    int32_t *pen_ids;      /* [max_list] */
    int32_t *pen_count;    /* [max_list] */
    int32_t *ban;          /* [max_list] */
    uint64_t *bits;        /* [max_words] */
    int32_t *cnt;          /* [vocab] output counts, zero between calls */
    uint8_t *mark;         /* [vocab] listed marks, zero between calls */
};

DevSampleBuilder *dev_sample_builder_create(const DevSampleCaps *caps) {
    DevSampleBuilder *b = xcalloc(1, sizeof *b);
    b->caps = *caps;
    b->words = (caps->vocab + 63) / 64;
    size_t L = caps->max_list > 0 ? (size_t)caps->max_list : 1;
    b->rows = xcalloc((size_t)caps->max_rows, sizeof *b->rows);
    b->bias_ids = xcalloc(L, sizeof(int32_t));
    b->bias_val = xcalloc(L, sizeof(float));
    b->pen_ids = xcalloc(L, sizeof(int32_t));
    b->pen_count = xcalloc(L, sizeof(int32_t));
    b->ban = xcalloc(L, sizeof(int32_t));
    b->bits = xcalloc(caps->max_words > 0 ? (size_t)caps->max_words : 1, sizeof(uint64_t));
    b->cnt = xcalloc((size_t)caps->vocab, sizeof(int32_t));
    b->mark = xcalloc((size_t)caps->vocab, 1);
    b->batch.rows = b->rows;
    b->batch.bias_ids = b->bias_ids;
    b->batch.bias_val = b->bias_val;
    b->batch.pen_ids = b->pen_ids;
    b->batch.pen_count = b->pen_count;
    b->batch.ban = b->ban;
    b->batch.bits = b->bits;
    return b;
}

void dev_sample_builder_free(DevSampleBuilder *b) {
    if (!b) return;
    free(b->rows);
    free(b->bias_ids);
    free(b->bias_val);
    free(b->pen_ids);
    free(b->pen_count);
    free(b->ban);
    free(b->bits);
    free(b->cnt);
    free(b->mark);
    free(b);
}

void dev_sample_builder_reset(DevSampleBuilder *b) {
    b->batch.n_rows = b->batch.n_masks = b->batch.n_bias = b->batch.n_pen = b->batch.n_ban = b->batch.n_words = 0;
}

const DevSampleBatch *dev_sample_builder_batch(const DevSampleBuilder *b) { return &b->batch; }

static int list_used(const DevSampleBuilder *b) { return b->batch.n_bias + b->batch.n_pen + b->batch.n_ban; }

int dev_sample_builder_add(DevSampleBuilder *b, int logit_row, const SamplingParams *p, const SampleHistory *h,
                           const int32_t *eos_ids, int n_eos, int seq_index, int pos, const SampleWant *want) {
    DevSampleBatch *B = &b->batch;
    const int V = b->caps.vocab;
    const int pen = p->repetition_penalty != 1.0f || p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f;
    const int minb = h->n_output < p->min_tokens;
    /* upper bounds first: a row that does not fit leaves the batch as it was */
    long need_list = (long)p->n_logit_bias + p->n_bad_words + (minb ? n_eos + p->n_stop_ids : 0) +
                     (pen ? (long)h->n_output + (p->repetition_penalty != 1.0f ? h->n_prompt : 0) : 0);
    long need_words = (p->n_allowed > 0 ? b->words : 0) + (want && want->allowed ? b->words : 0);
    if (B->n_rows >= b->caps.max_rows || list_used(b) + need_list > b->caps.max_list ||
        B->n_words + need_words > b->caps.max_words)
        return -1;
    DevSampleRow *r = &b->rows[B->n_rows];
    memset(r, 0, sizeof *r);
    r->logit_row = logit_row;
    r->temperature = p->temperature;
    r->top_p = p->top_p;
    r->min_p = p->min_p;
    r->top_k = p->top_k;
    r->presence = p->presence_penalty;
    r->frequency = p->frequency_penalty;
    r->repetition = p->repetition_penalty;
    r->seq_index = seq_index;
    r->pos = pos;
    r->seed = p->seed;
    if (want) {
        r->flags = (want->raw_logprob ? DEV_SAMPLE_RAW : 0) | (want->value ? DEV_SAMPLE_VALUE : 0) |
                   (want->mask ? DEV_SAMPLE_MASK : 0);
        r->mode = (int32_t)want->mode;
        r->top_n = want->top_n < V ? want->top_n : V;
    }
    r->mask_slot = want && want->mask ? B->n_masks++ : -1;
    /* logit_bias, in order */
    r->bias_off = B->n_bias;
    for (int i = 0; i < p->n_logit_bias; i++) {
        b->bias_ids[B->n_bias] = p->logit_bias_ids[i];
        b->bias_val[B->n_bias++] = p->logit_bias[i];
    }
    r->n_bias = B->n_bias - r->bias_off;
    /* bans: bad words (vLLM: on the output only), then min_tokens */
    r->ban_off = B->n_ban;
    for (int w = 0; w < p->n_bad_words; w++) {
        const int32_t *bw = p->bad_word_ids + p->bad_word_off[w];
        int L = p->bad_word_off[w + 1] - p->bad_word_off[w];
        if (L - 1 > h->n_output) continue;
        if (L == 1 || !memcmp(h->output + h->n_output - (L - 1), bw, (size_t)(L - 1) * sizeof(int32_t)))
            b->ban[B->n_ban++] = bw[L - 1];
    }
    if (minb) {
        if (!p->ignore_eos)
            for (int i = 0; i < n_eos; i++)
                if (eos_ids[i] >= 0 && eos_ids[i] < V) b->ban[B->n_ban++] = eos_ids[i];
        for (int i = 0; i < p->n_stop_ids; i++) b->ban[B->n_ban++] = p->stop_ids[i];
    }
    r->n_ban = B->n_ban - r->ban_off;
    /* bitsets */
    r->allow_off = -1;
    r->gram_off = -1;
    if (p->n_allowed > 0) {
        uint64_t *m = b->bits + B->n_words;
        memset(m, 0, sizeof(uint64_t) * (size_t)b->words);
        for (int i = 0; i < p->n_allowed; i++) m[p->allowed_ids[i] >> 6] |= 1ull << (p->allowed_ids[i] & 63);
        r->allow_off = B->n_words;
        B->n_words += b->words;
    }
    if (want && want->allowed) {
        memcpy(b->bits + B->n_words, want->allowed, sizeof(uint64_t) * (size_t)b->words);
        r->gram_off = B->n_words;
        B->n_words += b->words;
    }
    /* penalties: distinct ids with their output counts (ids out of range are
     * skipped, as apply_penalties skips them) */
    r->pen_off = B->n_pen;
    if (pen) {
        for (int i = 0; i < h->n_output; i++) {
            int32_t t = h->output[i];
            if (t >= 0 && t < V) b->cnt[t]++;
        }
        for (int pass = p->repetition_penalty != 1.0f ? 0 : 1; pass < 2; pass++) {
            const int32_t *ids = pass ? h->output : h->prompt;
            int n = pass ? h->n_output : h->n_prompt;
            for (int i = 0; i < n; i++) {
                int32_t t = ids[i];
                if (t < 0 || t >= V || b->mark[t]) continue;
                b->mark[t] = 1;
                b->pen_ids[B->n_pen++] = t;
            }
        }
        for (int j = r->pen_off; j < B->n_pen; j++) {
            int32_t t = b->pen_ids[j];
            b->pen_count[j] = b->cnt[t];
            b->cnt[t] = 0;
            b->mark[t] = 0;
        }
    }
    r->n_pen = B->n_pen - r->pen_off;
    return B->n_rows++;
}

void dev_sample_result(const DevSampleOut *o, const SampleWant *want, SampleResult *res) {
    res->token = o->token;
    res->logprob = o->logprob;
    res->logprob_raw = o->logprob_raw;
    res->value = o->value;
    res->rank = o->rank;
    res->n_kept = o->n_kept;
    if (want && want->top_n > 0)
        for (int i = 0; i < want->top_n && i < DEV_SAMPLE_MAX_TOP_N; i++) {
            want->top_ids[i] = o->top_ids[i];
            want->top_logprobs[i] = o->top_lp[i];
        }
}
