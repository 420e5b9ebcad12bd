#!/usr/bin/env bash
# Kernel A/B of build variants on ONE GPU machine (the method of docs/perf.md since v0.22.0: machines
# differ by more than most kernel changes, so every variant is built and measured in the same call).
#
# Here, where git works (prepares the base tree, the commit to compare against, into .ab/base):
#   bash scripts/gpu_ab.sh --prepare-base [REV]          # REV: default HEAD
# On the GPU machine (the device tool: carry .ab), e.g.
#   VARIANTS="base new x:-DDT_EXP_MY_SWITCH=1" ROUNDS=2 LAYER=1 TEST=test_gdn_chunk_cuda \
#     SRC='regex:state_warp_kernel|rev_warp_kernel' bash scripts/gpu_ab.sh
# VARIANTS: names, each "name" or "name:nvcc defines" (defines separated by commas). "new" is the
#   working tree, "base" .ab/base (both full builds); a name with defines is the working tree with
#   gdn_chunk.cu alone recompiled with them (DT_EXP_* switches go there, or in the headers it includes) and relinked.
# AB_FILES: the sources a variant recompiles (default src/ops/cuda/gdn_chunk.cu), e.g.
#   AB_FILES="src/ops/cuda/conv1d_varlen.cu" for the conv's DT_CONV_* knobs.
# Per variant: the four `gdn_kernels` digests (a change that keeps every sum order keeps them) and
# times; ncu's per-kernel times of one `gdn_layer` fwd+bwd, ROUNDS rounds with the variants
# alternating (default 2); LAYER=1: the eager `gdn_layer` fwd+bwd, two rounds alternating;
# TEST=<test binaries, e.g. test_gdn_chunk_cuda>, right after the digests: run on TEST_VARIANT (names, default: the last
#   variant) [with --gtest_filter=TEST_FILTER], a fresh process (and DT_TEST_SEED) per run, up to
#   TEST_REPEAT runs until one fails (its log keeps the failing run); SRC=<ncu -k filter>: ncu's
#   per-SASS-instruction stall samples of those kernels on SRC_VARIANT (default: the last), for
#   scripts/ncu_stalls.py --source (its --blocks summary is printed). BUDGET (s, default 520):
#   steps that would start later are skipped, so that the logs come back within one 600 s device call; DIGESTS=0 skips
#   gdn_kernels (for variants outside the chunk kernels, e.g. AB_FILES's conv); STEP_TIMEOUT (s, default 120)
#   ends any one program that runs longer (a hung kernel), so that the rest still runs. Everything lands in one
#   tarball, $OUT/ab.tgz (the device tool returns at most 8 files), and a summary is printed.
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
BUDGET=${BUDGET:-520}   # seconds: later steps are skipped past it, so the logs come back inside one call
left() { [ $(($(date +%s) - T0)) -lt "$BUDGET" ] || { t "budget of $BUDGET s spent: skipping $*"; return 1; }; }
names=()
declare -A defs
for v in "${VARS[@]}"; do
  n=${v%%:*}
  d=""
  [[ $v == *:* ]] && d=${v#*:}
  names+=("$n")
  defs[$n]=${d//,/ }
  [ "$n" = new ] && [ -n "$d" ] && { echo "gpu_ab: 'new' is the working tree without defines"; exit 1; }
done
[ " ${names[*]} " == *" base "* ] && [ ! -f .ab/base/CMakeLists.txt ] && { echo "gpu_ab: no .ab/base (run --prepare-base here first)"; exit 1; }
last=${names[-1]}
read -r -a tvs <<< "${TEST_VARIANT:-$last}"
read -r -a tests <<< "${TEST:-}"
# Full trees: the working tree ("new", always: the variants with defines start from its objects)
# and .ab/base. A variant with defines differs only in gdn_chunk.cu, the translation unit the
# switches live in: that one file is compiled again with the defines (from new's compile command),
# swapped into a copy of new's libdeltatron.a, and the programs relinked (link.txt of the Makefile
# generator). Four full trees side by side took more than one device call (600 s).
trees=(new)
[[ " ${names[*]} " == *" base "* ]] && trees+=(base)
tgts="gdn_kernels gdn_layer ${TEST:-}"
jobs=$(($(nproc) / ${#trees[@]}))
for n in "${trees[@]}"; do
  s=.; [ "$n" = base ] && s=.ab/base
  (cmake -S "$s" -B ".ab/build-$n" -G "Unix Makefiles" -DCMAKE_BUILD_TYPE=Release -DDELTATRON_CUDA=ON \
     -DCMAKE_EXPORT_COMPILE_COMMANDS=ON > "$L/cfg_$n.log" 2>&1 &&
   cmake --build ".ab/build-$n" -j "$jobs" --target $tgts > "$L/build_$n.log" 2>&1
   echo "build $n: rc $?") &
done
# the variants' objects of AB_FILES, alongside the trees' builds (each file's compile command, as
# new's build has it, taken once)
read -r -a abfiles <<< "${AB_FILES:-src/ops/cuda/gdn_chunk.cu}"
while [ ! -f .ab/build-new/compile_commands.json ]; do sleep 1; done
declare -A abcmd
for f in "${abfiles[@]}"; do
  abcmd[$f]=$(python3 -c '
import json, sys
for e in json.load(open(".ab/build-new/compile_commands.json")):
    if e["file"].endswith(sys.argv[1]):
        print(e["command"]); break' "$f")
  [ -n "${abcmd[$f]}" ] || { echo "gpu_ab: AB_FILES names $f, which no compile command builds"; exit 1; }
done
for n in "${names[@]}"; do
  [ -z "${defs[$n]}" ] && continue
  mkdir -p ".ab/build-$n/bench" ".ab/build-$n/tests"
  for f in "${abfiles[@]}"; do
    cmd=${abcmd[$f]}
    obj="$PWD/.ab/build-$n/$(basename "$f").o"
    # shellcheck disable=SC2086
    (cd .ab/build-new && eval "${cmd% -o *} -o $obj ${defs[$n]}" >> "$L/build_$n.log" 2>&1
     echo "compile $n $(basename "$f"): rc $?") &
  done
done
wait
t built
for n in "${names[@]}"; do
  [ -z "${defs[$n]}" ] && continue
  b=".ab/build-$n"
  objs=()
  for f in "${abfiles[@]}"; do objs+=("$b/$(basename "$f").o"); done
  cp .ab/build-new/libdeltatron.a "$b/libdeltatron.a" && ar r "$b/libdeltatron.a" "${objs[@]}" || exit 1
  for tg in $tgts; do
    dir=bench; [[ " ${tests[*]} " == *" $tg "* ]] && dir=tests
    link=$(sed -e "s#\.\./libdeltatron\.a#$PWD/$b/libdeltatron.a#" -e "s# -o $tg # -o $PWD/$b/$dir/$tg #" \
      ".ab/build-new/$dir/CMakeFiles/$tg.dir/link.txt")
    (cd ".ab/build-new/$dir" && eval "$link") >> "$L/build_$n.log" 2>&1 || { echo "link $n/$tg failed"; exit 1; }
  done
done
t linked
for n in "${names[@]}"; do
  [ -x ".ab/build-$n/bench/gdn_kernels" ] || { grep -E ' error' -A3 "$L/build_$n.log" | head -20; exit 1; }
done

if [ "${DIGESTS:-1}" = 1 ]; then
  echo "== gdn_kernels: fwd+bwd with saved intermediates (a)-(d), digests"
  for n in "${names[@]}"; do
    timeout "${STEP_TIMEOUT:-120}" ".ab/build-$n/bench/gdn_kernels" > "$L/kern_$n.log" 2>&1 || echo "$n: gdn_kernels rc $?"
    echo "$n: $(grep -o 'saved intermediates [0-9.]* ms, outputs. sha256 [0-9a-f]*' "$L/kern_$n.log" |
      sed -E 's/saved intermediates ([0-9.]+) ms, outputs. sha256 ([0-9a-f]+)/\1 \2/' | tr '\n' ' ')"
  done
  t digests
fi

if [ -n "${TEST:-}" ]; then
  # the test binary itself, a fresh process (and DT_TEST_SEED) per run, until one fails
  for tv in "${tvs[@]}"; do
    for tb in "${tests[@]}"; do
      rc=0 i=0
      for i in $(seq "${TEST_REPEAT:-1}"); do
        left "$tb runs $i.. on $tv" || break
        timeout "${STEP_TIMEOUT:-120}" ".ab/build-$tv/tests/$tb" ${TEST_FILTER:+--gtest_filter="$TEST_FILTER"} > "$L/test_${tv}_$tb.log" 2>&1 || { rc=$?; break; }
      done
      echo "== $tb ${TEST_FILTER:+--gtest_filter=$TEST_FILTER }on $tv, up to ${TEST_REPEAT:-1} runs: rc $rc (run $i)"
      grep -E 'Failure|FAILED|DT_TEST_SEED|PASSED' "$L/test_${tv}_$tb.log" | head -20
      t tests
    done
  done
fi

M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,smsp__inst_executed.sum
for r in $(seq "${ROUNDS:-2}"); do
  left "ncu round $r" || break
  for n in "${names[@]}"; do
    timeout "${STEP_TIMEOUT:-120}" ncu --clock-control none --profile-from-start off --metrics $M --csv --page raw \
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
first = {}  # each variant's first round (hdr, units, rows), for the DRAM table below
for n in names:
    for r in range(1, rounds + 1):
        p = f"{L}/ncu_{n}_{r}.csv"
        if not os.path.exists(p):
            continue
        hdr, units, rows = raw_csv(open(p).read().splitlines())
        if r == 1:
            first[n] = (hdr, units, rows)
        ix = {h: i for i, h in enumerate(hdr)}
        k, tcol = ix["Kernel Name"], ix["gpu__time_duration.sum"]
        us = [float(x[tcol].replace(",", "")) * US_PER[units[tcol]] for x in rows]
        if head is None:
            head = [short(x[k]) for x in rows]
            print(f"{'':10s}" + "".join(f"{h:>13s}" for h in head) + f"{'all':>9s}")
        print(f"{n:10s}" + "".join(f"{u:13.1f}" for u in us) + f"{sum(us) / 1e3:9.3f}")
# DRAM read + write bytes over time (TB/s), the first round of each variant: a streaming kernel
# (out, dvl, the conv backward) reaches ~2.87 on an H100 (docs/perf.md v0.36.0), so the gap to
# it is the room a kernel has
print("== ncu, DRAM TB/s per kernel (read + write bytes / time), first round")
BY = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}
for n, (hdr, units, rows) in first.items():
    ix = {h: i for i, h in enumerate(hdr)}
    tcol, rd, wr = ix["gpu__time_duration.sum"], ix["dram__bytes_read.sum"], ix["dram__bytes_write.sum"]
    def tbs(x):
        b = float(x[rd].replace(",", "")) * BY[units[rd]] + float(x[wr].replace(",", "")) * BY[units[wr]]
        return b / (float(x[tcol].replace(",", "")) * US_PER[units[tcol]] * 1e-6) / 1e12
    print(f"{n:10s}" + "".join(f"{tbs(x):13.2f}" for x in rows))
EOF

if [ "${LAYER:-0}" = 1 ]; then
  echo "== gdn_layer eager (two rounds alternating)"
  for r in 1 2; do
    left "layer round $r" || break
    for n in "${names[@]}"; do
      timeout "${STEP_TIMEOUT:-120}" ".ab/build-$n/bench/gdn_layer" > "$L/layer_${n}_$r.log" 2>&1
      echo "$n: $(grep -h -e '  fwd ' -e 'back to back' "$L/layer_${n}_$r.log" | tr -s ' \n' ' ')"
    done
  done
  t layer
fi
if [ -n "${SRC:-}" ] && left "source view"; then
  sv=${SRC_VARIANT:-$last}
  timeout "${STEP_TIMEOUT:-120}" ncu --clock-control none --profile-from-start off --section SourceCounters --section WarpStateStats \
    -k "$SRC" -o /tmp/ab_src ".ab/build-$sv/bench/gdn_layer" --profile > "$L/src_$sv.log" 2>&1
  ncu -i /tmp/ab_src.ncu-rep --page source --csv --print-source sass > "$L/src_$sv.csv" 2>> "$L/src_$sv.log"
  gzip -f "$L/src_$sv.csv"
  rm -f /tmp/ab_src.ncu-rep
  # where the executed instructions go, by straight-line block (ncu_stalls.py --blocks)
  python3 scripts/ncu_stalls.py --blocks --top 12 "$L/src_$sv.csv.gz" > "$L/src_blocks_$sv.txt" 2>&1
  head -60 "$L/src_blocks_$sv.txt"
  t "source view of '$SRC' on $sv: src_$sv.csv.gz, src_blocks_$sv.txt"
fi
t "done"
