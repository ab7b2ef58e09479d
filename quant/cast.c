/*
 * cast.c - scalar FP8 (E4M3, E5M2) and FP4 (E2M1) conversions, bit-exact
 * with PyTorch's c10 Float8 types and Model Optimizer's _cast_fp4 (see
 * quant.h for the special-value rules). Not vectorized: the matmul kernels
 * decode with their own SIMD code and are tested against these.
 */
#include "quant.h"

#include <math.h>

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* c10 fp8e4m3fn_from_fp32_value: the subnormal path relies on the FPU's
 * round-to-nearest-even when adding the magic constant 2^(141-127). */
uint8_t quant_f32_to_e4m3(float f) {
    uint32_t u = f32_bits(f), sign = u & 0x80000000u, r;
    u ^= sign;
    if (u >= (1087u << 20)) { /* >= 480, inf or NaN */
        r = u > 0x7f800000u ? 0x7f : 0x7e;
    } else if (u < (121u << 23)) { /* below 2^-6: subnormal or zero */
        uint32_t magic = 141u << 23;
        r = f32_bits(bits_f32(u) + bits_f32(magic)) - magic;
    } else {
        uint32_t odd = (u >> 20) & 1;
        u += ((uint32_t)(7 - 127) << 23) + 0x7ffff + odd;
        r = u >> 20;
        if (r == 0x7f) r = 0x7e; /* rounding carried into the NaN pattern: saturate */
    }
    return (uint8_t)(r | (sign >> 24));
}

/* Model Optimizer's _cast_fp4: ord = searchsorted(bounds, |x|) (left: the
 * number of bounds b with !(b >= |x|), so NaN counts all 7), plus one on the
 * bounds that round up to an even code. */
uint8_t quant_f32_to_e2m1(float f) {
    static const float bounds[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    float a = fabsf(f);
    uint8_t ord = 0;
    for (int i = 0; i < 7; i++) ord += !(bounds[i] >= a);
    ord += (a == 0.75f) | (a == 1.75f) | (a == 3.5f);
    return (uint8_t)(((f < 0) << 3) + ord);
}
