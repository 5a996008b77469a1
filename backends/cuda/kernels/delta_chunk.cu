// delta_chunk.cu: the chunked form of the gated delta rule (spec §4.4.5; the math of
// backends/cpu/src/delta_chunk.rs `chunked_body`, chunk DC = 64) for prefill. Equal to
// the recurrence (delta.cu `delta_rule`) up to float reassociation.
//
// Per V head h and chunk of l ≤ DC tokens t0.., with G the inclusive cumsum of g:
//   A[r][c] = β_r (k_r·k_c) e^{G_r−G_c} (c < r)   P[r][c] = (q̃_r·k_c) e^{G_r−G_c} (c ≤ r), q̃ = q·scale
//   T = (I + A)^{-1} (unit lower triangular)     Tb = T diag(β)   W = T diag(β e^G) K
//   U = Tb V   Vn = U − W S   O = diag(e^G) Q̃ S + P Vn
//   S := e^{G_last} S + Σ_r e^{G_last − G_r} k_r ⊗ Vn[r]
// Only Vn, O and S involve V rows j, and rows are independent: `delta_chunk_prep` builds
// P, Tb, W, G for every chunk of a group in parallel; `delta_chunk_apply` walks the
// chunks in order per (head, tile of DTJ rows of S).

#define DC 64
#define DTJ 32

// Scratch of one (head, chunk): P [DC][DC], Tb [DC][DC], W [DC][Dk], G [DC] floats.
__device__ __forceinline__ i64 dc_stride(int Dk) { return 2 * DC * DC + (i64)DC * Dk + DC; }

// grid (Hv, chunks of the group), block 256. Chunk blockIdx.y covers tokens
// (c0 + blockIdx.y)·DC ..; scratch of (h, ci) at ((h·gridDim.y) + ci)·stride.
// Dynamic shared memory: (2·DC·DC + 2·DC) floats (A, T, G, e^G).
extern "C" __global__ void delta_chunk_prep(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ g,
                                            const float* __restrict__ beta, float* __restrict__ scr, int Dk, int Hk, int Hv, int T,
                                            int c0, float scale) {
    extern __shared__ float sh[];
    float* A = sh;
    float* Tm = A + DC * DC;
    float* G = Tm + DC * DC;
    float* eG = G + DC;
    int h = blockIdx.x, kh = h % Hk, ci = blockIdx.y;
    int t0 = (c0 + ci) * DC;
    int l = T - t0 < DC ? T - t0 : DC;
    float* P = scr + ((i64)h * gridDim.y + ci) * dc_stride(Dk);
    float* Tb = P + DC * DC;
    float* W = Tb + DC * DC;
    float* Gout = W + (i64)DC * Dk;
    if (threadIdx.x == 0) {
        float acc = 0.0f;
        for (int r = 0; r < l; r++) {
            acc += g[(i64)(t0 + r) * Hv + h];
            G[r] = acc;
        }
    }
    __syncthreads();
    for (int r = threadIdx.x; r < l; r += blockDim.x) {
        eG[r] = expf(G[r]);
        Gout[r] = G[r];
    }
    // A (strictly lower) and P (lower), one (r, c) pair per thread, dots sequential in i
    for (int e = threadIdx.x; e < l * l; e += blockDim.x) {
        int r = e / l, c = e % l;
        if (c > r) continue;
        const float* kr = k + ((i64)(t0 + r) * Hk + kh) * Dk;
        const float* kc = k + ((i64)(t0 + c) * Hk + kh) * Dk;
        const float* qr = q + ((i64)(t0 + r) * Hk + kh) * Dk;
        float ex = expf(G[r] - G[c]);
        if (c < r) {
            float dd = 0.0f;
            for (int i = 0; i < Dk; i++) dd += kr[i] * kc[i];
            A[r * DC + c] = (beta[(i64)(t0 + r) * Hv + h] * dd) * ex;
        }
        float dq = 0.0f;
        for (int i = 0; i < Dk; i++) dq += (qr[i] * scale) * kc[i];
        P[r * DC + c] = dq * ex;
    }
    __syncthreads();
    // T = (I + A)^{-1} by forward substitution: T[r] = e_r − Σ_{m<r} A[r][m] T[m], m in order
    for (int r = 0; r < l; r++) {
        for (int c = threadIdx.x; c <= r; c += blockDim.x) {
            float x = c == r ? 1.0f : 0.0f;
            for (int m = c; m < r; m++) {
                float a = A[r * DC + m];
                if (a != 0.0f) x += -a * Tm[m * DC + c];
            }
            Tm[r * DC + c] = x;
        }
        __syncthreads();
    }
    for (int e = threadIdx.x; e < l * l; e += blockDim.x) {
        int r = e / l, c = e % l;
        Tb[r * DC + c] = c <= r ? Tm[r * DC + c] * beta[(i64)(t0 + c) * Hv + h] : 0.0f;
    }
    // W[r][i] = Σ_{c≤r} ((T[r][c]·β_c)·e^{G_c}) k_c[i], sequential in c
    for (int e = threadIdx.x; e < l * Dk; e += blockDim.x) {
        int r = e / Dk, i = e % Dk;
        float w = 0.0f;
        for (int c = 0; c <= r; c++) {
            float coef = (Tm[r * DC + c] * beta[(i64)(t0 + c) * Hv + h]) * eG[c];
            w += coef * k[((i64)(t0 + c) * Hk + kh) * Dk + i];
        }
        W[(i64)r * Dk + i] = w;
    }
}

