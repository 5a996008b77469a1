//! 16-row packed kernels for Q4_K and Q6_K (AVX-512 VNNI, prefill): two 8-row groups in
//! `x86_pack`'s layout side by side in 512-bit vectors, so each `vpdpbusd` (one broadcast of 4
//! activation bytes) gives 64 products of 16 rows and the scale, correction and float
//! steps run once per 16 rows: about half the instructions per product of the 8-row
//! kernel. Every lane does exactly what the 8-row kernel's lane does (exact integer
//! sums, the same unfused float step), so results are bitwise equal to it and to the
//! single-row kernel.

use super::q8::{Q8_K_BSUMS, Q8_K_BYTES, Q8_K_QS};
use super::x86_tile::{ld, MAX_TILE};
pub(crate) use super::x86_out::{store_rows, store_tile, Out};
pub(super) use super::x86_rows16::{Rows, Src};
use std::arch::x86_64::*;

/// One super-block of 16 rows, decoded (rows 0..8 in the low 256 bits of each vector).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Packed16 {
    pub(super) w: [__m512i; 64],
    pub(super) sc: [__m512i; 16],
    pub(super) corr: [__m512i; 8],
    /// Q4_K / Q5_K / IQ4_XS: the correction multipliers of sub-blocks 2q and 2q + 1 as
    /// one i16 pair (lane r = row r), against a token's `x86_rows16::BsumPairs`.
    pub(super) corr2: [__m512i; 4],
    pub(super) d: __m512,
    pub(super) dm: __m512,
}

#[inline(always)]
pub(super) unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

#[inline(always)]
pub(super) unsafe fn bcast4(p: *const u8) -> __m512i {
    // SAFETY: the caller guarantees 4 readable bytes at `p`.
    _mm512_set1_epi32(unsafe { (p as *const i32).read_unaligned() })
}

/// The formats of the packed kernel (`const F`): the K-quant's bit width.
pub const Q4K: u8 = 4;
pub const Q5K: u8 = 5;
pub const Q6K: u8 = 6;
/// IQ4_XS (4-bit codes through the non-linear table, 32-element sub-blocks).
pub const IQ4XS: u8 = 44;

/// The `vgf2p8affineqb` matrix that moves bits `from..from + n` of every byte to
/// `to..to + n` and clears the others: output bit d is the parity of the input byte and
/// matrix byte 7 − d, so byte 7 − (to + i) holds the single bit `from + i`.
pub(super) const fn gf_move(from: u32, to: u32, n: u32) -> i64 {
    let mut m = 0u64;
    let mut i = 0;
    while i < n {
        m |= (1u64 << (from + i)) << (8 * (7 - (to + i)));
        i += 1;
    }
    m as i64
}

/// Bits moved inside every byte of `v` by matrix `m` ([`gf_move`]): one GFNI operation
/// where shifts and masks take two or three. Callers run with GFNI enabled
/// (`Src::GFNI`).
#[inline(always)]
pub(super) unsafe fn gf(v: __m512i, m: i64) -> __m512i {
    // SAFETY: GFNI and AVX-512 enabled in every caller that reaches this (`Src::GFNI`).
    unsafe { _mm512_gf2p8affine_epi64_epi8::<0>(v, _mm512_set1_epi64(m)) }
}

/// A Q5_K / Q6_K code from the GFNI decode: the low nibble of every byte of `nib` under
/// the bits that matrix `m` moves out of the qh bytes `qh` to bits 4.. (one select).
#[inline(always)]
pub(super) unsafe fn nibble_under(nib: __m512i, qh: __m512i, m: i64) -> __m512i {
    // SAFETY: GFNI and AVX-512 enabled in every caller that reaches this (`Src::GFNI`).
    unsafe { _mm512_ternarylogic_epi32::<0xCA>(_mm512_set1_epi8(0x0f), nib, gf(qh, m)) }
}

/// Per qh bit b, the matrix moving it to bit 4 (Q5_K's fifth bit of sub-block b).
pub(super) const Q5K_BIT4: [i64; 8] = {
    let mut t = [0i64; 8];
    let mut b = 0;
    while b < 8 {
        t[b] = gf_move(b as u32, 4, 1);
        b += 1;
    }
    t
};

/// Per field k of a Q6_K qh byte (bits 2k, 2k + 1), the matrix moving it to bits 4, 5.
pub(super) const Q6K_BITS45: [i64; 4] = [gf_move(0, 4, 2), gf_move(2, 4, 2), gf_move(4, 4, 2), gf_move(6, 4, 2)];

