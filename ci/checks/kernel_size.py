#!/usr/bin/python3
"""Checks the code size of CUDA kernels in compiled objects, here on the CPU machine: reads each
object's .nv_fatbin section, finds the CUDA ELF images in it (e_machine 190), and takes the size of
each `.text.<kernel>` section whose name matches PATTERN. Exit 0 when at least one kernel matches
and every match is at most --max-bytes, 1 otherwise (one line per kernel either way), 2 on bad input.
Why: a kernel that runs one block per multiprocessor and outgrows the instruction caches stalls
on instruction fetch (reports/device/chunked.md runs 15-16: at 259 KB the gradient pass ran 18%
slower than the same kernel without the early loads, 228 KB). Used by ctest
(properties/kernel_size.cmake).
  kernel_size.py --pattern REGEX --max-bytes N OBJECT.o [OBJECT.o ...]
(an argument may list several objects separated by commas, as CMake's $<JOIN:...,\,> writes them;
objects without a .nv_fatbin section are skipped)"""
import argparse
import re
import struct
import sys

EM_CUDA = 190


def sections(img, where):
    """[(name, offset, size)] of the ELF64 image `img`; raises ValueError naming `where`."""
    if len(img) < 64 or img[:4] != b"\x7fELF" or img[4] != 2:
        raise ValueError(f"{where}: not an ELF64 image")
    shoff, = struct.unpack_from("<Q", img, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", img, 0x3A)
    if shentsize != 64 or shoff + shnum * 64 > len(img) or shstrndx >= shnum:
        raise ValueError(f"{where}: section table out of bounds")
    hdr = [struct.unpack_from("<IIQQQQ", img, shoff + i * 64) for i in range(shnum)]
    stro, strs = hdr[shstrndx][4], hdr[shstrndx][5]
    out = []
    for name_i, _type, _flags, _addr, off, size in hdr:
        end = img.find(b"\0", stro + name_i, stro + strs)
        out.append((img[stro + name_i:end].decode("ascii", "replace"), off, size))
    return out


def cuda_images(fatbin):
    """The CUDA ELF images inside a fatbin blob (scanned for ELF headers with e_machine 190)."""
    i = fatbin.find(b"\x7fELF")
    while i >= 0:
        if len(fatbin) >= i + 64 and fatbin[i + 4] == 2:
            machine, = struct.unpack_from("<H", fatbin, i + 0x12)
            if machine == EM_CUDA:
                yield i, fatbin[i:]
        i = fatbin.find(b"\x7fELF", i + 4)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pattern", required=True, help="regex searched in the kernel's (mangled) name")
    ap.add_argument("--max-bytes", type=int, required=True)
    ap.add_argument("objects", nargs="+")
    a = ap.parse_args()
    pat = re.compile(a.pattern)
    found, bad = 0, 0
    paths = [p for arg in a.objects for p in arg.split(",") if p]
    for path in paths:
        try:
            data = open(path, "rb").read()
            fb = [(off, size) for n, off, size in sections(data, path) if n == ".nv_fatbin"]
            for off, size in fb:
                for at, img in cuda_images(data[off:off + size]):
                    for name, _o, sz in sections(img, f"{path}: CUDA image at fatbin offset {at}"):
                        if not name.startswith(".text.") or not pat.search(name):
                            continue
                        found += 1
                        ok = sz <= a.max_bytes
                        bad += not ok
                        print(f"{'ok ' if ok else 'BIG'} {sz:8d} bytes (limit {a.max_bytes})  {name[6:]}  [{path}]")
        except (OSError, ValueError, struct.error) as e:
            print(f"kernel_size: {e}", file=sys.stderr)
            return 2
    if found == 0:
        print(f"kernel_size: no kernel matching /{a.pattern}/ in {len(paths)} object(s)", file=sys.stderr)
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
