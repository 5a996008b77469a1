// attention.cu: causal GQA attention over a KV cache in any pn_ops KvType (f32, f16,
// q8_0, q4_0), with the Hadamard rotation, the f16 sink / window shadows and the ring
// mode of pn_ops::KvCache. Device copy of the cache (src/devstate.rs; ncells = the
// capacity for a resident state, the cells a batch reads for the host protocol's copy):
//   cells  [Hkv][ncells][rb]   bytes of KvCache::k / kq (cell = pos, or pos % cap in a ring)
//   sink   [Hkv][sink][D]      f16 bits (KvCache::shadow.k_sink / v_sink)
//   win    [Hkv][slots][D]     f16 bits, slot = pos % slots (shadow.k_win / v_win)
// ty: 0 f32, 1 f16, 2 q8_0, 3 q4_0 (the cell format).

#define KV_F32 0
#define KV_F16 1
#define KV_Q8_0 2
#define KV_Q4_0 3

// Element i of a cell (pn_ops::state::kv::decode_row: the exact dequantized value).
template <int TY>
__device__ __forceinline__ float kv_elem(const u8* __restrict__ row, int i) {
    if (TY == KV_F32) return ((const float*)row)[i];
    if (TY == KV_F16) return f16_to_f32(((const u16*)row)[i]);
    if (TY == KV_Q8_0) {
        const u8* b = row + (i >> 5) * 34;
        return (float)(i8)b[2 + (i & 31)] * ld_f16(b);
    }
    const u8* b = row + (i >> 5) * 18;  // q4_0: low nibbles = elements 0..15, high = 16..31
    int j = i & 31;
    u32 byte = b[2 + (j & 15)];
    int q = j < 16 ? (int)(byte & 15u) : (int)(byte >> 4);
    return (float)(q - 8) * ld_f16(b);
}

// Σ_i a[i]·row[i], sequential in i from 0.0 (the reference's order).
template <int TY>
__device__ __forceinline__ float kv_dot(const float* a, const u8* __restrict__ row, int D) {
    float s = 0.0f;
    for (int i = 0; i < D; i++) s += a[i] * kv_elem<TY>(row, i);
    return s;
}

__device__ __forceinline__ float kv_elem_ty(int ty, const u8* row, int i) {
    switch (ty) {
        case KV_F32: return kv_elem<KV_F32>(row, i);
        case KV_F16: return kv_elem<KV_F16>(row, i);
        case KV_Q8_0: return kv_elem<KV_Q8_0>(row, i);
        default: return kv_elem<KV_Q4_0>(row, i);
    }
}

__device__ __forceinline__ float kv_dot_ty(int ty, const float* a, const u8* row, int D) {
    switch (ty) {
        case KV_F32: return kv_dot<KV_F32>(a, row, D);
        case KV_F16: return kv_dot<KV_F16>(a, row, D);
        case KV_Q8_0: return kv_dot<KV_Q8_0>(a, row, D);
        default: return kv_dot<KV_Q4_0>(a, row, D);
    }
}

// Where a query at position p reads position j of KV head g (KvCache::source):
// the sink shadow if j < sink, else the window shadow if j + window > p, else the cell.
// Sets *ty to the format of the returned row (shadows are f16).
__device__ __forceinline__ const u8* kv_src(const u8* cells, const u16* sink_sh, const u16* win_sh, int ty, int* rty, int g,
                                            int j, int p, int D, int rb, int ncells, int cap, int ring, int sink, int window,
                                            int slots) {
    if (j < sink) {
        *rty = KV_F16;
        return (const u8*)(sink_sh + ((i64)g * sink + j) * D);
    }
    if (j + window > p) {
        *rty = KV_F16;
        return (const u8*)(win_sh + ((i64)g * slots + j % slots) * D);
    }
    *rty = ty;
    int cell = ring ? j % cap : j;
    return cells + ((i64)g * ncells + cell) * rb;
}

// In place, block-wide: x ← H_n x for every n-chunk of x[0..D) in shared memory
// (pn_ops::state::kv::hadamard): butterfly stages h = 1, 2, .., n/2 (each element in one
// pair per stage, so any thread order gives the host's values), then x *= scale
// (1/sqrt(n), computed on the host). n == 0: no-op. Every thread must call it.
__device__ void hadamard_sh(float* x, int D, int n, float scale) {
    if (n == 0) return;
    int half = n >> 1;
    for (int h = 1; h < n; h <<= 1) {
        for (int e = threadIdx.x; e < D / 2; e += blockDim.x) {
            int c = e / half, r = e % half;
            int j = c * n + (r / h) * (2 * h) + (r % h);
            float a = x[j], b = x[j + h];
            x[j] = a + b;
            x[j + h] = a - b;
        }
        __syncthreads();
    }
    for (int i = threadIdx.x; i < D; i += blockDim.x) x[i] *= scale;
    __syncthreads();
}

