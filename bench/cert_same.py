#!/usr/bin/env python3
"""Compares two sets of certificates value for value (the check behind a "same bits" merge).

A kernel change that leaves every output bit where it was must re-measure to exactly the
committed errors: the same seeds, the same inputs, the same outputs. `qedcheck gate` only asks
that the new errors stay within the committed bounds (4x); this asks for equality, and names
every dataset where it fails.

  python3 bench/cert_same.py OLD NEW      (each a certificate file or a folder of *.json)
  python3 bench/cert_same.py --self-test  (no GPU: the committed certificates against themselves
                                           and against a copy with one value changed)

Per certificate present in both (by subject name; one in a single set is listed, not compared):
the cells matched by key, and in each dataset the per-seed relative Frobenius and max-abs errors
compared exactly. Prints one line per certificate and a verdict last; exits 0 when every value
is equal, 1 when any differs, a cell or dataset is missing on one side, or no certificate is in
both sets, 2 on bad arguments or unreadable files. The kernel fingerprint and dates
are expected to differ and are not compared.
"""
import copy
import glob
import json
import os
import sys

FIELDS = ("rel_frobenius", "max_abs")


def load(path):
    files = sorted(glob.glob(os.path.join(path, "*.json"))) if os.path.isdir(path) else [path]
    out = {}
    for f in files:
        try:
            with open(f) as fh:
                d = json.load(fh)
        except (OSError, ValueError) as e:
            print(f"cert_same.py: {f}: cannot read a certificate: {e}", file=sys.stderr)
            sys.exit(2)
        if not isinstance(d, dict) or "cells" not in d or "subject" not in d:
            continue  # not a certificate (e.g. a journal or an index)
        out[d["subject"].get("name", os.path.basename(f))] = d
    return out


def compare(a, b):
    """(datasets equal, datasets compared, [differences as text]) of two certificates."""
    ca = {c["key"]: c for c in a["cells"]}
    cb = {c["key"]: c for c in b["cells"]}
    same = total = 0
    diffs = []
    for key in sorted(set(ca) | set(cb)):
        if key not in ca or key not in cb:
            diffs.append(f"cell {key} only in the {'new' if key in cb else 'old'} set")
            continue
        da = {d["name"]: d for d in ca[key]["datasets"]}
        db = {d["name"]: d for d in cb[key]["datasets"]}
        for name in sorted(set(da) | set(db)):
            total += 1
            if name not in da or name not in db:
                diffs.append(f"{key} {name}: only in the {'new' if name in db else 'old'} set")
                continue
            bad = [f for f in FIELDS if da[name].get(f) != db[name].get(f)]
            if bad:
                f = bad[0]
                diffs.append(f"{key} {name}: {f} {da[name].get(f)} -> {db[name].get(f)}")
            else:
                same += 1
    return same, total, diffs


def run(old, new):
    a, b = load(old), load(new)
    if not a or not b:
        print(f"cert_same.py: no certificates in {old if not a else new}", file=sys.stderr)
        return 2
    ok, compared = True, 0
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            print(f"{name}: only in the {'new' if name in b else 'old'} set (not compared)")
            continue
        compared += 1
        same, total, diffs = compare(a[name], b[name])
        fp = f"{a[name].get('kernel_fingerprint', '-')} -> {b[name].get('kernel_fingerprint', '-')}"
        print(f"{name}: {same} of {total} datasets value for value equal ({fp})")
        for d in diffs[:10]:
            print(f"  {d}")
        if len(diffs) > 10:
            print(f"  ... and {len(diffs) - 10} more")
        ok = ok and not diffs
    if not compared:
        print("cert_same: no certificate in both sets")
        return 1
    print(f"cert_same: equal ({compared} certificates)" if ok else "cert_same: DIFFERENT")
    return 0 if ok else 1


def self_test():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reports", "certificates")
    certs = load(root)
    if not certs:
        print("cert_same self-test: FAILED: no committed certificates")
        return 1
    name, c = sorted(certs.items())[0]
    same, total, diffs = compare(c, c)
    if diffs or same != total or total == 0:
        print(f"cert_same self-test: FAILED: a certificate differs from itself ({diffs[:2]})")
        return 1
    m = copy.deepcopy(c)
    ds = m["cells"][-1]["datasets"][-1]
    ds["max_abs"] = list(ds["max_abs"])
    ds["max_abs"][-1] = ds["max_abs"][-1] * (1 + 2 ** -40)
    dropped = copy.deepcopy(c)
    dropped["cells"].pop(0)
    if not compare(c, m)[2] or not compare(c, dropped)[2]:
        print("cert_same self-test: FAILED: a changed value or a dropped cell went unnoticed")
        return 1
    print(f"cert_same self-test: ok ({name}: {total} datasets)")
    return 0


def main():
    argv = sys.argv[1:]
    if argv == ["--self-test"]:
        sys.exit(self_test())
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    for p in argv:
        if not os.path.exists(p):
            print(f"cert_same.py: {p}: no such file or folder", file=sys.stderr)
            sys.exit(2)
    sys.exit(run(*argv))


if __name__ == "__main__":
    main()
