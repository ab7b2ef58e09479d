#!/usr/bin/env python3
"""Tiny random-weight checkpoints and their transformers reference logits.

What it is: the generator of the model-parity golden files. For each fixture it builds a tiny
model with awkward shapes, gives EVERY parameter random values (norm weights and biases too,
so a loader that skips one is caught), casts to bfloat16, writes it with save_pretrained into
tests/fixtures/<name>/, reloads those files with transformers (float32, eager attention) and
records the logits of a few random token sequences:

  seq{i}.tokens          I32 [T]
  seq{i}.prefill_logits  F32 [T, vocab]   one forward over the whole sequence
  seq{i}.decode_logits   F32 [T, vocab]   same tokens fed one at a time through the KV cache

into tests/fixtures/<name>/ref.safetensors. It also writes the bundled default model
models/tiny-qwen3/ (full Qwen3 vocabulary, real tokenizer files, prefill reference only).

What it is not: a test. The C parity test reads these files; CI never runs this script.

config.json style: transformers 5 writes `rope_parameters`, `dtype` and (Qwen3-MoE)
`num_local_experts`; checkpoints on the hub (Qwen3, Llama 3.1, Qwen2) use `rope_theta`,
`rope_scaling`, `torch_dtype` and `num_experts`. Fixtures marked style="hub" get their
config.json rewritten to the hub layout; style="v5" keep what transformers 5 writes. Either
way the reference is computed by reloading the directory exactly as committed, and the
reloaded config is checked against the intended values.

Usage: python3 scripts/make_fixtures.py [--only NAME ...]   (run from the repo root)
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import save_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX_DIR = os.path.join(REPO, "tests", "fixtures")
QWEN3_TOKENIZER_DIR = os.path.join(os.path.dirname(REPO), "shared", "tokenizers", "qwen3")

# Routing decisions must not sit on a knife edge: if the k-th and (k+1)-th router logits are
# closer than this anywhere, an implementation with FP32 rounding differences (~1e-6) could pick
# a different expert and the golden would be unfair. Checked, not assumed.
MIN_ROUTER_GAP = 1e-3

FIXTURES = [
    dict(name="qwen3_gqa2", arch="Qwen3ForCausalLM", style="hub", seed=101,
         seq_lens=[7, 16, 33],
         cfg=dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, intermediate_size=88,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=4096,
                  tie_word_embeddings=True, attention_bias=False)),
    dict(name="qwen3_mha_sharded", arch="Qwen3ForCausalLM", style="v5", seed=102,
         seq_lens=[7, 16, 33], max_shard_size="100KB",
         cfg=dict(vocab_size=512, hidden_size=72, num_hidden_layers=3, num_attention_heads=3,
                  num_key_value_heads=3, head_dim=24, intermediate_size=136,
                  rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=2048,
                  tie_word_embeddings=False, attention_bias=False)),
    dict(name="qwen3_moe", arch="Qwen3MoeForCausalLM", style="hub", seed=103,
         seq_lens=[7, 16, 33],
         cfg=dict(vocab_size=512, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=1, head_dim=16, intermediate_size=96,
                  moe_intermediate_size=40, num_experts=8, num_experts_per_tok=2,
                  norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[0],
                  rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=4096,
                  tie_word_embeddings=False, attention_bias=False)),
    dict(name="qwen3_moe_nonorm", arch="Qwen3MoeForCausalLM", style="v5", seed=104,
         seq_lens=[7, 16, 33],
         cfg=dict(vocab_size=512, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=24, intermediate_size=80,
                  moe_intermediate_size=56, num_experts=8, num_experts_per_tok=2,
                  norm_topk_prob=False, decoder_sparse_step=2, mlp_only_layers=[],
                  rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=4096,
                  tie_word_embeddings=True, attention_bias=False)),
    # every linear width a multiple of 32, so NVFP4 quantizes every matrix and the GPU runs the
    # NVFP4 experts grouped (moe_gemm.cu); emu_check / gpu_check run it at nvfp4 against the CPU
    dict(name="qwen3_moe_fp4", arch="Qwen3MoeForCausalLM", style="hub", seed=112,
         seq_lens=[7, 16, 33],
         cfg=dict(vocab_size=512, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, intermediate_size=96,
                  moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                  norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[0],
                  rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=4096,
                  tie_word_embeddings=False, attention_bias=False)),
    # head_dim = 96/8 = 12 (no head_dim key, like Llama 3.1). With theta 5e5 the wavelengths
    # 2*pi*theta^(2i/12) are 6.3, 56, 499, ... : with original_max_position_embeddings 64
    # (high-freq wavelength 64/4 = 16, low-freq wavelength 64/1 = 64) the first pair is kept,
    # the second smoothly interpolated and the rest divided by 8, so all three llama3 branches
    # are exercised. The last sequence runs past position 64.
    dict(name="llama31", arch="LlamaForCausalLM", style="hub", seed=105,
         seq_lens=[7, 16, 70],
         cfg=dict(vocab_size=512, hidden_size=96, num_hidden_layers=2, num_attention_heads=8,
                  num_key_value_heads=1, intermediate_size=160,
                  rope_theta=500000.0,
                  rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                    high_freq_factor=4.0, original_max_position_embeddings=64),
                  rms_norm_eps=1e-5, max_position_embeddings=1024,
                  tie_word_embeddings=False, attention_bias=False, mlp_bias=False)),
    # The attention shapes of the production models, at a tiny width: head_dim 128 with 8 query
    # heads per KV head (Qwen3-30B-A3B), where the GPU decodes on the tensor
    # cores (attention_dec_mma.cu), and head_dim 64 with 4 per KV head, where it runs the vector
    # kernel; BF16/FP8 KV prefill of 16+ tokens takes attention_mma.cu at both. The last sequence
    # spans two of its 64-position tiles. The other fixtures' head_dim (12-32) reaches none of those
    # kernels. The 16 x 128 query width makes qwen3_g8_hd128 larger than the 1 MB rule.
    dict(name="qwen3_g8_hd128", arch="Qwen3ForCausalLM", style="hub", seed=113,
         seq_lens=[7, 16, 70], max_bytes=1_200_000,
         cfg=dict(vocab_size=512, hidden_size=32, num_hidden_layers=2, num_attention_heads=16,
                  num_key_value_heads=2, head_dim=128, intermediate_size=64,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=4096,
                  tie_word_embeddings=True, attention_bias=False)),
    dict(name="qwen3_hd64_g4", arch="Qwen3ForCausalLM", style="v5", seed=114,
         seq_lens=[7, 16, 70],
         cfg=dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=8,
                  num_key_value_heads=2, head_dim=64, intermediate_size=96,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=4096,
                  tie_word_embeddings=False, attention_bias=False)),
    dict(name="qwen2", arch="Qwen2ForCausalLM", style="hub", seed=106,
         seq_lens=[7, 16, 33],
         cfg=dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=120,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=4096,
                  tie_word_embeddings=True, use_sliding_window=False)),
]

# Long contexts (make_long_fixture): the same tiny Qwen3 shape at 8k and 32k tokens, where RoPE
# angles reach 3e4 radians (an f32 angle keeps ~12 bits of fraction there, so the angle's
# rounding rule matters) and attention sums over tens of thousands of positions. Logits are
# recorded at LONG_ROWS evenly spaced positions plus the last LONG_DECODE, not at every position
# (32k x 512 f32 would be 64 MB).
LONG_ROWS = 32
LONG_DECODE = 4
LONG_CHUNK = 2048
QWEN3_LONG = dict(name="qwen3_long", arch="Qwen3ForCausalLM", style="hub", seed=108,
                  seq_lens=[8192, 32768],
                  cfg=dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=16, intermediate_size=96,
                           rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=40960,
                           tie_word_embeddings=True, attention_bias=False))

TINY_QWEN3 = dict(name="tiny-qwen3", arch="Qwen3ForCausalLM", style="hub", seed=107,
                  cfg=dict(vocab_size=151936, hidden_size=48, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                           intermediate_size=128, rope_theta=1000000.0, rms_norm_eps=1e-6,
                           max_position_embeddings=40960, tie_word_embeddings=True,
                           attention_bias=False, bos_token_id=151643, eos_token_id=151645))

# Qwen3-0.6B's generation_config.json.
QWEN3_GENERATION_CONFIG = {
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
}


def build_config(arch, cfg):
    """A transformers config object from the fixture's hub-style keys."""
    cfg = dict(cfg)
    rope = {"rope_type": "default", "rope_theta": cfg.pop("rope_theta")}
    if "rope_scaling" in cfg:
        rope.update(cfg.pop("rope_scaling"))
    cfg["rope_parameters"] = rope
    if "num_experts" in cfg:
        cfg["num_local_experts"] = cfg.pop("num_experts")
    cls = {"Qwen3ForCausalLM": transformers.Qwen3Config,
           "Qwen3MoeForCausalLM": transformers.Qwen3MoeConfig,
           "LlamaForCausalLM": transformers.LlamaConfig,
           "Qwen2ForCausalLM": transformers.Qwen2Config}[arch]
    c = cls(**cfg)
    c.architectures = [arch]
    return c


