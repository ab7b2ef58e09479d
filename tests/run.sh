#!/usr/bin/env bash
# The test command (README): build everything with warnings as errors, run every
# test under ctest. SANITIZE=1 builds into build-asan with ASan+UBSan instead.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=build; extra=()
if [ "${SANITIZE:-0}" = 1 ]; then
  dir=build-asan; extra=(-DSAMPLER_SANITIZE=ON -DSAMPLER_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo)
fi
cmake -S . -B "$dir" -DSAMPLER_WERROR=ON "${extra[@]}" >/dev/null
cmake --build "$dir" -j"$(nproc)"
ctest --test-dir "$dir" --output-on-failure
