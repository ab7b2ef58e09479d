#!/usr/bin/env bash
# tests/gpu/prebuild.sh - build the GPU binaries on a machine with the build
# dependencies (.ci/deps) and nvcc, for a GPU machine that has nvcc and the CUDA
# libraries but not the -dev packages (the lent H200s: tests/gpu/README.md).
#
#   SM=90 tests/gpu/prebuild.sh [OUT]      # default OUT=build-gpu (ignored by git: /build*/)
#
# OUT gets bin/sampler-smXX and bin/gpu_check-smXX, the shared libraries they
# need that are neither glibc nor CUDA's (lib/: libmicrohttpd, jansson, zstd,
# xxhash, pcre2, utf8proc, gnutls and its dependencies, libcrypto, libstdc++),
# and two wrappers OUT/sampler-smXX and OUT/gpu_check-smXX that run the binaries
# with lib/ first on LD_LIBRARY_PATH (so only they see the bundled copies, not
# the Python that check.sh also runs). CUDA's libraries (cudart, cuBLAS,
# cuBLASLt) come from the GPU machine, whose driver they must match. Then:
#   device run: carry [OUT], command SAMPLER_GPU_PREBUILT=OUT tests/gpu/check.sh
# About 15 MB; the objects stay in $BUILD_DIR (default build-cuda).
set -euo pipefail
cd "$(dirname "$0")/../.."
SM=${SM:-90}
SRC=${BUILD_DIR:-build-cuda}
OUT=${1:-build-gpu}
t0=$(date +%s)
cmake -S . -B "$SRC" -DSAMPLER_WERROR=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$SRC" -j"$(nproc)" --target "sampler-sm$SM" "gpu_check-sm$SM"
rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib"
for b in "sampler-sm$SM" "gpu_check-sm$SM"; do
  cp "$SRC/$b" "$OUT/bin/"
  cat > "$OUT/$b" <<WRAP
#!/bin/sh
# prebuild.sh's wrapper: the bundled libraries for this binary only
d=\$(dirname "\$(readlink -f "\$0")")
LD_LIBRARY_PATH="\$d/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$d/bin/$b" "\$@"
WRAP
  chmod +x "$OUT/$b"
done
ldd "$OUT/bin/sampler-sm$SM" "$OUT/bin/gpu_check-sm$SM" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    case "$name" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libcuda.so*|libcudart.so*|libcublas*|libnvidia*) ;;
      *) cp -L "$path" "$OUT/lib/$name" ;;
    esac
  done
echo "prebuild.sh: $OUT ($(du -sh "$OUT" | cut -f1)) in $(( $(date +%s) - t0 )) s:"
ls "$OUT" "$OUT/bin" "$OUT/lib"
