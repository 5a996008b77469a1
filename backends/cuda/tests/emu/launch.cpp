// A generic launcher for tests/emu_kernels.rs: one kernel module (KERNEL_CU: its full
// source, kernels.rs `Module::full_source`) under the CPU emulation (cuda_emu.h), its kernels named by ENTRIES
// (`X(name) X(name) ...`, from the module list of src/kernels.rs). `launch JOB OUT` reads
// buffers and commands from JOB, runs the commands in order and writes every buffer back
// to OUT. Little-endian layout of JOB:
//   u32 buffers; per buffer: u64 bytes, the bytes
//   u32 commands; per command: u32 name length, the name, u32 grid[3], u32 block[3],
//     u32 arguments; per argument: u8 tag, then 1: u32 buffer, u64 byte offset (a pointer
//     into it) | 2: i32 | 3: i64 | 4: f32 | 5: a null pointer
// OUT: per buffer its bytes, in order. The arguments are passed with the kernel's own
// parameter types (as cuLaunchKernel would), so the test must give them as the host code
// does.
#include "cuda_emu.h"
#include KERNEL_CU  // the module as NVRTC gets it (common.cuh, blocks.cuh, the file)
#include <cstdint>
#include <string>
#include <utility>

template <class... A, size_t... I>
static void call_impl(void (*f)(A...), void** ps, std::index_sequence<I...>) {
    f(*(A*)ps[I]...);
}
template <class... A>
static void call(void (*f)(A...), void** ps) {
    call_impl(f, ps, std::index_sequence_for<A...>{});
}
template <class... A>
static constexpr unsigned arity(void (*)(A...)) {
    return sizeof...(A);
}
struct Entry {
    const char* name;
    void (*run)(void**);
    unsigned arity;
};
#define X(name) {#name, [](void** ps) { call(name, ps); }, arity(name)},
static const Entry TABLE[] = {ENTRIES};

template <class T>
static T rd(FILE* f) {
    T v;
    if (fread(&v, sizeof v, 1, f) != 1) {
        printf("truncated job\n");
        exit(2);
    }
    return v;
}

int main(int argc, char** argv) {
    if (argc != 3) return 2;
    FILE* in = fopen(argv[1], "rb");
    if (!in) return 2;
    std::vector<std::vector<u8>> bufs(rd<uint32_t>(in));
    for (auto& b : bufs) {
        b.resize(rd<uint64_t>(in));
        if (!b.empty() && fread(b.data(), 1, b.size(), in) != b.size()) return 2;
    }
    for (uint32_t c = rd<uint32_t>(in); c > 0; c--) {
        std::string name(rd<uint32_t>(in), ' ');
        if (fread(name.data(), 1, name.size(), in) != name.size()) return 2;
        Dim3 grid{rd<uint32_t>(in), rd<uint32_t>(in), rd<uint32_t>(in)};
        Dim3 block{rd<uint32_t>(in), rd<uint32_t>(in), rd<uint32_t>(in)};
        uint32_t na = rd<uint32_t>(in);
        std::vector<uint64_t> store(na);
        std::vector<void*> ps(na);
        for (uint32_t i = 0; i < na; i++) {
            switch (rd<uint8_t>(in)) {
                case 1: {
                    uint32_t b = rd<uint32_t>(in);
                    uint64_t off = rd<uint64_t>(in);
                    if (b >= bufs.size() || off > bufs[b].size()) return 2;
                    void* p = bufs[b].data() + off;
                    memcpy(&store[i], &p, sizeof p);
                    break;
                }
                case 2: { int32_t v = rd<int32_t>(in); memcpy(&store[i], &v, 4); break; }
                case 3: { int64_t v = rd<int64_t>(in); memcpy(&store[i], &v, 8); break; }
                case 4: { float v = rd<float>(in); memcpy(&store[i], &v, 4); break; }
                case 5: store[i] = 0; break;
                default: return 2;
            }
            ps[i] = &store[i];
        }
        const Entry* e = nullptr;
        for (const Entry& t : TABLE)
            if (name == t.name) e = &t;
        if (!e || e->arity != na) {
            printf("no kernel %s with %u arguments\n", name.c_str(), na);
            return 2;
        }
        emu_launch(grid, block, [&] { e->run(ps.data()); });
    }
    fclose(in);
    FILE* out = fopen(argv[2], "wb");
    if (!out) return 2;
    for (auto& b : bufs)
        if (!b.empty() && fwrite(b.data(), 1, b.size(), out) != b.size()) return 2;
    fclose(out);
    printf("ok\n");
    return 0;
}
