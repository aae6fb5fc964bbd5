# Sourced by the device scripts (ci/device.sh, ci/device_ab.sh, ci/device_pack_run.sh):
# peer_site ROOT LOG makes the peer (flash-linear-attention) importable when `import fla` fails,
# by installing the wheels carried in ROOT/.whl/ into /tmp/qed-site (pip's output to LOG) and
# putting that folder on PYTHONPATH. Nothing happens when fla imports or no wheel was carried.
peer_site() {
  local root=$1 log=$2
  if ! python3 -c "import fla" >/dev/null 2>&1 && compgen -G "$root/.whl/*.whl" >/dev/null; then
    python3 -m pip install --quiet --no-deps --no-index --target /tmp/qed-site "$root"/.whl/*.whl \
      >"$log" 2>&1 && export PYTHONPATH=/tmp/qed-site${PYTHONPATH:+:$PYTHONPATH}
  fi
}
