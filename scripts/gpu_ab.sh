#!/usr/bin/env bash
# Kernel A/B of build variants on ONE GPU machine (the method of docs/perf.md since v0.22.0: machines
# differ by more than most kernel changes, so every variant is built and measured in the same call).
#
# Here, where git works (prepares the base tree, the commit to compare against, into .ab/base):
#   bash scripts/gpu_ab.sh --prepare-base [REV]          # REV: default HEAD
# On the GPU machine (the device tool: carry .ab), e.g.
#   VARIANTS="base new u_early:-DDT_EXP_STATE_U_EARLY=1" ROUNDS=2 LAYER=1 TEST=test_gdn_chunk_cuda \
#     SRC='regex:state_warp_kernel|rev_warp_kernel' bash scripts/gpu_ab.sh
# VARIANTS: names, each "name" or "name:nvcc defines" (defines separated by commas); "base" builds
#   .ab/base, every other name the working tree with its defines.
# Per variant: the four `gdn_kernels` digests (a change that keeps every sum order keeps them) and
# times; ncu's per-kernel times of one `gdn_layer` fwd+bwd, ROUNDS rounds with the variants
# alternating (default 2); LAYER=1: the eager `gdn_layer` fwd+bwd, two rounds alternating;
# TEST=<ctest regex>: those tests on TEST_VARIANT (names, default: the last variant), TEST_REPEAT
#   times until one fails (default 1; its log keeps the failing run and its DT_TEST_SEED); with
#   TEST_FILTER=<gtest filter>, TEST names one test binary, run directly; SRC=<ncu -k filter>:
# ncu's per-SASS-instruction stall samples of those kernels on SRC_VARIANT (default: the last), for
# scripts/ncu_stalls.py --source. Everything lands in one tarball, $OUT/ab.tgz (the device tool
# returns at most 8 files), and a summary is printed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
if [ "${1:-}" = "--prepare-base" ]; then
  rm -rf .ab/base && mkdir -p .ab/base
  git archive "${2:-HEAD}" CMakeLists.txt src include bench tests third_party scripts | tar -x -C .ab/base || exit 1
  echo "base tree of $(git rev-parse --short "${2:-HEAD}") in .ab/base (carry .ab)"
  exit 0
