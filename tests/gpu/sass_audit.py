#!/usr/bin/env python3
"""sass_audit.py - what the compiler made of the decode GEMVs, without a GPU: for one architecture,
compile kernels/cuda/*.cu the way CMakeLists.txt does (plus -Xptxas -v), then

  - every kernel's registers, shared memory and spills (ptxas), the spilling ones listed;
  - for the GEMV kernels named in GEMVS, the SASS of their main loop (the longest backward branch,
    cuobjdump -sass): instructions per iteration, per weight byte, and the mix.

Why: a decode GEMV is meant to be bound by memory, and an SM issues about 4 warp instructions a
cycle against ~21 bytes of HBM3e a cycle (H200: 4.8 TB/s over 132 SMs at ~1.7 GHz), so a kernel
above ~3 instructions per weight byte per lane is issue-bound before it is memory-bound. This is
the instruction side of that budget; the GPU check measures the other.

    python3 tests/gpu/sass_audit.py [--sm 90] [--nvcc /usr/local/cuda/bin/nvcc] [--cuobjdump PATH]

cuobjdump comes with a full CUDA toolkit or `pip download --no-deps nvidia-cuda-cuobjdump` (the
wheel's nvidia/cu13/bin/cuobjdump). A dev tool: not part of the test command (CI has no nvcc).
"""
import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (source file, mangled kernel, weight bytes one lane loads per main-loop iteration, label)
# gemv_tile.cuh: 2 chunks x GT_ROWS (4) rows x 16 bytes; gemv_mma.cuh: GM_DEPTH (4) x 2 rows x 16 bytes
# (BF16), GM_FP8_DEPTH (2) x 2 rows x 16 bytes (FP8), GM_FP4_DEPTH (2) x 2 rows x 16 bytes (NVFP4)
GEMVS = [
    ("matmul.cu", "_Z16gemv_tile_kernelILi1ELi0EEv9GemvMulti", 128, "bf16 tiled, 1 token"),
    ("matmul.cu", "_Z16gemv_tile_kernelILi8ELi0EEv9GemvMulti", 128, "bf16 tiled, 8 tokens"),
    ("matmul.cu", "_Z15gemv_mma_kernelILi8ELi0EEv9GemvMulti", 128, "bf16 tensor cores, 8 tokens"),
    ("matmul.cu", "_Z15gemv_mma_kernelILi2ELi0EEv9GemvMulti", 128, "bf16 tensor cores, 2 tokens"),
    ("matmul.cu", "_Z16gemv_tile_kernelILi1ELi1EEv9GemvMulti", 128, "fp8 tiled, 1 token"),
    ("matmul.cu", "_Z16gemv_tile_kernelILi8ELi1EEv9GemvMulti", 128, "fp8 tiled, 8 tokens"),
    ("matmul.cu", "_Z15gemv_mma_kernelILi1ELi1EEv9GemvMulti", 64, "fp8 tensor cores, 1 token"),
    ("matmul.cu", "_Z15gemv_mma_kernelILi8ELi1EEv9GemvMulti", 64, "fp8 tensor cores, 8 tokens"),
    ("matmul.cu", "_Z16gemv_tile_kernelILi1ELi2EEv9GemvMulti", 128, "nvfp4 tiled, 1 token"),
    ("matmul.cu", "_Z16gemv_tile_kernelILi8ELi2EEv9GemvMulti", 128, "nvfp4 tiled, 8 tokens"),
    ("matmul.cu", "_Z15gemv_mma_kernelILi1ELi2EEv9GemvMulti", 64, "nvfp4 tensor cores, 1 token"),
    ("matmul.cu", "_Z15gemv_mma_kernelILi8ELi2EEv9GemvMulti", 64, "nvfp4 tensor cores, 8 tokens"),
]


