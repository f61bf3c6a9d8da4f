#!/bin/bash
# The 2-rank broadcast of 8 and 32 MiB on the model-207 VM: ferroccl-perf
# (through slots there), a few slot settings, and the bare pull
# (bench/bound/cma_bcast.c, one process_vm_readv a MiB), 3 turns, in turns.
# Columns of the ferroccl lines: size, out-of-place and in-place µs a call.
P=${P:-target/release/ferroccl-perf}
B=${B:-/tmp/cma_bcast}
echo "# $(date -u +%FT%TZ) $(git log -1 --format=%h) $(/tmp/pingpong 2>&1)"
for t in 1 2 3; do
  for v in A=1 FERROCCL_BUFFSIZE=1048576 FERROCCL_BUFFSIZE=16777216 FERROCCL_STEPS=4 FERROCCL_NT_STORE_BYTES=1048576; do
    echo "## turn $t $v: $(env $v $P broadcast --ranks 2 -b 8M -e 32M -f 4 -n 30 -w 3 -c 0 2>&1 | grep -E '^ +[0-9]' | awk '{printf "%s %s %s  ", $1, $6, $10}')"
  done
  for b in 8388608 33554432; do echo "## turn $t bare pull: $($B $b 1048576 30 2>&1 | tail -1)"; done
done
