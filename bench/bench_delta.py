#!/usr/bin/env python3
"""Delta benchmark on real checkpoint pairs (scripts/make_delta_pairs.py):
per learning rate, the changed fraction, the compression ratio against the
full BF16 checkpoint, `trainer diff` and `trainer apply` throughput, the
in-memory apply (prepare while serving, commit = the pause) - all against the
memory-copy bandwidth measured in the same run. Prints a markdown table.

  python3 bench/bench_delta.py PAIRS_DIR [--build build] [--threads 2] [--synthetic-mb 1024]

Every applied checkpoint is compared byte for byte with the real next one.
"""
import argparse
import filecmp
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile


def run(cmd):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed:\n{p.stderr}{p.stdout}")
    return p.stdout


def num(pat, text, group=1):
    m = re.search(pat, text)
    if not m:
        sys.exit(f"no match for {pat!r} in:\n{text}")
    return float(m.group(group))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pairs")
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--synthetic-mb", type=int, default=1024)
    a = ap.parse_args()
    trainer, bench = os.path.join(a.build, "trainer"), os.path.join(a.build, "bench_delta")
    bw = num(r"([\d.]+) GB/s", run([trainer, "membw", "--mb", 256]))
    print(f"memcpy bandwidth (trainer membw, 256 MiB, best of 5): {bw:.2f} GB/s; threads {a.threads}\n")
    rows = []
    tmp = tempfile.mkdtemp(prefix="bench_delta_")
    try:
        for lrdir in sorted(glob.glob(os.path.join(a.pairs, "lr*")), key=lambda d: float(d.split("lr")[-1])):
            steps = sorted(glob.glob(os.path.join(lrdir, "step*")), key=lambda d: int(d.split("step")[-1]))
            fp = None
            acc = dict(frac=[], ratio=[], dsize=[], diff=[], apply=[], prep=[], commit=[], commit_ms=[], bpc=[],
                       xratio=[], xbpc=[])
            for k in range(len(steps) - 1):
                dpath = os.path.join(tmp, f"{k}.delta")
                cmd = [trainer, "diff", steps[k], steps[k + 1], "-o", dpath, "--threads", a.threads,
                       "--base-version", k]
                if fp:
                    cmd += ["--fingerprint", fp]
                out = run(cmd)
                fp = fp or re.search(r"fingerprint ([0-9a-f]{16})", out).group(1)
                ck = num(r"bytes before (\d+)", out)
                nch = num(r"elements changed (\d+)", out)
                acc["frac"].append(num(r"\(([\d.]+)%\)", out))
                acc["ratio"].append(num(r"ratio ([\d.]+)x", out))
                acc["dsize"].append(num(r"after (\d+)", out))
                acc["bpc"].append(num(r"after (\d+)", out) / max(nch, 1))
                acc["diff"].append(ck / num(r"diff ([\d.]+)", out) / 1e9)
                xout = run(cmd + ["--values", "xor", "-o", dpath + ".xor"])
                acc["xratio"].append(num(r"ratio ([\d.]+)x", xout))
                acc["xbpc"].append(num(r"after (\d+)", xout) / max(nch, 1))
                outdir = os.path.join(tmp, f"out{k}")
                out = run([trainer, "apply", steps[k], dpath, "-o", outdir, "--threads", a.threads,
                           "--fingerprint", fp])
                acc["apply"].append(ck / num(r"time ([\d.]+) s", out) / 1e9)
                for f in sorted(os.listdir(steps[k + 1])):
                    if not filecmp.cmp(os.path.join(outdir, f), os.path.join(steps[k + 1], f), shallow=False):
                        sys.exit(f"apply output {f} differs from {steps[k + 1]}")
                shutil.rmtree(outdir)
                out = run([bench, steps[k], dpath, "--threads", a.threads]).split("-- warm")[1]
                acc["prep"].append(num(r"prepare .*?([\d.]+) GB/s", out))
                acc["commit_ms"].append(num(r"commit .*?([\d.]+) ms", out))
                acc["commit"].append(num(r"commit .*?([\d.]+) GB/s", out))
            avg = {k: sum(v) / len(v) for k, v in acc.items()}
            rows.append((os.path.basename(lrdir)[2:], len(steps) - 1, avg, ck))
    finally:
        shutil.rmtree(tmp)
    print("| LR | pairs | changed % | delta bytes | B/changed | ratio vs BF16 ckpt | xor values: B/changed | xor: ratio "
          "| diff GB/s | apply (offline, copy+patch+fsync) GB/s | prepare GB/s | commit ms (pause) | commit GB/s "
          "| memcpy GB/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for lr, n, v, ck in rows:
        print(f"| {lr} | {n} | {v['frac']:.4f} | {v['dsize']:.0f} | {v['bpc']:.2f} | {v['ratio']:.1f}x "
              f"| {v['xbpc']:.2f} | {v['xratio']:.1f}x | {v['diff']:.2f} "
              f"| {v['apply']:.2f} | {v['prep']:.2f} | {v['commit_ms']:.2f} | {v['commit']:.2f} | {bw:.2f} |")
    print(f"\ncheckpoint: {ck / 1e6:.1f} MB of BF16 tensors; means over the pairs of each LR; all applies byte-identical")
    if a.synthetic_mb:
        print(f"\nsynthetic {a.synthetic_mb} MiB BF16 model (16 tensors of 64 MiB, one-ulp changes at uniform random "
              "positions) at each measured changed fraction; commit = the pause:\n")
        print("| LR (fraction from) | changed % | delta ratio | prepare ms (serving continues) | commit ms | "
              "of which re-hash ms (1 thread) | commit without re-hash ms (est.) | memcpy GB/s (same run) | bit-exact |")
        print("|---|---|---|---|---|---|---|---|---|")
        for lr, n, v, ck in rows:
            out = run([bench, "--synthetic", a.synthetic_mb, v["frac"] / 100, "--threads", a.threads])
            prep, com = num(r"prepare .*?([\d.]+) ms", out), num(r"commit .*?([\d.]+) ms", out)
            rh = num(r"re-hash .*?: ([\d.]+) ms", out)
            frac, ratio = num(r"changed \(([\d.]+)%", out), num(r"B \(([\d.]+)x\)", out)
            mbw, exact = num(r"memcpy bandwidth ([\d.]+)", out), "yes" if "target: yes" in out else "NO"
            print(f"| {lr} | {frac:.4f} | {ratio:.1f}x | {prep:.1f} | {com:.1f} | {rh:.1f} | "
                  f"{max(com - rh / a.threads, 0):.1f} | {mbw:.2f} | {exact} |")

if __name__ == "__main__":
    main()
