//! 16-row packed kernel for the 32-element formats paired with Q8_0 activations (Q8_0,
//! Q4_0, IQ4_NL, MXFP4; AVX-512 VNNI, prefill).
//!
//! Each 32-weight block of 16 rows is stored as u8 (`w + 128`, w the block's signed
//! integers as `x86_tile::tile_32` gets them) interleaved 4 weights ×
//! 16 rows per vector, so one `vpdpbusd` with a broadcast of 4 activation bytes gives
//! the 4-weight partial sums of 16 rows; starting it from `−128 · Σ those 4 activations`
//! removes the offset, leaving exactly the integer each lane of the tile kernel computes.
//!
//! Bitwise contract (`x86_tile::tile_32`, ggml's AVX2 form): per block the 8 partial
//! sums of 4 products are converted to f32 and fused-multiply-added, scaled by
//! `d_w · d_a`, into the even- or odd-block accumulator of their lane; at the end the
//! two accumulators are added and the 8 lanes summed as `x86::hsum_ps` does. Here the
//! lanes are rows and those 8 partial-sum positions are 8 vectors: the same operations
//! in the same order for every (row, token).

use super::iq4::{IQ4_NL_BYTES, KVALUES_IQ4NL};
use super::legacy::Q4_0_BYTES;
use super::mxfp4::{e8m0_to_f32_half, KVALUES_MXFP4, MXFP4_BYTES};
use super::q8::Q8_0_BYTES;
use super::x86_pack16::{bcast4, join, transpose16x8};
use super::x86_tile::{f16, nibbles32, table16};

/// The weight formats of [`group16_q8`] (`const F`).
pub const Q8_0: u8 = 0;
pub const Q4_0: u8 = 1;
pub const IQ4NL: u8 = 2;
pub const MXFP4: u8 = 3;

/// Bytes of one block of format `F`.
const fn block_bytes(f: u8) -> usize {
    match f {
        Q4_0 => Q4_0_BYTES,
        IQ4NL => IQ4_NL_BYTES,
        MXFP4 => MXFP4_BYTES,
        _ => Q8_0_BYTES,
    }
}

/// The 32 signed weight integers of block `x` (as `x86_tile::tile_32`'s `ints`).
#[inline(always)]
unsafe fn ints<const F: u8>(x: *const u8) -> __m256i {
    // SAFETY (whole body): x is a whole block of format F.
    unsafe {
        match F {
            Q4_0 => _mm256_sub_epi8(nibbles32(x.add(2)), _mm256_set1_epi8(8)),
            IQ4NL => _mm256_shuffle_epi8(table16(&KVALUES_IQ4NL), nibbles32(x.add(2))),
            MXFP4 => _mm256_shuffle_epi8(table16(&KVALUES_MXFP4), nibbles32(x.add(1))),
            _ => _mm256_loadu_si256(x.add(2) as *const __m256i),
        }
    }
}

/// The block's float scale (`tile_32`'s `dw`).
#[inline(always)]
unsafe fn dw<const F: u8>(x: *const u8) -> f32 {
    // SAFETY: x is a whole block of format F.
    unsafe {
        if F == MXFP4 {
            e8m0_to_f32_half(*x)
        } else {
            f16(x)
        }
    }
}
use std::arch::x86_64::*;

/// One packed block `pk` against one token's block `y` (corrections `corr[0..8]`):
/// `acc[l] += d_w·d_a · (the 4-weight partial sums l of the 16 rows)`.
#[inline(always)]
unsafe fn block_step(pk: &PackedQ8, corr: *const i32, y: *const u8, acc: &mut [__m512; 8]) {
    // SAFETY (whole body): y is a whole Q8_0 block, corr holds 8 i32; the caller's
    // target features (inlined into `run`).
    unsafe {
        let dv = _mm512_mul_ps(pk.d, _mm512_set1_ps(f16(y)));
        for (l, al) in acc.iter_mut().enumerate() {
            let init = _mm512_set1_epi32(*corr.add(l));
            let s = _mm512_dpbusd_epi32(init, pk.w[l], bcast4(y.add(2 + 4 * l)));
            *al = _mm512_fmadd_ps(dv, _mm512_cvtepi32_ps(s), *al);
        }
    }
}

