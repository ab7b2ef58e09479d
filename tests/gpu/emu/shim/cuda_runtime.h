/*
 * shim/cuda_runtime.h - a CPU emulation of the small part of CUDA the kernels
 * of kernels/cuda/ use, so their index math and reductions can be checked on
 * a machine without a GPU (ctest cuda_emu, target emu_check). Every CUDA thread is a
 * fiber (a pthread under TSan: emu.cpp); a block's threads run together (barriers for
 * __syncthreads, per warp barriers + a slot array for __shfl_xor_sync); blocks run one
 * after another. Not a performance model, not a memory-model emulator.
 */
#ifndef EMU_CUDA_RUNTIME_H
#define EMU_CUDA_RUNTIME_H

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <functional>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

enum cudaError { cudaSuccess = 0, cudaErrorMemoryAllocation = 2, cudaErrorInvalidConfiguration = 9,
                 cudaErrorInvalidResourceHandle = 400,
                 cudaErrorLaunchFailure = 719,
                 cudaErrorNotSupported = 801, cudaErrorStreamCaptureUnsupported = 900,
                 cudaErrorStreamCaptureInvalidated = 901, cudaErrorUnknown = 999 };
typedef enum cudaError cudaError_t;
typedef void *cudaStream_t;
static inline const char *cudaGetErrorString(cudaError_t e) {
    return e == cudaSuccess ? "no error" : e == cudaErrorUnknown ? "emulated failure (injected)" : "emulated error";
}

/* Fault injection (emu.cpp; tests/gpu/emu/emu_check.cpp drives it): after
 * emu_fail_nth(k) the k-th fallible call from then on fails once and does
 * nothing: cudaMalloc, cudaMemset*, cudaMemcpy*, cudaStreamSynchronize,
 * cudaDeviceSynchronize and cublasGemmEx return cudaErrorUnknown / an error
 * status, a kernel launch does not run and the next cudaGetLastError reports
 * cudaErrorLaunchFailure (as on a device). emu_fail_nth(0) disarms;
 * emu_failed() says whether the armed failure fired. cudaFree never fails
 * (a failed free would only leak). */
void emu_fail_nth(long k);
int emu_failed(void);
int emu_fault(void);        /* 1: this call is the one to fail */
int emu_launch_fault(void); /* emu_fault for a launch: also records the pending launch error */
cudaError_t cudaGetLastError(void);
#define EMU_FAULT(err) do { if (emu_fault()) return (err); } while (0)
/* Silent corruption (emu.cpp): after emu_corrupt_nth(k) the k-th host-to-device
 * copy from then on (cudaMemcpy, cudaMemcpyAsync) succeeds but lands with bit 0
 * of its first byte flipped, once: what a check that reads back what it sent
 * must see. emu_corrupt_nth(0) disarms; emu_corrupted() says whether it fired. */
void emu_corrupt_nth(long k);
int emu_corrupted(void);
/* Kernels run so far (eager launches and graph replays' nodes; emu.cpp emu_submit): what a test of a
 * launch saved counts. */
long emu_kernels_run(void);
/* Blocks run one after another, first to last; emu_blocks_reverse(1): last to first, so a kernel
 * whose result must not depend on which block finishes last (a last-block epilogue) is checked
 * with another block last. */
void emu_blocks_reverse(int on);
int emu_corrupt(void); /* 1: this copy is the one to corrupt */

/* Stream capture (graphs, emu.cpp): between cudaStreamBeginCapture and
 * cudaStreamEndCapture every launch, async copy, async memset and library
 * call (cuBLAS / cuBLASLt) is recorded with its arguments as they are at the
 * call (a kernel's parameters copied, as CUDA copies them) instead of run; a
 * graph launch runs the recording in order. A call CUDA refuses inside a
 * capture (a synchronous copy or memset, a synchronize, an allocation)
 * returns cudaErrorStreamCaptureUnsupported and invalidates the capture, so
 * cudaStreamEndCapture fails as it would on a device: capture-unsafe code in
 * a captured region is caught here. */
int emu_capturing(void);
void emu_capture_bad(void);
void emu_record(std::function<void()> fn);
#define EMU_CAPTURE_REFUSE() do { if (emu_capturing()) { emu_capture_bad(); return cudaErrorStreamCaptureUnsupported; } } while (0)

