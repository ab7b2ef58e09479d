#!/usr/bin/env python3
"""The HTTP server against llama-server on the same model, in the same run (issue 23).

    python3 bench/llama_server_compare.py [--model /tmp/bench/qwen3-0.6b]
        [--gguf /tmp/llama_cpp_compare/qwen3-0.6b-bf16.gguf]
        [--llama-server /tmp/llama_cpp_compare/build/bin/llama-server]
        [--bin build/sampler-cpu] [--threads 2] [--conc 1,8,32] [--rounds 1] [--reps 1]
        [--prompt-len 64] [--max-tokens 64] [--server-args "..."] [--llama-args "..."]
        [--only sampler|llama] [--json OUT]

What it measures: for each repetition, the two servers one after the other (the order swaps every
repetition; one server runs at a time, on the same thread count), each started fresh, warmed up with
one request, then at each concurrency C: C client threads, each sending --rounds streaming requests one
after the other (closed loop). Every request is the same for both servers: a prompt of --prompt-len
token ids (pseudo-random ids from a fixed seed, distinct per request, so no prefix is shared),
--max-tokens output tokens with ignore_eos, temperature 1 and no truncation (top_k 0, top_p 1,
min_p 0: the full-vocabulary draw an RL sampler does). Printed per server and concurrency: output
tokens/s over the wall time of the level, TTFT p50/p99 (request sent -> first token chunk), ITL p50
(per request, (last token - first token) / (tokens - 1), the median over requests), the server
process's CPU time (all threads, /proc) per output token (steadier than wall time on a shared machine;
a busy-polling pool counts its spinning), and the ratios sampler / llama-server. The load average is printed with every level: on a shared machine, say it
next to the numbers.

The sampler server gets `/v1/completions` with the ids as the prompt; llama-server its native
`/completion` (prompt as ids, n_predict, return_tokens, cache_prompt false), started with
`--parallel max(C)` and `-c max(C) * (prompt + output + 64)` so every client has a slot.

What it is not: part of CI (it needs the llama.cpp build of bench/llama_cpp_compare.sh, PREPARE_ONLY=1).
"""
import argparse
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = os.environ.get("WORK", "/tmp/llama_cpp_compare")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def loadavg():
    return " ".join(open("/proc/loadavg").read().split()[:3])


def cpu_s(pid):
    """utime + stime of a process, all its threads, in seconds."""
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def prompt_ids(seed, n, vocab_lo=1000, vocab_hi=100000):
    r = random.Random(seed)
    return [r.randrange(vocab_lo, vocab_hi) for _ in range(n)]


class Sampler:
    name = "sampler"

    def __init__(self, a):
        self.a = a

    def start(self):
        a = self.a
        args = [a.bin, "--model", a.model, "--host", "127.0.0.1", "--port", "0", "--threads", str(a.threads),
                "--log-level", "warn"] + a.server_args.split()
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if "listening" not in line:
            raise SystemExit(f"sampler-cpu did not start: {line!r}")
        self.port = int(line.split()[2].rsplit(":", 1)[1])

    def request(self, ids, max_tokens):
        body = {"prompt": ids, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 1.0, "top_p": 1.0,
                "stream": True, "return_token_ids": True, "seed": 1}
        return "/v1/completions", body

    @staticmethod
    def tokens_of(chunk):
        ch = chunk.get("choices") or []
        return len(ch[0].get("token_ids") or []) if ch else 0

    def stop(self):
        self.proc.terminate()
        self.proc.wait(60)


class Llama:
    name = "llama-server"

    def __init__(self, a):
        self.a = a

    def start(self):
        a = self.a
        par = max(a.conc_list)
        self.port = free_port()
        ctx = par * (a.prompt_len + a.max_tokens + 64)
        args = [a.llama_server, "-m", a.gguf, "--host", "127.0.0.1", "--port", str(self.port), "-t", str(a.threads),
                "-tb", str(a.threads), "--parallel", str(par), "-c", str(ctx), "--no-webui"] + a.llama_args.split()
        self.log = open(os.path.join(WORK, "llama-server.log"), "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"llama-server exited {self.proc.returncode}: see {self.log.name}")
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise SystemExit("llama-server did not become healthy in 300 s")

    def request(self, ids, max_tokens):
        body = {"prompt": ids, "n_predict": max_tokens, "ignore_eos": True, "temperature": 1.0, "top_k": 0,
                "top_p": 1.0, "min_p": 0.0, "stream": True, "return_tokens": True, "cache_prompt": False, "seed": 1}
        return "/completion", body

    @staticmethod
    def tokens_of(chunk):
        # tokens_predicted is cumulative; a chunk's "tokens" can lag behind it (held-back UTF-8)
        return chunk.get("tokens_predicted", 0) if chunk.get("tokens") or chunk.get("stop") else 0

    cumulative = True

    def stop(self):
        self.proc.terminate()
        self.proc.wait(60)
        self.log.close()


def one_request(srv, ids, max_tokens):
    """Streams one request; returns (ttft, itl, tokens, total)."""
    path, body = srv.request(ids, max_tokens)
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{srv.name}: HTTP {r.status}: {r.read()[:300]!r}")
    toks, t_first, t_last = 0, None, None
    while True:
        line = r.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        if line == b"data: [DONE]":
            break
        n = srv.tokens_of(json.loads(line[6:]))
        if getattr(srv, "cumulative", False):
            n = max(0, n - toks)
        if n:
            now = time.perf_counter()
            if t_first is None:
                t_first = now
            t_last = now
            toks += n
    c.close()
    if toks != max_tokens:
        raise RuntimeError(f"{srv.name}: {toks} tokens streamed, wanted {max_tokens}")
    itl = (t_last - t_first) / (toks - 1) if toks > 1 else 0.0
    return t_first - t0, itl, toks, t_last - t0


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p / 100 * len(v)))]


