#!/usr/bin/env bash
# README quick start, command 2: the whole CPU test suite. Stages, in this order:
#   1. set-up and the Release build (ci/setup.sh, ci/build.sh; CUDA compiled when nvcc exists);
#   2. the CPU regression gate (ci/gate.sh): committed certificates re-measured, exactness checked;
#   3. the CPU suite under ASan + UBSan at reduced seed counts (ci/sanitize.sh, build-sanitize/);
#   4. the libFuzzer parser harnesses, 30 s in all (ci/fuzz_parsers.sh, same build);
#   5. the whole CPU suite in the Release build (ctest; GPU tests compile and skip visibly without a
#      device; label `slow` only with QEDCHECK_SLOW=1). Its summary comes last.
# Every stage runs even when an earlier one failed; the exit status is non-zero if any failed.
# QEDCHECK_SANITIZE=0 skips stages 3 and 4 (a quick local run; CI never sets it).
# ctest's JUnit XML: build/junit.xml (and build-sanitize/junit-sanitize.xml).
set -uo pipefail
cd "$(dirname "$0")/.."
failed=()
bash ci/setup.sh || exit 1
bash ci/build.sh || exit 1
bash ci/gate.sh || failed+=(gate)
if [[ "${QEDCHECK_SANITIZE:-1}" != 0 ]]; then
  bash ci/sanitize.sh || failed+=(sanitize)
  QEDCHECK_FUZZ_REPLAY_TIMEOUTS=1 bash ci/fuzz_parsers.sh 30 build/cli/qedcheck || failed+=(fuzz_parsers)
fi
exclude=(-LE slow)
[[ "${QEDCHECK_SLOW:-0}" == 1 ]] && exclude=()
(cd build && ctest --output-on-failure -j "${QEDCHECK_JOBS:-$(nproc)}" "${exclude[@]}" --output-junit junit.xml) ||
  failed+=(ctest)
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "ci/test.sh: FAILED stages: ${failed[*]}"
  exit 1
fi
