/*
 * rmsnorm_device.cuh - the RMSNorm of a row as one block of RMS_THREADS
 * threads computes it, optionally after the residual add (x += y), and
 * optionally writing the tensor-core FP8 / NVFP4 GEMV's split of its output.
 * Shared by rmsnorm_kernel (rmsnorm.cu: a block per row) and the last block of
 * the residual projection's GEMV at one token (matmul_add_norm.cu; moe_gemm.cu
 * for the routed experts' down), so they give the same bits: the order of the sum of squares is fixed by
 * RMS_THREADS, not by the launch. Device code only.
 *
 * The order: thread i of the block adds the squares of groups i, i +
 * RMS_THREADS, i + 2 RMS_THREADS, ... of four consecutive elements (fmaf, in
 * element order; a row's ragged last group padded with zeros, which add
 * nothing); each warp's sums meet in warp_sum's butterfly, and the eight
 * warps' sums are added in warp order (a narrow row's block may have fewer
 * warps: rms_threads). Vector or scalar loads (alignment) and
 * how many groups a thread loads before it adds them (B) do not change it; nor
 * does whether the output reads x again or the values held in registers.
 * Reference: cpu_add and cpu_rmsnorm (kernels/cpu/cpu_ops.c), f32 class.
 */
#ifndef SAMPLER_RMSNORM_DEVICE_CUH
#define SAMPLER_RMSNORM_DEVICE_CUH

#include "cuda_device.cuh"
#include "gemv_mma.cuh"

#define RMS_THREADS 256 /* threads of a block that norms; the order above depends on it */

/* The threads a block may norm a row of dim with and keep that order: RMS_THREADS, or as few as own a
 * group each (a multiple of 32): thread g then owns group g alone in both, and the warps it lacks
 * would add +0 to a sum of squares. Fewer threads for narrow rows (and fewer emulated fibers). */
static inline int rms_threads(int dim) {
    int ng = (dim + 3) / 4, t = ((ng + 31) / 32) * 32;
    return t < RMS_THREADS ? t : RMS_THREADS;
}

/* One f32 of memory: through L2 (CG: the last block of a grid reads the other blocks' writes) or not. */
template <bool CG>
static __device__ __forceinline__ float rms_ld(const float *p) {
    return CG ? __ldcg(p) : *p;
}

/* Elements 4g .. 4g + 3 of row r [dim] (those at or past dim read as 0): one 16-byte load where vec
 * (r 16-byte aligned, dim % 4 == 0), else four. */
template <bool CG>
static __device__ __forceinline__ float4 rms_group(const float *r, int dim, int g, bool vec) {
    if (vec) return CG ? __ldcg((const float4 *)r + g) : ((const float4 *)r)[g];
    int i = 4 * g;
    float4 v = {0.f, 0.f, 0.f, 0.f};
    v.x = i < dim ? rms_ld<CG>(r + i) : 0.f;
    v.y = i + 1 < dim ? rms_ld<CG>(r + i + 1) : 0.f;
    v.z = i + 2 < dim ? rms_ld<CG>(r + i + 2) : 0.f;
    v.w = i + 3 < dim ? rms_ld<CG>(r + i + 3) : 0.f;
    return v;
}
static __device__ __forceinline__ void rms_store(float *r, int dim, int g, bool vec, float4 v) {
    if (vec) {
        ((float4 *)r)[g] = v;
        return;
    }
    int i = 4 * g;
    if (i < dim) r[i] = v.x;
    if (i + 1 < dim) r[i + 1] = v.y;
    if (i + 2 < dim) r[i + 2] = v.z;
    if (i + 3 < dim) r[i + 3] = v.w;
}
static __device__ __forceinline__ bool rms_aligned(const void *p) {
    return !((uintptr_t)p & 15);
}

/* The four weights of group g < (dim + 3) / 4 (those at or past dim: 0), as f32: one 8-byte load
 * where vec (w 8-byte aligned, dim % 4 == 0), else four. */
