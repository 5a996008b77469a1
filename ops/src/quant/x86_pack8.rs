//! 8-row packed kernels for Q4_K, Q5_K, Q6_K and IQ4_XS on plain AVX2 (no VNNI): the AVX2
//! counterpart of `x86_pack16`. Each super-block of 8 weight rows is decoded once into
//! 256-bit vectors whose i32 lane r holds 4 elements of row r (one 8×8 dword transpose
//! per 32 raw bytes), so a broadcast of 4 activation bytes and one `vpmaddubsw` give 32
//! products of 8 rows, and the scales, corrections and float steps run once per 8 rows
//! instead of once per row: no horizontal sums at all (the per-row tile kernels sum 8
//! lanes per super-block and token).
//!
//! Exactness: `vpmaddubsw` pairs (u8 weight · i8 activation) are summed in i16 only as
//! far as they cannot overflow with any weight and any Q8_K byte (|q| ≤ 128): Q4_K
//! 8 groups (8·2·15·128 = 30720), Q5_K 4 groups (4·2·31·128 = 31744), Q6_K 2 groups
//! (2·2·63·128 = 32256); then `vpmaddwd` with the i16 sub-block scale gives exact i32
//! sums. IQ4_XS's table values are signed: `|w| · (a with w's sign)` per group, each
//! pair at most 2·127·127 (the Q8_K bytes stay within ±127), scaled at once. Every
//! super-block's integer sums are therefore the exact ones, and the float step per
//! super-block and token is the single-row kernel's (unfused, same order), so results
//! are bitwise equal to `vec_dot`.

use super::q8::{Q8_K_BSUMS, Q8_K_BYTES, Q8_K_QS};
use super::x86_rows8::{Rows8, Src8};
use super::x86_tile::{ld, MAX_TILE};
pub(super) use super::x86_out::store_rows8;
use super::x86_out::Out;
use std::arch::x86_64::*;

/// The formats (`const F`): the K-quant's bit width; IQ4_XS (`x86_pack16`'s code).
pub const Q4K: u8 = 4;
pub const Q5K: u8 = 5;
pub const Q6K: u8 = 6;
pub const IQ4XS: u8 = 44;

/// One super-block of 8 rows, decoded (lane r = row r).
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub struct Packed8 {
    /// `w[8·cb + g]` = elements 32·cb + 4g .. +4 of each row, unsigned bytes (IQ4_XS:
    /// the signed table values).
    pub(super) w: [__m256i; 64],
    /// The sub-block scales as `(s, s)` i16 pairs (Q4_K/Q5_K/IQ4_XS: 8 of 32 elements,
    /// Q6_K: 16 of 16, signed).
    pub(super) sc: [__m256i; 16],
    /// i16 pairs multiplied with the bsum pairs: Q4_K/Q5_K `(m, m)` of each sub-block,
    /// Q6_K `(s_2p, s_2p+1)`.
    pub(super) corr: [__m256i; 8],
    pub(super) d: __m256,
    pub(super) dm: __m256,
}

/// 8 rows × 8 dwords (`z[r]` = row r) transposed: lane r of `out[g]` = dword g of row r.
#[inline(always)]
unsafe fn transpose8x8(z: [__m256i; 8]) -> [__m256i; 8] {
    let mut t = [_mm256_setzero_si256(); 8];
    for k in 0..4 {
        t[2 * k] = _mm256_unpacklo_epi32(z[2 * k], z[2 * k + 1]);
        t[2 * k + 1] = _mm256_unpackhi_epi32(z[2 * k], z[2 * k + 1]);
    }
    let u = [
        _mm256_unpacklo_epi64(t[0], t[2]),
        _mm256_unpackhi_epi64(t[0], t[2]),
        _mm256_unpacklo_epi64(t[1], t[3]),
        _mm256_unpackhi_epi64(t[1], t[3]),
        _mm256_unpacklo_epi64(t[4], t[6]),
        _mm256_unpackhi_epi64(t[4], t[6]),
        _mm256_unpacklo_epi64(t[5], t[7]),
        _mm256_unpackhi_epi64(t[5], t[7]),
    ];
    let mut out = [_mm256_setzero_si256(); 8];
    for g in 0..4 {
        out[g] = _mm256_permute2x128_si256::<0x20>(u[g], u[g + 4]);
        out[4 + g] = _mm256_permute2x128_si256::<0x31>(u[g], u[g + 4]);
    }
    out
}

