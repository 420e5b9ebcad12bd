#!/usr/bin/env bash
# The test command: installs what is missing (Debian/Ubuntu, apt-get, only when missing),
# configures, builds with all cores and runs every test (CPU, multi-rank mpirun, and the
# `gpu` tests, which report "skipped" where no GPU is usable).
#   BUILD_DIR=build  DELTATRON_CUDA=AUTO|ON|OFF  CTEST_ARGS="-L cpu"  bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
install_deps
fetch_cudnn_frontend

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DDELTATRON_CUDA="${DELTATRON_CUDA:-AUTO}"
cmake --build "$BUILD_DIR" -j "$JOBS"
cd "$BUILD_DIR"
# Multi-rank tests oversubscribe the cores: run one test at a time.
ctest --output-on-failure ${CTEST_ARGS:-}
