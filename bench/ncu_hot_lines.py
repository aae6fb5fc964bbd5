#!/usr/bin/env python3
"""The hottest source lines of one profiled kernel, from the CSV that
  ncu --import REPORT.ncu-rep --page source --csv --print-source cuda,sass
prints (kernel built with -lineinfo). That CSV has one section per source file: a "File Path"
row, a "Function Name" row, a header row, then one row per CUDA line (its "Line No" set) and
one row per SASS instruction of it (Line No empty). Prints the CUDA lines sorted by their warp
stall samples, with their share, instructions executed and the largest stall reasons.
  ncu_hot_lines.py A.csv [--top 40]             the hottest lines of A
  ncu_hot_lines.py A.csv --base B.csv [--top 40] lines sorted by samples(A) - samples(B): where A
                                                 spends what B does not (same kernel binary)
  ncu_hot_lines.py A.csv [B.csv ...] --file chunked_bwd_grads.cu --regions "staging:300-490,3a:610-728"
      samples, instruction-fetch and long-scoreboard stalls and executed instructions per region of
      FILE's lines. Inlined helpers (other files, or FILE's lines outside every region) have no line
      of the kernel body, so each SASS instruction is charged to the region of the nearest
      instruction before it, in address order, that has one.
  ncu_hot_lines.py A.csv [B.csv ...] --regions-from kernels/chunked_bwd_grads.cu
      the same, the regions read from the source's own section comments ("// ---- staging",
      "// ---- 1.", "// 3a.", ...; each runs to the line before the next), so that they follow
      the code; --print-regions SOURCE prints them as a --regions string and exits.
Not a benchmark itself."""
import argparse
import csv
import gzip
import os
import re
import sys

# A section comment inside a kernel (indented): "// ---- staging: ...", "// ---- 1. ...",
# "// 3a. ...", "{  // 3f. ..." (numbered sections are named by their number), or
# "// ---- in-chunk cumulative decay, ..." (named by its words up to the first , : ( or ---).
SECTION = re.compile(r"^\s{2,}(?:\{\s*)?//\s*(?:(-{4})\s*)?(.*)$")
NUMBERED = re.compile(r"^(staging|\d+[a-z]?)[.:]\s")


def section_name(line):
    m = SECTION.match(line)
    if not m:
        return None
    rest = m.group(2)
    n = NUMBERED.match(rest)
    if n:
        return n.group(1)
    if not m.group(1):  # a plain comment, not a "----" heading
        return None
    name = re.split(r"[,:(]|---", rest, maxsplit=1)[0].strip()
    return name[:28] or None


def regions_of(source):
    """NAME:FIRST-LAST,... from the section comments of `source` (1-based lines)."""
    with open(source, encoding="utf-8") as f:
        lines = f.read().split("\n")
    marks = [(nm, i + 1) for i, ln in enumerate(lines) for nm in [section_name(ln)] if nm]
    if not marks:
        sys.exit(f"{source}: no section comments (// ---- staging, // ---- 1., // 3a., ...)")
    out = []
    for k, (name, first) in enumerate(marks):
        last = marks[k + 1][1] - 1 if k + 1 < len(marks) else len(lines)
        out.append(f"{name}:{first}-{last}")
    return ",".join(out)


def num(s):
    try:
        return float(s.replace(",", ""))
    except (AttributeError, ValueError):
        return 0.0


def load(path):
    """{(file, line): {"src", "samples", "inst", "stalls": {reason: samples}}} of the CUDA lines."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    out, cur, head = {}, "?", None
    for r in rows:
        if not r:
            continue
        if r[0] == "File Path":
            cur = os.path.basename(r[1]) if len(r) > 1 else "?"
            head = None
            continue
        if r[0] == "Function Name":
            continue
        if "Warp Stall Sampling (All Samples)" in r:
            head = {c: i for i, c in enumerate(r) if c not in head_skip(r)}
            head["__stall"] = r.index("Warp Stall Sampling (All Samples)")
            head["__inst"] = r.index("Instructions Executed") if "Instructions Executed" in r else None
            head["__reasons"] = [(i, c) for i, c in enumerate(r)
                                 if c.startswith("stall_") and "Not Issued" not in c]
            continue
        if head is None or not r[0].strip():
            continue  # SASS rows: their samples are in their CUDA line's row already
        key = (cur, int(num(r[0])))
        e = out.setdefault(key, {"src": r[1].strip(), "samples": 0.0, "inst": 0.0, "stalls": {}})
        e["samples"] += num(r[head["__stall"]])
        if head["__inst"] is not None:
            e["inst"] += num(r[head["__inst"]])
        for i, c in head["__reasons"]:
            e["stalls"][c[6:]] = e["stalls"].get(c[6:], 0.0) + num(r[i])
    if not out:
        sys.exit(f"{path}: no CUDA source rows with a 'Warp Stall Sampling (All Samples)' column")
    return out


def head_skip(r):
    return ()


def load_sass(path):
    """[(address, file, line, samples, no_inst, long_sb, executed)] of every SASS row, by address."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    cur, line, col, out = "?", None, None, []
    for r in rows:
        if not r or r[0] == "Function Name":
            continue
        if r[0] == "File Path":
            cur = os.path.basename(r[1]) if len(r) > 1 else "?"
            continue
        if "Warp Stall Sampling (All Samples)" in r:
            col = {k: r.index(k) for k in ("Warp Stall Sampling (All Samples)", "stall_no_inst",
                                           "stall_long_sb", "Instructions Executed") if k in r}
            continue
        if col is None:
            continue
        if r[0].strip():
            line = int(num(r[0]))
            continue
        try:
            addr = int(r[2], 16)
        except (IndexError, ValueError):
            continue
        g = lambda k: num(r[col[k]]) if k in col else 0.0
        out.append((addr, cur, line, g("Warp Stall Sampling (All Samples)"), g("stall_no_inst"),
                    g("stall_long_sb"), g("Instructions Executed")))
    if not out:
        sys.exit(f"{path}: no SASS rows (export with --print-source cuda,sass)")
    return sorted(out)


