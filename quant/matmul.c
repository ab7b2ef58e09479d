/*
 * matmul.c - CPU matmul kernels for FP8 and NVFP4 weights: out[n, rows] =
 * x[n, cols] @ W^T, dequantizing weights inside the loop (never a full f32
 * copy). AVX2+FMA+F16C when the CPU has them, else a portable path that
 * computes the same bits; the newer FP8 kernels (paths avx2, avx512) are in
 * fp8_matmul_x86.c, and this file chooses the path (quant_force_path). All
 * reduce every output element in one order fixed by cols alone (16 lanes
 * indexed by k mod 16, fmaf, a fixed lane tree), so results do not depend on the batch size, the token tile or the row split.
 * Not here: activation quantization (act.c), threading (callers split rows).
 */
#include "quant.h"
#include "fp8_matmul.h"

#include <math.h>
#if (defined(__x86_64__) || defined(__i386__)) && !defined(QUANT_NO_SIMD)
#include <immintrin.h>
#define QUANT_X86 1
#endif

#define LANES 16
#define TILE_T 4  /* tokens sharing one weight decode */
#define CHUNK_R 16 /* rows kept hot while token tiles stream */

static int g_path_init;
static int g_has[QUANT_PATH_COUNT];
static QuantPath g_path = QUANT_PATH_PORTABLE, g_default = QUANT_PATH_PORTABLE;
static const char *const g_names[QUANT_PATH_COUNT] = {"portable", "avx2-v0", "avx2", "avx512"};

#ifdef QUANT_X86
#include <cpuid.h>
/* F16C via CPUID leaf 1 ECX bit 29: clang's __builtin_cpu_supports has no "f16c". */
static int cpu_has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

static void path_init(void) {
    if (g_path_init) return;
    g_path_init = 1;
    g_has[QUANT_PATH_PORTABLE] = 1;
#ifdef QUANT_X86
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    g_has[QUANT_PATH_AVX2_V0] = avx2 && cpu_has_f16c();
    g_has[QUANT_PATH_AVX2] = avx2;
    g_has[QUANT_PATH_AVX512] = avx2 && __builtin_cpu_supports("avx512f");
#endif
    for (int p = QUANT_PATH_PORTABLE; p < QUANT_PATH_COUNT; p++)
        if (g_has[p] && p != QUANT_PATH_AVX2_V0) g_default = (QuantPath)p;
    g_path = g_default;
}

int quant_path_available(QuantPath p) {
    path_init();
    return p >= 0 && p < QUANT_PATH_COUNT && g_has[p];
}

const char *quant_path_name(QuantPath p) { return p >= 0 && p < QUANT_PATH_COUNT ? g_names[p] : "?"; }

QuantPath quant_path(void) {
    path_init();
    return g_path;
}

int quant_force_path(QuantPath p) {
    if (!quant_path_available(p)) return -1;
    g_path = p;
    return 0;
}

void quant_force_portable(int on) {
    path_init();
    g_path = on ? QUANT_PATH_PORTABLE : g_default;
}

int quant_simd_active(void) { return quant_path() != QUANT_PATH_PORTABLE; }

/* The NVFP4 kernel needs F16C besides a vector path. */
static int nvfp4_simd(void) {
#ifdef QUANT_X86
    static int f16c = -1;
    if (f16c < 0) f16c = cpu_has_f16c();
    return quant_simd_active() && f16c;
#else
    return 0;
#endif
}

static int imin(int a, int b) { return a < b ? a : b; }

/* Lane tree shared by both paths: l[i] = a[i] + a[i+8], m[i] = l[i] + l[i+4],
 * (m0 + m2) + (m1 + m3). */
static float hsum16(const float *a) {
    float l[8], m[4];
    for (int i = 0; i < 8; i++) l[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; i++) m[i] = l[i] + l[i + 4];
    return (m[0] + m[2]) + (m[1] + m[3]);
}

/* ---------------- portable path ---------------- */

