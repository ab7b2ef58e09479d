/*
 * gen_rl.c - a generation's RL outputs in raw form for the foreign dialects
 * (gen_rl.h): full kept sets, the routing of every input position, weight
 * version segments, cached prompt tokens.
 *
 * Not here: their JSON encodings (api_vllm_generate.c, api_sglang.c), our own
 * RL fields (gen.c).
 */
#include "gen_rl.h"

#include <stdlib.h>
#include <string.h>

int gen_rl_mask_check(GenParams *p, int max_len, const char *param, Err *err) {
    if (!p->ret_mask) return 0;
    int greedy = p->sp.temperature == 0;
    ENSURE(err, greedy || (p->sp.top_k > 0 && p->sp.top_k <= GEN_RL_MASK_MAX_TOP_K), 400,
           "%s: a sampling mask as id lists needs a bounded support: temperature 0, or top_k in [1, %d] "
           "(as vLLM requires top_k > 0)", param, GEN_RL_MASK_MAX_TOP_K);
    size_t per_tok = greedy ? 1 : (size_t)p->sp.top_k;
    size_t toks = (size_t)(p->max_tokens_set ? p->sp.max_tokens : max_len);
    p->extra_render_bytes += (size_t)p->n * toks * per_tok * GEN_RL_MASK_ID_BYTES;
    return 0;
}

int gen_rl_mask_csr(Gen *g, Choice *c, int n, int64_t **off, int32_t **ids, Err *err) {
    (void)g;
    *off = malloc(sizeof(int64_t) * (size_t)(n + 1));
    *ids = NULL;
    ENSURE(err, *off, 503, "out of memory rendering sampling masks; retry later, or lower n or max_tokens");
    engine_request_mask_csr_n(c->r, c->seq, n, *off, NULL);
    int64_t total = (*off)[n];
    *ids = malloc(sizeof(int32_t) * (size_t)(total ? total : 1));
    if (!*ids) {
        free(*off);
        *off = NULL;
        return ERR(err, 503, "out of memory rendering sampling masks; retry later, or lower n or max_tokens");
    }
    engine_request_mask_csr_n(c->r, c->seq, n, *off, *ids);
    return 0;
}

int32_t *gen_rl_experts(Gen *g, Choice *c, int n, int *n_pos, Err *err) {
    int E = engine_experts_per_token(g->s->eng);
    *n_pos = 0;
    if (E <= 0 || !g->p.ret_experts) return NULL;
    int P = (int)g->prompts[c->prompt_i].n;
    const int32_t *pe = NULL;
    int np = engine_request_prompt_experts(c->r, &pe);
    if (P > 1 && (np != P - 1 || !pe)) {
        *n_pos = -1;
        ERR(err, 500, "the routing of %d of the %d prompt positions is missing: refusing to send a partial one",
            P - 1 - np, P - 1);
        return NULL;
    }
    EngineSeqView v;
    engine_request_seq(c->r, c->seq, &v);
    int total = P - 1 + n;
    int32_t *a = malloc(sizeof(int32_t) * (size_t)E * (size_t)(total > 0 ? total : 1));
    if (!a) {
        *n_pos = -1;
        ERR(err, 503, "out of memory rendering routed experts; retry later");
        return NULL;
    }
    if (P > 1) memcpy(a, pe, sizeof(int32_t) * (size_t)E * (size_t)(P - 1));
    for (int k = 0; k < n; k++) {
        if (!v.tokens[k].experts) {
            free(a);
            *n_pos = -1;
            ERR(err, 500, "the routing of output token %d is missing", k);
            return NULL;
        }
        memcpy(a + (size_t)(P - 1 + k) * E, v.tokens[k].experts, sizeof(int32_t) * (size_t)E);
    }
    *n_pos = total;
    return a;
}

json_t *gen_rl_version_segments(Gen *g, Choice *c, int n) {
    EngineSeqView v;
    engine_request_seq(c->r, c->seq, &v);
    json_t *a = json_array();
    uint64_t last = 0;
    for (int k = 0; k < n; k++) {
        uint64_t x = server_weight_version(g->s, v.tokens[k].weight_version);
        if (k && x == last) continue;
        json_array_append_new(a, json_pack("[I, i]", (json_int_t)x, k));
        last = x;
    }
    return a;
}