/// 32 raw bytes at offset `off` of the 8 rows' blocks at `xb` (stride `ws`; rows past
/// `nr` repeat row `nr − 1`), transposed (lane r of `out[g]` = dword g of row r): the
/// nibbles and bit planes keep their places inside each dword, so masks and shifts
/// after the transpose decode all rows at once.
#[inline(always)]
pub(super) unsafe fn raw8(xb: *const u8, ws: usize, nr: usize, off: usize) -> [__m256i; 8] {
    let mut z = [_mm256_setzero_si256(); 8];
    // SAFETY: the caller guarantees 32 readable bytes at `off` of every row's block.
    unsafe {
        for (r, zr) in z.iter_mut().enumerate() {
            *zr = ld(xb.add(r.min(nr - 1) * ws + off));
        }
        transpose8x8(z)
    }
}

/// The 16 bytes at `x + r·ws` of the 8 rows as 4 vectors: lane r of `h[k]` = dword k of
/// row r (rows past `nr` repeat row `nr − 1`).
#[inline(always)]
pub(super) unsafe fn dwords8(x: *const u8, ws: usize, nr: usize) -> [__m256i; 4] {
    // SAFETY (whole body): 16 readable bytes at each `x + r·ws`.
    unsafe {
        // (a macro, not a closure: a closure would not inherit the target features)
        macro_rules! row {
            ($r:expr) => {
                _mm_loadu_si128(x.add(($r).min(nr - 1) * ws) as *const __m128i)
            };
        }
        // z[m] holds rows m (low lane) and m + 4 (high): a 4×4 dword transpose per lane
        let mut z = [_mm256_setzero_si256(); 4];
        for (m, zm) in z.iter_mut().enumerate() {
            *zm = _mm256_set_m128i(row!(m + 4), row!(m));
        }
        let (t0, t1) = (_mm256_unpacklo_epi32(z[0], z[1]), _mm256_unpackhi_epi32(z[0], z[1]));
        let (t2, t3) = (_mm256_unpacklo_epi32(z[2], z[3]), _mm256_unpackhi_epi32(z[2], z[3]));
        [
            _mm256_unpacklo_epi64(t0, t2),
            _mm256_unpackhi_epi64(t0, t2),
            _mm256_unpacklo_epi64(t1, t3),
            _mm256_unpackhi_epi64(t1, t3),
        ]
    }
}

/// i32 lanes → `(v, v)` i16 pairs (v fits in i16).
#[inline(always)]
unsafe fn pair(v: __m256i) -> __m256i {
    _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32::<16>(v))
}

/// f16 values at `x + r·ws + off` of the 8 rows as f32 lanes (F16C; exact).
#[inline(always)]
pub(super) unsafe fn f16_lanes(x: *const u8, ws: usize, nr: usize, off: usize) -> __m256 {
    let mut h = [0u16; 8];
    for (r, hr) in h.iter_mut().enumerate() {
        // SAFETY: the caller guarantees 2 readable bytes at each row's `off`.
        *hr = unsafe { (x.add(r.min(nr - 1) * ws + off) as *const u16).read_unaligned() };
    }
    // SAFETY: `h` is 16 readable bytes.
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr() as *const __m128i)) }
}

/// Low nibbles of each byte.
#[inline(always)]
pub(super) unsafe fn nib_lo(v: __m256i) -> __m256i {
    _mm256_and_si256(v, _mm256_set1_epi8(0x0f))
}

/// High nibbles of each byte.
#[inline(always)]
pub(super) unsafe fn nib_hi(v: __m256i) -> __m256i {
    _mm256_and_si256(_mm256_srli_epi16::<4>(v), _mm256_set1_epi8(0x0f))
}

