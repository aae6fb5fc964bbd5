#!/usr/bin/env python3
"""Write a random qedcheck case with numpy and h5py, exactly as spec/CASE_FORMAT.md (version 1).

This is the template for handing any outside implementation (a Triton kernel, a JAX port) to
`qedcheck verify`: fill /inputs (and /cotangents) with the values your implementation consumed,
add its results under /outputs and /grads, and write the file as below.

    /usr/bin/python3 examples/python/write_case.py --variant qed --arm full --out case.h5
    /usr/bin/python3 examples/python/write_case.py --variant gdn --B 1 --T 9 --seqlens 4,0,5 \
        --h0 --cotangents --dht --results --out varlen.h5

Needs numpy and h5py (Debian: python3-numpy python3-h5py).
"""
import argparse
import os
import sys

import h5py
import numpy as np

VARIANTS = ("gdn2", "qed", "kda", "gdn", "deltanet")
ARMS = ("full", "nogate", "nogate_noproj", "rand")
DTYPES = ("float64", "float32", "float16", "bfloat16")


def input_names(variant, arm):
    """The /inputs datasets a variant has (CASE_FORMAT.md, /inputs table), without h0/cu_seqlens."""
    names = ["q", "k", "v"]
    if variant in ("gdn2", "qed", "kda", "gdn"):
        names.append("g")
    if variant in ("gdn2", "qed"):
        names += ["b", "w"]
    if variant in ("kda", "gdn", "deltanet"):
        names.append("beta")
    if variant == "qed":
        names.append("lambda")
        if arm == "rand":
            names.append("r")
    return names


