#!/bin/bash
# The windows column where it was below 2x on the AMD VM (2026-12-05
# table): every 4-rank row from 8 to 128 KiB, and the 2-rank allgather,
# broadcast and reduce-scatter from 8 KiB to 32 MiB, beside the bare
# program (bench/bound/windows.c: whole calls, the root's output written
# in a broadcast, and the one-meeting staged way): "bound" the faster of N
# processes and 2, "bound-procs" 4 processes alone; the peers in the same
# turns, every run gated on the VM's fast state.
# From the repository root: docs/data/2026-12-05/windows/run.sh OUTDIR
set -euo pipefail
out=${1:?OUTDIR}
mkdir -p "$out"
run() {
  PEERS="openmpi intelmpi bound" PEERS_FAST_NS=150 FERROCCL_PERF=${FERROCCL_PERF:-target/release/ferroccl-perf} \
    bench/peers.sh "$1" "$2" "$3" "$4" 3 < /dev/null > "$out/$1-$2.txt"
  python3 bench/peers_table.py < "$out/$1-$2.txt" > "$out/$1-$2.md"
}
for op in allreduce allgather broadcast reducescatter reduce; do run "$op" 4 8192 131072; done
for op in allgather broadcast reducescatter; do run "$op" 2 8192 33554432; done