static void fp8_rows_portable(float *out, const float *x, const float *xs, const QuantFp8 *w, int n, int rb,
                              int re) {
    int cols = w->cols, ng = quant_fp8_groups(cols);
    for (int r = rb; r < re; r++) {
        const uint8_t *q = w->q + (size_t)r * cols;
        const float *srow = w->scale_inv + (size_t)(r / w->block_rows) * w->scale_cols;
        for (int t = 0; t < n; t++) {
            const float *xt = x + (size_t)t * cols;
            float acc[LANES] = {0};
            for (int g = 0; g < ng; g++) {
                int c0 = g * QUANT_FP8_GROUP, c1 = imin(c0 + QUANT_FP8_GROUP, cols);
                float p[LANES] = {0};
                for (int k = c0; k < c1; k += LANES)
                    for (int l = 0; l < LANES; l++) {
                        float xv = k + l < c1 ? xt[k + l] : 0.0f, wv = k + l < c1 ? quant_e4m3_to_f32(q[k + l]) : 0.0f;
                        p[l] = fmaf(xv, wv, p[l]);
                    }
                float s = srow[c0 / w->block_cols];
                if (xs) s *= xs[(size_t)t * ng + g];
                for (int l = 0; l < LANES; l++) acc[l] = fmaf(p[l], s, acc[l]);
            }
            out[(size_t)t * w->rows + r] = hsum16(acc);
        }
    }
}

static void nvfp4_rows_portable(float *out, const float *x, const float *xg, const QuantNvfp4 *w, int n,
                                int rb, int re) {
    int cols = w->cols, nb = cols / QUANT_NVFP4_BLOCK;
    for (int r = rb; r < re; r++) {
        const uint8_t *p = w->packed + (size_t)r * (cols / 2), *sc = w->scale + (size_t)r * nb;
        for (int t = 0; t < n; t++) {
            const float *xt = x + (size_t)t * cols;
            float acc[LANES] = {0};
            for (int b = 0; b < nb; b++) {
                float sf = quant_e4m3_to_f32(sc[b]);
                for (int l = 0; l < LANES; l++) {
                    int k = b * LANES + l;
                    uint8_t code = (l & 1) ? p[k / 2] >> 4 : p[k / 2] & 0xf;
                    acc[l] = fmaf(xt[k], quant_e2m1_to_f32(code) * sf, acc[l]);
                }
            }
            float s = w->scale2;
            if (xg) s *= xg[t];
            out[(size_t)t * w->rows + r] = hsum16(acc) * s;
        }
    }
}

/* ---------------- AVX2 + FMA + F16C path ---------------- */
#ifdef QUANT_X86

#define TGT __attribute__((target("avx2,fma,f16c")))
#define TGT_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) static inline

TGT_INLINE float hsum16_avx(__m256 a0, __m256 a1) {
    __m256 l = _mm256_add_ps(a0, a1);
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(l), _mm256_extractf128_ps(l, 1));
    __m128 h = _mm_add_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* 16 e4m3 bytes -> f32: e4m3 bits re-biased into an IEEE half (x 2^-8), F16C
 * to f32, times 256. Exact for every non-NaN byte (loaders reject NaN). */
TGT_INLINE void e4m3x16(const uint8_t *q, __m256 *w0, __m256 *w1) {
    __m256i h = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)q));
    __m256i mag = _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7f)), 7);
    __m256i sgn = _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x80)), 8);
    __m256i f16 = _mm256_or_si256(mag, sgn);
    __m256 k = _mm256_set1_ps(256.0f);
    *w0 = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(f16)), k);
    *w1 = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(f16, 1)), k);
}

/* 8 e2m1 codes (4 bytes, element 2i low nibble) times the block scale. */
TGT_INLINE __m256 e2m1x8(const uint8_t *p, __m256 sf) {
    const __m256 tbl = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    uint32_t u;
    memcpy(&u, p, 4);
    __m256i c = _mm256_srlv_epi32(_mm256_set1_epi32((int)u), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    c = _mm256_and_si256(c, _mm256_set1_epi32(0xf));
    __m256 mag = _mm256_permutevar8x32_ps(tbl, c); /* uses the low 3 bits */
    __m256 sgn = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(8)), 28));
    return _mm256_mul_ps(_mm256_xor_ps(mag, sgn), sf);
}

