#!/usr/bin/env bash
# Generates one small case per variant and arm (varlen with an empty sequence, h0, do and dht),
# runs `qedcheck reference`, and checks every output and gradient against the independent
# mpmath recurrence (ci/crosscheck/mpmath_recurrence.py) to at least 25 digits.
# Usage: run.sh QEDCHECK_BINARY PYTHON WORKDIR
set -euo pipefail
qc=$1; py=$2; work=$3
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$work"
status=0
seed=11
for spec in gdn2: qed:full qed:nogate qed:nogate_noproj qed:rand kda: gdn: deltanet:; do
  variant=${spec%%:*}; arm=${spec#*:}
  name="$variant${arm:+_$arm}"
  args=(--variant "$variant" -B 1 -T 6 -H 2 -K 3 -V 2 --seqlens 2,0,4 --h0 --dht --seed $seed --force)
  [[ -n $arm ]] && args+=(--arm "$arm")
  [[ $variant == qed ]] && args+=(--lambda 0.8)
  seed=$((seed + 1))
  "$qc" generate -o "$work/$name.h5" "${args[@]}" >/dev/null
  "$qc" reference "$work/$name.h5" -o "$work/$name.ref.h5" --force >/dev/null
  if out=$("$py" "$here/mpmath_recurrence.py" "$work/$name.ref.h5" --digits 25); then
    echo "$name: $(tail -n 1 <<<"$out")"
  else
    echo "$name: FAILED"; echo "$out"; status=1
  fi
done
# The check must be able to fail: a relative change of 1e-20 in one output element is caught.
"$py" - "$work/qed_full.ref.h5" "$work/qed_full.bad.h5" <<'PY'
import shutil, sys, h5py
shutil.copyfile(sys.argv[1], sys.argv[2])
with h5py.File(sys.argv[2], "r+") as f:
    lo = f["outputs/o_lo"]
    x = lo[...]
    x.flat[3] += 1e-20 * abs(f["outputs/o"][...].flat[3])
    lo[...] = x
PY
if "$py" "$here/mpmath_recurrence.py" "$work/qed_full.bad.h5" --digits 25 >/dev/null; then
  echo "mutation: a perturbed output passed the cross-check"; status=1
else
  echo "mutation: perturbed output caught"
fi
exit $status