/* The runtime API over host memory: "device" pointers are malloc'ed, copies
 * are memcpy, streams are ordered trivially (launches run to completion). */
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3 };
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrComputeCapabilityMajor = 75 };
#define cudaStreamNonBlocking 1
struct cudaDeviceProp { char name[256]; size_t totalGlobalMem; int major, minor, multiProcessorCount; };
#define EMU_SMS 4
static inline cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
static inline cudaError_t cudaSetDevice(int) { return cudaSuccess; }
static inline cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int) {
    *v = a == cudaDevAttrComputeCapabilityMajor ? 9 : EMU_SMS;
    return cudaSuccess;
}
static inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int) {
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "CPU emulation");
    p->totalGlobalMem = (size_t)1 << 32;
    p->major = 9;
    p->multiProcessorCount = EMU_SMS;
    return cudaSuccess;
}
static inline cudaError_t cudaMemGetInfo(size_t *f, size_t *t) { *f = *t = (size_t)1 << 32; return cudaSuccess; }
static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) { *s = malloc(1); return cudaSuccess; }
static inline cudaError_t cudaStreamDestroy(cudaStream_t s) { free(s); return cudaSuccess; }
/* Pinned host memory in flight (emu.cpp). Copies run when issued here, but on
 * a device an async copy out of pinned host memory reads it when the stream
 * gets there, so the host may rewrite those bytes only after a synchronize,
 * or an event recorded after the copy, has been waited for. The emulation
 * keeps every async copy out of pinned memory (cudaMallocHost) as in flight
 * until such a wait covers it; a copy that reads pinned bytes an in-flight copy
 * also reads is a hazard (that is how a rewrite before the wait shows):
 * counted, the first few printed, emu_pinned_hazards() tells.
 * The other way, an async copy into pinned memory lands, on a device, when
 * the stream gets there, so the host may read it only after such a wait: here
 * it lands at that wait (emu_pinned_defer keeps the source bytes as the copy
 * was issued, the destination reads 0xa5 bytes until then), so a read before
 * the wait gets those bytes, not the result. Into pageable memory it returns
 * once done, as CUDA's does. */
void emu_pinned_add(const void *p, size_t n);
void emu_pinned_del(const void *p);
void emu_pinned_copy(const void *src, size_t n); /* an async copy reads [src, src + n) */
int emu_pinned_defer(void *dst, const void *src, size_t n); /* 1: dst is pinned, the copy lands at a wait */
uint64_t emu_copy_mark(void);                    /* what an event recorded now covers */
void emu_copies_done(uint64_t mark);             /* a wait covering mark returned */
long emu_pinned_hazards(void);
static inline cudaError_t cudaStreamSynchronize(cudaStream_t) {
    EMU_CAPTURE_REFUSE();
    EMU_FAULT(cudaErrorUnknown);
    emu_copies_done(emu_copy_mark());
    return cudaSuccess;
}
static inline cudaError_t cudaDeviceSynchronize(void) {
    EMU_CAPTURE_REFUSE();
    EMU_FAULT(cudaErrorUnknown);
    emu_copies_done(emu_copy_mark());
    return cudaSuccess;
}
/* Events: a launch has run when it returns; an event holds the copy mark of
 * its record, and a wait (fallible like a stream synchronize) marks the copies
 * before it done. A timing event also holds the host clock at its record (the
 * emulated device computes while the host launches): cudaEventElapsedTime is
 * the difference, refused as CUDA refuses it for a DisableTiming event. */
