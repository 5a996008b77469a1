// kernels/matmul.cu's `mm_<format>` kernels under the CPU emulation (cuda_emu.h), for
// tests/emu_kernels.rs: `matmul FORMAT IN OUT` reads N, nb, P, the weight and activation
// row sizes and the bytes (little-endian i64 header, then N weight rows, then P activation
// rows in the format's vec-dot type), runs the kernel with the launch geometry of
// ops_linear.rs `mm` (grid ceil(N / MM_WARPS) × ceil(P / NT), 128 threads) and writes the
// P × N outputs; the test compares them with pn-ops' `vec_dot`.
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
    long long h[5];
    if (fread(h, 8, 5, in) != 5) return 2;
    long long N = h[0], nb = h[1], P = h[2], w_rb = h[3], a_rb = h[4];
    std::vector<u8> w(N * w_rb), a(P * a_rb);
    if (fread(w.data(), 1, w.size(), in) != w.size() || fread(a.data(), 1, a.size(), in) != a.size()) return 2;
    fclose(in);
    std::vector<float> y(P * N, NAN);
    emu_launch({(unsigned)((N + MM_WARPS - 1) / MM_WARPS), (unsigned)((P + mm->nt - 1) / mm->nt), 1}, {32 * MM_WARPS, 1, 1}, [&] {
        mm->f(w.data(), w_rb, 0, nullptr, 1, a.data(), a_rb, 1, y.data(), (int)N, (int)nb, (int)P);
    });
    FILE* out = fopen(argv[3], "wb");
    if (!out || fwrite(y.data(), 4, y.size(), out) != y.size()) return 2;
    fclose(out);
    printf("mm_%s: %lld rows x %lld pairs\n", argv[1], N, P);
    return 0;
}
