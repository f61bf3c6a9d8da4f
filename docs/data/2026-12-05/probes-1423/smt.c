// Throughput of an ALU-bound loop on one CPU alone and on both CPUs at once:
// SMT siblings share one core's execution units (each runs ~half speed
// when both run); two cores do not.
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static double work(int cpu){
  cpu_set_t s;CPU_ZERO(&s);CPU_SET(cpu,&s);sched_setaffinity(0,sizeof s,&s);
  volatile unsigned long sink; unsigned long a=1,b=2,c=3,d=4,e=5,f=6;
  double t=now();
  for(long i=0;i<400000000L;i++){a+=i;b^=a;c+=b;d^=i;e+=d;f^=e;}
  sink=a+b+c+d+e+f;(void)sink;
  return now()-t;
}
int main(void){
  double alone=work(0);
  int p[2];pipe(p);
  pid_t k=fork();
  if(!k){double t=work(1);write(p[1],&t,sizeof t);_exit(0);}
  double t0=work(0),t1;read(p[0],&t1,sizeof t1);waitpid(k,0,0);
  printf("alone %.3f s, together %.3f / %.3f s, ratio %.2f\n",alone,t0,t1,(t0+t1)/2/alone);
}
