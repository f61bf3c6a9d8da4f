#!/usr/bin/env bash
# Sweep FERROCCL_* settings for ferroccl-perf and print one busbw line per
# setting (out-of-place, GB/s), sizes across. The default setting runs first
# and last, so the spread between the two shows how noisy the machine was.
#
# usage: bench/knobs.sh [OP] [RANKS] [MINBYTES] [MAXBYTES] [SETTING...]
#   SETTING: space-free list of VAR=VALUE joined by ',' (e.g.
#   FERROCCL_BUFFSIZE=16777216,FERROCCL_STEPS=4); "default" for none.
set -euo pipefail
op=${1:-allreduce} n=${2:-2} minb=${3:-65536} maxb=${4:-67108864}
shift $(( $# < 4 ? $# : 4 ))
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
(cd "$root" && cargo build --release -q -p ferroccl-bench --bin ferroccl-perf)
perf=${CARGO_TARGET_DIR:-$root/target}/release/ferroccl-perf
settings=("$@")
[ ${#settings[@]} -gt 0 ] || settings=(
  FERROCCL_BUFFSIZE=1048576 FERROCCL_BUFFSIZE=16777216
  FERROCCL_STEPS=2 FERROCCL_STEPS=4 FERROCCL_NSOCKS_PERPEER=2)
echo "# $op, $n ranks, busbw GB/s out-of-place; load $(cut -d' ' -f1-3 /proc/loadavg)"
first=1
for s in default "${settings[@]}" default; do
  env_args=()
  [ "$s" = default ] || IFS=, read -r -a env_args <<<"$s"
  rows=$(env "${env_args[@]}" "$perf" "$op" --ranks "$n" -b "$minb" -e "$maxb" -f 4 -n 10 -w 2 -c 0 | grep -v '^#')
  if [ $first = 1 ]; then
    printf '%-44s' "# setting \\ bytes"; awk '{printf " %9s", $1}' <<<"$rows"; echo
    first=0
  fi
  printf '%-44s' "$s"; awk '{printf " %9.3f", $8}' <<<"$rows"; echo
done
echo "# load after $(cut -d' ' -f1-3 /proc/loadavg)"
