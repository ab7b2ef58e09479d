#!/usr/bin/env bash
# tests/gpu/check.sh - the one-shot GPU check, for a machine with an NVIDIA GPU.
#
# Builds the binary that fits the GPU found (sampler-smXX and gpu_check-smXX),
# or takes prebuilt ones (SAMPLER_GPU_PREBUILT, made by tests/gpu/prebuild.sh:
# the lent GPU machines have nvcc but not the -dev packages the server links),
# then (0) serves the bundled model with sampler-smXX at bf16, fp8 and nvfp4
# (tests/gpu/server_smoke.py) and runs gpu_check from the repository root: (1) every CUDA op against its
# CPU reference op, (2) the fixture models end to end against transformers and
# the CPU backend, (3) the Qwen3-8B-shaped decode/prefill benchmark against a
# roofline measured in the same run; then (4) the served benchmark
# (bench/gpu_served.py: sampler-smXX serving a Qwen3-8B-shaped random checkpoint
# written on this machine, clients on this machine, time-boxed) and (5) writes
# bench/gpu/<gpu>.json (bench/gpu_json.py) from the outputs of 3 and 4 and
# prints it as the markdown table for bench/RESULTS.md, last.
# Budget on an H200 (prebuilt binaries): parts 0-3 about 1 minute, part 4 at
# most SERVED_BUDGET_S (default 240 s) + 40 s of grace, part 5 a second: about
# 5-6 minutes in all, never past CHECK_TOTAL_S (9 minutes) unless a part hangs
# to its timeout. Building here instead adds the CUDA build (16 cores).
#
#   tests/gpu/check.sh                 # everything
#   tests/gpu/check.sh --skip-bench    # parts 0-2 (and 4 unless --skip-served)
#   tests/gpu/check.sh --skip-served   # no part 4 (its rows are written as not measured)
#   tests/gpu/check.sh --skip-smoke    # no part 0 (the server smoke test)
#   tests/gpu/check.sh --skip-gpu-check  # no parts 1-3 (gpu_check)
#   tests/gpu/check.sh --skip-served-bf16 --served-fp8  # part 4: the fp8 configuration alone
#   PREVIOUS_RESULTS=DIR ...           # part 5 also takes an earlier run's gpu_check.json and served_*.json
#                                      # (its $OUT, same commit) for whatever this run did not produce:
#                                      # a second device call that measures what the first had no time for
#   tests/gpu/check.sh --served-fp8    # part 4 also at --precision fp8 with an FP8 KV cache (c256
#                                      # 1000x1000 only; with SERVED_BUDGET_S=120 to fit in CHECK_TOTAL_S;
#                                      # BF16 K/V would cap it at ~16,500 tok/s at the rooflines:
#                                      # bench/RESULTS.md, "The host path at device speed")
#   tests/gpu/check.sh --served-sync   # part 4 also with --no-async-scheduling (c256 1000x1000, RL
#                                      # fields off / on: rows served_bf16_sync_*, the overlap's gain)
#   SM=90 tests/gpu/check.sh           # force the architecture (no nvidia-smi)
#   SAMPLER_GPU_PREBUILT=build-gpu tests/gpu/check.sh   # use binaries built elsewhere (prebuild.sh)
#   SERVED_BUDGET_S=300 SERVED_ARGS="--window-big-s 30" tests/gpu/check.sh   # part 4's budget, more flags
#                                      # (SERVED_ARGS go to every served run)
#   SAMPLER_COMMIT=abc1234 ...         # the commit for the JSON where the tree has no .git
#   CHECK_TOTAL_S=540 ...              # the whole run's target (default 9 minutes: the device
#                                      # tool's command limit is 10): part 4 gets what is left
#   GPU_CHECK_TIMEOUT=240 GPU_CHECK_TRIES=8 ...  # parts 1-3: all gpu_check tries together, how many
#   GPU_JSON_OUT=bench/gpu ...         # where part 5 writes <gpu>.json
# Outputs, written as each part ends into $OUT when set (the device tool brings
# it back even when the call is cut short), else $BUILD: gpu_check.log,
# gpu_check.json, served_bf16.json (+ served_fp8.json, served_sync.json), served.log,
# <gpu>.json (also bench/gpu/<gpu>.json), gpu_table.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s)

