#!/usr/bin/env python3
"""One case of bench/ab.sh as a markdown table: per size, the time (us) of
A and B (the better of their two runs each, out of place and in place:
interference on a shared machine only ever adds time) and
B's speed relative to A (A time / B time: above 1 is faster), with the
noise of the case: how far A's two runs differ (A1 time / A2 time)."""
import csv
import sys


def rows(path):
    with open(path) as f:
        return {int(r["size_bytes"]): r for r in csv.DictReader(f)}


def main():
    out, case = sys.argv[1], sys.argv[2]
    runs = {t: rows(f"{out}/{case}-{t}.csv") for t in ("a1", "b1", "a2", "b2")}
    print(f"\n### {case}\n")
    print("| size | A oop us | B oop us | B speed | A noise | A ip us | B ip us | B speed | A noise |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size in sorted(runs["a1"]):
        cells = [str(size)]
        for side in ("oop", "ip"):
            t = {k: float(runs[k][size][f"{side}_time_us"]) for k in runs}
            a = min(t["a1"], t["a2"])
            bb = min(t["b1"], t["b2"])
            cells += [f"{a:.2f}", f"{bb:.2f}", f"{a / bb:.2f}", f"{t['a1'] / t['a2']:.2f}"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
