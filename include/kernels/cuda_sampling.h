/*
 * cuda_sampling.h - the C launcher of the device sampler (kernels/cuda/sampling.cu):
 * a batch of rows of device logits sampled on the device with the semantics
 * of the CPU sampler (dev_sample.h states them and the tie rule). The backend
 * op Backend.sample (backend.h) is this over the backend's stream.
 *
 * A CudaSampler owns what a step needs, sized once by its DevSampleCaps: the
 * processed-logit scratch z [max_rows, vocab] f32 and the packed kept sets
 * [max_rows, W] int32 (W = DEV_MASK_WORDS(vocab)) on the device, and per
 * launch slot (DEV_SAMPLE_SLOTS: a step's results are read while the next
 * step's are produced) pinned host buffers for the packed rows, lists and
 * bitsets (one upload per launch), the compact results and the packed sets
 * (two downloads per launch). Nothing is allocated per call.
 * Device memory: 4 * max_rows * (vocab + W) bytes + the staging; pinned host
 * memory: DEV_SAMPLE_SLOTS * (staging + max_rows * (sizeof(DevSampleOut) + 4 W))
 * (at 256 rows of 151,936 logits: 161 MiB device, ~11 MiB pinned + the lists).
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

/* Launch the sampling of b->n_rows rows of logits [n_logit_rows, vocab] f32
 * (device) on stream, into slot (0 .. DEV_SAMPLE_SLOTS - 1, which must not be
 * launched and not yet waited on): the batch is copied into the slot's pinned
 * staging (b may be reused on return), the kernels and the downloads of the
 * results and of the packed kept sets (rows with DEV_SAMPLE_MASK, in their
 * mask_slot order) are queued, then the slot's event. Does not wait. Returns
 * 0, or -1 with err filled: a shape, offset or mask slot out of range, a batch
 * over the caps (nothing queued then), or a CUDA error. */
int cuda_sampler_launch(CudaSampler *s, const float *logits, int n_logit_rows, int vocab, const DevSampleBatch *b,
                        int slot, void *stream, Err *err);
/* Wait for slot's launch (its event only: later work on the stream goes on):
 * *out [n_rows] the results, *packed [n_masks, DEV_MASK_WORDS(vocab)] the
 * packed sets (row r's at mask_slot, out[r].mask_len int32s of form
 * out[r].mask_form), both pinned host memory valid until the slot's next
 * launch. Returns 0, or -1 with err filled (a CUDA error, a result out of
 * range: nothing of the launch may be used). */
int cuda_sampler_wait(CudaSampler *s, int slot, const DevSampleOut **out, const int32_t **packed, Err *err);
/* Device time (Backend.step_begin / device_seconds): step_begin records on
 * stream the mark where the next launch's step begins (before the step's
 * first op); each wait then adds the device seconds from that mark to the
 * launch's results (cudaEventElapsedTime) to busy_s. A step with no mark,
 * or whose mark could not be recorded, adds nothing. step_begin: 0, or -1
 * (no mark: the measurement skips that step, the step itself is unharmed). */
int cuda_sampler_step_begin(CudaSampler *s, void *stream);
double cuda_sampler_busy_s(const CudaSampler *s);
/* Queue on stream: every tokens[i] < 0 (device int32 [n]) becomes the token
 * of row -1 - tokens[i] of the last launch, whose rows must be >= n_src >
 * every such index (the caller checked its tokens against n_src). 0, or -1. */
int cuda_sampler_resolve(CudaSampler *s, int32_t *tokens, int n, int n_src, void *stream);

/* The device's counter RNG on the host (the same function as sampling_uniform,
 * for tests): a uniform double in [0, 1) from (seed, seq, pos). */
double cuda_sampling_uniform(uint64_t seed, uint64_t seq_index, uint64_t pos);

#ifdef __cplusplus
}
#endif
#endif
