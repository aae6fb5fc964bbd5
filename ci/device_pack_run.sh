#!/usr/bin/env bash
# One device call for a kernel change, from packs built on the CPU machine (nothing is built on
# the device): times the change against its base in alternating processes, then runs the chunked
# GPU tests beside a full CUDA re-certification, and prints a short table last.
#   NEW   a pack of the changed tree (bash ci/device_pack.sh out/new.tar.xz)
#   OLD   optional: the base tree's libchunked_capi.so, xz-compressed (in a worktree of the base:
#         BUILD_CAPI=/tmp/oldcapi bash ci/device_pack.sh /tmp/old.tar.xz, or just its bench/device
#         build: cmake -S bench/device -B /tmp/oldcapi && ninja -C /tmp/oldcapi chunked_capi)
# Usage on the device (carry the folder holding the packs, e.g. out/):
#   bash ci/device_pack_run.sh out/new.tar.xz [out/old_capi.so.xz]
# Knobs: PACK_SHAPES (default "8,4096,16,128;2,16384,16,128"), PACK_CASES (time_cases.py cases,
# default GDN-2 and QED forward and training pair), PACK_ROUNDS (alternations, 2),
# PACK_TIMING=0 / PACK_TESTS=0 / PACK_CERTIFY=0 (skip a stage), PACK_CERT_TIMEOUT (s, 300),
# PACK_BITS=0 (skip the same-bits check of NEW against OLD, bench/ab_bits.py, which runs when OLD
# is given; PACK_BITS_TIMEOUT s, 240), PACK_THREADS (certify's, 15), PACK_CERTS_FROM (a certs.tar
# an earlier call returned: certify resumes from its journals, which it accepts only from the same
# kernels), PACK_PEER=1 (after the
# A/B rounds, one process times the new library's cases beside the peer's chunk_gdn2 forward and
# training pair at the same shapes, PACK_PEER_TIMEOUT s at most, 400; PACK_PEER_CASES="peer||peer"
# times its forward alone, sparing the backward's autotuning; needs .whl/ carried, or fla
# importable). Outputs under $OUT: timing.log, bits.log, test_gpu_*.log, certify.log and
# certs.tar (the certificates and journals, re-tarred every 20 s so that a call cut by its time
# limit still returns what was measured: certify resumes from them with the same kernels).
# The device returns at most 8 files from $OUT, so at the end this script's logs (gpu.txt,
# timing.log, bits.log, pip.log, tests.rc, test_gpu_*.log, certify.log) go into one logs.tgz beside
# certs.tar (PACK_BUNDLE=0 leaves them loose); a caller that adds files of its own under $OUT
# should bundle those too.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
NEW=${1:?usage: bash ci/device_pack_run.sh NEW.tar.xz [OLD_CAPI.so.xz]}
OLD=${2:-}
OUT=${OUT:-$ROOT/out-device}
mkdir -p "$OUT"
[[ -f $NEW ]] || { echo "device_pack_run: $NEW: no such pack" >&2; exit 2; }
[[ -z $OLD || -f $OLD ]] || { echo "device_pack_run: $OLD: no such file" >&2; exit 2; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/n" "$W/o/capi" "$W/certs"
xz -dc "$NEW" | tar -C "$W/n" -xf - || { echo "device_pack_run: cannot unpack $NEW" >&2; exit 2; }
if [[ -n ${PACK_CERTS_FROM:-} ]]; then
  tar -C "$W" -xf "$PACK_CERTS_FROM" || { echo "device_pack_run: cannot unpack $PACK_CERTS_FROM" >&2; exit 2; }
fi
if [[ -n $OLD ]]; then
  xz -dc "$OLD" >"$W/o/capi/libchunked_capi.so" || { echo "device_pack_run: cannot unpack $OLD" >&2; exit 2; }
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >"$OUT/gpu.txt" 2>&1
"$W/n/devbundle/qedcheck" --version >>"$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

SHAPES=${PACK_SHAPES:-8,4096,16,128;2,16384,16,128}
read -r -a CASES <<<"${PACK_CASES:-fwd||gdn2 qed||qed train||train trainq||trainq}"
if [[ ${PACK_TIMING:-1} != 0 ]]; then
  sides=(n)
  [[ -n $OLD ]] && sides=(n o)
  for ((rep = 1; rep <= ${PACK_ROUNDS:-2}; ++rep)); do
    for side in "${sides[@]}"; do
      echo "== $side rep $rep" >>"$OUT/timing.log"
      TIME_CASES_REPS=2 timeout 120 python3 bench/time_cases.py "$W/$side/capi" "$SHAPES" "${CASES[@]}" \
        >>"$OUT/timing.log" 2>&1
    done
  done
  if [[ ${PACK_PEER:-0} != 0 ]]; then
    source "$ROOT/ci/peer_site.sh"
    peer_site "$ROOT" "$OUT/pip.log"
    echo "== n peer" >>"$OUT/timing.log"
    read -r -a PEER_CASES <<<"${PACK_PEER_CASES:-peer||peer peertrain||peertrain}"
    TIME_CASES_REPS=2 timeout "${PACK_PEER_TIMEOUT:-400}" python3 bench/time_cases.py "$W/n/capi" "$SHAPES" "${CASES[@]}" \
      "${PEER_CASES[@]}" >>"$OUT/timing.log" 2>&1
  fi
fi

# Same bits: the base's and the change's libraries on the same inputs, every variant and arm
# (bench/ab_bits.py), when the base is given; PACK_BITS=0 skips it.
if [[ -n $OLD && ${PACK_BITS:-1} != 0 ]]; then
  timeout "${PACK_BITS_TIMEOUT:-240}" python3 bench/ab_bits.py "$W/o/capi" "$W/n/capi" >"$OUT/bits.log" 2>&1
  echo "ab_bits rc=$?" >>"$OUT/bits.log"
fi

tp=
if [[ ${PACK_TESTS:-1} != 0 ]]; then
  (for t in test_gpu_chunked test_gpu_chunked_props test_gpu_chunked_backward; do
    QED_GPU_QUICK=1 timeout 300 "$W/n/tests/$t" >"$OUT/$t.log" 2>&1
    echo "$t rc=$?" >>"$OUT/tests.rc"
  done) &
  tp=$!
fi
if [[ ${PACK_CERTIFY:-1} != 0 ]]; then
  (timeout "${PACK_CERT_TIMEOUT:-300}" "$W/n/devbundle/qedcheck" certify --impl cuda-chunked cuda-recurrent \
    --quick --out "$W/certs" --threads "${PACK_THREADS:-15}" >"$OUT/certify.log" 2>&1
  echo "certify rc=$?" >>"$OUT/certify.log") &
  cpid=$!
  while kill -0 "$cpid" 2>/dev/null; do
    sleep 20
    tar -C "$W" -cf "$OUT/certs.tar" certs 2>/dev/null
  done
  tar -C "$W" -cf "$OUT/certs.tar" certs
fi
[[ -n $tp ]] && wait "$tp"

echo "== summary"
[[ -f $OUT/tests.rc ]] && cat "$OUT/tests.rc" && grep -h "PASSED\|FAILED" "$OUT"/test_gpu_*.log
[[ -f $OUT/certify.log ]] && tail -2 "$OUT/certify.log"
[[ -f $OUT/bits.log ]] && grep -v " same" "$OUT/bits.log" | tail -12
if [[ -f $OUT/timing.log ]]; then
  python3 - "$OUT/timing.log" <<'PY'
import collections, re, sys
runs, side = collections.defaultdict(list), None
for line in open(sys.argv[1]):
    m = re.match(r"== (\w) (rep|peer)", line)
    if m:
        side = "p" if m.group(2) == "peer" else m.group(1)
        continue
    m = re.match(r"\[x\]\s+(\S+)\s+(\S+)\s+([\d.]+)", line)
    if m:
        runs[(m.group(1), m.group(2), side)].append(m.group(3))
print("| shape | case | new (ms) | old (ms) | the peer's process (ms) |")
print("| --- | --- | --- | --- | --- |")
for shape, case in sorted({(a, b) for a, b, _ in runs}):
    cells = [" / ".join(runs[(shape, case, s)]) or "-" for s in "nop"]
    print(f"| {shape} | {case} | {' | '.join(cells)} |")
PY
fi
if [[ ${PACK_BUNDLE:-1} != 0 ]]; then  # this script's own files only (a caller may be writing others)
  (cd "$OUT" && ls gpu.txt timing.log bits.log pip.log tests.rc test_gpu_*.log certify.log 2>/dev/null >"$W/bundle.list"
    [[ -s $W/bundle.list ]] && tar -czf logs.tgz -T "$W/bundle.list" && xargs -a "$W/bundle.list" rm -f)
fi
