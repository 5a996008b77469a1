// rope.cu: rotary embedding, NEOX pairing (i, i + n_rot/2) or, with `normal`, adjacent
// pairs (2i, 2i+1); theta divided by the pair's freq factor ff[i] when ff is not null;
// theta built by the
// iterative f32 product of ggml / pn_ops::reference::common::rope_angles; IMRope picks
// the section's position ((p, p, p, 0) for text). In place on x [D, H, T].
// theta_scale = powf(freq_base, -2/n_rot) is computed by the host (Rust f32::powf) so
// it is the CPU's value bit for bit. One thread per (pair i, head h, token t).

extern "C" __global__ void rope_neox(float* __restrict__ x, const int* __restrict__ pos, int D, int H, int T, int B, int n_rot,
                                     float theta_scale, float freq_scale, int imrope, int s0, int s1, int s2, int s3,
                                     const float* __restrict__ ff, int normal) {
    int half = n_rot / 2;
    i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (i64)half * H * T * B) return;
    int i = (int)(idx % half);
    i64 ht = idx / half;  // h + H*t
    int t = (int)((ht / H) % T);  // ne3 (B) batches share the positions
    float theta_p = (float)pos[t];
    float theta_e = 0.0f;
    for (int k = 0; k < i; k++) {
        theta_p *= theta_scale;
        theta_e *= theta_scale;
    }
    float theta = theta_p;
    if (imrope) {
        int sect = s0 + s1 + s2 + s3;
        int sector = i % sect;
        bool pick_p = (sector % 3 == 1 && sector < 3 * s1) || (sector % 3 == 2 && sector < 3 * s2) ||
                      (sector % 3 == 0 && sector < 3 * s0);
        theta = pick_p ? theta_p : theta_e;
    }
    float th = ff ? freq_scale * (theta / ff[i]) : freq_scale * theta;
    float c = cosf(th), s = sinf(th);
    float* v = x + ht * D;
    int j = normal ? 2 * i : i, off = normal ? 1 : half;
    float a = v[j], b = v[j + off];
    v[j] = a * c - b * s;
    v[j + off] = a * s + b * c;
}
