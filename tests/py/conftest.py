"""Shared helpers for the Python integration tests: binary paths and a
dependency-free safetensors reader (numpy only; CI has no torch)."""
import json
import os
import struct

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD_DIR", os.path.join(ROOT, "build"))

_DT = {"F32": np.float32, "I32": np.int32, "I64": np.int64, "U8": np.uint8, "F16": np.float16,
       "BF16": np.uint16}


def read_safetensors(path):
    """name -> numpy array (BF16 returned as raw uint16 bits)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        out[k] = np.frombuffer(data[b:e], dtype=_DT[v["dtype"]]).reshape(v["shape"])
    return out


@pytest.fixture(scope="session")
def sampler_bin():
    return os.environ.get("SAMPLER_BIN", os.path.join(BUILD, "sampler-cpu"))
