#!/usr/bin/python3
"""Turns certificates and benchmark tables into reports/index.md and a self-contained
reports/index.html (figures embedded as base64 PNG).

Input is the bundle that `qedcheck report` writes after validating every file:
  {"certificates": [<certificate JSON, schema qedcheck.certificate/1, plus "path">],
   "bench": [{"path", "machine", "git_commit", "created",
              "rows": [{"name", "ms", "peer", "peer_ms"}]}]}
Run it through the verb (`qedcheck report --out reports/`), or directly:
  /usr/bin/python3 reports/report/make_report.py --bundle B.json --out DIR
Uses Debian's python3-matplotlib (Agg backend); the output depends only on the inputs.
"""
import argparse
import base64
import html
import io
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

FIG_DIR = "report/figures"  # relative to --out, where index.md finds its images
UNIT_ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11, "float64": 2.0**-53}
DATASET_ORDER = ["o", "ht", "dq", "dk", "dv", "dg", "db", "dw", "dbeta", "dlambda", "dr", "dh0"]
REGIME_ORDER = ["std", "mixed", "hard", "a1b1", "hard_corr"]
REGIME_STYLE = {"std": "o-", "mixed": "s-", "hard": "^-", "a1b1": "v-", "hard_corr": "D-"}


def sci(x, digits=2):
    if x is None or (isinstance(x, str)):
        return str(x) if x is not None else "-"
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return str(x)
    return f"{x:.{digits}e}"


def num(x):
    if isinstance(x, str):
        return float(x)
    return float(x) if x is not None else float("nan")


def dataset_rank(name):
    return DATASET_ORDER.index(name) if name in DATASET_ORDER else len(DATASET_ORDER)


def family(cell):
    if cell["variant"] != "qed":
        return cell["variant"]
    return f"qed.{cell['arm']}(λ={cell['lambda']:g})"


class Doc:
    """Blocks rendered twice: Markdown with PNG files, HTML with embedded PNGs."""

    def __init__(self):
        self.blocks = []

    def h(self, level, text):
        self.blocks.append(("h", level, text))

    def p(self, text):
        self.blocks.append(("p", text))

    def table(self, header, rows):
        self.blocks.append(("table", header, rows))

    def figure(self, name, png, caption):
        self.blocks.append(("fig", name, png, caption))

    def markdown(self):
        out = []
        for b in self.blocks:
            if b[0] == "h":
                out.append("#" * b[1] + " " + b[2])
            elif b[0] == "p":
                out.append(b[1])
            elif b[0] == "table":
                out.append("| " + " | ".join(b[1]) + " |")
                out.append("|" + "|".join("---" for _ in b[1]) + "|")
                for r in b[2]:
                    out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |")
            elif b[0] == "fig":
                out.append(f"![{b[3]}]({FIG_DIR}/{b[1]})")
                out.append("")
                out.append(f"*{b[3]}*")
            out.append("")
        return "\n".join(out)

    def html(self, title):
        out = [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{html.escape(title)}</title>",
            "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
            "table{border-collapse:collapse;margin:1em 0;font-size:0.9em}"
            "td,th{border:1px solid #bbb;padding:3px 8px;text-align:right}"
            "th{background:#eee}td:first-child,th:first-child{text-align:left}"
            "figure{margin:1.5em 0}img{max-width:100%}figcaption{font-style:italic;color:#555}"
            "code{background:#f4f4f4;padding:0 3px}</style></head><body>",
        ]
        for b in self.blocks:
            if b[0] == "h":
                out.append(f"<h{b[1]}>{inline(b[2])}</h{b[1]}>")
            elif b[0] == "p":
                out.append(f"<p>{inline(b[1])}</p>")
            elif b[0] == "table":
                out.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in b[1]) + "</tr>")
                for r in b[2]:
                    out.append("<tr>" + "".join(f"<td>{inline(str(c))}</td>" for c in r) + "</tr>")
                out.append("</table>")
            elif b[0] == "fig":
                data = base64.b64encode(b[2]).decode("ascii")
                out.append(f'<figure><img alt="{html.escape(b[3])}" src="data:image/png;base64,{data}">'
                           f"<figcaption>{html.escape(b[3])}</figcaption></figure>")
        out.append("</body></html>")
        return "\n".join(out) + "\n"


