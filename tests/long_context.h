/*
 * long_context.h - the long-context fixture (tests/fixtures/qwen3_long,
 * scripts/make_fixtures.py make_long_fixture) run through a Runner the way
 * the server's chunked prefill runs a long prompt: LONG_CHUNK tokens per
 * step through the paged KV cache (scattered blocks of LONG_BLOCK slots),
 * then the last LONG_DECODE tokens one per step. Shared by
 * tests/test_long_context.c (CPU vs transformers) and tests/gpu/gpu_check.c
 * (GPU vs transformers and vs the CPU). Not a test by itself: it returns
 * logits, the callers compare them.
 */
#ifndef TESTS_LONG_CONTEXT_H
#define TESTS_LONG_CONTEXT_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "safetensors.h"

#define LONG_DIR "tests/fixtures/qwen3_long"
#define LONG_BLOCK 16
#define LONG_CHUNK 2048 /* tokens per prefill step: vLLM's default max_num_batched_tokens */
#define LONG_DECODE 4   /* the reference's last 4 rows come from one-token steps */
#define LONG_MAX_T 32768
#define LONG_KV_BLOCKS (2 * (LONG_MAX_T / LONG_BLOCK)) /* every other block: scattered tables */

/* One recorded sequence of the reference file. */
typedef struct LongSeq {
    int T, P;                /* tokens, recorded rows */
    const int32_t *tokens;   /* [T] */
    const int32_t *positions; /* [P] ascending, the last LONG_DECODE are T-4..T-1 */
    const float *logits;     /* [P, vocab] transformers f32 */
} LongSeq;

/* Sequence s of ref; 0 with *ls filled, -1 when absent or malformed. */
static inline int long_seq_get(const SafeTensors *ref, int s, int vocab, LongSeq *ls) {
    char key[64];
    snprintf(key, sizeof key, "seq%d.tokens", s);
    const StTensor *tt = safetensors_get(ref, key);
    snprintf(key, sizeof key, "seq%d.positions", s);
    const StTensor *pt = safetensors_get(ref, key);
    snprintf(key, sizeof key, "seq%d.logits", s);
    const StTensor *lt = safetensors_get(ref, key);
    if (!tt || !pt || !lt || tt->dtype != DT_I32 || pt->dtype != DT_I32 || lt->dtype != DT_F32 ||
        tt->numel <= LONG_DECODE || tt->numel > LONG_MAX_T || lt->numel != pt->numel * vocab || pt->numel < LONG_DECODE)
        return -1;
    ls->T = (int)tt->numel;
    ls->P = (int)pt->numel;
    ls->tokens = (const int32_t *)tt->data;
    ls->positions = (const int32_t *)pt->data;
    ls->logits = (const float *)lt->data;
    for (int k = 0; k < ls->P; k++)
        if (ls->positions[k] < 0 || ls->positions[k] >= ls->T || (k && ls->positions[k] <= ls->positions[k - 1]))
            return -1;
    return ls->positions[ls->P - LONG_DECODE] == ls->T - LONG_DECODE ? 0 : -1;
}

/* Runs ls through r and kv (LONG_KV_BLOCKS blocks of LONG_BLOCK); out[P,
 * vocab] gets the logits of the recorded positions, in order. Returns 0, or -1
 * with err when a step failed. */
static inline int long_seq_run(Runner *r, KVCache *kv, const LongSeq *ls, int vocab, float *out, Err *err) {
    int T = ls->T, nb = (T + LONG_BLOCK - 1) / LONG_BLOCK, rc = 0;
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)nb);
    for (int i = 0; i < nb; i++) bt[i] = (nb - 1 - i) * 2 + 1; /* descending, every other id */
    const int32_t *tables[1] = {bt};
    int32_t *pos = malloc(sizeof(int32_t) * LONG_CHUNK), *seq = calloc(LONG_CHUNK, sizeof(int32_t)),
            *rows = malloc(sizeof(int32_t) * LONG_CHUNK);
    int k = 0;
    for (int t = 0; t < T && rc == 0;) {
        int left = T - LONG_DECODE - t, n = left > 0 ? (left < LONG_CHUNK ? left : LONG_CHUNK) : 1;
        int n_out = 0, k0 = k;
        for (int i = 0; i < n; i++) {
            pos[i] = t + i;
            while (k < ls->P && ls->positions[k] == t + i) { rows[n_out++] = i; k++; }
        }
        Batch b = {n, ls->tokens + t, pos, seq, 1, tables, n_out, rows, 0};
        rc = model_forward(r, kv, &b, out + (size_t)k0 * vocab, err);
        t += n;
    }
    free(rows);
    free(seq);
    free(pos);
    free(bt);
    return rc;
}

#endif
