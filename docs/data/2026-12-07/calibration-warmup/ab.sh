#!/bin/bash
# Start-ups of 0faa5cf (cur) and 60b7aa8 (warm) in turns, gated: the
# 2-rank allgather of 512 KiB and 2 MiB gathered, the calibration's
# time (rank 0's log, from its first line to the calibrated line) and the
# range it gave the pull; then the same three times each on 4 ranks
# (128 KiB gathered), for the calibration's cost there.
cd /work/main; . bench/fast_state.sh
row() { t0=$(grep "$3" $2 | grep rank=0 | cut -c18-26); t1=$(grep "cross-memory attach calibrated" $2 | grep rank=0 | cut -c18-26)
  echo "$1 $(grep -E '^ +[0-9]+ +[0-9]+ +float' $2 | awk '{printf "%s ", $6}') cal_ms $(python3 -c "print(round(($t1-$t0)*1000,1))") $(grep -o 'allgathers and all-to-alls pull [^,;]*\|all-to-alls pull [^(]*' $2 | head -1)"; }
for i in $(seq 1 10); do for v in cur warm; do
  wait_fast 150 /tmp/ferroccl-peers/pingpong
  FERROCCL_DEBUG=INFO /tmp/perf-$v allgather --ranks 2 -b 524288 -e 2097152 -f 4 -n 600 -w 20 -c 0 > /work/warm/$v-$i.txt 2>&1
  row "$i $v" /work/warm/$v-$i.txt "cross-memory attach between"
done; done
for i in 1 2 3; do for v in cur warm; do
  wait_fast 150 /tmp/ferroccl-peers/pingpong
  FERROCCL_DEBUG=INFO /tmp/perf-$v allgather --ranks 4 -b 131072 -e 131072 -n 200 -w 20 -c 0 > /work/warm/r4-$v-$i.txt 2>&1
  row "$i $v 4 ranks" /work/warm/r4-$v-$i.txt "control pages shared by"
done; done
