#!/usr/bin/env python3
"""Load test over loopback: N concurrent streaming completions against one
server, every stream checked, the numbers printed.

    python3 bench/load.py [--bin build/sampler-cpu] [--url URL] [--concurrency 1000]
        [--max-tokens 16] [--prompt-tokens 8] [--server-args "--threads 2"] [--json OUT]

Without --url it starts the server itself (the bundled model) on a free port
and stops it with SIGTERM at the end (exit code checked). All requests are
opened at once (asyncio, raw HTTP/1.1 with chunked decoding, no client
library: a thousand openai clients would cost more CPU than the server).

Per request: streaming, ignore_eos, max_tokens M, return_token_ids and
stream_options.include_usage. Contract checked for each one (README):
  - 200: the stream is well-formed SSE, ends with data: [DONE], the token ids
    of the chunks add up to M, finish_reason is "length", and the usage chunk
    says completion_tokens == M and prompt_tokens == the prompt's length;
  - 429 / 503 (waiting queue full, documented rejections) with the OpenAI
    error shape: counted as rejected;
  - anything else, a broken stream or a connection error: an error.
Prints accepted / rejected / errors, TTFT and total latency p50 / p99 (s) and
generated tokens/s over the wall time; exits 1 on any error. Imported by
tests/py/test_load.py (run_load).
"""
import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Result:
    def __init__(self):
        self.status = 0
        self.error = None        # str: a contract violation or transport error
        self.t0 = self.t_first = self.t_end = None
        self.tokens = 0          # token ids received in chunks
        self.usage = None
        self.finish = None
        self.done = False        # data: [DONE] seen
        self.body = b""          # non-200 answers


async def _read_chunked(reader):
    """Yield the body pieces of a chunked HTTP/1.1 response."""
    while True:
        line = await reader.readline()
        if not line:
            raise ConnectionError("connection closed inside a chunked body")
        size = int(line.split(b";")[0].strip(), 16)
        if size == 0:
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return
        data = await reader.readexactly(size)
        await reader.readexactly(2)
        yield data


async def _body(reader, headers):
    if headers.get("transfer-encoding", "").lower() == "chunked":
        async for piece in _read_chunked(reader):
            yield piece
    elif "content-length" in headers:
        yield await reader.readexactly(int(headers["content-length"]))
    else:
        while True:
            piece = await reader.read(65536)
            if not piece:
                return
            yield piece


async def request(host, port, path, body, on_event=None, timeout=600, headers=None):
    """POST body (a dict sent as JSON, or bytes sent as they are) and read the
    answer; for a 200 event stream, call on_event(res, obj) for each JSON
    event. Returns a Result (res.body: the answer of a non-stream)."""
    res = Result()
    res.t0 = time.monotonic()
    writer = None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\n{extra}Connection: close\r\n\r\n".encode() + data)
        await writer.drain()

        async def read_all():
            status_line = await reader.readline()
            if not status_line:
                raise ConnectionError("connection closed before the status line")
            res.status = int(status_line.split()[1])
            hdrs = {}
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                k, _, v = line.decode().partition(":")
                hdrs[k.strip().lower()] = v.strip()
            buf = b""
            is_sse = hdrs.get("content-type", "").startswith("text/event-stream")
            async for piece in _body(reader, hdrs):
                if not is_sse:
                    res.body += piece
                    continue
                buf += piece
                while b"\n\n" in buf:
                    ev, buf = buf.split(b"\n\n", 1)
                    if ev.startswith(b":"):
                        continue
                    if not ev.startswith(b"data: "):
                        raise ValueError(f"not an SSE event: {ev[:80]!r}")
                    payload = ev[6:]
                    if res.done:
                        raise ValueError("event after [DONE]")
                    if payload == b"[DONE]":
                        res.done = True
                        continue
                    obj = json.loads(payload)
                    if on_event:
                        on_event(res, obj)
            if is_sse and buf.strip():
                raise ValueError(f"stream ends inside an event: {buf[:80]!r}")
        await asyncio.wait_for(read_all(), timeout)
    except Exception as e:  # noqa: BLE001 - every failure is recorded, not raised
        res.error = f"{type(e).__name__}: {e}"
    finally:
        res.t_end = time.monotonic()
        if writer is not None:
            writer.close()
    return res


def _stream_event(res, obj):
    if "error" in obj:
        raise ValueError(f"error event: {obj['error']}")
    for ch in obj.get("choices", []):
        ids = ch.get("token_ids") or []
        if ids and res.t_first is None:
            res.t_first = time.monotonic()
        res.tokens += len(ids)
        if ch.get("finish_reason"):
            res.finish = ch["finish_reason"]
    if obj.get("usage") and not obj.get("choices"):
        res.usage = obj["usage"]


