/*
 * quant_gemv.cu - weight-only matmul for FP8 (block-scaled e4m3) and NVFP4
 * (e2m1 + e4m3 block scales + f32 global scale) weights: out[n, rows] =
 * x[n, cols] @ W^T with f32 activations, the weights dequantized inside the
 * kernel, f32 accumulation. One warp per weight row, 16-byte weight loads
 * (16 e4m3 or 32 e2m1 values), up to QGEMV_NT tokens per launch reading the
 * row once; more tokens take more launches (prefill re-reads the weights
 * once per QGEMV_NT tokens: correct, not fast).
 * Reference: quant_matmul_fp8_rows / quant_matmul_nvfp4_rows with xs = NULL
 * (quant/matmul.c); equal up to the order of the f32 summation.
 * Not here: quantized activations (native FP8 tensor cores on sm90 through
 * cuBLASLt, NVFP4 on sm100/103): the backend runs this weight-only path for
 * act_quant models too and says so at start-up.
 */
#include "cuda_check.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"

#define QGEMV_WARPS 8 /* rows per block */
#define QGEMV_NT 8    /* tokens per launch */

/* e4m3 (OCP e4m3fn) byte -> f32, exact; 0x7f/0xff are NaN as in quant.h. */
static __device__ __forceinline__ float e4m3_to_f32(uint32_t b) {
    uint32_t e = (b >> 3) & 0xf, m = b & 7, s = (b & 0x80) << 24;
    if ((b & 0x7f) == 0x7f) return __uint_as_float(s | 0x7fc00000u);
    if (e) return __uint_as_float(s | ((e + 120) << 23) | (m << 20));
    float v = (float)m * 0.001953125f; /* subnormal: m * 2^-9 */
    return s ? -v : v;
}

/* e2m1 code (low 4 bits of c) -> f32, exact: 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 the sign. */
static __device__ __forceinline__ float e2m1_to_f32(uint32_t c) {
    uint32_t e = (c >> 1) & 3, m = c & 1, s = (c & 8) << 28;
    uint32_t mag = e ? ((e + 126) << 23) | (m << 22) : (m ? 0x3f000000u : 0u);
    return __uint_as_float(s | mag);
}

/* x[t, k .. k+16) . w[0..16) for the tokens of one lane's chunk (x 16-byte aligned). */
template <int NT>
static __device__ __forceinline__ void dot16(float *p, const float *x, int cols, size_t k, const float *w) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float4 *xp = (const float4 *)(x + (size_t)t * cols + k);
        float4 a = __ldg(xp), b = __ldg(xp + 1), c = __ldg(xp + 2), d = __ldg(xp + 3);
        p[t] = w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z +
               w[7] * b.w + w[8] * c.x + w[9] * c.y + w[10] * c.z + w[11] * c.w + w[12] * d.x + w[13] * d.y +
               w[14] * d.z + w[15] * d.w;
    }
}

/* Four e4m3 bytes of u (byte i -> w[i]) -> f32, exact, NaN kept. sm_89+: the
 * hardware e4m3x2 -> f16x2 convert (e4m3 is a subset of f16) then f16 -> f32.
 * Older GPUs and the CPU emulation: the byte's bits placed in an f32 (exponent
 * bias 127 instead of 7, subnormals included, no FTZ in this build) times 2^120. */
static __device__ __forceinline__ void e4m3x4(uint32_t u, float *w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    uint32_t h0, h1;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h0) : "h"((unsigned short)(u & 0xffffu)));
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h1) : "h"((unsigned short)(u >> 16)));
    asm("cvt.f32.f16 %0, %1;" : "=f"(w[0]) : "h"((unsigned short)(h0 & 0xffffu)));
    asm("cvt.f32.f16 %0, %1;" : "=f"(w[1]) : "h"((unsigned short)(h0 >> 16)));
    asm("cvt.f32.f16 %0, %1;" : "=f"(w[2]) : "h"((unsigned short)(h1 & 0xffffu)));
    asm("cvt.f32.f16 %0, %1;" : "=f"(w[3]) : "h"((unsigned short)(h1 >> 16)));
#else
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t b = (u >> (8 * i)) & 0xffu;
        float v = __uint_as_float(((b & 0x80u) << 24) | ((b & 0x7fu) << 20)) * 1.329227995784916e36f; /* 2^120 */
        w[i] = (b & 0x7fu) == 0x7fu ? __uint_as_float(0x7fc00000u) : v;
    }
#endif
}
/* Eight e2m1 nibbles of u (nibble i -> w[i]) times the block scale sf, exact:
 * the nibble's bits placed in an f32 (bias 127 instead of 1) times 2^126. */
