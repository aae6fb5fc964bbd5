#!/usr/bin/env bash
# Installs the Debian packages qedcheck builds and tests with, only those that are missing.
# Safe to run any number of times; needs root (or sudo) only when something is missing.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config
  libeigen3-dev libboost-dev libmpfr-dev libgmp-dev libhdf5-dev
  libgtest-dev libgmock-dev librapidcheck-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev
  python3 python3-numpy python3-h5py python3-matplotlib python3-mpmath
  clang libclang-rt-14-dev chromium
)

missing=()
for p in "${PKGS[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  echo "ci/setup.sh: all ${#PKGS[@]} packages already installed"
  exit 0
fi

echo "ci/setup.sh: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
