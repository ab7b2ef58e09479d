"""--dtype (vLLM's flag: the activations of the BF16 matmuls) through the server: bfloat16's prompt
log-probs against transformers with every linear's input rounded to bf16
(tests/fixtures/qwen3_gqa2/ref_act_bf16.safetensors, scripts/make_act_bf16_goldens.py) and float32's
against the f32 reference; the two differ (the flag reached the matmuls); auto is the same bits as one
of them and the start-up log names which; float is float32; vLLM's half / float16 and unknown values
are refused at start-up with a message.

Bounds on |log-prob difference| per prompt token, with the KV cache in f32 so that the activations
alone are measured: bfloat16 against its golden ACT_TOL = 2e-2 (measured 6.7e-7 on this fixture's seq0,
where no input sits at a bf16 rounding boundary; one that does flips to the other neighbour and moves
logits by ~1e-2, see tests/test_forward.c, whose logits bound is 8.5e-2), float32 against the f32 golden
F32_TOL = 2e-4 (measured 1.6e-6; test_forward.c: logits within 1e-4). A server that ignored
--dtype bfloat16 would still pass ACT_TOL, so the test also asks that the two modes differ and that
bfloat16 is closer to its own golden than to the f32 one."""
import os
import subprocess

import numpy as np
import pytest

from conftest import ROOT, read_safetensors
from server_fixture import Server

FIX = os.path.join(ROOT, "tests/fixtures/qwen3_gqa2")
TOKENIZER = os.path.join(ROOT, "models/tiny-qwen3")
REF_F32 = read_safetensors(os.path.join(FIX, "ref.safetensors"))
REF_BF16 = read_safetensors(os.path.join(FIX, "ref_act_bf16.safetensors"))
TOKS = [int(t) for t in REF_F32["seq0.tokens"]]
ACT_TOL, F32_TOL = 2e-2, 2e-4


def log_softmax(x):
    m = np.max(x)
    return x - m - np.log(np.sum(np.exp(x - m)))


def ref_logprobs(ref):
    rows = ref["seq0.prefill_logits"].astype(np.float64)
    return np.array([log_softmax(rows[k - 1])[TOKS[k]] for k in range(1, len(TOKS))])


@pytest.fixture(scope="module")
def servers():
    common = ("--model", FIX, "--tokenizer", TOKENIZER, "--kv-cache-dtype", "float32", "--log-level", "info")
    out = {d: Server("--dtype", d, *common) for d in ("bfloat16", "float32", "float", "auto")}
    yield out
    for s in out.values():
        assert s.stop() == 0


def prompt_logprobs(s):
    st, r = s.post("/v1/completions", {"prompt": TOKS, "max_tokens": 1, "echo": True, "logprobs": 1,
                                       "temperature": 0})
    assert st == 200, r
    lp = r["choices"][0]["logprobs"]["token_logprobs"]
    assert lp[0] is None
    return np.array(lp[1:len(TOKS)], dtype=np.float64)


def started_with(s):
    s.request("GET", "/v1/models")  # the start-up lines are out before the server listens
    log = "".join(s.stderr)
    names = [d for d in ("bfloat16", "float32") if f"dtype {d}," in log]
    assert len(names) == 1, log
    return names[0]


def test_logprobs_match_their_references(servers):
    bf16, f32 = prompt_logprobs(servers["bfloat16"]), prompt_logprobs(servers["float32"])
    e_bf16 = np.max(np.abs(bf16 - ref_logprobs(REF_BF16)))
    e_f32 = np.max(np.abs(f32 - ref_logprobs(REF_F32)))
    print("max |dlogprob| bfloat16 vs its golden %.3e, float32 vs f32 %.3e" % (e_bf16, e_f32))
    assert e_bf16 < ACT_TOL and e_f32 < F32_TOL, (e_bf16, e_f32)
    assert np.any(bf16 != f32)  # the flag reached the matmuls
    # BF16 activations are closer to their own golden than to the f32 one
    assert e_bf16 < np.max(np.abs(bf16 - ref_logprobs(REF_F32)))


def test_start_up_log_and_auto(servers):
    assert started_with(servers["bfloat16"]) == "bfloat16"
    assert started_with(servers["float32"]) == "float32" and started_with(servers["float"]) == "float32"
    assert np.array_equal(prompt_logprobs(servers["float"]), prompt_logprobs(servers["float32"]))
    auto = started_with(servers["auto"])
    assert np.array_equal(prompt_logprobs(servers["auto"]), prompt_logprobs(servers[auto])), auto


def test_unimplemented_values_are_refused(sampler_bin):
    for v in ("half", "float16"):
        r = subprocess.run([sampler_bin, "--dtype", v, "--port", "0"], capture_output=True, text=True, timeout=60,
                           cwd=ROOT)
        assert r.returncode != 0 and "does not implement" in r.stderr and v in r.stderr, (v, r.stderr)
    r = subprocess.run([sampler_bin, "--dtype", "fp7", "--port", "0"], capture_output=True, text=True, timeout=60,
                       cwd=ROOT)
    assert r.returncode != 0 and "--dtype" in r.stderr and "fp7" in r.stderr, r.stderr