def check(res, max_tokens, n_prompt):
    """Classify a finished Result: 'ok', 'rejected' or 'error' (res.error set)."""
    if res.error:
        return "error"
    if res.status in (429, 503):
        try:
            e = json.loads(res.body)["error"]
            assert isinstance(e["message"], str) and e["type"]
            return "rejected"
        except Exception:  # noqa: BLE001
            res.error = f"{res.status} without the OpenAI error shape: {res.body[:200]!r}"
            return "error"
    if res.status != 200:
        res.error = f"status {res.status}: {res.body[:200]!r}"
        return "error"
    problems = []
    if not res.done:
        problems.append("no [DONE]")
    if res.tokens != max_tokens:
        problems.append(f"{res.tokens} token ids streamed, want {max_tokens}")
    if res.finish != "length":
        problems.append(f"finish_reason {res.finish!r}")
    u = res.usage or {}
    if u.get("completion_tokens") != max_tokens or u.get("prompt_tokens") != n_prompt or \
            u.get("total_tokens") != max_tokens + n_prompt:
        problems.append(f"usage {u}")
    if problems:
        res.error = "; ".join(problems)
        return "error"
    return "ok"


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


async def _run(host, port, concurrency, max_tokens, prompt):
    body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "temperature": 1.0, "return_token_ids": True, "stream_options": {"include_usage": True}}
    t0 = time.monotonic()
    results = await asyncio.gather(*[request(host, port, "/v1/completions", body, _stream_event)
                                     for _ in range(concurrency)])
    return results, time.monotonic() - t0


def run_load(host, port, concurrency, max_tokens, prompt_ids):
    """Run the load; returns a dict of the numbers plus 'errors' (list of str)."""
    results, wall = asyncio.run(_run(host, port, concurrency, max_tokens, prompt_ids))
    kinds = [check(r, max_tokens, len(prompt_ids)) for r in results]
    ok = [r for r, k in zip(results, kinds) if k == "ok"]
    ttft = [r.t_first - r.t0 for r in ok if r.t_first]
    total = [r.t_end - r.t0 for r in ok]
    toks = sum(r.tokens for r in ok)
    return {
        "concurrency": concurrency, "max_tokens": max_tokens, "prompt_tokens": len(prompt_ids),
        "accepted": len(ok), "rejected": kinds.count("rejected"), "errors": [r.error for r in results if r.error],
        "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99),
        "latency_p50_s": pct(total, 50), "latency_p99_s": pct(total, 99),
        "wall_s": wall, "tokens": toks, "tokens_per_s": toks / wall if wall > 0 else 0.0,
    }


def report(m):
    print(f"concurrency {m['concurrency']}  max_tokens {m['max_tokens']}  prompt {m['prompt_tokens']} tokens")
    print(f"accepted {m['accepted']}  rejected (429/503) {m['rejected']}  errors {len(m['errors'])}")
    print(f"TTFT    p50 {m['ttft_p50_s']:.3f} s  p99 {m['ttft_p99_s']:.3f} s")
    print(f"latency p50 {m['latency_p50_s']:.3f} s  p99 {m['latency_p99_s']:.3f} s")
    print(f"{m['tokens']} tokens in {m['wall_s']:.2f} s: {m['tokens_per_s']:.1f} generated tokens/s")
    for e in m["errors"][:10]:
        print("  error:", e)


def start_server(binary, args):
    """sampler-cpu on a free loopback port; returns (Popen, host, port)."""
    cmd = [binary, "--port", "0", "--log-level", "warn"] + args
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    line = p.stdout.readline()
    if not line.startswith("listening on "):
        p.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    host, port = line.split()[2].rsplit("/", 1)[1].rsplit(":", 1)
    return p, host, int(port)


def stop_server(p, timeout=60):
    p.send_signal(signal.SIGTERM)
    try:
        return p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/sampler-cpu"))
    ap.add_argument("--url", help="an already running server (http://host:port)")
    ap.add_argument("--concurrency", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=8)
    ap.add_argument("--server-args", default="", help="extra flags for the server this script starts")
    ap.add_argument("--json", help="also write the numbers here")
    a = ap.parse_args()
    prompt = [(1000 + 37 * i) % 150000 for i in range(a.prompt_tokens)]
    proc = None
    if a.url:
        host, port = a.url.split("//")[-1].rstrip("/").rsplit(":", 1)
        port = int(port)
    else:
        proc, host, port = start_server(a.bin, a.server_args.split())
    try:
        m = run_load(host, port, a.concurrency, a.max_tokens, prompt)
    finally:
        rc = stop_server(proc) if proc else 0
    report(m)
    if proc:
        print(f"server exit code after SIGTERM: {rc}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(m, f, indent=1)
    sys.exit(1 if m["errors"] or rc != 0 else 0)


if __name__ == "__main__":
    main()
