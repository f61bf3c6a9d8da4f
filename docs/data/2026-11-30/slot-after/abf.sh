#!/bin/bash
# A/B of binaries, each run in the fast state (retaken if it flipped): abf.sh OP N MINB MAXB BIN...
op=$1; n=$2; minb=$3; maxb=$4; shift 4
for t in 1 2 3; do for x in "$@"; do
  for try in 1 2 3 4 5 6; do
    /tmp/waitfast.sh >/dev/null
    pre=$(/tmp/pingpong)
    outp=$($x $op --ranks $n -b $minb -e $maxb -f ${FACTOR:-2} -n ${ITERS:-2000} -w 200 -c 0 ${EXTRA:-} 2>&1 | grep -v "^#" | grep -v "^$")
    post=$(/tmp/pingpong)
    rt=$(echo "$post" | sed -E 's/.*round trip ([0-9]+) ns.*/\1/')
    if [ "$rt" -lt 150 ]; then break; fi
  done
  echo "## xp=$x turn $t pre: $pre post: $post"; echo "$outp"
done; done