static __device__ __forceinline__ void e2m1x8(uint32_t u, float sf, float *w) {
#pragma unroll
    for (int i = 0; i < 8; i++) { /* two exact products: (bits * 2^126) is the e2m1 value; sf * 2^126 could overflow */
        uint32_t c = u >> (4 * i);
        w[i] = __uint_as_float(((c & 8u) << 28) | ((c & 7u) << 22)) * 8.507059173023462e37f * sf;
    }
}

#define QGEMV_UNROLL 4 /* 16-byte loads in flight per lane */

/* out: [NT, rows] f32; Q: [rows, cols] e4m3 (cols % 16 == 0, 16-byte aligned);
 * S: [ceil(rows / br), sc] f32 scale_inv of br x bc blocks (bc % 16 == 0 or bc >= cols);
 * x: [NT, cols] f32 (16-byte aligned); bias: [rows] bf16 or NULL. */
template <int NT>
__global__ void __launch_bounds__(QGEMV_WARPS * 32)
qgemv_fp8_vec_kernel(float *out, const float *x, const uint4 *Q, const float *S, int br, int bc, int sc,
                     const uint16_t *bias, int rows, int cols) {
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * QGEMV_WARPS + (threadIdx.x >> 5);
    if (r >= rows) return;
    int n16 = cols >> 4;
    const uint4 *wr = Q + (size_t)r * n16;
    const float *srow = S + (size_t)(r / br) * sc;
    float acc[NT], p[NT], w[16];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
    int c = lane;
    for (; c + 32 * (QGEMV_UNROLL - 1) < n16; c += 32 * QGEMV_UNROLL) {
        uint4 wv[QGEMV_UNROLL];
        float s[QGEMV_UNROLL];
#pragma unroll
        for (int u = 0; u < QGEMV_UNROLL; u++) wv[u] = __ldg(wr + c + 32 * u);
#pragma unroll
        for (int u = 0; u < QGEMV_UNROLL; u++) s[u] = __ldg(srow + ((c + 32 * u) * 16) / bc);
#pragma unroll
        for (int u = 0; u < QGEMV_UNROLL; u++) {
            e4m3x4(wv[u].x, w);
            e4m3x4(wv[u].y, w + 4);
            e4m3x4(wv[u].z, w + 8);
            e4m3x4(wv[u].w, w + 12);
            dot16<NT>(p, x, cols, (size_t)(c + 32 * u) * 16, w);
#pragma unroll
            for (int t = 0; t < NT; t++) acc[t] = fmaf(p[t], s[u], acc[t]); /* 16 | 128: one scale block */
        }
    }
    for (; c < n16; c += 32) {
        uint4 wv = __ldg(wr + c);
        float s = __ldg(srow + (c * 16) / bc);
        e4m3x4(wv.x, w);
        e4m3x4(wv.y, w + 4);
        e4m3x4(wv.z, w + 8);
        e4m3x4(wv.w, w + 12);
        dot16<NT>(p, x, cols, (size_t)c * 16, w);
#pragma unroll
        for (int t = 0; t < NT; t++) acc[t] = fmaf(p[t], s, acc[t]);
    }
    float bv = bias ? bf16_bits_to_f32(bias[r]) : 0.f;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float v = warp_sum(acc[t]);
        if (lane == 0) out[(size_t)t * rows + r] = v + bv;
    }
}

/* Any cols / alignment: one element per lane per step. Shapes as above, n <= QGEMV_NT. */
__global__ void __launch_bounds__(QGEMV_WARPS * 32)
qgemv_fp8_scalar_kernel(float *out, const float *x, int n, const uint8_t *Q, const float *S, int br, int bc,
                        int sc, const uint16_t *bias, int rows, int cols) {
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * QGEMV_WARPS + (threadIdx.x >> 5);
    if (r >= rows) return;
    const uint8_t *wr = Q + (size_t)r * cols;
    const float *srow = S + (size_t)(r / br) * sc;
    float bv = bias ? bf16_bits_to_f32(bias[r]) : 0.f;
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * cols;
        float acc = 0.f;
        for (int c = lane; c < cols; c += 32) acc += xt[c] * e4m3_to_f32(wr[c]) * srow[c / bc];
        acc = warp_sum(acc);
        if (lane == 0) out[(size_t)t * rows + r] = acc + bv;
    }
}

/* out: [NT, rows] f32; P: [rows, cols / 2] packed e2m1, element 2i in the low
 * nibble (cols % 32 == 0, 16-byte aligned); SF: [rows, cols / 16] e4m3 block
 * scales; x: [NT, cols] f32 (16-byte aligned); out = (x . e2m1 * sf) * scale2 + bias. */
