"""Signed deltas (--delta-key-file, docs/delta-format.md "Signatures"):
`trainer sign` writes the HMAC-SHA256 that Python's hmac module computes over
the container bytes; a sampler with a key applies signed deltas and refuses
unsigned, wrongly keyed, malformed and tampered ones with 401 (OpenAI error
shape + current_version) leaving the weights exactly as they were (GET
/admin/v1/weights identical) while it keeps serving; an old signed delta
replayed after newer ones gets 409; `trainer push --key-file` signs on the
fly; `--delta FILE` at start-up needs a valid FILE.sig."""
import hashlib
import hmac
import json
import os
import subprocess

import pytest

from conftest import BUILD, ROOT
from server_fixture import ADMIN, Server

TRAINER = os.environ.get("TRAINER_BIN", os.path.join(BUILD, "trainer"))
BINARY = os.environ.get("SAMPLER_BIN", os.path.join(BUILD, "sampler-cpu"))
AUTH = {"Authorization": "Bearer " + ADMIN, "Content-Type": "application/octet-stream"}
KEY = b"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
OTHER = b"0000000000000000000000000000000000000000000000000000000000000000"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    if not os.path.exists(TRAINER):
        pytest.skip("trainer binary not built")
    from test_server_admin import bump_bf16
    d = tmp_path_factory.mktemp("signed")
    v0 = os.path.join(ROOT, "models/tiny-qwen3")
    v1, v2 = str(d / "v1"), str(d / "v2")
    bump_bf16(v0, v1, ["model.norm.weight", "model.layers.0.mlp.down_proj.weight"])
    bump_bf16(v1, v2, ["model.layers.1.self_attn.o_proj.weight"], every=3)
    fp = json.loads(subprocess.run([TRAINER, "fingerprint", v0], capture_output=True, text=True).stdout)
    for a, b, base, tgt in ((v0, v1, 0, 1), (v1, v2, 1, 2)):
        r = subprocess.run([TRAINER, "diff", a, b, "-o", str(d / f"{tgt}.delta"), "--base-version", str(base),
                            "--target-version", str(tgt)] + (["--fingerprint", fp["model_fingerprint"]] if base else []),
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    (d / "key").write_bytes(KEY + b"\n")
    (d / "other").write_bytes(OTHER + b"\n")
    return {"dir": d, "d1": str(d / "1.delta"), "d2": str(d / "2.delta"), "key": str(d / "key"),
            "other": str(d / "other")}


def mac(key, data):
    return "hmac-sha256=" + hmac.new(key, data, hashlib.sha256).hexdigest()


def post(s, data, sig=None):
    h = dict(AUTH)
    if sig is not None:
        h["X-Delta-Signature"] = sig
    return s.request("POST", "/admin/v1/weights/delta", raw=data, headers=h)


def weights(s):
    st, w = s.request("GET", "/admin/v1/weights", headers=AUTH)
    assert st == 200
    return w


def test_trainer_sign_is_hmac_sha256(env):
    r = subprocess.run([TRAINER, "sign", env["d1"], "--key-file", env["key"]], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    data = open(env["d1"], "rb").read()
    assert open(env["d1"] + ".sig").read() == mac(KEY, data) + "\n"
    assert mac(KEY, data) != mac(OTHER, data)
    r = subprocess.run([TRAINER, "sign", env["d1"], "--key-file", env["dir"] / "nokey"], capture_output=True, text=True)
    assert r.returncode != 0 and "cannot open" in r.stderr


def test_refusals_leave_weights_unchanged(env):
    s = Server("--delta-key-file", env["key"])
    try:
        d1 = open(env["d1"], "rb").read()
        before = weights(s)
        tampered = bytearray(d1)
        tampered[len(d1) // 2] ^= 0x01  # inside a zstd payload: the XXH3 checks would also catch it later
        cases = {
            "unsigned": (d1, None),
            "wrong key": (d1, mac(OTHER, d1)),
            "tampered body": (bytes(tampered), mac(KEY, d1)),
            "truncated": (d1[:-8], mac(KEY, d1)),
            "malformed": (d1, "hmac-sha256=xyz"),
            "other algorithm": (d1, mac(KEY, d1).replace("hmac-sha256", "hmac-sha1")),
            "garbage signed with another key": (b"SMPLDELT garbage", mac(OTHER, b"SMPLDELT garbage")),
        }
        for what, (data, sig) in cases.items():
            st, r = post(s, data, sig)
            assert st == 401, (what, st, r)
            assert r["error"]["type"] == "authentication_error" and r["error"]["code"] == "invalid_delta_signature"
            assert r["current_version"] == 0, (what, r)
            assert weights(s) == before, what
        assert "unsigned delta" in post(s, d1)[1]["error"]["message"]
        # still serving
        st, c = s.post("/v1/completions", {"prompt": "Hi", "max_tokens": 3, "temperature": 0})
        assert st == 200 and c["choices"][0]["finish_reason"] == "length"
        # a garbage body signed with the right key passes the signature and fails parsing (400)
        st, r = post(s, b"SMPLDELT garbage", mac(KEY, b"SMPLDELT garbage"))
        assert st == 400 and r["current_version"] == 0 and weights(s) == before
        # signed: applied (hex digits in either case)
        st, r = post(s, d1, mac(KEY, d1).upper().replace("HMAC-SHA256", "hmac-sha256"))
        assert st == 200 and r["version"] == 1 and r["noop"] is False, r
        d2 = open(env["d2"], "rb").read()
        st, r = post(s, d2, mac(KEY, d2))
        assert st == 200 and r["version"] == 2, r
        after = weights(s)
        # replaying the old, validly signed delta cannot move the weights back
        st, r = post(s, d1, mac(KEY, d1))
        assert st == 409 and r["current_version"] == 2, r
        assert weights(s) == after != before
        log = "".join(s.stderr)
    finally:
        assert s.stop() == 0
    assert "refused a delta" in log and KEY.decode() not in log and ADMIN not in log


def test_unsigned_ok_without_key(env):
    s = Server()
    try:
        d1 = open(env["d1"], "rb").read()
        st, r = post(s, d1, mac(OTHER, d1))  # a signature is ignored when no key is configured
        assert st == 200 and r["version"] == 1, r
    finally:
        assert s.stop() == 0


def test_trainer_push_key_file(env):
    s = Server("--delta-key-file", env["key"])
    try:
        base = [TRAINER, "push", env["d1"], "--to", s.url, "--admin-token", ADMIN, "--retries", "0", "--deadline", "20"]
        r = subprocess.run(base, capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "HTTP 401" in r.stdout and "unsigned delta" in r.stdout, r.stdout
        r = subprocess.run(base + ["--key-file", env["other"]], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "wrong delta signature" in r.stdout, r.stdout
        assert weights(s)["version"] == 0
        r = subprocess.run(base + ["--key-file", env["key"]], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "all 1 samplers on version 1" in r.stdout, r.stdout + r.stderr
    finally:
        assert s.stop() == 0


def test_startup_delta_needs_sidecar(env, tmp_path):
    d = tmp_path / "1.delta"
    d.write_bytes(open(env["d1"], "rb").read())
    cmd = [BINARY, "--port", "0", "--threads", "1", "--kv-mem-mb", "64", "--delta-key-file", env["key"], "--delta", str(d)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)  # no d.sig: exits before listening
    assert r.returncode != 0 and "cannot open its signature" in r.stderr and "trainer sign" in r.stderr, r.stderr
    (tmp_path / "1.delta.sig").write_text(mac(OTHER, d.read_bytes()) + "\n")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "wrong delta signature" in r.stderr and "listening" not in r.stdout, r.stderr
    r = subprocess.run([TRAINER, "sign", str(d), "--key-file", env["key"]], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    s = Server("--delta-key-file", env["key"], "--delta", str(d))
    try:
        assert weights(s)["version"] == 1
    finally:
        assert s.stop() == 0
