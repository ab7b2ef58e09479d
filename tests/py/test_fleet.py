"""A fleet of three sampler-cpu replicas and one trainer: readiness, catching
up a replica that missed deltas, and /metrics under vLLM's names.

Catch-up: a replica is killed, three deltas are pushed (each push says that
one target failed and exits 1), the replica is restarted from its original
checkpoint (--fleet: not ready until the trainer speaks to it), and the next
`trainer push --chain DIR` (of the latest delta) sends it the deltas it is
missing, in order, then that one: it converges, its per-tensor hashes and greedy output equal the
others', and it answers ready again. A chain too short falls back to a full
reload (--reload), or fails loudly without one."""
import os
import re
import subprocess

import pytest

from delta_ckpt import TRAINER
from fleet_ckpt import make_chain
from server_fixture import ADMIN, Server, metrics, wait_until

AUTH = {"Authorization": "Bearer " + ADMIN}
GREEDY = {"prompt": "The quick brown fox", "max_tokens": 6, "temperature": 0, "return_token_ids": True}


def push(delta, servers, *extra):
    args = [TRAINER, "push", delta, "--admin-token", ADMIN, "--deadline", "30", "--retries", "1"]
    for s in servers:
        args += ["--to", s.url]
    return subprocess.run(args + [str(e) for e in extra], capture_output=True, text=True, timeout=120)


def row(out, url):
    return next(l for l in out.splitlines() if l.strip().startswith(url + " "))


def health(s):
    return s.request("GET", "/health")


def weights(s):
    st, w = s.request("GET", "/admin/v1/weights", headers=AUTH)
    assert st == 200, w
    return w


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("fleet"))
    dirs, chain_dir, deltas = make_chain(base, 4)
    return {"base": base, "dirs": dirs, "chain": chain_dir, "deltas": deltas}


def replica(chain, port=0):
    return Server("--fleet", "--reload-root", chain["base"], "--port", str(port))


def test_catch_up_after_missed_deltas(chain):
    d = chain["deltas"]
    fleet = [replica(chain) for _ in range(3)]
    try:
        for s in fleet:  # --fleet: not ready before a trainer announced the fleet's version
            st, body = health(s)
            assert st == 503 and "no trainer has announced" in body["error"]["message"], body
        p = push(d[0], fleet)
        assert p.returncode == 0, p.stdout + p.stderr
        assert all(health(s)[0] == 200 for s in fleet)
        assert "ready" in row(p.stdout, fleet[0].url)

        a, b, c = fleet
        port = c.port
        c.proc.kill()
        c.proc.wait()
        for k in (1, 2, 3):  # three deltas while it is down
            p = push(d[k], [a, b, c])
            assert p.returncode == 1 and "FAILED: 1 of 3" in p.stderr, p.stdout + p.stderr
            assert " FAILED " in row(p.stdout, c.url) and " ok " in row(p.stdout, a.url)
        assert weights(a)["version"] == 4

        c = fleet[2] = replica(chain, port)  # back, from its start-up checkpoint (version 0)
        st, body = health(c)
        assert st == 503 and weights(c)["version"] == 0
        # the routers probe /health: it stays 503 until the replica serves the fleet's version
        # the trainer's next push (here: the latest delta again) catches it up
        p = push(d[3], fleet, "--chain", chain["chain"])
        assert p.returncode == 0, p.stdout + p.stderr
        rc = row(p.stdout, c.url)
        assert re.search(r" ok +0 +4 ", rc) and "caught up with 3 chain deltas" in rc and "ready" in rc, rc
        assert re.search(r" noop +4 +4 ", row(p.stdout, a.url)), p.stdout
        ws = [weights(s) for s in fleet]
        assert all(w["version"] == 4 for w in ws)
        assert ws[2]["tensors"] == ws[0]["tensors"] == ws[1]["tensors"]
        outs = [s.post("/v1/completions", GREEDY)[1]["choices"][0]["token_ids"] for s in fleet]
        assert outs[0] == outs[1] == outs[2]
        assert all(health(s)[0] == 200 for s in fleet)

        # a replica told of a newer fleet version is not ready until it has it
        st, f = c.request("POST", "/admin/v1/fleet", body={"version": 5}, headers=AUTH)
        assert st == 200 and f == {"version": 4, "fleet_version": 5, "ready": False}, f
        st, body = health(c)
        assert st == 503 and "catching up" in body["error"]["message"], body
        st, f = c.request("POST", "/admin/v1/fleet", body={"version": -1}, headers=AUTH)
        assert st == 400 and f["error"]["param"] == "version"
        assert c.request("POST", "/admin/v1/fleet", body={"version": 4})[0] in (401, 403)
        st, f = c.request("POST", "/admin/v1/fleet", body={"version": 4}, headers=AUTH)
        assert st == 200 and f["ready"] is True and health(c)[0] == 200
    finally:
        assert [s.stop() for s in fleet] == [0, 0, 0]  # graceful exits (and no leaks under ASan)


def test_chain_too_short_reloads_or_fails(chain):
    """A replica at 0 gets delta 3 -> 4: the chain needs 3 deltas; with
    --max-chain 1 it fails loudly without --reload and is caught up by a full
    reload of the version-4 checkpoint with it."""
    d = chain["deltas"]
    ref, late = replica(chain), replica(chain)
    try:
        p = push(d[3], [ref], "--chain", chain["chain"])
        assert p.returncode == 0 and "caught up with 3 chain deltas" in p.stdout, p.stdout + p.stderr
        p = push(d[3], [late], "--chain", chain["chain"], "--max-chain", "1")
        assert p.returncode == 1 and "no path from there within --max-chain" in p.stdout, p.stdout
        assert weights(late)["version"] == 0
        assert health(late)[0] == 503  # told the fleet is at 3 while behind: not ready
        p = push(d[3], [late, ref], "--chain", chain["chain"], "--max-chain", "1", "--reload", chain["dirs"][4])
        assert p.returncode == 0, p.stdout + p.stderr
        assert "caught up by a full reload" in row(p.stdout, late.url)
        assert weights(late)["tensors"] == weights(ref)["tensors"]
        assert health(late)[0] == 200
    finally:
        assert [ref.stop(), late.stop()] == [0, 0]


