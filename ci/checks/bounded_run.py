#!/usr/bin/python3
"""Runs a command and checks its exit status, a substring of its stderr, its wall time and the
peak resident memory of its whole process tree (getrusage RUSAGE_CHILDREN: the largest peak of
any descendant that was waited for). Exit 0 when every check holds, 1 otherwise, with one line
per failed check. Used by ctest for resource regressions (properties/fuzz.cmake)."""
import argparse
import resource
import subprocess
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-rss-mb", type=float, required=True)
    ap.add_argument("--max-seconds", type=float, required=True)
    ap.add_argument("--expect-exit", type=int, required=True)
    ap.add_argument("--expect-stderr", default="")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        print("bounded_run: no command given", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=10 * a.max_seconds)
    except subprocess.TimeoutExpired:
        print(f"FAIL: still running after {10 * a.max_seconds:.0f} s: {' '.join(cmd)}")
        return 1
    wall = time.monotonic() - t0
    rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
    print(f"exit {p.returncode}, {wall:.2f} s, peak RSS {rss_mb:.1f} MB; stderr: {p.stderr.strip()}")
    bad = []
    if p.returncode != a.expect_exit:
        bad.append(f"exit {p.returncode}, expected {a.expect_exit}")
    if a.expect_stderr not in p.stderr:
        bad.append(f"stderr lacks {a.expect_stderr!r}")
    if wall > a.max_seconds:
        bad.append(f"took {wall:.2f} s, limit {a.max_seconds} s")
    if rss_mb > a.max_rss_mb:
        bad.append(f"peak RSS {rss_mb:.1f} MB, limit {a.max_rss_mb} MB")
    for b in bad:
        print("FAIL:", b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
