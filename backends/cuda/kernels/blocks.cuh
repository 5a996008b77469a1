// blocks.cuh: GGUF block formats on the device (prepended after common.cuh to the files
// that read weights). Mirrors ops/src/quant/*: for each weight format F
//   F::QK   elements per block, F::BW bytes per weight block,
//   F::BA   bytes per block of the activation format (vec_dot_type: q8_0 / q8_1 / q8_K),
//   F::L    lanes that share one block in the matmul (each takes one part),
//   F::part(w, a, p)  exact integer partial sums of part p (summed over the L lanes),
//   F::combine(w, a, s)  the float result of the block, in the reference's order,
//   F::deq(w, e)  element e of the block dequantized (GetRows).
// The integer sums are exact, so each block's float value equals the CPU's; only the
// order in which blocks are summed differs (warp tree instead of sequential).

struct I2 { int a, b; };

__constant__ signed char KV_IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
__constant__ signed char KV_MXFP4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// GGML_E8M0_TO_FP32_HALF
__device__ __forceinline__ float e8m0_half(u32 e) {
    u32 bits = e < 2 ? (0x00200000u << e) : ((e - 1u) << 23);
    return __uint_as_float(bits);
}

// Q8_K activation block: d f32 @0, qs i8[256] @4, bsums i16[16] @260.
__device__ __forceinline__ float q8k_d(const u8* a) { return ld_f32(a); }
__device__ __forceinline__ int q8k_q(const u8* a, int i) { return ld_i8(a + 4 + i); }
__device__ __forceinline__ int q8k_bsum(const u8* a, int g) { return (int)(i16)ld_u16(a + 260 + 2 * g); }

// ---- 32-element formats (8 elements per part) ------------------------------------

struct FQ8_0 {  // d f16 @0, qs i8[32] @2; act q8_0
    static const int QK = 32, BW = 34, BA = 34, L = 4;
    static __device__ I2 part(const u8* w, const u8* a, int p) {
        int s = 0;
        for (int j = 8 * p; j < 8 * p + 8; j++) s += ld_i8(w + 2 + j) * ld_i8(a + 2 + j);
        return I2{s, 0};
    }
    static __device__ float combine(const u8* w, const u8* a, I2 s) { return (float)s.a * (ld_f16(w) * ld_f16(a)); }
    static __device__ float deq(const u8* w, int e) { return (float)ld_i8(w + 2 + e) * ld_f16(w); }
};

// Element j (0..16) of a 4-bit block: low nibble; element j+16: high nibble.
struct FQ4_0 {  // d f16 @0, qs @2; act q8_0
    static const int QK = 32, BW = 18, BA = 34, L = 4;
    static __device__ I2 part(const u8* w, const u8* a, int p) {
        int s = 0;
        for (int j = 4 * p; j < 4 * p + 4; j++) {
            s += ((int)(w[2 + j] & 15) - 8) * ld_i8(a + 2 + j);
            s += ((int)(w[2 + j] >> 4) - 8) * ld_i8(a + 18 + j);
        }
        return I2{s, 0};
    }
    static __device__ float combine(const u8* w, const u8* a, I2 s) { return (float)s.a * ld_f16(w) * ld_f16(a); }
    static __device__ float deq(const u8* w, int e) {
        int q = e < 16 ? (w[2 + e] & 15) : (w[2 + e - 16] >> 4);
        return (float)(q - 8) * ld_f16(w);
    }
};

struct FQ4_1 {  // d f16 @0, m f16 @2, qs @4; act q8_1 (d @0, s @2, qs @4)
    static const int QK = 32, BW = 20, BA = 36, L = 4;
    static __device__ I2 part(const u8* w, const u8* a, int p) {
        int s = 0;
        for (int j = 4 * p; j < 4 * p + 4; j++) {
            s += (int)(w[4 + j] & 15) * ld_i8(a + 4 + j);
            s += (int)(w[4 + j] >> 4) * ld_i8(a + 20 + j);
        }
        return I2{s, 0};
    }
    static __device__ float combine(const u8* w, const u8* a, I2 s) {
        return (ld_f16(w) * ld_f16(a)) * (float)s.a + ld_f16(w + 2) * ld_f16(a + 2);
    }
    static __device__ float deq(const u8* w, int e) {
        int q = e < 16 ? (w[4 + e] & 15) : (w[4 + e - 16] >> 4);
        return (float)q * ld_f16(w) + ld_f16(w + 2);
    }
};