def regions_report(paths, fname, spec):
    try:
        regs = [(n, int(a), int(b)) for n, ab in (x.split(":") for x in spec.split(","))
                for a, b in [ab.split("-")]]
    except ValueError:
        sys.exit(f"--regions {spec!r}: want NAME:FIRST-LAST,... (line numbers of {fname})")
    for p in paths:
        sass = load_sass(p)
        tot = sum(x[3] for x in sass) or 1.0
        acc = {n: [0.0, 0.0, 0.0, 0.0, 0] for n, _, _ in regs}
        acc["(before any region)"] = [0.0, 0.0, 0.0, 0.0, 0]
        cur = "(before any region)"
        for _a, f, ln, smp, ni, lsb, ex in sass:
            if f == fname and ln is not None:
                cur = next((n for n, lo, hi in regs if lo <= ln <= hi), cur)
            v = acc[cur]
            v[0] += smp; v[1] += ni; v[2] += lsb; v[3] += ex; v[4] += 1
        print(f"{p}: {tot:.0f} stall samples, {len(sass)} SASS instructions "
              f"({len(sass) * 16 / 1024:.0f} KB), executed {sum(x[6] for x in sass):.3g}")
        print(f"{'region':22s} {'samples':>8s} {'no_inst':>8s} {'long_sb':>8s} {'executed':>10s} {'SASS':>6s}")
        for n, v in acc.items():
            if v[4]:
                print(f"{n:22s} {100 * v[0] / tot:7.1f}% {100 * v[1] / tot:7.1f}% {100 * v[2] / tot:7.1f}% "
                      f"{v[3]:10.3g} {v[4]:6d}")


def reasons(e, total):
    top = sorted(e["stalls"].items(), key=lambda kv: -kv[1])[:3]
    return " ".join(f"{k}:{100 * v / total:.1f}" for k, v in top if v > 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", nargs="*")
    ap.add_argument("--base", help="a second CSV of the same kernel: print the difference")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--file", help="with --regions: the kernel's source file (base name)")
    ap.add_argument("--regions", help="NAME:FIRST-LAST,... line ranges of --file")
    ap.add_argument("--regions-from", help="a kernel source: --file and --regions from its section comments")
    ap.add_argument("--print-regions", action="store_true",
                    help="with --regions-from: print the regions as a --regions string, read no CSV")
    args = ap.parse_args()
    if args.regions_from:
        args.regions = regions_of(args.regions_from)
        args.file = os.path.basename(args.regions_from)
        if args.print_regions:
            print(args.regions)
            return
    if args.regions:
        if not args.file:
            ap.error("--regions needs --file")
        regions_report(args.csv, args.file, args.regions)
        return
    if len(args.csv) != 1:
        ap.error("one CSV (several only with --regions)")
    args.csv = args.csv[0]
    a = load(args.csv)
    ta = sum(e["samples"] for e in a.values()) or 1.0
    if not args.base:
        print(f"{len(a)} CUDA lines, {ta:.0f} stall samples (share %, instructions executed, top stall "
              "reasons as % of all samples)")
        for (fn, ln), e in sorted(a.items(), key=lambda kv: -kv[1]["samples"])[:args.top]:
            print(f"{100 * e['samples'] / ta:5.1f}%  {fn}:{ln:<5} {e['inst']:9.3g}  {reasons(e, ta):40s}"
                  f"  {e['src'][:90]}")
        return
    b = load(args.base)
    tb = sum(e["samples"] for e in b.values()) or 1.0
    print(f"A {ta:.0f} samples, B {tb:.0f} samples (A - B = {ta - tb:.0f}); per line: A - B as % of B's "
          "total, A's and B's instructions executed")
    keys = set(a) | set(b)
    zero = {"samples": 0.0, "inst": 0.0, "stalls": {}, "src": ""}
    d = sorted(keys, key=lambda k: -(a.get(k, zero)["samples"] - b.get(k, zero)["samples"]))
    for k in d[:args.top]:
        ea, eb = a.get(k, zero), b.get(k, zero)
        src = ea["src"] or eb["src"]
        print(f"{100 * (ea['samples'] - eb['samples']) / tb:+6.1f}%  {k[0]}:{k[1]:<5} {ea['inst']:9.3g} "
              f"{eb['inst']:9.3g}  {reasons(ea, ta):40s}  {src[:80]}")


if __name__ == "__main__":
    main()
