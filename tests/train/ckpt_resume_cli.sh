#!/usr/bin/env bash
# Bit-exact resume across processes with the deltatron program: run A trains 6 steps saving
# after 3 and 6; run B, a new process, starts from A's step-3 checkpoint and trains steps 4-6.
# Passes when B's metrics (loss, grad norm, lr, skipped) equal A's for steps 4-6 and
# the final shard files (fp32 weights and AdamW state) are identical byte for byte.
#   ckpt_resume_cli.sh <deltatron> <source dir> <work dir> <cpu|cuda> <np> <mpiexec> [flags ...]
# The layout is tp = np. On the GPU (once the CUDA training path exists):
#   tests/train/ckpt_resume_cli.sh build/bin/deltatron . /tmp/ckpt_gpu cuda 1 mpirun
set -eu
bin=$1 src=$2 work=$3 device=$4 np=$5
shift 5
rm -rf "$work"
mkdir -p "$work"
"$bin" make-corpus --prefix "$work/corpus" --docs 300 >/dev/null
args=(train --config "$src/configs/quickstart.yaml" --data "$work/corpus" --set train.device="$device"
      --set parallel.tp="$np" --steps 6 --set logging.log_interval=1)
run() {  # name, extra args...
  local name=$1
  shift
  "$@" >"$work/$name.log" 2>&1 || { cat "$work/$name.log"; echo "ckpt_resume_cli: FAIL: run $name failed"; exit 1; }
}
launch=("$@" -np "$np" "$bin")
run a "${launch[@]}" "${args[@]}" --set checkpoint.dir="$work/a" --set checkpoint.interval=3 \
  --set logging.metrics_jsonl="$work/a.jsonl"
run b "${launch[@]}" "${args[@]}" --set checkpoint.dir="$work/b" --set checkpoint.load="$work/a/step_0000003" \
  --set logging.metrics_jsonl="$work/b.jsonl"
grep -q "resumed from $work/a/step_0000003 at step 3" "$work/b.log" || { cat "$work/b.log"; echo "ckpt_resume_cli: FAIL: B did not resume"; exit 1; }
fields() { sed -E 's/"(step_ms|tokens_per_s|tflops_per_gpu|mfu|peak_mem_bytes|eta_s)": [^,}]*,? ?//g' "$1"; }  # timings and memory differ, the rest must not
if ! diff <(fields "$work/a.jsonl" | tail -n 3) <(fields "$work/b.jsonl"); then
  echo "ckpt_resume_cli: FAIL: steps 4-6 differ between the straight run (<) and the resumed one (>)"
  exit 1
fi
n=0
for f in "$work"/a/step_0000006/shard_*.safetensors; do
  cmp "$f" "$work/b/step_0000006/$(basename "$f")" || { echo "ckpt_resume_cli: FAIL: $(basename "$f") differs"; exit 1; }
  n=$((n + 1))
done
[[ $n -eq $np ]] || { echo "ckpt_resume_cli: FAIL: $n shard files, expected $np"; exit 1; }
echo "ckpt_resume_cli: ok ($device, np $np: steps 4-6 and $n final shard file(s) identical)"