/// The high nibble of every byte as a value 0..15 (`gf` where `gfni`, a constant of the
/// caller's `Src::GFNI`; else shift and mask).
#[inline(always)]
pub(super) unsafe fn high_nibbles(v: __m512i, gfni: bool) -> __m512i {
    // SAFETY: AVX-512 (and GFNI where `gfni`) enabled in every caller.
    unsafe {
        if gfni {
            gf(v, gf_move(4, 0, 4))
        } else {
            _mm512_and_si512(_mm512_srli_epi16::<4>(v), _mm512_set1_epi8(0x0f))
        }
    }
}

/// IQ4_XS's table plus 128, bytes read as unsigned (the kernel removes the offset with
/// the bsums).
pub(super) const IQ4NL_U8: [i8; 16] = {
    let mut t = [0i8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (super::iq4::KVALUES_IQ4NL[i] as i16 + 128) as u8 as i8;
        i += 1;
    }
    t
};

/// 32 raw bytes at offset `off` of the 16 rows' blocks at `xb` (stride `ws`; rows past
/// `nr` repeat row `nr − 1`), transposed: lane r of `out[g]` = dword g of row r's bytes
/// (rows 0..8 in the low 256 bits, 8..16 in the high). The nibbles and bit planes keep
/// their places inside each dword, so decoding after the transpose (masks, shifts, the
/// IQ4 table) gives the same vectors as decoding each row first: one transpose per 32
/// raw bytes instead of one per 32 decoded elements (Q4_K: 4 per super-block, not 8).
#[inline(always)]
pub(super) unsafe fn raw16(xb: *const u8, ws: usize, nr: usize, off: usize) -> [__m512i; 8] {
    let mut z = [_mm512_setzero_si512(); 8];
    // SAFETY: the caller guarantees 32 readable bytes at `off` of every row's block.
    unsafe {
        for (r, zr) in z.iter_mut().enumerate() {
            let (ra, rb) = (r.min(nr - 1), (r + 8).min(nr - 1));
            *zr = join(ld(xb.add(ra * ws + off)), ld(xb.add(rb * ws + off)));
        }
        transpose16x8(z)
    }
}

/// The element bytes of super-block at `xb` (16 rows) into `pk.w`: `pk.w[8·cb + g]` lane r =
/// elements 32·cb + 4g .. +4 of row r, as unsigned values (Q4_K 0..15, Q5_K 0..31, Q6_K
/// 0..63, IQ4_XS its table + 128).
#[inline(always)]
unsafe fn pack_elements<const F: u8, S: Src>(s: S, pk: &mut Packed16) {
    let m4 = _mm512_set1_epi8(0x0f);
    // (macros, not closures: a closure would not inherit the target features)
    macro_rules! lo {
        ($v:expr) => {
            _mm512_and_si512($v, m4)
        };
    }
    macro_rules! hi {
        ($v:expr) => {
            high_nibbles($v, S::GFNI)
        };
    }
    // SAFETY (whole body): `s` holds 16 rows of whole Q4_K (qs 128 B @16) / Q5_K (qh 32 B
    // @16, qs 128 B @48) / Q6_K (ql 128 B @0, qh 64 B @128) / IQ4_XS (qs 128 B @8)
    // blocks; AVX-512 enabled in every caller.
    unsafe {
        if F == IQ4XS {
            // 32 raw bytes = sub-blocks 2p (dwords 0..4) and 2p + 1 (4..8); in each, the
            // low nibbles are elements 0..16, the high ones 16..32
            let t = _mm512_broadcast_i32x4(_mm_loadu_si128(IQ4NL_U8.as_ptr() as *const __m128i));
            for p in 0..4 {
                let v = s.raw::<F>(8 + 32 * p);
                for g in 0..4 {
                    pk.w[16 * p + g] = _mm512_shuffle_epi8(t, lo!(v[g]));
                    pk.w[16 * p + 4 + g] = _mm512_shuffle_epi8(t, hi!(v[g]));
                    pk.w[16 * p + 8 + g] = _mm512_shuffle_epi8(t, lo!(v[4 + g]));
                    pk.w[16 * p + 12 + g] = _mm512_shuffle_epi8(t, hi!(v[4 + g]));
                }
            }
        } else if F == Q6K {
            // cb = 4·half + k: ql chunk 2·half + k % 2 (k < 2 low nibbles, else high),
            // two high bits from qh chunk `half` >> 2k
            let m2 = _mm512_set1_epi8(3);
            for half in 0..2 {
                let q = [s.raw::<F>(64 * half), s.raw::<F>(64 * half + 32)];
                let h = s.raw::<F>(128 + 32 * half);
                if S::GFNI {
                    // field k of the qh byte straight to bits 4..6, then one select:
                    // low nibble from the ql byte (k < 2 low, else high), bits 4..8 from it
                    for g in 0..8 {
                        for (k, &mk) in Q6K_BITS45.iter().enumerate() {
                            let qv = q[k % 2][g];
                            let l = if k < 2 { qv } else { _mm512_srli_epi16::<4>(qv) };
                            pk.w[8 * (4 * half + k) + g] = nibble_under(l, h[g], mk);
                        }
                    }
                    continue;
                }
                for g in 0..8 {
                    let hb = [
                        _mm512_and_si512(h[g], m2),
                        _mm512_and_si512(_mm512_srli_epi16::<2>(h[g]), m2),
                        _mm512_and_si512(_mm512_srli_epi16::<4>(h[g]), m2),
                        _mm512_and_si512(_mm512_srli_epi16::<6>(h[g]), m2),
                    ];
                    for k in 0..4 {
                        let l = if k < 2 { lo!(q[k % 2][g]) } else { hi!(q[k % 2][g]) };
                        pk.w[8 * (4 * half + k) + g] = _mm512_or_si512(l, _mm512_slli_epi16::<4>(hb[k]));
                    }
                }
            }
        } else {
            // cb = 2c + h: nibble h of qs chunk c; Q5_K's fifth bit = bit cb of qh
            let qs_off = if F == Q5K { 48 } else { 16 };
            let qh = if F == Q5K { s.raw::<F>(16) } else { [_mm512_setzero_si512(); 8] };
            let one = _mm512_set1_epi8(1);
            for c in 0..4 {
                let q = s.raw::<F>(qs_off + 32 * c);
                for g in 0..8 {
                    if F == Q5K && S::GFNI {
                        // the fifth bits (2c, 2c + 1 of the qh byte) straight to bit 4, then
                        // one select each with the low / high nibble
                        pk.w[8 * (2 * c) + g] = nibble_under(q[g], qh[g], Q5K_BIT4[2 * c]);
                        pk.w[8 * (2 * c + 1) + g] = nibble_under(_mm512_srli_epi16::<4>(q[g]), qh[g], Q5K_BIT4[2 * c + 1]);
                        continue;
                    }
                    let (mut l, mut h) = (lo!(q[g]), hi!(q[g]));
                    if F == Q5K {
                        let bl = _mm512_and_si512(_mm512_srl_epi16(qh[g], _mm_cvtsi32_si128(2 * c as i32)), one);
                        let bh = _mm512_and_si512(_mm512_srl_epi16(qh[g], _mm_cvtsi32_si128(2 * c as i32 + 1)), one);
                        l = _mm512_or_si512(l, _mm512_slli_epi16::<4>(bl));
                        h = _mm512_or_si512(h, _mm512_slli_epi16::<4>(bh));
                    }
                    pk.w[8 * (2 * c) + g] = l;
                    pk.w[8 * (2 * c + 1) + g] = h;
                }
            }
        }
    }
}

