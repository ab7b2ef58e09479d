#!/usr/bin/env bash
# tests/gpu/emu/run.sh - check the CUDA kernels' logic on the CPU (no GPU, no nvcc):
# kernels/cuda/*.cu are rewritten for the pthread emulation in shim/ (to_cpp.py),
# compiled with g++ and run against the CPU reference ops (needs build/libsampler.a:
# cmake -S . -B build -DSAMPLER_CUDA=OFF && cmake --build build). -fno-operator-names:
# C headers (delta.h) use `xor` as a name.
set -euo pipefail
cd "$(dirname "$0")/../../.."
BUILD=${BUILD_DIR:-build}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
for f in kernels/cuda/*.cu; do # every kernel file: a new one needs no edit here
  python3 tests/gpu/emu/to_cpp.py "$f" "$OUT/$(basename "$f" .cu).cpp" >/dev/null
done
g++ -std=c++17 -fno-operator-names -O1 -g -U_FORTIFY_SOURCE ${EMU_FLAGS:-} -Wall -Wno-unused-function -Wno-unknown-pragmas -Wno-sign-compare -Itests/gpu/emu/shim -Iinclude -DSAMPLER_GPU_SM=90 -o "$OUT/emu_check" \
  tests/gpu/emu/emu_check.cpp tests/gpu/emu/emu.cpp "$OUT"/*.cpp "$BUILD/libsampler.a" \
  $(pkg-config --libs libmicrohttpd jansson libzstd libxxhash libpcre2-8 libutf8proc) -lpthread -lm
"$OUT/emu_check"
