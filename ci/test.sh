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
# RapidCheck's seed is fixed (QEDCHECK_RC_SEED, default 20261203): the suite's verdict is a function
# of the code alone, so a change cannot fail on an unlucky draw it did not cause, and a failure
# reproduces anywhere with the seed printed below. QEDCHECK_RC_SEED=random lets RapidCheck draw
# one per property (exploration, e.g. a nightly job; it prints the seed of any failure).
# ctest's JUnit XML: build/junit.xml (and build-sanitize/junit-sanitize.xml). When a stage fails,
# the last lines name its failed tests.
set -uo pipefail
cd "$(dirname "$0")/.."
failed=()
QEDCHECK_RC_SEED=${QEDCHECK_RC_SEED:-20261203}
if [[ $QEDCHECK_RC_SEED == random ]]; then
  unset QEDCHECK_RC_SEED
  echo "ci/test.sh: RapidCheck draws its own seeds"
elif [[ ! $QEDCHECK_RC_SEED =~ ^[0-9]{1,19}$ ]]; then
  echo "ci/test.sh: QEDCHECK_RC_SEED must be a decimal seed or 'random' (got '$QEDCHECK_RC_SEED')" >&2
  exit 2
else
  export QEDCHECK_RC_SEED
  echo "ci/test.sh: RapidCheck seed $QEDCHECK_RC_SEED (reproduce: RC_PARAMS=seed=$QEDCHECK_RC_SEED)"
fi
# The names of the tests a ctest log reports as failed, on one line.
failed_tests() { sed -n '/tests FAILED:/,$p' "$1" 2>/dev/null | grep -E '^[[:space:]]*[0-9]+ - ' |
  sed -E 's/^[[:space:]]*[0-9]+ - //' | paste -sd ' ' -; }
bash ci/setup.sh || exit 1
bash ci/build.sh || exit 1
bash ci/gate.sh || failed+=(gate)
if [[ "${QEDCHECK_SANITIZE:-1}" != 0 ]]; then
  bash ci/sanitize.sh || failed+=(sanitize)
  QEDCHECK_FUZZ_REPLAY_TIMEOUTS=1 bash ci/fuzz_parsers.sh 30 build/cli/qedcheck || failed+=(fuzz_parsers)
fi
exclude=(-LE slow)
[[ "${QEDCHECK_SLOW:-0}" == 1 ]] && exclude=()
(cd build && RC_PARAMS=${RC_PARAMS:-${QEDCHECK_RC_SEED:+seed=$QEDCHECK_RC_SEED}} ctest --output-on-failure -j "${QEDCHECK_JOBS:-$(nproc)}" \
  "${exclude[@]}" --output-junit junit.xml 2>&1 | tee ctest.log; exit "${PIPESTATUS[0]}") || failed+=(ctest)
if [[ ${#failed[@]} -gt 0 ]]; then
  for stage in "${failed[@]}"; do
    case $stage in
      sanitize) echo "ci/test.sh: sanitize failed: $(failed_tests build-sanitize/sanitize-tests.log)" ;;
      ctest) echo "ci/test.sh: ctest failed: $(failed_tests build/ctest.log)" ;;
    esac
  done
  echo "ci/test.sh: FAILED stages: ${failed[*]} (RapidCheck seed ${QEDCHECK_RC_SEED:-random})"
  exit 1
fi
