/*
 * cpu_ops.c - CPU reference ops (see cpu_ops.h) and the choice of matmul
 * path: a portable C path, built everywhere (aarch64 hosts such as GH200 use
 * it), and on x86 the AVX2+FMA and AVX-512F kernels of cpu_matmul_x86.c,
 * chosen at run time from cpuid. Every matmul path gives the reference order's
 * bits (cpu_ops.h). The old AVX2 kernel (before issue #23) stays here as the
 * path AVX2_V0: the benchmarks measure the new kernels against it.
 */
#include "cpu_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

#include "check.h"
#include "cpu_matmul.h"
#include "dtype.h"
#include "exp_poly.h"
#include "log.h"
#include "quant.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_OPS_X86 1
#define AVX2 __attribute__((target("avx2,fma")))
#define AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) static inline
#endif

static int g_init;
static int g_avx2;   /* the CPU has AVX2 and FMA: the vector path of dot/axpy */
static int g_has[CPU_PATH_COUNT];
static CpuPath g_path = CPU_PATH_PORTABLE;
static int g_bf16dot; /* vdpbf16ps runs here and gives the reference bits (bf16_dot_check) */

static const char *const g_names[CPU_PATH_COUNT] = {"portable", "avx2-v0", "avx2", "avx512"};

const char *cpu_ops_path_name(CpuPath p) { return p >= 0 && p < CPU_PATH_COUNT ? g_names[p] : "?"; }

/* The FP8 kernels follow the matmul path (quant.h numbers its paths alike). */
static void sync_quant_path(void) {
    static const QuantPath q[CPU_PATH_COUNT] = {QUANT_PATH_PORTABLE, QUANT_PATH_AVX2_V0, QUANT_PATH_AVX2,
                                                QUANT_PATH_AVX512};
    if (quant_force_path(q[g_path]) && g_path != CPU_PATH_PORTABLE) quant_force_path(QUANT_PATH_AVX2);
}

#ifdef CPU_OPS_X86
/* vdpbf16ps against the portable reference of cpu_matmul_bf16.c on inputs
 * that exercise its rounding, flushing and cancellation: 1 when every bit
 * agrees (a CPU whose instruction rounds otherwise gets the emulation). */
static int bf16_dot_check(void) {
    enum { K = 64 + 7, N = 3, R = 5 };
    uint16_t w[R * K], x[N * K];
    uint32_t st = 12345;
    for (int i = 0; i < R * K + N * K; i++) {
        st = st * 1103515245u + 12345u;
        uint16_t m = (uint16_t)((st >> 8) & 0x807f), e = (uint16_t)(i % 5 == 0 ? (st >> 20) % 3 : 100 + (st >> 20) % 50);
        uint16_t v = (uint16_t)(m | e << 7);
        if (i < R * K) w[i] = v;
        else x[i - R * K] = i % 7 ? v : (uint16_t)(w[(i - R * K) % (R * K)] ^ 0x8000); /* cancellations */
    }
    float a[N * R], b[N * R];
    cpu_matmul_bf16_portable(a, R, x, K, N, w, K, 0, R);
    cpu_matmul_bf16_avx512bf16(b, R, x, K, N, w, K, 0, R);
    if (memcmp(a, b, sizeof a)) {
        log_warn("this CPU's vdpbf16ps does not give the reference bits of --dtype bfloat16: emulating it");
        return 0;
    }
    return 1;
}
#endif

const char *cpu_ops_init(void) {
    if (!g_init) {
        g_init = 1;
        g_has[CPU_PATH_PORTABLE] = 1;
#ifdef CPU_OPS_X86
        __builtin_cpu_init();
        g_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        g_has[CPU_PATH_AVX2_V0] = g_has[CPU_PATH_AVX2] = g_avx2;
        g_has[CPU_PATH_AVX512] = g_avx2 && __builtin_cpu_supports("avx512f");
        g_bf16dot = g_has[CPU_PATH_AVX512] && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16") && bf16_dot_check();
#endif
        for (int p = CPU_PATH_PORTABLE; p < CPU_PATH_COUNT; p++)
            if (g_has[p] && p != CPU_PATH_AVX2_V0) g_path = (CpuPath)p;
        const char *env = getenv("SAMPLER_CPU_PATH");
        if (env && *env) {
            int found = 0;
            for (int p = 0; p < CPU_PATH_COUNT; p++)
                if (!strcmp(env, g_names[p])) {
                    found = 1;
                    if (g_has[p]) g_path = (CpuPath)p;
                    else log_warn("SAMPLER_CPU_PATH=%s: this CPU cannot run it; using %s", env, g_names[g_path]);
                }
            if (!found) log_warn("SAMPLER_CPU_PATH=%s: unknown (portable, avx2-v0, avx2, avx512); using %s", env, g_names[g_path]);
        }
        sync_quant_path();
    }
    return g_names[g_path];
}

int cpu_ops_path_available(CpuPath p) {
    cpu_ops_init();
    return p >= 0 && p < CPU_PATH_COUNT && g_has[p];
}

CpuPath cpu_ops_path(void) {
    cpu_ops_init();
    return g_path;
}

int cpu_ops_force_path(CpuPath p) {
    if (!cpu_ops_path_available(p)) return -1;
    g_path = p;
    sync_quant_path();
    return 0;
}

int cpu_matmul_task_rows(int K) {
    if (cpu_ops_path() == CPU_PATH_AVX2_V0) return 32; /* the old split, with the old kernel */
    int rows = (65536 / 2 / (K > 0 ? K : 1) + 15) / 16 * 16;
    return rows < 16 ? 16 : rows > 64 ? 64 : rows;
}

static inline int use_avx2(void) {
    if (!g_init) cpu_ops_init();
    return g_avx2;
}

#ifdef CPU_OPS_X86
/* ---------------- AVX2 helpers ---------------- */

