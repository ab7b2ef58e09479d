/*
 * emu.cpp - the execution machinery of shim/cuda_runtime.h. Blocks run one
 * after another (first to last, or last to first: emu_blocks_reverse); the threads of a block run as fibers in one OS thread,
 * switching only at barriers: __syncthreads waits for the block,
 * __shfl_xor_sync (and the other warp collectives: one barrier each, see
 * warp_phase) for the warp. Between two block barriers the warps run one
 * after another (emu_run says why); a lane that waits passes the turn
 * straight to the next lane of its warp (emu_pass), not through the
 * scheduler. A fiber is made once per CUDA thread index
 * (per host thread that launches): after its thread's kernel returns it parks
 * at the scheduler and runs the next block's from there. On x86-64 a switch
 * is emu_swap, a few instructions (the callee-saved registers and the stack
 * pointer): swapcontext makes a system call per switch, and ASan intercepts
 * longjmp with one per jump (sigaltstack), over a third of the run time
 * either way; elsewhere (and with -DEMU_SWAPCONTEXT) swapcontext. Under ASan
 * every switch is announced (__sanitizer_start_switch_fiber before, _finish_
 * after), so the sanitizer knows which stack is live and checks the kernels
 * as in any other code. Built with -DEMU_PTHREADS (the ThreadSanitizer build,
 * whose fiber API this does not speak) every CUDA thread of a block is an OS
 * thread of a persistent pool instead, with pthread barriers (~5x slower than
 * fibers).
 */
#include <semaphore.h>
#include <ucontext.h>

#include <atomic>
#include <vector>

#include "cuda_runtime.h"

/* The emulation's own machinery (barriers, turns, the collectives' arithmetic over the shim's
 * buffers and the values a kernel passes by value): not instrumented by ASan / UBSan, which are
 * there to check the kernels (the mma shim alone took a third of the sanitizer build's time). */
#define EMU_UNCHECKED __attribute__((no_sanitize("address", "undefined")))

thread_local uint3 threadIdx, blockIdx;
thread_local uint3 blockDim, gridDim; /* uint3, not dim3: a type without a constructor reads without a TLS wrapper call */

#define EMU_MAX_THREADS 1024

/* ---- fault injection (shim/cuda_runtime.h); host thread only ---- */
/* An armed "the k-th one" trigger: fires once, on the k-th call of emu_countdown_fire. */
typedef struct EmuCountdown { long left; int fired; } EmuCountdown;
static int emu_countdown_fire(EmuCountdown *c) {
    if (c->left <= 0 || --c->left) return 0;
    c->fired = 1;
    return 1;
}
static EmuCountdown fail_at, corrupt_at;
static cudaError_t pending_launch_error = cudaSuccess;
void emu_fail_nth(long k) { fail_at = EmuCountdown{k, 0}; }
int emu_failed(void) { return fail_at.fired; }
int emu_fault(void) { return emu_countdown_fire(&fail_at); }
int emu_launch_fault(void) {
    if (!emu_fault()) return 0;
    pending_launch_error = cudaErrorLaunchFailure;
    return 1;
}
void emu_corrupt_nth(long k) { corrupt_at = EmuCountdown{k, 0}; }
int emu_corrupted(void) { return corrupt_at.fired; }
int emu_corrupt(void) { return emu_countdown_fire(&corrupt_at); }
cudaError_t cudaGetLastError(void) {
    cudaError_t e = pending_launch_error;
    pending_launch_error = cudaSuccess;
    return e;
}

