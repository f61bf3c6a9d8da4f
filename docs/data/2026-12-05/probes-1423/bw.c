// memcpy of S bytes (each process its own source and destination) on one
// CPU alone, then on both CPUs at once: where the two CPUs share a last-level
// cache, the two copies share its capacity and bandwidth.
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static double run(int cpu,size_t s,int reps){
  cpu_set_t c;CPU_ZERO(&c);CPU_SET(cpu,&c);sched_setaffinity(0,sizeof c,&c);
  char*a=malloc(s),*b=malloc(s);memset(a,1,s);memset(b,2,s);
  for(int i=0;i<3;i++)memcpy(b,a,s);
  double best=1e9;
  for(int i=0;i<reps;i++){double t=now();memcpy(b,a,s);t=now()-t;if(t<best)best=t;a[i%s]++;}
  return best*1e6;
}
int main(int argc,char**argv){
  size_t s=(size_t)atol(argv[1]);int reps=atoi(argv[2]);
  double alone=run(0,s,reps);
  int p[2];if(pipe(p))return 1;
  pid_t k=fork();
  if(!k){double t=run(1,s,reps);if(write(p[1],&t,sizeof t)<0)_exit(1);_exit(0);}
  double t0=run(0,s,reps),t1;if(read(p[0],&t1,sizeof t1)<0)return 1;waitpid(k,0,0);
  printf("%zu B: alone %.1f us, together %.1f / %.1f us (best of %d)\n",s,alone,t0,t1,reps);
}
