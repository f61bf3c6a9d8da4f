#!/bin/bash
# per-call instructions by function: callgrind at two iteration counts, rank 0's process (largest pid of the two ranks: take both)
OP=$1; SZ=${2:-8}; BIN=${3:-/work/main/target/release/ferroccl-perf}
for n in 5000 15000; do
  rm -rf /tmp/cgd.$n; mkdir -p /tmp/cgd.$n
  FERROCCL_COPY=loop timeout 900 valgrind --tool=callgrind --trace-children=yes --callgrind-out-file=/tmp/cgd.$n/cg.%p $BIN $OP --ranks 2 -b $SZ -e $SZ -n $n -w 0 -c 0 >/dev/null 2>&1
done
python3 - "$@" <<'PY'
import subprocess,glob,collections,re,sys
def funcs(f):
    out=subprocess.run(['callgrind_annotate','--auto=no','--threshold=100',f],capture_output=True,text=True).stdout
    d=collections.Counter(); tot=0
    for l in out.splitlines():
        m=re.match(r'\s*([\d,]+) \([ \d.]+%\)\s+(\S.*?):(.*?)( \[.*\])?$',l)
        if m:
            d[m.group(3)]+=int(m.group(1).replace(',',''))
        m=re.match(r'\s*([\d,]+) \([ \d.]+%\)\s+PROGRAM TOTALS',l)
        if m: tot=int(m.group(1).replace(',',''))
    return d,tot
for rank in (0,1):
    fs=[sorted(glob.glob(f'/tmp/cgd.{n}/cg.*'), key=lambda p:int(p.split('.')[-1]))[1+rank] for n in (5000,15000)]
    (a,ta),(b,tb)=funcs(fs[0]),funcs(fs[1])
    calls=2*10000
    waitf=sum((b[k]-a.get(k,0)) for k in b if ('x)' not in k) and ('wait_said' in k or 'scan' in k or 'checkin::wait' in k or 'said_at' in k or 'num: usize' in k))/calls
    print(f"rank {rank}: total per call {(tb-ta)/calls:.0f} Ir, in waits {waitf:.0f}, rest {(tb-ta)/calls-waitf:.0f}")
    diffs=sorted(((b[k]-a.get(k,0))/calls,k) for k in b)[::-1]
    for v,k in [d for d in diffs if 'x)' not in d[1]][:int(sys.argv[4]) if len(sys.argv)>4 else 0]:
        if v>=3: print(f"  {v:7.0f}  {k[:110]}")
PY