/// 16 rows × 8 dwords → 8 vectors of 16 rows: `z[r]` holds dwords 0..8 of row r (low
/// 256 bits) and of row r + 8 (high); out[g] lane r = dword g of row r. One 8×8 dword
/// transpose per 256-bit half.
#[inline(always)]
pub(super) unsafe fn transpose16x8(z: [__m512i; 8]) -> [__m512i; 8] {
    let lo_idx = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    let hi_idx = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    let mut t = [_mm512_setzero_si512(); 8];
    for k in 0..4 {
        t[2 * k] = _mm512_unpacklo_epi32(z[2 * k], z[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_epi32(z[2 * k], z[2 * k + 1]);
    }
    let u = [
        _mm512_unpacklo_epi64(t[0], t[2]),
        _mm512_unpackhi_epi64(t[0], t[2]),
        _mm512_unpacklo_epi64(t[1], t[3]),
        _mm512_unpackhi_epi64(t[1], t[3]),
        _mm512_unpacklo_epi64(t[4], t[6]),
        _mm512_unpackhi_epi64(t[4], t[6]),
        _mm512_unpacklo_epi64(t[5], t[7]),
        _mm512_unpackhi_epi64(t[5], t[7]),
    ];
    let mut out = [_mm512_setzero_si512(); 8];
    for g in 0..4 {
        out[g] = _mm512_permutex2var_epi64(u[g], lo_idx, u[g + 4]);
        out[4 + g] = _mm512_permutex2var_epi64(u[g], hi_idx, u[g + 4]);
    }
    out
}

/// Byte size of one super-block of the format `F`.
pub(super) const fn block_bytes<const F: u8>() -> usize {
    use super::k_quants::{Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES};
    match F {
        IQ4XS => super::iq4::IQ4_XS_BYTES,
        Q6K => Q6_K_BYTES,
        Q5K => Q5_K_BYTES,
        _ => Q4_K_BYTES,
    }
}

/// One super-block of 16 rows from `s` (plain rows or the `rows16` layout) into `pk`.
#[inline(always)]
pub(super) unsafe fn pack16_from<const F: u8, S: Src>(s: S, pk: &mut Packed16) {
    // SAFETY (whole body): AVX-512 enabled in every caller; the caller guarantees a whole
    // super-block of 16 rows at `s`.
    unsafe {
        pack_elements::<F, S>(s, pk);
        pack_scales16::<F, S>(s, pk);
    }
}

/// The scales, corrections and d / dmin of the super-block at `s` of the 16 rows into
/// `pk` (its elements untouched).
#[inline(always)]
pub(super) unsafe fn pack_scales16<const F: u8, S: Src>(s: S, pk: &mut Packed16) {
    // SAFETY: the caller guarantees 16 rows of whole blocks at s (Q5_K's header is
    // Q4_K's); AVX-512 enabled in every caller.
    unsafe {
        if F == IQ4XS {
            iq4xs_scales16(s.hdr::<F>(0), pk)
        } else if F == Q6K {
            q6k_scales16(s.hdr::<F>(192), s.d6(), pk)
        } else {
            q4k_scales16(s.hdr::<F>(0), pk)
        }
    }
}

/// The 16 bytes at `x + r·ws` of the 16 rows as 4 vectors: lane r of `h[k]` = dword k
/// (bytes 4k..4k+4) of row r (rows past `nr` repeat row `nr − 1`).
#[inline(always)]
pub(super) unsafe fn dwords16(x: *const u8, ws: usize, nr: usize) -> [__m512i; 4] {
    // SAFETY (whole body): 16 readable bytes at each `x + r·ws`; AVX-512 enabled in every
    // caller. (Macros, not closures: a closure would not inherit the target features.)
    unsafe {
        macro_rules! row {
            ($r:expr) => {
                _mm_loadu_si128(x.add(($r).min(nr - 1) * ws) as *const __m128i)
            };
        }
        // z[m] holds rows m, m+4, m+8, m+12 (one per 128-bit lane), so that a 4×4 dword
        // transpose per lane leaves dword k of row r in lane r.
        let mut z = [_mm512_setzero_si512(); 4];
        for (m, zm) in z.iter_mut().enumerate() {
            let v = _mm512_castsi128_si512(row!(m));
            let v = _mm512_inserti32x4::<1>(v, row!(m + 4));
            let v = _mm512_inserti32x4::<2>(v, row!(m + 8));
            *zm = _mm512_inserti32x4::<3>(v, row!(m + 12));
        }
        let (t0, t1) = (_mm512_unpacklo_epi32(z[0], z[1]), _mm512_unpackhi_epi32(z[0], z[1]));
        let (t2, t3) = (_mm512_unpacklo_epi32(z[2], z[3]), _mm512_unpackhi_epi32(z[2], z[3]));
        [
            _mm512_unpacklo_epi64(t0, t2),
            _mm512_unpackhi_epi64(t0, t2),
            _mm512_unpacklo_epi64(t1, t3),
            _mm512_unpackhi_epi64(t1, t3),
        ]
    }
}

/// Q4_K scales, mins (as the `(m, m)` i16 pairs of the correction) and d / dmin of 16
/// blocks from their first 16 bytes `h` (`dwords16`: d, dmin, the 12 scale bytes),
/// computed across rows in 512-bit lanes (lane r = row r) with
/// `x86_tile::scales_mins_k4`'s bit formulas, exact as the scalar path.
#[inline(always)]
unsafe fn q4k_scales16(h: [__m512i; 4], pk: &mut Packed16) {
    // SAFETY (whole body): AVX-512 enabled in every caller.
    unsafe {
        let (k1, k2, k3) = (_mm512_set1_epi32(0x3f3f_3f3f), _mm512_set1_epi32(0x0f0f_0f0f), _mm512_set1_epi32(0x0303_0303));
        let sc_lo = _mm512_and_si512(h[1], k1);
        let mn_lo = _mm512_and_si512(h[2], k1);
        let sc_hi = _mm512_or_si512(
            _mm512_and_si512(h[3], k2),
            _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(h[1]), k3)),
        );
        let mn_hi = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi32::<4>(h[3]), k2),
            _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(h[2]), k3)),
        );
        let ff = _mm512_set1_epi32(0xff);
        for s in 0..4 {
            let c = _mm_cvtsi32_si128(8 * s as i32);
            macro_rules! byte {
                ($v:expr) => {
                    _mm512_and_si512(_mm512_srl_epi32($v, c), ff)
                };
            }
            pk.sc[s] = byte!(sc_lo);
            pk.sc[4 + s] = byte!(sc_hi);
            let (ml, mh) = (byte!(mn_lo), byte!(mn_hi));
            pk.corr[s] = _mm512_or_si512(ml, _mm512_slli_epi32::<16>(ml));
            pk.corr[4 + s] = _mm512_or_si512(mh, _mm512_slli_epi32::<16>(mh));
        }
        for q in 0..4 {
            pk.corr2[q] = _mm512_mask_blend_epi16(0xaaaa_aaaa, pk.corr[2 * q], pk.corr[2 * q + 1]);
        }
        pk.d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h[0]));
        pk.dm = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(h[0])));
    }
}

