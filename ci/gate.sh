#!/usr/bin/env bash
# The CPU regression gate (reports/certificates/README.md): re-measures the smallest-T cells of
# every committed certificate with the same seeds, checks the exactness properties, and exits 1
# with a diff table if anything regressed. Extra arguments go to `qedcheck gate` (for example
# --all-cells; on a device --require-all and --bench-table FRESH). Certificates of CUDA kernels
# are skipped, with the reason, where no device exists. QEDCHECK names the binary (default
# build/cli/qedcheck).
set -euo pipefail
cd "$(dirname "$0")/.."
qedcheck=${QEDCHECK:-build/cli/qedcheck}
certs=()
for c in reports/certificates/*.json; do
  certs+=(--certificate "$c")
done
if [[ ${#certs[@]} -eq 0 ]]; then
  echo "ci/gate.sh: no certificates in reports/certificates/" >&2
  exit 2
fi
exec "$qedcheck" gate "${certs[@]}" -q "$@"
