#!/usr/bin/env python3
"""Draws the rows sweep of geist and llama.cpp on one SVG: milliseconds per call and per row
against the row count n of one prefill call.

Inputs: the JSON of `geist bench rows --json FILE` (schema geist-bench/1) and the JSON of
`llama-bench -p N1,N2,... -n 0 -o json` run on the same GGUF in the same device session.
Each n is drawn at the fastest of its repetitions for both engines (geist's own `ms_per_call`
policy: interference only adds time; llama-bench's first repetition carries its graph
capture). No dependencies beyond the standard library.

    bench/plot_rows.py --geist rows.json --llama llama.json -o rows.svg --title "..."
"""
import argparse
import json
import math
import os
import sys


def geist_points(path):
    with open(path) as f:
        d = json.load(f)
    if d.get("command") != "rows":
        raise SystemExit(f"{path}: not a geist bench rows document")
    pts = {}
    for p in d["results"]["points"]:
        pts[int(p["n"])] = (min(p["samples_ms"]), bool(p.get("flagged")))
    return pts


def llama_points(path):
    with open(path) as f:
        d = json.load(f)
    pts = {}
    for r in d:
        if int(r.get("n_gen", 0)) != 0 or int(r.get("n_prompt", 0)) <= 0:
            continue
        pts[int(r["n_prompt"])] = (min(r["samples_ns"]) / 1e6, False)
    return pts


def svg(series, title, out):
    W, H, L, R, T, B = 900, 560, 70, 170, 50, 60
    ns = sorted({n for _, pts, _ in series for n in pts})
    if not ns:
        raise SystemExit("no points")
    xmax = max(ns)
    ymax = max(ms / n for _, pts, _ in series for n, (ms, _) in pts.items())
    ymax = 10 ** math.ceil(math.log10(ymax))  # ms per row, log scale from ymax / 1000
    ymin = ymax / 1000

    def x(n):
        return L + (W - L - R) * math.log2(n) / math.log2(xmax)

    def y(v):
        v = max(v, ymin)
        return T + (H - T - B) * (1 - (math.log10(v) - math.log10(ymin)) / 3)

    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{W / 2}" y="24" text-anchor="middle" font-size="14">{title}</text>']
    for k in range(4):
        v = ymin * 10 ** k
        o.append(f'<line x1="{L}" x2="{W - R}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
        o.append(f'<text x="{L - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
    n = 1
    while n <= xmax:
        o.append(f'<line x1="{x(n):.1f}" x2="{x(n):.1f}" y1="{T}" y2="{H - B}" stroke="#eee"/>')
        o.append(f'<text x="{x(n):.1f}" y="{H - B + 16}" text-anchor="middle">{n}</text>')
        n *= 2
    o.append(f'<text x="{(L + W - R) / 2}" y="{H - 18}" text-anchor="middle">rows in one prefill call (n)</text>')
    o.append(f'<text x="18" y="{(T + H - B) / 2}" transform="rotate(-90 18 {(T + H - B) / 2})" '
             f'text-anchor="middle">ms per row (log)</text>')
    for i, (name, pts, color) in enumerate(series):
        keys = sorted(pts)
        path = " ".join(f"{'M' if j == 0 else 'L'}{x(n):.1f},{y(pts[n][0] / n):.1f}" for j, n in enumerate(keys))
        o.append(f'<path d="{path}" fill="none" stroke="{color}" stroke-width="1.5"/>')
        for n in keys:
            ms, flagged = pts[n]
            fill = "red" if flagged else color
            o.append(f'<circle cx="{x(n):.1f}" cy="{y(ms / n):.1f}" r="3" fill="{fill}">'
                     f'<title>{name}: n={n}, {ms:.2f} ms per call, {ms / n:.3f} ms per row</title></circle>')
        ly = T + 20 * i
        o.append(f'<line x1="{W - R + 15}" x2="{W - R + 40}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"/>')
        o.append(f'<text x="{W - R + 45}" y="{ly + 4}">{name}</text>')
    o.append(f'<circle cx="{W - R + 27}" cy="{T + 20 * len(series)}" r="3" fill="red"/>')
    o.append(f'<text x="{W - R + 45}" y="{T + 20 * len(series) + 4}">above the line (geist)</text>')
    o.append("</svg>")
    # Only a new file or an SVG this script drew before is (re)written.
    if os.path.lexists(out):
        if not os.path.isfile(out) or os.path.islink(out):
            raise SystemExit(f"{out}: not a regular file; not written")
        with open(out, "rb") as f:
            if not f.read(200).startswith(b'<svg xmlns="http://www.w3.org/2000/svg"'):
                raise SystemExit(f"{out}: exists and is not an SVG drawn by this script; not overwritten")
    with open(out, "w") as f:
        f.write("\n".join(o) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--geist", required=True, help="geist bench rows --json output")
    ap.add_argument("--llama", required=True, help="llama-bench -o json output (-n 0, a list of -p)")
    ap.add_argument("-o", "--output", required=True, help="SVG file to write")
    ap.add_argument("--title", default="prefill cost per row, one call of n rows")
    a = ap.parse_args()
    svg([("geist", geist_points(a.geist), "#1f77b4"), ("llama.cpp", llama_points(a.llama), "#ff7f0e")], a.title,
        a.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
