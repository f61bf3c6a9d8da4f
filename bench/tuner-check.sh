#!/usr/bin/env bash
# The tuner's choice against the measured best (issue 37 item 5): for each
# collective with a choice, each rank count and transport, ferroccl-perf
# runs once as the library chooses ("tuner") and once with each other
# choice forced, in turns (each turn every variant once, starting one
# variant later than the turn before) so that load from other work falls
# on all alike. The choices are of two kinds:
# - algorithms (allreduce, broadcast, reduce): FERROCCL_ALGO=ring, tree,
#   ...; a forced algorithm also skips the inline exchange, the staging
#   areas and the pull, and runs through slots;
# - routes, on the default transport (shared memory): which of the inline
#   exchange, the pull out of the peer's process, the staging areas and
#   the slots a call takes, decided by the size, the start-up's
#   calibration and the rank count (docs/architecture.md). Each route
#   variant turns one off: "nopull" FERROCCL_CMA=0, "nopush"
#   FERROCCL_CMA_PUSH=0 (2 ranks: the allreduce's halves and the
#   broadcast's pushed share), "nostaging" FERROCCL_SPREAD=0 (4 to 8
#   ranks; the reduce-scatter's one choice), "slots" both of the first
#   and the last, "uncalibrated"
#   FERROCCL_CALIBRATE=0 (the fixed ranges the calibration replaces).
# The tuner's choice per size is read from its own `plan:` lines
# (FERROCCL_DEBUG=INFO). Prints one table per case
# (bench/tuner_summary.py) and keeps the CSVs and logs.
#
#   bench/tuner-check.sh [PERF] [OUT_DIR]
# Environment:
#   OPS="allreduce broadcast reduce allgather alltoall reducescatter"
#   RANKS="2 4"  TRANSPORTS="default tcp"
#   MINB=8 MAXB=16777216 FACTOR=4  ITERS=200 WARMUP=20  TURNS=3
#   ROUTES=1          0: algorithms only, as before 2026-12-07
#   TUNER_STATE=CMD   run before every run, its line printed (the
#                     machine's state, e.g. bench/bound/pingpong.c built)
#   TUNER_FAST_NS=N   with TUNER_STATE printing "round trip R ns": wait
#                     (up to 10 min) until R < N before every run, and
#                     take a run again (up to 5 times) when R >= N after
#                     it (bench/fast_state.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
perf=${1:-${CARGO_TARGET_DIR:-$root/target}/release/ferroccl-perf}
out=${2:-$(mktemp -d "${TMPDIR:-/tmp}/ferroccl-tuner.XXXXXX")}
mkdir -p "$out"
OPS=${OPS:-allreduce broadcast reduce allgather alltoall reducescatter}
RANKS=${RANKS:-2 4}
TRANSPORTS=${TRANSPORTS:-default tcp}
MINB=${MINB:-8} MAXB=${MAXB:-16777216} FACTOR=${FACTOR:-4}
ITERS=${ITERS:-200} WARMUP=${WARMUP:-20} TURNS=${TURNS:-3}
ROUTES=${ROUTES:-1}
# run_in_state: every run in the machine's state that TUNER_STATE's line reads.
. "$here/fast_state.sh"

# The variants other than the tuner's own for OP on N ranks over transport T.
variants_of() {
  local op=$1 n=$2 t=$3 v=()
  case $op in
    allreduce) v=(ring tree one_shot two_shot recursive_doubling) ;;
    broadcast | reduce) v=(ring tree) ;;
  esac
  if ((ROUTES)) && [[ $t == default ]]; then
    case $op in
      allreduce | broadcast | allgather | alltoall)
        # The pull and the pushed shares are for allgathers, all-to-alls,
        # broadcasts and the 2-rank allreduce; the staging areas for all
        # four on 4 to 8 ranks.
        if ((n == 2)); then
          [[ $op != allreduce ]] && v+=(nopull)
          [[ $op == allreduce || $op == broadcast ]] && v+=(nopush)
          v+=(uncalibrated)
        else
          [[ $op != allreduce ]] && v+=(nopull uncalibrated)
          v+=(nostaging)
          [[ $op != allreduce ]] && v+=(slots)
        fi
        ;;
      reducescatter) ((n >= 4)) && v+=(nostaging) ;;
    esac
  fi
  echo "${v[@]}"
}

# The environment that forces variant V.
env_of() {
  case $1 in
    tuner) ;;
    nopull) echo FERROCCL_CMA=0 ;;
    nopush) echo FERROCCL_CMA_PUSH=0 ;;
    nostaging) echo FERROCCL_SPREAD=0 ;;
    slots) echo FERROCCL_CMA=0 FERROCCL_SPREAD=0 ;;
    uncalibrated) echo FERROCCL_CALIBRATE=0 ;;
    *) echo "FERROCCL_ALGO=$1" ;;
  esac
}

echo "## $(date -u '+%Y-%m-%dT%H:%M:%SZ') nproc=$(nproc) load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "## $perf"
for t in $TRANSPORTS; do
  for n in $RANKS; do
    for op in $OPS; do
      case_name="$op-$n-$t"
      read -r -a others <<< "$(variants_of "$op" "$n" "$t")"
      if ((${#others[@]} == 0)); then
        echo "## $case_name: no choice to check"
        continue
      fi
      variants=(tuner "${others[@]}")
      for ((i = 1; i <= TURNS; i++)); do
        # Each turn starts one variant later, so that none always runs
        # first (a machine whose load drifts favours no one).
        for ((j = 0; j < ${#variants[@]}; j++)); do
          v=${variants[$(((j + i - 1) % ${#variants[@]}))]}
          # shellcheck disable=SC2207
          env_v=(FERROCCL_DEBUG=INFO $(env_of "$v"))
          [[ $t != default ]] && env_v+=(FERROCCL_TRANSPORT="$t")
          run_variant() {
            env "${env_v[@]}" "$perf" "$op" --ranks "$n" -b "$MINB" -e "$MAXB" -f "$FACTOR" \
              -n "$ITERS" -w "$WARMUP" -c 0 --csv "$out/$case_name-$v-$i.csv" \
              > "$out/$case_name-$v-$i.txt" 2> "$out/$case_name-$v-$i.log"
          }
          run_in_state "${TUNER_FAST_NS:-}" "${TUNER_STATE:-}" "$case_name $v $i" run_variant
        done
      done
      python3 "$here/tuner_summary.py" "$out" "$case_name" "$TURNS" "${others[@]}"
    done
  done
done
echo "## raw output in $out"
