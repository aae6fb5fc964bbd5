#!/usr/bin/env bash
# Parser fuzzing: builds the libFuzzer harnesses (fuzz/harness_*.cpp) in build-sanitize/ (the
# `sanitize` preset: clang-14, ASan + UBSan + fuzzer coverage, CUDA off; the same build that
# ci/sanitize.sh runs the CPU suite in), runs each for a fixed share
# of TOTAL seconds from the seeds in fuzz/seeds/, and records executions and findings:
#   fuzz_case_reader  read_case on arbitrary bytes, in process (50% of the time)
#   fuzz_tolerance    tolerance and certificate readers on arbitrary text (25%)
#   fuzz_cli          the CLI11 app with every verb on arbitrary argv (25%)
# Every crash artifact is replayed and classified by its first frame: our code (a failure of this
# script) or libhdf5 1.10 itself (known unsafe on damaged files; the CLI reads cases in an isolated
# child for that reason). Every case-loader artifact (crash, OOM, timeout, leak) is then replayed
# through the production reader, `qedcheck verify FILE`, which must answer with exit 0, 1 or 2,
# never crash, hang or exit 3 (needs a qedcheck binary; default build/cli/qedcheck; at most two
# timeout artifacts are replayed, each costs the reader's 30 s watchdog).
# Usage: ci/fuzz_parsers.sh [TOTAL_SECONDS=60] [QEDCHECK_BINARY]
# Results: build-sanitize/fuzz-run/summary.md (and each harness's log and artifacts beside it).
set -euo pipefail
cd "$(dirname "$0")/.."
total=${1:-60}
qedcheck=${2:-build/cli/qedcheck}
build=${QEDCHECK_FUZZ_BUILD:-build-sanitize}
jobs=${QEDCHECK_JOBS:-2}
harnesses=(fuzz_case_reader fuzz_tolerance fuzz_cli)

start=$(date +%s)
if [[ ! -f $build/CMakeCache.txt ]]; then
  if [[ $build == build-sanitize ]]; then
    cmake --preset sanitize >/dev/null
  else
    cmake -S . -B "$build" --preset sanitize >/dev/null
  fi
fi
cmake --build "$build" -j "$jobs" --target "${harnesses[@]}"
built=$(date +%s)

run=$build/fuzz-run
rm -rf "$run"
mkdir -p "$run"
root=$(pwd)

# By the first stack frame that is ours (a source path under this repository) or libhdf5's.
classify() {  # harness artifact -> ours | libhdf5 | not-reproducible
  local out
  out=$(timeout 60 "$1" -runs=2 "$2" 2>&1 || true)
  if ! grep -qE "ERROR: (AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|libFuzzer)|runtime error:|terminate called" <<<"$out"; then
    echo not-reproducible
    return
  fi
  # An escaped exception or a UBSan report is always ours (libhdf5 is not UBSan-instrumented).
  if grep -qE "terminate called|runtime error:" <<<"$out"; then
    echo ours
  elif grep -E "^ +#[0-9]+ 0x" <<<"$out" | grep -E "libhdf5| $root/" | head -1 | grep -q libhdf5; then
    echo libhdf5
  else
    echo ours
  fi
}

status=0
printf '| harness | seconds | executions | crashes: ours | crashes: libhdf5 | not reproducible | OOM | timeouts | production replay |\n' >"$run/summary.md"
printf '|---|---|---|---|---|---|---|---|---|\n' >>"$run/summary.md"
for h in "${harnesses[@]}"; do
  case $h in
    fuzz_case_reader) secs=$((total / 2)); seeds=fuzz/seeds/case; leaks=0 ;;  # libhdf5 keeps global state
    fuzz_tolerance) secs=$((total / 4)); seeds=fuzz/seeds/tolerance; leaks=1 ;;
    fuzz_cli) secs=$((total - total / 2 - total / 4)); seeds=fuzz/seeds/cli; leaks=1 ;;
  esac
  mkdir -p "$run/$h/corpus" "$run/$h/artifacts"
  "$build/fuzz/$h" -fork=1 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1 -timeout=3 \
    -rss_limit_mb=2048 -detect_leaks=$leaks -max_total_time="$secs" \
    -artifact_prefix="$run/$h/artifacts/" "$run/$h/corpus" "$seeds" >"$run/$h/log" 2>&1 || true
  execs=$(grep -oE "^#[0-9]+:" "$run/$h/log" | tail -1 | tr -d '#:')
  ours=0 hdf5=0 flaky=0 ooms=0 timeouts=0 replay="-"
  for a in "$run/$h"/artifacts/*; do
    [[ -e $a ]] || continue
    case $(basename "$a") in
      oom-*) ooms=$((ooms + 1)) ;;
      timeout-*) timeouts=$((timeouts + 1)) ;;
      *)
        kind=$(classify "$build/fuzz/$h" "$a")
        case $kind in
          ours) ours=$((ours + 1)); echo "CRASH in our code: $a (replay: $build/fuzz/$h $a)" ;;
          libhdf5) hdf5=$((hdf5 + 1)) ;;
          *) flaky=$((flaky + 1)) ;;
        esac ;;
    esac
  done
  if [[ $h == fuzz_case_reader ]]; then
    if [[ -x $qedcheck ]]; then
      ok=0 bad=0 timeouts_replayed=0
      mkdir -p "$run/$h/replay"
      for a in "$run/$h"/artifacts/*; do
        [[ -e $a ]] || continue
        # Endless loops cost the isolated reader's 30 s watchdog each: two of them show it.
        if [[ $(basename "$a") == timeout-* ]]; then
          [[ $timeouts_replayed -lt ${QEDCHECK_FUZZ_REPLAY_TIMEOUTS:-2} ]] || continue
          timeouts_replayed=$((timeouts_replayed + 1))
        fi
        rc=0
        (ulimit -v 8000000; timeout 120 "$qedcheck" verify "$a" --no-golden >/dev/null 2>"$run/$h/replay/$(basename "$a").stderr") || rc=$?
        if [[ $rc -le 2 ]]; then ok=$((ok + 1)); else bad=$((bad + 1)); echo "production reader: exit $rc on $a"; fi
      done
      replay="$ok handled, $bad not"
      [[ $bad -eq 0 ]] || status=1
    else
      replay="skipped (no $qedcheck)"
    fi
  fi
  [[ $ours -eq 0 ]] || status=1
  printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$h" "$secs" "${execs:-0}" "$ours" "$hdf5" "$flaky" \
    "$ooms" "$timeouts" "$replay" >>"$run/summary.md"
done
end=$(date +%s)
echo
cat "$run/summary.md"
echo
echo "build $((built - start)) s, fuzzing and triage $((end - built)) s, total $((end - start)) s; logs and artifacts in $run"
exit $status
