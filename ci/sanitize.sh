#!/usr/bin/env bash
# The whole CPU suite under AddressSanitizer + UndefinedBehaviorSanitizer (gcc): configures
# build-sanitize/ from the `sanitize` preset of CMakePresets.json (QEDCHECK_SANITIZE=ON, CUDA off,
# RelWithDebInfo; -Werror off, since gcc 12 under -fsanitize reports false -Wmaybe-uninitialized
# inside libstdc++'s <regex>), builds everything, and runs the `cpu` label with seed counts scaled down by
# QEDCHECK_SEED_SCALE (0.2 unless set; tests that read it run a fifth of their random cases).
# Tests too slow under the sanitizers can be excluded below, each with its reason and measured
# time; none is now: the whole cpu label took 43-55 s under ASan+UBSan at -j2 (build 13-15 min).
# Usage: ci/sanitize.sh   (QEDCHECK_JOBS=N to change the -j, default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${QEDCHECK_JOBS:-2}
build=build-sanitize
export QEDCHECK_SEED_SCALE=${QEDCHECK_SEED_SCALE:-0.2}
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

# Excluded under the sanitizers (ctest -E regular expressions), with the reason. Slowest now:
# crosscheck.mpmath_every_variant 18 s, Robustness.CommandLineTableMatchesTheBinary 8 s.
exclude=(
)

start=$(date +%s)
cmake --preset sanitize >/dev/null  # re-applies the preset's cache variables to an old build
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
