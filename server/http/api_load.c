/*
 * api_load.c - GET /get_load, the load report SGLang's router polls
 * (sglang-router's load monitor for power-of-two routing and its own
 * GET /get_loads): SGLang's shape, one entry per data-parallel rank (one
 * here): [{"dp_rank": 0, "num_reqs", "num_waiting_reqs", "num_tokens"}],
 * where num_reqs counts running and waiting sequences, num_waiting_reqs the
 * waiting ones and num_tokens the tokens held in referenced KV blocks (the
 * router takes it as the worker's load). No auth, like /metrics: it says no
 * more than /metrics does.
 *
 * Not here: /metrics (metrics.c, metrics_vllm.c), readiness (fleet.c).
 */
#include "server.h"

int api_get_load(HttpReq *q, json_t *body) {
    Server *s = q->s;
    EngineMetrics m;
    engine_metrics(s->eng, &m);
    json_t *e = json_object();
    json_object_set_new(e, "dp_rank", json_integer(0));
    json_object_set_new(e, "num_reqs", json_integer(m.running + m.waiting));
    json_object_set_new(e, "num_waiting_reqs", json_integer(m.waiting));
    json_object_set_new(e, "num_tokens", json_integer((json_int_t)m.kv_blocks_used * engine_config(s->eng)->block_size));
    json_t *a = json_array();
    json_array_append_new(a, e);
    return http_send_json(q, 200, a);
}
