#!/usr/bin/env python3
"""One decode step at B=512, H=16, K=V=128 (bf16 inputs, fp32 state pool, shuffled slots: the
step bench/bench_recurrent.py times), run once for a profiler, e.g.
  ncu --clock-control none -k regex:rec_decode --section SpeedOfLight \\
      --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \\
      python3 bench/profile_decode.py --lib-dir BUILD
(BUILD: a bench/device build holding librecurrent_capi.so). QED_REC_DECODE_KERNEL and the
shape variables (QED_REC_DECODE_GRID/WARPS, _ROWS, _STREAM) pick the kernel as in the benchmark. Not a benchmark itself."""
import argparse
import ctypes
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_recurrent as br  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib-dir", required=True)
    ap.add_argument("-B", type=int, default=512)
    ap.add_argument("--peer", action="store_true",
                    help="also run the peer's fused_recurrent_gdn2_fwd once on the same inputs (profile both with "
                         "-k regex:'rec_decode|fused_recurrent')")
    args = ap.parse_args()
    lib = br.load_lib(os.path.join(args.lib_dir, "librecurrent_capi.so"))
    err = ctypes.create_string_buffer(1024)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    B, H, K, V = args.B, 16, 128, 128
    q, k, v, g, b, w = br.gdn2_inputs(B, 1, H, K, V, torch.bfloat16, gen)
    pool = (0.1 * torch.randn(B, H, K, V, device="cuda", generator=gen)).float()
    idx = torch.randperm(B, device="cuda", generator=gen).to(torch.int32)
    o = torch.empty_like(v)
    br.check(lib.qed_rec_decode(br.GDN2, br.ARM_NONE, B, H, K, V, K ** -0.5, br.BF16, br.ptr(q), br.ptr(k),
                                br.ptr(v), br.ptr(g), br.ptr(b), br.ptr(w), None, None, None, br.ptr(pool),
                                br.ptr(idx), B, br.ptr(o), br.stream(), err, len(err)), err, "qed_rec_decode")
    torch.cuda.synchronize()
    print(f"ran one decode step, B={B}")
    if args.peer:
        from fla.ops.gdn2.fused_recurrent import fused_recurrent_gdn2_fwd
        pool_peer = pool.clone()
        o_peer = torch.empty_like(v)
        for _ in range(2):  # the first call compiles (and autotunes) the Triton kernel
            fused_recurrent_gdn2_fwd(q, k, v, g, b, w, initial_state=pool_peer, scale=K ** -0.5,
                                     inplace_final_state=True, ssm_state_indices=idx, out=o_peer)
        torch.cuda.synchronize()
        print(f"ran the peer's decode step twice, B={B}")

if __name__ == "__main__":
    main()
