"""POST /admin/v1/weights/reload: confinement and all-or-nothing.

Every file a reload opens (config.json, the shard index, each shard) must
resolve inside --reload-root; a symlink out of it is refused with the weights
untouched, and missing and forbidden paths get one answer. A checkpoint that
cannot be applied completely (a truncated or misshapen second shard, a
changed tensor the sampler cannot replace in place, a version above the
largest) is refused with the version, every per-tensor hash and the greedy
log-probs exactly as before, and the server keeps serving; a good reload
(also through a symlink that stays inside the root) still works."""
import json
import os
import shutil

import numpy as np
import pytest

from conftest import ROOT
from server_fixture import ADMIN, Server
from st_file import read_st, write_st

AUTH = {"Authorization": "Bearer " + ADMIN}
TINY = os.path.join(ROOT, "models/tiny-qwen3")
GREEDY = {"prompt": "The quick brown fox", "max_tokens": 8, "temperature": 0, "return_token_ids": True,
          "return_raw_logprobs": True}
DELTA_VERSION_MAX = 1 << 62


def bump(b, every=5):
    """BF16 bytes with some elements moved by a lot (changes the greedy output)."""
    a = np.frombuffer(b, dtype=np.uint16).copy()
    a[::every] += 300
    return a.tobytes()


def changed_tensors():
    """The tiny model with its embedding and last norm changed."""
    t = read_st(os.path.join(TINY, "model.safetensors"))
    for name in ("model.embed_tokens.weight", "model.norm.weight", "model.layers.1.mlp.down_proj.weight"):
        dt, shape, b = t[name]
        t[name] = (dt, shape, bump(b))
    return t


def checkpoint(d, tensors, shards=1):
    """A checkpoint directory: the tiny model's config and tokenizer, tensors in
    one file or in `shards` files with an index."""
    os.makedirs(d)
    for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TINY, f), d)
    if shards == 1:
        write_st(os.path.join(d, "model.safetensors"), tensors)
        return d
    names = sorted(tensors)
    weight_map = {}
    for s in range(shards):
        fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: tensors[k] for k in names[s::shards]}
        write_st(os.path.join(d, fn), part)
        weight_map.update({k: fn for k in part})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return d


def reload(s, path, version=1):
    return s.request("POST", "/admin/v1/weights/reload", body={"path": path, "version": version}, headers=AUTH)


