"""/v1/completions over HTTP with the official openai client: whole and
streamed responses, n > 1, token ids in and out, echo, logprobs, stop strings
split across tokens, usage, and seeded determinism under concurrency."""
import concurrent.futures as cf
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
