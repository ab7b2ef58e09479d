#!/usr/bin/env python3
"""Served benchmark: sampler-smXX (or sampler-cpu) serving a model, loaded by
clients on the same machine; output tok/s, TTFT and ITL p50 / p99 per
configuration, and the share of the engine step spent outside the model.

    python3 bench/gpu_served.py --bin build-gpu/sampler-sm90 --json OUT.json   # the GPU run
    python3 bench/gpu_served.py --smoke --json OUT.json    # the same code, CPU binary, tiny sizes

What it does (tests/gpu/check.sh part 4 runs it; tests/py/test_served_bench.py runs --smoke):
  - model: unless --model DIR, a Qwen3-8B-shaped random BF16 checkpoint written by
    scripts/make_bench_model.py qwen3-8b (--jobs 9) into --model-cache (default
    /dev/shm/sampler-bench/qwen3-8b when /dev/shm has room, else /tmp/...); reused when it
    is complete (a marker file). --smoke serves the bundled models/tiny-qwen3.
  - one server per run (the binary's own flags for the load: --max-running-seqs and
    --max-step-rows at the largest concurrency, output budgets sized for the RL fields,
    --kv-cache-dtype from this script's option of that name, default bfloat16, whose bytes
    the roofline counts), started once, stopped with SIGTERM at the end (its exit status is
    reported). A server that dies during a configuration (a fault at that batch) costs that
    configuration only: its numbers are dropped (server_died, server_deaths with the end of
    its log) and a fresh server runs the rest while the budget allows (server_restarts).
  - configurations: shapes PROMPTxOUTPUT (1000x1000, 128x2048) x concurrency (1, 16, 64,
    256 sequences in flight) x RL fields off / on. Concurrency counts sequences: requests
    carry n = min(8, C) (RL groups of 8), C / n of them in flight, each slot closed-loop
    (a new request as soon as one ends). Prompts are random token ids (distinct per
    request: no prefix-cache hits; the n samples of a request share theirs, as RL groups
    do), sent token-in to /v1/completions (no tokenization variance), streamed,
    ignore_eos with max_tokens = OUTPUT and temperature 1 (so lengths are exact), with
    return_token_ids; RL fields on adds return_sampler_logprobs and return_sampling_mask
    (each chunk checked: one log-prob and one mask row per token id).
  - time box: each configuration runs for a fixed window (--window-s, longer at the
    largest concurrency); at its end the clients close their connections (the server
    aborts those requests) and the script waits for the engine to drain before the next.
    What completed is reported (requests sent / completed / cut at the window's end).
    The whole run has a budget (--budget-s, counted from the start, model writing and
    server start included): configurations are run in priority order (the rows issue
    17 names first) and those the budget leaves no time for are reported as not run.
  - numbers per configuration: tok_s = output tokens received in the window / window
    (ramp-up included, as a served number should); steady_tok_s = those of the window's
    second half / half the window; TTFT (request sent -> first token id of any of its
    choices) p50 / p99 over requests that got one; ITL (gaps between token-carrying
    chunks of one choice; a chunk of k ids counts k gaps of gap / k) p50 / p99; the
    server's own counters over the window from /metrics: generated tokens, steps, and
    the engine thread's step time by phase (sampler_step_*_seconds_total): host_share =
    1 - (forward + device_sample) / (step + control), the share of the engine thread's busy time spent
    outside the backend's forward call and the device sampler's launch and wait (which on the GPU hold the
    launches, the wait for the device and the logits copy); with async scheduling (the default on the GPU)
    the host's share overlaps the device's next step, so it bounds the GPU's idle share from above;
    async_steps counts the steps that overlapped.
    device_busy_share = the device's time on the steps sampled on the device (each from its first op to
    its sampled results, /metrics sampler_device_step_seconds_total: CUDA events on a GPU, the modeled
    device of bench/bench_host) / the window: 1 - it is the share the device waited for the host (null
    where the server does not measure it, the CPU).
Clients: --workers processes (default: up to 4), each an asyncio loop over raw HTTP/1.1
(bench/load.py's request()), so the client side is not what limits the rate.
Exit status: 0 when every configuration run had no client error and the server never died, 1 otherwise.
"""
import argparse
import asyncio
import json
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import load  # noqa: E402  (bench/load.py: raw HTTP/1.1 + SSE client)