def level(srv, conc, rounds, a, seed0):
    res, lock, errs = [], threading.Lock(), []

    def client(ci):
        try:
            for k in range(rounds):
                ids = prompt_ids(seed0 + ci * 1000 + k, a.prompt_len)
                out = one_request(srv, ids, a.max_tokens)
                with lock:
                    res.append(out)
        except Exception as ex:  # reported below, fails the run
            errs.append(ex)

    c0 = cpu_s(srv.proc.pid)
    t0 = time.perf_counter()
    th = [threading.Thread(target=client, args=(i,)) for i in range(conc)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.perf_counter() - t0
    cpu = cpu_s(srv.proc.pid) - c0
    if errs:
        raise errs[0]
    toks = sum(r[2] for r in res)
    return {"conc": conc, "requests": len(res), "wall_s": wall, "tok_s": toks / wall, "cpu_ms_tok": 1000 * cpu / toks,
            "ttft_p50": pct([r[0] for r in res], 50), "ttft_p99": pct([r[0] for r in res], 99),
            "itl_p50": pct([r[1] for r in res], 50), "load": loadavg()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="/tmp/bench/qwen3-0.6b")
    ap.add_argument("--gguf", default=os.path.join(WORK, "qwen3-0.6b-bf16.gguf"))
    ap.add_argument("--llama-server", default=os.path.join(WORK, "build/bin/llama-server"))
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/sampler-cpu"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--conc", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=1, help="requests per client thread and level")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--server-args", default="--kv-mem-mb 2048 --max-model-len 512")
    ap.add_argument("--llama-args", default="")
    ap.add_argument("--only", choices=["sampler", "llama"])
    ap.add_argument("--json")
    a = ap.parse_args()
    a.conc_list = [int(c) for c in a.conc.split(",")]
    kinds = [Sampler, Llama] if not a.only else [Sampler] if a.only == "sampler" else [Llama]
    rows = {}
    print(f"model {a.model}; {a.threads} threads; prompts {a.prompt_len} ids, {a.max_tokens} out; "
          f"conc {a.conc}, {a.rounds} round(s), {a.reps} rep(s); load {loadavg()} on {os.cpu_count()} CPUs",
          flush=True)
    for rep in range(a.reps):
        order = kinds if rep % 2 == 0 else kinds[::-1]
        for K in order:
            srv = K(a)
            srv.start()
            try:
                one_request(srv, prompt_ids(7, a.prompt_len), 4)  # warm-up
                for conc in a.conc_list:
                    r = level(srv, conc, a.rounds, a, seed0=conc * 100000 + rep)
                    rows.setdefault((srv.name, conc), []).append(r)
                    print(f"  rep {rep} {srv.name:>12} conc {conc:>3}: {r['tok_s']:7.1f} tok/s  TTFT p50 "
                          f"{r['ttft_p50']:6.2f} s p99 {r['ttft_p99']:6.2f} s  ITL p50 {1000 * r['itl_p50']:7.1f} ms"
                          f"  CPU {r['cpu_ms_tok']:6.1f} ms/tok  (load {r['load']})", flush=True)
            finally:
                srv.stop()

    def med(name, conc, key):
        v = sorted(r[key] for r in rows.get((name, conc), []))
        return v[len(v) // 2] if v else float("nan")

    print(f"\nmedians of {a.reps} rep(s); load after {loadavg()}")
    print(f"{'conc':>4} {'server':>12} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50 ms':>10} "
          f"{'CPU ms/tok':>10}")
    names = [K.name for K in kinds]
    for conc in a.conc_list:
        for n in names:
            print(f"{conc:>4} {n:>12} {med(n, conc, 'tok_s'):8.1f} {med(n, conc, 'ttft_p50'):9.2f} "
                  f"{med(n, conc, 'ttft_p99'):9.2f} {1000 * med(n, conc, 'itl_p50'):10.1f} "
                  f"{med(n, conc, 'cpu_ms_tok'):10.1f}")
        if len(names) == 2:
            s, l = names
            print(f"{conc:>4} {'ratio s/l':>12} {med(s, conc, 'tok_s') / med(l, conc, 'tok_s'):7.2f}x "
                  f"{med(s, conc, 'ttft_p50') / med(l, conc, 'ttft_p50'):8.2f}x "
                  f"{med(s, conc, 'ttft_p99') / med(l, conc, 'ttft_p99'):8.2f}x "
                  f"{med(s, conc, 'itl_p50') / med(l, conc, 'itl_p50'):9.2f}x "
                  f"{med(s, conc, 'cpu_ms_tok') / med(l, conc, 'cpu_ms_tok'):9.2f}x")
    if a.json:
        json.dump({f"{k[0]}@{k[1]}": v for k, v in rows.items()}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
