// attention.cu: causal GQA attention over an f32 KV cache on the device
// (pn_ops::reference::attention for KvType::F32: no shadows, no rotation).
// Cache layout on the device: [Hkv][cells][D] (cell = position).

// Write k, v of every token at its position: one thread per (element, kv head, token).
extern "C" __global__ void kv_store(float* __restrict__ kc, float* __restrict__ vc, const float* __restrict__ k,
                                    const float* __restrict__ v, const int* __restrict__ pos, int D, int Hkv, int T, int cells) {
    i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (i64)D * Hkv * T) return;
    int i = (int)(idx % D);
    int g = (int)((idx / D) % Hkv);
    int t = (int)(idx / ((i64)D * Hkv));
    i64 c = ((i64)g * cells + pos[t]) * D + i;
    kc[c] = k[idx];
    vc[c] = v[idx];
}

// One block per (q head h, token t); blockDim.x threads (multiple of 32).
// s_j = scale·(q·k_j) with the dot sequential in i (as the reference); softmax with the
// max subtracted and the sum in f64; o_i = Σ_j p_j v_j[i] sequential in j.
// scores: scratch of [H·T][ctx] floats.
extern "C" __global__ void attn_f32(const float* __restrict__ q, const float* __restrict__ kc, const float* __restrict__ vc,
                                    const int* __restrict__ pos, float* __restrict__ scores, float* __restrict__ y, int D, int H,
                                    int Hkv, int T, int cells, int ctx, float scale) {
    __shared__ float shf[32];
    __shared__ double shd[32];
    int h = blockIdx.x, t = blockIdx.y;
    int g = h / (H / Hkv);
    int p = pos[t];
    const float* qh = q + ((i64)t * H + h) * D;
    const float* kb = kc + (i64)g * cells * D;
    const float* vb = vc + (i64)g * cells * D;
    float* s = scores + ((i64)t * H + h) * ctx;
    float m = -__int_as_float(0x7f800000);
    for (int j = threadIdx.x; j <= p; j += blockDim.x) {
        const float* kj = kb + (i64)j * D;
        float dot = 0.0f;
        for (int i = 0; i < D; i++) dot += qh[i] * kj[i];
        float v = scale * dot;
        s[j] = v;
        m = fmaxf(m, v);
    }
    m = block_max_f(m, shf);
    double sum = 0.0;
    for (int j = threadIdx.x; j <= p; j += blockDim.x) {
        float e = expf(s[j] - m);
        s[j] = e;
        sum += (double)e;
    }
    sum = block_sum_d(sum, shd);  // ends with __syncthreads: all s[j] are visible
    float inv = (float)(1.0 / sum);
    float* o = y + ((i64)t * H + h) * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j <= p; j++) acc += (s[j] * inv) * vb[(i64)j * D + i];
        o[i] = acc;
    }
}
