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
 * (bench/gpu_json.py), B = 1, 16, 32, 64; "moe30b_gemv" at 16, 32, 64: the
 * same steps with the grouped GEMV instead of the tensor-core GEMM (the
 * backend's tokens > 8 rule, unmeasured until these rows). Up to 8 tokens the
 * experts take the grouped GEMV or the grouped mma from a record measured as
 * start-up measures it (device_moe_gemv_crossover_on; row
 * moe30b_experts_mma_min_n, 0: never), before the batch-1 rows; batch 1 again
 * without PDL (decode_moe30b_b1_pdl_off_tok_s), without the down GEMV's
 * unpermute epilogue (decode_moe30b_b1_unpermute_off_tok_s), without the
 * router GEMV's routing epilogue (decode_moe30b_b1_router_route_off_tok_s) and
 * without the add + norm epilogues (decode_moe30b_b1_add_norm_off_tok_s). Included by
 * gpu_check.c after bench_decode; not run by the emulation (60 GB of weights).
 * bench_moe_prefill: one such layer's routed experts at a 1024-token prefill,
 * the grouped path (moe_mma.cu) against the per-expert path it replaced.
 * bench_moe_prefill_fp8: the same layer with FP8 experts (128x128 blocks), the
 * native grouped GEMM (e4m3 activations, moe_mma.cu fmt 3) against the
 * weight-only grouped GEMM (f32 activations as bf16 hi + lo); then that
 * layer's crossover between the two, measured as a server measures it at
 * start-up (device_moe_crossover_on, up to 512 tokens; row
 * moe30b_fp8_native_crossover_n, -1: native never won).
 * Not here: a whole-model MoE prefill, NVFP4 experts.
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

/* mid = 0: batch 1 and 64 (+ their routed-experts twins); 1: the 16-64 rows of both paths (a section
 * of its own, so that a failure there cannot cost the first rows). */
static void bench_moe(int mid) {
    Model *m = xcalloc(1, sizeof *m);
    ModelConfig *c = &m->cfg;
    qwen3_30b_a3b_config(c);
    size_t H = c->hidden, qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim,
           E = c->n_experts, I = c->moe_intermediate, V = c->vocab;
    size_t attn = qd * H + 2 * kvd * H + H * qd, expert = 3 * I * H, per_layer = attn + E * H + E * expert;
    size_t arena_bytes = ((per_layer + 4 * H) * c->n_layers + 2 * V * H + 8 * H) * 2 +
                         (size_t)(3 * E + 64) * 256 * c->n_layers;
    int max_b = 64, bps = (BENCH_CTX + BENCH_STEPS + BS) / BS, n_blocks = max_b * bps;
    size_t kv_bytes = (size_t)n_blocks * BS * c->n_layers * kvd * 2 * 2; /* BF16, the server's default KV */
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
    KVCache *kv = runner_kvcache_create_dtype(r, n_blocks, BS, KV_BF16);
    int32_t *tables = xmalloc(sizeof(int32_t) * (size_t)n_blocks);
    for (int i = 0; i < n_blocks; i++) tables[i] = i;
    float *logits = NULL;
    CUDA_CHECK(cudaMallocHost((void **)&logits, sizeof(float) * (size_t)max_b * V));
    int32_t *capture = (int32_t *)runner_host_alloc(r, sizeof(int32_t) * (size_t)max_b * c->n_layers * c->top_k);
    if (!mid) { /* as the server's start-up (device_gemv_calibrate): the experts' grouped GEMV or grouped mma
                 * up to 8 tokens, measured on layer 0; the batch-1 rows below run what it chose */
        NativeCrossover x;
        int rc = device_moe_gemv_crossover_on(b, m, 0, &x), rec = rc == 0 && x.min_n != INT_MAX ? x.min_n : 0;
        for (int i = 0; rc == 0 && i < x.points; i++)
            printf("  moe30b experts n=%d grouped GEMV %9.1f us  grouped mma %9.1f us\n", x.n[i], x.wo_us[i],
                   x.native_us[i]);
        printf("  moe30b experts: grouped mma from n = %d (0: never; rc %d)\n", rec, rc);
        native_row("moe30b_experts_mma_min_n", rec);
        for (size_t k = 0; k < (size_t)c->n_layers * 3 * E; k++) ex[k].mma_min_n = rec;
    }
    const int batches[] = {1, 64};
    double bytes_b1 = 0;
    for (int i = 0; i < (mid ? 0 : 2); i++) {
        double touched = moe_touched(r, kv, c, batches[i], logits, tables, bps);
        double bytes = 2.0 * ((double)(attn + E * H) * c->n_layers + touched * expert + (double)V * H);
        if (batches[i] == 1) bytes_b1 = bytes;
        printf("  moe30b batch %d: %.1f experts per layer touched, %.2f GB of weights per step\n", batches[i],
               touched / c->n_layers, bytes / 1e9);
        bench_decode(r, kv, c, batches[i], bytes, logits, tables, bps, "moe30b");
        /* the same steps capturing every layer's routed experts (return_routed_experts, routing
         * replay): the same graphs, one more copy a step (it ran eagerly, a host wait per layer, before) */
        runner_set_expert_capture(r, capture);
        bench_decode(r, kv, c, batches[i], bytes, logits, tables, bps, "moe30b_experts");
        runner_set_expert_capture(r, NULL);
    }
    runner_host_free(r, capture);
    /* batch 1 again without programmatic dependent launch (cuda_pdl.cuh): an MoE decode step is ~10 short
     * kernels a layer, where it should pay most. Its own one-sequence cache, so the step is captured again
     * without it (forward.c keys graphs to the cache). Row decode_moe30b_b1_pdl_off_tok_s. */
    if (!mid && cuda_pdl_enabled()) {
        KVCache *kvp = runner_kvcache_create_dtype(r, bps, BS, KV_BF16);
        cuda_pdl_enable(0);
        bench_decode(r, kvp, c, 1, bytes_b1, logits, tables, bps, "moe30b pdl off");
        cuda_pdl_enable(1);
        runner_kvcache_free(r, kvp);
        native_row("decode_moe30b_b1_pdl_off_tok_s", rows_out[n_rows - 1].tok_s);
    }
    /* batch 1 again with each of the MoE layer's epilogue fusions off (SAMPLER_CUDA_OFF): the down GEMV
     * and the weighted unpermute, the router's GEMV and the routing, as two launches each, as before; the
     * residual projections (o, the routed experts' down) then the residual add + RMSNorm.
     * Rows decode_moe30b_b1_unpermute_off_tok_s, decode_moe30b_b1_router_route_off_tok_s,
     * decode_moe30b_b1_add_norm_off_tok_s. */
    static const struct { const char *off, *label, *row; } fusions[] = {
        {"moe_unpermute", "moe30b unpermute off", "decode_moe30b_b1_unpermute_off_tok_s"},
        {"moe_router_route", "moe30b router_route off", "decode_moe30b_b1_router_route_off_tok_s"},
        {"matmul_add_rmsnorm", "moe30b add_norm off", "decode_moe30b_b1_add_norm_off_tok_s"},
    };
    for (int i = 0; i < (mid ? 0 : (int)(sizeof fusions / sizeof fusions[0])); i++) {
        KVCache *kvp = runner_kvcache_create_dtype(r, bps, BS, KV_BF16);
        backend_cuda_off(b, fusions[i].off, 1);
        bench_decode(r, kvp, c, 1, bytes_b1, logits, tables, bps, fusions[i].label);
        backend_cuda_off(b, fusions[i].off, 0);
        runner_kvcache_free(r, kvp);
        native_row(fusions[i].row, rows_out[n_rows - 1].tok_s);
    }
    /* Which path should a decode step of 16-64 tokens take? The backend's rule is tokens > 8: the
     * grouped tensor-core GEMM (moe_mma.cu), not measured; at 64 tokens x top-8 over 128 experts an
     * expert has ~4 pairs, which the grouped GEMV (moe_gemm.cu) also reads its weights once for.
     * Rows moe30b at 16 and 32 beside moe30b_gemv at 16, 32, 64: the same steps on a backend made
     * with SAMPLER_CUDA_OFF=moe_mma (the GEMV at every batch), for the rule's next revision. */
    if (mid) {
        const char *off = getenv("SAMPLER_CUDA_OFF");
        char *off_saved = off ? strdup(off) : NULL;
        setenv("SAMPLER_CUDA_OFF", "moe_mma", 1);
        Backend *b2 = backend_cuda_create_resident(c->head_dim, BENCH_MAX_CTX);
        if (off_saved) setenv("SAMPLER_CUDA_OFF", off_saved, 1);
        else unsetenv("SAMPLER_CUDA_OFF");
        free(off_saved);
        Runner *r2 = runner_create_with(m, b2, max_b, BENCH_MAX_CTX);
        CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
        if ((double)kv_bytes + (1u << 30) > (double)free_b) {
            printf("  SKIP moe30b_gemv rows: too little device memory for a second KV cache\n");
        } else {
            KVCache *kv2 = runner_kvcache_create_dtype(r2, n_blocks, BS, KV_BF16);
            const int bm[] = {16, 32, 64};
            for (int i = 0; i < 3; i++) {
                double touched = moe_touched(r, kv, c, bm[i], logits, tables, bps);
                double bytes = 2.0 * ((double)(attn + E * H) * c->n_layers + touched * expert + (double)V * H);
                printf("  moe30b batch %d: %.1f experts per layer touched, %.2f GB of weights per step\n", bm[i],
                       touched / c->n_layers, bytes / 1e9);
                if (bm[i] < 64) bench_decode(r, kv, c, bm[i], bytes, logits, tables, bps, "moe30b");
                bench_decode(r2, kv2, c, bm[i], bytes, logits, tables, bps, "moe30b_gemv");
            }
            runner_kvcache_free(r2, kv2);
        }
        runner_free(r2);
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

/* Host wall time of reps calls of fn(ctx) on b's stream, after warm-up calls (a download waits
 * for the stream; the per-expert path waits within each call anyway). */
static double moe_time_us(Backend *b, void (*fn)(void *), void *ctx, const float *dev_out, int reps) {
    float one = 0;
    for (int i = 0; i < 2; i++) fn(ctx);
    b->download(b, &one, dev_out, sizeof one);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < reps; i++) fn(ctx);
    b->download(b, &one, dev_out, sizeof one);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return ((double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e3) / reps;
}

typedef struct MoePrefillBench {
    Backend *b;
    MoeMlpArgs ma;          /* the grouped call (out: out_g) */
    const WeightMat *ex;    /* [3 * E]: gate, up, down */
    int32_t *h_off;         /* [E + 1] host */
    float *out_e, *yg;      /* [N, H], [N, H] the per-expert path's output and one expert's rows */
} MoePrefillBench;

static void moe_grouped_call(void *p) {
    MoePrefillBench *m = (MoePrefillBench *)p;
    CHECK(m->b->moe_mlp(m->b, &m->ma) == 0, "moe bench: moe_mlp refused the experts");
}

/* forward.c's per-expert loop as it ran steps above 256 tokens before moe_mma.cu: the offsets
 * to the host (a sync), then per expert gather, gate/up + SwiGLU and down (cuBLAS above 8
 * rows), the weighted scatter-add. */
static void moe_per_expert_call(void *p) {
    MoePrefillBench *m = (MoePrefillBench *)p;
    Backend *b = m->b;
    const MoeRouteArgs *ra = m->ma.route;
    int E = ra->n_experts, H = m->ma.hidden;
    b->download(b, m->h_off, ra->offsets, sizeof(int32_t) * (size_t)(E + 1));
    b->zero(b, m->out_e, sizeof(float) * (size_t)ra->n * H);
    for (int e = 0; e < E; e++) {
        int o = m->h_off[e], cnt = m->h_off[e + 1] - o;
        if (!cnt) continue;
        b->gather_rows(b, m->ma.xg, m->ma.x, ra->pair_tok + o, cnt, H);
        b->matmul_swiglu(b, m->ma.g, m->ma.xg, cnt, &m->ex[e], &m->ex[E + e], m->ma.g, m->ma.u);
        b->matmul(b, m->yg, m->ma.g, cnt, &m->ex[2 * E + e], NULL);
        b->scale_add_rows(b, m->out_e, m->yg, ra->pair_tok + o, ra->pair_w + o, cnt, H);
    }
}

/* A bench layer's inputs in a fresh backend: the experts' pointer table (tab [6 E]: dev, then
 * dev_scale) uploaded, x [N, H] and random router logits, routed on the device (ra). */
typedef struct MoeBenchIo {
    Backend *b;
    void *bufs[32]; /* backend allocations, released by moe_bench_io_free */
    int nb;
    const void **dtab; /* [6 E] */
    float *dx;         /* [N, H] */
    MoeRouteArgs ra;
} MoeBenchIo;
/* Backend memory of the bench, released by moe_bench_io_free. */
static void *moe_bench_alloc(MoeBenchIo *io, size_t bytes) {
    CHECK(io->nb < (int)(sizeof io->bufs / sizeof io->bufs[0]), "moe bench: more buffers than bufs holds");
    return io->bufs[io->nb++] = io->b->alloc(io->b, bytes);
}
static void moe_bench_io_create(MoeBenchIo *io, const void **tab, int N, int E, int K, int H) {
    size_t NK = (size_t)N * K;
    memset(io, 0, sizeof *io);
    Backend *b = io->b = backend_cuda_create_resident(128, 2048);
    b->reserve(b, N, H);
    io->dtab = moe_bench_alloc(io, sizeof(void *) * 6 * E);
    b->upload(b, (void *)io->dtab, tab, sizeof(void *) * 6 * E);
    float *lg = rand_f32((size_t)N * E, 2.0f), *x = rand_f32((size_t)N * H, 1.0f);
    float *dlg = moe_bench_alloc(io, sizeof(float) * (size_t)N * E);
    io->dx = moe_bench_alloc(io, sizeof(float) * (size_t)N * H);
    b->upload(b, dlg, lg, sizeof(float) * (size_t)N * E);
    b->upload(b, io->dx, x, sizeof(float) * (size_t)N * H);
    io->ra = (MoeRouteArgs){dlg, moe_bench_alloc(io, 4 * NK), moe_bench_alloc(io, 4 * NK),
                            moe_bench_alloc(io, 4 * (E + 1)), moe_bench_alloc(io, 4 * NK),
                            moe_bench_alloc(io, 4 * NK), moe_bench_alloc(io, 4 * NK), moe_bench_alloc(io, 4 * E),
                            N, E, K, 1, 0};
    b->moe_route(b, &io->ra);
    free(lg);
    free(x);
}
static void moe_bench_io_free(MoeBenchIo *io) {
    for (int i = 0; i < io->nb; i++) io->b->release(io->b, io->bufs[i]);
    io->b->free(io->b);
}

/* One Qwen3-30B-A3B MoE layer (hidden 2048, 128 BF16 experts of 768, top 8) at 1024 tokens:
 * 8192 pairs, ~64 an expert. Rows (named, bench/gpu_json.py): moe30b_layer_prefill1024_grouped_us,
 * _per_expert_us and _speedup (per-expert / grouped, measured in the same run), plus the
 * grouped path's weight bytes over the copy bandwidth (every expert read once) as a roofline
 * fraction in the printout. The two outputs' difference is printed (the op check compares). */
/* max |a - b| / max |b| over n device floats (max |a - b| when b is all zero): how far one
 * path's layer output is from the other's. */
static double moe_bench_rel_diff(Backend *b, const float *da, const float *db, size_t n) {
    float *ha = xmalloc(sizeof(float) * n), *hb = xmalloc(sizeof(float) * n);
    b->download(b, ha, da, sizeof(float) * n);
    b->download(b, hb, db, sizeof(float) * n);
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        md = fmax(md, fabs((double)ha[i] - hb[i]));
        mr = fmax(mr, fabs((double)hb[i]));
    }
    free(ha);
    free(hb);
    return mr > 0 ? md / mr : md;
}

static void bench_moe_prefill(void) {
    const int N = 1024, E = 128, K = 8, H = 2048, I = 768, reps = 10;
    size_t ew = (size_t)I * H, NK = (size_t)N * K;
    uint16_t *arena = NULL;
    CUDA_CHECK(cudaMalloc((void **)&arena, 3 * E * ew * sizeof(uint16_t)));
    WeightMat *ex = xcalloc((size_t)3 * E, sizeof(WeightMat));
    const void **tab = xcalloc((size_t)6 * E, sizeof(void *));
    for (int j = 0; j < 3; j++)
        for (int e = 0; e < E; e++) {
            uint16_t *p = arena + (size_t)(j * E + e) * ew;
            CHECK(cuda_fill_bf16(p, ew, 7000 + (uint64_t)(j * E + e), 0, 0.02f, NULL) == 0, "moe bench: fill");
            ex[j * E + e] = j < 2 ? wmat(I, H, p) : wmat(H, I, p);
            tab[j * E + e] = p;
        }
    MoeBenchIo io;
    moe_bench_io_create(&io, tab, N, E, K, H);
    Backend *b = io.b;
    MoePrefillBench m = {b, {0}, ex, xcalloc(E + 1, sizeof(int32_t)), moe_bench_alloc(&io, sizeof(float) * (size_t)N * H),
                         moe_bench_alloc(&io, sizeof(float) * (size_t)N * H)};
    float *xg = moe_bench_alloc(&io, sizeof(float) * NK * H);
    m.ma = (MoeMlpArgs){moe_bench_alloc(&io, sizeof(float) * (size_t)N * H), io.dx, &io.ra,
                        {ex, ex + E, ex + 2 * E, io.dtab, io.dtab + 3 * E, NULL}, xg, xg,
                        moe_bench_alloc(&io, sizeof(float) * NK * I), moe_bench_alloc(&io, sizeof(float) * NK * I), H, I,
                        NULL, NULL, NULL, 0.f};
    double us_g = moe_time_us(b, moe_grouped_call, &m, m.ma.out, reps);
    double us_e = moe_time_us(b, moe_per_expert_call, &m, m.out_e, reps);
    double rel = moe_bench_rel_diff(b, m.ma.out, m.out_e, (size_t)N * H);
    double roof_us = 3.0 * E * ew * 2 / (bw_gbs * 1e3);
    printf("  moe30b layer prefill 1024 x top 8 (BF16 experts): grouped %.0f us (%.0f%% of the %.0f us weight "
           "read), per-expert %.0f us, %.2fx; max|grouped - per-expert| / max|out| %.2e\n",
           us_g, bw_gbs > 0 ? 100 * roof_us / us_g : 0.0, roof_us, us_e, us_e / us_g, rel);
    native_row("moe30b_layer_prefill1024_grouped_us", us_g);
    native_row("moe30b_layer_prefill1024_per_expert_us", us_e);
    native_row("moe30b_layer_prefill1024_speedup", us_e / us_g);
    free(tab); free(m.h_off);
    moe_bench_io_free(&io);
    CUDA_CHECK(cudaFree(arena));
    free(ex);
}

/* One Qwen3-30B-A3B MoE layer with FP8 experts at 1024 tokens: the native grouped GEMM (x
 * quantized on the device, e4m3 mma) against the weight-only one, both through moe_mlp,
 * measured in the same run. Weights: one random gate/up-shaped and one down-shaped e4m3
 * matrix (made by the device quantizer from random f32, so no NaN codes) copied into every
 * expert's slot (distinct addresses: the same bytes to read), 128x128 scale blocks of
 * 1 / 448. Rows: moe30b_fp8_layer_prefill1024_native_us, _weight_only_us, _native_speedup
 * (weight-only / native). Skipped where the binary has no FP8 mma (sm_80). */
static void bench_moe_prefill_fp8(void) {
    if (!cuda_moe_gemm_fp8_native(128, 768) || !cuda_moe_gemm_fp8_native(128, 2048)) {
        printf("  moe30b fp8 layer prefill: skipped (this binary has no FP8 mma)\n");
        return;
    }
    const int N = 1024, E = 128, K = 8, H = 2048, I = 768, reps = 10;
    size_t ew = (size_t)I * H, NK = (size_t)N * K;
    uint8_t *arena = NULL;
    CUDA_CHECK(cudaMalloc((void **)&arena, 3 * E * ew));
    { /* the two source matrices: random f32 through the device quantizer (per row) */
        float *hsrc = rand_f32(ew, 1.0f), *dsrc = NULL, *dsc = NULL;
        CUDA_CHECK(cudaMalloc((void **)&dsrc, sizeof(float) * ew));
        CUDA_CHECK(cudaMalloc((void **)&dsc, sizeof(float) * H));
        CUDA_CHECK(cudaMemcpy(dsrc, hsrc, sizeof(float) * ew, cudaMemcpyHostToDevice));
        CHECK(cuda_quant_act_fp8(arena, dsc, dsrc, I, H, H, NULL) == 0, "moe fp8 bench: quantize");
        CHECK(cuda_quant_act_fp8(arena + 2 * E * ew, dsc, dsrc, H, I, I, NULL) == 0, "moe fp8 bench: quantize");
        for (int j = 0; j < 3; j++)
            for (int e = 0; e < E; e++)
                if ((j == 0 || j == 2) && e == 0) continue;
                else CUDA_CHECK(cudaMemcpy(arena + (size_t)(j * E + e) * ew, arena + (size_t)(j == 2 ? 2 * E : 0) * ew, ew,
                                           cudaMemcpyDeviceToDevice));
        CUDA_CHECK(cudaDeviceSynchronize());
        cudaFree(dsrc);
        cudaFree(dsc);
        free(hsrc);
    }
    QuantFp8 qgu = {I, H, 128, 128, I / 128, H / 128, NULL, NULL, 0}, qdn = {H, I, 128, 128, H / 128, I / 128, NULL, NULL, 0};
    size_t ns = (size_t)(I / 128) * (H / 128);
    float *hs = xmalloc(sizeof(float) * ns);
    for (size_t i = 0; i < ns; i++) hs[i] = 1.0f / 448.0f;
    float *dscale = NULL;
    CUDA_CHECK(cudaMalloc((void **)&dscale, sizeof(float) * ns));
    CUDA_CHECK(cudaMemcpy(dscale, hs, sizeof(float) * ns, cudaMemcpyHostToDevice));
    WeightMat *ex = xcalloc((size_t)6 * E, sizeof(WeightMat)); /* [2][3 E]: act_quant, weight-only */
    const void **tab = xcalloc((size_t)6 * E, sizeof(void *));
    for (int j = 0; j < 3; j++)
        for (int e = 0; e < E; e++) {
            WeightMat *w = &ex[j * E + e];
            w->rows = j < 2 ? I : H;
            w->cols = j < 2 ? H : I;
            w->fmt = WF_FP8;
            w->q = j < 2 ? &qgu : &qdn;
            w->dev = arena + (size_t)(j * E + e) * ew;
            w->dev_scale = dscale; /* [6, 16] or [16, 6]: the same ns constants */
            w->act_quant = 1;
            ex[3 * E + j * E + e] = *w;
            ex[3 * E + j * E + e].act_quant = 0;
            tab[j * E + e] = w->dev;
            tab[3 * E + j * E + e] = dscale;
        }
    MoeBenchIo io;
    moe_bench_io_create(&io, tab, N, E, K, H);
    Backend *b = io.b;
    float *xg = moe_bench_alloc(&io, sizeof(float) * NK * H), *g = moe_bench_alloc(&io, sizeof(float) * NK * I),
          *u = moe_bench_alloc(&io, sizeof(float) * NK * I);
    MoePrefillBench mn = {b, {0}, ex, NULL, NULL, NULL}, mw = mn;
    for (int v = 0; v < 2; v++) {
        const WeightMat *w0 = ex + (size_t)v * 3 * E;
        MoeMlpArgs ma = {moe_bench_alloc(&io, sizeof(float) * (size_t)N * H), io.dx, &io.ra,
                         {w0, w0 + E, w0 + 2 * E, io.dtab, io.dtab + 3 * E, NULL}, xg, xg, g, u, H, I, NULL, NULL, NULL, 0.f};
        (v ? &mw : &mn)->ma = ma;
    }
    double us_n = moe_time_us(b, moe_grouped_call, &mn, mn.ma.out, reps);
    double us_w = moe_time_us(b, moe_grouped_call, &mw, mw.ma.out, reps);
    double rel = moe_bench_rel_diff(b, mn.ma.out, mw.ma.out, (size_t)N * H);
    double roof_us = 3.0 * E * ew / (bw_gbs * 1e3);
    printf("  moe30b layer prefill 1024 x top 8 (FP8 experts): native %.0f us (%.0f%% of the %.0f us weight read), "
           "weight-only %.0f us, %.2fx; max|native - weight-only| / max|out| %.2e (quantized x: ~1e-2 expected)\n",
           us_n, bw_gbs > 0 ? 100 * roof_us / us_n : 0.0, roof_us, us_w, us_w / us_n, rel);
    native_row("moe30b_fp8_layer_prefill1024_native_us", us_n);
    native_row("moe30b_fp8_layer_prefill1024_weight_only_us", us_w);
    native_row("moe30b_fp8_layer_prefill1024_native_speedup", us_w / us_n);
    { /* the crossover: a one-layer model holding these experts, through the server's own measurement */
        Model fm = {0};
        LayerWeights lw = {0};
        qwen3_30b_a3b_config(&fm.cfg);
        fm.cfg.n_layers = 1;
        lw.egate = ex;
        lw.eup = ex + E;
        lw.edown = ex + 2 * E;
        fm.layers = &lw;
        NativeCrossover x;
        int cross = xover_report("moe30b fp8 experts", device_moe_crossover_on(b, &fm, 0, 512, &x), &x);
        native_row("moe30b_fp8_native_crossover_n", cross); /* an unmeasured server: CUDA_NATIVE_MIN_N */
    }
    free(tab); free(hs);
    moe_bench_io_free(&io);
    CUDA_CHECK(cudaFree(arena));
    CUDA_CHECK(cudaFree(dscale));
    free(ex);
}

#endif