static __device__ __forceinline__ float4 rms_weights(const __nv_bfloat16 *w, int dim, int g, bool vec) {
    int i = 4 * g;
    float4 f = {0.f, 0.f, 0.f, 0.f};
    if (vec) {
        uint2 u = ((const uint2 *)w)[g];
        bf16x2_to_f32(u.x, &f.x, &f.y);
        bf16x2_to_f32(u.y, &f.z, &f.w);
        return f;
    }
    f.x = i < dim ? __bfloat162float(w[i]) : 0.f;
    f.y = i + 1 < dim ? __bfloat162float(w[i + 1]) : 0.f;
    f.z = i + 2 < dim ? __bfloat162float(w[i + 2]) : 0.f;
    f.w = i + 3 < dim ? __bfloat162float(w[i + 3]) : 0.f;
    return f;
}

/* out [dim] = rmsnorm(x [dim]) * w [dim] (bf16); y [dim] non-NULL: x += y first (the sum stored into
 * x). split.hi non-NULL: also out's split (gm_split_exp / gm_split_pair over it: hi, lo [.., dim / 2]
 * u32 and inv [..] f32 at row srow; dim even), the bits gm_split_kernel writes from out. CG: x is
 * read through L2 (it holds other blocks' writes). B: groups a thread loads before it adds them; a
 * row of at most B RMS_THREADS groups (B = 4: 4096 columns) is read once, its values and weights kept
 * in registers until the output. Every thread of the block calls it (rms_threads(dim) of them, or
 * RMS_THREADS); __syncthreads
 * inside. out may be x (rmsnorm in place): every element is read and then written by the same thread. */
template <int B, bool CG>
static __device__ __forceinline__ void rms_row(float *out, float *x, const float *y, const __nv_bfloat16 *w, int dim,
                                               float eps, GmSplit split, int srow) {
    __shared__ float part[RMS_THREADS / 32];
    __shared__ int kk;
    int tid = threadIdx.x, lane = tid & 31, wp = tid >> 5, nw = blockDim.x >> 5, ng = (dim + 3) / 4;
    bool vx = dim % 4 == 0 && rms_aligned(x) && (!y || rms_aligned(y)), vo = dim % 4 == 0 && rms_aligned(out);
    bool vw = dim % 4 == 0 && !((uintptr_t)w & 7), once = ng <= B * RMS_THREADS;
    float4 v[B], wf[B]; /* once: this thread's groups of x and of w, from the sum to the output */
    if (once) /* the weights' loads first: they travel with x's */
#pragma unroll
        for (int j = 0; j < B; j++) {
            int g = tid + j * RMS_THREADS;
            wf[j] = g < ng ? rms_weights(w, dim, g, vw) : float4{0.f, 0.f, 0.f, 0.f};
        }
    float ss = 0.f;
    for (int g0 = tid; g0 < ng; g0 += B * RMS_THREADS) {
#pragma unroll
        for (int j = 0; j < B; j++) {
            int g = g0 + j * RMS_THREADS;
            v[j] = g < ng ? rms_group<CG>(x, dim, g, vx) : float4{0.f, 0.f, 0.f, 0.f};
        }
        if (y) {
#pragma unroll
            for (int j = 0; j < B; j++) {
                int g = g0 + j * RMS_THREADS;
                if (g >= ng) continue;
                float4 d = rms_group<false>(y, dim, g, vx);
                v[j].x += d.x;
                v[j].y += d.y;
                v[j].z += d.z;
                v[j].w += d.w;
                rms_store(x, dim, g, vx, v[j]);
            }
        }
#pragma unroll
        for (int j = 0; j < B; j++)
            if (g0 + j * RMS_THREADS < ng) {
                ss = fmaf(v[j].x, v[j].x, ss);
                ss = fmaf(v[j].y, v[j].y, ss);
                ss = fmaf(v[j].z, v[j].z, ss);
                ss = fmaf(v[j].w, v[j].w, ss);
            }
    }
    ss = warp_sum(ss);
    if (lane == 0) part[wp] = ss;
    __syncthreads(); /* the warps' sums */
    float s = part[0];
    for (int k = 1; k < nw; k++) s += part[k]; /* the warps past nw would add +0: nothing */
    float scale = rsqrtf(s / (float)dim + eps), amax = 0.f;
    if (once) {
#pragma unroll
        for (int j = 0; j < B; j++) {
            int g = tid + j * RMS_THREADS;
            if (g >= ng) continue;
            float4 o = {v[j].x * scale * wf[j].x, v[j].y * scale * wf[j].y, v[j].z * scale * wf[j].z,
                        v[j].w * scale * wf[j].w}; /* past dim: 0 * w = 0, not stored */
            rms_store(out, dim, g, vo, o);
            amax = fmaxf(amax, fmaxf(fmaxf(fabsf(o.x), fabsf(o.y)), fmaxf(fabsf(o.z), fabsf(o.w))));
        }
    } else {
        for (int g = tid; g < ng; g += RMS_THREADS) {
            float4 a = rms_group<CG>(x, dim, g, vx), f = rms_weights(w, dim, g, vw);
            float4 o = {a.x * scale * f.x, a.y * scale * f.y, a.z * scale * f.z, a.w * scale * f.w};
            rms_store(out, dim, g, vo, o);
            amax = fmaxf(amax, fmaxf(fmaxf(fabsf(o.x), fabsf(o.y)), fmaxf(fabsf(o.z), fabsf(o.w))));
        }
    }
    if (!split.hi) return;
    /* max |out| (fmaxf: order-free), then the pairs, each from up to two threads' writes (__syncthreads
     * makes a block's global writes visible to the block); part is free again: every thread read it
     * before the barrier below */
    amax = warp_max(amax);
    __syncthreads();
    if (lane == 0) part[wp] = amax;
    __syncthreads();
    if (tid == 0) {
        float a = 0.f;
        for (int k = 0; k < nw; k++) a = fmaxf(a, part[k]);
        kk = gm_split_exp(a);
        split.inv[srow] = ldexpf(1.0f, -kk);
    }
    __syncthreads();
    float sc = ldexpf(1.0f, kk);
    size_t o = (size_t)srow * (dim / 2);
    for (int i = tid; i < dim / 2; i += blockDim.x)
        gm_split_pair(out[2 * i], out[2 * i + 1], sc, &split.hi[o + i], &split.lo[o + i]);
}

