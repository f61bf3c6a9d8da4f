import collections,statistics,sys
d=collections.defaultdict(list)
for l in open(sys.argv[1]):
    if l.startswith('#'): print(l.strip()); continue
    t,op,v,sz,us=l.split(); d[(op,int(sz),v)].append(float(us))
for op,sz in sorted({(k[0],k[1]) for k in d}):
    a=statistics.median(d[(op,sz,'main')]); b=statistics.median(d[(op,sz,'xp')])
    print(f"{op:10s} {sz:8d} main={a:.3f} xp={b:.3f} x={a/b:.2f}")
