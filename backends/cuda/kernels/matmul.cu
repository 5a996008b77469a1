// matmul.cu (needs blocks.cuh): y = W x over GGUF blocks, MoE-aware, and GetRows.
//
// mm_<fmt>(W, w_rb, w_estride, ids, A, a_rb, act_div, Y, N, nb, P)
//   W: weight rows of w_rb bytes (nb blocks each); for 3-D expert tensors the matrix of
//   expert e starts at e*w_estride bytes. P "pairs" p (tokens, or token×expert pairs):
//   weight matrix = ids ? ids[p] : 0, activation row = p / act_div (a_rb bytes each,
//   already in the weight's vec-dot format), output Y[p*N + n].
// One warp per (row n, NT consecutive pairs); grid (ceil(N/4), ceil(P/NT)), block 128.

#define MM_WARPS 4
#define MM_NT 8

template <class F>
__device__ void mm_quant(const u8* __restrict__ W, i64 w_rb, i64 w_estride, const int* __restrict__ ids, int n_exp,
                         const u8* __restrict__ A, i64 a_rb, int act_div, float* __restrict__ Y, int N, int nb, int P) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int n = blockIdx.x * MM_WARPS + warp;
    if (n >= N) return;  // whole warp leaves together
    int p0 = blockIdx.y * MM_NT;
    const int per = WARP / F::L;  // blocks per warp step
    int sub = lane / F::L, part = lane % F::L;
    float acc[MM_NT];
    const u8* wr[MM_NT];
    const u8* ar[MM_NT];
    bool bad[MM_NT];
#pragma unroll
    for (int j = 0; j < MM_NT; j++) {
        acc[j] = 0.0f;
        int p = p0 + j < P ? p0 + j : P - 1;
        int e = ids ? ids[p] : 0;
        bad[j] = e < 0 || e >= n_exp;
        if (bad[j]) e = 0;
        wr[j] = W + (i64)e * w_estride + (i64)n * w_rb;
        ar[j] = A + (i64)(p / act_div) * a_rb;
    }
    for (int b0 = 0; b0 < nb; b0 += per) {
        int b = b0 + sub;
        bool ok = b < nb;
#pragma unroll
        for (int j = 0; j < MM_NT; j++) {
            if (p0 + j >= P) break;  // uniform across the warp
            const u8* w = wr[j] + (i64)b * F::BW;
            const u8* a = ar[j] + (i64)b * F::BA;
            I2 s = ok ? F::part(w, a, part) : I2{0, 0};
            for (int o = F::L / 2; o > 0; o >>= 1) {
                s.a += __shfl_xor_sync(FULL_MASK, s.a, o);
                s.b += __shfl_xor_sync(FULL_MASK, s.b, o);
            }
            if (ok && part == 0) acc[j] += F::combine(w, a, s);
        }
    }
#pragma unroll
    for (int j = 0; j < MM_NT; j++) {
        if (p0 + j >= P) break;
        float v = warp_sum_f(acc[j]);
        if (lane == 0) Y[(i64)(p0 + j) * N + n] = bad[j] ? __int_as_float(0x7fc00000) : v;
    }
}

// Float weights (F32 / F16 / BF16) with activations already rounded to the same type:
// products in f32, accumulated in f64 as ggml's generic vec_dot_f16/f32 (and the CPU).
#define MMF_NT 4
template <class F>
__device__ void mm_float(const u8* __restrict__ W, i64 w_rb, i64 w_estride, const int* __restrict__ ids, int n_exp,
                         const u8* __restrict__ A, i64 a_rb, int act_div, float* __restrict__ Y, int N, int K, int P) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int n = blockIdx.x * MM_WARPS + warp;
    if (n >= N) return;
    int p0 = blockIdx.y * MMF_NT;
    for (int j = 0; j < MMF_NT && p0 + j < P; j++) {
        int p = p0 + j;
        int e = ids ? ids[p] : 0;
        bool bad = e < 0 || e >= n_exp;
        if (bad) e = 0;
        const u8* w = W + (i64)e * w_estride + (i64)n * w_rb;
        const u8* a = A + (i64)(p / act_div) * a_rb;
        double s = 0.0;
        for (int i = lane; i < K; i += WARP) s += (double)(F::deq(w + (i64)i * F::BW, 0) * F::deq(a + (i64)i * F::BW, 0));
        s = warp_sum_d(s);
        if (lane == 0) Y[(i64)p * N + n] = bad ? __int_as_float(0x7fc00000) : (float)s;
    }
}

#define MM_ARGS const u8 *W, i64 w_rb, i64 w_estride, const int *ids, int n_exp, const u8 *A, i64 a_rb, int act_div, float *Y, int N, int nb, int P
#define MM_PASS W, w_rb, w_estride, ids, n_exp, A, a_rb, act_div, Y, N, nb, P
#define DEF_MMQ(name, F) extern "C" __global__ void mm_##name(MM_ARGS) { mm_quant<F>(MM_PASS); }
#define DEF_MMF(name, F) extern "C" __global__ void mm_##name(MM_ARGS) { mm_float<F>(MM_PASS); }
PN_QUANT_FORMATS(DEF_MMQ)
PN_FLOAT_FORMATS(DEF_MMF)

// get_rows_<fmt>(table, rb, ids, T, K, out, V): out[t*K + i] = row ids[t] element i.
// One thread per output element. The host range-checks ids it knows; an id outside
// 0..V (ids the host never saw, resident path) gives a NaN row instead of a stray read.
template <class F>
__device__ void get_rows(const u8* __restrict__ table, i64 rb, const int* __restrict__ ids, int T, int K, float* __restrict__ out,
                         int V) {
    i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (i64)T * K) return;
    int t = (int)(idx / K), i = (int)(idx % K);
    int id = ids[t];
    if (id < 0 || id >= V) {
        out[idx] = __int_as_float(0x7fc00000);
        return;
    }
    const u8* row = table + (i64)id * rb;
    out[idx] = F::deq(row + (i64)(i / F::QK) * F::BW, i % F::QK);
}
#define DEF_GR(name, F) \
    extern "C" __global__ void get_rows_##name(const u8 *table, i64 rb, const int *ids, int T, int K, float *out, int V) { \
        get_rows<F>(table, rb, ids, T, K, out, V); \
    }
PN_QUANT_FORMATS(DEF_GR)
PN_FLOAT_FORMATS(DEF_GR)
