"""Small Hugging Face-style checkpoints for the trainer tests, written with
numpy only (CI has no torch/safetensors): sharded safetensors + index +
config, and a "training step" that changes a sparse subset of the bits."""
import json
import os
import struct

import numpy as np

TRAINER = os.environ.get("TRAINER_BIN", os.path.join(os.environ.get("BUILD_DIR", "build"), "trainer"))

# name -> (safetensors dtype, numpy storage dtype, shape, shard)
TENSORS = {
    "model.embed_tokens.weight": ("BF16", np.uint16, (64, 32), 1),
    "model.layers.0.mlp.down_proj.weight": ("BF16", np.uint16, (32, 96), 1),
    "model.layers.0.input_layernorm.weight": ("F32", np.float32, (32,), 2),
    "model.norm.weight": ("F16", np.float16, (32,), 2),
    "lm_head.weight": ("BF16", np.uint16, (64, 32), 2),
}


def write_safetensors(path, arrays):
    """arrays: name -> (dtype string, numpy array). Layout per the safetensors spec."""
    header, blobs, off = {}, [], 0
    for name in sorted(arrays):
        dt, a = arrays[name]
        b = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def random_weights(seed):
    rng = np.random.default_rng(seed)
    w = {}
    for name, (dt, npdt, shape, _) in TENSORS.items():
        if npdt == np.uint16:  # bf16 bits of N(0, 0.02)
            f = (rng.standard_normal(shape) * 0.02).astype(np.float32)
            w[name] = (f.view(np.uint32) >> 16).astype(np.uint16)
        else:
            w[name] = (1.0 + 0.01 * rng.standard_normal(shape)).astype(npdt)
    return w


def step(w, seed, frac=0.01):
    """A step: ~frac of the BF16 elements get new low bits, the F32 norm is
    rewritten entirely, lm_head is untouched."""
    rng = np.random.default_rng(seed)
    out = {k: v.copy() for k, v in w.items()}
    for name in ("model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight"):
        a = out[name].reshape(-1)
        idx = rng.choice(a.size, max(1, int(a.size * frac)), replace=False)
        a[idx] ^= rng.integers(1, 8, idx.size).astype(np.uint16)
    out["model.layers.0.input_layernorm.weight"] = out["model.layers.0.input_layernorm.weight"] + np.float32(0.001)
    a = out["model.norm.weight"].view(np.uint16).reshape(-1)
    a[-1] ^= 1
    return out


def write_checkpoint(d, w):
    os.makedirs(d, exist_ok=True)
    shards = {1: {}, 2: {}}
    for name, (dt, _, _, s) in TENSORS.items():
        shards[s][name] = (dt, w[name])
    weight_map = {}
    for s, arrays in shards.items():
        fn = f"model-0000{s}-of-00002.safetensors"
        write_safetensors(os.path.join(d, fn), arrays)
        weight_map.update({n: fn for n in arrays})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 32}, f)
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        f.write('{"version": "1.0"}')


def parse_delta(buf):
    """The container per docs/delta-format.md, read independently of the C reader."""
    assert buf[:8] == b"SMPLDELT"
    ver, flags, fp, base, target, n, _, body, _ = struct.unpack_from("<IIQQQIIQQ", buf, 8)
    assert len(buf) == 64 + body + 8
    off, tensors = 64, []
    for _ in range(n):
        (nl,) = struct.unpack_from("<H", buf, off)
        name = buf[off + 2:off + 2 + nl].decode()
        off += 2 + nl
        dt, enc, ndim, _ = buf[off:off + 4]
        off += 4
        shape = struct.unpack_from(f"<{ndim}Q", buf, off)
        off += 8 * ndim
        numel, nch, raw, comp, hafter = struct.unpack_from("<5Q", buf, off)
        off += 40 + comp
        tensors.append(dict(name=name, dtype=dt, encoding=enc, shape=shape, numel=numel, n_changed=nch,
                            raw=raw, comp=comp, hash_after=hafter))
    assert off == len(buf) - 8
    return dict(version=ver, fingerprint=fp, base=base, target=target, tensors=tensors)
