#!/bin/bash
# Which runs of the 2-rank 512 KiB allreduce in fresh rounds are slow, and
# what their tuner chose: per start-up, the calibration's line, the plan
# of the 512 KiB allreduce and the times (out of place, in place).
# usage: modes.sh BINARY RUNS > out.txt
for i in $(seq 1 "${2:-12}"); do
  FERROCCL_DEBUG=INFO "$1" allreduce --ranks 2 -b 524288 -e 524288 -n 2000 -w 50 --fresh 1 2>&1 |
    sed 's/\x1b\[[0-9;]*m//g' > /tmp/modes.$$
  t=$(grep -E '^ +[0-9]' /tmp/modes.$$ | awk '{print $6, $10}')
  a=$(grep 'tuner: calibrated' /tmp/modes.$$ | grep rank=0 | sed 's/.*ranks: //; s/ (avx.*//')
  p=$(grep 'plan: all_reduce of 524288' /tmp/modes.$$ | grep rank=0 | sed 's/.*-> \([a-z_]*\),.*/\1/')
  echo "run $i: $t | $a | $p"
done
rm -f /tmp/modes.$$
