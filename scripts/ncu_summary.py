#!/usr/bin/env python3
"""Per-kernel time table from `ncu --csv --page raw --metrics gpu__time_duration.sum` output.

  ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv --page raw \
      build/bench/train_step --steps 1 --warmup 1 --phases 1 --profile > ncu.csv
  python3 scripts/ncu_summary.py ncu.csv [--top 40]

Kernels are listed in launch order within each profiler window (one decoder layer of each type,
forward then backward), then summed by name. Standard library only.
"""
import argparse
import csv
import sys
from collections import OrderedDict


# Microseconds per unit of ncu's time columns (also used by scripts/ncu_stalls.py).
US_PER = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}


def raw_csv(lines):
    """ncu's raw-page CSV: (header, units, data rows); ncu's own ==PROF== lines are not CSV."""
    r = csv.reader([l for l in lines if l.startswith('"')])
    header = next(r)
    units = next(r)  # the second row holds the units
    return header, units, list(r)


def rows(path):
    with open(path, newline="") as f:
        header, units, data = raw_csv(f)
    name_col = header.index("Kernel Name")
    t_col = header.index("gpu__time_duration.sum")
    scale = US_PER[units[t_col]]
    for row in data:
        if len(row) <= max(name_col, t_col):
            continue
        yield row[name_col], float(row[t_col].replace(",", "")) * scale


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    seq = list(rows(a.csv))
    if not seq:
        sys.exit(f"{a.csv}: no kernel rows (did ncu finish?)")
    total = sum(t for _, t in seq)
    print(f"{len(seq)} kernels, {total / 1e3:.3f} ms in all (serialised under ncu)\n")
    print("in launch order:")
    for i, (n, t) in enumerate(seq):
        print(f"  {i:4d} {t:9.1f} us  {n[:110]}")
    by = OrderedDict()
    for n, t in seq:
        c, s = by.get(n, (0, 0.0))
        by[n] = (c + 1, s + t)
    print("\nby name (sum, share):")
    for n, (c, s) in sorted(by.items(), key=lambda kv: -kv[1][1])[: a.top]:
        print(f"  {s:9.1f} us {100 * s / total:5.1f}%  x{c:<3d} {n[:100]}")


if __name__ == "__main__":
    main()
