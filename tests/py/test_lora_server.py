"""LoRA adapters through the server: --lora at start-up, vLLM's load/unload routes, a request's
adapter by `model`, /v1/models cards, mixed batches, the prefix cache keyed by adapter, load_inplace
versions, refusals.

Correctness reference: tests/data/lora_server_golden.json (scripts/make_lora_golden.py), greedy
continuations of a token prompt on models/tiny-qwen3 with transformers + peft for the base and the
two committed adapters tests/fixtures/lora/tiny-qwen3-t{1,2} (the smallest top-1/top-2 logit gap on
the way is 5e-3, far above f32 summation-order noise, so greedy ids must match exactly). Logit
parity itself is tests/test_lora.c.
"""
import json
import math
import os
import shutil
import struct
import threading

import pytest

from conftest import ROOT
from server_fixture import ADMIN, Server, metrics, wait_until
from st_file import read_st

GOLDEN = json.load(open(os.path.join(ROOT, "tests", "data", "lora_server_golden.json")))
T1 = "tests/fixtures/lora/tiny-qwen3-t1"
T2 = "tests/fixtures/lora/tiny-qwen3-t2"
ADM = {"Authorization": f"Bearer {ADMIN}"}
BASE = "tiny-qwen3"
LONG = [(7919 * i + 13) % 150000 for i in range(40)]  # 2 full KV blocks of 16 and a rest


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_root")
    for name in ("tiny-qwen3-t1", "tiny-qwen3-t2"):
        shutil.copytree(os.path.join(ROOT, "tests", "fixtures", "lora", name), root / name)
    dora = root / "dora"
    shutil.copytree(os.path.join(ROOT, T1), dora)
    c = json.load(open(dora / "adapter_config.json"))
    c["use_dora"] = True
    json.dump(c, open(dora / "adapter_config.json", "w"))
    s = Server("--lora", f"t1={T1}", "--max-loras", "3", "--reload-root", str(root))
    s.root = root
    yield s
    assert s.stop() == 0


def complete(s, model, prompt, n_tokens=GOLDEN["max_tokens"], **kw):
    body = {"model": model, "prompt": prompt, "max_tokens": n_tokens, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True, "return_sampler_logprobs": True, "return_raw_logprobs": True}
    body.update(kw)
    st, r = s.post("/v1/completions", body)
    assert st == 200, r
    return r


def ids(r):
    return r["choices"][0]["token_ids"]


def load(s, name, path, **kw):
    return s.post("/v1/load_lora_adapter", dict(lora_name=name, lora_path=str(path), **kw), headers=ADM)


def test_models_lists_adapters_with_parent(srv):
    st, r = srv.request("GET", "/v1/models")
    assert st == 200
    cards = {m["id"]: m for m in r["data"]}
    assert cards["t1"]["parent"] == "tiny-qwen3" and cards["tiny-qwen3"]["parent"] is None
    assert cards["t1"]["lora_rank"] == 8
    st, one = srv.request("GET", "/v1/models/t1")
    assert st == 200 and one["parent"] == "tiny-qwen3"


def test_greedy_matches_transformers_peft(srv):
    p = GOLDEN["prompt"]
    base = complete(srv, "tiny-qwen3", p)
    assert ids(base) == GOLDEN["base"]
    r = complete(srv, "t1", p)
    assert ids(r) == GOLDEN["t1"] and r["model"] == "t1"
    assert r["choices"][0]["token_adapter_versions"] == [0] * GOLDEN["max_tokens"]
    assert "token_adapter_versions" not in base["choices"][0]
    # a run-time load of t2 from --reload-root
    st, msg = load(srv, "t2", srv.root / "tiny-qwen3-t2")
    assert st == 200 and "t2" in msg
    try:
        assert ids(complete(srv, "t2", p)) == GOLDEN["t2"]
        # the chat endpoint picks the adapter by model too (echoed back)
        st, c = srv.post("/v1/chat/completions", {"model": "t2", "messages": [{"role": "user", "content": "hi"}],
                                                  "max_tokens": 2, "temperature": 0})
        assert st == 200 and c["model"] == "t2"
    finally:
        assert srv.post("/v1/unload_lora_adapter", {"lora_name": "t2"}, headers=ADM)[0] == 200


