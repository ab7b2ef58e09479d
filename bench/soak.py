#!/usr/bin/env python3
"""Soak over loopback: a mixed workload for --minutes with the server's
resident memory sampled, which must stay flat after warm-up.

    python3 bench/soak.py [--minutes 60] [--workers 16] [--delta-every 60]
        [--bin build/sampler-cpu] [--trainer build/trainer] [--server-args "--kv-mem-mb 64"]
        [--warmup-frac 0.25] [--max-growth-mb 16] [--json OUT]

It starts the server (bundled model, KV pool --kv-mem-mb 64 so the pool is
fully touched during warm-up and RSS then measures leaks, not first use).
Workers loop over: short prompts (whole answer), long prompts (~1,500 token
ids, streamed), n = 4, chat, streams cancelled after a few events, whole
requests cancelled before the answer, and /tokenize. Every answer is
checked (status, usage, [DONE]); 503 is counted, anything else is an error.
Every --delta-every seconds a delta is applied: the checkpoint alternates
between the bundled model and a copy with moved weights, versions ascend
(0 -> 1 -> 2 ...), made with `trainer diff` and sent alternately with
`trainer push` and a direct POST; each must answer 200 with the new version.
RSS (VmRSS of /proc/PID/status) every --sample-every seconds. After the run:
first / last / max RSS, the least-squares slope after warm-up (MB/hour), and
the growth between the first and last tenth of the post-warm-up samples;
exit 1 if that growth is over --max-growth-mb, on any error, or if the
server is not idle afterwards or does not exit 0 on SIGTERM.
"""
import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import load  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "models/tiny-qwen3")
ADMIN = "soak-admin"


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def bump(src, dst):
    shutil.copytree(src, dst)
    path = os.path.join(dst, "model.safetensors")
    raw = bytearray(open(path, "rb").read())
    n = int.from_bytes(raw[:8], "little")
    hdr = json.loads(raw[8:8 + n])
    for name in ("model.norm.weight", "model.layers.0.mlp.down_proj.weight"):
        b, e = hdr[name]["data_offsets"]
        a = np.frombuffer(raw, dtype=np.uint16, count=(e - b) // 2, offset=8 + n + b).copy()
        a[::7] += 200
        raw[8 + n + b:8 + n + e] = a.tobytes()
    open(path, "wb").write(raw)


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}
        self.errors = []

    def add(self, kind, err=None):
        with self.lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            if err:
                self.errors.append(f"{kind}: {err}")


def metrics(host, port):
    import http.client
    c = http.client.HTTPConnection(host, port, timeout=60)
    c.request("GET", "/metrics")
    out = {}
    for line in c.getresponse().read().decode().splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    c.close()
    return out