__device__ __forceinline__ int five(const u8* qs, u32 qh, int e) {
    int q = e < 16 ? (qs[e] & 15) : (qs[e - 16] >> 4);
    return q | (int)(((qh >> e) & 1u) << 4);
}

struct FQ5_0 {  // d f16 @0, qh u32 @2, qs @6; act q8_0
    static const int QK = 32, BW = 22, BA = 34, L = 4;
    static __device__ I2 part(const u8* w, const u8* a, int p) {
        u32 qh = ld_u32(w + 2);
        int s = 0;
        for (int e = 8 * p; e < 8 * p + 8; e++) s += (five(w + 6, qh, e) - 16) * ld_i8(a + 2 + e);
        return I2{s, 0};
    }
    static __device__ float combine(const u8* w, const u8* a, I2 s) { return (ld_f16(w) * ld_f16(a)) * (float)s.a; }
    static __device__ float deq(const u8* w, int e) { return (float)(five(w + 6, ld_u32(w + 2), e) - 16) * ld_f16(w); }
};

struct FQ5_1 {  // d f16 @0, m f16 @2, qh u32 @4, qs @8; act q8_1
    static const int QK = 32, BW = 24, BA = 36, L = 4;
    static __device__ I2 part(const u8* w, const u8* a, int p) {
        u32 qh = ld_u32(w + 4);
        int s = 0;
        for (int e = 8 * p; e < 8 * p + 8; e++) s += five(w + 8, qh, e) * ld_i8(a + 4 + e);
        return I2{s, 0};
    }
    static __device__ float combine(const u8* w, const u8* a, I2 s) {
        return (ld_f16(w) * ld_f16(a)) * (float)s.a + ld_f16(w + 2) * ld_f16(a + 2);
    }
    static __device__ float deq(const u8* w, int e) { return (float)five(w + 8, ld_u32(w + 4), e) * ld_f16(w) + ld_f16(w + 2); }
};

struct FIQ4_NL {  // d f16 @0, qs @2; act q8_0
    static const int QK = 32, BW = 18, BA = 34, L = 4;
    static __device__ I2 part(const u8* w, const u8* a, int p) {
        int s = 0;
        for (int j = 4 * p; j < 4 * p + 4; j++) {
            s += (int)KV_IQ4NL[w[2 + j] & 15] * ld_i8(a + 2 + j);
            s += (int)KV_IQ4NL[w[2 + j] >> 4] * ld_i8(a + 18 + j);
        }
        return I2{s, 0};
    }
    static __device__ float combine(const u8* w, const u8* a, I2 s) { return (ld_f16(w) * ld_f16(a)) * (float)s.a; }
    static __device__ float deq(const u8* w, int e) {
        int q = e < 16 ? (w[2 + e] & 15) : (w[2 + e - 16] >> 4);
        return ld_f16(w) * (float)KV_IQ4NL[q];
    }
};

struct FMXFP4 {  // e u8 (E8M0) @0, qs @1; act q8_0
    static const int QK = 32, BW = 17, BA = 34, L = 4;
    static __device__ I2 part(const u8* w, const u8* a, int p) {
        int s = 0;
        for (int j = 4 * p; j < 4 * p + 4; j++) {
            s += (int)KV_MXFP4[w[1 + j] & 15] * ld_i8(a + 2 + j);
            s += (int)KV_MXFP4[w[1 + j] >> 4] * ld_i8(a + 18 + j);
        }
        return I2{s, 0};
    }
    static __device__ float combine(const u8* w, const u8* a, I2 s) { return e8m0_half(w[0]) * ld_f16(a) * (float)s.a; }
    static __device__ float deq(const u8* w, int e) {
        int q = e < 16 ? (w[1 + e] & 15) : (w[1 + e - 16] >> 4);
        return (float)KV_MXFP4[q] * e8m0_half(w[0]);
    }
};

// ---- 256-element K-quants and IQ4_XS (32 elements per part, 8 parts) -------------

