/* What one copy of freshly written data between two processes costs,
 * both ways at once, by the kernel or out of shared memory: each round,
 * each process rewrites its own BYTES (as a training step rewrites its
 * gradients), reads its destination, meets the other, and copies the
 * peer's BYTES into its destination, timed alone; mode 0 with
 * process_vm_readv out of the peer's private (malloc'd) buffer, the copy
 * of ferroccl's pull (`exec::pull`) and of Open MPI's large messages;
 * mode 1 with memcpy out of the peer's buffer in shared memory, which is
 * where a copy through slots reads. Prints the mean of 2000 rounds.
 *
 * build: gcc -O2 -o /tmp/xcopy bench/bound/xcopy.c
 * run:   /tmp/xcopy BYTES 0|1      (e.g. /tmp/xcopy 262144 0)
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
struct sh { _Atomic long f[2][8]; char *buf[2]; pid_t pid[2]; };
static void bar(struct sh*s,int r,long g){atomic_store(&s->f[r][0],g);while(atomic_load(&s->f[1-r][0])<g){}}
int main(int argc,char**argv){
  size_t bytes=strtoul(argv[1],0,10); int mode=atoi(argv[2]); int iters=2000;
  struct sh *s=mmap(0,4096,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  char *shm=mmap(0,2*bytes,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  int r=fork()==0;
  char *b = mode==1 ? shm + r*bytes : aligned_alloc(4096,bytes);
  char *dst=aligned_alloc(4096,bytes); memset(dst,0,bytes); memset(b,1,bytes);
  s->buf[r]=b; s->pid[r]=getpid(); long g=0; bar(s,r,++g);
  char *pb = mode==1 ? shm + (1-r)*bytes : s->buf[1-r];
  double sum=0;
  for(long i=1;i<=iters;i++){
    memset(b,(int)i,bytes); volatile char c=0; for(size_t k=0;k<bytes;k+=64) c+=dst[k];
    bar(s,r,++g);
    double t=now();
    if(mode==1) memcpy(dst,pb,bytes);
    else { struct iovec l={dst,bytes}, rm={pb,bytes}; if(process_vm_readv(s->pid[1-r],&l,1,&rm,1,0)!=(ssize_t)bytes){perror("rv");return 1;} }
    sum+=now()-t;
    bar(s,r,++g);
    if(dst[bytes-1]!=(char)i){fprintf(stderr,"wrong\n");return 1;}
  }
  if(r==0){printf("both ways at once, %s, %zu bytes each: %.1f us (%.2f GB/s each)\n", mode==1?"memcpy out of shared memory":"process_vm_readv", bytes, sum/iters*1e6, bytes/(sum/iters)/1e9); wait(0);}
  return 0;
}
