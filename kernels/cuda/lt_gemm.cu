/*
 * lt_gemm.cu - the native tensor-core GEMMs through cuBLASLt (cuda_native.h
 * says which one runs on which GPU and why): FP8 with the checkpoint's block
 * scales (sm_90a), FP8 per channel (per-channel weights, any FP8 GPU; the
 * path of 128x128 checkpoints on sm_100a/103a), NVFP4 VEC16_UE4M3
 * (sm_100a/103a). f32 accumulation (FP8: CUBLASLT_MATMUL_DESC_FAST_ACCUM left
 * off, so Hopper promotes partial sums to f32), f32 output.
 *
 * Layout: row-major out[n, rows] = x[n, cols] @ W^T is, column-major,
 * D [rows, n] = op(A) B with A = W (stored [cols, rows] column-major, TRANSA = T)
 * and B = xq ([cols, n] column-major): the "TN" form every FP8 cuBLASLt kernel
 * needs. Scale tensors (their layout is implied by the mode, cuBLAS has no
 * pitch for them):
 *   BLK128x128_32F on A: block (rows / 128, cols / 128) at
 *     rb * roundup(cols / 128, 4) + kb, i.e. QuantFp8.scale_inv as it is when
 *     cols / 128 is a multiple of 4 (cols % 512 == 0: Qwen3's 4096 and 12288);
 *   VEC128_32F on B: (token t, group kb) at kb * n + t (cuda_quant_act_fp8);
 *   VEC16_UE4M3: cuBLASLt's 128x4 tiles (cuda_nvfp4_sf_offset).
 * These follow the cuBLAS documentation and PyTorch's scaled_mm (which pads the
 * 128x128 grid to a multiple of 4 and passes 1x128 scales outer-major); they
 * are checked against the CPU reference by gpu_check's op rows on a device, and
 * against the emulation's reference cuBLASLt (tests/gpu/emu/shim/cublasLt.h,
 * which implements this reading of the docs) in CI.
 *
 * Operands, outputs and block-scale tensors must be 16-byte aligned (the
 * heuristic is asked for algorithms valid at 16; a launcher refuses less, and
 * the backend then runs the weight-only kernel).
 * Algorithms: one heuristic query per (kind, rows, n, cols), cached in the
 * CudaLt with its descriptors (CUDA_LT_PLANS entries, replaced round-robin),
 * so a step allocates nothing once its shapes were seen. No algorithm: -1.
 * Not here: the quantizers and the epilogue (quant_act.cu), the choice of path
 * (backend_cuda.cu).
 */
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>

#include "cuda_check.h"
#include "cuda_native.h"
extern "C" {
#include "check.h"
}

#define LT_WORKSPACE (32u << 20)

#if !defined(__CUDACC__) || SAMPLER_GPU_SM == 90
#define LT_HAS_FP8_BLOCK 1
#endif
#if !defined(__CUDACC__) || SAMPLER_GPU_SM >= 90
#define LT_HAS_FP8_ROWWISE 1 /* a tensor-wide e4m3 GEMM: every FP8 tensor-core GPU */
#endif
#if !defined(__CUDACC__) || SAMPLER_GPU_SM >= 100
#define LT_HAS_BLACKWELL 1
#endif

enum { LT_FP8_BLOCK = 1, LT_FP8_ROWWISE = 2, LT_NVFP4 = 3 };

typedef struct LtPlan {
    int kind, rows, n, cols; /* kind 0: empty */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
} LtPlan;

struct CudaLt {
    cublasLtHandle_t h;
    void *ws; /* [LT_WORKSPACE] bytes */
    cublasLtMatmulPreference_t pref;
    LtPlan plans[CUDA_LT_PLANS];
    int next; /* round-robin slot once the cache is full */
};

extern "C" int cuda_native_caps(void) {
    int c = 0;
#ifdef LT_HAS_FP8_BLOCK
    c |= CUDA_NATIVE_FP8_BLOCK;
#endif
#ifdef LT_HAS_FP8_ROWWISE
    c |= CUDA_NATIVE_FP8_ROWWISE;
#endif
#ifdef LT_HAS_BLACKWELL
    c |= CUDA_NATIVE_NVFP4;
#endif
    return c;
}

