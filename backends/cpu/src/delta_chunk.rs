//! The gated delta rule: a vectorized recurrent form (used for every batch, so a prompt
//! gives the same state fed at once or token by token), and the chunked form (spec
//! §4.4.5, chunk 64; opt-in with `PN_DELTA_CHUNKED_FROM=N`, see `delta::CHUNKED_FROM_T`).
//!
//! Both equal the reference recurrence (§4.4.4) up to float reassociation (the
//! reference sums every dot product sequentially; here sums run in 16 lanes), checked
//! to 1e-4 relative by the tests. They are bitwise independent of the thread count
//! (heads are split between threads, never a head's arithmetic) and of the platform:
//! no FMA contraction, plain mul + add, the same lane order whatever the SIMD width.
//!
//! Per head, the state is kept as the reference stores it, `st[j][i] = S[i][j]` (Dv rows
//! of Dk), so every dot product below runs over contiguous rows.

// Index loops over tokens and lanes read better than iterator chains here.
#![allow(clippy::needless_range_loop)]

/// Tokens per chunk.
pub const CHUNK: usize = 64;

/// One head's inputs: rows of q, k (Dk) and v (Dv) for each token, with g and β.
#[derive(Clone, Copy)]
pub struct HeadIn<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub g: &'a [f32],
    pub beta: &'a [f32],
    /// Strides (in floats) between consecutive tokens' rows of q/k, v, and g/β.
    pub qk_stride: usize,
    pub v_stride: usize,
    pub gb_stride: usize,
    pub dk: usize,
    pub dv: usize,
    pub t: usize,
}

impl<'a> HeadIn<'a> {
    /// Tokens `a..b` (`a < b ≤ t`) of these inputs.
    pub fn tokens(&self, a: usize, b: usize) -> HeadIn<'a> {
        HeadIn {
            q: &self.q[a * self.qk_stride..],
            k: &self.k[a * self.qk_stride..],
            v: &self.v[a * self.v_stride..],
            g: &self.g[a * self.gb_stride..],
            beta: &self.beta[a * self.gb_stride..],
            t: b - a,
            ..*self
        }
    }
    #[inline(always)]
    pub(crate) fn q(&self, t: usize) -> &[f32] {
        &self.q[t * self.qk_stride..][..self.dk]
    }
    #[inline(always)]
    pub(crate) fn k(&self, t: usize) -> &[f32] {
        &self.k[t * self.qk_stride..][..self.dk]
    }
    #[inline(always)]
    pub(crate) fn v(&self, t: usize) -> &[f32] {
        &self.v[t * self.v_stride..][..self.dv]
    }
    #[inline(always)]
    pub(crate) fn g(&self, t: usize) -> f32 {
        self.g[t * self.gb_stride]
    }
    #[inline(always)]
    pub(crate) fn beta(&self, t: usize) -> f32 {
        self.beta[t * self.gb_stride]
    }
}

/// Σ a·b in 16 lanes (lane l sums indices ≡ l mod 16, in order), then the lanes
/// pairwise, then the tail.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let n16 = n / 16 * 16;
    let mut acc = [0f32; 16];
    for (ca, cb) in a[..n16].chunks_exact(16).zip(b[..n16].chunks_exact(16)) {
        for l in 0..16 {
            acc[l] += ca[l] * cb[l];
        }
    }
    let mut w = 8;
    while w > 0 {
        for l in 0..w {
            acc[l] += acc[l + w];
        }
        w /= 2;
    }
    let mut s = acc[0];
    for i in n16..n {
        s += a[i] * b[i];
    }
    s
}

/// y += a·x.
#[inline(always)]
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// The two vector primitives, portable or AVX2 (same lanes, same order: bitwise equal).
trait Vops {
    fn dot(a: &[f32], b: &[f32]) -> f32;
    fn axpy(y: &mut [f32], a: f32, x: &[f32]);
    /// `y *= s`, then `dot(y, b)` (one pass).
    fn scale_dot(y: &mut [f32], s: f32, b: &[f32]) -> f32 {
        for v in y.iter_mut() {
            *v *= s;
        }
        Self::dot(y, b)
    }
    /// `axpy(y, a, x)`, then `dot(y, b)` (one pass).
    fn axpy_dot(y: &mut [f32], a: f32, x: &[f32], b: &[f32]) -> f32 {
        Self::axpy(y, a, x);
        Self::dot(y, b)
    }
}

