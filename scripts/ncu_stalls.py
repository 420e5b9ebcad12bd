#!/usr/bin/env python3
"""Where kernels stall, from Nsight Compute CSV output (standard library only; docs/perf.md v0.17.0).

Per kernel (raw page): time, DRAM bytes and rate, occupancy, tensor-pipe and issue activity,
registers and the largest stall reasons (cycles per issued instruction):

  M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,\\
  sm__warps_active.avg.pct_of_peak_sustained_active,\\
  sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,\\
  smsp__issue_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread
  for s in barrier long_scoreboard short_scoreboard mio_throttle wait lg_throttle membar not_selected selected; do
    M=$M,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio; done
  ncu --clock-control none --profile-from-start off --metrics $M --csv --page raw \\
      build-gpu/bench/gdn_layer --profile > raw.csv
  python3 scripts/ncu_stalls.py raw.csv

Per SASS instruction (source page, stall sampling): the hottest instructions of each kernel with
their two largest stall reasons, and the share of samples by reason:

  ncu --clock-control none --profile-from-start off --section SourceCounters --section WarpStateStats \\
      -k 'regex:wy_kernel|dqk_kernel' -o src build-gpu/bench/gdn_layer --profile
  ncu -i src.ncu-rep --page source --csv --print-source sass > src.csv
  python3 scripts/ncu_stalls.py --source src.csv [--top 30]

Where the executed instructions go (the same source page, --blocks): runs of consecutive SASS
instructions executed equally often (straight-line blocks), the largest first, with their share
of the kernel's executed warp instructions and of its stall samples, and their opcode mix. A
block's share is what removing it would save at most in issue slots (docs/perf.md v0.35.0:
prep's and dqk's predicated fragment stores, a division per vector in dqk's state_dot):

  python3 scripts/ncu_stalls.py --blocks src.csv [--top 20]
"""
import argparse
import csv
import gzip
import re
from collections import Counter, OrderedDict

from ncu_summary import US_PER, raw_csv  # same folder

STALL = "smsp__average_warps_issue_stalled_"


