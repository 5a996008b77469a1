// common.cuh: prepended to every kernel file by pn-cuda (src/kernels.rs) before NVRTC
// compiles it. No system headers: NVRTC builds these files with its builtins only.
// Conventions: ggml shapes (ne0 innermost), f32 activations, raw GGUF blocks read
// byte-wise (blocks of 17/18/22/34/210 bytes are not word aligned), little endian.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef short i16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

#define WARP 32
#define FULL_MASK 0xffffffffu

__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
// IEEE round to nearest even, as F16C / half::f16::from_f32.
__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float bf16_to_f32(u16 b) { return __uint_as_float(((u32)b) << 16); }
// ggml's GGML_FP32_TO_BF16: NaN -> quiet NaN, else round to nearest even.
__device__ __forceinline__ u16 f32_to_bf16(float x) {
    u32 u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 64u);
    return (u16)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

__device__ __forceinline__ u32 ld_u16(const u8* p) { return (u32)p[0] | ((u32)p[1] << 8); }
__device__ __forceinline__ u32 ld_u32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}
__device__ __forceinline__ float ld_f16(const u8* p) { return f16_to_f32((u16)ld_u16(p)); }
__device__ __forceinline__ float ld_f32(const u8* p) { return __uint_as_float(ld_u32(p)); }
__device__ __forceinline__ int ld_i8(const u8* p) { return (int)(i8)p[0]; }
__device__ __forceinline__ void st_u16(u8* p, u32 v) { p[0] = (u8)(v & 255u); p[1] = (u8)(v >> 8); }

__device__ __forceinline__ float warp_sum_f(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ int warp_sum_i(int v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ float warp_max_f(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// Block-wide reductions for blockDim.x a multiple of 32 (≤ 1024). `sh` holds 32 slots.
// Every thread of the block must call them; all get the result.
__device__ __forceinline__ double block_sum_d(double v, double* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0;
    return warp_sum_d(v);
}
__device__ __forceinline__ float block_max_f(float v, float* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max_f(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -__int_as_float(0x7f800000);
    return warp_max_f(v);
}

// pn_ops::math::exp, operation for operation (--fmad=false: nothing fused but the fmaf):
// n = rint(x·log2 e), r = x − n·ln 2 (two fmaf), Taylor-7 of e^r in Horner form, 2^n in
// two exact halves. The constants are the Rust f32 constants' bits.
__device__ __forceinline__ float pn_exp_f(float x) {
    if (isnan(x)) return x;
    float xc = fminf(fmaxf(x, -104.0f), 89.0f);
    float n = rintf(xc * __int_as_float(0x3fb8aa3b));
    float r = fmaf(-n, __int_as_float(0x3f317200), xc);
    r = fmaf(-n, __int_as_float(0x35bfbe8e), r);
    float p = __int_as_float(0x39500d01);                 // 1/7!
    p = fmaf(p, r, __int_as_float(0x3ab60b61));           // 1/6!
    p = fmaf(p, r, __int_as_float(0x3c088889));           // 1/5!
    p = fmaf(p, r, __int_as_float(0x3d2aaaab));           // 1/4!
    p = fmaf(p, r, __int_as_float(0x3e2aaaab));           // 1/3!
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    int k = (int)n, k1 = k >> 1, k2 = k - k1;
    return p * __int_as_float((k1 + 127) << 23) * __int_as_float((k2 + 127) << 23);
}

// Scalar functions of spec §5 (same formulas as pn_ops::reference::common).
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + pn_exp_f(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + pn_exp_f(-x)); }
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : logf(1.0f + pn_exp_f(x)); }
