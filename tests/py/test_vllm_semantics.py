"""vLLM's semantics wherever the server uses vLLM's names, checked against
vLLM's documented behaviour with numbers computed here: the reference is the
transformers forward committed in models/tiny-qwen3/ref.safetensors (full
logits rows; the server's forward matches it to 1e-4, tests/test_forward.c),
so every log-prob, rank and top list below is recomputed with numpy.

- --logprobs-mode (vLLM: raw_logprobs by default, raw_logits,
  processed_logprobs, processed_logits): raw values are taken before any
  processing (temperature included), the top-N are ranked by the mode's own
  distribution (so with a logit_bias the raw argmax is still listed), greedy
  requests report log_softmax of the logits (never 0 / -9999), while the
  sampling mask of a greedy token stays {argmax} with sampler_logprobs 0.
- prompt_logprobs: the token's true rank in the whole vocabulary.
- OpenAI-route extras: allowed_token_ids, bad_words, continue_final_message,
  chat echo, truncate_prompt_tokens, return_tokens_as_token_ids; refused
  fields name themselves, stream_options needs stream, null keys, usage
  details, /tokenizer_info, reasoning, no empty chunks."""
import json
import os

import numpy as np
import pytest

from conftest import ROOT, read_safetensors
from sampling_mask import decode_sampling_mask
from server_fixture import Server
from successor_model import write_successor_model

REF = read_safetensors(os.path.join(ROOT, "models/tiny-qwen3/ref.safetensors"))
TOKS = [int(t) for t in REF["seq0.tokens"]]
ROWS = REF["seq0.prefill_logits"].astype(np.float64)  # row k: logits after TOKS[:k+1]
TOL = 2e-3  # log-prob / logit agreement with the reference (forward: 1e-4)
# The reference is transformers' f32 forward and TOL an f32-class bound, so these servers keep the
# KV cache in f32 (BF16 KV, the default, moves these log-probs by ~1e-2: test_kv_cache_dtype.py) and the
# matmul activations in f32 (--dtype auto takes BF16 activations on CPUs with AVX512_BF16: test_dtype.py).
KV = ("--kv-cache-dtype", "float32", "--dtype", "float32")


def log_softmax(x):
    m = np.max(x[np.isfinite(x)])
    return x - m - np.log(np.sum(np.exp(x[np.isfinite(x)] - m)))


@pytest.fixture(scope="module")
def servers():
    modes = ["default", "processed_logprobs", "raw_logits", "processed_logits"]
    out = {m: Server(*KV) if m == "default" else Server("--logprobs-mode", m, *KV) for m in modes}
    yield out
    for s in out.values():
        assert s.stop() == 0


def masks(c):
    return [[int(i) for i in m] for m in decode_sampling_mask(c["sampling_mask"])]


def one_token(srv, **kw):
    """One generated token after TOKS (its logits row is ROWS[-1]), with the
    top-N as token ids ("token_id:N" keys, vLLM's return_tokens_as_token_ids)."""
    body = dict(prompt=TOKS, max_tokens=1, logprobs=5, seed=3, return_tokens_as_token_ids=True,
                return_token_ids=True, return_sampling_mask=True, return_sampler_logprobs=True,
                return_raw_logprobs=True)
    body.update(kw)
    st, r = srv.post("/v1/completions", body)
    assert st == 200, r
    c = r["choices"][0]
    lp = c["logprobs"]
    tok = c["token_ids"][0]
    assert lp["tokens"] == [f"token_id:{tok}"]
    top = {int(k.split(":")[1]): v for k, v in lp["top_logprobs"][0].items()}
    return c, tok, lp["token_logprobs"][0], top


