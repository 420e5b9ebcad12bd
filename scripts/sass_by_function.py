#!/usr/bin/env python3
"""Where a kernel's SASS comes from: its instructions per source function (standard library + the
toolkit's nvdisasm), for kernels that near the SM's instruction cache.

A kernel whose code does not fit the instruction cache stalls on instruction fetch (ncu's
`stall_no_inst`): dqk and wy fused into one kernel took 203 KB of SASS, 47% of its stall samples
were no_instruction, and it ran at half the speed of the two kernels apart (docs/perf.md
v0.14.0, v0.37.0). Compile with line info (the build's -lineinfo) to a cubin, then

  nvcc ... -lineinfo -cubin -o gdn_chunk.cubin src/ops/cuda/gdn_chunk.cu
  python3 scripts/sass_by_function.py gdn_chunk.cubin dqk_kernelI13 wy_kernelI13 [--top 20]

Each kernel (a substring of its mangled name) gets its instruction count and size, then its
instructions by the source function of their innermost inlined line: the enclosing definition
(a line starting with `__device__` / `__global__`, after any `template<...>`, `static`, `inline`,
`__host__`) before that line in the file nvdisasm names. Inline helpers from
the CUDA headers count under the header's name. nvdisasm comes with the CUDA toolkit; where it is
missing, `pip download --no-deps nvidia-cuda-nvdisasm` and unzip the wheel (see sass_diff.py).
"""
import argparse
import bisect
import collections
import os
import re
import subprocess

LINE = re.compile(r'//## File "([^"]+)", line (\d+)')
INSN = re.compile(r"\s+/\*[0-9a-f]{4,6}\*/\s")
DEF = re.compile(r"^\s*(?:template\s*<.*>\s*)?(?:(?:static|inline|constexpr|__host__|__forceinline__)\s+)*"
                 r"(?:__device__|__global__)\b")
BOUNDS = re.compile(r"__launch_bounds__\s*\([^()]*(?:\([^()]*\)[^()]*)*\)")  # one level of nested ()
NAME = re.compile(r"\b([A-Za-z_]\w*)\s*\(")


class SourceFunctions:
    """The function definition enclosing a line, by the nearest preceding `__device__` or
    `__global__` definition (a kernel's `__launch_bounds__(...) void name(` included)."""

    def __init__(self):
        self.cache = {}

    def __call__(self, path, line):
        if path not in self.cache:
            defs = []
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    for i, text in enumerate(f, 1):
                        if not DEF.match(text):
                            continue
                        # the first identifier followed by "(" once __launch_bounds__(...) is gone:
                        # `__global__ void __launch_bounds__(256) k(`, `__global__ __launch_bounds__(
                        # 256, 2) void k(`, `__host__ __device__ T f(` (a name on the next line is missed)
                        m = NAME.search(BOUNDS.sub(" ", text))
                        if m and m.group(1) not in ("decltype", "alignas", "sizeof"):
                            defs.append((i, m.group(1)))
            self.cache[path] = ([d[0] for d in defs], [d[1] for d in defs])
        lines, names = self.cache[path]
        k = bisect.bisect_right(lines, line) - 1
        return names[k] if k >= 0 else os.path.basename(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cubin", help="a cubin compiled with -lineinfo (or an `nvdisasm -g -c` listing, .sass)")
    ap.add_argument("kernels", nargs="+", help="substrings of the mangled kernel names")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--nvdisasm", default="nvdisasm")
    a = ap.parse_args()
    if a.cubin.endswith(".sass"):
        text = open(a.cubin).read()
    else:
        text = subprocess.run([a.nvdisasm, "-g", "-c", a.cubin], capture_output=True, text=True, check=True).stdout
    lines = text.splitlines()
    heads = [i for i, l in enumerate(lines) if l.startswith(".text.")]
    fn = SourceFunctions()
    for want in a.kernels:
        hits = [i for i in heads if want in lines[i]]
        if not hits:
            print(f"== {want}: no such kernel")
            continue
        for start in hits:
            end = next((i for i in heads if i > start), len(lines))
            cur, count, n = ("?", 0), collections.Counter(), 0
            for l in lines[start:end]:
                m = LINE.search(l)
                if m:
                    cur = (m.group(1), int(m.group(2)))
                elif INSN.match(l):
                    count[fn(*cur)] += 1
                    n += 1
            print(f"== {lines[start][6:].rstrip(':')[:110]}\n   {n} instructions, {n * 16 / 1024:.0f} KB")
            for name, k in count.most_common(a.top):
                print(f"  {k:7d} {100 * k / max(n, 1):5.1f}%  {name}")


if __name__ == "__main__":
    main()