typedef void *cudaEvent_t;
#define cudaEventDefault 0
#define cudaEventDisableTiming 2
typedef struct EmuEvent { uint64_t mark; double t; unsigned flags; int recorded; } EmuEvent;
static inline double emu_clock_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    EmuEvent *ev = (EmuEvent *)calloc(1, sizeof(EmuEvent));
    ev->flags = flags;
    *e = ev;
    return cudaSuccess;
}
static inline cudaError_t cudaEventDestroy(cudaEvent_t e) { free(e); return cudaSuccess; }
static inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
    EMU_FAULT(cudaErrorUnknown);
    EmuEvent *ev = (EmuEvent *)e;
    ev->mark = emu_copy_mark();
    ev->t = emu_clock_s();
    ev->recorded = 1;
    return cudaSuccess;
}
static inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    EMU_CAPTURE_REFUSE();
    EMU_FAULT(cudaErrorUnknown);
    emu_copies_done(((EmuEvent *)e)->mark);
    return cudaSuccess;
}
static inline cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    const EmuEvent *a = (const EmuEvent *)start, *b = (const EmuEvent *)end;
    if ((a->flags | b->flags) & cudaEventDisableTiming) return cudaErrorInvalidResourceHandle;
    if (!a->recorded || !b->recorded) return cudaErrorInvalidResourceHandle;
    *ms = (float)(1e3 * (b->t - a->t));
    return cudaSuccess;
}
/* Device memory comes uninitialized, as on a GPU; here every byte reads 0xff (f32 / bf16 NaN,
 * int32 -1), so a kernel that reads what nothing wrote shows in the results. */
template <typename T> static inline cudaError_t cudaMalloc(T **p, size_t n) {
    EMU_CAPTURE_REFUSE();
    EMU_FAULT(cudaErrorMemoryAllocation);
    *p = (T *)malloc(n ? n : 1);
    if (*p) memset((void *)*p, 0xff, n);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
static inline cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
/* Pinned host memory: plain host memory here (fallible like cudaMalloc). */
template <typename T> static inline cudaError_t cudaMallocHost(T **p, size_t n) {
    EMU_CAPTURE_REFUSE();
    EMU_FAULT(cudaErrorMemoryAllocation);
    *p = (T *)malloc(n ? n : 1);
    if (*p) emu_pinned_add((const void *)*p, n ? n : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
static inline cudaError_t cudaFreeHost(void *p) { emu_pinned_del(p); free(p); return cudaSuccess; }
static inline cudaError_t cudaMemset(void *p, int v, size_t n) {
    EMU_CAPTURE_REFUSE();
    EMU_FAULT(cudaErrorUnknown);
    memset(p, v, n);
    return cudaSuccess;
}
static inline cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t) {
    EMU_FAULT(cudaErrorUnknown);
    if (emu_capturing()) emu_record([=]() { memset(p, v, n); });
    else memset(p, v, n);
    return cudaSuccess;
}
static inline cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind k) {
    EMU_CAPTURE_REFUSE();
    EMU_FAULT(cudaErrorUnknown);
    memcpy(d, s, n);
    if (k == cudaMemcpyHostToDevice && n && emu_corrupt()) *(unsigned char *)d ^= 1u;
    return cudaSuccess;
}
static inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t) {
    EMU_FAULT(cudaErrorUnknown);
    if (emu_capturing()) {
        emu_record([=]() { memcpy(d, s, n); });
        return cudaSuccess;
    }
    emu_pinned_copy(s, n);
    if (!emu_pinned_defer(d, s, n)) memcpy(d, s, n);
    if (k == cudaMemcpyHostToDevice && n && emu_corrupt()) *(unsigned char *)d ^= 1u;
    return cudaSuccess;
}

/* Graphs (the capture above; emu.cpp). An instantiated graph shares its
 * recording; a launch runs it. */
struct EmuGraph;
typedef EmuGraph *cudaGraph_t;
typedef EmuGraph *cudaGraphExec_t;
enum cudaStreamCaptureMode { cudaStreamCaptureModeThreadLocal = 1 };
cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode);
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t *g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e);

struct uint3 { unsigned x, y, z; };
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
/* CUDA's alignments (vector_types.h): a device faults on a uint4 load from an
 * address that is not a multiple of 16, so the emulation's types demand the
 * same, and UBSan (-fsanitize=alignment, the sanitizer build) reports a
 * misaligned vector access in a kernel as the GPU would. */
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };

extern thread_local uint3 threadIdx, blockIdx;
extern thread_local uint3 blockDim, gridDim; /* CUDA's are dim3: the kernels read .x .y .z only */

float emu_shfl_xor(float v, int off);
void emu_syncthreads(void);
#define __syncthreads() emu_syncthreads()
/* __syncwarp() (full mask): a barrier of the calling warp, which also orders
 * its lanes' shared-memory accesses (warp-private tiles, attention_dec_mma.cu) */
