#!/usr/bin/env python3
"""The CUDA chunked forward side by side with flash-linear-attention's chunk_gdn2 on the same
bf16 inputs, in one process:
  1. diagnostics: the workspace fragments of one chunk decoded and compared with float64
     matrices (W_a, Q~, K^, M, W_z, gamma), and every variant/arm end to end against a float64
     recurrence (fp32 and bf16 inputs);
  2. accuracy at K = V = 128, T = 4096 (regimes std, mixed, hard): relF of o and ht against
     float64 on the same bf16 inputs, ours vs peer;
  3. timings (CUDA events, warm-up, median): ours GDN-2 and QED (full, lambda = 1), each pass
     alone, value-tile widths, the peer, and the memory floor from a measured copy bandwidth;
  4. backward (chunked_backward; tensor-core products since run 6): gradients of every variant
     against float64 autograd through the recurrence, and forward+backward timings side by side
     with the peer's chunk_gdn2 forward+backward (autograd);
  5. (only when asked: --only phases) the prep pass cut after each of its phases, each phase
     timed by difference; (--only bwdphases) the backward cut after each of its passes;
     (--only bwdpeer) our gradients and the peer's side by side against float64 autograd.
Writes chunked_forward.md and .json into --out; prints the tables last.

python3 bench/bench_chunked.py --lib-dir BUILD (or --lib BUILD/libchunked_capi.so) --out $OUT [--quick] [--skip-peer]
"""
import argparse
import contextlib
import ctypes
import json
import math
import os
import statistics
import sys

import torch
import torch.nn.functional as F

import roofline  # bench/roofline.py: model FLOPs and byte floor of the chunked forward

FP32, BF16 = 0, 1
VARIANT = {"gdn2": 0, "qed": 1, "kda": 2, "gdn": 3, "deltanet": 4}
ARM = {"none": 0, "full": 1, "nogate": 2, "nogate_noproj": 3, "rand": 4}
DEV = "cuda"
# The backward pipeline these benchmarks call "ours" (bf16 inputs; kernels/chunked_api.hpp): v2,
# with the former pipeline v1 beside it where a table says so.
OURS_BWD = "v2"
os.environ["QEDCHECK_CHUNKED_BWD_IMPL"] = OURS_BWD


