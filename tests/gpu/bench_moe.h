/*
 * bench_moe.h - gpu_check part 3's MoE rows (issue 18): decode of a
 * Qwen3-30B-A3B-shaped model (48 layers, hidden 2048, 32 / 4 heads of 128,
 * 128 experts of moe_intermediate 768, top-8, vocab 151936; 30.5B parameters,
 * random BF16 weights made in device memory) at batch 1 and 64, through
 * model_forward: moe_route and moe_mlp on the device, the step in a CUDA graph.
 * Roofline: the bytes a step must read (attention, routers, lm_head, the
 * experts the step routes to: 8 per layer at batch 1, those a capture step of
 * the same batch size touched at 64, and the KV cache) over the copy bandwidth.
 * Rows "moe30b decode batch B (ctx 512)" -> decode_moe30b_bB_fraction
 * (bench/gpu_json.py). Included by gpu_check.c after bench_decode; not run by
 * the emulation (60 GB of weights). Not here: prefill, FP8 / NVFP4 experts.
 */
#ifndef SAMPLER_BENCH_MOE_H
#define SAMPLER_BENCH_MOE_H

/* Qwen3-30B-A3B shapes: the Qwen3 family's fields of qwen3_8b_config (heads of
 * 128, vocab, RoPE, QK-norm), then what differs. */
static void qwen3_30b_a3b_config(ModelConfig *c) {
    qwen3_8b_config(c);
    c->arch = ARCH_QWEN3_MOE;
    snprintf(c->arch_name, sizeof c->arch_name, "Qwen3MoeForCausalLM (random, Qwen3-30B-A3B shapes)");
    c->hidden = 2048;
    c->n_layers = 48;
    c->n_kv_heads = 4;
    c->intermediate = 6144;
    c->n_experts = 128;
    c->top_k = 8;
    c->moe_intermediate = 768;
    c->norm_topk_prob = 1;
    c->decoder_sparse_step = 1;
}

/* Distinct experts per layer of one decode step of B random tokens, summed over layers. */
static double moe_touched(Runner *r, KVCache *kv, const ModelConfig *c, int B, float *logits, int32_t *tables_mem,
                          int bps) {
    int32_t *tok = xmalloc(sizeof(int32_t) * B), *pos = xmalloc(sizeof(int32_t) * B),
            *seq = xmalloc(sizeof(int32_t) * B), *rows = xmalloc(sizeof(int32_t) * B);
    const int32_t **tables = xmalloc(sizeof(int32_t *) * B);
    int32_t *ex = xmalloc(sizeof(int32_t) * (size_t)B * c->n_layers * c->top_k);
    for (int i = 0; i < B; i++) {
        tok[i] = (int32_t)(rng_u64() % (uint64_t)c->vocab);
        pos[i] = BENCH_CTX;
        seq[i] = rows[i] = i;
        tables[i] = tables_mem + (size_t)i * bps;
    }
    Batch b = {B, tok, pos, seq, B, tables, B, rows, 0};
    Err err = {0};
    runner_set_expert_capture(r, ex);
    if (model_forward(r, kv, &b, logits, &err)) { fprintf(stderr, "fatal: moe capture step: %s\n", err.msg); exit(1); }
    runner_set_expert_capture(r, NULL);
    double touched = 0;
    unsigned char seen[MOE_MAX_EXPERTS];
    for (int l = 0; l < c->n_layers; l++) {
        memset(seen, 0, sizeof seen);
        for (int i = 0; i < B; i++)
            for (int k = 0; k < c->top_k; k++) seen[ex[((size_t)i * c->n_layers + l) * c->top_k + k]] = 1;
        for (int e = 0; e < c->n_experts; e++) touched += seen[e];
    }
    free(tok); free(pos); free(seq); free(rows); free(tables); free(ex);
    return touched;
}