AVX2_INLINE __m256 load_bf16x8(const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Weights as f32 (a converted panel) or bf16 (read in place); the conversion
 * is exact, so both give the same bits. */
AVX2_INLINE __m256 load_w8(const void *w, int f32, size_t i) {
    return f32 ? _mm256_loadu_ps((const float *)w + i) : load_bf16x8((const uint16_t *)w + i);
}

/* R rows x T tokens of W x^T, one accumulator per (row, token): the
 * arithmetic for a (row, token) pair is the same for every R, T and weight
 * source, which is what makes the matmul batch invariant. w: [R, ldw]. */
AVX2_INLINE void mm_block(int R, int T, float *out, int ldo, const float *x, int ldx, const void *w,
                          int wf32, int ldw, int K, const char *pf) {
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= K; k += 8) {
        /* Decode streams rows of a few KB: the hardware prefetcher restarts on
         * every row, so fetch the next tile (contiguous) one line per step. */
        if (pf) _mm_prefetch(pf + (size_t)k * 8, _MM_HINT_T0);
        __m256 wv[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) wv[r] = load_w8(w, wf32, (size_t)r * ldw + k);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m256 xv = _mm256_loadu_ps(x + (size_t)t * ldx + k);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            float s = cpu_hsum8(acc[r][t]);
            for (int kk = k; kk < K; kk++) {
                size_t i = (size_t)r * ldw + kk;
                float wv = wf32 ? ((const float *)w)[i] : bf16_to_f32(((const uint16_t *)w)[i]);
                s = fmaf(wv, x[(size_t)t * ldx + kk], s); /* the reference's FMA, at any -O */
            }
            out[(size_t)t * ldo + r] = s;
        }
}

#define MM_TOKEN_BLOCK 64
#define MM_PANEL_MAX_K 16384 /* wider rows are read in place */

AVX2 static void matmul_avx2_v0(float *out, int ldo, const float *x, int ldx, int n, const uint16_t *w,
                             int K, int r0, int r1) {
    if (n == 1) { /* decode: stream the weights once, 4 rows at a time */
        int r = r0;
        for (; r + 4 <= r1; r += 4)
            mm_block(4, 1, out + r, ldo, x, ldx, w + (size_t)r * K, 0, K, K, (const char *)(w + (size_t)(r + 4) * K));
        for (; r < r1; r++) mm_block(1, 1, out + r, ldo, x, ldx, w + (size_t)r * K, 0, K, K, NULL);
        return;
    }
    /* Batches: convert a pair of rows to f32 once per block of tokens, then
     * run every 4-token group of the block against the panel. */
    static __thread float panel[2 * MM_PANEL_MAX_K];
    int use_panel = K <= MM_PANEL_MAX_K && n >= 8;
    for (int t0 = 0; t0 < n; t0 += MM_TOKEN_BLOCK) {
        int t1 = t0 + MM_TOKEN_BLOCK < n ? t0 + MM_TOKEN_BLOCK : n;
        for (int r = r0; r < r1; r += 2) {
            int R = r + 2 <= r1 ? 2 : 1;
            const void *wr = w + (size_t)r * K;
            int ldw = K, wf32 = 0;
            if (use_panel) {
                for (size_t i = 0; i < (size_t)R * K; i += 8)
                    if (i + 8 <= (size_t)R * K) _mm256_storeu_ps(panel + i, load_bf16x8(w + (size_t)r * K + i));
                    else for (size_t j = i; j < (size_t)R * K; j++) panel[j] = bf16_to_f32(w[(size_t)r * K + j]);
                wr = panel;
                wf32 = 1;
            }
            int t = t0;
            float *o = out + r;
            if (R == 2) {
                for (; t + 4 <= t1; t += 4) mm_block(2, 4, o + (size_t)t * ldo, ldo, x + (size_t)t * ldx, ldx, wr, wf32, ldw, K, NULL);
                for (; t < t1; t++) mm_block(2, 1, o + (size_t)t * ldo, ldo, x + (size_t)t * ldx, ldx, wr, wf32, ldw, K, NULL);
            } else {
                for (; t + 4 <= t1; t += 4) mm_block(1, 4, o + (size_t)t * ldo, ldo, x + (size_t)t * ldx, ldx, wr, wf32, ldw, K, NULL);
                for (; t < t1; t++) mm_block(1, 1, o + (size_t)t * ldo, ldo, x + (size_t)t * ldx, ldx, wr, wf32, ldw, K, NULL);
            }
        }
    }
}

AVX2 static float dot_avx2(const float *a, const float *b, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = cpu_hsum8(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

AVX2 static void axpy_avx2(float *y, float a, const float *x, int n) {
    __m256 av = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

/* cpu_hsum8 of eight vectors at once, into o[0..8): the same adds on the same
 * operands (x + y == y + x): level 1 b_j = a_j + a_{j+4} (a 128-bit half of
 * each pair), level 2 c0 = b0 + b2, c1 = b1 + b3 (unpacked pairs), level 3
 * c0 + c1. One reduction per eight rows instead of eight. */
AVX2_INLINE void hsum8x8_avx2(const __m256 *a, float *o) {
    __m256 p[4];
    #pragma GCC unroll 4
    for (int r = 0; r < 4; r++) /* [b of row r | b of row r + 4] */
        p[r] = _mm256_add_ps(_mm256_permute2f128_ps(a[r], a[r + 4], 0x20), _mm256_permute2f128_ps(a[r], a[r + 4], 0x31));
    __m256 c01 = _mm256_add_ps(_mm256_unpacklo_ps(p[0], p[1]), _mm256_unpackhi_ps(p[0], p[1])); /* c0 c0' c1 c1' */
    __m256 c23 = _mm256_add_ps(_mm256_unpacklo_ps(p[2], p[3]), _mm256_unpackhi_ps(p[2], p[3]));
    _mm256_storeu_ps(o, _mm256_add_ps(_mm256_shuffle_ps(c01, c23, _MM_SHUFFLE(1, 0, 1, 0)),
                                      _mm256_shuffle_ps(c01, c23, _MM_SHUFFLE(3, 2, 3, 2))));
}

/* m dots of q against rows of k (stride ldk), eight rows at once when n % 8
 * == 0 (one transposed reduction for the eight), else four (four chains in
 * flight instead of one): each is dot_avx2's arithmetic. */
AVX2 static void dot_rows_avx2(float *out, const float *q, const float *k, size_t ldk, int m, int n) {
    int i = 0;
    for (; n % 8 == 0 && n > 0 && i + 8 <= m; i += 8) {
        const float *k0 = k + (size_t)i * ldk;
        __m256 a[8];
        #pragma GCC unroll 8
        for (int r = 0; r < 8; r++) a[r] = _mm256_setzero_ps();
        for (int j = 0; j < n; j += 8) {
            __m256 qv = _mm256_loadu_ps(q + j);
            #pragma GCC unroll 8
            for (int r = 0; r < 8; r++) a[r] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + (size_t)r * ldk + j), a[r]);
        }
        hsum8x8_avx2(a, out + i);
    }
    for (; i + 4 <= m; i += 4) {
        const float *k0 = k + (size_t)i * ldk;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int j = 0;
        for (; j + 8 <= n; j += 8) {
            __m256 qv = _mm256_loadu_ps(q + j);
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + j), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + ldk + j), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 2 * ldk + j), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 3 * ldk + j), a3);
        }
        float s[4] = {cpu_hsum8(a0), cpu_hsum8(a1), cpu_hsum8(a2), cpu_hsum8(a3)};
        #pragma GCC unroll 8
        for (int r = 0; r < 4; r++) {
            for (int jj = j; jj < n; jj++) s[r] += q[jj] * k0[(size_t)r * ldk + jj];
            out[i + r] = s[r];
        }
    }
    for (; i < m; i++) out[i] = dot_avx2(q, k + (size_t)i * ldk, n);
}

