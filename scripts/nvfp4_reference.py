"""NVFP4 reference: NVIDIA Model Optimizer's weight quantization formulas in torch.

Transcribed from modelopt/torch/quantization/qtensor/nvfp4_tensor.py
(NVFP4QTensor.get_weights_scaling_factor_2, get_weights_scaling_factor,
quantize, _cast_fp4), keeping its f32 operation order so that quant/ in C can
be compared bit for bit:

    weight_scale_2 = amax(|w|).float() / (6.0 * 448.0)
    s = block_amax.float() / (6.0 * weight_scale_2);  s[s == 0] = 1.0
    weight_scale = s.clamp(min=2**-9).to(float8_e4m3fn)
    codes = cast_fp4(w / (weight_scale.float() * weight_scale_2))
    packed = (codes[..., 1::2] << 4) | codes[..., 0::2]

One deliberate deviation, documented in include/quant.h: a block whose amax is
0 gets scale e4m3(1.0) and codes 0 even when the global scale is 0 (an
all-zero tensor, or an all-zero token for activations), where Model Optimizer
would divide 0 by 0 and emit NaN scales. For every non-zero global scale the
result is identical to Model Optimizer's.

Also used for NVFP4 activations with a per-row global scale (`g` [rows, 1]).
"""
import torch

E2M1_BOUNDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
E2M1_VALUES = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6])
BLOCK = 16


def cast_fp4(x: torch.Tensor) -> torch.Tensor:
    """Model Optimizer's _cast_fp4: f32 -> 4-bit codes (uint8), RNE, saturating at 6."""
    sign = (x < 0).to(torch.uint8)
    a = x.abs()
    ordv = torch.searchsorted(E2M1_BOUNDS, a, out_int32=True).to(torch.uint8)
    odd = torch.any(a.unsqueeze(-1) == E2M1_BOUNDS[[1, 3, 5]], dim=-1).to(torch.uint8)
    return (sign << 3) + ordv + odd


def weight_scale_2(w: torch.Tensor) -> torch.Tensor:
    return w.abs().amax().float() / (6.0 * 448.0)


def quantize(w: torch.Tensor, g: torch.Tensor):
    """w [rows, cols] (bf16 or f32), g: 0-dim or [rows, 1] f32 global scale.
    Returns packed uint8 [rows, cols/2], scale uint8 (e4m3 bits) [rows, cols/16]."""
    rows, cols = w.shape
    assert cols % BLOCK == 0, "NVFP4 needs cols % 16 == 0"
    g = g.float()
    blocks = w.view(rows, cols // BLOCK, BLOCK)
    bamax = blocks.abs().amax(dim=-1).float()
    s = bamax / (6.0 * g)
    s[s == 0] = 1.0
    zero = bamax == 0
    s[zero] = 1.0  # the deviation: defined even when g == 0
    s8 = s.clamp(min=2**-9).to(torch.float8_e4m3fn)
    scaled = blocks / (s8.to(torch.float32) * g).unsqueeze(-1)
    codes = cast_fp4(scaled.reshape(rows, cols))
    codes = codes.view(rows, cols // BLOCK, BLOCK)
    codes[zero] = 0
    codes = codes.view(rows, cols)
    packed = (codes[..., 1::2] << 4) | codes[..., 0::2]
    return packed.contiguous(), s8.view(torch.uint8).contiguous()


def quantize_weight(w: torch.Tensor):
    """A bf16 weight [out, in] -> (packed, weight_scale bits, weight_scale_2 f32)."""
    s2 = weight_scale_2(w)
    packed, scale = quantize(w, s2)
    return packed, scale, s2


def dequantize(packed: torch.Tensor, scale: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    rows = packed.shape[0]
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).view(rows, -1).long()
    vals = E2M1_VALUES[codes].view(rows, -1, BLOCK)
    sf = scale.view(torch.float8_e4m3fn).float() * g.float()
    return (vals * sf.unsqueeze(-1)).view(rows, -1)
