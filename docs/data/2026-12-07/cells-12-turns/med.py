import sys,re,statistics as st
d={}
for line in open(sys.argv[1]):
    p=line.split()
    if not p or p[0].startswith('#'): continue
    m=p[0]
    for size,t in re.findall(r'(\d+) ([0-9.]+) \|', line):
        d.setdefault((int(size),m),[]).append(float(t))
sizes=sorted({k[0] for k in d})
ms=[]
for k in d:
    if k[1] not in ms: ms.append(k[1])
print("| size | "+" | ".join(f"{m} median (min-max)" for m in ms)+" | x (best peer / ferroccl) |")
print("|---:|"+"---:|"*len(ms)+"---:|")
for s in sizes:
    cells=[]; med={}
    for m in ms:
        v=d.get((s,m),[])
        if v: med[m]=st.median(v); cells.append(f"{med[m]:.2f} ({min(v):.2f}-{max(v):.2f}, n={len(v)})")
        else: cells.append("-")
    peers=[med[m] for m in ms if m!='ferroccl' and m in med]
    x=min(peers)/med['ferroccl'] if peers and 'ferroccl' in med else float('nan')
    print(f"| {s} | "+" | ".join(cells)+f" | {x:.2f} |")