/* y_g[0, 8C) += a_g[i] * x_i for i < m in order, for G queries over the same
 * rows (G * C <= 8), the G * C accumulators held in registers across the
 * rows: per element axpy_avx2's arithmetic (one FMA a row), each query's FMAs
 * in its own order, so a query's bits do not depend on G. G > 1 puts G times
 * the independent chains in flight: a head_dim of 8-32 (C 1-4, the fixtures')
 * left one to four chains per row waiting on the FMA's latency. */
AVX2_INLINE void axpy_rows_q_regs(int G, int C, float *const *y, const float *const *a, const float *x, size_t ldx,
                                  int m) {
    __m256 acc[8];
    #pragma GCC unroll 8
    for (int g = 0; g < G; g++)
        #pragma GCC unroll 8
        for (int c = 0; c < C; c++) acc[g * C + c] = _mm256_loadu_ps(y[g] + 8 * c);
    for (int i = 0; i < m; i++) {
        const float *xi = x + (size_t)i * ldx;
        #pragma GCC unroll 8
        for (int g = 0; g < G; g++) {
            __m256 av = _mm256_set1_ps(a[g][i]);
            #pragma GCC unroll 8
            for (int c = 0; c < C; c++) acc[g * C + c] = _mm256_fmadd_ps(av, _mm256_loadu_ps(xi + 8 * c), acc[g * C + c]);
        }
    }
    #pragma GCC unroll 8
    for (int g = 0; g < G; g++)
        #pragma GCC unroll 8
        for (int c = 0; c < C; c++) _mm256_storeu_ps(y[g] + 8 * c, acc[g * C + c]);
}

/* One query: y[0, 8C) held in C registers. */
AVX2_INLINE void axpy_rows_regs(int C, float *y, const float *a, const float *x, size_t ldx, int m) {
    axpy_rows_q_regs(1, C, &y, &a, x, ldx, m);
}

/* y += a[i] * x_i for i < m in order, y held in registers across the rows
 * (64 floats at a time, then the rest of the multiple of 8; a head_dim below
 * 64 went through memory a row at a time: half of test_long_context's time at
 * head_dim 16): per element axpy_avx2's arithmetic. */
AVX2 static void axpy_rows_avx2(float *y, const float *a, const float *x, size_t ldx, int m, int n) {
    int d = 0;
    for (; d + 64 <= n; d += 64) axpy_rows_regs(8, y + d, a, x + d, ldx, m);
    switch ((n - d) / 8) {
    case 7: axpy_rows_regs(7, y + d, a, x + d, ldx, m); break;
    case 6: axpy_rows_regs(6, y + d, a, x + d, ldx, m); break;
    case 5: axpy_rows_regs(5, y + d, a, x + d, ldx, m); break;
    case 4: axpy_rows_regs(4, y + d, a, x + d, ldx, m); break;
    case 3: axpy_rows_regs(3, y + d, a, x + d, ldx, m); break;
    case 2: axpy_rows_regs(2, y + d, a, x + d, ldx, m); break;
    case 1: axpy_rows_regs(1, y + d, a, x + d, ldx, m); break;
    default: break;
    }
    d += (n - d) / 8 * 8;
    if (d < n) /* the last n % 8: axpy_avx2's scalar tail */
        for (int i = 0; i < m; i++) axpy_avx2(y + d, a[i], x + (size_t)i * ldx + d, n - d);
}

/* cpu_axpy_rows for nq queries against the same m rows, n = 8 * C with C <= 4: groups of 8 / C
 * queries through axpy_rows_q_regs, the rest alone. Returns the queries done (a prefix). */
AVX2 static int axpy_rows_multi_avx2(float *const *y, const float *const *a, int nq, const float *x, size_t ldx,
                                     int m, int n) {
    int e = 0;
    switch (n) {
    case 8: for (; e + 8 <= nq; e += 8) axpy_rows_q_regs(8, 1, y + e, a + e, x, ldx, m); break;
    case 16: for (; e + 4 <= nq; e += 4) axpy_rows_q_regs(4, 2, y + e, a + e, x, ldx, m); break;
    case 24: for (; e + 2 <= nq; e += 2) axpy_rows_q_regs(2, 3, y + e, a + e, x, ldx, m); break;
    case 32: for (; e + 2 <= nq; e += 2) axpy_rows_q_regs(2, 4, y + e, a + e, x, ldx, m); break;
    default: break;
    }
    return e;
}

#define AVX512 __attribute__((target("avx512f,avx2,fma")))
#define AVX512_INLINE __attribute__((target("avx512f,avx2,fma"), always_inline)) static inline

/* As dot_rows_avx2, eight rows at once, two to a zmm (lanes 0-7 one row,
 * 8-15 the next) against q broadcast to both halves. */
