#!/usr/bin/env bash
# One device run for the chunked forward (until ci/device.sh covers it): prebuilt binaries from
# build-cuda-chunked/ (carried), or built here when absent. Stages, each under its own timeout,
# logs in $OUT: diagnostics and variant checks (Python), GPU tests, accuracy + timings vs the
# peer, compute-sanitizer. Knobs: CH_STAGES (default "check tests bench sanitize"), CH_QUICK=1.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/out-chunked}
mkdir -p "$OUT"
B=build-cuda-chunked
LIB=$B/dev/libqedchunked.so
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
STAGES=${CH_STAGES:-check tests bench sanitize}
Q=()
[[ ${CH_QUICK:-0} == 1 ]] && Q=(--quick)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$OUT/env.txt" 2>&1
t0=$(date +%s)
for s in $STAGES; do
  ts=$(date +%s)
  case $s in
    check)
      PYTHONUNBUFFERED=1 timeout 150 python3 bench/bench_chunked.py --lib $LIB --out "$OUT" \
        --only diag,check "${Q[@]}" >"$OUT/check.log" 2>&1; echo "check rc=$?" ;;
    tests)
      for t in test_gpu_chunked test_gpu_chunked_props; do
        QED_GPU_QUICK=${CH_QUICK:-} timeout 240 $B/properties/$t >"$OUT/$t.log" 2>&1
        echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$t.log" | tr '\n' ' ')"
      done ;;
    bench)
      PYTHONUNBUFFERED=1 timeout 300 python3 bench/bench_chunked.py --lib $LIB --out "$OUT" \
        --only "${CH_BENCH_ONLY:-accuracy,timing}" "${Q[@]}" >"$OUT/bench.log" 2>&1; echo "bench rc=$?" ;;
    sanitize)
      for tool in memcheck racecheck initcheck; do
        QED_GPU_QUICK=1 timeout 120 compute-sanitizer --tool $tool --error-exitcode 1 \
          $B/properties/test_gpu_chunked_props \
          --gtest_filter=GpuChunkedProps.PoisonedOutputsFullyOverwritten:GpuChunkedProps.PackedEqualsSeparateAndDeterministic \
          >"$OUT/sanitizer_$tool.log" 2>&1
        echo "sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer_$tool.log" | tail -1)"
      done ;;
  esac
  echo "  ($s: $(( $(date +%s) - ts )) s)"
done
echo "total $(( $(date +%s) - t0 )) s"
grep -hE "^\[diag\]|FAILED|^\[check\]" "$OUT/check.log" 2>/dev/null | head -40
grep -hE "Failure|FAILED|Expected|Which is|relF" "$OUT"/test_gpu_chunked*.log 2>/dev/null | head -20
grep -hE "RACECHECK SUMMARY|Race reported|ERROR SUMMARY" "$OUT"/sanitizer_*.log 2>/dev/null | head
grep -hE "^\|" "$OUT/bench.log" 2>/dev/null
# At most 8 files come back: keep the tables, pack every log into one archive.
(cd "$OUT" && tar czf logs.tgz *.log env.txt 2>/dev/null && rm -f *.log)