/// IQ4_XS's 8 signed sub-block scales (`ls − 32`), their `(ls, ls)` i16 pairs for the
/// offset correction, and d of 16 blocks from their first 16 bytes `h` (d @0, scales_h
/// @2, scales_l @4), across rows in 512-bit lanes.
#[inline(always)]
unsafe fn iq4xs_scales16(h: [__m512i; 4], pk: &mut Packed16) {
    // SAFETY (whole body): AVX-512 enabled in every caller.
    unsafe {
        let sh = _mm512_srli_epi32::<16>(h[0]);
        let (f, three, lo16) = (_mm512_set1_epi32(15), _mm512_set1_epi32(3), _mm512_set1_epi32(0xffff));
        for ib in 0..8 {
            let lo = _mm512_and_si512(_mm512_srl_epi32(h[1], _mm_cvtsi32_si128(4 * ib as i32)), f);
            let hi = _mm512_and_si512(_mm512_srl_epi32(sh, _mm_cvtsi32_si128(2 * ib as i32)), three);
            let ls = _mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32::<4>(hi)), _mm512_set1_epi32(32));
            pk.sc[ib] = ls;
            pk.corr[ib] = _mm512_or_si512(_mm512_and_si512(ls, lo16), _mm512_slli_epi32::<16>(ls));
        }
        for q in 0..4 {
            pk.corr2[q] = _mm512_mask_blend_epi16(0xaaaa_aaaa, pk.corr[2 * q], pk.corr[2 * q + 1]);
        }
        pk.d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h[0]));
        pk.dm = _mm512_setzero_ps();
    }
}

