"""Pre-quantized checkpoints in the formats users have, made from a BF16
fixture with the reference formulas (not with our C code):

  tests/fixtures/llama31_fp8    Qwen3-FP8 / DeepSeek-V3 layout: `weight` F8_E4M3,
                                `weight_scale_inv` F32 per 128x128 block,
                                quantization_config {quant_method: fp8, weight_block_size}
  tests/fixtures/llama31_nvfp4  NVIDIA Model Optimizer NVFP4 layout: `weight` U8 packed,
                                `weight_scale` F8_E4M3 per 16, `weight_scale_2` F32,
                                `input_scale` F32; hf_quant_config.json + quantization_config

FP8 uses PyTorch's float8_e4m3fn cast; NVFP4 uses scripts/nvfp4_reference.py
(Model Optimizer's formulas). The C loader must give the same logits as
quantizing the BF16 fixture on load (tests/test_quant_model.c).
Run: python3 scripts/make_quant_fixtures.py
"""
import json
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nvfp4_reference as nv  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "tests/fixtures/llama31")
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantized(name):
    return name.startswith("model.layers.") and name.endswith(".weight") and name.split(".")[-2] in LINEARS


def fp8_block(w):
    w = w.float()
    rows, cols = w.shape
    sr, sc = -(-rows // 128), -(-cols // 128)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    s = torch.empty(sr, sc, dtype=torch.float32)
    for i in range(sr):
        for j in range(sc):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            amax = blk.abs().amax()
            si = amax / 448.0 if amax > 0 else torch.tensor(1.0)
            s[i, j] = si
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = (blk / si).to(torch.float8_e4m3fn)
    return q, s


def copy_meta(dst):
    os.makedirs(dst, exist_ok=True)
    for f in ("generation_config.json", "ref.safetensors"):
        shutil.copy(os.path.join(SRC, f), os.path.join(dst, f))
    with open(os.path.join(SRC, "config.json")) as f:
        return json.load(f)


def write(dst, cfg, tensors):
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})


def main():
    src = load_file(os.path.join(SRC, "model.safetensors"))

    dst = os.path.join(ROOT, "tests/fixtures/llama31_fp8")
    cfg = copy_meta(dst)
    cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                  "weight_block_size": [128, 128]}
    out = {}
    for k, v in sorted(src.items()):
        if quantized(k):
            q, s = fp8_block(v)
            out[k] = q
            out[k + "_scale_inv"] = s
        else:
            out[k] = v
    write(dst, cfg, out)

    dst = os.path.join(ROOT, "tests/fixtures/llama31_nvfp4")
    cfg = copy_meta(dst)
    qc = {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}
    cfg["quantization_config"] = dict(qc, quant_method="modelopt")
    with open(os.path.join(dst, "hf_quant_config.json"), "w") as f:
        json.dump({"producer": {"name": "modelopt"}, "quantization": qc}, f, indent=2, sort_keys=True)
    out = {}
    for k, v in sorted(src.items()):
        if quantized(k):
            packed, scale, s2 = nv.quantize_weight(v)
            p = k[:-len("weight")]
            out[k] = packed
            out[p + "weight_scale"] = scale.view(torch.float8_e4m3fn)
            out[p + "weight_scale_2"] = s2.reshape(())
            out[p + "input_scale"] = torch.tensor(0.01, dtype=torch.float32)  # a calibrated amax/2688 stand-in
        else:
            out[k] = v
    write(dst, cfg, out)
    print("wrote tests/fixtures/llama31_fp8 and tests/fixtures/llama31_nvfp4")


if __name__ == "__main__":
    main()
