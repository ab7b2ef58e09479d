"""vLLM's token-in/token-out route as prime-rl runs it, driven by the real
client: POST /inference/v1/generate through renderers' client (PyPI
renderers 0.1.12, renderers/client.py `generate`, the function verifiers'
TrainClient calls), the request bodies prime-rl and verifiers build (replayed
from their source: verifiers 0.4.0 verifiers/v1/clients/train.py,
prime-rl serving_tokens.py / kept_tokens.py / routed_experts.py /
weight_version.py), every answer validated with rl_schemas.py (written from
vLLM's protocol classes). Also: cache_salt keys the prefix cache on every
generation route, prime-rl's control routes under the admin token, and
streamed routed experts carry the prompt's routing once and whole."""
import asyncio
import base64
import json
import os
import urllib.request

import numpy as np
import pytest

from conftest import ROOT
from rl_schemas import ErrorResponse, GenerateResponse, GenerateStreamResponse
from sampling_mask import decode_sampling_mask
from server_fixture import ADMIN, Server

AUTH = {"Authorization": "Bearer " + ADMIN}
TINY = os.path.join(ROOT, "models/tiny-qwen3")
MOE = os.path.join(ROOT, "tests/fixtures/qwen3_moe")
PROMPT = [5, 17, 300, 42, 1000, 77, 3, 9]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A --reload-root holding a copy of the served checkpoint (a reload of
    the same weights at a higher version)."""
    import shutil
    r = tmp_path_factory.mktemp("rl_root")
    shutil.copytree(TINY, str(r / "ckpt"))
    return str(r)


@pytest.fixture(scope="module")
def srv(root):
    s = Server("--reload-root", root)
    yield s
    assert s.stop() == 0


def gen(s, body, headers=None):
    st, r = s.post("/inference/v1/generate", body, headers=headers)
    assert st == 200, r
    GenerateResponse.model_validate(r)
    return r


def sse(s, path, body):
    req = urllib.request.Request(s.url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    out = []
    with urllib.request.urlopen(req, timeout=60) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
    return out


class ServerTokenizer:
    """The tokenizer interface renderers' DefaultRenderer uses, answered by
    the sampler's own tokenizer (/tokenize, /detokenize): CI has no
    transformers."""
    all_special_tokens = ["<|im_end|>", "<|im_start|>", "<|endoftext|>"]
    unk_token_id = None

    def __init__(self, s, eos=True):
        self.s = s
        self.eos_token_id = self.convert_tokens_to_ids("<|im_end|>") if eos else None

    def encode(self, text, add_special_tokens=False):
        st, r = self.s.post("/tokenize", {"prompt": text, "add_special_tokens": add_special_tokens})
        assert st == 200, r
        return r["tokens"]

    def decode(self, ids, skip_special_tokens=False):
        st, r = self.s.post("/detokenize", {"tokens": list(ids)})
        assert st == 200, r
        return r["prompt"]

    def convert_tokens_to_ids(self, t):
        ids = self.encode(t)
        return ids[0] if len(ids) == 1 else None


def renderers_generate(s, model, eos=True, **kw):
    from openai import AsyncOpenAI
    from renderers.client import generate
    from renderers.default import DefaultRenderer
    client = AsyncOpenAI(base_url=s.url + "/v1", api_key="unused")

    async def run():
        try:
            return await generate(client=client, renderer=DefaultRenderer(ServerTokenizer(s, eos)),
                                  messages=[{"role": "user", "content": "hi"}], model=model, **kw)
        finally:
            await client.close()
    return asyncio.run(run())


def completions_twin(s, sp, prompt=PROMPT, **extra):
    """The same sampling through /v1/completions (same seed): the tokens,
    sampler log-probs and masks the generate route must equal."""
    body = dict(prompt=prompt, return_token_ids=True, return_sampler_logprobs=True, **sp, **extra)
    st, r = s.post("/v1/completions", body)
    assert st == 200, r
    return r["choices"][0]


def test_renderers_client_reads_every_field(srv):
    """renderers.client.generate (what verifiers' TrainClient calls): token
    ids, per-token log-probs (its token_id:N check and the -9999 sentinel
    check), vLLM's list-form sampling_mask (verifiers'
    SamplingMask.from_sampling_mask), finish_reason, usage, request_id, the
    pre-flight max_model_len of GET /v1/models; the values equal the same
    sampling through /v1/completions."""
    sp = {"max_tokens": 6, "temperature": 0.8, "top_k": 7, "seed": 11, "return_sampling_mask": True}
    res = renderers_generate(srv, "tiny-qwen3", prompt_ids=PROMPT, sampling_params=dict(sp), cache_salt="salt-a")
    twin = completions_twin(srv, {**sp, "stop_token_ids": [151645], "logprobs": 1, "skip_special_tokens": False})
    assert res["completion_ids"] == twin["token_ids"] and len(res["completion_ids"]) == 6
    # vLLM's logprobs follow --logprobs-mode (default raw_logprobs), as the twin's OpenAI logprobs do
    assert res["completion_logprobs"] == pytest.approx(twin["logprobs"]["token_logprobs"], abs=1e-6)
    assert all(-9999 < x <= 0 for x in res["completion_logprobs"])
    masks = decode_sampling_mask(twin["sampling_mask"])
    assert [list(m) for m in masks] == res["sampling_mask"]
    for t, row in zip(res["completion_ids"], res["sampling_mask"]):
        assert t in row and len(row) >= 1 and row == sorted(row)
    assert res["finish_reason"] == "length" and res["request_id"].startswith("generate-tokens-")
    assert res["usage"]["completion_tokens"] == 6 and res["usage"]["prompt_tokens"] == len(PROMPT)
    assert res["routed_experts"] is None  # dense model
    assert res["content"] is not None


def test_verifiers_train_client_call(srv):
    """What verifiers 0.4.0 TrainClient.get_response passes to generate
    (verifiers/v1/clients/train.py): sampling = SamplingConfig.model_dump(
    exclude_none=True) with cache_salt popped into the request, provider
    keys passed through (extra="allow"), routed_experts_prompt_start on a
    bridged turn, the X-Session-ID header; then response_from_generate's
    reads, SamplingMask.from_sampling_mask's ids/counts among them."""
    sampling = {"temperature": 1.0, "top_p": 0.95, "max_tokens": 4, "top_k": 8, "seed": 9,
                "return_sampling_mask": True, "cache_salt": "rollout-3", "routed_experts_prompt_start": 3}
    cache_salt = sampling.pop("cache_salt")
    res = renderers_generate(srv, "tiny-qwen3", prompt_ids=PROMPT, sampling_params=sampling, cache_salt=cache_salt,
                             extra_headers={"X-Session-ID": "session-1"})
    mask = res["sampling_mask"]
    counts = np.fromiter((len(r) for r in mask), dtype=np.int32, count=len(mask))
    ids = np.concatenate([np.asarray(r, dtype=np.int32) for r in mask])
    assert len(counts) == len(res["completion_ids"]) == 4 and counts.sum() == len(ids) and counts.max() <= 8
    assert res["finish_reason"] in ("stop", "length") and res["request_id"]
    assert len(res["completion_logprobs"]) == 4 and res["prompt_ids"] == PROMPT


