#!/bin/bash
# The 2-rank allgather of 128 KiB-8 MiB gathered: Open MPI, Intel MPI,
# ferroccl (ordinary buffers), and the bare programs of the two ways to move
# it (bench/bound/staged.c allgather through a FIFO in shared memory, 8
# slots of CHUNK; cma_allgather.c by process_vm_readv), in gated turns, one
# after the other. Times per call in µs (the bare programs' from their mean).
cd /work/main; . bench/fast_state.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
P=/tmp/ferroccl-peers; I=$P/x/impi_rt/impi_rt-2021.19.0.data/data
PP=$P/pingpong; PERF=${FERROCCL_PERF:-/tmp/perf-cur}
for t in 1 2 3 4 5; do
  for s in ${SIZES:-32768 131072 524288 2097152 8388608}; do
    b=$((s / 2)); it=$((512 * 1048576 / s)); ((it > 4000)) && it=4000
    c=$((b / 2)); ((c > 65536)) && c=65536; ((c < 64)) && c=64
    echo "### turn $t size $s"
    wait_fast 150 $PP; echo "# state $($PP | head -1)"
    mpirun --oversubscribe -n 2 $P/mc_ompi allgather $s $s 4 2>&1 | grep -E '^ +[0-9]' | sed 's/^/openmpi /'
    wait_fast 150 $PP
    (export PATH=$I/bin:$PATH I_MPI_ROOT=$I; mpirun -n 2 $P/mc_impi allgather $s $s 4 2>&1 | grep -E '^ +[0-9]' | sed 's/^/intelmpi /')
    wait_fast 150 $PP
    $PERF allgather --ranks 2 -b $s -e $s -n $it -w 20 -c 0 2>&1 | grep -E '^ +[0-9]' | awk '{print "ferroccl", $1, $6}'
    wait_fast 150 $PP
    /tmp/staged allgather $b $c 8 $it | sed 's/^/staged /'
    wait_fast 150 $PP
    /tmp/cma_allgather $b $b $it | sed 's/^/cma /'
    echo "# state after $($PP | head -1)"
  done
done