def test_default_is_raw_before_temperature(servers):
    row = ROWS[-1]
    ref = log_softmax(row)
    c, tok, lp, top = one_token(servers["default"], temperature=0.5, top_k=40)
    assert abs(lp - ref[tok]) < TOL  # not log_softmax(row / 0.5)
    assert abs(c["raw_logprobs"][0] - ref[tok]) < TOL
    want = set(np.argsort(-row, kind="stable")[:5].tolist())
    assert want <= set(top) and len(top) <= 6  # the 5 best of the raw row, plus the token
    for i, v in top.items():
        assert abs(v - ref[i]) < TOL


def test_raw_top_keeps_the_raw_argmax_under_logit_bias(servers):
    row = ROWS[-1]
    am = int(np.argmax(row))
    c, tok, lp, top = one_token(servers["default"], temperature=1.0, logit_bias={str(am): -100})
    assert tok != am
    assert am in top and abs(top[am] - log_softmax(row)[am]) < TOL
    assert abs(lp - log_softmax(row)[tok]) < TOL  # raw: the bias is not in it


def test_greedy_reports_log_softmax_and_keeps_an_argmax_mask(servers):
    row = ROWS[-1]
    am = int(np.argmax(row))
    c, tok, lp, top = one_token(servers["default"], temperature=0)
    assert tok == am and abs(lp - log_softmax(row)[am]) < TOL and lp < -1e-3
    assert all(v > -9999 for v in top.values()) and len(top) == 5
    # the sampler could pick only the argmax: that is its mask and its log-prob
    assert masks(c) == [[am]] and c["sampler_logprobs"] == [0.0]
    # processed: vLLM's greedy path reports log_softmax of the processed (biased) logits, untruncated
    b = int(np.argsort(-row)[3])
    c, tok, lp, top = one_token(servers["processed_logprobs"], temperature=0, top_k=2, logit_bias={str(b): 5})
    z = row.copy()
    z[b] += 5
    ref = log_softmax(z)
    assert tok == int(np.argmax(z)) and abs(lp - ref[tok]) < TOL
    best = np.argsort(-z, kind="stable")[:5]
    assert set(best.tolist()) <= set(top) and all(abs(top[i] - ref[i]) < TOL for i in best)
    assert masks(c) == [[tok]]


def test_processed_modes_are_the_sampled_distribution(servers):
    T, K = 0.8, 3
    z = ROWS[-1] / T
    kept = np.argsort(-z, kind="stable")[:K]
    masked = np.full_like(z, -np.inf)
    masked[kept] = z[kept]
    ref = log_softmax(masked)
    c, tok, lp, top = one_token(servers["processed_logprobs"], temperature=T, top_k=K)
    assert tok in kept.tolist() and abs(lp - ref[tok]) < TOL
    assert abs(lp - c["sampler_logprobs"][0]) < 1e-6
    for i, v in top.items():
        assert (abs(v - ref[i]) < TOL) if i in kept else v == -9999.0
    c, tok, v, top = one_token(servers["processed_logits"], temperature=T, top_k=K)
    assert abs(v - z[tok]) < TOL
    for i, x in top.items():
        assert (abs(x - z[i]) < TOL) if i in kept else x == -9999.0


def test_raw_logits_mode(servers):
    row = ROWS[-1]
    c, tok, v, top = one_token(servers["raw_logits"], temperature=0.7, logit_bias={str(int(np.argmax(row))): -50})
    assert abs(v - row[tok]) < TOL
    assert set(np.argsort(-row, kind="stable")[:5].tolist()) <= set(top)
    assert all(abs(x - row[i]) < TOL for i, x in top.items())


def test_allowed_token_ids(servers):
    row = ROWS[-1]
    allowed = [int(i) for i in np.argsort(row)[:3]] + [int(np.argsort(-row)[7])]  # 3 unlikely ids and one 8th best
    c, tok, lp, top = one_token(servers["default"], temperature=1.0, allowed_token_ids=allowed, seed=9)
    assert tok in allowed
    assert masks(c) == [sorted(allowed)]
    z = np.full_like(row, -np.inf)
    z[allowed] = row[allowed]
    assert abs(c["sampler_logprobs"][0] - log_softmax(z)[tok]) < TOL
    assert abs(lp - log_softmax(row)[tok]) < TOL  # raw: before the whitelist, as vLLM
    c, tok, lp, top = one_token(servers["default"], temperature=0, allowed_token_ids=allowed)
    assert tok == allowed[3]


