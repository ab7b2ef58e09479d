/* shim/cuda_bf16.h - __nv_bfloat16 for the CPU emulation (round to nearest even). */
#ifndef EMU_CUDA_BF16_H
#define EMU_CUDA_BF16_H
#include <stdint.h>
#include <string.h>
struct __nv_bfloat16 { uint16_t x; };
static inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline __nv_bfloat16 __float2bfloat16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 h;
    if ((u & 0x7fffffffu) > 0x7f800000u) { h.x = (uint16_t)((u >> 16) | 0x40); return h; }
    u += 0x7fffu + ((u >> 16) & 1u);
    h.x = (uint16_t)(u >> 16);
    return h;
}
#endif
