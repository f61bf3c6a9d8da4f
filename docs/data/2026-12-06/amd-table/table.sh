#!/bin/bash
O=$1; mkdir -p $O
for r in "allgather 2" "allgather 4" "allreduce 2" "allreduce 4" "broadcast 2" "broadcast 4" "reduce 2" "reduce 4" "reducescatter 2" "reducescatter 4" "alltoall 2" "alltoall 4"; do
  set -- $r
  max=33554432; [ "$1 $2" = "alltoall 4" ] && max=16777216
  PEERS="openmpi mpich intelmpi" PEERS_FAST_NS=150 FERROCCL_PERF=${FERROCCL_PERF:-target/release/ferroccl-perf} bench/peers.sh $1 $2 8 $max 3 < /dev/null > $O/$1-$2.txt 2>$O/$1-$2.err
done
python3 bench/peers_table.py --summary $O/*-[24].txt > $O/summary.md 2>&1
echo DONE > $O/done
