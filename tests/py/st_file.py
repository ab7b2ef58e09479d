"""Read and write safetensors files byte for byte (no numpy, no torch): the
tests' and helpers' one copy. {name: (dtype, shape, raw bytes)} in file order."""
import json
import struct


def read_st(path):
    """{name: (dtype, shape, raw bytes)} of a safetensors file, in file order."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    hdr.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in sorted(hdr.items(), key=lambda kv: kv[1]["data_offsets"][0])}


def write_st(path, tensors):
    header, off = {}, 0
    for k, (dt, shape, b) in tensors.items():
        header[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(b for _, _, b in tensors.values()))