def test_bad_words(servers):
    s = servers["default"]
    base = dict(prompt=TOKS, max_tokens=2, temperature=0, return_token_ids=True)
    st, r = s.post("/v1/completions", base)
    t1 = r["choices"][0]["token_ids"][0]
    assert t1 == int(np.argmax(ROWS[-1]))
    text1 = s.post("/detokenize", {"tokens": [t1]})[1]["prompt"]
    # vLLM tokenizes each word bare (leading space stripped) and after one space
    forms = [s.post("/tokenize", {"prompt": p})[1]["tokens"] for p in (text1.lstrip(), " " + text1.lstrip())]
    assert [t1] in forms, forms  # the greedy token is one of the word's forms, so it is banned
    st, r = s.post("/v1/completions", base | {"bad_words": [text1]})
    assert st == 200, r
    second_best = int(np.argsort(-ROWS[-1], kind="stable")[1])
    assert r["choices"][0]["token_ids"][0] == second_best
    # a two-token word (the greedy pair after TOKS[:3], which tokenizes back to itself): its first
    # token is allowed, the second is banned right after it
    base["prompt"] = TOKS[:3]
    t1, t2 = s.post("/v1/completions", base)[1]["choices"][0]["token_ids"]
    text12 = s.post("/detokenize", {"tokens": [t1, t2]})[1]["prompt"]
    two = [s.post("/tokenize", {"prompt": p})[1]["tokens"] for p in (text12.lstrip(), " " + text12.lstrip())]
    assert [t1, t2] in two and t1 != t2, two
    st, r = s.post("/v1/completions", base | {"bad_words": [text12]})
    out = r["choices"][0]["token_ids"]
    assert out[0] == t1 and out[1] != t2


def test_prompt_logprobs_rank_is_the_vocabulary_rank(servers):
    st, r = servers["default"].post("/v1/completions", {"prompt": TOKS, "max_tokens": 1, "prompt_logprobs": 1})
    assert st == 200, r
    pl = r["choices"][0]["prompt_logprobs"]
    assert pl[0] is None and len(pl) == len(TOKS)
    far = 0
    for k in range(1, len(TOKS)):
        ref = log_softmax(ROWS[k - 1])
        e = pl[k][str(TOKS[k])]
        v = ref[TOKS[k]]
        assert abs(e["logprob"] - v) < TOL
        lo, hi = int(np.sum(ref > v + TOL)), int(np.sum(ref >= v - TOL))
        assert lo <= e["rank"] <= hi and e["rank"] >= 1, (k, e, lo, hi)
        far += e["rank"] > 1
    assert far > 0  # some prompt token sits outside the top 1: its rank is still given


def test_refused_fields_name_themselves(servers):
    s = servers["default"]
    cases = [("/v1/completions", {"prompt": "hi", "stream_options": {"include_usage": True}}, "stream_options"),
             ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": False,
                                       "stream_options": {"include_usage": True}}, "stream_options"),
             ("/v1/completions", {"prompt": "hi", "use_beam_search": True}, "use_beam_search"),
             ("/v1/completions", {"prompt": "hi", "allowed_token_ids": []}, "allowed_token_ids"),
             ("/v1/completions", {"prompt": "hi", "bad_words": [""]}, "bad_words"),
             ("/v1/completions", {"prompt": "hi", "logprob_token_ids": [5]}, "logprob_token_ids"),
             ("/v1/completions", {"prompt": "hi", "logprobs": -1}, "logprobs"),
             ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                       "continue_final_message": True}, "continue_final_message"),  # + add_gen
             ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                       "structural_tag": {"type": "structural_tag"}}, "structural_tag")]
    for path, body, param in cases:
        st, r = s.post(path, body)
        assert st == 400 and r["error"]["param"] == param, (body, r)
    # the harmless forms are accepted, as vLLM accepts them
    st, r = s.post("/v1/completions", {"prompt": "hi", "max_tokens": 1, "use_beam_search": False,
                                       "stream_options": None, "response_format": {"type": "text"}})
    assert st == 200, r


