#!/bin/bash
# The 4-rank allreduce of 512 KiB and 2 MiB, start-up after start-up, two
# builds alternating (order reversed every other turn), gated on the fast
# state; each start-up's calibration line kept. usage: run.sh OUT TURNS BIN...
out=$1 turns=$2; shift 2
cd /work/main; . bench/fast_state.sh; mkdir -p $out
PP=/tmp/ferroccl-peers/pingpong
for ((t = 1; t <= turns; t++)); do
  if ((t % 2)); then order=("$@"); else order=(); for ((i = $#; i >= 1; i--)); do order+=("${!i}"); done; fi
  for bin in "${order[@]}"; do
    nm=$(basename $bin)
    wait_fast 150 $PP
    FERROCCL_DEBUG=INFO $bin allreduce --ranks 4 -b 524288 -e 2097152 -f 4 -n 300 -w 20 -c 0 > $out/$nm-$t.txt 2>&1
    echo "$nm $t $(grep -E '^ +(524288|2097152) ' $out/$nm-$t.txt | awk '{printf "%s oop %s ip %s  ", $1, $6, $10}') after $(round_trip $PP) ns"
  done
done
