"""--help documents every flag sampler-cpu accepts, and accepts every flag it
documents; bad flag values are start-up errors that say what to fix."""
import json
import os
import re
import signal
import subprocess

from conftest import BUILD, ROOT


def test_help_lists_every_flag(sampler_bin):
    src = open(os.path.join(ROOT, "server/http/flags.c")).read()
    handled = set(re.findall(r'\.name = "(--[a-z0-9-]+)"', src))
    out = subprocess.run([sampler_bin, "--help"], capture_output=True, text=True, timeout=60).stdout
    documented = set(re.findall(r"^\s+(?:-h, )?(--[a-z0-9-]+)", out, re.M))
    assert handled and handled == documented, (handled ^ documented)


def test_bad_flags_are_clear_errors(sampler_bin):
    for args, words in ((["--port", "70000"], "--port"), (["--logprobs-mode", "odd"], "--logprobs-mode"),
                        (["--bogus", "1"], "--bogus"), (["--precision", "int4"], "--precision"),
                        (["--weight-version", "3"], "--model-fingerprint"),
                        (["--native-crossover", "70000"], "--native-crossover"),
                        (["--native-crossover", "-1"], "--native-crossover")):
        r = subprocess.run([sampler_bin] + args, capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and words in r.stderr, (args, r.stderr)


def test_port_in_use_is_a_clear_error():
    """A second sampler on a taken port fails at start-up instead of sharing it."""
    from server_fixture import Server
    s = Server()
    try:
        r = subprocess.run([os.environ.get("SAMPLER_BIN", os.path.join(BUILD, "sampler-cpu")), "--port",
                            str(s.port), "--kv-mem-mb", "64"], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "port" in r.stderr, r.stderr
    finally:
        s.stop()


def _help_rows(sampler_bin):
    """--help as {flag: (metavar or None, text, default or None)}."""
    out = subprocess.run([sampler_bin, "--help"], capture_output=True, text=True, timeout=60).stdout
    rows, cur = {}, None
    for line in out.splitlines():
        m = re.match(r"^  (?:-h, )?(--[a-z0-9-]+)(?: ([A-Z0-9,]+))?(?:\s+(.*))?$", line)
        if m:
            cur = m.group(1)
            rows[cur] = [m.group(2), m.group(3) or ""]
        elif cur and line.startswith(" " * 20):
            rows[cur][1] += " " + line.strip()
        else:
            cur = None
    parsed = {}
    for flag, (metavar, text) in rows.items():
        d = re.search(r"\(default: (.*)\)$", text)
        parsed[flag] = (metavar, text, d.group(1) if d else None)
    return parsed


def test_every_flag_in_help_is_accepted(sampler_bin, tmp_path):
    """Each flag --help lists parses with a value of its metavar (then --help
    stops before the model loads): no listed flag is unknown to the parser."""
    rows = _help_rows(sampler_bin)
    assert len(rows) > 40, rows
    sample = {"DIR": ROOT, "FILE": str(tmp_path / "f"), "NAME": "m", "HEX": "0123456789abcdef", "KEY": "k",
              "TOKEN": "t", "ADDR": "127.0.0.1", "IDS": "1,2,3", "N": "64", "S": "5"}
    for flag, (metavar, _, default) in rows.items():
        args = [flag]
        if metavar:
            first = default.split()[0] if default else ""
            # the printed default when it is a value (8000, bf16, info, raw_logprobs), else a value of the metavar's kind
            value = first if default and (first.isdigit() or default.replace("_", "").isalnum()) else sample[metavar]
            args.append(value)
        r = subprocess.run([sampler_bin] + args + ["--help"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout.startswith("usage:"), (args, r.stderr)


def test_help_defaults_are_the_defaults_used(sampler_bin, tmp_path):
    """The defaults --help prints are those the server runs with: the engine's
    start-up line (engine_create prints what it uses), the listening address,
    /v1/models, the request limits, the environment defaults of the API key and
    admin token, and the one-shot token count."""
    rows = _help_rows(sampler_bin)
    default = {f: d for f, (_, _, d) in rows.items()}
    num = lambda f: int(default[f].split()[0])
    env = dict(os.environ, SAMPLER_API_KEY="env-key", SAMPLER_ADMIN_TOKEN="env-admin")
    p = subprocess.Popen([sampler_bin, "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, cwd=ROOT)
    try:
        line = p.stdout.readline()
        assert line.startswith("listening on "), line + p.stderr.read()
        url = line.split()[2]
        assert url.startswith("http://%s:" % default["--host"]), (url, default["--host"])
        p.send_signal(signal.SIGTERM)  # the engine line is already out: read stderr to the end
        err = p.communicate(timeout=60)[1]
        assert p.returncode == 0, err
    finally:
        if p.poll() is None:
            p.kill()
    eng = dict(kv.split("=") for kv in re.search(r"engine: (.*)", err).group(1).split() if "=" in kv)
    assert int(eng["max_running_seqs"]) == num("--max-running-seqs")
    assert int(eng["max_batched_tokens"]) == num("--max-batched-tokens")
    assert int(eng["max_waiting"]) == num("--max-waiting")
    assert int(eng["block_size"]) == num("--block-size")
    assert eng["prefix_cache"] == "on" and "--no-prefix-cache" in rows
    assert eng["threads"] == "0" and default["--threads"] == "all cores" and "0: all cores" in rows["--threads"][1]
    cfg = json.load(open(os.path.join(ROOT, "models/tiny-qwen3/config.json")))
    # --kv-cache-dtype auto is the model's dtype, BF16 here (2 bytes an element), named in the engine line
    assert default["--kv-cache-dtype"] == "auto" and eng["kv_cache_dtype"] == "bfloat16"
    per_block = 2 * cfg["num_hidden_layers"] * num("--block-size") * cfg["num_key_value_heads"] * cfg["head_dim"] * 2
    assert default["--kv-blocks"] == "from --kv-mem-mb"
    assert int(eng["kv_blocks"]) == (num("--kv-mem-mb") << 20) // per_block
    cap = int(re.search(r"(\d+)", default["--max-model-len"]).group(1))  # "the least of ..., 4096 and the KV pool"
    assert int(eng["max_model_len"]) == min(cfg["max_position_embeddings"], cap, int(eng["kv_blocks"]) * num("--block-size"))
    assert "info" in err.split("engine:")[0] and default["--log-level"] == "info"  # info lines without --log-level
    assert default["--api-key"].startswith("env SAMPLER_API_KEY")
    assert default["--admin-token"].startswith("env SAMPLER_ADMIN_TOKEN")
    assert "API key required" in err and "admin endpoints on" in err

    # the request limits, on a server that starts with no limit flag
    from server_fixture import Server
    s = Server(api_key="k")
    try:
        h = {"Authorization": "Bearer k"}
        st, models = s.request("GET", "/v1/models", headers=h)
        assert st == 200 and models["data"][0]["max_model_len"] == min(cfg["max_position_embeddings"], cap)
        n, lp = num("--max-n"), num("--max-logprobs")
        for body, ok in (({"n": n}, 200), ({"n": n + 1}, 400), ({"logprobs": lp}, 200), ({"logprobs": lp + 1}, 400)):
            st, r = s.post("/v1/completions", dict(body, prompt="hi", max_tokens=1), headers=h)
            assert st == ok, (body, st, r)
        limit = num("--max-body-bytes")
        st, r = s.post("/v1/completions", None, raw=b" " * (limit + 1), headers=h)
        assert st == 413 and str(limit) in r["error"]["message"], r
        st, r = s.post("/v1/completions", None, raw=b" " * limit, headers=h)
        assert st == 400, (st, r)  # kept and parsed: blank is not JSON
        st, w = s.request("GET", "/admin/v1/weights", headers={"Authorization": "Bearer admin-secret"})
        assert st == 200 and w["version"] == num("--weight-version"), w
    finally:
        assert s.stop() == 0

    r = subprocess.run([sampler_bin, "--prompt-ids", "1,2,3", "--threads", "1"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    gen = next(l for l in out if l.startswith("generated:")).split()[1:]
    assert "finish: length" in out and len(gen) == num("--max-tokens"), out  # greedy on the tiny model: no EOS


def test_native_crossover_off_the_gpu_says_it_does_nothing(sampler_bin):
    """--native-crossover picks between two GPU paths of quantized-activation
    models: on the CPU backend it is accepted, changes nothing, and says so."""
    base = [sampler_bin, "--prompt-ids", "1,2,3", "--max-tokens", "2", "--threads", "1"]
    plain = subprocess.run(base, capture_output=True, text=True, timeout=120)
    r = subprocess.run(base + ["--native-crossover", "16"], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0 and r.returncode == 0, r.stderr
    assert "--native-crossover 16: no effect" in r.stderr, r.stderr
    assert "no effect" not in plain.stderr
    gen = lambda p: next(l for l in p.stdout.splitlines() if l.startswith("generated:"))
    assert gen(r) == gen(plain)


def test_device_sampling_on_needs_a_device(sampler_bin):
    """--device-sampling on is a start-up error on a backend that cannot sample
    on the device (the CPU), naming the fix; auto and off start (auto falls
    back to the host sampler: covered by every other server test)."""
    r = subprocess.run([sampler_bin, "--device-sampling", "on", "--port", "0", "--kv-mem-mb", "64"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "--device-sampling on" in r.stderr and "fix:" in r.stderr, r.stderr


def test_async_scheduling_needs_device_sampling(sampler_bin):
    """--async-scheduling (vLLM's flag) is a start-up error where tokens are not
    sampled on the device (the CPU backend), naming the fix; --no-async-scheduling
    starts and serves."""
    r = subprocess.run([sampler_bin, "--async-scheduling", "--port", "0", "--kv-mem-mb", "64"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "--async-scheduling" in r.stderr and "fix:" in r.stderr, r.stderr
    r = subprocess.run([sampler_bin, "--no-async-scheduling", "--prompt-ids", "1,2,3", "--threads", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "finish: length" in r.stdout, r.stderr
