#!/usr/bin/env bash
# README quick start, command 2: the whole CPU test suite (GPU tests are compiled and skip
# visibly without a device; the `slow` label holds the larger sweeps: QEDCHECK_SLOW=1 runs them).
# ctest's JUnit XML goes to build/junit.xml for CI systems that read it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
bash ci/build.sh
# The CPU regression gate: committed certificates re-measured, exactness properties checked.
bash ci/gate.sh
cd build
exclude=(-LE slow)
[[ "${QEDCHECK_SLOW:-0}" == 1 ]] && exclude=()
ctest --output-on-failure -j "${QEDCHECK_JOBS:-$(nproc)}" "${exclude[@]}" --output-junit junit.xml