// f32 -> i8 as Rust's `as i8` (truncation toward zero, saturating, NaN -> 0).
__device__ __forceinline__ int sat_i8(float f) {
    if (f != f) return 0;
    if (f >= 127.0f) return 127;
    if (f <= -128.0f) return -128;
    return (int)f;
}

// Encode the row x[0..D) (shared) into a cell of format ty (pn_ops::state::kv::encode_row):
// q8_0 / q4_0 one thread per 32-block (ggml's reference quantizers, scanned in order).
// stage: a copy of the cell bytes (host protocol), or null (resident state: none).
__device__ void kv_encode(int ty, const float* x, u8* __restrict__ out, u8* __restrict__ stage, int D) {
    if (ty == KV_F32 || ty == KV_F16) {
        for (int i = threadIdx.x; i < D; i += blockDim.x) {
            if (ty == KV_F32) {
                ((float*)out)[i] = x[i];
                if (stage) ((float*)stage)[i] = x[i];
            } else {
                u16 h = f32_to_f16(x[i]);
                ((u16*)out)[i] = h;
                if (stage) ((u16*)stage)[i] = h;
            }
        }
        return;
    }
    for (int b = threadIdx.x; b < D / 32; b += blockDim.x) {
        const float* xb = x + b * 32;
        if (ty == KV_Q8_0) {  // quantize_q8_0_ref: d = amax/127, q = roundf(x·(1/d))
            u8* ob = out + b * 34;
            u8* sb = stage ? stage + b * 34 : nullptr;
            float amax = 0.0f;
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xb[i]));
            float d = amax / 127.0f;
            float id = d != 0.0f ? 1.0f / d : 0.0f;
            u16 dh = f32_to_f16(d);
            st_u16(ob, dh);
            if (sb) st_u16(sb, dh);
            for (int i = 0; i < 32; i++) {
                u8 q = (u8)(i8)sat_i8(roundf(xb[i] * id));
                ob[2 + i] = q;
                if (sb) sb[2 + i] = q;
            }
        } else {  // quantize_q4_0_ref: max = first value of largest |x|, d = max/-8
            u8* ob = out + b * 18;
            u8* sb = stage ? stage + b * 18 : nullptr;
            float amax = 0.0f, mx = 0.0f;
            for (int i = 0; i < 32; i++) {
                float a = fabsf(xb[i]);
                if (amax < a) {
                    amax = a;
                    mx = xb[i];
                }
            }
            float d = mx / -8.0f;
            float id = d != 0.0f ? 1.0f / d : 0.0f;
            u16 dh = f32_to_f16(d);
            st_u16(ob, dh);
            if (sb) st_u16(sb, dh);
            for (int j = 0; j < 16; j++) {
                int q0 = sat_i8(xb[j] * id + 8.5f), q1 = sat_i8(xb[j + 16] * id + 8.5f);
                q0 = q0 < 15 ? q0 : 15;  // `.min(15)` on the i8, then `as u8`
                q1 = q1 < 15 ? q1 : 15;
                u8 byte = (u8)((u8)(i8)q0 | (u8)((u8)(i8)q1 << 4));
                ob[2 + j] = byte;
                if (sb) sb[2 + j] = byte;
            }
        }
    }
}

