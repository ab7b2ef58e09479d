/*
 * scatter.cu - sparse weight deltas on the device: write the touched elements
 * of a weight tensor's device copy, and read them back for verification.
 * A delta touches a few percent of a tensor at most (issue: 50-1000x sparser
 * than the model), so uploading [n] indices and values and scattering them
 * moves a fraction of the bytes a whole-tensor re-upload would.
 * Not here: deciding what changed (delta_apply.c on the host copy, which stays
 * the master) or hashing (the host hashes its copy; backend_cuda.cu compares
 * the read-back values with what it sent).
 * Reference: the host loop dst[idx[i]] = val[i] (elem bytes each).
 * Both launchers are on the update path: errors return (CUDA_TRY), never exit.
 */
#include "cuda_check.h"
#include "cuda_kernels.h"

#define SC_THREADS 256

/* dst: [numel] elements of elem bytes (1, 2 or 4); idx: [n] int64 in [0, numel); val: [n] elements.
 * Indices out of range are skipped (the host validated them; this keeps a bad call in bounds). */
__global__ void scatter_kernel(uint8_t *dst, int64_t numel, const int64_t *idx, const uint8_t *val, int64_t n,
                               int elem) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t j = idx[i];
        if (j < 0 || j >= numel) continue;
        for (int k = 0; k < elem; k++) dst[j * elem + k] = val[i * elem + k];
    }
}

/* out[i] = src[idx[i]] for i < n (elem bytes each); out-of-range indices give zero bytes. */
__global__ void gather_kernel(uint8_t *out, const uint8_t *src, int64_t numel, const int64_t *idx, int64_t n,
                              int elem) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t j = idx[i];
        for (int k = 0; k < elem; k++) out[i * elem + k] = (j >= 0 && j < numel) ? src[j * elem + k] : 0;
    }
}

static unsigned sc_blocks(int64_t n) {
    int64_t b = (n + SC_THREADS - 1) / SC_THREADS;
    return (unsigned)(b > 65535 * 16 ? 65535 * 16 : b); /* grid-stride beyond */
}

extern "C" int cuda_scatter(void *dst, int64_t numel, const int64_t *idx, const void *val, int64_t n, int elem,
                            void *stream, Err *err) {
    if (!dst || numel <= 0 || n < 0 || (n && (!idx || !val)) || (elem != 1 && elem != 2 && elem != 4))
        return ERR(err, 500, "cuda_scatter: bad arguments (numel %lld, n %lld, elem %d)", (long long)numel,
                   (long long)n, elem);
    if (n == 0) return 0;
    scatter_kernel<<<sc_blocks(n), SC_THREADS, 0, (cudaStream_t)stream>>>((uint8_t *)dst, numel, idx,
                                                                           (const uint8_t *)val, n, elem);
    CUDA_TRY_LAUNCH(err);
    return 0;
}

extern "C" int cuda_gather(void *out, const void *src, int64_t numel, const int64_t *idx, int64_t n, int elem,
                           void *stream, Err *err) {
    if (!out || !src || numel <= 0 || n < 0 || (n && !idx) || (elem != 1 && elem != 2 && elem != 4))
        return ERR(err, 500, "cuda_gather: bad arguments (numel %lld, n %lld, elem %d)", (long long)numel,
                   (long long)n, elem);
    if (n == 0) return 0;
    gather_kernel<<<sc_blocks(n), SC_THREADS, 0, (cudaStream_t)stream>>>((uint8_t *)out, (const uint8_t *)src,
                                                                          numel, idx, n, elem);
    CUDA_TRY_LAUNCH(err);
    return 0;
}
