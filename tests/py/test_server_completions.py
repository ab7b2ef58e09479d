"""/v1/completions over HTTP with the official openai client: whole and
streamed responses, n > 1, token ids in and out, echo, logprobs, stop strings
split across tokens, usage, and seeded determinism under concurrency."""
import concurrent.futures as cf
import json
import math

import numpy as np
import openai
import pytest

from server_fixture import Server, wait_idle

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def srv():
    s = Server()
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


def detok(srv, ids):
    st, r = srv.post("/detokenize", {"tokens": list(ids)})
    assert st == 200
    return r["prompt"]


def tok(srv, text):
    st, r = srv.post("/tokenize", {"prompt": text})
    assert st == 200
    return r["tokens"]


def test_models_and_health(srv, client):
    assert [m.id for m in client.models.list().data] == ["tiny-qwen3"]
    assert srv.request("GET", "/health")[0] == 200


def test_whole_response_is_consistent(srv, client):
    r = client.completions.create(model="tiny-qwen3", prompt=PROMPT, max_tokens=8, seed=7,
                                  extra_body={"return_token_ids": True})
    d = r.model_dump()
    c = d["choices"][0]
    assert c["prompt_token_ids"] == tok(srv, PROMPT)
    assert len(c["token_ids"]) == 8 and c["finish_reason"] == "length"
    assert c["text"] == detok(srv, c["token_ids"])
    assert r.usage.prompt_tokens == len(c["prompt_token_ids"])
    assert r.usage.completion_tokens == 8 and r.usage.total_tokens == r.usage.prompt_tokens + 8
    assert d["weight_version"] == 0 and c["weight_versions"] == [0]


def test_stream_equals_whole(client):
    kw = dict(model="tiny-qwen3", prompt=PROMPT, max_tokens=10, seed=11, temperature=0.9)
    whole = client.completions.create(**kw, extra_body={"return_token_ids": True})
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True},
                                            extra_body={"return_token_ids": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    ids = [i for c in chunks if c.choices for i in (c.choices[0].model_extra.get("token_ids") or [])]
    assert text == whole.choices[0].text
    assert ids == whole.choices[0].model_extra["token_ids"]
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].usage.completion_tokens == 10 and chunks[-1].choices == []
    # a chunk carries the tokens ready when the connection is written: how many
    # share one depends on timing, so only their sum is checked here
    per_chunk = [len(c.choices[0].model_extra.get("token_ids") or []) for c in chunks if c.choices]
    assert sum(per_chunk) == 10, per_chunk


def test_stream_is_flushed_before_the_end(srv, client):
    """Tokens reach the client while the request still runs: the first chunk
    with tokens is not the whole answer (2000 tokens take the engine far
    longer than a fill of the connection)."""
    stream = client.completions.create(model="tiny-qwen3", prompt=PROMPT, max_tokens=2000, stream=True,
                                       extra_body={"ignore_eos": True, "return_token_ids": True})
    try:
        for c in stream:
            got = len(c.choices[0].model_extra.get("token_ids") or []) if c.choices else 0
            if got:
                assert got < 2000 and c.choices[0].finish_reason is None
                break
    finally:
        stream.close()  # the server aborts the rest
    wait_idle(srv)


def test_n_and_token_ids_in(srv, client):
    ids = tok(srv, PROMPT)
    r = client.completions.create(model="tiny-qwen3", prompt=[ids, ids[:2]], max_tokens=4, n=3, seed=5,
                                  extra_body={"return_token_ids": True})
    d = r.model_dump()
    assert [c["index"] for c in d["choices"]] == list(range(6))
    assert [c["prompt_token_ids"] for c in d["choices"]] == [ids] * 3 + [ids[:2]] * 3
    outs = [tuple(c["token_ids"]) for c in d["choices"]]
    assert len(set(outs[:3])) > 1, "samples of one prompt should differ"
    assert r.usage.prompt_tokens == len(ids) + 2 and r.usage.completion_tokens == 24
    # token ids are used as given: the same ids as a string prompt give the same samples
    r2 = client.completions.create(model="tiny-qwen3", prompt=PROMPT, max_tokens=4, n=3, seed=5,
                                   extra_body={"return_token_ids": True})
    assert [tuple(c["token_ids"]) for c in r2.model_dump()["choices"]] == outs[:3]


def test_echo(srv, client):
    r = client.completions.create(model="tiny-qwen3", prompt=PROMPT, max_tokens=3, echo=True, seed=1, logprobs=2,
                                  extra_body={"return_token_ids": True})
    c = r.choices[0]
    gen = detok(srv, c.model_extra["token_ids"])
    assert c.text == PROMPT + gen
    n_prompt = len(tok(srv, PROMPT))
    assert len(c.logprobs.tokens) == n_prompt + 3 and c.logprobs.token_logprobs[0] is None
    assert all(x <= 0 for x in c.logprobs.token_logprobs[1:])


