#!/usr/bin/env bash
# On a GPU machine: the benchmarks behind docs/perf.md with their canonical arguments, in one
# go (build first with scripts/gpu_test.sh or any CUDA build dir). Every output goes to one log,
# bench.log under $OUT (the device tool's output folder) when set, else under $BUILD_DIR; the
# headline lines are printed at the end. Runs needing two GPUs are skipped on one.
#   BUILD_DIR=build-gpu [CUDNN_LIB_DIR=dir with libcudnn >= 9.19] bash scripts/gpu_bench.sh [name ...]
# names: gdn_kernels gdn_elementwise gdn_layer attention optim_step train_step (default: all)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
[ -n "${CUDNN_LIB_DIR:-}" ] && export LD_LIBRARY_PATH=$CUDNN_LIB_DIR:${LD_LIBRARY_PATH:-}
BUILD_DIR=${BUILD_DIR:-build-gpu}
LOG=${OUT:-$BUILD_DIR}/bench.log
B=$BUILD_DIR/bench
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ') || ngpu=0
[ "$ngpu" -ge 1 ] || { echo "gpu_bench: no GPU visible"; exit 1; }
mpi=(mpirun --oversubscribe -x NCCL_NVLS_ENABLE=0 -x LD_LIBRARY_PATH -np 2)
[ "$(id -u)" = 0 ] && mpi=(mpirun --allow-run-as-root --oversubscribe -x NCCL_NVLS_ENABLE=0 -x LD_LIBRARY_PATH -np 2)
names=("$@")
[ ${#names[@]} -eq 0 ] && names=(gdn_kernels gdn_elementwise gdn_layer attention optim_step train_step)
: > "$LOG"
run() {  # label, command...
  echo "== $1: ${*:2}" | tee -a "$LOG"
  "${@:2}" >> "$LOG" 2>&1 || echo "   (exit $?)" | tee -a "$LOG"
}
two() {  # label, command... (two GPUs, one process each)
  if [ "$ngpu" -ge 2 ]; then run "$1" "${mpi[@]}" "${@:2}"; else echo "== $1: skipped ($ngpu GPU)" | tee -a "$LOG"; fi
}
for n in "${names[@]}"; do
  case $n in
    gdn_kernels | gdn_elementwise | attention | optim_step) run "$n" "$B/$n" ;;
    gdn_layer)
      run "gdn_layer 1 GPU" "$B/gdn_layer"
      two "gdn_layer TP=2 SP" "$B/gdn_layer" --tp 2 --sp
      two "gdn_layer CP=2" "$B/gdn_layer" --cp 2 ;;
    train_step)  # from the repo root: configs/ are found relative to the source tree either way
      run "train_step 1 GPU" "$B/train_step" --phases 5
      two "train_step CP=2" "$B/train_step" --set parallel.cp=2 --set data.max_tokens=16384 ;;
    *) echo "gpu_bench: unknown bench '$n'"; exit 2 ;;
  esac
done
echo "== headlines ($LOG)"
grep -E "^\(|^ *\(|median|ratio|TFLOP/s|tokens/s|phases|share|GB/s" "$LOG" | grep -v "^==" | head -80