/// One block of 16 rows: `w[g]` lane r = weights 4g..4g+4 of row r (+128), `d` = d_w.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct PackedQ8 {
    w: [__m512i; 8],
    d: __m512,
}

/// Scratch of [`group16_q8`]: the packed blocks and every token's offset corrections
/// (`corr[8·nb·j + 8·i + l]`, token j, block i, 4-activation group l).
#[derive(Default)]
pub struct ScratchQ8 {
    pks: Vec<PackedQ8>,
    corr: Vec<i32>,
}

/// The offset corrections of `m` Q8_0 activation rows (`nb` blocks each, at
/// `a + j·astride`) into `sc`: `−128 · (sum of each 4 activations)`, which removes the
/// +128 of the u8 weights. Computed once per call of the row-group loop, shared by
/// every 16-row group.
///
/// # Safety
/// AVX2 + AVX-512 VL/VNNI available; `m` activation rows of `nb` blocks at `a`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn corrections(nb: usize, a: *const u8, astride: usize, m: usize, sc: &mut ScratchQ8) {
    sc.corr.resize(8 * nb * m, 0);
    // SAFETY (whole body): the caller's contract; corr holds 8·nb·m i32.
    unsafe {
        let ones = _mm256_set1_epi8(1);
        for j in 0..m {
            let y0 = a.add(j * astride);
            let c0 = sc.corr.as_mut_ptr().add(8 * nb * j);
            for i in 0..nb {
                let q = _mm256_loadu_si256(y0.add(i * Q8_0_BYTES + 2) as *const __m256i);
                let s4 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q);
                let c = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<7>(s4));
                _mm256_storeu_si256(c0.add(8 * i) as *mut __m256i, c);
            }
        }
    }
}

