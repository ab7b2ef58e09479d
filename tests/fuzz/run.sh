#!/usr/bin/env bash
# Build every tests/fuzz/fuzz_*.c as a libFuzzer target (clang, ASan+UBSan)
# into build-fuzz/ and run each for FUZZ_SECONDS (default 60) from its seed
# corpus (tests/fuzz/corpus/<name>/, copied so the committed seeds stay as
# they are), FUZZ_JOBS (default: the core count) targets at a time (each
# fuzzer is one process on one core). Any crash, leak or UB fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${FUZZ_SECONDS:-60}
jobs=${FUZZ_JOBS:-$(nproc)}
CC=clang cmake -S . -B build-fuzz -DSAMPLER_FUZZ=ON -DSAMPLER_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target fuzz_targets

# one target: its log in build-fuzz/NAME.log, its exit status in build-fuzz/NAME.rc
fuzz_one() {
  local name=$1 short=${1#fuzz_} rc=0
  local work=build-fuzz/corpus/$short
  mkdir -p "$work"
  [ -d tests/fuzz/corpus/$short ] && cp -n tests/fuzz/corpus/$short/* "$work"/ 2>/dev/null || true
  ./build-fuzz/$name -max_total_time="$secs" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix=build-fuzz/ "$work" >build-fuzz/$name.log 2>&1 || rc=$?
  echo "$rc" >build-fuzz/$name.rc
}

names=()
for src in tests/fuzz/fuzz_*.c; do names+=("$(basename "$src" .c)"); done
for ((i = 0; i < ${#names[@]}; i += jobs)); do
  for name in "${names[@]:i:jobs}"; do
    echo "fuzz $name for ${secs}s"
    fuzz_one "$name" &
  done
  wait
done
failed=0
for name in "${names[@]}"; do
  echo "== $name"
  grep -E "^(stat::number_of_executed_units|stat::peak_rss|==[0-9]+==|SUMMARY)" build-fuzz/$name.log || true
  rc=$(cat build-fuzz/$name.rc)
  if [ "$rc" -ne 0 ]; then tail -40 build-fuzz/$name.log; echo "fuzz $name FAILED (rc $rc)"; failed=1; fi
done
[ "$failed" = 0 ] || exit 1
echo "fuzz: all targets ran ${secs}s without a crash"
