/*
 * cuda_pdl.cuh - programmatic dependent launch (sm_90+) for the kernels of a
 * step. A kernel launched through pdl_launch may be scheduled while the
 * kernel before it on the stream is still finishing: its blocks take the SMs
 * that kernel's finished blocks free, so its launch latency and block start-up
 * hide behind that kernel's tail instead of following it. A decode step at
 * batch 1 is a chain of ~10 short kernels a layer (3.5 us each for the small
 * ones on the 2026-11-29 H200, mostly latency: bench/RESULTS.md), which is
 * where this pays.
 *
 * The contract, which makes it safe: every kernel launched through pdl_launch
 * calls pdl_wait() before any global memory access (only pdl_prefetch_l2, a
 * hint that reads nothing, may come before it). pdl_wait
 * (griddepcontrol.wait) returns once the kernels before it on the stream have
 * completed and their writes are visible, so the kernel reads nothing early
 * and writes nothing the previous kernel still reads; and since every kernel
 * of the chain waits, completion stays transitive (a kernel two launches back
 * is complete too). In a kernel launched without the attribute pdl_wait
 * returns at once, so the kernels keep it unconditionally.
 *
 * When the next kernel starts: pdl_wait then lets it launch
 * (griddepcontrol.launch_dependents). The driver launches it once every block
 * of this grid has done so or exited, that is once this grid's last wave is
 * resident, so its blocks never take an SM slot this grid still needs; they
 * take the slots this grid's finished blocks free and stop at their own
 * pdl_wait. Before it the decode GEMVs prefetch the first weight lines they
 * will read into L2 (gemv_tile.cuh, gemv_mma.cuh): weights do not depend on
 * the kernel they wait for, so the memory system streams them during that
 * kernel's tail instead of after it. How much: a 16-byte chunk a lane and
 * weight row, 16 KiB a block (tiled) or 8 KiB (tensor-core tile); with the
 * ~700-1000 blocks an H200 holds, ~10 MB in flight: about what HBM moves in
 * the couple of microseconds a launch overlaps, and well inside the 50 MB L2,
 * so no prefetched line is evicted before its block reads it (a whole tile's
 * worth would be 30-70 MB). At most two grids of the chain are resident at
 * once: a kernel lets its successor launch only after its own wait.
 *
 * On where cuda_pdl_enabled() says so: a binary built for sm_90+ (SAMPLER_GPU_SM;
 * the sm_80 binary's kernels have no griddepcontrol) on a device of compute
 * capability 9+, unless SAMPLER_CUDA_OFF=pdl. Otherwise pdl_launch is a plain
 * launch. Stream capture records the programmatic edges (CUDA 12.3+), so the
 * decode graphs keep them.
 *
 * Which kernels: every kernel of kernels/cuda/ launches through pdl_launch (the
 * forward pass, dense and MoE, prefill and decode, LoRA, and the sampler), so
 * no launch of a step breaks the chain (the emulation checks that a step's
 * kernels all carry the attribute: cuda_emu "presplit, PDL and prefetch", and
 * the routed experts' "launched without PDL"); a new kernel does too. Not:
 * the random fill (start-up) and the delta's scatter / gather (weight updates,
 * between steps), and cuBLAS / cuBLASLt's own kernels, which a pdl_launch
 * kernel after them simply waits for.
 */
#ifndef SAMPLER_CUDA_PDL_CUH
#define SAMPLER_CUDA_PDL_CUH

#include "cuda_kernels.h"

/* In every kernel pdl_launch launches, before its first global memory access: waits for the kernels
 * before it, then lets the next one launch. */
static __device__ __forceinline__ void pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Brings the 128-byte line holding p into L2 (prefetch.global.L2): a hint, no value reaches the thread,
 * so it may come before pdl_wait; L2 is the device's point of coherence for global memory, so a line
 * prefetched before an earlier kernel writes it is updated by that write, never read stale. p must
 * point into an allocation (the emulation reads the byte, so ASan checks it). */
static __device__ __forceinline__ void pdl_prefetch_l2(const void *p) {
#if defined(__CUDA_ARCH__)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#elif defined(CUDA_EMULATION)
    emu_prefetch_l2(p);
#else
    (void)p; /* nvcc's host pass: never called there */
#endif
}

/* k<<<grid, block, smem, s>>>(args) as cudaLaunchKernelEx, with the programmatic-serialization
 * attribute when cuda_pdl_enabled() and s is a created stream (the backend's; the legacy NULL
 * stream of gpu_check's direct launcher calls launches plainly), else an ordinary launch. A launch
 * the driver refuses with the attribute turns PDL off for the process and goes again without it
 * (inside a stream capture the capture then fails, and forward.c runs that step eagerly). Errors
 * surface as a launch's do: the thread's last error, for CUDA_CHECK_LAUNCH after it. */
template <typename... P, typename... A>
static void pdl_launch(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A... args) {
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = at;
    cfg.numAttrs = s && cuda_pdl_enabled() ? 1 : 0;
    if (cudaLaunchKernelEx(&cfg, k, ((P)args)...) != cudaSuccess && cfg.numAttrs) {
        (void)cudaGetLastError();
        cuda_pdl_enable(0);
        cfg.numAttrs = 0;
        (void)cudaLaunchKernelEx(&cfg, k, ((P)args)...);
    }
}

#endif