/* ---- pinned host memory in flight (shim/cuda_runtime.h); any thread ---- */
struct EmuRange { const char *p; size_t n; uint64_t mark; };
static std::vector<EmuRange> pinned, in_flight; /* cudaMallocHost'ed; async copies out of them not yet waited for */
struct EmuLanding { char *dst; char *bytes; size_t n; uint64_t mark; };
static std::vector<EmuLanding> landing;          /* async copies into pinned memory, not yet waited for */
static uint64_t copy_mark, done_mark;
static long hazards;
static pthread_mutex_t pin_mu = PTHREAD_MUTEX_INITIALIZER;
void emu_pinned_add(const void *p, size_t n) {
    pthread_mutex_lock(&pin_mu);
    pinned.push_back({(const char *)p, n, 0});
    pthread_mutex_unlock(&pin_mu);
}
void emu_pinned_del(const void *p) {
    pthread_mutex_lock(&pin_mu);
    for (size_t i = 0; i < pinned.size(); i++)
        if (pinned[i].p == (const char *)p) {
            const char *a = pinned[i].p, *z = a + pinned[i].n;
            for (size_t j = 0; j < in_flight.size();) /* freed: nothing reads it any more (cudaFreeHost syncs) */
                if (in_flight[j].p >= a && in_flight[j].p < z) in_flight.erase(in_flight.begin() + (long)j);
                else j++;
            for (size_t j = 0; j < landing.size();) /* copies into it: dropped with it */
                if (landing[j].dst >= a && landing[j].dst < z) {
                    free(landing[j].bytes);
                    landing.erase(landing.begin() + (long)j);
                } else {
                    j++;
                }
            pinned.erase(pinned.begin() + (long)i);
            break;
        }
    pthread_mutex_unlock(&pin_mu);
}
void emu_pinned_copy(const void *src, size_t n) {
    const char *s = (const char *)src;
    pthread_mutex_lock(&pin_mu);
    int is_pinned = 0;
    for (const EmuRange &r : pinned) is_pinned |= s >= r.p && s < r.p + r.n;
    if (is_pinned) {
        for (size_t j = 0; j < in_flight.size();)
            if (in_flight[j].mark <= done_mark) in_flight.erase(in_flight.begin() + (long)j);
            else j++;
        for (const EmuRange &r : in_flight)
            if (s < r.p + r.n && r.p < s + n && hazards++ < 4)
                fprintf(stderr, "emulation: an async copy reads pinned host bytes [%p, +%zu) that an earlier copy "
                        "not yet waited for also reads: the host rewrote them while that copy was queued\n",
                        (const void *)s, n);
        in_flight.push_back({s, n, ++copy_mark});
    }
    pthread_mutex_unlock(&pin_mu);
}
int emu_pinned_defer(void *dst, const void *src, size_t n) {
    char *d = (char *)dst;
    pthread_mutex_lock(&pin_mu);
    int is_pinned = 0;
    for (const EmuRange &r : pinned) is_pinned |= d >= r.p && d < r.p + r.n;
    if (is_pinned) {
        char *bytes = (char *)malloc(n ? n : 1);
        memcpy(bytes, src, n); /* the device's bytes as the stream reaches the copy */
        landing.push_back({d, bytes, n, ++copy_mark});
        memset(d, 0xa5, n); /* until a wait covers it: a read shows (int32 -1515870811, a token no vocabulary has) */
    }
    pthread_mutex_unlock(&pin_mu);
    return is_pinned;
}
uint64_t emu_copy_mark(void) {
    pthread_mutex_lock(&pin_mu);
    uint64_t m = copy_mark;
    pthread_mutex_unlock(&pin_mu);
    return m;
}
void emu_copies_done(uint64_t mark) {
    pthread_mutex_lock(&pin_mu);
    if (mark > done_mark) done_mark = mark;
    for (size_t j = 0; j < landing.size();) /* in issue order: a later copy to the same bytes wins */
        if (landing[j].mark <= done_mark) {
            memcpy(landing[j].dst, landing[j].bytes, landing[j].n);
            free(landing[j].bytes);
            landing.erase(landing.begin() + (long)j);
        } else {
            j++;
        }
    pthread_mutex_unlock(&pin_mu);
}
long emu_pinned_hazards(void) {
    pthread_mutex_lock(&pin_mu);
    long h = hazards;
    pthread_mutex_unlock(&pin_mu);
    return h;
}

