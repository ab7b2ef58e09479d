#!/usr/bin/env bash
# tests/gpu/check.sh - the one-shot GPU check, for a machine with an NVIDIA GPU.
#
# Builds the binary that fits the GPU found (sampler-smXX and gpu_check-smXX),
# then (0) serves the bundled model with sampler-smXX at bf16, fp8 and nvfp4
# (tests/gpu/server_smoke.py) and runs gpu_check from the repository root: (1) every CUDA op against its
# CPU reference op, (2) the fixture models end to end against transformers and
# the CPU backend, (3) the Qwen3-8B-shaped decode/prefill benchmark against a
# roofline measured in the same run. The summary table is printed last and
# kept in $BUILD/gpu_check.log. Budget: under 8 minutes on an H200 (build ~2,
# parts 1-2 under 1, bench ~1).
#
#   tests/gpu/check.sh                 # build + all three parts
#   tests/gpu/check.sh --skip-bench    # parts 1-2 only
#   SM=90 tests/gpu/check.sh           # force the architecture (no nvidia-smi)
#   SAMPLER_GPU_PREBUILT=build-gpu tests/gpu/check.sh   # use binaries built elsewhere
set -euo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s)

if [ -z "${SM:-}" ]; then
  command -v nvidia-smi >/dev/null || { echo "check.sh: nvidia-smi not found; set SM=80|90|100|103" >&2; exit 2; }
  nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1 | tr -d ' ')
  case "$cc" in
    8.*) SM=80 ;;
    9.0) SM=90 ;;
    10.0) SM=100 ;;
    10.3) SM=103 ;;
    *) echo "check.sh: compute capability '$cc' has no sampler binary (A100 8.x, H100/H200 9.0, B200 10.0, B300 10.3)" >&2
       exit 2 ;;
  esac
fi
echo "check.sh: architecture sm_$SM -> sampler-sm$SM, gpu_check-sm$SM"

if [ -n "${SAMPLER_GPU_PREBUILT:-}" ]; then
  BUILD=$SAMPLER_GPU_PREBUILT
else
  BUILD=${BUILD_DIR:-build-gpu-check}
  cmake -S . -B "$BUILD" -DSAMPLER_WERROR=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$BUILD" -j"$(nproc)" --target "sampler-sm$SM" "gpu_check-sm$SM"
fi
t1=$(date +%s)
echo "check.sh: build $((t1 - t0)) s"

set +e
# The product binary first (part 0): the server on the bundled model at each precision.
echo "== 0. sampler-sm$SM serving models/tiny-qwen3 (tests/gpu/server_smoke.py) =="
src=0
for p in bf16 fp8 nvfp4; do
  # Native NVFP4 needs sm_100/103 and native FP8 sm_90+; elsewhere the binary refuses them at start-up
  # (checked below) and the weight-only path is what serves.
  wo=""
  if { [ "$p" = nvfp4 ] && [ "$SM" -lt 100 ]; } || { [ "$p" = fp8 ] && [ "$SM" = 80 ]; }; then wo="--weight-only"; fi
  timeout 120 python3 tests/gpu/server_smoke.py "$BUILD/sampler-sm$SM" --precision "$p" $wo || src=1
  if [ -n "$wo" ]; then
    out=$(timeout 60 "$BUILD/sampler-sm$SM" --precision "$p" --port 0 2>&1); rrc=$?
    if [ "$rrc" != 0 ] && [ "$rrc" != 124 ] && printf '%s' "$out" | grep -q -- "--weight-only"; then
      echo "  ok   server $p: sampler-sm$SM refuses native $p at start-up and offers --weight-only"
    else
      echo "  FAIL server $p: sampler-sm$SM did not refuse native $p with a --weight-only fix (exit $rrc)"; src=1
    fi
  fi
done
# A hung kernel must not eat the GPU session: the run itself gets 6 minutes.
timeout "${GPU_CHECK_TIMEOUT:-360}" "$BUILD/gpu_check-sm$SM" "$@" 2>&1 | tee "$BUILD/gpu_check.log"
rc=${PIPESTATUS[0]}
[ "$src" = 0 ] || { echo "check.sh: the server smoke test failed (above)"; rc=1; }
set -e
echo "check.sh: total $(( $(date +%s) - t0 )) s, exit $rc (commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
exit "$rc"
