#!/usr/bin/env bash
# Expected-failure check for multi-rank runs:
#   expect_fail.sh [--abort] <np> <pattern> <mpiexec> [mpiexec flags ...] -- <program> [args ...]
# Passes when
#   1. the plain launch exits non-zero and prints <pattern> (an extended regex) exactly once
#      (rank 0 reports a user error, or the failing rank a fatal one; the others stay quiet), and
#   2. every one of the <np> ranks exits non-zero (each rank runs under a small shell that
#      prints its exit status). With --abort (the job is ended by MPI_Abort, which also kills
#      those shells) only step 1 runs.
set -u
abort=0
if [[ ${1:-} == "--abort" ]]; then abort=1; shift; fi
if [[ $# -lt 5 ]]; then
  echo "usage: $0 [--abort] <np> <pattern> <mpiexec> [flags ...] -- <program> [args ...]" >&2
  exit 2
fi
np=$1 pattern=$2
shift 2
launcher=()
while [[ $# -gt 0 && $1 != "--" ]]; do launcher+=("$1"); shift; done
[[ $# -gt 1 ]] || { echo "expect_fail: missing '-- <program>'" >&2; exit 2; }
shift
out=$(mktemp)
trap 'rm -f "$out"' EXIT

"${launcher[@]}" -np "$np" "$@" >"$out" 2>&1
rc=$?
cat "$out"
if [[ $rc -eq 0 ]]; then
  echo "expect_fail: FAIL: the launch exited 0, expected non-zero"
  exit 1
fi
hits=$(grep -cE -- "$pattern" "$out")
if [[ $hits -ne 1 ]]; then
  echo "expect_fail: FAIL: expected the message /$pattern/ exactly once, found it $hits times"
  exit 1
fi
if [[ $abort -eq 1 ]]; then
  echo "expect_fail: ok (exit $rc, message printed once)"
  exit 0
fi

# shellcheck disable=SC2016  # expanded by the per-rank shell
wrap='"$0" "$@"; rc=$?; echo "expect_fail: rank ${OMPI_COMM_WORLD_RANK:-?} exit $rc"'
"${launcher[@]}" -np "$np" bash -c "$wrap" "$@" >"$out" 2>&1
statuses=$(grep -E '^expect_fail: rank ' "$out")
echo "$statuses"
failed=$(grep -cE 'exit [1-9]' <<<"$statuses")
if [[ $failed -ne $np ]]; then
  echo "expect_fail: FAIL: $failed of $np ranks exited non-zero"
  cat "$out"
  exit 1
fi
echo "expect_fail: ok (exit $rc, message printed once, all $np ranks exited non-zero)"
