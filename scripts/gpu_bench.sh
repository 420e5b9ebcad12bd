#!/usr/bin/env bash
# On a GPU machine: the benchmarks behind docs/perf.md with their canonical arguments, in one
# go (build first with scripts/gpu_test.sh or any CUDA build dir). Every output goes to one log,
# bench.log under $OUT (the device tool's output folder) when set, else under $BUILD_DIR; the
# headline lines are printed at the end. Runs needing more GPUs than the machine has are skipped;
# with 4 (issue 8's scaling runs, per-GPU tokens held fixed): gdn_layer CP=4 and TP=2+SP x CP=2,
# train_step CP=4 (32768 tokens) and TP=2+SP x CP=2 (16384 tokens: 8192 per CP rank).
#   BUILD_DIR=build-gpu [CUDNN_LIB_DIR=dir with libcudnn >= 9.19] bash scripts/gpu_bench.sh [name ...]
# names: gdn_kernels gdn_elementwise dense_elementwise gdn_layer attention optim_step train_step (default: all)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
[ -n "${CUDNN_LIB_DIR:-}" ] && export LD_LIBRARY_PATH=$CUDNN_LIB_DIR:${LD_LIBRARY_PATH:-}
BUILD_DIR=${BUILD_DIR:-build-gpu}
LOG=${OUT:-$BUILD_DIR}/bench.log
B=$BUILD_DIR/bench
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ') || ngpu=0
[ "$ngpu" -ge 1 ] || { echo "gpu_bench: no GPU visible"; exit 1; }
mpi=(mpirun --oversubscribe -x NCCL_NVLS_ENABLE=0 -x LD_LIBRARY_PATH)
[ "$(id -u)" = 0 ] && mpi=(mpirun --allow-run-as-root --oversubscribe -x NCCL_NVLS_ENABLE=0 -x LD_LIBRARY_PATH)
names=("$@")
[ ${#names[@]} -eq 0 ] && names=(gdn_kernels gdn_elementwise dense_elementwise gdn_layer attention optim_step train_step)
: > "$LOG"
run() {  # label, command...
  echo "== $1: ${*:2}" | tee -a "$LOG"
  "${@:2}" >> "$LOG" 2>&1 || echo "   (exit $?)" | tee -a "$LOG"
}
on() {  # n, label, command... (n GPUs, one process each)
  if [ "$ngpu" -ge "$1" ]; then run "$2" "${mpi[@]}" -np "$1" "${@:3}"; else echo "== $2: skipped ($ngpu GPU)" | tee -a "$LOG"; fi
}
two() { on 2 "$@"; }
four() { on 4 "$@"; }
for n in "${names[@]}"; do
  case $n in
    gdn_kernels)  # the serial kernels both ways (DT_GDN_SERIAL: src/ops/cuda/gdn_chunk.cu)
      for k in tile warp4 warp8 split2 split4 wg4; do run "gdn_kernels DT_GDN_SERIAL=$k" env DT_GDN_SERIAL=$k "$B/$n"; done
      # G = 2's dq / dk sums through f32 partials and gsum, the form the cluster sums replaced (v0.10.0)
      run "gdn_kernels DT_GDN_GQA_PAIR=0" env DT_GDN_GQA_PAIR=0 "$B/$n"
      # G = 2's exchange pulled behind a fenced cluster barrier (the default until v0.18.0; now pushed)
      run "gdn_kernels DT_GDN_GQA_PAIR=1" env DT_GDN_GQA_PAIR=1 "$B/$n"
      # dDelta_local made by dvl in bf16 (before v0.20.0; the digests of v0.16.0-v0.19.0)
      run "gdn_kernels DT_GDN_REV_P=0" env DT_GDN_REV_P=0 "$B/$n" ;;
    gdn_elementwise | dense_elementwise | attention | optim_step) run "$n" "$B/$n" ;;
    gdn_layer)
      run "gdn_layer 1 GPU" "$B/gdn_layer"
      # per-kernel times inside the unserialised run (CUPTI), beside ncu's one-at-a-time ones
      run "gdn_layer 1 GPU --trace" "$B/gdn_layer" --trace
      for k in tile warp4 split2 split4; do run "gdn_layer 1 GPU DT_GDN_SERIAL=$k" env DT_GDN_SERIAL=$k "$B/gdn_layer"; done
      run "gdn_layer 1 GPU DT_GDN_REV_WGMMA=0" env DT_GDN_REV_WGMMA=0 "$B/gdn_layer"  # wg4 with rev as warp4's
      run "gdn_layer 1 GPU DT_GDN_GQA_PAIR=0" env DT_GDN_GQA_PAIR=0 "$B/gdn_layer"
      run "gdn_layer 1 GPU DT_GDN_GQA_PAIR=1" env DT_GDN_GQA_PAIR=1 "$B/gdn_layer"
      # wg4's one-stage rev kernel loading K a step ahead (off: within noise, v0.19.0)
      run "gdn_layer 1 GPU --ab DT_GDN_REV_KSPLIT" "$B/gdn_layer" --ab DT_GDN_REV_KSPLIT
      # rev making dDelta_local from P (1, the default since v0.20.0) against dvl making it (0)
      run "gdn_layer 1 GPU --ab DT_GDN_REV_P" "$B/gdn_layer" --ab DT_GDN_REV_P
      run "gdn_layer 1 GPU --keep-elementwise --graph" "$B/gdn_layer" --keep-elementwise --graph
      run "gdn_layer 1 GPU DT_GEMM_AUTOTUNE=1" env DT_GEMM_AUTOTUNE=1 "$B/gdn_layer"
      run "gdn_layer 1 GPU DT_GDN_OUT_NORM=0" env DT_GDN_OUT_NORM=0 "$B/gdn_layer"
      run "gdn_layer 1 GPU --ab DT_GDN_OUT_NORM" "$B/gdn_layer" --ab DT_GDN_OUT_NORM  # paired, 40 rounds
      two "gdn_layer TP=2 SP" "$B/gdn_layer" --tp 2 --sp
      for comm in all_to_all all_gather; do  # the trainer's gdn.cp_comm=auto picks all_gather in all three
        two "gdn_layer CP=2 $comm" "$B/gdn_layer" --cp 2 --cp-comm $comm
        four "gdn_layer CP=4 $comm" "$B/gdn_layer" --cp 4 --cp-comm $comm
        four "gdn_layer TP=2 SP x CP=2 $comm" "$B/gdn_layer" --tp 2 --sp --cp 2 --cp-comm $comm
      done ;;
    train_step)  # from the repo root: configs/ are found relative to the source tree either way
      run "train_step 1 GPU" "$B/train_step" --phases 5
      # the forms the defaults replaced (v0.8.0): CTA-tiled GDN serial kernels, one AdamW launch per
      # parameter, v / dv through contiguous copies
      run "train_step 1 GPU DT_GDN_SERIAL=tile" env DT_GDN_SERIAL=tile "$B/train_step" --phases 5
      # 2 or 4 warps per 16 GDN state rows: correct but slower than warp4 (docs/perf.md v0.9.0)
      for k in split2 split4; do run "train_step 1 GPU DT_GDN_SERIAL=$k" env DT_GDN_SERIAL=$k "$B/train_step" --phases 5; done
      run "train_step 1 GPU DT_GDN_SERIAL=tile DT_OPTIM_MULTI=0 DT_GDN_STRIDED_V=0" env DT_GDN_SERIAL=tile \
        DT_OPTIM_MULTI=0 DT_GDN_STRIDED_V=0 "$B/train_step" --phases 5
      if [ -n "${CUDNN_LIB_DIR:-}" ]; then  # cuDNN's forward + the native backward (attention.backend auto is native)
        run "train_step 1 GPU cudnn_fwd" "$B/train_step" --set attention.backend=cudnn_fwd
      fi
      two "train_step CP=2" "$B/train_step" --set parallel.cp=2 --set data.max_tokens=16384
      two "train_step CP=2 overlap_embedding_reduce" "$B/train_step" --set parallel.cp=2 --set data.max_tokens=16384 \
        --set train.overlap_embedding_reduce=true
      four "train_step CP=4" "$B/train_step" --set parallel.cp=4 --set data.max_tokens=32768
      four "train_step TP=2 SP x CP=2" "$B/train_step" --set parallel.tp=2 --set parallel.sp=true \
        --set parallel.cp=2 --set data.max_tokens=16384 ;;
    *) echo "gpu_bench: unknown bench '$n'"; exit 2 ;;
  esac
done
echo "== headlines ($LOG)"
grep -E "^\(|^ *\(|median|ratio|TFLOP/s|tokens/s|phases|share|GB/s|back to back" "$LOG" | grep -v "^==" | head -80