AVX512 static void dot_rows_avx512(float *out, const float *q, const float *k, size_t ldk, int m, int n) {
    int i = 0;
    for (; i + 8 <= m && n >= 8; i += 8) {
        const float *k0 = k + (size_t)i * ldk;
        __m512 acc[4];
        #pragma GCC unroll 8
        for (int p = 0; p < 4; p++) acc[p] = _mm512_setzero_ps();
        int j = 0;
        for (; j + 8 <= n; j += 8) {
            __m512 qv = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(q + j))));
            #pragma GCC unroll 8
            for (int p = 0; p < 4; p++) {
                __m512 kv = _mm512_castpd_ps(_mm512_insertf64x4(
                    _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(k0 + (size_t)(2 * p) * ldk + j))),
                    _mm256_castps_pd(_mm256_loadu_ps(k0 + (size_t)(2 * p + 1) * ldk + j)), 1));
                acc[p] = _mm512_fmadd_ps(qv, kv, acc[p]);
            }
        }
        if (j == n) { /* no tail: the eight hsum8 trees at once, the same adds (x + y == y + x) */
            __m512 t[4];
            #pragma GCC unroll 4
            for (int p = 0; p < 4; p++) /* 128-bit blocks [A0-3 A4-7 B0-3 B4-7]: b = a[0..3] + a[4..7] */
                t[p] = _mm512_add_ps(acc[p], _mm512_shuffle_f32x4(acc[p], acc[p], _MM_SHUFFLE(2, 3, 0, 1)));
            #pragma GCC unroll 2
            for (int h = 0; h < 2; h++) { /* the b of rows 4h .. 4h+3, one per block */
                __m512 u = _mm512_shuffle_f32x4(t[2 * h], t[2 * h + 1], _MM_SHUFFLE(2, 0, 2, 0));
                u = _mm512_add_ps(u, _mm512_permute_ps(u, _MM_SHUFFLE(1, 0, 3, 2))); /* b0 + b2, b1 + b3 */
                u = _mm512_add_ps(u, _mm512_permute_ps(u, _MM_SHUFFLE(2, 3, 0, 1))); /* (b0 + b2) + (b1 + b3) */
                _mm512_mask_compressstoreu_ps(out + i + 4 * h, 0x1111, u);
            }
            continue;
        }
        #pragma GCC unroll 8
        for (int p = 0; p < 4; p++) {
            float s[2] = {cpu_hsum8(_mm512_castps512_ps256(acc[p])),
                          cpu_hsum8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[p]), 1)))};
            #pragma GCC unroll 8
            for (int h = 0; h < 2; h++) {
                const float *kr = k0 + (size_t)(2 * p + h) * ldk;
                for (int jj = j; jj < n; jj++) s[h] += q[jj] * kr[jj];
                out[i + 2 * p + h] = s[h];
            }
        }
    }
    if (i < m) dot_rows_avx2(out + i, q, k + (size_t)i * ldk, ldk, m - i, n);
}

/* dot_rows_avx512 for Q <= 4 queries against the same m rows: each 8-row
 * block's K chunks are loaded once for the Q queries (16 accumulators), and
 * every (query, row) dot is dot_rows_avx512's chain and reduction, so the
 * same bits. n % 8 == 0 (the caller sends the rest to the one-query kernel). */
AVX2 static void widen_avx2(float *w, const uint16_t *h, size_t n);

AVX512_INLINE __m512 kpair_avx512(const void *k, int kb, size_t a, size_t b) {
    if (kb) { /* two rows' 8 bf16 widened exactly, as cpu_kv_rows would */
        const uint16_t *h = k;
        __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(h + a))),
                                            _mm_loadu_si128((const __m128i *)(h + b)), 1);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
    }
    const float *f = k;
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(f + a))),
                                               _mm256_castps_pd(_mm256_loadu_ps(f + b)), 1));
}

AVX512_INLINE void dot_rows_q_avx512(int Q, int kb, float *const *out, const float *const *q, const void *k,
                                     size_t ldk, int m, int n) {
    int i = 0;
    for (; i + 8 <= m; i += 8) {
        size_t k0 = (size_t)i * ldk;
        __m512 acc[4][4];
        #pragma GCC unroll 4
        for (int e = 0; e < Q; e++)
            #pragma GCC unroll 4
            for (int p = 0; p < 4; p++) acc[e][p] = _mm512_setzero_ps();
        for (int j = 0; j < n; j += 8) {
            __m512 kv[4];
            #pragma GCC unroll 4
            for (int p = 0; p < 4; p++) kv[p] = kpair_avx512(k, kb, k0 + (size_t)(2 * p) * ldk + j, k0 + (size_t)(2 * p + 1) * ldk + j);
            #pragma GCC unroll 4
            for (int e = 0; e < Q; e++) {
                __m512 qv = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(q[e] + j))));
                #pragma GCC unroll 4
                for (int p = 0; p < 4; p++) acc[e][p] = _mm512_fmadd_ps(qv, kv[p], acc[e][p]);
            }
        }
        #pragma GCC unroll 4
        for (int e = 0; e < Q; e++) {
            __m512 t[4];
            #pragma GCC unroll 4
            for (int p = 0; p < 4; p++)
                t[p] = _mm512_add_ps(acc[e][p], _mm512_shuffle_f32x4(acc[e][p], acc[e][p], _MM_SHUFFLE(2, 3, 0, 1)));
            #pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m512 u = _mm512_shuffle_f32x4(t[2 * h], t[2 * h + 1], _MM_SHUFFLE(2, 0, 2, 0));
                u = _mm512_add_ps(u, _mm512_permute_ps(u, _MM_SHUFFLE(1, 0, 3, 2)));
                u = _mm512_add_ps(u, _mm512_permute_ps(u, _MM_SHUFFLE(2, 3, 0, 1)));
                _mm512_mask_compressstoreu_ps(out[e] + i + 4 * h, 0x1111, u);
            }
        }
    }
    if (i == m) return;
    if (!kb) {
        for (int e = 0; e < Q; e++) dot_rows_avx2(out[e] + i, q[e], (const float *)k + (size_t)i * ldk, ldk, m - i, n);
        return;
    }
    float w[7 * 256]; /* the last m - i < 8 rows widened (n <= 256: the caller checks) */
    for (int r = i; r < m; r++) widen_avx2(w + (size_t)(r - i) * n, (const uint16_t *)k + (size_t)r * ldk, (size_t)n);
    for (int e = 0; e < Q; e++) dot_rows_avx2(out[e] + i, q[e], w, (size_t)n, m - i, n);
}

