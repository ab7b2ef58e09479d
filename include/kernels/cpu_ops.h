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

#include <stdint.h>

#include "weights.h"

/* Chooses the AVX2+FMA kernels when the CPU has them (call once at start-up;
 * also called lazily). Returns the name of the chosen path. */
const char *cpu_ops_init(void);

/* out[n, dim] = x[n, dim] * rsqrt(mean(x^2) + eps) * w[dim] (bf16). out may alias x. */
void cpu_rmsnorm(float *out, const float *x, const uint16_t *w, int n, int dim, float eps);

/* out[t, r] = sum_k x[t, k] * W[r, k] (+ bias[r]) for t in [0, n), r in [r0, r1).
 * x: [n, w->cols] f32, row stride ldx; out: row stride ldo; W bf16 [rows, cols]. */
void cpu_matmul_rows(float *out, int ldo, const float *x, int ldx, int n, const WeightMat *w,
                     const uint16_t *bias, int r0, int r1);

/* dot of two f32 vectors of length n, fixed order. */
float cpu_dot(const float *a, const float *b, int n);
/* y[n] += a * x[n] */
void cpu_axpy(float *y, float a, const float *x, int n);

/* One row of the batched LoRA (backend.h, Backend.lora): h[j] = scale *
 * (A[j] . x) (cpu_dot over in), then out += h[j] * B^T[j] for j in order
 * (cpu_axpy over out). The same operations in the same order whatever else is
 * in the batch. */
struct LoraPair;
void cpu_lora_row(float *out, const float *x, const struct LoraPair *p);

/* Rotary embedding in place on one head vector x[head_dim] (HF rotate_half
 * layout: pairs (i, i + head_dim/2)); cs/sn: [head_dim/2] for its position. */
void cpu_rope(float *x, const float *cs, const float *sn, int head_dim);
/* inv_freq[head_dim/2] per HF (default or llama3 scaling). */
void cpu_rope_inv_freq(float *inv_freq, int head_dim, float theta, int llama3, float factor,
                       float low_ff, float high_ff, int orig_max_pos);

/* out[n] = silu(gate[n]) * up[n] */
void cpu_swiglu(float *out, const float *gate, const float *up, int n);
/* x[n] += y[n] */
void cpu_add(float *x, const float *y, int n);
/* out[dim] = embedding row (bf16 -> f32) */
void cpu_embed(float *out, const uint16_t *emb, int token, int dim);

#endif
