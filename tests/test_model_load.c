/*
 * test_model_load.c - model loading beyond the happy path:
 *   - an F32 copy of a BF16 checkpoint loads (converted to BF16 at load) and
 *     gives bit-identical logits (bf16 -> f32 -> bf16 is exact);
 *   - an F16 copy loads and gives logits within the F16 rounding of the weights;
 *   - config errors are refused with a message naming what is supported;
 *   - a checkpoint missing a tensor or with a wrong shape names the tensor.
 */
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "logit_stats.h"
#include "model.h"
#include "test.h"

/* Write every tensor of src converted to dtype dt (F32 or F16) as one file. */
static void write_converted(const SafeTensors *src, const char *path, Dtype dt) {
    char *hdr = malloc(1 << 20);
    size_t hl = 0, off = 0;
    hl += (size_t)sprintf(hdr + hl, "{");
    for (int i = 0; i < src->n; i++) {
        const StTensor *t = &src->t[i];
        size_t nb = (size_t)t->numel * dtype_size(dt);
        hl += (size_t)sprintf(hdr + hl, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", t->name, dtype_name(dt));
        for (int d = 0; d < t->ndim; d++) hl += (size_t)sprintf(hdr + hl, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        hl += (size_t)sprintf(hdr + hl, "],\"data_offsets\":[%zu,%zu]}", off, off + nb);
        off += nb;
    }
    hl += (size_t)sprintf(hdr + hl, "}");
    FILE *f = fopen(path, "wb");
    uint64_t n = hl;
    fwrite(&n, 8, 1, f);
    fwrite(hdr, 1, hl, f);
    for (int i = 0; i < src->n; i++) {
        const StTensor *t = &src->t[i];
        for (int64_t j = 0; j < t->numel; j++) {
            uint16_t h;
            memcpy(&h, t->data + 2 * j, 2);
            float v = bf16_to_f32(h);
            if (dt == DT_F32) fwrite(&v, 4, 1, f);
            else { /* f32 -> f16, round to nearest even (values here are small normals) */
                uint32_t u;
                memcpy(&u, &v, 4);
                uint32_t sign = (u >> 16) & 0x8000, e = (u >> 23) & 0xff, m = u & 0x7fffff;
                uint16_t r = (uint16_t)sign;
                if (e >= 113 && e <= 142) {
                    uint32_t mm = m >> 13, rem = m & 0x1fff;
                    r = (uint16_t)(sign | ((e - 112) << 10) | mm);
                    if (rem > 0x1000 || (rem == 0x1000 && (mm & 1))) r++;
                }
                fwrite(&r, 2, 1, f);
            }
        }
    }
    fclose(f);
    free(hdr);
}

static float *prefill(Model *m, int T) {
    Runner *r = runner_create(m, T, T, 1);
    KVCache *kv = kvcache_create(&m->cfg, (T + 15) / 16, 16);
    int32_t bt[8] = {0, 1, 2, 3, 4, 5, 6, 7}, tok[64], pos[64], seq[64] = {0}, rows[64];
    for (int i = 0; i < T; i++) { tok[i] = (i * 31 + 7) % m->cfg.vocab; pos[i] = i; rows[i] = i; }
    const int32_t *tables[1] = {bt};
    float *out = malloc(sizeof(float) * (size_t)T * m->cfg.vocab);
    Batch b = {T, tok, pos, seq, 1, tables, T, rows, 0};
    Err err = {0};
    T_ASSERT(model_forward(r, kv, &b, out, &err) == 0, "%s", err.msg);
    kvcache_free(kv);
    runner_free(r);
    return out;
}

static void copy_file(const char *from, const char *to) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0) fwrite(buf, 1, n, b);
    fclose(a);
    fclose(b);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

int main(void) {
    const char *base = "tests/fixtures/qwen2";
    char tmp[] = "/tmp/sampler_load_XXXXXX";
    T_ASSERT(mkdtemp(tmp) != NULL, "mkdtemp");
    char path[512];
    Err err = {0};
    SafeTensors *st = NULL;
    T_ASSERT(safetensors_open(&st, base, &err) == 0, "%s", err.msg);
    Model *ref = NULL;
    T_ASSERT(model_load(&ref, base, &err) == 0, "%s", err.msg);
    float *lr = prefill(ref, 12);

    Dtype dts[2] = {DT_F32, DT_F16};
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/%s", tmp, dtype_name(dts[k]));
        mkdir(path, 0700);
        char f[600];
        snprintf(f, sizeof f, "%s/model.safetensors", path);
        write_converted(st, f, dts[k]);
        snprintf(f, sizeof f, "%s/config.json", path);
        copy_file("tests/fixtures/qwen2/config.json", f);
        Model *m = NULL;
        int rc = model_load(&m, path, &err);
        T_ASSERT(rc == 0, "%s checkpoint: %s", dtype_name(dts[k]), err.msg);
        if (rc) continue;
        float *l = prefill(m, 12);
        LogitStats s = logit_stats(lr, l, 12, m->cfg.vocab);
        printf("%s checkpoint: max |dlogit| vs bf16 %.2e, KL %.2e\n", dtype_name(dts[k]), s.max_abs, s.max_kl);
        if (dts[k] == DT_F32) T_ASSERT(s.max_abs == 0, "F32 copy of a BF16 checkpoint must be exact");
        else T_ASSERT(s.max_abs < 0.05 && s.max_abs > 0, "F16 copy: %.3e (bf16 -> f16 is exact in f16's "
                      "normal range; weights below 2^-14 lose bits, so small nonzero error)", s.max_abs);
        free(l);
        model_free(m);
    }

    /* Missing tensor and wrong shape name the tensor. */
    snprintf(path, sizeof path, "%s/bad", tmp);
    mkdir(path, 0700);
    char f[600];
    snprintf(f, sizeof f, "%s/config.json", path);
    write_text(f, "{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":2,"
                  "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":120,"
                  "\"vocab_size\":512,\"tie_word_embeddings\":true}");
    snprintf(f, sizeof f, "%s/model.safetensors", path);
    copy_file("tests/fixtures/qwen3_gqa2/model.safetensors", f);
    Model *m = NULL;
    T_ASSERT(model_load(&m, path, &err) != 0 && strstr(err.msg, "tensor 'model.layers.0.self_attn.q_proj"),
             "wrong checkpoint accepted or error does not name the tensor: %s", err.msg);
    snprintf(f, sizeof f, "%s/config.json", path);
    write_text(f, "{\"architectures\":[\"GPT2LMHeadModel\"]}");
    T_ASSERT(model_load(&m, path, &err) != 0 && strstr(err.msg, "Qwen3ForCausalLM"),
             "unknown architecture must list the supported ones: %s", err.msg);
    write_text(f, "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":2,"
                  "\"num_attention_heads\":4,\"intermediate_size\":8,\"vocab_size\":9,"
                  "\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}");
    T_ASSERT(model_load(&m, path, &err) != 0 && strstr(err.msg, "yarn") && strstr(err.msg, "llama3"),
             "unsupported rope scaling must be refused: %s", err.msg);
    write_text(f, "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":2,"
                  "\"num_attention_heads\":3,\"num_key_value_heads\":2,\"intermediate_size\":8,\"vocab_size\":9}");
    T_ASSERT(model_load(&m, path, &err) != 0, "heads not divisible by kv heads accepted");
    T_ASSERT(m == NULL, "failed load returned a model");

    free(lr);
    model_free(ref);
    safetensors_free(st);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    T_ASSERT(system(cmd) == 0, "cleanup");
    return T_DONE();
}
