//! Fused 16-row kernels for few tokens (AVX-512 VNNI; Q4_K, Q5_K, Q6_K, and IQ4_XS from
//! the `rows16` layout only): the 16-row layout of `x86_pack16`, but each decoded vector
//! of 16 rows × 4 elements goes straight from the raw-byte transpose (or the `rows16`
//! copy, `x86_rows16`) into the `vpdpbusd` of every token, in registers, instead
//! of being stored into a packed super-block (5.7 KB written, then read back per token).
//! With 1–4 tokens per expert (256 experts, top-8, a 128-token batch; 16 decode slots of
//! 64 experts) the stores of the packed form cost about as much as the products.
//!
//! From the `rows16` layout on a CPU with GFNI (`Src::GFNI`) the bit fields move with
//! one `vgf2p8affineqb` each (`x86_pack16::gf`): a Q6_K vector in 2–3 operations instead
//! of 3–4, a Q5_K one in 2–3 instead of 5–6, Q4_K's high nibbles in one instead of two;
//! one thread, 1–4 tokens: Q5_K 15–23%, Q6_K 9–17% faster (docs/perf.md "Session 33").
//!
//! Exactness: the integer sums of each sub-block are exact whatever their order, and
//! the scales, corrections and the float step are `x86_pack16`'s own (`pack_scales16`,
//! `finish16`), so every lane is bitwise the single-row kernel's.

use super::q8::{Q8_K_BYTES, Q8_K_QS};
use super::x86_pack16::{bcast4, finish16, gf, high_nibbles, nibble_under, pack_scales16, store_tile, Corr, Out, Packed16, Rows, Src, IQ4NL_U8, IQ4XS, Q4K, Q5K, Q5K_BIT4, Q6K, Q6K_BITS45};
use std::arch::x86_64::*;

/// Most tokens of the fused kernels (more: the accumulators spill, and measured direct
/// 6-token kernels ran at a third of `x86_pack16`'s speed).
pub const MAX_FUSED: usize = 4;

/// Step `k`'s share of the prefetch window `pf` (pointer, bytes per step) into L2.
#[inline(always)]
fn prefetch_step(pf: (*const u8, usize), k: usize) {
    super::x86::prefetch_l2_range(pf.0, k * pf.1, (k + 1) * pf.1);
}