def init_params(model, gen, tied):
    """Random values for every parameter, scaled so the logits spread (std ~1-4).

    Linear weights N(0, 1/fan_in) keep activations O(1); norm weights 1 + 0.1 N(0,1) and biases
    0.2 N(0,1) are random so a loader that ignores them fails the test. The embedding is unit
    scale when untied (its rows enter through an RMSNorm anyway), and 2/sqrt(hidden) when tied so
    that lm_head = embedding gives logits of std ~2; an untied lm_head gets 2/sqrt(hidden).
    """
    hidden = model.config.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                v = 1.0 + 0.1 * r
            elif name.endswith(".bias"):
                v = 0.2 * r
            elif "embed_tokens" in name:
                v = r * (2.0 / hidden ** 0.5 if tied else 1.0)
            elif "lm_head" in name:
                v = r * (2.0 / hidden ** 0.5)
            else:
                # [out, in], or [experts, out, in] for transformers 5's fused expert tensors
                # (save_pretrained splits them back into per-expert hub tensors).
                assert p.dim() in (2, 3), name
                v = r / p.shape[-1] ** 0.5
            p.copy_(v)


def hub_style_config(d, cfg):
    """Rewrite a transformers-5 config dict in the layout of hub checkpoints.

    head_dim is dropped unless the fixture sets it: Llama 3.1 and Qwen2 configs leave it out and
    readers must default it to hidden_size / num_attention_heads.
    """
    d = dict(d)
    if "head_dim" not in cfg:
        d.pop("head_dim", None)
    rope = dict(d.pop("rope_parameters"))
    d["rope_theta"] = rope.pop("rope_theta")
    if rope.get("rope_type", "default") != "default":
        d["rope_scaling"] = rope
    if "num_local_experts" in d:
        d["num_experts"] = d.pop("num_local_experts")
    if "dtype" in d:
        d["torch_dtype"] = d.pop("dtype")
    d.pop("layer_types", None)
    return dict(sorted(d.items()))


