#!/usr/bin/env python3
"""Recurrent kernels side by side with flash-linear-attention's fused_recurrent_gdn2, on the same
inputs, in one process: forward over whole sequences, the decode step under CUDA-graph replay,
and our backward (time and ratio to our forward). CUDA events, warm-up, median of many
repetitions (device/METHOD.md). Writes bench_recurrent.md and .json into --out and prints the
table last.

Run by ci/device.sh as: python3 bench/bench_recurrent.py --lib-dir BUILD --out $OUT/bench
(loads BUILD/librecurrent_capi.so, built from bench/recurrent_capi.cpp).
"""
import argparse
import ctypes
import json
import os
import statistics
import sys

import torch

FP32, BF16, FP16 = 0, 1, 2
GDN2, ARM_NONE = 0, 0
VP = ctypes.c_void_p
I64 = ctypes.c_int64


def load_lib(path):
    lib = ctypes.CDLL(path)
    lib.qed_rec_forward.argtypes = [ctypes.c_int, ctypes.c_int, I64, I64, I64, I64, I64,
                                    ctypes.c_float, ctypes.c_int] + [VP] * 12 + [VP, ctypes.c_char_p, ctypes.c_int]
    lib.qed_rec_decode.argtypes = [ctypes.c_int, ctypes.c_int, I64, I64, I64, I64,
                                   ctypes.c_float, ctypes.c_int] + [VP] * 11 + [I64, VP, VP,
                                                                                 ctypes.c_char_p, ctypes.c_int]
    lib.qed_rec_backward.argtypes = [ctypes.c_int, ctypes.c_int, I64, I64, I64, I64, I64,
                                     ctypes.c_float, ctypes.c_int] + [VP] * 23 + [ctypes.c_uint64, VP,
                                                                                  ctypes.c_char_p, ctypes.c_int]
    lib.qed_rec_backward_workspace.argtypes = [ctypes.c_int, ctypes.c_int, I64, I64, I64, I64, I64]
    lib.qed_rec_backward_workspace.restype = ctypes.c_uint64
    if hasattr(lib, "qed_floor_kernel"):  # bench/recurrent_capi_floor.cu
        lib.qed_floor_kernel.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint, VP]
    return lib


def ptr(t):
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def stream():
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def check(rc, err, what):
    if rc != 0:
        raise RuntimeError(f"{what}: status {rc}: {err.value.decode()}")


def time_ms(fn, warmup=3, reps=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times), min(times), max(times)


def graph_us(fn, replays=200, rounds=7):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(10):
        g.replay()
    torch.cuda.synchronize()
    per = []
    for _ in range(rounds):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(replays):
            g.replay()
        b.record()
        b.synchronize()
        per.append(a.elapsed_time(b) * 1000.0 / replays)
    return statistics.median(per), min(per), max(per)


def gdn2_inputs(B, T, H, K, V, dtype, gen):
    dev = "cuda"
    q = torch.nn.functional.normalize(torch.randn(B, T, H, K, device=dev, generator=gen), dim=-1).to(dtype)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, device=dev, generator=gen), dim=-1).to(dtype)
    v = torch.randn(B, T, H, V, device=dev, generator=gen).to(dtype)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, device=dev, generator=gen)).to(dtype)
    b = torch.sigmoid(torch.randn(B, T, H, K, device=dev, generator=gen)).to(dtype)
    w = torch.sigmoid(torch.randn(B, T, H, V, device=dev, generator=gen)).to(dtype)
    return q, k, v, g, b, w


