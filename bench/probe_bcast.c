// Does a broadcast load take a vector-pipe slot? (docs/perf.md "Session 26"). One loop of
// 8 independent `vpmaddubsw` + 8 `vpaddw` (the mix of pn's AVX2 product loop), then the
// same with 8 `vpbroadcastd ymm, m32` added; prints cycles an iteration at 3.1 GHz (the
// Zen 3 box's clock, measured by a dependent-add chain). If the broadcasts were load-port
// only, the second loop would cost what the first does.
//   gcc -O2 -mavx2 -o probe_bcast bench/probe_bcast.c && ./probe_bcast
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
// the product loop's mix: 8 vpmaddubsw (8 chains) and 8 vpaddw (4 chains)
#define MIX \
  "vpmaddubsw %[b],%[a0],%[a0]\n\tvpmaddubsw %[b],%[a1],%[a1]\n\tvpmaddubsw %[b],%[a2],%[a2]\n\tvpmaddubsw %[b],%[a3],%[a3]\n\t" \
  "vpaddw %[b],%[c0],%[c0]\n\tvpaddw %[b],%[c1],%[c1]\n\tvpaddw %[b],%[c2],%[c2]\n\tvpaddw %[b],%[c3],%[c3]\n\t" \
  "vpaddw %[b],%[c0],%[c0]\n\tvpaddw %[b],%[c1],%[c1]\n\tvpaddw %[b],%[c2],%[c2]\n\tvpaddw %[b],%[c3],%[c3]\n\t" \
  "vpmaddubsw %[b],%[a4],%[a4]\n\tvpmaddubsw %[b],%[a5],%[a5]\n\tvpmaddubsw %[b],%[a6],%[a6]\n\tvpmaddubsw %[b],%[a7],%[a7]\n\t" \

#define OUTS [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5), \
  [a6] "+x"(a6), [a7] "+x"(a7), [c0] "+x"(c0), [c1] "+x"(c1), [c2] "+x"(c2), [c3] "+x"(c3)
__attribute__((aligned(64))) int32_t buf[64];
int main(){
  long n=100000000;
  for(int t=0;t<3;t++){
  __m256i a0=_mm256_set1_epi8(1),a1=a0,a2=a0,a3=a0,a4=a0,a5=a0,a6=a0,a7=a0,b=a0,c0=a0,c1=a0,c2=a0,c3=a0, x=a0;
  const int32_t*p=buf;
  double t0=now();
  for(long i=0;i<n;i++){
    __asm__ volatile(
    MIX
    : OUTS : [b] "x"(b));
  }
  double e1=now()-t0; t0=now();
  for(long i=0;i<n;i++){
    __asm__ volatile(
    MIX
    "vpbroadcastd (%[p]),%[x]\n\tvpbroadcastd 4(%[p]),%[x]\n\tvpbroadcastd 8(%[p]),%[x]\n\tvpbroadcastd 12(%[p]),%[x]\n\t"
    "vpbroadcastd 16(%[p]),%[x]\n\tvpbroadcastd 20(%[p]),%[x]\n\tvpbroadcastd 24(%[p]),%[x]\n\tvpbroadcastd 28(%[p]),%[x]\n\t"
    : OUTS, [x] "=x"(x) : [b] "x"(b), [p] "r"(p));
  }
  double e2=now()-t0;
  printf("8 maddubs+8 paddw: %.2f cycles/iter at 3.1 GHz; +8 bcast: %.2f\n", e1/n*3.1e9, e2/n*3.1e9);
  }
}
