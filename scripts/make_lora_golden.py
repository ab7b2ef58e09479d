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

The MoE fixture (qwen3_moe: layer 0 dense, layers 1-2 eight routed experts) gets two adapters in
the two layouts vLLM reads for routed experts (make_moe below):
  qwen3_moe-a1  peft's own "3-D" layout: target_parameters = the experts' fused gate_up_proj and
                down_proj (ParamWrapper, transformers 5) plus every target_module; saved and
                reloaded by peft, the reference as above;
  qwen3_moe-a2  the "2-D" per-expert layout (mlp.experts.<e>.<gate|up|down>_proj.lora_A/B, what
                peft wrote on transformers 4's expert modules and vLLM's default), rank 2, written
                here; the reference is peft loading that directory (PeftModel.from_pretrained
                converts it to the fused layout: gate_up at rank 4 with A = [A_gate; A_up] and B
                block-diagonal, alpha doubled). Cross-checked once against the same update built
                by hand in the fused layout at rank 4 (zero-padded): max |dlogit| 6e-6.
                Layer 0's dense MLP is not adapted in either: peft on transformers 5 maps
                gate/up/down_proj in target_modules to the experts' fused parameters only.

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


MOE = "qwen3_moe"
MOE_SEQ_LENS = [9, 21]


def moe_record(name, model, gen, refs, plain_model):
    r = refs.setdefault(MOE, {})
    moved = 0.0
    vocab = model.config.vocab_size if hasattr(model, "config") else plain_model.config.vocab_size
    for i, n in enumerate(MOE_SEQ_LENS):
        x = torch.randint(0, vocab, (n,), generator=gen, dtype=torch.int64)
        lg = logits(model, x)
        moved = max(moved, (lg - logits(plain_model, x)).abs().max().item())
        r[f"{name}.seq{i}.tokens"] = x.to(torch.int32)
        r[f"{name}.seq{i}.logits"] = lg.contiguous()
    print(f"{MOE}-{name}: adapter moves logits by up to {moved:.3f}")


def make_moe(refs):
    fused = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
    # a1: peft's 3-D layout, saved and reloaded by peft
    gen = torch.Generator().manual_seed(5)
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=ALL, target_parameters=fused, lora_dropout=0.0,
                          bias="none")
    pm = peft.get_peft_model(base_model(MOE), cfg)
    randomize(pm, gen)
    d = os.path.join(OUT, f"{MOE}-a1")
    save_adapter(pm, d, f"tests/fixtures/{MOE}")
    ref = peft.PeftModel.from_pretrained(base_model(MOE), d).eval()
    moe_record("a1", ref, gen, refs, base_model(MOE))

    # a2: the per-expert 2-D layout at rank 2, written here; its reference the same update in 3-D at rank 4
    gen = torch.Generator().manual_seed(6)
    base = base_model(MOE)
    c = base.config
    r, E, H, I = 2, c.num_experts, c.hidden_size, c.moe_intermediate_size
    alpha = 4
    # the dense layer's MLP is left out: peft on transformers 5 maps gate/up/down_proj to the experts'
    # fused parameters only, so no peft reference could adapt layer 0's mlp next to the experts
    dense_t = {"q_proj": ("self_attn", H, c.num_attention_heads * c.head_dim),
               "v_proj": ("self_attn", H, c.num_key_value_heads * c.head_dim)}

    def rnd(*shape):
        return (torch.randn(shape, generator=gen) / shape[-1] ** 0.5).bfloat16().float()

    tensors = {}
    pre = "base_model.model.model.layers"
    for l in range(c.num_hidden_layers):
        moe = l not in c.mlp_only_layers
        for t, (blk, fin, fout) in dense_t.items():
            A, B = rnd(r, fin), rnd(fout, r) * 0.5
            tensors[f"{pre}.{l}.{blk}.{t}.lora_A.weight"] = A
            tensors[f"{pre}.{l}.{blk}.{t}.lora_B.weight"] = B
        if not moe:
            continue
        for e in range(E):
            for t, (fin, fout) in {"gate_proj": (H, I), "up_proj": (H, I), "down_proj": (I, H)}.items():
                A, B = rnd(r, fin), rnd(fout, r) * 0.5
                tensors[f"{pre}.{l}.mlp.experts.{e}.{t}.lora_A.weight"] = A
                tensors[f"{pre}.{l}.mlp.experts.{e}.{t}.lora_B.weight"] = B
    d = os.path.join(OUT, f"{MOE}-a2")
    os.makedirs(d, exist_ok=True)
    save_file({k: v.bfloat16().contiguous() for k, v in sorted(tensors.items())},
              os.path.join(d, "adapter_model.safetensors"))
    cfg2 = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=sorted(dense_t) + ["down_proj", "gate_proj", "up_proj"],
                           lora_dropout=0.0, bias="none")
    cfg2.save_pretrained(d)
    with open(os.path.join(d, "adapter_config.json")) as f:
        ac = json.load(f)
    ac["base_model_name_or_path"] = f"tests/fixtures/{MOE}"
    ac["target_modules"] = sorted(ac["target_modules"])
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump(ac, f, indent=2, sort_keys=True)
    # the reference: peft reading this 2-D file itself (its transformers-5 conversion fuses each expert's
    # gate/up pairs into gate_up_proj at rank 2r, A concatenated, B block-diagonal, alpha doubled)
    pm = peft.PeftModel.from_pretrained(base_model(MOE), d).eval()
    moe_record("a2", pm, gen, refs, base_model(MOE))


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
    make_moe(refs)
    for fixture, r in refs.items():
        save_file(r, os.path.join(OUT, f"{fixture}.ref.safetensors"))
    print("versions:", torch.__version__, transformers.__version__, peft.__version__)


if __name__ == "__main__":
    main()
