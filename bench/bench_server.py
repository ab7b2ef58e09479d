#!/usr/bin/env python3
"""Load generator for the HTTP server over loopback: requests/s and tokens/s
at several concurrencies, and the share of wall time spent outside the
model's forward pass (HTTP, JSON, tokenizer, scheduler, sampler), from the
server's /metrics counter sampler_model_forward_seconds_total.

    python3 bench/bench_server.py [--bin build/sampler-cpu] [--url URL]
        [--conc 1,4,16,64] [--requests-per-conc 4] [--max-tokens 32]
        [--stream] [--server-args "--threads 1"]

Without --url it starts the server itself on a free port (bundled model).
Each request: a short prompt, max_tokens output tokens (ignore_eos), T = 1.
The client uses raw http.client in threads (the openai package would cost
more client CPU than the server on a small machine).
"""
import argparse
import http.client
import json
import os
import subprocess
import threading
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def metrics(host, port):
    c = http.client.HTTPConnection(host, port, timeout=60)
    c.request("GET", "/metrics")
    out = {}
    for l in c.getresponse().read().decode().splitlines():
        if l and not l.startswith("#"):
            k, v = l.rsplit(" ", 1)
            out[k] = float(v)
    c.close()
    return out


def worker(host, port, body, n, stream, results, lock):
    c = http.client.HTTPConnection(host, port, timeout=300)
    for _ in range(n):
        t0 = time.perf_counter()
        c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        dt = time.perf_counter() - t0
        assert r.status == 200, data[:300]
        if stream:
            toks = sum(len(json.loads(l[6:])["choices"][0].get("token_ids") or [])
                       for l in data.decode().split("\n") if l.startswith("data: {") and '"choices":[{' in l)
        else:
            toks = json.loads(data)["usage"]["completion_tokens"]
        with lock:
            results.append((dt, toks))
    c.close()


def run(host, port, conc, n_req, max_tokens, stream):
    body = json.dumps({"prompt": "Benchmark prompt number one", "max_tokens": max_tokens, "ignore_eos": True,
                       "temperature": 1.0, "stream": stream, "return_token_ids": stream}).encode()
    per = max(1, n_req // conc)
    results, lock = [], threading.Lock()
    m0 = metrics(host, port)
    t0 = time.perf_counter()
    th = [threading.Thread(target=worker, args=(host, port, body, per, stream, results, lock)) for _ in range(conc)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.perf_counter() - t0
    m1 = metrics(host, port)
    fwd = m1["sampler_model_forward_seconds_total"] - m0["sampler_model_forward_seconds_total"]
    steps = m1["sampler_engine_steps_total"] - m0["sampler_engine_steps_total"]
    toks = sum(t for _, t in results)
    lat = sorted(d for d, _ in results)
    return {"conc": conc, "requests": len(results), "wall_s": wall, "req_s": len(results) / wall,
            "tok_s": toks / wall, "p50_s": lat[len(lat) // 2], "forward_s": fwd,
            "outside_model": 1 - fwd / wall, "steps": steps, "tokens_per_step": toks / max(steps, 1)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/sampler-cpu"))
    ap.add_argument("--url")
    ap.add_argument("--conc", default="1,4,16,64")
    ap.add_argument("--requests-per-conc", type=int, default=4, help="requests per client thread")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--server-args", default="--threads 1")
    a = ap.parse_args()
    proc = None
    if a.url:
        u = urllib.parse.urlparse(a.url)
        host, port = u.hostname, u.port
    else:
        proc = subprocess.Popen([a.bin, "--port", "0", "--log-level", "warn", "--kv-mem-mb", "256"] +
                                a.server_args.split(), stdout=subprocess.PIPE, text=True)
        line = proc.stdout.readline()
        host, port = "127.0.0.1", int(line.split()[2].rsplit(":", 1)[1])
    try:
        run(host, port, 4, 8, 4, a.stream)  # warm-up
        print(f"{'conc':>5} {'reqs':>5} {'req/s':>8} {'tok/s':>9} {'p50 s':>7} {'tok/step':>8} {'fwd s':>7} "
              f"{'wall s':>7} {'outside model':>13}")
        for conc in map(int, a.conc.split(",")):
            r = run(host, port, conc, conc * a.requests_per_conc, a.max_tokens, a.stream)
            print(f"{r['conc']:>5} {r['requests']:>5} {r['req_s']:>8.1f} {r['tok_s']:>9.0f} {r['p50_s']:>7.3f} "
                  f"{r['tokens_per_step']:>8.1f} {r['forward_s']:>7.2f} {r['wall_s']:>7.2f} "
                  f"{100 * r['outside_model']:>12.1f}%", flush=True)
    finally:
        if proc:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