extern "C" CudaLt *cuda_lt_create(void) {
    CudaLt *lt = (CudaLt *)xcalloc(1, sizeof *lt);
    CUDA_CHECK(cublasLtCreate(&lt->h));
    CUDA_CHECK(cudaMalloc(&lt->ws, LT_WORKSPACE));
    CUDA_CHECK(cublasLtMatmulPreferenceCreate(&lt->pref));
    size_t wsb = LT_WORKSPACE;
    CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(lt->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                                    sizeof wsb));
    /* Algorithms valid for 16-byte aligned operands (the launchers refuse less): the
     * default assumes 256, which a row offset into an activation buffer need not have. */
    const cublasLtMatmulPreferenceAttributes_t al[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    uint32_t sixteen = 16;
    for (int i = 0; i < 4; i++)
        CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(lt->pref, al[i], &sixteen, sizeof sixteen));
    return lt;
}

static void plan_clear(LtPlan *p) {
    if (!p->kind) return;
    cublasLtMatrixLayoutDestroy(p->a);
    cublasLtMatrixLayoutDestroy(p->b);
    cublasLtMatrixLayoutDestroy(p->d);
    cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

extern "C" void cuda_lt_free(CudaLt *lt) {
    if (!lt) return;
    for (int i = 0; i < CUDA_LT_PLANS; i++) plan_clear(&lt->plans[i]);
    cublasLtMatmulPreferenceDestroy(lt->pref);
    CUDA_CHECK(cudaFree(lt->ws));
    cublasLtDestroy(lt->h);
    free(lt);
}

#ifdef LT_HAS_FP8_ROWWISE /* sm_80 has no native GEMM: no plans */
static int al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

static int set_attr(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t a, const void *v, size_t bytes) {
    return cublasLtMatmulDescSetAttribute(op, a, v, bytes) == CUBLAS_STATUS_SUCCESS ? 0 : -1;
}

/* The descriptors and the heuristic's algorithm for one shape, cached. NULL when
 * cuBLASLt refuses the configuration. */
static LtPlan *plan_get(CudaLt *lt, int kind, int rows, int n, int cols) {
    for (int i = 0; i < CUDA_LT_PLANS; i++) {
        LtPlan *p = &lt->plans[i];
        if (p->kind == kind && p->rows == rows && p->n == n && p->cols == cols) return p;
    }
    LtPlan *p = NULL;
    for (int i = 0; i < CUDA_LT_PLANS && !p; i++)
        if (!lt->plans[i].kind) p = &lt->plans[i];
    if (!p) {
        p = &lt->plans[lt->next];
        lt->next = (lt->next + 1) % CUDA_LT_PLANS;
        plan_clear(p);
    }
    cudaDataType et = kind == LT_NVFP4 ? CUDA_R_4F_E2M1 : CUDA_R_8F_E4M3;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LtPlan q;
    memset(&q, 0, sizeof q);
    if (cublasLtMatmulDescCreate(&q.op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) return NULL;
    int ok = set_attr(q.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == 0 &&
             set_attr(q.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == 0;
    if (kind != LT_FP8_ROWWISE) { /* rowwise: the default SCALAR_32F mode with no pointer (scale 1) */
        int32_t am = kind == LT_NVFP4 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
        int32_t bm = kind == LT_NVFP4 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        ok = ok && set_attr(q.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof am) == 0 &&
             set_attr(q.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof bm) == 0;
    }
    ok = ok && cublasLtMatrixLayoutCreate(&q.a, et, (uint64_t)cols, (uint64_t)rows, cols) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatrixLayoutCreate(&q.b, et, (uint64_t)cols, (uint64_t)n, cols) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatrixLayoutCreate(&q.d, CUDA_R_32F, (uint64_t)rows, (uint64_t)n, rows) == CUBLAS_STATUS_SUCCESS;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    memset(&res, 0, sizeof res);
    ok = ok && cublasLtMatmulAlgoGetHeuristic(lt->h, q.op, q.a, q.b, q.d, q.d, lt->pref, 1, &res, &found) ==
                   CUBLAS_STATUS_SUCCESS && found > 0 && res.state == CUBLAS_STATUS_SUCCESS;
    q.kind = kind;
    if (!ok) {
        if (q.a) cublasLtMatrixLayoutDestroy(q.a);
        if (q.b) cublasLtMatrixLayoutDestroy(q.b);
        if (q.d) cublasLtMatrixLayoutDestroy(q.d);
        cublasLtMatmulDescDestroy(q.op);
        return NULL;
    }
    q.rows = rows;
    q.n = n;
    q.cols = cols;
    q.algo = res.algo;
    *p = q;
    return p;
}

/* One cuBLASLt matmul on the plan: D = alpha * op(A) B (beta 0). */
static int lt_run(CudaLt *lt, LtPlan *p, float alpha, const void *A, const void *sa, const void *B, const void *sb,
                  float *out, cudaStream_t s) {
    if (p->kind != LT_FP8_ROWWISE &&
        (set_attr(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa) ||
         set_attr(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb)))
        return -1;
    const float zero = 0.f;
    CUDA_CHECK(cublasLtMatmul(lt->h, p->op, &alpha, A, p->a, B, p->b, &zero, out, p->d, out, p->d, &p->algo, lt->ws,
                              LT_WORKSPACE, s));
    return 0;
}

#endif

extern "C" int cuda_gemm_fp8_block(CudaLt *lt, float *out, const uint8_t *xq, const float *xs, int n,
                                   const uint8_t *W, const float *ws, int rows, int cols, const uint16_t *bias,
                                   void *stream) {
#ifdef LT_HAS_FP8_BLOCK
    if (!lt || n < 0 || rows <= 0 || rows % 16 || cols <= 0 || cols % 512 || !out || !xq || !xs || !W || !ws ||
        !al16(out) || !al16(xq) || !al16(W) || !al16(xs) || !al16(ws))
        return -1;
    if (n == 0) return 0;
    LtPlan *p = plan_get(lt, LT_FP8_BLOCK, rows, n, cols);
    if (!p || lt_run(lt, p, 1.f, W, ws, xq, xs, out, (cudaStream_t)stream)) return -1;
    return bias ? cuda_scale_outer(out, n, rows, NULL, NULL, 1.f, NULL, bias, stream) : 0;
#else
    (void)lt; (void)out; (void)xq; (void)xs; (void)n; (void)W; (void)ws; (void)rows; (void)cols; (void)bias;
    (void)stream;
    return -1;
#endif
}

extern "C" int cuda_gemm_fp8_rowwise(CudaLt *lt, float *out, const uint8_t *xq, const float *xs, int n,
                                     const uint8_t *W, const float *ws, int rows, int cols, const uint16_t *bias,
                                     void *stream) {
#ifdef LT_HAS_FP8_ROWWISE
    if (!lt || n < 0 || rows <= 0 || rows % 16 || cols <= 0 || cols % 16 || !out || !xq || !xs || !W || !ws ||
        !al16(out) || !al16(xq) || !al16(W))
        return -1;
    if (n == 0) return 0;
    LtPlan *p = plan_get(lt, LT_FP8_ROWWISE, rows, n, cols);
    if (!p || lt_run(lt, p, 1.f, W, NULL, xq, NULL, out, (cudaStream_t)stream)) return -1;
    return cuda_scale_outer(out, n, rows, xs, ws, 1.f, NULL, bias, stream);
#else
    (void)lt; (void)out; (void)xq; (void)xs; (void)n; (void)W; (void)ws; (void)rows; (void)cols; (void)bias;
    (void)stream;
    return -1;
#endif
}

extern "C" int cuda_gemm_nvfp4(CudaLt *lt, float *out, const uint8_t *xq, const uint8_t *xsf, const float *xg,
                               int n, const uint8_t *W, const uint8_t *wsf, const float *scale2, int rows, int cols,
                               const uint16_t *bias, void *stream) {
#ifdef LT_HAS_BLACKWELL
    if (!lt || n < 0 || rows <= 0 || rows % 16 || cols <= 0 || cols % 32 || !out || !xq || !xsf || !xg || !W || !wsf || !scale2 ||
        !al16(out) || !al16(xq) || !al16(W) || !al16(xsf) || !al16(wsf))
        return -1;
    if (n == 0) return 0;
    LtPlan *p = plan_get(lt, LT_NVFP4, rows, n, cols);
    if (!p || lt_run(lt, p, 1.f, W, wsf, xq, xsf, out, (cudaStream_t)stream)) return -1;
    return cuda_scale_outer(out, n, rows, xg, NULL, 1.f, scale2, bias, stream);
#else
    (void)lt; (void)out; (void)xq; (void)xsf; (void)xg; (void)n; (void)W; (void)wsf; (void)scale2; (void)rows;
    (void)cols; (void)bias; (void)stream;
    return -1;
#endif
}
