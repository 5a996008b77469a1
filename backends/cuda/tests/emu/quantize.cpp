// kernels/quantize.cu under the CPU emulation (cuda_emu.h), for tests/emu_kernels.rs:
// `quantize FORMAT IN OUT` reads rows and k (little-endian i64) and rows × k floats, runs
// the format's kernel with ops_linear.rs `quantize`'s launch geometry (the q8 formats one
// warp per block, 4 a thread block; f16 / bf16 one thread per element, 256 a block) and
// writes the converted rows; the test compares them with pn-ops' `quantize_row`, byte for
// byte.
#include "cuda_emu.h"
#include COMMON_CUH
#include QUANTIZE_CU
#include <string>

int main(int argc, char** argv) {
    if (argc != 4) return 2;
    std::string f = argv[1];
    FILE* in = fopen(argv[2], "rb");
    long long h[2];
    if (!in || fread(h, 8, 2, in) != 2) return 2;
    long long rows = h[0], k = h[1], n = rows * k;
    std::vector<float> x(n);
    if (fread(x.data(), 4, n, in) != (size_t)n) return 2;
    fclose(in);
    long long qk = f == "q8_k" ? 256 : (f == "q8_0" || f == "q8_1") ? 32 : 1;
    long long bb = f == "q8_k" ? 292 : f == "q8_0" ? 34 : f == "q8_1" ? 36 : 2;
    long long nblocks = n / qk;
    std::vector<u8> out(nblocks * bb, 0xAB);
    auto grid1 = [](long long items, unsigned threads) { return Dim3{(unsigned)((items + threads - 1) / threads), 1, 1}; };
    if (f == "q8_0")
        emu_launch(grid1(nblocks * 32, 128), {128, 1, 1}, [&] { quantize_q8_0(x.data(), out.data(), nblocks); });
    else if (f == "q8_1")
        emu_launch(grid1(nblocks * 32, 128), {128, 1, 1}, [&] { quantize_q8_1(x.data(), out.data(), nblocks); });
    else if (f == "q8_k")
        emu_launch(grid1(nblocks * 32, 128), {128, 1, 1}, [&] { quantize_q8_k(x.data(), out.data(), nblocks); });
    else if (f == "f16")
        emu_launch(grid1(n, 256), {256, 1, 1}, [&] { quantize_f16(x.data(), (u16*)out.data(), n); });
    else if (f == "bf16")
        emu_launch(grid1(n, 256), {256, 1, 1}, [&] { quantize_bf16(x.data(), (u16*)out.data(), n); });
    else
        return 2;
    FILE* o = fopen(argv[3], "wb");
    if (!o || fwrite(out.data(), 1, out.size(), o) != out.size()) return 2;
    fclose(o);
    printf("quantize_%s: %lld rows of %lld\n", f.c_str(), rows, k);
    return 0;
}
