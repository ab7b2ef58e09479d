#!/usr/bin/env python3
"""Attack mixes over loopback: normal traffic measured alone, then beside each
of five bounded attacks, against one sampler-cpu (the reliability issue's bar).

    python3 bench/attack.py [--bin build/sampler-cpu] [--quick | --smoke]
        [--max-rss-mb MB] [--server-args "--kv-mem-mb 64"] [--json OUT]

It starts the server on 127.0.0.1 (port 0) with the bundled model
(models/tiny-qwen3), an admin token and --server-args (default
"--kv-mem-mb 64 --threads 1", so the KV pool is small and is touched early).
After a warm-up it runs phases, one after another, waiting for the server to
be idle (/metrics) between them:

  idle       normal traffic alone: a fixed count of requests cycling over a
             short completion (8 tokens), a streamed chat (8 tokens) and n = 4
             with return_sampling_mask (top_k 50, 8 tokens), 4 at a time; each
             answer checked (200, usage, [DONE], 4 masks of 8 tokens);
  uploads    the same traffic beside K connections (3 .. 8) each POSTing a
             Content-Length body of zeros (200 MB; --smoke 8 MB) at full speed
             without a token, half to /admin/v1/weights/delta, half to
             /v1/completions; each reads what the server answers;
  masks      beside mask-heavy requests: n = 16, 400 tokens, ignore_eos,
             temperature 1 with no top-k/top-p/min-p (untruncated),
             return_sampling_mask, 2 at a time;
  plogprobs  beside prompt_logprobs-heavy requests: a 4,000-token prompt with
             echo, logprobs 1, prompt_logprobs 20, max_tokens 1, 2 at a time;
  slowloris  beside 150 connections that each send a request line and then
             one header byte per second, never ending the headers;
  bombs      beside JSON bombs: a 7.5 MB `[{},{},...]` in an ignored field of
             a completion body, and a 7 MB `[[[[...]]]]` deep nesting, 2 at a
             time.

Every attack is bounded in count and by the phase's time cap (it stops by
itself; a request past the cap is abandoned, which closes its connection);
the normal traffic runs its fixed count with a per-request timeout.
The server's VmRSS (/proc/PID/status) is sampled every 0.5 s throughout.

Recorded: normal latency p50/p99 per phase and the ratio to idle, normal
failures (kind and status), RSS peak and final, every 5xx, whether the
process died, and what each attack got back (statuses, bytes sent and
received, connections the server closed and when). A table on stdout and,
with --json, every number (schema: the dict built in main()).

Bar (exit 1 when any part fails, 0 when all pass):
  - every normal request answered correctly (200, checked) in every phase;
  - normal p99 latency beside each attack within 3x of the idle p99;
  - peak RSS under --max-rss-mb; default: idle RSS (the RSS after the idle
    phase, warm-up and KV first touch included) + 256 MB;
  - no 5xx to anyone, normal or attack;
  - the server alive at the end and exiting 0 on SIGTERM.
Safety: past --rss-guard-mb (default min(8192, MemAvailable / 2)) the script
SIGKILLs the server (guard_killed in the JSON; the run fails the bar).

Sizes: default ~3 minutes on a 2-core VM, --quick ~60 s, --smoke ~15 s (a
few requests of each kind, small bodies: checks that the script works, not
the bar; used by tests/py/test_attack_bench.py).
"""
import argparse
import asyncio
import json
import os
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import load  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ADMIN = "attack-admin"
MB = 1 << 20

