#!/usr/bin/env python3
"""Times named cases of the chunked kernels, and of the peer, side by side in one process.

The A/B tool of the device reports (reports/device/chunked.md, runs 21-23): each case is one
callable (our forward, QED's forward, a training pair, the peer's forward or training pair) run
under a set of environment knobs, timed by bench_chunked.time_ms (CUDA events, median of
repetitions after warm-up), each case list repeated so that drift between repetitions shows.

  python3 bench/time_cases.py LIB_DIR SHAPES CASE [CASE ...]

  LIB_DIR  the folder holding libchunked_capi.so (the device build, e.g. /tmp/qed-device-build)
  SHAPES   B,T,H,K[;B,T,H,K...]  (V = K, bf16 inputs)
  CASE     name|KNOB=V[,KNOB=V...]|what, what one of:
             gdn2, qed        our forward (QED: full arm, lambda = 1)
             train, trainq    our training pair: the forward saving its chunk states, then the
                              backward with bf16 gradients (GDN-2, QED)
             peer             flash-linear-attention's chunk_gdn2 forward
             peertrain        its forward + backward
  TIME_CASES_REPS            how many times the case list runs (default 2)
  --dry-run (first argument)  check the arguments and print the plan; needs no GPU and no torch

Example: python3 bench/time_cases.py /tmp/qed-device-build "2,16384,16,128" \
           "fwd||gdn2" "fwd serial|QEDCHECK_CHUNKED_OVERLAP=0|gdn2" "peer||peer"
Prints one line per case and repetition: "[x] B,T,H,K name median ms (min ms)", and before
the first repetition, for each case of our forward or training pair, the state pass's plan under
its knobs: "[plan] B,T,H,K name: C columns, W walking warps (+R read-out), N blocks, serial|overlapped".
The knobs are read by the library at every call, so one prepared callable serves every setting.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

WHAT = ("gdn2", "qed", "train", "trainq", "peer", "peertrain")


def parse_cases(args):
    cases = []
    for c in args:
        parts = c.split("|")
        if len(parts) != 3 or parts[2] not in WHAT:
            sys.exit(f"time_cases.py: case '{c}': expected name|KNOB=V,...|what with what one of {', '.join(WHAT)}")
        knobs = []
        for kv in filter(None, parts[1].split(",")):
            k, sep, v = kv.partition("=")
            if not sep or not k:
                sys.exit(f"time_cases.py: case '{c}': knob '{kv}' is not KNOB=VALUE")
            knobs.append((k, v))
        cases.append((parts[0], knobs, parts[2]))
    return cases


def parse_shapes(text):
    shapes = []
    for s in text.split(";"):
        try:
            dims = tuple(int(v) for v in s.split(","))
        except ValueError:
            dims = ()
        if len(dims) != 4 or min(dims) <= 0:
            sys.exit(f"time_cases.py: shape '{s}': expected four positive integers B,T,H,K")
        shapes.append(dims)
    return shapes


def runners(bc, lib, B, T, H, D, train):
    import torch
    x = bc.make_inputs(B, T, H, D, D, "gdn2", "none", "std", torch.bfloat16, seed=1)
    xq = dict(x)
    xq.update(variant="qed", arm="full", lam=torch.ones(H, device=bc.DEV))
    o = torch.empty(B, T, H, D, dtype=torch.bfloat16, device=bc.DEV)
    ht = torch.empty(B, H, D, D, dtype=torch.float32, device=bc.DEV)
    runs = {"gdn2": lib.prepare(x, o, ht), "qed": lib.prepare(xq, o, ht), "peer": lambda: bc.peer_call(x)}
    runs["plan"] = {"gdn2": lambda: lib.plan(x, o), "qed": lambda: lib.plan(xq, o)}
    if train:
        do = torch.randn(B, T, H, D, device=bc.DEV).to(torch.bfloat16)
        for tag, xx in (("train", x), ("trainq", xq)):
            grads = lib.grad_buffers(xx, B, torch.bfloat16)
            fwd = lib.prepare_forward_saving(xx, o, ht)
            bwd = lib.prepare_backward(xx, do, grads, g_dtype=bc.BF16, saved=True)
            runs[tag] = lambda fwd=fwd, bwd=bwd: (fwd(), bwd())
        runs["peertrain"] = lambda: bc.peer_fwd_bwd(x, do)
    return runs


def main():
    argv = sys.argv[1:]
    dry = bool(argv) and argv[0] == "--dry-run"
    if dry:
        argv = argv[1:]
    if len(argv) < 3:
        sys.exit(__doc__)
    shapes = parse_shapes(argv[1])
    cases = parse_cases(argv[2:])
    reps_text = os.environ.get("TIME_CASES_REPS", "2")
    if not reps_text.isdigit() or int(reps_text) < 1:
        sys.exit(f"time_cases.py: TIME_CASES_REPS='{reps_text}': expected a positive integer")
    reps = int(reps_text)
    if dry:
        for (B, T, H, D) in shapes:
            for name, knobs, what in cases:
                knob_text = ",".join(f"{k}={v}" for k, v in knobs) or "-"
                print(f"plan {B},{T},{H},{D} {name} {what} {knob_text} x{reps}")
        return
    lib_path = os.path.join(argv[0], "libchunked_capi.so")
    if not os.path.exists(lib_path):
        sys.exit(f"time_cases.py: {lib_path} not found (build chunked_capi first)")
    import torch
    import bench_chunked as bc
    lib = bc.Chunked(lib_path)
    train = any(w in ("train", "trainq", "peertrain") for _, _, w in cases)
    for (B, T, H, D) in shapes:
        runs = runners(bc, lib, B, T, H, D, train)
        for rep in range(reps):
            for name, knobs, what in cases:
                with bc.knobs(dict(knobs)):
                    pl = runs["plan"]["qed" if what in ("qed", "trainq") else "gdn2"]() \
                        if rep == 0 and what not in ("peer", "peertrain") else None
                    if pl:
                        extra = f" (+{pl['read_out_warps']} read-out)" if pl["read_out_warps"] else ""
                        mode = "overlapped" if pl["overlapped"] else "serial"
                        print(f"[plan] {B},{T},{H},{D} {name}: {pl['tile_columns']} columns, "
                              f"{pl['walking_warps']} walking warps{extra}, {pl['state_blocks']} blocks, {mode}",
                              flush=True)
                    med, lo = bc.time_ms(runs[what])[:2]
                print(f"[x] {B},{T},{H},{D} {name:28s} {med:.3f} ms (min {lo:.3f})", flush=True)
        del runs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