struct Portable;
impl Vops for Portable {
    #[inline(always)]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        dot(a, b)
    }
    #[inline(always)]
    fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
        axpy(y, a, x)
    }
}

#[cfg(target_arch = "x86_64")]
struct Avx;
#[cfg(target_arch = "x86_64")]
impl Vops for Avx {
    /// `dot` with two 8-lane accumulators (lanes 0..8 and 8..16) and the same reduction
    /// tree. Only inlined into `avx2` functions.
    #[inline(always)]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        use std::arch::x86_64::*;
        let n = a.len().min(b.len());
        let n16 = n / 16 * 16;
        // SAFETY: AVX is enabled in every caller (the `*_avx2` entry points); every
        // load reads 8 floats at i or i + 8 with i + 16 <= n16 <= both lengths.
        unsafe {
            let (pa, pb) = (a.as_ptr(), b.as_ptr());
            let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut i = 0;
            while i < n16 {
                a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i))));
                a1 = _mm256_add_ps(
                    a1,
                    _mm256_mul_ps(_mm256_loadu_ps(pa.add(i + 8)), _mm256_loadu_ps(pb.add(i + 8))),
                );
                i += 16;
            }
            let mut s = reduce16(a0, a1);
            for i in n16..n {
                s += a[i] * b[i];
            }
            s
        }
    }
    #[inline(always)]
    fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
        use std::arch::x86_64::*;
        let n = y.len().min(x.len());
        let n8 = n / 8 * 8;
        // SAFETY: AVX enabled in every caller; 8 floats at i with i + 8 <= n8.
        unsafe {
            let av = _mm256_set1_ps(a);
            let (py, px) = (y.as_mut_ptr(), x.as_ptr());
            let mut i = 0;
            while i < n8 {
                let v = _mm256_add_ps(_mm256_loadu_ps(py.add(i)), _mm256_mul_ps(av, _mm256_loadu_ps(px.add(i))));
                _mm256_storeu_ps(py.add(i), v);
                i += 8;
            }
        }
        for i in n8..n {
            y[i] += a * x[i];
        }
    }
    #[inline(always)]
    fn scale_dot(y: &mut [f32], s: f32, b: &[f32]) -> f32 {
        use std::arch::x86_64::*;
        let n = y.len().min(b.len());
        if !n.is_multiple_of(16) {
            for v in y.iter_mut() {
                *v *= s;
            }
            return Self::dot(y, b);
        }
        // SAFETY: AVX enabled in every caller; n is a multiple of 16 inside both slices.
        unsafe {
            let sv = _mm256_set1_ps(s);
            let (py, pb) = (y.as_mut_ptr(), b.as_ptr());
            let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut i = 0;
            while i < n {
                let y0 = _mm256_mul_ps(_mm256_loadu_ps(py.add(i)), sv);
                let y1 = _mm256_mul_ps(_mm256_loadu_ps(py.add(i + 8)), sv);
                _mm256_storeu_ps(py.add(i), y0);
                _mm256_storeu_ps(py.add(i + 8), y1);
                a0 = _mm256_add_ps(a0, _mm256_mul_ps(y0, _mm256_loadu_ps(pb.add(i))));
                a1 = _mm256_add_ps(a1, _mm256_mul_ps(y1, _mm256_loadu_ps(pb.add(i + 8))));
                i += 16;
            }
            for v in y[n..].iter_mut() {
                *v *= s;
            }
            reduce16(a0, a1)
        }
    }
    #[inline(always)]
    fn axpy_dot(y: &mut [f32], a: f32, x: &[f32], b: &[f32]) -> f32 {
        use std::arch::x86_64::*;
        let n = y.len();
        if !n.is_multiple_of(16) || x.len() < n || b.len() < n {
            Self::axpy(y, a, x);
            return Self::dot(y, b);
        }
        // SAFETY: AVX enabled in every caller; n is a multiple of 16 inside all slices.
        unsafe {
            let av = _mm256_set1_ps(a);
            let (py, px, pb) = (y.as_mut_ptr(), x.as_ptr(), b.as_ptr());
            let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut i = 0;
            while i < n {
                let y0 = _mm256_add_ps(_mm256_loadu_ps(py.add(i)), _mm256_mul_ps(av, _mm256_loadu_ps(px.add(i))));
                let y1 = _mm256_add_ps(
                    _mm256_loadu_ps(py.add(i + 8)),
                    _mm256_mul_ps(av, _mm256_loadu_ps(px.add(i + 8))),
                );
                _mm256_storeu_ps(py.add(i), y0);
                _mm256_storeu_ps(py.add(i + 8), y1);
                a0 = _mm256_add_ps(a0, _mm256_mul_ps(y0, _mm256_loadu_ps(pb.add(i))));
                a1 = _mm256_add_ps(a1, _mm256_mul_ps(y1, _mm256_loadu_ps(pb.add(i + 8))));
                i += 16;
            }
            reduce16(a0, a1)
        }
    }
}