/// Rows `0..nr` (1 ≤ nr ≤ 16) of `kind` weights `w` (stride `ws`, `nb` blocks each)
/// against `m` Q8_0 activation rows at `a + j·astride`: `out[r·ostride + j]`.
///
/// # Safety
/// AVX-512 F/BW/VL + VNNI and AVX2 available; `nr` rows of `nb` blocks at `w`, `m`
/// activation rows of `nb` blocks, `out` holds `(nr−1)·ostride + m` floats; `sc` holds
/// [`corrections`] of these `m` activation rows; `next` (pointer, bytes): weights to
/// prefetch meanwhile (the next row group).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn group16_q8(
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
    sc: &mut ScratchQ8,
    next: Option<(*const u8, usize)>,
) {
    // SAFETY: the caller's contract.
    unsafe {
        match kind {
            Q4_0 => run::<Q4_0>(nb, nr, w, ws, a, astride, m, out, ostride, sc, next),
            IQ4NL => run::<IQ4NL>(nb, nr, w, ws, a, astride, m, out, ostride, sc, next),
            MXFP4 => run::<MXFP4>(nb, nr, w, ws, a, astride, m, out, ostride, sc, next),
            _ => run::<Q8_0>(nb, nr, w, ws, a, astride, m, out, ostride, sc, next),
        }
    }
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn run<const F: u8>(
    nb: usize,
    nr: usize,
    w: *const u8,
    ws: usize,
    a: *const u8,
    astride: usize,
    m: usize,
    out: &mut [f32],
    ostride: usize,
    sc: &mut ScratchQ8,
    next: Option<(*const u8, usize)>,
) {
    // SAFETY: an all-zero bit pattern is a valid PackedQ8.
    let zero: PackedQ8 = unsafe { std::mem::zeroed() };
    sc.pks.resize(nb, zero);
    debug_assert!(sc.corr.len() >= 8 * nb * m, "corrections() not run for these tokens");
    // SAFETY (whole body): the caller's contract; no closures (they would not inherit
    // the target features).
    unsafe {
        let flip = _mm256_set1_epi8(-128);
        for (i, pk) in sc.pks.iter_mut().enumerate() {
            let mut z = [_mm512_setzero_si512(); 8];
            for (r, zr) in z.iter_mut().enumerate() {
                let (ra, rb) = (r.min(nr - 1), (r + 8).min(nr - 1));
                let bb = block_bytes(F);
                let qa = ints::<F>(w.add(ra * ws + i * bb));
                let qb = ints::<F>(w.add(rb * ws + i * bb));
                *zr = join(_mm256_xor_si256(qa, flip), _mm256_xor_si256(qb, flip));
            }
            pk.w = transpose16x8(z);
            let mut d = [0f32; 16];
            for (r, dr) in d.iter_mut().enumerate() {
                *dr = dw::<F>(w.add(r.min(nr - 1) * ws + i * block_bytes(F)));
            }
            pk.d = _mm512_loadu_ps(d.as_ptr());
        }
        for j in 0..m {
            let y0 = a.add(j * astride);
            // even / odd blocks' accumulators as two named arrays (a runtime parity index
            // kept them on the stack: a store-forwarding chain per block)
            let (mut ev, mut od) = ([_mm512_setzero_ps(); 8], [_mm512_setzero_ps(); 8]);
            let pks = sc.pks.as_ptr();
            let corr = sc.corr.as_ptr().add(8 * nb * j);
            // the next rows (`next`: pointer, bytes) are prefetched during the first token,
            // a share per block pair, so the loads stay in flight without a burst
            let (pf_at, pf_len) = if j == 0 { next.unwrap_or((core::ptr::null(), 0)) } else { (core::ptr::null(), 0) };
            let per_pair = pf_len.div_ceil(nb.div_ceil(2)).next_multiple_of(64);
            let mut i = 0;
            while i + 1 < nb {
                let mut off = (i / 2) * per_pair;
                while off < ((i / 2 + 1) * per_pair).min(pf_len) {
                    // SAFETY: a prefetch never faults; the caller passes bytes of the weights.
                    _mm_prefetch::<_MM_HINT_T0>(pf_at.add(off) as *const i8);
                    off += 64;
                }
                block_step(&*pks.add(i), corr.add(8 * i), y0.add(i * Q8_0_BYTES), &mut ev);
                block_step(&*pks.add(i + 1), corr.add(8 * i + 8), y0.add((i + 1) * Q8_0_BYTES), &mut od);
                i += 2;
            }
            if i < nb {
                block_step(&*pks.add(i), corr.add(8 * i), y0.add(i * Q8_0_BYTES), &mut ev);
            }
            // the tile kernel's final sum: parities added, then hsum_ps's tree over lanes
            let s: [__m512; 8] = [
                _mm512_add_ps(ev[0], od[0]),
                _mm512_add_ps(ev[1], od[1]),
                _mm512_add_ps(ev[2], od[2]),
                _mm512_add_ps(ev[3], od[3]),
                _mm512_add_ps(ev[4], od[4]),
                _mm512_add_ps(ev[5], od[5]),
                _mm512_add_ps(ev[6], od[6]),
                _mm512_add_ps(ev[7], od[7]),
            ];
            let t = [
                _mm512_add_ps(s[0], s[4]),
                _mm512_add_ps(s[1], s[5]),
                _mm512_add_ps(s[2], s[6]),
                _mm512_add_ps(s[3], s[7]),
            ];
            let res = _mm512_add_ps(_mm512_add_ps(t[0], t[2]), _mm512_add_ps(t[1], t[3]));
            super::x86_pack16::store_rows(res, nr, out, ostride, j);
        }
    }
}
