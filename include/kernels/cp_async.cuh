/*
 * cp_async.cuh - asynchronous copies from global to shared memory (cp.async,
 * sm_80+), the tile loads of the mma kernels (attention_mma.cu, moe_mma.cu):
 * a thread issues 16-byte copies, closes them into a group, and later waits
 * until at most N of its groups are still in flight, so the next tile's bytes
 * travel while the warps compute on the current one, without passing through
 * registers. The rules a kernel keeps (the CPU emulation enforces them: its
 * copies land only at the wait and leave NaN in their destination until
 * then, tests/gpu/emu/shim/cuda_runtime.h):
 *   - a wait covers only this thread's copies: a __syncthreads after it makes
 *     every thread's bytes of the tile visible to the block;
 *   - a copy may be issued into shared bytes only after a barrier that follows
 *     every read of their previous contents;
 *   - every copy is waited for before the thread returns.
 * Device code only; no tiling policy.
 */
#ifndef SAMPLER_CP_ASYNC_CUH
#define SAMPLER_CP_ASYNC_CUH

#include <stdint.h>

#include "cuda_device.cuh"

/* 16 bytes src -> dst (both 16-byte aligned), or 16 zeros when !full (src is
 * not read then; pass any valid pointer). L2 only (.cg): the tiles are read
 * once per block, and other blocks share them through L2. */
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, bool full) {
#if defined(__CUDA_ARCH__)
    uint32_t s = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src), "r"(full ? 16 : 0) : "memory");
#elif defined(CUDA_EMULATION)
    emu_cp_async16(dst, src, full ? 16 : 0);
#else
    (void)dst, (void)src, (void)full; /* nvcc's host pass: never called there */
#endif
}

/* The copies issued since the last commit become one group (possibly empty). */
static __device__ __forceinline__ void cp_async_commit(void) {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.commit_group;" ::: "memory");
#elif defined(CUDA_EMULATION)
    emu_cp_async_commit();
#endif
}

/* Wait until at most N of this thread's committed groups are in flight. */
template <int N>
static __device__ __forceinline__ void cp_async_wait(void) {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#elif defined(CUDA_EMULATION)
    emu_cp_async_wait(N);
#endif
}

#endif