def test_renderers_overlong_prompt_preflight(srv):
    """renderers reads max_model_len from GET /v1/models and refuses an
    overlong prompt before sending it."""
    from renderers.client import OverlongPromptError
    st, m = srv.request("GET", "/v1/models")
    n = m["data"][0]["max_model_len"]
    with pytest.raises(OverlongPromptError):
        renderers_generate(srv, "tiny-qwen3", prompt_ids=[5] * (n + 1), sampling_params={"max_tokens": 1})


def test_prime_rl_body_kept_tokens_and_versions(srv):
    """The body renderers/verifiers send for prime-rl (sampling_params with
    stop_token_ids, logprobs=1, skip_special_tokens, cache_salt, priority 0,
    the X-data-parallel-rank header): prime-rl's kept_tokens (base64 int32
    ids + counts) equal vLLM's sampling_mask lists, weight_versions are
    [[version, first token]], usage has the cached tokens."""
    body = {"model": "tiny-qwen3", "token_ids": PROMPT * 4,
            "sampling_params": {"temperature": 1.0, "top_p": 0.9, "top_k": 20, "max_tokens": 5, "seed": 2,
                                "stop_token_ids": [151645], "logprobs": 1, "skip_special_tokens": False,
                                "return_sampling_mask": True},
            "cache_salt": "run-7-step-3", "priority": 0}
    r = gen(srv, body, headers={"X-data-parallel-rank": "0"})
    c = r["choices"][0]
    ids = np.frombuffer(base64.b64decode(c["kept_tokens"]["ids"]), dtype="<i4")
    counts = np.frombuffer(base64.b64decode(c["kept_tokens"]["counts"]), dtype="<i4")
    assert len(counts) == len(c["token_ids"]) == 5 and counts.sum() == len(ids)
    rows = np.split(ids, np.cumsum(counts)[:-1])
    assert [list(x) for x in rows] == c["sampling_mask"]
    assert all(1 <= k <= 20 for k in counts)
    assert c["weight_versions"] == [[0, 0]] and r["weight_version"] == 0
    lp = c["logprobs"]["content"]
    assert [e["token"] for e in lp] == [f"token_id:{t}" for t in c["token_ids"]]
    assert all(len(e["top_logprobs"]) == 1 and e["top_logprobs"][0]["token"].startswith("token_id:") for e in lp)
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    again = gen(srv, body)
    # the 32-token prompt's 2 blocks, less the last (its last position is computed for the logits)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 16
    assert again["choices"][0]["token_ids"] == c["token_ids"]


