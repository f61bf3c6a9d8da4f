#!/bin/bash
# The issue's own side-by-side script, every row it has (allreduce, allgather, reducescatter; 2 and 4 ranks), two ranges.
cd /work/main
for op in allreduce allgather reducescatter; do for n in 2 4; do
  FERROCCL_PERF=/tmp/perf-head ../shared/peers/sbs2.sh $op $n 8 32768 3 5000 < /dev/null > /tmp/s77/sbs2/$op-$n-small.txt 2>&1
  FERROCCL_PERF=/tmp/perf-head ../shared/peers/sbs2.sh $op $n 131072 33554432 3 100 < /dev/null > /tmp/s77/sbs2/$op-$n-large.txt 2>&1
  echo "$op $n done $(date -u +%T)"
done; done