def inline(text):
    """Markdown `code` and **bold** to HTML, everything else escaped."""
    parts = text.split("`")
    out = []
    for i, part in enumerate(parts):
        esc = html.escape(part)
        if i % 2 == 1:
            out.append(f"<code>{esc}</code>")
        else:
            bold = esc.split("**")
            out.append("".join(f"<b>{s}</b>" if j % 2 == 1 else s for j, s in enumerate(bold)))
    return "".join(out)


def png_of(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def error_vs_T(cert, dataset="o"):
    cells = [c for c in cert["cells"] if any(d["name"] == dataset for d in c["datasets"])]
    fams = []
    for c in cells:
        f = (family(c), c["unstable"])
        if f not in fams:
            fams.append(f)
    if not fams:
        return None
    cols = min(3, len(fams))
    rows = (len(fams) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False)
    for ax, (fam, unstable) in zip(axes.flat, fams):
        nonfinite = sorted({c["T"] for c in cells if family(c) == fam and c["unstable"] == unstable
                            for d in c["datasets"] if d["name"] == dataset
                            and not math.isfinite(num(d["max_rel_frobenius"]))})
        for regime in REGIME_ORDER:
            pts = sorted(
                (c["T"], num(d["max_rel_frobenius"]), num(d["bound_rel_frobenius"]))
                for c in cells
                if family(c) == fam and c["unstable"] == unstable and c["regime"] == regime
                for d in c["datasets"]
                if d["name"] == dataset
            )
            pts = [p for p in pts if p[1] > 0 and math.isfinite(p[1])]
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], REGIME_STYLE[regime], label=regime, ms=4)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        title = fam + (" — unstable, not certified" if unstable else "")
        if nonfinite:
            title += "\nnon-finite at T = " + ", ".join(str(t) for t in nonfinite)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("T")
        ax.set_ylabel(f"max rel_F({dataset}) over seeds")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(fams):]:
        ax.axis("off")
    fig.suptitle(f"{cert['subject']['name']}: error of {dataset} vs T against the oracle", fontsize=10)
    fig.tight_layout()
    return png_of(fig)


def distribution(cert):
    u = UNIT_ROUNDOFF[cert["subject"]["case_dtype"]]
    by_ds = {}
    for c in cert["cells"]:
        if c["status"] != "certified":
            continue
        for d in c["datasets"]:
            vals = [num(x) for x in d["rel_frobenius"]]
            by_ds.setdefault(d["name"], []).extend(v / u for v in vals if v > 0 and math.isfinite(v))
    if not by_ds:
        return None
    names = sorted(by_ds, key=dataset_rank)
    fig, ax = plt.subplots(figsize=(8, 3.4))
    ax.boxplot([by_ds[n] for n in names], labels=names, whis=(0, 100))
    ax.set_yscale("log")
    ax.set_ylabel("rel_F in units of the input dtype's u")
    ax.set_title(f"{cert['subject']['name']}: error distribution over every certified sample "
                 f"(whiskers: min and max)", fontsize=10)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    return png_of(fig)