/// Q6_K element vector `k` (0..4) of group `g` of a 64-byte ql half (`q`: its two raw
/// chunks) and its qh chunk `h`: the ql nibble | the 2 qh bits at 2k..2k+2 moved to bits
/// 4..6 by one 16-bit shift (the bits it carries across a byte boundary are masked off).
#[inline(always)]
pub(super) unsafe fn q6_elems(q: &[[__m256i; 8]; 2], h: &[__m256i; 8], k: usize, g: usize) -> __m256i {
    let m30 = _mm256_set1_epi8(0x30);
    let hb = match k {
        0 => _mm256_slli_epi16::<4>(h[g]),
        1 => _mm256_slli_epi16::<2>(h[g]),
        2 => h[g],
        _ => _mm256_srli_epi16::<2>(h[g]),
    };
    let l = if k < 2 { nib_lo(q[k % 2][g]) } else { nib_hi(q[k % 2][g]) };
    _mm256_or_si256(l, _mm256_and_si256(hb, m30))
}

/// Q5_K element vectors of group `g` of qs chunk `c` (`q`: its raws; `qh`: the qh raws):
/// (sub-block 2c, sub-block 2c + 1), each nibble | its qh bit (2c, 2c + 1) at bit 4.
#[inline(always)]
pub(super) unsafe fn q5_elems(q: &[__m256i; 8], qh: &[__m256i; 8], c: usize, g: usize) -> (__m256i, __m256i) {
    let one = _mm256_set1_epi8(1);
    let bl = _mm256_and_si256(_mm256_srl_epi16(qh[g], _mm_cvtsi32_si128(2 * c as i32)), one);
    let bh = _mm256_and_si256(_mm256_srl_epi16(qh[g], _mm_cvtsi32_si128(2 * c as i32 + 1)), one);
    (_mm256_or_si256(nib_lo(q[g]), _mm256_slli_epi16::<4>(bl)), _mm256_or_si256(nib_hi(q[g]), _mm256_slli_epi16::<4>(bh)))
}

/// Decodes the super-block of the 8 rows at `s` into `pk`.
#[inline(always)]
pub(super) unsafe fn pack8<const F: u8, S: Src8>(s: S, pk: &mut Packed8) {
    // SAFETY (whole body): the caller guarantees 8 rows of whole blocks at w: Q4_K (d,
    // dmin, scales 12 B, qs 128 B @16), Q5_K (the same header, qh 32 B @16, qs @48),
    // Q6_K (ql 128 B @0, qh 64 B @128, scales 16 B @192, d @208).
    unsafe {
        if F == IQ4XS {
            // chunk c (32 qs bytes @8) holds sub-blocks 2c (dwords 0..4) and 2c + 1:
            // low nibbles elements 4g.., high ones 16 + 4g.., through the value table
            let t = super::x86_tile::table16(&super::iq4::KVALUES_IQ4NL);
            for c in 0..4 {
                let q = s.raw::<F>(8 + 32 * c);
                for g in 0..8 {
                    let sb = 2 * c + g / 4;
                    pk.w[8 * sb + g % 4] = _mm256_shuffle_epi8(t, nib_lo(q[g]));
                    pk.w[8 * sb + 4 + g % 4] = _mm256_shuffle_epi8(t, nib_hi(q[g]));
                }
            }
        } else if F == Q6K {
            for half in 0..2 {
                let q = [s.raw::<F>(64 * half), s.raw::<F>(64 * half + 32)];
                let h = s.raw::<F>(128 + 32 * half);
                for g in 0..8 {
                    for k in 0..4 {
                        pk.w[8 * (4 * half + k) + g] = q6_elems(&q, &h, k, g);
                    }
                }
            }
        } else {
            let qs_off = if F == Q5K { 48 } else { 16 };
            let qh = if F == Q5K { s.raw::<F>(16) } else { [_mm256_setzero_si256(); 8] };
            for c in 0..4 {
                let q = s.raw::<F>(qs_off + 32 * c);
                for g in 0..8 {
                    let (l, h) = if F == Q5K { q5_elems(&q, &qh, c, g) } else { (nib_lo(q[g]), nib_hi(q[g])) };
                    pk.w[8 * (2 * c) + g] = l;
                    pk.w[8 * (2 * c + 1) + g] = h;
                }
            }
        }
        pack_scales8::<F, S>(s, pk);
    }
}

