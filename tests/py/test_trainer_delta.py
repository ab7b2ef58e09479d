"""trainer diff / apply / inspect on generated sharded checkpoints: the
applied checkpoint is byte-identical to the one the delta was made from, a
delta that does not fit is refused without writing anything, inspect checks
the payloads, and a delta without tensors moves the version only when its
header says so."""
import ctypes
import filecmp
import os
import struct
import subprocess

import numpy as np
import pytest

from conftest import ROOT
from delta_ckpt import TRAINER, parse_delta, random_weights, step, write_checkpoint
from server_fixture import ADMIN, Server


def run(*args, ok=True):
    p = subprocess.run([TRAINER, *map(str, args)], capture_output=True, text=True, timeout=120)
    if ok:
        assert p.returncode == 0, p.stderr + p.stdout
    return p


def same_dirs(a, b):
    fa, fb = sorted(os.listdir(a)), sorted(os.listdir(b))
    assert fa == fb
    for f in fa:
        assert filecmp.cmp(os.path.join(a, f), os.path.join(b, f), shallow=False), f


@pytest.mark.parametrize("values", ["raw", "xor"])
def test_diff_apply_round_trip(tmp_path, values):
    w0 = random_weights(1)
    w1 = step(w0, 2)
    w2 = step(w1, 3)
    for i, w in enumerate((w0, w1, w2)):
        write_checkpoint(tmp_path / f"v{i}", w)
    out = run("diff", tmp_path / "v0", tmp_path / "v1", "-o", tmp_path / "d01.delta", "--threads", 2,
              "--values", values).stdout
    assert "elements changed" in out and "ratio" in out
    d01 = parse_delta((tmp_path / "d01.delta").read_bytes())
    assert (d01["base"], d01["target"]) == (0, 1)
    names = {t["name"]: t for t in d01["tensors"]}
    # exactly the tensors whose bits changed, with the true changed counts
    changed = {n for n in w0 if not np.array_equal(w0[n].view(np.uint8), w1[n].view(np.uint8))}
    assert set(names) == changed and "lm_head.weight" not in names
    for n in changed:
        want = int(np.sum(w0[n].reshape(-1) != w1[n].reshape(-1)))
        assert names[n]["n_changed"] == want, n
    assert names["model.layers.0.input_layernorm.weight"]["encoding"] == 1  # dense: all changed
    assert names["model.embed_tokens.weight"]["encoding"] == (2 if values == "xor" else 0)

    insp = run("inspect", tmp_path / "d01.delta").stdout
    assert "model.layers.0.mlp.down_proj.weight" in insp and "dense" in insp
    assert ("sxor" if values == "xor" else "sparse") in insp

    run("apply", tmp_path / "v0", tmp_path / "d01.delta", "-o", tmp_path / "out1")
    same_dirs(tmp_path / "out1", tmp_path / "v1")

    # the next step carries the lineage fingerprint and base version 1
    fp = f"{d01['fingerprint']:016x}"
    run("diff", tmp_path / "v1", tmp_path / "v2", "-o", tmp_path / "d12.delta", "--base-version", 1,
        "--fingerprint", fp, "--values", values)
    d12 = parse_delta((tmp_path / "d12.delta").read_bytes())
    assert (d12["base"], d12["target"], d12["fingerprint"]) == (1, 2, d01["fingerprint"])
    run("apply", tmp_path / "out1", tmp_path / "d12.delta", "-o", tmp_path / "out2", "--fingerprint", fp)
    same_dirs(tmp_path / "out2", tmp_path / "v2")


