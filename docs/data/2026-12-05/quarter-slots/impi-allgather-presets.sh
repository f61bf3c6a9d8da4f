#!/bin/bash
# Intel MPI's 2-rank allgather of 8-128 KiB gathered with each
# I_MPI_ADJUST_ALLGATHER preset forced, beside its default and
# ferroccl-perf, three turns each waiting for the VM's fast state
# (bench/peers.sh builds the MPI programs and pingpong first).
#   docs/data/2026-12-05/quarter-slots/impi-allgather-presets.sh
cd "$(dirname "$0")/../../../.." || exit 1
F=${FERROCCL_PERF:-target/release/ferroccl-perf}
. bench/fast_state.sh
P=/tmp/ferroccl-peers; PP=$P/pingpong
I=$(grep -m1 "^I=" bench/peers.sh | cut -d= -f2-); eval I=$I
export PATH=$I/bin:$PATH I_MPI_ROOT=$I
for turn in 1 2 3; do
 for a in default 1 2 3 4 5 6 7 8 9 10 11; do
  wait_fast 150 $PP
  if [ $a = default ]; then unset I_MPI_ADJUST_ALLGATHER; else export I_MPI_ADJUST_ALLGATHER=$a; fi
  r=$(mpirun -n 2 $P/mc_impi allgather 8192 131072 4 2>&1 | awk '/^ *[0-9]/{printf "%s:%s ", $1, $2}')
  echo "$turn $a $r state $(round_trip $PP)"
 done
 r=$($F allgather --ranks 2 -b 8K -e 128K -f 4 -n 5000 -w 100 -c 0 2>&1 | awk '/^ +[0-9]/{printf "%s:%s ", $1, $6}')
 echo "$turn ferroccl $r"
done