STEP_KEYS = ("step", "schedule", "forward", "sample", "device_sample", "publish", "control")
VOCAB_LO, VOCAB_HI = 1000, 150000  # prompt ids: ordinary tokens of the Qwen3 vocabulary


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


# ---- the server ----

def read_metrics(url):
    """/metrics as {name: float} (unlabelled rows only)."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            try:
                out[k] = float(v)
            except ValueError:
                pass
    return out


def metrics_delta(m0, m1, window_s):
    d = {k: m1.get(f"sampler_step_{k}_seconds_total" if k != "step" else "sampler_step_seconds_total", 0.0) -
         m0.get(f"sampler_step_{k}_seconds_total" if k != "step" else "sampler_step_seconds_total", 0.0)
         for k in STEP_KEYS}
    gen = "sampler_generation_tokens_total"
    out = {"generated_tokens": m1.get(gen, 0) - m0.get(gen, 0),
           "steps": m1.get("sampler_engine_steps_total", 0) - m0.get("sampler_engine_steps_total", 0),
           "preemptions": m1.get("sampler_preemptions_total", 0) - m0.get("sampler_preemptions_total", 0),
           "async_steps": m1.get("sampler_async_steps_total", 0) - m0.get("sampler_async_steps_total", 0),
           "step_seconds": d}
    for k, name in (("forward_calls", "sampler_model_forward_calls_total"),
                    ("full_graph_calls", "sampler_model_forward_full_graph_calls_total"),
                    ("piecewise_graph_calls", "sampler_model_forward_piecewise_graph_calls_total")):
        out[k] = m1.get(name, 0) - m0.get(name, 0)
    dev = m1.get("sampler_device_step_seconds_total", 0.0) - m0.get("sampler_device_step_seconds_total", 0.0)
    out["device_step_seconds"] = dev
    out["device_busy_share"] = dev / window_s if dev > 0 and window_s > 0 else None
    busy = d["step"] + d["control"]
    out["host_share"] = 1.0 - (d["forward"] + d["device_sample"]) / busy if busy > 0 else None
    out["phase_shares"] = {k: d[k] / busy for k in STEP_KEYS if k != "step"} if busy > 0 else None
    out["ms_per_step"] = 1e3 * d["step"] / out["steps"] if out["steps"] else None
    out["forward_ms_per_step"] = 1e3 * d["forward"] / out["steps"] if out["steps"] else None
    return out


KV_DTYPES = ("bfloat16", "fp8", "fp8_e4m3", "float32")  # the server's --kv-cache-dtype values, auto aside


def kv_elem_bytes(dtype, config):
    """Bytes a --kv-cache-dtype cache stores per K or V element, its scales spread over the elements
    (include/kernels/kv_dtype.h: fp8 = e4m3 with one f32 scale per position and KV head), for the
    roofline bench/gpu_json.py computes."""
    hd = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return {"float32": 4.0, "bfloat16": 2.0, "fp8": 1.0 + 4.0 / hd, "fp8_e4m3": 1.0 + 4.0 / hd}[dtype]


class ServerProc:
    def __init__(self, cmd, start_timeout):
        self.cmd = cmd
        t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        self.log = []
        self._err = threading.Thread(target=self._drain, daemon=True)
        self._err.start()
        line = [None]

        def first_line():
            line[0] = self.proc.stdout.readline()
        t = threading.Thread(target=first_line, daemon=True)
        t.start()
        t.join(start_timeout)
        if not line[0] or not line[0].startswith("listening on "):
            self.proc.kill()
            self.proc.wait()
            self._err.join(5)
            raise RuntimeError(f"server did not start within {start_timeout} s: {line[0]!r}\n" +
                               "".join(self.log[-20:]))
        self.url = line[0].split()[2].strip()
        hp = self.url.rsplit("/", 1)[1]
        self.host, port = hp.rsplit(":", 1)
        self.port = int(port)
        self.start_s = time.monotonic() - t0

    def _drain(self):
        for l in self.proc.stderr:
            self.log.append(l)

    def stop(self, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        return self.proc.returncode

    def wait_idle(self, timeout):
        """Poll /metrics until nothing runs or waits; True when drained."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            m = read_metrics(self.url)
            if m.get("sampler_num_requests_running", 1) == 0 and m.get("sampler_num_requests_waiting", 1) == 0:
                return True
            time.sleep(0.1)
        return False