/* R weight rows from r0 against T tokens from t0 (T * R <= 4, both constant):
 * independent (token, row) accumulator chains for ILP; each output's own
 * reduction order is the same for every tile shape. */
TGT_INLINE void fp8_tile(float *out, const float *x, const float *xs, const QuantFp8 *w, int r0, int t0,
                         const int T, const int R) {
    int cols = w->cols, ng = quant_fp8_groups(cols);
    const uint8_t *q[4];
    const float *srow[4], *xt[4];
    __m256 acc0[4], acc1[4], p0[4], p1[4], w0[4], w1[4];
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) {
        q[i] = w->q + (size_t)(r0 + i) * cols;
        srow[i] = w->scale_inv + (size_t)((r0 + i) / w->block_rows) * w->scale_cols;
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) xt[t] = x + (size_t)(t0 + t) * cols;
#pragma GCC unroll 4
    for (int j = 0; j < T * R; j++) acc0[j] = acc1[j] = _mm256_setzero_ps();
    for (int g = 0; g < ng; g++) {
        int c0 = g * QUANT_FP8_GROUP, c1 = imin(c0 + QUANT_FP8_GROUP, cols), k = c0;
#pragma GCC unroll 4
        for (int j = 0; j < T * R; j++) p0[j] = p1[j] = _mm256_setzero_ps();
        for (; k + LANES <= c1; k += LANES) {
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) e4m3x16(q[i] + k, &w0[i], &w1[i]);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                __m256 xa = _mm256_loadu_ps(xt[t] + k), xb = _mm256_loadu_ps(xt[t] + k + 8);
#pragma GCC unroll 4
                for (int i = 0; i < R; i++) {
                    p0[t * R + i] = _mm256_fmadd_ps(xa, w0[i], p0[t * R + i]);
                    p1[t * R + i] = _mm256_fmadd_ps(xb, w1[i], p1[t * R + i]);
                }
            }
        }
        if (k < c1) { /* ragged tail: zero-padded like the portable path */
            for (int i = 0; i < R; i++) {
                uint8_t qb[LANES] = {0};
                memcpy(qb, q[i] + k, (size_t)(c1 - k));
                e4m3x16(qb, &w0[i], &w1[i]);
            }
            for (int t = 0; t < T; t++) {
                float xb[LANES] = {0};
                memcpy(xb, xt[t] + k, (size_t)(c1 - k) * sizeof(float));
                for (int i = 0; i < R; i++) {
                    p0[t * R + i] = _mm256_fmadd_ps(_mm256_loadu_ps(xb), w0[i], p0[t * R + i]);
                    p1[t * R + i] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 8), w1[i], p1[t * R + i]);
                }
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) {
                float s = srow[i][c0 / w->block_cols];
                if (xs) s *= xs[(size_t)(t0 + t) * ng + g];
                __m256 sv = _mm256_set1_ps(s);
                acc0[t * R + i] = _mm256_fmadd_ps(p0[t * R + i], sv, acc0[t * R + i]);
                acc1[t * R + i] = _mm256_fmadd_ps(p1[t * R + i], sv, acc1[t * R + i]);
            }
    }
    for (int t = 0; t < T; t++)
        for (int i = 0; i < R; i++)
            out[(size_t)(t0 + t) * w->rows + r0 + i] = hsum16_avx(acc0[t * R + i], acc1[t * R + i]);
}

