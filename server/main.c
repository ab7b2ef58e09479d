/*
 * main.c - entry point of sampler-cpu and the per-GPU binaries.
 * Until the GPU backend lands, the GPU binaries detect the device and exit.
 */
#include <stdio.h>
#include <stddef.h>

#ifdef SAMPLER_GPU_SM
#include "cuda_kernels.h"
static int gpu_refuse(void) {
    int major, minor, sms;
    size_t mem;
    char name[256];
    if (cuda_device_probe(&major, &minor, &sms, &mem, name, sizeof name) != 0)
        fprintf(stderr, "sampler-sm%d: no CUDA device found; run sampler-cpu instead\n", SAMPLER_GPU_SM);
    else
        fprintf(stderr, "sampler-sm%d: found %s (sm_%d%d, %d SMs, %zu MiB); the GPU backend is not "
                "implemented yet: run sampler-cpu\n", SAMPLER_GPU_SM, name, major, minor, sms, mem >> 20);
    return 2;
}
#endif

int main(int argc, char **argv) {
#ifdef SAMPLER_GPU_SM
    return gpu_refuse();
#else
    (void)argc; (void)argv;
    printf("sampler-cpu: not yet\n");
    return 0;
#endif
}