static void bench_moe(void) {
    Model *m = xcalloc(1, sizeof *m);
    ModelConfig *c = &m->cfg;
    qwen3_30b_a3b_config(c);
    size_t H = c->hidden, qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim,
           E = c->n_experts, I = c->moe_intermediate, V = c->vocab;
    size_t attn = qd * H + 2 * kvd * H + H * qd, expert = 3 * I * H, per_layer = attn + E * H + E * expert;
    size_t arena_bytes = ((per_layer + 4 * H) * c->n_layers + 2 * V * H + 8 * H) * 2 +
                         (size_t)(3 * E + 64) * 256 * c->n_layers;
    int max_b = 64, bps = (BENCH_CTX + BENCH_STEPS + BS) / BS, n_blocks = max_b * bps;
    size_t kv_bytes = (size_t)n_blocks * BS * c->n_layers * kvd * 4 * 2;
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    printf("  moe30b: weights %.1f GiB + KV cache %.1f GiB; free %.1f GiB\n", arena_bytes / 1073741824.0,
           kv_bytes / 1073741824.0, free_b / 1073741824.0);
    if ((double)arena_bytes + kv_bytes + (2u << 30) > (double)free_b) {
        printf("  SKIP moe30b bench: too little device memory\n");
        free(m);
        return;
    }
    char *arena = NULL, *cur;
    CUDA_CHECK(cudaMalloc((void **)&arena, arena_bytes));
    cur = arena;
    uint64_t seed = 5000;
    float ws = 0.02f;
    carve_model_ends(m, &cur, &seed, ws);
    WeightMat *ex = xcalloc((size_t)c->n_layers * 3 * E, sizeof(WeightMat));
    for (int l = 0; l < c->n_layers; l++) {
        LayerWeights *w = &m->layers[l];
        carve_layer_attn(w, c, &cur, &seed, ws);
        w->router = wmat(E, H, carve(&cur, E * H, seed++, 0, ws));
        w->egate = ex + (size_t)l * 3 * E;
        w->eup = w->egate + E;
        w->edown = w->egate + 2 * E;
        for (size_t e = 0; e < E; e++) {
            w->egate[e] = wmat(I, H, carve(&cur, I * H, seed++, 0, ws));
            w->eup[e] = wmat(I, H, carve(&cur, I * H, seed++, 0, ws));
            w->edown[e] = wmat(H, I, carve(&cur, H * I, seed++, 0, ws));
        }
    }
    CHECK((size_t)(cur - arena) <= arena_bytes, "moe bench arena overflow (a bug)");
    CUDA_CHECK(cudaDeviceSynchronize());
    Backend *b = backend_cuda_create_resident(c->head_dim, BENCH_MAX_CTX);
    Runner *r = runner_create_with(m, b, max_b, BENCH_MAX_CTX);
    KVCache *kv = runner_kvcache_create(r, n_blocks, BS);
    int32_t *tables = xmalloc(sizeof(int32_t) * (size_t)n_blocks);
    for (int i = 0; i < n_blocks; i++) tables[i] = i;
    float *logits = NULL;
    CUDA_CHECK(cudaMallocHost((void **)&logits, sizeof(float) * (size_t)max_b * V));
    const int batches[] = {1, 64};
    for (int i = 0; i < 2; i++) {
        double touched = moe_touched(r, kv, c, batches[i], logits, tables, bps);
        double bytes = 2.0 * ((double)(attn + E * H) * c->n_layers + touched * expert + (double)V * H);
        printf("  moe30b batch %d: %.1f experts per layer touched, %.2f GB of weights per step\n", batches[i],
               touched / c->n_layers, bytes / 1e9);
        bench_decode(r, kv, c, batches[i], bytes, logits, tables, bps, "moe30b");
    }
    CUDA_CHECK(cudaFreeHost(logits));
    free(tables);
    runner_kvcache_free(r, kv);
    runner_free(r);
    CUDA_CHECK(cudaFree(arena));
    free(ex);
    free(m->layers);
    free(m);
}

#endif