/// The scales, corrections and d / dmin of the super-block of the 8 rows at `src` into
/// `pk` (its elements untouched).
#[inline(always)]
pub(super) unsafe fn pack_scales8<const F: u8, S: Src8>(src: S, pk: &mut Packed8) {
    // SAFETY (whole body): the caller guarantees 8 rows of whole blocks at src (Q4_K /
    // Q5_K: d, dmin, scales 12 B @0; Q6_K: scales 16 B @192, d @208; IQ4_XS: d,
    // scales_h @2, scales_l 4 B @4).
    unsafe {
        if F == IQ4XS {
            // ls = (4 bits of scales_l | 2 bits of scales_h << 4) − 32, per 32 elements
            let h = src.hdr::<F>(0);
            let (m4, m3, k32) = (_mm256_set1_epi32(15), _mm256_set1_epi32(3), _mm256_set1_epi32(32));
            for ib in 0..8 {
                let lo4 = _mm256_and_si256(_mm256_srl_epi32(h[1], _mm_cvtsi32_si128(4 * ib as i32)), m4);
                let hi2 = _mm256_and_si256(_mm256_srl_epi32(h[0], _mm_cvtsi32_si128(16 + 2 * ib as i32)), m3);
                pk.sc[ib] = pair(_mm256_sub_epi32(_mm256_or_si256(lo4, _mm256_slli_epi32::<4>(hi2)), k32));
            }
            pk.d = src.halves::<F>(0);
            pk.dm = _mm256_setzero_ps();
        } else if F == Q6K {
            let h = src.hdr::<F>(192);
            let mut s = [_mm256_setzero_si256(); 16];
            for (k, hk) in h.iter().enumerate() {
                // byte b of the dword, sign-extended: scale 4k + b
                s[4 * k] = _mm256_srai_epi32::<24>(_mm256_slli_epi32::<24>(*hk));
                s[4 * k + 1] = _mm256_srai_epi32::<24>(_mm256_slli_epi32::<16>(*hk));
                s[4 * k + 2] = _mm256_srai_epi32::<24>(_mm256_slli_epi32::<8>(*hk));
                s[4 * k + 3] = _mm256_srai_epi32::<24>(*hk);
            }
            let lo16 = _mm256_set1_epi32(0xffff);
            for p in 0..8 {
                pk.corr[p] = _mm256_or_si256(_mm256_and_si256(s[2 * p], lo16), _mm256_slli_epi32::<16>(s[2 * p + 1]));
            }
            for (o, v) in pk.sc.iter_mut().zip(s) {
                *o = pair(v);
            }
            pk.d = src.halves::<F>(208);
            pk.dm = _mm256_setzero_ps();
        } else {
            // scales and mins: `x86_tile::scales_mins_k4`'s bit formulas across rows
            let h = src.hdr::<F>(0);
            let (k1, k2, k3) = (_mm256_set1_epi32(0x3f3f_3f3f), _mm256_set1_epi32(0x0f0f_0f0f), _mm256_set1_epi32(0x0303_0303));
            let sc_lo = _mm256_and_si256(h[1], k1);
            let mn_lo = _mm256_and_si256(h[2], k1);
            let sc_hi = _mm256_or_si256(
                _mm256_and_si256(h[3], k2),
                _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(h[1]), k3)),
            );
            let mn_hi = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi32::<4>(h[3]), k2),
                _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(h[2]), k3)),
            );
            let ff = _mm256_set1_epi32(0xff);
            for s in 0..4 {
                let c = _mm_cvtsi32_si128(8 * s as i32);
                macro_rules! byte {
                    ($v:expr) => {
                        _mm256_and_si256(_mm256_srl_epi32($v, c), ff)
                    };
                }
                pk.sc[s] = pair(byte!(sc_lo));
                pk.sc[4 + s] = pair(byte!(sc_hi));
                pk.corr[s] = pair(byte!(mn_lo));
                pk.corr[4 + s] = pair(byte!(mn_hi));
            }
            pk.d = src.halves::<F>(0);
            pk.dm = src.halves::<F>(2);
        }
    }
}

#[inline(always)]
pub(super) unsafe fn bcast4(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 4 readable bytes at `p`.
    _mm256_set1_epi32(unsafe { (p as *const i32).read_unaligned() })
}

