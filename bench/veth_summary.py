#!/usr/bin/env python3
"""Summary of bench/veth.sh's rows (stdlib only), as markdown tables.

usage: veth_summary.py ROWS_TXT

ROWS_TXT lines, as veth.sh writes them:
  line RATE uni|bidir before|after FWD_GBITS REV_GBITS   (iperf3, per direction)
  PEER RATE RANKS ROUND BYTES TIME_US BUSBW_GBS          (PEER: ferroccl | ferroccl-d1 | ferroccl-base | ompi)
busbw is recomputed from the time (allreduce: bytes / time * 2(n-1)/n).
Each cell is the median over the rounds, with the range when there are
several. The line rate a collective is held against is iperf3's
both-directions rate (the slower direction, median of before and after),
since a ring allreduce sends both ways at once; busbw is in GB/s (1e9 B/s),
the line rate converted from Gb/s.
"""

import statistics
import sys
from collections import defaultdict

TARGET_BYTES = 64 << 20


def size(b):
    for unit, s in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << s and b % (1 << s) == 0:
            return f"{b >> s} {unit}"
    return f"{b} B"


def cell(values, fmt):
    if not values:
        return "-"
    m = statistics.median(values)
    if len(values) == 1:
        return fmt % m
    return (fmt % m) + " (" + (fmt % min(values)) + "-" + (fmt % max(values)) + ")"


def main(path):
    lines = defaultdict(list)  # (rate, mode) -> [per-direction Gb/s]
    rows = defaultdict(lambda: defaultdict(list))  # (rate, n) -> (peer, bytes) -> [(t, bw)]
    order = []
    for raw in open(path):
        c = raw.split()
        if not c:
            continue
        if c[0] == "line":
            rate, mode = c[1], c[2]
            fwd, rev = float(c[4]), float(c[5])
            lines[(rate, mode)].append(min(fwd, rev) if mode == "bidir" else fwd)
            if rate not in order:
                order.append(rate)
            continue
        peer, rate, n, _round, b, t, _bw = c
        n, b, t = int(n), int(b), float(t)
        # busbw from the time (ferroccl-perf prints it to 2 decimals only):
        # nccl-tests' allreduce busbw = bytes / time * 2(n-1)/n.
        rows[(rate, n)][(peer, b)].append((t, b / (t * 1e3) * 2 * (n - 1) / n))

    print("### Raw line rate (iperf3, one TCP stream, Gb/s per direction; before, after)\n")
    print("| tc rate | one direction | both directions at once (slower one) |")
    print("|---|---|---|")
    for rate in order:
        uni = ", ".join(f"{v:.2f}" for v in lines[(rate, "uni")])
        bi = ", ".join(f"{v:.2f}" for v in lines[(rate, "bidir")])
        print(f"| {rate} | {uni} | {bi} |")
    print()

    verdicts = []
    for rate, n in sorted(rows, key=lambda k: (order.index(k[0]) if k[0] in order else 99, k[1])):
        cells = rows[(rate, n)]
        line_bi = lines.get((rate, "bidir"))
        line_uni = lines.get((rate, "uni"))
        uni_gbs = statistics.median(line_uni) / 8 if line_uni else float("nan")
        line_gbs = statistics.median(line_bi) / 8 if line_bi else None
        sizes = sorted({b for (_, b) in cells})
        print(
            f"### {rate}, {n} ranks (line rate {line_gbs * 8:.2f} Gb/s = {line_gbs:.3f} GB/s per direction)\n"
            if line_gbs
            else f"### {rate}, {n} ranks\n"
        )
        # Other ferroccl runs interleaved with the default one: depth 1
        # (VETH_LOCKSTEP) and another build (VETH_BASELINE), a column each
        # with the default's gain over it.
        others = sorted({p for (p, _) in cells if p.startswith("ferroccl-")})
        labels = {
            "ferroccl-d1": ("ferroccl depth 1", "pipelined gain"),
            "ferroccl-base": ("ferroccl baseline", "gain over baseline"),
        }
        head = "".join(" {} us | {} |".format(*labels.get(o, (o, "gain"))) for o in others)
        print(
            "| bytes | ferroccl us | Open MPI us | ferroccl busbw GB/s | Open MPI busbw GB/s "
            "| ferroccl % line | Open MPI % line |" + head
        )
        print("|---|---|---|---|---|---|---|" + "---|---|" * len(others))
        for b in sizes:
            f = cells.get(("ferroccl", b), [])
            m = cells.get(("ompi", b), [])
            ft, fb = [x[0] for x in f], [x[1] for x in f]
            mt, mb = [x[0] for x in m], [x[1] for x in m]
            fp = mp = "-"
            if line_gbs and b >= 65536:
                fp = "%.0f" % (100 * statistics.median(fb) / line_gbs) if fb else "-"
                mp = "%.0f" % (100 * statistics.median(mb) / line_gbs) if mb else "-"
            extra = ""
            for o in others:
                d = [x[0] for x in cells.get((o, b), [])]
                gain = "%.2fx" % (statistics.median(d) / statistics.median(ft)) if d and ft else "-"
                extra += f" {cell(d, '%.1f')} | {gain} |"
            print(
                f"| {size(b)} | {cell(ft, '%.1f')} | {cell(mt, '%.1f')} | {cell(fb, '%.3f')} | "
                f"{cell(mb, '%.3f')} | {fp} | {mp} |" + extra
            )
        print()
        f64 = [x[1] for x in cells.get(("ferroccl", TARGET_BYTES), [])]
        m64 = [x[1] for x in cells.get(("ompi", TARGET_BYTES), [])]
        if line_gbs and f64:
            fr = statistics.median(f64) / line_gbs
            mr = statistics.median(m64) / line_gbs if m64 else float("nan")
            verdicts.append(
                f"| {rate} | {n} | {line_gbs:.3f} | {statistics.median(f64):.3f} ({100 * fr:.0f}%) | "
                f"{statistics.median(m64) if m64 else float('nan'):.3f} ({100 * mr:.0f}%) | "
                f"{100 * statistics.median(f64) / uni_gbs:.0f}% | {'met' if fr >= 0.8 else 'not met'} |"
            )
    if verdicts:
        print("### busbw at 64 MiB against the line rate (target: ferroccl >= 80%)\n")
        print(
            "| tc rate | ranks | line GB/s (both ways) | ferroccl GB/s (% of it) | Open MPI GB/s (% of it) "
            "| ferroccl % of one-way rate | target |"
        )
        print("|---|---|---|---|---|---|---|")
        print("\n".join(verdicts))
        print()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
