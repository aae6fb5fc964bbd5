#!/usr/bin/env bash
# The one device script (run on the GPU machine, from the repository root): builds the GPU side
# (bench/device: kernels, every properties/test_gpu_*.cpp, the benchmark library), runs every
# ctest test labelled `gpu` (sanitizer runs included) and every bench/bench_*.py, and prints a
# short table last. Full logs go to $OUT: build.log, tests.log, bench.log, summary.md, and
# whatever each benchmark writes under $OUT/bench/. A benchmark is called as
#   python3 bench/bench_X.py --lib-dir BUILD --out $OUT/bench
# and finds its ctypes library BUILD/lib<name>_capi.so there (bench/<name>_capi.cpp).
# Knobs: QED_DEVICE_JOBS (16), QED_DEVICE_SANITIZE=0 (skip the sanitizer tests),
# QED_DEVICE_BENCH=0 (skip benchmarks), QED_DEVICE_TESTS=0 (skip tests),
# QED_DEVICE_TEST_REGEX (ctest -R filter), QED_DEVICE_BENCH_GLOB (bench_*.py),
# QED_DEVICE_TEST_TIMEOUT (s per ctest test, 600), QED_GTEST_SOURCE (googletest sources when
# GoogleTest is not installed; default .devdeps/googletest).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/out-device}
BUILD=${QED_DEVICE_BUILD:-/tmp/qed-device-build}
JOBS=${QED_DEVICE_JOBS:-16}
mkdir -p "$OUT/bench" "$BUILD"
export PATH=/usr/local/cuda/bin:$PATH
export QED_GTEST_SOURCE=${QED_GTEST_SOURCE:-$ROOT/.devdeps/googletest}
SUMMARY=$OUT/summary.md
: >"$SUMMARY"
t0=$(date +%s)
say() { echo "$@" | tee -a "$SUMMARY"; }

{
  echo "== $(date -u +%FT%TZ) $(uname -m)"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv 2>&1
  nvcc --version | tail -2
  g++ --version | head -1
  cmake --version | head -1
  git -C "$ROOT" log -1 --format='commit %h %s' 2>/dev/null
} >"$OUT/build.log" 2>&1

build_ok=1
if ! cmake -S "$ROOT/bench/device" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    >>"$OUT/build.log" 2>&1; then
  build_ok=0
fi
if [[ $build_ok == 1 ]]; then
  ninja -C "$BUILD" -j"$JOBS" -k 0 device_all >>"$OUT/build.log" 2>&1 || build_ok=0
fi
t1=$(date +%s)

test_status="skipped"
if [[ ${QED_DEVICE_TESTS:-1} != 0 && -f "$BUILD/CTestTestfile.cmake" ]]; then
  tmo=${QED_DEVICE_TEST_TIMEOUT:-600}
  filter=()
  [[ -n ${QED_DEVICE_TEST_REGEX:-} ]] && filter=(-R "$QED_DEVICE_TEST_REGEX")
  (cd "$BUILD" && timeout "${QED_DEVICE_CTEST_BUDGET:-420}" ctest -L gpu -LE sanitizer "${filter[@]}" -V \
      --timeout "$tmo") >"$OUT/tests.log" 2>&1
  test_status="rc=$?"
  if [[ ${QED_DEVICE_SANITIZE:-1} != 0 ]]; then
    (cd "$BUILD" && timeout "${QED_DEVICE_SANITIZER_BUDGET:-300}" ctest -L sanitizer "${filter[@]}" -V \
        --timeout "$tmo") >>"$OUT/tests.log" 2>&1
    test_status+=", sanitizer rc=$?"
  fi
fi
t2=$(date +%s)

bench_status="skipped"
: >"$OUT/bench.log"
if [[ ${QED_DEVICE_BENCH:-1} != 0 ]]; then
  bench_status=""
  for b in "$ROOT"/bench/${QED_DEVICE_BENCH_GLOB:-bench_*.py}; do
    [[ -e "$b" ]] || continue
    name=$(basename "$b" .py)
    echo "== $name" >>"$OUT/bench.log"
    PYTHONUNBUFFERED=1 timeout "${QED_DEVICE_BENCH_BUDGET:-300}" python3 "$b" --lib-dir "$BUILD" --out "$OUT/bench" \
      >"$OUT/bench/$name.stdout" 2>>"$OUT/bench.log"
    rc=$?
    cat "$OUT/bench/$name.stdout" >>"$OUT/bench.log"
    rm -f "$OUT/bench/$name.stdout"
    bench_status+="$name rc=$rc; "
  done
fi
t3=$(date +%s)

say "## device run $(date -u +%FT%TZ): $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
say ""
say "build: $([[ $build_ok == 1 ]] && echo ok || echo FAILED, see build.log) ($((t1 - t0)) s); tests: $test_status ($((t2 - t1)) s); bench: $bench_status ($((t3 - t2)) s)"
if [[ $build_ok != 1 ]]; then
  grep -E "error|FAILED" "$OUT/build.log" | head -20 | tee -a "$SUMMARY"
fi
if [[ -s "$OUT/tests.log" ]]; then
  say ""
  say "| test | result | seconds |"
  say "| --- | --- | --- |"
  grep -E "^ *[0-9]+/[0-9]+ Test +#[0-9]+:" "$OUT/tests.log" |
    sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+) \.+ *(\*\*\*)?([A-Za-z ]+[A-Za-z]).* ([0-9.]+) sec.*/| \1 | \3 | \4 |/' |
    sort | tee -a "$SUMMARY"
  grep -E "tests passed|tests failed" "$OUT/tests.log" | tail -1 | tee -a "$SUMMARY"
  grep -c "\[case\]" "$OUT/tests.log" | sed 's/^/oracle cases checked: /' | tee -a "$SUMMARY"
fi
if [[ -s "$OUT/bench.log" ]]; then
  say ""
  grep -E "^\|" "$OUT/bench.log" | tee -a "$SUMMARY"
fi