skip_bench=0 skip_served=0 skip_smoke=0 served_fp8=0 served_sync=0 skip_gc=0 skip_bf16=0
gc_args=()
for a in "$@"; do
  case "$a" in
    --skip-bench) skip_bench=1; gc_args+=(--skip-bench) ;;
    --skip-served) skip_served=1 ;;
    --skip-smoke) skip_smoke=1 ;;
    --served-fp8) served_fp8=1 ;;
    --served-sync) served_sync=1 ;;
    --skip-gpu-check) skip_gc=1 ;;
    --skip-served-bf16) skip_bf16=1 ;;
    *) echo "check.sh: unknown option $a (--skip-bench, --skip-served, --skip-smoke, --skip-gpu-check," \
            "--skip-served-bf16, --served-fp8, --served-sync)" >&2; exit 2 ;;
  esac
done

gpu_name=""
if [ -z "${SM:-}" ]; then
  command -v nvidia-smi >/dev/null || { echo "check.sh: nvidia-smi not found; set SM=80|90|100|103" >&2; exit 2; }
  nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader
  gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)
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
  [ -x "$BUILD/sampler-sm$SM" ] && [ -x "$BUILD/gpu_check-sm$SM" ] || {
    echo "check.sh: $BUILD has no sampler-sm$SM / gpu_check-sm$SM (SM=$SM tests/gpu/prebuild.sh makes them)" >&2; exit 2; }
else
  BUILD=${BUILD_DIR:-build-gpu-check}
  cmake -S . -B "$BUILD" -DSAMPLER_WERROR=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$BUILD" -j"$(nproc)" --target "sampler-sm$SM" "gpu_check-sm$SM"
fi
# Shared libraries: prebuild.sh's wrappers give its binaries (in $BUILD/bin) the
# bundled ones; the CUDA libraries are this machine's, added to LD_LIBRARY_PATH
# where the loader does not find them already.
probe="$BUILD/sampler-sm$SM" libs=""
if [ -x "$BUILD/bin/sampler-sm$SM" ]; then probe="$BUILD/bin/sampler-sm$SM"; fi
if [ -d "$BUILD/lib" ]; then libs=$(cd "$BUILD/lib" && pwd); fi
missing() { LD_LIBRARY_PATH="${libs:+$libs:}${LD_LIBRARY_PATH:-}" ldd "$probe" | grep "not found"; }
if missing >/dev/null; then
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/lib64 \
           $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, q, "lib") for p in nvidia.__path__ for q in os.listdir(p)))' 2>/dev/null); do
    [ -d "$d" ] && ls "$d"/libcu* >/dev/null 2>&1 && LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  done
  export LD_LIBRARY_PATH
fi
if missing; then
  echo "check.sh: sampler-sm$SM misses the libraries above (tests/gpu/README.md: prebuilt binaries)" >&2; exit 2
fi
RES=${OUT:-$BUILD}
mkdir -p "$RES"
t1=$(date +%s)
echo "check.sh: build $((t1 - t0)) s; results in $RES"

set +e
# The product binary first (part 0): the server on the bundled model at each precision.
src=0
if [ "$skip_smoke" = 1 ]; then
  echo "== 0. server smoke test skipped (--skip-smoke) =="
else
  echo "== 0. sampler-sm$SM serving models/tiny-qwen3 (tests/gpu/server_smoke.py) =="
  for p in bf16 fp8 nvfp4; do
    # Native NVFP4 needs sm_100/103 and native FP8 sm_90+; elsewhere the binary refuses them at start-up
    # (checked below) and the weight-only path is what serves.
    wo=""
    if { [ "$p" = nvfp4 ] && [ "$SM" -lt 100 ]; } || { [ "$p" = fp8 ] && [ "$SM" = 80 ]; }; then wo="--weight-only"; fi
    timeout 60 python3 tests/gpu/server_smoke.py "$BUILD/sampler-sm$SM" --precision "$p" $wo || src=1
    if [ -n "$wo" ]; then
      out=$(timeout 60 "$BUILD/sampler-sm$SM" --precision "$p" --port 0 2>&1); rrc=$?
      if [ "$rrc" != 0 ] && [ "$rrc" != 124 ] && printf '%s' "$out" | grep -q -- "--weight-only"; then
        echo "  ok   server $p: sampler-sm$SM refuses native $p at start-up and offers --weight-only"
      else
        echo "  FAIL server $p: sampler-sm$SM did not refuse native $p with a --weight-only fix (exit $rrc)"; src=1
      fi
    fi
  done
fi
# Parts 1-3: gpu_check, in sections (tests/gpu/check_sections.h). A try that dies part-way (a
# kernel fault that breaks the CUDA context, a hang its watchdog stops, a fatal exit) leaves a JSON
# naming the step it died in; the next try, a fresh process, skips what is done and that step
# (bench/gpu_json.py resume). All tries together get GPU_CHECK_TIMEOUT (4 minutes; a clean run takes
# ~1-2), at most GPU_CHECK_TRIES of them; the tries' JSON are merged into gpu_check.json.
gc_deadline=$(( $(date +%s) + ${GPU_CHECK_TIMEOUT:-240} ))
gc_tries=() resume=() rc=0 msg=$(mktemp)
rm -f "$RES"/gpu_check.try*.json*
if [ "$skip_gc" = 1 ]; then
  echo "== 1-3. gpu_check skipped (--skip-gpu-check) =="
  rm -f "$RES/gpu_check.json"
