// kernels/attention.cu's decode kernels for several sequences (`kv_store_seqs`,
// `attn_kv_seqs`, one launch each per table of up to 16) against the single-sequence
// kernels (`kv_store`, `attn_kv`) launched once per sequence, under the CPU emulation
// (cuda_emu.h): every output row and every cache byte must be equal, for each cell format,
// with the Hadamard rotation, sink and window shadows, in plain and ring mode, for 17
// sequences at different positions (two tables), their tokens spread over the pass with
// other tokens between them (a mixed pass). tests/emu_kernels.rs builds and runs it.
#include "cuda_emu.h"
#include COMMON_CUH
#include ATTENTION_CU

static unsigned long long rs = 0x9e3779b97f4a7c15ull;
static float rnd() { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (float)((rs >> 11) % 20001) / 10000.0f - 1.0f; }

struct Cache {
    std::vector<u8> kc, vc;
    std::vector<u16> ks, vs, kw, vw;
};

int main() {
    const int D = 64, H = 4, Hkv = 2, sink = 2, window = 4, slots = 8, cap = 24, Z = 17, threads = 64;
    const float rsk = 0.125f, rsv = 0.125f, scale = 0.125f;
    int bad = 0, cases = 0;
    for (int ty = 0; ty < 4; ty++)
        for (int ring = 0; ring < 2; ring++) {
            int rb = ty == 0 ? 4 * D : ty == 1 ? 2 * D : ty == 2 ? D / 32 * 34 : D / 32 * 18;
            std::vector<Cache> a(Z);
            std::vector<int> len(Z);
            for (int z = 0; z < Z; z++) {
                Cache& c = a[z];
                c.kc.assign((size_t)Hkv * cap * rb, 0);
                c.vc = c.kc;
                c.ks.assign((size_t)Hkv * sink * D, 0);
                c.vs = c.ks;
                c.kw.assign((size_t)Hkv * slots * D, 0);
                c.vw = c.kw;
                // a history of its own length (past the capacity in ring mode): cells and
                // shadows of random values in the cell format (what kv_store would leave)
                len[z] = ring ? 1 + (z * 7) % (2 * cap) : 1 + (z * 5) % (cap - 1);
                for (auto* cells : {&c.kc, &c.vc})
                    for (size_t r = 0; r < cells->size() / rb; r++) {
                        u8* row = cells->data() + r * rb;
                        if (ty == 0)
                            for (int i = 0; i < D; i++) ((float*)row)[i] = rnd();
                        else if (ty == 1)
                            for (int i = 0; i < D; i++) ((u16*)row)[i] = emu_f2h(rnd());
                        else
                            for (int blk = 0; blk < D / 32; blk++) {
                                int bb = ty == 2 ? 34 : 18;
                                u16 d = emu_f2h(0.05f * rnd());
                                memcpy(row + blk * bb, &d, 2);
                                for (int i = 2; i < bb; i++) row[blk * bb + i] = (u8)(rs = rs * 6364136223846793005ull + 1) >> 7;
                            }
                    }
                for (auto* sh : {&c.ks, &c.vs, &c.kw, &c.vw})
                    for (auto& x : *sh) x = emu_f2h(rnd());
            }
            std::vector<Cache> b = a;
            // one token per sequence, sequence z's at index tok(z) of a pass of T tokens (the
            // others another sequence's), at position len[z]
            const int T = 2 * Z + 1;
            auto tok = [](int z) { return 2 * z + 1; };
            std::vector<float> q(T * H * D), k(T * Hkv * D), v(T * Hkv * D);
            for (auto* x : {&q, &k, &v})
                for (auto& e : *x) e = rnd();
            std::vector<int> pos(T, 0);
            for (int z = 0; z < Z; z++) pos[tok(z)] = len[z];
            std::vector<float> ya(T * H * D, NAN), yb(T * H * D, NAN), sa(H * cap), sb(16 * H * cap);
            for (int z = 0; z < Z; z++) {
                Cache& c = a[z];
                emu_launch({1, (unsigned)Hkv, 1}, {threads, 1, 1}, [&] {
                    kv_store(c.kc.data(), c.vc.data(), c.ks.data(), c.vs.data(), c.kw.data(), c.vw.data(), nullptr, nullptr,
                             k.data(), v.data(), pos.data(), tok(z), ty, D, Hkv, rb, cap, cap, ring, sink, slots, D, rsk, D, rsv);
                });
                emu_launch({(unsigned)H, 1, 1}, {threads, 1, 1}, [&] {
                    attn_kv(q.data(), c.kc.data(), c.vc.data(), c.ks.data(), c.vs.data(), c.kw.data(), c.vw.data(), pos.data(),
                            sa.data(), ya.data(), tok(z), ty, D, H, Hkv, rb, cap, cap, ring, sink, window, slots, cap, D, rsk, D, rsv,
                            scale);
                });
            }
            for (int z0 = 0; z0 < Z; z0 += KV_TAB) {
                int n = Z - z0 < KV_TAB ? Z - z0 : KV_TAB;
                KvTab tab{};
                tab.n = n;
                for (int z = 0; z < n; z++) {
                    Cache& c = b[z0 + z];
                    tab.kc[z] = (unsigned long long)c.kc.data();
                    tab.vc[z] = (unsigned long long)c.vc.data();
                    tab.ks[z] = (unsigned long long)c.ks.data();
                    tab.vs[z] = (unsigned long long)c.vs.data();
                    tab.kw[z] = (unsigned long long)c.kw.data();
                    tab.vw[z] = (unsigned long long)c.vw.data();
                    tab.tok[z] = tok(z0 + z);
                }
                emu_launch({(unsigned)n, (unsigned)Hkv, 1}, {threads, 1, 1}, [&] {
                    kv_store_seqs(tab, k.data(), v.data(), pos.data(), ty, D, Hkv, rb, cap, cap, ring, sink, slots, D, rsk, D, rsv);
                });
                emu_launch({(unsigned)H, (unsigned)n, 1}, {threads, 1, 1}, [&] {
                    attn_kv_seqs(tab, q.data(), pos.data(), sb.data(), yb.data(), ty, D, H, Hkv, rb, cap, cap, ring, sink, window,
                                 slots, cap, D, rsk, D, rsv, scale);
                });
            }
            int m = memcmp(ya.data(), yb.data(), 4 * ya.size()) != 0;
            for (int z = 0; z < Z; z++)
                for (int i = 0; i < H * D; i++) m += std::isnan(ya[(size_t)tok(z) * H * D + i]);
            for (int z = 0; z < Z; z++)
                m += a[z].kc != b[z].kc || a[z].vc != b[z].vc || a[z].ks != b[z].ks || a[z].vs != b[z].vs || a[z].kw != b[z].kw ||
                     a[z].vw != b[z].vw;
            printf("kv type %d, ring %d: %s\n", ty, ring, m ? "MISMATCH" : "equal");
            bad += m != 0;
            cases++;
        }
    printf("%d of %d cases: %s\n", cases - bad, cases, bad ? "MISMATCH" : "every row and cache byte equal to the per-sequence kernels");
    return bad != 0;
}
