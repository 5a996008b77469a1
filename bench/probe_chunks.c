// Streaming probe in chunks (docs/perf.md "Session 22"): reads a 1 GiB buffer in chunks of
// C bytes, the chunks in random order (R=1) or in turn (R=0), with bench/probe_stream.c's
// work per line (two `vpdpbusd` per 64 bytes on the nibbles) and a T1 prefetch DIST bytes
// ahead inside the chunk; prints the best GB/s of 6 passes. Shows whether reading MoE
// experts (0.6-0.9 MB each, scattered) costs bandwidth against one long stream.
//   gcc -O2 -march=native -o probe_chunks bench/probe_chunks.c
//   ./probe_chunks C R DIST   (two at once, as probe_stream)
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
int main(int argc,char**argv){ size_t C=atol(argv[1]); int R=atoi(argv[2]); size_t dist=atol(argv[3]);
 size_t n=1UL<<30; char*p=aligned_alloc(1<<21,n); madvise(p,n,MADV_HUGEPAGE); for(size_t i=0;i<n;i+=4096)p[i]=1;
 size_t nc=n/C; size_t*ord=malloc(nc*sizeof(size_t)); for(size_t i=0;i<nc;i++)ord[i]=i;
 srand(getpid()); if(R) for(size_t i=nc-1;i>0;i--){size_t j=rand()%(i+1); size_t t=ord[i];ord[i]=ord[j];ord[j]=t;}
 double best=0; __m512i a0=_mm512_setzero_si512(),a1=a0,a2=a0,a3=a0; __m512i m=_mm512_set1_epi8(15), b=_mm512_set1_epi8(3);
 for(int r=0;r<6;r++){ struct timespec ta,tb; clock_gettime(CLOCK_MONOTONIC,&ta);
  for(size_t c=0;c<nc;c++){ char*q=p+ord[c]*C;
   for(size_t i=0;i<C;i+=128){ if(i+dist<C){_mm_prefetch(q+i+dist,_MM_HINT_T1);_mm_prefetch(q+i+dist+64,_MM_HINT_T1);}
    __m512i v=_mm512_load_si512(q+i), u=_mm512_load_si512(q+i+64);
    __m512i lo=_mm512_and_si512(v,m), hi=_mm512_and_si512(_mm512_srli_epi16(v,4),m);
    __m512i lo2=_mm512_and_si512(u,m), hi2=_mm512_and_si512(_mm512_srli_epi16(u,4),m);
    a0=_mm512_dpbusd_epi32(a0,lo,b); a1=_mm512_dpbusd_epi32(a1,hi,b); a2=_mm512_dpbusd_epi32(a2,lo2,b); a3=_mm512_dpbusd_epi32(a3,hi2,b);}}
  clock_gettime(CLOCK_MONOTONIC,&tb); double t=(tb.tv_sec-ta.tv_sec)+(tb.tv_nsec-ta.tv_nsec)*1e-9; if(n/t/1e9>best)best=n/t/1e9;}
 a0=_mm512_add_epi32(a0,a1);a2=_mm512_add_epi32(a2,a3);a0=_mm512_add_epi32(a0,a2); int s[16]; _mm512_storeu_si512(s,a0);
 printf("C %zu R %d dist %zu: %.1f GB/s (%d)\n",C,R,dist,best,s[0]&1);}
