#!/bin/bash
# Intel MPI's all-to-all presets (I_MPI_ADJUST_ALLTOALL=N) against its
# default and ferroccl, 2 ranks, at the sizes where ferroccl is below it.
set -u
P=/tmp/ferroccl-peers
I=$P/x/impi_rt/impi_rt-2021.19.0.data/data
. /work/main/bench/fast_state.sh
PERF=${PERF:-/tmp/perf-a2ai}
for t in 1 2 3; do
  echo "### turn $t"
  for preset in default 1 2 3 4; do
    wait_fast 150 $P/pingpong
    echo "## impi $preset"
    (export PATH=$I/bin:$PATH I_MPI_ROOT=$I
     [ "$preset" != default ] && export I_MPI_ADJUST_ALLTOALL=$preset
     mpirun -n 2 $P/mc_impi alltoall 131072 8388608 4 2>&1 | grep -E "^ +[0-9]")
  done
  wait_fast 150 $P/pingpong
  echo "## ferroccl"
  $PERF alltoall --ranks 2 -b 128K -e 8M -f 4 -n 200 -w 20 2>&1 | grep -E "^ +[0-9]" | awk '{print $1, $6}'
  echo "# state after: $(round_trip $P/pingpong) ns"
done
