// Two-thread streaming probe, one process (docs/perf.md "Session 23"): each of NT threads
// reads its own share of a 1 GiB buffer (huge pages) with T1 prefetch DIST bytes ahead and
// 2 `vpdpbusd` a 64-byte line (without AVX-512 VNNI: a `vpmaddubsw` a 32 bytes), the threads meeting at a barrier before and after every
// pass, so a pass's time is the concurrent rate of all the threads together — what a
// decode step's two threads can get. (`probe_stream.c` run twice at once sums two
// processes' best passes, which need not have overlapped.) Prints the best and the median
// of 8 passes, GB/s.
//   gcc -O2 -march=native -pthread -o probe_threads bench/probe_threads.c
//   ./probe_threads 2 8192 1073741824
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#define PASSES 8
static size_t n, dist;
static char *buf;
static pthread_barrier_t bar;
static int nt, sink[64];
static double gs[PASSES];
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
static void *run(void *arg) {
  long id = (long)arg;
  size_t part = n / nt;
  char *p = buf + id * part;
#ifdef __AVX512VNNI__
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  __m512i m = _mm512_set1_epi8(15), b = _mm512_set1_epi8(3);
#else
  // plain AVX2 (no VNNI): 4 × 32 bytes a 128-byte step, each `vpmaddubsw` + an i16 add
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  __m256i m = _mm256_set1_epi8(15), b = _mm256_set1_epi8(3);
#endif
  for (int r = 0; r < PASSES; r++) {
    pthread_barrier_wait(&bar);
    double t0 = now();
    for (size_t j = 0; j < part; j += 128) {
      _mm_prefetch(p + j + dist, _MM_HINT_T1);
      _mm_prefetch(p + j + dist + 64, _MM_HINT_T1);
#ifdef __AVX512VNNI__
      __m512i v = _mm512_load_si512(p + j), u = _mm512_load_si512(p + j + 64);
      a0 = _mm512_dpbusd_epi32(a0, _mm512_and_si512(v, m), b);
      a1 = _mm512_dpbusd_epi32(a1, _mm512_and_si512(_mm512_srli_epi16(v, 4), m), b);
      a2 = _mm512_dpbusd_epi32(a2, _mm512_and_si512(u, m), b);
      a3 = _mm512_dpbusd_epi32(a3, _mm512_and_si512(_mm512_srli_epi16(u, 4), m), b);
#else
      __m256i v0 = _mm256_load_si256((const __m256i *)(p + j)), v1 = _mm256_load_si256((const __m256i *)(p + j + 32));
      __m256i v2 = _mm256_load_si256((const __m256i *)(p + j + 64)), v3 = _mm256_load_si256((const __m256i *)(p + j + 96));
      a0 = _mm256_add_epi16(a0, _mm256_maddubs_epi16(_mm256_and_si256(v0, m), b));
      a1 = _mm256_add_epi16(a1, _mm256_maddubs_epi16(_mm256_and_si256(v1, m), b));
      a2 = _mm256_add_epi16(a2, _mm256_maddubs_epi16(_mm256_and_si256(v2, m), b));
      a3 = _mm256_add_epi16(a3, _mm256_maddubs_epi16(_mm256_and_si256(v3, m), b));
#endif
    }
    pthread_barrier_wait(&bar);
    if (id == 0) gs[r] = n / (now() - t0) / 1e9;
  }
  int s[16];
#ifdef __AVX512VNNI__
  _mm512_storeu_si512(s, _mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)));
#else
  _mm256_storeu_si256((__m256i *)s, _mm256_add_epi16(_mm256_add_epi16(a0, a1), _mm256_add_epi16(a2, a3)));
#endif
  sink[id] = s[0];
  return 0;
}
int main(int argc, char **argv) {
  if (argc < 4) { fprintf(stderr, "usage: %s THREADS DIST BYTES\n", argv[0]); return 2; }
  nt = atoi(argv[1]); dist = atol(argv[2]); n = (size_t)atol(argv[3]);
  if (nt < 1 || nt > 64) { fprintf(stderr, "THREADS: 1..64\n"); return 2; }
  size_t len = n + (1 << 20);
  buf = aligned_alloc(1 << 21, (len + (1 << 21) - 1) / (1 << 21) * (1 << 21));
  madvise(buf, len, MADV_HUGEPAGE);
  memset(buf, 1, len);
  pthread_barrier_init(&bar, 0, nt);
  pthread_t th[64];
  for (long i = 0; i < nt; i++) pthread_create(&th[i], 0, run, (void *)i);
  for (int i = 0; i < nt; i++) pthread_join(th[i], 0);
  qsort(gs, PASSES, sizeof(double), cmpd);
  printf("%d threads, dist %zu, %zu bytes: best %.2f median %.2f GB/s (%d)\n", nt, dist, n, gs[PASSES - 1], (gs[PASSES / 2 - 1] + gs[PASSES / 2]) / 2, sink[0] & 1);
  return 0;
}
