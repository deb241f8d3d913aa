#!/usr/bin/env python3
"""Draws the rows sweep of geist and llama.cpp on one SVG: milliseconds per call and per row
against the row count n of one prefill call.

Inputs: the JSON of `geist bench rows --json FILE` (schema geist-bench/1) and the JSON of
`llama-bench -p N1,N2,... -n 0 -o json` run on the same GGUF in the same device session.
Each n is drawn at the fastest of its repetitions for both engines (geist's own `ms_per_call`
policy: interference only adds time; llama-bench's first repetition carries its graph
capture). No dependencies beyond the standard library.

    bench/plot_rows.py --geist rows.json --llama llama.json -o rows.svg --title "..."
    bench/plot_rows.py --geist rows.json --llama llama.json --table [--align 16] [--threshold 0.05]

--table prints, instead of drawing, a markdown table of both engines' ms per call at every n
that both measured, each with its excess over the line through its aligned neighbours (the
rule of `geist bench rows`: the nearest multiples of --align below and above n, 1 standing
for 0; both engines must have measured both), and how many n each engine has above the
threshold.
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


def aligned_neighbours(n, align):
    """bench_stats.cpp's aligned_neighbours: (lo, hi), lo None for n = 1."""
    hi = (n // align + 1) * align
    lo = max(1, (n - 1) // align * align) if n > 1 else None
    return lo, hi


def excesses(pts, align):
    """n -> ms / line - 1 against the line through n's aligned neighbours, where both were measured."""
    out = {}
    for n, (ms, _) in pts.items():
        lo, hi = aligned_neighbours(n, align)
        if lo is None or lo not in pts or hi not in pts:
            continue
        tl, th = pts[lo][0], pts[hi][0]
        line = tl + (th - tl) * (n - lo) / (hi - lo)
        if line > 0:
            out[n] = ms / line - 1
    return out


def table(series, align, threshold):
    """Markdown: n, then per engine ms per call and excess (flagged ones in bold)."""
    ns = sorted(set.intersection(*(set(pts) for _, pts, _ in series)))
    # Each engine's line through the counts both measured, so both are tested at the same n.
    ex = [excesses({n: pts[n] for n in ns}, align) for _, pts, _ in series]
    head = ["rows"] + [h for name, _, _ in series for h in (f"{name} ms", f"{name} over line")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    flagged = [0] * len(series)
    tested = [0] * len(series)
    for n in ns:
        cells = [str(n)]
        for i, (_, pts, _) in enumerate(series):
            cells.append(f"{pts[n][0]:.2f}")
            e = ex[i].get(n)
            if e is None:
                cells.append("")
                continue
            tested[i] += 1
            mark = e > threshold
            flagged[i] += mark
            cells.append(f"**{100 * e:+.1f} %**" if mark else f"{100 * e:+.1f} %")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for i, (name, _, _) in enumerate(series):
        lines.append(f"{name}: {flagged[i]} of {tested[i]} tested counts more than {100 * threshold:g} % above "
                     f"the line (align {align})")
    return "\n".join(lines)


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
    ap.add_argument("-o", "--output", help="SVG file to write")
    ap.add_argument("--table", action="store_true", help="print a markdown table of both curves' excesses instead")
    ap.add_argument("--align", type=int, default=16, help="--table: row multiple of the aligned neighbours")
    ap.add_argument("--threshold", type=float, default=0.05, help="--table: flag above this fraction")
    ap.add_argument("--title", default="prefill cost per row, one call of n rows")
    a = ap.parse_args()
    series = [("geist", geist_points(a.geist), "#1f77b4"), ("llama.cpp", llama_points(a.llama), "#ff7f0e")]
    if a.table:
        if a.align < 1:
            raise SystemExit("--align must be at least 1")
        print(table(series, a.align, a.threshold))
        return 0
    if not a.output:
        raise SystemExit("-o FILE is needed (or --table)")
    svg(series, a.title, a.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