# Per mode: normal requests per phase, the phase time cap (s) and the attack sizes.
SIZES = {
    "full": dict(normal=48, cap=35.0, uploads=6, upload_mb=200, mask_reqs=4, mask_n=16, mask_tokens=400,
                 plp_reqs=6, plp_tokens=4000, loris=150, bombs=6, bomb_mb=7.5, deep_mb=7.0),
    "quick": dict(normal=21, cap=16.0, uploads=4, upload_mb=200, mask_reqs=2, mask_n=16, mask_tokens=400,
                  plp_reqs=2, plp_tokens=4000, loris=150, bombs=2, bomb_mb=7.5, deep_mb=7.0),
    "smoke": dict(normal=6, cap=3.0, uploads=3, upload_mb=8, mask_reqs=1, mask_n=16, mask_tokens=16,
                  plp_reqs=1, plp_tokens=400, loris=10, bombs=1, bomb_mb=0.5, deep_mb=0.5),
}
MIXES = ["uploads", "masks", "plogprobs", "slowloris", "bombs"]


def rss_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def metrics(host, port):
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def wait_idle(host, port, proc, timeout):
    """Poll /metrics until nothing runs or waits, no KV block is held and no HTTP request is in flight
    (an abandoned request may still be building its answer after the engine is done); True if it got there."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout and proc.poll() is None:
        try:
            m = metrics(host, port)
            if m.get("sampler_num_requests_running") == 0 and m.get("sampler_num_requests_waiting") == 0 and \
                    m.get("sampler_kv_blocks_used") == 0 and m.get("sampler_inflight_requests", 0) == 0:
                return True
        except Exception:  # noqa: BLE001 - a busy or dying server: keep polling until the deadline
            pass
        time.sleep(0.2)
    return False


def mem_available_mb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024.0
    return float("inf")


class RssSampler(threading.Thread):
    """VmRSS every `every` s; SIGKILLs the server past guard_mb (protects a shared machine from a
    server whose memory is unbounded: the run then fails the bar with guard_killed)."""

    def __init__(self, proc, t0, guard_mb, every=0.5):
        super().__init__(daemon=True)
        self.proc, self.pid, self.t0, self.every, self.guard_mb = proc, proc.pid, t0, every, guard_mb
        self.samples = []  # (seconds since start, MB)
        self.guard_killed = False
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            v = rss_mb(self.pid)
            if v is not None:
                self.samples.append((round(time.monotonic() - self.t0, 2), round(v, 1)))
                if v > self.guard_mb and self.proc.poll() is None:
                    self.guard_killed = True
                    self.proc.kill()
            self.stop.wait(self.every)

    def peak_since(self, t):
        """Peak of the samples taken since t, and of one taken now (a phase may be shorter than a period)."""
        xs = [v for s, v in self.samples if s >= t]
        now = rss_mb(self.pid)
        if now is not None:
            xs.append(round(now, 1))
        return max(xs) if xs else None


# ---------------------------------------------------------------- normal traffic

def normal_body(kind, i):
    if kind == "short":
        return "/v1/completions", {"prompt": "The quick brown fox " * (1 + i % 4), "max_tokens": 8,
                                   "ignore_eos": True, "temperature": 1.0, "seed": i}
    if kind == "chat_stream":
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell me a story " * (1 + i % 5)}],
                                        "max_tokens": 8, "ignore_eos": True, "stream": True, "seed": i,
                                        "stream_options": {"include_usage": True}}
    return "/v1/completions", {"prompt": [9707, 11, 1879], "n": 4, "max_tokens": 8, "ignore_eos": True,
                               "temperature": 1.0, "top_k": 50, "seed": i, "return_token_ids": True,
                               "return_sampling_mask": True}


def _chat_event(res, obj):
    if "error" in obj:
        raise ValueError(f"error event: {obj['error']}")
    if obj.get("usage") and not obj.get("choices"):
        res.usage = obj["usage"]
    for ch in obj.get("choices", []):
        if ch.get("finish_reason"):
            res.finish = ch["finish_reason"]


def check_normal(kind, r):
    """None when the answer is right, else a failure kind (a short string)."""
    if r.error:
        return "timeout" if r.error.startswith("TimeoutError") else "transport: " + r.error.split(":")[0]
    if r.status != 200:
        return f"status {r.status}"
    try:
        if kind == "chat_stream":
            ok = r.done and (r.usage or {}).get("completion_tokens") == 8 and r.finish == "length"
        else:
            o = json.loads(r.body)
            if kind == "short":
                ok = o["usage"]["completion_tokens"] == 8
            else:
                ok = len(o["choices"]) == 4 and o["usage"]["completion_tokens"] == 32 and \
                    all(c["sampling_mask"]["n_tokens"] == 8 for c in o["choices"])
    except Exception as e:  # noqa: BLE001
        return f"bad answer: {type(e).__name__}"
    return None if ok else "bad answer"


async def normal_traffic(host, port, count, timeout, concurrency=4):
    kinds = ["short", "chat_stream", "n4_mask"]
    todo = list(range(count))
    out = []

    async def worker():
        while todo:
            i = todo.pop(0)
            kind = kinds[i % len(kinds)]
            path, body = normal_body(kind, i)
            r = await load.request(host, port, path, body, _chat_event if kind == "chat_stream" else None,
                                   timeout=timeout)
            out.append((kind, r.t_end - r.t0, check_normal(kind, r), r.status))
    t0 = time.monotonic()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    wall = time.monotonic() - t0
    lat = [t for _, t, f, _ in out if f is None]
    fails = {}
    for kind, _, f, _ in out:
        if f is not None:
            k = f"{kind}: {f}"
            fails[k] = fails.get(k, 0) + 1
    return {"count": count, "ok": len(lat), "failed": count - len(lat), "failures": fails,
            "p50_s": round(load.pct(lat, 50), 4), "p99_s": round(load.pct(lat, 99), 4),
            "max_s": round(max(lat), 4) if lat else float("nan"), "wall_s": round(wall, 2),
            "five_xx": sum(1 for *_, st in out if st >= 500)}


# ---------------------------------------------------------------- attacks

class AttackLog:
    def __init__(self, name):
        self.name = name
        self.sent = 0            # requests / connections started
        # one outcome per request / connection started: its status, or "none" (no status line), except
        # slowloris connections still open at the time cap (counted in errors only)
        self.statuses = {}       # "200" / "401" / ... / "none" -> count
        self.errors = {}         # client-side outcome (reset, closed by server, timeout) -> count
        self.bytes_sent = 0
        self.bytes_received = 0
        self.by_kind = {}        # kind of request (path, bomb shape) -> {status: count}
        self.closed_by_server_s = []  # slowloris: seconds until the server closed

    def status(self, st, kind=None):
        k = str(st) if st else "none"
        self.statuses[k] = self.statuses.get(k, 0) + 1
        if kind:
            d = self.by_kind.setdefault(kind, {})
            d[k] = d.get(k, 0) + 1

    def error(self, e):
        self.errors[e] = self.errors.get(e, 0) + 1

    def five_xx(self):
        return sum(v for k, v in self.statuses.items() if k.isdigit() and int(k) >= 500)

    def to_json(self, wall):
        d = {"name": self.name, "sent": self.sent, "statuses": self.statuses, "errors": self.errors,
             "bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received, "by_kind": self.by_kind,
             "wall_s": round(wall, 2),
             "five_xx": self.five_xx()}
        c = sorted(self.closed_by_server_s)
        d["closed_by_server"] = len(c)
        d["closed_after_s_p50"] = round(load.pct(c, 50), 2) if c else None
        d["closed_after_s_max"] = round(c[-1], 2) if c else None
        return d


async def read_status(reader, log, kind=None, limit=64 * MB):
    """Read an HTTP answer until EOF (bounded); record its status and size."""
    data = b""
    while len(data) < limit:
        b = await reader.read(1 << 16)
        if not b:
            break
        data += b
    log.bytes_received += len(data)
    st = None
    if data.startswith(b"HTTP/"):
        try:
            st = int(data.split(b" ", 2)[1])
        except (IndexError, ValueError):
            pass
    log.status(st, kind)
    return data


async def upload(host, port, path, nbytes, deadline, log):
    log.sent += 1
    chunk = bytes(MB)
    writer = None
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/octet-stream\r\n"
                     f"Content-Length: {nbytes}\r\nConnection: close\r\n\r\n".encode())
        left = nbytes
        while left > 0:
            if time.monotonic() > deadline:
                log.error("stopped at the time cap")
                log.status(None, path)
                return
            n = min(left, len(chunk))
            writer.write(chunk[:n])
            await asyncio.wait_for(writer.drain(), max(0.1, deadline - time.monotonic()))
            log.bytes_sent += n
            left -= n
            if reader.at_eof() or len(reader._buffer):  # the server answered early
                break
        await asyncio.wait_for(read_status(reader, log, path), max(0.1, deadline - time.monotonic()))
    except (ConnectionResetError, BrokenPipeError) as e:
        # the server closed while we wrote: what it said first (if anything) is still in the buffer
        log.error(f"closed by server while sending ({type(e).__name__})")
        try:
            await asyncio.wait_for(read_status(reader, log, path), 2)
        except Exception:  # noqa: BLE001
            log.status(None, path)
    except asyncio.TimeoutError:
        log.error("stopped at the time cap")
        log.status(None, path)
    except OSError as e:
        log.error(f"connect: {type(e).__name__}")
        log.status(None, path)
    finally:
        if writer is not None:
            writer.close()


async def json_request(host, port, body, deadline, log, path="/v1/completions", kind=None):
    log.sent += 1
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    log.bytes_sent += len(data)
    r = await load.request(host, port, path, data, on_event=None, timeout=max(0.1, deadline - time.monotonic()))
    log.bytes_received += len(r.body)
    if r.error and r.status == 0:
        log.error("stopped at the time cap" if r.error.startswith("TimeoutError") else r.error.split(":")[0])
        log.status(None, kind)
    else:
        if r.error:
            log.error(r.error.split(":")[0])
        log.status(r.status, kind)


async def bounded_pool(jobs, concurrency):
    """Run the coroutine factories in jobs, concurrency at a time."""
    jobs = list(jobs)

    async def worker():
        while jobs:
            await jobs.pop(0)()
    await asyncio.gather(*[worker() for _ in range(concurrency)])


async def attack_uploads(host, port, sz, deadline, log):
    n = sz["uploads"]
    paths = ["/admin/v1/weights/delta" if i % 2 == 0 else "/v1/completions" for i in range(n)]
    await asyncio.gather(*[upload(host, port, p, int(sz["upload_mb"] * MB), deadline, log) for p in paths])


async def attack_masks(host, port, sz, deadline, log):
    body = {"prompt": [9707, 11, 1879], "n": sz["mask_n"], "max_tokens": sz["mask_tokens"], "ignore_eos": True,
            "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "return_sampling_mask": True,
            "return_token_ids": True}
    await bounded_pool([lambda: json_request(host, port, body, deadline, log)] * sz["mask_reqs"], 2)


async def attack_plogprobs(host, port, sz, deadline, log):
    ids = [(1000 + 37 * i) % 150000 for i in range(sz["plp_tokens"])]
    body = {"prompt": ids, "max_tokens": 1, "echo": True, "logprobs": 1, "prompt_logprobs": 20,
            "temperature": 1.0}
    await bounded_pool([lambda: json_request(host, port, body, deadline, log)] * sz["plp_reqs"], 2)


async def loris(host, port, deadline, log):
    log.sent += 1
    writer = None
    t0 = time.monotonic()
    try:
        reader, writer = await asyncio.open_connection(host, port)
        head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nX-Slow: ".encode()
        writer.write(head)
        log.bytes_sent += len(head)
        while time.monotonic() < deadline:
            try:
                b = await asyncio.wait_for(reader.read(1 << 16), 1.0)
            except asyncio.TimeoutError:
                writer.write(b"a")
                await writer.drain()
                log.bytes_sent += 1
                continue
            log.bytes_received += len(b)
            log.closed_by_server_s.append(time.monotonic() - t0)
            if b:
                st = None
                if b.startswith(b"HTTP/"):
                    try:
                        st = int(b.split(b" ", 2)[1])
                    except (IndexError, ValueError):
                        pass
                log.status(st)
                log.error("answered")
            else:
                log.status(None)
                log.error("closed by server")
            return
        log.error("still open at the time cap")
    except (ConnectionResetError, BrokenPipeError):
        log.closed_by_server_s.append(time.monotonic() - t0)
        log.status(None)
        log.error("reset by server")
    except OSError as e:
        log.status(None)
        log.error(f"connect: {type(e).__name__}")
    finally:
        if writer is not None:
            writer.close()


async def attack_slowloris(host, port, sz, deadline, log):
    await asyncio.gather(*[loris(host, port, deadline, log) for _ in range(sz["loris"])])


def flat_bomb(mb):
    n = int(mb * MB) // 3
    return b'{"prompt": "hi", "max_tokens": 1, "ignored": [' + b"{}," * (n - 1) + b"{}]}"


def deep_bomb(mb):
    d = int(mb * MB) // 2
    return b'{"prompt": "hi", "max_tokens": 1, "ignored": ' + b"[" * d + b"]" * d + b"}"


async def attack_bombs(host, port, sz, deadline, log):
    flat, deep = flat_bomb(sz["bomb_mb"]), deep_bomb(sz["deep_mb"])
    jobs = []
    for _ in range(sz["bombs"]):
        jobs += [lambda: json_request(host, port, flat, deadline, log, kind="flat [{},...]"),
                 lambda: json_request(host, port, deep, deadline, log, kind="deep [[[...]]]")]
    await bounded_pool(jobs, 2)


ATTACKS = {"uploads": attack_uploads, "masks": attack_masks, "plogprobs": attack_plogprobs,
           "slowloris": attack_slowloris, "bombs": attack_bombs}


async def phase(host, port, sz, mix, normal_timeout):
    """Normal traffic (fixed count) beside one attack (bounded by the phase cap)."""
    t0 = time.monotonic()
    deadline = t0 + sz["cap"]
    log = AttackLog(mix)
    atk = asyncio.ensure_future(ATTACKS[mix](host, port, sz, deadline, log))
    await asyncio.sleep(0.3)  # let the attack get going first
    normal = await normal_traffic(host, port, sz["normal"], normal_timeout)
    await atk
    return normal, log.to_json(time.monotonic() - t0)


# ---------------------------------------------------------------- main

def human(n):
    return f"{n / MB:.1f} MB" if n >= MB else f"{n / 1024:.1f} kB" if n >= 1024 else f"{n} B"


def fmt(x, nd=3):
    return "-" if x is None or x != x else f"{x:.{nd}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/sampler-cpu"))
    ap.add_argument("--quick", action="store_true", help="~60 s")
    ap.add_argument("--smoke", action="store_true", help="~15 s, tiny sizes (script check, not the bar)")
    ap.add_argument("--mixes", default=",".join(MIXES), help="comma-separated subset of " + ",".join(MIXES))
    ap.add_argument("--max-rss-mb", type=float, help="RSS bound (default: idle RSS + 256)")
    ap.add_argument("--rss-guard-mb", type=float,
                    help="SIGKILL the server past this RSS (default: min(8192, MemAvailable / 2))")
    ap.add_argument("--latency-factor", type=float, default=3.0, help="p99 under attack / idle p99 bound")
    ap.add_argument("--normal-timeout", type=float, default=60.0, help="per normal request (s)")
    ap.add_argument("--server-args", default="--kv-mem-mb 64 --threads 1")
    ap.add_argument("--json", help="write every number here")
    a = ap.parse_args()
    mode = "smoke" if a.smoke else "quick" if a.quick else "full"
    sz = SIZES[mode]
    mixes = [m for m in a.mixes.split(",") if m]
    for m in mixes:
        if m not in ATTACKS:
            ap.error(f"unknown mix {m!r}; known: {', '.join(MIXES)}")

    t_start = time.monotonic()
    server_args = ["--host", "127.0.0.1", "--admin-token", ADMIN] + a.server_args.split()
    proc, host, port = load.start_server(a.bin, server_args)
    guard = a.rss_guard_mb or min(8192.0, mem_available_mb() / 2)
    rss = RssSampler(proc, t_start, guard)
    rss.start()
    out = {"mode": mode, "sizes": sz, "server": {"bin": a.bin, "args": server_args, "pid": proc.pid},
           "latency_factor": a.latency_factor, "rss_guard_mb": round(guard, 1)}
    exit_code = None
    try:
        # warm-up: first touch of the sampler's buffers and a few KV blocks, not measured
        asyncio.run(normal_traffic(host, port, 6, a.normal_timeout))
        wait_idle(host, port, proc, 30)
        t_idle = time.monotonic() - t_start
        idle = asyncio.run(normal_traffic(host, port, sz["normal"], a.normal_timeout))
        idle["rss_peak_mb"] = rss.peak_since(t_idle)
        wait_idle(host, port, proc, 30)
        rss_idle = rss_mb(proc.pid) or float("nan")
        out["idle"] = idle
        out["rss_idle_mb"] = round(rss_idle, 1)
        out["max_rss_mb"] = a.max_rss_mb if a.max_rss_mb else round(rss_idle + 256, 1)
        out["max_rss_formula"] = "--max-rss-mb" if a.max_rss_mb else "idle RSS + 256 MB"
        out["mixes"] = []
        for mix in mixes:
            if proc.poll() is not None:
                break
            t_m = time.monotonic() - t_start
            normal, attack = asyncio.run(phase(host, port, sz, mix, a.normal_timeout))
            idle_after = wait_idle(host, port, proc, 60)
            p99, ip99 = normal["p99_s"], idle["p99_s"]
            out["mixes"].append({
                "name": mix, "normal": normal, "attack": attack,
                "p50_ratio": round(normal["p50_s"] / idle["p50_s"], 2) if idle["p50_s"] > 0 else None,
                "p99_ratio": round(p99 / ip99, 2) if ip99 > 0 and p99 == p99 else None,
                "rss_peak_mb": rss.peak_since(t_m), "rss_end_mb": rss_mb(proc.pid),
                "idle_after": idle_after, "alive": proc.poll() is None})
    finally:
        last = rss_mb(proc.pid)  # the final RSS: after the last phase and its idle wait, before SIGTERM
        rss.stop.set()
        rss.join()
        if last is not None:
            rss.samples.append((round(time.monotonic() - t_start, 2), round(last, 1)))
        out["guard_killed"] = rss.guard_killed
        died = proc.poll() is not None and not rss.guard_killed
        out["died"] = died
        out["died_returncode"] = proc.returncode if died else None
        gone = proc.poll() is not None
        exit_code = proc.returncode if gone else load.stop_server(proc)
    out["exit_code_after_sigterm"] = None if gone else exit_code
    samples = rss.samples
    # the peak over the 0.5 s samples and the per-phase readings (a phase can end between two samples)
    peaks = [v for _, v in samples] + [x for x in [out.get("idle", {}).get("rss_peak_mb")] +
                                       [m["rss_peak_mb"] for m in out.get("mixes", [])] if x is not None]
    out["rss"] = {"peak_mb": max(peaks, default=None),
                  "final_mb": samples[-1][1] if samples else None, "every_s": rss.every, "samples": samples}
    out["wall_s"] = round(time.monotonic() - t_start, 1)

    # the bar
    ms = out.get("mixes", [])
    normal_failed = out["idle"]["failed"] + sum(m["normal"]["failed"] for m in ms)
    five_xx = out["idle"]["five_xx"] + sum(m["normal"]["five_xx"] + m["attack"]["five_xx"] for m in ms)
    bar = {
        "all_normal_answered": normal_failed == 0 and len(ms) == len(mixes),
        "p99_within_factor": all(m["p99_ratio"] is not None and m["p99_ratio"] <= a.latency_factor for m in ms)
        and len(ms) == len(mixes),
        "rss_under_bound": out["rss"]["peak_mb"] is not None and out["rss"]["peak_mb"] < out["max_rss_mb"]
        and not rss.guard_killed,
        "no_5xx": five_xx == 0,
        "alive": not died and not rss.guard_killed and exit_code == 0,
    }
    bar["pass"] = all(bar.values())
    out["normal_failed"] = normal_failed
    out["five_xx"] = five_xx
    out["bar"] = bar
    report(out)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    sys.exit(0 if bar["pass"] else 1)


def report(o):
    print(f"mode {o['mode']}  server pid {o['server']['pid']}  wall {o['wall_s']} s")
    print(f"{'phase':<10} {'normal ok':>9} {'p50 s':>7} {'p99 s':>7} {'p99 x':>6} {'RSS peak':>8}  attack got back")
    i = o["idle"]
    print(f"{'idle':<10} {i['ok']:>4}/{i['count']:<4} {fmt(i['p50_s']):>7} {fmt(i['p99_s']):>7} {'1.00':>6} "
          f"{fmt(i['rss_peak_mb'], 1):>8}  -")
    for m in o["mixes"]:
        n, atk = m["normal"], m["attack"]
        got = ", ".join(f"{k} x{v}" for k, v in sorted(atk["statuses"].items())) or "-"
        extra = "; ".join(f"{k} x{v}" for k, v in sorted(atk["errors"].items()))
        print(f"{m['name']:<10} {n['ok']:>4}/{n['count']:<4} {fmt(n['p50_s']):>7} {fmt(n['p99_s']):>7} "
              f"{fmt(m['p99_ratio'], 2):>6} {fmt(m['rss_peak_mb'], 1):>8}  {atk['sent']} sent, status {got}; "
              f"{human(atk['bytes_sent'])} out, {human(atk['bytes_received'])} back"
              + (f"; {extra}" if extra else ""))
        if len(atk["by_kind"]) > 1:
            print(f"{'':<10} " + "; ".join(f"{k}: " + ", ".join(f"{st} x{v}" for st, v in sorted(d.items()))
                                          for k, d in sorted(atk["by_kind"].items())))
        if atk["closed_by_server"]:
            print(f"{'':<10} closed by server: {atk['closed_by_server']}, after p50 {atk['closed_after_s_p50']} s, "
                  f"max {atk['closed_after_s_max']} s")
        for k, v in n["failures"].items():
            print(f"{'':<10} normal failed: {k} x{v}")
    for k, v in o["idle"]["failures"].items():
        print(f"idle normal failed: {k} x{v}")
    r = o["rss"]
    print(f"RSS: idle {fmt(o['rss_idle_mb'], 1)} MB, peak {fmt(r['peak_mb'], 1)} MB, final {fmt(r['final_mb'], 1)} MB "
          f"(bound {o['max_rss_mb']} MB: {o['max_rss_formula']})")
    if o["guard_killed"]:
        print(f"server SIGKILLed by this script: RSS over the guard ({o['rss_guard_mb']} MB); later phases skipped")
    print(f"normal failed {o['normal_failed']}, 5xx {o['five_xx']}, died {o['died']}"
          f" (returncode {o['died_returncode']}), exit after SIGTERM {o['exit_code_after_sigterm']}")
    b = o["bar"]
    print("bar: " + ", ".join(f"{k} {'ok' if v else 'FAIL'}" for k, v in b.items() if k != "pass")
          + f"  => {'PASS' if b['pass'] else 'FAIL'}")


if __name__ == "__main__":
    main()
