#!/usr/bin/env python3
"""Split a `perf record -p <sampler pid>` profile of the server under load
into model forward, sampler, and everything else (HTTP, JSON, tokenizer,
scheduler, kernel: sockets, futexes, scheduling).

    perf record -F 499 -p PID -o perf.data   # while bench_server.py runs
    perf report -i perf.data --sort symbol --stdio | python3 bench/perf_split.py
"""
import re
import sys

MODEL = re.compile(r"matmul|dot_|axpy|attn|cpu_|rope|rmsnorm|swiglu|model_forward|threadpool|gemm|bf16")
SAMPLER = re.compile(r"sampler_|expf|logf|log_fma|ieee754_log|exp_fma|qsort|msort|sort")
tot = {"model forward": 0.0, "sampler": 0.0, "kernel (sockets, futex, sched)": 0.0, "other user (HTTP, JSON, tokenizer, engine)": 0.0}
for line in sys.stdin:
    m = re.match(r"\s*([\d.]+)%\s+\[(.)\]\s+(\S+)", line)
    if not m:
        continue
    pct, kind, sym = float(m.group(1)), m.group(2), m.group(3)
    if kind == "k":
        tot["kernel (sockets, futex, sched)"] += pct
    elif MODEL.search(sym):
        tot["model forward"] += pct
    elif SAMPLER.search(sym):
        tot["sampler"] += pct
    else:
        tot["other user (HTTP, JSON, tokenizer, engine)"] += pct
s = sum(tot.values())
for k, v in tot.items():
    print(f"{k:45s} {100 * v / s:6.2f}%")
print(f"{'outside the model':45s} {100 * (1 - tot['model forward'] / s):6.2f}%")
print(f"{'outside model and sampler':45s} {100 * (1 - (tot['model forward'] + tot['sampler']) / s):6.2f}%")
