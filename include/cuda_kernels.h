/*
 * cuda_kernels.h - C launchers of the CUDA kernels (kernels/cuda/). Each
 * launcher checks shapes, launches on the given stream and checks the launch.
 * Every kernel has a CPU reference op in cpu_ops.h that tests compare against.
 * Pointers are device pointers.
 */
#ifndef SAMPLER_CUDA_KERNELS_H
#define SAMPLER_CUDA_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out[n, dim] (f32) = x[n, dim] (f32) / rms(x) * w[dim] (bf16). Returns 0, or -1 on bad shape. */
int cuda_rmsnorm(float *out, const float *x, const uint16_t *w, int n, int dim, float eps,
                 void *stream);

/* Device probe for the per-GPU binaries: fills the compute capability and
 * returns 0, or -1 when no CUDA device is usable. */
int cuda_device_probe(int *major, int *minor, int *sm_count, size_t *mem_bytes, char *name,
                      int name_len);

#ifdef __cplusplus
}
#endif
#endif
