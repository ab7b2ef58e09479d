#!/usr/bin/env python3
"""Throughput of heavy requests under the per-step row budget (--max-step-rows).

    python3 bench/row_shares.py [--bin build/sampler-cpu] [--rows 16,80] [--repeat 2]

For each row budget R (alternating, --repeat times) it starts sampler-cpu on the
bundled model (--threads 1 --kv-mem-mb 64 --max-step-rows R), sends two
concurrent n = 16, max_tokens 200, temperature 1, return_sampling_mask
completions (32 sequences: more rows than a budget of 16) and prints the wall
time of both and the tokens per second. It shows what the fair row shares
(scheduler.h, step 0) cost a heavy workload when nothing else runs; the latency
they buy for others is bench/attack.py's. No assertion: numbers only.
"""
import argparse
import concurrent.futures as cf
import json
import os
import socket
import subprocess
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def run(binary, rows):
    port = free_port()
    p = subprocess.Popen([binary, "--model", os.path.join(ROOT, "models/tiny-qwen3"), "--host", "127.0.0.1",
                          "--port", str(port), "--threads", "1", "--kv-mem-mb", "64", "--max-step-rows", str(rows),
                          "--log-level", "warn"], stdout=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except Exception:
                time.sleep(0.1)
        body = json.dumps({"prompt": [9707, 11, 1879], "n": 16, "max_tokens": 200, "ignore_eos": True,
                           "temperature": 1.0, "return_sampling_mask": True}).encode()

        def one(_):
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            return urllib.request.urlopen(req, timeout=600).status

        t = time.monotonic()
        with cf.ThreadPoolExecutor(2) as ex:
            assert list(ex.map(one, range(2))) == [200, 200]
        return time.monotonic() - t
    finally:
        p.terminate()
        p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/sampler-cpu"))
    ap.add_argument("--rows", default="16,80")
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}")
    for _ in range(a.repeat):
        for r in (int(x) for x in a.rows.split(",")):
            dt = run(a.bin, r)
            print(f"--max-step-rows {r:4d}: 2 x n=16 x 200 masked tokens in {dt:6.2f} s = {2 * 16 * 200 / dt:6.0f} tok/s",
                  flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