class Chunked:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        f = self.lib.qed_chunked_forward
        f.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_float, ctypes.POINTER(ctypes.c_void_p),
                      ctypes.POINTER(ctypes.c_uint64), ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p,
                      ctypes.c_int]
        f.restype = ctypes.c_int
        self.f = f
        fb = self.lib.qed_chunked_backward
        fb.argtypes = f.argtypes
        fb.restype = ctypes.c_int
        self.fb = fb
        # the training pair: a forward that keeps the backward's recompute in the backward's
        # workspace, and the backward that then skips it (kernels/chunked_api.hpp)
        self.fs = self.lib.qed_chunked_forward_saving
        self.fs.argtypes, self.fs.restype = f.argtypes, ctypes.c_int
        self.fbs = self.lib.qed_chunked_backward_saved
        self.fbs.argtypes, self.fbs.restype = f.argtypes, ctypes.c_int
        self.err = ctypes.create_string_buffer(2048)
        self.ws = torch.empty(0, dtype=torch.uint8, device=DEV)
        self.wsb = torch.empty(0, dtype=torch.uint8, device=DEV)

    def prepare(self, x, o, ht=None, cs=None, cu=None, o_dtype=BF16):
        """Returns a zero-argument launcher for inputs dict x (q k v g b w beta lam r h0)."""
        shape, ts = self._problem(x, o_dtype, cu)
        ts += [o, ht, cs, cu, None]
        return self._launcher(self.f, "chunked_forward", "ws", shape, x["scale"], ts, 14)

    def plan(self, x, o, cu=None, o_dtype=BF16):
        """The state pass's plan of the forward prepare() would launch (under the knobs now set):
        a dict of tile_columns, walking_warps, read_out_warps, overlapped, state_blocks; None
        from a library older than the entry point (an A/B's base side)."""
        if not hasattr(self.lib, "qed_chunked_forward_plan"):
            return None
        shape, ts = self._problem(x, o_dtype, cu)
        ts += [o, None, None, cu, None]
        ptrs = (ctypes.c_void_p * len(ts))(*[None if t is None else t.data_ptr() for t in ts])
        out = (ctypes.c_int64 * 5)()
        fn = self.lib.qed_chunked_forward_plan
        fn.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_float, ctypes.POINTER(ctypes.c_void_p),
                       ctypes.POINTER(ctypes.c_int64), ctypes.c_char_p, ctypes.c_int]
        fn.restype = ctypes.c_int
        rc = fn(shape, float(x["scale"]), ptrs, out, self.err, 2048)
        if rc != 0:
            raise RuntimeError(f"chunked_forward_plan: status {rc}: {self.err.value.decode()}")
        return dict(zip(("tile_columns", "walking_warps", "read_out_warps", "overlapped", "state_blocks"), out))

    def prepare_backward(self, x, do, grads, dht=None, cu=None, g_dtype=FP32, saved=False):
        """Zero-argument launcher of chunked_backward; grads: dict of output tensors. saved: the
        backward after prepare_forward_saving's launcher (same inputs; it skips the recompute)."""
        shape, ts = self._problem(x, g_dtype, cu)
        ts += [do, dht, cu, None]
        ts += [grads.get(n) for n in ("dq", "dk", "dv", "dg", "db", "dw", "dbeta", "dlambda", "dr", "dh0")]
        fn, name = (self.fbs, "chunked_backward (saved)") if saved else (self.fb, "chunked_backward")
        return self._launcher(fn, name, "wsb", shape, x["scale"], ts, 13)

    def prepare_forward_saving(self, x, o, ht=None, cu=None, o_dtype=BF16):
        """Zero-argument launcher of chunked_forward_saving into the backward's workspace (make it
        before prepare_backward(saved=True), which must find the workspace already sized)."""
        shape, ts = self._problem(x, o_dtype, cu)
        ts += [o, ht, None, cu, None]
        return self._launcher(self.fs, "chunked_forward_saving", "wsb", shape, x["scale"], ts, 14)

    @staticmethod
    def _problem(x, out_dtype, cu):
        """The C entry points' shape array ({variant, arm, B, T, H, K, V, dtype, g_dtype,
        out_dtype, N}) and their first ten pointers (q k v g b w beta lambda r h0) for inputs x."""
        q, v = x["q"], x["v"]
        B, T, H, K = q.shape
        V = v.shape[-1]
        dt = FP32 if q.dtype == torch.float32 else BF16
        g = x.get("g")
        gdt = FP32 if (g is not None and g.dtype == torch.float32) else dt
        N = 0 if cu is None else cu.numel() - 1
        shape = (ctypes.c_int64 * 11)(VARIANT[x["variant"]], ARM[x["arm"]], B, T, H, K, V, dt, gdt,
                                      out_dtype, N)
        return shape, [x.get(n) for n in ("q", "k", "v", "g", "b", "w", "beta", "lam", "r", "h0")]

    def _launcher(self, fn, name, ws_attr, shape, scale, ts, ws_slot):
        """Queries the workspace of C entry point fn, grows the buffer self.<ws_attr> to it, puts
        it into pointer slot ws_slot and returns a zero-argument launcher of fn."""
        ptrs = (ctypes.c_void_p * len(ts))(*[None if t is None else t.data_ptr() for t in ts])
        nb = ctypes.c_uint64(0)
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        rc = fn(shape, float(scale), ptrs, ctypes.byref(nb), 1, stream, self.err, 2048)
        if rc != 0:
            raise RuntimeError(f"{name} workspace query: status {rc}: {self.err.value.decode()}")
        if getattr(self, ws_attr).numel() < nb.value:
            setattr(self, ws_attr, torch.empty(nb.value, dtype=torch.uint8, device=DEV))
        ws = getattr(self, ws_attr)
        ptrs[ws_slot] = ws.data_ptr()
        nb2 = ctypes.c_uint64(ws.numel())
        err = self.err

        def run():
            rc = fn(shape, float(scale), ptrs, ctypes.byref(nb2), 0, stream, err, 2048)
            if rc != 0:
                raise RuntimeError(f"{name}: status {rc}: {err.value.decode()}")
        return run

    def grad_buffers(self, x, N, g_dtype=torch.float32):
        q, v = x["q"], x["v"]
        B, T, H, K = q.shape
        V = v.shape[-1]
        nan = lambda *s, dt=g_dtype: torch.full(s, float("nan"), dtype=dt, device=DEV)
        gr = {"dq": nan(B, T, H, K), "dk": nan(B, T, H, K), "dv": nan(B, T, H, V),
              "dh0": nan(N, H, K, V, dt=torch.float32)}
        if x.get("g") is not None:
            gr["dg"] = nan(*x["g"].shape)
        if x.get("b") is not None:
            gr["db"] = nan(B, T, H, K)
            gr["dw"] = nan(B, T, H, V)
        if x.get("beta") is not None:
            gr["dbeta"] = nan(B, T, H)
        if x.get("lam") is not None:
            gr["dlambda"] = nan(H, dt=torch.float32)
        if x.get("r") is not None:
            gr["dr"] = nan(H, K, dt=torch.float32)
        return gr

    def backward(self, x, do, dht=None, cu=None):
        N = x["q"].shape[0] if cu is None else cu.numel() - 1
        gr = self.grad_buffers(x, N)
        self.prepare_backward(x, do, gr, dht, cu)()
        torch.cuda.synchronize()
        return gr

    def forward(self, x, o_dtype=BF16, want_cs=False, cu=None):
        q, v = x["q"], x["v"]
        B, T, H, K = q.shape
        V = v.shape[-1]
        N = B if cu is None else cu.numel() - 1
        od = torch.float32 if o_dtype == FP32 else torch.bfloat16
        o = torch.full((B, T, H, V), float("nan"), dtype=od, device=DEV)
        ht = torch.full((N, H, K, V), float("nan"), dtype=torch.float32, device=DEV)
        cs = None
        if want_cs:
            cs = torch.full((N * ((T + 63) // 64), H, K, V), float("nan"), device=DEV)
        self.prepare(x, o, ht, cs, cu, o_dtype)()
        torch.cuda.synchronize()
        return o, ht, cs


# ---------------------------------------------------------------- inputs and references

def make_inputs(B, T, H, K, V, variant="gdn2", arm="none", regime="std", dtype=torch.bfloat16,
                lam=1.0, seed=0, h0=False):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    rn = lambda *s: torch.randn(*s, device=DEV, generator=gen)
    q = F.normalize(rn(B, T, H, K), dim=-1)
    k = rn(B, T, H, K)
    if regime == "hard_corr":  # a common direction per head: mean pairwise cosine about 0.5
        c = rn(1, 1, H, K)
        k = k + c / c.norm(dim=-1, keepdim=True) * math.sqrt(K)
    k = F.normalize(k, dim=-1)
    v = rn(B, T, H, V)
    if regime == "mixed":
        mu_g = torch.linspace(-1, 7, K, device=DEV)
    elif regime in ("hard", "hard_corr"):
        mu_g = torch.full((K,), 7.0, device=DEV)
    else:
        mu_g = torch.zeros(K, device=DEV)
    mu_b = 4.0 if regime in ("hard", "hard_corr") else 0.0
    x = {"variant": variant, "arm": arm, "scale": K ** -0.5}
    if variant in ("gdn2", "qed", "kda"):
        x["g"] = F.logsigmoid(mu_g + rn(B, T, H, K))
    elif variant == "gdn":
        x["g"] = F.logsigmoid(rn(B, T, H))
    if variant in ("gdn2", "qed"):
        x["b"] = torch.sigmoid(mu_b + rn(B, T, H, K))
        x["w"] = torch.sigmoid(rn(B, T, H, V))
    else:
        x["beta"] = torch.sigmoid(rn(B, T, H))
    if regime == "a1b1":
        if "g" in x:
            x["g"].zero_()
        if "b" in x:
            x["b"].fill_(1.0)
        if "beta" in x:
            x["beta"].fill_(1.0)
    x.update(q=q, k=k, v=v)
    for n in ("q", "k", "v", "g", "b", "w", "beta"):
        if n in x:
            x[n] = x[n].to(dtype).contiguous()
    if variant == "qed":
        x["lam"] = torch.full((H,), lam, device=DEV)
        if arm == "rand":
            x["r"] = F.normalize(rn(H, K), dim=-1).contiguous()
    if h0:
        N = B
        x["h0"] = 0.5 * rn(N, H, K, V)
    return x


def ref_recurrent(x, cu=None):
    """float64 recurrence (MATH.md §3) on the exact inputs; o [B,T,H,V], ht [N,H,K,V]."""
    d = lambda n: x[n].double() if x.get(n) is not None else None
    q, k, v = d("q"), d("k"), d("v")
    B, T, H, K = q.shape
    V = v.shape[-1]
    var, arm = x["variant"], x["arm"]
    g = d("g")
    if g is None:
        g = torch.zeros(B, T, H, K, dtype=torch.float64, device=DEV)
    elif g.dim() == 3:
        g = g[..., None].expand(B, T, H, K)
    if var in ("gdn2", "qed"):
        bb, ww = d("b"), d("w")
    else:
        bb = d("beta")[..., None].expand(B, T, H, K)
        ww = d("beta")[..., None].expand(B, T, H, V)
    lam = d("lam")
    r = d("r")
    spans = [(b, 0, T) for b in range(B)] if cu is None else [(0, int(cu[i]), int(cu[i + 1])) for i in range(cu.numel() - 1)]
    o = torch.zeros(B, T, H, V, dtype=torch.float64, device=DEV)
    hts = []
    for n, (b, s0, s1) in enumerate(spans):
        S = torch.zeros(H, K, V, dtype=torch.float64, device=DEV)
        if x.get("h0") is not None:
            S = x["h0"][n].double().clone()
        for t in range(s0, s1):
            kt, qt = k[b, t], q[b, t]
            a = bb[b, t] * kt
            if var == "qed":
                m = {"full": bb[b, t] * qt, "nogate": qt, "nogate_noproj": qt,
                     "rand": bb[b, t] * (r if r is not None else 0)}[arm]
                if arm != "nogate_noproj":
                    nn = (kt * kt).sum(-1, keepdim=True)
                    km = (kt * m).sum(-1, keepdim=True)
                    m = torch.where(nn > 0, m - kt * km / torch.where(nn > 0, nn, 1), m)
                a = a + lam[:, None] * m
            S = S * torch.exp(g[b, t])[..., None]
            u = ww[b, t] * v[b, t] - torch.einsum("hk,hkv->hv", a, S)
            S = S + kt[..., None] * u[:, None, :]
            o[b, t] = x["scale"] * torch.einsum("hk,hkv->hv", qt, S)
        hts.append(S)
    return o, torch.stack(hts)


def relF(a, b):
    a = a.double()
    b = b.double()
    if not torch.isfinite(a).all():
        return float("nan")
    return ((a - b).norm() / b.norm()).item()


# ---------------------------------------------------------------- workspace diagnostics

def bf16_to_f32(u16):
    return ((u16.to(torch.int32) & 0xFFFF) << 16).view(torch.float32)


def decode_blob(blob, K, V, NT, NTQ):
    """Matrices of one (chunk, head) workspace blob (kernels/chunked_common.cuh, WsLayout)."""
    import numpy as np
    sizes = [("WA", 4 * (K // 16) * 2 * 32 * NT * 8), ("QT", 4 * (K // 16) * 2 * 32 * NTQ * 8),
             ("KH", 4 * 4 * (K // 32) * 32 * NT * 8), ("MM", 4 * 4 * 2 * 32 * NTQ * 8),
             ("GC", 4 * K), ("WZ", (V // 16) * 4 * 2 * 32 * 16)]
    reg, off = {}, 0
    for n, s in sizes:
        reg[n] = blob[off:off + s]
        off += s

    def frags(buf, nterm, dims):
        x = bf16_to_f32(buf.view(torch.int16)).reshape(*dims, 32, nterm, 2, 2).sum(dim=-3)
        return x.double().cpu().numpy()  # [..., lane, reg, half]
    lanes = np.arange(32)
    gq, tq = lanes // 4, lanes % 4
    out = {}
    # -W_a^T B-fragments: [w][kb][nt][lane][reg][half] -> W_a[16w+8nt+g][16kb+2t+half+8reg]
    x = frags(reg["WA"], NT, (4, K // 16, 2))
    W = np.zeros((64, K))
    for w in range(4):
        for kb in range(K // 16):
            for nt in range(2):
                for rg in range(2):
                    for hf in range(2):
                        W[16 * w + 8 * nt + gq, 16 * kb + 2 * tq + hf + 8 * rg] = -x[w, kb, nt, :, rg, hf]
    out["W_a"] = W
    x = frags(reg["QT"], NTQ, (4, K // 16, 2))
    Q = np.zeros((64, K))
    for w in range(4):
        for kb in range(K // 16):
            for nt in range(2):
                for rg in range(2):
                    for hf in range(2):
                        Q[16 * w + 8 * nt + gq, 16 * kb + 2 * tq + hf + 8 * rg] = x[w, kb, nt, :, rg, hf]
    out["Q~"] = Q
    x = frags(reg["KH"], NT, (4, 4, K // 32))
    KH = np.zeros((64, K))
    for s in range(4):
        for kb in range(4):
            for nt in range(K // 32):
                for rg in range(2):
                    for hf in range(2):
                        KH[16 * kb + 2 * tq + hf + 8 * rg, s * (K // 4) + 8 * nt + gq] = x[s, kb, nt, :, rg, hf]
    out["K^"] = KH
    x = frags(reg["MM"], NTQ, (4, 4, 2))
    M = np.zeros((64, 64))
    for w in range(4):
        for kb in range(w + 1):
            for nt in range(2):
                for rg in range(2):
                    for hf in range(2):
                        M[16 * w + 8 * nt + gq, 16 * kb + 2 * tq + hf + 8 * rg] = x[w, kb, nt, :, rg, hf]
    out["M"] = M
    out["gamma"] = reg["GC"].view(torch.float32).double().cpu().numpy()
    z = reg["WZ"].view(torch.float32).reshape(V // 16, 4, 2, 32, 4).double().cpu().numpy()
    WZ = np.zeros((64, V))
    for vb in range(V // 16):
        for w in range(4):
            for nt in range(2):
                for e in range(4):
                    WZ[16 * w + 8 * nt + 2 * tq + (e & 1), 16 * vb + gq + 8 * (e >> 1)] = z[vb, w, nt, :, e]
    out["W_z"] = WZ
    return out


def chunk_matrices(x, b=0, h=0, c=0):
    """float64 W_a, Q~, K^, M, W_z, gamma of chunk c of (b, h) (MATH.md §4)."""
    sl = slice(64 * c, 64 * (c + 1))
    q = x["q"][b, sl, h].double()
    k = x["k"][b, sl, h].double()
    v = x["v"][b, sl, h].double()
    n = q.shape[0]
    g = x["g"][b, sl, h].double() if x.get("g") is not None else torch.zeros_like(q)
    if g.dim() == 1:
        g = g[:, None].expand_as(q)
    if x["variant"] in ("gdn2", "qed"):
        bb, ww = x["b"][b, sl, h].double(), x["w"][b, sl, h].double()
    else:
        bb = x["beta"][b, sl, h].double()[:, None].expand_as(q)
        ww = x["beta"][b, sl, h].double()[:, None].expand_as(v)
    a = bb * k
    if x["variant"] == "qed":
        arm = x["arm"]
        m = {"full": bb * q, "nogate": q, "nogate_noproj": q,
             "rand": bb * x["r"][h].double() if "r" in x else None}[arm]
        if arm != "nogate_noproj":
            m = m - k * (k * m).sum(-1, keepdim=True) / (k * k).sum(-1, keepdim=True)
        a = a + x["lam"][h].double() * m
    G = torch.cumsum(g, 0)
    E = torch.exp(G[:, None, :] - G[None, :, :])  # [r, j, c]
    lower = torch.tril(torch.ones(n, n, dtype=torch.bool, device=DEV))
    E = torch.where(lower[..., None], E, torch.zeros_like(E))
    T = torch.einsum("rc,jc,rjc->rj", a, k, E) * (~torch.eye(n, dtype=torch.bool, device=DEV))
    M = torch.einsum("rc,jc,rjc->rj", q, k, E)
    L = torch.linalg.inv(torch.eye(n, dtype=torch.float64, device=DEV) + T)
    return {"W_a": (L @ (a * torch.exp(G))).cpu().numpy(), "Q~": (q * torch.exp(G)).cpu().numpy(),
            "K^": (k * torch.exp(G[-1] - G)).cpu().numpy(), "M": M.cpu().numpy(),
            "W_z": (L @ (ww * v)).cpu().numpy(), "gamma": torch.exp(G[-1]).cpu().numpy()}


def diagnose(lib, log):
    import numpy as np
    K = V = 128
    for variant, arm, dt, NT, NTQ in [("gdn2", "none", torch.bfloat16, 2, 1), ("qed", "full", torch.bfloat16, 2, 1),
                                      ("gdn2", "none", torch.float32, 3, 3)]:
        x = make_inputs(1, 128, 1, K, V, variant, arm, "std", dt, lam=0.8, seed=5)
        lib.forward(x)
        want = chunk_matrices(x)
        blob_bytes = None
        # blob size: regions + WZ, rounded up to 256 (no cu_seqlens: the blobs start after the
        # overlapped forward's flags, 4 bytes per (chunk, head) rounded up to 256)
        flags = (2 * 1 * 4 + 255) // 256 * 256
        tot = (4 * (K // 16) * 2 * 32 * NT * 8 + 4 * (K // 16) * 2 * 32 * NTQ * 8 + 4 * 4 * (K // 32) * 32 * NT * 8
               + 4 * 4 * 2 * 32 * NTQ * 8 + 4 * K + (V // 16) * 4 * 2 * 32 * 16)
        blob_bytes = (tot + 255) // 256 * 256
        got = decode_blob(lib.ws[flags:flags + blob_bytes], K, V, NT, NTQ)
        parts = []
        for name in ("W_a", "Q~", "K^", "M", "W_z", "gamma"):
            a, b = got[name], want[name]
            e = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)
            parts.append(f"{name} {e:.1e}")
        log(f"[diag] workspace chunk 0 {variant}/{arm} {str(dt)[6:]}: " + ", ".join(parts))


def variants_check(lib, log, quick):
    rows = []
    cases = [("gdn2", "none"), ("qed", "full"), ("qed", "nogate"), ("qed", "nogate_noproj"),
             ("qed", "rand"), ("kda", "none"), ("gdn", "none"), ("deltanet", "none")]
    for i, (variant, arm) in enumerate(cases):
        for dt in (torch.float32, torch.bfloat16):
            T = 130 if quick else 200
            x = make_inputs(2, T, 2, 128, 64 if i % 2 else 128, variant, arm, "std", dt, lam=0.8,
                            seed=10 + i, h0=(i % 2 == 0))
            o, ht, _ = lib.forward(x, o_dtype=FP32)
            ro, rht = ref_recurrent(x)
            eo, eh = relF(o, ro), relF(ht, rht)
            rows.append((variant, arm, str(dt)[6:], eo, eh))
            log(f"[check] {variant}/{arm} {str(dt)[6:]} T={T}: relF o {eo:.2e} ht {eh:.2e}")
    # packed sequences with an empty one and a partial chunk
    x = make_inputs(1, 300, 2, 128, 128, "qed", "nogate", "mixed", torch.bfloat16, lam=0.9, seed=77)
    cu = torch.tensor([0, 70, 70, 134, 300], dtype=torch.int64, device=DEV)
    x["h0"] = 0.5 * torch.randn(4, 2, 128, 128, device=DEV)
    o, ht, _ = lib.forward(x, o_dtype=FP32, cu=cu)
    ro, rht = ref_recurrent(x, cu)
    log(f"[check] varlen qed/nogate bf16: relF o {relF(o, ro):.2e} ht {relF(ht, rht):.2e}")
    rows.append(("qed-varlen", "nogate", "bfloat16", relF(o, ro), relF(ht, rht)))
    return rows


# ---------------------------------------------------------------- accuracy vs the peer

def peer_call(x, want_state=True):
    from fla.ops.gdn2 import chunk_gdn2
    return chunk_gdn2(x["q"], x["k"], x["v"], x["g"], x["b"], x["w"], scale=x["scale"],
                      output_final_state=want_state)


def accuracy(lib, log, quick, have_peer):
    rows = []
    T = 1024 if quick else 4096
    for regime in ("std", "mixed", "hard"):
        x = make_inputs(1, T, 2, 128, 128, "gdn2", "none", regime, torch.bfloat16, seed=100)
        ro, rht = ref_recurrent(x)
        o, ht, _ = lib.forward(x, o_dtype=BF16)
        o32, _, _ = lib.forward(x, o_dtype=FP32)
        os.environ["QEDCHECK_CHUNKED_MUTANT"] = "single"
        os_, hts, _ = lib.forward(x, o_dtype=BF16)
        del os.environ["QEDCHECK_CHUNKED_MUTANT"]
        row = {"regime": regime, "T": T, "ours_o": relF(o, ro), "ours_o_fp32out": relF(o32, ro),
               "ours_ht": relF(ht, rht), "single_o": relF(os_, ro), "single_ht": relF(hts, rht)}
        if have_peer:
            po, pht = peer_call(x)
            torch.cuda.synchronize()
            row.update(peer_o=relF(po, ro), peer_ht=relF(pht, rht))
        rows.append(row)
        log("[accuracy] " + json.dumps(row))
    return rows


# ---------------------------------------------------------------- timing

@contextlib.contextmanager
def knobs(settings):
    """The library's environment knobs (QEDCHECK_CHUNKED_*, read at every call) set to settings
    (name -> value) for the block, then put back as they were, unset ones unset again."""
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def time_ms(fn, warmup=3, reps=15):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts), min(ts), max(ts)


def matmul_ceiling():
    """Measured bf16 matmul rate (torch.matmul, 8192 x 8192 x 8192, fp32 accumulation), FLOP/s:
    the compute ceiling the forward's achieved TFLOP/s is read against."""
    n = 8192
    a = torch.randn(n, n, dtype=torch.bfloat16, device=DEV)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=DEV)
    med, _, _ = time_ms(lambda: a @ b, 2, 10)
    return 2 * n ** 3 / (med * 1e-3)


def copy_bandwidth():
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device=DEV)
    a.random_(0, 255)
    b = torch.empty_like(a)
    med, _, _ = time_ms(lambda: b.copy_(a), 2, 10)
    return 2 * n / (med * 1e-3)


# State-pass configurations beside the default (four warps, bulk loads at K = 128): row-name tag,
# QEDCHECK_CHUNKED_STATE_WARPS, QEDCHECK_CHUNKED_STATE_LOAD.
STATE_CONFIGS = (("w4bulk", "4", "bulk"), ("w4cp", "4", "cpasync"), ("w8cp", "8", "cpasync"),
                 ("w8bulk", "8", "bulk"))


def explore_forward(row, run):
    """Rows beside the default forward: the prep pass on 4 warps; for each state-pass
    configuration the pass alone at each tile width and the whole forward at its default width;
    the whole default forward at each tile width."""
    os.environ["QEDCHECK_CHUNKED_ONLY"] = "prep"
    os.environ["QEDCHECK_CHUNKED_PREP_WARPS"] = "4"  # the prep pass with 4 warps per block
    row["prep_4w_ms"] = time_ms(run)[0]
    del os.environ["QEDCHECK_CHUNKED_ONLY"]
    row["ours_gdn2_4w_ms"] = time_ms(run)[0]
    del os.environ["QEDCHECK_CHUNKED_PREP_WARPS"]
    for tag, warps, load in STATE_CONFIGS:
        os.environ["QEDCHECK_CHUNKED_STATE_WARPS"] = warps
        os.environ["QEDCHECK_CHUNKED_STATE_LOAD"] = load
        row[f"ours_gdn2_{tag}_ms"] = time_ms(run)[0]
        os.environ["QEDCHECK_CHUNKED_ONLY"] = "state"
        for mt in (1, 2, 4):
            os.environ["QEDCHECK_CHUNKED_MT"] = str(mt)
            row[f"state_{tag}_mt{mt}_ms"] = time_ms(run)[0]
        del os.environ["QEDCHECK_CHUNKED_MT"]
        del os.environ["QEDCHECK_CHUNKED_ONLY"]
    del os.environ["QEDCHECK_CHUNKED_STATE_WARPS"]
    del os.environ["QEDCHECK_CHUNKED_STATE_LOAD"]
    for mt in (1, 2, 4):
        os.environ["QEDCHECK_CHUNKED_MT"] = str(mt)
        row[f"ours_gdn2_mt{mt}_ms"] = time_ms(run)[0]
    del os.environ["QEDCHECK_CHUNKED_MT"]


def explore_ilp(row, run):
    """The state pass at one value tile, former and ILP instance (the default since run 20;
    QEDCHECK_CHUNKED_STATE_ILP=0 the former), alone and in a whole forward; interleaved, the
    former first."""
    os.environ["QEDCHECK_CHUNKED_MT"] = "1"
    for tag, ilp in (("", "0"), ("_ilp", "1"), ("_2", "0"), ("_ilp_2", "1")):
        os.environ["QEDCHECK_CHUNKED_STATE_ILP"] = ilp
        row[f"fwd_mt1{tag}_ms"] = time_ms(run)[0]
        os.environ["QEDCHECK_CHUNKED_ONLY"] = "state"
        row[f"state_mt1{tag}_ms"] = time_ms(run)[0]
        del os.environ["QEDCHECK_CHUNKED_ONLY"]
    del os.environ["QEDCHECK_CHUNKED_STATE_ILP"]
    del os.environ["QEDCHECK_CHUNKED_MT"]


def explore_qed(lib, row, x, xq, o, ht):
    """QED on the eight-warp state pass, and the one-term mutant."""
    os.environ["QEDCHECK_CHUNKED_STATE_WARPS"] = "8"
    row["ours_qed_w8cp_ms"] = time_ms(lib.prepare(xq, o, ht))[0]
    del os.environ["QEDCHECK_CHUNKED_STATE_WARPS"]
    os.environ["QEDCHECK_CHUNKED_MUTANT"] = "single"
    row["ours_single_ms"] = time_ms(lib.prepare(x, o, ht))[0]
    del os.environ["QEDCHECK_CHUNKED_MUTANT"]


def timings(lib, log, quick, have_peer, bw, pick=None, lean=False, mm=float("nan")):
    """pick: 1-based indices of the shapes to time (all three by default); lean: only the rows of
    the README table and of the QED split (no warp-count, load-path or one-term exploration)."""
    shapes = [(8, 4096, 16, 128), (2, 16384, 16, 128), (1, 65536, 8, 128)]
    if pick:
        shapes = [shapes[i - 1] for i in pick]
    if quick:
        shapes = [(2, 4096, 16, 128)]
    rows = []
    for (B, T, H, D) in shapes:
        x = make_inputs(B, T, H, D, D, "gdn2", "none", "std", torch.bfloat16, seed=1)
        o = torch.empty(B, T, H, D, dtype=torch.bfloat16, device=DEV)
        ht = torch.empty(B, H, D, D, dtype=torch.float32, device=DEV)
        row = {"shape": f"[{B},{T},{H},{D}]"}
        floor_bytes = roofline.forward_floor_bytes(B, T, H, D, D)
        row["floor_ms"] = floor_bytes / bw * 1e3
        run = lib.prepare(x, o, ht)
        row["ours_gdn2_ms"] = time_ms(run)[0]
        # against the ceilings measured in this call (roofline.py: model FLOPs, byte floor)
        sec = row["ours_gdn2_ms"] * 1e-3
        row["model_gflop"] = roofline.forward_flops(B, T, H, D, D) / 1e9
        row["tflops"] = row["model_gflop"] / sec / 1e3
        row["tflops_of_ceiling"] = row["tflops"] * 1e12 / mm
        row["floor_gb"] = floor_bytes / 1e9
        row["eff_tbs"] = floor_bytes / sec / 1e12
        row["bw_of_ceiling"] = floor_bytes / sec / bw
        os.environ["QEDCHECK_CHUNKED_ONLY"] = "prep"
        row["prep_ms"] = time_ms(run)[0]
        del os.environ["QEDCHECK_CHUNKED_ONLY"]
        # the passes in series (the default overlaps them where the state pass has few blocks)
        os.environ["QEDCHECK_CHUNKED_OVERLAP"] = "0"
        row["ours_gdn2_serial_ms"] = time_ms(run)[0]
        del os.environ["QEDCHECK_CHUNKED_OVERLAP"]
        os.environ["QEDCHECK_CHUNKED_ONLY"] = "state"
        row["state_ms"] = time_ms(run)[0]
        del os.environ["QEDCHECK_CHUNKED_ONLY"]
        if not lean:
            explore_forward(row, run)
            explore_ilp(row, run)
        xq = dict(x)
        xq.update(variant="qed", arm="full", lam=torch.ones(H, device=DEV))
        run_q = lib.prepare(xq, o, ht)
        row["ours_qed_ms"] = time_ms(run_q)[0]
        for only in ("prep", "state"):  # where QED's extra time goes
            os.environ["QEDCHECK_CHUNKED_ONLY"] = only
            row[f"qed_{only}_ms"] = time_ms(run_q)[0]
            row[f"gdn2_{only}_ms"] = time_ms(run)[0]
        del os.environ["QEDCHECK_CHUNKED_ONLY"]
        if not lean:
            explore_qed(lib, row, x, xq, o, ht)
        if have_peer:
            row["peer_ms"] = time_ms(lambda: peer_call(x))[0]
            row["speedup"] = row["peer_ms"] / row["ours_gdn2_ms"]
        row["qed_over_gdn2"] = row["ours_qed_ms"] / row["ours_gdn2_ms"] - 1
        rows.append(row)
        log("[timing] " + json.dumps(row))
        del x, xq, o, ht
        torch.cuda.empty_cache()
    return rows


def prep_phases(lib, log):
    """The prep pass cut after each of its phases (QEDCHECK_CHUNKED_PREP_STOP=k), GDN-2 and QED
    (full, lambda = 1) at [8,4096,16,128] bf16: each phase's cost is the difference of neighbours."""
    names = ["load", "decay cumsum", "QED prologue", "T/M products", "L, K^ and Q~", "A~", "v/w load",
             "W_a and W_z"]
    B, T, H, D = 8, 4096, 16, 128
    x = make_inputs(B, T, H, D, D, "gdn2", "none", "std", torch.bfloat16, seed=1)
    xq = dict(x)
    xq.update(variant="qed", arm="full", lam=torch.ones(H, device=DEV))
    o = torch.empty(B, T, H, D, dtype=torch.bfloat16, device=DEV)
    ht = torch.empty(B, H, D, D, dtype=torch.float32, device=DEV)
    rows = []
    os.environ["QEDCHECK_CHUNKED_ONLY"] = "prep"
    try:
        for k in range(1, 9):
            os.environ["QEDCHECK_CHUNKED_PREP_STOP"] = str(k % 8)  # 8 -> 0: the whole pass
            rows.append({"phase": k, "name": names[k - 1], "gdn2_ms": time_ms(lib.prepare(x, o, ht))[0],
                         "qed_ms": time_ms(lib.prepare(xq, o, ht))[0]})
    finally:
        del os.environ["QEDCHECK_CHUNKED_ONLY"]
        os.environ.pop("QEDCHECK_CHUNKED_PREP_STOP", None)
    prev = {"gdn2_ms": 0.0, "qed_ms": 0.0}
    for r in rows:
        r["gdn2_phase_ms"] = r["gdn2_ms"] - prev["gdn2_ms"]
        r["qed_phase_ms"] = r["qed_ms"] - prev["qed_ms"]
        prev = r
        log("[phases] " + json.dumps(r))
    return rows


# ---------------------------------------------------------------- backward

def ref_grads(x, do, names, dht=None):
    """float64 autograd through ref_recurrent of the loss <o, do> (+ <ht, dht>): {name: gradient}."""
    xd = dict(x)
    leaves = {n: x[n].detach().double().requires_grad_(True) for n in names}
    xd.update(leaves)
    o, ht = ref_recurrent(xd)
    loss = (o * do.double()).sum()
    if dht is not None:
        loss = loss + (ht * dht.double()).sum()
    return dict(zip(names, torch.autograd.grad(loss, [leaves[n] for n in names])))


def backward_check(lib, log):
    """Our gradients against float64 autograd through ref_recurrent, every variant (small T)."""
    rows = []
    cases = [("gdn2", "none"), ("qed", "full"), ("qed", "nogate"), ("qed", "nogate_noproj"),
             ("qed", "rand"), ("kda", "none"), ("gdn", "none"), ("deltanet", "none")]
    for i, (variant, arm) in enumerate(cases):
        for dt in (torch.float32, torch.bfloat16):
            x = make_inputs(1, 130, 2, 64, 64, variant, arm, "std", dt, lam=0.8, seed=200 + i, h0=True)
            do = torch.randn(1, 130, 2, 64, device=DEV).to(dt)
            dht = torch.randn(1, 2, 64, 64, device=DEV)
            gr = lib.backward(x, do, dht)
            names = [n for n in ("q", "k", "v", "g", "b", "w", "beta", "lam", "r", "h0") if x.get(n) is not None]
            ref = ref_grads(x, do, names, dht)
            errs = {}
            for n in names:
                key = "dlambda" if n == "lam" else "d" + n
                if key in gr:
                    errs[key] = relF(gr[key], ref[n])
            rows.append({"variant": variant, "arm": arm, "dtype": str(dt)[6:], **errs})
            log(f"[bwd check] {variant}/{arm} {str(dt)[6:]}: " + " ".join(f"{k} {v:.1e}" for k, v in errs.items()))
    return rows


def backward_vs_peer(lib, log):
    """Issue 7's side-by-side accuracy check: our gradients and chunk_gdn2's, both against float64
    autograd through the recurrence on the same bf16 inputs (gdn2, B=1, T=512, H=2, K=V=128,
    regimes std, mixed, hard, hard_corr). relF per gradient; ours must not be worse."""
    rows = []
    for i, regime in enumerate(("std", "mixed", "hard", "hard_corr")):
        x = make_inputs(1, 512, 2, 128, 128, "gdn2", "none", regime, torch.bfloat16, seed=300 + i)
        do = torch.randn(1, 512, 2, 128, device=DEV).to(torch.bfloat16)
        ours = lib.backward(x, do)
        os.environ["QEDCHECK_CHUNKED_BWD_IMPL"] = "v1"  # the former pipeline, side by side
        try:
            ours1 = lib.backward(x, do)
        finally:
            os.environ["QEDCHECK_CHUNKED_BWD_IMPL"] = OURS_BWD
        leaves = peer_fwd_bwd(x, do)
        torch.cuda.synchronize()
        names = ("q", "k", "v", "g", "b", "w")
        ref = ref_grads(x, do, names)
        for n, leaf in zip(names, leaves):
            row = {"regime": regime, "grad": "d" + n, "ours": relF(ours["d" + n], ref[n]),
                   "ours_v1": relF(ours1["d" + n], ref[n]), "peer": relF(leaf.grad, ref[n])}
            rows.append(row)
            log("[bwd vs peer] " + json.dumps(row))
    return rows


def peer_fwd_bwd(x, do):
    from fla.ops.gdn2 import chunk_gdn2
    leaves = [x[n].detach().clone().requires_grad_(True) for n in ("q", "k", "v", "g", "b", "w")]
    o, _ = chunk_gdn2(*leaves, scale=x["scale"], output_final_state=False)
    torch.autograd.backward(o, do)
    return leaves


def timings_backward(lib, log, quick, have_peer, pick=None, lean=False):
    """lean: only the recomputing and the training-pair rows (no v1 pipeline, no sixteen warps)."""
    shapes = [(8, 4096, 16, 128), (2, 16384, 16, 128), (1, 65536, 8, 128)]
    if pick:
        shapes = [shapes[i - 1] for i in pick]
    if quick:
        shapes = [(2, 4096, 16, 128)]
    rows = []
    for (B, T, H, D) in shapes:
        x = make_inputs(B, T, H, D, D, "gdn2", "none", "std", torch.bfloat16, seed=3)
        do = torch.randn(B, T, H, D, device=DEV).to(torch.bfloat16)
        o = torch.empty(B, T, H, D, dtype=torch.bfloat16, device=DEV)
        ht = torch.empty(B, H, D, D, dtype=torch.float32, device=DEV)
        gr = lib.grad_buffers(x, B, torch.bfloat16)
        fwd = lib.prepare(x, o, ht)
        bwd = lib.prepare_backward(x, do, gr, g_dtype=BF16)
        row = {"shape": f"[{B},{T},{H},{D}]", "ws_gb": lib.wsb.numel() / 1e9}
        row["ours_fwd_ms"] = time_ms(fwd)[0]
        row["ours_bwd_ms"] = time_ms(bwd)[0]
        row["ours_bwd_v1_ms"] = float("nan")
        if B * T <= 32768 and not lean:  # the former pipeline, for the side-by-side row (43 ms and more a call)
            os.environ["QEDCHECK_CHUNKED_BWD_IMPL"] = "v1"
            try:
                row["ours_bwd_v1_ms"] = time_ms(lib.prepare_backward(x, do, gr, g_dtype=BF16), warmup=1, reps=3)[0]
            finally:
                os.environ["QEDCHECK_CHUNKED_BWD_IMPL"] = OURS_BWD
        row["ours_bwd_w16_ms"] = float("nan")
        if not lean:
            os.environ["QEDCHECK_CHUNKED_GRADS_WARPS"] = "16"  # the gradient pass on sixteen warps
            try:
                row["ours_bwd_w16_ms"] = time_ms(lib.prepare_backward(x, do, gr, g_dtype=BF16))[0]
            finally:
                os.environ.pop("QEDCHECK_CHUNKED_GRADS_WARPS", None)
        row["ours_fwdbwd_ms"] = time_ms(lambda: (fwd(), bwd()))[0]
        # the training pair: the forward keeps the recompute, the backward skips it
        fsv = lib.prepare_forward_saving(x, o, ht)
        bsv = lib.prepare_backward(x, do, gr, g_dtype=BF16, saved=True)
        row["ours_fwdbwd_saved_ms"] = time_ms(lambda: (fsv(), bsv()))[0]
        xq = dict(x)
        xq.update(variant="qed", arm="full", lam=torch.ones(H, device=DEV))
        grq = lib.grad_buffers(xq, B, torch.bfloat16)
        fq, bq = lib.prepare(xq, o, ht), lib.prepare_backward(xq, do, grq, g_dtype=BF16)
        row["ours_qed_fwdbwd_ms"] = time_ms(lambda: (fq(), bq()))[0]
        fqs = lib.prepare_forward_saving(xq, o, ht)
        bqs = lib.prepare_backward(xq, do, grq, g_dtype=BF16, saved=True)
        row["ours_qed_fwdbwd_saved_ms"] = time_ms(lambda: (fqs(), bqs()))[0]
        row["qed_over_gdn2_saved"] = row["ours_qed_fwdbwd_saved_ms"] / row["ours_fwdbwd_saved_ms"]
        # QED's pair with the gradient pass's partials stored and read back (QEDCHECK_CHUNKED_GRADS_HOLD=0)
        os.environ["QEDCHECK_CHUNKED_GRADS_HOLD"] = "0"
        try:
            row["ours_qed_fwdbwd_saved_nohold_ms"] = time_ms(lambda: (fqs(), bqs()))[0]
        finally:
            os.environ.pop("QEDCHECK_CHUNKED_GRADS_HOLD", None)
        if have_peer:
            row["peer_fwdbwd_ms"] = time_ms(lambda: peer_fwd_bwd(x, do))[0]
            row["peer_over_ours"] = row["peer_fwdbwd_ms"] / row["ours_fwdbwd_ms"]
            row["peer_over_ours_saved"] = row["peer_fwdbwd_ms"] / row["ours_fwdbwd_saved_ms"]
            leaves = peer_fwd_bwd(x, do)
            torch.cuda.synchronize()
            row["grad_relF_vs_peer"] = {n: relF(gr["d" + n], l.grad) for n, l in
                                        zip(("q", "k", "v", "g", "b", "w"), leaves)}
        rows.append(row)
        log("[timing fwd+bwd] " + json.dumps(row))
        del x, xq, o, ht, gr, grq, do
        lib.wsb = torch.empty(0, dtype=torch.uint8, device=DEV)
        torch.cuda.empty_cache()
    return rows


def backward_phases(lib, log, impls=("v2",), configs=("8", "16")):
    """The backward cut after each of its passes (QEDCHECK_CHUNKED_BWD_STOP=k), GDN-2 and QED
    (full arm) at [8,4096,16,128] bf16, for each pipeline (QEDCHECK_CHUNKED_BWD_IMPL) and, for v2,
    each gradient-pass configuration of `configs`: "8" (eight warps, the default), "16" (sixteen
    warps), "8late" (eight warps loading each slab's inputs at use, QEDCHECK_CHUNKED_GRADS_AHEAD=0),
    "8general" (eight warps, the kernel for any input layout, QEDCHECK_CHUNKED_GRADS_RAW=0).
    Each pass's cost is the difference of neighbouring cuts."""
    knobs = {"8": {}, "16": {"QEDCHECK_CHUNKED_GRADS_WARPS": "16"},
             "8late": {"QEDCHECK_CHUNKED_GRADS_AHEAD": "0"},
             "8general": {"QEDCHECK_CHUNKED_GRADS_RAW": "0"}}
    names = {"v2": ["recompute forward (+ U, backward blobs)", "reverse sweep", "gradients + token VJP"],
             "v1": ["recompute forward", "prep", "reverse state sweep", "chunk (decay factors)", "token VJP"]}
    B, T, H, D = 8, 4096, 16, 128
    rows = []
    runs = []
    for impl in impls:
        for variant in ("gdn2", "qed"):
            for cfg in (configs if impl == "v2" else ("8",)):
                runs.append((impl, variant, cfg))
    try:
        for impl, variant, cfg in runs:
            x = make_inputs(B, T, H, D, D, variant, "full" if variant == "qed" else "none", "std",
                            torch.bfloat16, seed=3)
            do = torch.randn(B, T, H, D, device=DEV).to(torch.bfloat16)
            gr = lib.grad_buffers(x, B, torch.bfloat16)
            os.environ["QEDCHECK_CHUNKED_BWD_IMPL"] = impl
            for k, v in knobs[cfg].items():
                os.environ[k] = v
            prev = 0.0
            label = f"{impl}{'' if cfg == '8' else ' (' + cfg + ')'} {variant}"
            for k in range(1, len(names[impl]) + 1):
                os.environ["QEDCHECK_CHUNKED_BWD_STOP"] = str(k)
                ms = time_ms(lib.prepare_backward(x, do, gr, g_dtype=BF16), warmup=1, reps=3)[0]
                rows.append({"pass": k, "name": f"{label}: {names[impl][k - 1]}", "cum_ms": ms,
                             "pass_ms": ms - prev})
                prev = ms
                log("[bwd phases] " + json.dumps(rows[-1]))
            for k in knobs[cfg]:
                os.environ.pop(k, None)
            os.environ.pop("QEDCHECK_CHUNKED_BWD_STOP", None)
            del x, do, gr
    finally:
        os.environ.pop("QEDCHECK_CHUNKED_BWD_STOP", None)
        for kv in knobs.values():
            for k in kv:
                os.environ.pop(k, None)
        os.environ["QEDCHECK_CHUNKED_BWD_IMPL"] = OURS_BWD
    lib.wsb = torch.empty(0, dtype=torch.uint8, device=DEV)
    torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", help="path of the ctypes library (libchunked_capi.so)")
    ap.add_argument("--lib-dir", help="build folder holding libchunked_capi.so (ci/device.sh)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-peer", action="store_true")
    ap.add_argument("--only", default="diag,check,accuracy,timing,bwdcheck,bwdtiming")
    ap.add_argument("--shapes", default="1,2,3", help="timing shapes of the forward and of forward + backward, 1-based (default all three)")
    ap.add_argument("--phase-configs", default="8,16",
                    help="bwdphases: gradient-pass configurations, of 8, 16, 8late, 8general (see backward_phases)")
    ap.add_argument("--lean", action="store_true", help="forward and fwd+bwd timing: the default rows only")
    args = ap.parse_args()
    try:
        pick = [int(i) for i in args.shapes.split(",")]
        if not pick or any(i < 1 or i > 3 for i in pick):
            raise ValueError
    except ValueError:
        ap.error(f"--shapes {args.shapes!r}: a comma-separated list of 1, 2, 3")
    if not args.lib and not args.lib_dir:
        ap.error("give --lib PATH or --lib-dir BUILD")
    if not args.lib:
        args.lib = os.path.join(args.lib_dir, "libchunked_capi.so")
    os.makedirs(args.out, exist_ok=True)
    logf = open(os.path.join(args.out, "chunked_bench.log"), "w")

    def log(s):
        print(s, flush=True)
        logf.write(s + "\n")
        logf.flush()
    lib = Chunked(args.lib)
    have_peer = False
    if not args.skip_peer:
        try:
            import fla.ops.gdn2  # noqa: F401
            have_peer = True
        except Exception as e:  # noqa: BLE001
            log(f"peer unavailable: {e!r}")
    log(f"device {torch.cuda.get_device_name()} torch {torch.__version__} peer {have_peer}")
    res = {}
    only = args.only.split(",")
    for name, fn in (("diag", lambda: diagnose(lib, log)),
                     ("check", lambda: variants_check(lib, log, args.quick)),
                     ("accuracy", lambda: accuracy(lib, log, args.quick, have_peer)),
                     ("bwdcheck", lambda: backward_check(lib, log)),
                     ("phases", lambda: prep_phases(lib, log))):
        if name in only:
            try:
                res[name] = fn()
            except Exception as e:  # noqa: BLE001
                log(f"[{name}] FAILED: {e!r}")
    if "timing" in only:
        bw = copy_bandwidth()
        log(f"[bandwidth] device-to-device copy {bw / 1e12:.2f} TB/s (read + write)")
        mm = matmul_ceiling()
        log(f"[matmul] bf16 8192^3 torch.matmul {mm / 1e12:.0f} TFLOP/s")
        try:
            res["timing"] = timings(lib, log, args.quick, have_peer, bw, pick, args.lean, mm)
        except Exception as e:  # noqa: BLE001
            log(f"[timing] FAILED: {e!r}")
    if "bwdtiming" in only:
        try:
            res["bwdtiming"] = timings_backward(lib, log, args.quick, have_peer, pick, args.lean)
        except Exception as e:  # noqa: BLE001
            log(f"[bwdtiming] FAILED: {e!r}")
    if "bwdpeer" in only and have_peer:
        try:
            res["bwdpeer"] = backward_vs_peer(lib, log)
        except Exception as e:  # noqa: BLE001
            log(f"[bwdpeer] FAILED: {e!r}")
    if "bwdphases" in only:
        try:
            res["bwdphases"] = backward_phases(lib, log, configs=tuple(args.phase_configs.split(",")))
        except Exception as e:  # noqa: BLE001
            log(f"[bwdphases] FAILED: {e!r}")
    with open(os.path.join(args.out, "chunked_forward.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    lines = []

    def table(header, rows):
        if lines:
            lines.append("")
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + " --- |" * len(header))
        lines.extend("| " + " | ".join(r) + " |" for r in rows)
    nan = float("nan")
    if res.get("accuracy"):
        table(["regime (T)", "ours o", "ours ht", "single-term o", "single-term ht", "peer o", "peer ht"],
              [[f"{r['regime']} ({r['T']})", f"{r['ours_o']:.2e}", f"{r['ours_ht']:.2e}", f"{r['single_o']:.2e}",
                f"{r['single_ht']:.2e}", f"{r.get('peer_o', nan):.2e}", f"{r.get('peer_ht', nan):.2e}"]
               for r in res["accuracy"]])
    if res.get("phases"):
        table(["prep pass cut after phase ([8,4096,16,128] bf16)", "gdn2 ms", "phase ms", "qed ms", "phase ms"],
              [[f"{r['phase']} {r['name']}", f"{r['gdn2_ms']:.3f}", f"{r['gdn2_phase_ms']:.3f}", f"{r['qed_ms']:.3f}",
                f"{r['qed_phase_ms']:.3f}"] for r in res["phases"]])
    if res.get("timing"):
        tr = res["timing"]
        explored = "state_w4bulk_mt1_ms" in tr[0]

        def ms(r, *keys):
            return "/".join(f"{r.get(k, nan):.3f}" for k in keys)
        # Whole forwards against the peer, then the two passes alone (no peer column: the peer's
        # time is only comparable with a whole forward).
        table(["shape", "floor ms", "ours gdn2 ms", "ours qed ms", "ours, prep 4 warps ms", "single-term ms", "peer ms",
               "speed-up"],
              [[r["shape"], ms(r, "floor_ms"), ms(r, "ours_gdn2_ms"), ms(r, "ours_qed_ms"), ms(r, "ours_gdn2_4w_ms"),
                ms(r, "ours_single_ms"), ms(r, "peer_ms"), f"{r.get('speedup', nan):.2f}x"] for r in tr])
        # The default forward against the passes in series (QEDCHECK_CHUNKED_OVERLAP=0): the same
        # where the default does not overlap them
        # (one time column, rows named apart from the first table's for the gate's reader)
        table(["forward, passes in series", "time ms"],
              [[r["shape"] + " in series", ms(r, "ours_gdn2_serial_ms")] for r in tr])
        table(["shape", "state pass alone ms"], [[r["shape"], ms(r, "state_ms")] for r in tr])
        # Our GDN-2 forward (first table) against the ceilings measured in the same call
        # (bench/roofline.py); no time column, so that the gate's table reader skips this table
        table(["shape", "model GFLOP", "TFLOP/s", "of bf16 matmul", "byte floor GB",
               "effective TB/s", "of copy bandwidth"],
              [[r["shape"], f"{r.get('model_gflop', nan):.1f}", f"{r.get('tflops', nan):.1f}",
                f"{100 * r.get('tflops_of_ceiling', nan):.1f}%",
                f"{r.get('floor_gb', nan):.3f}", f"{r.get('eff_tbs', nan):.3f}",
                f"{100 * r.get('bw_of_ceiling', nan):.1f}%"] for r in tr])
        if explored:
            table(["shape", "prep pass ms", "prep pass, 4 warps ms", "whole forward mt1/2/4 ms"],
                  [[r["shape"], ms(r, "prep_ms"), ms(r, "prep_4w_ms"),
                    ms(r, "ours_gdn2_mt1_ms", "ours_gdn2_mt2_ms", "ours_gdn2_mt4_ms")] for r in tr])
            # The state pass's configurations: whole forwards (each at its default tile width) and
            # the pass alone at each width, all in the same call.
            tags = [t for t, _, _ in STATE_CONFIGS]
            table(["shape", "whole forward " + " / ".join(tags) + " ms"]
                  + [f"state {t} mt1/2/4 ms" for t in tags],
                  [[r["shape"], ms(r, *[f"ours_gdn2_{t}_ms" for t in tags])]
                   + [ms(r, f"state_{t}_mt1_ms", f"state_{t}_mt2_ms", f"state_{t}_mt4_ms") for t in tags]
                   for r in tr])
        # The state pass's ILP instance at one value tile against the former, twice each (not
        # with --lean: the comparison is settled, run 20).
        if "state_mt1_ilp_ms" in tr[0]:
            table(["shape", "state mt1 former ms (twice)", "state mt1 ILP ms (twice)",
                   "whole fwd mt1 former ms (twice)", "whole fwd mt1 ILP ms (twice)"],
                  [[r["shape"], ms(r, "state_mt1_ms", "state_mt1_2_ms"),
                    ms(r, "state_mt1_ilp_ms", "state_mt1_ilp_2_ms"), ms(r, "fwd_mt1_ms", "fwd_mt1_2_ms"),
                    ms(r, "fwd_mt1_ilp_ms", "fwd_mt1_ilp_2_ms")] for r in tr])
        # Where QED's extra time goes: each pass alone, GDN-2 and QED (full, lambda = 1).
        table(["shape", "prep gdn2 ms", "prep qed ms", "state gdn2 ms", "state qed ms"],
              [[r["shape"], ms(r, "gdn2_prep_ms"), ms(r, "qed_prep_ms"), ms(r, "gdn2_state_ms"), ms(r, "qed_state_ms")]
               for r in tr])
    if res.get("bwdtiming"):
        # Whole forward + backward against the peer's, then our two halves alone (no peer column:
        # the peer's time is only comparable with a whole step).
        # "saved": the training pair (chunked_forward_saving, then the backward without its
        # recompute); "recompute": chunked_forward, then the backward that recomputes.
        table(["shape", "ours saved ms", "ours qed saved ms", "qed/gdn2", "ours recompute ms",
               "ours qed recompute ms", "peer fwd+bwd ms", "peer/ours saved", "peer/ours recompute", "workspace GB"],
              [[r["shape"], f"{r['ours_fwdbwd_saved_ms']:.3f}", f"{r['ours_qed_fwdbwd_saved_ms']:.3f}",
                f"{r['qed_over_gdn2_saved']:.3f}", f"{r['ours_fwdbwd_ms']:.3f}", f"{r['ours_qed_fwdbwd_ms']:.3f}",
                f"{r.get('peer_fwdbwd_ms', nan):.3f}", f"{r.get('peer_over_ours_saved', nan):.2f}x",
                f"{r.get('peer_over_ours', nan):.2f}x", f"{r['ws_gb']:.2f}"]
               for r in res["bwdtiming"]])
        table(["shape", "ours fwd ms", "ours bwd ms", "bwd, gradient pass on 16 warps ms", "bwd, former pipeline (v1) ms"],
              [[r["shape"], f"{r['ours_fwd_ms']:.3f}", f"{r['ours_bwd_ms']:.3f}", f"{r['ours_bwd_w16_ms']:.3f}",
                f"{r['ours_bwd_v1_ms']:.3f}"]
               for r in res["bwdtiming"]])
        table(["QED training pair, shape", "partials held ms (default)", "partials stored and read back ms"],
              [[r["shape"], f"{r['ours_qed_fwdbwd_saved_ms']:.3f}", f"{r.get('ours_qed_fwdbwd_saved_nohold_ms', nan):.3f}"]
               for r in res["bwdtiming"]])
    if res.get("bwdpeer"):
        table(["regime (gdn2, T=512, K=V=128, bf16)", "gradient", "ours relF", "ours, former pipeline (v1) relF",
               "peer relF", "peer / ours"],
              [[r["regime"], r["grad"], f"{r['ours']:.2e}", f"{r['ours_v1']:.2e}", f"{r['peer']:.2e}",
                f"{r['peer'] / max(r['ours'], 1e-30):.0f}x"] for r in res["bwdpeer"]])
    if res.get("bwdphases"):
        table(["backward cut after pass ([8,4096,16,128] bf16)", "cumulative ms", "pass ms"],
              [[f"{r['pass']} {r['name']}", f"{r['cum_ms']:.3f}", f"{r['pass_ms']:.3f}"] for r in res["bwdphases"]])
    with open(os.path.join(args.out, "chunked_forward.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    for l in lines:
        log(l)


if __name__ == "__main__":
    main()
