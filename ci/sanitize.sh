#!/usr/bin/env bash
# The whole CPU suite under AddressSanitizer + UndefinedBehaviorSanitizer. Configures
# build-sanitize/ from the `sanitize` preset of CMakePresets.json: clang-14, CUDA off, -O1 with
# line tables, ASan + UBSan (no recovery) and libFuzzer's coverage instrumentation on every
# source, so the same build also holds the parser harnesses that ci/fuzz_parsers.sh runs (one
# sanitized build instead of two). Runs the `cpu` label without `slow`, with seed counts scaled
# down: RapidCheck properties run RC_PARAMS max_success=20 (of 100), tests that read
# QEDCHECK_SEED_SCALE run a fifth of their random cases. QEDCHECK_RC_SEED (set by ci/test.sh) fixes
# RapidCheck's seed.
# Usage: ci/sanitize.sh   (QEDCHECK_JOBS=N to change the -j, default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${QEDCHECK_JOBS:-2}
build=build-sanitize
export QEDCHECK_SEED_SCALE=${QEDCHECK_SEED_SCALE:-0.2}
export RC_PARAMS=${RC_PARAMS:-max_success=20${QEDCHECK_RC_SEED:+ seed=$QEDCHECK_RC_SEED}}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# LeakSanitizer suppressions, for memory that libraries keep per thread or per process on purpose:
# MPFR/GMP cache constants (exp, log 2, pi) per thread and free them only in mpfr_free_cache(),
# which the reference's worker threads never call; gnutls (pulled in by a dependency) keeps its
# global state. Our own allocations are not suppressed.
mkdir -p "$build"
cat >"$build/lsan.supp" <<'SUPP'
leak:libmpfr.so
leak:libgmp.so
leak:libgnutls.so
SUPP
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$(pwd)/$build/lsan.supp:print_suppressions=0}

start=$(date +%s)
cmake --preset sanitize >/dev/null  # re-applies the preset's cache variables to an old build
cmake --build "$build" -j "$jobs"
built=$(date +%s)
status=0
ctest --test-dir "$build" -L cpu -LE slow -j "$jobs" --timeout 1800 --output-junit junit-sanitize.xml \
  >"$build/sanitize-tests.log" 2>&1 || status=$?
end=$(date +%s)
# The failures in full, the summary always.
if [[ $status != 0 ]]; then
  ctest --test-dir "$build" --rerun-failed --output-on-failure -j "$jobs" --timeout 1800 || true
fi
grep -E "tests passed|tests failed|Total Test time" "$build/sanitize-tests.log" || tail -5 "$build/sanitize-tests.log"
echo "sanitize: build $((built - start)) s, tests $((end - built)) s, total $((end - start)) s (log: $build/sanitize-tests.log)"
exit $status
