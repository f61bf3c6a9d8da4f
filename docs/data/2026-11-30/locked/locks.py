import glob,re,collections,bisect,sys
lockaddrs={}
for l in open('/tmp/dis.txt'):
    m=re.match(r'^\s*([0-9a-f]+):\t(lock .*|xchg .*)$',l)
    if m and 'xchg   %ax,%ax' not in m.group(2): lockaddrs[int(m.group(1),16)]=m.group(2)
funcs=[]
for l in open('/tmp/dis.txt'):
    m=re.match(r'^([0-9a-f]+) <(.*)>:$',l)
    if m: funcs.append((int(m.group(1),16),m.group(2)))
starts=[f[0] for f in funcs]
def fname(a):
    i=bisect.bisect_right(starts,a)-1; return funcs[i][1][:90]
def num(x,prev):
    if x=='*': return prev
    if x[0] in '+-':
        v=int(x[1:],16) if x[1:].startswith('0x') else int(x[1:])
        return prev+v if x[0]=='+' else prev-v
    return int(x,16) if x.startswith('0x') else int(x)
N=int(sys.argv[1])
for f in sorted(glob.glob('/tmp/cgi/cg.*'))[1:]:
    cnt=collections.Counter(); addr=0; line=0; skip=False
    for l in open(f):
        if l.startswith('calls='): skip=True; continue
        t=l.split()
        if not t or not (t[0][0] in '+-*' or t[0].startswith('0x')): continue
        addr=num(t[0],addr)
        if len(t)>=3: line=num(t[1],line)
        if skip: skip=False; continue
        if len(t)>=3: cnt[addr]+=int(t[2])
    print(f)
    for a,c in sorted(cnt.items()):
        if a in lockaddrs and c>=N: print('  ',hex(a),c,lockaddrs[a],fname(a))
