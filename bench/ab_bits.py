#!/usr/bin/env python3
"""Checks that two builds of the chunked kernels give the same bits, case by case.

A kernel change that only reorders work or trims instructions (no change to any product, sum or
rounding) should leave every output bit where it was. This runs the same inputs through two
builds of libchunked_capi.so, each in a process of its own, and compares SHA-256 digests of the
bytes each writes: the forward's o, ht and intermediate chunk states, and the backward's
gradients. It is the device check behind a "same bits" claim in reports/device/chunked.md; the
GPU tests and the re-certification still judge accuracy itself.

  python3 bench/ab_bits.py OLD_DIR NEW_DIR [--quick]

  OLD_DIR, NEW_DIR  folders holding libchunked_capi.so (e.g. the base's and the change's)
  --quick           a third of the cases (every variant and arm still appears)
  --dry-run         print the cases; needs no GPU and no torch
  --self-test       (alone) check the comparison on made-up digests; no GPU, no torch

Cases: every variant and QED arm, bf16 and fp32 inputs, K = V in {64, 128}, the regimes std and
hard, with and without h0, packed sequences (cu_seqlens), the overlapped forward at a long
sequence, and the four-warp prep pass (QEDCHECK_CHUNKED_PREP_WARPS=4). Outputs are filled with
NaN before each call, so an element one build leaves unwritten shows as a difference.
Prints one line per case ("same", or the tensors whose bits differ) and a summary line last;
exits 1 when any case differs, 2 on bad arguments, a missing library or a build that fails.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

VARIANTS = [("gdn2", "none"), ("qed", "full"), ("qed", "nogate"), ("qed", "nogate_noproj"),
            ("qed", "rand"), ("kda", "none"), ("gdn", "none"), ("deltanet", "none")]


def cases(quick):
    """(name, variant, arm, dtype, B, T, H, K, regime, h0, packed, knobs, backward)."""
    out = []
    i = 0
    for variant, arm in VARIANTS:
        for dt in ("bf16", "fp32"):
            for K in (128, 64):
                for regime in ("std", "hard"):
                    i += 1
                    if quick and i % 3:
                        continue
                    h0 = i % 2 == 0
                    packed = i % 4 == 1
                    out.append((f"{variant}/{arm} {dt} K={K} {regime}{' h0' if h0 else ''}{' packed' if packed else ''}",
                                variant, arm, dt, 2, 1000, 4, K, regime, h0, packed, {}, True))
    # the overlapped forward (a long single sequence) and the four-warp prep pass
    out.append(("gdn2 bf16 overlapped [1,16384,8,128]", "gdn2", "none", "bf16", 1, 16384, 8, 128, "std",
                False, False, {"QEDCHECK_CHUNKED_OVERLAP": "1"}, False))
    out.append(("qed/full bf16 overlapped [1,16384,8,128]", "qed", "full", "bf16", 1, 16384, 8, 128, "std",
                False, False, {"QEDCHECK_CHUNKED_OVERLAP": "1"}, False))
    out.append(("gdn2 bf16 prep 4 warps", "gdn2", "none", "bf16", 2, 1000, 4, 128, "std", True, False,
                {"QEDCHECK_CHUNKED_PREP_WARPS": "4"}, False))
    out.append(("qed/rand bf16 prep 4 warps", "qed", "rand", "bf16", 2, 1000, 4, 128, "hard", False, False,
                {"QEDCHECK_CHUNKED_PREP_WARPS": "4"}, False))
    return out


def digests(bc, lib, case):
    """{tensor name: sha256 of its bytes} of what the build writes for case, or {"error": text}
    when it refuses the case."""
    import hashlib
    import torch
    name, variant, arm, dt, B, T, H, K, regime, h0, packed, knobs, backward = case
    dtype = torch.bfloat16 if dt == "bf16" else torch.float32
    x = bc.make_inputs(B, T, H, K, K, variant, arm, regime, dtype, seed=7, h0=h0)
    cu = None
    if packed:  # the batch as one packed row of three sequences (1, 637 and the rest)
        for n in ("q", "k", "v", "g", "b", "w", "beta"):
            if n in x:
                x[n] = x[n].reshape(1, B * T, *x[n].shape[2:]).contiguous()
        cu = torch.tensor([0, 1, 638, B * T], dtype=torch.int64, device=bc.DEV)
        if "h0" in x:
            x["h0"] = x["h0"][:1].repeat(3, 1, 1, 1).contiguous()
    od = bc.FP32 if dt == "fp32" else bc.BF16
    try:
        with bc.knobs(knobs):
            o, ht, cs = lib.forward(x, od, want_cs=True, cu=cu)
            got = {"o": o, "ht": ht, "chunk_states": cs}
            if backward:
                gen = torch.Generator(device=bc.DEV).manual_seed(11)
                do = torch.randn(*o.shape, device=bc.DEV, generator=gen).to(o.dtype)
                got.update(lib.backward(x, do, cu=cu))
            torch.cuda.synchronize()
    except RuntimeError as e:
        return {"error": hashlib.sha256(str(e).encode()).hexdigest()[:16]}
    out = {}
    for key, t in got.items():
        if t is not None:
            raw = t.contiguous().view(torch.uint8).cpu().numpy().tobytes()
            out[key] = hashlib.sha256(raw).hexdigest()[:16]
    return out


def emit(lib_dir, quick):
    """Child process: one build's digests, a line per case and tensor."""
    import bench_chunked as bc
    lib = bc.Chunked(os.path.join(lib_dir, "libchunked_capi.so"))
    for i, c in enumerate(cases(quick)):
        for key, d in digests(bc, lib, c).items():
            print(f"{i}\t{key}\t{d}", flush=True)


