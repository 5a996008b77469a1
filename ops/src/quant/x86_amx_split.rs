//! The split form of `x86_amx` (Q4_K / Q5_K from `SPLIT_MIN_TOKENS` tokens, IQ4_XS from
//! `IQ4XS_SPLIT_MIN_TOKENS`, Q6_K whenever it takes the tiles): each sub-block's scale
//! folded into the codes in two parts, so a whole super-block sums in full-size (K = 64) tile products without a store per
//! sub-block, and two token tiles can share each `B` tile. Exact: `(C_hi << SHIFT) + C_lo`
//! is the same integer as Σ_s scale_s · Σ products (see [`Split`]).

use super::q8::Q8_K_QS;
use super::x86_pack16::Packed16;
use std::arch::asm;
use std::arch::x86_64::*;

/// A packed K-quant super-block with the scales folded into the codes, in two parts.
/// Q4_K / Q5_K ([`split`]): scale = 2^SHIFT·hi + lo (Q4_K: SHIFT 4, codes < 16; Q5_K:
/// SHIFT 3, codes < 32), so that code·lo and code·hi are unsigned bytes (< 256). Q6_K and
/// IQ4_XS ([`split_signed`]): the product itself, value·scale = 64·hi + lo with lo in
/// 0..63 and hi in −64..64, both signed bytes. A whole super-block (4 tile products of 64
/// elements per part) sums in the accumulators: `isum` = (C_hi << SHIFT) + C_lo, the same
/// exact integer as Σ_s scale_s · Σ products. `w`'s layout (`Packed16`).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct Split {
    pub(super) hi: [__m512i; 64],
    pub(super) lo: [__m512i; 64],
    /// Q4_K / Q5_K: each element's sub-block min (lane r = row r, its byte four times):
    /// the products with the activations are the min correction Σ_s m_s·bsum_s, exactly
    /// what `finish16` sums from the bsums token by token.
    pub(super) mn: [__m512i; 64],
}

/// `pk`'s codes times the two parts of each sub-block's scale (lane r = row r) into `out`,
/// and the mins' bytes.
#[inline(always)]
pub(super) unsafe fn split<const SHIFT: u32>(pk: &Packed16, out: &mut Split) {
    // SAFETY (whole body): AVX-512 BW enabled in every caller. `vpmaddubsw` of the codes
    // with (part, 0) i16 pairs gives the even bytes' products, with (0, part) the odd
    // ones', each < 256 in its word (no saturation).
    unsafe {
        let low = _mm512_set1_epi32((1 << SHIFT) - 1);
        let (ff, bytes4) = (_mm512_set1_epi32(0xff), _mm512_set1_epi32(0x0101_0101));
        for s in 0..8 {
            let m4 = _mm512_mullo_epi32(_mm512_and_si512(pk.corr[s], ff), bytes4);
            out.mn[8 * s..8 * s + 8].fill(m4);
            let sc = pk.sc[s];
            let parts = [_mm512_srli_epi32::<SHIFT>(sc), _mm512_and_si512(sc, low)];
            for (pi, &p) in parts.iter().enumerate() {
                let even = _mm512_or_si512(p, _mm512_slli_epi32::<16>(p));
                let odd = _mm512_slli_epi16::<8>(even);
                let dst = if pi == 0 { &mut out.hi } else { &mut out.lo };
                for g in 0..8 {
                    let w = pk.w[8 * s + g];
                    let e = _mm512_maddubs_epi16(w, even);
                    let o = _mm512_maddubs_epi16(w, odd);
                    dst[8 * s + g] = _mm512_or_si512(e, _mm512_slli_epi16::<8>(o));
                }
            }
        }
    }
}

/// The signed split's shift: value·scale = (hi << 6) + lo.
pub(super) const SIGNED_SHIFT: u32 = 6;