async def one(host, port, rng, stats):
    kind = rng.choice(["short", "short", "long_stream", "n4", "chat", "chat_stream", "cancel_stream",
                       "cancel_whole", "tokenize"])
    if kind == "short":
        mt = rng.randint(1, 16)
        r = await load.request(host, port, "/v1/completions", {"prompt": "The quick brown fox " * rng.randint(1, 8),
                                                                "max_tokens": mt, "ignore_eos": True})
        check_whole(stats, kind, r, lambda o: o["usage"]["completion_tokens"] == mt)
    elif kind == "long_stream":
        ids = [rng.randrange(1000, 150000) for _ in range(rng.randint(1000, 2000))]
        body = {"prompt": ids, "max_tokens": 24, "ignore_eos": True, "stream": True, "return_token_ids": True,
                "return_sampler_logprobs": True, "stream_options": {"include_usage": True}}
        r = await load.request(host, port, "/v1/completions", body, load._stream_event)
        classify(stats, kind, r, load.check(r, 24, len(ids)))
    elif kind == "n4":
        r = await load.request(host, port, "/v1/completions", {"prompt": [9707, 11, 1879], "n": 4, "max_tokens": 8,
                                                                "ignore_eos": True, "return_token_ids": True})
        check_whole(stats, kind, r, lambda o: len(o["choices"]) == 4 and o["usage"]["completion_tokens"] == 32)
    elif kind in ("chat", "chat_stream"):
        body = {"messages": [{"role": "user", "content": "Tell me a story " * rng.randint(1, 20)}],
                "max_tokens": 12, "ignore_eos": True, "stream": kind == "chat_stream",
                "stream_options": {"include_usage": True}}
        if kind == "chat":
            r = await load.request(host, port, "/v1/chat/completions", body)
            check_whole(stats, kind, r, lambda o: o["usage"]["completion_tokens"] == 12)
        else:
            r = await load.request(host, port, "/v1/chat/completions", body, load._stream_event)
            ok = r.error is None and r.status == 200 and r.done and (r.usage or {}).get("completion_tokens") == 12
            classify(stats, kind, r, "ok" if ok else ("rejected" if r.status == 503 else "error"))
    elif kind == "cancel_stream":
        # read a few events, then go away
        reader, writer = await asyncio.open_connection(host, port)
        data = json.dumps({"prompt": "abc", "max_tokens": 500, "ignore_eos": True, "stream": True}).encode()
        writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        got = b""
        try:
            while got.count(b"data: ") < rng.randint(1, 4):
                b = await asyncio.wait_for(reader.read(65536), 120)
                if not b:
                    break
                got += b
        finally:
            writer.close()
        stats.add(kind if got.startswith(b"HTTP/1.1 200") or got.startswith(b"HTTP/1.1 503") else kind + "_odd")
    elif kind == "cancel_whole":
        reader, writer = await asyncio.open_connection(host, port)
        data = json.dumps({"prompt": "abc", "max_tokens": 400, "ignore_eos": True}).encode()
        writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        await writer.drain()
        await asyncio.sleep(rng.uniform(0.05, 0.5))
        writer.close()
        stats.add(kind)
    else:
        r = await load.request(host, port, "/tokenize", {"prompt": "hello world " * rng.randint(1, 50)})
        check_whole(stats, kind, r, lambda o: o["count"] > 0)


def classify(stats, kind, r, k):
    if k == "ok":
        stats.add(kind)
    elif k == "rejected":
        stats.add("rejected_503")
    else:
        stats.add(kind + "_error", r.error or f"status {r.status}")


def check_whole(stats, kind, r, pred):
    if r.error is None and r.status == 200:
        try:
            ok = pred(json.loads(r.body))
        except Exception as e:  # noqa: BLE001
            ok, r.error = False, repr(e)
        classify(stats, kind, r, "ok" if ok else "error")
    elif r.error is None and r.status == 503:
        stats.add("rejected_503")
    else:
        stats.add(kind + "_error", r.error or f"status {r.status}: {r.body[:200]!r}")


