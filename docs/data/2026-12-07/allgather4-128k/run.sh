#!/bin/bash
# 4-rank allgather of 128 KiB gathered: the start-up's route choice and the call's time, run after run
cd /work/main; . bench/fast_state.sh
for i in 1 2 3 4 5 6; do
  wait_fast 150 /tmp/ferroccl-peers/pingpong
  FERROCCL_DEBUG=INFO ${FERROCCL_PERF:-target/release/ferroccl-perf} allgather --ranks 4 -b 131072 -e 131072 -n 2000 -w 100 -c 0 > /tmp/ag4-$i.txt 2>&1
  echo "run $i: $(grep -E '^ +131072' /tmp/ag4-$i.txt | awk '{print "oop",$6,"ip",$10}') rt $(round_trip /tmp/ferroccl-peers/pingpong)"
  grep -o "allgather blocks [^;]*; [^;]*;[^,]*" /tmp/ag4-$i.txt | head -1
done
