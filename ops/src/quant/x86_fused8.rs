//! Fused 8-row Q4_K kernel for few tokens on plain AVX2: the 8-row layout of
//! `x86_pack8`, but each decoded vector of 8 rows × 4 elements goes straight from the
//! raw-byte transpose into every token's `vpmaddubsw`, in registers, instead of being
//! stored into a packed super-block and read back per token. For 2–3 tokens per expert,
//! where the per-row tile kernels spend much of their time in horizontal sums. (Q5_K
//! and Q6_K in this form measured no faster than their tile kernels on AVX2: Q6_K's
//! two-group i16 chains double the `vpmaddwd`, and 16 registers spill.)
//!
//! Exactness: `x86_pack8`'s i16 chain of 8 groups (8·2·15·128 = 30720: no overflow for
//! any code and any Q8_K byte, whatever the order), then `vpmaddwd` with the sub-block
//! scale: exact i32 sums; the scales and the float step are `x86_pack8`'s own
//! (`pack_scales8`, `finish8`), so every lane is bitwise the single-row kernel's.

use super::q8::{Q8_K_BYTES, Q8_K_QS};
use super::x86_pack8::{bcast4, finish8, pack_scales8, Packed8, Q4K};
use super::x86_rows8::{Rows8, Src8};
use std::arch::x86_64::*;

/// Most tokens of the fused kernels (16 vector registers: more spill).
pub const MAX_FUSED: usize = 3;

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

/// The integer sums of the Q4_K super-block of the 8 rows at `src` with `M` tokens'
/// Q8_K blocks at `y + j·astride`: `isum[j]` lane r = Σ_s scale_s · Σ_sub-block products
/// of row r. `pf`: (pointer, bytes per step) prefetched at each of the 4 steps.
#[inline(always)]
unsafe fn ints8<const M: usize, S: Src8>(
    src: S,
    pk: &Packed8,
    y: *const u8,
    astride: usize,
    pf: (*const u8, usize),
) -> [__m256i; M] {
    let m4 = _mm256_set1_epi8(0x0f);
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
                    let v = if hi == 0 { _mm256_and_si256(qg, m4) } else { _mm256_and_si256(_mm256_srli_epi16::<4>(qg), m4) };
                    for (j, a) in acc.iter_mut().enumerate() {
                        // activation bytes of element vector 8s + g of token j
                        let b = bcast4(y.add(j * astride + Q8_K_QS + 4 * (8 * s + g)));
                        *a = _mm256_add_epi16(*a, _mm256_maddubs_epi16(v, b));
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
    unsafe { run_src(nb, nr, Rows8 { xb: w, ws, nr }, a, astride, m, out, ostride, pk, next) }
}

/// `group8_fused` with the rows' blocks from `src` (block 0: plain rows or the 8-row
/// layout of `x86_rows8`).
///
/// # Safety
/// As `group8_fused`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) unsafe fn run_src<S: Src8>(
    nb: usize,
    nr: usize,
    src: S,
    a: *const u8,
    astride: usize,
    m: usize,
    out: &mut [f32],
    ostride: usize,
    pk: &mut Packed8,
    next: Option<(*const u8, usize)>,
) {
    debug_assert!((1..=MAX_FUSED).contains(&m));
    // SAFETY (each arm): the caller's contract.
    unsafe {
        match m {
            1 => run::<1, S>(nb, nr, src, a, astride, out, ostride, pk, next),
            2 => run::<2, S>(nb, nr, src, a, astride, out, ostride, pk, next),
            _ => run::<3, S>(nb, nr, src, a, astride, out, ostride, pk, next),
        }
    }
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn run<const M: usize, S: Src8>(
    nb: usize,
    nr: usize,
    src: S,
    a: *const u8,
    astride: usize,
    out: &mut [f32],
    ostride: usize,
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
            let b = src.block::<Q4K>(i);
            pack_scales8::<Q4K, S>(b, pk);
            let pf = (pf_at.wrapping_add(i * steps * per_step), per_step);
            let isum = ints8::<M, S>(b, pk, a.add(i * Q8_K_BYTES), astride, pf);
            finish8::<Q4K, M>(pk, i, a, astride, &isum, &mut sumf);
        }
    }
    for (j, v) in sumf.iter().enumerate() {
        let mut l = [0f32; 8];
        // SAFETY: 8 writable floats.
        unsafe { _mm256_storeu_ps(l.as_mut_ptr(), *v) };
        for (r, &x) in l.iter().enumerate().take(nr) {
            out[r * ostride + j] = x;
        }
    }
}
