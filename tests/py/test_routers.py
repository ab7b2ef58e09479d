"""sampler-cpu replicas behind the routers the field runs: vllm-router
(prime-rl's; consistent hash on X-Session-ID) and sglang-router (SGLang's;
the manual policy keeps a routing key, X-SMG-Routing-Key, on one worker),
both the real binaries from PyPI, on loopback, three replicas.

Each router: requests spread over the replicas; one session stays on one
replica; streams and the RL fields come back exactly as the replica answers
them directly; a replica that answers not ready on /health (behind the
fleet's version) gets no requests until it is ready again; a killed replica
is routed around (marked unhealthy by the
router's /health probe, no request fails once it is) and re-admitted when it
is back on its port. sglang-router 0.3 re-serializes chat requests from its
own schema and drops fields it does not know (return_token_ids and the other
RL options): RL clients behind it use /v1/completions, which keeps every field, with
text prompts (its schema refuses token-id prompts with 422) (docs/fleet.md)."""
import json

import pytest

from routers import Router, available
from server_fixture import ADMIN, Server, metrics, wait_until

pytestmark = pytest.mark.skipif(not (available("vllm") and available("sglang")),
                                reason="pip install -r tests/requirements.txt (vllm-router, sglang-router)")

AUTH = {"Authorization": "Bearer " + ADMIN}
MODEL = "tiny-qwen3"  # sglang-router requires the field
HI = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
RL = {"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 4, "temperature": 1.0, "top_k": 20, "seed": 7,
      "return_token_ids": True, "return_sampler_logprobs": True, "return_sampling_mask": True,
      "return_raw_logprobs": True, "logprobs": 2}
STICKY = {"vllm": ("consistent_hash", "X-Session-ID"), "sglang": ("manual", "X-SMG-Routing-Key")}


@pytest.fixture(scope="module")
def fleet():
    servers = []
    try:
        for _ in range(3):
            servers.append(Server())
        yield servers
    finally:
        assert [s.stop() for s in servers] == [0] * len(servers)  # graceful exits (and no leaks under ASan)


def submitted(servers):
    return [metrics(s)["sampler_requests_submitted_total"] for s in servers]


def strip(r):
    """A completion without what differs between two identical requests."""
    r = json.loads(r) if isinstance(r, str) else r
    for k in ("id", "created"):
        r.pop(k, None)
    return r


def sse(text):
    return [json.loads(l[6:]) for l in text.splitlines() if l.startswith("data: ") and l != "data: [DONE]"]


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_router(fleet, kind):
    policy, header = STICKY[kind]
    r = Router(kind, [s.url for s in fleet], policy)
    try:
        # spread: distinct sessions land on more than one replica; affinity: one session on one replica
        before = submitted(fleet)
        for i in range(24):
            st, body = r.post("/v1/completions", HI, {header: f"session-{i}"})
            assert st == 200, body
        spread = [a - b for a, b in zip(submitted(fleet), before)]
        assert sum(spread) == 24 and sum(1 for x in spread if x) >= 2, spread
        before = submitted(fleet)
        for _ in range(6):
            assert r.post("/v1/completions", HI, {header: "one-session"})[0] == 200
        sticky = [a - b for a, b in zip(submitted(fleet), before)]
        assert sorted(sticky) == [0, 0, 6], sticky
        home = sticky.index(6)

        if kind == "sglang":  # its load report reads each replica's GET /get_load (-1: none)
            st, loads = r.get("/get_loads")
            assert st == 200 and sorted(w["worker"] for w in loads["workers"]) == sorted(s.url for s in fleet)
            assert all(w["load"] == 0 for w in loads["workers"]), loads  # idle: no KV tokens held

        # RL fields and streams come back as the replica answers them
        st, direct = fleet[0].post("/v1/completions", RL)
        assert st == 200
        st, via = r.post("/v1/completions", RL)
        assert st == 200 and strip(via) == strip(direct), via
        st, text = r.post("/v1/completions", {**RL, "stream": True}, {header: "one-session"})
        chunks = sse(text)
        assert st == 200 and text.rstrip().endswith("data: [DONE]")
        toks = [t for c in chunks for t in c["choices"][0].get("token_ids", [])]
        assert toks == direct["choices"][0]["token_ids"]
        assert [x for c in chunks for x in c["choices"][0].get("sampler_logprobs", [])] == \
            direct["choices"][0]["sampler_logprobs"]
        if kind == "vllm":  # vllm-router forwards bodies as sent: token-id prompts and chat too
            ids = {**RL, "prompt": [9707, 11, 1879]}
            st, via = r.post("/v1/completions", ids)
            assert st == 200 and strip(via) == strip(fleet[0].post("/v1/completions", ids)[1])
            chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "seed": 1, "temperature": 1,
                    "return_token_ids": True, "return_sampler_logprobs": True}
            st, via = r.post("/v1/chat/completions", chat)
            assert st == 200 and strip(via) == strip(fleet[0].post("/v1/chat/completions", chat)[1])

        # a replica that is not ready (told the fleet is at a version it lacks) is routed around until it is
        lag = fleet[(home + 1) % 3]
        st, f = lag.request("POST", "/admin/v1/fleet", body={"version": 5}, headers=AUTH)
        assert st == 200 and f["ready"] is False
        wait_until(lambda: not r.healthy()[lag.url], f"{kind}-router sees {lag.url} not ready")
        before = metrics(lag)["sampler_requests_submitted_total"]
        for i in range(12):
            assert r.post("/v1/completions", HI, {header: f"session-{i}"})[0] == 200
        assert metrics(lag)["sampler_requests_submitted_total"] == before
        assert lag.request("POST", "/admin/v1/fleet", body={"version": 0}, headers=AUTH)[1]["ready"] is True
        wait_until(lambda: r.healthy()[lag.url], f"{kind}-router re-admits {lag.url} once ready")

        # a killed replica is routed around, then re-admitted on its port
        dead = fleet[home]
        port = dead.port
        dead.proc.kill()
        dead.proc.wait()
        wait_until(lambda: not r.healthy()[dead.url], f"{kind}-router marks {dead.url} unhealthy")
        live = [s for s in fleet if s is not dead]
        before = submitted(live)
        for i in range(12):
            st, body = r.post("/v1/completions", HI, {header: f"session-{i}"})
            assert st == 200, body
        st, body = r.post("/v1/completions", HI, {header: "one-session"})
        assert st == 200, body
        assert sum(submitted(live)) - sum(before) == 13
        fleet[home] = Server("--port", str(port))
        wait_until(lambda: r.healthy()[fleet[home].url], f"{kind}-router re-admits {fleet[home].url}")
        wait_until(lambda: r.post("/v1/completions", HI, {header: "one-session"})[0]
                   == 200 and metrics(fleet[home])["sampler_requests_submitted_total"] > 0,
                   f"{kind}-router routes one-session to the re-admitted replica again")
    finally:
        r.stop()
