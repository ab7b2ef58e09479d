#!/usr/bin/env bash
# The test command (README). Builds with warnings as errors and runs every test
# under ctest, twice: a release build (build/, with the CUDA targets when nvcc
# is found) and an ASan+UBSan build (build-asan/, CPU only), where any leak or
# undefined behaviour fails; then every libFuzzer target for FUZZ_SECONDS
# (default 30) each when clang is installed. QUICK=1 skips both extra passes.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

cmake -S . -B build -DSAMPLER_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure

if [ "${QUICK:-0}" != 1 ]; then
  cmake -S . -B build-asan -DSAMPLER_WERROR=ON -DSAMPLER_SANITIZE=ON -DSAMPLER_CUDA=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build build-asan -j"$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure
  if command -v clang >/dev/null; then
    FUZZ_SECONDS=${FUZZ_SECONDS:-30} ./tests/fuzz/run.sh
  fi
fi
