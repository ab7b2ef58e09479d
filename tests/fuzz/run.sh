#!/usr/bin/env bash
# Build every tests/fuzz/fuzz_*.c as a libFuzzer target (clang, ASan+UBSan)
# into build-fuzz/ and run each for FUZZ_SECONDS (default 60) from its seed
# corpus (tests/fuzz/corpus/<name>/, copied so the committed seeds stay as
# they are), FUZZ_JOBS (default: the core count) processes at a time (each
# fuzzer is one process on one core). The last round's targets, fewer than
# the jobs, each run as jobs / (their count) processes side by side for that
# share of FUZZ_SECONDS, on the one corpus directory (as libFuzzer's own -jobs
# do): every target gets its FUZZ_SECONDS of a core and no core waits (7
# targets on 2 cores: 105 s, not 120). Any crash, leak or UB fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${FUZZ_SECONDS:-60}
jobs=${FUZZ_JOBS:-$(nproc)}
CC=clang cmake -S . -B build-fuzz -DSAMPLER_FUZZ=ON -DSAMPLER_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target fuzz_targets

# one process of target NAME for SECS: its log in build-fuzz/NAME.I.log, its exit status in build-fuzz/NAME.I.rc
fuzz_one() {
  local name=$1 secs=$2 inst=$3 short=${1#fuzz_} rc=0
  local work=build-fuzz/corpus/$short
  "./build-fuzz/$name" -max_total_time="$secs" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix=build-fuzz/ "$work" >"build-fuzz/$name.$inst.log" 2>&1 || rc=$?
  echo "$rc" >"build-fuzz/$name.$inst.rc"
}

names=()
for src in tests/fuzz/fuzz_*.c; do names+=("$(basename "$src" .c)"); done
rm -f build-fuzz/fuzz_*.log build-fuzz/fuzz_*.rc
for name in "${names[@]}"; do
  short=${name#fuzz_}
  mkdir -p "build-fuzz/corpus/$short"
  [ -d "tests/fuzz/corpus/$short" ] && cp -n "tests/fuzz/corpus/$short"/* "build-fuzz/corpus/$short/" 2>/dev/null || true
done
n=${#names[@]}
full=$((n / jobs * jobs))
for ((i = 0; i < n; i += jobs)); do
  split=1
  [ "$i" -ge "$full" ] && split=$((jobs / (n - full)))
  part=$(((secs + split - 1) / split))
  for name in "${names[@]:i:jobs}"; do
    echo "fuzz $name for ${secs}s ($split x ${part}s)"
    for ((k = 0; k < split; k++)); do fuzz_one "$name" "$part" "$k" & done
  done
  wait
done
failed=0
for name in "${names[@]}"; do
  for rcf in "build-fuzz/$name".*.rc; do
    log=${rcf%.rc}.log
    echo "== $name (${log#build-fuzz/})"
    grep -E "^(stat::number_of_executed_units|stat::peak_rss|==[0-9]+==|SUMMARY)" "$log" || true
    rc=$(cat "$rcf")
    if [ "$rc" -ne 0 ]; then tail -40 "$log"; echo "fuzz $name FAILED (rc $rc)"; failed=1; fi
  done
done
[ "$failed" = 0 ] || exit 1
echo "fuzz: all targets ran ${secs}s without a crash"
