// Streaming probe (docs/perf.md "Session 15"): reads a 1 GiB buffer (or a WINDOW-byte
// part of it, cycled) 128 bytes at a time with OPS/2 `vpdpbusd` per 64-byte line on the
// nibbles, and prints the best GB/s of 6 passes. Shows whether compute of a decode
// kernel's weight overlaps with streaming it from memory.
//   gcc -O2 -march=native -DOPS=2 -o probe bench/probe_stream.c
//   ./probe MODE DIST WINDOW   (two at once: ./probe 1 8192 1073741824 & ./probe 1 8192 1073741824)
// MODE 0: no software prefetch; 1: T1 prefetch of every line DIST bytes ahead; 3: T0;
// 2: T1 of the first two lines of each 4 KB page only.
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#ifndef OPS
#define OPS 4
#endif
int main(int argc,char**argv){ int mode=atoi(argv[1]); size_t dist=atol(argv[2]); size_t w=atol(argv[3]);
 size_t n=1UL<<30; char*p=aligned_alloc(1<<21,n); madvise(p,n,MADV_HUGEPAGE); memset(p,1,n);
 double best=0; __m512i a0=_mm512_setzero_si512(),a1=a0,a2=a0,a3=a0,a4=a0,a5=a0,a6=a0,a7=a0;
 __m512i m=_mm512_set1_epi8(15), b=_mm512_set1_epi8(3);
 for(int r=0;r<6;r++){ struct timespec ta,tb; clock_gettime(CLOCK_MONOTONIC,&ta);
  for(size_t i=0;i<n;i+=128){ size_t j=i&(w-1);
    if(mode==1){ _mm_prefetch(p+j+dist,_MM_HINT_T1); _mm_prefetch(p+j+dist+64,_MM_HINT_T1);}
    else if(mode==3){ _mm_prefetch(p+j+dist,_MM_HINT_T0); _mm_prefetch(p+j+dist+64,_MM_HINT_T0);}
    else if(mode==2 && ((j&4095)<128)) _mm_prefetch(p+j+dist,_MM_HINT_T1);
    __m512i v=_mm512_load_si512(p+j), u=_mm512_load_si512(p+j+64);
    __m512i lo=_mm512_and_si512(v,m), hi=_mm512_and_si512(_mm512_srli_epi16(v,4),m);
    __m512i lo2=_mm512_and_si512(u,m), hi2=_mm512_and_si512(_mm512_srli_epi16(u,4),m);
#if OPS>=2
    a0=_mm512_dpbusd_epi32(a0,lo,b); a1=_mm512_dpbusd_epi32(a1,hi,b);
    a2=_mm512_dpbusd_epi32(a2,lo2,b); a3=_mm512_dpbusd_epi32(a3,hi2,b);
#endif
#if OPS>=4
    a4=_mm512_dpbusd_epi32(a4,lo,hi); a5=_mm512_dpbusd_epi32(a5,hi,lo);
    a6=_mm512_dpbusd_epi32(a6,lo2,hi2); a7=_mm512_dpbusd_epi32(a7,hi2,lo2);
#endif
#if OPS>=8
    a0=_mm512_dpbusd_epi32(a0,lo,hi2); a1=_mm512_dpbusd_epi32(a1,hi,lo2);
    a2=_mm512_dpbusd_epi32(a2,lo2,hi); a3=_mm512_dpbusd_epi32(a3,hi2,lo);
    a4=_mm512_dpbusd_epi32(a4,lo,lo2); a5=_mm512_dpbusd_epi32(a5,hi,hi2);
    a6=_mm512_dpbusd_epi32(a6,lo2,lo); a7=_mm512_dpbusd_epi32(a7,hi2,hi);
#endif
#if OPS==0
    a0=_mm512_add_epi32(a0,lo); a1=_mm512_add_epi32(a1,hi2);
#endif
  }
  clock_gettime(CLOCK_MONOTONIC,&tb); double t=(tb.tv_sec-ta.tv_sec)+(tb.tv_nsec-ta.tv_nsec)*1e-9; if(n/t/1e9>best)best=n/t/1e9;}
 a0=_mm512_add_epi32(a0,a1);a2=_mm512_add_epi32(a2,a3);a4=_mm512_add_epi32(a4,a5);a6=_mm512_add_epi32(a6,a7);a0=_mm512_add_epi32(a0,a2);a4=_mm512_add_epi32(a4,a6);a0=_mm512_add_epi32(a0,a4);
 int s[16]; _mm512_storeu_si512(s,a0); printf("ops/line %d mode %d dist %zu w %zu: %.1f GB/s (%d)\n",OPS/2,mode,dist,w,best,s[0]&1); }
