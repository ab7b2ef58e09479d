#!/usr/bin/env bash
# llama_cpp_compare.sh - the CPU forward pass against llama.cpp in the same run (issue #23).
#
# What it does: builds llama.cpp's llama-bench, llama-server and llama-quantize from the llama-cpp-python sdist (PyPI; the sdist
# vendors llama.cpp), converts the random Qwen3-0.6B-shaped model of scripts/make_bench_model.py to
# GGUF BF16 with the sdist's convert_hf_to_gguf.py, then alternates runs of llama-bench and
# bench_forward (prefill of P tokens, batch-1 decode of D tokens after it, i.e. at context P .. P + D;
# llama-bench's decode runs at the same depth, -d P) REPS times per thread count and
# prints the medians and the ratios sampler / llama.cpp. The machine's load average is printed
# before and after: on a shared machine say it next to the numbers.
#
# What it is not: part of CI (it downloads and builds llama.cpp, minutes on 2 cores).
#
# usage: bench/llama_cpp_compare.sh [MODEL_DIR] [THREADS="1 2"] [P=512] [D=32] [REPS=5]
#   PREPARE_ONLY=1 stops after the build and the GGUF (bench/llama_server_compare.py uses them) and
#   touches $WORK/READY.
#   env: WORK (default /tmp/llama_cpp_compare) holds the sdist, the build and the GGUF;
#        BUILD_DIR (default ./build) holds bench_forward; PATHS (default avx2-v0,<default path>,<default
#        path>+bf16): the sampler's CPU matmul paths to run (cpu_ops.h), the first one is the old kernel;
#        "+bf16" runs the path with BF16 matmul activations (--dtype bfloat16, what --dtype auto picks on
#        a CPU with AVX512_BF16; llama.cpp rounds its activations to BF16 for a BF16 GGUF too).
# needs: python3 with torch, numpy, transformers, sentencepiece (the converter), cmake, a C++ compiler.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
MODEL=${1:-/tmp/bench/qwen3-0.6b}
THREADS=${2:-"1 2"}
P=${3:-512}
D=${4:-32}
REPS=${5:-5}
WORK=${WORK:-/tmp/llama_cpp_compare}
BUILD_DIR=${BUILD_DIR:-$REPO/build}
mkdir -p "$WORK"

if [ ! -f "$MODEL/model.safetensors" ] && [ ! -f "$MODEL/model.safetensors.index.json" ]; then
  python3 "$REPO/scripts/make_bench_model.py" qwen3-0.6b "$MODEL"
fi

# ---- llama.cpp from the llama-cpp-python sdist ----
if [ ! -x "$WORK/build/bin/llama-bench" ] || [ ! -x "$WORK/build/bin/llama-server" ] || \
   [ ! -x "$WORK/build/bin/llama-quantize" ]; then
  if ! ls "$WORK"/llama_cpp_python-*.tar.gz >/dev/null 2>&1; then
    pip download --no-deps --no-binary :all: llama-cpp-python -d "$WORK"
  fi
  SDIST=$(ls "$WORK"/llama_cpp_python-*.tar.gz | head -1)
  [ -d "$(ls -d "$WORK"/llama_cpp_python-*/ 2>/dev/null | head -1)" ] || tar -xzf "$SDIST" -C "$WORK"
  SRC=$(ls -d "$WORK"/llama_cpp_python-*/vendor/llama.cpp | head -1)
  ln -sfn "$SRC" "$WORK/llama.cpp"
  cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_TOOLS=ON >"$WORK/cmake.log" 2>&1
  cmake --build "$WORK/build" -j"${JOBS:-2}" --target llama-bench llama-server llama-quantize \
    >"$WORK/build.log" 2>&1
fi
LLAMA_VERSION=$(basename "$(dirname "$(dirname "$(readlink -f "$WORK/llama.cpp")")")")

# ---- the same weights as GGUF BF16 ----
GGUF="$WORK/$(basename "$MODEL")-bf16.gguf"
if [ ! -f "$GGUF" ]; then
  PYTHONPATH="$WORK/llama.cpp/gguf-py${PYTHONPATH:+:$PYTHONPATH}" \
    python3 "$WORK/llama.cpp/convert_hf_to_gguf.py" "$MODEL" --outtype bf16 --outfile "$GGUF" >"$WORK/convert.log" 2>&1
fi

if [ "${PREPARE_ONLY:-0}" = 1 ]; then touch "$WORK/READY"; echo "ready: $GGUF"; exit 0; fi
[ -x "$BUILD_DIR/bench_forward" ] || { echo "build bench_forward first (cmake --build build)"; exit 1; }
DEFAULT_PATH=$(SAMPLER_CPU_PATH= "$BUILD_DIR/test_cpu_paths" 2>/dev/null | sed -n 's/^default path: //p' || true)
PATHS=${PATHS:-avx2-v0,${DEFAULT_PATH:-avx2},${DEFAULT_PATH:-avx2}+bf16}

median() { sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

echo "llama.cpp: $LLAMA_VERSION (llama-bench, GGUF BF16); sampler paths: $PATHS; model $MODEL"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"
for T in $THREADS; do
  : >"$WORK/l_pp.$T"; : >"$WORK/l_tg.$T"; : >"$WORK/s.$T"
  for rep in $(seq "$REPS"); do
    # llama-bench: one repetition of pp P (from an empty cache) and of tg D at depth P (-d: the decode
    # runs with P positions already in its KV cache, as bench_forward's decode does after its prefill;
    # llama-bench's tg without -d starts from an empty cache). Its JSON gives avg_ts per test.
    "$WORK/build/bin/llama-bench" -m "$GGUF" -t "$T" -p "$P" -n 0 -r 1 -o json 2>/dev/null >"$WORK/l.json"
    "$WORK/build/bin/llama-bench" -m "$GGUF" -t "$T" -p 0 -n "$D" -d "$P" -r 1 -o json 2>/dev/null >"$WORK/l2.json"
    python3 - "$WORK/l.json" "$WORK/l2.json" "$WORK/l_pp.$T" "$WORK/l_tg.$T" <<'EOF'
import json, sys
for path in sys.argv[1:3]:
    for r in json.load(open(path)):
        f = sys.argv[3] if r["n_prompt"] > 0 else sys.argv[4]
        open(f, "a").write(f"{r['avg_ts']}\n")
EOF
    "$BUILD_DIR/bench_forward" "$MODEL" "$T" "$P" "$D" "$PATHS" 1 2>/dev/null >>"$WORK/s.$T"
  done
  lpp=$(median <"$WORK/l_pp.$T"); ltg=$(median <"$WORK/l_tg.$T")
  echo "== $T thread(s), medians of $REPS alternating runs"
  printf "%-28s %10s %10s\n" "" "prefill $P" "decode"
  printf "%-28s %10.1f %10.2f\n" "llama.cpp (tok/s)" "$lpp" "$ltg"
  for path in ${PATHS//,/ }; do
    spp=$(awk -v p="[$path]" '$1==p {f=1; next} /^\[/ {f=0} f && /^prefill/ {print $4}' "$WORK/s.$T" | median)
    stg=$(awk -v p="[$path]" '$1==p {f=1; next} /^\[/ {f=0} f && /^decode batch/ {print $6}' "$WORK/s.$T" | median)
    printf "%-28s %10.1f %10.2f\n" "sampler $path (tok/s)" "$spp" "$stg"
    printf "%-28s %9.2fx %9.2fx\n" "  ratio to llama.cpp" "$(echo "$spp / $lpp" | bc -l)" "$(echo "$stg / $ltg" | bc -l)"
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
