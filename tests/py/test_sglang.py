"""SGLang's native routes as slime calls them: the /generate body slime
builds (THUDM/slime slime/rollout/sglang_rollout.py @ 0044b40d:
GenerateState.sampling_params and generate()'s payload, replayed here) and
the fields slime reads (meta_info.output_token_logprobs [logprob, id],
text, finish_reason, weight_version, cached_tokens, routed_experts), checked
against the same sampling through /v1/completions; every answer validated
with rl_schemas.py (written from SGLang's tokenizer_manager meta_info);
streams, batches and n; errors in SGLang's {"error": {"message"}}; the
controls (/update_weights_from_disk, /pause_generation,
/continue_generation, /flush_cache, /get_model_info, /get_server_info,
/health_generate)."""
import base64
import json
import os
import shutil
import urllib.request

import numpy as np
import pytest

from conftest import ROOT
from rl_schemas import SglError, SglOutput, SglResult
from server_fixture import ADMIN, Server

AUTH = {"Authorization": "Bearer " + ADMIN}
TINY = os.path.join(ROOT, "models/tiny-qwen3")
MOE = os.path.join(ROOT, "tests/fixtures/qwen3_moe")
PROMPT = [5, 17, 300, 42, 1000, 77, 3, 9]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("sgl_root")
    shutil.copytree(TINY, str(r / "ckpt"))
    return str(r)


@pytest.fixture(scope="module")
def srv(root):
    s = Server("--reload-root", root)
    yield s
    assert s.stop() == 0


def slime_payload(input_ids, max_new_tokens=6, top_p=1.0, **kw):
    """generate()'s payload with GenerateState's sampling params (rollout
    args: temperature, top_p, top_k, max_new_tokens, stop, stop_token_ids,
    skip_special_tokens; no_stop_trim and spaces_between_special_tokens
    fixed; custom_params when top_p != 1)."""
    sp = dict(temperature=1.0, top_p=top_p, top_k=-1, max_new_tokens=max_new_tokens, stop=None,
              stop_token_ids=None, skip_special_tokens=False, no_stop_trim=True,
              spaces_between_special_tokens=False)
    if top_p != 1.0:
        sp["custom_params"] = {"return_top_p_token_ids": True}
    sp.update(kw.pop("sp", {}))
    return {"sampling_params": sp, "return_logprob": True, "input_ids": input_ids, **kw}


def post(s, body, path="/generate"):
    st, r = s.post(path, body)
    assert st == 200, r
    for o in (r if isinstance(r, list) else [r]):
        SglOutput.model_validate(o)
    return r


def twin(s, prompt, **sp):
    st, r = s.post("/v1/completions", dict(prompt=prompt, return_token_ids=True, return_sampler_logprobs=True, **sp))
    assert st == 200, r
    return r["choices"][0]


def test_slime_generate_body(srv):
    out = post(srv, slime_payload(PROMPT, top_p=0.9, sp={"sampling_seed": 4}))
    mi = out["meta_info"]
    toks = [item[1] for item in mi["output_token_logprobs"]]
    lps = [item[0] for item in mi["output_token_logprobs"]]
    ref = twin(srv, PROMPT, max_tokens=6, temperature=1.0, top_p=0.9, seed=4, skip_special_tokens=False,
               include_stop_str_in_output=True)
    assert toks == out["output_ids"] == ref["token_ids"]
    assert lps == pytest.approx(ref["sampler_logprobs"], abs=1e-6)
    assert out["text"] == ref["text"]
    assert mi["finish_reason"] == {"type": "length", "length": 6}
    assert mi["prompt_tokens"] == len(PROMPT) and mi["completion_tokens"] == 6
    assert mi["weight_version"] == "0" and mi["cached_tokens"] == 0 and mi["e2e_latency"] > 0
    assert mi["input_token_logprobs"] == []  # logprob_start_len -1: outputs only