/* ---- stream capture and graphs (shim/cuda_runtime.h); host thread only ---- */
struct EmuGraph {
    std::vector<std::function<void()>> nodes; /* in stream order */
    int refs;                                 /* the captured graph and its instances */
};
static EmuGraph *capture; /* the open capture, or NULL */
static int capture_bad;   /* a refused call happened in it */
int emu_capturing(void) { return capture != NULL; }
void emu_capture_bad(void) { capture_bad = 1; }
void emu_record(std::function<void()> fn) { capture->nodes.push_back(std::move(fn)); }
static std::atomic<long> kernels_run; /* host threads of the engine checks launch too */
long emu_kernels_run(void) { return kernels_run.load(); }
static std::atomic<long> pdl_launches;
long emu_pdl_launches(void) { return pdl_launches.load(); }
void emu_pdl_count(void) { pdl_launches++; }
static std::atomic<long> prefetches_l2;
void emu_prefetch_l2(const void *p) {
    (void)*(const volatile unsigned char *)p;
    prefetches_l2.fetch_add(1, std::memory_order_relaxed);
}
long emu_prefetches_l2(void) { return prefetches_l2.load(); }
static std::atomic<int> blocks_reversed; /* emu_blocks_reverse: the grid's blocks run last to first */
void emu_blocks_reverse(int on) { blocks_reversed = on; }
static std::atomic<int> pdl_refuse;
void emu_pdl_refuse(int on) { pdl_refuse = on; }
cudaError_t emu_pdl_refused(void) {
    if (!pdl_refuse) return cudaSuccess;
    pending_launch_error = cudaErrorNotSupported;
    return cudaErrorNotSupported;
}
void emu_submit(EmuCfg c, std::function<void()> fn) {
    if (!c.grid.x || !c.grid.y || !c.grid.z || c.grid.x > 0x7fffffffu || c.grid.y > 65535u || c.grid.z > 65535u) {
        fprintf(stderr, "emulation: launch of grid (%u, %u, %u) x block %u: invalid configuration, refused as on a device\n",
                c.grid.x, c.grid.y, c.grid.z, c.block.x);
        pending_launch_error = cudaErrorInvalidConfiguration;
        if (capture) capture_bad = 1;
        return;
    }
    if (capture) capture->nodes.push_back([c, fn]() { kernels_run++; emu_run(c, fn); });
    else {
        kernels_run++;
        emu_run(c, fn);
    }
}
static void graph_unref(EmuGraph *g) {
    if (g && --g->refs == 0) delete g;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
    if (capture) return cudaErrorStreamCaptureUnsupported;
    capture = new EmuGraph{{}, 1};
    capture_bad = 0;
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t *g) {
    *g = NULL;
    if (!capture) return cudaErrorStreamCaptureInvalidated;
    EmuGraph *c = capture;
    capture = NULL;
    if (capture_bad) {
        graph_unref(c);
        return cudaErrorStreamCaptureInvalidated;
    }
    *g = c;
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long) {
    if (!g) return cudaErrorUnknown;
    if (emu_fault()) return cudaErrorUnknown;
    g->refs++;
    *e = g;
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    graph_unref(g);
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
    graph_unref(e);
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t) {
    if (!e || capture) return cudaErrorUnknown;
    if (emu_fault()) return cudaErrorUnknown;
    for (auto &n : e->nodes) n();
    return cudaSuccess;
}

static struct {
    dim3 bd, gd;
    uint3 b;
    std::function<void()> *fn;
} job;

/* ---- cp.async (shim/cuda_runtime.h): each CUDA thread's copies not yet
 * waited for. Blocks run one at a time, so a slot per thread index serves;
 * cp_async_reset empties a thread's slot when its block starts. ---- */
#define EMU_CP_MAX 64 /* copies in flight per thread (the kernels keep <= 16) */
struct EmuCpAsync {
    struct { uint8_t *dst; uint8_t data[16]; long group; } q[EMU_CP_MAX]; /* group 0: not committed */
    int n;
    long groups; /* committed so far */
};
static EmuCpAsync cp_q[EMU_MAX_THREADS];

static void cp_async_reset(unsigned t) { cp_q[t].n = 0, cp_q[t].groups = 0; }

/* The thread's kernel returned: every copy must have been waited for. */
static void cp_async_exit(void) {
    EmuCpAsync *c = &cp_q[threadIdx.x];
    if (c->n) {
        fprintf(stderr, "emulation: thread %u of block (%u, %u, %u) returned with %d cp.async copies not waited for\n",
                threadIdx.x, blockIdx.x, blockIdx.y, blockIdx.z, c->n);
        exit(1);
    }
}

void emu_cp_async16(void *dst, const void *src, int src_bytes) {
    EmuCpAsync *c = &cp_q[threadIdx.x];
    if (((uintptr_t)dst | (src_bytes ? (uintptr_t)src : 0)) & 15u || src_bytes < 0 || src_bytes > 16 ||
        c->n == EMU_CP_MAX) {
        fprintf(stderr, "emulation: cp.async dst %p src %p bytes %d (%d in flight): misaligned, bad size or too many\n",
                dst, src, src_bytes, c->n);
        exit(1);
    }
    auto &e = c->q[c->n++];
    e.dst = (uint8_t *)dst;
    memset(e.data, 0, sizeof e.data);
    if (src_bytes) memcpy(e.data, src, (size_t)src_bytes);
    e.group = 0;
    memset(dst, 0xff, 16); /* garbage until the wait */
}

