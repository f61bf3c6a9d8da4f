#!/bin/bash
# The script on the 2-rank allgather of 8 MiB a rank, five turns
# kept where the VM was in its fast state after them (at most ten tried).
# Run from the checkout: docs/data/2026-12-05/allgather-8m/sbs2-gated.sh > OUT
. bench/fast_state.sh
PP=/tmp/ferroccl-peers/pingpong
export FERROCCL_PERF=${FERROCCL_PERF:-target/release/ferroccl-perf}
kept=0; tries=0
while [ $kept -lt 5 ] && [ $tries -lt 10 ]; do
  tries=$((tries+1))
  wait_fast 150 $PP
  turn=$(../shared/peers/sbs2.sh allgather 2 8388608 8388608 1 100 2>&1)
  rt=$(round_trip $PP)
  if [ "$rt" -lt 150 ]; then kept=$((kept+1)); echo "$turn"; echo "# state after turn: $rt ns (kept)"
  else echo "# a turn dropped: $rt ns after it"; fi
done