// grid (Hv, ceil(Dv / DTJ)), block 256: rows j0 = blockIdx.y·DTJ .. of S_h (ssm[h][j]),
// chunks c0 .. c0+nch in order (scratch from delta_chunk_prep of the same group).
extern "C" __global__ void delta_chunk_apply(float* __restrict__ ssm, const float* __restrict__ q, const float* __restrict__ k,
                                             const float* __restrict__ v, const float* __restrict__ scr, float* __restrict__ y,
                                             int Dk, int Hk, int Dv, int Hv, int T, int c0, int nch, float scale) {
    __shared__ float vn[DC * DTJ];
    __shared__ float eg[DC], ag[DC];
    int h = blockIdx.x, kh = h % Hk, j0 = blockIdx.y * DTJ;
    int tj = Dv - j0 < DTJ ? Dv - j0 : DTJ;
    for (int ci = 0; ci < nch; ci++) {
        int t0 = (c0 + ci) * DC;
        int l = T - t0 < DC ? T - t0 : DC;
        const float* P = scr + ((i64)h * nch + ci) * dc_stride(Dk);
        const float* Tb = P + DC * DC;
        const float* W = Tb + DC * DC;
        const float* G = W + (i64)DC * Dk;
        for (int r = threadIdx.x; r < l; r += blockDim.x) {
            eg[r] = expf(G[r]);
            ag[r] = expf(G[l - 1] - G[r]);
        }
        __syncthreads();
        // Vn[r][j] = Σ_{c≤r} Tb[r][c] v_c[j] − W[r]·S_j;  y[r][j] = e^{G_r} (q̃_r·S_j)
        for (int e = threadIdx.x; e < l * tj; e += blockDim.x) {
            int r = e / tj, jj = e % tj, j = j0 + jj;
            const float* srow = ssm + ((i64)h * Dv + j) * Dk;
            float u = 0.0f;
            for (int c = 0; c <= r; c++) u += Tb[r * DC + c] * v[((i64)(t0 + c) * Hv + h) * Dv + j];
            const float* wr = W + (i64)r * Dk;
            const float* qr = q + ((i64)(t0 + r) * Hk + kh) * Dk;
            float wd = 0.0f, qd = 0.0f;
            for (int i = 0; i < Dk; i++) {
                wd += wr[i] * srow[i];
                qd += (qr[i] * scale) * srow[i];
            }
            vn[r * DTJ + jj] = u - wd;
            y[((i64)(t0 + r) * Hv + h) * Dv + j] = eg[r] * qd;
        }
        __syncthreads();
        // y[r][j] += Σ_{c≤r} P[r][c] Vn[c][j] (c in order)
        for (int e = threadIdx.x; e < l * tj; e += blockDim.x) {
            int r = e / tj, jj = e % tj;
            float* yp = y + ((i64)(t0 + r) * Hv + h) * Dv + j0 + jj;
            float o = *yp;
            for (int c = 0; c <= r; c++) o += P[r * DC + c] * vn[c * DTJ + jj];
            *yp = o;
        }
        // S_j[i] = e^{G_last} S_j[i] + Σ_r (e^{G_last−G_r} Vn[r][j]) k_r[i] (r in order)
        float dl = eg[l - 1];
        for (int e = threadIdx.x; e < tj * Dk; e += blockDim.x) {
            int jj = e / Dk, i = e % Dk;
            float* sp = ssm + ((i64)h * Dv + j0 + jj) * Dk + i;
            float sv = *sp * dl;
            for (int r = 0; r < l; r++) sv += (ag[r] * vn[r * DTJ + jj]) * k[((i64)(t0 + r) * Hk + kh) * Dk + i];
            *sp = sv;
        }
        __syncthreads();
    }
}