void emu_cp_async_commit(void) {
    EmuCpAsync *c = &cp_q[threadIdx.x];
    c->groups++;
    for (int i = 0; i < c->n; i++)
        if (!c->q[i].group) c->q[i].group = c->groups;
}

void emu_cp_async_wait(int n) {
    EmuCpAsync *c = &cp_q[threadIdx.x];
    int k = 0;
    for (int i = 0; i < c->n; i++)
        if (c->q[i].group && c->q[i].group <= c->groups - n) memcpy(c->q[i].dst, c->q[i].data, 16); /* lands */
        else c->q[k++] = c->q[i];
    c->n = k;
}

#ifndef EMU_PTHREADS
/* ---- fibers ---- */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define FIB_CLEAN(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n)) /* a stack reused: no redzone of an old frame stays */
#define FIB_START(save, bottom, size) __sanitizer_start_switch_fiber((save), (bottom), (size))
#define FIB_FINISH(save, bottom, size) __sanitizer_finish_switch_fiber((save), (bottom), (size))
#else
#define FIB_START(save, bottom, size) ((void)(save), (void)(bottom), (void)(size))
#define FIB_FINISH(save, bottom, size) ((void)(save), (void)(bottom), (void)(size))
#define FIB_CLEAN(p, n) ((void)(p), (void)(n))
#endif
struct EmuBlock {
    unsigned arrived[33], gen[33]; /* [0..31] per warp, [32] the block */
    float slots[2][32][32];        /* __shfl_xor_sync's, by warp_phase */
};

#define FIBER_STACK (128 * 1024)
static void fiber_main(void);
#if defined(__x86_64__) && !defined(EMU_SWAPCONTEXT)
/* emu_swap(save, to): push the callee-saved registers (and MXCSR / the x87
 * control word, callee-saved too) on this stack, *save = the stack pointer,
 * then the same in reverse from the stack pointer `to`. A fiber's first
 * switch-in "returns" into fiber_main from the frame fib_make builds. */
asm(".text\n.globl emu_swap\n.type emu_swap,@function\nemu_swap:\n"
    "pushq %rbp\npushq %rbx\npushq %r12\npushq %r13\npushq %r14\npushq %r15\n"
    "subq $8, %rsp\nstmxcsr (%rsp)\nfnstcw 4(%rsp)\n"
    "movq %rsp, (%rdi)\nmovq %rsi, %rsp\n"
    "ldmxcsr (%rsp)\nfldcw 4(%rsp)\naddq $8, %rsp\n"
    "popq %r15\npopq %r14\npopq %r13\npopq %r12\npopq %rbx\npopq %rbp\nret\n"
    ".size emu_swap, .-emu_swap\n");
extern "C" void emu_swap(void **save, void *to);
typedef void *FibCtx; /* a parked side's stack pointer */
static void fib_switch(FibCtx *from, FibCtx *to) { emu_swap(from, *to); }
static void fib_make(FibCtx *c, char *stack, size_t size) {
    FIB_CLEAN(stack, size);
    uintptr_t top = ((uintptr_t)stack + size) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)(top - 72); /* fiber_main entered with sp % 16 == 8, as after a call */
    uint32_t csr[2] = {0x1f80, 0x037f};    /* MXCSR, x87 control word: the ABI's initial values */
    memcpy(&sp[0], csr, 8);
    for (int i = 1; i <= 6; i++) sp[i] = 0;  /* r15 .. rbp */
    sp[7] = (uint64_t)(uintptr_t)fiber_main; /* emu_swap's ret */
    sp[8] = 0;                               /* fiber_main's return address: it never returns */
    *c = sp;
}
#else
typedef ucontext_t FibCtx;
static void fib_switch(FibCtx *from, FibCtx *to) { swapcontext(from, to); }
static void fib_make(FibCtx *c, char *stack, size_t size) {
    FIB_CLEAN(stack, size);
    getcontext(c);
    c->uc_stack.ss_sp = stack;
    c->uc_stack.ss_size = size;
    c->uc_link = NULL; /* fiber_main never returns */
    makecontext(c, fiber_main, 0);
}
#endif
static FibCtx sched_ctx, fib_ctx[EMU_MAX_THREADS];
static char *stacks;
static int fib_done[EMU_MAX_THREADS], fib_started[EMU_MAX_THREADS];
static pthread_t fib_owner; /* the host thread whose launches the fibers ran (fib_started) */
static unsigned cur, cur_nt;
static EmuBlock *fib_blk; /* the block the fibers run (a static like the rest of the fibers' state: a
                           * thread-local read is a call under ASan, and the hot paths below read it) */
