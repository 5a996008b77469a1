// delta.cu: Gated-DeltaNet state ops (spec §4.4.2, §4.4.4) with the state on the device.

// out[t][c] = Σ_{i<d_conv} X_c[t+i]·w[c][i] over the window X = [state (d_conv−1 rows) | x].
// One thread per (channel, token).
extern "C" __global__ void conv1d_causal(const float* __restrict__ st, const float* __restrict__ x, const float* __restrict__ w,
                                         float* __restrict__ y, int C, int T, int d_conv) {
    i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (i64)C * T) return;
    int c = (int)(idx % C), t = (int)(idx / C);
    int ns = d_conv - 1;
    float sum = 0.0f;
    for (int i = 0; i < d_conv; i++) {
        int r = t + i;
        float xv = r < ns ? st[(i64)r * C + c] : x[(i64)(r - ns) * C + c];
        sum += xv * w[(i64)c * d_conv + i];
    }
    y[idx] = sum;
}

// New state: the last d_conv−1 rows of the window. One thread per element of new_st.
extern "C" __global__ void conv_state_update(const float* __restrict__ st, const float* __restrict__ x, float* __restrict__ new_st,
                                             int C, int T, int d_conv) {
    int ns = d_conv - 1;
    i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (i64)ns * C) return;
    int c = (int)(idx % C), r = (int)(idx / C) + T;  // window row
    new_st[idx] = r < ns ? st[(i64)r * C + c] : x[(i64)(r - ns) * C + c];
}

// Gated delta rule, sequential over tokens (the recurrent form: decode and short inputs).
// grid (Hv, ceil(Dv / blockDim.x)): V head h (K head h mod Hk), thread j = blockIdx.y ·
// blockDim.x + threadIdx.x owns row j of ssm[h] (ssm[h][j][i] = S_h[i][j]), updated in
// place (rows are independent, so Dv tiles over blocks):
// S *= expf(g); kv_j = Σ_i S[i][j] k_i; δ_j = (v_j − kv_j)·β; S[i][j] += k_i δ_j;
// o_j = (Σ_i S[i][j] q_i) · 1/sqrtf(Dk). Every sum in the reference's order.
// use_sh: q, k of the current token staged in dynamic shared memory (2·Dk floats);
// 0 (Dk too large for it): read from global memory.
extern "C" __global__ void delta_rule(float* __restrict__ ssm, const float* __restrict__ q, const float* __restrict__ k,
                                      const float* __restrict__ v, const float* __restrict__ g, const float* __restrict__ beta,
                                      float* __restrict__ y, int Dk, int Hk, int Dv, int Hv, int T, float scale, int use_sh) {
    extern __shared__ float qk[];
    int h = blockIdx.x, kh = h % Hk, j = blockIdx.y * blockDim.x + threadIdx.x;
    float* s = ssm + ((i64)h * Dv + (j < Dv ? j : 0)) * Dk;
    for (int t = 0; t < T; t++) {
        const float* qg = q + ((i64)t * Hk + kh) * Dk;
        const float* kg = k + ((i64)t * Hk + kh) * Dk;
        const float* qs = qg;
        const float* ks = kg;
        if (use_sh) {
            __syncthreads();
            for (int i = threadIdx.x; i < Dk; i += blockDim.x) {
                qk[i] = qg[i];
                qk[Dk + i] = kg[i];
            }
            __syncthreads();
            qs = qk;
            ks = qk + Dk;
        }
        if (j >= Dv) continue;
        float decay = expf(g[(i64)t * Hv + h]);
        float bt = beta[(i64)t * Hv + h];
        float kv = 0.0f;
        for (int i = 0; i < Dk; i++) {
            s[i] *= decay;
            kv += s[i] * ks[i];
        }
        float delta = (v[((i64)t * Hv + h) * Dv + j] - kv) * bt;
        float o = 0.0f;
        for (int i = 0; i < Dk; i++) {
            s[i] += ks[i] * delta;
            o += s[i] * qs[i];
        }
        y[((i64)t * Hv + h) * Dv + j] = o * scale;
    }
}