# ---- the clients ----

class ReqStats:
    """One request's stream, as far as it got (cancellation keeps what arrived)."""
    __slots__ = ("t_sent", "t_first", "last", "itl", "tokens", "late", "bad")

    def __init__(self, n):
        self.t_sent = time.monotonic()
        self.t_first = None
        self.last = [None] * n   # last token time per choice
        self.itl = []
        self.tokens = []         # arrival time of each token-carrying chunk, repeated per id
        self.late = 0
        self.bad = None


def make_body(cfg, prompt):
    b = {"prompt": prompt, "max_tokens": cfg["output"], "n": cfg["n"], "stream": True, "ignore_eos": True,
         "temperature": 1.0, "top_p": 1.0, "return_token_ids": True}
    if cfg["rl"]:
        b["return_sampler_logprobs"] = True
        b["return_sampling_mask"] = True
    return b


def on_event_for(st, rl):
    def on_event(res, obj):
        if "error" in obj:
            raise ValueError(f"error event: {obj['error']}")
        t = time.monotonic()
        for ch in obj.get("choices", []):
            ids = ch.get("token_ids") or []
            if not ids:
                continue
            if rl:
                lp, mask = ch.get("sampler_logprobs"), ch.get("sampling_mask")
                if lp is None or len(lp) != len(ids) or not mask or mask.get("n_tokens") != len(ids):
                    st.bad = f"RL fields missing or of the wrong length in a chunk of {len(ids)} ids"
            i = ch.get("index", 0)
            if st.t_first is None:
                st.t_first = t
            prev = st.last[i]
            if prev is not None:
                g = (t - prev) / len(ids)
                st.itl.extend([g] * len(ids))
            st.last[i] = t
            st.tokens.extend([t] * len(ids))
    return on_event


async def _slot(host, port, cfg, rng, t_end, out):
    while time.monotonic() < t_end:
        prompt = [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(cfg["prompt"])]
        st = ReqStats(cfg["n"])
        out["sent"] += 1
        try:
            res = await asyncio.wait_for(
                load.request(host, port, "/v1/completions", make_body(cfg, prompt), on_event_for(st, cfg["rl"]),
                             timeout=3600),
                max(0.01, t_end - time.monotonic()))
        except asyncio.TimeoutError:
            out["cut"] += 1
            res = None
        out["reqs"].append(st)
        if res is not None and st.tokens and st.tokens[-1] > t_end:
            out["cut"] += 1  # ended after the window (the timer fired late): counted as cut, like its tokens
            res = None
        if res is None:
            break
        err = res.error or st.bad
        if not err and res.status != 200:
            err = f"status {res.status}: {res.body[:300]!r}"
        if not err and len(st.tokens) != cfg["n"] * cfg["output"]:
            err = f"{len(st.tokens)} token ids streamed, want {cfg['n'] * cfg['output']}"
        if err:
            out["errors"].append(err)
            await asyncio.sleep(0.05)  # a refusing server must not be hammered in a loop
        else:
            out["completed"] += 1


