#!/usr/bin/env python3
"""Dump a flash-linear-attention GDN-2 run as a qedcheck candidate case, for `qedcheck verify`.

Builds a random GDN-2 problem, rounds every input to bfloat16 (the case then holds exactly what
the kernel consumed), runs fla.ops.gdn2.chunk_gdn2 forward and backward (autograd with the
cotangents do and dht), and writes /inputs (float64 holding bf16 values, /inputs@dtype
"bfloat16"), /cotangents, and the kernel's /outputs and /grads converted to float64:

    python3 examples/python/dump_fla_gdn2.py --out fla_gdn2.h5            # CUDA + torch + fla
    qedcheck verify fla_gdn2.h5 --json verdict.json                       # 0 pass, 1 fail

`--impl naive` runs fla's pure-PyTorch naive_recurrent_gdn2 instead (works on CPU; fp32).
`--dry-run` needs neither torch nor fla: it writes the same case with the outputs of a float32
numpy recurrence standing in for the kernel (forward only), to test this script and the
verifier end to end. Needs numpy and h5py; the real run needs torch and flash-linear-attention.
Where h5py is missing (a bare GPU machine), write `--out X.npz` and convert it elsewhere with
`--from-npz X.npz --out X.h5`.
See examples/python/verify_example.md for the workflow.
"""
import argparse
import os
import sys

import json

import numpy as np

try:
    import h5py
except ImportError:  # a GPU machine without h5py: write .npz there, convert with --from-npz here
    h5py = None

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from write_case import round_to, unit_rows  # noqa: E402  (the format's reference writer)


def make_problem(args):
    """Inputs and cotangents as float64 arrays already rounded to args.dtype."""
    rng = np.random.default_rng(args.seed)
    B, T, H, K, V = args.B, args.T, args.H, args.K, args.V
    seqlens = [int(s) for s in args.seqlens.split(",")] if args.seqlens else None
    if seqlens is not None and (B != 1 or sum(seqlens) != T):
        sys.exit("dump_fla_gdn2.py: --seqlens needs --B 1 and lengths summing to --T")
    N = len(seqlens) if seqlens else B
    normal = rng.standard_normal
    sigmoid = lambda x: 1.0 / (1.0 + np.exp(-x))  # noqa: E731
    x = {
        "q": unit_rows(normal((B, T, H, K))),
        "k": unit_rows(normal((B, T, H, K))),
        "v": normal((B, T, H, V)),
        "g": -np.logaddexp(0.0, -(args.gate_mean + normal((B, T, H, K)))),  # log sigmoid <= 0
        "b": sigmoid(normal((B, T, H, K))),
        "w": sigmoid(normal((B, T, H, V))),
    }
    if args.h0:
        x["h0"] = 0.5 * normal((N, H, K, V))
    inputs = {n: round_to(a, args.dtype) for n, a in x.items()}
    if seqlens:
        inputs["cu_seqlens"] = np.concatenate([[0], np.cumsum(seqlens)]).astype(np.int64)
    # The kernel receives do in the dtype of o (bf16) and dht in that of ht (fp32): rounding both
    # to the input dtype keeps them exact in either.
    cot = {"do": round_to(normal((B, T, H, V)), args.dtype),
           "dht": round_to(normal((N, H, K, V)), args.dtype)}
    return inputs, cot


def run_fla(args, inputs, cot, scale):
    import torch
    from fla.ops.gdn2 import chunk_gdn2, naive_recurrent_gdn2

    dev = torch.device(args.device)
    low = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[args.dtype]
    if args.impl == "naive":
        low = torch.float32  # the naive reference computes in fp32 whatever it is given

    def leaf(name, dtype):
        t = torch.tensor(inputs[name], dtype=torch.float64, device=dev).to(dtype)
        # The case claims the kernel consumed exactly these values: check that nothing rounded.
        if not torch.equal(t.double(), torch.tensor(inputs[name], dtype=torch.float64, device=dev)):
            sys.exit(f"dump_fla_gdn2.py: /inputs/{name} is not exact in {dtype}")
        return t.requires_grad_()

    t = {n: leaf(n, low) for n in ("q", "k", "v", "g", "b", "w")}
    h0 = leaf("h0", torch.float32) if "h0" in inputs else None  # fla wants an fp32 state
    kw = dict(scale=scale, initial_state=h0, output_final_state=True)
    if args.impl == "chunk":
        if "cu_seqlens" in inputs:
            kw["cu_seqlens"] = torch.tensor(inputs["cu_seqlens"], dtype=torch.long, device=dev)
        o, ht = chunk_gdn2(t["q"], t["k"], t["v"], t["g"], t["b"], t["w"], **kw)
    else:
        if "cu_seqlens" in inputs:
            sys.exit("dump_fla_gdn2.py: --impl naive has no varlen support; drop --seqlens")
        o, ht = naive_recurrent_gdn2(t["q"], t["k"], t["v"], t["g"], t["b"], t["w"], **kw)
    do = torch.tensor(cot["do"], dtype=torch.float64, device=dev).to(o.dtype)
    dht = torch.tensor(cot["dht"], dtype=torch.float64, device=dev).to(ht.dtype)
    torch.autograd.backward([o, ht], [do, dht])
    as64 = lambda z: z.detach().to(torch.float64).cpu().numpy()  # noqa: E731
    outputs = {"o": as64(o), "ht": as64(ht)}
    grads = {"d" + n: as64(t[n].grad) for n in t}
    if h0 is not None:
        grads["dh0"] = as64(h0.grad)
    producer = f"fla.ops.gdn2.{'chunk_gdn2' if args.impl == 'chunk' else 'naive_recurrent_gdn2'} " \
               f"({args.dtype} inputs, torch {torch.__version__}, {torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'})"
    return outputs, grads, producer