else
  : > "$RES/gpu_check.log"
  while :; do
    n=$(( ${#gc_tries[@]} + 1 )) left=$(( gc_deadline - $(date +%s) ))
    if [ "$left" -lt 15 ]; then
      echo "check.sh: gpu_check not resumed: ${left} s left of GPU_CHECK_TIMEOUT=${GPU_CHECK_TIMEOUT:-240}" | tee -a "$RES/gpu_check.log"
      rc=1; break
    fi
    j="$RES/gpu_check.try$n.json"
    [ "$n" -gt 1 ] && echo "== gpu_check try $n: ${resume[*]} ==" | tee -a "$RES/gpu_check.log"
    timeout "$left" "$BUILD/gpu_check-sm$SM" ${gc_args[@]+"${gc_args[@]}"} --json "$j" ${resume[@]+"${resume[@]}"} \
      2>&1 | tee -a "$RES/gpu_check.log"
    gc_rc=${PIPESTATUS[0]}
    gc_tries+=("$j")
    next=$(python3 bench/gpu_json.py resume "${gc_tries[@]}" 2>"$msg"); st=$?
    tee -a "$RES/gpu_check.log" < "$msg"
    if [ "$st" = 1 ]; then [ "$gc_rc" = 0 ] || rc=1; break; fi    # the try completed (exit 1: a check failed)
    rc=1
    echo "check.sh: gpu_check try $n died (exit $gc_rc)" | tee -a "$RES/gpu_check.log"
    [ "$st" = 0 ] || break
    if [ "$n" -ge "${GPU_CHECK_TRIES:-8}" ]; then
      echo "check.sh: gpu_check not resumed: $n tries (GPU_CHECK_TRIES)" | tee -a "$RES/gpu_check.log"; break
    fi
    read -r -a resume <<< "$next"
  done
  python3 bench/gpu_json.py merge "${gc_tries[@]}" --out "$RES/gpu_check.json" || rm -f "$RES/gpu_check.json"
fi
rm -f "$RES"/gpu_check.try*.json* "$msg"
[ "$src" = 0 ] || { echo "check.sh: the server smoke test failed (above)"; rc=1; }
t2=$(date +%s)

# Part 4: the served benchmark, time-boxed by its own budget (at most what is left of
# CHECK_TOTAL_S after 45 s kept for the rest); timeout is the backstop.
served=()
budget=${SERVED_BUDGET_S:-240}
left=$(( ${CHECK_TOTAL_S:-540} - ($(date +%s) - t0) - 45 ))
[ "$left" -lt "$budget" ] && budget=$left
if [ "$skip_served" = 0 ] && [ "$budget" -lt 60 ]; then
  echo "check.sh: part 4 skipped: ${budget} s left of CHECK_TOTAL_S=${CHECK_TOTAL_S:-540}"
  skip_served=1
fi
if [ "$skip_served" = 0 ]; then
  echo "== 4. served benchmark: sampler-sm$SM, Qwen3-8B-shaped random BF16 (bench/gpu_served.py, budget ${budget} s) =="
  rm -f "$RES/served_bf16.json" "$RES/served_fp8.json" "$RES/served_sync.json"
  src4=0
  : > "$RES/served.log"
  if [ "$skip_bf16" = 1 ]; then
    echo "check.sh: the bf16 served configurations skipped (--skip-served-bf16)" | tee -a "$RES/served.log"
  else
    PYTHONUNBUFFERED=1 timeout $((budget + 40)) python3 bench/gpu_served.py --bin "$BUILD/sampler-sm$SM" \
      --gpu "$gpu_name" --budget-s "$budget" --json "$RES/served_bf16.json" ${SERVED_ARGS:-} 2>&1 | tee -a "$RES/served.log"
    src4=${PIPESTATUS[0]}
  fi
  [ -f "$RES/served_bf16.json" ] && served+=(--served "$RES/served_bf16.json")
  left=$(( ${CHECK_TOTAL_S:-540} - ($(date +%s) - t0) - 45 ))
  if [ "$served_fp8" = 1 ] && [ "$left" -lt 90 ]; then
    echo "check.sh: the fp8 served run skipped: ${left} s left of CHECK_TOTAL_S (raise it, or lower SERVED_BUDGET_S)"
  elif [ "$served_fp8" = 1 ]; then
    b8=$(( left < 150 ? left : 150 ))
    PYTHONUNBUFFERED=1 timeout $((b8 + 40)) python3 bench/gpu_served.py --bin "$BUILD/sampler-sm$SM" --gpu "$gpu_name" \
      --precision fp8 --kv-cache-dtype fp8 --shapes 1000x1000 --concurrency 256 --rl off --budget-s "$b8" \
      --json "$RES/served_fp8.json" ${SERVED_ARGS:-} 2>&1 | tee -a "$RES/served.log"
    [ -f "$RES/served_fp8.json" ] && served+=(--served "$RES/served_fp8.json")
  fi
  # --served-sync: c256 1000x1000 with async scheduling off, beside the default (async) run's rows
  left=$(( ${CHECK_TOTAL_S:-540} - ($(date +%s) - t0) - 45 ))
  if [ "$served_sync" = 1 ] && [ "$left" -lt 90 ]; then
    echo "check.sh: the sync served run skipped: ${left} s left of CHECK_TOTAL_S (raise it, or lower SERVED_BUDGET_S)"
  elif [ "$served_sync" = 1 ]; then
    bs=$(( left < 120 ? left : 120 ))
    PYTHONUNBUFFERED=1 timeout $((bs + 40)) python3 bench/gpu_served.py --bin "$BUILD/sampler-sm$SM" --gpu "$gpu_name" \
      --shapes 1000x1000 --concurrency 256 --rl off,on --budget-s "$bs" --tag sync \
      --server-args "--no-async-scheduling" --json "$RES/served_sync.json" ${SERVED_ARGS:-} 2>&1 | tee -a "$RES/served.log"
    [ -f "$RES/served_sync.json" ] && served+=(--served "$RES/served_sync.json")
  fi
  [ "$src4" = 0 ] || { echo "check.sh: the served benchmark reported errors (above, $RES/served.log)"; rc=1; }
fi
t3=$(date +%s)

# Part 5: bench/gpu/<gpu>.json and its table (rows not measured here: null, with the reason).
gc_json=()
[ -f "$RES/gpu_check.json" ] && gc_json=(--gpu-check "$RES/gpu_check.json")
# PREVIOUS_RESULTS: an earlier run's outputs (same commit) for what this run did not produce
if [ -n "${PREVIOUS_RESULTS:-}" ]; then
  if [ ! -d "$PREVIOUS_RESULTS" ]; then
    echo "check.sh: PREVIOUS_RESULTS=$PREVIOUS_RESULTS is not a folder"; rc=1
  else
    if [ ! -f "$RES/gpu_check.json" ] && [ -f "$PREVIOUS_RESULTS/gpu_check.json" ]; then
      gc_json=(--gpu-check "$PREVIOUS_RESULTS/gpu_check.json")
      echo "check.sh: part 5 takes gpu_check.json from $PREVIOUS_RESULTS (an earlier run)"
    fi
    for k in bf16 fp8 sync; do
      if [ ! -f "$RES/served_$k.json" ] && [ -f "$PREVIOUS_RESULTS/served_$k.json" ]; then
        served+=(--served "$PREVIOUS_RESULTS/served_$k.json")
        echo "check.sh: part 5 takes served_$k.json from $PREVIOUS_RESULTS (an earlier run)"
      fi
    done
  fi
fi
# the device tool's copy of the tree may have no .git: SAMPLER_COMMIT names the commit then
commit=${SAMPLER_COMMIT:-}
if [ -z "$commit" ] && commit=$(git rev-parse --short HEAD 2>/dev/null); then
  git diff --quiet HEAD -- 2>/dev/null || commit="$commit+dirty"
fi
commit=${commit:-unknown}
json=$(python3 bench/gpu_json.py write ${gc_json[@]+"${gc_json[@]}"} ${served[@]+"${served[@]}"} \
  --gpu "${gpu_name:-sm_$SM}" --commit "$commit" --out "${GPU_JSON_OUT:-bench/gpu}") || { echo "check.sh: gpu_json.py failed"; rc=1; }
set -e
if [ -n "${json:-}" ]; then
  python3 bench/gpu_json.py render "$json" > "$RES/gpu_table.md"
  [ "$(dirname "$json")" -ef "$RES" ] || cp "$json" "$RES/"
  echo
  echo "== bench/gpu table, brief ($json; every row: $RES/gpu_table.md) =="
  python3 bench/gpu_json.py render --brief "$json"
fi
echo "check.sh: build $((t1 - t0)) s, parts 0-3 $((t2 - t1)) s, served $((t3 - t2)) s;" \
     "total $(( $(date +%s) - t0 )) s, exit $rc (commit $commit)"
exit "$rc"
