//! Fused 8-row kernels for few tokens on plain AVX2: the 8-row layout of `x86_pack8`,
//! but each decoded vector of 8 rows × 4 elements goes straight from the raw bytes into
//! every token's `vpmaddubsw`, in registers, instead of being stored into a packed
//! super-block and read back per token. Q4_K for 1–3 tokens (2–3 tokens per expert,
//! where the per-row tile kernels spend much of their time in horizontal sums); Q5_K and
//! Q6_K for 1–2 tokens, IQ4_XS for one (`fused_other_upto`: a decode step, where the
//! packed form's stores and reloads of every decoded vector made these formats twice
//! Q4_K's cost a byte — compute-bound on a 2-core Zen 3, docs/perf.md "Session 25").
//!
//! Exactness: the i16 chains are `x86_pack8`'s (Q4_K 8 groups: 8·2·15·128 = 30720;
//! Q5_K 4 groups: 4·2·31·128 = 31744; Q6_K 2 groups: 2·2·63·128 = 32256; IQ4_XS one
//! group of `|w| · (a with w's sign)`, at most 2·127·127), each then `vpmaddwd` with its
//! sub-block scale: exact i32 sums whatever the order; the scales and the float step are
//! `x86_pack8`'s own (`pack_scales8`, `finish8`), so every lane is bitwise the
//! single-row kernel's.

use super::q8::{Q8_K_BYTES, Q8_K_QS};
use super::x86_out::Out;
use super::x86_pack8::{bcast4, finish8, nib_hi, nib_lo, pack_scales8, q5_elems, q6_elems, store_rows8, Packed8, IQ4XS, Q4K, Q5K, Q6K};
use super::x86_rows8::{Rows8, Src8};
use std::arch::x86_64::*;

/// Most tokens of the fused Q4_K kernel (16 vector registers: more spill).
pub const MAX_FUSED: usize = 3;

/// Most tokens of the fused Q5_K / Q6_K / IQ4_XS kernels (a benchmark's knob
/// `KNOB_FUSED8_OTHER_UPTO` overrides; 0 = never): Q5_K / Q6_K 2, IQ4_XS 1 (at 2 tokens
/// its per-token sign steps made it slower than the packed form).
pub const fn fused_other_upto(kind: u8) -> usize {
    if kind == IQ4XS {
        1
    } else {
        2
    }
}

/// Prefetches `len` bytes at `at + off` (a prefetch never faults).
#[inline(always)]
unsafe fn prefetch(at: *const u8, off: usize, len: usize) {
    let mut o = off;
    while o < off + len {
        // SAFETY: a prefetch is a hint; it never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(o) as *const i8) };
        o += 64;
    }
}

/// The integer sums of the super-block of format `F` of the 8 rows at `src` with `M`
/// tokens' Q8_K blocks at `y + j·astride`: `isum[j]` lane r = Σ_s scale_s · Σ_sub-block
/// products of row r. `pf`: (pointer, bytes per step) prefetched at each of the 4 steps.
#[inline(always)]
unsafe fn ints8<const F: u8, const M: usize, S: Src8>(
    src: S,
    pk: &Packed8,
    y: *const u8,
    astride: usize,
    pf: (*const u8, usize),
) -> [__m256i; M] {
    // SAFETY: the caller's contract (ints_q4's).
    unsafe {
        match F {
            Q6K => ints_q6::<M, S>(src, pk, y, astride, pf),
            Q5K => ints_q5::<M, S>(src, pk, y, astride, pf),
            IQ4XS => ints_iq4xs::<M, S>(src, pk, y, astride, pf),
            _ => ints_q4::<M, S>(src, pk, y, astride, pf),
        }
    }
}

/// Activation bytes of element vector `v` (elements 4v..4v+4) of token j's Q8_K block
/// at `y + j·astride`, broadcast.
#[inline(always)]
unsafe fn act(y: *const u8, astride: usize, j: usize, v: usize) -> __m256i {
    // SAFETY: the caller guarantees token j's whole Q8_K block at y + j·astride.
    unsafe { bcast4(y.add(j * astride + Q8_K_QS + 4 * v)) }
}