/* One lane's 32 nvfp4 values (wv, block scales s0 for the first 16, s1 for the rest) at column k. */
template <int NT>
static __device__ __forceinline__ void nvfp4_chunk(float *acc, const float *x, int cols, size_t k, uint4 wv,
                                                   float s0, float s1) {
    float w[16], p[NT];
    e2m1x8(wv.x, s0, w);
    e2m1x8(wv.y, s0, w + 8);
    dot16<NT>(p, x, cols, k, w);
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] += p[t];
    e2m1x8(wv.z, s1, w);
    e2m1x8(wv.w, s1, w + 8);
    dot16<NT>(p, x, cols, k + 16, w);
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] += p[t];
}

template <int NT>
__global__ void __launch_bounds__(QGEMV_WARPS * 32)
qgemv_nvfp4_vec_kernel(float *out, const float *x, const uint4 *P, const uint8_t *SF, float scale2,
                       const uint16_t *bias, int rows, int cols) {
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * QGEMV_WARPS + (threadIdx.x >> 5);
    if (r >= rows) return;
    int n32 = cols >> 5;
    const uint4 *wr = P + (size_t)r * n32;
    const uint16_t *sr = (const uint16_t *)(SF + (size_t)r * (cols >> 4)); /* two scales per 32 values */
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
    int c = lane;
    for (; c + 32 * (QGEMV_UNROLL - 1) < n32; c += 32 * QGEMV_UNROLL) {
        uint4 wv[QGEMV_UNROLL];
        uint32_t sv[QGEMV_UNROLL];
#pragma unroll
        for (int u = 0; u < QGEMV_UNROLL; u++) wv[u] = __ldg(wr + c + 32 * u);
#pragma unroll
        for (int u = 0; u < QGEMV_UNROLL; u++) sv[u] = __ldg(sr + c + 32 * u);
#pragma unroll
        for (int u = 0; u < QGEMV_UNROLL; u++)
            nvfp4_chunk<NT>(acc, x, cols, (size_t)(c + 32 * u) * 32, wv[u], e4m3_to_f32(sv[u] & 0xffu),
                            e4m3_to_f32(sv[u] >> 8));
    }
    for (; c < n32; c += 32) {
        uint32_t sv = __ldg(sr + c);
        nvfp4_chunk<NT>(acc, x, cols, (size_t)c * 32, __ldg(wr + c), e4m3_to_f32(sv & 0xffu), e4m3_to_f32(sv >> 8));
    }
    float bv = bias ? bf16_bits_to_f32(bias[r]) : 0.f;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float v = warp_sum(acc[t]);
        if (lane == 0) out[(size_t)t * rows + r] = v * scale2 + bv;
    }
}

/* Any cols % 16 == 0 / alignment: one 16-element block per lane per step, byte loads. n <= QGEMV_NT. */
__global__ void __launch_bounds__(QGEMV_WARPS * 32)
qgemv_nvfp4_scalar_kernel(float *out, const float *x, int n, const uint8_t *P, const uint8_t *SF, float scale2,
                          const uint16_t *bias, int rows, int cols) {
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * QGEMV_WARPS + (threadIdx.x >> 5);
    if (r >= rows) return;
    int nb = cols >> 4;
    const uint8_t *wr = P + (size_t)r * (cols >> 1), *sr = SF + (size_t)r * nb;
    float bv = bias ? bf16_bits_to_f32(bias[r]) : 0.f;
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * cols;
        float acc = 0.f;
        for (int b = lane; b < nb; b += 32) {
            float sf = e4m3_to_f32(sr[b]);
            for (int i = 0; i < 16; i++) {
                uint32_t byte = wr[b * 8 + i / 2];
                acc += xt[b * 16 + i] * (e2m1_to_f32(i & 1 ? byte >> 4 : byte) * sf);
            }
        }
        acc = warp_sum(acc);
        if (lane == 0) out[(size_t)t * rows + r] = acc * scale2 + bv;
    }
}

static unsigned qblocks(int rows) { return (unsigned)((rows + QGEMV_WARPS - 1) / QGEMV_WARPS); }

template <int NT>
static void fp8_launch(float *out, const float *x, const uint8_t *Q, const float *S, int br, int bc, int sc,
                       const uint16_t *bias, int rows, int cols, cudaStream_t s) {
    qgemv_fp8_vec_kernel<NT><<<qblocks(rows), QGEMV_WARPS * 32, 0, s>>>(out, x, (const uint4 *)Q, S, br, bc, sc,
                                                                        bias, rows, cols);
}

