#!/usr/bin/env bash
# On a GPU machine: build (sm_90a by default) and run the `gpu`-labelled tests (which
# include the NCCL multi-rank tests on 1 and 2 GPUs, and on one GPU their staged twins), then
# print a summary. Logs go to
# $OUT (the device tool's output folder) when set, else to $BUILD_DIR.
#   BUILD_DIR=build-gpu  CTEST_ARGS=...  CUDNN_LIB_DIR=dir  BENCH=1  bash scripts/gpu_test.sh
# CUDNN_LIB_DIR: a libcudnn >= 9.19 to run the cuDNN attention path with (older ones are refused);
# BENCH=1: then scripts/gpu_bench.sh (every benchmark of docs/perf.md into bench.log).
# The whole gpu label takes ~10 min on 2 H200s: CTEST_ARGS="-I 1,,2" and "-I 2,,2" run every
# other entry, so two calls of a time-limited device tool cover it (the build is ~90 s each).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
export NCCL_NVLS_ENABLE=0
[ -n "${CUDNN_LIB_DIR:-}" ] && export LD_LIBRARY_PATH=$CUDNN_LIB_DIR:${LD_LIBRARY_PATH:-}
BUILD_DIR=${BUILD_DIR:-build-gpu}
LOG=${OUT:-$BUILD_DIR}
mkdir -p "$LOG" "$BUILD_DIR"
LOG=$(cd "$LOG" && pwd)  # absolute: the script changes directory below
nvidia-smi -L || { echo "no GPU visible"; exit 1; }
ngpu=$(nvidia-smi -L | grep -c '^GPU ')
if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then  # a mask limits what the ranks can select (as tests/gpu_only.sh)
  IFS=, read -ra vis <<< "$CUDA_VISIBLE_DEVICES"
  [ "${#vis[@]}" -lt "$ngpu" ] && ngpu=${#vis[@]}
fi
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DDELTATRON_CUDA=ON ${CMAKE_ARGS:-} > "$LOG/configure.log" 2>&1 \
  || { tail -30 "$LOG/configure.log"; exit 1; }
start=$(date +%s)
cmake --build "$BUILD_DIR" -j "$(nproc)" > "$LOG/build.log" 2>&1 || { grep -E "error" -A3 "$LOG/build.log" | head -60; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
cd "$BUILD_DIR"
# npN GPU tests need N GPUs; with fewer they are excluded (the summary says so; run anyway, they
# report themselves skipped through tests/gpu_only.sh). Their npN_shared twins run the same ranks
# on one GPU (DT_COMM_STAGED=1: CUDA collectives through MPI), so they run where the NCCL entry
# cannot and are excluded where it can. CTEST_ARGS="-LE gpu_shared" leaves them all out.
exclude=""
for np in 2 4 8; do
  if [ "$ngpu" -lt "$np" ]; then exclude="$exclude|_np${np}\$"; else exclude="$exclude|_np${np}_shared\$"; fi
done
exclude=${exclude#|}
ctest -L gpu ${exclude:+-E "$exclude"} --output-on-failure ${CTEST_ARGS:-} 2>&1 | tee "$LOG/ctest_gpu.log"
rc=${PIPESTATUS[0]}
if [ "${BENCH:-0}" = "1" ]; then
  (cd "$ROOT" && BUILD_DIR="$BUILD_DIR" bash scripts/gpu_bench.sh)
fi
echo "== summary ($ngpu GPU(s)): $(grep -E 'tests passed|tests failed' "$LOG/ctest_gpu.log" | tail -1)"
echo "   not run here (need more GPUs, or their NCCL entry ran): tests matching '$exclude'"
exit $rc