def test_cache_salt_keys_the_prefix_cache_on_every_route(srv):
    """A prompt cached under one salt is found again only with the same salt
    (vLLM: the salt is part of the first block's hash): /v1/completions and
    /v1/chat/completions entries are keyed by it too."""
    p = [7 + i for i in range(40)]

    def cached(salt):
        body = {"token_ids": p, "sampling_params": {"max_tokens": 1}}
        if salt is not None:
            body["cache_salt"] = salt
        return gen(srv, body)["usage"]["prompt_tokens_details"]["cached_tokens"]
    st, r = srv.post("/v1/completions", {"prompt": p, "max_tokens": 1, "cache_salt": "alice"})
    assert st == 200, r
    assert cached("bob") == 0 and cached(None) == 0
    assert cached("alice") == 32
    assert cached(None) == 32  # the unsalted run above registered its own blocks
    # chat: the rendered prompt is the same for the same messages
    msgs = [{"role": "user", "content": "tell me a long story about the sea " * 4}]
    st, r = srv.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 1, "cache_salt": "carol"})
    assert st == 200, r
    st, t = srv.post("/tokenize", {"messages": msgs, "add_generation_prompt": True})
    body = {"token_ids": t["tokens"], "sampling_params": {"max_tokens": 1}, "cache_salt": "carol"}
    assert gen(srv, body)["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16
    body["cache_salt"] = "dave"
    assert gen(srv, body)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    for path, b in (("/v1/completions", {"prompt": p, "max_tokens": 1, "cache_salt": ""}),
                    ("/v1/chat/completions", {"messages": msgs, "max_tokens": 1, "cache_salt": 5})):
        st, e = srv.post(path, b)
        assert st == 400 and e["error"]["param"] == "cache_salt", e


def test_stream_equals_whole(srv):
    """stream: true sends GenerateStreamResponse chunks whose token_ids and
    log-probs concatenate to the whole answer; no chunk is empty; the last
    carries finish_reason, the masks and weight_versions; with include_usage
    a usage chunk with no choices ends it."""
    body = {"token_ids": PROMPT, "sampling_params": {"max_tokens": 7, "temperature": 1.0, "top_k": 4, "seed": 5,
                                                     "logprobs": 0, "return_sampling_mask": True}}
    whole = gen(srv, body)["choices"][0]
    chunks = sse(srv, "/inference/v1/generate", {**body, "stream": True, "stream_options": {"include_usage": True}})
    for c in chunks:
        GenerateStreamResponse.model_validate(c)
    *parts, last = chunks
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 7
    ids = [t for c in parts for t in c["choices"][0]["token_ids"]]
    lps = [e["logprob"] for c in parts for e in c["choices"][0]["logprobs"]["content"]]
    assert ids == whole["token_ids"]
    assert lps == [e["logprob"] for e in whole["logprobs"]["content"]]
    assert all(c["choices"][0]["token_ids"] for c in parts)
    assert [c["choices"][0]["finish_reason"] for c in parts][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in parts[:-1])
    assert parts[-1]["choices"][0]["sampling_mask"] == whole["sampling_mask"]
    assert parts[-1]["choices"][0]["kept_tokens"] == whole["kept_tokens"]


def test_n_and_prompt_logprobs(srv):
    body = {"token_ids": PROMPT, "sampling_params": {"max_tokens": 3, "n": 3, "seed": 1, "prompt_logprobs": 1}}
    r = gen(srv, body)
    assert [c["index"] for c in r["choices"]] == [0, 1, 2]
    assert all(len(c["token_ids"]) == 3 for c in r["choices"]) and r["usage"]["completion_tokens"] == 9
    pl = r["prompt_logprobs"]
    assert pl[0] is None and len(pl) == len(PROMPT)
    for k in range(1, len(PROMPT)):
        assert str(PROMPT[k]) in pl[k]


@pytest.mark.parametrize("body,headers,param", [
    ({"token_ids": PROMPT, "sampling_params": {}, "priority": 1}, None, "priority"),
    ({"token_ids": PROMPT, "sampling_params": {}}, {"X-data-parallel-rank": "1"}, "X-data-parallel-rank"),
    ({"token_ids": PROMPT, "sampling_params": {}}, {"X-data-parallel-rank": "x"}, "X-data-parallel-rank"),
    ({"token_ids": [5, -1], "sampling_params": {}}, None, "token_ids"),
    ({"token_ids": [], "sampling_params": {}}, None, "token_ids"),
    ({"token_ids": PROMPT}, None, "sampling_params"),
    ({"token_ids": PROMPT, "sampling_params": {"top_k": 3}, "features": {"mm_hashes": {}}}, None, "features"),
    ({"token_ids": PROMPT, "sampling_params": {"logits_processors": ["x"]}}, None,
     "sampling_params.logits_processors"),
    ({"token_ids": PROMPT, "sampling_params": {"structured_outputs": {"regex": "("}}}, None, "structured_outputs"),
    ({"token_ids": PROMPT, "sampling_params": {"return_sampling_mask": True}}, None,
     "sampling_params.return_sampling_mask"),  # untruncated: an unbounded support (vLLM needs top_k > 0)
    ({"token_ids": PROMPT, "sampling_params": {"max_tokens": 10 ** 6}}, None, "max_tokens"),
    ({"token_ids": PROMPT, "sampling_params": {}, "cache_salt": ""}, None, "cache_salt"),
])
def test_errors_in_vllms_shape(srv, body, headers, param):
    st, e = srv.post("/inference/v1/generate", body, headers=headers)
    assert st == 400, e
    ErrorResponse.model_validate(e)
    if headers:  # a header is no body parameter: named in the message
        assert e["error"]["param"] is None and e["error"]["message"].startswith(param + ": "), e
    else:
        assert e["error"]["param"] == param, e


def test_api_key_guards_generate():
    s = Server(api_key="k")
    try:
        st, e = s.post("/inference/v1/generate", {"token_ids": PROMPT, "sampling_params": {}})
        assert st == 401 and ErrorResponse.model_validate(e)
        st, r = s.post("/inference/v1/generate", {"token_ids": PROMPT, "sampling_params": {"max_tokens": 1}},
                       headers={"Authorization": "Bearer k"})
        assert st == 200, r
    finally:
        assert s.stop() == 0


def test_control_routes(srv, root):
    """prime-rl's controls, behind the admin token: /update_weights reloads
    a confined checkpoint directory all or nothing (outside the root: 403,
    nothing moves), tokens then carry the new version; /weight_info,
    /update_weight_version (a label never moves alone), /liveness; /pause
    with clear_cache flushes the prefix cache (vLLM's default), and
    clear_cache=false keeps it."""
    for method, path in (("POST", "/update_weights"), ("GET", "/weight_info"), ("GET", "/liveness"),
                         ("POST", "/update_weight_version")):
        st, e = srv.request(method, path, body={} if method == "POST" else None)
        assert st == 401, (path, e)
    st, w = srv.request("GET", "/weight_info", headers=AUTH)
    assert st == 200 and w["weight_version"] == 0 and len(w["model_fingerprint"]) == 16
    assert srv.request("GET", "/liveness", headers=AUTH) == (200, {"status": "ok"})
    st, e = srv.post("/update_weights", {"weight_dir": TINY}, headers=AUTH)  # outside --reload-root
    assert st == 403 and ErrorResponse.model_validate(e)
    st, e = srv.post("/update_weights", {}, headers=AUTH)
    assert st == 400 and e["error"]["param"] == "weight_dir"
    assert srv.request("GET", "/weight_info", headers=AUTH)[1]["weight_version"] == 0
    st, r = srv.post("/update_weights", {"weight_dir": os.path.join(root, "ckpt")}, headers=AUTH)
    assert st == 200 and r["status"] == "ok" and r["weight_version"] == 1, r
    c = gen(srv, {"token_ids": PROMPT, "sampling_params": {"max_tokens": 2}})
    assert c["choices"][0]["weight_versions"] == [[1, 0]] and c["weight_version"] == 1
    st, r = srv.post("/update_weights", {"weight_dir": os.path.join(root, "ckpt"), "version": 5}, headers=AUTH)
    assert st == 200 and r["weight_version"] == 5, r
    st, r = srv.post("/update_weights", {"weight_dir": os.path.join(root, "ckpt"), "version": 5}, headers=AUTH)
    assert st == 409, r  # not above the current version
    assert srv.post("/update_weight_version", {"version": 5}, headers=AUTH)[0] == 200
    st, e = srv.post("/update_weight_version", {"version": 6}, headers=AUTH)
    assert st == 409 and srv.request("GET", "/weight_info", headers=AUTH)[1]["weight_version"] == 5
    # /pause clear_cache
    body = {"token_ids": [9 + i for i in range(40)], "sampling_params": {"max_tokens": 1}, "cache_salt": "p"}
    gen(srv, body)
    assert gen(srv, body)["usage"]["prompt_tokens_details"]["cached_tokens"] == 32
    assert srv.post("/pause?mode=keep&clear_cache=false", None, headers=AUTH)[1] == {"is_paused": True}
    assert srv.post("/resume", None, headers=AUTH)[1] == {"is_paused": False}
    assert gen(srv, body)["usage"]["prompt_tokens_details"]["cached_tokens"] == 32
    st, r = srv.post("/pause", {"mode": "keep"}, headers=AUTH)  # JSON body; clear_cache defaults to true
    assert st == 200 and r == {"is_paused": True}
    srv.post("/resume", None, headers=AUTH)
    assert gen(srv, body)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert srv.post("/pause?clear_cache=maybe", None, headers=AUTH)[0] == 400


def test_weight_update_mid_request_segments(srv, root):
    """prime-rl's async loop: /pause?mode=keep, /update_weights, /resume while
    a request streams: its weight_versions are two segments [[v, 0], [v + 1,
    k]], k the first token sampled by the new weights."""
    st, w = srv.request("GET", "/weight_info", headers=AUTH)
    v = w["weight_version"]
    body = {"token_ids": PROMPT, "sampling_params": {"max_tokens": 1000, "ignore_eos": True, "temperature": 0},
            "stream": True}
    req = urllib.request.Request(srv.url + "/inference/v1/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    n, last = 0, None
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            c = json.loads(line[6:])["choices"][0]
            n += len(c["token_ids"])
            if last is None:  # the first chunk is in: the request runs
                last = {}
                assert srv.post("/pause?mode=keep", None, headers=AUTH)[0] == 200
                st, u = srv.post("/update_weights", {"weight_dir": os.path.join(root, "ckpt")}, headers=AUTH)
                assert st == 200 and u["weight_version"] == v + 1, u
                assert srv.post("/resume", None, headers=AUTH)[0] == 200
            if c["finish_reason"]:
                last = c
    seg = last["weight_versions"]
    assert n == 1000 and len(seg) == 2 and seg[0] == [v, 0] and seg[1][0] == v + 1 and 0 < seg[1][1] < n, seg


# ---- MoE: routed experts ----
@pytest.fixture(scope="module")
def moe():
    s = Server("--tokenizer", TINY, "--max-batched-tokens", "8", "--return-sampling-mask",
               "--enable-return-routed-experts", model=MOE)
    yield s
    assert s.stop() == 0


def test_routed_experts_prime_rl_layout(moe):
    """routed_experts in prime-rl's layout (base64 uint8 [positions, layers,
    top_k], shape, start, dtype) equal our own routed_experts fields of the
    same request, from routed_experts_prompt_start on; renderers' client
    splices the base64 out of the raw bytes ("routed_experts":{"data":")."""
    prompt = [5, 17, 300, 42, 8, 9, 10, 11, 12, 13]
    sp = {"max_tokens": 4, "seed": 3, "top_k": 4, "ignore_eos": True, "return_routed_experts": True}
    twin = completions_twin(moe, sp, prompt=prompt)["routed_experts"]
    full = np.concatenate([np.array(twin["prompt_ids"]), np.array(twin["ids"])]).reshape(-1, 2, 2)
    assert full.shape[0] == len(prompt) + 4 - 1
    for start in (0, 6):
        res = renderers_generate(moe, "qwen3_moe", eos=False, prompt_ids=prompt,  # its vocab is 512
                                 sampling_params={**sp, "routed_experts_prompt_start": start})
        e = res["routed_experts"]
        assert isinstance(e["data"], memoryview)  # renderers found the prefix in the raw answer
        assert e["shape"] == [full.shape[0] - start, 2, 2] and e["start"] == start and e["dtype"] == "uint8"
        got = np.frombuffer(base64.b64decode(bytes(e["data"])), dtype=np.uint8).reshape(e["shape"])
        assert (got == full[start:]).all()


def test_vllm_engine_flags(moe):
    """--return-sampling-mask and --enable-return-routed-experts (vLLM's
    engine-wide flags): prime-rl's body, which asks for neither, gets both;
    a request without a bounded support is refused, as vLLM requires
    top_k > 0 for masks."""
    prompt = [5, 17, 300, 42, 8, 9]
    res = renderers_generate(moe, "qwen3_moe", eos=False, prompt_ids=prompt,
                             sampling_params={"max_tokens": 3, "temperature": 1.0, "top_k": 4, "seed": 2})
    assert len(res["sampling_mask"]) == 3 and all(len(r) <= 4 for r in res["sampling_mask"])
    assert res["routed_experts"]["shape"] == [len(prompt) + 3 - 1, 2, 2]
    st, e = moe.post("/inference/v1/generate", {"token_ids": prompt, "sampling_params": {"max_tokens": 2}})
    assert st == 400 and e["error"]["param"] == "sampling_params.return_sampling_mask", e
    st, r = moe.post("/v1/completions", {"prompt": prompt, "max_tokens": 2})  # the flags are the route's
    assert st == 200 and "sampling_mask" not in r["choices"][0] and "routed_experts" not in r["choices"][0]


def test_streamed_prompt_routing_sent_once_and_whole(moe):
    """A long prompt prefilled in chunks of 8 tokens while streaming: exactly
    one chunk carries the prompt's routing, all n_prompt - 1 positions of it
    (before the fix the first chunk carried the part prefilled so far and a
    later one all of it again), equal to the whole answer's."""
    prompt = [5 + (i * 7) % 500 for i in range(300)]
    body = {"prompt": prompt, "max_tokens": 3, "seed": 1, "ignore_eos": True, "return_routed_experts": True}
    st, whole = moe.post("/v1/completions", body)
    assert st == 200, whole
    we = whole["choices"][0]["routed_experts"]
    chunks = sse(moe, "/v1/completions", {**body, "stream": True})
    carrying = [c["choices"][0]["routed_experts"] for c in chunks
                if c["choices"] and "prompt_ids" in (c["choices"][0].get("routed_experts") or {})]
    assert len(carrying) == 1, [c["choices"][0].get("routed_experts", {}).get("prompt_n_tokens") for c in chunks]
    assert carrying[0]["prompt_n_tokens"] == len(prompt) - 1
    assert carrying[0]["prompt_ids"] == we["prompt_ids"]
    ids = [x for c in chunks if c["choices"] for x in (c["choices"][0].get("routed_experts") or {}).get("ids", [])]
    assert ids == we["ids"]


def test_sampling_params_that_constrain(srv):
    """SamplingParams fields vLLM applies are applied here too, as on
    /v1/completions: allowed_token_ids (only those ids come out),
    truncate_prompt_tokens (the prompt's last k tokens, usage says k),
    structured_outputs (vLLM's StructuredOutputsParams: a choice decodes to one
    of its strings, and the result equals /v1/completions' guided_choice)."""
    r = gen(srv, {"token_ids": PROMPT, "sampling_params": {"max_tokens": 8, "temperature": 1.0, "seed": 3,
                                                         "ignore_eos": True, "allowed_token_ids": [11, 12, 13]}})
    ids = r["choices"][0]["token_ids"]
    assert len(ids) == 8 and set(ids) <= {11, 12, 13}, ids
    r = gen(srv, {"token_ids": PROMPT, "sampling_params": {"max_tokens": 2, "truncate_prompt_tokens": 3}})
    assert r["usage"]["prompt_tokens"] == 3, r["usage"]
    opts = ["yes", "no", "maybe"]
    sp = {"max_tokens": 8, "temperature": 1.0, "seed": 5, "structured_outputs": {"choice": opts}}
    r = gen(srv, {"token_ids": PROMPT, "sampling_params": sp})
    ids = r["choices"][0]["token_ids"]
    assert r["choices"][0]["finish_reason"] == "stop" and ids[-1] in (151643, 151645), r  # ends at EOS, kept as vLLM
    st, d = srv.post("/detokenize", {"tokens": ids[:-1]})
    assert st == 200 and d["prompt"] in opts, (ids, d)
    st, c = srv.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "seed": 5,
                                         "guided_choice": opts, "return_token_ids": True})
    assert st == 200 and c["choices"][0]["token_ids"] in (ids, ids[:-1]), (c, ids)
