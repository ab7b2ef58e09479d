/* shim/cublasLt.h - the cuBLASLt calls of kernels/cuda/lt_gemm.cu for the CPU
 * emulation: descriptors are plain structs, the heuristic accepts exactly the
 * three configurations lt_gemm.cu uses (TN, e4m3 or e2m1 A and B, f32 D, f32
 * compute; scale modes BLK128x128 x VEC128, SCALAR x SCALAR, VEC16_UE4M3 x
 * VEC16_UE4M3) and refuses the rest, and cublasLtMatmul is a plain reference
 * loop that reads the operands and scale tensors the way the cuBLAS docs lay
 * them out (lt_gemm.cu's header comment). It checks lt_gemm.cu's call logic
 * (shapes, leading dimensions, which scale goes where), not cuBLASLt: a real
 * device runs gpu_check's rows against the same CPU reference. */
#ifndef EMU_CUBLASLT_H
#define EMU_CUBLASLT_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cublas_v2.h"
#include "cuda_native.h"
extern "C" {
#include "quant.h"
}

typedef int cudaDataType_t;
#define CUDA_R_8F_E4M3 28
#define CUDA_R_4F_E2M1 33
#define CUBLAS_STATUS_INVALID_VALUE ((cublasStatus_t)7)

typedef enum {
    CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F = 0,
    CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 = 1,
    CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0 = 2,
    CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F = 3,
    CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F = 4,
    CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F = 5,
} cublasLtMatmulMatrixScale_t;
typedef enum {
    CUBLASLT_MATMUL_DESC_TRANSA = 3,
    CUBLASLT_MATMUL_DESC_TRANSB = 4,
    CUBLASLT_MATMUL_DESC_A_SCALE_POINTER = 17,
    CUBLASLT_MATMUL_DESC_B_SCALE_POINTER = 18,
    CUBLASLT_MATMUL_DESC_A_SCALE_MODE = 31,
    CUBLASLT_MATMUL_DESC_B_SCALE_MODE = 32,
} cublasLtMatmulDescAttributes_t;
typedef enum {
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
} cublasLtMatmulPreferenceAttributes_t;

struct EmuLtDesc { int comp, scale_type, ta, tb, am, bm; const void *as, *bs; };
struct EmuLtLayout { int type; uint64_t rows, cols; int64_t ld; };
struct EmuLtPref { size_t ws; uint32_t align[4]; };
struct EmuLt { int unused; };
typedef EmuLt *cublasLtHandle_t;
typedef EmuLtDesc *cublasLtMatmulDesc_t;
typedef EmuLtLayout *cublasLtMatrixLayout_t;
typedef EmuLtPref *cublasLtMatmulPreference_t;
typedef struct { uint64_t data[8]; } cublasLtMatmulAlgo_t;
typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