def round_to(x, dtype):
    """The float64 values a kernel running in `dtype` would consume (round to nearest even)."""
    if dtype == "float64":
        return x
    if dtype in ("float32", "float16"):
        return x.astype(dtype).astype(np.float64)
    # bfloat16: keep the top 16 bits of the float32 pattern, rounding to nearest even.
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def unit_rows(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def build(args):
    """Returns (root attributes, {group: {name: array}}) for a random case."""
    rng = np.random.default_rng(args.seed)
    B, T, H, K, V = args.B, args.T, args.H, args.K, args.V
    seqlens = [int(s) for s in args.seqlens.split(",")] if args.seqlens else None
    if seqlens is not None and (B != 1 or sum(seqlens) != T):
        sys.exit("write_case.py: --seqlens needs --B 1 and lengths summing to --T")
    N = len(seqlens) if seqlens is not None else B

    def normal(*shape):
        return rng.standard_normal(shape)

    def sigmoid(x):
        return 1.0 / (1.0 + np.exp(-x))

    inputs = {
        "q": unit_rows(normal(B, T, H, K)),
        "k": unit_rows(normal(B, T, H, K)),
        "v": normal(B, T, H, V),
    }
    names = input_names(args.variant, args.arm)
    if "g" in names:  # log-decay g = log(sigmoid(x)) <= 0
        shape = (B, T, H) if args.variant == "gdn" else (B, T, H, K)
        inputs["g"] = -np.logaddexp(0.0, -normal(*shape))
    if "b" in names:
        inputs["b"] = sigmoid(normal(B, T, H, K))
        inputs["w"] = sigmoid(normal(B, T, H, V))
    if "beta" in names:
        inputs["beta"] = sigmoid(normal(B, T, H))
    if "lambda" in names:
        inputs["lambda"] = rng.uniform(0.5, 0.9, size=H)
    if "r" in names:
        inputs["r"] = unit_rows(normal(H, K))
    if args.h0:
        inputs["h0"] = 0.5 * normal(N, H, K, V)
    inputs = {n: round_to(x, args.dtype) for n, x in inputs.items()}
    if seqlens is not None:
        inputs["cu_seqlens"] = np.concatenate([[0], np.cumsum(seqlens)]).astype(np.int64)

    groups = {"inputs": inputs}
    if args.cotangents:
        groups["cotangents"] = {"do": normal(B, T, H, V)}
        if args.dht:
            groups["cotangents"]["dht"] = normal(N, H, K, V)
    if args.results:
        # Stand-ins for an implementation's results; a double-double producer adds X_lo.
        groups["outputs"] = {"o": normal(B, T, H, V), "ht": normal(N, H, K, V)}
        grads = {}
        for n in names + ["h0"]:
            shape = (N, H, K, V) if n == "h0" else inputs[n].shape
            grads["d" + n] = normal(*shape)
        groups["grads"] = grads
        for g in ("outputs", "grads"):
            for n in list(groups[g]):
                groups[g][n + "_lo"] = 1e-17 * normal(*groups[g][n].shape)

    attrs = {
        "format": "qedcheck.case",
        "version": np.int64(1),
        "variant": args.variant,
        "scale": np.float64(args.scale if args.scale is not None else K ** -0.5),
    }
    if args.variant == "qed":
        attrs["arm"] = args.arm
    if args.results:
        attrs["producer"] = "examples/python/write_case.py (random stand-ins)"
    return attrs, groups


def write(path, attrs, groups, dtype, fixed_strings, digits):
    def text(s):
        # h5py stores str as variable-length UTF-8 and numpy bytes as fixed-length ASCII;
        # qedcheck reads both.
        return np.bytes_(s) if fixed_strings else s

    with h5py.File(path, "w") as f:
        for name, value in attrs.items():
            f.attrs[name] = text(value) if isinstance(value, str) else value
        for group, datasets in groups.items():
            g = f.create_group(group)
            for name, x in datasets.items():
                # float64 for every floating-point array, int64 for cu_seqlens.
                g.create_dataset(name, data=x.astype("<i8" if name == "cu_seqlens" else "<f8"))
            if group in ("outputs", "grads"):
                for name in datasets:
                    if not name.endswith("_lo"):
                        g[name].attrs["digits"] = np.float64(digits)  # X@digits
        f["inputs"].attrs["dtype"] = text(dtype)


def dump_raw(folder, attrs, groups):
    """Each array as little-endian raw bytes (<group>_<name>.bin), for bit-exact comparisons."""
    os.makedirs(folder, exist_ok=True)
    np.array([attrs["scale"]], dtype="<f8").tofile(os.path.join(folder, "root_scale.bin"))
    for group, datasets in groups.items():
        for name, x in datasets.items():
            kind = "<i8" if name == "cu_seqlens" else "<f8"
            x.astype(kind).tofile(os.path.join(folder, f"{group}_{name}.bin"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--variant", choices=VARIANTS, default="gdn2")
    p.add_argument("--arm", choices=ARMS, default="full", help="qed only")
    p.add_argument("--out", required=True, help="the .h5 file to write (replaced if present)")
    for d, default in (("B", 1), ("T", 16), ("H", 2), ("K", 8), ("V", 8)):
        p.add_argument(f"--{d}", type=int, default=default)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=float, help="default K**-0.5")
    p.add_argument("--seqlens", help="comma-separated sequence lengths: packed varlen (B = 1)")
    p.add_argument("--h0", action="store_true", help="random initial state")
    p.add_argument("--cotangents", action="store_true", help="random /cotangents/do")
    p.add_argument("--dht", action="store_true", help="with --cotangents: also /cotangents/dht")
    p.add_argument("--results", action="store_true",
                   help="random /outputs and /grads with X_lo and X@digits (format demo)")
    p.add_argument("--digits", type=float, default=30.0, help="X@digits written with --results")
    p.add_argument("--dtype", choices=DTYPES, default="float64",
                   help="round inputs to this precision (stored as float64)")
    p.add_argument("--fixed-strings", action="store_true", help="fixed-length byte strings")
    p.add_argument("--dump-raw", metavar="DIR", help="also dump every array as raw bytes")
    args = p.parse_args()
    attrs, groups = build(args)
    write(args.out, attrs, groups, args.dtype, args.fixed_strings, args.digits)
    if args.dump_raw:
        dump_raw(args.dump_raw, attrs, groups)


if __name__ == "__main__":
    main()
