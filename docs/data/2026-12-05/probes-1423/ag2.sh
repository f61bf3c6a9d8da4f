#!/bin/bash
cd /work/main
. bench/fast_state.sh
P=/tmp/ferroccl-peers
F=/tmp/perf-xg
for t in 1 2 3; do
  wait_fast 150 $P/pingpong
  echo "# turn $t $(round_trip $P/pingpong) ns"
  for fresh in 0 1; do
  for s in 131072 524288 1048576 2097152 4194304 8388608; do
    n=$((200000000 / s / 100)); [ $n -lt 30 ] && n=30; [ $n -gt 2000 ] && n=2000
    for v in pull slots; do
      e="X_CMA_GATHER=$v"
      r=$(env $e $F allgather --ranks 2 -b $s -e $s -n $n -w 10 -c 0 --fresh $fresh 2>&1 | grep -E '^ +[0-9]' | awk '{print $6, $10}')
      echo "fresh=$fresh $v $s $r"
    done
  done
  done
  echo "# after $(round_trip $P/pingpong) ns"
done
