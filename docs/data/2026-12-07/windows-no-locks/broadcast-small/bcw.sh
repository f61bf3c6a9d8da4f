#!/bin/bash
# broadcast between windows, 2 ranks, 2 and 8 KiB, base vs final in alternating gated turns
cd /work/main; . bench/fast_state.sh
for t in 1 2 3 4; do
  if ((t % 2)); then order="base final"; else order="final base"; fi
  for b in $order; do
    wait_fast 150 /tmp/ferroccl-peers/pingpong
    for s in 2048 8192; do
      r=$(/tmp/perf-$b broadcast --ranks 2 -b $s -e $s -n 20000 -w 20 -c 0 -R 2 2>&1 | grep -E '^ +[0-9]+ ' | awk '{print $6}')
      echo "$b $t $s $r"
    done
  done
done
