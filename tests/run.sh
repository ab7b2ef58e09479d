#!/usr/bin/env bash
# The test command (README). Builds with warnings as errors and runs every test
# under ctest: a release build (build/, with the CUDA targets when nvcc is
# found), then an ASan+UBSan build (build-asan/, CPU only) where any leak or
# undefined behaviour fails (the emulation's second half, cuda_emu_2, runs only
# there: see below), then a ThreadSanitizer build (build-tsan/) of the
# tests where threads meet (engine, block manager, sampling, the tokenizer's
# cache, the server tests),
# then every libFuzzer target for FUZZ_SECONDS (default 30) each when clang is
# installed. Each ctest pass runs nproc tests at a time (pytest and the CUDA
# emulation, the long ones, start first: their COST in CMakeLists.txt), the
# fuzzers nproc at a time. QUICK=1 runs the release pass only.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
# phase NAME: how long the previous phase took (the CI log shows where the time goes)
t0=$SECONDS; last=$SECONDS
phase() { echo "== run.sh: $1 (previous phase $((SECONDS - last)) s, total $((SECONDS - t0)) s)"; last=$SECONDS; }
trap 'phase "exit $?"' EXIT

phase "release build"

cmake -S . -B build -DSAMPLER_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
phase "release tests"
# cuda_emu_2 (the emulation's second half, whole) runs in the ASan pass below: the same checks of the
# same code (the emulation at -O1 in both builds), under ASan + UBSan; here only when that pass does not run
release_skip=()
[ "${QUICK:-0}" != 1 ] && release_skip=(-E '^cuda_emu_2$')
ctest --test-dir build -j"$jobs" --output-on-failure ${release_skip[@]+"${release_skip[@]}"}

if [ "${QUICK:-0}" != 1 ]; then
  phase "ASan build"
  cmake -S . -B build-asan -DSAMPLER_WERROR=ON -DSAMPLER_SANITIZE=ON -DSAMPLER_CUDA=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build build-asan -j"$jobs"
  phase "ASan tests"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan -j"$jobs" --output-on-failure

  phase "TSan build"
  cmake -S . -B build-tsan -DSAMPLER_WERROR=ON -DSAMPLER_TSAN=ON -DSAMPLER_CUDA=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  tsan_tests="test_engine test_block_manager test_sampling test_grammar test_scheduler test_lora test_tokenizer"
  # only what the TSan pass runs: those tests, and the server and trainer that its pytest subset starts
  # shellcheck disable=SC2086 # one word per target
  cmake --build build-tsan -j"$jobs" --target sampler-cpu trainer $tsan_tests
  phase "TSan tests"
  TSAN_OPTIONS=halt_on_error=1:exitcode=66 \
    ctest --test-dir build-tsan -j"$jobs" --output-on-failure -R "^(${tsan_tests// /|}|pytest)\$"

  if command -v clang >/dev/null; then
    phase "fuzz"
    FUZZ_SECONDS=${FUZZ_SECONDS:-30} ./tests/fuzz/run.sh
  fi
fi
