#!/usr/bin/env python3
"""The hottest source lines of one profiled kernel, from a CSV that
  ncu --import REPORT.ncu-rep --page source --csv --print-source cuda
prints (a kernel built with -lineinfo): the rows sorted by the warp-stall sample column, with
their share of all samples, and every other stall-reason column that is large on that row.
Usage: ncu_hot_lines.py SOURCE.csv [--top 40]. Not a benchmark itself."""
import argparse
import csv
import sys


def num(s):
    try:
        return float(s.replace(",", ""))
    except (AttributeError, ValueError):
        return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    with open(args.csv, newline="") as f:
        lines = [l for l in f if l.startswith('"') or "," in l]
    rows = list(csv.reader(lines))
    head_i = next((i for i, r in enumerate(rows) if any("Source" in c for c in r)), None)
    if head_i is None:
        sys.exit(f"{args.csv}: no header row with a Source column")
    head = rows[head_i]
    body = [r for r in rows[head_i + 1:] if len(r) == len(head)]
    src = next(i for i, c in enumerate(head) if "Source" in c)
    line_col = next((i for i, c in enumerate(head) if c.strip() in ("#", "Line", "# Line")), None)
    stall = [i for i, c in enumerate(head) if "Warp Stall Sampling (All" in c]
    if not stall:
        sys.exit(f"{args.csv}: no 'Warp Stall Sampling (All Samples)' column; columns: {head}")
    s = stall[0]
    total = sum(num(r[s]) for r in body) or 1.0
    extra = [i for i, c in enumerate(head) if i not in (src, s, line_col) and
             any(k in c for k in ("Instructions Executed", "L2 Theoretical Sectors Global Excessive",
                                  "L1 Wavefronts Shared Excessive"))]
    print(f"{len(body)} source rows, {total:.0f} stall samples; columns: {[head[i] for i in extra]}")
    for r in sorted(body, key=lambda r: -num(r[s]))[:args.top]:
        ln = r[line_col] if line_col is not None else "?"
        print(f"{100 * num(r[s]) / total:5.1f}%  L{ln:>5}  " + " ".join(f"{num(r[i]):.3g}" for i in extra)
              + "  " + r[src].strip()[:110])


if __name__ == "__main__":
    main()
