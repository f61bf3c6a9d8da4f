#!/bin/bash
# usage: [W=200] [RANKS=2] abx.sh OP MINB MAXB RUNS NITER bin1 bin2 ...
# The builds alternate run by run; prints medians [min-max] per size per
# build (out of place, us) and the time ratios first/other.
op=$1; lo=$2; hi=$3; runs=$4; n=$5; shift 5
W=${W:-200}; RANKS=${RANKS:-2}
raw=/tmp/abx.$$.raw; rm -f $raw
for r in $(seq $runs); do
  for b in "$@"; do
    rm -f /tmp/abx.$$.csv
    timeout 300 $b $op --ranks $RANKS -b $lo -e $hi -n $n -w $W --csv /tmp/abx.$$.csv >/dev/null 2>&1
    awk -F, -v b=$(basename $b) 'NR>1 {print b, $3, $8, $12}' /tmp/abx.$$.csv >> $raw
  done
done
python3 - $raw "$@" <<'PY'
import sys,statistics,collections
d=collections.defaultdict(list)
for l in open(sys.argv[1]):
    b,s,o,i=l.split()
    d[(b,int(s))].append(float(o))
bins=[a.split('/')[-1] for a in sys.argv[2:]]
sizes=sorted({s for _,s in d})
print('size '+' '.join(f'{b:>22}' for b in bins)+'  ratio(first/other) oop')
for s in sizes:
    row=[]
    for b in bins:
        v=d[(b,s)]; row.append(f'{statistics.median(v):7.3f} [{min(v):.2f}-{max(v):.2f}]')
    m0=statistics.median(d[(bins[0],s)])
    rat=' '.join(f'{m0/statistics.median(d[(b,s)]):.2f}' for b in bins[1:])
    print(f'{s:8d} '+' '.join(f'{r:>22}' for r in row)+'  '+rat)
PY
rm -f $raw /tmp/abx.$$.csv
