#!/usr/bin/env python3
"""Load generator for the HTTP server over loopback: requests/s and tokens/s
at several concurrencies, and the share of wall time spent outside the
model's forward pass (HTTP, JSON, tokenizer, scheduler, sampler), from the
server's /metrics counter sampler_model_forward_seconds_total.

    python3 bench/bench_server.py [--bin build/sampler-cpu] [--url URL]
        [--conc 1,4,16,64] [--requests-per-conc 4] [--max-tokens 32]
        [--stream] [--server-args "--threads 1"]

Without --url it starts the server itself on a free port: the bundled model,
or with --make-model DIR a random Qwen3 checkpoint of --hidden / --layers
written there first (numpy only; the bundled tiny model spends most of its
step in the sampler's softmax over 152k ids, a bigger one is closer to real).
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


def make_model(d, hidden, layers):
    """Random BF16 Qwen3 checkpoint with the bundled tokenizer's vocab."""
    import shutil
    import struct
    import numpy as np
    os.makedirs(d, exist_ok=True)
    src = os.path.join(ROOT, "models/tiny-qwen3")
    cfg = json.load(open(os.path.join(src, "config.json")))
    hd, nh, nkv, inter = 64, hidden // 64, max(1, hidden // 256), hidden * 3
    cfg.update(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=nh, num_key_value_heads=nkv,
               head_dim=hd, intermediate_size=inter, tie_word_embeddings=True)
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    for f in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(src, f), d)
    rng = np.random.default_rng(0)
    V, H = cfg["vocab_size"], hidden
    shapes = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    for l in range(layers):
        p = f"model.layers.{l}."
        shapes.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                       p + "self_attn.q_proj.weight": (nh * hd, H), p + "self_attn.k_proj.weight": (nkv * hd, H),
                       p + "self_attn.v_proj.weight": (nkv * hd, H), p + "self_attn.o_proj.weight": (H, nh * hd),
                       p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                       p + "mlp.gate_proj.weight": (inter, H), p + "mlp.up_proj.weight": (inter, H),
                       p + "mlp.down_proj.weight": (H, inter)})
    hdr, off = {}, 0
    for k, sh in shapes.items():
        n = int(np.prod(sh)) * 2
        hdr[k] = {"dtype": "BF16", "shape": list(sh), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for k, sh in shapes.items():
            a = np.ones(sh, np.float32) if k.endswith("norm.weight") else \
                rng.standard_normal(sh, dtype=np.float32) * (0.02 if "embed" in k else 1 / np.sqrt(sh[-1]))
            f.write((a.view(np.uint32) >> 16).astype(np.uint16).tobytes())
    return d


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
    ap.add_argument("--make-model", metavar="DIR", help="write a random Qwen3 checkpoint there and serve it")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    a = ap.parse_args()
    proc = None
    if a.url:
        u = urllib.parse.urlparse(a.url)
        host, port = u.hostname, u.port
    else:
        model = ["--model", make_model(a.make_model, a.hidden, a.layers)] if a.make_model else []
        proc = subprocess.Popen([a.bin, "--port", "0", "--log-level", "warn", "--kv-mem-mb", "256"] + model +
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