def state(s):
    """What a refused reload must leave exactly as it was: every hash, the
    version, and a greedy completion's tokens and log-probs."""
    st, w = s.request("GET", "/admin/v1/weights", headers=AUTH)
    assert st == 200, w
    st, r = s.post("/v1/completions", GREEDY)
    assert st == 200, r
    c = r["choices"][0]
    return w, c["token_ids"], c["raw_logprobs"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """root/ is the --reload-root; outside/ is not under it."""
    base = tmp_path_factory.mktemp("reload")
    root, outside = base / "root", base / "outside"
    root.mkdir()
    outside.mkdir()
    new = changed_tensors()
    checkpoint(str(outside / "single"), new)
    checkpoint(str(outside / "sharded"), new, shards=2)
    checkpoint(str(root / "good"), new)
    return {"root": str(root), "outside": str(outside), "new": new}


def test_reload_symlinks_out_of_the_root_are_refused(tree):
    """A checkpoint directory inside the root whose model.safetensors, shard
    index, second shard or config.json is a symlink to a file outside: 403,
    and nothing changes. The same checkpoint without the symlink reloads
    (so each refusal is the symlink's doing, and the content would have
    changed the weights)."""
    root, out, new = tree["root"], tree["outside"], tree["new"]
    cases = {}
    d = checkpoint(os.path.join(root, "link-single"), new)
    os.remove(os.path.join(d, "model.safetensors"))
    os.symlink(os.path.join(out, "single/model.safetensors"), os.path.join(d, "model.safetensors"))
    cases["model.safetensors"] = d
    d = checkpoint(os.path.join(root, "link-index"), new, shards=2)
    os.remove(os.path.join(d, "model.safetensors.index.json"))
    os.symlink(os.path.join(out, "sharded/model.safetensors.index.json"), os.path.join(d, "model.safetensors.index.json"))
    cases["model.safetensors.index.json"] = d
    d = checkpoint(os.path.join(root, "link-shard"), new, shards=2)
    os.remove(os.path.join(d, "model-00002-of-00002.safetensors"))
    os.symlink(os.path.join(out, "sharded/model-00002-of-00002.safetensors"),
               os.path.join(d, "model-00002-of-00002.safetensors"))
    cases["model-00002-of-00002.safetensors"] = d
    d = checkpoint(os.path.join(root, "link-config"), new)
    os.remove(os.path.join(d, "config.json"))
    os.symlink(os.path.join(out, "single/config.json"), os.path.join(d, "config.json"))
    cases["config.json"] = d
    # inside the root, a symlink that stays inside is fine
    d = checkpoint(os.path.join(root, "link-inside"), {})
    os.remove(os.path.join(d, "model.safetensors"))
    os.symlink(os.path.join(root, "good/model.safetensors"), os.path.join(d, "model.safetensors"))

    s = Server("--reload-root", root)
    try:
        before = state(s)
        for fname, path in cases.items():
            st, r = reload(s, path)
            assert st == 403 and r["current_version"] == 0, (fname, st, r)
            assert r["error"]["message"] == f"{path}: no readable file '{fname}' inside the --reload-root directories", r
            assert state(s) == before, f"a refused reload through a symlinked {fname} changed the weights"
        st, r = reload(s, os.path.join(root, "link-inside"), 3)
        assert st == 200 and r["version"] == 3 and r["tensors_updated"] == 3, r
        after = state(s)
        assert after[0]["version"] == 3 and after[0]["tensors"] != before[0]["tensors"]
        assert after[1:] != before[1:], "the reloaded checkpoint should change the greedy output"
    finally:
        assert s.stop() == 0


def test_reload_missing_and_forbidden_look_the_same(tree):
    """Paths that do not exist, exist outside the root, escape it through a
    directory symlink, or are not directories all get 403 with the same
    message shape, naming only the path the client sent."""
    root, out = tree["root"], tree["outside"]
    os.symlink(out, os.path.join(root, "escape"))
    os.symlink(os.path.join(out, "no-such-dir"), os.path.join(root, "dangling"))
    with open(os.path.join(root, "a-file"), "w") as f:
        f.write("{}")
    paths = [os.path.join(root, "nope"), os.path.join(root, "escape"), os.path.join(root, "escape/single"),
             os.path.join(root, "escape/nope"), os.path.join(root, "good/../escape/single"),
             os.path.join(root, "dangling"), os.path.join(root, "a-file"), os.path.join(out, "single"),
             os.path.join(out, "nope"), "/etc", "/no/such/dir"]
    # inside a directory: a missing model.safetensors and one that escapes
    miss = checkpoint(os.path.join(root, "no-weights"), {})
    os.remove(os.path.join(miss, "model.safetensors"))
    esc = checkpoint(os.path.join(root, "escaping-weights"), {})
    os.remove(os.path.join(esc, "model.safetensors"))
    os.symlink(os.path.join(out, "single/model.safetensors"), os.path.join(esc, "model.safetensors"))
    s = Server("--reload-root", root)
    try:
        before = state(s)
        answers = set()
        for p in paths:
            st, r = reload(s, p)
            answers.add((st, r["error"]["message"].replace(p, "<PATH>"), r["error"]["type"], r["current_version"]))
        assert len(answers) == 1 and next(iter(answers))[0] == 403, answers
        answers = set()
        for p in (miss, esc):
            st, r = reload(s, p)
            answers.add((st, r["error"]["message"].replace(p, "<PATH>"), r["error"]["type"], r["current_version"]))
        assert len(answers) == 1 and next(iter(answers))[0] == 403, answers
        assert state(s) == before
    finally:
        assert s.stop() == 0


def test_reload_bad_second_shard_changes_nothing(tree):
    """A sharded checkpoint whose second shard is truncated, or holds one
    tensor with another shape: an error, version and every hash unchanged,
    the server keeps serving the old weights; the intact checkpoint then
    reloads."""
    root, new = tree["root"], tree["new"]
    good = checkpoint(os.path.join(root, "sharded-good"), new, shards=2)
    trunc = checkpoint(os.path.join(root, "sharded-trunc"), new, shards=2)
    p = os.path.join(trunc, "model-00002-of-00002.safetensors")
    os.truncate(p, os.path.getsize(p) - 100)
    shape = checkpoint(os.path.join(root, "sharded-shape"), new, shards=2)
    p = os.path.join(shape, "model-00002-of-00002.safetensors")
    t = read_st(p)
    name = "model.layers.1.mlp.down_proj.weight"
    assert name in t
    dt, sh, b = t[name]
    t[name] = (dt, sh[::-1], b)  # same bytes, transposed shape
    write_st(p, t)
    s = Server("--reload-root", root)
    try:
        before = state(s)
        for d in (trunc, shape):
            st, r = reload(s, d, 5)
            assert st == 400 and r["current_version"] == 0, (d, st, r)
            assert state(s) == before, f"a refused reload of {d} changed the weights"
        st, r = reload(s, good, 5)
        assert st == 200 and r["version"] == 5 and r["tensors_updated"] == 3, r
        assert state(s)[1:] != before[1:]
    finally:
        assert s.stop() == 0


def test_reload_with_an_unreplaceable_tensor_is_all_or_nothing(tmp_path):
    """A sampler whose checkpoint stores model.norm.weight as F32 (converted to
    BF16 at load, so it cannot be replaced in place). A checkpoint that
    changes the embedding (replaceable, and applied first by name order) and
    that norm is refused as a whole: 422, the embedding is not half-applied,
    version and hashes unchanged. One that changes only replaceable tensors
    reloads."""
    t = read_st(os.path.join(TINY, "model.safetensors"))

    def f32(b):
        return (np.frombuffer(b, dtype=np.uint16).astype(np.uint32) << 16).tobytes()

    dt, sh, b = t["model.norm.weight"]
    t["model.norm.weight"] = ("F32", sh, f32(b))
    root = tmp_path / "root"
    root.mkdir()
    served = checkpoint(str(tmp_path / "served"), t)
    both = dict(t)
    for name in ("model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight"):
        both[name] = (t[name][0], t[name][1], bump(t[name][2]))
    only = dict(both)
    both["model.norm.weight"] = ("F32", sh, f32(bump(b)))
    both_d = checkpoint(str(root / "both"), both)
    only_d = checkpoint(str(root / "only"), only)
    s = Server("--reload-root", str(root), model=served)
    try:
        before = state(s)
        st, r = reload(s, both_d, 2)
        assert st == 422 and r["current_version"] == 0 and "model.norm.weight" in r["error"]["message"], r
        assert state(s) == before, "a refused reload left some tensors replaced"
        st, r = reload(s, only_d, 2)
        assert st == 200 and r["version"] == 2 and r["tensors_updated"] == 2, r
        assert state(s)[1:] != before[1:]
    finally:
        assert s.stop() == 0


def test_reload_version_above_the_largest_is_400(tree):
    """Versions are at most 2^62 (DELTA_VERSION_MAX), as for deltas."""
    s = Server("--reload-root", tree["root"])
    try:
        before = state(s)
        st, r = reload(s, os.path.join(tree["root"], "good"), DELTA_VERSION_MAX + 1)
        assert st == 400 and r["current_version"] == 0, r
        assert state(s) == before
        st, r = reload(s, os.path.join(tree["root"], "good"), DELTA_VERSION_MAX)
        assert st == 200 and r["version"] == DELTA_VERSION_MAX, r
    finally:
        assert s.stop() == 0