def test_logprob_start_and_top(srv):
    out = post(srv, {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 3, "temperature": 0},
                     "return_logprob": True, "logprob_start_len": 2, "top_logprobs_num": 2,
                     "return_text_in_logprobs": True})
    mi = out["meta_info"]
    assert [x[1] for x in mi["input_token_logprobs"]] == PROMPT[2:]
    assert len(mi["input_top_logprobs"]) == len(PROMPT) - 2 and all(len(t) == 2 for t in mi["input_top_logprobs"])
    assert len(mi["output_top_logprobs"]) == 3 and all(isinstance(x[2], str) for x in mi["output_token_logprobs"])
    # greedy: the token is the top alternative
    assert [t[0][1] for t in mi["output_top_logprobs"]] == out["output_ids"]
    first = post(srv, {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1}, "return_logprob": True,
                       "logprob_start_len": 0})["meta_info"]["input_token_logprobs"]
    assert first[0][0] is None and first[0][1] == PROMPT[0] and len(first) == len(PROMPT)


def test_text_stop_and_cached_tokens(srv):
    st, t = srv.post("/tokenize", {"prompt": "Once upon a time"})
    out = post(srv, {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 12, "temperature": 0}})
    ref = twin(srv, t["tokens"], max_tokens=12, temperature=0)
    assert out["output_ids"] == ref["token_ids"] and out["meta_info"]["prompt_tokens"] == len(t["tokens"])
    # a stop string in the greedy text ends it: matched names it, and it is trimmed unless no_stop_trim
    piece = out["text"][3:6]
    stopped = post(srv, {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 12, "temperature": 0,
                                                                        "stop": [piece]}})
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": piece}
    assert stopped["text"] == out["text"][:out["text"].index(piece)]
    # cached_tokens and the salt (SGLang's extra_key)
    long = [11 + i for i in range(40)]
    body = {"input_ids": long, "sampling_params": {"max_new_tokens": 1}, "extra_key": "k1"}
    post(srv, body)
    assert post(srv, body)["meta_info"]["cached_tokens"] == 32
    assert post(srv, {**body, "extra_key": "k2"})["meta_info"]["cached_tokens"] == 0


def test_batch_and_n(srv):
    r = post(srv, {"input_ids": [PROMPT, PROMPT[:4]], "sampling_params": {"max_new_tokens": 2, "n": 2}})
    assert isinstance(r, list) and len(r) == 4 and [o["index"] for o in r] == [0, 1, 2, 3]
    assert [o["meta_info"]["prompt_tokens"] for o in r] == [8, 8, 4, 4]
    assert len({o["meta_info"]["id"] for o in r}) == 4


def test_stream_is_cumulative(srv):
    body = slime_payload(PROMPT, max_new_tokens=5, sp={"sampling_seed": 2}, stream=True)
    whole = post(srv, {**body, "stream": False})
    req = urllib.request.Request(srv.url + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    chunks, done = [], False
    with urllib.request.urlopen(req, timeout=60) as resp:
        for line in resp:
            line = line.decode().strip()
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunks.append(json.loads(line[6:]))
    assert done and chunks
    for c in chunks:
        SglOutput.model_validate(c)
    for a, b in zip(chunks, chunks[1:]):
        assert b["output_ids"][:len(a["output_ids"])] == a["output_ids"] and b["text"].startswith(a["text"])
    last = chunks[-1]
    assert last["output_ids"] == whole["output_ids"] and last["text"] == whole["text"]
    assert last["meta_info"]["finish_reason"] == whole["meta_info"]["finish_reason"]
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert [x[0] for x in last["meta_info"]["output_token_logprobs"]] == \
        [x[0] for x in whole["meta_info"]["output_token_logprobs"]]


def test_sampling_mask(srv):
    out = post(srv, {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4, "top_k": 6, "sampling_seed": 1},
                     "return_sampling_mask": True})
    m = out["meta_info"]["sampling_mask"]
    assert len(m) == 4 and all(t in row and len(row) <= 6 for t, row in zip(out["output_ids"], m))


