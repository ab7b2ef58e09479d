/*
 * act.c - dynamic activation quantization for the CPU emulation of the
 * native GPU paths: FP8 per token and 128-column group, NVFP4 per 16-element
 * block with a per-token (or static checkpoint) global scale; FP8 per token
 * (quant_act_fp8_token) for per-channel weights. Outputs are f32
 * holding exactly the quantized values without their group / global scale,
 * so the matmul kernels consume them like ordinary activations. Not here:
 * weights (fp8_weight.c, nvfp4_weight.c). The FP8 quantizer's vector
 * versions (paths avx2, avx512) are in fp8_act_x86.c.
 */
#include "quant.h"
#include "fp8_matmul.h"

#include <math.h>

void quant_act_fp8(float *xq, float *xs, const float *x, int n, int cols) {
#if (defined(__x86_64__) || defined(__i386__)) && !defined(QUANT_NO_SIMD)
    /* the same bits, vectorised (fp8_act_x86.c); portable and avx2-v0 keep this loop */
    QuantPath p = quant_path();
    if (p == QUANT_PATH_AVX512) { quant_act_fp8_avx512(xq, xs, x, n, cols); return; }
    if (p == QUANT_PATH_AVX2) { quant_act_fp8_avx2(xq, xs, x, n, cols); return; }
#endif
    int ng = quant_fp8_groups(cols);
    for (int t = 0; t < n; t++)
        for (int g = 0; g < ng; g++) {
            int c0 = g * QUANT_FP8_GROUP, c1 = c0 + QUANT_FP8_GROUP < cols ? c0 + QUANT_FP8_GROUP : cols;
            const float *v = x + (size_t)t * cols;
            float amax = 0.0f;
            for (int c = c0; c < c1; c++) amax = fmaxf(amax, fabsf(v[c]));
            float s = amax > 0.0f ? amax / QUANT_FP8_MAX : 1.0f;
            xs[(size_t)t * ng + g] = s;
            for (int c = c0; c < c1; c++) xq[(size_t)t * cols + c] = quant_e4m3_to_f32(quant_f32_to_e4m3(v[c] / s));
        }
}

void quant_act_fp8_token(float *xq, float *xs, const float *x, int n, int cols) {
    int ng = quant_fp8_groups(cols);
    for (int t = 0; t < n; t++) {
        const float *v = x + (size_t)t * cols;
        float amax = 0.0f;
        for (int c = 0; c < cols; c++) amax = fmaxf(amax, fabsf(v[c]));
        float s = amax > 0.0f ? amax / QUANT_FP8_MAX : 1.0f;
        for (int g = 0; g < ng; g++) xs[(size_t)t * ng + g] = s;
        for (int c = 0; c < cols; c++) xq[(size_t)t * cols + c] = quant_e4m3_to_f32(quant_f32_to_e4m3(v[c] / s));
    }
}

void quant_act_nvfp4(float *xq, float *xg, const float *x, int n, int cols, float static_scale) {
    for (int t = 0; t < n; t++) {
        const float *v = x + (size_t)t * cols;
        float g = static_scale;
        if (!(static_scale > 0.0f)) {
            float amax = 0.0f;
            for (int c = 0; c < cols; c++) amax = fmaxf(amax, fabsf(v[c]));
            g = amax / 2688.0f;
        }
        xg[t] = g;
        for (int c = 0; c < cols; c += QUANT_NVFP4_BLOCK) {
            uint8_t codes[QUANT_NVFP4_BLOCK];
            float sf = quant_e4m3_to_f32(quant_nvfp4_block(v + c, g, codes));
            for (int i = 0; i < QUANT_NVFP4_BLOCK; i++)
                xq[(size_t)t * cols + c + i] = quant_e2m1_to_f32(codes[i]) * sf;
        }
    }
}
