#!/usr/bin/env bash
# Code size of every kernel of one CUDA source, here on the CPU machine (no GPU, no cuobjdump):
# the source's compile command from a ninja build is rerun with -cubin and the ELF's .text sections
# are listed, largest first, in bytes (an SM90 instruction is 16 bytes).
#   bash bench/kernel_sizes.sh BUILD kernels/chunked_bwd_grads.cu [--regs]
# --regs: each kernel's registers, spill bytes and stack frame from ptxas instead (-Xptxas -v):
# whether a change pushed a kernel at its register limit into local memory.
# Why: at one block per multiprocessor a kernel whose executed code outgrows the instruction caches
# stalls on instruction fetch ("no_inst" in ncu's warp states); reports/device/chunked.md runs
# 15-16 trace a slowdown of the gradient pass to that, and its cure to a smaller kernel.
set -eu
BUILD=$1 SRC=$2 MODE=${3:-}
obj=$(ninja -C "$BUILD" -t targets all | grep -o "^[^:]*$(basename "$SRC")\.o" | head -1)
[[ -n $obj ]] || { echo "kernel_sizes.sh: no object for $SRC in $BUILD" >&2; exit 2; }
cmd=$(ninja -C "$BUILD" -t commands "$obj" | tail -1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmd=$(echo "$cmd" | sed -E "s# -c # -cubin #; s# -o [^ ]+# -o $tmp/k.cubin#; s#-MD -MT [^ ]+ -MF [^ ]+##")
if [[ $MODE == --regs ]]; then
  cmd="$cmd -Xptxas -v"
  (cd "$BUILD" && eval "$cmd") 2>&1 | awk '
    /Compiling entry function/ { match($0, /_Z[^'"'"']*/); name = substr($0, RSTART, RLENGTH) }
    /bytes stack frame/ { split($0, a, /[ ,]+/); for (i in a) { if (a[i] == "stack") st = a[i-2];
      if (a[i] == "stores") ss = a[i-3]; if (a[i] == "loads" && a[i-1] == "spill") sl = a[i-3] } }
    /Used [0-9]+ registers/ { match($0, /Used [0-9]+ registers/); r = substr($0, RSTART + 5, RLENGTH - 15);
      printf "%4s regs  %5s B spill stores  %5s B spill loads  %5s B stack  %s\n", r, ss, sl, st, name }' |
    sort -k8
  exit 0
fi
(cd "$BUILD" && eval "$cmd") >/dev/null
readelf -SW "$tmp/k.cubin" 2>/dev/null | awk '$2 ~ /^\.text\./ {print $2, $6}' |
  while read -r name hex; do printf '%8d  %s\n' $((16#$hex)) "${name#.text.}"; done | sort -rn
