#!/usr/bin/env python3
"""Side-by-side busbw of ferroccl-perf and the peers (stdlib only).

usage: compare_summary.py FERROCCL_CSV PEERS_TXT [--windows WINDOWS_CSV] [--csv OUT]

FERROCCL_CSV is what `ferroccl-perf --csv` writes; PEERS_TXT the output of
shared/peers/run.sh: sections headed "## Open MPI, shared memory",
"## Open MPI, TCP only", "## Gloo (PyTorch)", each with rows
"bytes time_us algbw busbw". The ratio uses ferroccl's out-of-place column,
as the peers' MPI rows are out of place (Gloo's are in place, as torch's
all_reduce is); ferroccl's in-place column is shown next to it.
WINDOWS_CSV, from `ferroccl-perf -R 2` in the same session, adds the
columns ferroccl_win and ferroccl_win_ip. The CSV also carries the ratios
to Open MPI shared memory (ratio_vs_mpi_shm, and win_ratio_vs_mpi_shm).
"""

import csv
import sys

SECTIONS = {
    "Open MPI, shared memory": "mpi_shm",
    "Open MPI, TCP only": "mpi_tcp",
    "Gloo (PyTorch)": "gloo",
}


def read_peers(path):
    """{peer: {bytes: busbw}} from run.sh's output."""
    peers, current = {}, None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("## "):
                current = SECTIONS.get(line[3:].strip())
                if current:
                    peers[current] = {}
                continue
            if current is None or not line or line.startswith("#"):
                continue
            cols = line.split()
            if len(cols) == 4 and cols[0].isdigit():
                peers[current][int(cols[0])] = float(cols[3])
    return peers


def read_ferroccl(path):
    """{bytes: (out-of-place busbw, in-place busbw or None)}."""
    rows = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            ip = r["ip_busbw_gbs"]
            rows[int(r["size_bytes"])] = (float(r["oop_busbw_gbs"]), float(ip) if ip else None)
    return rows


def main(argv):
    args = list(argv)
    out_csv = windows = None
    while len(args) > 2 and args[-2] in ("--csv", "--windows"):
        if args[-2] == "--csv":
            out_csv = args[-1]
        else:
            windows = args[-1]
        args = args[:-2]
    if len(args) != 2:
        sys.exit(__doc__)
    ours = read_ferroccl(args[0])
    peers = read_peers(args[1])
    win = read_ferroccl(windows) if windows else {}

    def peer(name, size):
        return peers.get(name, {}).get(size)

    def fmt(v, width=10):
        return f"{v:>{width}.3f}" if v is not None else f"{'-':>{width}}"

    def over(a, b):
        return a / b if a is not None and b else None

    header = [
        "bytes",
        "ferroccl",
        "ferroccl_ip",
        "mpi_shm",
        "mpi_tcp",
        "gloo",
        "ratio_vs_mpi_tcp",
        "ratio_vs_mpi_shm",
    ]
    if win:
        header += ["ferroccl_win", "ferroccl_win_ip", "win_ratio_vs_mpi_shm"]
    rows = []
    for size in sorted(ours):
        oop, ip = ours[size]
        tcp, shm = peer("mpi_tcp", size), peer("mpi_shm", size)
        row = [size, oop, ip, shm, tcp, peer("gloo", size), over(oop, tcp), over(oop, shm)]
        if win:
            w_oop, w_ip = win.get(size, (None, None))
            row += [w_oop, w_ip, over(w_oop, shm)]
        rows.append(row)

    print(
        "## busbw GB/s (ferroccl: out-of-place and in-place columns; "
        "ratio = ferroccl out-of-place / Open MPI TCP)"
    )
    extra = f" {'windows':>10} {'windows-ip':>10} {'win/shm':>8}" if win else ""
    print(
        f"#{'bytes':>12} {'ferroccl':>10} {'ferroccl-ip':>11} {'OMPI shm':>10} "
        f"{'OMPI TCP':>10} {'Gloo':>10} {'ratio':>7}{extra}"
    )
    for row in rows:
        size, oop, ip, shm, tcp, gloo, ratio = row[:7]
        line = f"{size:>13} {fmt(oop)} {fmt(ip, 11)} {fmt(shm)} {fmt(tcp)} {fmt(gloo)} {fmt(ratio, 7)}"
        if win:
            line += f" {fmt(row[8])} {fmt(row[9])} {fmt(row[10], 8)}"
        print(line)
    target = [r for r in rows if r[0] >= 65536 and r[4] is not None]
    met = [r for r in target if r[1] >= r[4]]
    print(f"# target (ferroccl >= Open MPI TCP from 64 KiB): met at {len(met)} of {len(target)} sizes")
    if out_csv:
        with open(out_csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            for r in rows:
                w.writerow(["" if v is None else (f"{v:.4f}" if isinstance(v, float) else v) for v in r])


if __name__ == "__main__":
    main(sys.argv[1:])
