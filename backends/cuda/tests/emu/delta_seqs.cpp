// CPU emulation of kernels/delta.cu's multi-sequence kernels (tests/emu_delta.rs compiles
// it with the host C++ compiler): CUDA threads run one after another, which is exact for
// these kernels with use_sh = 0 (no cross-thread dependency; the conv kernels have none).
// Checks every output and state bitwise against each sequence computed alone (the
// kernels' sums in their order), 19 sequences of 1-5 tokens: two sequence tables.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <vector>
struct D3 { unsigned x, y, z; };
static D3 blockIdx, threadIdx, blockDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __syncthreads() do {} while (0)
static float SH[1 << 16];

typedef long long i64;

#include DELTA_CU  // delta.cu, `extern "C"` and its extern __shared__ array rewritten
template <class F> void launch(D3 grid, D3 block, F f) {
  blockDim = block;
  for (unsigned z = 0; z < grid.z; z++) for (unsigned y = 0; y < grid.y; y++) for (unsigned x = 0; x < grid.x; x++)
    for (unsigned tz = 0; tz < block.z; tz++) for (unsigned ty = 0; ty < block.y; ty++) for (unsigned tx = 0; tx < block.x; tx++) {
      blockIdx = {x, y, z}; threadIdx = {tx, ty, tz}; f();
    }
}
static unsigned long long rs = 88172645463325252ull;
float rnd() { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (float)((rs >> 11) % 2001) / 1000.0f - 1.0f; }
int main() {
  const int Dk = 16, Hk = 2, Dv = 24, Hv = 4, C = 40, dconv = 4, ns = dconv - 1;
  std::vector<int> lens = {3, 1, 5, 1, 2, 1, 1, 4, 1, 1, 1, 2, 1, 1, 3, 1, 1, 2, 1};  // 19: two tables
  int S = lens.size(), T = 0; std::vector<int> t0 = {0};
  for (int l : lens) { T += l; t0.push_back(T); }
  std::vector<float> q(T*Hk*Dk), k(T*Hk*Dk), v(T*Hv*Dv), g(T*Hv), beta(T*Hv), x(T*C), w(C*dconv);
  for (auto* a : {&q, &k, &v, &g, &beta, &x, &w}) for (auto& e : *a) e = rnd();
  for (auto& e : g) e = -std::fabs(e);
  std::vector<std::vector<float>> ssm(S, std::vector<float>(Hv*Dv*Dk)), cst(S, std::vector<float>(ns*C));
  for (auto& s : ssm) for (auto& e : s) e = rnd(); for (auto& s : cst) for (auto& e : s) e = rnd();
  auto ssm_ref = ssm; auto cst_ref = cst;
  // reference: each sequence alone, scalar, the kernel's sums in order
  std::vector<float> y_ref(T*Hv*Dv), yc_ref(T*C);
  float scale = 1.0f / sqrtf((float)Dk);
  for (int z = 0; z < S; z++) for (int h = 0; h < Hv; h++) for (int j = 0; j < Dv; j++) {
    float* s = &ssm_ref[z][((i64)h*Dv + j)*Dk]; int kh = h % Hk;
    for (int t = t0[z]; t < t0[z+1]; t++) {
      const float* qs = &q[((i64)t*Hk + kh)*Dk]; const float* ks = &k[((i64)t*Hk + kh)*Dk];
      float decay = expf(g[t*Hv + h]), bt = beta[t*Hv + h], kv = 0;
      for (int i = 0; i < Dk; i++) { s[i] *= decay; kv += s[i]*ks[i]; }
      float delta = (v[((i64)t*Hv + h)*Dv + j] - kv)*bt, o = 0;
      for (int i = 0; i < Dk; i++) { s[i] += ks[i]*delta; o += s[i]*qs[i]; }
      y_ref[((i64)t*Hv + h)*Dv + j] = o*scale;
    }
  }
  for (int z = 0; z < S; z++) {
    int L = lens[z];
    for (int t = 0; t < L; t++) for (int c = 0; c < C; c++) { float sum = 0;
      for (int i = 0; i < dconv; i++) { int r = t + i; float xv = r < ns ? cst_ref[z][r*C + c] : x[(t0[z] + r - ns)*C + c]; sum += xv*w[c*dconv + i]; }
      yc_ref[(t0[z] + t)*C + c] = sum; }
    std::vector<float> nw(ns*C);
    for (int r0 = 0; r0 < ns; r0++) for (int c = 0; c < C; c++) { int r = r0 + L; nw[r0*C + c] = r < ns ? cst_ref[z][r*C + c] : x[(t0[z] + r - ns)*C + c]; }
    cst_ref[z] = nw;
  }
  // the kernels, tables of 16 as SeqTab::groups makes them
  std::vector<float> y(T*Hv*Dv, NAN), yc(T*C, NAN);
  for (int a = 0; a < S; a += SEQ_TAB) {
    SeqTab ts, tc; int n = std::min(SEQ_TAB, S - a); ts.n = tc.n = n;
    for (int z = 0; z <= SEQ_TAB; z++) ts.t0[z] = tc.t0[z] = t0[std::min(a + z, S)];
    for (int z = 0; z < SEQ_TAB; z++) { ts.st[z] = z < n ? (unsigned long long)ssm[a+z].data() : 0; tc.st[z] = z < n ? (unsigned long long)cst[a+z].data() : 0; }
    int threads = 32;
    launch({(unsigned)Hv, (unsigned)((Dv + threads - 1)/threads), (unsigned)n}, {(unsigned)threads, 1, 1},
           [&] { delta_rule_seqs(ts, q.data(), k.data(), v.data(), g.data(), beta.data(), y.data(), Dk, Hk, Dv, Hv, scale, 0); });
    int toks = tc.t0[n] - tc.t0[0];
    launch({(unsigned)((C*toks + 255)/256), 1, 1}, {256, 1, 1}, [&] { conv1d_causal_seqs(tc, x.data(), w.data(), yc.data(), C, dconv); });
    std::vector<float> tmp(n*ns*C, NAN);
    launch({(unsigned)((ns*C + 255)/256), (unsigned)n, 1}, {256, 1, 1}, [&] { conv_state_update_seqs(tc, x.data(), tmp.data(), C, dconv); });
    launch({(unsigned)((ns*C + 255)/256), (unsigned)n, 1}, {256, 1, 1}, [&] { conv_state_store_seqs(tc, tmp.data(), C, dconv); });
  }
  int bad = 0;
  bad += memcmp(y.data(), y_ref.data(), 4*y.size()) != 0;
  bad += memcmp(yc.data(), yc_ref.data(), 4*yc.size()) != 0;
  for (int z = 0; z < S; z++) { bad += memcmp(ssm[z].data(), ssm_ref[z].data(), 4*ssm[z].size()) != 0; bad += memcmp(cst[z].data(), cst_ref[z].data(), 4*cst[z].size()) != 0; }
  printf("%d sequences (%d tokens), two tables: %s (%d mismatching arrays)\n", S, T, bad ? "MISMATCH" : "bitwise equal to each sequence alone", bad);
  return bad != 0;
}
