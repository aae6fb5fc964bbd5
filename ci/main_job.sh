#!/usr/bin/env bash
# The main job on its built-in default: the oracle on the bundled example case, printing the
# certified digits of every output and gradient.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p build/out
./build/cli/qedcheck reference fixtures/examples/qed_full_small.h5 -o build/out/qed_full_small.ref.h5 --force
