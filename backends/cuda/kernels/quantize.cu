// quantize.cu: activation rows f32 -> the weight's vec-dot format, byte-identical to
// pn_ops::quant::quantize_row (ggml's x86 quantizers): q8_0, q8_1, q8_K, f16, bf16, f32.
// x: rows of k floats; out: rows of the format's row bytes, contiguous.

// q8_0 / q8_1: one warp per 32-element block (lane = element). grid.x = blocks/4, block 128.
template <bool Q81>
__device__ void quant_q8(const float* __restrict__ x, u8* __restrict__ out, i64 nblocks) {
    i64 b = (i64)blockIdx.x * 4 + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (b >= nblocks) return;
    float v = x[b * 32 + lane];
    float amax = warp_max_f(fabsf(v));
    float d = amax / 127.0f;
    float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int q = (int)rintf(v * id);  // round half to even, as _mm256_round_ps
    q = q < -128 ? -128 : (q > 127 ? 127 : q);
    const int BB = Q81 ? 36 : 34, QO = Q81 ? 4 : 2;
    u8* ob = out + b * BB;
    ob[QO + lane] = (u8)(i8)q;
    if (Q81) {
        int sum = warp_sum_i(q);
        if (lane == 0) st_u16(ob + 2, f32_to_f16(d * (float)sum));
    }
    if (lane == 0) st_u16(ob, f32_to_f16(d));
}
extern "C" __global__ void quantize_q8_0(const float* x, u8* out, i64 nblocks) { quant_q8<false>(x, out, nblocks); }
extern "C" __global__ void quantize_q8_1(const float* x, u8* out, i64 nblocks) { quant_q8<true>(x, out, nblocks); }

// q8_K (quantize_row_q8_K_ref): one warp per 256-element block, 8 elements per lane.
// Layout: d f32 @0, qs i8[256] @4, bsums i16[16] @260.
extern "C" __global__ void quantize_q8_k(const float* __restrict__ x, u8* __restrict__ out, i64 nblocks) {
    i64 b = (i64)blockIdx.x * 4 + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (b >= nblocks) return;
    const float* xb = x + b * 256 + lane * 8;
    // the element of largest |v|, first index on ties (strict > in the reference scan)
    float amax = 0.0f;
    int imax = 1 << 30;
    for (int i = 0; i < 8; i++) {
        float a = fabsf(xb[i]);
        if (a > amax) { amax = a; imax = lane * 8 + i; }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float a2 = __shfl_xor_sync(FULL_MASK, amax, o);
        int i2 = __shfl_xor_sync(FULL_MASK, imax, o);
        if (a2 > amax || (a2 == amax && i2 < imax)) { amax = a2; imax = i2; }
    }
    u8* ob = out + b * 292;
    if (amax == 0.0f) {
        for (int i = lane; i < 292; i += 32) ob[i] = 0;
        return;
    }
    float mx = x[b * 256 + imax];
    float iscale = -127.0f / mx;
    int s = 0;
    for (int i = 0; i < 8; i++) {
        int q = __float2int_rn(iscale * xb[i]);  // nearest_int: ties to even
        q = q > 127 ? 127 : q;
        s += q;
        ob[4 + lane * 8 + i] = (u8)(i8)q;
    }
    s += __shfl_xor_sync(FULL_MASK, s, 1);  // 16-element groups = lane pairs
    if ((lane & 1) == 0) st_u16(ob + 260 + lane, (u32)(u16)(i16)s);
    if (lane == 0) {
        u32 dbits = __float_as_uint(1.0f / iscale);
        ob[0] = (u8)dbits; ob[1] = (u8)(dbits >> 8); ob[2] = (u8)(dbits >> 16); ob[3] = (u8)(dbits >> 24);
    }
}

// Float formats: one thread per element.
extern "C" __global__ void quantize_f16(const float* __restrict__ x, u16* __restrict__ out, i64 n) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f32_to_f16(x[i]);
}
extern "C" __global__ void quantize_bf16(const float* __restrict__ x, u16* __restrict__ out, i64 n) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f32_to_bf16(x[i]);
}
