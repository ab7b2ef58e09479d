/* emu.cpp - the thread machinery of shim/cuda_runtime.h. */
#include "cuda_runtime.h"

struct EmuBlock {
    pthread_barrier_t block_bar;
    pthread_barrier_t warp_bar[32];
    float slots[32][32];
};

thread_local uint3 threadIdx, blockIdx;
thread_local dim3 blockDim, gridDim;
thread_local EmuBlock *emu_block;

float emu_shfl_xor(float v, int off) {
    int w = threadIdx.x / 32, l = threadIdx.x % 32;
    emu_block->slots[w][l] = v;
    pthread_barrier_wait(&emu_block->warp_bar[w]);
    float r = emu_block->slots[w][l ^ off];
    pthread_barrier_wait(&emu_block->warp_bar[w]);
    return r;
}

void emu_syncthreads(void) { pthread_barrier_wait(&emu_block->block_bar); }

struct EmuThread {
    uint3 t, b;
    dim3 bd, gd;
    EmuBlock *blk;
    std::function<void()> *fn;
};

static void *emu_thread(void *p) {
    EmuThread *e = (EmuThread *)p;
    threadIdx = e->t;
    blockIdx = e->b;
    blockDim = e->bd;
    gridDim = e->gd;
    emu_block = e->blk;
    (*e->fn)();
    return NULL;
}

void emu_run(EmuCfg c, std::function<void()> fn) {
    unsigned nt = c.block.x * c.block.y * c.block.z;
    if (c.block.y != 1 || c.block.z != 1 || nt % 32 || nt > 1024) { fprintf(stderr, "emu: unsupported block\n"); exit(1); }
    EmuThread *ts = new EmuThread[nt];
    pthread_t *th = new pthread_t[nt];
    for (unsigned bz = 0; bz < c.grid.z; bz++)
        for (unsigned by = 0; by < c.grid.y; by++)
            for (unsigned bx = 0; bx < c.grid.x; bx++) {
                EmuBlock blk;
                pthread_barrier_init(&blk.block_bar, NULL, nt);
                for (unsigned w = 0; w < nt / 32; w++) pthread_barrier_init(&blk.warp_bar[w], NULL, 32);
                for (unsigned i = 0; i < nt; i++) {
                    ts[i] = EmuThread{{i, 0, 0}, {bx, by, bz}, c.block, c.grid, &blk, &fn};
                    if (pthread_create(&th[i], NULL, emu_thread, &ts[i])) { fprintf(stderr, "emu: pthread_create\n"); exit(1); }
                }
                for (unsigned i = 0; i < nt; i++) pthread_join(th[i], NULL);
                pthread_barrier_destroy(&blk.block_bar);
                for (unsigned w = 0; w < nt / 32; w++) pthread_barrier_destroy(&blk.warp_bar[w]);
            }
    delete[] ts;
    delete[] th;
}
