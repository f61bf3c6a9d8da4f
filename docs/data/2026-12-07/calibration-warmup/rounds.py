import re,glob,sys
WIN=0.95
def rng(probes):
    r=None
    for k,(b,p,s) in enumerate(probes):
        if p<=s*WIN:
            up = 'inf' if k==len(probes)-1 else b
            r=(r[0] if r else b, up)
        elif r: break
    return r
for f in sorted(glob.glob(sys.argv[1]+'/*.txt'), key=lambda x:int(re.findall(r'(\d+)\.txt',x)[0])):
    R={}
    for l in open(f):
        m=re.match(r'XR (\d+) \[(.*)\]',l)
        if m: R[int(m.group(1))]=[float(x) for x in m.group(2).split(',')]
    t=[l.split()[5] for l in open(f) if re.match(r'^ +524288',l)]
    def dec(rounds):
        v=[min(R[r][i] for r in rounds) for i in range(6)]
        return rng([(65536,v[0],v[1]),(524288,v[2],v[3]),(2097152,v[4],v[5])])
    print(f.split('/')[-1], t, 'now(0,1):',dec([0,1]),' warm+2(1,2):',dec([1,2]),' warm+3(1,2,3):',dec([1,2,3]), ' all5:',dec(range(5)))
