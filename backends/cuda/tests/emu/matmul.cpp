// kernels/matmul.cu's `mm_<format>` kernels under the CPU emulation (cuda_emu.h), for
// tests/emu_kernels.rs: `matmul FORMAT IN OUT` reads N, nb, P, the weight and activation
// row sizes, the experts, the bytes between experts and the pairs per activation row
// (little-endian i64 header), then the experts' weight rows, the activation rows (in the
// format's vec-dot type) and, with more than one expert, each pair's expert id (i32); runs
// the kernel with the launch geometry of ops_linear.rs `mm` (grid ceil(N / MM_WARPS) ×
// ceil(P / NT), 128 threads) and writes the P × N outputs; the test compares them with
// pn-ops' `vec_dot`.
#include "cuda_emu.h"
#include COMMON_CUH
#include BLOCKS_CUH
#include MATMUL_CU
#include <string>

struct Mm {
    const char* name;
    void (*f)(MM_ARGS);
    int nt;
};
#define QENT(name, F) {#name, mm_##name, MM_NT},
#define FENT(name, F) {#name, mm_##name, MMF_NT},
static const Mm TABLE[] = {PN_QUANT_FORMATS(QENT) PN_FLOAT_FORMATS(FENT)};

int main(int argc, char** argv) {
    if (argc != 4) return 2;
    const Mm* mm = nullptr;
    for (const Mm& m : TABLE)
        if (std::string(m.name) == argv[1]) mm = &m;
    if (!mm) {
        printf("no kernel mm_%s\n", argv[1]);
        return 2;
    }
    FILE* in = fopen(argv[2], "rb");
    if (!in) return 2;
    long long h[8];
    if (fread(h, 8, 8, in) != 8) return 2;
    long long N = h[0], nb = h[1], P = h[2], w_rb = h[3], a_rb = h[4], n_exp = h[5], estride = h[6], act_div = h[7];
    std::vector<u8> w(n_exp * estride), a((P + act_div - 1) / act_div * a_rb);
    std::vector<int> ids(n_exp > 1 ? P : 0);
    if (fread(w.data(), 1, w.size(), in) != w.size() || fread(a.data(), 1, a.size(), in) != a.size() ||
        fread(ids.data(), 4, ids.size(), in) != ids.size())
        return 2;
    fclose(in);
    std::vector<float> y(P * N, 12345.0f);
    const int* idp = n_exp > 1 ? ids.data() : nullptr;
    emu_launch({(unsigned)((N + MM_WARPS - 1) / MM_WARPS), (unsigned)((P + mm->nt - 1) / mm->nt), 1}, {32 * MM_WARPS, 1, 1}, [&] {
        mm->f(w.data(), w_rb, estride, idp, (int)n_exp, a.data(), a_rb, (int)act_div, y.data(), (int)N, (int)nb, (int)P);
    });
    FILE* out = fopen(argv[3], "wb");
    if (!out || fwrite(y.data(), 4, y.size(), out) != y.size()) return 2;
    fclose(out);
    printf("mm_%s: %lld rows x %lld pairs\n", argv[1], N, P);
    return 0;
}