void emu_syncwarp(void);
#define __syncwarp() emu_syncwarp()
#define __shfl_xor_sync(mask, v, off) emu_shfl_xor((v), (off))

/* The kernels' inline-PTX paths are guarded by __CUDA_ARCH__; this says the
 * emulation's replacement of such a path exists (e.g. attention_mma.cu's mma). */
#define CUDA_EMULATION 1
/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 as a warp collective,
 * with the PTX ISA's fragment layout ("Matrix Fragments for mma.m16n8k16 with
 * floating point type", 9.7.14.5.8 in ISA 9.0; g = lane / 4, t = lane % 4; each 32-bit
 * register holds two bf16, the lower k / column in the low half):
 *   a[0] A[g][2t..2t+1]  a[1] A[g+8][2t..2t+1]  a[2] A[g][2t+8..]  a[3] A[g+8][2t+8..]
 *   b[0] B[2t..2t+1][g]  b[1] B[2t+8..2t+9][g]
 *   c/d[0..1] C[g][2t..2t+1]  c/d[2..3] C[g+8][2t..2t+1]
 * Every lane of the warp must call it (as on a device: .aligned); d = A B + c
 * with the bf16 products exact in f32, summed over k in order, then c added. */
void emu_mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]);
/* mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32: the same layout with IEEE binary16 elements. */
void emu_mma_m16n8k16_f16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]);
/* mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 likewise ("Matrix
 * Fragments for mma.m16n8k32" with .e4m3; each register holds four e4m3, the
 * lower k in the lower byte, i = 0..3):
 *   a[0] A[g][4t+i]  a[1] A[g+8][4t+i]  a[2] A[g][4t+16+i]  a[3] A[g+8][4t+16+i]
 *   b[0] B[4t+i][g]  b[1] B[4t+16+i][g]
 *   c/d as m16n8k16. d = A B + c, the e4m3 products exact in f32, summed over k
 * in order, then c added (a device keeps fewer accumulator bits: a tolerance). */
void emu_mma_m16n8k32_e4m3(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]);
/* ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16 as a warp collective (PTX
 * ISA "Warp-level matrix load instruction: ldmatrix"): lane l gives the address
 * of row l % 8 of matrix l / 8 (8 b16 elements, 16-byte aligned); register j of
 * lane l (g = l / 4, t = l % 4) gets matrix j's elements (g, 2t), (g, 2t+1), or
 * with .trans (2t, g), (2t+1, g), the first in the low half. */
void emu_ldmatrix_x4(uint32_t r[4], const void *row, int trans);
/* cp.async.cg.shared.global [dst], [src], 16, src_bytes (PTX ISA "Data
 * Movement and Conversion Instructions: cp.async"), commit_group and
 * wait_group n, per thread. The emulation makes the copy land as late as the
 * ISA allows and makes its destination garbage until then: at the issue the
 * 16 destination bytes become 0xff (a bf16 / e4m3 / f32 NaN), and the data
 * (src_bytes of src, then zeros) land only when this thread's wait_group
 * covers the copy's group. A read of the tile before the wait (or before the
 * barrier that follows the other threads' waits) or a copy issued into bytes
 * another thread still reads sees NaN, which the op checks catch. Both
 * addresses must be 16-byte aligned (a device faults otherwise); a thread that
 * exits with copies not waited for is a kernel bug (their bytes never land as
 * the kernel meant) and stops the emulation. */
void emu_cp_async16(void *dst, const void *src, int src_bytes);
void emu_cp_async_commit(void);
void emu_cp_async_wait(int n);
/* prefetch.global.L2 (cuda_pdl.cuh pdl_prefetch_l2): a hint, so it changes no result; here it reads
 * the byte (ASan: the address lies in an allocation, as the kernel's contract says) and counts
 * (emu_prefetches_l2: a test that the decode GEMVs issue theirs). */
void emu_prefetch_l2(const void *p);
long emu_prefetches_l2(void);

template <typename T> static inline T __ldg(const T *p) { return *p; }
/* __ldcg (a load through L2, skipping L1: a value another block wrote) and __threadfence: blocks run
 * one after another here, so a plain load and a full fence (EMU_PTHREADS' threads) say the same. */
