import sys,glob,statistics,os,re
out=sys.argv[1]; a,b=sys.argv[2],sys.argv[3]
def read(nm):
    r={}
    for f in glob.glob(f"{out}/{nm}-[0-9]*.csv"):
        t=int(re.search(r"-(\d+)\.csv$",f).group(1))
        for line in open(f):
            p=line.strip().split(',')
            try: r[t]=(float(p[7]),float(p[11]))
            except: pass
    return r
A,B=read(a),read(b)
for k,name in ((0,'oop'),(1,'ip')):
    rs=sorted(A[t][k]/B[t][k] for t in A if t in B)
    print(name, "paired ratios", [round(x,2) for x in rs], "median", round(statistics.median(rs),3), "faster in", sum(x>1 for x in rs), "of", len(rs))