/// Q6_K's 16 signed scales (sign-extended), their i16 pairs for the offset correction,
/// and d of 16 blocks from their scale bytes `h` (`dwords16` @192) and d, across rows in
/// 512-bit lanes (lane r = row r).
#[inline(always)]
unsafe fn q6k_scales16(h: [__m512i; 4], d: __m512, pk: &mut Packed16) {
    // SAFETY (whole body): AVX-512 enabled in every caller.
    unsafe {
        for (k, hk) in h.iter().enumerate() {
            // byte b of the dword, sign-extended: scale 4k + b
            pk.sc[4 * k] = _mm512_srai_epi32::<24>(_mm512_slli_epi32::<24>(*hk));
            pk.sc[4 * k + 1] = _mm512_srai_epi32::<24>(_mm512_slli_epi32::<16>(*hk));
            pk.sc[4 * k + 2] = _mm512_srai_epi32::<24>(_mm512_slli_epi32::<8>(*hk));
            pk.sc[4 * k + 3] = _mm512_srai_epi32::<24>(*hk);
        }
        let lo16 = _mm512_set1_epi32(0xffff);
        for p in 0..8 {
            pk.corr[p] = _mm512_or_si512(_mm512_and_si512(pk.sc[2 * p], lo16), _mm512_slli_epi32::<16>(pk.sc[2 * p + 1]));
        }
        pk.d = d;
        pk.dm = _mm512_setzero_ps();
    }
}

