#!/usr/bin/env bash
# llama_cpp_compare_fp8.sh - the CPU FP8 forward pass against llama.cpp's q8_0 and against our BF16 in
# the same run (issue #23: "CPU FP8 decode faster than BF16 and >= 1.0x llama.cpp q8_0").
#
# What it does: converts the GGUF BF16 of the random Qwen3-0.6B-shaped model (made by
# bench/llama_cpp_compare.sh) to q8_0 with llama.cpp's llama-quantize, then alternates, REPS times per
# thread count: llama-bench on the q8_0 GGUF, bench_forward at --precision bf16, bench_forward at fp8
# (quantized at load, activations quantized: what `sampler-cpu --precision fp8` runs) and at fp8-wo
# (`--weight-only`). Prints the medians of prefill P and batch-1 decode D, the ratios, and the load
# average before and after (on a shared machine say it next to the numbers).
#
# What it is not: part of CI, nor a build of llama.cpp (bench/llama_cpp_compare.sh builds it into WORK;
# run that once first).
#
# usage: bench/llama_cpp_compare_fp8.sh [MODEL_DIR] [THREADS="1 2"] [P=512] [D=32] [REPS=5]
#   env: WORK (default /tmp/llama_cpp_compare): llama.cpp's build and the GGUFs;
#        BUILD_DIR (default ./build) holds bench_forward; PRECS (default "bf16 fp8 fp8-wo");
#        PATH_NAME (default: the path `sampler-cpu --dtype auto` runs, e.g. avx512+bf16).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
MODEL=${1:-/tmp/bench/qwen3-0.6b}
THREADS=${2:-"1 2"}
P=${3:-512}
D=${4:-32}
REPS=${5:-5}
WORK=${WORK:-/tmp/llama_cpp_compare}
BUILD_DIR=${BUILD_DIR:-$REPO/build}
PRECS=${PRECS:-"bf16 fp8 fp8-wo"}

BF16_GGUF="$WORK/$(basename "$MODEL")-bf16.gguf"
Q8_GGUF="$WORK/$(basename "$MODEL")-q8_0.gguf"
# llama.cpp's build and the GGUF BF16: bench/llama_cpp_compare.sh's (one place that knows how)
[ -x "$WORK/build/bin/llama-bench" ] && [ -f "$BF16_GGUF" ] ||
  WORK="$WORK" PREPARE_ONLY=1 "$REPO/bench/llama_cpp_compare.sh" "$MODEL"
[ -x "$WORK/build/bin/llama-bench" ] && [ -f "$BF16_GGUF" ] ||
  { echo "bench/llama_cpp_compare.sh did not build llama.cpp and the GGUF BF16 into $WORK"; exit 1; }
if [ ! -x "$WORK/build/bin/llama-quantize" ]; then
  cmake --build "$WORK/build" -j"$(nproc)" --target llama-quantize >"$WORK/build-quantize.log" 2>&1
fi
if [ ! -f "$Q8_GGUF" ]; then
  "$WORK/build/bin/llama-quantize" "$BF16_GGUF" "$Q8_GGUF" q8_0 >"$WORK/quantize.log" 2>&1
fi
[ -x "$BUILD_DIR/bench_forward" ] || { echo "build bench_forward first (cmake --build build)"; exit 1; }
LLAMA_VERSION=$(basename "$(dirname "$(dirname "$(readlink -f "$WORK/llama.cpp")")")")
# the matmul path the server takes by default: the default path, with BF16 activations (+bf16) where
# --dtype auto picks them (a CPU with AVX512_BF16); they change only the BF16 lm_head of an FP8 model
if [ -z "${PATH_NAME:-}" ]; then
  PATH_NAME=$(SAMPLER_CPU_PATH= "$BUILD_DIR/test_cpu_paths" 2>/dev/null | sed -n 's/^default path: //p' || true)
  PATH_NAME=${PATH_NAME:-avx2}
  grep -qw avx512_bf16 /proc/cpuinfo && PATH_NAME=$PATH_NAME+bf16
fi

median() { sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

echo "llama.cpp: $LLAMA_VERSION (llama-bench, GGUF q8_0: $(du -m "$Q8_GGUF" | cut -f1) MB); sampler path $PATH_NAME; model $MODEL"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"
for T in $THREADS; do
  : >"$WORK/q8_pp.$T"; : >"$WORK/q8_tg.$T"
  for pr in $PRECS; do : >"$WORK/s_$pr.$T"; done
  for rep in $(seq "$REPS"); do
    # pp P from an empty cache, tg D at depth P (-d): the context bench_forward decodes at
    "$WORK/build/bin/llama-bench" -m "$Q8_GGUF" -t "$T" -p "$P" -n 0 -r 1 -o json 2>/dev/null >"$WORK/q8.json"
    "$WORK/build/bin/llama-bench" -m "$Q8_GGUF" -t "$T" -p 0 -n "$D" -d "$P" -r 1 -o json 2>/dev/null >"$WORK/q8b.json"
    python3 - "$WORK/q8.json" "$WORK/q8b.json" "$WORK/q8_pp.$T" "$WORK/q8_tg.$T" <<'EOF'
import json, sys
for path in sys.argv[1:3]:
    for r in json.load(open(path)):
        f = sys.argv[3] if r["n_prompt"] > 0 else sys.argv[4]
        open(f, "a").write(f"{r['avg_ts']}\n")
EOF
    for pr in $PRECS; do
      "$BUILD_DIR/bench_forward" "$MODEL" "$T" "$P" "$D" "$PATH_NAME" 1 "$pr" 2>/dev/null >>"$WORK/s_$pr.$T"
    done
  done
  lpp=$(median <"$WORK/q8_pp.$T"); ltg=$(median <"$WORK/q8_tg.$T")
  sbf_tg=""
  echo "== $T thread(s), medians of $REPS alternating runs"
  printf "%-30s %10s %10s %12s %12s\n" "" "prefill $P" "decode" "dec/q8_0" "dec/our bf16"
  printf "%-30s %10.1f %10.2f\n" "llama.cpp q8_0 (tok/s)" "$lpp" "$ltg"
  for pr in $PRECS; do
    spp=$(awk '/^prefill/ {print $4}' "$WORK/s_$pr.$T" | median)
    stg=$(awk '/^decode batch/ {print $6}' "$WORK/s_$pr.$T" | median)
    [ "$pr" = bf16 ] && sbf_tg=$stg
    rbf="-"
    [ -n "$sbf_tg" ] && rbf=$(printf "%.2fx" "$(echo "$stg / $sbf_tg" | bc -l)")
    printf "%-30s %10.1f %10.2f %11.2fx %12s\n" "sampler $pr (tok/s)" "$spp" "$stg" "$(echo "$stg / $ltg" | bc -l)" "$rbf"
  done
  printf "%-30s" "  prefill / q8_0"
  for pr in $PRECS; do
    spp=$(awk '/^prefill/ {print $4}' "$WORK/s_$pr.$T" | median)
    printf " %s %.2fx" "$pr" "$(echo "$spp / $lpp" | bc -l)"
  done
  echo
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