def run_side(lib_dir, quick):
    import subprocess
    cmd = [sys.executable, os.path.abspath(__file__), "--emit", lib_dir] + (["--quick"] if quick else [])
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print(f"ab_bits.py: the run of {lib_dir} failed (status {p.returncode}):\n{p.stderr[-3000:]}",
              file=sys.stderr)
        sys.exit(2)
    return parse(p.stdout)


def parse(text):
    """{case index: {tensor: digest}} from emit()'s lines."""
    got = {}
    for line in text.splitlines():
        i, key, d = line.split("\t")
        got.setdefault(int(i), {})[key] = d
    return got


def verdict(a, b):
    """None when the two builds' digests of a case agree (both refusing it alike included), else
    why not."""
    if not a and not b:
        return "no output from either build"
    if a == b:
        return None
    keys = sorted(set(a) | set(b))
    return "differ: " + ", ".join(k for k in keys if a.get(k) != b.get(k))


def self_test():
    """The comparison on made-up digests (no GPU, no torch): a differing tensor, a one-sided
    refusal and a missing case must each be reported; equal digests and a shared refusal not."""
    old = parse("0\to\taa\n0\tht\tbb\n1\terror\tee\n2\to\tcc\n3\to\tdd\n")
    new = parse("0\to\taa\n0\tht\tbb\n1\terror\tee\n2\to\tcX\n3\terror\tee\n")
    got = [verdict(old.get(i, {}), new.get(i, {})) for i in range(5)]
    want = [None, None, "differ: o", "differ: error, o", "no output from either build"]
    if got != want:
        print(f"ab_bits self-test: FAILED: {got} != {want}")
        sys.exit(1)
    print("ab_bits self-test: ok")


def main():
    argv = sys.argv[1:]
    if argv == ["--self-test"]:
        self_test()
        return
    dry = "--dry-run" in argv
    quick = "--quick" in argv
    argv = [a for a in argv if a not in ("--dry-run", "--quick")]
    if len(argv) == 2 and argv[0] == "--emit":
        emit(argv[1], quick)
        return
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    todo = cases(quick)
    if dry:
        for c in todo:
            print("case", c[0], c[11] or "")
        return
    for d in argv:
        if not os.path.exists(os.path.join(d, "libchunked_capi.so")):
            print(f"ab_bits.py: {d}/libchunked_capi.so not found (build chunked_capi first)", file=sys.stderr)
            sys.exit(2)
    old, new = run_side(argv[0], quick), run_side(argv[1], quick)
    bad = 0
    for i, c in enumerate(todo):
        a, b = old.get(i, {}), new.get(i, {})
        why = verdict(a, b)
        bad += why is not None
        same = "same (both refuse it)" if "error" in a else "same"
        print(f"[bits] {c[0]:48s} {why or same}", flush=True)
    print(f"[bits] {len(todo) - bad} of {len(todo)} cases bitwise equal ({argv[0]} vs {argv[1]})")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