/// `pk`'s values times their sub-block's signed scale (lane r = row r), as the two
/// signed-byte parts of [`Split`]: `NS` sub-blocks of `GS` vectors, the codes' offset
/// `OFF` taken out (value = code − OFF). Q6_K: 16 × 4, codes 0..63, OFF 32, scales
/// −128..127; IQ4_XS: 8 × 8, codes 1..241 (the table's values + 128), OFF 128, scales
/// −32..31. So |value·scale| ≤ 4096: hi in −64..64, lo in 0..63. The sums then need no
/// offset correction (`finish16`'s `Corr::Folded`).
#[inline(always)]
pub(super) unsafe fn split_signed<const NS: usize, const GS: usize, const OFF: i32>(pk: &Packed16, out: &mut Split) {
    // SAFETY (whole body): AVX-512 BW enabled in every caller. `vpmaddubsw` of the
    // unsigned codes with (scale, 0) / (0, scale) signed-byte pairs gives the even / odd
    // bytes' code·scale as words, |·| ≤ 241·32 or 63·128 (no saturation); OFF·scale,
    // |·| ≤ 4096, comes off each.
    unsafe {
        let (six, byte) = (_mm512_set1_epi16(63), _mm512_set1_epi16(0xff));
        for s in 0..NS {
            let sc = _mm512_and_si512(pk.sc[s], _mm512_set1_epi32(0xff));
            let even = _mm512_or_si512(sc, _mm512_slli_epi32::<16>(sc));
            let odd = _mm512_slli_epi16::<8>(even);
            let off = _mm512_mullo_epi32(pk.sc[s], _mm512_set1_epi32(OFF));
            let off = _mm512_or_si512(_mm512_and_si512(off, _mm512_set1_epi32(0xffff)), _mm512_slli_epi32::<16>(off));
            for g in 0..GS {
                let w = pk.w[GS * s + g];
                let xe = _mm512_sub_epi16(_mm512_maddubs_epi16(w, even), off);
                let xo = _mm512_sub_epi16(_mm512_maddubs_epi16(w, odd), off);
                let lo = _mm512_or_si512(_mm512_and_si512(xe, six), _mm512_slli_epi16::<8>(_mm512_and_si512(xo, six)));
                let hi = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srai_epi16::<6>(xe), byte),
                    _mm512_slli_epi16::<8>(_mm512_srai_epi16::<6>(xo)),
                );
                out.lo[GS * s + g] = lo;
                out.hi[GS * s + g] = hi;
            }
        }
    }
}

/// The integer sums of split super-block `sp` for 16 tokens whose Q8_K blocks start at
/// `y + j·astride`: 8 tile products of 64 elements, two stores. `SIGNED`: the parts are
/// signed bytes (Q6_K, IQ4_XS: `tdpbssd`); else unsigned (Q4_K, Q5_K: `tdpbsud`), and 4
/// more products give the min correction, stored in `buf[2]` (row j: token j).
#[inline(always)]
pub(super) unsafe fn isums16_split<const SHIFT: u32, const SIGNED: bool>(sp: &Split, y: *const u8, astride: usize, buf: &mut [[i32; 256]; 6]) -> [__m512i; 16] {
    // SAFETY (whole body): the caller configured 64-byte tiles and guarantees 16 tokens'
    // blocks at y; chunk c's activations are at `y + Q8_K_QS + 64c`, its parts at
    // `hi/lo/mn[16c..]`.
    unsafe {
        let q = y.add(Q8_K_QS);
        let (hi, lo, mn) = (sp.hi.as_ptr(), sp.lo.as_ptr(), sp.mn.as_ptr());
        if SIGNED {
            macro_rules! chunk {
                ($c:expr, $ta:literal, $th:literal, $tl:literal) => {
                    asm!(
                        "tileloadd tmm{ta}, [{a} + {s}*1]",
                        "tileloadd tmm{th}, [{h} + {bs}*1]",
                        "tileloadd tmm{tl}, [{l} + {bs}*1]",
                        "tdpbssd tmm0, tmm{ta}, tmm{th}",
                        "tdpbssd tmm1, tmm{ta}, tmm{tl}",
                        ta = const $ta, th = const $th, tl = const $tl,
                        a = in(reg) q.add(64 * $c), s = in(reg) astride,
                        h = in(reg) hi.add(16 * $c), l = in(reg) lo.add(16 * $c), bs = in(reg) 64usize,
                        options(nostack),
                    )
                };
            }
            asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem));
            chunk!(0, 2, 4, 5);
            chunk!(1, 3, 6, 7);
            chunk!(2, 2, 4, 5);
            chunk!(3, 3, 6, 7);
        } else {
            // C tmm0 / tmm1 / tmm2 (hi, lo, min), A tmm3 / tmm7 by turns, B tmm4..tmm6
            macro_rules! chunk {
                ($c:expr, $ta:literal) => {
                    asm!(
                        "tileloadd tmm{ta}, [{a} + {s}*1]",
                        "tileloadd tmm4, [{h} + {bs}*1]",
                        "tileloadd tmm5, [{l} + {bs}*1]",
                        "tileloadd tmm6, [{m} + {bs}*1]",
                        "tdpbsud tmm0, tmm{ta}, tmm4",
                        "tdpbsud tmm1, tmm{ta}, tmm5",
                        "tdpbsud tmm2, tmm{ta}, tmm6",
                        ta = const $ta,
                        a = in(reg) q.add(64 * $c), s = in(reg) astride,
                        h = in(reg) hi.add(16 * $c), l = in(reg) lo.add(16 * $c), m = in(reg) mn.add(16 * $c),
                        bs = in(reg) 64usize,
                        options(nostack),
                    )
                };
            }
            asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", options(nostack, nomem));
            chunk!(0, 3);
            chunk!(1, 7);
            chunk!(2, 3);
            chunk!(3, 7);
            asm!("tilestored [{c2} + {bs}*1], tmm2", c2 = in(reg) buf[2].as_mut_ptr(), bs = in(reg) 64usize, options(nostack));
        }
        asm!(
            "tilestored [{c0} + {bs}*1], tmm0",
            "tilestored [{c1} + {bs}*1], tmm1",
            c0 = in(reg) buf[0].as_mut_ptr(), c1 = in(reg) buf[1].as_mut_ptr(), bs = in(reg) 64usize,
            options(nostack),
        );
        split_isums::<SHIFT>(&buf[0], &buf[1])
    }
}

