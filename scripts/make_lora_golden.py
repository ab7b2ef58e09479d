#!/usr/bin/env python3
"""Random PEFT LoRA adapters for the bundled fixture models and their transformers + peft logits.

What it is: the generator of the LoRA golden files. For each (fixture, adapter) below it loads
the fixture checkpoint tests/fixtures/<fixture>/ with transformers (float32, eager attention),
wraps it with peft (LoraConfig: r, lora_alpha, target_modules, use_rslora, lora_dropout 0),
gives every lora_A / lora_B random values that are exact in bfloat16 (so the BF16 file and the
float32 reference hold the same numbers), saves the adapter with save_pretrained (BF16) into
tests/fixtures/lora/<fixture>-<adapter>/ (adapter_config.json + adapter_model.safetensors,
exactly what peft writes), reloads that directory with PeftModel.from_pretrained and records
the logits of every position of a few random token sequences:

  <adapter>.seq{i}.tokens   I32 [T]
  <adapter>.seq{i}.logits   F32 [T, vocab]   base + adapter, one forward over the sequence

into tests/fixtures/lora/<fixture>.ref.safetensors. The base model's own logits are the
fixture's ref.safetensors (scripts/make_fixtures.py). The adapters are sized so that they move
the logits far more than the test's tolerance (printed: max |logit(adapter) - logit(base)|).

Tolerance (tests/test_lora.c): both sides accumulate in f32 from identical values; measured
max |dlogit| is ~1e-5, the test allows 1e-4 and KL 1e-9, as test_forward.c does for the base.

What it is not: a test; CI never runs it (torch, transformers and peft are not installed there).
Made with torch 2.15.0 (CPU), transformers 5.24.0, peft 0.21.2.

Usage: python3 scripts/make_lora_golden.py   (run from the repo root)
"""
import json
import os

import torch
import transformers
import peft
from safetensors.torch import save_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(REPO, "tests", "fixtures")
OUT = os.path.join(FIX, "lora")

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# (fixture, adapter name, LoraConfig arguments, seed)
ADAPTERS = [
    ("qwen3_gqa2", "a1", dict(r=8, lora_alpha=16, target_modules=ALL), 1),
    ("qwen3_gqa2", "a2", dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], use_rslora=True), 2),
    ("llama31", "a1", dict(r=8, lora_alpha=32, target_modules=ALL), 3),
    ("llama31", "a2", dict(r=2, lora_alpha=4, target_modules=["k_proj", "o_proj", "up_proj"]), 4),
]
SEQ_LENS = [9, 21]


def base_model(fixture):
    m = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.join(FIX, fixture), dtype=torch.float32, attn_implementation="eager")
    m.eval()
    return m


def randomize(model, gen):
    """Random, BF16-exact lora_A / lora_B (B is zero after peft's default init: no effect)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name:
                v = torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5
            elif "lora_B" in name:
                v = torch.randn(p.shape, generator=gen) * 0.5 / p.shape[1] ** 0.5
            else:
                continue
            p.copy_(v.bfloat16().float())


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids[None, :], use_cache=False).logits[0].float()


# Adapters on the bundled models/tiny-qwen3 (real tokenizer) for the server tests
# (tests/py/test_lora_server.py): greedy continuations of a token prompt under the base and
# each adapter, with transformers + peft, into tests/data/lora_server_golden.json.
TINY = [("t1", dict(r=8, lora_alpha=16, target_modules=ALL), 11),
        ("t2", dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"], use_rslora=True), 12)]
GREEDY_TOKENS = 8


def greedy(model, ids, n):
    """n argmax steps over the full sequence; the smallest top-1 / top-2 logit gap seen."""
    ids = ids.clone()
    margin = float("inf")
    for _ in range(n):
        lg = logits(model, ids)[-1]
        top = torch.topk(lg, 2).values
        margin = min(margin, (top[0] - top[1]).item())
        ids = torch.cat([ids, lg.argmax().view(1)])
    return ids[-n:].tolist(), margin


def save_adapter(pm, d, base_name):
    """peft's save_pretrained, then the tensors as BF16 (exact: the values were rounded)."""
    pm.save_pretrained(d, save_embedding_layers=False)
    from safetensors.torch import load_file
    st = load_file(os.path.join(d, "adapter_model.safetensors"))
    save_file({k: v.bfloat16() for k, v in st.items()}, os.path.join(d, "adapter_model.safetensors"))
    with open(os.path.join(d, "adapter_config.json")) as f:
        ac = json.load(f)
    ac["base_model_name_or_path"] = base_name
    ac["target_modules"] = sorted(ac["target_modules"])  # peft keeps a set: hash order would differ per run
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump(ac, f, indent=2, sort_keys=True)
    os.remove(os.path.join(d, "README.md"))  # peft's model card template


