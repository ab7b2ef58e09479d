/*
 * lora_checks.h - LoRA adapters end to end on the CUDA backend, ONE check for
 * both places that run it: tests/gpu/gpu_check.c (part 2, a real GPU) and
 * tests/gpu/emu/emu_check.cpp (the CPU emulation). Uses n_pass / n_fail and
 * compare helpers of op_checks.h (include that first).
 *
 * A fixture with the two committed PEFT adapters of tests/fixtures/lora
 * (scripts/make_lora_golden.py) on a GPU runner (backend_cuda_create, the
 * adapters uploaded into the runner's pool: runner_reserve_lora +
 * runner_set_lora) and on a CPU runner:
 *   - one mixed step of 8 tokens (GEMV path: f32 throughout): a1's sequence,
 *     a base sequence and a2's sequence; then one decode token each. Every
 *     row against the CPU runner and the adapted rows against transformers +
 *     peft (the golden), bounds of part 2's f32 class: 1e-3 / 1e-7 (measured
 *     on the emulation: see tests/gpu/README.md), while an adapter moves these
 *     logits by 7-12, so a lost target, scale or row is far outside;
 *   - slot 0 replaced in place by a2 (the spare region), then decode: against
 *     the CPU runner with the same replacement;
 *   - quick (sanitizer builds of the emulation): no decode step of the three,
 *     and the fault loop runs its forward after the first failure only;
 *   - where fail_nth is given (the emulation's fault injection): each CUDA call
 *     of a further replacement's upload fails in turn; runner_set_lora must
 *     return the error and the slot must keep serving a2, bit for bit;
 *   - with bf16 = 1 the adapters are stored as BF16 (--lora-dtype bfloat16;
 *     the committed adapters are BF16-exact, so the same bounds hold).
 */
#ifndef SAMPLER_LORA_CHECKS_H
#define SAMPLER_LORA_CHECKS_H

#ifdef __cplusplus
extern "C" {
#endif
#include "logit_stats.h"
#include "lora.h"
#include "model.h"
#include "safetensors.h"
#ifdef __cplusplus
}
#endif

static void lc_report(const char *what, const float *ref, const float *got, int rows, int V) {
    LogitStats st = logit_stats(ref, got, rows, V);
    int ok = st.max_abs <= 1e-3 && st.max_kl <= 1e-7;
    ok ? n_pass++ : n_fail++;
    printf("  %-4s %-58s max|dlogit| %.2e KL %.2e\n", ok ? "ok" : "FAIL", what, st.max_abs, st.max_kl);
}
static void lc_verdict(int ok, const char *what) {
    ok ? n_pass++ : n_fail++;
    printf("  %-4s %s\n", ok ? "ok" : "FAIL", what);
}