@pytest.mark.parametrize("body,status", [
    ({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, "bogus": 1}}, 400),
    ({"sampling_params": {}}, 400),
    ({"input_ids": PROMPT, "text": "x"}, 400),
    ({"input_ids": [5, 10 ** 9]}, 400),
    ({"input_ids": PROMPT, "sampling_params": {"regex": "a+"}}, 400),
    ({"input_ids": PROMPT, "image_data": ["x"]}, 400),
    ({"input_ids": PROMPT, "return_sampling_mask": True}, 400),  # untruncated: unbounded support
    ({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 10 ** 6}}, 400),
])
def test_errors_in_sglangs_shape(srv, body, status):
    st, e = srv.post("/generate", body)
    assert st == status, e
    SglError.model_validate(e)


def test_controls(srv, root):
    st, e = srv.post("/update_weights_from_disk", {"model_path": os.path.join(root, "ckpt")})
    assert st == 401 and SglError.model_validate(e)
    st, r = srv.post("/update_weights_from_disk", {"model_path": TINY}, headers=AUTH)  # outside --reload-root
    assert st == 403 and r["success"] is False and SglResult.model_validate(r)
    st, r = srv.post("/update_weights_from_disk", {"model_path": os.path.join(root, "ckpt"), "weight_version": "3"},
                     headers=AUTH)
    assert st == 200 and SglResult.model_validate(r) and r["success"] is True, r
    out = post(srv, {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1}})
    assert out["meta_info"]["weight_version"] == "3"
    st, info = srv.request("GET", "/get_model_info")
    assert st == 200 and info["weight_version"] == "3" and info["is_generation"] is True
    st, info = srv.request("GET", "/get_server_info")
    assert st == 200 and info["context_length"] > 0 and info["weight_version"] == "3"
    st, r = srv.post("/update_weights_from_disk", {"model_path": os.path.join(root, "ckpt"), "weight_version": "v4"},
                     headers=AUTH)
    assert st == 400 and r["success"] is False
    # pause / continue, flush_cache
    body = {"input_ids": [21 + i for i in range(40)], "sampling_params": {"max_new_tokens": 1}}
    post(srv, body)
    assert post(srv, body)["meta_info"]["cached_tokens"] == 32
    assert srv.request("GET", "/flush_cache", headers=AUTH)[0] == 200
    assert post(srv, body)["meta_info"]["cached_tokens"] == 0
    assert srv.post("/flush_cache", None, headers=AUTH)[0] == 200
    st, r = srv.post("/pause_generation", {"mode": "in_place"}, headers=AUTH)
    assert st == 200 and r["success"] and srv.request("GET", "/is_paused", headers=AUTH)[1]["is_paused"] is True
    st, r = srv.post("/continue_generation", {}, headers=AUTH)
    assert st == 200 and srv.request("GET", "/is_paused", headers=AUTH)[1]["is_paused"] is False
    st, e = srv.post("/pause_generation", {"mode": "sideways"}, headers=AUTH)
    assert st == 400 and SglError.model_validate(e)
    st, body = srv.request("GET", "/health_generate")
    assert st == 200 and body == ""


def test_routed_experts_whole_stream():
    """meta_info.routed_experts: base64 int32 [n_prompt + n_out - 1,
    layers * top_k], as SGLang returns it (slime decodes it with
    np.frombuffer(..., int32)); equal to the OpenAI route's routing."""
    s = Server("--tokenizer", TINY, model=MOE)
    try:
        prompt = [5, 17, 300, 42, 8, 9]
        out = post(s, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 3, "ignore_eos": True,
                                                                "sampling_seed": 3}, "return_routed_experts": True})
        a = np.frombuffer(base64.b64decode(out["meta_info"]["routed_experts"]), dtype=np.int32).reshape(-1, 4)
        assert a.shape[0] == len(prompt) + 3 - 1
        ref = twin(s, prompt, max_tokens=3, ignore_eos=True, seed=3, return_routed_experts=True)["routed_experts"]
        assert a.reshape(-1).tolist() == ref["prompt_ids"] + ref["ids"]
    finally:
        assert s.stop() == 0
