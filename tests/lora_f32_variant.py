#!/usr/bin/env python3
"""lora_f32_variant.py SRC DST - a copy of the PEFT adapter in SRC (BF16 tensors) as F32 tensors whose
values are each BF16 value times (1 - 2^-12) (even elements) or (1 + 2^-12) (odd ones): not
BF16-exact, but within half a BF16 ulp (>= 2^-10 relative below a power of two, 2^-9 otherwise) of the
original, so rounding them to nearest-even BF16 gives the original bits back (truncation would not,
for the ones scaled down).
tests/test_lora.c uses it to check --lora-dtype bfloat16's rounding. Standard library only."""
import json
import shutil
import struct
import sys

src, dst = sys.argv[1], sys.argv[2]
raw = open(src + "/adapter_model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
data = raw[8 + n:]
out, blobs, off = {}, [], 0
for name, t in head.items():
    if name == "__metadata__":
        out[name] = t
        continue
    assert t["dtype"] == "BF16", name
    s, e = t["data_offsets"]
    bits = struct.unpack("<%dH" % ((e - s) // 2), data[s:e])
    vals = [struct.unpack("<f", struct.pack("<I", b << 16))[0] * (1 + (2.0 ** -12 if i % 2 else -2.0 ** -12))
            for i, b in enumerate(bits)]
    blob = struct.pack("<%df" % len(vals), *vals)
    out[name] = {"dtype": "F32", "shape": t["shape"], "data_offsets": [off, off + len(blob)]}
    off += len(blob)
    blobs.append(blob)
hj = json.dumps(out).encode()
hj += b" " * ((8 - len(hj) % 8) % 8)
with open(dst + "/adapter_model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(hj)) + hj + b"".join(blobs))
shutil.copy(src + "/adapter_config.json", dst + "/adapter_config.json")