// KvCache::write on the device of token t, KV head g: rotate k (rot_k) / v (rot_v), encode
// into the cell, copy the cell bytes to the staging rows kst/vst [T][Hkv][rb] (host
// protocol: what the host copies back into its cache; null for a resident state), and f16
// copies into the sink (p < sink) and window (slots > 0) shadows. The cell and shadow
// slots follow pos[t], read here: the launch is the same for every decode step.
// Dynamic shared memory: D floats. Every thread of the block calls it.
__device__ void kv_store_body(u8* __restrict__ kc, u8* __restrict__ vc, u16* __restrict__ ksink, u16* __restrict__ vsink,
                              u16* __restrict__ kwin, u16* __restrict__ vwin, u8* __restrict__ kst, u8* __restrict__ vst,
                              const float* __restrict__ k, const float* __restrict__ v, const int* __restrict__ pos, int t,
                              int g, int ty, int D, int Hkv, int rb, int ncells, int cap, int ring, int sink, int slots,
                              int rot_k, float rs_k, int rot_v, float rs_v) {
    extern __shared__ float xs[];
    int p = pos[t];
    int cell = ring ? p % cap : p;
    for (int pass = 0; pass < 2; pass++) {
        const float* src = (pass ? v : k) + ((i64)t * Hkv + g) * D;
        for (int i = threadIdx.x; i < D; i += blockDim.x) xs[i] = src[i];
        __syncthreads();
        if (pass == 0)
            hadamard_sh(xs, D, rot_k, rs_k);
        else
            hadamard_sh(xs, D, rot_v, rs_v);
        u8* cells = pass ? vc : kc;
        u8* st = pass ? vst : kst;
        u8* stage = st ? st + ((i64)t * Hkv + g) * rb : nullptr;
        kv_encode(ty, xs, cells + ((i64)g * ncells + cell) * rb, stage, D);
        u16* sk = pass ? vsink : ksink;
        u16* sw = pass ? vwin : kwin;
        for (int i = threadIdx.x; i < D; i += blockDim.x) {
            u16 h = f32_to_f16(xs[i]);
            if (p < sink) sk[((i64)g * sink + p) * D + i] = h;
            if (slots > 0) sw[((i64)g * slots + p % slots) * D + i] = h;
        }
        __syncthreads();
    }
}

// kv_store_body for tokens t0 .. t0+gridDim.x, one block per (token, KV head blockIdx.y).
extern "C" __global__ void kv_store(u8* __restrict__ kc, u8* __restrict__ vc, u16* __restrict__ ksink, u16* __restrict__ vsink,
                                    u16* __restrict__ kwin, u16* __restrict__ vwin, u8* __restrict__ kst, u8* __restrict__ vst,
                                    const float* __restrict__ k, const float* __restrict__ v, const int* __restrict__ pos, int t0,
                                    int ty, int D, int Hkv, int rb, int ncells, int cap, int ring, int sink, int slots, int rot_k,
                                    float rs_k, int rot_v, float rs_v) {
    kv_store_body(kc, vc, ksink, vsink, kwin, vwin, kst, vst, k, v, pos, t0 + blockIdx.x, blockIdx.y, ty, D, Hkv, rb, ncells,
                  cap, ring, sink, slots, rot_k, rs_k, rot_v, rs_v);
}

// The KV caches of sequences with one token each (a decode pass, or the decode part of a
// mixed one), passed by value: each cache's K / V cells, sink and window shadows (the
// resident state's buffers, fixed for its slot row's life) and its token's index in the
// pass. Same layout as ops_attn.rs' `KvTab`.
#define KV_TAB 16
struct KvTab {
    unsigned long long kc[KV_TAB], vc[KV_TAB], ks[KV_TAB], vs[KV_TAB], kw[KV_TAB], vw[KV_TAB];
    int tok[KV_TAB];
    int n, pad;
};

// kv_store_body for the tokens of `tab`'s sequences: block (sequence z, KV head).
extern "C" __global__ void kv_store_seqs(const KvTab tab, const float* __restrict__ k, const float* __restrict__ v,
                                         const int* __restrict__ pos, int ty, int D, int Hkv, int rb, int ncells, int cap, int ring,
                                         int sink, int slots, int rot_k, float rs_k, int rot_v, float rs_v) {
    int z = blockIdx.x;
    if (z >= tab.n) return;
    kv_store_body((u8*)tab.kc[z], (u8*)tab.vc[z], (u16*)tab.ks[z], (u16*)tab.vs[z], (u16*)tab.kw[z], (u16*)tab.vw[z], nullptr,
                  nullptr, k, v, pos, tab.tok[z], blockIdx.y, ty, D, Hkv, rb, ncells, cap, ring, sink, slots, rot_k, rs_k, rot_v,
                  rs_v);
}

