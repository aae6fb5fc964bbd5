#!/usr/bin/env bash
# Prepares everything a device run carries, on the CPU machine (all git-ignored):
#   .whl/       flash-linear-attention and fla-core wheels (pip download, no dependencies; the
#               device has torch and triton and cannot reach a registry)
#   .devdeps/   GoogleTest sources from Debian's googletest package (the device has none)
#   .devbundle/ the CUDA-enabled qedcheck and its libraries (ci/device_bundle.sh; needs build/)
# Then one device call does everything (tests, sanitizers, benchmarks, CUDA certificates, the GPU
# gate, the chunk_gdn2 verdict) and prints a short table last:
#   run(command="bash ci/device.sh", carry=[".whl", ".devdeps", ".devbundle"], timeout_s=600)
# Usage: ci/device_prepare.sh [FLA_VERSION=0.6.0]
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-0.6.0}
if ! compgen -G ".whl/flash_linear_attention-$version-*.whl" >/dev/null; then
  python3 -m pip download --quiet --no-deps -d .whl "flash-linear-attention==$version" "fla-core==$version"
fi
if [[ ! -f .devdeps/googletest/CMakeLists.txt ]]; then
  [[ -d /usr/src/googletest/googletest ]] || { echo "ci/device_prepare.sh: apt-get install googletest" >&2; exit 2; }
  mkdir -p .devdeps
  cp -r /usr/src/googletest/googletest .devdeps/googletest
fi
bash ci/device_bundle.sh
du -sh .whl .devdeps .devbundle | tr '\n' ' '
echo "(carry limit 64 MiB in all)"