/// `M` tokens (activations at `a + j·astride`) against the packed super-blocks `pks`,
/// which are blocks `i0..` of rows of `nb` blocks: `sumf[j]` += the 16 rows' dot products
/// over those blocks (lane r = row r; the 8-row kernel's steps, blocks in order). `pf`:
/// the next rows' bytes, prefetched a share per sub-block step of the `nb` blocks;
/// `pairs`: the tokens' bsum pairs (`Corr::Pairs`; Q6_K takes its bsums).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn dot16<const F: u8, const M: usize>(
    pks: &[Packed16],
    i0: usize,
    nb: usize,
    a: *const u8,
    astride: usize,
    sumf: &mut [__m512; M],
    pf: Option<(*const u8, usize)>,
    pairs: Option<(*const u8, usize)>,
) {
    let (ns, gs) = if F == Q6K { (16, 4) } else { (8, 8) };
    let corr = Corr::of::<F>(pairs);
    // the next rows' bytes spread over the sub-block steps: a few lines each, so the
    // loads stay in flight instead of overflowing the miss buffers in one burst
    let (pf_at, pf_len) = pf.unwrap_or((core::ptr::null(), 0));
    let per_step = pf_len.div_ceil(nb * ns).next_multiple_of(64);
    for (ii, pk) in pks.iter().enumerate() {
        let i = i0 + ii;
        let mut isum = [_mm512_setzero_si512(); M];
        for s in 0..ns {
            let scv = pk.sc[s];
            let start = (i * ns + s) * per_step;
            super::x86::prefetch_l2_range(pf_at, start, (start + per_step).min(pf_len));
            // weight vector g against every token before g + 1: the M chains of `vpdpbusd`
            // (5 cycles each) interleave in program order (token by token, each chain's
            // latency was exposed: Q4_K 2048×8192 at 64–512 tokens 7–8% slower, one thread)
            // SAFETY: inside token 0's block i (the caller's contract).
            let y0 = unsafe { a.add(i * Q8_K_BYTES + Q8_K_QS + 4 * gs * s) };
            if F == Q4K {
                // Q4_K: each 16-element half's sum fits i16 (|·| ≤ 16·15·128 = 30720), so
                // `vpdpwssd` against the scale as the pair (sc, 0) adds sum·sc exactly —
                // one µop for `vpmulld`'s two and the add
                for h in 0..2 {
                    let mut acc = [_mm512_setzero_si512(); M];
                    for g in 4 * h..4 * h + 4 {
                        for (j, ac) in acc.iter_mut().enumerate() {
                            // SAFETY: as below.
                            *ac = unsafe { _mm512_dpbusd_epi32(*ac, pk.w[gs * s + g], bcast4(y0.add(j * astride + 4 * g))) };
                        }
                    }
                    for (is, ac) in isum.iter_mut().zip(acc) {
                        *is = _mm512_dpwssd_epi32(*is, ac, scv);
                    }
                }
                continue;
            }
            let mut acc = [_mm512_setzero_si512(); M];
            for g in 0..gs {
                for (j, ac) in acc.iter_mut().enumerate() {
                    // SAFETY: token j's block i is Q8_K_BYTES at a + j·astride + i·Q8_K_BYTES;
                    // the qs bytes read are 4 + (s·gs + g)·4 + 4 <= 260.
                    *ac = unsafe { _mm512_dpbusd_epi32(*ac, pk.w[gs * s + g], bcast4(y0.add(j * astride + 4 * g))) };
                }
            }
            for (is, ac) in isum.iter_mut().zip(acc) {
                *is = _mm512_add_epi32(*is, _mm512_mullo_epi32(ac, scv));
            }
        }
        // SAFETY: token j's block i exists (the caller's contract).
        unsafe { finish16::<F, M>(pk, i, a, astride, &isum, corr, sumf) };
    }
}

/// Where [`finish16`] takes each token's correction integer (Σ over sub-blocks of `pk`'s
/// mins, or scales for the codes' offset, times the token's sub-block sums) from.
#[derive(Clone, Copy)]
pub(super) enum Corr<'a> {
    /// The token's bsums, one `vpdpwssd` per pair of them.
    Bsums,
    /// The tokens' bsums summed per 32-element sub-block (`x86_rows16::BsumPairs`: token j's block
    /// i at `p + j·stride + 16·i`), one `vpdpwssd` per two sub-blocks (Q4_K / Q5_K /
    /// IQ4_XS): the same integer as `Bsums`, in half the products.
    Pairs(*const u8, usize),
    /// Row j of a tile product's result (`x86_amx_split`: Q4_K / Q5_K mins as a B part).
    Rows(&'a [i32; 256]),
    /// None left: the sums are of value·scale, offset taken out (`x86_amx_split::
    /// split_signed`: Q6_K / IQ4_XS).
    Folded,
}

impl Corr<'_> {
    /// Format `F`'s correction from the tokens' bsum pairs where it has them (Q4_K, Q5_K,
    /// IQ4_XS: `x86_rows16::BsumPairs`, token 0 at `pairs`), else from each token's bsums.
    #[inline(always)]
    pub(super) fn of<const F: u8>(pairs: Option<(*const u8, usize)>) -> Corr<'static> {
        match pairs {
            Some((p, stride)) if F != Q6K => Corr::Pairs(p, stride),
            _ => Corr::Bsums,
        }
    }
}