def rel(a, b):
    a = a.float()
    b = b.float()
    return ((a - b).norm() / b.norm()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib-dir", required=True)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="forward,decode",
                    help="comma-separated parts: forward (forward and backward), decode (default both)")
    args = ap.parse_args()
    parts = set(args.only.split(","))
    lib = load_lib(os.path.join(args.lib_dir, "librecurrent_capi.so"))
    err = ctypes.create_string_buffer(1024)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    rows = []
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    try:
        from fla.ops.gdn2 import fused_recurrent_gdn2
        from fla.ops.gdn2.fused_recurrent import fused_recurrent_gdn2_fwd
        import fla
        res["fla"] = getattr(fla, "__version__", "?")
        have_peer = True
    except Exception as e:  # the table says so; our numbers still count
        print(f"peer unavailable: {e!r}", file=sys.stderr)
        have_peer = False

    tuning, floors = [], []
    if "forward" in parts:
        # ---- forward over whole sequences ----
        B, T, H, K, V = (8, 4096, 16, 128, 128) if not args.quick else (2, 512, 16, 128, 128)
        scale = K ** -0.5
        q, k, v, g, b, w = gdn2_inputs(B, T, H, K, V, torch.bfloat16, gen)
        o = torch.empty_like(v)
        ht = torch.empty(B, H, K, V, device="cuda", dtype=torch.float32)

        def ours_fwd(o=o, ht_=None):
            check(lib.qed_rec_forward(GDN2, ARM_NONE, B, T, H, K, V, scale, BF16, ptr(q), ptr(k), ptr(v),
                                      ptr(g), ptr(b), ptr(w), None, None, None, None, ptr(o), ptr(ht_),
                                      stream(), err, len(err)), err, "qed_rec_forward")

        ours_fwd(ht_=ht)
        torch.cuda.synchronize()
        f_ours = [time_ms(ours_fwd, reps=15) for _ in range(2)]
        res["forward"] = {"shape": [B, T, H, K, V], "dtype": "bf16", "ours_ms": [x[0] for x in f_ours]}
        line = {"what": f"forward [B,T,H,K]=[{B},{T},{H},{K}] V={V} bf16", "ours": f"{f_ours[0][0]:.3f} ms"}
        if have_peer:
            po, pht = fused_recurrent_gdn2(q, k, v, g, b, w, scale=scale, output_final_state=True)
            torch.cuda.synchronize()
            res["forward"]["rel_o_vs_peer"] = rel(o, po)
            res["forward"]["rel_ht_vs_peer"] = rel(ht, pht)
            peer_fwd = lambda: fused_recurrent_gdn2(q, k, v, g, b, w, scale=scale)
            f_peer = [time_ms(peer_fwd, reps=10) for _ in range(2)]
            res["forward"]["peer_ms"] = [x[0] for x in f_peer]
            line["peer"] = f"{f_peer[0][0]:.3f} ms"
            line["ratio"] = f"{f_peer[0][0] / f_ours[0][0]:.2f}x faster"
            line["note"] = f"rel(o) {res['forward']['rel_o_vs_peer']:.1e}, rel(ht) {res['forward']['rel_ht_vs_peer']:.1e}; repeat {f_ours[1][0]:.3f} / {f_peer[1][0]:.3f} ms"
        rows.append(line)

        # ---- backward (ours only: the peer's recurrent kernel has no backward) ----
        dout = torch.randn(B, T, H, V, device="cuda", generator=gen).to(torch.bfloat16)
        grads = [torch.empty_like(q) for _ in range(2)] + [torch.empty_like(v)] + [torch.empty_like(g), torch.empty_like(b), torch.empty_like(w)]
        dh0 = torch.empty(B, H, K, V, device="cuda", dtype=torch.float32)
        wsb = lib.qed_rec_backward_workspace(GDN2, ARM_NONE, B, T, H, K, V)
        ws = torch.empty(wsb, device="cuda", dtype=torch.uint8)

        def ours_bwd():
            dq, dk, dv, dg, db, dw = grads
            check(lib.qed_rec_backward(GDN2, ARM_NONE, B, T, H, K, V, scale, BF16, ptr(q), ptr(k), ptr(v),
                                       ptr(g), ptr(b), ptr(w), None, None, None, None, ptr(dout), None,
                                       ptr(dq), ptr(dk), ptr(dv), ptr(dg), ptr(db), ptr(dw), None, None,
                                       None, ptr(dh0), ptr(ws), wsb, stream(), err, len(err)), err,
                  "qed_rec_backward")

        bw = [time_ms(ours_bwd, warmup=2, reps=5) for _ in range(2)]
        res["backward"] = {"ours_ms": [x[0] for x in bw], "workspace_bytes": wsb,
                           "ratio_to_forward": bw[0][0] / f_ours[0][0]}
        rows.append({"what": "backward, same shape (dq dk dv dg db dw dh0)", "ours": f"{bw[0][0]:.3f} ms",
                     "peer": "-", "ratio": f"{bw[0][0] / f_ours[0][0]:.1f}x our forward",
                     "note": f"repeat {bw[1][0]:.3f} ms; workspace {wsb / 2**30:.2f} GiB"})
        del ws, grads, dout
        torch.cuda.empty_cache()

    if "decode" in parts:
        # ---- decode step, CUDA-graph replay ----
        H, K, V = 16, 128, 128
        scale = K ** -0.5
        # Side by side (tuning overrides of recurrent_decode): at B=512 the tile kernel (bitwise the
        # forward's step), the row kernels and the pipelined row kernels (cp.async and bulk tensor
        # copies) in their launch shapes; at B=1 the tile kernel, the small-batch kernel in its
        # shapes, and two empty kernels launched like a step (16- and 624-byte arguments): the floor.
        def cfg(kernel, knob=None, shape=None):
            env = {"QED_REC_DECODE_KERNEL": kernel}
            if knob:
                env[knob] = shape
            return (kernel + (" " + shape if shape else ""), env)
        big = [("tile flat 4w", {"QED_REC_DECODE_KERNEL": "tile", "QED_REC_DECODE_WARPS": "4"}),
               cfg("rows", "QED_REC_DECODE_ROWS", "8x4")] + \
              [cfg("stream", "QED_REC_DECODE_STREAM", x) for x in ("8x2x2", "8x2x3")] + \
              [cfg("tma", "QED_REC_DECODE_TMA", x) for x in ("8x2x2", "8x2x3")] + \
              [cfg("tmae", "QED_REC_DECODE_TMA", x) for x in ("8x2x2", "8x2x3")] + \
              [cfg("tmas", "QED_REC_DECODE_TMA", x) for x in ("8x2x2", "8x2x3", "16x4x2")] + \
              [("tmas 8x2x2 L2 hint", {"QED_REC_DECODE_KERNEL": "tmas", "QED_REC_DECODE_TMA": "8x2x2",
                                       "QED_REC_DECODE_L2HINT": "1"})] + \
              [cfg("lat", "QED_REC_DECODE_LAT", "4x16")]
        small = [("tile", {"QED_REC_DECODE_KERNEL": "tile"}), cfg("stream", "QED_REC_DECODE_STREAM", "8x2x2")] + \
                [cfg("lat", "QED_REC_DECODE_LAT", x) for x in ("4x16", "8x16", "4x8", "8x8", "16x16", "2x8")]
        configs = big + [c for c in small if c[0] not in {b[0] for b in big}]
        floors = ["| decode floor, graph replay | median |", "| --- | --- |"]
        tuning = ["| decode tuning | " + " | ".join(c[0] for c in configs) + " |", "| --- |" + " --- |" * len(configs)]
        for Bd in (1, 512):
            qd, kd, vd, gd, bd, wd = gdn2_inputs(Bd, 1, H, K, V, torch.bfloat16, gen)
            slots = Bd
            pool = (0.1 * torch.randn(slots, H, K, V, device="cuda", generator=gen)).float()
            pool_peer = pool.clone()
            idx = torch.randperm(slots, device="cuda", generator=gen).to(torch.int32)
            od = torch.empty_like(vd)
            od_peer = torch.empty_like(vd)

            def ours_dec():
                check(lib.qed_rec_decode(GDN2, ARM_NONE, Bd, H, K, V, scale, BF16, ptr(qd), ptr(kd), ptr(vd),
                                         ptr(gd), ptr(bd), ptr(wd), None, None, None, ptr(pool), ptr(idx),
                                         slots, ptr(od), stream(), err, len(err)), err, "qed_rec_decode")

            nbytes = 2 * Bd * H * K * V * 4 + Bd * H * (4 * K + 3 * V) * 2 + Bd * 4
            # At B=1 a one-node graph's replay costs about 4 us whatever its kernel does (an empty
            # kernel: 4.1-4.6 us; torch's own add_ on one element: 5.3 us; the peer's step moved
            # 3.8-5.4 us between runs), so the B=1 figure is the cost per step in a graph of S
            # steps (what a decode loop's graph pays per kernel); the one-node replay is reported
            # beside it.
            S = 16

            def per_step(fn, replays=200, rounds=7):
                if Bd != 1:
                    return graph_us(fn, replays, rounds)[0]
                return graph_us(lambda: [fn() for _ in range(S)], max(replays // 4, 25), rounds)[0] / S

            tune = {}
            for label, env in big if Bd >= 64 else small:
                os.environ.update(env)
                tune[label] = per_step(ours_dec, replays=100, rounds=3)
                for key in env:
                    del os.environ[key]
            if Bd == 1 and hasattr(lib, "qed_floor_kernel"):
                for which, label in ((0, "empty kernel, 16-byte argument"), (1, "empty kernel, 624-byte argument")):
                    def floor(which=which):
                        rc = lib.qed_floor_kernel(which, 128, 128, stream())
                        if rc != 0:
                            raise RuntimeError(f"qed_floor_kernel: CUDA error {rc}")
                    t1, tS = graph_us(floor)[0], per_step(floor)
                    res.setdefault("decode_floor_us", {})[label] = {"one_node": t1, "per_kernel_in_graph": tS}
                    floors.append(f"| {label}, 128 blocks x 128 threads | {t1:.2f} us one node, {tS:.2f} us per kernel "
                                  f"in a graph of {S} |")
                tiny = torch.zeros(1, device="cuda")
                t_add = graph_us(lambda: tiny.add_(1.0))[0]
                floors.append(f"| torch add_ on one element | {t_add:.2f} us one node |")
            tuning.append(f"| decode B={Bd}{f' (per step, {S} per graph)' if Bd == 1 else ''} | " + " | ".join(
                f"{tune[c[0]]:.2f} us ({nbytes / tune[c[0]] / 1e6:.2f} TB/s)" if c[0] in tune else "-"
                for c in configs) + " |")
            d_ours = per_step(ours_dec)
            what = f"decode B={Bd} H={H} K=V={K} fp32 state, graph replay" + (f", per step in a graph of {S} steps" if Bd == 1 else "")
            line = {"what": what, "ours": f"{d_ours:.2f} us ({nbytes / d_ours / 1e6:.2f} TB/s)"}
            res[f"decode_B{Bd}"] = {"ours_us": d_ours, "ours_TBps": nbytes / d_ours / 1e6, "bytes": nbytes,
                                    "tuning_us": tune}
            if Bd == 1:
                res["decode_B1"]["ours_one_node_us"] = graph_us(ours_dec)[0]
            if have_peer:
                def peer_dec():
                    fused_recurrent_gdn2_fwd(qd, kd, vd, gd, bd, wd, initial_state=pool_peer, scale=scale,
                                             inplace_final_state=True, ssm_state_indices=idx, out=od_peer)
                # same function: one step from identical states gives the same outputs and states
                p0 = pool.clone()
                pool_peer.copy_(p0)
                ours_dec()
                peer_dec()
                torch.cuda.synchronize()
                res[f"decode_B{Bd}"]["rel_o_vs_peer"] = rel(od, od_peer)
                res[f"decode_B{Bd}"]["rel_state_vs_peer"] = rel(pool, pool_peer)
                d_peer = per_step(peer_dec)
                res[f"decode_B{Bd}"].update({"peer_us": d_peer, "peer_TBps": nbytes / d_peer / 1e6})
                line["peer"] = f"{d_peer:.2f} us ({nbytes / d_peer / 1e6:.2f} TB/s)"
                line["ratio"] = f"{d_peer / d_ours:.2f}x faster"
                line["note"] = (f"rel(o) {res[f'decode_B{Bd}']['rel_o_vs_peer']:.1e}, "
                                f"rel(state) {res[f'decode_B{Bd}']['rel_state_vs_peer']:.1e}")
                if Bd == 1:
                    p1 = graph_us(peer_dec)[0]
                    res["decode_B1"]["peer_one_node_us"] = p1
                    line["note"] += (f"; one-node replay: ours {res['decode_B1']['ours_one_node_us']:.2f} us, "
                                     f"peer {p1:.2f} us")
            rows.append(line)
            del pool, pool_peer

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_recurrent.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = ["| benchmark | ours | peer (fla fused_recurrent_gdn2) | ratio | note |",
          "| --- | --- | --- | --- | --- |"]
    for r in rows:
        md.append(f"| {r['what']} | {r['ours']} | {r.get('peer', '-')} | {r.get('ratio', '-')} | {r.get('note', '')} |")
    text = "\n".join(md)
    with open(os.path.join(args.out, "bench_recurrent.md"), "w") as f:
        f.write(f"device: {res['device']}, torch {res['torch']}, fla {res.get('fla', 'n/a')}\n\n" + text + "\n")
    print(text)
    if len(tuning) > 2:  # stdout only (bench.log, the device summary): not part of the gated table
        print("\n" + "\n".join(tuning))
    if len(floors) > 2:
        print("\n" + "\n".join(floors))


if __name__ == "__main__":
    main()