TGT_INLINE void nvfp4_tile(float *out, const float *x, const float *xg, const QuantNvfp4 *w, int r0, int t0,
                           const int T, const int R) {
    int cols = w->cols, nb = cols / QUANT_NVFP4_BLOCK;
    const uint8_t *p[4], *sc[4];
    const float *xt[4];
    __m256 acc0[4], acc1[4], w0[4], w1[4];
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) {
        p[i] = w->packed + (size_t)(r0 + i) * (cols / 2);
        sc[i] = w->scale + (size_t)(r0 + i) * nb;
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) xt[t] = x + (size_t)(t0 + t) * cols;
#pragma GCC unroll 4
    for (int j = 0; j < T * R; j++) acc0[j] = acc1[j] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            __m256 sf = _mm256_set1_ps(quant_e4m3_to_f32(sc[i][b]));
            w0[i] = e2m1x8(p[i] + b * 8, sf);
            w1[i] = e2m1x8(p[i] + b * 8 + 4, sf);
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m256 xa = _mm256_loadu_ps(xt[t] + b * LANES), xb = _mm256_loadu_ps(xt[t] + b * LANES + 8);
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) {
                acc0[t * R + i] = _mm256_fmadd_ps(xa, w0[i], acc0[t * R + i]);
                acc1[t * R + i] = _mm256_fmadd_ps(xb, w1[i], acc1[t * R + i]);
            }
        }
    }
    for (int t = 0; t < T; t++) {
        float s = w->scale2;
        if (xg) s *= xg[t0 + t];
        for (int i = 0; i < R; i++)
            out[(size_t)(t0 + t) * w->rows + r0 + i] = hsum16_avx(acc0[t * R + i], acc1[t * R + i]) * s;
    }
}

/* Rows in chunks of CHUNK_R so a chunk's weights stay in cache while token
 * tiles stream past: 4 tokens x 1 row, then the leftover tokens one at a
 * time x 4 rows. The per-element reduction order is unaffected. */
#define ROWS_DRIVER(TILE)                                                                   \
    for (int c0 = rb; c0 < re; c0 += CHUNK_R) {                                             \
        int c1 = imin(c0 + CHUNK_R, re), t = 0;                                             \
        for (; t + TILE_T <= n; t += TILE_T)                                                \
            for (int r = c0; r < c1; r++) TILE(r, t, TILE_T, 1);                            \
        for (; t < n; t++) {                                                                \
            int r = c0;                                                                     \
            for (; r + 4 <= c1; r += 4) TILE(r, t, 1, 4);                                   \
            for (; r < c1; r++) TILE(r, t, 1, 1);                                           \
        }                                                                                   \
    }

TGT static void fp8_rows_avx2(float *out, const float *x, const float *xs, const QuantFp8 *w, int n, int rb,
                              int re) {
#define FP8_TILE(r, t, T, R) fp8_tile(out, x, xs, w, r, t, T, R)
    ROWS_DRIVER(FP8_TILE)
#undef FP8_TILE
}

TGT static void nvfp4_rows_avx2(float *out, const float *x, const float *xg, const QuantNvfp4 *w, int n, int rb,
                                int re) {
#define NVFP4_TILE(r, t, T, R) nvfp4_tile(out, x, xg, w, r, t, T, R)
    ROWS_DRIVER(NVFP4_TILE)
#undef NVFP4_TILE
}

#else
static void nvfp4_rows_avx2(float *out, const float *x, const float *xg, const QuantNvfp4 *w, int n, int rb,
                            int re) {
    nvfp4_rows_portable(out, x, xg, w, n, rb, re);
}
#endif

/* ---------------- entry points ---------------- */

void quant_matmul_fp8_rows(float *out, const float *x, const float *xs, const QuantFp8 *w, int n, int row_begin,
                           int row_end) {
    switch (quant_path()) {
#ifdef QUANT_X86
    case QUANT_PATH_AVX512: quant_fp8_rows_avx512(out, x, xs, w, n, row_begin, row_end); break;
    case QUANT_PATH_AVX2: quant_fp8_rows_avx2(out, x, xs, w, n, row_begin, row_end); break;
    case QUANT_PATH_AVX2_V0: fp8_rows_avx2(out, x, xs, w, n, row_begin, row_end); break;
#endif
    default: fp8_rows_portable(out, x, xs, w, n, row_begin, row_end); break;
    }
}

void quant_matmul_nvfp4_rows(float *out, const float *x, const float *xg, const QuantNvfp4 *w, int n,
                             int row_begin, int row_end) {
    if (nvfp4_simd()) nvfp4_rows_avx2(out, x, xg, w, n, row_begin, row_end);
    else nvfp4_rows_portable(out, x, xg, w, n, row_begin, row_end);
}
