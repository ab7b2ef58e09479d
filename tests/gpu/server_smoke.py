#!/usr/bin/env python3
"""The product binary on a GPU: start sampler-smXX on the bundled model at one
precision, wait for /health, and send a completion, a streamed chat completion
and an n=2 sampled completion through plain HTTP (urllib: the GPU machine may
lack the openai package). Checks: HTTP 200, the start-up log names the CUDA
backend, finish_reason, token counts, finite log-probs <= 0, sampler metadata
(weight version) on every token, and [DONE] on the stream. Exit 1 on a failure.

    python3 tests/gpu/server_smoke.py BIN [--precision bf16|fp8|nvfp4] [--weight-only]
"""
import argparse
import json
import math
import socket
import subprocess
import sys
import time
import urllib.request


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def post(url, body, stream=False):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        data = r.read().decode()
        return r.status, data


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--weight-only", action="store_true", help="pass --weight-only (no native tensor-core path)")
    a = ap.parse_args()
    port = free_port()
    log = open(f"/tmp/server_smoke_{a.precision}.log", "w+")
    srv = subprocess.Popen([a.bin, "--port", str(port), "--precision", a.precision, "--log-level", "info"] +
                           (["--weight-only"] if a.weight_only else []),
                           stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    fails = []

    def check(ok, what):
        print(f"  {'ok  ' if ok else 'FAIL'} server {a.precision}: {what}")
        if not ok:
            fails.append(what)

    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except Exception:
                if srv.poll() is not None:
                    break
                time.sleep(0.1)
        log.flush()
        log.seek(0)
        text = log.read()
        check("with sampler-sm" in text and srv.poll() is None, "started on the CUDA backend")
        if srv.poll() is not None:
            print(text[-3000:])
            return 1
        st, body = post(base + "/v1/completions", {"model": "tiny-qwen3", "prompt": "The capital of France is",
                                                    "max_tokens": 16, "temperature": 0, "logprobs": 2,
                                                    "ignore_eos": True})
        j = json.loads(body)
        lp = j["choices"][0]["logprobs"]["token_logprobs"]
        check(st == 200 and j["usage"]["completion_tokens"] == 16 and len(lp) == 16 and
              all(math.isfinite(x) and x <= 1e-6 for x in lp), f"greedy completion, 16 tokens, logprobs {lp[:3]}")
        st, body = post(base + "/v1/chat/completions", {"model": "tiny-qwen3", "stream": True, "max_tokens": 12,
                                                         "messages": [{"role": "user", "content": "hi"}],
                                                         "ignore_eos": True})
        events = [l[6:] for l in body.splitlines() if l.startswith("data: ")]
        check(st == 200 and events and events[-1] == "[DONE]" and len(events) >= 3, f"streamed chat, {len(events)} events")
        st, body = post(base + "/v1/completions", {"model": "tiny-qwen3", "prompt": "Once upon a time", "n": 2,
                                                    "max_tokens": 24, "temperature": 1.0, "top_p": 0.9, "seed": 7,
                                                    "logprobs": 1, "ignore_eos": True})
        j = json.loads(body)
        ok = st == 200 and len(j["choices"]) == 2
        for c in j.get("choices", []):
            lps = c["logprobs"]["token_logprobs"]
            ok = ok and len(lps) == 24 and all(math.isfinite(x) and x <= 1e-6 for x in lps)
        check(ok, "n=2 sampled completion, top_p 0.9, finite logprobs")
        print("  server: " + json.dumps(j["choices"][0].get("text", ""))[:80])
    except Exception as e:  # an HTTP error or a malformed answer
        check(False, f"request failed: {e!r}")
    finally:
        srv.terminate()
        try:
            rc = srv.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.kill()
            rc = -9
        check(rc == 0, f"exit {rc} on SIGTERM")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
