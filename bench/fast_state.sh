# Sourced by bench/ab.sh, bench/peers.sh and bench/tuner-check.sh: the
# machine's state, for a VM that flips between a fast and a slow state (the AMD EPYC build VM:
# a cross-core round trip of 69-99 ns, or 370-500), so that a measurement
# can be kept to one state.

# The cross-core round trip in ns from the first line that the command
# "$@" prints ("... round trip R ns ...", as bench/bound/pingpong.c
# does); a large number where it prints none, so that a wait for the
# fast state ends by its limit.
round_trip() {
  local line
  line=$("$@" 2>&1 | head -1)
  [[ $line =~ round\ trip\ ([0-9]+)\ ns ]] && echo "${BASH_REMATCH[1]}" || echo 999999
}

# Wait, up to 10 minutes, until round_trip "${@:2}" is under $1 ns.
wait_fast() {
  local limit=$1 w
  shift
  for ((w = 0; w < 120; w++)); do
    (($(round_trip "$@") < limit)) && return 0
    sleep 5
  done
}

# Run "${@:4}" once where $1 (a limit in ns) is empty; else in the fast
# state that $2 (a command line printing "round trip R ns") reads: wait
# for it before the run, and run again (up to 5 times in all) while the
# state after the run is not under the limit. Where $2 is set its line
# before every try is printed, and every retake is, prefixed with
# "## $3: " (bench/ab.sh's turns, bench/tuner-check.sh's runs).
run_in_state() {
  local limit=$1 state=$2 label=$3 try after
  shift 3
  for ((try = 1; try <= 5; try++)); do
    # $state is a command line: split into its words.
    # shellcheck disable=SC2086
    [[ -n $limit ]] && wait_fast "$limit" $state
    [[ -n $state ]] && echo "## $label: $($state 2>&1 | head -1)"
    "$@"
    [[ -z $limit ]] && return 0
    # shellcheck disable=SC2086
    after=$(round_trip $state)
    ((after < limit)) && return 0
    echo "## $label: taken again, the state after it: $after ns"
  done
}