/* axpy_rows_avx512 for Q <= 2 outputs over the same m rows of x: each row
 * chunk is loaded once for both; per output the same FMAs in the same order. */
AVX512_INLINE __m512 x16_avx512(const void *x, int kb, size_t o) {
    if (kb) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
                   (const __m256i *)((const uint16_t *)x + o))), 16));
    return _mm512_loadu_ps((const float *)x + o);
}

AVX512_INLINE void axpy_rows_q_avx512(int Q, int kb, float *const *y, const float *const *a, const void *x,
                                      size_t ldx, int m, int n) {
    for (int d = 0; d < n; d += 128) {
        __m512 acc[2][8];
        #pragma GCC unroll 2
        for (int e = 0; e < Q; e++)
            #pragma GCC unroll 8
            for (int c = 0; c < 8; c++) acc[e][c] = _mm512_loadu_ps(y[e] + d + 16 * c);
        for (int i = 0; i < m; i++) {
            size_t xi = (size_t)i * ldx + d;
            __m512 av[2];
            #pragma GCC unroll 2
            for (int e = 0; e < Q; e++) av[e] = _mm512_set1_ps(a[e][i]);
            #pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                __m512 xv = x16_avx512(x, kb, xi + 16 * (size_t)c);
                #pragma GCC unroll 2
                for (int e = 0; e < Q; e++) acc[e][c] = _mm512_fmadd_ps(av[e], xv, acc[e][c]);
            }
        }
        #pragma GCC unroll 2
        for (int e = 0; e < Q; e++)
            #pragma GCC unroll 8
            for (int c = 0; c < 8; c++) _mm512_storeu_ps(y[e] + d + 16 * c, acc[e][c]);
    }
}

AVX512 static void dot_rows_multi_avx512(float *const *out, const float *const *q, int nq, const void *k, int kb,
                                         size_t ldk, int m, int n) {
#define DQ(QQ) kb ? dot_rows_q_avx512(QQ, 1, out + e, q + e, k, ldk, m, n) : dot_rows_q_avx512(QQ, 0, out + e, q + e, k, ldk, m, n)
    for (int e = 0; e < nq; e += 4) switch (nq - e < 4 ? nq - e : 4) {
        case 4: DQ(4); break;
        case 3: DQ(3); break;
        case 2: DQ(2); break;
        default: DQ(1); break;
        }
#undef DQ
}

AVX512 static void axpy_rows_multi_avx512(float *const *y, const float *const *a, int nq, const void *x, int kb,
                                          size_t ldx, int m, int n) {
    int e = 0;
    for (; e + 2 <= nq; e += 2)
        if (kb) axpy_rows_q_avx512(2, 1, y + e, a + e, x, ldx, m, n);
        else axpy_rows_q_avx512(2, 0, y + e, a + e, x, ldx, m, n);
    if (e < nq) {
        if (kb) axpy_rows_q_avx512(1, 1, y + e, a + e, x, ldx, m, n);
        else axpy_rows_q_avx512(1, 0, y + e, a + e, x, ldx, m, n);
    }
}

/* As axpy_rows_avx2 with 128 floats of y in eight zmm. */
AVX512 static void axpy_rows_avx512(float *y, const float *a, const float *x, size_t ldx, int m, int n) {
    int d = 0;
    for (; d + 128 <= n; d += 128) {
        __m512 acc[8];
        #pragma GCC unroll 8
        for (int c = 0; c < 8; c++) acc[c] = _mm512_loadu_ps(y + d + 16 * c);
        for (int i = 0; i < m; i++) {
            __m512 av = _mm512_set1_ps(a[i]);
            const float *xi = x + (size_t)i * ldx + d;
            #pragma GCC unroll 8
            for (int c = 0; c < 8; c++) acc[c] = _mm512_fmadd_ps(av, _mm512_loadu_ps(xi + 16 * c), acc[c]);
        }
        #pragma GCC unroll 8
        for (int c = 0; c < 8; c++) _mm512_storeu_ps(y + d + 16 * c, acc[c]);
    }
    if (d < n) axpy_rows_avx2(y + d, a, x + d, ldx, m, n - d);
}
#endif /* CPU_OPS_X86 */

/* ---------------- portable path ---------------- */

static void matmul_portable(float *out, int ldo, const float *x, int ldx, int n, const uint16_t *w,
                            int K, int r0, int r1) {
    for (int t = 0; t < n; t++)
        for (int r = r0; r < r1; r++) {
            const uint16_t *wr = w + (size_t)r * K;
            const float *xt = x + (size_t)t * ldx;
            float acc[8] = {0};
            int k = 0;
            for (; k + 8 <= K; k += 8)
                for (int j = 0; j < 8; j++) acc[j] = fmaf(bf16_to_f32(wr[k + j]), xt[k + j], acc[j]);
            float s = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
            for (; k < K; k++) s = fmaf(bf16_to_f32(wr[k]), xt[k], s);
            out[(size_t)t * ldo + r] = s;
        }
}

/* ---------------- public ops ---------------- */

void cpu_matmul_rows(float *out, int ldo, const float *x, int ldx, int n, const WeightMat *w,
                     const uint16_t *bias, int r0, int r1) {
    if (n < 1) return; /* an empty batch writes nothing (the SIMD paths' tiles hold >= 1 token) */
    if (!g_init) cpu_ops_init();
    CpuMatmulFn fn = matmul_portable;
#ifdef CPU_OPS_X86
    if (g_path == CPU_PATH_AVX2_V0) fn = matmul_avx2_v0;
    else if (g_path == CPU_PATH_AVX2) fn = cpu_matmul_avx2;
    else if (g_path == CPU_PATH_AVX512) fn = cpu_matmul_avx512;
#endif
    fn(out, ldo, x, ldx, n, w->bf16, w->cols, r0, r1);
    if (bias)
        for (int t = 0; t < n; t++)
            for (int r = r0; r < r1; r++) out[(size_t)t * ldo + r] += bf16_to_f32(bias[r]);
}

