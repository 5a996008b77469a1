//! The delta-rule recurrence blocked for the cache and the pipeline: bitwise what
//! `delta_chunk::recurrent_body` computes, in another loop order.
//!
//! Each row `j` of a head's state (`st[j]` = column j of S, Dk floats) evolves on its own:
//! per token it is decayed, dotted with k, updated by δ_j k and dotted with q, and only
//! the token's k, q, v_j, g, β enter. So the rows can run in any order, and each row's
//! arithmetic stays the same operations in the same order. Here `R` rows run together
//! through a block of [`TOKENS`] tokens:
//! * `R` independent dot-product chains are in flight at once (one row's chain, 8 vector
//!   adds + a reduction + the scalar δ, is ~4× longer than its arithmetic at Dk = 128);
//! * the `R` rows stay in L1 for the whole token block, so a head's 64 KB state crosses
//!   L2 once per block instead of once per token.
//!
//! Measured (Xeon 6/207, `row_groups` below, 16 heads of Dk = Dv = 128, T ≥ 16): AVX-512
//! with 8 rows 2.15 µs per token and head, 4 rows 2.45, one row (the old loop order) 4.67;
//! AVX2 with 4 rows 2.96–3.12, 2 rows 3.8–4.0, one row 4.7–4.9.
//!
//! Sums are 16 lanes wide as in `delta_chunk::dot` (lane l sums indices ≡ l mod 16 in
//! order, then the lanes pairwise: 8, 4, 2, 1), with plain mul + add (no FMA), so every
//! width gives the same bits.

// Index loops over rows and lanes read better than iterator chains here.
#![allow(clippy::needless_range_loop)]

use crate::delta_chunk::HeadIn;

/// Tokens per block: `R` rows (R × Dk floats) and the block's q and k rows
/// (2 × TOKENS × Dk floats, 16 KB at Dk = 128) stay in L1 together.
pub const TOKENS: usize = 16;

/// 16 f32 lanes, the unit every sum here runs in.
pub trait Lanes {
    type V: Copy;
    unsafe fn zero() -> Self::V;
    unsafe fn splat(x: f32) -> Self::V;
    unsafe fn load(p: *const f32) -> Self::V;
    unsafe fn store(p: *mut f32, v: Self::V);
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// Lanes pairwise: l += l + 8, then + 4, + 2, + 1; lane 0.
    unsafe fn sum(v: Self::V) -> f32;
}

/// Two 8-lane AVX registers (lanes 0..8, 8..16).
#[cfg(target_arch = "x86_64")]
pub struct Avx2;

