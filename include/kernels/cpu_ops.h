/*
 * cpu_ops.h - the CPU reference ops of the forward pass. The CPU backend
 * runs them; the CUDA kernels are tested against them. All activations are
 * f32; weights are bf16 (quantized formats go through quant.h).
 *
 * Batch invariance contract: every output element is computed by the same
 * sequence of floating-point operations whatever the number of tokens, the
 * tile a token lands in, or the thread that runs it.
 */
#ifndef SAMPLER_CPU_OPS_H
#define SAMPLER_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "weights.h"

/* Chooses the fastest matmul path the CPU has (cpuid at run time; call once
 * at start-up, also called lazily). Returns the name of the chosen path. */
const char *cpu_ops_init(void);

/* The matmul paths. Every path computes each output element in the same
 * reference order, so all of them give the same bits (tests/test_cpu_paths.c
 * checks it on every path the machine can run):
 *   acc[j] = fma(W[r, k], x[t, k], acc[j]) for k = j, j + 8, ... (j < 8, k < K & ~7),
 *   s = ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7)),
 *   s = fma(W[r, k], x[t, k], s) for the K % 8 tail, then + bias[r].
 * AVX2_V0 is the AVX2 kernel as it was before issue #23, kept as the
 * reference the benchmarks measure the others against. Choosing a path also
 * chooses the FP8 matmul kernels of the same name (quant.h QuantPath). */
typedef enum CpuPath {
    CPU_PATH_PORTABLE, /* plain C (fmaf); the aarch64 path */
    CPU_PATH_AVX2_V0,  /* AVX2+FMA, the old kernel: 4-row decode, 2x4 tiles */
    CPU_PATH_AVX2,     /* AVX2+FMA, packed panels, 3x4 tiles */
    CPU_PATH_AVX512,   /* AVX-512F: two rows per zmm, 8x6 tiles */
    CPU_PATH_COUNT
} CpuPath;

/* 1 when this CPU (and build) can run path p. */
int cpu_ops_path_available(CpuPath p);
const char *cpu_ops_path_name(CpuPath p);
/* The path in use. */
CpuPath cpu_ops_path(void);
/* Forces path p (tests and benchmarks; also SAMPLER_CPU_PATH=name at start-up).
 * Not to be called while a matmul runs. Returns 0, or -1 when p is not
 * available here (the path in use is then unchanged). */
int cpu_ops_force_path(CpuPath p);

/* Rows per matmul task for a bf16 [rows, K] weight: about 64 KB of weights,
 * a multiple of 16 rows (64-byte output lines: no two tasks write one line). */
int cpu_matmul_task_rows(int K);

/* out[n, dim] = x[n, dim] * rsqrt(mean(x^2) + eps) * w[dim] (bf16). out may alias x. */
void cpu_rmsnorm(float *out, const float *x, const uint16_t *w, int n, int dim, float eps);

/* out[t, r] = sum_k x[t, k] * W[r, k] (+ bias[r]) for t in [0, n), r in [r0, r1).
 * x: [n, w->cols] f32, row stride ldx; out: row stride ldo; W bf16 [rows, cols]. */
void cpu_matmul_rows(float *out, int ldo, const float *x, int ldx, int n, const WeightMat *w,
                     const uint16_t *bias, int r0, int r1);

/* BF16 activations (--dtype bfloat16): dst[i] = src[i] rounded to bf16, to
 * nearest even, a subnormal to a zero of its sign, NaN to a quiet NaN (what
 * AVX512_BF16's vcvtneps2bf16 gives, checked over all 2^32 inputs). */
void cpu_act_to_bf16(uint16_t *dst, const float *src, size_t n);
/* cpu_matmul_rows with x already bf16 (cpu_act_to_bf16) [n, w->cols], row
 * stride ldx. Reference order (vdpbf16ps' own, so a CPU with AVX512_BF16 runs
 * it natively and every other path emulates it bit for bit; tests/test_cpu_paths.c):
 *   acc[j], j < 16; per 32-wide step k0 < K & ~31:
 *     acc[j] = F(W[r, k0+2j+1] x[t, k0+2j+1] + acc[j]), then the same with k0+2j,
 *   v[j] = F(acc[j] + acc[j+8]) (j < 8), s = the f32 path's tree over v (each add F),
 *   s = F(W[r, k] x[t, k] + s) for the K % 32 tail, then + bias[r];
 * F: one FMA or add rounded to nearest even, a subnormal result flushed to a
 * zero of its sign; a subnormal bf16 input reads as a zero of its sign. */
void cpu_matmul_rows_bf16(float *out, int ldo, const uint16_t *x, int ldx, int n, const WeightMat *w,
                          const uint16_t *bias, int r0, int r1);
/* 1 when cpu_matmul_rows_bf16 runs on vdpbf16ps (the AVX-512 path on a CPU
 * with AVX512_BF16 whose instruction passed the start-up check). */
int cpu_ops_bf16_native(void);

