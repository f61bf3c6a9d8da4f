#!/usr/bin/env bash
# Two builds of ferroccl-perf side by side in one session, in turns: A, B,
# B, A, A, B, ... for every case, so that load from other work on the
# machine falls on both alike, and the spread of the A runs gives the
# run-to-run noise. The order alternates because the build run second in
# a turn gained on the first by itself (the same binary twice, 4 ranks on
# the AMD VM: 1.19x; docs/data/2026-12-06/digest/README.md). Used to check
# that a change costs no speed (docs/performance-log.md, "Restructuring check").
#
#   bench/ab.sh A_PERF B_PERF [OUT_DIR]
# Environment:
#   OPS="allreduce allgather reducescatter"   collectives
#   RANKS="2 4"                               rank counts
#   TRANSPORTS="default tcp"                  FERROCCL_TRANSPORT values
#   MINB=8 MAXB=268435456 FACTOR=2            sizes
#   ITERS=10 WARMUP=3                         iterations
#   TURNS=2                                   turns of A and B each
#   REGISTER=0                                2: buffers in windows (-R 2)
#   AB_STATE=CMD                              run before every turn, its line
#                                             printed (the machine's state, e.g.
#                                             bench/bound/pingpong.c built)
#   AB_FAST_NS=N                              with AB_STATE printing "round trip
#                                             R ns": wait (up to 10 min) until
#                                             R < N before every turn, and take a
#                                             turn again (up to 5 times) when R
#                                             >= N after it: every turn in one
#                                             state of a machine that flips
# Prints one table per case (bench/ab_summary.py) and keeps the CSVs.
set -euo pipefail
a=${1:?usage: bench/ab.sh A_PERF B_PERF [OUT_DIR]}
b=${2:?usage: bench/ab.sh A_PERF B_PERF [OUT_DIR]}
out=${3:-$(mktemp -d "${TMPDIR:-/tmp}/ferroccl-ab.XXXXXX")}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
OPS=${OPS:-allreduce allgather reducescatter}
RANKS=${RANKS:-2 4}
TRANSPORTS=${TRANSPORTS:-default tcp}
MINB=${MINB:-8} MAXB=${MAXB:-268435456} FACTOR=${FACTOR:-2}
ITERS=${ITERS:-10} WARMUP=${WARMUP:-3} TURNS=${TURNS:-2}
# run_in_state: every turn in the machine's state that AB_STATE's line reads.
. "$here/fast_state.sh"
turns=()
for ((i = 1; i <= TURNS; i++)); do
  if ((i % 2)); then turns+=("a$i" "b$i"); else turns+=("b$i" "a$i"); fi
done
REGISTER=${REGISTER:-0}
echo "## $(date -u '+%Y-%m-%dT%H:%M:%SZ') nproc=$(nproc) load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "## A=$a"
echo "## B=$b"
for t in $TRANSPORTS; do
  for n in $RANKS; do
    for op in $OPS; do
      case_name="$op-$n-$t"
      for turn in "${turns[@]}"; do
        exe=$a
        [[ $turn == b* ]] && exe=$b
        env_t=()
        [[ $t != default ]] && env_t=(FERROCCL_TRANSPORT="$t")
        run_turn() {
          env "${env_t[@]}" "$exe" "$op" --ranks "$n" -b "$MINB" -e "$MAXB" -f "$FACTOR" \
            -n "$ITERS" -w "$WARMUP" -c 0 -R "$REGISTER" \
            --csv "$out/$case_name-$turn.csv" > "$out/$case_name-$turn.txt"
        }
        run_in_state "${AB_FAST_NS:-}" "${AB_STATE:-}" "$case_name $turn" run_turn
      done
      python3 "$here/ab_summary.py" "$out" "$case_name" "$TURNS"
    done
  done
done
echo "## raw output in $out"
