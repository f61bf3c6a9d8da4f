#!/bin/bash
# Ranks confined to fewer CPUs than the machine has (issue 37 follow-up,
# 2026-12-02). BASE: ferroccl-perf of b70f196; NEW: of the change that
# tells ranks the launcher's CPUs (FERROCCL_HOST_CPUS). Two cases, 3 turns
# each, in turns:
#  1. the launcher itself under `taskset -c 0` (both ranks on CPU 0);
#  2. both ranks in a cgroup (v1 `cpu` controller, as root) with a quota of
#     one CPU (cfs_quota_us = cfs_period_us = 100000), NEW as it is and NEW
#     with FERROCCL_HOST_CPUS=1 (waiting as ranks that share a CPU, what a
#     quota rule would have made of it), with the cgroup's cpu.stat after.
# Columns: size, out-of-place time, in-place time (µs a call).
BASE=${BASE:-/tmp/ab/base} NEW=${NEW:-/tmp/ab/hostcpus}
perf() { "$@" allreduce --ranks 2 -b 8 -e 512K -f 16 -n 2000 -w 50 -c 0 2>&1 |
  grep -E '^ +[0-9]' | awk '{print $1, $6, $10}'; }
echo "# $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo) model $(grep -m1 '^model\s' /proc/cpuinfo | awk '{print $3}')"
for t in 1 2 3; do
  for b in BASE NEW; do
    echo "## taskset -c 0, $b, turn $t"; perf timeout 300 taskset -c 0 "${!b}"
  done
done
G=/sys/fs/cgroup/cpu/ferroccl-quota
mkdir -p $G && echo 100000 > $G/cpu.cfs_period_us && echo 100000 > $G/cpu.cfs_quota_us || exit 0
for t in 1 2 3; do
  for v in "" 1; do
    echo "## quota of 1 CPU, NEW, FERROCCL_HOST_CPUS='$v', turn $t"
    before=$(grep throttled_time $G/cpu.stat)
    sh -c "echo \$\$ > $G/cgroup.procs; exec env ${v:+FERROCCL_HOST_CPUS=$v} timeout 300 $NEW allreduce --ranks 2 -b 8 -e 512K -f 16 -n 2000 -w 50 -c 0" 2>&1 |
      grep -E '^ +[0-9]' | awk '{print $1, $6, $10}'
    echo "# cpu.stat before: $before; after: $(grep -E 'nr_throttled|throttled_time' $G/cpu.stat | tr '\n' ' ')"
  done
done
