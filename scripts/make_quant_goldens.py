"""Golden files for tests/test_quant_*.c (FP8 / NVFP4), written with PyTorch.

    python3 scripts/make_quant_goldens.py      # writes tests/data/quant/

References:
  * scalar casts: torch's own `.to(torch.float8_e4m3fn)` and its `.float()`
    (the E5M2 grid is among the cast inputs only); E2M1 from Model Optimizer's _cast_fp4 (nvfp4_reference.py).
  * FP8 weights: block / channel / tensor scaled like the Qwen3-FP8 / DeepSeek-V3
    `weight_scale_inv` checkpoints: s = amax / 448 (1.0 for an all-zero block),
    q = (w.float() / s).to(float8_e4m3fn) (torch saturates at 448).
  * NVFP4 weights: nvfp4_reference.py (Model Optimizer formulas).
  * activations: FP8 per token and 128-column group; NVFP4 per 16-block with a
    per-token global scale amax / (6 * 448).
  * matmul: float64 products of the dequantized operands.
Every file is raw little-endian; cases.txt lists shapes. Deterministic (fixed seed).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nvfp4_reference as nv  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "quant")
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
cases = []


def save(name, t):
    t.contiguous().cpu().numpy().tofile(os.path.join(OUT, name))


def f32_from_bits(bits):
    return torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)


def cast_inputs(g):
    """Random, edge and special f32 inputs for the scalar casts."""
    parts = [torch.randn(4000, generator=g) * s for s in (1e-4, 1e-2, 1.0, 30.0, 300.0, 3e4)]
    parts.append(torch.empty(2000).uniform_(-600, 600, generator=g))
    # every finite e4m3 / e5m2 value, the midpoints (ties) and one f32 ulp either side
    for dt in (E4M3, E5M2):
        v = torch.arange(256, dtype=torch.uint8).view(dt).float()
        v = v[torch.isfinite(v)].unique()
        mid = (v[1:] + v[:-1]) / 2
        parts += [v, mid, torch.nextafter(mid, torch.tensor(-1e30)), torch.nextafter(mid, torch.tensor(1e30))]
    # e2m1 grid, its ties and neighbours
    e2 = nv.E2M1_VALUES.unique()
    mid = (e2[1:] + e2[:-1]) / 2
    parts += [e2, mid, torch.nextafter(mid, torch.tensor(-1e30)), torch.nextafter(mid, torch.tensor(1e30))]
    specials = [0.0, -0.0, 448.0, -448.0, 449.0, 460.0, 464.0, 464.00003, 470.0, 479.99997, 480.0, 500.0,
                -1e6, 1e30, 57344.0, 61439.0, 61440.0, 65536.0, 1e38, 6.0, 7.0, -6.5, 1e-45, -1e-45,
                2.0**-6, 2.0**-7, 2.0**-9, 2.0**-10, 1.5 * 2.0**-10, 2.0**-14, 2.0**-16, 2.0**-17,
                float("inf"), float("-inf"), float("nan")]
    parts.append(torch.tensor(specials, dtype=torch.float32))
    parts.append(f32_from_bits([0xFFC00000, 0x7F800001, 0x00000001, 0x807FFFFF, 0x00400000]))  # -NaN, sNaN, denormals
    x = torch.cat([p.float().reshape(-1) for p in parts])
    return torch.cat([x, -x])


def gen_casts(g):
    x = cast_inputs(g)
    save("cast_in.f32", x)
    save("cast_e4m3.u8", x.to(E4M3).view(torch.uint8))
    save("cast_e2m1.u8", nv.cast_fp4(x.clone()))
    b = torch.arange(256, dtype=torch.uint8)
    save("e4m3_all.f32", b.view(E4M3).float())
    save("e2m1_all.f32", nv.E2M1_VALUES.float())
    cases.append(f"casts {x.numel()}")


def fp8_quant(w, br, bc):
    """w [rows, cols] bf16 or f32 -> (q uint8 [rows, cols], s f32 [ceil(rows/br), ceil(cols/bc)])."""
    rows, cols = w.shape
    sr, sc = -(-rows // br), -(-cols // bc)
    pad = torch.zeros(sr * br, sc * bc, dtype=w.dtype)
    pad[:rows, :cols] = w
    amax = pad.abs().view(sr, br, sc, bc).amax(dim=(1, 3)).float()
    s = amax / 448.0
    s[amax == 0] = 1.0
    sfull = s.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:rows, :cols]
    q = (w / sfull).to(E4M3)
    return q.view(torch.uint8), s


def fp8_dequant(q, s, br, bc):
    rows, cols = q.shape
    sfull = s.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:rows, :cols]
    return q.view(E4M3).float() * sfull


def weights(g):
    def rnd(r, c, std=0.02):
        return (torch.randn(r, c, generator=g) * std).to(torch.bfloat16)

    out = {}
    out["randn"] = rnd(64, 256)
    w = rnd(64, 256)
    w[5, 37] = 3.0e5  # one huge value: most NVFP4 block scales hit the 2^-9 clamp
    w[40, 16:32] = torch.tensor([1e-3] * 15 + [50.0])  # one huge value inside a block
    out["outlier"] = w
    w = rnd(256, 384)
    w[0:128, 128:256] = 0  # an all-zero 128x128 FP8 block
    w[200, 32:48] = 0  # all-zero NVFP4 blocks
    w[201, 0:16] = -0.0
    w[3, :] = 0
    out["zeroblocks"] = w
    w = (torch.exp(torch.randn(96, 160, generator=g) * 4) * torch.sign(torch.randn(96, 160, generator=g)))
    w[0, :8] = torch.tensor([1e-40, -1e-39, 5e-41, 0, 2e-38, -3e-38, 9e-41, 1e-41])  # bf16 subnormals
    out["wide"] = w.to(torch.bfloat16)
    out["allzero"] = torch.zeros(16, 32, dtype=torch.bfloat16)
    out["allzero"][1, ::2] = -0.0
    out["ragged"] = rnd(200, 304)  # not multiples of 128
    return out


def gen_weights(g):
    layouts = {"block128": lambda r, c: (128, 128), "channel": lambda r, c: (1, c), "tensor": lambda r, c: (r, c)}
    ws = weights(g)
    for name, w in ws.items():
        rows, cols = w.shape
        save(f"w_{name}.bf16", w.view(torch.int16))
        for lay, dims in layouts.items():
            br, bc = dims(rows, cols)
            q, s = fp8_quant(w, br, bc)
            save(f"fp8_{lay}_{name}.q.u8", q)
            save(f"fp8_{lay}_{name}.s.f32", s)
        packed, scale, s2 = nv.quantize_weight(w)
        save(f"nvfp4_{name}.packed.u8", packed)
        save(f"nvfp4_{name}.scale.u8", scale)
        save(f"nvfp4_{name}.scale2.f32", s2.reshape(1))
        cases.append(f"weight {name} {rows} {cols}")
    return ws


def gen_act_and_matmul(g, ws):
    n, cols = 7, 384
    x = torch.randn(n, cols, generator=g) * torch.exp(torch.randn(n, 1, generator=g))
    x[2, 130:140] = 40.0  # an outlier group
    x[4] = 0.0  # an all-zero token
    x[5, 256:] = 0.0  # an all-zero group and blocks
    save("act_x.f32", x)
    q, s = fp8_quant(x, 1, 128)
    save("act_fp8.q.u8", q)
    save("act_fp8.s.f32", s)
    gx = x.abs().amax(dim=1, keepdim=True) / (6.0 * 448.0)
    packed, scale = nv.quantize(x, gx)
    save("act_nvfp4.packed.u8", packed)
    save("act_nvfp4.scale.u8", scale)
    save("act_nvfp4.g.f32", gx.reshape(-1))
    cases.append(f"act {n} {cols}")

    w = ws["zeroblocks"]  # [256, 384]
    xd = x.double()
    wq, wsi = fp8_quant(w, 128, 128)
    wd = fp8_dequant(wq, wsi, 128, 128).double()
    save("mm_fp8_wo.f64", xd @ wd.T)
    xq = fp8_dequant(q, s, 1, 128).double()
    save("mm_fp8_aq.f64", xq @ wd.T)
    p, sc, s2 = nv.quantize_weight(w)
    wd = nv.dequantize(p, sc, s2).double()
    save("mm_nvfp4_wo.f64", xd @ wd.T)
    xq = nv.dequantize(packed, scale, gx).double()
    save("mm_nvfp4_aq.f64", xq @ wd.T)
    cases.append(f"matmul zeroblocks {n} {cols}")


def main():
    os.makedirs(OUT, exist_ok=True)
    g = torch.Generator().manual_seed(7)
    gen_casts(g)
    ws = gen_weights(g)
    gen_act_and_matmul(g, ws)
    with open(os.path.join(OUT, "cases.txt"), "w") as f:
        f.write(f"# written by scripts/make_quant_goldens.py with torch {torch.__version__}\n")
        f.write("\n".join(cases) + "\n")
    print("wrote", OUT, f"(torch {torch.__version__})")


if __name__ == "__main__":
    main()
