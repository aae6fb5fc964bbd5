#!/usr/bin/env bash
# ncu of one kernel of the chunked forward on the device (bench/profile_chunked.py runs the
# forward twice; the second launch of the kernel is profiled):
#   bash bench/ncu_chunked.sh BUILD KERNEL_REGEX SHAPE VARIANT NAME [PROFILE_ARGS...]
# e.g. bash bench/ncu_chunked.sh /tmp/qed-device-build state_kernel 1,65536,8,128 gdn2 state3
#      bash bench/ncu_chunked.sh /tmp/qed-device-build grads_kernel 8,4096,16,128 qed grads_qed --backward
# (PROFILE_ARGS go to bench/profile_chunked.py: --backward profiles the backward's kernels)
# writes $OUT/NAME.txt (the details page: speed of light, warp states, scheduler, memory) and
# $OUT/NAME_source.csv.gz (per CUDA line and SASS instruction: stall samples, instructions; build
# with CUDAFLAGS=-lineinfo for the line numbers). Not a benchmark: ncu serialises and replays.
set -u
BUILD=$1 KREGEX=$2 SHAPE=$3 VARIANT=$4 NAME=$5
shift 5
OUT=${OUT:-.}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PATH=/usr/local/cuda/bin:$PATH
rep=/tmp/$NAME
# QED_NCU_SECTIONS="--section A --section B" profiles those sections instead of --set full
read -r -a sections <<<"${QED_NCU_SECTIONS:---set full}"
timeout "${QED_NCU_BUDGET:-120}" ncu --clock-control none -k "regex:$KREGEX" -s 1 -c 1 "${sections[@]}" \
  --import-source yes -f -o "$rep" python3 "$ROOT/bench/profile_chunked.py" --lib-dir "$BUILD" \
  --shape "$SHAPE" --variant "$VARIANT" "$@" >"$OUT/$NAME.log" 2>&1
echo "ncu $NAME rc=$?"
ncu -i "$rep.ncu-rep" --page details >"$OUT/$NAME.txt" 2>&1
ncu -i "$rep.ncu-rep" --page source --csv --print-source cuda,sass 2>/dev/null | gzip >"$OUT/${NAME}_source.csv.gz"
python3 "$ROOT/bench/ncu_hot_lines.py" "$OUT/${NAME}_source.csv.gz" --top 40 >"$OUT/${NAME}_hot.txt" 2>&1
grep -E "Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued" "$OUT/$NAME.txt" | head -12
