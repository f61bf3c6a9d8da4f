# Sourced by bench/ab.sh and bench/peers.sh: the machine's state, for a
# VM that flips between a fast and a slow state (the AMD EPYC build VM:
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
