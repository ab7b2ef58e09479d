"""The served GPU benchmark's code on the CPU: bench/gpu_served.py --smoke (the
same code check.sh runs on a GPU, with sampler-cpu, the bundled model and tiny
sizes, each configuration time-boxed) and bench/gpu_json.py (bench/gpu/<gpu>.json
written from a sample gpu_check --json output and the smoke run's JSON, its
schema, the rows issues 17-19 name, the markdown rendering).

Also the engine's step-phase counters (/metrics sampler_step_*_seconds_total),
read by the bench for the host share: they move while serving and their parts
add up to at most the step. No timing assertions: the numbers themselves are
for bench/, only their presence and consistency are checked."""
import json
import math
import os
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))
import gpu_json  # noqa: E402
import gpu_served  # noqa: E402

SERVED = os.path.join(ROOT, "bench", "gpu_served.py")
GPU_JSON = os.path.join(ROOT, "bench", "gpu_json.py")
SAMPLE_GC = os.path.join(ROOT, "tests", "py", "data", "gpu_check_sample.json")
CONFIG_KEYS = {"name", "prompt", "output", "concurrency", "n", "rl", "window_s", "slots", "workers", "requests_sent",
               "requests_completed", "requests_cut", "n_errors", "errors", "tokens", "tok_s", "steady_tok_s",
               "ttft_n", "ttft_p50_s", "ttft_p99_s", "itl_n", "itl_p50_s", "itl_p99_s", "server", "drained"}


