/*
 * exp_poly.h - exp in float as this project defines it, not libm's expf nor
 * CUDA's (their bits depend on the C library, its ifunc choice and the
 * device): the CPU ops' softmax and SwiGLU (cpu_expf and its AVX2 / AVX-512
 * forms, cpu_ops.c), the CPU sampler (sampling.c) and the device sampler
 * (kernels/cuda/sampling.cu) all compute these bits, so a sampled token's
 * probabilities start from the same exponentials on every backend.
 *
 * x clamped to the range where the result is a normal float (x < -87 gives
 * 0, x > 88 gives +inf, NaN gives NaN), n = floor(fma(x, log2 e, 0.5)),
 * r = x - n ln2 in two FMAs (Cody-Waite, Cephes' split of ln 2), Cephes'
 * degree-7 polynomial for e^r on [-ln2/2, ln2/2] by FMAs, 2^n added to the
 * exponent bits. Within 2 ulp of exp over [-87, 88] (tests/test_cpu_paths.c
 * measures it against double exp). Every step is an explicit fmaf, mul or
 * add and the scaling an integer add, so no compiler contraction (gcc's or
 * nvcc's --fmad) can change the bits.
 *
 * Not here: the vector forms (cpu_ops.c, lane by lane these operations).
 */
#ifndef SAMPLER_EXP_POLY_H
#define SAMPLER_EXP_POLY_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define EXP_POLY_HD __host__ __device__
#else
#define EXP_POLY_HD
#endif

#define EXP_LO (-87.0f)
#define EXP_HI 88.0f
#define EXP_LOG2E 1.44269504088896341f
#define EXP_C1 0.693359375f
#define EXP_C2 (-2.12194440e-4f)
#define EXP_P0 1.9875691500e-4f
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f

static inline EXP_POLY_HD float exp_poly(float x) {
    if (x != x) return x + x;
    if (x < EXP_LO) return 0.f;
    if (x > EXP_HI) return INFINITY;
    float n = floorf(fmaf(x, EXP_LOG2E, 0.5f));
    float r = fmaf(n, -EXP_C1, x);
    r = fmaf(n, -EXP_C2, r);
    float z = r * r;
    float p = fmaf(EXP_P0, r, EXP_P1);
    p = fmaf(p, r, EXP_P2);
    p = fmaf(p, r, EXP_P3);
    p = fmaf(p, r, EXP_P4);
    p = fmaf(p, r, EXP_P5);
    float y = fmaf(p, z, r) + 1.0f;
    uint32_t u;
    memcpy(&u, &y, 4);
    u += (uint32_t)(int32_t)n << 23; /* n in [-126, 127], y in [0.7, 1.5]: a normal result */
    memcpy(&y, &u, 4);
    return y;
}

#endif
