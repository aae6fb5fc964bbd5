#!/usr/bin/env bash
# The main job on its built-in default: the oracle on the bundled example case (certified digits
# of every output and gradient), then the quick certification of the CPU implementations
# (`qedcheck certify --quick`, under 5 minutes on 2 cores), written to build/certificates
# (re-running resumes; the committed certificates in reports/certificates are not touched).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p build/out
./build/cli/qedcheck reference fixtures/examples/qed_full_small.h5 -o build/out/qed_full_small.ref.h5 --force
./build/cli/qedcheck certify --quick --out build/certificates