/* ASan's bookkeeping of the switches: the scheduler's stack (learnt at the
 * first switch into a fiber) and each side's fake-stack handle. */
static const void *sched_bottom;
static size_t sched_size;
static void *sched_fake, *fib_fake[EMU_MAX_THREADS];

static unsigned fib_held[EMU_MAX_THREADS]; /* block barrier generation + 1, or 0 */
static int fib_entered[EMU_MAX_THREADS];    /* has run (a fresh fiber is entered from the scheduler only) */

/* Whether emu_run's lane loop would run fiber i now: not returned, not held at the block barrier. */
EMU_UNCHECKED static int fib_runnable(unsigned i) {
    return !fib_done[i] && !(fib_held[i] && fib_blk->gen[32] == fib_held[i] - 1);
}

EMU_UNCHECKED static void emu_yield(void) {
    unsigned me = cur;
    FIB_START(&fib_fake[me], sched_bottom, sched_size);
    fib_switch(&fib_ctx[me], &sched_ctx);
    FIB_FINISH(fib_fake[me], NULL, NULL);
}

/* A waiting fiber passes the turn on: straight to the next lane of its warp that emu_run's lane loop
 * would run next (the same order, half the switches: none through the scheduler), or back to the
 * scheduler after the warp's last lane (cur tells it where the turns stopped). */
EMU_UNCHECKED static void emu_pass(void) {
    unsigned me = cur, j = me + 1;
    while (j % 32 && !fib_runnable(j)) j++;
    if (!(j % 32) || !fib_entered[j]) {
        emu_yield();
        return;
    }
    threadIdx = uint3{j, 0, 0};
    cur = j;
    FIB_START(&fib_fake[me], stacks + (size_t)j * FIBER_STACK, FIBER_STACK);
    fib_switch(&fib_ctx[me], &fib_ctx[j]);
    FIB_FINISH(fib_fake[me], NULL, NULL);
}

/* Barrier k (a warp, or 32 for the block) of n fibers. A fiber held at the
 * block barrier says so (fib_held, the generation it waits out), so the
 * scheduler can move on to the next warp. */
EMU_UNCHECKED static void emu_barrier(int k, unsigned n) {
    EmuBlock *b = fib_blk;
    if (++b->arrived[k] == n) {
        b->arrived[k] = 0;
        b->gen[k]++;
        return;
    }
    unsigned g = b->gen[k];
    if (k == 32) fib_held[cur] = g + 1;
    while (b->gen[k] == g) emu_pass();
    fib_held[cur] = 0;
}

/* A warp collective (a shuffle, mma, ldmatrix) deposits its lanes' values in buffer warp_phase(w)
 * of two, meets at the warp barrier, reads, and is done: no second meeting before the buffer is
 * written again. The phase is the barrier's generation g (the same in every lane until all arrive),
 * and the next collective to write buffer g % 2 meets at generation g + 2 or later, which every lane
 * reaches only after generation g + 1, after its reads of g. One barrier a collective instead of two:
 * half the fiber switches of the emulation's hottest path. */
EMU_UNCHECKED static unsigned warp_phase(int w) { return fib_blk->gen[w] & 1u; }
static void warp_collective_done(int w) { (void)w; }

void emu_syncthreads(void) { emu_barrier(32, cur_nt); }
static void emu_warp_barrier(int w) { emu_barrier(w, 32); }

EMU_UNCHECKED float emu_shfl_xor(float v, int off) {
    int w = cur / 32, l = cur % 32; /* cur: threadIdx.x */
    unsigned p = warp_phase(w);
    fib_blk->slots[p][w][l] = v;
    emu_warp_barrier(w);
    return fib_blk->slots[p][w][l ^ off];
}
void emu_syncwarp(void) { emu_warp_barrier(threadIdx.x / 32); }

/* A fiber's life: its CUDA thread of every block emu_run gives it, parked in
 * between (emu_yield: the scheduler resumes it at the next block). */
static void fiber_main(void) {
    FIB_FINISH(NULL, &sched_bottom, &sched_size);
    fib_entered[cur] = 1;
    for (;;) {
        (*job.fn)();
        cp_async_exit();
        fib_done[cur] = 1;
        emu_yield();
    }
}

