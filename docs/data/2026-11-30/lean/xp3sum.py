import collections,statistics,sys
d=collections.defaultdict(list); vs=[]
for l in open(sys.argv[1]):
    if l.startswith('#'): print(l.strip()); continue
    t,op,v,sz,us=l.split(); d[(op,int(sz),v)].append(float(us))
    if v not in vs: vs.append(v)
base=vs[0]
for op,sz in sorted({(k[0],k[1]) for k in d}):
    a=statistics.median(d[(op,sz,base)])
    print(f"{op:18s} {sz:6d} " + " ".join(f"{v}={statistics.median(d[(op,sz,v)]):.3f}({a/statistics.median(d[(op,sz,v)]):.2f})" for v in vs))