# vLLM v1's buckets (vllm/v1/metrics/loggers.py)
VLLM_BUCKETS = {
    "vllm:time_to_first_token_seconds": [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                                         5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0],
    "vllm:inter_token_latency_seconds": [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                                         7.5, 10.0, 20.0, 40.0, 80.0],
    "vllm:e2e_request_latency_seconds": [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                                         60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0],
}
# build_1_2_5_buckets(max_model_len): the tiny model serves max_model_len 4096
TOKEN_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]
VLLM_BUCKETS.update({"vllm:request_prompt_tokens": TOKEN_BUCKETS, "vllm:request_generation_tokens": TOKEN_BUCKETS})
VLLM_TYPES = {"vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
              "vllm:kv_cache_usage_perc": "gauge", "vllm:prefix_cache_queries_total": "counter",
              "vllm:prefix_cache_hits_total": "counter", "vllm:num_preemptions_total": "counter",
              "vllm:prompt_tokens_total": "counter", "vllm:generation_tokens_total": "counter",
              "vllm:request_success_total": "counter", **{k: "histogram" for k in VLLM_BUCKETS}}
LABELS = 'model_name="tiny-qwen3",engine="0"'


def test_metrics_under_vllm_names():
    s = Server()
    try:
        for i in range(3):
            st, r = s.post("/v1/completions", {"prompt": "Hello there", "max_tokens": 5, "n": 2, "temperature": 1,
                                               "seed": i, "ignore_eos": True})
            assert st == 200, r
        # a sequence is counted as finished just after its last token is published: wait for the counts
        wait_until(lambda: metrics(s)[f"vllm:e2e_request_latency_seconds_count{{{LABELS}}}"] == 6, "6 finished")
        st, text = s.request("GET", "/metrics")
        types = dict(re.findall(r"^# TYPE (vllm:\S+) (\S+)$", text, re.M))
        assert types == VLLM_TYPES
        m = metrics(s)
        for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prefix_cache_queries_total",
                     "prefix_cache_hits_total", "num_preemptions_total", "prompt_tokens_total",
                     "generation_tokens_total"):
            ours = {"num_preemptions_total": "preemptions_total"}.get(name, name)
            assert m[f"vllm:{name}{{{LABELS}}}"] == m[f"sampler_{ours}"], name
        assert m[f"vllm:generation_tokens_total{{{LABELS}}}"] == 30
        assert m[f'vllm:request_success_total{{{LABELS},finished_reason="length"}}'] == 6
        for name, bounds in VLLM_BUCKETS.items():
            les = re.findall(rf'^{name}_bucket\{{{LABELS},le="([^"]+)"\}} (\d+)$', text, re.M)
            # the label values as vLLM's prometheus_client writes them: repr of the float
            assert [le for le, _ in les] == [repr(float(x)) for x in bounds] + ["+Inf"], name
            counts = [int(c) for _, c in les]
            assert counts == sorted(counts) and counts[-1] == m[f"{name}_count{{{LABELS}}}"]
        assert m[f"vllm:time_to_first_token_seconds_count{{{LABELS}}}"] == 3  # per request: its first token
        assert m[f"vllm:inter_token_latency_seconds_count{{{LABELS}}}"] == 6 * 4
        assert m[f"vllm:e2e_request_latency_seconds_count{{{LABELS}}}"] == 6
        assert m[f"vllm:request_generation_tokens_sum{{{LABELS}}}"] == 30  # 6 sequences x 5 tokens
        assert m[f'vllm:request_generation_tokens_bucket{{{LABELS},le="2.0"}}'] == 0
        assert m[f'vllm:request_generation_tokens_bucket{{{LABELS},le="5.0"}}'] == 6
        prompt = m[f"vllm:request_prompt_tokens_sum{{{LABELS}}}"]
        assert prompt == m["sampler_prompt_tokens_total"] and m[f"vllm:request_prompt_tokens_count{{{LABELS}}}"] == 6
        assert m[f"vllm:time_to_first_token_seconds_sum{{{LABELS}}}"] == pytest.approx(
            m["sampler_time_to_first_token_seconds_sum"], rel=1e-6)
    finally:
        assert s.stop() == 0


def test_catch_up_with_signed_deltas(chain, tmp_path):
    """A sampler that requires signed deltas is caught up too: the chain's
    deltas are signed with --key-file like the pushed one (an unsigned chain
    delta would be refused with 401)."""
    key = tmp_path / "delta.key"
    key.write_text("9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\n")
    s = Server("--delta-key-file", str(key))
    try:
        p = push(chain["deltas"][2], [s], "--chain", chain["chain"])
        assert p.returncode == 1 and "HTTP 401" in p.stdout, p.stdout  # unsigned: refused, nothing applied
        assert weights(s)["version"] == 0
        p = push(chain["deltas"][2], [s], "--chain", chain["chain"], "--key-file", str(key))
        assert p.returncode == 0 and "caught up with 2 chain deltas" in p.stdout, p.stdout + p.stderr
        assert weights(s)["version"] == 3
    finally:
        assert s.stop() == 0