template <int NT>
static void nvfp4_launch(float *out, const float *x, const uint8_t *P, const uint8_t *SF, float scale2,
                         const uint16_t *bias, int rows, int cols, cudaStream_t s) {
    qgemv_nvfp4_vec_kernel<NT><<<qblocks(rows), QGEMV_WARPS * 32, 0, s>>>(out, x, (const uint4 *)P, SF, scale2,
                                                                          bias, rows, cols);
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

extern "C" int cuda_gemv_fp8(float *out, const float *x, int n, const uint8_t *Q, const float *scale_inv,
                             int rows, int cols, int block_rows, int block_cols, const uint16_t *bias,
                             void *stream) {
    if (n < 0 || rows <= 0 || cols <= 0 || block_rows <= 0 || block_cols <= 0 || !out || !x || !Q || !scale_inv)
        return -1;
    cudaStream_t s = (cudaStream_t)stream;
    int sc = (cols + block_cols - 1) / block_cols;
    /* The vector path applies one scale per 16 columns: needs blocks of whole 16-column chunks. */
    int vec = cols % 16 == 0 && (block_cols % 16 == 0 || block_cols >= cols) && aligned16(Q) && aligned16(x);
    for (int t0 = 0; t0 < n; t0 += QGEMV_NT) {
        int m = n - t0 < QGEMV_NT ? n - t0 : QGEMV_NT;
        float *o = out + (size_t)t0 * rows;
        const float *xt = x + (size_t)t0 * cols;
        if (!vec) {
            qgemv_fp8_scalar_kernel<<<qblocks(rows), QGEMV_WARPS * 32, 0, s>>>(o, xt, m, Q, scale_inv, block_rows,
                                                                               block_cols, sc, bias, rows, cols);
        } else {
            switch (m) {
            case 1: fp8_launch<1>(o, xt, Q, scale_inv, block_rows, block_cols, sc, bias, rows, cols, s); break;
            case 2: fp8_launch<2>(o, xt, Q, scale_inv, block_rows, block_cols, sc, bias, rows, cols, s); break;
            case 3: fp8_launch<3>(o, xt, Q, scale_inv, block_rows, block_cols, sc, bias, rows, cols, s); break;
            case 4: fp8_launch<4>(o, xt, Q, scale_inv, block_rows, block_cols, sc, bias, rows, cols, s); break;
            case 5: fp8_launch<5>(o, xt, Q, scale_inv, block_rows, block_cols, sc, bias, rows, cols, s); break;
            case 6: fp8_launch<6>(o, xt, Q, scale_inv, block_rows, block_cols, sc, bias, rows, cols, s); break;
            case 7: fp8_launch<7>(o, xt, Q, scale_inv, block_rows, block_cols, sc, bias, rows, cols, s); break;
            default: fp8_launch<8>(o, xt, Q, scale_inv, block_rows, block_cols, sc, bias, rows, cols, s); break;
            }
        }
        CUDA_CHECK_LAUNCH();
    }
    return 0;
}

extern "C" int cuda_gemv_nvfp4(float *out, const float *x, int n, const uint8_t *packed, const uint8_t *scale,
                               float scale2, int rows, int cols, const uint16_t *bias, void *stream) {
    if (n < 0 || rows <= 0 || cols <= 0 || cols % 16 || !out || !x || !packed || !scale) return -1;
    cudaStream_t s = (cudaStream_t)stream;
    /* 16-byte weight loads and 2-byte scale loads (cols / 16 is even, so rows of scales stay aligned) */
    int vec = cols % 32 == 0 && aligned16(packed) && aligned16(x) && ((uintptr_t)scale & 1) == 0;
    for (int t0 = 0; t0 < n; t0 += QGEMV_NT) {
        int m = n - t0 < QGEMV_NT ? n - t0 : QGEMV_NT;
        float *o = out + (size_t)t0 * rows;
        const float *xt = x + (size_t)t0 * cols;
        if (!vec) {
            qgemv_nvfp4_scalar_kernel<<<qblocks(rows), QGEMV_WARPS * 32, 0, s>>>(o, xt, m, packed, scale, scale2,
                                                                                 bias, rows, cols);
        } else {
            switch (m) {
            case 1: nvfp4_launch<1>(o, xt, packed, scale, scale2, bias, rows, cols, s); break;
            case 2: nvfp4_launch<2>(o, xt, packed, scale, scale2, bias, rows, cols, s); break;
            case 3: nvfp4_launch<3>(o, xt, packed, scale, scale2, bias, rows, cols, s); break;
            case 4: nvfp4_launch<4>(o, xt, packed, scale, scale2, bias, rows, cols, s); break;
            case 5: nvfp4_launch<5>(o, xt, packed, scale, scale2, bias, rows, cols, s); break;
            case 6: nvfp4_launch<6>(o, xt, packed, scale, scale2, bias, rows, cols, s); break;
            case 7: nvfp4_launch<7>(o, xt, packed, scale, scale2, bias, rows, cols, s); break;
            default: nvfp4_launch<8>(o, xt, packed, scale, scale2, bias, rows, cols, s); break;
            }
        }
        CUDA_CHECK_LAUNCH();
    }
    return 0;
}