template <typename T> static inline T __ldcg(const T *p) { return *p; }
static inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
/* Integer atomics (shared or global memory): the fibers of a block switch only
 * at barriers, the OS threads of EMU_PTHREADS need the real thing; both are
 * exact, so a sum is independent of the threads' order as on a device. */
static inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
/* CUDA's documented semantics: byte i of the result is byte (s >> 4i) & 7 of
 * the 8 bytes y:x (x the low four); the selector's bit 3 of each nibble and its
 * bits 16..31 are ignored. (PTX prmt would replicate the sign on bit 3.) */
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    uint64_t v = (uint64_t)y << 32 | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)(v >> (8 * ((s >> (4 * i)) & 7)) & 0xffu) << (8 * i);
    return r;
}

struct EmuCfg { dim3 grid, block; };
static inline EmuCfg emu_cfg(dim3 g, dim3 b, size_t = 0, cudaStream_t = 0) { return EmuCfg{g, b}; }
void emu_run(EmuCfg c, std::function<void()> fn);
/* A launch runs now, or is recorded while a capture is open (emu.cpp). A
 * configuration a device refuses (an empty grid, grid y or z above 65535,
 * grid x above 2^31 - 1) runs nothing and leaves cudaErrorInvalidConfiguration
 * for cudaGetLastError, as a device's launch does (and says so on stderr). */
void emu_submit(EmuCfg c, std::function<void()> fn);
/* kernel<<<cfg>>>(args) (to_cpp.py writes EMU_LAUNCH((cfg), kernel, (args))):
 * the arguments are converted to the kernel's parameter types and copied at
 * the launch, as CUDA copies them, so a launch recorded in a graph keeps the
 * values it was given (a pointer to a caller's struct may be gone by then). */
template <typename... P> struct EmuBinder {
    EmuCfg c;
    void (*k)(P...);
    void operator()(P... p) const {
        void (*kk)(P...) = k;
        emu_submit(c, [=]() { kk(p...); });
    }
};
template <typename... P> static inline EmuBinder<P...> emu_bind(EmuCfg c, void (*k)(P...)) { return EmuBinder<P...>{c, k}; }
#define EMU_LAUNCH(cfg, kern, args) do { if (!emu_launch_fault()) emu_bind(emu_cfg cfg, kern) args; } while (0)

/* cudaLaunchKernelEx with its one attribute the kernels use, programmatic stream serialization
 * (cuda_pdl.cuh): launches here run to completion in stream order, which every schedule the
 * attribute allows must equal (its kernels wait for the previous one first), so it launches as
 * EMU_LAUNCH does, and counts (emu_pdl_launches: a test that the decode chain takes the path). */
enum cudaLaunchAttributeID { cudaLaunchAttributeProgrammaticStreamSerialization = 5 };
union cudaLaunchAttributeValue { int programmaticStreamSerializationAllowed; char pad[64]; };
struct cudaLaunchAttribute { cudaLaunchAttributeID id; cudaLaunchAttributeValue val; };
struct cudaLaunchConfig_t {
    dim3 gridDim, blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    cudaLaunchAttribute *attrs;
    unsigned numAttrs;
};
long emu_pdl_launches(void);
void emu_pdl_count(void);
/* emu_pdl_refuse(1): a launch with the attribute is refused (cudaErrorNotSupported, returned and
 * pending) and does not run, as a driver without PDL would; 0 disarms. */
void emu_pdl_refuse(int on);
cudaError_t emu_pdl_refused(void);
template <typename... P, typename... A>
static inline cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t *c, void (*k)(P...), A... a) {
    for (unsigned i = 0; i < c->numAttrs; i++)
        if (c->attrs[i].id == cudaLaunchAttributeProgrammaticStreamSerialization &&
            c->attrs[i].val.programmaticStreamSerializationAllowed) {
            if (cudaError_t r = emu_pdl_refused()) return r;
            emu_pdl_count();
        }
    EMU_LAUNCH((c->gridDim, c->blockDim, c->dynamicSmemBytes, c->stream), k, (a...));
    return cudaSuccess; /* a refused launch stays the pending error, for the caller's cudaGetLastError */
}

#endif