/* The one test of "vdpbf16ps runs cpu_matmul_rows_bf16 here". */
static inline int bf16_native(void) { return g_path == CPU_PATH_AVX512 && g_bf16dot; }

int cpu_ops_bf16_native(void) {
    cpu_ops_init();
    return bf16_native();
}

void cpu_act_to_bf16(uint16_t *dst, const float *src, size_t n) {
    if (!g_init) cpu_ops_init();
#ifdef CPU_OPS_X86
    if (bf16_native()) cpu_act_to_bf16_avx512bf16(dst, src, n);
    else if (g_path != CPU_PATH_PORTABLE) cpu_act_to_bf16_avx2(dst, src, n);
    else
#endif
        cpu_act_to_bf16_portable(dst, src, n);
}

void cpu_matmul_rows_bf16(float *out, int ldo, const uint16_t *x, int ldx, int n, const WeightMat *w,
                          const uint16_t *bias, int r0, int r1) {
    if (n < 1) return; /* as cpu_matmul_rows */
    if (!g_init) cpu_ops_init();
    CpuMatmulBf16Fn fn = cpu_matmul_bf16_portable;
#ifdef CPU_OPS_X86
    if (bf16_native()) fn = cpu_matmul_bf16_avx512bf16;
    else if (g_path != CPU_PATH_PORTABLE) fn = cpu_matmul_bf16_avx2;
#endif
    fn(out, ldo, x, ldx, n, w->bf16, w->cols, r0, r1);
    if (bias)
        for (int t = 0; t < n; t++)
            for (int r = r0; r < r1; r++) out[(size_t)t * ldo + r] += bf16_to_f32(bias[r]);
}

float cpu_dot(const float *a, const float *b, int n) {
#ifdef CPU_OPS_X86
    if (use_avx2()) return dot_avx2(a, b, n);
#endif
    float s = 0.f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

void cpu_axpy(float *y, float a, const float *x, int n) {
#ifdef CPU_OPS_X86
    if (use_avx2()) { axpy_avx2(y, a, x, n); return; }
#endif
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

void cpu_dot_rows(float *out, const float *q, const float *k, size_t ldk, int m, int n) {
#ifdef CPU_OPS_X86
    if (use_avx2()) {
        if (g_path == CPU_PATH_AVX512) dot_rows_avx512(out, q, k, ldk, m, n);
        else dot_rows_avx2(out, q, k, ldk, m, n);
        return;
    }
#endif
    for (int i = 0; i < m; i++) out[i] = cpu_dot(q, k + (size_t)i * ldk, n);
}

void cpu_dot_rows_multi(float *const *out, const float *const *q, int nq, const float *k, size_t ldk, int m, int n) {
#ifdef CPU_OPS_X86
    if (use_avx2() && g_path == CPU_PATH_AVX512 && n % 8 == 0 && m >= 8) {
        dot_rows_multi_avx512(out, q, nq, k, 0, ldk, m, n);
        return;
    }
#endif
    for (int e = 0; e < nq; e++) cpu_dot_rows(out[e], q[e], k, ldk, m, n);
}

void cpu_axpy_rows_multi(float *const *y, const float *const *a, int nq, const float *x, size_t ldx, int m, int n) {
    int e = 0;
#ifdef CPU_OPS_X86
    if (use_avx2() && g_path == CPU_PATH_AVX512 && n % 128 == 0) {
        axpy_rows_multi_avx512(y, a, nq, x, 0, ldx, m, n);
        return;
    }
    if (use_avx2() && g_path != CPU_PATH_AVX512) e = axpy_rows_multi_avx2(y, a, nq, x, ldx, m, n);
#endif
    for (; e < nq; e++) cpu_axpy_rows(y[e], a[e], x, ldx, m, n);
}

int cpu_kv_bf16_direct(int n) {
    if (!g_init) cpu_ops_init();
#ifdef CPU_OPS_X86
    return use_avx2() && g_path == CPU_PATH_AVX512 && n % 128 == 0 && n <= 256;
#else
    (void)n;
    return 0;
#endif
}

void cpu_dot_rows_multi_bf16(float *const *out, const float *const *q, int nq, const uint16_t *k, size_t ldk, int m,
                             int n) {
    ASSERT(cpu_kv_bf16_direct(n), "cpu_dot_rows_multi_bf16 on a path without it (n %d)", n);
#ifdef CPU_OPS_X86
    dot_rows_multi_avx512(out, q, nq, k, 1, ldk, m, n);
#else
    (void)out, (void)q, (void)nq, (void)k, (void)ldk, (void)m;
#endif
}

void cpu_axpy_rows_multi_bf16(float *const *y, const float *const *a, int nq, const uint16_t *x, size_t ldx, int m,
                              int n) {
    ASSERT(cpu_kv_bf16_direct(n), "cpu_axpy_rows_multi_bf16 on a path without it (n %d)", n);
#ifdef CPU_OPS_X86
    axpy_rows_multi_avx512(y, a, nq, x, 1, ldx, m, n);
#else
    (void)y, (void)a, (void)nq, (void)x, (void)ldx, (void)m;
#endif
}

void cpu_axpy_rows(float *y, const float *a, const float *x, size_t ldx, int m, int n) {
#ifdef CPU_OPS_X86
    if (use_avx2()) {
        if (g_path == CPU_PATH_AVX512) axpy_rows_avx512(y, a, x, ldx, m, n);
        else axpy_rows_avx2(y, a, x, ldx, m, n);
        return;
    }
#endif
    for (int i = 0; i < m; i++) cpu_axpy(y, a[i], x + (size_t)i * ldx, n);
}

void cpu_rmsnorm(float *out, const float *x, const uint16_t *w, int n, int dim, float eps) {
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * dim;
        float *ot = out + (size_t)t * dim;
        float ss = cpu_dot(xt, xt, dim);
        float scale = 1.0f / sqrtf(ss / (float)dim + eps);
        for (int i = 0; i < dim; i++) ot[i] = bf16_to_f32(w[i]) * (xt[i] * scale);
    }
}

void cpu_rope(float *x, const float *cs, const float *sn, int head_dim) {
    int h = head_dim / 2;
    for (int i = 0; i < h; i++) {
        float a = x[i], b = x[i + h];
        x[i] = a * cs[i] - b * sn[i];
        x[i + h] = b * cs[i] + a * sn[i];
    }
}

void cpu_rope_inv_freq(float *inv_freq, int head_dim, float theta, int llama3, float factor,
                       float low_ff, float high_ff, int orig_max_pos) {
    for (int i = 0; i < head_dim / 2; i++) {
        float f = 1.0f / powf(theta, (float)(2 * i) / (float)head_dim);
        if (llama3) {
            float low_wavelen = (float)orig_max_pos / low_ff, high_wavelen = (float)orig_max_pos / high_ff;
            float wavelen = 2.0f * (float)M_PI / f;
            if (wavelen > low_wavelen) f = f / factor;
            else if (!(wavelen < high_wavelen)) {
                float smooth = ((float)orig_max_pos / wavelen - low_ff) / (high_ff - low_ff);
                f = (1.0f - smooth) * f / factor + smooth * f;
            }
        }
        inv_freq[i] = f;
    }
}

/* exp_poly (exp_poly.h): the vector forms below run its operations lane by lane. */
float cpu_expf(float x) { return exp_poly(x); }

#ifdef CPU_OPS_X86
AVX512_INLINE __m512 expf_avx512(__m512 x) {
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), lo = _mm512_cmp_ps_mask(x, _mm512_set1_ps(EXP_LO), _CMP_LT_OQ),
              hi = _mm512_cmp_ps_mask(x, _mm512_set1_ps(EXP_HI), _CMP_GT_OQ);
    __m512 c = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(EXP_LO)), _mm512_set1_ps(EXP_HI));
    __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(c, _mm512_set1_ps(EXP_LOG2E), _mm512_set1_ps(0.5f)),
                                    _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-EXP_C1), c);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-EXP_C2), r);
    __m512 z = _mm512_mul_ps(r, r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(EXP_P0), r, _mm512_set1_ps(EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P5));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, z, r), _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_cvtps_epi32(n), 23);
    y = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(y), e));
    y = _mm512_mask_mov_ps(y, lo, _mm512_setzero_ps());
    y = _mm512_mask_mov_ps(y, hi, _mm512_set1_ps(INFINITY));
    return _mm512_mask_add_ps(y, nan, x, x);
}

