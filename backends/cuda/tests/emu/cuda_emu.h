// A CPU emulation of the CUDA execution model for kernel tests (tests/emu_kernels.rs):
// a launch runs its blocks one after another; a block's blockDim.x threads are fibers on
// one OS thread (ucontext), switched at every __syncthreads and warp shuffle, so a block
// runs as its threads would between barriers (any interleaving is a valid CUDA schedule
// for race-free code). The kernel source comes in as plain C++ (tests/emu_kernels.rs
// rewrites `extern "C"`, the dynamic shared arrays and common.cuh's two f16 `asm`
// conversions). Exact for what it runs; says nothing about a device's memory model,
// launch limits or intrinsics beyond these.
#pragma once
#include <immintrin.h>
#include <ucontext.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>
using std::fabs;
using std::isnan;

struct Dim3 { unsigned x = 1, y = 1, z = 1; };
static Dim3 blockDim, gridDim, threadIdx, blockIdx;
static double emu_xch[32][32];
alignas(64) static float emu_dyn_shared[1 << 16];

static ucontext_t emu_sched;
static std::vector<ucontext_t> emu_fiber;
static std::vector<char> emu_done;
static const std::function<void()>* emu_kernel;
static unsigned emu_cur;

// Back to the scheduler: every thread of the block reaches this point before any goes on.
static void emu_barrier() { swapcontext(&emu_fiber[emu_cur], &emu_sched); }

#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static
#define __constant__
#define __syncthreads() emu_barrier()

static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline int __float2int_rn(float f) { return (int)std::nearbyint(f); }
static inline float emu_h2f(unsigned short h) { return _cvtsh_ss(h); }
static inline unsigned short emu_f2h(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
// every thread of the block calls the shuffles of these kernels together (block-wide
// reductions), so a block barrier stands for the warp's
template <class T> static T __shfl_xor_sync(unsigned, T v, int o) {
    unsigned w = threadIdx.x >> 5, l = threadIdx.x & 31;
    emu_xch[w][l] = (double)v;
    emu_barrier();
    T r = (T)emu_xch[w][l ^ o];
    emu_barrier();
    return r;
}

static void emu_entry(unsigned t) {
    threadIdx = {t, 0, 0};
    (*emu_kernel)();
    emu_done[t] = 1;
}

// Runs `kernel()` for every block of `grid` on `block.x` threads (≤ 1024).
static void emu_launch(Dim3 grid, Dim3 block, const std::function<void()>& kernel) {
    const size_t stack = 1 << 16;
    static std::vector<std::vector<char>> stacks;
    gridDim = grid;
    blockDim = block;
    emu_kernel = &kernel;
    unsigned n = block.x;
    emu_fiber.assign(n, ucontext_t{});
    emu_done.assign(n, 0);
    if (stacks.size() < n) stacks.resize(n, std::vector<char>(stack));
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = {x, y, z};
                for (unsigned t = 0; t < n; t++) {
                    emu_done[t] = 0;
                    getcontext(&emu_fiber[t]);
                    emu_fiber[t].uc_stack.ss_sp = stacks[t].data();
                    emu_fiber[t].uc_stack.ss_size = stack;
                    emu_fiber[t].uc_link = &emu_sched;
                    makecontext(&emu_fiber[t], (void (*)())emu_entry, 1, t);
                }
                for (unsigned live = n; live > 0;) {
                    live = 0;
                    for (unsigned t = 0; t < n; t++) {
                        if (emu_done[t]) continue;
                        emu_cur = t;
                        threadIdx = {t, 0, 0};
                        swapcontext(&emu_sched, &emu_fiber[t]);
                        live += !emu_done[t];
                    }
                }
            }
}
