/*
 * sampling_device.h - the host half of sampling on the device: turn what
 * sampler_sample takes (SamplingParams, the history, the EOS ids, SampleWant)
 * into the rows and lists of a DevSampleBatch (dev_sample.h) for a backend's
 * sample op, and its results back into SampleResult / SampleWant.
 *
 * Per row it writes: the scalar parameters; logit_bias in order; the ban list
 * (bad words whose prefix ends the output, EOS and stop ids while min_tokens
 * is not reached); allowed_token_ids as a bitset; the grammar's bitset
 * (SampleWant.allowed, copied); and, when a penalty is on, one entry per
 * distinct id of prompt + output (prompt ids only with a repetition penalty)
 * with its count in the output. The device then computes exactly the
 * processed logits sampler_sample computes (dev_sample.h).
 *
 * Host cost per row: O(n_logit_bias + bad words + history) when a penalty is
 * on, O(1) otherwise, plus ceil(vocab / 64) words per bitset. Memory: the
 * arrays of the caps, a [vocab] count and a [vocab] mark, allocated at
 * creation; nothing per call.
 *
 * Not here: the kernels (kernels/cuda/sampling.cu), the choice between device
 * and host sampling (engine_step.c).
 */
#ifndef SAMPLER_SAMPLING_DEVICE_H
#define SAMPLER_SAMPLING_DEVICE_H

#include "dev_sample.h"
#include "sampling.h"

typedef struct DevSampleBuilder DevSampleBuilder;

/* Start-up path: room for caps (its vocab is the model's). */
DevSampleBuilder *dev_sample_builder_create(const DevSampleCaps *caps);
void dev_sample_builder_free(DevSampleBuilder *b);
/* Empty the batch (the start of a step). */
void dev_sample_builder_reset(DevSampleBuilder *b);

/* Append one row sampling from logit row logit_row, with sampler_sample's
 * arguments (want may be NULL; its output pointers are not used here: see
 * dev_sample_result). Returns the row's index, or -1 when the row would not
 * fit the caps (nothing appended: sample it on the host). */
int dev_sample_builder_add(DevSampleBuilder *b, int logit_row, const SamplingParams *p, const SampleHistory *h,
                           const int32_t *eos_ids, int n_eos, int seq_index, int pos, const SampleWant *want);

/* The batch built so far (valid until the next add or reset). */
const DevSampleBatch *dev_sample_builder_batch(const DevSampleBuilder *b);

/* A device result as sampler_sample reports it: res, and want's top_ids /
 * top_logprobs (want may be NULL). The kept ids were written to the mask
 * pointer the op was given. */
void dev_sample_result(const DevSampleOut *o, const SampleWant *want, SampleResult *res);

#endif
