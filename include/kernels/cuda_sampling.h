/*
 * cuda_sampling.h - the C launcher of the device sampler (kernels/cuda/sampling.cu):
 * a batch of rows of device logits sampled on the device with the semantics
 * of the CPU sampler (dev_sample.h states them and the tie rule). The backend
 * op Backend.sample (backend.h) is this over the backend's stream.
 *
 * A CudaSampler owns what a step needs, sized once by its DevSampleCaps: the
 * processed-logit scratch z [max_rows, vocab] f32 and the kept-id buffer
 * [max_rows, vocab] int32 on the device, a pinned host staging buffer for the
 * packed rows, lists and bitsets (one upload per call) and for the compact
 * results (one download per call), plus one download per row that asked for
 * its kept set (n_kept ids). Nothing is allocated per call.
 * Device memory: 8 * max_rows * vocab bytes + the staging (bounded by caps).
 *
 * Not here: building the rows from SamplingParams (sampling_device.h), the
 * reference (sampling.c).
 */
#ifndef SAMPLER_CUDA_SAMPLING_H
#define SAMPLER_CUDA_SAMPLING_H

#include <stddef.h>
#include <stdint.h>

#include "dev_sample.h"

#ifdef __cplusplus
extern "C" {
#endif
#include "check.h"

typedef struct CudaSampler CudaSampler;

/* Start-up path: allocates the device scratch and the pinned staging; NULL
 * with err filled when they cannot be had (caps invalid, out of memory). */
CudaSampler *cuda_sampler_create(const DevSampleCaps *caps, Err *err);
void cuda_sampler_free(CudaSampler *s);
const DevSampleCaps *cuda_sampler_caps(const CudaSampler *s);

/* Sample b->n_rows rows of logits [n_logit_rows, vocab] f32 (device) on
 * stream: out [n_rows] (host) receives each row's result; masks (NULL, or
 * [n_rows] host pointers, each NULL or room for vocab ids) receives the kept
 * ids, ascending, of the rows with DEV_SAMPLE_MASK. Synchronises the stream
 * before it returns. Returns 0, or -1 with err filled: a shape or offset out
 * of range, a batch over the caps (nothing launched then), or a CUDA error. */
int cuda_sampler_run(CudaSampler *s, const float *logits, int n_logit_rows, int vocab, const DevSampleBatch *b,
                     DevSampleOut *out, int32_t *const *masks, void *stream, Err *err);

/* The device's counter RNG on the host (the same function as sampling_uniform,
 * for tests): a uniform double in [0, 1) from (seed, seq, pos). */
double cuda_sampling_uniform(uint64_t seed, uint64_t seq_index, uint64_t pos);

#ifdef __cplusplus
}
#endif
#endif
