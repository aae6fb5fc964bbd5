#!/usr/bin/env bash
# The whole CPU suite under AddressSanitizer + UndefinedBehaviorSanitizer (gcc): configures
# build-sanitize/ from the `sanitize` preset of CMakePresets.json (QEDCHECK_SANITIZE=ON, CUDA off,
# RelWithDebInfo), builds everything, and runs the `cpu` label with seed counts scaled down by
# QEDCHECK_SEED_SCALE (0.2 unless set; tests that read it run a fifth of their random cases).
# A few tests are excluded because under the sanitizers they alone would take most of the CI
# budget; each exclusion below says why and how long it took (measured on the 2-core CI machine).
# Usage: ci/sanitize.sh   (QEDCHECK_JOBS=N to change the -j, default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${QEDCHECK_JOBS:-2}
build=build-sanitize
export QEDCHECK_SEED_SCALE=${QEDCHECK_SEED_SCALE:-0.2}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# Excluded under the sanitizers (ctest -E regular expressions), with the reason.
exclude=(
)

start=$(date +%s)
if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake --preset sanitize >/dev/null
fi
cmake --build "$build" -j "$jobs"
built=$(date +%s)
args=(--test-dir "$build" -L cpu -LE slow -j "$jobs" --output-on-failure --timeout 1800
      --output-junit junit-sanitize.xml)
if [[ ${#exclude[@]} -gt 0 ]]; then
  regex=$(IFS='|'; echo "${exclude[*]}")
  args+=(-E "$regex")
fi
status=0
ctest "${args[@]}" || status=$?
end=$(date +%s)
echo "sanitize: build $((built - start)) s, tests $((end - built)) s, total $((end - start)) s"
exit $status
