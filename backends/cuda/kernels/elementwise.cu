// elementwise.cu: Unary, Binary (ggml modulo broadcast), SwiGLU, slices, MoE combine.
// One thread per output element.

// op: 0 silu, 1 sigmoid, 2 softplus, 3 exp, 4 scale(s)
extern "C" __global__ void unary_f32(const float* __restrict__ x, float* __restrict__ y, i64 n, int op, float s) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    switch (op) {
        case 0: v = silu_f(v); break;
        case 1: v = sigmoid_f(v); break;
        case 2: v = softplus_f(v); break;
        case 3: v = pn_exp_f(v); break;
        default: v = v * s; break;
    }
    y[i] = v;
}

// out[i0,i1,i2,i3] = f(a[...], b[i0 % b0, i1 % b1, i2 % b2, i3 % b3]); op: 0 add, 1 mul, 2 swiglu
extern "C" __global__ void binary_f32(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y, int a0, int a1,
                                      int a2, int a3, int b0, int b1, int b2, int b3, int op) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    i64 n = (i64)a0 * a1 * a2 * a3;
    if (i >= n) return;
    int i0 = (int)(i % a0);
    i64 r = i / a0;
    int i1 = (int)(r % a1);
    r /= a1;
    int i2 = (int)(r % a2);
    int i3 = (int)(r / a2);
    i64 ib = (((i64)(i3 % b3) * b2 + i2 % b2) * b1 + i1 % b1) * b0 + i0 % b0;
    float x = a[i], z = b[ib];
    y[i] = op == 0 ? x + z : (op == 1 ? x * z : silu_f(x) * z);
}

// Keep elements [offset, offset+len) of every group of `group`.
extern "C" __global__ void slice_cols(const float* __restrict__ x, float* __restrict__ y, i64 n_out, int group, int offset, int len) {
    i64 o = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= n_out) return;
    i64 g = o / len;
    y[o] = x[g * group + offset + (o % len)];
}

// y[i] = x[start + i] (SliceRows: a contiguous range of rows).
extern "C" __global__ void copy_f32(const float* __restrict__ x, float* __restrict__ y, i64 start, i64 n) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[start + i];
}
