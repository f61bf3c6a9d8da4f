import sys,collections,statistics
d=collections.defaultdict(list); xs=[]
for l in open(sys.argv[1]):
    if l.startswith('## xp='):
        x=l.split()[1]; xs.append(x) if x not in xs else None; print(l.strip()); continue
    f=l.split()
    if len(f)>10: d[(int(f[0]),x)].append((float(f[5]),float(f[9])))
for s in sorted(set(k[0] for k in d)):
    print(s, '  '.join(f"{x}: {statistics.median(a for a,b in d[(s,x)]):.2f}/{statistics.median(b for a,b in d[(s,x)]):.2f}" for x in xs))
