/*
 * cuda_check.h - check macros for CUDA runtime, cuBLAS and kernel launches.
 * CUDA_CHECK is fatal (start-up); CUDA_TRY returns an Err status (request path).
 * Only included by the .cu files of kernels/cuda.
 */
#ifndef SAMPLER_CUDA_CHECK_H
#define SAMPLER_CUDA_CHECK_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CUDA_CHECK(call)                                                              \
    do {                                                                              \
        cudaError_t e_ = (call);                                                      \
        if (e_ != cudaSuccess) {                                                      \
            fprintf(stderr, "fatal: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,      \
                    cudaGetErrorString(e_));                                          \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

/* After every kernel launch: launch-configuration errors surface here. */
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#endif