/// The 16-lane reduction tree of `dot` (lanes 0..8 in `a0`, 8..16 in `a1`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn reduce16(a0: std::arch::x86_64::__m256, a1: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let v = _mm256_add_ps(a0, a1);
    let x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let y = _mm_add_ps(x, _mm_movehl_ps(x, x));
    _mm_cvtss_f32(y) + _mm_cvtss_f32(_mm_shuffle_ps(y, y, 1))
}

/// Scratch of one chunk (reused across chunks and calls).
#[derive(Default)]
pub struct Scratch {
    gc: Vec<f32>,
    a: Vec<f32>,
    tm: Vec<f32>,
    p: Vec<f32>,
    u: Vec<f32>,
    w: Vec<f32>,
    qs: Vec<f32>,
    vn: Vec<f32>,
    qk: Vec<f32>,
}

/// Recurrent form, vectorized: per token, decay, kv_j = S_j·k, δ_j = (v_j − kv_j)β,
/// S_j += δ_j k, o_j = (S_j·q)·scale. `o` is [T][Dv].
#[inline(always)]
fn recurrent_body<V: Vops>(p: &HeadIn<'_>, st: &mut [f32], o: &mut [f32]) {
    let (dk, dv) = (p.dk, p.dv);
    let scale = 1.0f32 / (dk as f32).sqrt();
    for ti in 0..p.t {
        let (qt, kt, vt) = (p.q(ti), p.k(ti), p.v(ti));
        let decay = p.g(ti).exp();
        let bt = p.beta(ti);
        let ot = &mut o[ti * dv..(ti + 1) * dv];
        for (j, row) in st.chunks_exact_mut(dk).enumerate().take(dv) {
            let d = (vt[j] - V::scale_dot(row, decay, kt)) * bt;
            ot[j] = V::axpy_dot(row, d, kt, qt) * scale;
        }
    }
}

