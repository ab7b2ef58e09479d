#!/usr/bin/env python3
"""Encode throughput, one thread: our tokenizer (bench_tokenizer) vs the Python `tokenizers`
package on the same corpus, document by document, in the same run. Prints MB/s and the ratio.
Then the load time of each tokenizer.json (decompressed into a temporary directory, with its
tokenizer_config.json: ours also compiles the chat template) against `Tokenizer.from_file`, best of 5.

Usage: python3 bench/tokenizer_vs_hf.py [BUILD_DIR]   (needs `tokenizers`; run from the repo root)
"""
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "tokenizers")


def corpus():
    raw = subprocess.run(["zstd", "-dc", "--long=27", os.path.join(DATA, "corpus.bin.zst")],
                         stdout=subprocess.PIPE, check=True).stdout
    n = struct.unpack_from("<I", raw, 0)[0]
    off, docs = 4, []
    for _ in range(n):
        ln = struct.unpack_from("<I", raw, off)[0]
        docs.append(raw[off + 4:off + 4 + ln])
        off += 4 + ln
    return docs


def main():
    from tokenizers import Tokenizer
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build")
    docs = corpus()
    texts = [d.decode("utf-8", "replace") for d in docs]
    # first=0: whole corpus; first=10: without the ten pathological long runs at its start
    for name in ["qwen3", "llama3.1"]:
        d = os.path.join(DATA, name)
        js = subprocess.run(["zstd", "-dc", os.path.join(d, "tokenizer.json.zst")], stdout=subprocess.PIPE, check=True).stdout
        tok = Tokenizer.from_str(js.decode())
        for first in (0, 10):
            out = subprocess.run([os.path.join(build, "bench_tokenizer"), d, os.path.join(DATA, "corpus.bin.zst"), "3",
                                  str(first)], stdout=subprocess.PIPE, text=True, check=True, cwd=ROOT).stdout
            ours = float([l.split()[1] for l in out.splitlines() if l.startswith("encode_mb_s")][0])
            nb = sum(len(x) for x in docs[first:])
            best = 1e30
            for _ in range(3):
                t = time.perf_counter()
                for s in texts[first:]:
                    tok.encode(s, add_special_tokens=False)
                best = min(best, time.perf_counter() - t)
            hf = nb / 1e6 / best
            print("%-9s docs %2d.. %.2f MB: ours %7.2f MB/s   HF tokenizers %7.2f MB/s   ratio %.2fx"
                  % (name, first, nb / 1e6, ours, hf, ours / hf))
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "tokenizer.json"), "wb") as f:
                f.write(js)
            shutil.copy(os.path.join(d, "tokenizer_config.json"), tmp)
            ours = hf = 1e30
            for _ in range(5):  # each of ours in a fresh process, as a server start loads it
                out = subprocess.run([os.path.join(build, "bench_tokenizer"), tmp, os.path.join(DATA, "corpus.bin.zst"),
                                      "1", "845"], stdout=subprocess.PIPE, text=True, check=True, cwd=ROOT).stdout
                ours = min(ours, float([l.split()[1] for l in out.splitlines() if l.startswith("load_s")][0]))
                t = time.perf_counter()
                Tokenizer.from_file(os.path.join(tmp, "tokenizer.json"))
                hf = min(hf, time.perf_counter() - t)
            print("%-9s load tokenizer.json (%.1f MB): ours %.3f s   HF tokenizers %.3f s   ratio %.2fx"
                  % (name, len(js) / 1e6, ours, hf, hf / ours))


if __name__ == "__main__":
    main()
