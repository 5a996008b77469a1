// kernels/delta.cu's kernels (`delta_rule_seqs`, `conv1d_causal_seqs`,
// `conv_state_update_seqs`, `conv_state_store_seqs`) under the CPU emulation (cuda_emu.h):
// every output and state bitwise what each sequence gives alone (computed here with the
// kernels' sums in their order), 19 sequences of 1-5 tokens in two sequence tables, with
// q / k staged in shared memory (use_sh = 1) and read from global memory (0).
// tests/emu_kernels.rs builds and runs it.
#include "cuda_emu.h"
#include COMMON_CUH
#include DELTA_CU
#include <algorithm>
template <class F> void launch(Dim3 grid, Dim3 block, F f) { emu_launch(grid, block, f); }
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
  // the kernels, tables of 16 as SeqTab::groups makes them, q / k in shared memory or not
  int bad = 0;
  for (int use_sh = 0; use_sh < 2; use_sh++) {
    auto ssm_k = ssm, cst_k = cst;
    std::vector<float> y(T*Hv*Dv, NAN), yc(T*C, NAN);
    for (int a = 0; a < S; a += SEQ_TAB) {
      SeqTab ts, tc; int n = std::min(SEQ_TAB, S - a); ts.n = tc.n = n;
      for (int z = 0; z <= SEQ_TAB; z++) ts.t0[z] = tc.t0[z] = t0[std::min(a + z, S)];
      for (int z = 0; z < SEQ_TAB; z++) { ts.st[z] = z < n ? (unsigned long long)ssm_k[a+z].data() : 0; tc.st[z] = z < n ? (unsigned long long)cst_k[a+z].data() : 0; }
      int threads = 32;  // Dv = 24: threads past Dv go through the barriers too
      launch({(unsigned)Hv, (unsigned)((Dv + threads - 1)/threads), (unsigned)n}, {(unsigned)threads, 1, 1},
             [&] { delta_rule_seqs(ts, q.data(), k.data(), v.data(), g.data(), beta.data(), y.data(), Dk, Hk, Dv, Hv, scale, use_sh); });
      int toks = tc.t0[n] - tc.t0[0];
      launch({(unsigned)((C*toks + 255)/256), 1, 1}, {256, 1, 1}, [&] { conv1d_causal_seqs(tc, x.data(), w.data(), yc.data(), C, dconv); });
      std::vector<float> tmp(n*ns*C, NAN);
      launch({(unsigned)((ns*C + 255)/256), (unsigned)n, 1}, {256, 1, 1}, [&] { conv_state_update_seqs(tc, x.data(), tmp.data(), C, dconv); });
      launch({(unsigned)((ns*C + 255)/256), (unsigned)n, 1}, {256, 1, 1}, [&] { conv_state_store_seqs(tc, tmp.data(), C, dconv); });
    }
    bad += memcmp(y.data(), y_ref.data(), 4*y.size()) != 0;
    bad += memcmp(yc.data(), yc_ref.data(), 4*yc.size()) != 0;
    for (int z = 0; z < S; z++) { bad += memcmp(ssm_k[z].data(), ssm_ref[z].data(), 4*ssm_k[z].size()) != 0; bad += memcmp(cst_k[z].data(), cst_ref[z].data(), 4*cst_k[z].size()) != 0; }
  }
  printf("%d sequences (%d tokens), two tables: %s (%d mismatching arrays)\n", S, T, bad ? "MISMATCH" : "bitwise equal to each sequence alone", bad);
  return bad != 0;
}