def _worker(host, port, cfg, slots, seed, t_start, t_end, conn):
    async def main():
        while time.monotonic() < t_start:
            await asyncio.sleep(min(0.01, t_start - time.monotonic()))
        out = {"sent": 0, "completed": 0, "cut": 0, "errors": [], "reqs": []}
        rngs = [random.Random(seed * 1000003 + i) for i in range(slots)]
        await asyncio.gather(*[_slot(host, port, cfg, r, t_end, out) for r in rngs])
        return out
    out = asyncio.run(main())
    half = t_start + (t_end - t_start) / 2
    reqs = out.pop("reqs")
    conn.send({
        "sent": out["sent"], "completed": out["completed"], "cut": out["cut"],
        "errors": out["errors"][:5], "n_errors": len(out["errors"]),
        "ttft": [r.t_first - r.t_sent for r in reqs if r.t_first is not None],
        "itl": [g for r in reqs for g in r.itl],
        "tokens": sum(1 for r in reqs for t in r.tokens if t <= t_end),
        "tokens_2nd_half": sum(1 for r in reqs for t in r.tokens if half <= t <= t_end),
    })
    conn.close()


def run_config(srv, cfg, window_s, n_workers, seed, kill_at=None):
    slots = max(1, cfg["concurrency"] // cfg["n"])
    n_workers = max(1, min(n_workers, slots))
    per = [slots // n_workers + (1 if i < slots % n_workers else 0) for i in range(n_workers)]
    ctx = multiprocessing.get_context("fork")
    t_start = time.monotonic() + 0.3  # the workers' fork and import before the window opens
    t_end = t_start + window_s
    procs, pipes = [], []
    for i, k in enumerate(per):
        a, b = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_worker, args=(srv.host, srv.port, cfg, k, seed + i, t_start, t_end, b), daemon=True)
        p.start()
        procs.append(p)
        pipes.append(a)
    while time.monotonic() < t_start:
        time.sleep(0.005)
    m0 = read_metrics(srv.url)
    t_m0 = time.monotonic()
    while time.monotonic() < t_end:
        if kill_at is not None and time.monotonic() >= t_start + kill_at * window_s and srv.proc.poll() is None:
            srv.proc.kill()  # the planted death of the CPU test (--kill-server-during)
        time.sleep(min(0.05, max(0.0, t_end - time.monotonic())))
    try:
        m1 = read_metrics(srv.url)
        t_m1 = time.monotonic()
    except OSError:  # the server died during the window: what the clients saw is kept, the counters are not
        m1 = None
    parts = []
    for p, a in zip(procs, pipes):
        parts.append(a.recv() if a.poll(120) else {"sent": 0, "completed": 0, "cut": 0, "errors": ["worker hung"],
                                                    "n_errors": 1, "ttft": [], "itl": [], "tokens": 0,
                                                    "tokens_2nd_half": 0})
        p.join(10)
    died = srv.proc.poll()
    drained = died is None and srv.wait_idle(60)
    ttft = [x for q in parts for x in q["ttft"]]
    itl = [x for q in parts for x in q["itl"]]
    tokens = sum(q["tokens"] for q in parts)
    r = dict(cfg)
    r.update({
        "window_s": window_s, "slots": slots, "workers": n_workers,
        "requests_sent": sum(q["sent"] for q in parts), "requests_completed": sum(q["completed"] for q in parts),
        "requests_cut": sum(q["cut"] for q in parts), "n_errors": sum(q["n_errors"] for q in parts),
        "errors": [e for q in parts for e in q["errors"]][:5],
        "tokens": tokens, "tok_s": tokens / window_s,
        "steady_tok_s": sum(q["tokens_2nd_half"] for q in parts) / (window_s / 2),
        "ttft_n": len(ttft), "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99),
        "itl_n": len(itl), "itl_p50_s": pct(itl, 50), "itl_p99_s": pct(itl, 99),
        "server": metrics_delta(m0, m1, t_m1 - t_m0) if m1 is not None else {
            "host_share": None, "ms_per_step": None, "forward_ms_per_step": None, "device_busy_share": None},
        "drained": drained, "server_died": died,
    })

    return r


# ---- the plan ----

def config_name(c):
    return f"c{c['concurrency']}_{c['prompt']}x{c['output']}" + ("_rl_fields" if c["rl"] else "")


def plan(shapes, concs, n_max, rl_modes):
    """Every configuration, the rows issue 17 names first, then by shape, concurrency."""
    cfgs = [{"prompt": p, "output": o, "concurrency": c, "n": min(n_max, c), "rl": rl}
            for (p, o) in shapes for c in concs for rl in rl_modes]
    big, first_shape = max(concs), shapes[0]

    def prio(c):
        s = (c["prompt"], c["output"]) == first_shape
        if s and c["concurrency"] == big and not c["rl"]:
            return 0
        if s and c["concurrency"] == big and c["rl"]:
            return 1
        if s and c["concurrency"] == min(concs) and not c["rl"]:
            return 2
        return 3 + shapes.index((c["prompt"], c["output"])) * 2 + (1 if c["rl"] else 0)
    return sorted(cfgs, key=lambda c: (prio(c), c["concurrency"]))


def ensure_model(cache, layers, log):
    """The Qwen3-8B-shaped checkpoint at cache (written once; a marker says it is complete)."""
    marker = os.path.join(cache, ".complete")
    want = f"qwen3-8b layers={layers}"
    if os.path.exists(marker) and open(marker).read().strip() == want:
        log(f"model: reusing {cache}")
        return 0.0
    shutil.rmtree(cache, ignore_errors=True)
    t0 = time.monotonic()
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "make_bench_model.py"), "qwen3-8b", cache, "--jobs", "9",
           "--no-verify"]
    if layers:
        cmd += ["--layers", str(layers)]
    subprocess.run(cmd, check=True)
    with open(marker, "w") as f:
        f.write(want + "\n")
    dt = time.monotonic() - t0
    log(f"model: wrote {cache} in {dt:.1f} s")
    return dt