/// Q6_K: per ql half, element vector k of group g is vector 8·(4·half + k) + g, of
/// 16-element sub-block 2·(4·half + k) + g/4; chains of 2 groups.
#[inline(always)]
unsafe fn ints_q6<const M: usize, S: Src8>(src: S, pk: &Packed8, y: *const u8, astride: usize, pf: (*const u8, usize)) -> [__m256i; M] {
    let z = _mm256_setzero_si256();
    let mut isum = [z; M];
    // SAFETY (whole body): as ints_q4 (Q6_K: ql 128 B @0, qh 64 B @128).
    unsafe {
        for half in 0..2 {
            prefetch(pf.0, 2 * half * pf.1, 2 * pf.1);
            let q = [src.raw::<Q6K>(64 * half), src.raw::<Q6K>(64 * half + 32)];
            let h = src.raw::<Q6K>(128 + 32 * half);
            // a pair of groups at a time (6 raw vectors live: more spill), its 4
            // element vectors each
            for g in (0..8).step_by(2) {
                for k in 0..4 {
                    let cb = 4 * half + k;
                    let (w0, w1) = (q6_elems(&q, &h, k, g), q6_elems(&q, &h, k, g + 1));
                    for (j, is) in isum.iter_mut().enumerate() {
                        let p = _mm256_add_epi16(
                            _mm256_maddubs_epi16(w0, act(y, astride, j, 8 * cb + g)),
                            _mm256_maddubs_epi16(w1, act(y, astride, j, 8 * cb + g + 1)),
                        );
                        *is = _mm256_add_epi32(*is, _mm256_madd_epi16(p, pk.sc[2 * cb + g / 4]));
                    }
                }
            }
        }
    }
    isum
}

/// Q5_K: qs chunk c holds 32-element sub-blocks 2c (low nibbles) and 2c + 1 (high),
/// element vectors 16c + g and 16c + 8 + g; chains of 4 groups.
#[inline(always)]
unsafe fn ints_q5<const M: usize, S: Src8>(src: S, pk: &Packed8, y: *const u8, astride: usize, pf: (*const u8, usize)) -> [__m256i; M] {
    let z = _mm256_setzero_si256();
    let mut isum = [z; M];
    // SAFETY (whole body): as ints_q4 (Q5_K: qh 32 B @16, qs 128 B @48).
    unsafe {
        let qh = src.raw::<Q5K>(16);
        for c in 0..4 {
            prefetch(pf.0, c * pf.1, pf.1);
            let q = src.raw::<Q5K>(48 + 32 * c);
            for g0 in (0..8).step_by(4) {
                let (mut al, mut ah) = ([z; M], [z; M]);
                for g in g0..g0 + 4 {
                    let (l, h) = q5_elems(&q, &qh, c, g);
                    for j in 0..M {
                        al[j] = _mm256_add_epi16(al[j], _mm256_maddubs_epi16(l, act(y, astride, j, 16 * c + g)));
                        ah[j] = _mm256_add_epi16(ah[j], _mm256_maddubs_epi16(h, act(y, astride, j, 16 * c + 8 + g)));
                    }
                }
                for (j, is) in isum.iter_mut().enumerate() {
                    *is = _mm256_add_epi32(*is, _mm256_madd_epi16(al[j], pk.sc[2 * c]));
                    *is = _mm256_add_epi32(*is, _mm256_madd_epi16(ah[j], pk.sc[2 * c + 1]));
                }
            }
        }
    }
    isum
}

/// IQ4_XS: qs chunk c holds sub-blocks 2c (dwords 0..4) and 2c + 1: the low nibbles of
/// dword g are element vector 8·sb + g % 4, the high ones 8·sb + 4 + g % 4 (sb = 2c +
/// g/4), through the value table; signed, so `|w| · (a with w's sign)` a group.
#[inline(always)]
unsafe fn ints_iq4xs<const M: usize, S: Src8>(src: S, pk: &Packed8, y: *const u8, astride: usize, pf: (*const u8, usize)) -> [__m256i; M] {
    let z = _mm256_setzero_si256();
    let mut isum = [z; M];
    // SAFETY (whole body): as ints_q4 (IQ4_XS: qs 128 B @8).
    unsafe {
        let t = super::x86_tile::table16(&super::iq4::KVALUES_IQ4NL);
        for c in 0..4 {
            prefetch(pf.0, c * pf.1, pf.1);
            let q = src.raw::<IQ4XS>(8 + 32 * c);
            for g in 0..8 {
                let sb = 2 * c + g / 4;
                for (w, v) in [(nib_lo(q[g]), 8 * sb + g % 4), (nib_hi(q[g]), 8 * sb + 4 + g % 4)] {
                    let w = _mm256_shuffle_epi8(t, w);
                    let aw = _mm256_sign_epi8(w, w);
                    for (j, is) in isum.iter_mut().enumerate() {
                        let p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(act(y, astride, j, v), w));
                        *is = _mm256_add_epi32(*is, _mm256_madd_epi16(p, pk.sc[sb]));
                    }
                }
            }
        }
    }
    isum
}

