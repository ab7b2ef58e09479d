#!/usr/bin/env python3
"""Random BF16 checkpoint of a real model's shape, for benchmarks.

What it is: a writer of a Hugging Face model directory (config.json, generation_config.json,
model.safetensors or model-0000i-of-0000n.safetensors + model.safetensors.index.json) with the
exact config and tensor names/shapes of Qwen3-0.6B or Qwen3-8B and random weights. It needs only
numpy: the safetensors format is written by hand (8-byte little-endian header length, JSON header
with dtype/shape/data_offsets, then the raw little-endian data), the same layout the
`safetensors` package writes, and it is verified with that package when installed.

What it is not: a model with meaningful outputs. Matrices are ~N(0, 0.02) bf16 values taken at
random offsets from a 16M-entry pool (generating 8B fresh normals would dominate the run time and
buys nothing for a bandwidth benchmark); norm weights are 1. Its output is not committed.

Usage: python3 scripts/make_bench_model.py NAME OUTDIR [--shard-size BYTES] [--layers N]
       [--seed S] [--jobs J] [--no-verify]
NAME: qwen3-0.6b | qwen3-8b | qwen3-30b-a3b (the MoE; per-expert tensor names, as the published
checkpoint). --layers overrides the layer count (quick tests only). --jobs writes
J shards at once (processes; each shard draws its offsets from its own generator seeded (S, shard),
so the bytes do not depend on J). Qwen3-8B (16.4 GB, 9 shards) took 9 s per 3.3 GB on a 2-core VM
with one job; tests/gpu/check.sh writes it on the GPU machine with --jobs 9 into /dev/shm.
"""
import argparse
import json
import os
import shutil
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Qwen3-0.6B and Qwen3-8B config.json, as published by Qwen.
_QWEN3_COMMON = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 40960,
    "model_type": "qwen3",
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
CONFIGS = {
    "qwen3-0.6b": dict(_QWEN3_COMMON, hidden_size=1024, intermediate_size=3072,
                       max_window_layers=28, num_attention_heads=16, num_hidden_layers=28,
                       tie_word_embeddings=True),
    "qwen3-8b": dict(_QWEN3_COMMON, hidden_size=4096, intermediate_size=12288,
                     max_window_layers=36, num_attention_heads=32, num_hidden_layers=36,
                     tie_word_embeddings=False),
    # Qwen3-30B-A3B (a mixture of experts: 128 routed experts, 8 per token); use --layers on small machines
    "qwen3-30b-a3b": dict(_QWEN3_COMMON, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                          hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
                          num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                          max_window_layers=48, num_attention_heads=32, num_key_value_heads=4,
                          num_hidden_layers=48, tie_word_embeddings=False, output_router_logits=False,
                          router_aux_loss_coef=0.001),
}
GENERATION_CONFIG = {
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
    "transformers_version": "4.51.0",
}

POOL_SIZE = 1 << 24
BF16_ONE = 0x3F80


def tensor_specs(c):
    """(name, shape, kind) in the order transformers' state_dict lists them."""
    h, hd, inter = c["hidden_size"], c["head_dim"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    specs = [("model.embed_tokens.weight", (c["vocab_size"], h), "w")]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        specs += [
            (p + "self_attn.q_proj.weight", (q, h), "w"),
            (p + "self_attn.k_proj.weight", (kv, h), "w"),
            (p + "self_attn.v_proj.weight", (kv, h), "w"),
            (p + "self_attn.o_proj.weight", (h, q), "w"),
            (p + "self_attn.q_norm.weight", (hd,), "norm"),
            (p + "self_attn.k_norm.weight", (hd,), "norm"),
        ]
        if c.get("num_experts"):  # every layer a MoE layer (decoder_sparse_step 1, no mlp_only_layers)
            mi = c["moe_intermediate_size"]
            specs.append((p + "mlp.gate.weight", (c["num_experts"], h), "w"))
            for e in range(c["num_experts"]):
                specs += [(p + f"mlp.experts.{e}.gate_proj.weight", (mi, h), "w"),
                          (p + f"mlp.experts.{e}.up_proj.weight", (mi, h), "w"),
                          (p + f"mlp.experts.{e}.down_proj.weight", (h, mi), "w")]
        else:
            specs += [(p + "mlp.gate_proj.weight", (inter, h), "w"),
                      (p + "mlp.up_proj.weight", (inter, h), "w"),
                      (p + "mlp.down_proj.weight", (h, inter), "w")]
        specs += [
            (p + "input_layernorm.weight", (h,), "norm"),
            (p + "post_attention_layernorm.weight", (h,), "norm"),
        ]
    specs.append(("model.norm.weight", (h,), "norm"))
    if not c["tie_word_embeddings"]:
        specs.append(("lm_head.weight", (c["vocab_size"], h), "w"))
    return specs


def f32_to_bf16_bits(x):
    """Round-to-nearest-even float32 -> bfloat16 bit patterns (uint16), as torch casts."""
    b = x.astype(np.float32).view(np.uint32)
    b = b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))
    return (b >> np.uint32(16)).astype("<u2")


def shard_plan(specs, shard_size):
    """Greedy split like transformers: a new shard when the next tensor would overflow."""
    shards, cur, cur_bytes = [], [], 0
    for s in specs:
        n = 2 * int(np.prod(s[1]))
        if cur and cur_bytes + n > shard_size:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append(s)
        cur_bytes += n
    if cur:
        shards.append(cur)
    return shards


