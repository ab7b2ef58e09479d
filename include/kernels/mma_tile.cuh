/*
 * mma_tile.cuh - the tensor-core fragments the mma kernels share
 * (attention_mma.cu, attention_dec_mma.cu, moe_mma.cu): mma.sync m16n8k16
 * with bf16 inputs and f32 accumulators (sm_80+), m16n8k32 with e4m3 inputs
 * (sm_89+: the sm_90 / 100 / 103 binaries), ldmatrix loads of 8x8 b16
 * matrices from shared memory, the f32 -> bf16 pair packing (round to nearest
 * even, as dtype.h f32_to_bf16) and its hi + lo split, and what both attention
 * kernels decode and rescale by (e4m3 x 8 -> bf16, the online-softmax
 * correction). On the CPU emulation each maps to its shim function
 * (tests/gpu/emu/shim/cuda_runtime.h spells out the PTX fragment layouts).
 * Device code only; not a kernel, no tiling policy.
 */
#ifndef SAMPLER_MMA_TILE_CUH
#define SAMPLER_MMA_TILE_CUH

#include <math.h>
#include <stdint.h>

#include "cuda_device.cuh"
#include "kv_device.cuh" /* kv_f32_to_bf16 */

/* D[16x8] f32 = A[16x16] bf16 (row) x B[16x8] bf16 (col) + D; the PTX ISA's
 * fragment layout: lane l = 4 g + tq holds A rows g, g + 8 at k 2tq (+1, +8, +9),
 * B's k 2tq (+1, +8, +9) of column g, and D rows g, g + 8 at columns 2tq, 2tq + 1. */
static __device__ __forceinline__ void mma_bf16_16816(float *d, const uint32_t *a, const uint32_t *b) {
#if defined(__CUDA_ARCH__)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(CUDA_EMULATION)
    emu_mma_m16n8k16_bf16(d, a, b, d);
#else
    (void)d, (void)a, (void)b; /* nvcc's host pass: never called there */
#endif
}

/* mma_bf16_16816 with IEEE binary16 A and B (the same fragment layout). */
static __device__ __forceinline__ void mma_f16_16816(float *d, const uint32_t *a, const uint32_t *b) {
#if defined(__CUDA_ARCH__)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(CUDA_EMULATION)
    emu_mma_m16n8k16_f16(d, a, b, d);
#else
    (void)d, (void)a, (void)b; /* nvcc's host pass: never called there */
#endif
}

/* D[16x8] f32 = A[16x32] e4m3 (row) x B[32x8] e4m3 (col) + D (sm_89+; the
 * sm_80 binary traps: its host code never launches it, MG_FP8_MMA). Each
 * register holds four e4m3, the lowest k in the low byte; in b16 units (two
 * e4m3) the fragments are m16n8k16's: lane 4 g + tq holds A rows g, g + 8 at
 * k 4tq..4tq+3 (+16), B's k 4tq..4tq+3 (+16) of column g, so the ldmatrix
 * loads below serve both. */
static __device__ __forceinline__ void mma_e4m3_16832(float *d, const uint32_t *a, const uint32_t *b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(__CUDA_ARCH__)
    (void)d, (void)a, (void)b;
    __trap();
#elif defined(CUDA_EMULATION)
    emu_mma_m16n8k32_e4m3(d, a, b, d);
#else
    (void)d, (void)a, (void)b; /* nvcc's host pass: never called there */
#endif
}

/* Four 8x8 b16 matrices from shared memory (ldmatrix .x4; .trans when TRANS):
 * lane l gives the address of row l % 8 of matrix l / 8; register j gets matrix
 * j's fragment in the mma layout (trans: of the transposed matrix). */
template <bool TRANS>
static __device__ __forceinline__ void ldsm_x4(uint32_t *r, const uint16_t *row) {
#if defined(__CUDA_ARCH__)
    uint32_t s = (uint32_t)__cvta_generic_to_shared(row);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
#elif defined(CUDA_EMULATION)
    emu_ldmatrix_x4(r, row, TRANS);
#else
    (void)r, (void)row; /* nvcc's host pass: never called there */
#endif
}

/* Eight e4m3 (the first in the low byte) as bf16 bits: the e4m3 values
 * unscaled (exact: 3 mantissa bits, every e4m3 exponent is a bf16 normal one),
 * for FP8 K / V tiles on their way to the bf16 mma. */
static __device__ __forceinline__ uint4 mma_e4m3x8_bf16(uint2 u) {
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint32_t b = (j < 2 ? u.x : u.y) >> (16 * (j & 1));
        w[j] = __float_as_uint(kv_e4m3_to_f32(b & 0xffu)) >> 16 |
               (__float_as_uint(kv_e4m3_to_f32((b >> 8) & 0xffu)) & 0xffff0000u);
    }
    return uint4{w[0], w[1], w[2], w[3]};
}

/* Online softmax on tensor-core tiles: the weight of an old state with max m
 * under the new max mn, 1 while both are -inf (nothing seen yet, the state is
 * zero either way). */
static __device__ __forceinline__ float mma_corr(float m, float mn) { return mn == -INFINITY ? 1.f : expf(m - mn); }

/* Two f32 -> one register of two bf16 (lo in the low half), round to nearest even. Device: one
 * cvt.rn.bf16x2.f32 (sm_80+), the same bits as kv_f32_to_bf16's integer rounding (about five
 * instructions a value) for every finite input; a NaN becomes the canonical one. */
static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
#if defined(__CUDA_ARCH__)
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return (uint32_t)kv_f32_to_bf16(lo) | (uint32_t)kv_f32_to_bf16(hi) << 16;
#endif
}

/* Two f32 as hi + lo, each a pack_bf16 register: hi the bf16 roundings, lo the bf16 roundings of
 * what they left (16 significant bits in all: a relative error of at most 2^-18 where bf16 alone
 * leaves 2^-9). Two mmas, one on each, give an f32-class product of x with a bf16 operand.
 * Finite inputs (an infinity leaves lo NaN). */
static __device__ __forceinline__ void pack_bf16_split(float x, float y, uint32_t *hi, uint32_t *lo) {
    uint32_t h = pack_bf16(x, y);
    *hi = h;
    *lo = pack_bf16(x - __uint_as_float(h << 16), y - __uint_as_float(h & 0xffff0000u));
}

#endif
