#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void loop(char*d,const char*s,size_t n){size_t i=0;for(;i+32<=n;i+=32)_mm256_storeu_si256((__m256i*)(d+i),_mm256_loadu_si256((const __m256i*)(s+i)));memcpy(d+i,s+i,n-i);}
int main(int c,char**v){size_t n=atoi(v[1]);int off=atoi(v[2]);char*s=aligned_alloc(4096,n+4096),*d=aligned_alloc(4096,n+4096);memset(s,1,n+4096);memset(d,0,n+4096);
double b[2]={1e9,1e9};for(int r=0;r<16;r++){for(int w=0;w<2;w++){double t=now();for(int k=0;k<8;k++){if(w==0)memcpy(d+off,s,n);else loop(d+off,s,n);}double e=now()-t;if(e<b[w])b[w]=e;}}
printf("n=%zu off=%d memcpy %.1f GB/s loop %.1f GB/s\n",n,off,8*n/b[0]/1e9,8*n/b[1]/1e9);}
