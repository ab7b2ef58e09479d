"""sampler-cpu's one-shot generation on the bundled model agrees with the
transformers reference: its first greedy token is the argmax of the
reference logits at the last prompt position."""
import os
import subprocess

import numpy as np

from conftest import ROOT, read_safetensors


def test_help(sampler_bin):
    r = subprocess.run([sampler_bin, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--model" in r.stdout


def test_greedy_matches_reference(sampler_bin):
    ref = read_safetensors(os.path.join(ROOT, "models/tiny-qwen3/ref.safetensors"))
    for i in range(2):
        toks = ref[f"seq{i}.tokens"]
        want = int(np.argmax(ref[f"seq{i}.prefill_logits"][-1]))
        r = subprocess.run([sampler_bin, "--prompt-ids", ",".join(map(str, toks)), "--max-tokens", "1",
                            "--threads", "1"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        line = next(l for l in r.stdout.splitlines() if l.startswith("generated:"))
        assert int(line.split()[1]) == want


def test_bad_model_dir_is_a_clear_error(sampler_bin, tmp_path):
    r = subprocess.run([sampler_bin, "--model", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "config.json" in r.stderr
