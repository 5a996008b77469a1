// delta.cu: Gated-DeltaNet state ops (spec §4.4.2, §4.4.4) with the state on the device.

// The sequences of a multi-sequence pass, passed by value (kernel parameter space, so a
// captured graph replays it with no upload): sequence z's layer state (its conv window
// or ssm, one device buffer per sequence) and its tokens t0[z]..t0[z + 1] of the pass.
// ops_state.rs / ops_delta.rs (`SeqTab`) pack it with the same layout.
#define SEQ_TAB 16
struct SeqTab {
    unsigned long long st[SEQ_TAB];
    int t0[SEQ_TAB + 1];
    int n;
};

// The causal conv for every sequence of `tab`: out[t][c] = Σ_{i<d_conv} X_c[t+i]·w[c][i]
// over the sequence's window X = [state (d_conv−1 rows) | its x]. One thread per
// (channel, token t0[0]..t0[n] of the pass); the token's sequence found in the table.
extern "C" __global__ void conv1d_causal_seqs(const SeqTab tab, const float* __restrict__ x, const float* __restrict__ w,
                                              float* __restrict__ y, int C, int d_conv) {
    int T = tab.t0[tab.n] - tab.t0[0];
    i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (i64)C * T) return;
    int c = (int)(idx % C), t = tab.t0[0] + (int)(idx / C);
    int z = 0;
    while (z + 1 < tab.n && tab.t0[z + 1] <= t) z++;
    const float* st = (const float*)tab.st[z];
    const float* xs = x + (i64)tab.t0[z] * C;
    int tl = t - tab.t0[z], ns = d_conv - 1;
    float sum = 0.0f;
    for (int i = 0; i < d_conv; i++) {
        int r = tl + i;
        float xv = r < ns ? st[(i64)r * C + c] : xs[(i64)(r - ns) * C + c];
        sum += xv * w[(i64)c * d_conv + i];
    }
    y[(i64)t * C + c] = sum;
}

// Each sequence's new window (the last d_conv−1 rows of X) into new_st[z] ([n][d_conv −
// 1][C]), read before any is stored back: grid (ceil((d_conv − 1)·C / blockDim.x), n).
extern "C" __global__ void conv_state_update_seqs(const SeqTab tab, const float* __restrict__ x, float* __restrict__ new_st,
                                                  int C, int d_conv) {
    int ns = d_conv - 1, z = blockIdx.y;
    i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (z >= tab.n || idx >= (i64)ns * C) return;
    const float* st = (const float*)tab.st[z];
    const float* xs = x + (i64)tab.t0[z] * C;
    int T = tab.t0[z + 1] - tab.t0[z];
    int c = (int)(idx % C), r = (int)(idx / C) + T;  // window row
    new_st[(i64)z * ns * C + idx] = r < ns ? st[(i64)r * C + c] : xs[(i64)(r - ns) * C + c];
}

// The new windows back into each sequence's state: grid (ceil((d_conv − 1)·C / blockDim.x), n).
extern "C" __global__ void conv_state_store_seqs(const SeqTab tab, const float* __restrict__ new_st, int C, int d_conv) {
    int ns = d_conv - 1, z = blockIdx.y;
    i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (z >= tab.n || idx >= (i64)ns * C) return;
    ((float*)tab.st[z])[idx] = new_st[(i64)z * ns * C + idx];
}

// Gated delta rule, sequential over tokens (the recurrent form: decode and short inputs),
// for one sequence; block (V head, row tile): V head h (K head h mod Hk), thread j = blockIdx.y ·
// blockDim.x + threadIdx.x owns row j of ssm[h] (ssm[h][j][i] = S_h[i][j]), updated in
// place (rows are independent, so Dv tiles over blocks):
// S *= expf(g); kv_j = Σ_i S[i][j] k_i; δ_j = (v_j − kv_j)·β; S[i][j] += k_i δ_j;
// o_j = (Σ_i S[i][j] q_i) · 1/sqrtf(Dk). Every sum in the reference's order.
// use_sh: q, k of the current token staged in dynamic shared memory (2·Dk floats);
// 0 (Dk too large for it): read from global memory.
__device__ __forceinline__ void delta_rule_body(float* __restrict__ ssm, const float* __restrict__ q, const float* __restrict__ k,
                                                const float* __restrict__ v, const float* __restrict__ g,
                                                const float* __restrict__ beta, float* __restrict__ y, int Dk, int Hk, int Dv,
                                                int Hv, int T, float scale, int use_sh) {
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

// The gated delta rule for every sequence of `tab` in one launch: grid (Hv, ceil(Dv /
// blockDim.x), n), blockIdx.z the sequence (its ssm, its tokens of the pass); each block
// computes exactly what it computes for that sequence alone (one sequence: the same kernel).
extern "C" __global__ void delta_rule_seqs(const SeqTab tab, const float* __restrict__ q, const float* __restrict__ k,
                                           const float* __restrict__ v, const float* __restrict__ g,
                                           const float* __restrict__ beta, float* __restrict__ y, int Dk, int Hk, int Dv,
                                           int Hv, float scale, int use_sh) {
    int z = blockIdx.z;
    if (z >= tab.n) return;
    i64 t0 = tab.t0[z];
    int T = tab.t0[z + 1] - tab.t0[z];
    delta_rule_body((float*)tab.st[z], q + t0 * Hk * Dk, k + t0 * Hk * Dk, v + t0 * Hv * Dv, g + t0 * Hv, beta + t0 * Hv,
                    y + t0 * Hv * Dv, Dk, Hk, Dv, Hv, T, scale, use_sh);
}
