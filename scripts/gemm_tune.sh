#!/usr/bin/env bash
# In-layer cuBLASLt tuning for bench/gdn_layer (run on the GPU machine, after a build): which
# heuristic candidate of each of the layer's six GEMM shapes makes the whole fwd+bwd fastest.
# Timing a GEMM alone ranks candidates differently from the power-capped layer (docs/perf.md
# v0.25.0, v0.28.0), so every candidate is A/B'd inside the layer against cuBLASLt's first
# (`gdn_layer --ab DT_GEMM_ALGO=...`, ABBA rounds, median of the paired differences), then the
# winners together. Prints the DT_GEMM_ALGO value to run with, against cuBLASLt's first
# (DT_GEMM_TUNED=0: the built-in table, src/ops/gemm_tuned.cpp, stays out of the measurement).
#   BUILD_DIR=build-gpu CANDIDATES="1 2 3 4 5 6 7" SHAPES="MxNxK ..." LOG=dir KEEP=0  bash scripts/gemm_tune.sh [gdn_layer args]
# gdn_layer args: e.g. --ab-block 10 --ab-rounds 16 (~11 s per A/B), which v0.29.0 found to be
# what a steady run sees; one-iteration sides (the default, ~7.5 s per A/B) overstated the gains
# of GEMM choices ~3x, since they switch faster than the power cap settles.
# SHAPES: only these of the layer's shapes (default: all six). CANDIDATES: heuristic indices (up to
# 31; the autotune log lists what each one is; cuBLASLt offered 8 for every shape in v0.29.0).
# KEEP=1: add to an earlier run's $LOG/gemm_tune_ab.txt (same machine, same gdn_layer args, which
# its first line records) and pick the winners from both, the latest result of each candidate.
# A candidate wins its shape when its median gain exceeds MIN_GAIN_MS (0.015) and it is faster in
# at least MIN_WIN_FRAC (0.6) of the rounds.
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
R="$LOG/gemm_tune_ab.txt"
head="# gdn_layer args: $*"
if [ "${KEEP:-0}" = 1 ] && [ -s "$R" ]; then
  [ "$(head -1 "$R")" = "$head" ] || { echo "gemm_tune: KEEP=1, but $R was made with '$(head -1 "$R")', not '$head'"; exit 1; }
else
  echo "$head" > "$R"
fi
for s in $shapes; do
  for i in ${CANDIDATES:-1 2 3 4 5 6 7}; do
    # "1x1x1:0" matches no shape: the defaults, as a value the A/B can set
    line=$("$B" "$@" --ab "DT_GEMM_ALGO=1x1x1:0,$s:$i" 2>&1 | grep -E '^A/B .*median of')
    [ -n "$line" ] || { echo "$s:$i: no A/B line (candidate not offered?)" | tee -a "$R"; continue; }
    echo "$s:$i ${line#*median of }" | tee -a "$R"
  done
done
win=$(MIN_GAIN_MS=${MIN_GAIN_MS:-0.015} MIN_WIN_FRAC=${MIN_WIN_FRAC:-0.6} python3 - "$R" <<'PY'
import os, re, sys
gain, frac = float(os.environ["MIN_GAIN_MS"]), float(os.environ["MIN_WIN_FRAC"])
latest = {}  # (shape, i) -> (median, wins, rounds): a repeated candidate counts by its last run
for line in open(sys.argv[1]):
    m = re.match(r"(\d+x\d+x\d+):(\d+) \(\S+ - \S+\) ([-+0-9.]+) ms \| \S+ faster in (\d+) of (\d+)", line)
    if m:
        latest[(m.group(1), m.group(2))] = (float(m.group(3)), int(m.group(4)), int(m.group(5)))
best = {}
for (shape, i), (d, n, rounds) in latest.items():
    if d < -gain and n >= frac * rounds and (shape not in best or d < best[shape][0]):
        best[shape] = (d, i)
print(",".join(f"{s}:{i}" for s, (d, i) in best.items()))
PY
)
if [ -n "$win" ]; then
  for r in 1 2; do "$B" "$@" --ab "DT_GEMM_ALGO=1x1x1:0,$win" 2>&1 | grep -E '^A/B' | tee -a "$R"; done
fi
echo "DT_GEMM_TUNED=0 DT_GEMM_ALGO=$win"