def vllm_top(own_id, own, entries, k):
    """vLLM's completions top_logprobs of one position (serving_completion.py: the first logprobs + 1 items
    of the position's logprob dict, keyed by decoded text, a later item replacing an earlier one of the same
    text). The dict holds the position's own token first, then the top ranks (vllm/logprobs.py:
    append_logprobs_for_next_position), one item per token id. entries: {id: (text, logprob, rank)}."""
    items = [(own_id, own)] + sorted(((i, e) for i, e in entries.items() if i != own_id), key=lambda x: x[1][2])
    return {text: lp for _, (text, lp, _) in items[:k + 1]}


def prompt_entries(c, ids):
    """The response's vLLM prompt_logprobs field as {position: (own entry, {id: (text, logprob, rank)})}."""
    out = {}
    for pos, d in enumerate(c["prompt_logprobs"]):
        if d is None:
            continue
        e = {int(i): (v["decoded_token"], v["logprob"], v["rank"]) for i, v in d.items()}
        out[pos] = (e[ids[pos]], {i: x for i, x in e.items() if x[2] is not None})
    return out


def same_top(a, b):
    return a.keys() == b.keys() and all(math.isclose(a[t], b[t], abs_tol=1e-5) for t in a)


@pytest.mark.parametrize("logprobs,prompt_logprobs", [(5, None), (5, 2), (3, 8), (0, None)])
def test_echo_logprobs_like_vllm(srv, logprobs, prompt_logprobs):
    """Echo with logprobs: every echoed prompt token but the first (null, no context) carries the
    alternatives vLLM gives it: its prompt logprobs computed with top-prompt_logprobs when the request sets
    it, else top-logprobs, cut to logprobs + 1 entries with the token's own first. Streamed exactly as whole.
    The prompt ends with the model's own greedy continuation, so some prompt tokens are rank 1 in their
    top list (there the cut keeps a lower-ranked token that a plain top-logprobs would drop)."""
    st, r = srv.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "temperature": 0,
                                         "return_token_ids": True})
    assert st == 200
    ids = tok(srv, PROMPT) + r["choices"][0]["token_ids"]
    # the reference top lists: the response's own vLLM prompt_logprobs field, with more ranks than asked
    ref_k = max(logprobs, prompt_logprobs or 0)
    st, ref = srv.post("/v1/completions", {"prompt": ids, "max_tokens": 1, "prompt_logprobs": ref_k})
    assert st == 200
    ref = prompt_entries(ref["choices"][0], ids)
    k = prompt_logprobs if prompt_logprobs is not None else logprobs
    if logprobs:
        # (a prompt token ranked within the top list; ranks are vLLM's vocabulary ranks)
        assert any(own[2] is not None and own[2] <= min(k, logprobs) for own, _ in ref.values()), \
            "no prompt token in its own top list"

    body = {"prompt": ids, "max_tokens": 3, "echo": True, "logprobs": logprobs, "seed": 4}
    if prompt_logprobs is not None:
        body["prompt_logprobs"] = prompt_logprobs
    st, r = srv.post("/v1/completions", body)
    assert st == 200, r
    lp = r["choices"][0]["logprobs"]
    n = len(ids)
    assert len(lp["tokens"]) == n + 3
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    for pos in range(1, n):
        own, top = ref[pos]
        want = vllm_top(ids[pos], own, {i: e for i, e in top.items() if e[2] <= k}, logprobs)
        assert math.isclose(lp["token_logprobs"][pos], own[1], abs_tol=1e-5)
        assert same_top(lp["top_logprobs"][pos], want), (pos, lp["top_logprobs"][pos], want)
    for top in lp["top_logprobs"][n:]:  # sampled tokens: their own + top-logprobs
        assert logprobs <= len(top) <= logprobs + 1
    offs = lp["text_offset"]
    assert offs[0] == 0 and all(offs[i + 1] == offs[i] + len(lp["tokens"][i]) for i in range(n + 2))

    if prompt_logprobs:  # vLLM refuses prompt_logprobs > 0 with stream; nothing to compare
        return
    chunks = srv.request("POST", "/v1/completions", body | {"stream": True})[1]
    events = [json.loads(l[6:]) for l in chunks.split("\n") if l.startswith("data: {")]
    parts = [e["choices"][0]["logprobs"] for e in events if e["choices"] and e["choices"][0]["logprobs"]]
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == r["choices"][0]["text"]
    streamed = {key: [x for p in parts for x in p[key]] for key in lp}
    assert streamed["tokens"] == lp["tokens"] and streamed["text_offset"] == lp["text_offset"]
    assert streamed["token_logprobs"][0] is None and streamed["top_logprobs"][0] is None
    assert np.allclose(streamed["token_logprobs"][1:], lp["token_logprobs"][1:], atol=1e-5)
    assert all(same_top(a, b) for a, b in zip(streamed["top_logprobs"][1:], lp["top_logprobs"][1:]))


