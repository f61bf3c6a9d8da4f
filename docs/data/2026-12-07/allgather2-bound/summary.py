# usage: summary.py RUN.txt [LAST_TURN]: medians (min-max) of each program's
# time per call in µs by size, over turns 1..LAST_TURN (all by default)
import re,sys,statistics as st
last=int(sys.argv[2]) if len(sys.argv)>2 else 99
d={}
size=None
for l in open(sys.argv[1]):
    m=re.match(r'### turn (\d+) size (\d+)',l)
    if m: size=int(m.group(2)) if int(m.group(1))<=last else None; continue
    if size is None: continue
    f=l.split()
    if not f or f[0].startswith('#'): continue
    name=f[0]
    if name in('openmpi','intelmpi','ferroccl'): v=float(f[2])
    else:
        m=re.search(r'mean ([\d.]+) us',l); v=float(m.group(1))
    d.setdefault(size,{}).setdefault(name,[]).append(v)
names=['openmpi','intelmpi','ferroccl','staged','cma']
print('size',*names,'best-mpi/ferroccl',sep=' | ')
for s in sorted(d):
    r=d[s]; med={n:st.median(r[n]) for n in names if n in r}
    mpis=[med[n] for n in ('openmpi','intelmpi') if n in med]
    print(s,*[f"{med[n]:.1f} ({min(r[n]):.1f}-{max(r[n]):.1f})" if n in med else '-' for n in names], f"{min(mpis)/med['ferroccl']:.2f}",sep=' | ')
