#!/usr/bin/env bash
# The tuner's choice against the measured best (issue 37 item 5): for each
# collective with a choice of algorithm, each rank count and transport,
# ferroccl-perf runs once as the tuner chooses and once with each algorithm
# forced (FERROCCL_ALGO), in turns (each turn every variant once, starting
# one variant later than the turn before) so that load from other work
# falls on all alike. The tuner's choice per size
# is read from its own `plan:` lines (FERROCCL_DEBUG=INFO). Prints one
# table per case (bench/tuner_summary.py) and keeps the CSVs and logs.
#
#   bench/tuner-check.sh [PERF] [OUT_DIR]
# Environment:
#   OPS="allreduce broadcast reduce"   collectives with a choice
#   RANKS="2 4"  TRANSPORTS="default tcp"
#   MINB=8 MAXB=16777216 FACTOR=4  ITERS=200 WARMUP=20  TURNS=3
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
perf=${1:-${CARGO_TARGET_DIR:-$root/target}/release/ferroccl-perf}
out=${2:-$(mktemp -d "${TMPDIR:-/tmp}/ferroccl-tuner.XXXXXX")}
mkdir -p "$out"
OPS=${OPS:-allreduce broadcast reduce}
RANKS=${RANKS:-2 4}
TRANSPORTS=${TRANSPORTS:-default tcp}
MINB=${MINB:-8} MAXB=${MAXB:-16777216} FACTOR=${FACTOR:-4}
ITERS=${ITERS:-200} WARMUP=${WARMUP:-20} TURNS=${TURNS:-3}
algos_of() {
  case $1 in
    allreduce) echo "ring tree one_shot two_shot recursive_doubling" ;;
    *) echo "ring tree" ;;
  esac
}
echo "## $(date -u '+%Y-%m-%dT%H:%M:%SZ') nproc=$(nproc) load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "## $perf"
for t in $TRANSPORTS; do
  for n in $RANKS; do
    for op in $OPS; do
      case_name="$op-$n-$t"
      variants=(tuner $(algos_of "$op"))
      for ((i = 1; i <= TURNS; i++)); do
        # Each turn starts one variant later, so that none always runs
        # first (a machine whose load drifts favours no one).
        for ((j = 0; j < ${#variants[@]}; j++)); do
          v=${variants[$(((j + i - 1) % ${#variants[@]}))]}
          env_v=(FERROCCL_DEBUG=INFO)
          [[ $t != default ]] && env_v+=(FERROCCL_TRANSPORT="$t")
          [[ $v != tuner ]] && env_v+=(FERROCCL_ALGO="$v")
          env "${env_v[@]}" "$perf" "$op" --ranks "$n" -b "$MINB" -e "$MAXB" -f "$FACTOR" \
            -n "$ITERS" -w "$WARMUP" -c 0 --csv "$out/$case_name-$v-$i.csv" \
            > "$out/$case_name-$v-$i.txt" 2> "$out/$case_name-$v-$i.log"
        done
      done
      python3 "$here/tuner_summary.py" "$out" "$case_name" "$TURNS" $(algos_of "$op")
    done
  done
done
echo "## raw output in $out"