def compile_all(nvcc, sm, out):
    arch = f"{sm}a" if sm != 80 else "80"
    incs = [f"-I{ROOT}/include/{d}" for d in ("kernels", "quant", "base")]
    res = {}
    for src in sorted(glob.glob(f"{ROOT}/kernels/cuda/*.cu")):
        name = os.path.basename(src)
        obj = os.path.join(out, name + ".o")
        p = subprocess.run([nvcc, f"-DSAMPLER_GPU_SM={sm}", *incs, "-O3", "-DNDEBUG",
                            f"--generate-code=arch=compute_{arch},code=[sm_{arch}]", "-Xptxas", "-v", "-c", src,
                            "-o", obj], capture_output=True, text=True)
        if p.returncode:
            sys.exit(f"sass_audit: {name} did not compile:\n{p.stderr[-2000:]}")
        res[name] = (obj, p.stderr)
    return res


def ptxas_table(log):
    rows, fn, spill = [], None, (0, 0, 0)
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            fn = m.group(1)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            spill = tuple(int(v) for v in m.groups())
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and fn:
            sm = re.search(r"(\d+) bytes smem", line)
            rows.append((fn, int(m.group(1)), int(sm.group(1)) if sm else 0, spill))
            fn, spill = None, (0, 0, 0)
    return rows


def main_loop(cuobjdump, obj, fn):
    out = subprocess.run([cuobjdump, "-sass", "-fun", fn, obj], capture_output=True, text=True).stdout
    ins = []
    for line in out.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2).strip()))
    # the main loop: of the loops that load, the one with the smallest share of guarded loads (a tail
    # loop the compiler unrolled is as long, but its loads are guarded), the longest of those
    best, best_key = None, None
    for a, t in ins:
        m = re.search(r"\bBRA (?:!?P\d, )?0x([0-9a-f]+)", t)
        if m and int(m.group(1), 16) <= a:
            body = [u for b, u in ins if int(m.group(1), 16) <= b <= a]
            loads = [u for u in body if " LDG" in u or u.startswith("LDG")]
            if not loads:
                continue
            key = (sum(u.startswith("@") for u in loads) / len(loads), -len(body))
            if best_key is None or key < best_key:
                best, best_key = body, key
    if not best:
        return None
    mix = collections.Counter(re.sub(r"^@!?U?P\d+\s+", "", u).split()[0].split(".")[0] for u in best)
    return len(best), mix


def demangle(names):
    filt = shutil.which("c++filt")
    if not filt:
        return names
    return subprocess.run([filt], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sm", type=int, default=90, choices=(80, 90, 100, 103))
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        objs = compile_all(a.nvcc, a.sm, tmp)
        allrows = [(name, r) for name, (_, log) in objs.items() for r in ptxas_table(log)]
        print(f"sm_{a.sm}: {len(allrows)} kernels; spilling (file, kernel, registers, smem, stack/stores/loads bytes):")
        spilling = [(n, r) for n, r in allrows if r[3][1] or r[3][2]]
        for (n, r), dn in zip(spilling, demangle([r[0] for _, r in spilling])):
            print(f"  {n:20s} {dn[:60]:60s} {r[1]:4d} {r[2]:6d} {'/'.join(map(str, r[3]))}")
        if not spilling:
            print("  none")
        if not a.cuobjdump:
            print("no cuobjdump (pip download --no-deps nvidia-cuda-cuobjdump): the SASS part is skipped")
            return
        print("decode GEMV main loops (SASS instructions per iteration, per weight byte a lane loads, top of the mix):")
        for src, fn, wbytes, label in GEMVS:
            got = main_loop(a.cuobjdump, objs[src][0], fn)
            if not got:
                print(f"  {label:30s} not found")
                continue
            n, mix = got
            top = ", ".join(f"{k} {v}" for k, v in mix.most_common(6))
            print(f"  {label:30s} {n:4d} per {wbytes} B = {n / wbytes:4.2f} / byte  ({top})")


if __name__ == "__main__":
    main()
