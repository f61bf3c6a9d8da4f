#!/bin/bash
# The 2-rank all-to-all of 512 KiB-8 MiB (a rank's input): Intel MPI,
# ferroccl (ordinary buffers), and the bare programs of the two ways to
# move it (bench/bound/staged_alltoall.c through rings in shared memory,
# cma_alltoall.c by process_vm_readv), in gated turns, one after the other.
cd /work/main; . bench/fast_state.sh
P=/tmp/ferroccl-peers; I=$P/x/impi_rt/impi_rt-2021.19.0.data/data
PP=$P/pingpong
for t in 1 2 3 4 5; do
  for s in 524288 2097152 8388608; do
    b=$((s / 2)); it=$((512 * 1048576 / s)); ((it > 2000)) && it=2000
    echo "### turn $t size $s"
    wait_fast 150 $PP; echo "# state $($PP | head -1)"
    (export PATH=$I/bin:$PATH I_MPI_ROOT=$I; mpirun -n 2 $P/mc_impi alltoall $s $s 4 2>&1 | grep -E '^ +[0-9]' | sed 's/^/intelmpi /')
    wait_fast 150 $PP
    /tmp/perf-head alltoall --ranks 2 -b $s -e $s -n $it -w 20 -c 0 2>&1 | grep -E '^ +[0-9]' | awk '{print "ferroccl", $1, $6}'
    wait_fast 150 $PP
    /tmp/staged_alltoall 2 $b $it | sed 's/^/staged /'
    wait_fast 150 $PP
    NPROC=2 /tmp/cma_alltoall $b 262144 $it | sed 's/^/cma /'
    echo "# state after $($PP | head -1)"
  done
done
