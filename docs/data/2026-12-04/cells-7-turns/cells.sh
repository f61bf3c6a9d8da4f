#!/bin/bash
# The 16 cells below the best peer in the 2026-12-04 06:18 table, 7 turns each, one size.
cd /work/main
while read op n s peers; do
  PEERS="$peers" FERROCCL_PERF=/tmp/perf-head bench/peers.sh $op $n $s $s 7 < /dev/null > /tmp/s77/cells/$op-$n-$s.txt 2>&1
  echo "$op $n $s done $(date -u +%T)"
done <<'L'
allgather 2 524288 openmpi intelmpi
allgather 2 8388608 openmpi mpich intelmpi
allgather 2 33554432 openmpi mpich intelmpi
allgather 4 131072 openmpi intelmpi
allreduce 2 32768 openmpi intelmpi
allreduce 2 131072 openmpi intelmpi
allreduce 4 524288 openmpi intelmpi
broadcast 2 32 openmpi intelmpi
broadcast 4 32768 openmpi intelmpi
broadcast 4 2097152 openmpi intelmpi
reduce 2 8 openmpi intelmpi
reduce 2 32 openmpi intelmpi
reduce 2 131072 openmpi intelmpi
reduce 4 8 openmpi intelmpi
reduce 4 524288 openmpi intelmpi
reducescatter 4 524288 openmpi intelmpi
L
