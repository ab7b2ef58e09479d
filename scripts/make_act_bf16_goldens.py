#!/usr/bin/env python3
"""Reference logits for --dtype bfloat16 (BF16 matmul activations): transformers with every
linear's input rounded to bfloat16.

What it is: the generator of tests/fixtures/<name>/ref_act_bf16.safetensors, the golden files test_forward.c compares the sampler's BF16-activation forward
pass against. For each committed fixture it reloads the directory exactly as make_fixtures.py does
(transformers, float32, eager attention), reads the token sequences of its ref.safetensors, and runs
them again under a TorchFunctionMode that rounds the first argument of every
torch.nn.functional.linear to bfloat16 and back to float32 before the product (q/k/v/o, the MLP, the
MoE router and experts, lm_head: every matmul with a weight). Everything else (norms, RoPE,
attention, softmax, the residual stream) stays float32, which is what the sampler's
`--dtype bfloat16` computes; the products of two bf16 values are exact in f32, so the only
differences left against the sampler are the summation order and torch's rounding of subnormals
(it keeps them, the sampler flushes them: none occur in these models). Files:

  seq{i}.tokens          I32 [T]         (copied from ref.safetensors)
  seq{i}.prefill_logits  F32 [T, vocab]
  seq{i}.decode_logits   F32 [T, vocab]  (fixtures whose ref.safetensors has decode logits)

What it is not: a test (test_forward.c is), nor a bf16 transformers run (torch_dtype=bfloat16
rounds every intermediate, which the sampler does not).

Usage: python3 scripts/make_act_bf16_goldens.py [NAME ...]   (run from the repo root, after
make_fixtures.py; NAME: only those fixtures, default every one)
"""
import os
import sys

import torch
import transformers
from safetensors import safe_open
from torch.overrides import TorchFunctionMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402

F = torch.nn.functional


class RoundLinearInputs(TorchFunctionMode):
    """F.linear(x, w, b) -> F.linear(bf16(x), w, b): the weights are bf16 values already."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            args = (args[0].to(torch.bfloat16).to(torch.float32),) + tuple(args[1:])
        return func(*args, **kwargs)


def make(out_dir, fx):
    model = mf.load_reference_model(out_dir, fx)
    src = safe_open(os.path.join(out_dir, "ref.safetensors"), "pt")
    keys = set(src.keys())
    ref = {}
    worst = 0.0
    i = 0
    while f"seq{i}.tokens" in keys:
        ids = src.get_tensor(f"seq{i}.tokens").to(torch.int64)
        with RoundLinearInputs():
            p = mf.prefill(model, ids)
            d = mf.decode(model, ids) if f"seq{i}.decode_logits" in keys else None
        f32 = src.get_tensor(f"seq{i}.prefill_logits")
        worst = max(worst, (p - f32).abs().max().item())
        ref[f"seq{i}.tokens"] = ids.to(torch.int32).contiguous()
        ref[f"seq{i}.prefill_logits"] = p.contiguous()
        if d is not None:
            ref[f"seq{i}.decode_logits"] = d.contiguous()
        i += 1
    assert i > 0, out_dir
    mf.save_ref(ref, os.path.join(out_dir, "ref_act_bf16.safetensors"))
    print(f"{out_dir}: {i} sequences, max |bf16-activation - f32 logits| {worst:.3e}")


def main():
    torch.set_num_threads(1)  # fixed summation order: reruns reproduce the same bytes
    names = [fx["name"] for fx in mf.FIXTURES]
    for n in sys.argv[1:]:
        if n not in names:
            sys.exit(f"unknown fixture {n}; known: {', '.join(names)}")
    for fx in mf.FIXTURES:
        if not sys.argv[1:] or fx["name"] in sys.argv[1:]:
            make(os.path.join(mf.FIX_DIR, fx["name"]), fx)
    # models/tiny-qwen3 gets none: its full-vocabulary logits would add 6.7 MB; test_forward runs it
    # against its f32 reference with the BF16-class bounds instead.
    print("versions:", {"torch": torch.__version__, "transformers": transformers.__version__})


if __name__ == "__main__":
    main()
