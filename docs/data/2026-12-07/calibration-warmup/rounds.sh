#!/bin/bash
# Each round of the cross-memory-attach calibration apart: 12 start-ups of
# a 2-rank allgather of 512 KiB gathered, gated on the VM's fast state,
# with the build of 0faa5cf plus rounds.patch (FERROCCL_XROUNDS rounds,
# rank 0 prints each round's own times: XR ROUND [allgather 64 KiB pull,
# slots, 512 KiB pull, slots, 2 MiB pull, slots, broadcasts ..., all-to-alls ...]).
# Then rounds.py: the range the pull would take from rounds 0-1 (the
# calibration before 60b7aa8), 1-2 (after it), 1-3 and all five.
cd /work/main; . bench/fast_state.sh
for i in $(seq 1 12); do
  wait_fast 150 /tmp/ferroccl-peers/pingpong
  FERROCCL_XROUNDS=5 FERROCCL_DEBUG=INFO /tmp/perf-exp2 allgather --ranks 2 -b 524288 -e 524288 -n 1024 -w 20 -c 0 > /work/xr/$i.txt 2>&1
done