def test_apply_refuses_without_writing(tmp_path):
    w0 = random_weights(5)
    w1 = step(w0, 6)
    write_checkpoint(tmp_path / "v0", w0)
    write_checkpoint(tmp_path / "v1", w1)
    run("diff", tmp_path / "v0", tmp_path / "v1", "-o", tmp_path / "d.delta")
    # applied to the wrong base (v1 instead of v0): fingerprint differs
    p = run("apply", tmp_path / "v1", tmp_path / "d.delta", "-o", tmp_path / "bad", ok=False)
    assert p.returncode != 0 and "does not apply" in p.stderr
    assert sorted(os.listdir(tmp_path)) == ["d.delta", "v0", "v1"]  # no OUT, no temp dir
    # a base with the right fingerprint claim but other content: hash check
    w0b = {k: v.copy() for k, v in w0.items()}
    w0b["model.embed_tokens.weight"].reshape(-1)[0] ^= 1
    write_checkpoint(tmp_path / "v0b", w0b)
    fp = f"{parse_delta((tmp_path / 'd.delta').read_bytes())['fingerprint']:016x}"
    p = run("apply", tmp_path / "v0b", tmp_path / "d.delta", "-o", tmp_path / "bad", "--fingerprint", fp, ok=False)
    assert p.returncode != 0 and "hash" in p.stderr and not (tmp_path / "bad").exists()
    # never overwrites
    os.mkdir(tmp_path / "exists")
    p = run("apply", tmp_path / "v0", tmp_path / "d.delta", "-o", tmp_path / "exists", ok=False)
    assert p.returncode != 0 and os.listdir(tmp_path / "exists") == []
    # a corrupted container is refused by every subcommand that reads it
    buf = bytearray((tmp_path / "d.delta").read_bytes())
    buf[100] ^= 0x20
    (tmp_path / "c.delta").write_bytes(bytes(buf))
    assert run("inspect", tmp_path / "c.delta", ok=False).returncode != 0
    assert run("apply", tmp_path / "v0", tmp_path / "c.delta", "-o", tmp_path / "bad", ok=False).returncode != 0
    assert not (tmp_path / "bad").exists()


def test_identical_checkpoints_give_empty_delta(tmp_path):
    w0 = random_weights(9)
    write_checkpoint(tmp_path / "a", w0)
    write_checkpoint(tmp_path / "b", w0)
    run("diff", tmp_path / "a", tmp_path / "b", "-o", tmp_path / "d.delta")
    assert parse_delta((tmp_path / "d.delta").read_bytes())["tensors"] == []
    run("apply", tmp_path / "a", tmp_path / "d.delta", "-o", tmp_path / "out")
    same_dirs(tmp_path / "out", tmp_path / "b")


# XXH3-64 (the container checksum) from the libxxhash that CI installs (.ci/packages.txt), so a test can
# rewrite a container's fields and keep the checksum valid: the reader then has to refute the field itself.
_XXH = ctypes.CDLL("libxxhash.so.0")
_XXH.XXH3_64bits.restype = ctypes.c_uint64
_XXH.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def rechecksum(buf):
    buf = bytes(buf)
    return buf[:-8] + struct.pack("<Q", _XXH.XXH3_64bits(buf[:-8], len(buf) - 8))


def record_offsets(buf):
    """Per tensor record: (offset of its raw-bytes field R, offset of its zstd payload, record dict)."""
    d, off, out = parse_delta(buf), 64, []
    for t in d["tensors"]:
        off += 2 + len(t["name"].encode()) + 4 + 8 * len(t["shape"])
        out.append((off + 16, off + 40, t))
        off += 40 + t["comp"]
    return out