async def workers(host, port, n, until, stats, seed):
    async def worker(i):
        rng = random.Random(seed * 1000 + i)
        while time.monotonic() < until:
            try:
                await one(host, port, rng, stats)
            except Exception as e:  # noqa: BLE001
                stats.add("client_error", repr(e))
    await asyncio.gather(*[worker(i) for i in range(n)])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--delta-every", type=float, default=60)
    ap.add_argument("--sample-every", type=float, default=5)
    ap.add_argument("--warmup-frac", type=float, default=0.25)
    ap.add_argument("--max-growth-mb", type=float, default=16)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/sampler-cpu"))
    ap.add_argument("--trainer", default=os.path.join(ROOT, "build/trainer"))
    ap.add_argument("--server-args", default="--kv-mem-mb 64")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="also write the numbers and RSS samples here")
    a = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="soak-")
    other = os.path.join(tmp, "b")
    bump(TINY, other)
    fp = json.loads(subprocess.run([a.trainer, "fingerprint", TINY], capture_output=True, text=True,
                                   check=True).stdout)["model_fingerprint"]
    proc, host, port = load.start_server(a.bin, ["--admin-token", ADMIN] + a.server_args.split())
    stats = Stats()
    samples = []  # (seconds since start, RSS MB)
    deltas = []   # (seconds, version, how, seconds to apply)
    t_start = time.monotonic()
    until = t_start + a.minutes * 60
    stop = threading.Event()

    def sampler():
        while not stop.is_set():
            samples.append((time.monotonic() - t_start, rss_mb(proc.pid)))
            stop.wait(a.sample_every)

    def updater():
        version = 0
        while not stop.wait(a.delta_every):
            src, dst = (TINY, other) if version % 2 == 0 else (other, TINY)
            out = os.path.join(tmp, f"{version + 1}.delta")
            cmd = [a.trainer, "diff", src, dst, "-o", out, "--base-version", str(version),
                   "--target-version", str(version + 1)] + (["--fingerprint", fp] if version else [])
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                stats.add("delta_error", r.stderr[-300:])
                continue
            t = time.monotonic()
            if version % 2 == 0:
                how = "trainer push"
                r = subprocess.run([a.trainer, "push", out, "--to", f"http://{host}:{port}", "--admin-token", ADMIN],
                                   capture_output=True, text=True)
                ok = r.returncode == 0
                err = r.stderr[-300:]
            else:
                how = "POST"
                res = asyncio.run(load.request(host, port, "/admin/v1/weights/delta", open(out, "rb").read(),
                                               headers={"Authorization": "Bearer " + ADMIN}))
                ok = res.status == 200 and json.loads(res.body).get("version") == version + 1
                err = res.error or res.body[:300]
            took = time.monotonic() - t
            os.unlink(out)
            if not ok:
                stats.add("delta_error", f"{how}: {err}")
                continue
            version += 1
            m = metrics(host, port)
            if m["sampler_weight_version"] != version:
                stats.add("delta_error", f"weight version {m['sampler_weight_version']} after applying {version}")
            deltas.append((time.monotonic() - t_start, version, how, took))
            stats.add("delta")

    threads = [threading.Thread(target=sampler, daemon=True), threading.Thread(target=updater, daemon=True)]
    for t in threads:
        t.start()
    try:
        asyncio.run(workers(host, port, a.workers, until, stats, a.seed))
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    samples.append((time.monotonic() - t_start, rss_mb(proc.pid)))
    # idle afterwards
    idle_ok, m = False, {}
    for _ in range(200):
        m = metrics(host, port)
        if m["sampler_num_requests_running"] == 0 and m["sampler_num_requests_waiting"] == 0 and \
                m["sampler_kv_blocks_used"] == 0 and m["sampler_inflight_requests"] == 0:
            idle_ok = True
            break
        time.sleep(0.1)
    rc = load.stop_server(proc)
    shutil.rmtree(tmp, ignore_errors=True)

    t = np.array([s[0] for s in samples])
    r = np.array([s[1] for s in samples])
    post = t >= a.warmup_frac * (t[-1] if len(t) else 0)
    tp, rp = t[post], r[post]
    slope = float(np.polyfit(tp / 3600.0, rp, 1)[0]) if len(tp) >= 3 else float("nan")
    k = max(1, len(rp) // 10)
    growth = float(np.mean(rp[-k:]) - np.mean(rp[:k])) if len(rp) else float("nan")
    total = sum(v for kk, v in stats.counts.items() if not kk.endswith("_error"))
    print(f"soak {a.minutes:g} min, {a.workers} workers, {len(deltas)} deltas (every {a.delta_every:g} s)")
    print("requests:", json.dumps(dict(sorted(stats.counts.items()))), f"(total {total})")
    print(f"errors {len(stats.errors)}; idle afterwards {idle_ok}; exit code after SIGTERM {rc}")
    for e in stats.errors[:10]:
        print("  error:", e)
    print(f"RSS MB: first {r[0]:.1f}  at warm-up end {rp[0]:.1f}  last {r[-1]:.1f}  max {r.max():.1f}")
    print(f"after warm-up ({a.warmup_frac:.0%} of the run, {len(rp)} samples): slope {slope:+.2f} MB/hour, "
          f"growth first->last tenth {growth:+.2f} MB (limit {a.max_growth_mb:g})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"minutes": a.minutes, "workers": a.workers, "counts": stats.counts, "errors": stats.errors,
                       "deltas": deltas, "rss": samples, "slope_mb_per_h": slope, "growth_mb": growth,
                       "idle": idle_ok, "exit_code": rc}, f, indent=1)
    bad = stats.errors or not idle_ok or rc != 0 or not (growth <= a.max_growth_mb)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