/// The integer sums of super-block `src` (16 rows) with `M` tokens' Q8_K
/// blocks at `y + j·astride` (their `qs`): `isum[j]` lane r = Σ_s scale_s · Σ_sub-block
/// products of row r. `pf`: (pointer, bytes per step) prefetched at each of the 4 (Q4_K /
/// Q5_K) or 8 (Q6_K) steps.
#[inline(always)]
unsafe fn ints16<const F: u8, const M: usize, S: Src>(
    src: S,
    pk: &Packed16,
    y: *const u8,
    astride: usize,
    pf: (*const u8, usize),
) -> [__m512i; M] {
    let m4 = _mm512_set1_epi8(0x0f);
    let z = _mm512_setzero_si512();
    let mut isum = [z; M];
    // activation bytes of element vector e (elements 4e..4e + 4) of token j
    macro_rules! act {
        ($j:expr, $e:expr) => {
            bcast4(y.add($j * astride + Q8_K_QS + 4 * ($e)))
        };
    }
    // SAFETY (whole body): the caller guarantees 16 rows of whole blocks at src (Q4_K qs
    // 128 B @16; Q5_K qh 32 B @16, qs @48; Q6_K ql 128 B @0, qh 64 B @128) and every
    // token's whole Q8_K block at y + j·astride; AVX-512 enabled in every caller.
    unsafe {
        if F == Q6K {
            let m30 = _mm512_set1_epi8(0x30);
            for half in 0..2 {
                let q = [src.raw::<F>(64 * half), src.raw::<F>(64 * half + 32)];
                let h = src.raw::<F>(128 + 32 * half);
                for k in 0..4 {
                    prefetch_step(pf, 4 * half + k);
                    // element vectors 8·cb + g; sub-block 2·cb + g / 4
                    let cb = 4 * half + k;
                    let mut acc = [[z; M]; 2];
                    for g in 0..8 {
                        // the code's two high bits (field k of the qh byte) moved to bits
                        // 4..6, then one select: low nibble from the ql byte, bits 4..8
                        // from them (three operations a vector, not six)
                        let qv = q[k % 2][g];
                        let l = if k < 2 { qv } else { _mm512_srli_epi16::<4>(qv) };
                        let hs = if S::GFNI {
                            // one bit-matrix multiply: field k to bits 4..6, the rest 0
                            gf(h[g], Q6K_BITS45[k])
                        } else {
                            let hs = match k {
                                0 => _mm512_slli_epi16::<4>(h[g]),
                                1 => _mm512_slli_epi16::<2>(h[g]),
                                2 => h[g],
                                _ => _mm512_srli_epi16::<2>(h[g]),
                            };
                            _mm512_and_si512(hs, m30)
                        };
                        // (m4 & l) | (!m4 & hs)
                        let v = _mm512_ternarylogic_epi32::<0xCA>(m4, l, hs);
                        for (j, a) in acc[g / 4].iter_mut().enumerate() {
                            *a = _mm512_dpbusd_epi32(*a, v, act!(j, 8 * cb + g));
                        }
                    }
                    for (j, is) in isum.iter_mut().enumerate() {
                        *is = _mm512_add_epi32(*is, _mm512_mullo_epi32(acc[0][j], pk.sc[2 * cb]));
                        *is = _mm512_add_epi32(*is, _mm512_mullo_epi32(acc[1][j], pk.sc[2 * cb + 1]));
                    }
                }
            }
        } else if F == IQ4XS {
            // 32 raw bytes p = sub-blocks 2p (dwords 0..4) and 2p + 1 (4..8), low nibbles
            // elements 0..16 of each, high 16..32; codes through the table (+128)
            let t = _mm512_broadcast_i32x4(_mm_loadu_si128(IQ4NL_U8.as_ptr() as *const __m128i));
            for p in 0..4 {
                prefetch_step(pf, p);
                let v = src.raw::<F>(8 + 32 * p);
                // low and high nibbles in separate chains (half the `vpdpbusd` depth)
                let (mut a0, mut a1, mut b0, mut b1) = ([z; M], [z; M], [z; M], [z; M]);
                for g in 0..4 {
                    // (a macro: a closure would not inherit the target features)
                    macro_rules! code {
                        ($x:expr) => {
                            _mm512_shuffle_epi8(t, $x)
                        };
                    }
                    let x0 = code!(_mm512_and_si512(v[g], m4));
                    let x1 = code!(high_nibbles(v[g], S::GFNI));
                    let x2 = code!(_mm512_and_si512(v[4 + g], m4));
                    let x3 = code!(high_nibbles(v[4 + g], S::GFNI));
                    for j in 0..M {
                        a0[j] = _mm512_dpbusd_epi32(a0[j], x0, act!(j, 16 * p + g));
                        b0[j] = _mm512_dpbusd_epi32(b0[j], x1, act!(j, 16 * p + 4 + g));
                        a1[j] = _mm512_dpbusd_epi32(a1[j], x2, act!(j, 16 * p + 8 + g));
                        b1[j] = _mm512_dpbusd_epi32(b1[j], x3, act!(j, 16 * p + 12 + g));
                    }
                }
                for (j, is) in isum.iter_mut().enumerate() {
                    *is = _mm512_add_epi32(*is, _mm512_mullo_epi32(_mm512_add_epi32(a0[j], b0[j]), pk.sc[2 * p]));
                    *is = _mm512_add_epi32(*is, _mm512_mullo_epi32(_mm512_add_epi32(a1[j], b1[j]), pk.sc[2 * p + 1]));
                }
            }
        } else {
            // nibble h of qs chunk c is sub-block 2c + h; Q5_K's fifth bit = bit 2c + h of qh
            let qs_off = if F == Q5K { 48 } else { 16 };
            let qh = if F == Q5K { src.raw::<F>(16) } else { [z; 8] };
            let one = _mm512_set1_epi8(1);
            for c in 0..4 {
                prefetch_step(pf, c);
                let q = src.raw::<F>(qs_off + 32 * c);
                // two chains per accumulator (even / odd groups): half the dependency
                // depth of the `vpdpbusd`s; exact integer sums, any order
                let (mut al, mut ah) = ([z; M], [z; M]);
                let (mut bl, mut bh) = ([z; M], [z; M]);
                for g in 0..8 {
                    let (l, h) = if F == Q5K && S::GFNI {
                        // the fifth bits (2c, 2c + 1 of the qh byte) straight to bit 4,
                        // one select each with the low / high nibble
                        (nibble_under(q[g], qh[g], Q5K_BIT4[2 * c]), nibble_under(_mm512_srli_epi16::<4>(q[g]), qh[g], Q5K_BIT4[2 * c + 1]))
                    } else {
                        let (mut l, mut h) = (_mm512_and_si512(q[g], m4), high_nibbles(q[g], S::GFNI));
                        if F == Q5K {
                            let bl = _mm512_and_si512(_mm512_srl_epi16(qh[g], _mm_cvtsi32_si128(2 * c as i32)), one);
                            let bh = _mm512_and_si512(_mm512_srl_epi16(qh[g], _mm_cvtsi32_si128(2 * c as i32 + 1)), one);
                            l = _mm512_or_si512(l, _mm512_slli_epi16::<4>(bl));
                            h = _mm512_or_si512(h, _mm512_slli_epi16::<4>(bh));
                        }
                        (l, h)
                    };
                    for j in 0..M {
                        if g % 2 == 0 {
                            al[j] = _mm512_dpbusd_epi32(al[j], l, act!(j, 8 * (2 * c) + g));
                            ah[j] = _mm512_dpbusd_epi32(ah[j], h, act!(j, 8 * (2 * c + 1) + g));
                        } else {
                            bl[j] = _mm512_dpbusd_epi32(bl[j], l, act!(j, 8 * (2 * c) + g));
                            bh[j] = _mm512_dpbusd_epi32(bh[j], h, act!(j, 8 * (2 * c + 1) + g));
                        }
                    }
                }
                if F == Q4K {
                    // each chain's 16 products fit i16 (|·| ≤ 16·15·128): `vpdpwssd`
                    // against (sc, 0) adds chain·sc exactly (`x86_pack16::dot16`)
                    for (j, is) in isum.iter_mut().enumerate() {
                        *is = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(*is, al[j], pk.sc[2 * c]), bl[j], pk.sc[2 * c]);
                        *is = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(*is, ah[j], pk.sc[2 * c + 1]), bh[j], pk.sc[2 * c + 1]);
                    }
                    continue;
                }
                for (j, is) in isum.iter_mut().enumerate() {
                    *is = _mm512_add_epi32(*is, _mm512_mullo_epi32(_mm512_add_epi32(al[j], bl[j]), pk.sc[2 * c]));
                    *is = _mm512_add_epi32(*is, _mm512_mullo_epi32(_mm512_add_epi32(ah[j], bh[j]), pk.sc[2 * c + 1]));
                }
            }
        }
    }
    isum
}