/// `M` tokens (activations at `a + j·astride`) against the packed super-blocks `pks`
/// (blocks `i0..` of the rows): `sumf[j]` lane r += row r's dot product over them.
#[inline(always)]
unsafe fn dot8<const F: u8, const M: usize>(pks: &[Packed8], i0: usize, a: *const u8, astride: usize, sumf: &mut [__m256; M]) {
    // sub-blocks per super-block, groups of 4 elements per sub-block, and how many
    // groups' i16 pair sums are added before the scale (see the module's bounds)
    let (ns, gs, chain) = match F {
        Q6K => (16, 4, 2),
        Q5K => (8, 8, 4),
        _ => (8, 8, 8),
    };
    for (ii, pk) in pks.iter().enumerate() {
        let i = i0 + ii;
        let mut isum = [_mm256_setzero_si256(); M];
        if F == IQ4XS {
            // signed weights: |w| · (a with w's sign) (pairs ≤ 2·127·127: Q8_K bytes
            // are within ±127), each group's i16 pairs scaled at once
            for s in 0..8 {
                let scv = pk.sc[s];
                for g in 0..8 {
                    let w = pk.w[8 * s + g];
                    let aw = _mm256_sign_epi8(w, w);
                    for (j, is) in isum.iter_mut().enumerate() {
                        // SAFETY: token j's block i is Q8_K_BYTES at y (the caller's contract).
                        unsafe {
                            let y = a.add(j * astride + i * Q8_K_BYTES + Q8_K_QS + 32 * s + 4 * g);
                            let p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(bcast4(y), w));
                            *is = _mm256_add_epi32(*is, _mm256_madd_epi16(p, scv));
                        }
                    }
                }
            }
            // SAFETY: token j's block i exists (the caller's contract).
            unsafe { finish8::<F, M>(pk, i, a, astride, &isum, sumf) };
            continue;
        }
        for s in 0..ns {
            let scv = pk.sc[s];
            for (j, is) in isum.iter_mut().enumerate() {
                // SAFETY (this block): token j's block i is Q8_K_BYTES at y; the qs
                // bytes read are 4 + (s·gs + g)·4 + 4 <= 260.
                unsafe {
                    let y = a.add(j * astride + i * Q8_K_BYTES + Q8_K_QS + 4 * gs * s);
                    let mut g = 0;
                    while g < gs {
                        let mut acc = _mm256_maddubs_epi16(pk.w[gs * s + g], bcast4(y.add(4 * g)));
                        for h in 1..chain {
                            acc = _mm256_add_epi16(acc, _mm256_maddubs_epi16(pk.w[gs * s + g + h], bcast4(y.add(4 * (g + h)))));
                        }
                        *is = _mm256_add_epi32(*is, _mm256_madd_epi16(acc, scv));
                        g += chain;
                    }
                }
            }
        }
        // SAFETY: token j's block i exists (the caller's contract).
        unsafe { finish8::<F, M>(pk, i, a, astride, &isum, sumf) };
    }
}

/// The float step of super-block `i` for `M` tokens: the bsum correction of `pk`'s
/// scales and `sumf[j]` += d·(integer sums `isum[j]`) per lane, unfused, as the
/// single-row kernel.
///
/// # Safety
/// AVX2 enabled in the caller; token j's block i at `a + j·astride + i·Q8_K_BYTES`.
#[inline(always)]
pub(super) unsafe fn finish8<const F: u8, const M: usize>(
    pk: &Packed8,
    i: usize,
    a: *const u8,
    astride: usize,
    isum: &[__m256i; M],
    sumf: &mut [__m256; M],
) {
    for (j, sf) in sumf.iter_mut().enumerate() {
        // SAFETY (this block): token j's block i: d @0, bsums 32 bytes @260.
        unsafe {
            let y = a.add(j * astride + i * Q8_K_BYTES);
            let yd = _mm256_set1_ps((y as *const f32).read_unaligned());
            let c = if F == IQ4XS { _mm256_setzero_si256() } else { corr8(pk, &bsums8(y)) };
            *sf = _mm256_add_ps(*sf, term8::<F>(pk, isum[j], c, yd));
        }
    }
}

