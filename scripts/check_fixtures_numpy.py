#!/usr/bin/env python3
"""Cross-check of the committed fixture references against a from-scratch float64 forward pass.

What it is: a second, independent reading of each fixture directory (safetensors parsed by hand,
both config.json styles) and a plain numpy float64 implementation of the four architectures
(RMSNorm, QK-norm, q/k/v bias, RoPE with llama3 scaling, GQA causal attention, SwiGLU, top-k MoE
with/without norm_topk_prob, tied/untied lm_head). It prints, per fixture and sequence, the max
absolute difference between the float64 logits and the transformers float32 prefill/decode logits
in ref.safetensors. That difference is the float32 rounding of transformers itself, i.e. the
scale a correct float32 implementation should also reach.

What it is not: the reference. transformers is; this only guards against a golden that does not
mean what the formulas say (a transformers regression, a dropped config key). numpy + json only.

Usage: python3 scripts/check_fixtures_numpy.py [DIR ...]   (default: every tests/fixtures/* and
models/tiny-qwen3)
"""
import glob
import json
import math
import os
import struct
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_safetensors(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    hdr = json.loads(buf[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in hdr.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        raw = buf[base + a:base + b]
        if e["dtype"] == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype={"F32": "<f4", "I32": "<i4", "F16": "<f2"}[e["dtype"]])
        out[name] = arr.reshape(e["shape"]).astype(np.float64 if arr.dtype.kind == "f" else arr.dtype)
    return out


def read_weights(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    w = {}
    for fn in files:
        w.update(read_safetensors(os.path.join(d, fn)))
    return w


def read_config(d):
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    rope = dict(c.get("rope_parameters") or {})
    if "rope_theta" in c:
        rope["rope_theta"] = c["rope_theta"]
    if c.get("rope_scaling"):
        rope.update(c["rope_scaling"])
    rope.setdefault("rope_type", rope.get("type", "default"))
    c["rope"] = rope
    c["n_experts"] = c.get("num_experts", c.get("num_local_experts", 0))
    c.setdefault("head_dim", c["hidden_size"] // c["num_attention_heads"])
    return c


def inv_freq(c):
    r, d = c["rope"], c["head_dim"]
    inv = 1.0 / r["rope_theta"] ** (np.arange(0, d, 2, dtype=np.float64) / d)
    if r["rope_type"] == "llama3":
        old = r["original_max_position_embeddings"]
        lo_wl, hi_wl = old / r["low_freq_factor"], old / r["high_freq_factor"]
        wl = 2 * math.pi / inv
        smooth = (old / wl - r["low_freq_factor"]) / (r["high_freq_factor"] - r["low_freq_factor"])
        scaled = np.where(wl > lo_wl, inv / r["factor"], inv)
        mid = (wl >= hi_wl) & (wl <= lo_wl)
        inv = np.where(mid, (1 - smooth) * inv / r["factor"] + smooth * inv, scaled)
    else:
        assert r["rope_type"] == "default", r
    return inv


def rmsnorm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope(x, pos, inv):  # x [T, heads, d]; pairs (i, i + d/2) as transformers' rotate_half
    ang = pos[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)


def silu(x):
    return x / (1 + np.exp(-x))


def mlp(h, w, p):
    return (silu(h @ w[p + "gate_proj.weight"].T) * (h @ w[p + "up_proj.weight"].T)) @ \
        w[p + "down_proj.weight"].T


def moe(h, w, p, c):
    logits = h @ w[p + "gate.weight"].T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    k = c["num_experts_per_tok"]
    top = np.argsort(-probs, -1, kind="stable")[:, :k]
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        wt = probs[t, top[t]]
        if c["norm_topk_prob"]:
            wt = wt / wt.sum()
        for e, g in zip(top[t], wt):
            out[t] += g * mlp(h[t:t + 1], w, f"{p}experts.{e}.")[0]
    return out


Q_CHUNK = 1024


def forward(c, w, tokens, rows=None):
    """float64 logits [T, vocab], or [len(rows), vocab] for the positions rows only."""
    T, nh, nkv, hd = len(tokens), c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    eps, arch = c["rms_norm_eps"], c["architectures"][0]
    inv, pos = inv_freq(c), np.arange(T, dtype=np.float64)
    x = w["model.embed_tokens.weight"][tokens]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rmsnorm(x, w[p + "input_layernorm.weight"], eps)
        qkv = []
        for n, heads in (("q", nh), ("k", nkv), ("v", nkv)):
            y = h @ w[f"{p}self_attn.{n}_proj.weight"].T
            if f"{p}self_attn.{n}_proj.bias" in w:
                y = y + w[f"{p}self_attn.{n}_proj.bias"]
            qkv.append(y.reshape(T, heads, hd))
        q, k, v = qkv
        if arch.startswith("Qwen3"):
            q = rmsnorm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rmsnorm(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = rope(q, pos, inv), rope(k, pos, inv)
        att = np.empty((T, nh, hd))
        for hh in range(nh):
            kh = hh // (nh // nkv)
            for q0 in range(0, T, Q_CHUNK):  # query rows in chunks: T x T scores would not fit at 32k
                q1 = min(T, q0 + Q_CHUNK)
                s = q[q0:q1, hh] @ k[:q1, kh].T / math.sqrt(hd) + np.triu(np.full((q1 - q0, q1), -np.inf), q0 + 1)
                s = np.exp(s - s.max(-1, keepdims=True))
                att[q0:q1, hh] = (s / s.sum(-1, keepdims=True)) @ v[:q1, kh]
        x = x + att.reshape(T, nh * hd) @ w[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        sparse = (c["n_experts"] > 0 and i not in c.get("mlp_only_layers", [])
                  and (i + 1) % c.get("decoder_sparse_step", 1) == 0)
        x = x + (moe(h, w, p + "mlp.", c) if sparse else mlp(h, w, p + "mlp."))
    if rows is not None:
        x = x[rows]
    x = rmsnorm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if c.get("tie_word_embeddings") else w["lm_head.weight"]
    return x @ head.T


def check(d):
    c, w, ref = read_config(d), read_weights(d), read_safetensors(os.path.join(d, "ref.safetensors"))
    worst = 0.0
    i = 0
    while f"seq{i}.tokens" in ref:
        tokens = ref[f"seq{i}.tokens"].astype(np.int64)
        rows = ref[f"seq{i}.positions"].astype(np.int64) if f"seq{i}.positions" in ref else None
        logits = forward(c, w, tokens, rows)
        line = f"{os.path.relpath(d, REPO)} seq{i} T={len(tokens)}:"
        for kind in ("prefill", "decode", "long"):  # long: the positions of a long-context fixture
            key = f"seq{i}.logits" if kind == "long" else f"seq{i}.{kind}_logits"
            if key in ref:
                err = np.abs(logits - ref[key]).max()
                worst = max(worst, err)
                line += f" max|f64 - hf_{kind}| {err:.2e}"
        print(line)
        i += 1
    return worst


def main():
    dirs = sys.argv[1:] or sorted(glob.glob(os.path.join(REPO, "tests", "fixtures", "*", ""))) + \
        [os.path.join(REPO, "models", "tiny-qwen3")]
    worst = max(check(os.path.normpath(d)) for d in dirs)
    print(f"worst {worst:.2e}")
    if worst > 1e-3:
        sys.exit("fixture references disagree with the float64 forward pass")


if __name__ == "__main__":
    main()