@pytest.fixture(scope="module")
def smoke(sampler_bin, tmp_path_factory):
    out = tmp_path_factory.mktemp("served") / "served.json"
    # the timeout bounds a hung script only: every configuration is time-boxed by the script itself
    r = subprocess.run([sys.executable, SERVED, "--smoke", "--bin", sampler_bin, "--json", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(out.read_text()), str(out)


def test_smoke_runs_every_configuration(smoke):
    d, _ = smoke
    assert d["mode"] == "smoke" and d["server_exit"] == 0 and "error" not in d
    names = [c["name"] for c in d["configs"]] + [c["name"] for c in d["not_run"]]
    # 2 shapes x 2 concurrencies x RL off/on, the rows issue 17 names first
    assert sorted(names) == sorted(f"c{c}_{s}{r}" for s in ("16x6", "8x10") for c in (1, 4)
                                   for r in ("", "_rl_fields"))
    assert names[:3] == ["c4_16x6", "c4_16x6_rl_fields", "c1_16x6"]
    assert d["configs"], "the budget left no configuration"
    # a loaded CI machine may finish little inside a window: what did arrive must be consistent,
    # and something must have arrived in at least one window of each RL mode
    for rl in (False, True):
        assert any(c["requests_completed"] >= 1 for c in d["configs"] if c["rl"] == rl), rl
    for c in d["configs"]:
        assert CONFIG_KEYS <= set(c), CONFIG_KEYS - set(c)
        assert c["n"] == min(2, c["concurrency"]) and c["slots"] == max(1, c["concurrency"] // c["n"])
        assert c["n_errors"] == 0, c["errors"]  # with RL fields: a log-prob and a mask row per token id
        assert c["drained"]
        assert c["requests_sent"] >= c["requests_completed"] + c["requests_cut"] >= 1
        assert c["tokens"] >= c["requests_completed"] * c["n"] * c["output"]
        if c["ttft_n"]:
            assert 0 < c["ttft_p50_s"] <= c["ttft_p99_s"]
        if c["itl_n"]:
            assert 0 <= c["itl_p50_s"] <= c["itl_p99_s"]
        assert c["tok_s"] == pytest.approx(c["tokens"] / c["window_s"])


def test_a_server_death_costs_one_configuration(sampler_bin, tmp_path):
    """The server killed halfway through the first configuration's window (--kill-server-during, the
    stand-in for a kernel fault at that batch): that configuration's rows are null with the reason,
    a fresh server runs the rest, and the run exits 1."""
    out = tmp_path / "served.json"
    r = subprocess.run([sys.executable, SERVED, "--smoke", "--bin", sampler_bin, "--json", str(out),
                        "--kill-server-during", "c4_16x6"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 1, r.stdout + r.stderr
    d = json.loads(out.read_text())
    assert [x["during"] for x in d["server_deaths"]] == ["c4_16x6"] and d["server_deaths"][0]["exit"] == -9
    assert d["server_restarts"] == 1 and d["server_exit"] == 0 and "error" not in d
    first, rest = d["configs"][0], d["configs"][1:]
    assert first["name"] == "c4_16x6" and first["server_died"] == -9 and not first["drained"]
    assert rest and all(c["server_died"] is None and c["n_errors"] == 0 and c["drained"] for c in rest)
    assert any(c["requests_completed"] >= 1 for c in rest)
    doc = gpu_json.build(json.load(open(SAMPLE_GC)), [d], "", "a", "d")
    assert gpu_json.check(doc) == []
    rows = {x["name"]: x for x in doc["rows"]}
    assert rows["served_bf16_c4_16x6_tok_s"]["value"] is None and "died" in rows["served_bf16_c4_16x6_tok_s"]["reason"]
    assert all(rows[f"served_bf16_{c['name']}_tok_s"]["value"] is not None for c in rest if c["tokens"])


def test_kv_dtype_from_the_server(smoke):
    d, _ = smoke
    # the dtype the bench gave the server (--kv-cache-dtype bfloat16 by default) is what the roofline counts
    assert "--kv-cache-dtype bfloat16" in d["server_cmd"]
    assert d["kv_cache_dtype"] == "bfloat16" and d["kv_elem_bytes"] == 2.0
    mc = {"hidden_size": 4096, "num_attention_heads": 32, "head_dim": 128}
    assert gpu_served.kv_elem_bytes("fp8", mc) == 1 + 4 / 128  # one f32 scale per position and KV head
    assert gpu_served.kv_elem_bytes("float32", mc) == 4


def test_step_counters(smoke):
    d, _ = smoke
    moved = [c for c in d["configs"] if c["tokens"] > 0]
    assert moved
    for c in moved:
        sv = c["server"]
        st = sv["step_seconds"]
        assert sv["steps"] > 0 and sv["generated_tokens"] > 0
        assert all(v >= 0 for v in st.values()), st
        assert st["step"] > 0 and st["forward"] > 0, st  # the counters exist and move
        parts = st["schedule"] + st["forward"] + st["sample"] + st["publish"]
        assert parts <= st["step"] * (1 + 1e-9) + 1e-6, st  # phases of one step, read on one clock
        assert 0 < sv["host_share"] < 1
        assert sum(sv["phase_shares"].values()) == pytest.approx(1.0, abs=1e-6)
        assert sv["device_busy_share"] is None and sv["device_step_seconds"] == 0  # the CPU measures none


def test_host_path_over_a_modeled_device(tmp_path):
    """bench/bench_host: the whole server over a modeled device (device sampling, async scheduling) under
    the same smoke run: every stream well formed (with RL fields: a log-prob and a mask row per token id),
    the steps sampled on the device and overlapped, and the device's time on its steps, read from
    /metrics sampler_device_step_seconds_total at each window's ends (a share of the window: between 0
    and 1; the CPU server does not measure it: null there)."""
    from conftest import BUILD
    host_bin = os.path.join(BUILD, "bench_host")
    if not os.path.exists(host_bin):
        pytest.skip("bench_host is not built here")
    out = tmp_path / "host.json"
    r = subprocess.run([sys.executable, SERVED, "--smoke", "--bin", host_bin, "--json", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    d = json.loads(out.read_text())
    assert d["server_exit"] == 0 and "error" not in d
    assert {c["rl"] for c in d["configs"]} == {False, True}
    for c in d["configs"]:
        assert c["n_errors"] == 0 and c["drained"], c["errors"]
        sv = c["server"]
        assert sv["steps"] > 0 and sv["generated_tokens"] > 0, sv
        assert sv["step_seconds"]["device_sample"] > 0 and sv["async_steps"] > 0, sv
        assert sv["device_busy_share"] is not None and 0 < sv["device_busy_share"] <= 1.0 + 1e-2, sv


def test_gpu_json_from_smoke(smoke, tmp_path):
    _, served = smoke
    r = subprocess.run([sys.executable, GPU_JSON, "write", "--gpu-check", SAMPLE_GC, "--served", served,
                        "--commit", "abc1234", "--date", "2026-12-01T00:00:00Z", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    path = r.stdout.strip()
    assert os.path.basename(path) == "h200.json"
    doc = json.load(open(path))
    assert gpu_json.check(doc) == []
    rows = {x["name"]: x for x in doc["rows"]}
    # the smoke run served tiny-qwen3 at bf16: its rows are named like the GPU run's
    assert rows["served_bf16_c4_16x6_tok_s"]["value"] > 0
    assert rows["served_bf16_c4_host_share"]["value"] == rows["served_bf16_c4_16x6_host_share"]["value"]
    assert 0 < rows["served_bf16_c4_16x6_tok_s"]["fraction_of_roofline"]
    # not measured by it: null with the reason
    big = rows["served_bf16_c256_1000x1000_tok_s"]
    assert big["value"] is None and big["reason"]
    assert subprocess.run([sys.executable, GPU_JSON, "check", path], capture_output=True).returncode == 0
    md = subprocess.run([sys.executable, GPU_JSON, "render", path], capture_output=True, text=True).stdout
    assert md.count("\n| `") == len(doc["rows"]) and "| `served_bf16_c4_16x6_tok_s` |" in md
    brief = subprocess.run([sys.executable, GPU_JSON, "render", "--brief", path], capture_output=True, text=True).stdout
    assert all(f"| `{n}` |" in brief for n in gpu_json.REQUIRED) and "_ttft_p99_ms` |" not in brief


def test_gpu_json_tagged_run(smoke, tmp_path):
    """A run with --tag (check.sh --served-sync: async scheduling off) gets rows of its own beside the
    untagged run's, so the two are compared in one table."""
    d, served = smoke
    tagged = dict(d, tag="sync")
    p = tmp_path / "served_sync.json"
    p.write_text(json.dumps(tagged))
    r = subprocess.run([sys.executable, GPU_JSON, "write", "--gpu-check", SAMPLE_GC, "--served", served, "--served",
                        str(p), "--commit", "abc1234", "--date", "2026-12-01T00:00:00Z", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rows = {x["name"]: x for x in json.load(open(r.stdout.strip()))["rows"]}
    assert rows["served_bf16_sync_c4_16x6_tok_s"]["value"] == rows["served_bf16_c4_16x6_tok_s"]["value"] > 0


def sample_served():
    """A served JSON as gpu_served.py writes it (one configuration, Qwen3-8B shapes)."""
    mc = {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
          "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": False}
    cfg = {"name": "c256_1000x1000", "prompt": 1000, "output": 1000, "concurrency": 256, "n": 8, "rl": False,
           "window_s": 20.0, "slots": 32, "workers": 8, "requests_sent": 32, "requests_completed": 0,
           "requests_cut": 32, "n_errors": 0, "errors": [], "tokens": 20000, "tok_s": 1000.0, "steady_tok_s": 1100.0,
           "ttft_n": 32, "ttft_p50_s": 2.0, "ttft_p99_s": 3.0, "itl_n": 19000, "itl_p50_s": 0.2, "itl_p99_s": 0.3,
           "server": {"host_share": 0.8, "ms_per_step": 50.0, "forward_ms_per_step": 10.0}, "drained": True}
    c1 = dict(cfg, name="c1_1000x1000", concurrency=1, n=1, slots=1, tokens=1000, tok_s=125.0, itl_p50_s=0.008)
    return {"mode": "gpu", "gpu": "NVIDIA H200", "precision": "bf16", "kv_cache_dtype": "bfloat16",
            "kv_elem_bytes": 2.0, "model": "/dev/shm/x",
            "model_config": mc, "shapes": ["1000x1000", "128x2048"], "concurrency": [1, 16, 64, 256], "n": 8,
            "configs": [cfg, c1],
            "not_run": [{"name": "c16_128x2048_rl_fields", "reason": "time budget (270 s) spent"}]}


def test_gpu_json_rows_and_roofline():
    gc = json.load(open(SAMPLE_GC))
    # a label of several words keeps them all: the same batch at another path is a row of its own
    # (they used to fold into the precision's row, first one kept)
    gc["rows"] += [dict(name=n, tok_s=v, ms=1000.0 / v, roof_tok_s=278.0, fraction=v / 278.0)
                   for n, v in (("bf16 pdl off decode batch 1", 150.0), ("moe30b unpermute off decode batch 1", 80.0))]
    doc = gpu_json.build(gc, [sample_served()], "", "abc1234", "2026-12-01T00:00:00Z")
    assert gpu_json.check(doc) == []
    rows = {x["name"]: x for x in doc["rows"]}
    assert rows["decode_bf16_pdl_off_b1_tok_s"]["value"] == 150.0
    assert rows["decode_moe30b_unpermute_off_b1_ctx512_tok_s"]["value"] == 80.0
    assert rows["decode_bf16_b1_tok_s"]["value"] == 186.3  # not folded in (nor moe30b's: unmeasured below)
    assert set(gpu_json.REQUIRED) <= set(rows)
    assert rows["decode_bf16_b1_tok_s"]["value"] == 186.3 and rows["decode_bf16_b1_fraction"]["value"] == 0.670
    assert rows["decode_bf16_b1_ctx512_tok_s"]["value"] == 186.3
    assert rows["decode_bf16_b128_ctx512_fraction"]["value"] == 0.476
    assert rows["prefill_bf16_4x1024_fraction"]["value"] == 0.232
    assert rows["decode_fp8_b1_tok_s"]["value"] == 249.7
    assert rows["decode_bf16_b8_ctx32k_fraction"]["value"] == 0.6  # a row another change adds, named by rule
    assert rows["kl_bf16_fp8_mean"]["value"] == 0.0012            # named_rows copied
    assert rows["roofline_copy_gbs"]["value"] == 4251 and rows["gpu_check_ops_failed"]["value"] == 0
    assert rows["gemv_bf16_4096x4096_gbs"]["value"] == 2700
    assert rows["gemv_bf16_n8_4096x4096_gbs"]["value"] == 1677  # 8 tokens, tiled
    assert rows["gemv_bf16_mma_n8_4096x4096_fraction"]["value"] == 0.8  # 8 tokens, tensor cores
    assert rows["served_bf16_c256_host_share"]["value"] == 0.8
    assert rows["served_bf16_c256_1000x1000_step_ms"]["value"] == 50.0
    assert rows["served_bf16_c256_1000x1000_forward_ms"]["value"] == 10.0
    # served roofline: C * bw / (W + C * (P + O/2) * kv bytes per token), Qwen3-8B, BF16 KV
    W = 2 * (36 * (4096 * 4096 * 2 + 2 * 1024 * 4096 + 3 * 12288 * 4096) + 151936 * 4096)
    kv = 2 * 36 * 1024 * 2
    roof = 256 * 4251e9 / (W + 256 * 1500 * kv)
    assert rows["served_bf16_c256_1000x1000_tok_s"]["fraction_of_roofline"] == pytest.approx(1000.0 / roof)
    step1 = (W + 1500 * kv) / 4251e9
    assert rows["served_bf16_c1_1000x1000_itl_p50_ms"]["value"] == pytest.approx(8.0)
    assert rows["served_bf16_c1_1000x1000_itl_p50_ms"]["fraction_of_roofline"] == pytest.approx(step1 / 0.008)
    nr = rows["served_bf16_c16_128x2048_rl_fields_tok_s"]
    assert nr["value"] is None and "budget" in nr["reason"]
    # what this run did not measure
    for n in ("served_fp8_c256_1000x1000_tok_s", "decode_moe30b_b1_fraction",
              "served_bf16_c256_1000x1000_rl_fields_tok_s"):
        assert rows[n]["value"] is None and rows[n]["reason"], n
    # a served run whose KV dtype is unknown has no roofline (rather than a guessed one)
    unknown = gpu_json.build(gc, [dict(sample_served(), kv_elem_bytes=None)], "", "a", "d")
    r = {x["name"]: x for x in unknown["rows"]}["served_bf16_c256_1000x1000_tok_s"]
    assert r["value"] == 1000.0 and r["fraction_of_roofline"] is None
    # without any input every required row is there, null with its reason
    empty = gpu_json.build(None, [], "NVIDIA H200", "abc", "d")
    assert gpu_json.check(empty) == [] and all(r["value"] is None for r in empty["rows"])
    assert {r["name"] for r in empty["rows"]} == set(gpu_json.REQUIRED)


def test_gpu_json_check_rejects():
    good = gpu_json.build(None, [], "NVIDIA H200", "abc", "d")
    assert gpu_json.check(good) == []

    def broken(f):
        d = json.loads(json.dumps(good))
        f(d)
        return gpu_json.check(d)
    assert broken(lambda d: d.update(extra=1))
    assert broken(lambda d: d.update(commit=""))
    assert broken(lambda d: d["rows"][0].pop("reason"))
    assert broken(lambda d: d["rows"].append(dict(d["rows"][0])))
    assert broken(lambda d: d["rows"][0].update(value=math.nan, reason="x"))
    assert broken(lambda d: d["rows"][0].update(value="12"))
    assert broken(lambda d: d["rows"][0].update(name="Bad Name"))
    assert broken(lambda d: d["rows"][0].pop("fraction_of_roofline"))
    assert broken(lambda d: d["rows"].pop(0))  # a required row missing
    assert gpu_json.gpu_slug("NVIDIA H200") == "h200" and gpu_json.gpu_slug("NVIDIA B200") == "b200"
