#!/usr/bin/env python3
"""Fleet benchmark on loopback (models/tiny-qwen3): how long one `trainer
push` takes to bring N samplers to a new version and how many bytes the
trainer sends, how long catching up a replica that missed k deltas takes,
and the latency vllm-router and sglang-router add per request. Prints
markdown tables (bench/RESULTS.md, "Fleets").

  python3 bench/fleet.py [--build build] [--fleets 3,30] [--requests 200] [--kv-mem-mb 16]

Push: N samplers (--threads 1), a chain of deltas of the tiny model
(tests/py/fleet_ckpt.py: ~2% of three BF16 tensors per step); each row is one
`trainer push` of the next delta to all N (wall time of the trainer process,
and the time it prints), then a check that all N report the version. Router
latency: sequential small requests (max_tokens 1) over one keep-alive
connection, direct to a replica and through each router in front of three
replicas; the added latency is the difference of the medians (and p90s)
measured in the same run, interleaved.
"""
import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--fleets", default="3,30")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--kv-mem-mb", default="16")
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    os.environ.setdefault("SAMPLER_BIN", os.path.join(build, "sampler-cpu"))
    os.environ.setdefault("TRAINER_BIN", os.path.join(build, "trainer"))
    os.environ.setdefault("BUILD_DIR", build)
    from fleet_ckpt import make_chain
    from routers import Router
    from server_fixture import ADMIN, Server

    tmp = tempfile.mkdtemp(prefix="fleet-bench-")
    dirs, chain, deltas = make_chain(tmp, a.steps + 3)
    trainer = os.environ["TRAINER_BIN"]
    print(f"deltas: {', '.join(str(os.path.getsize(d)) for d in deltas)} bytes "
          f"(checkpoint {os.path.getsize(os.path.join(dirs[0], 'model.safetensors'))} bytes)\n")

    def push(delta, servers, *extra):
        args = [trainer, "push", delta, "--admin-token", ADMIN, "--deadline", "300"]
        for s in servers:
            args += ["--to", s.url]
        t0 = time.monotonic()
        p = subprocess.run(args + list(extra), capture_output=True, text=True)
        wall = time.monotonic() - t0
        if p.returncode != 0:
            sys.exit(p.stdout + p.stderr)
        t = float(re.search(r"samplers in ([\d.]+) s", p.stdout).group(1))
        sent = int(re.search(r"s, (\d+) bytes sent", p.stdout).group(1))
        return wall, t, sent, p.stdout

    def start(n, *extra):
        return [Server("--kv-mem-mb", a.kv_mem_mb, *extra) for _ in range(n)]

    print("| samplers | delta | push wall s | push s (trainer) | bytes sent | bytes / sampler |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for n in [int(x) for x in a.fleets.split(",")]:
        fleet = start(n)
        try:
            for k in range(a.steps):
                wall, t, sent, _ = push(deltas[k], fleet)
                print(f"| {n} | {k} -> {k + 1} | {wall:.3f} | {t:.3f} | {sent} | {sent // n} |")
        finally:
            for s in fleet:
                s.stop()

    # catching up: one replica k deltas behind, the others at the base
    print("\n| replica behind by | push wall s | push s (trainer) | bytes sent to it |")
    print("| ---: | ---: | ---: | ---: |")
    for behind in (1, 3):
        ref, late = start(2)
        try:
            base = a.steps + 2  # the pushed delta: base -> base + 1
            for k in range(base):
                push(deltas[k], [ref])
            for k in range(base - behind):
                push(deltas[k], [late])
            wall, t, sent, out = push(deltas[base], [ref, late], "--chain", chain)
            row = next(l for l in out.splitlines() if l.strip().startswith(late.url + " "))
            print(f"| {behind} | {wall:.3f} | {t:.3f} | {row.split()[4]} |")
        finally:
            ref.stop()
            late.stop()

    # routers' added latency
    fleet = start(3)
    routers = []
    try:
        routers = [Router("vllm", [s.url for s in fleet], "round_robin"),
                   Router("sglang", [s.url for s in fleet], "round_robin")]
        body = json.dumps({"model": "tiny-qwen3", "prompt": "hi", "max_tokens": 1, "temperature": 0})
        targets = {"direct": fleet[0].port, "vllm-router": routers[0].port, "sglang-router": routers[1].port}
        conns = {k: http.client.HTTPConnection("127.0.0.1", p, timeout=30) for k, p in targets.items()}
        lat = {k: [] for k in targets}

        def one(k):
            c = conns[k]
            t0 = time.perf_counter()
            c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            r = c.getresponse()
            r.read()
            assert r.status == 200, r.status
            return time.perf_counter() - t0

        for k in targets:  # warm-up
            for _ in range(10):
                one(k)
        for _ in range(a.requests):
            for k in targets:
                lat[k].append(one(k))
        med = {k: statistics.median(v) for k, v in lat.items()}
        p90 = {k: statistics.quantiles(v, n=10)[-1] for k, v in lat.items()}
        print(f"\n| path ({a.requests} sequential requests, max_tokens 1) | median ms | p90 ms | added median ms | added p90 ms |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for k in targets:
            print(f"| {k} | {med[k] * 1e3:.2f} | {p90[k] * 1e3:.2f} | {(med[k] - med['direct']) * 1e3:+.2f} | "
                  f"{(p90[k] - p90['direct']) * 1e3:+.2f} |")
    finally:
        for r in routers:
            r.stop()
        for s in fleet:
            s.stop()


if __name__ == "__main__":
    main()
