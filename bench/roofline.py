#!/usr/bin/env python3
"""Where a chunked forward stands against the machine's ceilings: its model FLOPs (MATH.md §4,
each product counted once, as dense tiles) and its byte floor (every input read once, o written
once), and from a measured time the achieved TFLOP/s and effective bandwidth.

Model FLOPs of one chunk of n tokens and one head (K keys, V values; a multiply-add is 2):
  T (the UT system, n x n over K)            2 n^2 K
  M (the intra-chunk attention, n x n over K) 2 n^2 K
  L = (I + T)^-1 (unit lower triangular)      2 n^3 / 3
  W_a = L A~, W_z = L Z                       2 n^2 K + 2 n^2 V
  U = W_z - W_a S                             2 n K V
  O = Q~ S + M U                              2 n K V + 2 n^2 V
  S' = diag(gamma) S + K^T U                  2 n K V
QED's erase vector (a prologue of dot products and scalings per token) is not counted.
Byte floor (bf16): q, k, g, b read (4 K per token and head), v, w read and o written (3 V).

  python3 bench/roofline.py --shape 8,4096,16,128,128 --ms 1.691 [--tflops 675 --tbs 4.27]
"""
import argparse
import sys


def chunk_flops(n, K, V):
    return 6 * n * n * K + 4 * n * n * V + 6 * n * K * V + 2 * n ** 3 / 3


def forward_flops(B, T, H, K, V, C=64):
    """Model FLOPs of the chunked forward over B sequences of length T (the last chunk of each
    partial when C does not divide T) and H heads."""
    full, rest = divmod(T, C)
    per_seq = full * chunk_flops(C, K, V) + (chunk_flops(rest, K, V) if rest else 0)
    return B * H * per_seq


def forward_floor_bytes(B, T, H, K, V, elem=2):
    return B * T * H * (4 * K + 3 * V) * elem


def self_test():
    """The counts against sums done by hand (CTest roofline_counts): one chunk at C = 64,
    K = V = 128 is 3145728 (T, M, W_a) + 2097152 (W_z, M U) + 6291456 (U, Q~ S, K^T U) + 174762.67
    (L) FLOPs; a partial last chunk counts as its own length; B and H scale linearly."""
    one = 6 * 64 * 64 * 128 + 4 * 64 * 64 * 128 + 6 * 64 * 128 * 128 + 2 * 64 ** 3 / 3
    checks = [
        (chunk_flops(64, 128, 128), 3145728 + 2097152 + 6291456 + 174762.0 + 2.0 / 3, "one chunk"),
        (chunk_flops(64, 128, 128), one, "one chunk, by terms"),
        (forward_flops(1, 65, 1, 128, 64), chunk_flops(64, 128, 64) + chunk_flops(1, 128, 64), "T = 65"),
        (forward_flops(8, 4096, 16, 128, 128), 8 * 16 * 64 * one, "[8,4096,16,128]"),
        (forward_floor_bytes(8, 4096, 16, 128, 128), 939524096, "floor bytes"),
    ]
    bad = [f"{what}: {got!r} != {want!r}" for got, want, what in checks if abs(got - want) > 1e-6 * abs(want)]
    for b in bad:
        print("roofline self-test:", b, file=sys.stderr)
    print("roofline self-test:", "FAIL" if bad else f"ok ({len(checks)} checks)")
    return 1 if bad else 0


def main(argv=None):
    if argv is None:
        argv = sys.argv[1:]
    if argv == ["--self-test"]:
        return self_test()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, help="B,T,H,K,V (or --self-test alone)")
    ap.add_argument("--ms", type=float, required=True, help="measured time of the forward, ms")
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--tflops", type=float, help="a measured bf16 matmul ceiling, TFLOP/s")
    ap.add_argument("--tbs", type=float, help="a measured copy bandwidth, TB/s (read + write)")
    a = ap.parse_args(argv)
    try:
        B, T, H, K, V = (int(x) for x in a.shape.split(","))
    except ValueError:
        ap.error(f"--shape {a.shape!r}: expected five integers B,T,H,K,V")
    if min(B, T, H, K, V) < 1 or a.ms <= 0 or a.chunk < 1:
        ap.error("shape entries, --chunk and --ms must be positive")
    f = forward_flops(B, T, H, K, V, a.chunk)
    by = forward_floor_bytes(B, T, H, K, V)
    tf = f / (a.ms * 1e-3) / 1e12
    tb = by / (a.ms * 1e-3) / 1e12
    line = f"model {f / 1e9:.2f} GFLOP, {tf:.1f} TFLOP/s"
    if a.tflops:
        line += f" ({100 * tf / a.tflops:.1f}% of {a.tflops:g})"
    line += f"; floor {by / 1e9:.3f} GB, {tb:.3f} TB/s effective"
    if a.tbs:
        line += f" ({100 * tb / a.tbs:.1f}% of {a.tbs:g})"
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
