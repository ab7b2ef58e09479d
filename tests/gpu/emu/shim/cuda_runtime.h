/*
 * shim/cuda_runtime.h - a CPU emulation of the small part of CUDA the kernels
 * of kernels/cuda/ use, so their index math and reductions can be checked on
 * a machine without a GPU (tests/gpu/emu/run.sh). Every CUDA thread is a
 * pthread; a block's threads run together (barriers for __syncthreads, per
 * warp barriers + a slot array for __shfl_xor_sync); blocks run one after
 * another. Not a performance model, not a memory-model emulator.
 */
#ifndef EMU_CUDA_RUNTIME_H
#define EMU_CUDA_RUNTIME_H

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <functional>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

typedef int cudaError_t;
#define cudaSuccess 0
typedef void *cudaStream_t;
static inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
static inline const char *cudaGetErrorString(cudaError_t) { return "emulated"; }

struct uint3 { unsigned x, y, z; };
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint4 { unsigned x, y, z, w; };
struct float4 { float x, y, z, w; };

struct EmuBlock;
extern thread_local uint3 threadIdx, blockIdx;
extern thread_local dim3 blockDim, gridDim;
extern thread_local EmuBlock *emu_block;

float emu_shfl_xor(float v, int off);
void emu_syncthreads(void);
#define __syncthreads() emu_syncthreads()
#define __shfl_xor_sync(mask, v, off) emu_shfl_xor((v), (off))

template <typename T> static inline T __ldg(const T *p) { return *p; }
static inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

struct EmuCfg { dim3 grid, block; };
static inline EmuCfg emu_cfg(dim3 g, dim3 b, size_t = 0, cudaStream_t = 0) { return EmuCfg{g, b}; }
void emu_run(EmuCfg c, std::function<void()> fn);
#define EMU_LAUNCH(cfg, call) emu_run(emu_cfg cfg, [=]() { call; })

#endif
