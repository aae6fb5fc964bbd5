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
# QED_DEVICE_ARGS_<bench name> (extra arguments of one benchmark, e.g.
# QED_DEVICE_ARGS_bench_chunked="--only timing"), QED_DEVICE_TEST_TIMEOUT (s per ctest test, 600), QED_GTEST_SOURCE (googletest sources when
# GoogleTest is not installed; default .devdeps/googletest), QED_DEVICE_QEDCHECK=0 (skip the
# qedcheck stage below), QED_DEVICE_CERTIFY=0 / QED_DEVICE_FLA=0 (skip its certification / its
# chunk_gdn2 verdict).
# The peer: flash-linear-attention is installed from the wheels in .whl/ (carry it) into
# /tmp/qed-site when `import fla` fails. qedcheck itself: when .devbundle/ is carried
# (ci/device_bundle.sh packs the CUDA-enabled binary built on the CPU machine), the script also
# runs the GPU gate (every committed certificate, --require-all, the fresh benchmark tables
# against reports/bench/), certifies the CUDA kernels (`certify --quick`, into
# $OUT/certificates, packed as certificates.tar) and gates those fresh certificates, replays
# the golden corpus against both CUDA kernels in fp32 and bf16 (`qedcheck golden --replay`;
# $OUT/golden_replay.log; QED_DEVICE_GOLDEN=0 skips it) and judges chunk_gdn2 with
# `qedcheck verify` (examples/python/dump_fla_gdn2.py; $OUT/fla_verdict.*).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/out-device}
BUILD=${QED_DEVICE_BUILD:-/tmp/qed-device-build}
JOBS=${QED_DEVICE_JOBS:-16}
mkdir -p "$OUT/bench" "$BUILD"
export PATH=/usr/local/cuda/bin:$PATH
export QED_GTEST_SOURCE=${QED_GTEST_SOURCE:-$ROOT/.devdeps/googletest}
SUMMARY=$OUT/summary.md
source "$ROOT/ci/peer_site.sh"
peer_site "$ROOT" "$OUT/pip.log"
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
  # QED_DEVICE_TARGETS: build only these ninja targets (default device_all: every GPU test and benchmark)
  ninja -C "$BUILD" -j"$JOBS" -k 0 ${QED_DEVICE_TARGETS:-device_all} >>"$OUT/build.log" 2>&1 || build_ok=0
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
    extra_var="QED_DEVICE_ARGS_$name"
    read -r -a extra <<<"${!extra_var:-}"
    PYTHONUNBUFFERED=1 timeout "${QED_DEVICE_BENCH_BUDGET:-300}" python3 "$b" --lib-dir "$BUILD" --out "$OUT/bench" \
      "${extra[@]}" >"$OUT/bench/$name.stdout" 2>>"$OUT/bench.log"
    rc=$?
    cat "$OUT/bench/$name.stdout" >>"$OUT/bench.log"
    rm -f "$OUT/bench/$name.stdout"
    bench_status+="$name rc=$rc; "
  done
fi
t3=$(date +%s)