/* dot of two f32 vectors of length n, fixed order. */
float cpu_dot(const float *a, const float *b, int n);
/* y[n] += a * x[n] */
void cpu_axpy(float *y, float a, const float *x, int n);
/* out[i] = cpu_dot(q, k + i * ldk, n) for i < m, the same bits, several rows at once. */
void cpu_dot_rows(float *out, const float *q, const float *k, size_t ldk, int m, int n);
/* cpu_axpy(y, a[i], x + i * ldx, n) for i = 0 .. m-1 in order, the same bits, y kept in registers. */
void cpu_axpy_rows(float *y, const float *a, const float *x, size_t ldx, int m, int n);
/* cpu_dot_rows(out[e], q[e], k, ldk, m, n) for e < nq, the same bits, each chunk of k loaded once for
 * several queries (attention: the queries of a tile that see the same rows). */
void cpu_dot_rows_multi(float *const *out, const float *const *q, int nq, const float *k, size_t ldk, int m, int n);
/* cpu_axpy_rows(y[e], a[e], x, ldx, m, n) for e < nq, the same bits, each row of x loaded once for two. */
void cpu_axpy_rows_multi(float *const *y, const float *const *a, int nq, const float *x, size_t ldx, int m, int n);
/* The two above on BF16 rows read in place (BF16 KV cache), widened exactly in registers: the bits of
 * widening the rows to f32 first. Only where cpu_kv_bf16_direct(n) (the avx512 path, n = 128 or 256). */
int cpu_kv_bf16_direct(int n);
void cpu_dot_rows_multi_bf16(float *const *out, const float *const *q, int nq, const uint16_t *k, size_t ldk, int m,
                             int n);
void cpu_axpy_rows_multi_bf16(float *const *y, const float *const *a, int nq, const uint16_t *x, size_t ldx, int m,
                              int n);

/* One row of the batched LoRA (backend.h, Backend.lora): h[j] = scale *
 * (A[j] . x) (cpu_dot over in), then out += h[j] * B^T[j] for j in order
 * (cpu_axpy over out). The same operations in the same order whatever else is
 * in the batch. */
struct LoraPair;
void cpu_lora_row(float *out, const float *x, const struct LoraPair *p);
/* dst[i] = the f32 value of bf16 src[i], i < n (exact; AVX2 where the CPU has it). */
void cpu_bf16_to_f32(float *dst, const uint16_t *src, size_t n);
/* cpu_lora_row on rows[0..n) of out [., p->out] and x [., p->in] (n <= CPU_LORA_ROWS_MAX), the same bits
 * per row; BF16 pairs widen each row of A and chunk of B once for the n rows. */
#define CPU_LORA_ROWS_MAX 8
void cpu_lora_rows(float *out, const float *x, const int *rows, int n, const struct LoraPair *p);

/* MoE routing (backend.h MoeRouteArgs, Backend.moe_route) on host memory: the
 * reference the device kernels are checked against (kernels/cpu/cpu_moe.c). */
struct MoeRouteArgs;
void cpu_moe_route(const struct MoeRouteArgs *a);

/* Rotary embedding in place on one head vector x[head_dim] (HF rotate_half
 * layout: pairs (i, i + head_dim/2)); cs/sn: [head_dim/2] for its position. */
void cpu_rope(float *x, const float *cs, const float *sn, int head_dim);
/* inv_freq[head_dim/2] per HF (default or llama3 scaling). */
void cpu_rope_inv_freq(float *inv_freq, int head_dim, float theta, int llama3, float factor,
                       float low_ff, float high_ff, int orig_max_pos);

/* exp(x) in float as the project defines it: exp_poly (exp_poly.h), within 2
 * ulp of exp, not libm's expf. The AVX2 and AVX-512 forms of cpu_exp_shift and
 * cpu_swiglu run the same operations lane by lane, so every path gives these
 * bits. */
float cpu_expf(float x);
/* s[i] = s[i] * c for i < n; returns the largest s[i] (NaNs skipped; -inf if
 * none): the softmax's scale and max. Which zero it returns when the largest
 * value is a zero of both signs depends on the path; s[i] - mx, and so every
 * exponential, does not. */
float cpu_scale_max(float *s, int n, float c);
/* s[i] = s[i] * c for i < n. */
void cpu_scale(float *s, int n, float c);
/* s[i] = cpu_expf(s[i] - mx) for i < n: the softmax's exponentials. */
void cpu_exp_shift(float *s, int n, float mx);
/* out[i] = cpu_expf(s[i] - mx) for i < n (out may be s): the sampler's (sampling.h). */
void cpu_exp_shift_to(float *out, const float *s, int n, float mx);
/* out[n] = (gate / (1 + cpu_expf(-gate))) * up, per element in that order */
void cpu_swiglu(float *out, const float *gate, const float *up, int n);
/* x[n] += y[n] */
void cpu_add(float *x, const float *y, int n);
/* out[dim] = embedding row (bf16 -> f32) */
void cpu_embed(float *out, const uint16_t *emb, int token, int dim);

#endif