def make_tiny():
    tiny = os.path.join(REPO, "models", "tiny-qwen3")

    def load():
        m = transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32, attn_implementation="eager")
        return m.eval()

    gen = torch.Generator().manual_seed(21)
    prompt = torch.randint(0, 151936, (6,), generator=gen, dtype=torch.int64)
    out = {"prompt": prompt.tolist(), "max_tokens": GREEDY_TOKENS}
    out["base"], margin = greedy(load(), prompt, GREEDY_TOKENS)
    for name, kw, seed in TINY:
        pm = peft.get_peft_model(load(), peft.LoraConfig(lora_dropout=0.0, bias="none", **kw))
        randomize(pm, torch.Generator().manual_seed(seed))
        d = os.path.join(OUT, f"tiny-qwen3-{name}")
        save_adapter(pm, d, "models/tiny-qwen3")
        ref = peft.PeftModel.from_pretrained(load(), d).eval()
        out[name], m = greedy(ref, prompt, GREEDY_TOKENS)
        margin = min(margin, m)
        assert out[name] != out["base"], name
    # argmax must not sit on a knife edge: f32 summation order moves logits by ~1e-5
    assert margin > 1e-3, margin
    out["min_top2_gap"] = margin
    with open(os.path.join(REPO, "tests", "data", "lora_server_golden.json"), "w") as f:
        json.dump(out, f, indent=1)
    print("tiny-qwen3:", out)


def main():
    os.makedirs(OUT, exist_ok=True)
    make_tiny()
    refs = {}
    for fixture, name, kw, seed in ADAPTERS:
        gen = torch.Generator().manual_seed(seed)
        cfg = peft.LoraConfig(lora_dropout=0.0, bias="none", **kw)
        pm = peft.get_peft_model(base_model(fixture), cfg)
        randomize(pm, gen)
        d = os.path.join(OUT, f"{fixture}-{name}")
        save_adapter(pm, d, f"tests/fixtures/{fixture}")
        # the reference: the committed directory reloaded onto a fresh base
        base = base_model(fixture)
        vocab = base.config.vocab_size
        ids = [torch.randint(0, vocab, (n,), generator=gen, dtype=torch.int64) for n in SEQ_LENS]
        plain = [logits(base, x) for x in ids]
        ref_model = peft.PeftModel.from_pretrained(base_model(fixture), d)
        ref_model.eval()
        r = refs.setdefault(fixture, {})
        moved = 0.0
        for i, x in enumerate(ids):
            lg = logits(ref_model, x)
            moved = max(moved, (lg - plain[i]).abs().max().item())
            r[f"{name}.seq{i}.tokens"] = x.to(torch.int32)
            r[f"{name}.seq{i}.logits"] = lg.contiguous()
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        print(f"{fixture}-{name}: {size} bytes, adapter moves logits by up to {moved:.3f}")
    for fixture, r in refs.items():
        save_file(r, os.path.join(OUT, f"{fixture}.ref.safetensors"))
    print("versions:", torch.__version__, transformers.__version__, peft.__version__)


if __name__ == "__main__":
    main()
