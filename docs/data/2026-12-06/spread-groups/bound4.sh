#!/bin/bash
# The 4-rank allreduce against its bare program, Intel MPI and ferroccl in turns, gated.
set -u
cd /work/main
. bench/fast_state.sh
PP=/tmp/ferroccl-peers/pingpong
P=/tmp/peers2; I=$P/x/impi_rt/impi_rt-2021.19.0.data/data
N=${N:-4}
for t in $(seq 1 ${TURNS:-5}); do
  for b in ${SIZES:-262144 1048576 4194304}; do
    it=$((b >= 4194304 ? 50 : 400))
    wait_fast 150 $PP
    echo "turn $t size $b gate $(round_trip $PP) ns"
    echo "  intelmpi $( (export PATH=$I/bin:$PATH I_MPI_ROOT=$I; mpirun -n $N $P/mb_impi allreduce $b $b 20 4 2>&1 | grep -E '^ +[0-9]' | awk '{print $2}') )"
    echo "  ferroccl $(target/release/ferroccl-perf all_reduce --ranks $N -b $b -e $b -n $it -w 20 -c 0 2>&1 | grep -E '^ +[0-9]' | awk '{print $6}')"
    echo "  bare-memcpy $(/tmp/spread_allreduce $N $b $it 4)"
    echo "  bare-loop $(COPY=loop /tmp/spread_allreduce $N $b $it 4)"
  done
done