void emu_run(EmuCfg c, std::function<void()> fn) {
    unsigned nt = c.block.x * c.block.y * c.block.z;
    if (c.block.y != 1 || c.block.z != 1 || nt % 32 || nt > EMU_MAX_THREADS) { fprintf(stderr, "emu: unsupported block\n"); exit(1); }
    if (!stacks && !(stacks = (char *)malloc((size_t)EMU_MAX_THREADS * FIBER_STACK))) { fprintf(stderr, "emu: stacks\n"); exit(1); }
    job.fn = &fn;
    /* fibers parked by another host thread are dropped (made again here): a fiber resumes on
     * the thread it parked on, whose stack bookkeeping (ASan's) it carries */
    if (!pthread_equal(fib_owner, pthread_self())) {
        memset(fib_started, 0, sizeof fib_started);
        fib_owner = pthread_self();
    }
    EmuBlock blk;
    for (unsigned iz = 0, rev = blocks_reversed.load(); iz < c.grid.z; iz++)
        for (unsigned iy = 0; iy < c.grid.y; iy++)
            for (unsigned ix = 0; ix < c.grid.x; ix++) {
                unsigned bx = rev ? c.grid.x - 1 - ix : ix, by = rev ? c.grid.y - 1 - iy : iy,
                         bz = rev ? c.grid.z - 1 - iz : iz;
                memset(&blk, 0, sizeof blk);
                cur_nt = nt;
                /* the block's (the fibers run on this OS thread, so its thread-locals are theirs) */
                blockIdx = uint3{bx, by, bz};
                blockDim = uint3{c.block.x, c.block.y, c.block.z};
                gridDim = uint3{c.grid.x, c.grid.y, c.grid.z};
                fib_blk = &blk;
                for (unsigned i = 0; i < nt; i++) {
                    if (!fib_started[i]) {
                        fib_make(&fib_ctx[i], stacks + (size_t)i * FIBER_STACK, FIBER_STACK);
                        fib_started[i] = 1;
                        fib_entered[i] = 0;
                    }
                    fib_done[i] = 0;
                    fib_held[i] = 0;
                    cp_async_reset(i);
                }
                /* Warps run one after another from block barrier to block barrier
                 * (the lanes of a warp in turns, meeting at its warp barriers), in
                 * ascending order in even blocks and descending in odd ones: a
                 * warp that writes shared memory another warp still reads (or
                 * reads what another has not written yet) without a barrier
                 * between them sees the wrong bytes in one of the two orders,
                 * where warps in lockstep would hide it. */
                unsigned nw = nt / 32, down = (bx + by + bz) & 1;
                for (unsigned left = nt; left;) {
                    unsigned any = 0;
                    for (unsigned wi = 0; wi < nw; wi++) {
                        unsigned w0 = 32 * (down ? nw - 1 - wi : wi);
                        for (unsigned ran = 1; ran;) {
                            ran = 0;
                            for (unsigned i = w0; i < w0 + 32; i++) {
                                if (!fib_runnable(i)) continue;
                                ran = any = 1;
                                threadIdx = uint3{i, 0, 0};
                                cur = i;
                                FIB_START(&sched_fake, stacks + (size_t)i * FIBER_STACK, FIBER_STACK);
                                fib_switch(&sched_ctx, &fib_ctx[i]);
                                FIB_FINISH(sched_fake, NULL, NULL);
                                i = cur; /* lanes up to cur ran by emu_pass's turns */
                            }
                        }
                    }
                    left = 0;
                    for (unsigned i = 0; i < nt; i++) left += !fib_done[i];
                    if (left && !any) {
                        fprintf(stderr, "emu: block (%u, %u, %u): %u threads wait at a __syncthreads that the others "
                                "returned without\n", bx, by, bz, left);
                        exit(1);
                    }
                }
            }
}

#else
/* ---- OS threads: a pool of persistent workers, worker i plays CUDA thread i ---- */
struct EmuBlock {
    pthread_barrier_t block_bar;
    pthread_barrier_t warp_bar[32];
    float slots[32][32];
};
static thread_local EmuBlock *emu_block; /* the block this worker's CUDA thread belongs to */

void emu_syncthreads(void) { pthread_barrier_wait(&emu_block->block_bar); }
static void emu_warp_barrier(int w) { pthread_barrier_wait(&emu_block->warp_bar[w]); }
/* A warp collective here: one buffer, and a second meeting before it is written again. */
static unsigned warp_phase(int w) { return (void)w, 0u; }
static void warp_collective_done(int w) { emu_warp_barrier(w); }

