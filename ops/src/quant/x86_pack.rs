//! Packed 8-row kernels for Q4_K and Q6_K (AVX-512 VNNI, prefill): a group of 8 weight
//! rows is decoded once into u8 values interleaved 4 elements × 8 rows per vector, so
//! one `vpdpbusd` with a broadcast of 4 activation bytes gives 32 products of 8 rows at
//! once; the sub-block scales are applied per 8 rows with one `vpmulld`. The decoded
//! group is reused for every token of the batch.
//!
//! Bitwise contract: each (row, token) gets exactly the single-row kernel's value. The
//! integer sums of a super-block are exact (`is`, and the min / offset correction from
//! the activation `bsums`), and the float step per super-block is the same formula, in
//! 8 lanes (one per row) of plain, unfused multiplies and adds.

use super::k_quants::{Q4_K_BYTES, Q6_K_BYTES};
use super::q8::{Q8_K_BSUMS, Q8_K_BYTES, Q8_K_QS};
use super::x86_tile::{scales_mins_k4, MAX_TILE};
use std::arch::x86_64::*;

/// One super-block of 8 rows, decoded.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub struct Packed {
    /// Element groups: vector `8·cb + g` holds elements 32·cb + 4g .. +4 of the 8 rows.
    pub(super) w: [__m256i; 64],
    /// Sub-block scales per row (8 used by Q4_K, 16 by Q6_K).
    pub(super) sc: [__m256i; 16],
    /// i16 pairs multiplied with the activation bsum pairs: Q4_K (m_s, m_s), Q6_K
    /// (sc_2p, sc_2p+1).
    pub(super) corr: [__m256i; 8],
    pub(super) d: __m256,
    pub(super) dm: __m256,
}