/// The 8 bsum pairs of the Q8_K block at `y`, each broadcast.
///
/// # Safety
/// AVX2 enabled in the caller; a Q8_K block at `y`.
#[inline(always)]
pub(super) unsafe fn bsums8(y: *const u8) -> [__m256i; 8] {
    let mut bs = [_mm256_setzero_si256(); 8];
    for (p, b) in bs.iter_mut().enumerate() {
        // SAFETY: the bsums are 32 bytes @260 of the block (the caller's contract).
        *b = unsafe { bcast4(y.add(Q8_K_BSUMS + 4 * p)) };
    }
    bs
}

/// The bsum correction of `pk` for one token (`bs`: its [`bsums8`]), per lane.
///
/// # Safety
/// AVX2 enabled in the caller.
#[inline(always)]
pub(super) unsafe fn corr8(pk: &Packed8, bs: &[__m256i; 8]) -> __m256i {
    let mut c = _mm256_setzero_si256();
    for (cp, b) in pk.corr.iter().zip(bs) {
        c = _mm256_add_epi32(c, _mm256_madd_epi16(*cp, *b));
    }
    c
}

/// One super-block's float term for one token (`is`: the integer sums, `c`: the bsum
/// correction, `yd`: the token's scale), unfused, as the single-row kernel.
///
/// # Safety
/// AVX2 enabled in the caller.
#[inline(always)]
pub(super) unsafe fn term8<const F: u8>(pk: &Packed8, is: __m256i, c: __m256i, yd: __m256) -> __m256 {
    if F == IQ4XS {
        // (dw·yd)·is: no mins
        _mm256_mul_ps(_mm256_mul_ps(pk.d, yd), _mm256_cvtepi32_ps(is))
    } else if F == Q6K {
        // dw·yd·(is − 32·off)
        let t = _mm256_sub_epi32(is, _mm256_slli_epi32::<5>(c));
        _mm256_mul_ps(_mm256_mul_ps(pk.d, yd), _mm256_cvtepi32_ps(t))
    } else {
        // (dw·yd)·is − (dmw·yd)·summ
        let dd = _mm256_mul_ps(pk.d, yd);
        let dmin = _mm256_mul_ps(pk.dm, yd);
        _mm256_sub_ps(_mm256_mul_ps(dd, _mm256_cvtepi32_ps(is)), _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(c)))
    }
}

/// Most tokens the block-wise order takes (its float sums live on the stack): past 32 it
/// measured no faster than packing all blocks first (docs/perf.md "Session 26").
const BLOCKWISE_MAX: usize = 32;

/// Tokens up to which [`run`] packs each super-block right before all the token tiles'
/// products (knob `KNOB_PACK8_BLOCKWISE_UPTO`; at most `BLOCKWISE_MAX`).
#[inline(always)]
fn blockwise_upto() -> usize {
    use super::x86_block::{knob, KNOB_PACK8_BLOCKWISE_UPTO};
    knob(KNOB_PACK8_BLOCKWISE_UPTO, BLOCKWISE_MAX).min(BLOCKWISE_MAX)
}

/// Scratch of [`group8`]: the packed super-blocks.
#[derive(Default)]
pub struct Scratch8 {
    pks: Vec<Packed8>,
}

/// Rows `0..nr` (1 ≤ nr ≤ 8) of `w` (stride `ws`, `nb` super-blocks each) against `m`
/// tokens: `out[r·ostride + j]`; `next` (pointer, bytes): the weights to prefetch
/// meanwhile (a share per super-block packed, so the loads stay in flight).
///
/// # Safety
/// AVX2 + FMA + F16C available; `nr` rows of `nb` blocks at `w`, `m` tokens of `nb` Q8_K
/// blocks at `a + j·astride`, `out` holds `(nr−1)·ostride + m` floats.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn group8(
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
    sc: &mut Scratch8,
    next: Option<(*const u8, usize)>,
) {
    let o = Out::rows(out, ostride);
    // SAFETY (whole body): the caller's contract.
    unsafe {
        match kind {
            Q6K => run::<Q6K, _>(nb, nr, Rows8 { xb: w, ws, nr }, a, astride, m, o, sc, next),
            Q5K => run::<Q5K, _>(nb, nr, Rows8 { xb: w, ws, nr }, a, astride, m, o, sc, next),
            IQ4XS => run::<IQ4XS, _>(nb, nr, Rows8 { xb: w, ws, nr }, a, astride, m, o, sc, next),
            _ => run::<Q4K, _>(nb, nr, Rows8 { xb: w, ws, nr }, a, astride, m, o, sc, next),
        }
    }
}

