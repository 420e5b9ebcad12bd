#!/usr/bin/env bash
# The run command: installs and builds like scripts/test.sh, writes the synthetic quickstart
# corpus (data/quickstart/corpus, the data configs/quickstart.yaml names), prints the
# environment banner of every rank, runs the 2-rank collective self-check, then trains the
# tiny hybrid model of configs/quickstart.yaml on the CPU (about a minute; the loss falls from
# ln 64 = 4.16). Extra arguments go to `deltatron train` (e.g. --steps 50).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
install_deps
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DDELTATRON_CUDA="${DELTATRON_CUDA:-AUTO}" > /dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target deltatron_cli
BIN="$BUILD_DIR/bin/deltatron"
export NCCL_NVLS_ENABLE=0
mkdir -p data/quickstart
"$BIN" make-corpus --prefix data/quickstart/corpus --docs 20000 --seed 1234 --vocab 64
mpirun $(mpirun_flags) -np 2 "$BIN" env
mpirun $(mpirun_flags) -np 2 "$BIN" selfcheck --tp 2 --backend mpi --dtype f32
mpirun $(mpirun_flags) -np 2 "$BIN" selfcheck --cp 2 --backend mpi --dtype bf16
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l || true)
if [ "${ngpu:-0}" -ge 2 ]; then
  mpirun $(mpirun_flags) -np 2 "$BIN" selfcheck --tp 2 --backend nccl --dtype bf16
fi
mkdir -p runs
"$BIN" train --config configs/quickstart.yaml "$@"