/// Chunked form over all tokens of one head. `o` is [T][Dv].
#[inline(always)]
fn chunked_body<V: Vops>(p: &HeadIn<'_>, st: &mut [f32], o: &mut [f32], sc: &mut Scratch) {
    let (dk, dv) = (p.dk, p.dv);
    let scale = 1.0f32 / (dk as f32).sqrt();
    let c = CHUNK;
    sc.gc.resize(c, 0.0);
    sc.a.resize(c * c, 0.0);
    sc.tm.resize(c * c, 0.0);
    sc.p.resize(c * c, 0.0);
    sc.qk.resize(c * dk, 0.0);
    sc.u.resize(c * dv, 0.0);
    sc.w.resize(c * dk, 0.0);
    sc.qs.resize(c * dv, 0.0);
    sc.vn.resize(c * dv, 0.0);
    let mut t0 = 0;
    while t0 < p.t {
        let l = c.min(p.t - t0);
        // G: inclusive cumulative sum of g inside the chunk.
        let mut acc = 0.0f32;
        for r in 0..l {
            acc += p.g(t0 + r);
            sc.gc[r] = acc;
        }
        let gc = &sc.gc[..l];
        // q̃ = q·scale (rows kept in scratch).
        for r in 0..l {
            let qr = p.q(t0 + r);
            for (y, &x) in sc.qk[r * dk..(r + 1) * dk].iter_mut().zip(qr) {
                *y = x * scale;
            }
        }
        // A[r][c] = β_r (k_r·k_c) e^{G_r−G_c} (c < r); P[r][c] = (q̃_r·k_c) e^{G_r−G_c} (c ≤ r).
        for r in 0..l {
            let kr = p.k(t0 + r);
            let br = p.beta(t0 + r);
            let qr = &sc.qk[r * dk..(r + 1) * dk];
            for cc in 0..=r {
                let kc = p.k(t0 + cc);
                let e = (gc[r] - gc[cc]).exp();
                if cc < r {
                    sc.a[r * c + cc] = br * V::dot(kr, kc) * e;
                }
                sc.p[r * c + cc] = V::dot(qr, kc) * e;
            }
        }
        // T = (I + A)^{-1}, unit lower triangular: T[r] = e_r − Σ_{m<r} A[r][m] T[m].
        for r in 0..l {
            let (done, row) = sc.tm.split_at_mut(r * c);
            let row = &mut row[..l];
            row.fill(0.0);
            row[r] = 1.0;
            for m in 0..r {
                let arm = sc.a[r * c + m];
                if arm != 0.0 {
                    V::axpy(&mut row[..=m], -arm, &done[m * c..m * c + m + 1]);
                }
            }
        }
        // U = T diag(β) V;  W = T diag(β e^G) K.
        for r in 0..l {
            let (u, w) = (&mut sc.u[r * dv..(r + 1) * dv], &mut sc.w[r * dk..(r + 1) * dk]);
            u.fill(0.0);
            w.fill(0.0);
            for cc in 0..=r {
                let t = sc.tm[r * c + cc];
                let b = p.beta(t0 + cc);
                V::axpy(u, t * b, p.v(t0 + cc));
                V::axpy(w, t * b * gc[cc].exp(), p.k(t0 + cc));
            }
        }
        // Vn = U − W S;  qs = Q̃ S  (S as rows st[j]).
        for (j, row) in st.chunks_exact(dk).enumerate().take(dv) {
            for r in 0..l {
                sc.vn[r * dv + j] = sc.u[r * dv + j] - V::dot(&sc.w[r * dk..(r + 1) * dk], row);
                sc.qs[r * dv + j] = V::dot(&sc.qk[r * dk..(r + 1) * dk], row);
            }
        }
        // O = diag(e^G) Q̃ S + P Vn.
        for r in 0..l {
            let or = &mut o[(t0 + r) * dv..(t0 + r + 1) * dv];
            let eg = gc[r].exp();
            for (y, &x) in or.iter_mut().zip(&sc.qs[r * dv..(r + 1) * dv]) {
                *y = eg * x;
            }
            for cc in 0..=r {
                V::axpy(or, sc.p[r * c + cc], &sc.vn[cc * dv..(cc + 1) * dv]);
            }
        }
        // S := e^{G_last} S + Σ_t e^{G_last − G_t} k_t ⊗ Vn[t].
        let glast = gc[l - 1];
        let dl = glast.exp();
        for r in 0..l {
            sc.a[r] = (glast - gc[r]).exp(); // reuse: per-token decay to the chunk end
        }
        for (j, row) in st.chunks_exact_mut(dk).enumerate().take(dv) {
            for x in row.iter_mut() {
                *x *= dl;
            }
            for r in 0..l {
                V::axpy(row, sc.a[r] * sc.vn[r * dv + j], p.k(t0 + r));
            }
        }
        t0 += l;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn recurrent_avx2(p: &HeadIn<'_>, st: &mut [f32], o: &mut [f32]) {
    if rows_blockable(p, st) {
        // SAFETY: AVX2 enabled here; Dk a multiple of 16, st holds Dv rows of Dk
        return unsafe { crate::delta_rows::recurrent::<crate::delta_rows::Avx2, 4>(p, st, o) };
    }
    recurrent_body::<Avx>(p, st, o)
}

/// Whether `delta_rows` can run this head: whole 16-lane chunks per row, Dv rows in `st`.
#[cfg(target_arch = "x86_64")]
fn rows_blockable(p: &HeadIn<'_>, st: &[f32]) -> bool {
    p.dk.is_multiple_of(16) && st.len() >= p.dv * p.dk
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f")]
unsafe fn recurrent_avx512(p: &HeadIn<'_>, st: &mut [f32], o: &mut [f32]) {
    // SAFETY: AVX-512F enabled here; the caller checked Dk and the state's length
    unsafe { crate::delta_rows::recurrent::<crate::delta_rows::Avx512, 8>(p, st, o) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chunked_avx2(p: &HeadIn<'_>, st: &mut [f32], o: &mut [f32], sc: &mut Scratch) {
    chunked_body::<Avx>(p, st, o, sc)
}

#[cfg(target_arch = "x86_64")]
fn avx2() -> bool {
    pn_ops::quant::simd_available()
}

/// One head, recurrent form (vectorized), denormals flushed (`delta_rows::FlushDenormals`). `st` is [Dv][Dk], `o` is [T][Dv].
pub fn recurrent(p: &HeadIn<'_>, st: &mut [f32], o: &mut [f32]) {
    let _ftz = crate::delta_rows::FlushDenormals::on();
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        if pn_ops::quant::avx512_available() && rows_blockable(p, st) {
            // SAFETY: AVX-512F detected; Dk a multiple of 16, st holds Dv rows of Dk
            return unsafe { recurrent_avx512(p, st, o) };
        }
        // SAFETY: AVX2 + FMA detected (`simd_available` also requires them).
        return unsafe { recurrent_avx2(p, st, o) };
    }
    recurrent_body::<Portable>(p, st, o)
}

/// One head, chunked form, denormals flushed as in [`recurrent`]. `st` is [Dv][Dk], `o` is [T][Dv].
pub fn chunked(p: &HeadIn<'_>, st: &mut [f32], o: &mut [f32], sc: &mut Scratch) {
    let _ftz = crate::delta_rows::FlushDenormals::on();
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2 + FMA detected.
        return unsafe { chunked_avx2(p, st, o, sc) };
    }
    chunked_body::<Portable>(p, st, o, sc)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        pn_ops::testing::uniform(n, seed, 99991)
    }

    /// The dispatched recurrence (blocked rows on AVX2 / AVX-512) is bitwise the
    /// portable one, token blocks and row tails included.
    #[test]
    fn blocked_rows_are_bitwise_the_portable_recurrence() {
        for (dk, dv) in [(128usize, 128usize), (32, 6), (16, 9), (48, 130)] {
            for t in [1usize, 3, 16, 17, 40] {
                let (hk, hv) = (2, 3);
                let q = data(t * hk * dk, 1);
                let k = data(t * hk * dk, 2);
                let v = data(t * hv * dv, 3);
                let g: Vec<f32> = data(t * hv, 4).iter().map(|x| -0.5 * (x + 1.0)).collect();
                let b: Vec<f32> = data(t * hv, 5).iter().map(|x| 0.5 * (x + 1.0)).collect();
                let p = HeadIn { q: &q[dk..], k: &k[dk..], v: &v[dv..], g: &g[1..], beta: &b[1..], qk_stride: hk * dk, v_stride: hv * dv, gb_stride: hv, dk, dv, t };
                let s0 = data(dv * dk, 6);
                let (mut s1, mut o1) = (s0.clone(), vec![0f32; t * dv]);
                recurrent_body::<Portable>(&p, &mut s1, &mut o1);
                let (mut s2, mut o2) = (s0.clone(), vec![0f32; t * dv]);
                recurrent(&p, &mut s2, &mut o2);
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&o1), bits(&o2), "out, Dk {dk} Dv {dv} T {t}");
                assert_eq!(bits(&s1), bits(&s2), "state, Dk {dk} Dv {dv} T {t}");
            }
        }
    }
}
