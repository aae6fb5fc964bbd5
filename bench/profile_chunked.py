#!/usr/bin/env python3
"""One chunked forward at [B,T,H,K] = [8,4096,16,128], V = 128, bf16 GDN-2 (the shape
bench/bench_chunked.py times first), run once after one warm-up call, for a profiler, e.g.
  ncu --clock-control none -k regex:prep_kernel -s 1 -c 1 --section SpeedOfLight \\
      --section WarpStateStats --section Occupancy --section SourceCounters \\
      python3 bench/profile_chunked.py --lib-dir BUILD
(BUILD: a bench/device build holding libchunked_capi.so; configure it with CUDAFLAGS=-lineinfo
for source lines). QEDCHECK_CHUNKED_ONLY=prep|state runs one pass. --backward runs the chunked
backward instead (bf16 gradients; its kernels: regex:grads_kernel, regex:sweep). Not a benchmark
itself."""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_chunked as bc  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib-dir", required=True)
    ap.add_argument("--shape", default="8,4096,16,128", help="B,T,H,K (V = K)")
    ap.add_argument("--variant", default="gdn2", choices=["gdn2", "qed"])
    ap.add_argument("--backward", action="store_true", help="the backward instead of the forward")
    args = ap.parse_args()
    B, T, H, K = (int(s) for s in args.shape.split(","))
    lib = bc.Chunked(os.path.join(args.lib_dir, "libchunked_capi.so"))
    x = bc.make_inputs(B, T, H, K, K, args.variant, "full" if args.variant == "qed" else "none", "std",
                       torch.bfloat16, seed=1)
    o = torch.empty(B, T, H, K, dtype=torch.bfloat16, device=bc.DEV)
    ht = torch.empty(B, H, K, K, dtype=torch.float32, device=bc.DEV)
    if args.backward:
        do = torch.randn(B, T, H, K, device=bc.DEV).to(torch.bfloat16)
        gr = lib.grad_buffers(x, B, torch.bfloat16)
        run = lib.prepare_backward(x, do, gr, g_dtype=bc.BF16)
    else:
        run = lib.prepare(x, o, ht)
    run()
    run()
    torch.cuda.synchronize()
    what = "backward" if args.backward else "forward"
    print(f"ran the chunked {what} twice, shape {args.shape}, {args.variant}")


if __name__ == "__main__":
    main()
