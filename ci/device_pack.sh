#!/usr/bin/env bash
# Everything a device call needs to test and time the CUDA kernels without building there, built
# here and packed into one xz file (about 12 MB; the device build of the same takes 220 s of the
# session's device time, the unpacked tests then run in about 40 s):
#   tests/    the chunked GPU test binaries of build/ (brought up to date; statically linked apart from
#             the C library: they run on the device as they are)
#   devbundle/ the CUDA-enabled qedcheck, bundled afresh by ci/device_bundle.sh (certify, gate, run)
#   capi/     libchunked_capi.so of bench/device (time_cases.py, bench_chunked.py, profile_chunked.py)
# Usage: bash ci/device_pack.sh [OUT=.devpack.tar.xz]   (git-ignored; carry it to the device)
# On the device: mkdir -p /tmp/t && xz -dc .devpack.tar.xz | tar -C /tmp/t -xf -, then e.g.
#   QED_GPU_QUICK=1 /tmp/t/tests/test_gpu_chunked_props
#   python3 bench/time_cases.py /tmp/t/capi "8,4096,16,128" "fwd||gdn2" "qed||qed"
#   /tmp/t/devbundle/qedcheck certify --impl cuda-chunked --quick --out $OUT/certificates
# (certificate names hold '+': tar them under $OUT, the device tool does not return such names).
# An A/B of a kernel change: pack each side from its own checkout (BUILD_CAPI names the build
# folder, default build-capi) under its own OUT, carry both and time each side's capi/.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.devpack.tar.xz}
capi=${BUILD_CAPI:-build-capi}
tests=(test_gpu_chunked test_gpu_chunked_props test_gpu_chunked_backward)
[[ -f build/build.ninja ]] || { echo "ci/device_pack.sh: no build/ (bash ci/build.sh with nvcc first)" >&2; exit 2; }
# The pack must hold this tree's kernels: bring build/'s test binaries and qedcheck up to date
# (nothing to do right after ci/build.sh) and bundle that qedcheck afresh.
ninja -C build "${tests[@]}" qedcheck >/dev/null || { echo "ci/device_pack.sh: building the GPU tests in build/ failed" >&2; exit 1; }
bash ci/device_bundle.sh >/dev/null
export QED_GTEST_SOURCE=${QED_GTEST_SOURCE:-$PWD/.devdeps/googletest}
[[ -d $QED_GTEST_SOURCE ]] || { echo "ci/device_pack.sh: no GoogleTest sources at $QED_GTEST_SOURCE (bash ci/device_prepare.sh)" >&2; exit 2; }
mkdir -p "$capi"
log=$capi/device_pack.log
if ! { cmake -S bench/device -B "$capi" -G Ninja -DCMAKE_BUILD_TYPE=Release && ninja -C "$capi" chunked_capi; } >"$log" 2>&1; then
  tail -20 "$log" >&2
  echo "ci/device_pack.sh: building bench/device's chunked_capi failed (log: $log)" >&2
  exit 1
fi
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/tests" "$stage/capi"
for t in "${tests[@]}"; do cp "build/properties/$t" "$stage/tests/"; done
cp -r .devbundle "$stage/devbundle"
cp "$capi/libchunked_capi.so" "$stage/capi/"
tar -C "$stage" -cf - tests devbundle capi | xz -9 -T2 >"$out.tmp"
mv "$out.tmp" "$out"
echo "ci/device_pack.sh: $out, $(du -h "$out" | cut -f1) (carry [\"$out\"])"
