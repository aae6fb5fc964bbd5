#!/usr/bin/env bash
# Code size of every kernel of one CUDA source, here on the CPU machine (no GPU, no cuobjdump):
# the source's compile command from a ninja build is rerun with -cubin and the ELF's .text sections
# are listed, largest first, in bytes (an SM90 instruction is 16 bytes).
#   bash bench/kernel_sizes.sh BUILD kernels/chunked_bwd_grads.cu
# Why: at one block per multiprocessor a kernel whose executed code outgrows the instruction caches
# stalls on instruction fetch ("no_inst" in ncu's warp states); reports/device/chunked.md runs
# 15-16 trace a slowdown of the gradient pass to that, and its cure to a smaller kernel.
set -eu
BUILD=$1 SRC=$2
obj=$(ninja -C "$BUILD" -t targets all | grep -o "^[^:]*$(basename "$SRC")\.o" | head -1)
[[ -n $obj ]] || { echo "kernel_sizes.sh: no object for $SRC in $BUILD" >&2; exit 2; }
cmd=$(ninja -C "$BUILD" -t commands "$obj" | tail -1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmd=$(echo "$cmd" | sed -E "s# -c # -cubin #; s# -o [^ ]+# -o $tmp/k.cubin#; s#-MD -MT [^ ]+ -MF [^ ]+##")
(cd "$BUILD" && eval "$cmd") >/dev/null
readelf -SW "$tmp/k.cubin" 2>/dev/null | awk '$2 ~ /^\.text\./ {print $2, $6}' |
  while read -r name hex; do printf '%8d  %s\n' $((16#$hex)) "${name#.text.}"; done | sort -rn
