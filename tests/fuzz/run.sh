#!/usr/bin/env bash
# Build every tests/fuzz/fuzz_*.c as a libFuzzer target (clang, ASan+UBSan)
# into build-fuzz/ and run each for FUZZ_SECONDS (default 60) from its seed
# corpus (tests/fuzz/corpus/<name>/, copied so the committed seeds stay as
# they are). Any crash, leak or UB fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${FUZZ_SECONDS:-60}
CC=clang cmake -S . -B build-fuzz -DSAMPLER_FUZZ=ON -DSAMPLER_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target fuzz_targets
for src in tests/fuzz/fuzz_*.c; do
  name=$(basename "$src" .c); short=${name#fuzz_}
  work=build-fuzz/corpus/$short; mkdir -p "$work"
  [ -d tests/fuzz/corpus/$short ] && cp -n tests/fuzz/corpus/$short/* "$work"/ 2>/dev/null || true
  echo "fuzz $name for ${secs}s"
  rc=0
  ./build-fuzz/$name -max_total_time="$secs" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix=build-fuzz/ "$work" >build-fuzz/$name.log 2>&1 || rc=$?
  grep -E "^(stat::number_of_executed_units|stat::peak_rss|==[0-9]+==|SUMMARY)" build-fuzz/$name.log || true
  if [ "$rc" -ne 0 ]; then tail -40 build-fuzz/$name.log; echo "fuzz $name FAILED (rc $rc)"; exit 1; fi
done
echo "fuzz: all targets ran ${secs}s without a crash"
