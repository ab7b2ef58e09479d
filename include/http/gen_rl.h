/*
 * gen_rl.h - the RL outputs of a generation in the raw forms the foreign
 * dialects encode (vLLM / prime-rl /inference/v1/generate, SGLang /generate):
 * a choice's kept-id sets decoded to full lists, the routed experts of every
 * input position of prompt + output as one array, and the weight-version
 * segments of its tokens. Each either is exact or fails (NULL / -1 with err):
 * never a partial or a guessed output.
 *
 * Not here: the JSON of our own RL fields on the OpenAI routes (gen.c), the
 * dialects' shapes (api_vllm_generate.c, api_sglang.c).
 */
#ifndef SAMPLER_GEN_RL_H
#define SAMPLER_GEN_RL_H

#include <stdint.h>

#include <jansson.h>

#include "gen.h"

/* Largest top_k whose kept sets the list-form masks (vLLM sampling_mask,
 * prime-rl kept_tokens, SGLang sampling_mask) carry: like vLLM, a list-form
 * mask needs a bounded support (greedy, or 0 < top_k <= this). */
#define GEN_RL_MASK_MAX_TOP_K 4096

/* A list-form mask is wanted (p->ret_mask): 0 when its support is bounded
 * (and p->extra_render_bytes counts its rendering, GEN_RL_MASK_ID_BYTES per
 * id for max_tokens, or max_len when unset), else a 400 naming param. */
#define GEN_RL_MASK_ID_BYTES 64 /* a jansson integer in a list, its dump, its base64 copy */
int gen_rl_mask_check(GenParams *p, int max_len, const char *param, Err *err);
/* The full kept sets of the first n records of c, CSR: *off [n + 1] int64,
 * *ids [(*off)[n]] int32, both malloc'd (free them). 0, or -1 (out of memory)
 * with err. */
int gen_rl_mask_csr(Gen *g, Choice *c, int n, int64_t **off, int32_t **ids, Err *err);
/* Routed experts of every input position of c's prompt + first n records:
 * positions 0..n_prompt+n-2, each [n_moe_layers, top_k] int32 (E ids),
 * malloc'd [*n_pos, E] (free it). NULL with *n_pos 0 on a dense model or
 * when experts were not asked; NULL with err set (and *n_pos -1) when the
 * prompt's routing is not complete (never sent partial). */
int32_t *gen_rl_experts(Gen *g, Choice *c, int n, int *n_pos, Err *err);
/* Weight-version segments of the first n records of c, prime-rl's shape:
 * [[version, first token index], ...], one per run of equal versions. */
json_t *gen_rl_version_segments(Gen *g, Choice *c, int n);

#endif
