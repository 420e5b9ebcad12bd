#!/usr/bin/env bash
# Puts the header-only cuDNN frontend (the `include/` of the nvidia-cudnn-frontend wheel) into
# the git-ignored .deps/cudnn_frontend/include, where FindCudnnFrontend.cmake looks. Needs pip
# and the network once; carry the .deps folder to a machine without network. No sudo.
#   CUDNN_FRONTEND_VERSION=1.32.0 (default: that release)  bash scripts/fetch_cudnn_frontend.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ver=${CUDNN_FRONTEND_VERSION:-1.32.0}
dest=.deps/cudnn_frontend
if [ -f "$dest/include/cudnn_frontend.h" ] && grep -q "MINOR_VERSION $(echo "$ver" | cut -d. -f2)\$" \
     "$dest/include/cudnn_frontend_version.h" 2>/dev/null; then
  echo "[deltatron] cudnn_frontend $ver already in $dest"; exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp" "nvidia-cudnn-frontend==$ver"
whl=$(ls "$tmp"/nvidia_cudnn_frontend-*.whl | head -1)
python3 - "$whl" "$tmp/x" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:  # only the headers: the wheel's top-level include/
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/")])
PY
rm -rf "$dest"
mkdir -p "$dest"
mv "$tmp/x/include" "$dest/include"
echo "[deltatron] cudnn_frontend $ver headers in $dest/include"
