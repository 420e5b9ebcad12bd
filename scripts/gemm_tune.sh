#!/usr/bin/env bash
# In-layer cuBLASLt tuning for bench/gdn_layer (run on the GPU machine, after a build): which
# heuristic candidate of each of the layer's six GEMM shapes makes the whole fwd+bwd fastest.
# Timing a GEMM alone ranks candidates differently from the power-capped layer (docs/perf.md
# v0.25.0, v0.28.0), so every candidate is A/B'd inside the layer against the default's first
# (`gdn_layer --ab DT_GEMM_ALGO=...`, 40 rounds ABBA, median of the paired differences), then
# the winners together. Prints the DT_GEMM_ALGO value to run with (empty: keep the defaults).
#   BUILD_DIR=build-gpu CANDIDATES="1 2 3 4 5 6 7" SHAPES="MxNxK ..." LOG=dir KEEP=0  bash scripts/gemm_tune.sh [gdn_layer args]
# SHAPES: only these of the layer's shapes (default: all six). CANDIDATES: heuristic indices (up to
# 31; the autotune log lists what each one is). KEEP=1: add to an earlier run's $LOG/gemm_tune_ab.txt
# (same machine) and pick the winners from both, so that a long search can span several calls.
# A candidate wins its shape when its median gain exceeds MIN_GAIN_MS (0.015) and it is faster
# in at least MIN_WINS (24) of the 40 rounds. ~10 s per A/B: 6 shapes x 7 candidates ~7 min.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${BUILD_DIR:-build-gpu}/bench/gdn_layer
[ -x "$B" ] || { echo "gemm_tune: $B not built (cmake --build ${BUILD_DIR:-build-gpu} --target gdn_layer)"; exit 1; }
LOG=${LOG:-${OUT:-/tmp}}
mkdir -p "$LOG"
export NCCL_NVLS_ENABLE=0
export DT_GEMM_TUNED=0  # against cuBLASLt's first, not the built-in table (src/ops/gemm_tuned.cpp)
# The layer's GEMM shapes, from the autotune log of one run (M N K as gemm() sees them).
DT_GEMM_AUTOTUNE=1 "$B" "$@" > "$LOG/gemm_tune_autotune.log" 2>&1 || { tail "$LOG/gemm_tune_autotune.log"; exit 1; }
shapes=$(sed -n 's/.*gemm autotune M \([0-9]*\) N \([0-9]*\) K \([0-9]*\):.*/\1x\2x\3/p' "$LOG/gemm_tune_autotune.log")
[ -n "$shapes" ] || { echo "gemm_tune: no 'gemm autotune' lines in $LOG/gemm_tune_autotune.log"; exit 1; }
if [ -n "${SHAPES:-}" ]; then
  for s in $SHAPES; do
    echo "$shapes" | grep -qx "$s" || { echo "gemm_tune: SHAPES names $s, not one of the layer's:" $shapes; exit 1; }
  done
  shapes=$SHAPES
fi
[ "${KEEP:-0}" = 1 ] || : > "$LOG/gemm_tune_ab.txt"
for s in $shapes; do
  for i in ${CANDIDATES:-1 2 3 4 5 6 7}; do
    # "1x1x1:0" matches no shape: the defaults, as a value the A/B can set
    line=$("$B" "$@" --ab "DT_GEMM_ALGO=1x1x1:0,$s:$i" 2>&1 | grep -E '^A/B')
    [ -n "$line" ] || { echo "$s:$i: no A/B line (candidate not offered?)" | tee -a "$LOG/gemm_tune_ab.txt"; continue; }
    echo "$s:$i ${line#*median of }" | tee -a "$LOG/gemm_tune_ab.txt"
  done
done
win=$(MIN_GAIN_MS=${MIN_GAIN_MS:-0.015} MIN_WINS=${MIN_WINS:-24} python3 - "$LOG/gemm_tune_ab.txt" <<'PY'
import os, re, sys
gain, wins = float(os.environ["MIN_GAIN_MS"]), int(os.environ["MIN_WINS"])
best = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\d+x\d+x\d+):(\d+) \(\S+ - \S+\) ([-+0-9.]+) ms \| \S+ faster in (\d+) of (\d+)", line)
    if not m:
        continue
    shape, i, d, n = m.group(1), m.group(2), float(m.group(3)), int(m.group(4))
    if d < -gain and n >= wins and (shape not in best or d < best[shape][0]):
        best[shape] = (d, i)
print(",".join(f"{s}:{i}" for s, (d, i) in best.items()))
PY
)
if [ -n "$win" ]; then
  for r in 1 2; do "$B" "$@" --ab "DT_GEMM_ALGO=1x1x1:0,$win" 2>&1 | grep -E '^A/B' | tee -a "$LOG/gemm_tune_ab.txt"; done
fi
echo "DT_GEMM_ALGO=$win"
