#!/usr/bin/env bash
# deltatron train on a corrupt checkpoint: trains one step under tp 2 saving a checkpoint,
# flips one byte of the tp-rank-1 shard, then resumes from it, which must fail with one error
# line naming the file, the expected and the actual SHA-256, and a non-zero exit on every rank
# (tests/dist/expect_fail.sh).
#   ckpt_corrupt_cli.sh <deltatron> <source dir> <work dir> <expect_fail.sh> <mpiexec> [flags ...]
set -eu
bin=$1 src=$2 work=$3 expect=$4
shift 4
rm -rf "$work"
mkdir -p "$work"
"$bin" make-corpus --prefix "$work/corpus" --docs 300 >/dev/null
args=(train --config "$src/configs/quickstart.yaml" --data "$work/corpus" --set train.device=cpu
      --set logging.metrics_jsonl= --set checkpoint.dir="$work/ckpt" --set parallel.tp=2)
"$@" -np 2 "$bin" "${args[@]}" --steps 1 >"$work/train.log" 2>&1 || { cat "$work/train.log"; exit 1; }
f="$work/ckpt/step_0000001/shard_tp01-of-02.safetensors"
[[ -f $f ]] || { echo "no $f after the first run"; exit 1; }
off=$(( $(stat -c %s "$f") / 2 ))
b=$(od -An -tu1 -j "$off" -N1 "$f" | tr -d ' ')
printf "\\x$(printf %02x $(( b ^ 1 )))" | dd of="$f" bs=1 seek="$off" conv=notrunc status=none
exec "$expect" 2 \
  "SHA-256 mismatch in shard_tp01-of-02.safetensors: expected [0-9a-f]{64}, actual [0-9a-f]{64} \\(the file is corrupt\\)" \
  "$@" -- "$bin" "${args[@]}" --steps 2
