#!/usr/bin/env python3
"""Which kernels' SASS differs between two cubins (standard library + the toolkit's cuobjdump).

For changes meant to leave some kernels untouched (a refactor, a template flag that is off by
default): compile one translation unit twice, before and after, on a machine with no GPU,

  nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc --expt-relaxed-constexpr \\
       -cubin -o after.cubin src/ops/cuda/gdn_chunk.cu
  python3 scripts/sass_diff.py before.cubin after.cubin

and it prints each function whose instruction sequence changed (branch targets and other hex
constants masked), with both instruction counts. cuobjdump and nvdisasm come with the CUDA
toolkit; where the toolkit lacks them, `pip download --no-deps nvidia-cuda-cuobjdump
nvidia-cuda-nvdisasm` and unzip the wheels (tooling only). --rename REGEX=REPL rewrites the first
file's mangled names (re.sub) to match the second's, e.g. for a template flag appended with its
default value: --rename '(rev_warp_kernelILi\d+ELi\d+ELb\d)E=\1ELb0E'.
"""
import argparse
import re
import subprocess

INSN = re.compile(r"\s+/\*[0-9a-f]{4,6}\*/\s+(.*?);")  # addresses grow past 4 hex digits in long kernels


def functions(cubin):
    out = subprocess.run(["cuobjdump", "-sass", cubin], capture_output=True, text=True, check=True).stdout
    cur, funcs = None, {}
    for line in out.splitlines():
        m = re.match(r"\s+Function : (\S+)", line)
        if m:
            cur = m.group(1)
            funcs[cur] = []
            continue
        m = INSN.match(line)
        if m and cur:
            funcs[cur].append(re.sub(r"0x[0-9a-f]+", "HEX", m.group(1)))
    return funcs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rename", action="append", default=[], help="REGEX=REPL applied to the first file's names")
    a = ap.parse_args()
    before, after = functions(a.before), functions(a.after)
    for r in a.rename:
        old, new = r.split("=", 1)
        before = {re.sub(old, new, k): v for k, v in before.items()}
    changed = 0
    for name in sorted(set(before) | set(after)):
        x, y = before.get(name), after.get(name)
        if x != y:
            changed += 1
            print(f"{'-' if x is None else len(x):>6} {'-' if y is None else len(y):>6}  {name}")
    print(f"{changed} of {len(set(before) | set(after))} functions differ ({len(before)} before, {len(after)} after)")


if __name__ == "__main__":
    main()
