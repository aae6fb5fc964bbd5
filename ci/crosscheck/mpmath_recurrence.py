#!/usr/bin/env python3
"""Independent cross-check of `qedcheck reference`: recomputes a case in mpmath.

Reads a case file written by `qedcheck reference` (outputs and, if present, gradients with
their double-double low parts), recomputes the recurrence of CASE_FORMAT.md directly from its
matrix form, S_t = (I - k e^T) D S_{t-1} + k (w*v)^T, and obtains every gradient by central
finite differences in mpmath (60 digits, h = 1e-25). Exits 1 if any dataset agrees with the
file's X + X_lo to fewer than --digits significant digits (element-wise, relative to the
dataset's largest element below 1e-40 of it).

Written separately from the C++ reference on purpose: no shared code, another language, the
matrix form instead of the step form, finite differences instead of the adjoint.
"""
import argparse
import sys

import h5py
import mpmath as mp
import numpy as np

mp.mp.dps = 60


def read(path):
    f = h5py.File(path, "r")
    attr = lambda k: f.attrs[k].decode() if isinstance(f.attrs[k], bytes) else f.attrs[k]
    case = {
        "variant": str(attr("variant")),
        "arm": str(attr("arm")) if "arm" in f.attrs else None,
        "scale": float(f.attrs["scale"]),
        "inputs": {k: np.array(f["inputs"][k]) for k in f["inputs"]},
        "cot": {k: np.array(f["cotangents"][k]) for k in f["cotangents"]} if "cotangents" in f else {},
        "results": {},
    }
    for grp in ("outputs", "grads"):
        if grp not in f:
            continue
        for k in f[grp]:
            if k.endswith("_lo"):
                continue
            hi = np.array(f[grp][k])
            lo = np.array(f[grp][k + "_lo"]) if (k + "_lo") in f[grp] else np.zeros_like(hi)
            case["results"][grp + "/" + k] = (hi, lo)
    return case


def to_mp(x):
    return np.vectorize(lambda e: mp.mpf(float(e)), otypes=[object])(x) if x.size else x.astype(object)


def forward(case, inp):
    """Returns (o [B,T,H,V], ht [N,H,K,V]) as object arrays of mpf."""
    var, arm, scale = case["variant"], case["arm"], mp.mpf(case["scale"])
    q, k, v = inp["q"], inp["k"], inp["v"]
    B, T, H, K = q.shape
    V = v.shape[3]
    cu = inp.get("cu_seqlens")
    spans = [(b, 0, T) for b in range(B)] if cu is None else [(0, int(cu[n]), int(cu[n + 1])) for n in range(len(cu) - 1)]
    o = np.empty((B, T, H, V), dtype=object)
    o[...] = mp.mpf(0)
    ht = np.empty((len(spans), H, K, V), dtype=object)
    for n, (b, t0, t1) in enumerate(spans):
        for h in range(H):
            S = mp.matrix(K, V)
            if "h0" in inp:
                for i in range(K):
                    for j in range(V):
                        S[i, j] = inp["h0"][n, h, i, j]
            for t in range(t0, t1):
                kt = mp.matrix([k[b, t, h, c] for c in range(K)])
                qt = mp.matrix([q[b, t, h, c] for c in range(K)])
                vt = [v[b, t, h, j] for j in range(V)]
                if var in ("gdn2", "qed", "kda"):
                    alpha = [mp.exp(inp["g"][b, t, h, c]) for c in range(K)]
                elif var == "gdn":
                    alpha = [mp.exp(inp["g"][b, t, h])] * K
                else:
                    alpha = [mp.mpf(1)] * K
                if var in ("gdn2", "qed"):
                    bt = [inp["b"][b, t, h, c] for c in range(K)]
                    wt = [inp["w"][b, t, h, j] for j in range(V)]
                else:
                    bt = [inp["beta"][b, t, h]] * K
                    wt = [inp["beta"][b, t, h]] * V
                e = mp.matrix([bt[c] * kt[c] for c in range(K)])
                if var == "qed":
                    lam = inp["lambda"][h]
                    if arm == "full":
                        x = mp.matrix([bt[c] * qt[c] for c in range(K)])
                    elif arm in ("nogate", "nogate_noproj"):
                        x = qt.copy()
                    else:
                        x = mp.matrix([bt[c] * inp["r"][h, c] for c in range(K)])
                    if arm != "nogate_noproj":
                        nn = sum(kt[c] ** 2 for c in range(K))
                        if nn != 0:
                            P = mp.eye(K) - (kt * kt.T) / nn
                            x = P * x
                    e = e + lam * x
                D = mp.diag(alpha)
                z = mp.matrix([[wt[j] * vt[j] for j in range(V)]])
                S = (mp.eye(K) - kt * e.T) * D * S + kt * z
                out = (S.T * qt) * scale
                for j in range(V):
                    o[b, t, h, j] = out[j]
            for i in range(K):
                for j in range(V):
                    ht[n, h, i, j] = S[i, j]
    return o, ht


def loss(case, inp):
    o, ht = forward(case, inp)
    L = mp.mpf(0)
    do = case["cot"]["do"]
    for idx in np.ndindex(o.shape):
        L += o[idx] * do[idx]
    if "dht" in case["cot"]:
        for idx in np.ndindex(ht.shape):
            L += ht[idx] * case["cot"]["dht"][idx]
    return L


def digits(hi, lo, ref):
    """Fewest agreeing significant digits of hi+lo against ref (object array of mpf)."""
    flat_ref = list(ref.reshape(-1))
    scale = max((abs(e) for e in flat_ref), default=mp.mpf(0))
    if scale == 0:
        return 99.0
    floor = scale * mp.mpf(10) ** -40
    worst = mp.mpf(99)
    for x_hi, x_lo, r in zip(hi.reshape(-1), lo.reshape(-1), flat_ref):
        diff = abs(mp.mpf(float(x_hi)) + mp.mpf(float(x_lo)) - r)
        if diff == 0:
            continue
        worst = min(worst, -mp.log10(diff / max(abs(r), floor)))
    return float(worst)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", help="case file written by `qedcheck reference`")
    ap.add_argument("--digits", type=float, default=25.0, help="required agreeing digits")
    args = ap.parse_args()
    case = read(args.case)
    inp = {name: to_mp(x) if x.dtype.kind == "f" else x for name, x in case["inputs"].items()}
    o, ht = forward(case, inp)
    refs = {"outputs/o": o, "outputs/ht": ht}
    if "do" in case["cot"]:
        h = mp.mpf("1e-25")
        for name, x in inp.items():
            if name == "cu_seqlens":
                continue
            g = np.empty(x.shape, dtype=object)
            for idx in np.ndindex(x.shape):
                keep = x[idx]
                x[idx] = keep + h
                lp = loss(case, inp)
                x[idx] = keep - h
                lm = loss(case, inp)
                x[idx] = keep
                g[idx] = (lp - lm) / (2 * h)
            refs["grads/d" + name] = g
        if "h0" not in inp:  # dh0 exists even without h0: the gradient at h0 = 0
            pass
    worst = 99.0
    bad = False
    for name, (hi, lo) in sorted(case["results"].items()):
        if name not in refs:
            continue
        d = digits(hi, lo, refs[name])
        worst = min(worst, d)
        ok = d >= args.digits
        bad |= not ok
        print(f"{name:<16} {d:6.1f} digits {'ok' if ok else 'TOO FEW'}")
    missing = [n for n in refs if n not in case["results"]]
    if missing:
        print("missing from the file:", ", ".join(missing))
        bad = True
    print(f"worst {worst:.1f} digits (required {args.digits})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