fi
export NCCL_NVLS_ENABLE=0
T0=$(date +%s)
t() { echo "[$(($(date +%s) - T0)) s] $*"; }
L=/tmp/ab_logs
rm -rf "$L" && mkdir -p "$L"
# the logs go back also when a build or a step fails part way
trap '[ -n "${OUT:-}" ] && tar czf "$OUT/ab.tgz" -C /tmp ab_logs && echo "logs: \$OUT/ab.tgz"' EXIT
read -r -a VARS <<< "${VARIANTS:-base new}"
names=()
declare -A src defs
for v in "${VARS[@]}"; do
  n=${v%%:*}
  d=""
  [[ $v == *:* ]] && d=${v#*:}
  names+=("$n")
  defs[$n]=${d//,/ }
  if [ "$n" = base ]; then src[$n]=.ab/base; else src[$n]=.; fi
  [ -f "${src[$n]}/CMakeLists.txt" ] || { echo "gpu_ab: no tree for '$n' at ${src[$n]} (run --prepare-base here first)"; exit 1; }
done
last=${names[-1]}
read -r -a tvs <<< "${TEST_VARIANT:-$last}"
jobs=$(($(nproc) / ${#names[@]}))
[ "$jobs" -lt 2 ] && jobs=2
for n in "${names[@]}"; do
  (cmake -S "${src[$n]}" -B ".ab/build-$n" -DCMAKE_BUILD_TYPE=Release -DDELTATRON_CUDA=ON \
     "-DCMAKE_CUDA_FLAGS=${defs[$n]}" > "$L/cfg_$n.log" 2>&1 &&
     tgts="gdn_kernels gdn_layer"
     # the tests only where they run (TEST: target names, as a ctest regex of alternatives)
     [ -n "${TEST:-}" ] && [[ " ${tvs[*]} " == *" $n "* ]] && tgts="$tgts ${TEST//|/ }"
     cmake --build ".ab/build-$n" -j "$jobs" --target $tgts > "$L/build_$n.log" 2>&1
   echo "build $n: rc $?") &
done
wait
t built
for n in "${names[@]}"; do
  [ -x ".ab/build-$n/bench/gdn_kernels" ] || { grep -E ' error' -A3 "$L/build_$n.log" | head -20; exit 1; }
done

echo "== gdn_kernels: fwd+bwd with saved intermediates (a)-(d), digests"
for n in "${names[@]}"; do
  ".ab/build-$n/bench/gdn_kernels" > "$L/kern_$n.log" 2>&1
  echo "$n: $(grep -o 'saved intermediates [0-9.]* ms, outputs. sha256 [0-9a-f]*' "$L/kern_$n.log" |
    sed -E 's/saved intermediates ([0-9.]+) ms, outputs. sha256 ([0-9a-f]+)/\1 \2/' | tr '\n' ' ')"
done
t digests

M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,smsp__inst_executed.sum
for r in $(seq "${ROUNDS:-2}"); do
  for n in "${names[@]}"; do
    ncu --clock-control none --profile-from-start off --metrics $M --csv --page raw \
      ".ab/build-$n/bench/gdn_layer" --profile > "$L/ncu_${n}_$r.csv" 2> "$L/ncu_${n}_$r.err"
  done
done
t ncu
echo "== ncu, us per kernel of one gdn_layer fwd+bwd, in launch order (one line per round)"
python3 - "$L" "${ROUNDS:-2}" "${names[@]}" << 'EOF'
import os, re, sys
sys.path.insert(0, "scripts")
from ncu_summary import US_PER, raw_csv
L, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def short(k):
    if "nvjet" in k or "gemm" in k.lower():
        return "gemm"
    m = re.search(r"(\w+)_kernel", k)
    return (m.group(1) if m else k[:12])[:12]
head = None
for n in names:
    for r in range(1, rounds + 1):
        p = f"{L}/ncu_{n}_{r}.csv"
        if not os.path.exists(p):
            continue
        hdr, units, rows = raw_csv(open(p).read().splitlines())
        ix = {h: i for i, h in enumerate(hdr)}
        k, tcol = ix["Kernel Name"], ix["gpu__time_duration.sum"]
        us = [float(x[tcol].replace(",", "")) * US_PER[units[tcol]] for x in rows]
        if head is None:
            head = [short(x[k]) for x in rows]
            print(f"{'':10s}" + "".join(f"{h:>13s}" for h in head) + f"{'all':>9s}")
        print(f"{n:10s}" + "".join(f"{u:13.1f}" for u in us) + f"{sum(us) / 1e3:9.3f}")
EOF

if [ "${LAYER:-0}" = 1 ]; then
  echo "== gdn_layer eager (two rounds alternating)"
  for r in 1 2; do
    for n in "${names[@]}"; do
      ".ab/build-$n/bench/gdn_layer" > "$L/layer_${n}_$r.log" 2>&1
      echo "$n: $(grep -h '  fwd ' "$L/layer_${n}_$r.log")"
    done
  done
  t layer
fi
if [ -n "${TEST:-}" ]; then
  for tv in "${tvs[@]}"; do
    if [ -n "${TEST_FILTER:-}" ]; then  # one binary, a gtest filter, a fresh process (and seed) per run
      rc=0
      for i in $(seq "${TEST_REPEAT:-1}"); do
        ".ab/build-$tv/tests/$TEST" --gtest_filter="$TEST_FILTER" > "$L/test_$tv.log" 2>&1 || { rc=$?; break; }
      done
      echo "== $TEST --gtest_filter=$TEST_FILTER on $tv, up to ${TEST_REPEAT:-1} runs: rc $rc (run $i)"
    else
      (cd ".ab/build-$tv" && ctest -R "$TEST" --repeat "until-fail:${TEST_REPEAT:-1}" --output-on-failure \
        > "$L/test_$tv.log" 2>&1)
      echo "== tests '$TEST' on $tv: rc $? ($(grep -E 'tests passed' "$L/test_$tv.log"))"
    fi
    grep -E 'Failure|FAILED|DT_TEST_SEED' "$L/test_$tv.log" | head -20
    t tests
  done
fi
if [ -n "${SRC:-}" ]; then
  sv=${SRC_VARIANT:-$last}
  ncu --clock-control none --profile-from-start off --section SourceCounters --section WarpStateStats \
    -k "$SRC" -o /tmp/ab_src ".ab/build-$sv/bench/gdn_layer" --profile > "$L/src_$sv.log" 2>&1
  ncu -i /tmp/ab_src.ncu-rep --page source --csv --print-source sass > "$L/src_$sv.csv" 2>> "$L/src_$sv.log"
  gzip -f "$L/src_$sv.csv"
  rm -f /tmp/ab_src.ncu-rep
  t "source view of '$SRC' on $sv: src_$sv.csv.gz"
fi
t "done"
