#!/usr/bin/env bash
# Configures and builds qedcheck in build/ (Release; CUDA kernels compiled for sm_90 when nvcc
# is on PATH or in /usr/local/cuda/bin). Re-running only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
jobs=${QEDCHECK_JOBS:-$(nproc)}
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
# Configure when no build system was generated yet (also after a configure that failed half-way,
# e.g. run before the packages were installed: it leaves a cache but no build files).
if [[ ! -f build/CMakeCache.txt || ( ! -f build/build.ninja && ! -f build/Makefile ) ]]; then
  cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release ${QEDCHECK_CMAKE_ARGS:-}
fi
cmake --build build -j "$jobs"