static void lora_model_check(const char *fixture, int bf16, int quick, void (*fail_nth)(long), int (*failed)(void)) {
    char dir[256], path[320], what[200];
    snprintf(dir, sizeof dir, "tests/fixtures/%s", fixture);
    Err err = {0};
    Model *m = NULL;
    SafeTensors *ref = NULL;
    LoraAdapter *ad[2] = {NULL, NULL};
    snprintf(path, sizeof path, "tests/fixtures/lora/%s.ref.safetensors", fixture);
    int bad = model_load(&m, dir, &err) || safetensors_open(&ref, path, &err);
    LoraLoadOpts lo = {64, bf16 ? LORA_DTYPE_BF16 : LORA_DTYPE_F32};
    for (int a = 0; !bad && a < 2; a++) {
        snprintf(path, sizeof path, "tests/fixtures/lora/%s-a%d", fixture, a + 1);
        bad = lora_load_opts(&ad[a], &m->cfg, path, &lo, NULL, path, &err);
    }
    if (bad) {
        printf("  FAIL lora %s: %s\n", fixture, err.msg);
        n_fail++;
        for (int a = 0; a < 2; a++) lora_free(ad[a]);
        if (ref) safetensors_free(ref);
        if (m) model_free(m);
        return;
    }
    int V = m->cfg.vocab;
    Backend *gb = backend_cuda_create(&m->weights, m->cfg.head_dim, 128);
    Runner *rc = runner_create_with(m, backend_cpu_create(1, 128), 64, 128), *rg = runner_create_with(m, gb, 64, 128);
    runner_reserve_lora(rg, 2, 16, lo.dtype);
    KVCache *kvc = runner_kvcache_create(rc, 40, 4), *kvg = runner_kvcache_create(rg, 40, 4);
    for (int a = 0; a < 2; a++) {
        int ok = runner_set_lora(rc, a, ad[a], &err) == 0 && runner_set_lora(rg, a, ad[a], &err) == 0;
        if (!ok) printf("       (%s)\n", err.msg);
        snprintf(what, sizeof what, "lora %s: adapter a%d uploaded to the GPU pool%s", fixture, a + 1,
                 bf16 ? " (bf16)" : "");
        lc_verdict(ok, what);
    }
    /* sequences: 0 = a1 seq0, 1 = base (a1 seq1's tokens), 2 = a2 seq0; 3 + 3 + 2 prompt tokens */
    const int32_t *stok[3];
    const float *sref[3] = {NULL, NULL, NULL};
    const char *sname[3] = {"a1.seq0", "a1.seq1", "a2.seq0"};
    int plen[3] = {3, 3, 2}, slot[3] = {0, -1, 1}, ok_ref = 1;
    for (int q = 0; q < 3; q++) {
        char nm[64];
        snprintf(nm, sizeof nm, "%s.tokens", sname[q]);
        const StTensor *t = safetensors_get(ref, nm);
        snprintf(nm, sizeof nm, "%s.logits", sname[q]);
        const StTensor *l = safetensors_get(ref, nm);
        ok_ref &= t && l && t->numel >= plen[q] + 1;
        stok[q] = t ? (const int32_t *)t->data : NULL;
        sref[q] = l ? (const float *)l->data : NULL;
    }
    if (!ok_ref) lc_verdict(0, "lora: the golden lacks a1.seq0 / a1.seq1 / a2.seq0");
    int32_t tok[8], pos[8], seq[8], rows[8], lt[8], bt[3][8];
    for (int q = 0; q < 3; q++)
        for (int i = 0; i < 8; i++) bt[q][i] = 1 + 10 * q + i;
    const int32_t *tables[3] = {bt[0], bt[1], bt[2]};
    float *oc = (float *)xmalloc(sizeof(float) * 8 * V), *og = (float *)xmalloc(sizeof(float) * 8 * V);
    float *wantv = (float *)xmalloc(sizeof(float) * 8 * V);
    int n = 0, rc1 = 0, rc2 = 0;
    for (int q = 0; ok_ref && q < 3; q++)
        for (int i = 0; i < plen[q]; i++, n++) {
            tok[n] = stok[q][i]; pos[n] = i; seq[n] = q; rows[n] = n; lt[n] = slot[q];
        }
    if (ok_ref) {
        Batch b = {n, tok, pos, seq, 3, tables, n, rows, 0};
        runner_set_lora_tokens(rc, lt);
        runner_set_lora_tokens(rg, lt);
        rc1 = model_forward(rc, kvc, &b, oc, &err);
        rc2 = model_forward(rg, kvg, &b, og, &err);
        if (rc1 || rc2) lc_verdict(0, err.msg);
        snprintf(what, sizeof what, "lora %s mixed step (a1, base, a2; 8 tokens) vs cpu", fixture);
        lc_report(what, oc, og, n, V);
        /* the adapted rows against transformers + peft */
        int k = 0, g = 0;
        for (int q = 0; q < 3; q++)
            for (int i = 0; i < plen[q]; i++, g++)
                if (slot[q] >= 0) {
                    memcpy(wantv + (size_t)k * V, sref[q] + (size_t)i * V, sizeof(float) * V);
                    memmove(og + (size_t)k * V, og + (size_t)g * V, sizeof(float) * V);
                    k++;
                }
        snprintf(what, sizeof what, "lora %s mixed step, adapted rows vs transformers + peft", fixture);
        lc_report(what, wantv, og, k, V);
        /* one decode token per sequence (quick: sanitizer builds, where a forward pass of the emulation
         * costs ~30 s, go from the mixed step to the replacement) */
        n = 0;
        for (int q = 0; q < 3; q++, n++) {
            tok[n] = stok[q][plen[q]]; pos[n] = plen[q]; seq[n] = q; rows[n] = n; lt[n] = slot[q];
        }
        Batch d = {3, tok, pos, seq, 3, tables, 3, rows, 0};
        rc1 = quick ? 0 : model_forward(rc, kvc, &d, oc, &err);
        rc2 = quick ? 0 : model_forward(rg, kvg, &d, og, &err);
        if (rc1 || rc2) lc_verdict(0, err.msg);
        if (!quick) {
            snprintf(what, sizeof what, "lora %s decode of the three vs cpu", fixture);
            lc_report(what, oc, og, 3, V);
            memcpy(wantv, sref[0] + (size_t)plen[0] * V, sizeof(float) * V);
            snprintf(what, sizeof what, "lora %s decode a1 vs transformers + peft", fixture);
            lc_report(what, wantv, og, 1, V);
        }
        /* slot 0 replaced in place by a2 (the spare region), decode seq 0's next position */
        int okr = runner_set_lora(rc, 0, ad[1], &err) == 0 && runner_set_lora(rg, 0, ad[1], &err) == 0;
        lc_verdict(okr, "lora: slot 0 replaced in place by a2 (upload into the spare region)");
        /* quick: seq 0's next position is plen[0] (no decode step above) */
        int32_t t1 = stok[0][plen[0] + !quick], p1 = plen[0] + !quick, s1 = 0, r1 = 0, l1 = 0;
        Batch d1 = {1, &t1, &p1, &s1, 1, tables, 1, &r1, 0};
        runner_set_lora_tokens(rc, &l1);
        runner_set_lora_tokens(rg, &l1);
        rc1 = model_forward(rc, kvc, &d1, oc, &err);
        rc2 = model_forward(rg, kvg, &d1, og, &err);
        if (rc1 || rc2) lc_verdict(0, err.msg);
        snprintf(what, sizeof what, "lora %s decode on the replaced slot vs cpu", fixture);
        lc_report(what, oc, og, 1, V);
        if (fail_nth) {
            /* every CUDA call of a replacement's upload fails in turn: error, and a2 still serves */
            float *before = (float *)xmalloc(sizeof(float) * V);
            memcpy(before, og, sizeof(float) * V);
            int injected = 0, wrong = 0;
            for (long k2 = 1; k2 < 20; k2++) {
                Err fe = {0};
                fail_nth(k2);
                int frc = runner_set_lora(rg, 0, ad[0], &fe);
                int fired = failed();
                fail_nth(0);
                if (!fired) {
                    if (frc == 0) runner_set_lora(rg, 0, ad[1], &fe); /* it went through: back to a2 */
                    break;
                }
                injected++;
                if (frc == 0) { wrong++; runner_set_lora(rg, 0, ad[1], &fe); continue; }
                if (quick && injected > 1) continue; /* quick: the forward after the first failure only */
                rc2 = model_forward(rg, kvg, &d1, og, &err); /* the same position again: a2's logits */
                if (rc2 || memcmp(og, before, sizeof(float) * V)) wrong++;
            }
            snprintf(what, sizeof what, "lora %s: %d failed uploads in turn, each refused, slot kept a2 bit for bit "
                     "(%d wrong)", fixture, injected, wrong);
            lc_verdict(injected >= 1 && wrong == 0, what);
            free(before);
        }
        runner_set_lora_tokens(rc, NULL);
        runner_set_lora_tokens(rg, NULL);
    }
    free(oc); free(og); free(wantv);
    runner_kvcache_free(rg, kvg);
    runner_kvcache_free(rc, kvc);
    runner_free(rg);
    runner_free(rc);
    for (int a = 0; a < 2; a++) lora_free(ad[a]);
    safetensors_free(ref);
    model_free(m);
}

#endif