def bench_bars(table):
    rows = table["rows"]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
    y = list(range(len(rows)))
    ax.barh([i + 0.2 for i in y], [r["ms"] for r in rows], height=0.4, label="qedcheck")
    peers = [(i, r["peer_ms"]) for i, r in zip(y, rows) if r.get("peer_ms") is not None]
    if peers:
        ax.barh([i - 0.2 for i, _ in peers], [p for _, p in peers], height=0.4,
                label=rows[0].get("peer") or "peer")
    ax.set_yticks(y)
    ax.set_yticklabels([r["name"] for r in rows], fontsize=7)
    ax.invert_yaxis()
    times = [r["ms"] for r in rows] + [p for _, p in peers]
    if max(times) > 50 * min(times):  # microsecond decode steps next to millisecond passes
        ax.set_xscale("log")
        ax.set_xlabel("ms, log scale (lower is better)")
    else:
        ax.set_xlabel("ms (lower is better)")
    ax.legend(fontsize=8)
    ax.set_title(os.path.basename(table["path"]), fontsize=10)
    fig.tight_layout()
    return png_of(fig)


def machine_text(m):
    """The CPU, and for a CUDA subject the GPU its kernels ran on."""
    text = f"{m['cpu']} ({m['cores']} cores)"
    return f"{m['gpu']}; {text}" if m.get("gpu") else text


def commit_text(c):
    """The commit the measuring binary was built from where the certificate records it (a device
    copy's git state may lag behind the binary it was handed), else the checkout's commit."""
    if c.get("build_commit"):
        return f"{c['build_commit'][:10]} (binary)"
    return c["git_commit"][:10]


