#!/bin/bash
# broadcast between windows, 2 ranks, 8 KiB, three builds in rotating gated turns
cd /work/main; . bench/fast_state.sh
builds=(head base final)
for t in 1 2 3 4 5 6; do
  for k in 0 1 2; do
    b=${builds[$(( (k + t) % 3 ))]}
    wait_fast 150 /tmp/ferroccl-peers/pingpong
    for s in 2048 8192; do
      r=$(/tmp/perf-$b broadcast --ranks 2 -b $s -e $s -n 20000 -w 20 -c 0 -R 2 2>&1 | grep -E '^ +[0-9]+ ' | awk '{print $6}')
      echo "$b $t $s $r"
    done
  done
done