def dry_run(inputs, scale):
    """A float32 numpy recurrence (forward only) standing in for the kernel."""
    f = {n: a.astype(np.float32) for n, a in inputs.items() if n != "cu_seqlens"}
    B, T, H, K = f["q"].shape
    V = f["v"].shape[-1]
    cu = inputs.get("cu_seqlens")
    spans = [(0, int(cu[n]), int(cu[n + 1])) for n in range(len(cu) - 1)] if cu is not None \
        else [(b, 0, T) for b in range(B)]
    o = np.zeros((B, T, H, V), np.float32)
    ht = np.zeros((len(spans), H, K, V), np.float32)
    for n, (b, t0, t1) in enumerate(spans):
        for h in range(H):
            S = f["h0"][n, h].copy() if "h0" in f else np.zeros((K, V), np.float32)
            for t in range(t0, t1):
                k, q = f["k"][b, t, h], f["q"][b, t, h]
                S = np.exp(f["g"][b, t, h])[:, None] * S
                u = f["w"][b, t, h] * f["v"][b, t, h] - (f["b"][b, t, h] * k) @ S
                S = S + np.outer(k, u)
                o[b, t, h] = np.float32(scale) * (q @ S)
            ht[n, h] = S
    return {"o": o.astype(np.float64), "ht": ht.astype(np.float64)}, {}, \
        "examples/python/dump_fla_gdn2.py --dry-run (float32 numpy recurrence, forward only)"


def write_candidate(path, dtype, groups, producer, scale):
    """CASE_FORMAT version 1, written to a temporary file and renamed into place. A path ending
    in .npz stores the same content as numpy arrays ("inputs/q", ...) plus a JSON "attrs"."""
    tmp = f"{path}.tmp-{os.getpid()}"
    attrs = {"format": "qedcheck.case", "version": 1, "variant": "gdn2", "scale": scale,
             "producer": producer, "dtype": dtype}
    try:
        if path.endswith(".npz"):
            arrays = {f"{g}/{n}": a for g, data in groups.items() for n, a in data.items()}
            with open(tmp, "wb") as f:
                np.savez(f, attrs=np.array(json.dumps(attrs)), **arrays)
        else:
            if h5py is None:
                sys.exit("dump_fla_gdn2.py: h5py is missing; write --out X.npz and convert it "
                         "with --from-npz X.npz --out X.h5 where h5py is installed")
            with h5py.File(tmp, "w") as f:
                f.attrs["format"] = "qedcheck.case"
                f.attrs["version"] = np.int64(1)
                f.attrs["variant"] = "gdn2"
                f.attrs["scale"] = np.float64(scale)
                f.attrs["producer"] = producer
                for group, data in groups.items():
                    if not data:
                        continue
                    g = f.create_group(group)
                    for name, a in data.items():
                        kind = "<i8" if name == "cu_seqlens" else "<f8"
                        g.create_dataset(name, data=np.asarray(a).astype(kind))
                f["inputs"].attrs["dtype"] = dtype
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def from_npz(src, out):
    with np.load(src) as z:
        attrs = json.loads(str(z["attrs"]))
        groups = {}
        for key in z.files:
            if key != "attrs":
                g, n = key.split("/")
                groups.setdefault(g, {})[n] = z[key]
    write_candidate(out, attrs["dtype"], groups, attrs["producer"], attrs["scale"])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="candidate case to write (replaced if present)")
    for d, default in (("B", 2), ("T", 256), ("H", 2), ("K", 64), ("V", 64)):
        p.add_argument(f"--{d}", type=int, default=default)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seqlens", help="comma-separated lengths: packed varlen (needs --B 1)")
    p.add_argument("--h0", action=argparse.BooleanOptionalAction, default=True,
                   help="random initial state (default on)")
    p.add_argument("--gate-mean", type=float, default=2.0,
                   help="g = logsigmoid(mean + N(0,1)); 2 gives alpha ~ 0.88")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    p.add_argument("--impl", choices=("chunk", "naive"), default="chunk")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dry-run", action="store_true", help="no torch/fla: numpy stand-in results")
    p.add_argument("--from-npz", metavar="NPZ", help="convert a .npz written by this script to --out")
    args = p.parse_args()
    if args.from_npz:
        from_npz(args.from_npz, args.out)
        print(f"wrote {args.out} from {args.from_npz}")
        return
    inputs, cot = make_problem(args)
    scale = args.K ** -0.5
    if args.dry_run:
        outputs, grads, producer = dry_run(inputs, scale)
    else:
        outputs, grads, producer = run_fla(args, inputs, cot, scale)
    groups = {"inputs": inputs, "cotangents": cot, "outputs": outputs, "grads": grads}
    write_candidate(args.out, args.dtype, groups, producer, scale)
    print(f"wrote {args.out}: {producer}; judge it with `qedcheck verify {args.out}`")


if __name__ == "__main__":
    main()