def test_continue_final_message_and_chat_echo(servers):
    s = servers["default"]
    msgs = [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "The capital is "}]
    st, closed = s.post("/tokenize", {"messages": msgs, "add_generation_prompt": False})
    st, r = s.post("/tokenize", {"messages": msgs, "add_generation_prompt": False, "continue_final_message": True,
                                 "chat_template_kwargs": {"enable_thinking": False}})
    assert st == 200, r
    cont = r["tokens"]
    st, text = s.post("/detokenize", {"tokens": r["tokens"]})
    # transformers' cut: right after the final content; its trailing space kept as the template kept it
    st, full = s.post("/detokenize", {"tokens": closed["tokens"]})
    assert full["prompt"].startswith(text["prompt"]) and text["prompt"].endswith("The capital is ")
    assert "<|im_end|>" in full["prompt"][len(text["prompt"]):]
    body = {"messages": msgs, "add_generation_prompt": False, "continue_final_message": True, "echo": True,
            "max_tokens": 3, "temperature": 0, "chat_template_kwargs": {"enable_thinking": False},
            "return_token_ids": True}
    st, r = s.post("/v1/chat/completions", body)
    assert st == 200, r
    assert r["prompt_token_ids"] == cont
    st, gen = s.post("/detokenize", {"tokens": r["choices"][0]["token_ids"]})
    assert r["choices"][0]["message"]["content"] == "The capital is " + gen["prompt"]
    chunks = sse(s, "/v1/chat/completions", body | {"stream": True})
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0].get("role") == "assistant" and deltas[1] == {"content": "The capital is "}
    assert "".join(d.get("content") or "" for d in deltas) == r["choices"][0]["message"]["content"]