/// The float step of super-block `i` for `M` tokens: the correction of `pk`'s scales
/// (from `corr`) and `sumf[j]` += d·(integer sums `isum[j]`) per lane (the 8-row kernel's
/// unfused steps, so every lane equals the single-row kernel).
///
/// # Safety
/// AVX-512 enabled in the caller; token j's block i at `a + j·astride + i·Q8_K_BYTES`.
#[inline(always)]
pub(super) unsafe fn finish16<const F: u8, const M: usize>(
    pk: &Packed16,
    i: usize,
    a: *const u8,
    astride: usize,
    isum: &[__m512i; M],
    corr: Corr<'_>,
    sumf: &mut [__m512; M],
) {
    for (j, sf) in sumf.iter_mut().enumerate() {
        // SAFETY (this block): token j's block i: d @0, bsums 32 bytes @260; `Rows` has
        // 16 i32 at row j (j < 16).
        unsafe {
            let y = a.add(j * astride + i * Q8_K_BYTES);
            let c = match corr {
                Corr::Bsums => {
                    let mut c = _mm512_setzero_si512();
                    for p in 0..8 {
                        c = _mm512_dpwssd_epi32(c, pk.corr[p], bcast4(y.add(Q8_K_BSUMS + 4 * p)));
                    }
                    c
                }
                Corr::Pairs(p, stride) => {
                    let pp = p.add(j * stride + 16 * i);
                    let mut c = _mm512_setzero_si512();
                    for q in 0..4 {
                        c = _mm512_dpwssd_epi32(c, pk.corr2[q], bcast4(pp.add(4 * q)));
                    }
                    c
                }
                Corr::Rows(r) => _mm512_loadu_si512(r[16 * j..].as_ptr() as *const _),
                Corr::Folded => _mm512_setzero_si512(),
            };
            let yd = _mm512_set1_ps((y as *const f32).read_unaligned());
            let term = if F == Q6K || F == IQ4XS {
                // dw·yd·(is − off): Q6_K's offset 32 per 16 elements, IQ4_XS's 128
                // (the +128 of its unsigned codes) per 32
                let off = if F == Q6K { _mm512_slli_epi32::<5>(c) } else { _mm512_slli_epi32::<7>(c) };
                let t = _mm512_sub_epi32(isum[j], off);
                _mm512_mul_ps(_mm512_mul_ps(pk.d, yd), _mm512_cvtepi32_ps(t))
            } else {
                // (dw·yd)·is − (dmw·yd)·summ
                let dd = _mm512_mul_ps(pk.d, yd);
                let dmin = _mm512_mul_ps(pk.dm, yd);
                _mm512_sub_ps(_mm512_mul_ps(dd, _mm512_cvtepi32_ps(isum[j])), _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(c)))
            };
            *sf = _mm512_add_ps(*sf, term);
        }
    }
}

/// Scratch of [`group16`]: the packed super-blocks.
#[derive(Default)]
pub struct Scratch16 {
    pub(super) pks: Vec<Packed16>,
}

/// Rows `0..nr` (1 ≤ nr ≤ 16) of `w` (stride `ws`, `nb` super-blocks each) against `m`
/// tokens: `out[r·ostride + j]`; `next` (pointer, bytes): the weights to prefetch meanwhile.
///
/// # Safety
/// AVX-512 F/BW/VL + VNNI and AVX2 available; `nr` rows of `nb` blocks at `w`, `m`
/// tokens of `nb` Q8_K blocks at `a + j·astride`, `out` holds `(nr−1)·ostride + m` floats.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn group16(
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
    sc: &mut Scratch16,
    next: Option<(*const u8, usize)>,
) {
    let o = Out::rows(out, ostride);
    // SAFETY (whole body): the caller's contract.
    unsafe {
        match kind {
            IQ4XS => run::<IQ4XS, Rows>(nb, nr, Rows { xb: w, ws, nr }, a, astride, m, o, sc, next, false, None),
            Q6K => run::<Q6K, Rows>(nb, nr, Rows { xb: w, ws, nr }, a, astride, m, o, sc, next, false, None),
            Q5K => run::<Q5K, Rows>(nb, nr, Rows { xb: w, ws, nr }, a, astride, m, o, sc, next, false, None),
            _ => run::<Q4K, Rows>(nb, nr, Rows { xb: w, ws, nr }, a, astride, m, o, sc, next, false, None),
        }
    }
}