static inline cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) { *h = new EmuLt{0}; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) { delete h; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, int comp, int scale_type) {
    *d = new EmuLtDesc{comp, scale_type, CUBLAS_OP_N, CUBLAS_OP_N, 0, 0, NULL, NULL};
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { delete d; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a,
                                                            const void *buf, size_t bytes) {
    switch (a) {
    case CUBLASLT_MATMUL_DESC_TRANSA: if (bytes != sizeof(int)) break; memcpy(&d->ta, buf, bytes); return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_TRANSB: if (bytes != sizeof(int)) break; memcpy(&d->tb, buf, bytes); return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_A_SCALE_MODE: if (bytes != 4) break; memcpy(&d->am, buf, 4); return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_B_SCALE_MODE: if (bytes != 4) break; memcpy(&d->bm, buf, 4); return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: if (bytes != sizeof(void *)) break; memcpy(&d->as, buf, bytes); return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: if (bytes != sizeof(void *)) break; memcpy(&d->bs, buf, bytes); return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}
static inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, int type, uint64_t rows,
                                                        uint64_t cols, int64_t ld) {
    *l = new EmuLtLayout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) { delete l; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    *p = new EmuLtPref{0, {256, 256, 256, 256}};
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) { delete p; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                                  cublasLtMatmulPreferenceAttributes_t a,
                                                                  const void *buf, size_t bytes) {
    if (a == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES && bytes == sizeof(size_t)) {
        memcpy(&p->ws, buf, bytes);
        return CUBLAS_STATUS_SUCCESS;
    }
    if (a >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && a <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES &&
        bytes == sizeof(uint32_t)) {
        memcpy(&p->align[a - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, bytes);
        return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}

/* The configurations lt_gemm.cu uses; 0 for anything else (the heuristic then finds nothing). */
static inline int emu_lt_supported(const EmuLtDesc *d, const EmuLtLayout *a, const EmuLtLayout *b,
                                   const EmuLtLayout *c) {
    if (d->comp != CUBLAS_COMPUTE_32F || d->scale_type != CUDA_R_32F || d->ta != CUBLAS_OP_T || d->tb != CUBLAS_OP_N)
        return 0;
    if (a->type != b->type || c->type != CUDA_R_32F || a->rows != b->rows || c->rows != a->cols || c->cols != b->cols ||
        a->ld < (int64_t)a->rows || b->ld < (int64_t)b->rows || c->ld < (int64_t)c->rows)
        return 0;
    if (a->type == CUDA_R_8F_E4M3)
        return (d->am == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F && d->bm == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F) ||
               (d->am == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F && d->bm == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F);
    if (a->type == CUDA_R_4F_E2M1)
        return d->am == CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 && d->bm == CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 &&
               a->rows % 16 == 0;
    return 0;
}

static inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d,
                                                            cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                            cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t,
                                                            cublasLtMatmulPreference_t pref, int req,
                                                            cublasLtMatmulHeuristicResult_t *res, int *found) {
    *found = 0;
    if (req < 1) return CUBLAS_STATUS_INVALID_VALUE;
    if (!emu_lt_supported(d, a, b, c)) return CUBLAS_STATUS_NOT_SUPPORTED;
    memset(res, 0, sizeof *res);
    for (int i = 0; i < 4; i++) res->algo.data[i] = pref->align[i]; /* the alignment the algorithm may assume */
    res->state = CUBLAS_STATUS_SUCCESS;
    *found = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* Element (k, j) of a column-major e4m3 / e2m1 operand [K, *] with pitch ld. */
static inline float emu_lt_elem(const EmuLtLayout *l, const void *p, uint64_t k, uint64_t j) {
    uint64_t i = j * (uint64_t)l->ld + k;
    const uint8_t *u = (const uint8_t *)p;
    if (l->type == CUDA_R_8F_E4M3) return quant_e4m3_to_f32(u[i]);
    return quant_e2m1_to_f32((uint8_t)(i & 1 ? u[i / 2] >> 4 : u[i / 2] & 15));
}

static inline void emu_lt_run(const EmuLtDesc *d, const void *A, const EmuLtLayout *a, const void *B,
                              const EmuLtLayout *b, const EmuLtLayout *dl, float *out, float al, uint64_t K,
                              uint64_t M, uint64_t N, uint64_t kb_n, uint64_t kb_pitch) {
    for (uint64_t j = 0; j < N; j++)
        for (uint64_t i = 0; i < M; i++) {
            float acc = 0.f;
            if (d->am == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F) {
                const float *sa = (const float *)d->as, *sb = (const float *)d->bs;
                for (uint64_t kb = 0; kb < kb_n; kb++) {
                    float p = 0.f;
                    for (uint64_t k = kb * 128; k < K && k < kb * 128 + 128; k++)
                        p += emu_lt_elem(a, A, k, i) * emu_lt_elem(b, B, k, j);
                    acc += p * sa[(i / 128) * kb_pitch + kb] * sb[kb * N + j];
                }
            } else if (d->am == CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3) {
                const uint8_t *sa = (const uint8_t *)d->as, *sb = (const uint8_t *)d->bs;
                int nb = (int)(K / 16);
                for (uint64_t k = 0; k < K; k++) {
                    float fa = quant_e4m3_to_f32(sa[cuda_nvfp4_sf_offset((int)i, (int)(k / 16), nb)]);
                    float fb = quant_e4m3_to_f32(sb[cuda_nvfp4_sf_offset((int)j, (int)(k / 16), nb)]);
                    acc += emu_lt_elem(a, A, k, i) * fa * (emu_lt_elem(b, B, k, j) * fb);
                }
            } else {
                for (uint64_t k = 0; k < K; k++) acc += emu_lt_elem(a, A, k, i) * emu_lt_elem(b, B, k, j);
                acc *= (d->as ? *(const float *)d->as : 1.f) * (d->bs ? *(const float *)d->bs : 1.f);
            }
            out[j * (uint64_t)dl->ld + i] = al * acc;
        }
}

/* D [M, N] = alpha * sum_k A[k, i] B[k, j] with the scale modes applied: per
 * 128-deep block p_kb * sa * sb (BLK128x128 on A at (i / 128) * roundup(Kb, 4) + kb,
 * VEC128 on B at kb * N + j); VEC16_UE4M3 per element (cuda_nvfp4_sf_offset);
 * SCALAR_32F: *pointer, or 1 without one. */
static inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t d, const void *alpha,
                                            const void *A, cublasLtMatrixLayout_t a, const void *B,
                                            cublasLtMatrixLayout_t b, const void *beta, const void *,
                                            cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t dl,
                                            const cublasLtMatmulAlgo_t *algo, void *, size_t, cudaStream_t) {
    if (emu_fault()) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!emu_lt_supported(d, a, b, c) || dl != c || *(const float *)beta != 0.f) return CUBLAS_STATUS_NOT_SUPPORTED;
    const void *ptr[4] = {A, B, D, D};
    for (int i = 0; i < 4; i++) /* an operand less aligned than the algorithm assumes */
        if (!algo || !algo->data[i] || (uintptr_t)ptr[i] % algo->data[i]) return CUBLAS_STATUS_INVALID_VALUE;
    uint64_t K = a->rows, M = a->cols, N = b->cols, kb_n = (K + 127) / 128, kb_pitch = (kb_n + 3) / 4 * 4;
    float al = *(const float *)alpha, *out = (float *)D;
    /* the descriptors and host scalars as they are at the call (a captured call runs at the graph's launch) */
    auto dd = *d;
    auto la = *a, lb = *b, ldl = *dl;
    auto run = [=]() { emu_lt_run(&dd, A, &la, B, &lb, &ldl, out, al, K, M, N, kb_n, kb_pitch); };
    if (emu_capturing()) emu_record(run);
    else run();
    return CUBLAS_STATUS_SUCCESS;
}
#endif
