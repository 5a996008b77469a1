// moe.cu: MoE routing on the device (spec §4.5): TopK, MoeWeights, and the combine
// step of MoeExperts (the expert matmuls are mm_<fmt> with ids, see matmul.cu).

// Rust's f32::total_cmp key, with ±0 folded to +0 (pn_ops::reference::common::topk_before).
__device__ __forceinline__ int topk_key(float v) {
    if (v == 0.0f) v = 0.0f;
    int i = __float_as_int(v);
    return i ^ (int)(((u32)(i >> 31)) >> 1);
}

// Indices of the k largest values of each row of n, descending, ties to the lower index.
// One block per row; element e's rank = number of elements ordered before it.
extern "C" __global__ void topk_rows(const float* __restrict__ x, int* __restrict__ out, int n, int k) {
    const float* xr = x + (i64)blockIdx.x * n;
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
        int ke = topk_key(xr[e]);
        int rank = 0;
        for (int o = 0; o < n; o++) {
            int ko = topk_key(xr[o]);
            rank += (ko > ke || (ko == ke && o < e)) ? 1 : 0;
        }
        if (rank < k) out[(i64)blockIdx.x * k + rank] = e;
    }
}

// w[r,t] = probs[ids[r,t], t], divided by max(Σ_r w, 6.103515625e-5) when normalize.
// One thread per token. The host range-checks ids it knows; an id outside 0..E (ids
// computed on the device, resident path) gives NaN instead of a stray read.
extern "C" __global__ void moe_weights(const float* __restrict__ probs, const int* __restrict__ ids, float* __restrict__ w, int E,
                                       int k, int T, int normalize) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    float sum = 0.0f;
    for (int r = 0; r < k; r++) {
        int e = ids[(i64)t * k + r];
        float v = (e >= 0 && e < E) ? probs[(i64)t * E + e] : __int_as_float(0x7fc00000);
        w[(i64)t * k + r] = v;
        sum += v;
    }
    if (normalize) {
        float den = fmaxf(sum, 6.103515625e-5f);
        for (int r = 0; r < k; r++) w[(i64)t * k + r] /= den;
    }
}

// out[t][i] = Σ_r (selection order) d[t·top + r][i] · w[t, r], from 0.
extern "C" __global__ void moe_combine(const float* __restrict__ d, const float* __restrict__ w, float* __restrict__ out, int K, int top,
                                       int T) {
    i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (i64)K * T) return;
    int i = (int)(idx % K), t = (int)(idx / K);
    float acc = 0.0f;
    for (int r = 0; r < top; r++) acc += d[((i64)t * top + r) * K + i] * w[(i64)t * top + r];
    out[idx] = acc;
}
