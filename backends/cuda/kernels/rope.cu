// rope.cu: rotary embedding, NEOX pairing (i, i + n_rot/2), theta built by the
// iterative f32 product of ggml / pn_ops::reference::common::rope_angles; IMRope picks
// the section's position ((p, p, p, 0) for text). In place on x [D, H, T].
// theta_scale = powf(freq_base, -2/n_rot) is computed by the host (Rust f32::powf) so
// it is the CPU's value bit for bit. One thread per (pair i, head h, token t).

extern "C" __global__ void rope_neox(float* __restrict__ x, const int* __restrict__ pos, int D, int H, int T, int B, int n_rot,
                                     float theta_scale, float freq_scale, int imrope, int s0, int s1, int s2, int s3) {
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
    float th = freq_scale * theta;
    float c = cosf(th), s = sinf(th);
    float* v = x + ht * D;
    float a = v[i], b = v[i + half];
    v[i] = a * c - b * s;
    v[i + half] = a * s + b * c;
}
