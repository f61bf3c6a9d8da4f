#!/bin/bash
# usage: run.sh OUT OP RANKS BYTES ITERS TURNS BIN...
# (the builds in turns, gated on the VM's fast state, alternating their order)
out=$1 op=$2 n=$3 b=$4 it=$5 turns=$6; shift 6
cd /work/main; . bench/fast_state.sh
mkdir -p $out
for ((t=1;t<=turns;t++)); do
  # Every other turn in the reverse order: the build run right after
  # another one gained up to 1.2x on 4 ranks (the same binary twice).
  if ((t % 2)); then order=("$@"); else order=(); for ((i=$#;i>=1;i--)); do order+=("${!i}"); done; fi
  for bin in "${order[@]}"; do
    nm=$(basename $bin)
    for try in 1 2 3 4 5; do
      wait_fast 150 /tmp/ferroccl-peers/pingpong
      $bin $op --ranks $n -b $b -e $b -n $it -w 1000 -c 0 --csv $out/$nm-$t.csv > /dev/null 2>&1
      after=$(round_trip /tmp/ferroccl-peers/pingpong); ((after < 150)) && break
    done
  done
done
python3 - "$out" "$@" <<'PY'
import sys,glob,statistics,os
out=sys.argv[1]; bins=[os.path.basename(b) for b in sys.argv[2:]]
meds={}
for b in bins:
    oop=[];ip=[]
    for f in sorted(glob.glob(f"{out}/{b}-[0-9]*.csv")):
        for line in open(f):
            p=line.strip().split(',')
            try: oop.append(float(p[7])); ip.append(float(p[11]) if len(p)>11 else float('nan'))
            except: pass
    meds[b]=(statistics.median(oop), statistics.median(ip))
    print(f"{b}: oop {sorted(oop)} median {meds[b][0]:.4f}; ip median {meds[b][1]:.4f}")
base=bins[0]
for b in bins[1:]:
    print(f"{b} vs {base}: oop {meds[base][0]/meds[b][0]:.3f}x ip {meds[base][1]/meds[b][1]:.3f}x")
PY
