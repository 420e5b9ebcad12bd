#!/usr/bin/env bash
# Runs a command only where the build has CUDA and enough GPUs are visible; otherwise exits 77,
# which the ctest entries of the program-level GPU checks report as skipped.
#   gpu_only.sh <build has CUDA: 0|1> <GPUs needed> command args...
set -u
have_cuda=$1 need=$2
shift 2
[ "$have_cuda" = 1 ] || { echo "gpu_only: skipped: a CPU-only build"; exit 77; }
n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ') || n=0
if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then  # a mask limits what the ranks can select
  IFS=, read -ra vis <<< "$CUDA_VISIBLE_DEVICES"
  [ "${#vis[@]}" -lt "$n" ] && n=${#vis[@]}
fi
[ "$n" -ge "$need" ] || { echo "gpu_only: skipped: $n GPU(s) visible, $need needed"; exit 77; }
exec "$@"
