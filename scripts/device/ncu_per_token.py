#!/usr/bin/env python3
"""Per-token kernel costs from two Nsight Compute CSV runs (--csv --page raw) of the same
program decoding different token counts: (run B - run A) / tokens per kernel name.

Usage: ncu_per_token.py A.csv B.csv TOKENS   (scripts/device/profile.sh runs it)
       ncu_per_token.py A.csv                 (one run's totals per kernel name and grid)
"""
import csv
import re
import sys
from collections import defaultdict


def short(name: str) -> str:
    for junk in ("(anonymous namespace)::", "<unnamed>::", "unnamed>::", "geist::cuda::", "geist::quant::"):
        name = name.replace(junk, "")
    name = re.sub(r"^void ", "", name)
    depth = 0
    for i, ch in enumerate(name):  # cut the argument list: the first '(' outside template brackets
        depth += {"<": 1, ">": -1}.get(ch, 0)
        if ch == "(" and depth == 0:
            name = name[:i]
            break
    return name[:90]


def load(path: str, by_grid: bool = False):
    agg = defaultdict(lambda: [0, 0.0, 0.0])  # launches, ns, bytes
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    hdr = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if hdr is None:
        sys.exit(f"{path}: no ncu table")
    cols = rows[hdr]
    ki, ti, bi = cols.index("Kernel Name"), cols.index("gpu__time_duration.sum"), cols.index("dram__bytes_read.sum")
    gi = cols.index("Grid Size") if "Grid Size" in cols else None
    units = rows[hdr + 1]
    tscale = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "ns": 1.0, "us": 1e3, "ms": 1e6}.get(units[ti], 1.0)
    bscale = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}.get(units[bi], 1.0)
    for r in rows[hdr + 2:]:
        if len(r) != len(cols):
            continue
        a = agg[short(r[ki]) + (" grid " + r[gi] if by_grid and gi is not None else "")]
        a[0] += 1
        a[1] += float(r[ti].replace(",", "")) * tscale
        a[2] += float(r[bi].replace(",", "")) * bscale
    return agg


def main() -> None:
    if len(sys.argv) == 2:
        a, b, n = {}, load(sys.argv[1], by_grid=True), 1
    else:
        a, b, n = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3])
    out = []
    for k in set(a) | set(b):
        x, y = a.get(k, [0, 0, 0]), b.get(k, [0, 0, 0])
        d = [(y[i] - x[i]) / n for i in range(3)]
        if d[0] > 0.01:
            out.append((d[1], d[0], d[2], k))
    out.sort(reverse=True)
    tot_t = sum(o[0] for o in out)
    tot_n = sum(o[1] for o in out)
    tot_b = sum(o[2] for o in out)
    print(f"{'per token' if len(sys.argv) > 2 else 'in all'}: {tot_n:.0f} kernels, {tot_t / 1e3:.1f} us summed isolated, {tot_b / 1e6:.1f} MB read "
          f"({tot_b / max(tot_t, 1):.0f} GB/s over the sum)")
    print(f"{'kernel':90} {'n':>6} {'us':>8} {'us each':>8} {'MB/tok':>8} {'GB/s':>6}")
    for t, c, by, k in out:
        print(f"{k:90} {c:6.1f} {t / 1e3:8.1f} {t / 1e3 / c:8.2f} {by / 1e6:8.2f} {by / max(t, 1):6.0f}")


if __name__ == "__main__":
    main()
