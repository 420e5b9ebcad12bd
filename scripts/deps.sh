# Sourced by the scripts: installs the Debian/Ubuntu packages deltatron builds against,
# only those missing. The CUDA toolkit (nvcc, cuBLAS, cuDNN, NCCL) is not installed here:
# without it the build is CPU-only (DELTATRON_CUDA=AUTO).
DT_PACKAGES=(cmake g++ make libyaml-cpp-dev libspdlog-dev libfmt-dev libopenmpi-dev openmpi-bin libgtest-dev
             nlohmann-json3-dev libcli11-dev libopenblas-dev)

install_deps() {
  local missing=()
  for p in "${DT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then return 0; fi
  echo "[deltatron] installing: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# The optional header-only cuDNN frontend (attention.backend=cudnn) into .deps/, only when a CUDA
# toolkit is there to use it; a failure (e.g. no network) leaves the build without it.
fetch_cudnn_frontend() {
  command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || return 0
  bash "$(dirname "${BASH_SOURCE[0]}")/fetch_cudnn_frontend.sh" ||
    echo "[deltatron] cudnn_frontend not fetched: attention.backend=cudnn will be unavailable"
}

# mpirun flags for oversubscribed runs (and root, as in containers and CI).
mpirun_flags() {
  local f="--oversubscribe"
  [ "$(id -u)" -eq 0 ] && f="$f --allow-run-as-root"
  echo "$f"
}