/// Rows `0..nr` (1 ≤ nr ≤ 16) of `w` (stride `ws`, `nb` super-blocks each) against `m`
/// (1..=`MAX_FUSED`) tokens: `out[r·ostride + j]`; `next` (pointer, bytes): the weights
/// to prefetch meanwhile, spread over the steps. `pk`: scratch for the scales.
///
/// # Safety
/// AVX-512 F/BW/VL + VNNI and AVX2 available; `nr` rows of `nb` blocks at `w`, `m`
/// tokens of `nb` Q8_K blocks at `a + j·astride`, `out` holds `(nr−1)·ostride + m` floats.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn group16_fused(
    kind: u8,
    nb: usize,
    nr: usize,
    w: *const u8,
    ws: usize,
    a: *const u8,
    astride: usize,
    m: usize,
    out: &mut [f32],
    ostride: usize,
    pk: &mut Packed16,
    next: Option<(*const u8, usize)>,
) {
    let o = Out::rows(out, ostride);
    macro_rules! go {
        ($f:expr, $mm:literal) => {
            // SAFETY: the caller's contract.
            unsafe { run::<{ $f }, $mm, Rows>(nb, nr, Rows { xb: w, ws, nr }, a, astride, o, pk, next, None) }
        };
    }
    macro_rules! by_m {
        ($f:expr) => {
            match m {
                1 => go!($f, 1),
                2 => go!($f, 2),
                3 => go!($f, 3),
                _ => go!($f, 4),
            }
        };
    }
    debug_assert!((1..=MAX_FUSED).contains(&m));
    match kind {
        Q6K => by_m!(Q6K),
        Q5K => by_m!(Q5K),
        _ => by_m!(Q4K),
    }
}

/// `group16_fused` for format `F` and `M` tokens, the rows' blocks from `src` (block 0;
/// plain rows or the `rows16` layout).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) unsafe fn run<const F: u8, const M: usize, S: Src>(
    nb: usize,
    nr: usize,
    src: S,
    a: *const u8,
    astride: usize,
    o: Out,
    pk: &mut Packed16,
    next: Option<(*const u8, usize)>,
    pairs: Option<(*const u8, usize)>,
) {
    let (pf_at, pf_len) = next.unwrap_or((core::ptr::null(), 0));
    let corr = Corr::of::<F>(pairs);
    let steps = if F == Q6K { 8 } else { 4 };
    let per_step = pf_len.div_ceil(nb * steps).next_multiple_of(64);
    let mut sumf = [_mm512_setzero_ps(); M];
    for i in 0..nb {
        // SAFETY: the caller guarantees 16 rows of nb blocks at w and every token's nb
        // blocks; the prefetch window stays inside `next` (a hint past it never faults).
        unsafe {
            let s = src.block::<F>(i);
            pack_scales16::<F, S>(s, pk);
            let pf = (pf_at.wrapping_add(i * steps * per_step), per_step);
            let isum = ints16::<F, M, S>(s, pk, a.add(i * Q8_K_BYTES), astride, pf);
            finish16::<F, M>(pk, i, a, astride, &isum, corr, &mut sumf);
        }
    }
    // SAFETY: AVX-512 F/VL enabled in every caller; `o` holds the nr rows × M tokens.
    unsafe { store_tile(&sumf, nr, o, 0) };
}
