// pn's AVX2 8-row product loop (x86_pack8::dot8: per sub-block 8 weight vectors in
// registers, per token 8 `vpbroadcastd` + 8 `vpmaddubsw`, an i16 tree, `vpmaddwd` by the
// scale, the i32 sum in memory) against the same loop reading activations already
// broadcast in memory (a 2 KB vector per token and super-block, folded into the
// `vpmaddubsw`), in L1; best of 15 alternated runs, products/ns (docs/perf.md "Session 26").
//   gcc -O2 -mavx2 -mfma -o probe_prebroadcast bench/probe_prebroadcast.c && ./probe_prebroadcast
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define M 8
__attribute__((aligned(64))) uint8_t W[8*32*8];
__attribute__((aligned(64))) int8_t A[M][256+64];
__attribute__((aligned(64))) __m256i X[M*8*8+40];
#define BC(p) _mm256_set1_epi32(*(const int32_t*)(p))
#define LW __m256i w0=_mm256_load_si256((__m256i*)(W+32*(8*s+0))),w1=_mm256_load_si256((__m256i*)(W+32*(8*s+1))),w2=_mm256_load_si256((__m256i*)(W+32*(8*s+2))),w3=_mm256_load_si256((__m256i*)(W+32*(8*s+3))),w4=_mm256_load_si256((__m256i*)(W+32*(8*s+4))),w5=_mm256_load_si256((__m256i*)(W+32*(8*s+5))),w6=_mm256_load_si256((__m256i*)(W+32*(8*s+6))),w7=_mm256_load_si256((__m256i*)(W+32*(8*s+7)));
__attribute__((noinline)) void v1(long reps, __m256i* out){
  __m256i isum[M]; for(int j=0;j<M;j++) isum[j]=_mm256_setzero_si256();
  for(long r=0;r<reps;r++){
   for(int s=0;s<8;s++){
    LW
    __m256i sc=_mm256_set1_epi16(s+1);
    for(int j=0;j<M;j++){
      const int8_t*y=A[j]+32*s;
      __m256i p0=_mm256_maddubs_epi16(w0,BC(y)),p1=_mm256_maddubs_epi16(w1,BC(y+4)),p2=_mm256_maddubs_epi16(w2,BC(y+8)),p3=_mm256_maddubs_epi16(w3,BC(y+12));
      __m256i p4=_mm256_maddubs_epi16(w4,BC(y+16)),p5=_mm256_maddubs_epi16(w5,BC(y+20)),p6=_mm256_maddubs_epi16(w6,BC(y+24)),p7=_mm256_maddubs_epi16(w7,BC(y+28));
      __m256i acc=_mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(p0,p1),_mm256_add_epi16(p2,p3)),_mm256_add_epi16(_mm256_add_epi16(p4,p5),_mm256_add_epi16(p6,p7)));
      isum[j]=_mm256_add_epi32(isum[j],_mm256_madd_epi16(acc,sc));
    }
   }
   __asm__ volatile(""::"r"(isum):"memory");
  }
  for(int j=0;j<M;j++) out[j]=isum[j];
}
__attribute__((noinline)) void v4(long reps, __m256i* out){
  __m256i isum[M]; for(int j=0;j<M;j++) isum[j]=_mm256_setzero_si256();
  for(long r=0;r<reps;r++){
   for(int s=0;s<8;s++){
    LW
    __m256i sc=_mm256_set1_epi16(s+1);
    for(int j=0;j<M;j++){
      const __m256i*y=X+ (s*M+j)*8;   // layout: block s, token j, 8 groups contiguous (256 B)
      __m256i p0=_mm256_maddubs_epi16(w0,y[0]),p1=_mm256_maddubs_epi16(w1,y[1]),p2=_mm256_maddubs_epi16(w2,y[2]),p3=_mm256_maddubs_epi16(w3,y[3]);
      __m256i p4=_mm256_maddubs_epi16(w4,y[4]),p5=_mm256_maddubs_epi16(w5,y[5]),p6=_mm256_maddubs_epi16(w6,y[6]),p7=_mm256_maddubs_epi16(w7,y[7]);
      __m256i acc=_mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(p0,p1),_mm256_add_epi16(p2,p3)),_mm256_add_epi16(_mm256_add_epi16(p4,p5),_mm256_add_epi16(p6,p7)));
      isum[j]=_mm256_add_epi32(isum[j],_mm256_madd_epi16(acc,sc));
    }
   }
   __asm__ volatile(""::"r"(isum):"memory");
  }
  for(int j=0;j<M;j++) out[j]=isum[j];
}
int main(){
  for(int i=0;i<sizeof W;i++)W[i]=i*7&15; for(int j=0;j<M;j++)for(int i=0;i<320;i++)A[j][i]=(i*13+j)&127;
  for(int i=0;i<sizeof X;i++)((int8_t*)X)[i]=i*5&63;
  long reps=400000; __m256i o[M];
  double b1=1e9,b4=1e9;
  for(int t=0;t<15;t++){
   double t0=now(); v1(reps,o); double a=now()-t0; if(a<b1)b1=a;
   t0=now(); v4(reps,o); double d=now()-t0; if(d<b4)b4=d;
  }
  double prods=(double)reps*8*M*256;
  printf("best: v1 (bcast) %.1f  v4 (pre-broadcast, folded) %.1f products/ns\n", prods/b1/1e9, prods/b4/1e9);
}