def test_inspect_verifies_payloads(tmp_path):
    """Containers whose structure is sound (valid checksum) but whose payloads are not: inspect decodes every
    payload as a sampler's apply does, and exits non-zero naming the tensor; trainer apply refuses them too."""
    w0 = random_weights(11)
    write_checkpoint(tmp_path / "v0", w0)
    write_checkpoint(tmp_path / "v1", step(w0, 12))
    run("diff", tmp_path / "v0", tmp_path / "v1", "-o", tmp_path / "d.delta")
    good = (tmp_path / "d.delta").read_bytes()
    assert run("inspect", tmp_path / "d.delta").returncode == 0
    sparse = [r for r in record_offsets(good) if r[2]["encoding"] == 0]
    assert sparse
    r_off, p_off, t = sparse[0]
    bad = {}
    # R one byte more: still a legal size for the record, but not what the zstd frame holds
    b = bytearray(good)
    b[r_off:r_off + 8] = struct.pack("<Q", t["raw"] + 1)
    bad["raw size"] = rechecksum(b)
    # the zstd frame's magic number
    b = bytearray(good)
    b[p_off] ^= 0xFF
    bad["zstd magic"] = rechecksum(b)
    for what, buf in bad.items():
        parse_delta(buf)  # structurally fine
        path = tmp_path / "bad.delta"
        path.write_bytes(buf)
        p = run("inspect", path, ok=False)
        assert p.returncode != 0 and t["name"] in p.stderr and "corrupt" in p.stderr, (what, p.stdout, p.stderr)
        p = run("apply", tmp_path / "v0", path, "-o", tmp_path / "out", ok=False)
        assert p.returncode != 0 and t["name"] in p.stderr and not (tmp_path / "out").exists(), what


def test_version_only_delta_is_explicit(tmp_path):
    """Identical checkpoints give a delta that says it moves only the version (header flag 1); without that
    flag a zero-tensor container is refused, by inspect and apply alike; versions end at 2^62."""
    w0 = random_weights(13)
    write_checkpoint(tmp_path / "a", w0)
    write_checkpoint(tmp_path / "b", w0)
    p = run("diff", tmp_path / "a", tmp_path / "b", "-o", tmp_path / "d.delta")
    assert "version-only" in p.stderr
    buf = (tmp_path / "d.delta").read_bytes()
    assert parse_delta(buf)["tensors"] == [] and struct.unpack_from("<I", buf, 12)[0] == 1
    assert "(version only)" in run("inspect", tmp_path / "d.delta").stdout
    b = bytearray(buf)
    b[12:16] = struct.pack("<I", 0)
    (tmp_path / "noflag.delta").write_bytes(rechecksum(b))
    for cmd in (["inspect", tmp_path / "noflag.delta"],
                ["apply", tmp_path / "a", tmp_path / "noflag.delta", "-o", tmp_path / "out"]):
        p = run(*cmd, ok=False)
        assert p.returncode != 0 and "no tensors" in p.stderr and "version_only" in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()
    p = run("diff", tmp_path / "a", tmp_path / "b", "-o", tmp_path / "e.delta", "--target-version", 2 ** 62 + 1,
            ok=False)
    assert p.returncode != 0 and "2^62" in p.stderr and not (tmp_path / "e.delta").exists()
    b = bytearray(buf)
    b[32:40] = struct.pack("<Q", 2 ** 64 - 1)
    (tmp_path / "far.delta").write_bytes(rechecksum(b))
    p = run("inspect", tmp_path / "far.delta", ok=False)
    assert p.returncode != 0 and "2^62" in p.stderr


def test_sampler_refuses_unflagged_empty_delta(tmp_path):
    """Over HTTP: the zero-tensor delta without the flag is a 400 naming the flag and changes nothing; with it,
    the version moves and no tensor does."""
    v0 = os.path.join(ROOT, "models", "tiny-qwen3")
    p = run("diff", v0, v0, "-o", tmp_path / "d.delta")
    buf = (tmp_path / "d.delta").read_bytes()
    b = bytearray(buf)
    b[12:16] = struct.pack("<I", 0)
    noflag = rechecksum(b)
    s = Server()
    try:
        h = {"Authorization": "Bearer " + ADMIN, "Content-Type": "application/octet-stream"}
        st, r = s.request("POST", "/admin/v1/weights/delta", raw=noflag, headers=h)
        assert st == 400 and "version_only" in r["error"]["message"] and r["current_version"] == 0, r
        st, r = s.request("POST", "/admin/v1/weights/delta", raw=buf, headers=h)
        assert st == 200 and r["version"] == 1 and r["tensors_updated"] == 0 and r["noop"] is False, r
    finally:
        assert s.stop() == 0
