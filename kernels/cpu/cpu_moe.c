/*
 * cpu_moe.c - MoE routing on the host (Backend.moe_route of the CPU backend):
 * HF Qwen3MoE's softmax over all experts in f32, top-k, optional
 * renormalisation, then the (token, k) pairs counting-sorted by expert. The
 * exact operations and their order are the contract (backend.h MoeRouteArgs):
 * this is the reference the CUDA kernels (kernels/cuda/moe_route.cu) are
 * checked against, and forward.c's MoE layers on the CPU run it.
 * Not here: the experts' matmuls (forward.c runs them one expert at a time).
 */
#include <math.h>
#include <string.h>

#include "backend.h"
#include "check.h"
#include "cpu_ops.h"

/* Token t's top-k: ids descending by p, ties to the lower id. */
static void route_token(const MoeRouteArgs *a, int t, int ld) {
    int E = a->n_experts, K = a->top_k;
    const float *l = a->logits + (size_t)t * E;
    float p[MOE_MAX_EXPERTS], mx = -INFINITY, sum = 0.f;
    for (int e = 0; e < E; e++) mx = l[e] > mx ? l[e] : mx;
    for (int e = 0; e < E; e++) sum += (p[e] = expf(l[e] - mx));
    for (int e = 0; e < E; e++) p[e] /= sum;
    int32_t *idx = a->ids + (size_t)t * ld;
    float *wk = a->weights + (size_t)t * K, wsum = 0.f;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int j = 0; j < k; j++) taken |= idx[j] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        idx[k] = best;
        wsum += (wk[k] = p[best]);
    }
    if (a->norm)
        for (int k = 0; k < K; k++) wk[k] /= wsum;
}

void cpu_moe_route(const MoeRouteArgs *a) {
    int E = a->n_experts, K = a->top_k, ld = a->ids_ld ? a->ids_ld : K;
    ASSERT(E >= 1 && E <= MOE_MAX_EXPERTS && K >= 1 && K <= MOE_MAX_TOPK && K <= E && a->n >= 0 && ld >= K,
           "moe_route: %d experts, top %d, ids rows of %d", E, K, ld);
    for (int t = 0; t < a->n; t++) route_token(a, t, ld);
    int32_t *off = a->offsets;
    memset(off, 0, sizeof(int32_t) * (size_t)(E + 1));
    for (int t = 0; t < a->n; t++)
        for (int k = 0; k < K; k++) off[a->ids[(size_t)t * ld + k] + 1]++;
    for (int e = 0; e < E; e++) off[e + 1] += off[e];
    for (int t = 0; t < a->n; t++) /* tokens ascending within each expert */
        for (int k = 0; k < K; k++) {
            int i = t * K + k, p = off[a->ids[(size_t)t * ld + k]]++;
            a->pair_tok[p] = t;
            a->pair_w[p] = a->weights[i];
            a->pair_of[i] = p;
        }
    for (int e = E; e > 0; e--) off[e] = off[e - 1]; /* back to starts */
    off[0] = 0;
    int na = 0;
    for (int e = 0; e < E; e++)
        if (off[e + 1] > off[e]) a->active[na++] = e;
    for (int s = na; s < E; s++) a->active[s] = -1;
}