AVX2_INLINE __m256 expf_avx2(__m256 x) {
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q), lo = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_LO), _CMP_LT_OQ),
           hi = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_HI), _CMP_GT_OQ);
    __m256 c = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(EXP_LO)), _mm256_set1_ps(EXP_HI));
    __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(c, _mm256_set1_ps(EXP_LOG2E), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-EXP_C1), c);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-EXP_C2), r);
    __m256 z = _mm256_mul_ps(r, r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(EXP_P0), r, _mm256_set1_ps(EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P5));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, z, r), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    y = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(y), e));
    y = _mm256_andnot_ps(lo, y);
    y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), hi);
    return _mm256_blendv_ps(y, _mm256_add_ps(x, x), nan);
}

/* Lanes [i, min(i + 16, n)): one loop, the tail masked. */
AVX512_INLINE __mmask16 lanes16(int i, int n) { return n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1); }

AVX512 static void exp_shift_avx512(float *out, const float *s, int n, float mx) {
    __m512 m = _mm512_set1_ps(mx);
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = lanes16(i, n);
        _mm512_mask_storeu_ps(out + i, k, expf_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + i), m)));
    }
}

AVX2 static void exp_shift_avx2(float *out, const float *s, int n, float mx) {
    __m256 m = _mm256_set1_ps(mx);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, expf_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + i), m)));
    for (; i < n; i++) out[i] = cpu_expf(s[i] - mx);
}

AVX512 static void swiglu_avx512(float *out, const float *gate, const float *up, int n) {
    __m512 one = _mm512_set1_ps(1.0f);
    __m512i neg = _mm512_set1_epi32(INT32_MIN); /* -g: the sign flipped, as in C */
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = lanes16(i, n);
        __m512 g = _mm512_maskz_loadu_ps(k, gate + i);
        __m512 e = expf_avx512(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(g), neg)));
        _mm512_mask_storeu_ps(out + i, k,
                              _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), _mm512_maskz_loadu_ps(k, up + i)));
    }
}

AVX2 static void swiglu_avx2(float *out, const float *gate, const float *up, int n) {
    __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 e = expf_avx2(_mm256_xor_ps(g, neg));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
    }
    for (; i < n; i++) out[i] = (gate[i] / (1.0f + cpu_expf(-gate[i]))) * up[i];
}
#endif

#ifdef CPU_OPS_X86
AVX512 static float scale_max_avx512(float *s, int n, float c) {
    __m512 k = _mm512_set1_ps(c), m = _mm512_set1_ps(-INFINITY);
    for (int i = 0; i < n; i += 16) {
        __mmask16 l = lanes16(i, n);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(l, s + i), k);
        _mm512_mask_storeu_ps(s + i, l, v);
        m = _mm512_mask_max_ps(m, l, v, m); /* v > m ? v : m: a NaN lane keeps m */
    }
    return _mm512_reduce_max_ps(m);
}

AVX2 static float scale_max_avx2(float *s, int n, float c) {
    __m256 k = _mm256_set1_ps(c), m = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(s + i), k);
        _mm256_storeu_ps(s + i, v);
        m = _mm256_max_ps(v, m);
    }
    float b[8], mx = -INFINITY;
    _mm256_storeu_ps(b, m);
    for (int j = 0; j < 8; j++) mx = b[j] > mx ? b[j] : mx;
    for (; i < n; i++) {
        s[i] = s[i] * c;
        if (s[i] > mx) mx = s[i];
    }
    return mx;
}

AVX512 static void scale_avx512(float *s, int n, float c) {
    __m512 k = _mm512_set1_ps(c);
    for (int i = 0; i < n; i += 16) {
        __mmask16 l = lanes16(i, n);
        _mm512_mask_storeu_ps(s + i, l, _mm512_mul_ps(_mm512_maskz_loadu_ps(l, s + i), k));
    }
}