/// `group8` for format `F`, the rows' blocks from `src` (block 0; plain rows or the
/// 8-row layout).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) unsafe fn run<const F: u8, S: Src8>(
    nb: usize,
    nr: usize,
    src: S,
    a: *const u8,
    astride: usize,
    m: usize,
    out: Out,
    sc: &mut Scratch8,
    next: Option<(*const u8, usize)>,
) {
    use super::x86::prefetch_share;
    // SAFETY: an all-zero bit pattern is a valid Packed8.
    let zero: Packed8 = unsafe { std::mem::zeroed() };
    // Up to `blockwise_upto` tokens: each super-block dotted with every token tile right
    // after it is packed (in L1); more: all blocks packed first, then every tile runs
    // over them.
    if m > MAX_TILE && m <= blockwise_upto() {
        sc.pks.resize(1, zero);
        let mut o = [_mm256_setzero_ps(); BLOCKWISE_MAX];
        for i in 0..nb {
            prefetch_share::<false>(next, nb, i);
            // SAFETY: the caller guarantees 8 rows of nb blocks at w.
            unsafe { pack8::<F, S>(src.block::<F>(i), &mut sc.pks[0]) };
            let mut t0 = 0;
            while t0 < m {
                let mt = MAX_TILE.min(m - t0);
                // SAFETY: tokens t0..t0+mt are inside the activations (caller).
                let at = unsafe { a.add(t0 * astride) };
                macro_rules! go {
                    ($mm:literal) => {{
                        let os: &mut [__m256; $mm] = (&mut o[t0..t0 + $mm]).try_into().expect("tile");
                        // SAFETY: block i of every row and token exists (caller).
                        unsafe { dot8::<F, $mm>(&sc.pks[..1], i, at, astride, os) };
                    }};
                }
                tokens_upto8!(mt, go);
                t0 += mt;
            }
        }
        for (j, v) in o.iter().enumerate().take(m) {
            // SAFETY: AVX2 enabled in every caller.
            unsafe { store_rows8(*v, nr, out, j) };
        }
        return;
    }
    // One token tile: each super-block dotted right after it is packed, the tile's sums
    // in a local array (registers); more than `blockwise_upto`: all blocks packed first.
    let one_tile = m <= MAX_TILE;
    sc.pks.resize(if one_tile { 1 } else { nb }, zero);
    if !one_tile {
        for i in 0..nb {
            prefetch_share::<false>(next, nb, i);
            // SAFETY: the caller guarantees 8 rows of nb blocks at w.
            unsafe { pack8::<F, S>(src.block::<F>(i), &mut sc.pks[i]) };
        }
    }
    let mut t0 = 0;
    while t0 < m {
        let mt = MAX_TILE.min(m - t0);
        // SAFETY: tokens t0..t0+mt are inside the activations (caller).
        let at = unsafe { a.add(t0 * astride) };
        macro_rules! go {
            ($mm:literal) => {{
                let mut o = [_mm256_setzero_ps(); $mm];
                if one_tile {
                    for i in 0..nb {
                        prefetch_share::<false>(next, nb, i);
                        // SAFETY: as above; block i of every row and token exists.
                        unsafe {
                            pack8::<F, S>(src.block::<F>(i), &mut sc.pks[0]);
                            dot8::<F, $mm>(&sc.pks[..1], i, at, astride, &mut o);
                        }
                    }
                } else {
                    // SAFETY: as above.
                    unsafe { dot8::<F, $mm>(&sc.pks, 0, at, astride, &mut o) };
                }
                for (j, v) in o.iter().enumerate() {
                    // SAFETY: AVX2 enabled in every caller.
                    unsafe { store_rows8(*v, nr, out, t0 + j) };
                }
            }};
        }
        tokens_upto8!(mt, go);
        t0 += mt;
    }
}
