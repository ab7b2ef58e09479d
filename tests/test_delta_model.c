/*
 * test_delta_model.c - deltas applied in place to a loaded model compute
 * exactly what the model loaded from the updated checkpoint computes: for
 * BF16 weights and for quantize-on-load FP8 and NVFP4 (the touched blocks
 * re-quantized by delta_model_requant), the logits after the update are
 * bit-identical to those of a fresh load of the new checkpoint, and the
 * reported hashes equal that checkpoint's. A refused delta leaves the logits
 * bit-identical to before.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "delta.h"
#include "model.h"
#include "test.h"

#define T_TOK 12

static float *logits(Model *m) {
    int32_t tok[T_TOK], pos[T_TOK], seq[T_TOK], rows[T_TOK], bt[4] = {0, 1, 2, 3};
    for (int i = 0; i < T_TOK; i++) {
        tok[i] = (i * 37 + 11) % m->cfg.vocab;
        pos[i] = i;
        seq[i] = 0;
        rows[i] = i;
    }
    Runner *r = runner_create(m, T_TOK, T_TOK, 2);
    KVCache *kv = kvcache_create(&m->cfg, 4, 16);
    const int32_t *tables[1] = {bt};
    float *out = xmalloc(sizeof(float) * T_TOK * (size_t)m->cfg.vocab);
    Batch b = {T_TOK, tok, pos, seq, 1, tables, T_TOK, rows, 0};
    Err err = {0};
    T_ASSERT(model_forward(r, kv, &b, out, &err) == 0, "forward: %s", err.msg);
    kvcache_free(kv);
    runner_free(r);
    return out;
}

static void copy_file(const char *src, const char *dst) {
    FILE *a = fopen(src, "rb"), *b = fopen(dst, "wb");
    CHECK(a && b, "copy %s -> %s", src, dst);
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0) CHECK(fwrite(buf, 1, n, b) == n, "write %s", dst);
    fclose(a);
    fclose(b);
}

/* New bits for tensor k: LSB flips at a sparse pattern; two tensors dense. */
static void new_bits(const char *name, int k, const uint16_t *old, uint16_t *nw, int64_t n) {
    int dense = strstr(name, "layers.0.mlp.up_proj") || strcmp(name, "model.norm.weight") == 0;
    for (int64_t i = 0; i < n; i++)
        nw[i] = (uint16_t)(old[i] ^ (dense || ((uint64_t)i * 2654435761u + (uint64_t)k) % 37 == 0));
}

static void check(const char *dir, Precision p) {
    Err err = {0};
    LoadOptions o = {p, 0, 0};
    Model *m = NULL;
    if (model_load_opts(&m, dir, &o, &err) != 0) {
        T_ASSERT(0, "%s: %s", dir, err.msg);
        return;
    }
    WeightVersion *wv = weight_version_from_safetensors(m->st, 2);
    char tmp[] = "/tmp/test_delta_model_XXXXXX", path[512], src[512];
    CHECK_PTR(mkdtemp(tmp), "mkdtemp");
    const char *files[] = {"config.json", "generation_config.json", "model.safetensors"};
    for (int i = 0; i < 3; i++) {
        snprintf(src, sizeof src, "%s/%s", dir, files[i]);
        snprintf(path, sizeof path, "%s/%s", tmp, files[i]);
        if (access(src, R_OK) == 0) copy_file(src, path);
    }
    /* The delta, and the same update written into the copied checkpoint. */
    SafeTensors *st = m->st;
    DeltaRecord *rec = xcalloc((size_t)st->n, sizeof(DeltaRecord));
    int nrec = 0;
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    int fd = open(path, O_WRONLY);
    CHECK(fd >= 0, "open %s", path);
    for (int k = 0; k < st->n; k++) {
        const StTensor *t = &st->t[k];
        if (t->dtype != DT_BF16) continue;
        uint16_t *nw = xmalloc(t->nbytes);
        new_bits(t->name, k, (const uint16_t *)t->data, nw, t->numel);
        T_ASSERT(delta_encode_tensor(&rec[nrec], t->name, t->dtype, t->ndim, t->shape, t->data, nw, 3, k % 2, &err) == 0,
                 "%s", err.msg);
        if (rec[nrec].n_changed) nrec++;
        CHECK(pwrite(fd, nw, t->nbytes, (off_t)(t->data - st->maps[t->file])) == (ssize_t)t->nbytes, "pwrite");
        free(nw);
    }
    close(fd);
    DeltaHeader h = {.fingerprint = wv->fingerprint, .base_version = 0, .target_version = 1};
    size_t n;
    uint8_t *d = delta_serialize(&h, rec, nrec, &n);

    float *before = logits(m);
    DeltaTarget tgt = {.lookup = delta_lookup_model, .ctx = m, .touched = delta_model_requant, .touched_ctx = m,
                       .n_threads = 2};
    DeltaResult res;
    /* refused first (the sampler is at another version): nothing moves */
    WeightVersion lie = *wv;
    lie.version = 7;
    T_ASSERT(delta_apply(d, n, &tgt, &lie, &res, &err) == -409, "wrong base refused");
    float *same = logits(m);
    T_ASSERT(memcmp(before, same, sizeof(float) * T_TOK * (size_t)m->cfg.vocab) == 0, "refused: logits unchanged");
    int rc = delta_apply(d, n, &tgt, wv, &res, &err);
    T_ASSERT(rc == 0 && res.tensors_updated == nrec, "%s %s: apply: %s", dir, precision_name(p), err.msg);
    float *after = logits(m);

    Model *m2 = NULL;
    T_ASSERT(model_load_opts(&m2, tmp, &o, &err) == 0, "load updated checkpoint: %s", err.msg);
    if (m2) {
        float *fresh = logits(m2);
        size_t nb = sizeof(float) * T_TOK * (size_t)m->cfg.vocab;
        T_ASSERT(memcmp(after, fresh, nb) == 0, "%s %s: logits after the in-place update == fresh load", dir,
                 precision_name(p));
        T_ASSERT(memcmp(after, before, nb) != 0, "%s %s: the update changed the logits", dir, precision_name(p));
        WeightVersion *w2 = weight_version_from_safetensors(m2->st, 2);
        T_ASSERT(w2->n == wv->n && memcmp(w2->hash, wv->hash, sizeof(uint64_t) * (size_t)wv->n) == 0,
                 "reported hashes == the new checkpoint's");
        weight_version_free(w2);
        free(fresh);
        model_free(m2);
    }
    printf("%-28s %-5s %d tensors updated, %lld elements; logits bit-identical to a fresh load\n", dir,
           precision_name(p), res.tensors_updated, (long long)res.elements_updated);
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", tmp, files[i]);
        unlink(path);
    }
    rmdir(tmp);
    for (int i = 0; i < nrec; i++) delta_record_free(&rec[i]);
    free(rec);
    free(d);
    free(before);
    free(same);
    free(after);
    weight_version_free(wv);
    model_free(m);
}

int main(void) {
    check("tests/fixtures/qwen3_gqa2", PREC_BF16); /* tied embeddings */
    check("tests/fixtures/llama31", PREC_BF16);
    check("tests/fixtures/qwen3_gqa2", PREC_FP8);
    check("tests/fixtures/llama31", PREC_FP8);
    check("tests/fixtures/llama31", PREC_NVFP4);
    return T_DONE();
}
