"""--kv-cache-dtype (vLLM's flag) on the bundled model: the dtype the engine uses is named in the start-up
log, the prompt log-probs at the default (auto = bfloat16) and at fp8 stay within stated bounds of
transformers' f32 forward (models/tiny-qwen3/ref.safetensors, as test_vllm_semantics.py reads it), and
vLLM's values we do not implement are refused at start-up with a message.

Bounds on |log-prob difference| per prompt token (the logits bounds of tests/test_forward.c, whose
log-softmax moves by at most twice the largest logit difference): measured here, bfloat16 9.3e-3 and fp8
1.6e-1; bounds BF16_TOL = 5e-2 and FP8_TOL = 6e-1. float32 is test_vllm_semantics.py's 2e-3."""
import os
import subprocess

import numpy as np
import pytest

from conftest import ROOT, read_safetensors
from server_fixture import Server

REF = read_safetensors(os.path.join(ROOT, "models/tiny-qwen3/ref.safetensors"))
TOKS = [int(t) for t in REF["seq0.tokens"]]
ROWS = REF["seq0.prefill_logits"].astype(np.float64)
BF16_TOL, FP8_TOL = 5e-2, 6e-1


def log_softmax(x):
    m = np.max(x)
    return x - m - np.log(np.sum(np.exp(x - m)))


@pytest.fixture(scope="module")
def servers():
    # f32 activations: the bounds are the KV dtype's alone (BF16 activations: test_dtype.py)
    out = {"auto": Server("--log-level", "info", "--dtype", "float32"),
           "fp8": Server("--kv-cache-dtype", "fp8", "--log-level", "info", "--dtype", "float32")}
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


def ref_logprobs():
    return np.array([log_softmax(ROWS[k - 1])[TOKS[k]] for k in range(1, len(TOKS))])


def test_engine_line_names_the_dtype(servers):
    for name, want in (("auto", "kv_cache_dtype=bfloat16"), ("fp8", "kv_cache_dtype=fp8_e4m3")):
        s = servers[name]
        s.request("GET", "/v1/models")  # the log lines of start-up are out before the server listens
        log = "".join(s.stderr)
        assert want in log, (name, log)


def test_prompt_logprobs_against_transformers(servers):
    ref = ref_logprobs()
    bf16, fp8 = prompt_logprobs(servers["auto"]), prompt_logprobs(servers["fp8"])
    e_bf16, e_fp8 = np.max(np.abs(bf16 - ref)), np.max(np.abs(fp8 - ref))
    print("max |dlogprob| bfloat16 %.3e fp8 %.3e" % (e_bf16, e_fp8))
    assert e_bf16 < BF16_TOL and e_fp8 < FP8_TOL, (e_bf16, e_fp8)
    assert np.any(bf16 != fp8)  # the flag reached the cache: the two dtypes round differently


def test_unimplemented_values_are_refused(sampler_bin):
    for v in ("fp8_e5m2", "fp8_inc", "fp8_ds_mla", "int8"):
        r = subprocess.run([sampler_bin, "--kv-cache-dtype", v, "--port", "0"], capture_output=True, text=True,
                           timeout=60, cwd=ROOT)
        assert r.returncode != 0 and "does not implement" in r.stderr and v in r.stderr, (v, r.stderr)
    r = subprocess.run([sampler_bin, "--kv-cache-dtype", "fp9", "--port", "0"], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert r.returncode != 0 and "--kv-cache-dtype" in r.stderr and "fp9" in r.stderr, r.stderr