/// `group16` for format `F`, the rows' blocks from `src` (block 0; plain rows or the
/// `rows16` layout); `prepacked`: `sc.pks` already holds the rows' `nb` packed
/// super-blocks (`src` unused).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) unsafe fn run<const F: u8, S: Src>(
    nb: usize,
    nr: usize,
    src: S,
    a: *const u8,
    astride: usize,
    m: usize,
    o: Out,
    sc: &mut Scratch16,
    next: Option<(*const u8, usize)>,
    prepacked: bool,
    pairs: Option<(*const u8, usize)>,
) {
    // SAFETY: an all-zero bit pattern is a valid Packed16.
    let zero: Packed16 = unsafe { std::mem::zeroed() };
    // token t's pairs (a hint past the call's tokens is never read)
    let pairs_at = |t: usize| pairs.map(|(p, st)| (p.wrapping_add(t * st), st));
    // Two token tiles (9–16 tokens: 16 decode slots, an expert's share of a batch): each
    // super-block dotted by both right after it is packed, while it is in L1.
    if m > MAX_TILE && m <= 2 * MAX_TILE && !prepacked && super::x86_block::knob(super::x86_block::KNOB_PACK_AHEAD, 1) != 0 {
        // SAFETY: the caller's contract (16 rows of nb blocks at src, m tokens at a).
        return unsafe { two_tiles::<F, S>(nb, nr, src, a, astride, m, o, sc, next, pairs) };
    }
    // One token tile (few tokens: an expert's share of a batch): each super-block is
    // dotted right after it is packed, while it is in L1 (one Packed16 of scratch). More
    // tokens: all blocks packed first, then every tile runs over them.
    let one_tile = m <= MAX_TILE && !prepacked;
    sc.pks.resize(if one_tile { 1 } else { nb }, zero);
    if !one_tile && !prepacked {
        for i in 0..nb {
            // SAFETY: the caller guarantees 16 rows of nb blocks at src.
            unsafe { pack16_from::<F, S>(src.block::<F>(i), &mut sc.pks[i]) };
        }
    }
    // The next rows (`next`: pointer, bytes) load while the first token tile computes.
    let mut t0 = 0;
    while t0 < m {
        let mt = MAX_TILE.min(m - t0);
        // SAFETY: tokens t0..t0+mt are inside the activations (caller).
        let at = unsafe { a.add(t0 * astride) };
        macro_rules! dot {
            ($mm:literal, $pks:expr, $i0:expr, $o:expr, $pf:expr) => {
                // SAFETY: as above.
                unsafe { dot16_as::<F, $mm>($pks, $i0, nb, at, astride, $o, $pf, pairs_at(t0)) }
            };
        }
        macro_rules! go {
            ($mm:literal) => {{
                let mut acc = [_mm512_setzero_ps(); $mm];
                let pf = if t0 == 0 { next } else { None };
                if one_tile {
                    for i in 0..nb {
                        // SAFETY: the caller guarantees 16 rows of nb blocks at src.
                        unsafe { pack16_from::<F, S>(src.block::<F>(i), &mut sc.pks[0]) };
                        dot!($mm, &sc.pks[..1], i, &mut acc, pf);
                    }
                } else {
                    dot!($mm, &sc.pks, 0, &mut acc, pf);
                }
                // SAFETY: AVX-512 F/VL enabled in every caller.
                unsafe { store_tile(&acc, nr, o, t0) };
            }};
        }
        tokens_upto8!(mt, go);
        t0 += mt;
    }
}

/// [`dot16`] with format `F`'s dot formula (Q5_K's packed blocks dot as Q4_K's).
///
/// # Safety
/// As [`dot16`]'s.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn dot16_as<const F: u8, const M: usize>(pks: &[Packed16], i0: usize, nb: usize, a: *const u8, astride: usize, sumf: &mut [__m512; M], pf: Option<(*const u8, usize)>, pairs: Option<(*const u8, usize)>) {
    // SAFETY: the caller's contract.
    unsafe {
        if F == Q6K {
            dot16::<Q6K, M>(pks, i0, nb, a, astride, sumf, pf, pairs)
        } else if F == IQ4XS {
            dot16::<IQ4XS, M>(pks, i0, nb, a, astride, sumf, pf, pairs)
        } else if F == Q5K {
            dot16::<Q5K, M>(pks, i0, nb, a, astride, sumf, pf, pairs)
        } else {
            dot16::<Q4K, M>(pks, i0, nb, a, astride, sumf, pf, pairs)
        }
    }
}

/// [`run`] for 9–16 tokens: tokens 0..8 and 8..m, every super-block packed once into one
/// `Packed16` and dotted by both tiles at once (each token's sums still run over the
/// blocks in order: bitwise [`run`]'s).
///
/// # Safety
/// As [`run`]'s; `MAX_TILE < m <= 2·MAX_TILE`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn two_tiles<const F: u8, S: Src>(
    nb: usize,
    nr: usize,
    src: S,
    a: *const u8,
    astride: usize,
    m: usize,
    o: Out,
    sc: &mut Scratch16,
    next: Option<(*const u8, usize)>,
    pairs: Option<(*const u8, usize)>,
) {
    // SAFETY: an all-zero bit pattern is a valid Packed16.
    sc.pks.resize(1, unsafe { std::mem::zeroed() });
    let pairs2 = pairs.map(|(p, st)| (p.wrapping_add(MAX_TILE * st), st));
    // SAFETY (whole body): the caller's contract; tokens MAX_TILE.. start at a2.
    unsafe {
        let a2 = a.add(MAX_TILE * astride);
        let mut o1 = [_mm512_setzero_ps(); MAX_TILE];
        macro_rules! go {
            ($mm:literal) => {{
                let mut o2 = [_mm512_setzero_ps(); $mm];
                for i in 0..nb {
                    pack16_from::<F, S>(src.block::<F>(i), &mut sc.pks[0]);
                    dot16_as::<F, MAX_TILE>(&sc.pks[..1], i, nb, a, astride, &mut o1, next, pairs);
                    dot16_as::<F, $mm>(&sc.pks[..1], i, nb, a2, astride, &mut o2, None, pairs2);
                }
                store_tile(&o1, nr, o, 0);
                store_tile(&o2, nr, o, MAX_TILE);
            }};
        }
        tokens_upto8!(m - MAX_TILE, go);
    }
}
