#!/usr/bin/env python3
"""One case of bench/tuner-check.sh as a markdown table: per size, what the
tuner chose (from its `plan:` line; "inline" where the call does not go
through an algorithm at all; the route in brackets where the check-in
leads to the staging areas or a pull), its time, the fastest other variant
(a forced algorithm, or a route turned off: bench/tuner-check.sh) and its
time (out of place, the best of each variant's turns: interference only
ever adds time), the tuner's time over the best, and the noise (the
larger spread of the tuner's own turns and the best one's). "right" where
the tuner is within that noise (or 5%) of the best. "paired": the median
over the turns of the tuner's time over the best variant's in the same
turn, and in how many turns the tuner was the slower: on a machine whose
slow spells fall inside single runs (the AMD EPYC VM) the best of each
variant's turns can come from different states, where runs of one turn
lie minutes apart at most.

    tuner_summary.py OUT_DIR CASE TURNS VARIANT...
"""

import csv
import re
import statistics
import sys

PLAN = re.compile(r"plan: (\S+) of (\d+) bytes on \d+ ranks(?: over [^>]*)? -> ([^,( ]+)")


# Where a plan line names a route besides the algorithm, a word for it:
# its schedule then only orders the check-in (docs/architecture.md).
ROUTES = [
    ("through the staging areas", " (staging areas)"),
    ("straight out of the peers' processes", " (pulled or windows)"),
]


def times(path):
    with open(path) as f:
        return {int(r["size_bytes"]): float(r["oop_time_us"]) for r in csv.DictReader(f)}


def choices(path, op):
    """Size class (power-of-two bucket) -> the tuner's choice for `op`
    (the log also has the plan lines of the library's own calls and of
    ferroccl-perf's timing allreduce, which must not stand for it)."""
    out = {}
    with open(path, errors="replace") as f:
        for line in f:
            m = PLAN.search(line)
            if m and m.group(1).replace("_", "") == op:
                route = next((r for k, r in ROUTES if k in line), "")
                out[int(m.group(2)).bit_length()] = m.group(3) + route
    return out


def main():
    out, case, turns = sys.argv[1], sys.argv[2], int(sys.argv[3])
    algos = sys.argv[4:]  # the variants other than the tuner's own
    runs = {}
    for v in ["tuner"] + algos:
        runs[v] = [times(f"{out}/{case}-{v}-{i}.csv") for i in range(1, turns + 1)]
    op, ranks = case.split("-")[0], int(case.split("-")[1])
    chose = choices(f"{out}/{case}-tuner-1.log", op)
    # The CSV's size of an allgather or reduce-scatter is the whole
    # gathered (scattered) array, the plan line's one rank's block.
    per_block = ranks if op in ("allgather", "reducescatter") else 1
    print(f"\n### {case}\n")
    print("| size | tuner chose | tuner us | best other | best us | tuner / best | noise | | paired |")
    print("|---:|---|---:|---|---:|---:|---:|---|---|")
    right = total = 0
    for size in sorted(runs["tuner"][0]):
        tuner = [r[size] for r in runs["tuner"]]
        best_algo, best = min(((a, min(r[size] for r in runs[a])) for a in algos), key=lambda x: x[1])
        best_turns = [r[size] for r in runs[best_algo]]
        noise = max(max(tuner) / min(tuner), max(best_turns) / min(best_turns))
        ratio = min(tuner) / best
        ok = ratio <= max(noise, 1.05)
        total += 1
        right += ok
        pairs = [t / b for t, b in zip(tuner, best_turns)]
        slower = sum(p > 1 for p in pairs)
        print(
            f"| {size} | {chose.get((size // per_block).bit_length(), '?')} | {min(tuner):.2f} | {best_algo} "
            f"| {best:.2f} | {ratio:.2f} | {noise:.2f} | {'right' if ok else 'off'} "
            f"| {statistics.median(pairs):.2f} ({slower} of {len(pairs)} slower) |"
        )
    print(f"\n{right} of {total} sizes within the noise of the best.")


if __name__ == "__main__":
    main()