#[inline(always)]
unsafe fn ld(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 32 readable bytes at `p`.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

#[inline(always)]
unsafe fn f16(p: *const u8) -> f32 {
    // SAFETY: the caller guarantees 2 readable bytes at `p`.
    let bits = unsafe { (p as *const u16).read_unaligned() };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

#[inline(always)]
unsafe fn bcast4(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 4 readable bytes at `p`.
    _mm256_set1_epi32(unsafe { (p as *const i32).read_unaligned() })
}

/// 8×8 transpose of 32-bit elements.
#[inline(always)]
unsafe fn transpose8(r: [__m256i; 8]) -> [__m256i; 8] {
    let t: [__m256i; 8] = core::array::from_fn(|i| {
        let (a, b) = (r[2 * (i / 2)], r[2 * (i / 2) + 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_epi32(a, b)
        } else {
            _mm256_unpackhi_epi32(a, b)
        }
    });
    // t0 = lo(r0,r1) t1 = hi(r0,r1) t2 = lo(r2,r3) t3 = hi(r2,r3), t4..t7 likewise
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
    [
        _mm256_permute2x128_si256(u[0], u[4], 0x20),
        _mm256_permute2x128_si256(u[1], u[5], 0x20),
        _mm256_permute2x128_si256(u[2], u[6], 0x20),
        _mm256_permute2x128_si256(u[3], u[7], 0x20),
        _mm256_permute2x128_si256(u[0], u[4], 0x31),
        _mm256_permute2x128_si256(u[1], u[5], 0x31),
        _mm256_permute2x128_si256(u[2], u[6], 0x31),
        _mm256_permute2x128_si256(u[3], u[7], 0x31),
    ]
}

#[inline(always)]
unsafe fn load_i32x8(v: &[i32; 8]) -> __m256i {
    // SAFETY: 32 readable bytes.
    unsafe { _mm256_loadu_si256(v.as_ptr() as *const __m256i) }
}

/// Decodes super-block `i` of the 8 rows at `w` (row stride `ws`) into `pk`.
/// `SIX`: Q6_K, else Q4_K.
#[inline(always)]
pub unsafe fn pack<const SIX: bool>(w: *const u8, ws: usize, i: usize, pk: &mut Packed) {
    let mut vals = [[0u8; 256]; 8];
    let mut sc = [[0i32; 8]; 16];
    let mut corr = [[0i32; 8]; 8];
    let (mut d, mut dm) = ([0f32; 8], [0f32; 8]);
    let m4 = _mm256_set1_epi8(0x0f);
    for r in 0..8 {
        // SAFETY (this block): row r's super-block i is a whole block at x (checked by
        // the caller: 8 rows of nb blocks); `vals[r]` is 256 writable bytes.
        unsafe {
            let vp = vals[r].as_mut_ptr() as *mut __m256i;
            if SIX {
                let x = w.add(r * ws + i * Q6_K_BYTES);
                let m2 = _mm256_set1_epi8(3);
                for half in 0..2 {
                    let q0 = ld(x.add(64 * half));
                    let q1 = ld(x.add(64 * half + 32));
                    let qh = ld(x.add(128 + 32 * half));
                    let low = [
                        _mm256_and_si256(q0, m4),
                        _mm256_and_si256(q1, m4),
                        _mm256_and_si256(_mm256_srli_epi16(q0, 4), m4),
                        _mm256_and_si256(_mm256_srli_epi16(q1, 4), m4),
                    ];
                    let high = [
                        _mm256_and_si256(qh, m2),
                        _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2),
                        _mm256_and_si256(_mm256_srli_epi16(qh, 4), m2),
                        _mm256_and_si256(_mm256_srli_epi16(qh, 6), m2),
                    ];
                    for (k, &h) in high.iter().enumerate() {
                        let q = _mm256_or_si256(low[k], _mm256_slli_epi16(h, 4));
                        _mm256_storeu_si256(vp.add(4 * half + k), q);
                    }
                }
                for g in 0..16 {
                    sc[g][r] = *x.add(192 + g) as i8 as i32;
                }
                for p in 0..8 {
                    let (a, b) = (sc[2 * p][r] as i16 as u16 as u32, sc[2 * p + 1][r] as i16 as u16 as u32);
                    corr[p][r] = (a | (b << 16)) as i32;
                }
                d[r] = f16(x.add(208));
            } else {
                let x = w.add(r * ws + i * Q4_K_BYTES);
                for c in 0..4 {
                    let q = ld(x.add(16 + 32 * c));
                    _mm256_storeu_si256(vp.add(2 * c), _mm256_and_si256(q, m4));
                    _mm256_storeu_si256(vp.add(2 * c + 1), _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
                }
                let (s8, m8) = scales_mins_k4(x.add(4));
                for s in 0..8 {
                    sc[s][r] = s8[s] as i32;
                    corr[s][r] = (m8[s] as u32 | ((m8[s] as u32) << 16)) as i32;
                }
                d[r] = f16(x);
                dm[r] = f16(x.add(2));
            }
        }
    }
    for cb in 0..8 {
        // SAFETY: each `vals[r]` holds 256 bytes; 32·cb + 32 <= 256.
        let rows: [__m256i; 8] = core::array::from_fn(|r| unsafe { ld(vals[r].as_ptr().add(32 * cb)) });
        // SAFETY: AVX2 enabled in every caller.
        let t = unsafe { transpose8(rows) };
        pk.w[8 * cb..8 * cb + 8].copy_from_slice(&t);
    }
    for s in 0..16 {
        // SAFETY: 8 i32.
        pk.sc[s] = unsafe { load_i32x8(&sc[s]) };
    }
    for p in 0..8 {
        // SAFETY: 8 i32.
        pk.corr[p] = unsafe { load_i32x8(&corr[p]) };
    }
    // SAFETY: 8 f32 each.
    unsafe {
        pk.d = _mm256_loadu_ps(d.as_ptr());
        pk.dm = _mm256_loadu_ps(dm.as_ptr());
    }
}

/// `M` tokens (activations at `a + j·astride`) against `nb` packed super-blocks:
/// `out[j]` = the 8 rows' dot products (lane r = row r).
#[inline(always)]
pub unsafe fn dot_packed<const SIX: bool, const M: usize>(
    pks: &[Packed],
    a: *const u8,
    astride: usize,
    out: &mut [__m256; M],
) {
    let mut sumf = [_mm256_setzero_ps(); M];
    for (i, pk) in pks.iter().enumerate() {
        let mut isum = [_mm256_setzero_si256(); M];
        let (ns, gs) = if SIX { (16, 4) } else { (8, 8) };
        for s in 0..ns {
            let scv = pk.sc[s];
            for (j, is) in isum.iter_mut().enumerate() {
                // SAFETY (this block): token j's block i is Q8_K_BYTES at y; the qs
                // bytes read are 4 + (s·gs + g)·4 + 4 <= 260.
                unsafe {
                    let y = a.add(j * astride + i * Q8_K_BYTES + Q8_K_QS + 4 * gs * s);
                    let mut acc = _mm256_setzero_si256();
                    for g in 0..gs {
                        acc = _mm256_dpbusd_epi32(acc, pk.w[gs * s + g], bcast4(y.add(4 * g)));
                    }
                    *is = _mm256_add_epi32(*is, _mm256_mullo_epi32(acc, scv));
                }
            }
        }
        for (j, sf) in sumf.iter_mut().enumerate() {
            // SAFETY (this block): token j's block i: d @0, bsums 32 bytes @260.
            unsafe {
                let y = a.add(j * astride + i * Q8_K_BYTES);
                let mut c = _mm256_setzero_si256();
                for p in 0..8 {
                    c = _mm256_dpwssd_epi32(c, pk.corr[p], bcast4(y.add(Q8_K_BSUMS + 4 * p)));
                }
                let yd = _mm256_set1_ps((y as *const f32).read_unaligned());
                let term = if SIX {
                    // dw·yd·(is − 32·off)
                    let t = _mm256_sub_epi32(isum[j], _mm256_slli_epi32(c, 5));
                    _mm256_mul_ps(_mm256_mul_ps(pk.d, yd), _mm256_cvtepi32_ps(t))
                } else {
                    // (dw·yd)·is − (dmw·yd)·summ
                    let dd = _mm256_mul_ps(pk.d, yd);
                    let dmin = _mm256_mul_ps(pk.dm, yd);
                    _mm256_sub_ps(
                        _mm256_mul_ps(dd, _mm256_cvtepi32_ps(isum[j])),
                        _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(c)),
                    )
                };
                *sf = _mm256_add_ps(*sf, term);
            }
        }
    }
    *out = sumf;
}

/// Rows `0..8` of `w` (stride `ws`, `nb` super-blocks each) against `m` tokens:
/// `out[r·ostride + j]`. Uses (and grows) `buf` for the packed rows.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn group8<const SIX: bool>(
    nb: usize,
    w: *const u8,
    ws: usize,
    a: *const u8,
    astride: usize,
    m: usize,
    out: &mut [f32],
    ostride: usize,
    buf: &mut Vec<Packed>,
    next: Option<(*const u8, usize)>,
) {
    // SAFETY: an all-zero bit pattern is a valid Packed (integers and floats).
    let zero: Packed = unsafe { std::mem::zeroed() };
    buf.resize(nb, zero);
    for (i, pk) in buf.iter_mut().enumerate() {
        // SAFETY: the caller guarantees 8 rows of nb blocks at w.
        unsafe { pack::<SIX>(w, ws, i, pk) };
    }
    // Start loading the next rows (`len` bytes at `p`) while this group computes.
    if let Some((p, len)) = next {
        for off in (0..len).step_by(64) {
            // SAFETY: a prefetch never faults; the caller passes bytes of the weights.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(off) as *const i8) };
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
                // SAFETY: as above.
                unsafe { dot_packed::<SIX, $mm>(buf, at, astride, &mut o) };
                for (j, v) in o.iter().enumerate() {
                    let mut l = [0f32; 8];
                    // SAFETY: 8 writable floats.
                    unsafe { _mm256_storeu_ps(l.as_mut_ptr(), *v) };
                    for (r, &x) in l.iter().enumerate() {
                        out[r * ostride + t0 + j] = x;
                    }
                }
            }};
        }
        match mt {
            1 => go!(1),
            2 => go!(2),
            3 => go!(3),
            4 => go!(4),
            5 => go!(5),
            6 => go!(6),
            7 => go!(7),
            _ => go!(8),
        }
        t0 += mt;
    }
}
