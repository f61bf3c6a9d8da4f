#!/bin/bash
# Every collective against the four peers on the AMD EPYC VM with one build
# (FERROCCL_PERF), every peer's run of every turn gated on the fast state;
# the 4-rank all-to-all to 16 MiB. Output beside this script (or in OUT).
cd /work/main
out=${OUT:-$(dirname "$0")}
: > "$out/times.txt"
for n in 2 4; do for op in allreduce allgather reducescatter broadcast reduce alltoall; do
  max=33554432; [ "$op$n" = alltoall4 ] && max=16777216
  echo "$(date -u +%T) start $op $n" >> "$out/times.txt"
  PEERS_FAST_NS=150 bench/peers.sh $op $n 8 $max 3 > "$out/$op-$n.txt"
done; done
echo "$(date -u +%T) end" >> "$out/times.txt"
bench/peers_table.py --summary "$out"/*-[24].txt > "$out/summary.txt"