float emu_shfl_xor(float v, int off) {
    int w = threadIdx.x / 32, l = threadIdx.x % 32;
    emu_block->slots[w][l] = v;
    emu_warp_barrier(w);
    float r = emu_block->slots[w][l ^ off];
    warp_collective_done(w);
    return r;
}
void emu_syncwarp(void) { emu_warp_barrier(threadIdx.x / 32); }

static pthread_t pool[EMU_MAX_THREADS];
static sem_t start_sem[EMU_MAX_THREADS], done_sem;
static int pool_size;
static EmuBlock *job_blk;

static void *worker(void *p) {
    unsigned i = (unsigned)(uintptr_t)p;
    for (;;) {
        sem_wait(&start_sem[i]);
        threadIdx = uint3{i, 0, 0};
        blockIdx = job.b;
        blockDim = uint3{job.bd.x, job.bd.y, job.bd.z};
        gridDim = uint3{job.gd.x, job.gd.y, job.gd.z};
        emu_block = job_blk;
        cp_async_reset(i);
        (*job.fn)();
        cp_async_exit();
        sem_post(&done_sem);
    }
    return NULL;
}

void emu_run(EmuCfg c, std::function<void()> fn) {
    unsigned nt = c.block.x * c.block.y * c.block.z;
    if (c.block.y != 1 || c.block.z != 1 || nt % 32 || nt > EMU_MAX_THREADS) { fprintf(stderr, "emu: unsupported block\n"); exit(1); }
    if (!pool_size) sem_init(&done_sem, 0, 0);
    for (; pool_size < (int)nt; pool_size++) {
        sem_init(&start_sem[pool_size], 0, 0);
        if (pthread_create(&pool[pool_size], NULL, worker, (void *)(uintptr_t)pool_size)) { fprintf(stderr, "emu: pthread_create\n"); exit(1); }
        pthread_detach(pool[pool_size]);
    }
    EmuBlock *blk = new EmuBlock;
    for (unsigned iz = 0, rev = blocks_reversed.load(); iz < c.grid.z; iz++)
        for (unsigned iy = 0; iy < c.grid.y; iy++)
            for (unsigned ix = 0; ix < c.grid.x; ix++) {
                unsigned bx = rev ? c.grid.x - 1 - ix : ix, by = rev ? c.grid.y - 1 - iy : iy,
                         bz = rev ? c.grid.z - 1 - iz : iz;
                pthread_barrier_init(&blk->block_bar, NULL, nt);
                for (unsigned w = 0; w < nt / 32; w++) pthread_barrier_init(&blk->warp_bar[w], NULL, 32);
                job.bd = c.block;
                job.gd = c.grid;
                job.b = uint3{bx, by, bz};
                job.fn = &fn;
                job_blk = blk;
                for (unsigned i = 0; i < nt; i++) sem_post(&start_sem[i]);
                for (unsigned i = 0; i < nt; i++) sem_wait(&done_sem);
                pthread_barrier_destroy(&blk->block_bar);
                for (unsigned w = 0; w < nt / 32; w++) pthread_barrier_destroy(&blk->warp_bar[w]);
            }
    delete blk;
}
#endif

/* ---- warp-collective mma (shim/cuda_runtime.h): each lane deposits its
 * fragments, the warp meets, each lane computes its four outputs from the
 * deposited registers by the PTX layout (warp_phase's buffer: no second
 * meeting). Blocks run one at a time, so one scratch serves. ---- */
static struct { uint32_t a[32][32][4], b[32][32][2]; } mma_scratch[2]; /* by warp_phase */

/* IEEE binary16 (1 sign, 5 exponent bits of bias 15, 10 mantissa bits) to f32, from the format's definition. */
static float f16_def(uint32_t h) {
    uint32_t e = h >> 10 & 31u, m = h & 1023u;
    float f = e == 31u ? (m ? NAN : INFINITY) : e ? ldexpf(1.0f + (float)m / 1024.0f, (int)e - 15) : ldexpf((float)m, -24);
    return h & 0x8000u ? -f : f;
}

/* e4m3 (OCP FP8: 1 sign, 4 exponent bits of bias 7, 3 mantissa bits; no
 * infinities, S.1111.111 NaN) to f32, from the format's definition. */
static float e4m3_def(uint32_t v) {
    uint32_t e = v >> 3 & 15u, m = v & 7u;
    float f = (e == 15u && m == 7u) ? NAN : e ? ldexpf(1.0f + (float)m / 8.0f, (int)e - 7) : ldexpf((float)m, -9);
    return v & 0x80u ? -f : f;
}

