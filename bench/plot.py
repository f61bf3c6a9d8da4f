#!/usr/bin/env python3
"""Draw busbw against message size for ferroccl and its peers as an SVG.

usage: plot.py OUT.svg TITLE SUMMARY.csv [LABEL:SUMMARY.csv ...]

Each SUMMARY.csv is what `bench/compare.sh` writes with COMPARE_CSV=FILE
(columns bytes, ferroccl, ferroccl_ip, mpi_shm, mpi_tcp, gloo, ...). With
several files (e.g. 2 and 4 ranks), give each a label: "2 ranks:a.csv".
Standard library only, so it runs anywhere the benchmarks run.
"""

import csv
import math
import sys

SERIES = [
    ("ferroccl", "ferroccl", "#d62728"),
    ("ferroccl_win", "ferroccl windows", "#ff7f0e"),
    ("mpi_shm", "Open MPI shm", "#1f77b4"),
    ("mpi_tcp", "Open MPI TCP", "#2ca02c"),
    ("gloo", "Gloo", "#9467bd"),
]
DASHES = ["", "6,4", "2,3", "8,3,2,3"]
W, H = 860, 520
L, R, T, B = 70, 200, 50, 60


def read(path):
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f):
            rows.append(r)
    return rows


def human(n):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div:
            return f"{n // div}{unit}"
    return str(n)


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    out, title, specs = argv[0], argv[1], argv[2:]
    groups = []
    for i, spec in enumerate(specs):
        label, _, path = spec.rpartition(":") if ":" in spec else ("", "", spec)
        groups.append((label, read(path), DASHES[i % len(DASHES)]))
    points = []
    for label, rows, dash in groups:
        for key, name, color in SERIES:
            pts = [(int(r["bytes"]), float(r[key])) for r in rows if r.get(key) not in (None, "")]
            pts = [(x, y) for x, y in pts if y > 0]
            if pts:
                points.append((f"{name} {label}".strip(), color, dash, pts))
    if not points:
        sys.exit("plot.py: no data")
    xs = [x for _, _, _, p in points for x, _ in p]
    ymax = max(y for _, _, _, p in points for _, y in p) * 1.1
    lx0, lx1 = math.log2(min(xs)), math.log2(max(xs))

    def sx(x):
        return L + (math.log2(x) - lx0) / max(lx1 - lx0, 1) * (W - L - R)

    def sy(y):
        return H - B - y / ymax * (H - T - B)

    svg = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{W}" height="{H}" fill="white"/>',
        f'<text x="{W / 2}" y="25" text-anchor="middle" font-size="15">{title}</text>',
    ]
    # Axes and grid.
    step = 10 ** math.floor(math.log10(ymax / 5)) if ymax > 0 else 1
    for m in (1, 2, 5):
        if ymax / (step * m) <= 8:
            step *= m
            break
    y = 0.0
    while y <= ymax:
        svg.append(f'<line x1="{L}" x2="{W - R}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" stroke="#ddd"/>')
        svg.append(f'<text x="{L - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{y:g}</text>')
        y += step
    x = 2 ** math.ceil(lx0)
    while x <= 2**lx1:
        svg.append(f'<line x1="{sx(x):.1f}" x2="{sx(x):.1f}" y1="{T}" y2="{H - B}" stroke="#eee"/>')
        svg.append(f'<text x="{sx(x):.1f}" y="{H - B + 16}" text-anchor="middle">{human(x)}</text>')
        x *= 4
    svg.append(f'<line x1="{L}" x2="{W - R}" y1="{H - B}" y2="{H - B}" stroke="black"/>')
    svg.append(f'<line x1="{L}" x2="{L}" y1="{T}" y2="{H - B}" stroke="black"/>')
    svg.append(f'<text x="{(L + W - R) / 2}" y="{H - 15}" text-anchor="middle">message size (bytes)</text>')
    svg.append(
        f'<text x="18" y="{(T + H - B) / 2}" transform="rotate(-90 18 {(T + H - B) / 2})" '
        'text-anchor="middle">busbw (GB/s)</text>'
    )
    # Lines and legend.
    for i, (name, color, dash, pts) in enumerate(points):
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sorted(pts))
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        svg.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"{extra}/>')
        for x, y in pts:
            svg.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{color}"/>')
        ly = T + 10 + i * 18
        svg.append(
            f'<line x1="{W - R + 12}" x2="{W - R + 40}" y1="{ly}" y2="{ly}" '
            f'stroke="{color}" stroke-width="2"{extra}/>'
        )
        svg.append(f'<text x="{W - R + 46}" y="{ly + 4}">{name}</text>')
    svg.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