#[cfg(target_arch = "x86_64")]
impl Lanes for Avx2 {
    type V = (std::arch::x86_64::__m256, std::arch::x86_64::__m256);
    #[inline(always)]
    unsafe fn zero() -> Self::V {
        use std::arch::x86_64::*;
        unsafe { (_mm256_setzero_ps(), _mm256_setzero_ps()) }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self::V {
        use std::arch::x86_64::*;
        unsafe { (_mm256_set1_ps(x), _mm256_set1_ps(x)) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self::V {
        use std::arch::x86_64::*;
        unsafe { (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self::V) {
        use std::arch::x86_64::*;
        unsafe {
            _mm256_storeu_ps(p, v.0);
            _mm256_storeu_ps(p.add(8), v.1);
        }
    }
    #[inline(always)]
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V {
        use std::arch::x86_64::*;
        unsafe { (_mm256_add_ps(a.0, b.0), _mm256_add_ps(a.1, b.1)) }
    }
    #[inline(always)]
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V {
        use std::arch::x86_64::*;
        unsafe { (_mm256_mul_ps(a.0, b.0), _mm256_mul_ps(a.1, b.1)) }
    }
    #[inline(always)]
    unsafe fn sum(v: Self::V) -> f32 {
        // SAFETY: AVX enabled in every caller (the `delta_chunk::dot` reduction tree)
        unsafe { crate::delta_chunk::reduce16(v.0, v.1) }
    }
}

/// One 16-lane AVX-512 register.
#[cfg(target_arch = "x86_64")]
pub struct Avx512;

#[cfg(target_arch = "x86_64")]
impl Lanes for Avx512 {
    type V = std::arch::x86_64::__m512;
    #[inline(always)]
    unsafe fn zero() -> Self::V {
        unsafe { std::arch::x86_64::_mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self::V {
        unsafe { std::arch::x86_64::_mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self::V {
        unsafe { std::arch::x86_64::_mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self::V) {
        unsafe { std::arch::x86_64::_mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V {
        unsafe { std::arch::x86_64::_mm512_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V {
        unsafe { std::arch::x86_64::_mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn sum(v: Self::V) -> f32 {
        use std::arch::x86_64::*;
        unsafe {
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
            crate::delta_chunk::reduce16(_mm512_castps512_ps256(v), hi)
        }
    }
}

/// One head, all its tokens: `st` is [Dv][Dk], `o` is [T][Dv].
///
/// # Safety
/// The CPU has what `L` uses; `p.dk` is a multiple of 16 and `st` holds `p.dv` rows of
/// `p.dk` (checked by the caller); `o` holds `p.t` rows of `p.dv` (asserted).
#[inline(always)]
pub unsafe fn recurrent<L: Lanes, const R: usize>(p: &HeadIn<'_>, st: &mut [f32], o: &mut [f32]) {
    let (dk, dv) = (p.dk, p.dv);
    assert!(dk.is_multiple_of(16) && st.len() >= dv * dk && o.len() >= p.t * dv);
    let scale = 1.0f32 / (dk as f32).sqrt();
    #[cfg(target_arch = "x86_64")]
    let ahead = pn_ops::quant::knob(pn_ops::quant::KNOB_DELTA_PREFETCH, PREFETCH_GROUPS) * R * dk;
    #[cfg(not(target_arch = "x86_64"))]
    let ahead = 0;
    let mut t0 = 0;
    while t0 < p.t {
        let t1 = p.t.min(t0 + TOKENS);
        let mut j = 0;
        while j + R <= dv {
            // the group `ahead` floats on (past the head's end: the next head's state)
            let pf = if ahead > 0 { st.as_ptr().wrapping_add(j * dk + ahead) } else { std::ptr::null() };
            // SAFETY: rows j..j + R of st and columns j..j + R of o's rows are in bounds
            unsafe { rows::<L, R>(p, st.as_mut_ptr().add(j * dk), j, t0, t1, o.as_mut_ptr(), scale, pf) };
            j += R;
        }
        while j < dv {
            // SAFETY: as above, one row
            unsafe { rows::<L, 1>(p, st.as_mut_ptr().add(j * dk), j, t0, t1, o.as_mut_ptr(), scale, std::ptr::null()) };
            j += 1;
        }
        t0 = t1;
    }
}

/// Denormal floats flushed to zero (MXCSR FTZ + DAZ) while alive; the thread's previous
/// mode restored on drop. A long-decayed state drifts into the denormal range (|x| <
/// 2⁻¹²⁶), where every multiply and add takes a microcode assist: a head whose state sat
/// there ran 96–105 µs a token instead of 2.0–2.2 (Xeon 6/207, `tests/delta_chunk.rs`
/// `timing`; the synthetic model files never reach it). Values that small are below any output's
/// resolution; every form of the CPU delta rule (`delta_chunk::recurrent` and `chunked`,
/// so prefill, decode, slots, any thread) runs under it, so results stay bitwise
/// invariant among them, and within the reference's 1e-4 (it keeps denormals).
pub(crate) struct FlushDenormals(#[cfg(target_arch = "x86_64")] u32);

impl FlushDenormals {
    #[inline(always)]
    pub(crate) fn on() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            let mut old: u32 = 0;
            // SAFETY: stmxcsr / ldmxcsr read and write the thread's SSE control word only
            // (FTZ bit 15, DAZ bit 6); no memory but `old`.
            unsafe {
                std::arch::asm!("stmxcsr [{0}]", in(reg) &mut old, options(nostack, preserves_flags));
                let new = old | 0x8040;
                std::arch::asm!("ldmxcsr [{0}]", in(reg) &new, options(nostack, readonly, preserves_flags));
            }
            FlushDenormals(old)
        }
        #[cfg(not(target_arch = "x86_64"))]
        FlushDenormals()
    }
}

impl Drop for FlushDenormals {
    #[inline(always)]
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: restores the control word read in `on`.
        unsafe {
            std::arch::asm!("ldmxcsr [{0}]", in(reg) &self.0, options(nostack, readonly, preserves_flags))
        };
    }
}

/// Row groups of state prefetched ahead of the group being computed. A decode step reads
/// each head's 64 KB state from memory once (16 sequences: 32 MB a layer), and each group
/// of rows starts a new 4 KB page, where the hardware's streamer stops. The lines go out
/// spread over the group's first pass (`rows`): `cold_state`, Xeon 6/207, 2 groups ahead,
/// all at once → spread: one thread 6.84 → 5.37 µs a head, two 3.52 → 2.82 (the
/// in-place read-modify-write bound of that memory: ~4.5 / ~2.7).
const PREFETCH_GROUPS: usize = 2;

/// Prefetches the line at `p` into L1 (a prefetch never faults, whatever the address).
#[inline(always)]
fn prefetch_line(p: *const f32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint: it never reads memory it may not
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Rows `j..j + R` (at `st`) through tokens `t0..t1`; outputs into `o[t][j..j + R]`.
/// `pf` (null: none): `R` rows of `p.dk` floats to prefetch into L1, a line of each row
/// per 16 columns of the first token's first pass, so the loads stay in flight beside
/// the arithmetic (all 64 lines of a group at once stalled the loop until they landed).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn rows<L: Lanes, const R: usize>(p: &HeadIn<'_>, st: *mut f32, j: usize, t0: usize, t1: usize, o: *mut f32, scale: f32, pf: *const f32) {
    let (dk, dv) = (p.dk, p.dv);
    for ti in t0..t1 {
        let (kt, qt) = (p.k(ti).as_ptr(), p.q(ti).as_ptr());
        let vt = p.v(ti);
        let bt = p.beta(ti);
        // SAFETY (whole block): kt and qt hold Dk floats, the rows R × Dk (caller)
        unsafe {
            // decay, then kv_r = row_r · k
            let decay = L::splat(p.g(ti).exp());
            let mut acc = [L::zero(); R];
            for c in (0..dk).step_by(16) {
                let kc = L::load(kt.add(c));
                if ti == t0 && !pf.is_null() {
                    for r in 0..R {
                        prefetch_line(pf.wrapping_add(r * dk + c));
                    }
                }
                for r in 0..R {
                    let at = st.add(r * dk + c);
                    let y = L::mul(L::load(at), decay);
                    L::store(at, y);
                    acc[r] = L::add(acc[r], L::mul(y, kc));
                }
            }
            // δ_r = (v_r − kv_r) β; row_r += δ_r k; o_r = (row_r · q) scale
            let mut d = [L::zero(); R];
            for r in 0..R {
                d[r] = L::splat((vt[j + r] - L::sum(acc[r])) * bt);
            }
            let mut acc = [L::zero(); R];
            for c in (0..dk).step_by(16) {
                let (kc, qc) = (L::load(kt.add(c)), L::load(qt.add(c)));
                for r in 0..R {
                    let at = st.add(r * dk + c);
                    let y = L::add(L::load(at), L::mul(d[r], kc));
                    L::store(at, y);
                    acc[r] = L::add(acc[r], L::mul(y, qc));
                }
            }
            for r in 0..R {
                *o.add(ti * dv + j + r) = L::sum(acc[r]) * scale;
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod timing {
    use super::*;

    #[target_feature(enable = "avx2,fma,avx512f")]
    unsafe fn run512<const R: usize>(p: &HeadIn<'_>, st: &mut [f32], o: &mut [f32]) {
        unsafe { recurrent::<Avx512, R>(p, st, o) }
    }
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run256<const R: usize>(p: &HeadIn<'_>, st: &mut [f32], o: &mut [f32]) {
        unsafe { recurrent::<Avx2, R>(p, st, o) }
    }

    type Kernel = unsafe fn(&HeadIn<'_>, &mut [f32], &mut [f32]);

    /// Row-group sizes side by side, calls interleaved (`cargo test --release -p pn-cpu
    /// --lib delta_rows -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn row_groups() {
        let (d, heads) = (128usize, 16usize);
        for t in [1usize, 16, 128] {
            let x = |n: usize, s: u32| pn_ops::testing::uniform(n, s, 99991);
            let (q, k, v) = (x(t * d, 1), x(t * d, 2), x(t * d, 3));
            let g: Vec<f32> = x(t, 4).iter().map(|x| -0.3 * (x + 1.0)).collect();
            let b: Vec<f32> = x(t, 5).iter().map(|x| 0.5 * (x + 1.0)).collect();
            let p = HeadIn { q: &q, k: &k, v: &v, g: &g, beta: &b, qk_stride: d, v_stride: d, gb_stride: 1, dk: d, dv: d, t };
            let mut s = x(heads * d * d, 6);
            let mut o = vec![0f32; t * d];
            let variants: [(&str, Kernel); 6] =
                [("512x2", run512::<2>), ("512x4", run512::<4>), ("512x8", run512::<8>), ("256x1", run256::<1>), ("256x2", run256::<2>), ("256x4", run256::<4>)];
            let mut best = [f64::MAX; 6];
            let reps = (1024 / t).max(2);
            for _ in 0..7 {
                for (i, (_, f)) in variants.iter().enumerate() {
                    let t0 = std::time::Instant::now();
                    for _ in 0..reps {
                        for h in s.chunks_mut(d * d) {
                            unsafe { f(&p, h, &mut o) };
                        }
                    }
                    best[i] = best[i].min(t0.elapsed().as_secs_f64() / (reps * heads * t) as f64 * 1e6);
                }
            }
            let line: Vec<String> = variants.iter().zip(best).map(|((n, _), b)| format!("{n} {b:.2}")).collect();
            eprintln!("T={t}: µs per token and head: {}", line.join(", "));
        }
    }

    /// One decode token over states read from memory (`HEADS` heads of 128 × 128, default
    /// 8192 = 512 MB), the prefetch distance (`PF`, groups) alternated
    /// (`cargo test --release -p pn-cpu --lib cold_state -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn cold_state() {
        let d = 128usize;
        let heads: usize = std::env::var("HEADS").ok().and_then(|v| v.parse().ok()).unwrap_or(8192);
        let pfs: Vec<usize> = std::env::var("PF").unwrap_or_else(|_| "0,1,2,4".into()).split(',').map(|v| v.parse().expect("PF")).collect();
        let x = |n: usize, s: u32| pn_ops::testing::uniform(n, s, 99991);
        let (q, k, v) = (x(d, 1), x(d, 2), x(d, 3));
        let (g, b) = (vec![-0.1f32], vec![0.5f32]);
        let p = HeadIn { q: &q, k: &k, v: &v, g: &g, beta: &b, qk_stride: d, v_stride: d, gb_stride: 1, dk: d, dv: d, t: 1 };
        let n = heads * d * d;
        // HUGE=1: the state in memory advised for transparent huge pages
        let mut map = memmap2::MmapMut::map_anon(n * 4).expect("map");
        if std::env::var("HUGE").is_ok_and(|v| v == "1") {
            map.advise(memmap2::Advice::HugePage).expect("advise");
        }
        let s: &mut [f32] = unsafe { std::slice::from_raw_parts_mut(map.as_mut_ptr() as *mut f32, n) };
        s.copy_from_slice(&x(n, 6));
        let mut o = vec![0f32; d];
        let par = std::env::var("PAR").is_ok_and(|v| v == "1");
        let mut best = vec![f64::MAX; pfs.len()];
        for _ in 0..6 {
            for (i, &pf) in pfs.iter().enumerate() {
                let mut kn = [usize::MAX; pn_ops::quant::N_KNOBS];
                kn[pn_ops::quant::KNOB_DELTA_PREFETCH] = pf;
                pn_ops::quant::set_knobs(&kn);
                let t0 = std::time::Instant::now();
                if par {
                    use rayon::prelude::*;
                    s.par_chunks_mut(d * d).for_each(|h| unsafe { run512::<8>(&p, h, &mut vec![0f32; d]) });
                } else {
                    for h in s.chunks_mut(d * d) {
                        unsafe { run512::<8>(&p, h, &mut o) };
                    }
                }
                best[i] = best[i].min(t0.elapsed().as_secs_f64());
            }
        }
        pn_ops::quant::set_knobs(&[usize::MAX; pn_ops::quant::N_KNOBS]);
        for (pf, b) in pfs.iter().zip(best) {
            let gb = (heads * d * d * 4 * 2) as f64 / b / 1e9;
            eprintln!("PF {pf}: {:.3} µs a head, {gb:.1} GB/s read + written", b / heads as f64 * 1e6);
        }
    }
}
