#!/bin/bash
# The windows column beside its bound: each row OP:RANKS:MINB:MAXB through
# bench/peers.sh with Open MPI, Intel MPI, ferroccl (ordinary buffers and
# windows) and the bare program of a call between windows
# (bench/bound/windows.c: "bound" the faster of N processes and 2,
# "bound-procs" N processes alone where they outnumber the CPUs), three
# turns, every run gated on the VM's fast state; a table per row.
# From the repository root:
#   FERROCCL_PERF=... docs/data/2026-12-07/windows-bound/run.sh OUTDIR OP:RANKS:MINB:MAXB...
set -euo pipefail
out=${1:?OUTDIR}
shift
mkdir -p "$out"
for row in "$@"; do
  IFS=: read -r op n minb maxb <<< "$row"
  date -u +"$op-$n %H:%M:%S" >> "$out/times.txt"
  PEERS="openmpi intelmpi bound" PEERS_FAST_NS=150 FERROCCL_PERF=${FERROCCL_PERF:-target/release/ferroccl-perf} \
    bench/peers.sh "$op" "$n" "$minb" "$maxb" 3 < /dev/null > "$out/$op-$n.txt"
  python3 bench/peers_table.py < "$out/$op-$n.txt" > "$out/$op-$n.md"
done
date -u +"end %H:%M:%S" >> "$out/times.txt"
