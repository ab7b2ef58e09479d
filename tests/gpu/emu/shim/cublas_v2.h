/* shim/cublas_v2.h - the cuBLAS calls of kernels/cuda/ for the CPU emulation:
 * GemmEx is a plain triple loop for the one configuration matmul.cu uses
 * (op(A) = A^T, bf16 A and B, f32 C, f32 compute), anything else fails. */
#ifndef EMU_CUBLAS_H
#define EMU_CUBLAS_H
#include "cuda_runtime.h"
#include "cuda_bf16.h"
struct EmuBlas { cudaStream_t stream; };
typedef EmuBlas *cublasHandle_t;
typedef enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_NOT_SUPPORTED = 15 } cublasStatus_t;
typedef int cublasOperation_t;
typedef int cudaDataType;
typedef int cublasComputeType_t;
typedef int cublasGemmAlgo_t;
#define CUBLAS_OP_N 0
#define CUBLAS_OP_T 1
#define CUDA_R_32F 0
#define CUDA_R_16BF 14
#define CUBLAS_COMPUTE_32F 68
#define CUBLAS_GEMM_DEFAULT (-1)
static inline const char *cublasGetStatusString(cublasStatus_t s) { return s ? "emulated failure" : "ok"; }
static inline cublasStatus_t cublasCreate(cublasHandle_t *h) { *h = new EmuBlas{0}; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasDestroy(cublasHandle_t h) { delete h; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) { h->stream = s; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasGetStream(cublasHandle_t h, cudaStream_t *s) { *s = h->stream; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasSetWorkspace(cublasHandle_t, void *, size_t) { return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType at, int lda,
                                          const void *B, cudaDataType bt, int ldb, const void *beta, void *C,
                                          cudaDataType ct, int ldc, cublasComputeType_t comp, cublasGemmAlgo_t) {
    if (emu_fault()) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (ta != CUBLAS_OP_T || tb != CUBLAS_OP_N || at != CUDA_R_16BF || bt != CUDA_R_16BF || ct != CUDA_R_32F ||
        comp != CUBLAS_COMPUTE_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    const __nv_bfloat16 *a = (const __nv_bfloat16 *)A, *b = (const __nv_bfloat16 *)B;
    float al = *(const float *)alpha, be = *(const float *)beta, *c = (float *)C; /* host scalars: read at the call */
    auto run = [=]() {
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                float s = 0.f; /* C[i, j] = sum_l A[l, i] * B[l, j] (column-major, A transposed) */
                for (int l = 0; l < k; l++) s += __bfloat162float(a[(size_t)i * lda + l]) * __bfloat162float(b[(size_t)j * ldb + l]);
                c[(size_t)j * ldc + i] = al * s + (be != 0.f ? be * c[(size_t)j * ldc + i] : 0.f);
            }
    };
    if (emu_capturing()) emu_record(run); /* a captured GEMM runs at the graph's launch */
    else run();
    return CUBLAS_STATUS_SUCCESS;
}
#endif