# qedcheck on the device (see the header): certificates of the CUDA kernels, the GPU gate, and
# the verdict on flash-linear-attention's chunk_gdn2.
QC=$ROOT/.devbundle/qedcheck
qc_status="skipped (no .devbundle)"
if [[ -x $QC && ${QED_DEVICE_QEDCHECK:-1} != 0 ]]; then
  qc_status=""
  mkdir -p "$OUT/certificates"
  # The gate over the committed certificates first (about 15 s): its verdict is what this stage is
  # for, and it must not wait on certify (run 19 of reports/device/chunked.md lost it to a
  # timeout during certify). Then the fresh certificates, then gated in turn.
  gate_certs=()
  for c in "$ROOT"/reports/certificates/*.json; do
    [[ -e $c ]] && gate_certs+=(--certificate "$c")
  done
  : >"$OUT/gate.log"
  # once per fresh benchmark table (against its committed twin), or once without any
  tables=()
  for t in recurrent:bench_recurrent chunked_forward:chunked_forward; do
    [[ -f $OUT/bench/${t##*:}.md ]] && tables+=("$t")
  done
  [[ ${#tables[@]} -eq 0 ]] && tables=(none:none)
  for t in "${tables[@]}"; do
    base=${t%%:*} fresh=${t##*:}
    bench=()
    [[ -f $OUT/bench/$fresh.md ]] && bench=(--bench-table "$OUT/bench/$fresh.md" --bench-baseline "$ROOT/reports/bench/$base.md")
    echo "== gate, committed certificates, ${bench[*]:-no benchmark table}" >>"$OUT/gate.log"
    timeout 300 "$QC" gate "${gate_certs[@]}" --require-all --threads "$JOBS" -q "${bench[@]}" >>"$OUT/gate.log" 2>&1
    qc_status+="gate($base) rc=$?; "
  done
  if [[ ${QED_DEVICE_CERTIFY:-1} != 0 ]]; then
    timeout "${QED_DEVICE_CERTIFY_BUDGET:-300}" "$QC" certify --impl cuda-recurrent cuda-chunked --quick \
      --out "$OUT/certificates" --threads "$JOBS" >"$OUT/certify.log" 2>&1
    qc_status+="certify rc=$?; "
    fresh_certs=()
    for c in "$OUT"/certificates/*.json; do
      [[ -e $c ]] && fresh_certs+=(--certificate "$c")
    done
    if [[ ${#fresh_certs[@]} -gt 0 ]]; then
      echo "== gate, fresh certificates" >>"$OUT/gate.log"
      timeout 300 "$QC" gate "${fresh_certs[@]}" --require-all --threads "$JOBS" -q --no-exact >>"$OUT/gate.log" 2>&1
      qc_status+="gate(fresh) rc=$?; "
    fi
  fi
  # The golden corpus replayed against every CUDA kernel, fp32 and bf16 inputs (head sizes the
  # kernels are not built for run zero-padded, verify/head_padding.hpp).
  if [[ ${QED_DEVICE_GOLDEN:-1} != 0 ]]; then
    : >"$OUT/golden_replay.log"
    for impl in cuda-recurrent cuda-chunked; do
      for dt in fp32 bf16; do
        echo "== $impl $dt" >>"$OUT/golden_replay.log"
        timeout 300 "$QC" golden --replay "$ROOT/fixtures/golden" --impl "$impl" --dtype "$dt" --threads "$JOBS" \
          --json "$OUT/golden_${impl}_${dt}.json" >>"$OUT/golden_replay.log" 2>&1
        qc_status+="golden($impl,$dt) rc=$?; "
      done
    done
  fi
  # The device tool brings back no file whose name holds '+' (cuda-chunked+bf16.json): pack them.
  if compgen -G "$OUT/certificates/*" >/dev/null; then
    tar -C "$OUT" -cf "$OUT/certificates.tar" certificates && rm -rf "$OUT/certificates"
  fi
  if [[ ${QED_DEVICE_FLA:-1} == 0 ]]; then
    qc_status+="fla verdict skipped; "
  elif python3 -c "import fla" >/dev/null 2>&1; then
    PYTHONUNBUFFERED=1 timeout "${QED_DEVICE_FLA_BUDGET:-400}" python3 "$ROOT/examples/python/dump_fla_gdn2.py" \
      --out "$OUT/fla_chunk_gdn2.h5" >"$OUT/fla_dump.log" 2>&1
    qc_status+="fla dump rc=$?; "
    if [[ -f $OUT/fla_chunk_gdn2.h5 ]]; then
      "$QC" verify "$OUT/fla_chunk_gdn2.h5" --json "$OUT/fla_verdict.json" >"$OUT/fla_verdict.txt" 2>&1
      qc_status+="fla verify rc=$?; "
    fi
  else
    qc_status+="fla not importable; "
  fi
fi
t4=$(date +%s)

say "## device run $(date -u +%FT%TZ): $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
say ""
say "build: $([[ $build_ok == 1 ]] && echo ok || echo FAILED, see build.log) ($((t1 - t0)) s); tests: $test_status ($((t2 - t1)) s); bench: $bench_status ($((t3 - t2)) s); qedcheck: $qc_status ($((t4 - t3)) s)"
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
if [[ -s $OUT/gate.log ]]; then
  say ""
  grep -E "^(==|gate|PASS|FAIL|REGRESS)|^\|" "$OUT/gate.log" | head -60 | tee -a "$SUMMARY"
fi
if [[ -s $OUT/golden_replay.log ]]; then
  say ""
  say "golden corpus replayed against the CUDA kernels:"
  grep -E "^replay (PASS|FAIL)|error" "$OUT/golden_replay.log" | tee -a "$SUMMARY"
fi
if [[ -s $OUT/fla_verdict.txt ]]; then
  say ""
  say "qedcheck verify on chunk_gdn2 (flash-linear-attention), bf16:"
  tee -a "$SUMMARY" <"$OUT/fla_verdict.txt"
fi