def header_bytes(specs):
    hdr = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, shape, _ in specs:
        n = 2 * int(np.prod(shape))
        hdr[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    js = json.dumps(hdr, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)  # data starts 8-byte aligned, as the safetensors package does
    return len(js).to_bytes(8, "little") + js, off


_POOL = None  # the workers' copy of the pool (inherited at fork, or made once per worker)


def _shard_job(job):
    path, specs, seed, index = job
    global _POOL
    if _POOL is None:
        _POOL = make_pool(seed)
    write_shard(path, specs, _POOL, np.random.default_rng([seed, index]))
    return path


def make_pool(seed):
    rng = np.random.default_rng(seed)
    return f32_to_bf16_bits(rng.normal(0.0, 0.02, POOL_SIZE).astype(np.float32))


def write_shard(path, specs, pool, rng):
    hdr, data_len = header_bytes(specs)
    chunk = 1 << 22  # elements per write
    ones = np.full(max(s[1][0] for s in specs), BF16_ONE, dtype="<u2")
    with open(path, "wb") as f:
        f.write(hdr)
        for _, shape, kind in specs:
            n = int(np.prod(shape))
            if kind == "norm":
                f.write(ones[:n].tobytes())
                continue
            done = 0
            while done < n:
                m = min(chunk, n - done)
                start = int(rng.integers(0, POOL_SIZE - m + 1))
                f.write(pool[start:start + m].tobytes())
                done += m
    assert os.path.getsize(path) == len(hdr) + data_len, path


def verify(outdir, files, specs):
    """Load every file with the safetensors package; read tensors through torch if available."""
    try:
        from safetensors import safe_open
    except ImportError:
        print("safetensors package not installed: skipped verification")
        return
    try:
        import torch  # noqa: F401  (numpy has no bfloat16, so full reads need torch)
        framework = "pt"
    except ImportError:
        framework = None
    want = {name: list(shape) for name, shape, _ in specs}
    seen = {}
    for fn in files:
        with safe_open(os.path.join(outdir, fn), framework or "np") as f:
            keys = list(f.keys())
            for k in keys:
                sl = f.get_slice(k)
                assert sl.get_dtype() == "BF16", (fn, k, sl.get_dtype())
                seen[k] = list(sl.get_shape())
            if framework is None:
                continue
            # Read a few tensors fully: first, last, one norm.
            norms = [x for x in keys if x.endswith("norm.weight")][:1]
            for k in [keys[0], keys[-1]] + norms:
                t = f.get_tensor(k).float()
                assert list(t.shape) == seen[k]
                if k.endswith("norm.weight"):
                    assert bool((t == 1).all()), k
                else:
                    assert abs(t.std().item() - 0.02) < 0.002 and abs(t.mean().item()) < 1e-3, k
    assert seen == want, "tensor set or shapes differ from the spec"
    print(f"verified with safetensors ({framework or 'headers only'}): {len(seen)} tensors "
          f"in {len(files)} file(s)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("name", choices=sorted(CONFIGS))
    ap.add_argument("outdir")
    ap.add_argument("--shard-size", type=int, default=2 * 1000 ** 3,
                    help="max bytes of tensor data per shard file (default 2 GB)")
    ap.add_argument("--layers", type=int, help="override num_hidden_layers (quick tests)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1, help="shards written at once (processes)")
    ap.add_argument("--no-verify", action="store_true")
    args = ap.parse_args()

    t0 = time.time()
    c = dict(CONFIGS[args.name])
    if args.layers is not None:
        c["num_hidden_layers"] = args.layers
        c["max_window_layers"] = args.layers
    specs = tensor_specs(c)
    total = sum(2 * int(np.prod(s[1])) for s in specs)
    shards = shard_plan(specs, args.shard_size)
    os.makedirs(args.outdir, exist_ok=True)
    for fn in os.listdir(args.outdir):
        if fn.startswith("model") and (fn.endswith(".safetensors") or fn.endswith(".index.json")):
            os.remove(os.path.join(args.outdir, fn))

    global _POOL
    _POOL = make_pool(args.seed)

    if len(shards) == 1:
        files = ["model.safetensors"]
    else:
        files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    jobs = [(os.path.join(args.outdir, fn), sh, args.seed, i) for i, (fn, sh) in enumerate(zip(files, shards))]
    sizes = {os.path.join(args.outdir, fn): sum(2 * int(np.prod(s[1])) for s in sh) for fn, sh in zip(files, shards)}
    if args.jobs > 1 and len(jobs) > 1:
        import multiprocessing
        with multiprocessing.get_context("fork").Pool(min(args.jobs, len(jobs))) as pool:
            for path in pool.imap_unordered(_shard_job, jobs):
                print(f"wrote {os.path.basename(path)} ({sizes[path] / 1e9:.2f} GB)", flush=True)
    else:
        for job in jobs:
            _shard_job(job)
            print(f"wrote {os.path.basename(job[0])} ({sizes[job[0]] / 1e9:.2f} GB)", flush=True)
    if len(shards) > 1:
        index = {"metadata": {"total_parameters": total // 2, "total_size": total},
                 "weight_map": {s[0]: fn for fn, sh in zip(files, shards) for s in sh}}
        with open(os.path.join(args.outdir, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")
    with open(os.path.join(args.outdir, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
        f.write("\n")
    with open(os.path.join(args.outdir, "generation_config.json"), "w") as f:
        json.dump(GENERATION_CONFIG, f, indent=2)
        f.write("\n")
    tok_dir = os.path.join(REPO, "models", "tiny-qwen3")  # the real Qwen3 tokenizer files
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(tok_dir, fn)):
            shutil.copyfile(os.path.join(tok_dir, fn), os.path.join(args.outdir, fn))
    print(f"{args.name}: {total // 2 / 1e9:.3f} B params, {total / 1e9:.2f} GB in {len(files)} "
          f"file(s), {time.time() - t0:.1f} s -> {args.outdir}")
    if not args.no_verify:
        verify(args.outdir, files, specs)


if __name__ == "__main__":
    sys.exit(main())