/* The residual add and the next norm as a GEMV's epilogue at one token (matmul_add_norm.cu: o, a dense
 * MLP's down; moe_gemm.cu: the routed experts' down after the unpermute): the GEMV's blocks add their
 * rows into x, then the last of them norms it. */
typedef struct RmsAddNorm {
    float *x;               /* [dim] f32: the residual, updated in place by the GEMV's blocks */
    float *out;             /* [dim] f32: rmsnorm(x) * w */
    const __nv_bfloat16 *w; /* [dim] bf16 */
    float eps;
    GmSplit split;          /* out's split for the tensor-core GEMV after it; hi NULL: none */
    uint32_t *done;         /* [1] device counter, 0 between launches */
} RmsAddNorm;

/* The launchers' check of a GemvAddNorm (cuda_kernels.h) for a row of dim columns after a GEMV over in,
 * and the kernels' form of it: 0, or -1 (a pointer missing, x / out / in aliased, the split's shape). */
static inline int rms_add_norm_args(const GemvAddNorm *an, int dim, const float *in, RmsAddNorm *d) {
    if (!an->x || !an->out || !an->w || !an->done || an->out == an->x || an->x == in || an->out == in)
        return -1;
    if (an->split && (dim % 2 || ((uintptr_t)an->split & 15))) return -1;
    *d = RmsAddNorm{an->x, an->out, (const __nv_bfloat16 *)an->w, an->eps,
                    an->split ? gemv_mma_split_at(an->split, 1, dim) : GmSplit{}, an->done};
    return 0;
}

/* Every thread of a block calls it once the block's adds into an.x are written (last_block_done's
 * fence makes them visible): the last of `blocks` to count norms x, reading the others' adds through
 * L2. B: rms_row's (registers, not bits). */
template <int B>
static __device__ __forceinline__ void rms_add_norm_last(const RmsAddNorm &an, int dim, unsigned blocks) {
    if (!last_block_done(an.done, blocks)) return; /* the whole block */
    rms_row<B, true>(an.out, an.x, NULL, an.w, dim, an.eps, an.split, 0);
}

#endif
