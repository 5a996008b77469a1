// norm.cu: RmsNorm, L2Norm, Softmax (spec §4.2, §4.4.3, §5). One block per row of n;
// sums in f64 like pn_ops::reference::norm (block tree order instead of sequential).

// y = x * (1/sqrtf(mean(x²) + eps)) [* w]; w may be null.
extern "C" __global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int n, float eps) {
    __shared__ double sh[32];
    const float* xr = x + (i64)blockIdx.x * n;
    float* yr = y + (i64)blockIdx.x * n;
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += (double)xr[i] * (double)xr[i];
    s = block_sum_d(s, sh);
    float mean = (float)(s / (double)n);
    float scale = 1.0f / sqrtf(mean + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = w ? xr[i] * scale * w[i] : xr[i] * scale;
}

// y = x * (1/sqrtf(mean + eps/n)) * (1/sqrtf(n))
extern "C" __global__ void l2_norm(const float* __restrict__ x, float* __restrict__ y, int n, float eps) {
    __shared__ double sh[32];
    const float* xr = x + (i64)blockIdx.x * n;
    float* yr = y + (i64)blockIdx.x * n;
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += (double)xr[i] * (double)xr[i];
    s = block_sum_d(s, sh);
    float mean = (float)(s / (double)n);
    float scale = 1.0f / sqrtf(mean + eps / (float)n);
    float s2 = 1.0f / sqrtf((float)n);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * scale * s2;
}

// e = expf(x − max), sum in f64, y = e * (float)(1/sum)
extern "C" __global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, int n) {
    __shared__ float shf[32];
    __shared__ double shd[32];
    const float* xr = x + (i64)blockIdx.x * n;
    float* yr = y + (i64)blockIdx.x * n;
    float m = -__int_as_float(0x7f800000);
    for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, xr[i]);
    m = block_max_f(m, shf);
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float e = expf(xr[i] - m);
        yr[i] = e;
        s += (double)e;
    }
    s = block_sum_d(s, shd);
    float inv = (float)(1.0 / s);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] *= inv;
}