def test_logprobs_processed_distribution(client):
    # T = 1 and no truncation: the sampled distribution is the model's
    r = client.completions.create(model="tiny-qwen3", prompt=PROMPT, max_tokens=5, seed=3, logprobs=5,
                                  extra_body={"return_sampler_logprobs": True, "return_raw_logprobs": True})
    c = r.choices[0]
    ex = c.model_extra
    assert np.allclose(ex["sampler_logprobs"], ex["raw_logprobs"], atol=1e-5)
    assert np.allclose(c.logprobs.token_logprobs, ex["sampler_logprobs"], atol=1e-6)
    assert ex["token_weight_versions"] == [0] * 5
    for i, top in enumerate(c.logprobs.top_logprobs):
        vals = sorted(top.values(), reverse=True)
        assert len(top) >= 5 and vals[0] >= c.logprobs.token_logprobs[i] - 1e-6
        assert sum(math.exp(v) for v in vals) <= 1 + 1e-4


def test_stop_string_split_across_tokens(srv, client):
    kw = dict(model="tiny-qwen3", prompt=PROMPT, max_tokens=24, seed=21, temperature=1.0)
    base = client.completions.create(**kw, extra_body={"return_token_ids": True})
    ids = base.choices[0].model_extra["token_ids"]
    text = base.choices[0].text
    pieces = [detok(srv, ids[:k]) for k in range(len(ids) + 1)]
    # a stop string made of the end of token k and the start of token k+1
    for k in range(1, len(ids) - 1):
        a, b, c = pieces[k - 1], pieces[k], pieces[k + 1]
        if len(b) - len(a) >= 2 and len(c) - len(b) >= 2 and c.startswith(b) and b.startswith(a):
            stop = b[-2:] + c[len(b):len(b) + 2]
            if text.find(stop) == len(b) - 2:
                break
    else:
        pytest.skip("no token boundary with two-character tokens on both sides")
    r = client.completions.create(**kw, stop=[stop], extra_body={"return_token_ids": True})
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == text[:len(b) - 2]
    assert r.choices[0].model_extra["token_ids"] == ids[:k + 1]
    assert r.usage.completion_tokens == k + 1
    s = list(client.completions.create(**kw, stop=[stop], stream=True))
    assert "".join(x.choices[0].text for x in s) == text[:len(b) - 2]
    assert s[-1].choices[0].finish_reason == "stop"
    r = client.completions.create(**kw, stop=stop, extra_body={"include_stop_str_in_output": True})
    assert r.choices[0].text == text[:len(b) - 2] + stop


def test_seeded_alone_equals_among_16_concurrent(client):
    kw = dict(model="tiny-qwen3", max_tokens=8, temperature=0.8,
              extra_body={"return_token_ids": True, "top_k": 40})
    alone = client.completions.create(prompt=PROMPT, seed=1234, **kw).choices[0].model_extra["token_ids"]

    def one(i):
        p, seed = (PROMPT, 1234) if i % 4 == 0 else (f"{PROMPT} {i}", 100 + i)
        return i, client.completions.create(prompt=p, seed=seed, **kw).choices[0].model_extra["token_ids"]

    with cf.ThreadPoolExecutor(16) as ex:
        res = dict(ex.map(one, range(16)))
    for i in range(0, 16, 4):
        assert res[i] == alone


def test_unknown_fields_ignored_and_extra_params(client):
    r = client.completions.create(model="tiny-qwen3", prompt=PROMPT, max_tokens=4, seed=2,
                                  presence_penalty=0.5, frequency_penalty=0.5, logit_bias={"11": 5},
                                  extra_body={"top_k": 3, "min_p": 0.01, "repetition_penalty": 1.1, "ignore_eos": True, "min_tokens": 2,
                                              "some_future_field": {"x": 1}})
    assert r.usage.completion_tokens == 4


def test_logit_bias_forces_token(client):
    r = client.completions.create(model="tiny-qwen3", prompt=PROMPT, max_tokens=4, seed=2,
                                  logit_bias={"12345": 100}, extra_body={"return_token_ids": True})
    assert r.choices[0].model_extra["token_ids"] == [12345] * 4


def test_stop_token_ids(client):
    r = client.completions.create(model="tiny-qwen3", prompt=PROMPT, max_tokens=6, seed=2,
                                  logit_bias={"12345": 100},
                                  extra_body={"return_token_ids": True, "stop_token_ids": [12345]})
    assert r.choices[0].finish_reason == "stop" and r.choices[0].model_extra["token_ids"] == [12345]
