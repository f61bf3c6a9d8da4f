#!/usr/bin/env python3
"""One case of bench/ab.sh as a markdown table: per size, the time (us) of
A and B (the best of their turns each, out of place and in place:
interference on a shared machine only ever adds time), B's speed relative
to A (A time / B time: above 1 is faster), and the noise of the case: the
spread of A's own turns (slowest A / fastest A). A size is marked "slower"
where B's best is slower than A's best by more than that spread, and by
more than 5%. A side that has no time (an all-to-all has no in place)
shows "-".

    ab_summary.py OUT_DIR CASE [TURNS]
"""

import csv
import sys


def rows(path):
    with open(path) as f:
        return {int(r["size_bytes"]): r for r in csv.DictReader(f)}


def main():
    out, case = sys.argv[1], sys.argv[2]
    turns = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    names = [f"{s}{i}" for i in range(1, turns + 1) for s in "ab"]
    runs = {t: rows(f"{out}/{case}-{t}.csv") for t in names}
    print(f"\n### {case}\n")
    print("| size | A oop us | B oop us | B speed | A noise | A ip us | B ip us | B speed | A noise |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    slower = []
    for size in sorted(runs["a1"]):
        cells = [str(size)]
        for side in ("oop", "ip"):
            got = {k: runs[k][size][f"{side}_time_us"] for k in runs}
            if not all(got.values()):
                cells += ["-"] * 4
                continue
            t = {k: float(v) for k, v in got.items()}
            a = [t[k] for k in names if k[0] == "a"]
            b = [t[k] for k in names if k[0] == "b"]
            speed = min(a) / min(b)
            noise = max(a) / min(a)
            mark = ""
            if speed < min(1 / noise, 0.95):
                mark = " slower"
                slower.append(f"{size} {side}")
            cells += [f"{min(a):.2f}", f"{min(b):.2f}", f"{speed:.2f}{mark}", f"{noise:.2f}"]
        print("| " + " | ".join(cells) + " |")
    print(f"\n{case}: B slower than A beyond A's noise at: {', '.join(slower) or 'no size'}")


if __name__ == "__main__":
    main()