def lines_of(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        return f.read().splitlines()


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return float("nan")


def raw_table(path):
    hdr, units, rows = raw_csv(lines_of(path))
    rows = [r for r in rows if len(r) == len(hdr)]
    ix = {h: i for i, h in enumerate(hdr)}
    b_scale = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}
    stalls = [h for h in hdr if h.startswith(STALL)]
    weighted = ["sm__warps_active.avg.pct_of_peak_sustained_active",
                "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                "smsp__issue_active.avg.pct_of_peak_sustained_active", "launch__registers_per_thread"] + stalls
    agg = OrderedDict()
    for r in rows:
        t = num(r[ix["gpu__time_duration.sum"]]) * US_PER[units[ix["gpu__time_duration.sum"]]]
        by = sum(num(r[ix[m]]) * b_scale.get(units[ix[m]], 1) for m in ("dram__bytes_read.sum", "dram__bytes_write.sum")
                 if m in ix)
        a = agg.setdefault(r[ix["Kernel Name"]][:44], {"t": 0.0, "b": 0.0, "n": 0, "w": {}})
        a["t"], a["b"], a["n"] = a["t"] + t, a["b"] + by, a["n"] + 1
        for m in weighted:
            if m in ix:
                a["w"][m] = a["w"].get(m, 0.0) + num(r[ix[m]]) * t  # time-weighted over launches
    print(f"{'kernel':44s} {'us':>7s} {'x':>2s} {'GB':>6s} {'TB/s':>5s} {'occ%':>5s} {'tc%':>5s} {'iss%':>5s} {'reg':>4s}  "
          "top stalls (cycles per issue)")
    for name, a in sorted(agg.items(), key=lambda kv: -kv[1]["t"]):
        w = lambda m: a["w"].get(m, float("nan")) / a["t"]
        top = sorted(((w(s), s[len(STALL):].replace("_per_issue_active.ratio", "")) for s in stalls), reverse=True)[:4]
        print(f"{name:44s} {a['t']:7.0f} {a['n']:2d} {a['b'] / 1e9:6.2f} {a['b'] / a['t'] / 1e6:5.2f} "
              f"{w(weighted[0]):5.1f} {w(weighted[1]):5.1f} {w(weighted[2]):5.1f} {w(weighted[3]):4.0f}  "
              + " ".join(f"{s}={v:.2f}" for v, s in top))
    print(f"total {sum(a['t'] for a in agg.values()):.0f} us")


def source_kernels(path):
    """The source page's kernels, each {name, hdr, rows}, a kernel profiled twice only once."""
    kernels, cur = [], None
    for l in lines_of(path):
        if l.startswith('"Kernel Name"'):
            cur = {"name": next(csv.reader([l]))[1][:70], "rows": []}
            kernels.append(cur)
        elif l.startswith('"Address"') and cur is not None:
            cur["hdr"] = next(csv.reader([l]))
        elif l.startswith('"0x') and cur is not None:
            cur["rows"].append(next(csv.reader([l])))
    seen, out = set(), []
    for k in kernels:
        if k["name"] in seen or "hdr" not in k:  # a kernel profiled twice: its first launch
            continue
        seen.add(k["name"])
        out.append(k)
    return out


def source_table(path, top):
    for k in source_kernels(path):
        ix = {h: i for i, h in enumerate(k["hdr"])}
        samples = ix["Warp Stall Sampling (All Samples)"]
        reasons = [h for h in k["hdr"] if h.startswith("stall_") and "Not Issued" not in h]
        total = sum(int(r[samples]) for r in k["rows"]) or 1
        share = {s: sum(int(r[ix[s]]) for r in k["rows"]) for s in reasons}
        print(f"== {k['name']}: {len(k['rows'])} instructions, {total} samples; "
              + " ".join(f"{s[6:]}={100 * v / total:.1f}%" for s, v in sorted(share.items(), key=lambda kv: -kv[1])[:7]))
        hot = sorted(range(len(k["rows"])), key=lambda i: -int(k["rows"][i][samples]))[:top]
        for i in sorted(hot):
            r = k["rows"][i]
            two = sorted(((int(r[ix[s]]), s[6:]) for s in reasons), reverse=True)[:2]
            print(f"  {i:5d} {100 * int(r[samples]) / total:5.1f}%  {r[ix['Source']].strip()[:60]:60s} "
                  + " ".join(f"{s}={v}" for v, s in two))


def opcode(src):
    """SASS opcode without predicate and modifiers: '@!P1 LDG.E.128 R4, ...' -> 'LDG'."""
    return re.sub(r"^@!?U?P\w+\s+", "", src.strip()).split(" ")[0].split(".")[0]


def block_table(path, top):
    for k in source_kernels(path):
        ix = {h: i for i, h in enumerate(k["hdr"])}
        ex, samples = ix["Instructions Executed"], ix["Warp Stall Sampling (All Samples)"]
        blocks = []  # [first, last, executions, samples, opcodes]
        for i, r in enumerate(k["rows"]):
            e = int(num(r[ex]))
            if blocks and blocks[-1][2] == e and blocks[-1][1] == i - 1:
                b = blocks[-1]
                b[1], b[3] = i, b[3] + int(r[samples])
                b[4][opcode(r[ix["Source"]])] += 1
            else:
                blocks.append([i, i, e, int(r[samples]), Counter([opcode(r[ix["Source"]])])])
        total = sum(b[2] * (b[1] - b[0] + 1) for b in blocks) or 1
        tsamp = sum(b[3] for b in blocks) or 1
        print(f"== {k['name']}: {total / 1e6:.1f} M warp instructions executed, {tsamp} samples")
        print(f"  {'first-last':>11s} {'n':>4s} {'x/warp':>9s} {'instr%':>6s} {'samp%':>6s}  opcodes")
        for b in sorted(blocks, key=lambda b: -b[2] * (b[1] - b[0] + 1))[:top]:
            n = b[1] - b[0] + 1
            mix = " ".join(f"{o} {c}" for o, c in b[4].most_common(7))
            print(f"  {b[0]:5d}-{b[1]:<5d} {n:4d} {b[2]:9d} {100 * b[2] * n / total:6.1f} {100 * b[3] / tsamp:6.1f}  {mix}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="ncu CSV (raw page, or source page with --source; .gz read as gzip)")
    ap.add_argument("--source", action="store_true", help="the CSV is ncu's source page (SASS with stall samples)")
    ap.add_argument("--blocks", action="store_true",
                    help="the CSV is ncu's source page: executed instructions by straight-line block")
    ap.add_argument("--top", type=int, default=30, help="hottest instructions or largest blocks per kernel")
    a = ap.parse_args()
    if a.blocks:
        block_table(a.csv, a.top)
    elif a.source:
        source_table(a.csv, a.top)
    else:
        raw_table(a.csv)


if __name__ == "__main__":
    main()
