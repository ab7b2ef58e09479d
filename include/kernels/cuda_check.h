/*
 * cuda_check.h - the one check mechanism for CUDA runtime calls, cuBLAS calls
 * and kernel launches, in the two error regimes of check.h. `call` returns a
 * cudaError_t or a cublasStatus_t (both 0 on success); the message names the
 * call, the file and the line, and the status (cuda_status_str).
 *
 *   CUDA_CHECK(call)        start-up only (backend creation, runner creation,
 *                           tests): fatal, check_fail prints and exits.
 *   CUDA_TRY(err, call)     request and update paths (a delta refreshing the
 *                           device copy): fills err (Err *, may be NULL) and
 *                           returns its status (-500) from the enclosing
 *                           int function; nothing exits.
 *   CUDA_CHECK_LAUNCH()     after every kernel launch, fatal / returning,
 *   CUDA_TRY_LAUNCH(err)    as above: launch-configuration errors surface here.
 *
 * Included by the .cu files of kernels/cuda (C++, also compiled against the CPU
 * emulation's shim, tests/gpu/emu/shim/) and by tests/gpu/gpu_check.c (C).
 * Not here: the launchers' shape checks (they return -1, cuda_kernels.h).
 */
#ifndef SAMPLER_CUDA_CHECK_H
#define SAMPLER_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "check.h"
#ifdef __cplusplus
}
#endif

/* The status string of either kind of status. */
#ifdef __cplusplus
static inline const char *cuda_status_str(cudaError_t e) { return cudaGetErrorString(e); }
static inline const char *cuda_status_str(cublasStatus_t s) { return cublasGetStatusString(s); }
#define CUDA_STATUS_T_(call) auto
#else
#define cuda_status_str(s) _Generic((s), cudaError_t: cudaGetErrorString, cublasStatus_t: cublasGetStatusString)(s)
#define CUDA_STATUS_T_(call) __typeof__(call)
#endif

#define CUDA_CHECK(call)                                                                            \
    do {                                                                                            \
        CUDA_STATUS_T_(call) s_ = (call);                                                           \
        if ((int)s_ != 0) check_fail(__FILE__, __LINE__, #call, 0, "%s", cuda_status_str(s_));      \
    } while (0)

#define CUDA_TRY(err, call)                                                                         \
    do {                                                                                            \
        CUDA_STATUS_T_(call) s_ = (call);                                                           \
        if ((int)s_ != 0) return ERR((err), 500, "%s: %s", #call, cuda_status_str(s_));             \
    } while (0)

#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
#define CUDA_TRY_LAUNCH(err) CUDA_TRY(err, cudaGetLastError())

#endif