// Query head h, token t, over the positions lo..=p visible to it (lo = p+1-cap in a wrapped
// ring, else 0), KV head h / (H/Hkv): q' = H_rot_k q (shared); s_j = scale·(q'·k_j), dot
// sequential in i; softmax with the max subtracted and the sum in f64; o_i = Σ_j (e_j·inv)
// v_j[i] sequential in j; y = H_rot_v o. s: this block's scores row (span floats).
// Dynamic shared memory: D floats. Every thread of the block calls it.
__device__ void attn_kv_body(const float* __restrict__ q, const u8* __restrict__ kc, const u8* __restrict__ vc,
                             const u16* __restrict__ ksink, const u16* __restrict__ vsink, const u16* __restrict__ kwin,
                             const u16* __restrict__ vwin, const int* __restrict__ pos, float* __restrict__ s,
                             float* __restrict__ y, int h, int t, int ty, int D, int H, int Hkv, int rb, int ncells, int cap,
                             int ring, int sink, int window, int slots, int rot_k, float rs_k, int rot_v, float rs_v,
                             float scale) {
    extern __shared__ float xs[];
    __shared__ float shf[32];
    __shared__ double shd[32];
    int g = h / (H / Hkv);
    int p = pos[t];
    int lo = (ring && p >= cap) ? p + 1 - cap : 0;
    const float* qh = q + ((i64)t * H + h) * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) xs[i] = qh[i];
    __syncthreads();
    hadamard_sh(xs, D, rot_k, rs_k);
    float m = -__int_as_float(0x7f800000);
    for (int j = lo + threadIdx.x; j <= p; j += blockDim.x) {
        int rty;
        const u8* row = kv_src(kc, ksink, kwin, ty, &rty, g, j, p, D, rb, ncells, cap, ring, sink, window, slots);
        float v = scale * kv_dot_ty(rty, xs, row, D);
        s[j - lo] = v;
        m = fmaxf(m, v);
    }
    m = block_max_f(m, shf);
    double sum = 0.0;
    for (int j = lo + threadIdx.x; j <= p; j += blockDim.x) {
        float e = pn_exp_f(s[j - lo] - m);
        s[j - lo] = e;
        sum += (double)e;
    }
    sum = block_sum_d(sum, shd);  // ends with __syncthreads: all s[j] and the q' reads are done
    float inv = (float)(1.0 / sum);
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float acc = 0.0f;
        for (int j = lo; j <= p; j++) {
            int rty;
            const u8* row = kv_src(vc, vsink, vwin, ty, &rty, g, j, p, D, rb, ncells, cap, ring, sink, window, slots);
            acc += (s[j - lo] * inv) * kv_elem_ty(rty, row, i);
        }
        xs[i] = acc;
    }
    __syncthreads();
    hadamard_sh(xs, D, rot_v, rs_v);
    float* o = y + ((i64)t * H + h) * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) o[i] = xs[i];
}

// attn_kv_body for q head blockIdx.x, token t0 + blockIdx.y; scores: [gridDim.y][H][span].
extern "C" __global__ void attn_kv(const float* __restrict__ q, const u8* __restrict__ kc, const u8* __restrict__ vc,
                                   const u16* __restrict__ ksink, const u16* __restrict__ vsink, const u16* __restrict__ kwin,
                                   const u16* __restrict__ vwin, const int* __restrict__ pos, float* __restrict__ scores,
                                   float* __restrict__ y, int t0, int ty, int D, int H, int Hkv, int rb, int ncells, int cap,
                                   int ring, int sink, int window, int slots, int span, int rot_k, float rs_k, int rot_v,
                                   float rs_v, float scale) {
    attn_kv_body(q, kc, vc, ksink, vsink, kwin, vwin, pos, scores + ((i64)blockIdx.y * H + blockIdx.x) * span, y, blockIdx.x,
                 t0 + blockIdx.y, ty, D, H, Hkv, rb, ncells, cap, ring, sink, window, slots, rot_k, rs_k, rot_v, rs_v, scale);
}

// attn_kv_body for the tokens of `tab`'s sequences: block (q head, sequence z), token
// tab.tok[z] over sequence z's cache; scores: [n][H][span].
extern "C" __global__ void attn_kv_seqs(const KvTab tab, const float* __restrict__ q, const int* __restrict__ pos,
                                        float* __restrict__ scores, float* __restrict__ y, int ty, int D, int H, int Hkv, int rb,
                                        int ncells, int cap, int ring, int sink, int window, int slots, int span, int rot_k,
                                        float rs_k, int rot_v, float rs_v, float scale) {
    int z = blockIdx.y;
    if (z >= tab.n) return;
    attn_kv_body(q, (const u8*)tab.kc[z], (const u8*)tab.vc[z], (const u16*)tab.ks[z], (const u16*)tab.vs[z],
                 (const u16*)tab.kw[z], (const u16*)tab.vw[z], pos, scores + ((i64)z * H + blockIdx.x) * span, y, blockIdx.x,
                 tab.tok[z], ty, D, H, Hkv, rb, ncells, cap, ring, sink, window, slots, rot_k, rs_k, rot_v, rs_v, scale);
}