AVX2 static void scale_avx2(float *s, int n, float c) {
    __m256 k = _mm256_set1_ps(c);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(s + i, _mm256_mul_ps(_mm256_loadu_ps(s + i), k));
    for (; i < n; i++) s[i] = s[i] * c;
}
#endif

float cpu_scale_max(float *s, int n, float c) {
#ifdef CPU_OPS_X86
    if (use_avx2()) return g_path == CPU_PATH_AVX512 ? scale_max_avx512(s, n, c) : scale_max_avx2(s, n, c);
#endif
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) {
        s[i] = s[i] * c;
        if (s[i] > mx) mx = s[i];
    }
    return mx;
}

void cpu_scale(float *s, int n, float c) {
#ifdef CPU_OPS_X86
    if (use_avx2()) {
        if (g_path == CPU_PATH_AVX512) scale_avx512(s, n, c);
        else scale_avx2(s, n, c);
        return;
    }
#endif
    for (int i = 0; i < n; i++) s[i] = s[i] * c;
}

void cpu_exp_shift_to(float *out, const float *s, int n, float mx) {
#ifdef CPU_OPS_X86
    if (use_avx2()) {
        if (g_path == CPU_PATH_AVX512) exp_shift_avx512(out, s, n, mx);
        else exp_shift_avx2(out, s, n, mx);
        return;
    }
#endif
    for (int i = 0; i < n; i++) out[i] = cpu_expf(s[i] - mx);
}

void cpu_exp_shift(float *s, int n, float mx) { cpu_exp_shift_to(s, s, n, mx); }

void cpu_swiglu(float *out, const float *gate, const float *up, int n) {
#ifdef CPU_OPS_X86
    if (use_avx2()) {
        if (g_path == CPU_PATH_AVX512) swiglu_avx512(out, gate, up, n);
        else swiglu_avx2(out, gate, up, n);
        return;
    }
#endif
    for (int i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = (g / (1.0f + cpu_expf(-g))) * up[i];
    }
}

void cpu_add(float *x, const float *y, int n) {
    for (int i = 0; i < n; i++) x[i] += y[i];
}

void cpu_embed(float *out, const uint16_t *emb, int token, int dim) {
    const uint16_t *row = emb + (size_t)token * dim;
    for (int i = 0; i < dim; i++) out[i] = bf16_to_f32(row[i]);
}

/* BF16 storage: a row of A (and a chunk of a row of B) is widened exactly into
 * a stack buffer first, so the arithmetic is the f32 path's on the same
 * values: bf16 storage gives the bits of f32 storage of the bf16-rounded
 * adapter. B's rows go in chunks of LORA_WIDEN (a multiple of 8, so cpu_axpy
 * takes the same elements on its vector and scalar paths as unchunked). */
#define LORA_WIDEN 1024
#ifdef CPU_OPS_X86
AVX2 static void widen_avx2(float *w, const uint16_t *h, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + i)));
        _mm256_storeu_ps(w + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    for (; i < n; i++) w[i] = bf16_to_f32(h[i]);
}
#endif
void cpu_bf16_to_f32(float *dst, const uint16_t *src, size_t n) {
#ifdef CPU_OPS_X86
    if (use_avx2()) {
        widen_avx2(dst, src, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(src[i]);
}
static const float *lora_widen(float *w, const void *src, size_t off, int n) {
    cpu_bf16_to_f32(w, (const uint16_t *)src + off, (size_t)n);
    return w;
}

void cpu_lora_row(float *out, const float *x, const LoraPair *p) {
    float h[LORA_MAX_RANK];
    if (!p->bf16) {
        const float *a = p->a, *b = p->b;
        for (int j = 0; j < p->rank; j++) h[j] = p->scale * cpu_dot(a + (size_t)j * p->in, x, p->in);
        for (int j = 0; j < p->rank; j++) cpu_axpy(out, h[j], b + (size_t)j * p->out, p->out);
        return;
    }
    float w[LORA_BF16_MAX_IN];
    ASSERT(p->in <= LORA_BF16_MAX_IN, "BF16 LoRA in-features %d above %d (lora.c refuses those)", p->in,
           LORA_BF16_MAX_IN);
    for (int j = 0; j < p->rank; j++) h[j] = p->scale * cpu_dot(lora_widen(w, p->a, (size_t)j * p->in, p->in), x, p->in);
    for (int j = 0; j < p->rank; j++)
        for (int o = 0; o < p->out; o += LORA_WIDEN) {
            int k = p->out - o < LORA_WIDEN ? p->out - o : LORA_WIDEN;
            cpu_axpy(out + o, h[j], lora_widen(w, p->b, (size_t)j * p->out + o, k), k);
        }
}

void cpu_lora_rows(float *out, const float *x, const int *rows, int n, const LoraPair *p) {
    if (!p->bf16 || n == 1) {
        for (int r = 0; r < n; r++) cpu_lora_row(out + (size_t)rows[r] * p->out, x + (size_t)rows[r] * p->in, p);
        return;
    }
    /* cpu_lora_row's operations on each row in the same order, each widened row of A and chunk of B
     * shared by the n rows */
    ASSERT(n <= CPU_LORA_ROWS_MAX && p->in <= LORA_BF16_MAX_IN, "cpu_lora_rows: %d rows, %d in-features", n, p->in);
    float w[LORA_BF16_MAX_IN], h[CPU_LORA_ROWS_MAX][LORA_MAX_RANK];
    for (int j = 0; j < p->rank; j++) {
        lora_widen(w, p->a, (size_t)j * p->in, p->in);
        for (int r = 0; r < n; r++) h[r][j] = p->scale * cpu_dot(w, x + (size_t)rows[r] * p->in, p->in);
    }
    for (int j = 0; j < p->rank; j++)
        for (int o = 0; o < p->out; o += LORA_WIDEN) {
            int k = p->out - o < LORA_WIDEN ? p->out - o : LORA_WIDEN;
            lora_widen(w, p->b, (size_t)j * p->out + o, k);
            for (int r = 0; r < n; r++) cpu_axpy(out + (size_t)rows[r] * p->out + o, h[r][j], w, k);
        }
}
