#!/bin/bash
# Broadcast between windows, 2 ranks, 2 and 8 KiB: builds /tmp/perf-NAME
# in gated turns, the order rotating by one build every turn.
#   bcw.sh TURNS NAME...
# bcw.txt:  bcw.sh 4 base final        (alternating: base final, final base, ...)
# bcw3.txt: bcw.sh 6 final head base   (head base final, base final head, ...)
cd /work/main; . bench/fast_state.sh
turns=$1; shift
builds=("$@")
for ((t = 1; t <= turns; t++)); do
  for ((k = 0; k < ${#builds[@]}; k++)); do
    b=${builds[$(( (k + t + 1) % ${#builds[@]} ))]}
    wait_fast 150 /tmp/ferroccl-peers/pingpong
    for s in 2048 8192; do
      r=$(/tmp/perf-$b broadcast --ranks 2 -b $s -e $s -n 20000 -w 20 -c 0 -R 2 2>&1 | grep -E '^ +[0-9]+ ' | awk '{print $6}')
      echo "$b $t $s $r"
    done
  done
done