/* The definitions above tabulated once (the mma shims decode every element of every fragment). */
static float f16_tab[65536], e4m3_tab[256];
static struct MmaTabs {
    MmaTabs() {
        for (uint32_t i = 0; i < 65536; i++) f16_tab[i] = f16_def(i);
        for (uint32_t i = 0; i < 256; i++) e4m3_tab[i] = e4m3_def(i);
    }
} mma_tabs;

/* Element i (lower bits first) of a register. */
static float mma_bf16(uint32_t reg, int hi) { return __uint_as_float(hi ? reg & 0xffff0000u : reg << 16); }
static float mma_f16(uint32_t reg, int hi) { return f16_tab[hi ? reg >> 16 : reg & 0xffffu]; }
static float mma_e4m3(uint32_t reg, int byte) { return e4m3_tab[reg >> (8 * byte) & 0xffu]; }

/* m16n8kK of the mma shims: each 32-bit register holds EPR elements (bf16, f16: 2, e4m3: 4), the
 * lower k in the lower bits, so K = 8 EPR and lane (row % 8) * 4 + (k % (K / 2)) / EPR, register
 * (row >= 8) + 2 (k >= K / 2) holds A[row][k], lane col * 4 + (k % (K / 2)) / EPR, register
 * k >= K / 2 holds B[k][col] (element k % EPR of each); ELEM decodes element i of a register. A lane's
 * outputs are rows g, g + 8 by columns 2t, 2t + 1: those two rows of A and columns of B decoded once,
 * then each output the sum over k in order, plus c. */
template <int EPR, float (*ELEM)(uint32_t reg, int i)>
EMU_UNCHECKED static void emu_mma(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    constexpr int K = 8 * EPR, half = K / 2;
    int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l / 4, t = l % 4;
    auto &ms = mma_scratch[warp_phase(w)];
    memcpy(ms.a[w][l], a, sizeof ms.a[w][l]);
    memcpy(ms.b[w][l], b, sizeof ms.b[w][l]);
    emu_warp_barrier(w);
    float ar[2][K], bc[2][K], r[4]; /* A rows g, g + 8; B columns 2t, 2t + 1 */
    for (int k = 0; k < K; k++)
        for (int h = 0; h < 2; h++) {
            ar[h][k] = ELEM(ms.a[w][g * 4 + (k % half) / EPR][h + 2 * (k >= half)], k % EPR);
            bc[h][k] = ELEM(ms.b[w][(2 * t + h) * 4 + (k % half) / EPR][k >= half], k % EPR);
        }
    for (int i = 0; i < 4; i++) {
        float s = 0.f;
        for (int k = 0; k < K; k++) s += ar[i >= 2][k] * bc[i & 1][k];
        r[i] = s + c[i];
    }
    warp_collective_done(w);
    memcpy(d, r, sizeof r);
}

void emu_mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    emu_mma<2, mma_bf16>(d, a, b, c);
}

void emu_mma_m16n8k16_f16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    emu_mma<2, mma_f16>(d, a, b, c);
}

void emu_mma_m16n8k32_e4m3(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    emu_mma<4, mma_e4m3>(d, a, b, c);
}

/* ---- warp-collective ldmatrix (shim/cuda_runtime.h), the same protocol ---- */
static const uint16_t *ldm_rows[2][32][32]; /* by warp_phase */

void emu_ldmatrix_x4(uint32_t r[4], const void *row, int trans) {
    int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l / 4, t = l % 4;
    if ((uintptr_t)row & 15u) { /* a device faults: each row is 16 bytes at a 16-byte boundary */
        fprintf(stderr, "emulation: ldmatrix row %p of lane %d (thread %u of block (%u, %u, %u)): misaligned\n", row, l,
                threadIdx.x, blockIdx.x, blockIdx.y, blockIdx.z);
        exit(1);
    }
    unsigned p = warp_phase(w);
    ldm_rows[p][w][l] = (const uint16_t *)row;
    emu_warp_barrier(w);
    uint32_t v[4];
    for (int j = 0; j < 4; j++) {
        const uint16_t *const *m = ldm_rows[p][w] + 8 * j; /* matrix j's eight rows */
        v[j] = trans ? (uint32_t)m[2 * t][g] | (uint32_t)m[2 * t + 1][g] << 16
                     : (uint32_t)m[g][2 * t] | (uint32_t)m[g][2 * t + 1] << 16;
    }
    warp_collective_done(w);
    memcpy(r, v, sizeof v);
}

