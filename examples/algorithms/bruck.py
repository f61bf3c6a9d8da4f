#!/usr/bin/env python3
"""Write bruck.algo: Bruck's allgather in ferroccl's text format, for any
rank count.

Chunks address the buffer of n * count elements of an allgather's in-place
layout: chunk b of n is rank b's block (docs/algorithms.md). Rank r first
copies its input into its block. In round k (distance d = 2^k, while
d < n) it sends the blocks it holds, r .. r + d - 1 (mod n; the first
n - d of them in the last round), to rank r - d, and receives blocks
r + d .. r + 2d - 1 from rank r + d: ceil(log2 n) messages a rank, each
rank sending (n - 1) / n of the output. Blocks keep their place, so the
final rotation of the textbook version is not needed; a range that wraps
past block n - 1 is sent as two steps, on both ends.

Usage: bruck.py [MAX_RANKS | N,N,...] > bruck.algo
  (default 16: sections for 1..16 ranks, the shipped bruck.algo; a list
  writes sections for those rank counts only)
"""
import sys


def ranges(first, count, n):
    """Blocks first .. first + count - 1 (mod n) as (a, b) ranges."""
    if first + count <= n:
        return [(first, first + count)]
    return [(first, n), (0, first + count - n)]


def chunks(a, b, n):
    return f"chunk {a} of {n}" if b == a + 1 else f"chunks {a}..{b} of {n}"


def rank_steps(n, r):
    out = [f"copy {chunks(r, r + 1, n)}"]
    d = 1
    while d < n:
        m = min(d, n - d)
        to, frm = (r - d) % n, (r + d) % n
        for a, b in ranges(r, m, n):
            out.append(f"send to {to} {chunks(a, b, n)} using output")
        for a, b in ranges((r + d) % n, m, n):
            out.append(f"recv from {frm} {chunks(a, b, n)}")
        d *= 2
    return out


def main():
    arg = sys.argv[1] if len(sys.argv) > 1 else "16"
    sizes = [int(x) for x in arg.split(",")] if "," in arg else range(1, int(arg) + 1)
    print("# Bruck allgather, written by examples/algorithms/bruck.py")
    print("algorithm bruck_allgather")
    print("collective allgather")
    for n in sizes:
        print(f"\nranks {n}")
        for r in range(n):
            for s in rank_steps(n, r):
                print(f"rank {r}: {s}")


if __name__ == "__main__":
    main()
