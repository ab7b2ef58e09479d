#!/usr/bin/env python3
"""Pairs of consecutive checkpoints from real optimizer steps, for the delta
benchmarks (bench/bench_delta.sh): a small Qwen3-shaped model
(transformers Qwen3ForCausalLM, random init), trained with PyTorch AdamW on
synthetic token data at several learning rates, saved with save_pretrained
(safetensors) after every step. The changed fractions measured on these pairs
are those of real training, not assumed.

  python3 scripts/make_delta_pairs.py OUT_DIR [--lrs 1e-7,1e-6,1e-5] [--steps 3]
      [--precision bf16|fp32-master]

bf16: parameters and optimizer state in BF16 (what the issue specifies; steps
below half a BF16 ulp round away); the forward/backward runs in F32 on exact
copies of the BF16 values (CPU BF16 matmuls are very slow) and the gradient is
rounded to BF16 before the BF16 AdamW step. fp32-master: FP32 parameters and optimizer,
BF16 checkpoints saved from them (mixed-precision training; the BF16 copy
changes when the master crosses a rounding boundary).

Layout: OUT_DIR/lr{LR}/step{K}/ (config.json, model.safetensors, ...).
Needs torch + transformers (scripts/requirements.txt); not run in CI.
"""
import argparse
import os
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--lrs", default="1e-7,1e-6,1e-5")
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps after step0 (pairs = steps)")
    ap.add_argument("--warmup", type=int, default=2, help="steps taken before step0 is saved")
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32-master"])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = Qwen3Config(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=3 * a.hidden,
                      num_hidden_layers=a.layers, num_attention_heads=8, num_key_value_heads=4,
                      head_dim=a.hidden // 8, max_position_embeddings=1024, tie_word_embeddings=False,
                      torch_dtype="bfloat16")
    for lr_s in a.lrs.split(","):
        lr = float(lr_s)
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(cfg).float()  # forward/backward in f32: CPU bf16 matmuls are ~20x slower
        params = [p for p in model.parameters()]
        if a.precision == "bf16":
            # The trained state is BF16: AdamW (and its state) on BF16 leaves,
            # fed the f32 gradient rounded to BF16; the f32 model only holds
            # exact copies of those BF16 values for the matmuls.
            state = [p.detach().to(torch.bfloat16).requires_grad_() for p in params]
            with torch.no_grad():
                for p, s in zip(params, state):
                    p.copy_(s.float())
        else:
            state = params
        n_params = sum(p.numel() for p in params)
        opt = torch.optim.AdamW(state, lr=lr, betas=(0.9, 0.999), weight_decay=0.01)
        gen = torch.Generator().manual_seed(1)
        d = os.path.join(a.out, f"lr{lr_s}")
        for k in range(-a.warmup, a.steps + 1):
            if k >= 0:
                sd = {n: t.detach().to(torch.bfloat16) for n, t in model.state_dict().items()}
                path = os.path.join(d, f"step{k}")
                model.save_pretrained(path, state_dict=sd, safe_serialization=True)
                cfg.save_pretrained(path)  # torch_dtype bfloat16
            if k == a.steps:
                break
            t0 = time.time()
            # synthetic data with structure (repeated n-grams) so the loss moves
            base = torch.randint(0, a.vocab, (a.batch, a.seq // 4), generator=gen)
            ids = base.repeat(1, 4)
            out = model(input_ids=ids, labels=ids)
            out.loss.backward()
            if a.precision == "bf16":
                for p, s in zip(params, state):
                    s.grad = p.grad.to(torch.bfloat16)
            opt.step()
            opt.zero_grad(set_to_none=True)
            model.zero_grad(set_to_none=True)
            if a.precision == "bf16":
                with torch.no_grad():
                    for p, s in zip(params, state):
                        p.copy_(s.float())
            print(f"lr {lr_s} step {k + 1}: loss {out.loss.item():.4f} ({time.time() - t0:.1f} s, "
                  f"{n_params / 1e6:.1f}M params, {a.precision})", flush=True)

if __name__ == "__main__":
    main()