def default_cache():
    try:
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize > 24 << 30:
            return "/dev/shm/sampler-bench/qwen3-8b"
    except OSError:
        pass
    return "/tmp/sampler-bench/qwen3-8b"


def server_cmd(a, concs, shapes, n_max):
    cmd = [a.bin, "--port", "0", "--host", "127.0.0.1", "--log-level", "warn"]
    if a.model_dir:
        cmd += ["--model", a.model_dir]
    if a.precision != "bf16":
        cmd += ["--precision", a.precision]
    big = max(concs)
    max_len = max(p + o for p, o in shapes)
    # RL fields reserve at most a mask bitmap of ceil(vocab / 32) words per output token at
    # submit (engine_request_output_bytes): size both output budgets for the largest case
    mask_mb = ((151936 + 31) // 32) * 4 * max(o for _, o in shapes) // (1 << 20) + 1
    per_req_mb = n_max * (mask_mb + 64)
    cmd += ["--max-running-seqs", str(big), "--max-step-rows", str(big), "--max-model-len", str(max_len),
            "--max-request-output-mb", str(per_req_mb), "--max-output-mem-mb", str(per_req_mb * (big // n_max + 1)),
            "--max-waiting", str(4 * big)]
    if a.kv_mem_mb:
        cmd += ["--kv-mem-mb", str(a.kv_mem_mb)]
    cmd += ["--kv-cache-dtype", a.kv_cache_dtype]
    cmd += a.server_args.split()
    return cmd


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", help="the server binary (default: build-gpu-check/sampler-sm90; "
                                  "--smoke: build/sampler-cpu)")
    ap.add_argument("--model", dest="model_dir",
                    help="serve this model directory (default: write the Qwen3-8B-shaped one)")
    ap.add_argument("--model-cache", help="where the Qwen3-8B-shaped checkpoint is written / reused")
    ap.add_argument("--layers", type=int, default=0, help="fewer layers in the written checkpoint (quick runs only)")
    ap.add_argument("--shapes", default="1000x1000,128x2048", help="PROMPTxOUTPUT,...")
    ap.add_argument("--concurrency", default="1,16,64,256", help="sequences in flight, comma-separated")
    ap.add_argument("--n", type=int, default=8, help="samples per request (RL group size)")
    ap.add_argument("--rl", default="off,on", help="RL fields: off,on | off | on")
    ap.add_argument("--window-s", type=float, default=8.0, help="time box of one configuration")
    ap.add_argument("--window-big-s", type=float, default=20.0, help="time box at the largest concurrency")
    ap.add_argument("--budget-s", type=float, default=240.0, help="the whole run, model and server start included")
    ap.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1),
                    help="client processes (few: the server samples on the same cores)")
    ap.add_argument("--kv-mem-mb", type=int, default=None, help="server KV pool (default 90000; --smoke 64)")
    ap.add_argument("--precision", default="bf16", help="the server's --precision (row names carry it)")
    ap.add_argument("--kv-cache-dtype", default="bfloat16", choices=KV_DTYPES,
                    help="the server's --kv-cache-dtype, passed explicitly so that the roofline counts the KV bytes "
                         "it stores (default bfloat16, what auto resolves to for these checkpoints)")
    ap.add_argument("--server-args", default="", help="more server flags (not --kv-cache-dtype: the option above)")
    ap.add_argument("--tag", default="", help="a word the rows' names carry after the precision (e.g. sync for a "
                                              "run with --server-args --no-async-scheduling)")
    ap.add_argument("--start-timeout", type=float, default=180.0)
    ap.add_argument("--gpu", default="", help="the GPU's name, recorded in the JSON")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="CPU binary, bundled tiny model, tiny sizes (the CI test)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--kill-server-during", default="", metavar="CONFIG",
                    help="for the CPU test only: SIGKILL the server halfway through this configuration's window "
                         "(the run must restart it and go on)")
    a = ap.parse_args()
    t_run = time.monotonic()
    if a.smoke:
        a.bin = a.bin or os.path.join(ROOT, "build", "sampler-cpu")
        if a.shapes == ap.get_default("shapes"):
            a.shapes = "16x6,8x10"
        if a.concurrency == ap.get_default("concurrency"):
            a.concurrency = "1,4"
        a.n = min(a.n, 2)
        a.window_s = min(a.window_s, 1.0)
        a.window_big_s = min(a.window_big_s, 1.5)
        a.budget_s = min(a.budget_s, 25.0)
        a.workers = min(a.workers, 2)
        a.kv_mem_mb = a.kv_mem_mb or 64
        a.server_args = (a.server_args + " --threads 1").strip()
    else:
        a.bin = a.bin or os.path.join(ROOT, "build-gpu-check", "sampler-sm90")
        a.kv_mem_mb = a.kv_mem_mb or 90000
    if "--kv-cache-dtype" in a.server_args.split():
        ap.error("--server-args must not set --kv-cache-dtype: use this script's --kv-cache-dtype (the roofline "
                 "counts its bytes)")
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    concs = [int(x) for x in a.concurrency.split(",")]
    rl_modes = [{"off": False, "on": True}[x] for x in a.rl.split(",")]

    def log(msg):
        print(f"[{time.monotonic() - t_run:6.1f} s] {msg}", flush=True)

    out = {"mode": "smoke" if a.smoke else "gpu", "gpu": a.gpu, "binary": os.path.basename(a.bin),
           "precision": a.precision, "tag": a.tag, "kv_cache_dtype": a.kv_cache_dtype, "kv_elem_bytes": None,
           "shapes": [f"{p}x{o}" for p, o in shapes], "concurrency": concs, "n": a.n, "budget_s": a.budget_s,
           "model": None, "model_write_s": 0.0, "server_start_s": None, "server_exit": None, "configs": [],
           "not_run": [], "server_deaths": [], "server_restarts": 0}
    rc = 0
    srv = None

    def on_term(signum, frame):
        raise SystemExit(128 + signum)  # through the finally below: the server is stopped, the JSON written
    signal.signal(signal.SIGTERM, on_term)
    try:
        if not a.smoke and not a.model_dir:
            cache = a.model_cache or default_cache()
            out["model_write_s"] = ensure_model(cache, a.layers, log)
            a.model_dir = cache
        out["model"] = a.model_dir or "models/tiny-qwen3"
        with open(os.path.join(a.model_dir or os.path.join(ROOT, "models", "tiny-qwen3"), "config.json")) as f:
            c = json.load(f)
        out["model_config"] = {k: c.get(k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                     "num_attention_heads", "num_key_value_heads", "head_dim",
                                                     "vocab_size", "tie_word_embeddings")}
        cmd = server_cmd(a, concs, shapes, a.n)
        out["server_cmd"] = " ".join(cmd)
        log("server: " + out["server_cmd"])
        srv = ServerProc(cmd, a.start_timeout)
        out["server_start_s"] = srv.start_s
        log(f"server: listening on {srv.url} after {srv.start_s:.1f} s")
        out["kv_elem_bytes"] = kv_elem_bytes(a.kv_cache_dtype, c)
        for i, cfg in enumerate(plan(shapes, concs, a.n, rl_modes)):
            name = config_name(cfg)
            w = a.window_big_s if cfg["concurrency"] == max(concs) else a.window_s
            left = a.budget_s - (time.monotonic() - t_run)
            if srv.proc.poll() is not None:
                # the server died in the last configuration (a fault at that batch, say): a fresh one
                # for the rest, when the budget holds its start and this window
                if left < srv.start_s + w + 3:
                    out["not_run"].append({"name": name, "reason": "the server died and no time is left to "
                                           "restart it"})
                    continue
                srv.stop()
                log("server: restarting after its death")
                srv = ServerProc(cmd, a.start_timeout)
                out["server_restarts"] += 1
                left = a.budget_s - (time.monotonic() - t_run)
            if left < w + 3:
                out["not_run"].append({"name": name, "reason": f"time budget ({a.budget_s:.0f} s) spent"})
                continue
            r = run_config(srv, cfg, w, a.workers, a.seed + 100 * i,
                           0.5 if name == a.kill_server_during else None)
            r["name"] = name
            out["configs"].append(r)
            sv = r["server"]
            hs = f"{100 * sv['host_share']:.1f}%" if sv["host_share"] is not None else "-"
            if sv.get("device_busy_share") is not None:
                hs += f"  device busy {100 * sv['device_busy_share']:.1f}%"
            log(f"{name:28s} {r['tok_s']:9.1f} tok/s (steady {r['steady_tok_s']:.1f})  TTFT p50 "
                f"{fmt_s(r['ttft_p50_s'])} p99 {fmt_s(r['ttft_p99_s'])}  ITL p50 {fmt_s(r['itl_p50_s'])} p99 "
                f"{fmt_s(r['itl_p99_s'])}  host {hs}  req {r['requests_completed']}/{r['requests_sent']} "
                f"done, {r['requests_cut']} cut, {r['n_errors']} errors")
            for e in r["errors"]:
                log(f"  error: {e}")
            if r["n_errors"]:
                rc = 1
            if r["server_died"] is not None:
                log(f"  the server died during {name} (exit {r['server_died']}); its log's end:")
                for l in srv.log[-10:]:
                    log("    " + l.rstrip())
                out["server_deaths"].append({"during": name, "exit": r["server_died"],
                                             "log_tail": "".join(srv.log[-20:])})
                rc = 1
            elif not r["drained"]:
                log("  the engine did not drain in 60 s: stopping here")
                rc = 1
                break
    except Exception as e:  # noqa: BLE001 - reported in the JSON, exit 1
        out["error"] = f"{type(e).__name__}: {e}"
        log("error: " + out["error"])
        rc = 1
    except SystemExit as e:
        out["error"] = f"terminated (exit {e.code}) during the run"
        log("error: " + out["error"])
        rc = e.code
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if srv is not None:
            out["server_exit"] = srv.stop()
            if out["server_exit"] != 0:
                out["server_log_tail"] = "".join(srv.log[-20:])
                rc = rc or 1
        out["wall_s"] = time.monotonic() - t_run
        log(f"served bench: {len(out['configs'])} configurations run, {len(out['not_run'])} not run, "
            f"server exit {out['server_exit']}, {out['wall_s']:.1f} s")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
                f.write("\n")
    return rc


def fmt_s(x):
    return "-" if x is None else f"{1e3 * x:.1f} ms"


if __name__ == "__main__":
    sys.exit(main())
