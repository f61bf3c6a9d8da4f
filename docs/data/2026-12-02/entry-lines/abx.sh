#!/bin/bash
# usage: abx.sh OP MINB MAXB RUNS NITER bin1 bin2 ...   -> medians per size per bin (out of place us)
op=$1; lo=$2; hi=$3; runs=$4; n=$5; shift 5
rm -f /tmp/abx.raw
for r in $(seq $runs); do
  for b in "$@"; do
    rm -f /tmp/c3.csv
    timeout 300 $b $op --ranks ${RANKS:-2} -b $lo -e $hi  -w ${W:-200} $( [ "$n" = 0 ] && echo "" || echo "-n $n") --csv /tmp/c3.csv >/dev/null 2>&1
    awk -F, -v b=$(basename $b) 'NR>1 {print b, $3, $8, ($12==""?$8:$12)}' /tmp/c3.csv >> /tmp/abx.raw
  done
done
python3 - "$@" <<'PY'
import sys,statistics,collections
d=collections.defaultdict(list); d2=collections.defaultdict(list)
for l in open('/tmp/abx.raw'):
    b,s,o,i=l.split()
    d[(b,int(s))].append(float(o)); d2[(b,int(s))].append(float(i))
bins=[a.split('/')[-1] for a in sys.argv[1:]]
sizes=sorted({s for _,s in d})
print('size '+' '.join(f'{b:>22}' for b in bins)+'  ratio(first/other) oop')
for s in sizes:
    row=[]
    for b in bins:
        v=d[(b,s)]; row.append(f'{statistics.median(v):7.3f} [{min(v):.2f}-{max(v):.2f}]')
    m0=statistics.median(d[(bins[0],s)])
    rat=' '.join(f'{m0/statistics.median(d[(b,s)]):.2f}' for b in bins[1:])
    print(f'{s:5d} '+' '.join(f'{r:>22}' for r in row)+'  '+rat)
PY
