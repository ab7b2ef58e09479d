/* shim/cublas_v2.h - just enough of cuBLAS for matmul.cu to compile in the emulation; the GEMM
 * path is not emulated (cuda_gemm_bf16 is exercised on a real GPU only). */
#ifndef EMU_CUBLAS_H
#define EMU_CUBLAS_H
#include "cuda_runtime.h"
typedef void *cublasHandle_t;
typedef int cublasStatus_t;
#define CUBLAS_STATUS_SUCCESS 0
#define CUBLAS_OP_T 1
#define CUBLAS_OP_N 0
#define CUDA_R_16BF 14
#define CUDA_R_32F 0
#define CUBLAS_COMPUTE_32F 68
#define CUBLAS_GEMM_DEFAULT (-1)
static inline const char *cublasGetStatusString(cublasStatus_t) { return "emulated"; }
static inline cublasStatus_t cublasGetStream(cublasHandle_t, cudaStream_t *s) { *s = 0; return 1; }
static inline cublasStatus_t cublasGemmEx(...) { return 1; }
#endif
