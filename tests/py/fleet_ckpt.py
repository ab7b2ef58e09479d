"""A chain of checkpoints of the bundled tiny model and the trainer's deltas
between them (v0 = models/tiny-qwen3 -> v1 -> ... -> vN), numpy only, for the
fleet tests and bench/fleet.py. Step k moves a sparse set of elements of a few
BF16 tensors (enough to change greedy output)."""
import os
import shutil
import subprocess

import numpy as np

from conftest import ROOT
from delta_ckpt import TRAINER, parse_delta
from st_file import read_st, write_st

TINY = os.path.join(ROOT, "models/tiny-qwen3")
STEP_TENSORS = ("model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight", "model.norm.weight")


def make_chain(base, n_steps):
    """base/v1..vN checkpoint directories and base/chain/step-K.delta (K-1 -> K);
    returns (list of checkpoint dirs [v0, v1, ...], chain dir, list of delta paths)."""
    chain = os.path.join(base, "chain")
    os.makedirs(chain, exist_ok=True)
    t = read_st(os.path.join(TINY, "model.safetensors"))
    dirs, deltas, fp = [TINY], [], None
    for k in range(1, n_steps + 1):
        rng = np.random.default_rng(k)
        for name in STEP_TENSORS:
            dt, shape, b = t[name]
            a = np.frombuffer(b, dtype=np.uint16).copy()
            idx = rng.choice(a.size, max(1, a.size // 50), replace=False)
            a[idx] += np.uint16(200)
            t[name] = (dt, shape, a.tobytes())
        d = os.path.join(base, f"v{k}")
        os.makedirs(d)
        for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(TINY, f), d)
        write_st(os.path.join(d, "model.safetensors"), t)
        out = os.path.join(chain, f"step-{k:04d}.delta")
        args = [TRAINER, "diff", dirs[-1], d, "-o", out, "--base-version", str(k - 1), "--target-version", str(k),
                "--threads", "1"]
        if fp is not None:
            args += ["--fingerprint", f"{fp:016x}"]
        subprocess.run(args, check=True, capture_output=True)
        if fp is None:
            fp = parse_delta(open(out, "rb").read())["fingerprint"]
        dirs.append(d)
        deltas.append(out)
    return dirs, chain, deltas
