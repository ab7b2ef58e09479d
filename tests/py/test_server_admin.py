"""The trainer's controls over HTTP: a weight delta made by `trainer diff`
applied in place (POST /admin/v1/weights/delta) gives the same tokens as a
server started on the updated checkpoint, tokens after it carry the new
version (also mid-stream), replays are no-ops, conflicts are 409;
--delta at start-up; pause / resume; abort by response id."""
import json
import os
import shutil
import subprocess
import threading
import urllib.request

import numpy as np
import pytest

from conftest import BUILD, ROOT
from server_fixture import ADMIN, Server, metrics, wait_until

AUTH = {"Authorization": "Bearer " + ADMIN}
TRAINER = os.environ.get("TRAINER_BIN", os.path.join(BUILD, "trainer"))
GREEDY = {"prompt": "The quick brown fox", "max_tokens": 12, "temperature": 0, "return_token_ids": True,
          "return_sampler_logprobs": True, "return_raw_logprobs": True}


def bump_bf16(src, dst, names, every=7):
    """Copy the checkpoint src -> dst with some BF16 elements of the named
    tensors moved by a few ulps (a fake optimizer step)."""
    shutil.copytree(src, dst)
    path = os.path.join(dst, "model.safetensors")
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    n = int.from_bytes(raw[:8], "little")
    hdr = json.loads(raw[8:8 + n])
    for name in names:
        b, e = hdr[name]["data_offsets"]
        a = np.frombuffer(raw, dtype=np.uint16, count=(e - b) // 2, offset=8 + n + b).copy()
        a[::every] += 200  # about x3 in value: enough to change the greedy tokens
        raw[8 + n + b:8 + n + e] = a.tobytes()
    with open(path, "wb") as f:
        f.write(raw)


@pytest.fixture(scope="module")
def deltas(tmp_path_factory):
    if not os.path.exists(TRAINER):
        pytest.skip("trainer binary not built")
    d = tmp_path_factory.mktemp("deltas")
    v0 = os.path.join(ROOT, "models/tiny-qwen3")
    v1, v2 = str(d / "v1"), str(d / "v2")
    bump_bf16(v0, v1, ["model.norm.weight", "model.layers.0.mlp.down_proj.weight"])
    bump_bf16(v1, v2, ["model.layers.1.self_attn.o_proj.weight"], every=3)
    for a, b, base, tgt in ((v0, v1, 0, 1), (v1, v2, 1, 2)):
        r = subprocess.run([TRAINER, "diff", a, b, "-o", str(d / f"{tgt}.delta"), "--base-version", str(base),
                            "--target-version", str(tgt)] +
                           (["--fingerprint", json.loads(subprocess.run(
                               [TRAINER, "fingerprint", v0], capture_output=True, text=True).stdout)["model_fingerprint"]]
                            if base else []),
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    return {"dir": d, "v1": v1, "v2": v2, "d1": str(d / "1.delta"), "d2": str(d / "2.delta")}


def push(s, path):
    return s.request("POST", "/admin/v1/weights/delta", raw=open(path, "rb").read(),
                     headers=AUTH | {"Content-Type": "application/octet-stream"})


def greedy(s):
    st, r = s.post("/v1/completions", GREEDY)
    assert st == 200, r
    return r["choices"][0]


def test_delta_applies_in_place(deltas):
    ref = Server(model=deltas["v1"], *("--tokenizer", os.path.join(ROOT, "models/tiny-qwen3")))
    want_c = greedy(ref)
    want = want_c["token_ids"]
    ref.stop()
    s = Server()
    try:
        before = greedy(s)
        assert before["token_weight_versions"] == [0] * 12
        assert before["token_ids"] != want, "the fake step should change the greedy output"
        st, r = push(s, deltas["d1"])
        assert st == 200 and r["version"] == 1 and r["noop"] is False and r["tensors_updated"] == 2, r
        after = greedy(s)
        assert after["token_ids"] == want and after["raw_logprobs"] == want_c["raw_logprobs"]
        assert after["token_weight_versions"] == [1] * 12 and after["weight_versions"] == [1]
        st, w = s.request("GET", "/admin/v1/weights", headers=AUTH)
        fp = subprocess.run([TRAINER, "fingerprint", deltas["v1"], "--version", "1", "--fingerprint",
                             w["model_fingerprint"]], capture_output=True, text=True)
        assert st == 200 and w == json.loads(fp.stdout)
        st, r = push(s, deltas["d1"])  # replay
        assert st == 200 and r["noop"] is True and r["version"] == 1
        st, r = s.request("POST", "/admin/v1/weights/delta", raw=b"SMPLDELT garbage", headers=AUTH)
        assert st == 400 and r["current_version"] == 1
        st, m = s.request("GET", "/metrics")
        assert "sampler_weight_version 1\n" in m
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("precision", ["fp8", "nvfp4"])
def test_delta_on_quantized_sampler(deltas, precision):
    """A quantized sampler patches its BF16 master and re-quantizes the touched
    blocks: afterwards it answers exactly like a sampler that quantized the
    updated checkpoint from scratch."""
    tok = ("--tokenizer", os.path.join(ROOT, "models/tiny-qwen3"))
    ref = Server("--precision", precision, *tok, model=deltas["v1"])
    want = greedy(ref)
    ref.stop()
    s = Server("--precision", precision)
    try:
        before = greedy(s)
        st, r = push(s, deltas["d1"])
        assert st == 200 and r["version"] == 1, r
        after = greedy(s)
        assert before["token_ids"] != want["token_ids"]
        assert after["token_ids"] == want["token_ids"] and after["raw_logprobs"] == want["raw_logprobs"]
    finally:
        assert s.stop() == 0


def test_trainer_push_updates_running_samplers(deltas):
    """The trainer's path end to end: `trainer diff` made the delta, `trainer
    push` sends it to two running samplers at once, both end on version 1 with
    exactly the per-tensor hashes of the trainer's v1 checkpoint."""
    a, b = Server(), Server()
    try:
        r = subprocess.run([TRAINER, "push", deltas["d1"], "--to", a.url, "--to", b.url, "--admin-token", ADMIN,
                            "--deadline", "60"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        for s in (a, b):
            st, w = s.request("GET", "/admin/v1/weights", headers=AUTH)
            fp = subprocess.run([TRAINER, "fingerprint", deltas["v1"], "--version", "1", "--fingerprint",
                                 w["model_fingerprint"]], capture_output=True, text=True)
            assert st == 200 and w["version"] == 1 and w == json.loads(fp.stdout)
        # pushing the next delta to a sampler that missed one fails loudly (409 reported, non-zero exit)
        c = Server()
        try:
            r = subprocess.run([TRAINER, "push", deltas["d2"], "--to", c.url, "--admin-token", ADMIN,
                                "--deadline", "20"], capture_output=True, text=True, timeout=120)
            assert r.returncode != 0 and "409" in (r.stdout + r.stderr), r.stdout + r.stderr
        finally:
            c.stop()
    finally:
        a.stop()
        b.stop()


def test_full_reload(deltas, tmp_path):
    """POST /admin/v1/weights/reload swaps in a whole checkpoint directory of
    the same model, in place: afterwards the sampler answers like one started
    on that checkpoint and reports its hashes. Paths outside --reload-root
    (also through a symlink), stale versions and other models are refused
    with the weights untouched."""
    ref = Server("--tokenizer", os.path.join(ROOT, "models/tiny-qwen3"), model=deltas["v2"])
    want = greedy(ref)
    ref.stop()
    root = str(deltas["dir"])
    os.symlink(os.path.join(ROOT, "tests/fixtures/qwen3_gqa2"), os.path.join(root, "escape"))
    s = Server("--reload-root", root)
    try:
        st, w0 = s.request("GET", "/admin/v1/weights", headers=AUTH)
        for body, status in (({"path": os.path.join(root, "escape"), "version": 2}, 403),
                             ({"path": os.path.join(ROOT, "models/tiny-qwen3"), "version": 2}, 403),
                             ({"path": os.path.join(root, "nope"), "version": 2}, 403),  # missing looks like forbidden
                             ({"path": deltas["v2"], "version": 0}, 400),
                             ({"path": deltas["v2"]}, 400)):
            st, r = s.request("POST", "/admin/v1/weights/reload", body=body, headers=AUTH)
            assert st == status and "error" in r and r["current_version"] == 0, (body, st, r)
        st, w = s.request("GET", "/admin/v1/weights", headers=AUTH)
        assert w == w0, "a refused reload changed the weights"
        st, r = s.request("POST", "/admin/v1/weights/reload", body={"path": deltas["v2"], "version": 2}, headers=AUTH)
        assert st == 200 and r["version"] == 2 and r["tensors_updated"] == 3, r
        after = greedy(s)
        assert after["token_ids"] == want["token_ids"] and after["raw_logprobs"] == want["raw_logprobs"]
        assert after["token_weight_versions"] == [2] * 12
        st, w = s.request("GET", "/admin/v1/weights", headers=AUTH)
        fp = subprocess.run([TRAINER, "fingerprint", deltas["v2"], "--version", "2", "--fingerprint",
                             w["model_fingerprint"]], capture_output=True, text=True)
        assert w == json.loads(fp.stdout)
        st, r = s.request("POST", "/admin/v1/weights/reload", body={"path": deltas["v1"], "version": 1}, headers=AUTH)
        assert st == 409 and r["current_version"] == 2, r
    finally:
        assert s.stop() == 0
    s = Server()
    try:
        st, r = s.request("POST", "/admin/v1/weights/reload", body={"path": deltas["v2"], "version": 2}, headers=AUTH)
        assert st == 403 and "--reload-root" in r["error"]["message"], r
    finally:
        s.stop()


def test_conflict_is_409(deltas):
    s = Server()
    try:
        st, r = push(s, deltas["d2"])  # base 1, server at 0
        assert st == 409 and r["current_version"] == 0
        assert greedy(s)["token_weight_versions"][0] == 0
    finally:
        assert s.stop() == 0


def test_delta_flag_at_startup(deltas):
    ref = Server(model=deltas["v2"], *("--tokenizer", os.path.join(ROOT, "models/tiny-qwen3")))
    want = greedy(ref)["token_ids"]
    ref.stop()
    s = Server("--delta", deltas["d1"], "--delta", deltas["d2"])
    try:
        got = greedy(s)
        assert got["token_ids"] == want and got["token_weight_versions"] == [2] * 12
    finally:
        assert s.stop() == 0


def stream_lines(s, body):
    req = urllib.request.Request(s.url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                yield json.loads(line[6:])


def test_delta_mid_stream(deltas):
    s = Server()
    try:
        body = {"prompt": "hi", "max_tokens": 40, "ignore_eos": True, "stream": True, "top_p": 0.5, "seed": 3,
                "return_sampler_logprobs": True, "return_raw_logprobs": True}
        versions, final, pushed = [], None, False
        for i, ch in enumerate(stream_lines(s, body)):
            versions += ch["choices"][0].get("token_weight_versions") or []
            if len(versions) >= 5 and not pushed:  # a chunk may carry several tokens
                pushed = True
                st, r = push(s, deltas["d1"])
                assert st == 200 and r["version"] == 1
            final = ch["choices"][0]
        assert len(versions) == 40 and versions[:5] == [0] * 5 and versions[-1] == 1
        assert versions == sorted(versions)
        assert final["weight_versions"] == [0, 1]
    finally:
        assert s.stop() == 0


def test_pause_resume_and_abort():
    s = Server()
    try:
        st, r = s.request("POST", "/pause?mode=keep", {}, headers=AUTH)
        assert st == 200 and r["is_paused"] is True
        assert s.request("GET", "/is_paused", headers=AUTH)[1]["is_paused"] is True
        out = {}
        t = threading.Thread(target=lambda: out.update(r=s.post("/v1/completions", {"prompt": "hi", "max_tokens": 3})))
        t.start()
        wait_until(lambda: metrics(s)["sampler_num_requests_waiting"] == 1, "the request queued while paused")
        assert t.is_alive(), "a request must wait while paused"
        m = metrics(s)
        assert m["sampler_num_requests_running"] == 0 and m["sampler_generation_tokens_total"] == 0
        st, r = s.request("POST", "/resume", {}, headers=AUTH)
        assert st == 200 and r["is_paused"] is False
        t.join(30)
        assert out["r"][0] == 200 and out["r"][1]["usage"]["completion_tokens"] == 3
        # abort by response id
        body = {"prompt": "hi", "max_tokens": 200, "ignore_eos": True, "stream": True, "top_p": 0.5}
        finish = None
        for i, ch in enumerate(stream_lines(s, body)):
            if i == 1:
                st, r = s.request("POST", "/abort_request", {"rid": ch["id"]}, headers=AUTH)
                assert st == 200 and r["aborted"] == 1
            finish = ch["choices"][0]["finish_reason"] or finish
        assert finish == "abort"
    finally:
        assert s.stop() == 0