/// Q4_K: nibble h of qs chunk c is sub-block 2c + h (element vectors 8·(2c + h) + g); its
/// 8 groups summed in i16.
#[inline(always)]
unsafe fn ints_q4<const M: usize, S: Src8>(
    src: S,
    pk: &Packed8,
    y: *const u8,
    astride: usize,
    pf: (*const u8, usize),
) -> [__m256i; M] {
    let z = _mm256_setzero_si256();
    let mut isum = [z; M];
    // SAFETY (whole body): the caller guarantees 8 rows of whole Q4_K blocks at src (qs
    // 128 B @16) and every token's whole Q8_K block at y + j·astride; AVX2 enabled in
    // every caller.
    unsafe {
        // nibble h of qs chunk c is sub-block 2c + h: its 8 groups summed in i16
        for c in 0..4 {
            prefetch(pf.0, c * pf.1, pf.1);
            let q = src.raw::<Q4K>(16 + 32 * c);
            for hi in 0..2 {
                let s = 2 * c + hi;
                let mut acc = [z; M];
                for (g, &qg) in q.iter().enumerate() {
                    let v = if hi == 0 { nib_lo(qg) } else { nib_hi(qg) };
                    for (j, a) in acc.iter_mut().enumerate() {
                        *a = _mm256_add_epi16(*a, _mm256_maddubs_epi16(v, act(y, astride, j, 8 * s + g)));
                    }
                }
                for (is, a) in isum.iter_mut().zip(acc) {
                    *is = _mm256_add_epi32(*is, _mm256_madd_epi16(a, pk.sc[s]));
                }
            }
        }
    }
    isum
}

/// Q4_K rows `0..nr` (1 ≤ nr ≤ 8) of `w` (stride `ws`, `nb` super-blocks each) against `m`
/// (1..=`MAX_FUSED`) tokens: `out[r·ostride + j]`; `next` (pointer, bytes): the weights
/// to prefetch meanwhile, spread over the steps. `pk`: scratch for the scales.
///
/// # Safety
/// AVX2 + FMA + F16C available; `nr` rows of `nb` blocks at `w`, `m` tokens of `nb` Q8_K
/// blocks at `a + j·astride`, `out` holds `(nr−1)·ostride + m` floats.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn group8_fused(
    nb: usize,
    nr: usize,
    w: *const u8,
    ws: usize,
    a: *const u8,
    astride: usize,
    m: usize,
    out: &mut [f32],
    ostride: usize,
    pk: &mut Packed8,
    next: Option<(*const u8, usize)>,
) {
    // SAFETY: the caller's contract.
    unsafe { run_src::<Q4K, _>(nb, nr, Rows8 { xb: w, ws, nr }, a, astride, m, Out::rows(out, ostride), pk, next) }
}

/// `group8_fused` for format `F` (Q4_K: 1..=`MAX_FUSED` tokens; Q5_K, Q6_K, IQ4_XS:
/// 1..=2) with the rows' blocks from `src` (block 0: plain rows or the 8-row layout of
/// `x86_rows8`).
///
/// # Safety
/// As `group8_fused`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) unsafe fn run_src<const F: u8, S: Src8>(
    nb: usize,
    nr: usize,
    src: S,
    a: *const u8,
    astride: usize,
    m: usize,
    out: Out,
    pk: &mut Packed8,
    next: Option<(*const u8, usize)>,
) {
    debug_assert!((1..=if F == Q4K { MAX_FUSED } else { 2 }).contains(&m));
    // SAFETY (each arm): the caller's contract.
    unsafe {
        match m {
            1 => run::<F, 1, S>(nb, nr, src, a, astride, out, pk, next),
            2 => run::<F, 2, S>(nb, nr, src, a, astride, out, pk, next),
            _ if F == Q4K => run::<Q4K, 3, S>(nb, nr, src, a, astride, out, pk, next),
            _ => unreachable!("the fused Q5_K / Q6_K / IQ4_XS kernels take at most 2 tokens"),
        }
    }
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn run<const F: u8, const M: usize, S: Src8>(
    nb: usize,
    nr: usize,
    src: S,
    a: *const u8,
    astride: usize,
    out: Out,
    pk: &mut Packed8,
    next: Option<(*const u8, usize)>,
) {
    let (pf_at, pf_len) = next.unwrap_or((core::ptr::null(), 0));
    let steps = 4;
    let per_step = pf_len.div_ceil(nb * steps).next_multiple_of(64);
    let mut sumf = [_mm256_setzero_ps(); M];
    for i in 0..nb {
        // SAFETY: the caller guarantees 8 rows of nb blocks at w and every token's nb
        // blocks; the prefetch window ends within a few lines of `next`'s (a hint never
        // faults).
        unsafe {
            let b = src.block::<F>(i);
            pack_scales8::<F, S>(b, pk);
            let pf = (pf_at.wrapping_add(i * steps * per_step), per_step);
            let isum = ints8::<F, M, S>(b, pk, a.add(i * Q8_K_BYTES), astride, pf);
            finish8::<F, M>(pk, i, a, astride, &isum, &mut sumf);
        }
    }
    for (j, v) in sumf.iter().enumerate() {
        // SAFETY: AVX2 enabled in every caller.
        unsafe { store_rows8(*v, nr, out, j) };
    }
}
