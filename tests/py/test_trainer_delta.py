"""trainer diff / apply / inspect on generated sharded checkpoints: the
applied checkpoint is byte-identical to the one the delta was made from, a
delta that does not fit is refused without writing anything."""
import filecmp
import os
import subprocess

import numpy as np
import pytest

from delta_ckpt import TRAINER, parse_delta, random_weights, step, write_checkpoint


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