def test_mixed_batch_equals_each_alone(srv):
    assert load(srv, "t2", srv.root / "tiny-qwen3-t2")[0] == 200
    try:
        models = ["tiny-qwen3", "t1", "t2", "t1", "tiny-qwen3", "t2"]
        prompts = [GOLDEN["prompt"], LONG[:20], LONG[:33], GOLDEN["prompt"], LONG[:7], GOLDEN["prompt"]]
        alone = [complete(srv, m, p, 12, prompt_logprobs=0)["choices"][0] for m, p in zip(models, prompts)]
        together = [None] * len(models)

        def run(i):
            together[i] = complete(srv, models[i], prompts[i], 12, prompt_logprobs=0)["choices"][0]
        ts = [threading.Thread(target=run, args=(i,)) for i in range(len(models))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for a, b in zip(alone, together):
            assert a["token_ids"] == b["token_ids"] and a["raw_logprobs"] == b["raw_logprobs"]
        assert alone[0]["token_ids"] != alone[3]["token_ids"]  # same prompt, base vs t1
    finally:
        assert srv.post("/v1/unload_lora_adapter", {"lora_name": "t2"}, headers=ADM)[0] == 200


def test_prefix_cache_is_keyed_by_adapter_and_version(srv):
    # the truth for each model: prompt_logprobs requests never look the prefix cache up
    truth = {m: complete(srv, m, LONG, 6, prompt_logprobs=0)["choices"][0]["raw_logprobs"]
             for m in ("tiny-qwen3", "t1")}
    assert truth["tiny-qwen3"] != truth["t1"]
    h0 = metrics(srv)["sampler_prefix_cache_hits_total"]
    for m in ("tiny-qwen3", "t1", "tiny-qwen3", "t1"):  # each prompt's blocks get cached, then hit
        assert complete(srv, m, LONG, 6)["choices"][0]["raw_logprobs"] == truth[m], m
    assert metrics(srv)["sampler_prefix_cache_hits_total"] - h0 >= 4 * 16  # the repeats hit 2 blocks each
    # load_inplace: version 1, and nothing cached under version 0 is reused
    st, _ = load(srv, "t1", srv.root / "tiny-qwen3-t2", load_inplace=True)
    assert st == 200
    try:
        r = complete(srv, "t1", LONG, 6)["choices"][0]
        t2_truth = complete(srv, "t1", LONG, 6, prompt_logprobs=0)["choices"][0]
        assert r["raw_logprobs"] == t2_truth["raw_logprobs"] != truth["t1"]
        assert r["token_adapter_versions"] == [1] * 6
        st, card = srv.request("GET", "/v1/models/t1")
        assert card["adapter_version"] == 1
    finally:  # back to t1's own weights (version 2)
        assert load(srv, "t1", srv.root / "tiny-qwen3-t1", load_inplace=True)[0] == 200
    assert ids(complete(srv, "t1", GOLDEN["prompt"])) == GOLDEN["t1"]


def test_refusals_leave_adapters_as_they_were(srv):
    before = srv.request("GET", "/v1/models")[1]
    cases = [
        (dict(lora_name="x", lora_path=str(srv.root / "dora")), None, 400, "use_dora"),
        (dict(lora_name="t1", lora_path=str(srv.root / "tiny-qwen3-t2")), None, 400, "already been loaded"),
        (dict(lora_name="t1", lora_path=str(srv.root / "dora"), load_inplace=True), None, 400, "use_dora"),
        (dict(lora_name="x", lora_path="/etc"), None, 403, "--reload-root"),
        (dict(lora_name="x", lora_path=os.path.join(ROOT, T2)), None, 403, "--reload-root"),
        (dict(lora_name="tiny-qwen3", lora_path=str(srv.root / "tiny-qwen3-t2")), None, 400, "base model"),
        (dict(lora_name="x"), None, 400, "lora_path"),
        (dict(lora_name="x", lora_path=str(srv.root / "tiny-qwen3-t2")), {}, 401, "admin token"),
    ]
    for body, headers, status, want in cases:
        st, r = srv.post("/v1/load_lora_adapter", body, headers=ADM if headers is None else headers)
        assert st == status and want in r["error"]["message"], (body, st, r)
    assert srv.post("/v1/unload_lora_adapter", {"lora_name": "nope"}, headers=ADM)[0] == 404
    st, r = srv.post("/v1/completions", {"model": "nope", "prompt": [1, 2], "max_tokens": 1})
    assert st == 404 and "nope" in r["error"]["message"]
    assert srv.request("GET", "/v1/models")[1] == before
    assert ids(complete(srv, "t1", GOLDEN["prompt"])) == GOLDEN["t1"]


def test_slots_are_bounded_and_unload_waits_for_its_requests(srv):
    # --max-loras 3: t1 plus two more fill every slot
    assert load(srv, "u1", srv.root / "tiny-qwen3-t2")[0] == 200
    assert load(srv, "u2", srv.root / "tiny-qwen3-t2")[0] == 200
    st, r = load(srv, "u3", srv.root / "tiny-qwen3-t2")
    assert st == 400 and "slots" in r["error"]["message"]
    # a request in flight keeps its adapter through an unload; the name is gone at once
    import urllib.request
    body = {"model": "u1", "prompt": GOLDEN["prompt"], "max_tokens": 64, "temperature": 0, "ignore_eos": True,
            "stream": True, "return_token_ids": True}
    req = urllib.request.Request(srv.url + "/v1/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    got = []
    with urllib.request.urlopen(req, timeout=60) as resp:
        first = resp.readline()  # the request is running on u1 from here
        assert first.startswith(b"data: "), first
        got.append(json.loads(first[6:]))
        assert srv.post("/v1/unload_lora_adapter", {"lora_name": "u1"}, headers=ADM)[0] == 200
        assert srv.post("/v1/completions", {"model": "u1", "prompt": [1], "max_tokens": 1})[0] == 404
        for line in resp:
            if line.startswith(b"data: {"):
                got.append(json.loads(line[6:]))
    toks = [t for c in got for ch in c.get("choices", []) for t in ch.get("token_ids") or []]
    assert toks[:GOLDEN["max_tokens"]] == GOLDEN["t2"] and len(toks) == 64
    assert srv.post("/v1/unload_lora_adapter", {"lora_name": "u2"}, headers=ADM)[0] == 200
    # every slot but t1's is free again (u1's once its request let go, just after its answer went out)
    assert load(srv, "u3", srv.root / "tiny-qwen3-t2")[0] == 200
    wait_until(lambda: load(srv, "u4", srv.root / "tiny-qwen3-t2")[0] == 200, "u1's slot freed")
    for n in ("u3", "u4"):
        assert srv.post("/v1/unload_lora_adapter", {"lora_name": n}, headers=ADM)[0] == 200


def test_startup_refuses_bad_lora_flags(sampler_bin):
    import subprocess
    for args, want in ((["--lora", "t1"], "NAME=DIR"), (["--lora", f"x={ROOT}/tests/fixtures/lora/qwen3_gqa2-a1"], "shape"),
                       (["--lora", f"a={T1}", "--lora", f"b={T2}", "--max-loras", "1"], "--max-loras"),
                       (["--lora-dtype", "float16"], "--lora-dtype")):
        p = subprocess.run([sampler_bin, "--port", "0", "--threads", "1", "--kv-mem-mb", "16", *args], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode != 0 and want in p.stderr, (args, p.stderr)


def test_lora_dtype_bfloat16():
    """--lora-dtype bfloat16: adapters stored as BF16 (half the memory, logged), f32 math; the committed
    adapters are BF16-exact, so the greedy continuations are peft's exactly, in one mixed batch too."""
    s = Server("--lora", f"t1={T1}", "--lora", f"t2={T2}", "--lora-dtype", "bfloat16", "--log-level", "info")
    try:
        assert ids(complete(s, "t1", GOLDEN["prompt"])) == GOLDEN["t1"]
        out = {}
        ths = [threading.Thread(target=lambda m=m: out.__setitem__(m, ids(complete(s, m, GOLDEN["prompt"]))))
               for m in ("t2", "t1", BASE)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        assert out == {"t1": GOLDEN["t1"], "t2": GOLDEN["t2"], BASE: GOLDEN["base"]}
        wait_until(lambda: any("stored as bf16" in l for l in s.stderr), "the start-up log names bf16 storage")
    finally:
        assert s.stop() == 0


def test_trainer_push_lora_signed_inplace(tmp_path):
    import subprocess
    from conftest import BUILD
    trainer = os.environ.get("TRAINER_BIN", os.path.join(BUILD, "trainer"))
    key, wrong = tmp_path / "k", tmp_path / "wrong"
    key.write_text("ab" * 32 + "\n")
    wrong.write_text("cd" * 32 + "\n")
    s = Server("--delta-key-file", str(key), "--max-loras", "2")
    try:
        def push(d, *extra, k=key):
            args = [trainer, "push-lora", d, "--name", "p", "--to", s.url, "--admin-token", ADMIN, "--retries", "0"]
            if k:
                args += ["--key-file", str(k)]
            return subprocess.run(args + list(extra), cwd=ROOT, capture_output=True, text=True, timeout=60)
        p = push(T1)
        assert p.returncode == 0 and '"adapter_version":0' in p.stdout.replace(" ", ""), p.stderr
        assert ids(complete(s, "p", GOLDEN["prompt"])) == GOLDEN["t1"]
        p = push(T2)  # the name is taken and --inplace is not given
        assert p.returncode != 0 and "already been loaded" in p.stderr
        for k in (None, wrong):  # unsigned, wrongly signed: 401, p unchanged
            p = push(T2, "--inplace", k=k)
            assert p.returncode != 0 and "401" in p.stderr, p.stderr
        assert ids(complete(s, "p", GOLDEN["prompt"])) == GOLDEN["t1"]
        p = push(T2, "--inplace")
        assert p.returncode == 0, p.stderr
        r = complete(s, "p", GOLDEN["prompt"])
        assert ids(r) == GOLDEN["t2"] and r["choices"][0]["token_adapter_versions"] == [1] * GOLDEN["max_tokens"]
        bad = tmp_path / "bad"
        shutil.copytree(os.path.join(ROOT, T1), bad)
        c = json.load(open(bad / "adapter_config.json"))
        c["use_dora"] = True
        json.dump(c, open(bad / "adapter_config.json", "w"))
        p = push(str(bad), "--inplace")
        assert p.returncode != 0 and "use_dora" in p.stderr
        assert ids(complete(s, "p", GOLDEN["prompt"])) == GOLDEN["t2"]
    finally:
        assert s.stop() == 0


def test_lora_routes_with_an_api_key(tmp_path):
    """vLLM's routes sit in the /v1/ area (API-key class before the body) but are admin controls:
    the admin token passes both checks, the API key alone gets 401 from the handler."""
    shutil.copytree(os.path.join(ROOT, T2), tmp_path / "t2")
    s = Server("--reload-root", str(tmp_path), api_key="user-key")
    try:
        body = {"lora_name": "t2", "lora_path": str(tmp_path / "t2")}
        user = {"Authorization": "Bearer user-key"}
        st, r = s.post("/v1/load_lora_adapter", body, headers=user)
        assert st == 401 and "admin token" in r["error"]["message"]
        assert s.post("/v1/load_lora_adapter", body)[0] == 401  # no key at all: refused before the body
        st, _ = s.post("/v1/load_lora_adapter", body, headers=ADM)
        assert st == 200
        st, r = s.post("/v1/completions", {"model": "t2", "prompt": GOLDEN["prompt"], "max_tokens": 8,
                                           "temperature": 0, "ignore_eos": True, "return_token_ids": True},
                       headers=user)
        assert st == 200 and r["choices"][0]["token_ids"] == GOLDEN["t2"]
        assert s.post("/v1/unload_lora_adapter", {"lora_name": "t2"}, headers=user)[0] == 401
        assert s.post("/v1/unload_lora_adapter", {"lora_name": "t2"}, headers=ADM)[0] == 200
    finally:
        assert s.stop() == 0


def _moe_golden():
    """{(adapter, seq): (tokens, logits rows)} of tests/fixtures/lora/qwen3_moe.ref.safetensors."""
    t = read_st(os.path.join(ROOT, "tests", "fixtures", "lora", "qwen3_moe.ref.safetensors"))
    out = {}
    for ad in ("a1", "a2"):
        for s in (0, 1):
            dt, shape, raw = t[f"{ad}.seq{s}.tokens"]
            toks = list(struct.unpack(f"<{shape[0]}i", raw))
            dt, (T, V), raw = t[f"{ad}.seq{s}.logits"]
            flat = struct.unpack(f"<{T * V}f", raw)
            out[ad, s] = toks, [flat[i * V:(i + 1) * V] for i in range(T)]
    return out


def _log_softmax_at(row, i):
    m = max(row)
    return row[i] - m - math.log(sum(math.exp(x - m) for x in row))


def test_moe_expert_adapters_match_peft_through_the_server(tmp_path):
    """The routed experts' LoRA (both layouts, docs/lora.md) served: qwen3_moe-a1 (peft's fused
    target_parameters layout) at start-up, qwen3_moe-a2 (per-expert layout) loaded at run time; every
    prompt position's log-prob of its token against transformers + peft's logits (f32 both sides:
    1e-4, as tests/test_lora.c, with an f32 KV cache), then the three (a1, a2, base) at once give what each gave alone."""
    shutil.copytree(os.path.join(ROOT, "tests", "fixtures", "lora", "qwen3_moe-a2"), tmp_path / "a2")
    s = Server("--lora", f"e1={os.path.join(ROOT, 'tests/fixtures/lora/qwen3_moe-a1')}", "--reload-root",
               str(tmp_path), "--tokenizer", os.path.join(ROOT, "models/tiny-qwen3"),
               "--kv-cache-dtype", "float32",  # the golden's K/V are f32 (the default BF16 cache rounds them)
               "--dtype", "float32",  # and its activations (auto rounds them to BF16 on AVX512_BF16 CPUs)
               model=os.path.join(ROOT, "tests/fixtures/qwen3_moe"))
    try:
        assert load(s, "e2", tmp_path / "a2")[0] == 200
        gold = _moe_golden()

        def plp(model, toks):
            c = complete(s, model, toks, 1, prompt_logprobs=0)["choices"][0]
            return [None] + [c["prompt_logprobs"][p][str(toks[p])]["logprob"] for p in range(1, len(toks))]

        worst = 0.0
        for (ad, seq), (toks, rows) in gold.items():
            got = plp({"a1": "e1", "a2": "e2"}[ad], toks)
            base = plp("qwen3_moe", toks)
            for p in range(1, len(toks)):
                want = _log_softmax_at(rows[p - 1], toks[p])
                worst = max(worst, abs(got[p] - want))
            # the adapter moved them far beyond the tolerance
            assert max(abs(got[p] - base[p]) for p in range(1, len(toks))) > 0.5, (ad, seq)
        assert worst <= 1e-4, worst
        jobs = [("e1", gold["a1", 1][0]), ("qwen3_moe", gold["a1", 1][0]), ("e2", gold["a2", 1][0]),
                ("e1", gold["a1", 0][0])]
        alone = [plp(m, t) for m, t in jobs]
        together = [None] * len(jobs)

        def run(i):
            together[i] = plp(*jobs[i])
        ts = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert together == alone
    finally:
        assert s.stop() == 0