// get_scale_min_k4
__device__ __forceinline__ void scale_min_k4(int j, const u8* s, int* sc, int* mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Q4_K / Q5_K integer weight of element 32*s + l (s = sub-block 0..8).
__device__ __forceinline__ int q45_int(const u8* qs, const u8* qh, int s, int l) {
    u8 v = qs[32 * (s >> 1) + l];
    int q = (s & 1) ? (v >> 4) : (v & 15);
    if (qh) q |= ((qh[l] >> s) & 1) << 4;
    return q;
}

template <bool FIVE>
struct FQ45_K {  // Q4_K: d @0, dmin @2, scales[12] @4, qs @16 (144 B); Q5_K: qh[32] @16, qs @48 (176 B)
    static const int QK = 256, BW = FIVE ? 176 : 144, BA = 292, L = 8;
    static __device__ I2 part(const u8* w, const u8* a, int p) {
        const u8* qh = FIVE ? w + 16 : (const u8*)0;
        const u8* qs = FIVE ? w + 48 : w + 16;
        int sc, mn;
        scale_min_k4(p, w + 4, &sc, &mn);
        int s = 0;
        for (int l = 0; l < 32; l++) s += q45_int(qs, qh, p, l) * q8k_q(a, 32 * p + l);
        return I2{sc * s, mn * (q8k_bsum(a, 2 * p) + q8k_bsum(a, 2 * p + 1))};
    }
    static __device__ float combine(const u8* w, const u8* a, I2 s) {
        float d = ld_f16(w) * q8k_d(a);
        float dmin = ld_f16(w + 2) * q8k_d(a);
        return d * (float)s.a - dmin * (float)s.b;
    }
    static __device__ float deq(const u8* w, int e) {
        int sb = e >> 5, sc, mn;
        scale_min_k4(sb, w + 4, &sc, &mn);
        int q = q45_int(FIVE ? w + 48 : w + 16, FIVE ? w + 16 : (const u8*)0, sb, e & 31);
        return (ld_f16(w) * (float)sc) * (float)q - ld_f16(w + 2) * (float)mn;
    }
};

// Q6_K: ql[128] @0, qh[64] @128, scales i8[16] @192, d f16 @208 (210 B).
__device__ __forceinline__ int q6_int(const u8* w, int e) {
    int half = e >> 7, k = (e >> 5) & 3, l = e & 31;
    u8 lb = w[64 * half + l + 32 * (k & 1)];
    int low4 = k < 2 ? (lb & 15) : (lb >> 4);
    int high2 = (w[128 + 32 * half + l] >> (2 * k)) & 3;
    return (low4 | (high2 << 4)) - 32;
}
struct FQ6_K {
    static const int QK = 256, BW = 210, BA = 292, L = 8;
    static __device__ I2 part(const u8* w, const u8* a, int p) {
        int is = 0;
        for (int g = 2 * p; g < 2 * p + 2; g++) {
            int s = 0;
            for (int e = 16 * g; e < 16 * g + 16; e++) s += q6_int(w, e) * q8k_q(a, e);
            is += ld_i8(w + 192 + g) * s;
        }
        return I2{is, 0};
    }
    static __device__ float combine(const u8* w, const u8* a, I2 s) { return ld_f16(w + 208) * q8k_d(a) * (float)s.a; }
    static __device__ float deq(const u8* w, int e) { return (ld_f16(w + 208) * (float)ld_i8(w + 192 + (e >> 4))) * (float)q6_int(w, e); }
};

// Q2_K: scales[16] @0, qs[64] @16, d @80, dmin @82 (84 B).
__device__ __forceinline__ int q2_int(const u8* w, int e) {
    int half = e >> 7, j = (e >> 5) & 3, l = e & 31;
    return (w[16 + 32 * half + l] >> (2 * j)) & 3;
}
struct FQ2_K {
    static const int QK = 256, BW = 84, BA = 292, L = 8;
    static __device__ I2 part(const u8* w, const u8* a, int p) {
        int is = 0, summs = 0;
        for (int g = 2 * p; g < 2 * p + 2; g++) {
            int s = 0;
            for (int e = 16 * g; e < 16 * g + 16; e++) s += q2_int(w, e) * q8k_q(a, e);
            summs += (int)(w[g] >> 4) * q8k_bsum(a, g);
            is += (int)(w[g] & 15) * s;
        }
        return I2{is, summs};
    }
    static __device__ float combine(const u8* w, const u8* a, I2 s) {
        float dall = q8k_d(a) * ld_f16(w + 80);
        float dmin = q8k_d(a) * ld_f16(w + 82);
        return dall * (float)s.a - dmin * (float)s.b;
    }
    static __device__ float deq(const u8* w, int e) {
        int g = e >> 4;
        float dl = ld_f16(w + 80) * (float)(w[g] & 15);
        float ml = ld_f16(w + 82) * (float)(w[g] >> 4);
        return dl * (float)q2_int(w, e) - ml;
    }
};

// Q3_K: hmask[32] @0, qs[64] @32, scales[12] @96, d @108 (110 B).
__device__ __forceinline__ int q3_int(const u8* w, int e) {
    int half = e >> 7, j = (e >> 5) & 3, l = e & 31;
    int q2 = (w[32 + 32 * half + l] >> (2 * j)) & 3;
    int m = 1 << (4 * half + j);
    return q2 - ((w[l] & m) ? 0 : 4);
}
__device__ __forceinline__ int q3_scale(const u8* s, int i) {
    int low = i < 8 ? (s[i] & 15) : (s[i - 8] >> 4);
    int high = (s[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
    return (int)(i8)(u8)(low | (high << 4)) - 32;
}
struct FQ3_K {
    static const int QK = 256, BW = 110, BA = 292, L = 8;
    static __device__ I2 part(const u8* w, const u8* a, int p) {
        int is = 0;
        for (int g = 2 * p; g < 2 * p + 2; g++) {
            int s = 0;
            for (int e = 16 * g; e < 16 * g + 16; e++) s += q3_int(w, e) * q8k_q(a, e);
            is += q3_scale(w + 96, g) * s;
        }
        return I2{is, 0};
    }
    static __device__ float combine(const u8* w, const u8* a, I2 s) { return ld_f16(w + 108) * q8k_d(a) * (float)s.a; }
    static __device__ float deq(const u8* w, int e) { return (ld_f16(w + 108) * (float)q3_scale(w + 96, e >> 4)) * (float)q3_int(w, e); }
};

// IQ4_XS: d f16 @0, scales_h u16 @2, scales_l[4] @4, qs[128] @8 (136 B).
__device__ __forceinline__ int iq4xs_scale(const u8* w, int ib) {
    int sh = (int)ld_u16(w + 2);
    int lo = (w[4 + ib / 2] >> (4 * (ib & 1))) & 15;
    return (lo | (((sh >> (2 * ib)) & 3) << 4)) - 32;
}
struct FIQ4_XS {
    static const int QK = 256, BW = 136, BA = 292, L = 8;
    static __device__ I2 part(const u8* w, const u8* a, int p) {
        const u8* qs = w + 8 + 16 * p;
        int s = 0;
        for (int j = 0; j < 16; j++) {
            s += (int)KV_IQ4NL[qs[j] & 15] * q8k_q(a, 32 * p + j);
            s += (int)KV_IQ4NL[qs[j] >> 4] * q8k_q(a, 32 * p + j + 16);
        }
        return I2{iq4xs_scale(w, p) * s, 0};
    }
    static __device__ float combine(const u8* w, const u8* a, I2 s) { return ld_f16(w) * q8k_d(a) * (float)s.a; }
    static __device__ float deq(const u8* w, int e) {
        int ib = e >> 5, j = e & 31;
        const u8* qs = w + 8 + 16 * ib;
        int q = j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4);
        return (ld_f16(w) * (float)iq4xs_scale(w, ib)) * (float)KV_IQ4NL[q];
    }
};

// ---- float formats (one element per "block"; used by GetRows and the float matmul) --
struct FF32 { static const int QK = 1, BW = 4; static __device__ float deq(const u8* w, int) { return ld_f32(w); } };
struct FF16 { static const int QK = 1, BW = 2; static __device__ float deq(const u8* w, int) { return ld_f16(w); } };
struct FBF16 { static const int QK = 1, BW = 2; static __device__ float deq(const u8* w, int) { return bf16_to_f32((u16)ld_u16(w)); } };

// X-macro of every weight format with a native kernel: (suffix, struct).
#define PN_QUANT_FORMATS(X) \
    X(q4_0, FQ4_0) X(q4_1, FQ4_1) X(q5_0, FQ5_0) X(q5_1, FQ5_1) X(q8_0, FQ8_0) \
    X(q2_k, FQ2_K) X(q3_k, FQ3_K) X(q4_k, FQ45_K<false>) X(q5_k, FQ45_K<true>) X(q6_k, FQ6_K) \
    X(iq4_nl, FIQ4_NL) X(iq4_xs, FIQ4_XS) X(mxfp4, FMXFP4)
#define PN_FLOAT_FORMATS(X) X(f32, FF32) X(f16, FF16) X(bf16, FBF16)
