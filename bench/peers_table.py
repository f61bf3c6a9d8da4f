#!/usr/bin/env python3
"""Reads bench/peers.sh output; prints markdown.

bench/peers.sh allreduce 2 | bench/peers_table.py
    per size: the median over turns of each system's time per call
    (us), the best peer, and ferroccl's speed against it (the best
    peer's time over ferroccl's: above 1, ferroccl is faster), for
    ordinary buffers and for windows; with PEERS="... bound" also the
    bare program between shared buffers (bench/bound/windows.c) and the
    best peer's time over its own ("bound x": the most a call between
    windows could reach here), and where the ranks outnumber the CPUs
    "bound-procs", the same program on N processes alone, with its own
    "x" (what a library of N processes taking turns could reach);
bench/peers_table.py --summary OUT1 OUT2 ...
    one row per file (a collective on some ranks): that speed at six
    sizes, how many sizes ordinary buffers are at or above the best
    peer, the slowest ratio, and the windows' slowest ratio from 8 KiB
    (docs/performance.md's first table).
"""

import collections
import statistics
import sys

PEERS = ("openmpi", "mpich", "intelmpi", "gloo")
OURS = ("ferroccl", "ferroccl-win")
# Not peers: the bare program doing only a windows call's traffic (the
# faster of N processes and as many as the CPUs), and on N processes alone.
BOUNDS = ("bound", "bound-procs")
SHORT = {"openmpi": "OMPI", "mpich": "MPICH", "intelmpi": "IMPI", "gloo": "Gloo"}
# The summary's columns, as positions on the 8 B x 4^k ladder peers.sh runs
# (allgather and reduce-scatter round the smallest sizes up to a float a
# rank, so a position, not a size, names a column).
COLUMNS = (("8 B", 0), ("512 B", 3), ("8 KiB", 5), ("128 KiB", 7), ("2 MiB", 9), ("32 MiB", 11))


def parse(lines, machine=None):
    """{size: {system: [times]}} and the header's words; the machine lines
    (bench/bound/pingpong.c, one a turn) go to `machine` where given."""
    times = collections.defaultdict(lambda: collections.defaultdict(list))
    system, header = None, []
    for line in lines:
        line = line.strip()
        if line.startswith("# machine:") and machine is not None:
            machine.append(line[len("# machine:") :].strip())
        elif line.startswith("# peers.sh"):
            header = line[2:].split()
        elif line.startswith("## "):
            system = line[3:]
        elif line and not line.startswith("#") and system:
            fields = line.split()
            times[int(float(fields[0]))][system].append(float(fields[1]))
    return times, header


def rows(times):
    """Per size: (size, medians, best peer, speed ordinary, speed windows)."""
    present = [p for p in PEERS if any(p in row for row in times.values())]
    out = []
    for size in sorted(times):
        med = {k: statistics.median(v) for k, v in times[size].items()}
        peers = {k: med[k] for k in present if k in med}
        best = min(peers, key=peers.get) if peers else None
        speed = [peers[best] / med[k] if best and med.get(k, 0) > 0 else None for k in OURS]
        out.append((size, med, best, speed[0], speed[1]))
    return present, out


def table(lines):
    machine = []
    times, header = parse(lines, machine)
    present, out = rows(times)
    if header:
        print(f"`{' '.join(header)}`\n")
    for m in machine:
        print(f"- machine: {m}")
    if machine:
        print()
    bounds = [b for b in BOUNDS if any(b in row for row in times.values())]
    names = present + list(OURS) + bounds
    extra = "".join(f" {b} x |" for b in bounds)
    print("| size | " + " | ".join(names) + " | best peer | x | windows x |" + extra)
    print("|---:|" + "---:|" * (len(names) + 3 + len(bounds)))
    for size, med, best, x, xw in out:
        cells = [f"{med[k]:.2f}" if k in med else "-" for k in names]
        cells.append(best or "-")
        cells += [f"{v:.2f}" if v else "-" for v in (x, xw)]
        for b in bounds:
            mb = med.get(b, 0)
            cells.append(f"{med[best] / mb:.2f}" if best and mb > 0 else "-")
        print(f"| {size} | " + " | ".join(cells) + " |")


def summary(paths):
    cols = " | ".join(name for name, _ in COLUMNS)
    print(f"| call | ranks | {cols} | at or above | slowest | windows from 8 KiB |")
    print("|---|---:|" + "---:|" * (len(COLUMNS) + 3))
    for path in paths:
        with open(path) as f:
            times, header = parse(f)
        _, out = rows(times)
        op, ranks = (header[1], header[2]) if len(header) > 2 else (path, "?")
        cells = []
        for _, at in COLUMNS:
            if at < len(out) and out[at][3]:
                cells.append(f"{out[at][3]:.2f} ({SHORT.get(out[at][2], out[at][2])})")
            else:
                cells.append("-")
        speeds = [(r[3], r[0]) for r in out if r[3]]
        ahead = sum(1 for v, _ in speeds if v >= 1.0)
        worst = min(speeds) if speeds else None
        win = [r[4] for r in out if r[4] and r[0] >= 8192]
        cells.append(f"{ahead} of {len(speeds)}")
        cells.append(f"{worst[0]:.2f} at {worst[1]} B" if worst else "-")
        cells.append(f"{min(win):.2f}" if win else "-")
        print(f"| {op} | {ranks} | " + " | ".join(cells) + " |")


def main():
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        print(__doc__)
    elif len(sys.argv) > 1 and sys.argv[1] == "--summary":
        summary(sys.argv[2:])
    else:
        table(sys.stdin)


if __name__ == "__main__":
    main()