def test_null_keys_usage_details_and_prefix_cache(servers):
    s = servers["default"]
    prompt = list(range(1000, 1040))  # 40 tokens: two full 16-token blocks can be cached
    st, r = s.post("/v1/completions", {"prompt": prompt, "max_tokens": 2, "temperature": 0})
    assert st == 200, r
    c = r["choices"][0]
    assert "prompt_logprobs" in c and c["prompt_logprobs"] is None
    assert "prompt_token_ids" in c and c["prompt_token_ids"] is None
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    st, r = s.post("/v1/completions", {"prompt": prompt, "max_tokens": 2, "temperature": 0})
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == 32
    st, r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert st == 200 and r["prompt_logprobs"] is None and r["prompt_token_ids"] is None
    assert r["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0


def test_truncate_prompt_tokens(servers):
    s = servers["default"]
    prompt = list(range(2000, 2030))
    for side, want in (("left", prompt[-7:]), ("right", prompt[:7])):
        st, r = s.post("/v1/completions", {"prompt": prompt, "max_tokens": 1, "truncate_prompt_tokens": 7,
                                           "truncation_side": side, "return_token_ids": True})
        assert st == 200, r
        assert r["choices"][0]["prompt_token_ids"] == want and r["usage"]["prompt_tokens"] == 7
    st, r = s.post("/v1/completions", {"prompt": prompt, "max_tokens": 1, "truncate_prompt_tokens": 10 ** 7})
    assert st == 400 and r["error"]["param"] == "truncate_prompt_tokens"


def test_tokenizer_info(servers):
    st, r = servers["default"].request("GET", "/tokenizer_info")
    cfg = json.load(open(os.path.join(ROOT, "models/tiny-qwen3/tokenizer_config.json")))
    assert st == 200 and r["tokenizer_class"] == cfg["tokenizer_class"]
    assert r["chat_template"] == cfg["chat_template"] and r["eos_token"] == cfg["eos_token"]


def sse(srv, path, body):
    import urllib.request
    req = urllib.request.Request(srv.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    out = []
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
    return out


def test_streams_have_no_empty_chunks(servers):
    s = servers["default"]
    long_prompt = list(range(3000, 3300))  # prefilled in several steps beside the other choices
    chunks = sse(s, "/v1/completions", {"prompt": long_prompt, "max_tokens": 6, "n": 3, "stream": True, "seed": 5})
    for ch in chunks:
        for c in ch["choices"]:
            assert c["text"] != "" or c["finish_reason"] is not None, ch
    chunks = sse(s, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x " * 200}], "max_tokens": 4,
                                             "n": 2, "stream": True, "seed": 5})
    for ch in chunks:
        for c in ch["choices"]:
            d = c["delta"]
            assert d.get("content") or d.get("reasoning") or d.get("tool_calls") or d.get("role") or \
                c["finish_reason"], ch
    # echo with logprobs: the first chunk carries the prompt and its log-probs
    chunks = sse(s, "/v1/completions", {"prompt": TOKS, "max_tokens": 2, "echo": True, "logprobs": 1,
                                        "stream": True, "return_tokens_as_token_ids": True})
    first = chunks[0]["choices"][0]["logprobs"]
    assert first["tokens"][:len(TOKS)] == [f"token_id:{t}" for t in TOKS]
    assert first["token_logprobs"][0] is None
    for k in range(1, len(TOKS)):
        assert abs(first["token_logprobs"][k] - log_softmax(ROWS[k - 1])[TOKS[k]]) < TOL


@pytest.fixture(scope="module")
def think_srv(servers, tmp_path_factory):
    s = servers["default"]
    st, t = s.post("/tokenize", {"prompt": "<think>Let me see</think>Sunny"})
    st, p = s.post("/tokenize", {"messages": [{"role": "user", "content": "Weather?"}]})
    st, eos = s.post("/tokenize", {"prompt": "<|im_end|>"})
    chain = [p["tokens"][-1]] + t["tokens"] + eos["tokens"]
    d = write_successor_model(str(tmp_path_factory.mktemp("think")), chain)
    srv = Server(model=d, *("--tokenizer", os.path.join(ROOT, "models/tiny-qwen3")))
    srv.chain = chain
    srv.n_think = len(s.post("/tokenize", {"prompt": "<think>Let me see</think>"})[1]["tokens"])
    yield srv
    assert srv.stop() == 0


def test_reasoning_as_vllm_sends_it(think_srv):
    msgs = [{"role": "user", "content": "Weather?"}]
    st, r = think_srv.post("/v1/chat/completions", {"messages": msgs, "temperature": 0, "max_tokens": 40})
    assert st == 200, r
    m = r["choices"][0]["message"]
    assert m["reasoning"] == "Let me see" and m["reasoning_content"] == "Let me see" and m["content"] == "Sunny"
    assert r["usage"]["completion_tokens_details"]["reasoning_tokens"] == think_srv.n_think
    chunks = sse(think_srv, "/v1/chat/completions", {"messages": msgs, "temperature": 0, "max_tokens": 40,
                                                     "stream": True})
    assert "".join(c["choices"][0]["delta"].get("reasoning") or "" for c in chunks) == "Let me see"
    # an assistant turn may carry its reasoning under either name (the template renders it)
    rendered = {}
    for key in (None, "reasoning", "reasoning_content"):
        turn = {"role": "assistant", "content": "Sunny."}
        if key:
            turn[key] = "Let me see."
        st, r = think_srv.post("/tokenize", {"messages": msgs + [turn], "add_generation_prompt": False})
        assert st == 200, r
        rendered[key] = r["tokens"]
    assert rendered["reasoning"] == rendered["reasoning_content"] != rendered[None]
