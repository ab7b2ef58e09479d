/*
 * device.cu - what the CUDA side of a per-GPU binary knows about itself and
 * the device: the architecture it was compiled for and a probe of device 0.
 * Not here: the binary/device match policy (server/device_select.c).
 */
#include <stdio.h>

#include "cuda_check.h"
#include "cuda_kernels.h"

#ifndef SAMPLER_GPU_SM
#error "kernels/cuda is compiled only into the per-GPU binaries (SAMPLER_GPU_SM=80|90|100|103)"
#endif

extern "C" int cuda_binary_sm(void) { return SAMPLER_GPU_SM; }

extern "C" int cuda_device_probe(int *major, int *minor, int *sm_count, size_t *mem_bytes,
                                 char *name, int name_len) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return -1;
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    *major = p.major;
    *minor = p.minor;
    *sm_count = p.multiProcessorCount;
    *mem_bytes = p.totalGlobalMem;
    snprintf(name, (size_t)name_len, "%s", p.name);
    return 0;
}

/* cuda_pdl.cuh: programmatic dependent launch where both sides have it (the binary's kernels call
 * griddepcontrol.wait from sm_90 on; the device schedules it from compute capability 9). -1: not
 * decided yet (the first query probes device 0, so a launch before any backend is consistent). */
static int pdl_state = -1;
static int pdl_possible(void) {
    int major = 0;
    return SAMPLER_GPU_SM >= 90 && cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess &&
           major >= 9;
}
static int gemv_prefetch_on = 1;
extern "C" void cuda_gemv_prefetch_enable(int on) { __atomic_store_n(&gemv_prefetch_on, on != 0, __ATOMIC_RELAXED); }
extern "C" int cuda_gemv_prefetch_enabled(void) { return __atomic_load_n(&gemv_prefetch_on, __ATOMIC_RELAXED); }
extern "C" void cuda_pdl_enable(int on) { __atomic_store_n(&pdl_state, on && pdl_possible(), __ATOMIC_RELAXED); }
extern "C" int cuda_pdl_enabled(void) { /* read at every launch, by whichever thread launches (relaxed: a flag) */
    int v = __atomic_load_n(&pdl_state, __ATOMIC_RELAXED);
    if (v < 0) {
        v = pdl_possible();
        __atomic_store_n(&pdl_state, v, __ATOMIC_RELAXED);
    }
    return v;
}
