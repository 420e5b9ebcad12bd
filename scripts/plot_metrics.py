#!/usr/bin/env python3
"""Plot deltatron training metrics (logging.metrics_jsonl) of one or several runs side by side.

    scripts/plot_metrics.py RUN.jsonl [MORE.jsonl ...] -o plot.png

Draws loss, grad norm, tokens/s and (when recorded) peak memory against the step, one line per
run, labelled by the file name. Needs matplotlib (`pip install matplotlib` or Debian's
python3-matplotlib); nothing is installed at import time.
"""
import argparse
import json
import os
import re
import sys

# Files written before non-finite values became null held a bare nan / inf, which is not JSON.
_NONFINITE = re.compile(r":\s*-?(nan|inf)\b")


def load(path):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(_NONFINITE.sub(": null", line))
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not a JSON object ({e})")
            if isinstance(r.get("peak_mem_bytes"), (int, float)):
                r["peak_mem_gib"] = r["peak_mem_bytes"] / 2**30
            rows.append(r)
    if not rows:
        sys.exit(f"{path}: no records")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="metrics JSONL files")
    ap.add_argument("-o", "--out", default="metrics.png", help="output image (PNG, SVG, PDF)")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_metrics.py needs matplotlib: pip install matplotlib  (or apt-get install python3-matplotlib)")

    runs = [(os.path.basename(p), load(p)) for p in args.runs]
    panels = [("loss", "loss"), ("grad_norm", "grad norm"), ("tokens_per_s", "tokens/s"), ("peak_mem_gib", "peak memory (GiB)")]
    panels = [p for p in panels if any(r.get(p[0]) is not None for _, rows in runs for r in rows)]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False)
    for ax, (key, title) in zip(axes[0], panels):
        for name, rows in runs:
            pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None and "step" in r]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name, linewidth=1.2)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