/// [`isums16_split`] for two token tiles at once (blocks at `y` and `y2`): each chunk's two
/// `B` tiles loaded once for both, four independent accumulators (the single tile's two
/// chained accumulators wait on each product's latency). Tiles: C tmm0..tmm3 (tile 1 hi,
/// lo, tile 2 hi, lo), A tmm4 / tmm5, B tmm6 / tmm7; all four C stored into `buf[0..4]`.
/// Unsigned (Q4_K, Q5_K): then the min products of both tiles into `buf[4]`, `buf[5]`.
#[inline(always)]
pub(super) unsafe fn products16_split2<const SIGNED: bool>(sp: &Split, y: *const u8, y2: *const u8, astride: usize, buf: &mut [[i32; 256]; 6]) {
    // SAFETY (whole body): the caller configured 64-byte tiles and guarantees 16 tokens'
    // blocks at y and at y2; chunk c's activations are at `+ Q8_K_QS + 64c`.
    unsafe {
        let (q, q2) = (y.add(Q8_K_QS), y2.add(Q8_K_QS));
        let (hi, lo) = (sp.hi.as_ptr(), sp.lo.as_ptr());
        asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
        macro_rules! chunk {
            ($op:literal, $c:expr) => {
                asm!(
                    "tileloadd tmm6, [{h} + {bs}*1]",
                    "tileloadd tmm7, [{l} + {bs}*1]",
                    "tileloadd tmm4, [{a} + {s}*1]",
                    concat!($op, " tmm0, tmm4, tmm6"),
                    concat!($op, " tmm1, tmm4, tmm7"),
                    "tileloadd tmm5, [{a2} + {s}*1]",
                    concat!($op, " tmm2, tmm5, tmm6"),
                    concat!($op, " tmm3, tmm5, tmm7"),
                    a = in(reg) q.add(64 * $c), a2 = in(reg) q2.add(64 * $c), s = in(reg) astride,
                    h = in(reg) hi.add(16 * $c), l = in(reg) lo.add(16 * $c), bs = in(reg) 64usize,
                    options(nostack),
                )
            };
        }
        for c in 0..4 {
            if SIGNED {
                chunk!("tdpbssd", c);
            } else {
                chunk!("tdpbsud", c);
            }
        }
        let (four, mins) = buf.split_at_mut(4);
        super::x86_amx::store4(four.try_into().expect("4 buffers"));
        if !SIGNED {
            let mn = sp.mn.as_ptr();
            asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem));
            for c in 0..4 {
                asm!(
                    "tileloadd tmm6, [{m} + {bs}*1]",
                    "tileloadd tmm4, [{a} + {s}*1]",
                    "tdpbsud tmm0, tmm4, tmm6",
                    "tileloadd tmm5, [{a2} + {s}*1]",
                    "tdpbsud tmm1, tmm5, tmm6",
                    a = in(reg) q.add(64 * c), a2 = in(reg) q2.add(64 * c), s = in(reg) astride,
                    m = in(reg) mn.add(16 * c), bs = in(reg) 64usize,
                    options(nostack),
                );
            }
            asm!(
                "tilestored [{c0} + {bs}*1], tmm0",
                "tilestored [{c1} + {bs}*1], tmm1",
                c0 = in(reg) mins[0].as_mut_ptr(), c1 = in(reg) mins[1].as_mut_ptr(), bs = in(reg) 64usize,
                options(nostack),
            );
        }
    }
}

/// `isum[j]` = (hi row j << SHIFT) + lo row j: a split tile pair's exact integers.
#[inline(always)]
pub(super) unsafe fn split_isums<const SHIFT: u32>(hi: &[i32; 256], lo: &[i32; 256]) -> [__m512i; 16] {
    let mut isum = [_mm512_setzero_si512(); 16];
    for (j, is) in isum.iter_mut().enumerate() {
        // SAFETY: 16 readable i32 at row j of each; AVX-512 enabled in every caller.
        unsafe {
            let h = _mm512_loadu_si512(hi[16 * j..].as_ptr() as *const _);
            let l = _mm512_loadu_si512(lo[16 * j..].as_ptr() as *const _);
            *is = _mm512_add_epi32(_mm512_slli_epi32::<SHIFT>(h), l);
        }
    }
    isum
}
