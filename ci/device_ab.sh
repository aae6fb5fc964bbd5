#!/usr/bin/env bash
# Before/after on the GPU machine in one call (run from the repository root there): builds the
# benchmark libraries of this tree (A) and of this tree with PATCH applied (B) side by side, then
# runs one benchmark script on each, so that a performance change is measured against its base in
# the same device session (the peer's timings drift between sessions). Logs under $OUT/ab/.
#   bash ci/device_ab.sh PATCH "bench/bench_chunked.py --only phases,timing" [ninja targets...]
# PATCH: a `git diff` of the change (e.g. `git diff > change.patch`, left untracked so that it
# travels with the working tree). Targets default to chunked_capi and recurrent_capi. The last
# lines printed are each side's final table lines. Knobs: QED_AB_CUDAFLAGS (default -lineinfo).
set -u
if [[ $# -lt 2 ]]; then
  echo "usage: bash ci/device_ab.sh PATCH \"BENCH_SCRIPT ARGS\" [ninja targets...]" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PATCH_ARG=$1
PATCH=$(cd "$(dirname "$1")" 2>/dev/null && pwd)/$(basename "$1")
BENCH=$2
shift 2
TARGETS=("$@")
[[ ${#TARGETS[@]} -eq 0 ]] && TARGETS=(chunked_capi recurrent_capi)
OUT=${OUT:-$ROOT/out-device}
LOG=$OUT/ab
mkdir -p "$LOG"
export PATH=/usr/local/cuda/bin:$PATH
export QED_GTEST_SOURCE=${QED_GTEST_SOURCE:-$ROOT/.devdeps/googletest}
if [[ ! -f $PATCH ]]; then
  echo "device_ab: $PATCH_ARG: no such patch file" >&2
  exit 2
fi
source "$ROOT/ci/peer_site.sh"
peer_site "$ROOT" "$LOG/pip.log"
SRC_B=/tmp/qed-ab-tree
rm -rf "$SRC_B" && mkdir -p "$SRC_B"
(cd "$ROOT" && tar --exclude='./build*' --exclude=./.whl --exclude=./.devdeps --exclude=./.git \
  --exclude=./out-device -cf - .) | (cd "$SRC_B" && tar xf -)
if ! (cd "$SRC_B" && patch -p1 --forward --batch <"$PATCH" >"$LOG/patch.log" 2>&1); then
  echo "device_ab: $PATCH does not apply to this tree (see $LOG/patch.log)" >&2
  exit 1
fi
status=0
for side in A B; do
  src=$ROOT
  [[ $side == B ]] && src=$SRC_B
  build=/tmp/qed-ab-build-$side
  if ! CUDAFLAGS=${QED_AB_CUDAFLAGS:--lineinfo} cmake -S "$src/bench/device" -B "$build" -G Ninja \
      -DCMAKE_BUILD_TYPE=Release >"$LOG/build_$side.log" 2>&1 ||
     ! ninja -C "$build" -j16 "${TARGETS[@]}" >>"$LOG/build_$side.log" 2>&1; then
    echo "device_ab: side $side did not build (see $LOG/build_$side.log)" >&2
    tail -20 "$LOG/build_$side.log" >&2
    exit 1
  fi
done
for side in A B; do
  # The same script (this tree's) runs against each side's libraries.
  read -r -a args <<<"$BENCH"
  PYTHONUNBUFFERED=1 timeout "${QED_AB_BENCH_BUDGET:-300}" python3 "$ROOT/${args[0]}" "${args[@]:1}" \
    --lib-dir "/tmp/qed-ab-build-$side" --out "$LOG/bench_$side" >"$LOG/bench_$side.log" 2>&1 || status=1
done
for side in A B; do
  echo "== side $side ($([[ $side == A ]] && echo base || echo "with $(basename "$PATCH")"))"
  grep -E '^\|' "$LOG/bench_$side.log" | tail -24
done
exit $status
