#!/usr/bin/env bash
# Packs the CUDA-enabled qedcheck built here (build/cli/qedcheck, nvcc sm_90) for the GPU machine,
# which has no Debian development packages (no HDF5, MPFR, fmt) and cannot install any:
#   .devbundle/bin/qedcheck   the binary
#   .devbundle/lib/           every shared library it loads except the C library's own
#                             (libc, libm, libdl, libpthread, librt, libresolv, ld-linux), which
#                             come from the device (binaries built here ran there before)
#   .devbundle/qedcheck       a wrapper that puts lib/ first on LD_LIBRARY_PATH
# .devbundle is git-ignored; hand it to the device tool with carry [".devbundle"] (ci/device.sh
# then certifies the CUDA kernels, runs the GPU gate and judges flash-linear-attention's
# chunk_gdn2 with it). Usage: ci/device_bundle.sh [BINARY=build/cli/qedcheck]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/cli/qedcheck}
out=.devbundle
[[ -x $bin ]] || { echo "ci/device_bundle.sh: $bin not built (bash ci/build.sh)" >&2; exit 2; }
if ! grep -q "cuda-chunked" <("$bin" run --help 2>&1); then
  echo "ci/device_bundle.sh: $bin has no CUDA implementations (nvcc missing at build time?)" >&2
  exit 2
fi
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
cp "$bin" "$out/bin/qedcheck"
ldd "$bin" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
  case $name in
    libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|libresolv.so.*|ld-linux*) continue ;;
  esac
  cp -L "$path" "$out/lib/$name"
done
cat >"$out/qedcheck" <<'WRAP'
#!/usr/bin/env bash
here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$here/bin/qedcheck" "$@"
WRAP
chmod +x "$out/qedcheck"
# Every library must resolve inside the bundle (or to the C library).
missing=$(LD_LIBRARY_PATH="$out/lib" ldd "$out/bin/qedcheck" | awk '$3 ~ /^\// && $3 !~ /\.devbundle\/lib\// {print $1}' |
  grep -vE '^(libc|libm|libdl|libpthread|librt|libresolv)\.so' || true)
if [[ -n $missing ]]; then
  echo "ci/device_bundle.sh: resolved outside the bundle: $missing" >&2
  exit 1
fi
"$out/qedcheck" --version >/dev/null 2>&1 || "$out/qedcheck" --help >/dev/null
echo "ci/device_bundle.sh: $out: $(ls "$out/lib" | wc -l) libraries, $(du -sh "$out" | cut -f1) (carry [\".devbundle\"])"