def check_reloaded_config(c, fx):
    """The reloaded config must mean what the fixture says (catches silently dropped keys)."""
    want = fx["cfg"]
    for k, v in want.items():
        if k == "rope_theta":
            got = c.rope_parameters["rope_theta"]
        elif k == "rope_scaling":
            got = {kk: c.rope_parameters[kk] for kk in v}
        elif k == "num_experts":
            got = c.num_local_experts
        else:
            got = getattr(c, k)
        assert got == v, f"{fx['name']}: reloaded {k}={got!r}, want {v!r}"
    if "rope_scaling" not in want:
        assert c.rope_parameters.get("rope_type", "default") == "default"


def check_llama3_rope(model):
    """The llama3 scaling must really change frequencies: some kept, some / factor, some between."""
    c = model.config
    rp = c.rope_parameters
    d = c.hidden_size // c.num_attention_heads
    base = 1.0 / (rp["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ratio = (base / model.model.rotary_emb.inv_freq.double()).tolist()
    kept = sum(abs(r - 1) < 1e-6 for r in ratio)
    divided = sum(abs(r - rp["factor"]) < 1e-4 for r in ratio)
    between = len(ratio) - kept - divided
    assert kept and divided and between, f"llama3 rope ratios {ratio}"
    return ratio


def router_min_gap(model, ids):
    """Smallest gap between the k-th and (k+1)-th router logits over all MoE layers/tokens."""
    k = model.config.num_experts_per_tok
    gaps = []
    hooks = []

    def hook(mod, args):
        x = args[0].reshape(-1, args[0].shape[-1]).float()
        logits = x @ mod.gate.weight.float().t()
        top = torch.topk(logits, k + 1, dim=-1).values
        gaps.append((top[:, k - 1] - top[:, k]).min().item())

    for layer in model.model.layers:
        if hasattr(layer.mlp, "gate") and hasattr(layer.mlp, "experts"):
            hooks.append(layer.mlp.register_forward_pre_hook(hook))
    with torch.no_grad():
        model(input_ids=ids)
    for h in hooks:
        h.remove()
    return min(gaps) if gaps else None


def save_model(fx, out_dir, generation_config):
    gen = torch.Generator().manual_seed(fx["seed"])
    config = build_config(fx["arch"], fx["cfg"])
    model = getattr(transformers, fx["arch"])(config)
    init_params(model, gen, config.tie_word_embeddings)
    model = model.to(torch.bfloat16)
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    kw = {}
    if "max_shard_size" in fx:
        kw["max_shard_size"] = fx["max_shard_size"]
    model.save_pretrained(out_dir, **kw)
    if fx["style"] == "hub":
        path = os.path.join(out_dir, "config.json")
        with open(path) as f:
            d = json.load(f)
        with open(path, "w") as f:
            json.dump(hub_style_config(d, fx["cfg"]), f, indent=2)
            f.write("\n")
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(generation_config, f, indent=2)
        f.write("\n")
    return gen


def load_reference_model(out_dir, fx):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        out_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    check_reloaded_config(model.config, fx)
    # The float32 model must hold exactly the saved BF16 values.
    for name, p in model.named_parameters():
        assert torch.equal(p, p.bfloat16().float()), name
    return model


def prefill(model, ids):
    with torch.no_grad():
        return model(input_ids=ids[None, :], use_cache=False).logits[0].float()


def decode(model, ids):
    cache = transformers.DynamicCache(config=model.config)
    rows = []
    with torch.no_grad():
        for t in range(ids.shape[0]):
            # transformers 5.2x renamed past_key_values to cache; the cache fills in place.
            out = model(input_ids=ids[None, t:t + 1], cache=cache, use_cache=True)
            rows.append(out.logits[0, -1].float())
    assert cache.get_seq_length() == ids.shape[0]
    return torch.stack(rows)


def save_ref(ref, path):
    # No __metadata__: safetensors writes its keys in hash order, which would make reruns differ
    # byte-wise. The versions live in tests/fixtures/VERSIONS.json.
    save_file(ref, path)


def dir_bytes(d):
    return {f: os.path.getsize(os.path.join(d, f)) for f in sorted(os.listdir(d))}


def make_fixture(fx):
    out_dir = os.path.join(FIX_DIR, fx["name"])
    fx["cfg"].setdefault("bos_token_id", 1)
    fx["cfg"].setdefault("eos_token_id", 2)
    gen = save_model(fx, out_dir, {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0})
    model = load_reference_model(out_dir, fx)
    vocab = model.config.vocab_size
    if "rope_scaling" in fx["cfg"]:
        ratio = check_llama3_rope(model)
        print(f"{fx['name']}: base/scaled inv_freq per pair {[round(r, 4) for r in ratio]}")
    ref = {}
    worst = 0.0
    stds = []
    gaps = []
    for i, T in enumerate(fx["seq_lens"]):
        ids = torch.randint(0, vocab, (T,), generator=gen, dtype=torch.int64)
        p = prefill(model, ids)
        d = decode(model, ids)
        worst = max(worst, (p - d).abs().max().item())
        stds.append(p.std().item())
        if fx["arch"] == "Qwen3MoeForCausalLM":
            gaps.append(router_min_gap(model, ids[None, :]))
        ref[f"seq{i}.tokens"] = ids.to(torch.int32).contiguous()
        ref[f"seq{i}.prefill_logits"] = p.contiguous()
        ref[f"seq{i}.decode_logits"] = d.contiguous()
    save_ref(ref, os.path.join(out_dir, "ref.safetensors"))
    sizes = dir_bytes(out_dir)
    total = sum(sizes.values())
    assert total < fx.get("max_bytes", 1_000_000), f"{fx['name']} is {total} bytes"
    std_lo, std_hi = min(stds), max(stds)
    assert 1.0 <= std_lo and std_hi <= 4.0, f"{fx['name']}: logit std {stds}"
    if gaps:
        assert min(gaps) > MIN_ROUTER_GAP, f"{fx['name']}: router gap {min(gaps)}"
    info = {"max_abs_prefill_minus_decode": worst, "logit_std": stds,
            "router_min_gap": min(gaps) if gaps else None, "bytes": sizes, "total_bytes": total}
    print(f"{fx['name']}: max|prefill-decode| {worst:.3e}  logit std {std_lo:.2f}..{std_hi:.2f}"
          + (f"  router min top-k gap {min(gaps):.3e}" if gaps else "")
          + f"  total {total} B  {sizes}")
    return info


def long_positions(T):
    """The recorded positions of a T-token sequence: the last of each of LONG_ROWS equal spans,
    and the last LONG_DECODE positions (the test decodes those one token at a time)."""
    step = T // LONG_ROWS
    pos = {step * (k + 1) - 1 for k in range(LONG_ROWS)} | set(range(T - LONG_DECODE, T))
    return sorted(pos)


def make_long_fixture(fx):
    """seq{i}.tokens I32 [T], seq{i}.positions I32 [P], seq{i}.logits F32 [P, vocab]: transformers
    (float32, eager attention) prefilling the sequence in LONG_CHUNK-token chunks through its
    DynamicCache (eager attention over the whole sequence at once would need T^2 floats per head),
    the last LONG_DECODE tokens fed one at a time. The chunked rows are checked against a
    one-token-at-a-time run of the same positions, as make_fixture checks prefill against decode."""
    out_dir = os.path.join(FIX_DIR, fx["name"])
    fx["cfg"].setdefault("bos_token_id", 1)
    fx["cfg"].setdefault("eos_token_id", 2)
    gen = save_model(fx, out_dir, {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0})
    model = load_reference_model(out_dir, fx)
    vocab = model.config.vocab_size
    ref = {}
    stds = []
    worst = 0.0
    for i, T in enumerate(fx["seq_lens"]):
        ids = torch.randint(0, vocab, (T,), generator=gen, dtype=torch.int64)
        pos = long_positions(T)
        want = set(pos)
        rows = {}
        cache = transformers.DynamicCache(config=model.config)
        with torch.no_grad():
            t = 0
            while t < T - LONG_DECODE:
                n = min(LONG_CHUNK, T - LONG_DECODE - t)
                out = model(input_ids=ids[None, t:t + n], cache=cache, use_cache=True).logits[0].float()
                for j in range(n):
                    if t + j in want:
                        rows[t + j] = out[j].clone()
                t += n
            # the tail once as a chunk (a cache copy), then one token at a time: the same rows
            tail = transformers.DynamicCache(config=model.config)
            for layer in range(model.config.num_hidden_layers):
                k, v = cache.layers[layer].keys, cache.layers[layer].values
                tail.update(k.clone(), v.clone(), layer)
            chunk = model(input_ids=ids[None, T - LONG_DECODE:], cache=tail, use_cache=True).logits[0].float()
            for j in range(LONG_DECODE):
                p = T - LONG_DECODE + j
                out = model(input_ids=ids[None, p:p + 1], cache=cache, use_cache=True).logits[0, -1].float()
                rows[p] = out
                worst = max(worst, (out - chunk[j]).abs().max().item())
        assert cache.get_seq_length() == T
        logits = torch.stack([rows[p] for p in pos])
        stds.append(logits.std().item())
        ref[f"seq{i}.tokens"] = ids.to(torch.int32).contiguous()
        ref[f"seq{i}.positions"] = torch.tensor(pos, dtype=torch.int32)
        ref[f"seq{i}.logits"] = logits.contiguous()
    save_ref(ref, os.path.join(out_dir, "ref.safetensors"))
    sizes = dir_bytes(out_dir)
    total = sum(sizes.values())
    assert total < 1_000_000, f"{fx['name']} is {total} bytes"
    assert all(1.0 <= s <= 4.0 for s in stds), stds
    print(f"{fx['name']}: max|chunk-decode| {worst:.3e}  logit std {min(stds):.2f}..{max(stds):.2f}"
          f"  total {total} B  {sizes}")
    return {"max_abs_chunk_minus_decode": worst, "logit_std": stds, "bytes": sizes, "total_bytes": total}


def make_tiny_qwen3():
    fx = TINY_QWEN3
    out_dir = os.path.join(REPO, "models", fx["name"])
    gen = save_model(fx, out_dir, QWEN3_GENERATION_CONFIG)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(QWEN3_TOKENIZER_DIR, f), os.path.join(out_dir, f))
    model = load_reference_model(out_dir, fx)
    vocab = model.config.vocab_size
    assert model.model.embed_tokens.weight.shape[0] == 151936
    # seq0: ids the real tokenizer gives for a chat-formatted text; seq1: random ids over the
    # whole vocabulary (ids above 65535 catch 16-bit truncation).
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
    seq0 = tok.encode("<|im_start|>user\nHi!<|im_end|>", add_special_tokens=False).ids
    seq1 = torch.randint(0, vocab, (5,), generator=gen, dtype=torch.int64)
    seq1[0] = vocab - 1
    ref = {}
    stds = []
    for i, ids in enumerate([torch.tensor(seq0, dtype=torch.int64), seq1]):
        p = prefill(model, ids)
        stds.append(p.std().item())
        ref[f"seq{i}.tokens"] = ids.to(torch.int32).contiguous()
        ref[f"seq{i}.prefill_logits"] = p.contiguous()
    save_ref(ref, os.path.join(out_dir, "ref.safetensors"))
    sizes = dir_bytes(out_dir)
    total = sum(sizes.values())
    assert total < 35_000_000, total
    assert all(1.0 <= s <= 4.0 for s in stds), stds
    print(f"{fx['name']}: seq0 {seq0} seq1 {seq1.tolist()} logit std "
          f"{min(stds):.2f}..{max(stds):.2f} total {total} B {sizes}")
    return {"logit_std": stds, "bytes": sizes, "total_bytes": total}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", help="fixture names (tiny-qwen3 for the bundled model)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # fixed summation order: reruns reproduce the same bytes
    names = [f["name"] for f in FIXTURES] + [QWEN3_LONG["name"], "tiny-qwen3"]
    todo = args.only or names
    for n in todo:
        if n not in names:
            sys.exit(f"unknown fixture {n}; known: {', '.join(names)}")
    os.makedirs(FIX_DIR, exist_ok=True)
    for fx in FIXTURES:
        if fx["name"] in todo:
            make_fixture(fx)
    if QWEN3_LONG["name"] in todo:
        make_long_fixture(QWEN3_LONG)
    if "tiny-qwen3" in todo:
        make_tiny_qwen3()
    import safetensors
    versions = {"python": sys.version.split()[0], "torch": torch.__version__,
                "transformers": transformers.__version__, "safetensors": safetensors.__version__,
                "numpy": np.__version__}
    with open(os.path.join(FIX_DIR, "VERSIONS.json"), "w") as f:
        json.dump(versions, f, indent=2)
        f.write("\n")
    print("versions:", versions)


if __name__ == "__main__":
    main()
