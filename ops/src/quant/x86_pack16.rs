//! 16-row packed kernels for Q4_K and Q6_K (AVX-512 VNNI, prefill): two 8-row groups of
//! `x86_pack` side by side in 512-bit vectors, so each `vpdpbusd` (one broadcast of 4
//! activation bytes) gives 64 products of 16 rows and the scale, correction and float
//! steps run once per 16 rows: about half the instructions per product of the 8-row
//! kernel. Every lane does exactly what the 8-row kernel's lane does (exact integer
//! sums, the same unfused float step), so results are bitwise equal to it and to the
//! single-row kernel.

use super::q8::{Q8_K_BSUMS, Q8_K_BYTES, Q8_K_QS};
use super::x86_pack::{pack, Packed};
use super::x86_tile::MAX_TILE;
use std::arch::x86_64::*;

/// One super-block of 16 rows, decoded (rows 0..8 in the low 256 bits of each vector).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Packed16 {
    w: [__m512i; 64],
    sc: [__m512i; 16],
    corr: [__m512i; 8],
    d: __m512,
    dm: __m512,
}

#[inline(always)]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

#[inline(always)]
unsafe fn bcast4(p: *const u8) -> __m512i {
    // SAFETY: the caller guarantees 4 readable bytes at `p`.
    _mm512_set1_epi32(unsafe { (p as *const i32).read_unaligned() })
}

/// Decodes super-block `i` of the 16 rows at `w` (row stride `ws`) into `pk`.
#[inline(always)]
unsafe fn pack16<const SIX: bool>(w: *const u8, ws: usize, i: usize, halves: &mut [Packed; 2], pk: &mut Packed16) {
    // SAFETY: the caller guarantees 16 rows of whole blocks at w.
    unsafe {
        pack::<SIX>(w, ws, i, &mut halves[0]);
        pack::<SIX>(w.add(8 * ws), ws, i, &mut halves[1]);
    }
    let [a, b] = &*halves;
    for k in 0..64 {
        // SAFETY: AVX-512 enabled in every caller.
        pk.w[k] = unsafe { join(a.w[k], b.w[k]) };
    }
    for s in 0..16 {
        // SAFETY: as above.
        pk.sc[s] = unsafe { join(a.sc[s], b.sc[s]) };
    }
    for p in 0..8 {
        // SAFETY: as above.
        pk.corr[p] = unsafe { join(a.corr[p], b.corr[p]) };
    }
    // SAFETY: as above.
    unsafe {
        pk.d = _mm512_castsi512_ps(join(_mm256_castps_si256(a.d), _mm256_castps_si256(b.d)));
        pk.dm = _mm512_castsi512_ps(join(_mm256_castps_si256(a.dm), _mm256_castps_si256(b.dm)));
    }
}

/// `M` tokens (activations at `a + j·astride`) against `nb` packed super-blocks:
/// `out[j]` = the 16 rows' dot products (lane r = row r); the 8-row kernel's steps.
#[inline(always)]
unsafe fn dot16<const SIX: bool, const M: usize>(pks: &[Packed16], a: *const u8, astride: usize, out: &mut [__m512; M]) {
    let mut sumf = [_mm512_setzero_ps(); M];
    for (i, pk) in pks.iter().enumerate() {
        let mut isum = [_mm512_setzero_si512(); M];
        let (ns, gs) = if SIX { (16, 4) } else { (8, 8) };
        for s in 0..ns {
            let scv = pk.sc[s];
            for (j, is) in isum.iter_mut().enumerate() {
                // SAFETY (this block): token j's block i is Q8_K_BYTES at y; the qs
                // bytes read are 4 + (s·gs + g)·4 + 4 <= 260.
                unsafe {
                    let y = a.add(j * astride + i * Q8_K_BYTES + Q8_K_QS + 4 * gs * s);
                    let mut acc = _mm512_setzero_si512();
                    for g in 0..gs {
                        acc = _mm512_dpbusd_epi32(acc, pk.w[gs * s + g], bcast4(y.add(4 * g)));
                    }
                    *is = _mm512_add_epi32(*is, _mm512_mullo_epi32(acc, scv));
                }
            }
        }
        for (j, sf) in sumf.iter_mut().enumerate() {
            // SAFETY (this block): token j's block i: d @0, bsums 32 bytes @260.
            unsafe {
                let y = a.add(j * astride + i * Q8_K_BYTES);
                let mut c = _mm512_setzero_si512();
                for p in 0..8 {
                    c = _mm512_dpwssd_epi32(c, pk.corr[p], bcast4(y.add(Q8_K_BSUMS + 4 * p)));
                }
                let yd = _mm512_set1_ps((y as *const f32).read_unaligned());
                let term = if SIX {
                    // dw·yd·(is − 32·off)
                    let t = _mm512_sub_epi32(isum[j], _mm512_slli_epi32::<5>(c));
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
    *out = sumf;
}

/// Scratch of [`group16`]: the packed super-blocks and the two 8-row halves.
pub struct Scratch16 {
    pks: Vec<Packed16>,
    halves: [Packed; 2],
}

impl Default for Scratch16 {
    fn default() -> Scratch16 {
        // SAFETY: an all-zero bit pattern is a valid Packed (integers and floats).
        let zero: Packed = unsafe { std::mem::zeroed() };
        Scratch16 { pks: Vec::new(), halves: [zero, zero] }
    }
}

/// Rows `0..16` of `w` (stride `ws`, `nb` super-blocks each) against `m` tokens:
/// `out[r·ostride + j]`; `next` (pointer, bytes): the weights to prefetch meanwhile.
///
/// # Safety
/// AVX-512 F/BW/VL + VNNI and AVX2 available; 16 rows of `nb` blocks at `w`, `m` tokens
/// of `nb` Q8_K blocks at `a + j·astride`, `out` holds `15·ostride + m` floats.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn group16(
    six: bool,
    nb: usize,
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
    // SAFETY (whole body): the caller's contract.
    unsafe {
        if six {
            run::<true>(nb, w, ws, a, astride, m, out, ostride, sc, next)
        } else {
            run::<false>(nb, w, ws, a, astride, m, out, ostride, sc, next)
        }
    }
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn run<const SIX: bool>(
    nb: usize,
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
    // SAFETY: an all-zero bit pattern is a valid Packed16.
    let zero: Packed16 = unsafe { std::mem::zeroed() };
    sc.pks.resize(nb, zero);
    for i in 0..nb {
        // SAFETY: the caller guarantees 16 rows of nb blocks at w.
        unsafe { pack16::<SIX>(w, ws, i, &mut sc.halves, &mut sc.pks[i]) };
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
                let mut o = [_mm512_setzero_ps(); $mm];
                // SAFETY: as above.
                unsafe { dot16::<SIX, $mm>(&sc.pks, at, astride, &mut o) };
                for (j, v) in o.iter().enumerate() {
                    let mut l = [0f32; 16];
                    // SAFETY: 16 writable floats.
                    unsafe { _mm512_storeu_ps(l.as_mut_ptr(), *v) };
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