def build(bundle):
    doc = Doc()
    certs = bundle.get("certificates", [])
    bench = bundle.get("bench", [])
    doc.h(1, "qedcheck: certified tolerances and benchmarks")
    doc.p("Generated by `qedcheck report` from the certificates in `reports/certificates/` "
          "(format and reasoning: `reports/certificates/README.md`) and the benchmark tables in "
          "`reports/bench/`. Errors are against the oracle (double recurrent reference on the same "
          "rounded inputs, its digits checked against float128). rel_F = ||x - x_ref||_F / "
          "||x_ref||_F; certified bound = observed max over seeds x the safety factor.")
    if not certs:
        doc.p("No certificates found.")
    else:
        doc.h(2, "Certificates")
        rows = []
        for c in certs:
            s = c["summary"]
            m = c["machine"]
            rows.append([f"`{c['subject']['name']}`", c["subject"]["case_dtype"], c["mode"], s["cells"],
                         s["certified"], s["unstable"], s["not_certified"], s["samples"],
                         f"{c['safety_factor']:g}", machine_text(m), commit_text(c), c["updated"]])
        doc.table(["subject", "inputs", "mode", "cells", "certified", "unstable", "not certified",
                   "samples", "factor", "machine", "commit", "updated"], rows)
    for c in certs:
        name = c["subject"]["name"]
        doc.h(2, f"{name}")
        doc.p(f"Implementation `{c['subject']['impl']}` (precision {c['subject']['precision']}, "
              f"operands {c['subject']['operands']}, chunk {c['subject']['chunk']}) on "
              f"{c['subject']['case_dtype']} inputs. Certificate: `{c.get('path', '')}`.")
        doc.h(3, "Certified tolerance (usable as `qedcheck verify --tolerance`)")
        tol = c["tolerance"]["datasets"]
        trows = [[f"`{k}`", sci(tol[k]["rtol_frobenius"]), sci(tol[k]["atol_max"])]
                 for k in sorted(tol, key=dataset_rank)]
        doc.table(["dataset", "rtol_frobenius", "atol_max"], trows)
        doc.p(c["tolerance"]["description"])
        doc.h(3, "Growth of rel_F(o) with T (err ≈ c·T^p, least squares on log-log)")
        frows = []
        for f in c["fits"]:
            if f["dataset"] != "o":
                continue
            fam = f["variant"] if f["variant"] != "qed" else f"qed.{f['arm']}(λ={f['lambda']:g})"
            frows.append([fam + (" (unstable)" if f["unstable"] else ""), f["regime"],
                          f"K=V={f['K']}", sci(num(f["c"])), f"{num(f['p']):+.3f}",
                          f"{num(f['residual_log10']):.3f}" if f["points"] > 2 else "- (2 points)",
                          f"{f['T_min']}..{f['T_max']} ({f['points']})"])
        if frows:
            doc.table(["family", "regime", "dims", "c", "p", "residual (decades)", "T (points)"], frows)
        png = error_vs_T(c)
        if png:
            fname = f"{name}_error_vs_T.png"
            doc.figure(fname, png, f"{name}: max rel_F(o) over seeds against T, per regime (log axes)")
        png = distribution(c)
        if png:
            fname = f"{name}_distribution.png"
            doc.figure(fname, png, f"{name}: distribution of rel_F per dataset in units of u")
        worst = []
        for cell in c["cells"]:
            if cell["status"] != "certified":
                continue
            for d in cell["datasets"]:
                worst.append((num(d["max_eps_units"]), cell, d))
        worst.sort(key=lambda w: -w[0] if math.isfinite(w[0]) else -1e300)
        doc.h(3, "Largest certified errors (in units of u of the inputs)")
        doc.table(["cell", "status", "dataset", "max rel_F", "rms rel_F", "max eps units",
                   "max abs err", "bound rel_F", "oracle digits"],
                  [[f"`{cell['key']}`", cell["status"], d["name"], sci(num(d["max_rel_frobenius"])),
                    sci(num(d["rms_rel_frobenius"])), f"{e:.2f}", sci(num(d["max_max_abs"])),
                    sci(num(d["bound_rel_frobenius"])), f"{num(cell['oracle']['min_digits']):.1f}"]
                   for e, cell, d in worst[:12]])
        unstable = [cell for cell in c["cells"] if cell["status"] != "certified"]
        if unstable:
            doc.h(3, "Reported, not certified")
            doc.table(["cell", "status", "rel_F(o) max", "‖h_T‖_F max", "note"],
                      [[f"`{cell['key']}`", cell["status"],
                        sci(max((num(d["max_rel_frobenius"]) for d in cell["datasets"] if d["name"] == "o"),
                                default=float("nan"))),
                        sci(max((num(x) for x in cell["state_norm"]), default=float("nan"))), cell["note"]]
                       for cell in unstable])
    doc.h(2, "Benchmarks")
    if not bench:
        doc.p("No benchmark tables in `reports/bench/` yet (the CUDA benchmarks write them on a "
              "device; format: `verify/certify_bench.hpp`).")
    for t in bench:
        doc.h(3, os.path.basename(t["path"]))
        doc.p(f"Machine: {t.get('machine') or 'not stated'}; commit {t.get('git_commit') or 'not stated'}.")
        doc.table(["benchmark", "ms", "peer", "peer ms", "peer / ours"],
                  [[r["name"], f"{r['ms']:.4g}", r.get("peer") or "-",
                    "-" if r.get("peer_ms") is None else f"{r['peer_ms']:.4g}",
                    "-" if r.get("peer_ms") is None else f"{r['peer_ms'] / r['ms']:.2f}"]
                   for r in t["rows"]])
        png = bench_bars(t)
        if png:
            base = os.path.splitext(os.path.basename(t["path"]))[0]
            doc.figure(f"bench_{base}.png", png, f"{base}: time per benchmark, ours against the peer")
    return doc


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    with open(a.bundle) as f:
        bundle = json.load(f)
    doc = build(bundle)
    os.makedirs(os.path.join(a.out, FIG_DIR), exist_ok=True)
    for b in doc.blocks:
        if b[0] == "fig":
            with open(os.path.join(a.out, FIG_DIR, b[1]), "wb") as f:
                f.write(b[2])
    for name, text in (("index.md", doc.markdown()), ("index.html", doc.html("qedcheck report"))):
        tmp = os.path.join(a.out, name + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, os.path.join(a.out, name))
    figs = sum(1 for b in doc.blocks if b[0] == "fig")
    print(f"wrote {os.path.join(a.out, 'index.md')}, {os.path.join(a.out, 'index.html')} and {figs} figure(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
