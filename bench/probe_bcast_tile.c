// x86_bcast8's inner loop (ops/src/quant/x86_bcast8.rs `ints`: per sub-block, 8 weight
// vectors decoded from nibbles, each into T = 4 tokens' `vpmaddubsw` with the activations
// already broadcast in memory, i16 chains, `vpmaddwd` by the scale) alone with its data in
// L1, as a chain (the kernel's order) and as a tree of the 8 products; products/ns, best of
// 11 alternated runs (docs/perf.md "Session 28": the kernel in the model runs well below
// this). The pragmas matter: without them gcc keeps the chains in memory (~3× slower).
//   gcc -O3 -mavx2 -mfma -o probe_bcast_tile bench/probe_bcast_tile.c && ./probe_bcast_tile
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define T 4
__attribute__((aligned(64))) uint8_t W[36*32];
__attribute__((aligned(64))) __m256i X[T*72];
__attribute__((aligned(64))) __m256i SC[16];
__attribute__((noinline)) void chain(long reps, __m256i* out){
  __m256i isum[T]; for(int j=0;j<T;j++) isum[j]=_mm256_setzero_si256();
  const __m256i m4=_mm256_set1_epi8(15);
  for(long r=0;r<reps;r++){
   for(int c=0;c<4;c++) for(int hi=0;hi<2;hi++){
    int s=2*c+hi; __m256i acc[T]; for(int j=0;j<T;j++) acc[j]=_mm256_setzero_si256();
    const uint8_t* b=W; __asm__ volatile("":"+r"(b));
    _Pragma("GCC unroll 8") for(int g=0;g<8;g++){
      __m256i q=_mm256_loadu_si256((const __m256i*)(b+32*(4+8*c+g)));
      __m256i v= hi==0? _mm256_and_si256(q,m4): _mm256_and_si256(_mm256_srli_epi16(q,4),m4);
      _Pragma("GCC unroll 8") for(int j=0;j<T;j++) acc[j]=_mm256_add_epi16(acc[j],_mm256_maddubs_epi16(v,X[72*j+8*s+g]));
    }
    for(int j=0;j<T;j++) isum[j]=_mm256_add_epi32(isum[j],_mm256_madd_epi16(acc[j],SC[s]));
   }
   __asm__ volatile(""::"r"(isum):"memory");
  }
  for(int j=0;j<T;j++) out[j]=isum[j];
}
__attribute__((noinline)) void tree(long reps, __m256i* out){
  __m256i isum[T]; for(int j=0;j<T;j++) isum[j]=_mm256_setzero_si256();
  const __m256i m4=_mm256_set1_epi8(15);
  for(long r=0;r<reps;r++){
   for(int c=0;c<4;c++) for(int hi=0;hi<2;hi++){
    int s=2*c+hi;
    const uint8_t* b=W; __asm__ volatile("":"+r"(b));
    __m256i v[8];
    for(int g=0;g<8;g++){ __m256i q=_mm256_loadu_si256((const __m256i*)(b+32*(4+8*c+g))); v[g]= hi==0? _mm256_and_si256(q,m4): _mm256_and_si256(_mm256_srli_epi16(q,4),m4);}
    for(int j=0;j<T;j++){
      const __m256i*y=X+72*j+8*s;
      __m256i p0=_mm256_maddubs_epi16(v[0],y[0]),p1=_mm256_maddubs_epi16(v[1],y[1]),p2=_mm256_maddubs_epi16(v[2],y[2]),p3=_mm256_maddubs_epi16(v[3],y[3]);
      __m256i p4=_mm256_maddubs_epi16(v[4],y[4]),p5=_mm256_maddubs_epi16(v[5],y[5]),p6=_mm256_maddubs_epi16(v[6],y[6]),p7=_mm256_maddubs_epi16(v[7],y[7]);
      __m256i acc=_mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(p0,p1),_mm256_add_epi16(p2,p3)),_mm256_add_epi16(_mm256_add_epi16(p4,p5),_mm256_add_epi16(p6,p7)));
      isum[j]=_mm256_add_epi32(isum[j],_mm256_madd_epi16(acc,SC[s]));
    }
   }
   __asm__ volatile(""::"r"(isum):"memory");
  }
  for(int j=0;j<T;j++) out[j]=isum[j];
}
int main(){
  for(int i=0;i<sizeof W;i++)W[i]=i*7; for(int i=0;i<sizeof X;i++)((int8_t*)X)[i]=i*5&63;
  for(int i=0;i<16;i++) SC[i]=_mm256_set1_epi16(i+1);
  long reps=1000000; __m256i o[T]; double b1=1e9,b2=1e9;
  for(int t=0;t<11;t++){ double t0=now(); chain(reps,o); double a=now()-t0; if(a<b1)b1=a; t0=now(); tree(reps,o); a=now()-t0; if(a<b2)b2=a; }
  double prods=(double)reps*T*256*8;
  printf("chain %.1f tree %.1f products/ns\n", prods/b1/1e9, prods/b2/1e9);
}
