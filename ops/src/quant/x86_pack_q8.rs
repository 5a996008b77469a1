//! 16-row kernels for the 32-element formats paired with Q8_0 activations (Q8_0, Q4_0,
//! IQ4_NL, MXFP4; AVX-512 VNNI), from plain rows (packed per call) or the `rows16` layout
//! (made at load).
//!
//! A block of 16 rows is 8 vectors of u8 weights (`w + 128`), vector l lane r = weights
//! 4l..4l+4 of row r, and the 16 rows' float scales. One `vpdpbusd` with a broadcast of
//! 4 activation bytes gives 16 rows' sums of 4 products; eight of them, started from
//! `−128 · Σ the block's 32 activations`, give each row's exact block integer `sumi`.
//! Then one float step per block and token, `sumf += sumi as f32 · (d_w · d_a)` in block
//! order: the contract of `x86_tile::tile_32` and the scalar dots, lane by lane, so every
//! result is bitwise theirs.
//!
//! `rows16` layout, per 16-row group and block (the 16 plain blocks' bytes, reordered):
//! Q8_0: the 8 weight vectors (lane r = bytes 4l..4l+4 of row r's qs), then the 16 f16 d; Q4_0 /
//! IQ4_NL: 4 vectors of the qs bytes (lane r = bytes 4g..4g+4 of row r: low nibbles are
//! weights 4g.., high ones 16 + 4g..), then the 16 f16 d; MXFP4: the 4 qs vectors, then
//! the 16 e8m0 bytes.

use super::iq4::{IQ4_NL_BYTES, KVALUES_IQ4NL};
use super::legacy::Q4_0_BYTES;
use super::mxfp4::{e8m0_to_f32_half, KVALUES_MXFP4, MXFP4_BYTES};
use super::q8::Q8_0_BYTES;
use super::x86::prefetch_share;
use super::x86_pack16::{bcast4, join, store_rows, transpose16x8, Out, IQ4NL_U8};
use super::x86_tile::{f16, nibbles32, table16};
use super::x86_amx_q8::{amx_tiles, run_amx, run_amx2};
use std::arch::x86_64::*;

/// The weight formats of these kernels (`const F`; distinct from `x86_pack16`'s kinds,
/// so `x86_rows16::kind` can name both families).
pub const Q8_0: u8 = 0;
pub const Q4_0: u8 = 1;
pub const IQ4NL: u8 = 2;
pub const MXFP4: u8 = 3;

/// Bytes of one block of format `f`.
pub(crate) const fn block_bytes(f: u8) -> usize {
    match f {
        Q4_0 => Q4_0_BYTES,
        IQ4NL => IQ4_NL_BYTES,
        MXFP4 => MXFP4_BYTES,
        _ => Q8_0_BYTES,
    }
}

/// MXFP4's table plus 128, read as unsigned bytes.
const MXFP4_U8: [i8; 16] = {
    let mut t = [0i8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (KVALUES_MXFP4[i] as i16 + 128) as u8 as i8;
        i += 1;
    }
    t
};

/// The 32 signed weight integers of plain block `x` (as `x86_tile::tile_32`'s `ints`).
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

/// Plain block `x`'s float scale (`tile_32`'s `dw`).
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

/// One block of 16 rows as the kernel uses it: `w[l]` lane r = weights 4l..4l+4 of row r
/// (+128), `d` lane r = row r's scale.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct PackedQ8 {
    pub(super) w: [__m512i; 8],
    pub(super) d: __m512,
}

/// Where the kernel reads its blocks.
pub(super) trait SrcQ8: Copy {
    /// Block `i` of the 16 rows.
    unsafe fn block<const F: u8>(self, i: usize) -> PackedQ8;
    /// Block `i`'s 16 signed weight vectors as they lie in memory (an AMX B tile), where
    /// the source has them (Q8_0 in the `rows16` layout).
    fn signed_b<const F: u8>(self, _i: usize) -> Option<*const u8> {
        None
    }
    /// Block `i`'s scales (`block(i).d`).
    unsafe fn d<const F: u8>(self, i: usize) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { self.block::<F>(i).d }
    }
}

/// Blocks packed per call ([`pack`]).
#[derive(Clone, Copy)]
struct Packed(*const PackedQ8);

impl SrcQ8 for Packed {
    #[inline(always)]
    unsafe fn block<const F: u8>(self, i: usize) -> PackedQ8 {
        // SAFETY: the caller packed at least i + 1 blocks.
        unsafe { *self.0.add(i) }
    }
}

/// A 16-row group in the `rows16` layout (its block 0).
#[derive(Clone, Copy)]
struct Pre(*const u8);

impl SrcQ8 for Pre {
    #[inline(always)]
    fn signed_b<const F: u8>(self, i: usize) -> Option<*const u8> {
        (F == Q8_0).then(|| self.0.wrapping_add(i * 16 * block_bytes(F)))
    }
    #[inline(always)]
    unsafe fn d<const F: u8>(self, i: usize) -> __m512 {
        if F == Q8_0 {
            // SAFETY: a whole rows16 Q8_0 block at p (the caller's contract): d after 512 bytes.
            return unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(self.0.add(i * 16 * block_bytes(F) + 512) as *const __m256i)) };
        }
        // SAFETY: the caller's contract.
        unsafe { self.block::<F>(i).d }
    }
    #[inline(always)]
    unsafe fn block<const F: u8>(self, i: usize) -> PackedQ8 {
        // SAFETY (whole body): a whole rows16 block of 16 rows at p (the caller's contract).
        unsafe {
            let p = self.0.add(i * 16 * block_bytes(F));
            let v = |k: usize| _mm512_loadu_si512(p.add(64 * k) as *const _);
            if F == Q8_0 {
                let w = std::array::from_fn(|k| _mm512_xor_si512(v(k), _mm512_set1_epi8(-128)));
                return PackedQ8 { w, d: _mm512_cvtph_ps(_mm256_loadu_si256(p.add(512) as *const __m256i)) };
            }
            let m4 = _mm512_set1_epi8(0x0f);
            let code = |k: usize| {
                let q = v(k % 4);
                let c = if k < 4 { q } else { _mm512_srli_epi16::<4>(q) };
                let c = _mm512_and_si512(c, m4);
                match F {
                    Q4_0 => _mm512_add_epi8(c, _mm512_set1_epi8(120)),
                    IQ4NL => _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128(IQ4NL_U8.as_ptr() as *const __m128i)), c),
                    _ => _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128(MXFP4_U8.as_ptr() as *const __m128i)), c),
                }
            };
            let d = if F == MXFP4 {
                // e8m0_to_f32_half on 16 lanes: e < 2 → 0x200000 << e, else (e − 1) << 23
                let e = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(256) as *const __m128i));
                let small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
                let big = _mm512_slli_epi32::<23>(_mm512_sub_epi32(e, _mm512_set1_epi32(1)));
                let sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x0020_0000), e);
                _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, big, sub))
            } else {
                _mm512_cvtph_ps(_mm256_loadu_si256(p.add(256) as *const __m256i))
            };
            PackedQ8 { w: std::array::from_fn(code), d }
        }
    }
}

/// `nb` blocks of rows `0..nr` (row `nr − 1` again past it) of plain weights `w` (stride
/// `ws`) into `pks`.
#[inline(always)]
unsafe fn pack<const F: u8>(nb: usize, nr: usize, w: *const u8, ws: usize, pks: &mut Vec<PackedQ8>) {
    // SAFETY: an all-zero bit pattern is a valid PackedQ8.
    pks.resize(nb, unsafe { std::mem::zeroed() });
    let bb = block_bytes(F);
    // SAFETY (whole body): nr rows of nb blocks at w (the caller's contract).
    unsafe {
        let flip = _mm256_set1_epi8(-128);
        for (i, pk) in pks.iter_mut().enumerate() {
            let z = std::array::from_fn(|r| {
                let (ra, rb) = (r.min(nr - 1), (r + 8).min(nr - 1));
                let qa = ints::<F>(w.add(ra * ws + i * bb));
                let qb = ints::<F>(w.add(rb * ws + i * bb));
                join(_mm256_xor_si256(qa, flip), _mm256_xor_si256(qb, flip))
            });
            let d: [f32; 16] = std::array::from_fn(|r| dw::<F>(w.add(r.min(nr - 1) * ws + i * bb)));
            *pk = PackedQ8 { w: transpose16x8(z), d: _mm512_loadu_ps(d.as_ptr()) };
        }
    }
}

/// Per call: every token's per-block offset corrections, `corr[nb·j + i]` = `−128 · Σ`
/// the 32 activations of block i of token j (removes the weights' +128), their scales
/// `da[nb·j + i]` as f32, and the packed blocks of the plain path.
#[derive(Default)]
pub struct ScratchQ8 {
    pks: Vec<PackedQ8>,
    corr: Vec<i32>,
    da: Vec<f32>,
    /// The AMX path's A tiles: token tile t, block i at `512·(nb·t + i)`, its 16 tokens'
    /// 32 activation bytes in a row (one contiguous tile load instead of 16 strided rows).
    tiles: Vec<u8>,
}

/// The per-call values the kernels read ([`ScratchQ8`] minus the packed blocks).
#[derive(Clone, Copy)]
struct Prep<'a> {
    corr: &'a [i32],
    da: &'a [f32],
    tiles: &'a [u8],
}

/// The offset corrections of `m` Q8_0 activation rows (`nb` blocks each, at
/// `a + j·astride`), their scales and the AMX path's A tiles into `sc`, once per call
/// (every 16-row group reads them). `direct`: the weights are Q8_0 `rows16` blocks (their
/// AMX tiles need no corrections).
///
/// # Safety
/// AVX2 + AVX-512 VL/VNNI available; `m` activation rows of `nb` blocks at `a`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn prepare(nb: usize, a: *const u8, astride: usize, m: usize, sc: &mut ScratchQ8, direct: bool) {
    let tiles = amx_tiles(m);
    // a padded tile's missing tokens: zero corrections and scales; `direct` (signed B
    // tiles) AMX tokens need no corrections
    let padded = m.max(16 * tiles);
    let corr_from = if direct { (16 * tiles).min(m) } else { 0 };
    sc.corr.resize(nb * padded, 0);
    sc.da.resize(nb * padded, 0.0);
    sc.corr[nb * m..].fill(0);
    sc.da[nb * m..].fill(0.0);
    sc.tiles.resize(tiles * nb * 512, 0);
    // SAFETY (whole body): the caller's contract; corr and da hold nb·padded values,
    // tiles 512·nb·tiles bytes.
    unsafe {
        let ones = _mm256_set1_epi8(1);
        for j in 0..m {
            let y0 = a.add(j * astride);
            for i in 0..nb {
                sc.da[nb * j + i] = f16(y0.add(i * Q8_0_BYTES));
            }
            if j < corr_from {
                continue;
            }
            for i in 0..nb {
                let q = _mm256_loadu_si256(y0.add(i * Q8_0_BYTES + 2) as *const __m256i);
                let s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q);
                let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
                let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
                let s = _mm_add_epi32(s, _mm_shuffle_epi32::<1>(s));
                sc.corr[nb * j + i] = -128 * _mm_cvtsi128_si32(s);
            }
        }
        for t in 0..tiles {
            for i in 0..nb {
                let dst = sc.tiles.as_mut_ptr().add(512 * (nb * t + i));
                for r in 0..16 {
                    let q = if 16 * t + r < m {
                        _mm256_loadu_si256(a.add((16 * t + r) * astride + i * Q8_0_BYTES + 2) as *const __m256i)
                    } else {
                        _mm256_setzero_si256()
                    };
                    _mm256_storeu_si256(dst.add(32 * r) as *mut __m256i, q);
                }
            }
        }
    }
}

/// Tokens a kernel pass takes (its float accumulators stay in registers).
const TOKENS: usize = 8;

/// 16 rows (`nr` stored) from `src` against `M` tokens at `a + j·astride` (corrections
/// `corr + nb·j`): row r, token j of `o`; `pf` (pointer, bytes) prefetched meanwhile, a
/// share per block.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn run<const F: u8, const M: usize, S: SrcQ8>(
    nb: usize,
    src: S,
    a: *const u8,
    astride: usize,
    corr: *const i32,
    da: *const f32,
    nr: usize,
    o: Out,
    pf: Option<(*const u8, usize)>,
) {
    let mut acc = [_mm512_setzero_ps(); M];
    // SAFETY (whole body): the caller's contract; a prefetch never faults.
    unsafe {
        for i in 0..nb {
            prefetch_share::<true>(pf, nb, i);
            let b = src.block::<F>(i);
            for (j, acc) in acc.iter_mut().enumerate() {
                let y = a.add(j * astride + i * Q8_0_BYTES);
                // two chains of 4 (integer sums: their order is free)
                let mut s0 = _mm512_set1_epi32(*corr.add(nb * j + i));
                let mut s1 = _mm512_setzero_si512();
                for l in 0..4 {
                    s0 = _mm512_dpbusd_epi32(s0, b.w[l], bcast4(y.add(2 + 4 * l)));
                    s1 = _mm512_dpbusd_epi32(s1, b.w[4 + l], bcast4(y.add(18 + 4 * l)));
                }
                let sumi = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
                *acc = _mm512_add_ps(*acc, _mm512_mul_ps(sumi, _mm512_mul_ps(b.d, _mm512_set1_ps(*da.add(nb * j + i)))));
            }
        }
        for (j, v) in acc.iter().enumerate() {
            store_rows(*v, nr, o, j);
        }
    }
}

/// [`run`] over all `m` tokens, `TOKENS` at a time (whole 16-token tiles through AMX
/// where the CPU has it); the prefetch during the first pass.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn tokens<const F: u8, S: SrcQ8>(
    nb: usize,
    src: S,
    a: *const u8,
    astride: usize,
    m: usize,
    sc: Prep<'_>,
    nr: usize,
    o: Out,
    next: Option<(*const u8, usize)>,
) {
    let Prep { corr, da, tiles: at } = sc;
    // the AMX tiles `prepare` made for these tokens (`amx_tiles(m)` of them)
    let tiles = at.len() / (512 * nb);
    debug_assert!(corr.len() >= nb * m.max(16 * tiles) && da.len() >= nb * m.max(16 * tiles), "prepare() not run for these tokens");
    if tiles > 1 && src.signed_b::<F>(0).is_some() && super::x86_block::knob(super::x86_block::KNOB_AMX_PAIRS, 1) != 0 {
        // signed B tiles straight from the source: two token tiles a pass
        // SAFETY: AMX usable (`prepare` made tiles only where `has_amx`).
        unsafe { super::x86_amx_q8::configure_pairs() };
        for t in (0..tiles * 16).step_by(32) {
            let pf = if t == 0 { next } else { None };
            let two = t + 16 < tiles * 16;
            let (t1, mt1) = if two { (t + 16, 16.min(m - t - 16)) } else { (t, 0) };
            let at2 = [at[512 * nb * (t / 16)..].as_ptr(), at[512 * nb * (t1 / 16)..].as_ptr()];
            let da2 = [da[nb * t..].as_ptr(), da[nb * t1..].as_ptr()];
            // SAFETY: the caller's contract, for tokens t..t + 32 (padded past m).
            unsafe { run_amx2::<F, S>(nb, src, at2, da2, [16.min(m - t), mt1], nr, o.at(0, t), pf) };
        }
    } else if tiles > 0 {
        // SAFETY: AMX usable (`prepare` made tiles only where `has_amx`).
        unsafe { super::x86_amx::configure(32) };
        for t in (0..tiles * 16).step_by(16) {
            let pf = if t == 0 { next } else { None };
            // SAFETY: the caller's contract, for tokens t..t + 16 (padded past m).
            unsafe { run_amx::<F, S>(nb, src, at[512 * nb * (t / 16)..].as_ptr(), corr[nb * t..].as_ptr(), da[nb * t..].as_ptr(), 16.min(m - t), nr, o.at(0, t), pf) };
        }
    }
    for t in ((tiles * 16).min(m)..m).step_by(TOKENS) {
        let (a, c, d, o, pf) = (a.wrapping_add(t * astride), corr[nb * t..].as_ptr(), da[nb * t..].as_ptr(), o.at(0, t), if t == 0 { next } else { None });
        macro_rules! go {
            ($m:literal) => {
                // SAFETY: the caller's contract, for tokens t..t + $m.
                unsafe { run::<F, $m, S>(nb, src, a, astride, c, d, nr, o, pf) }
            };
        }
        tokens_upto8!(m - t, go)
    }
}

/// Rows `0..nr` (1 ≤ nr ≤ 16) of plain `kind` weights `w` (stride `ws`, `nb` blocks
/// each) against `m` Q8_0 activation rows at `a + j·astride`: `out[r·ostride + j]`.
///
/// # Safety
/// AVX-512 F/BW/VL + VNNI and AVX2 available; `nr` rows of `nb` blocks at `w`, `m`
/// activation rows of `nb` blocks, `out` holds `(nr−1)·ostride + m` floats; `sc` holds
/// [`prepare`] of these `m` activation rows; `next` (pointer, bytes): weights to
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
    macro_rules! go {
        ($f:expr) => {
            // SAFETY: the caller's contract; `pack` fills nb blocks.
            unsafe {
                pack::<{ $f }>(nb, nr, w, ws, &mut sc.pks);
                tokens::<{ $f }, Packed>(nb, Packed(sc.pks.as_ptr()), a, astride, m, Prep { corr: &sc.corr, da: &sc.da, tiles: &sc.tiles }, nr, Out::rows(out, ostride), next)
            }
        };
    }
    match kind {
        Q4_0 => go!(Q4_0),
        IQ4NL => go!(IQ4NL),
        MXFP4 => go!(MXFP4),
        _ => go!(Q8_0),
    }
}

/// `rows` (a multiple of 16) rows of `nb` blocks of `kind` at `src` into the `rows16`
/// layout at `dst` (the same length).
///
/// # Safety
/// AVX-512 F/BW/VL available; `src` and `dst` hold `rows · nb · block_bytes(kind)` bytes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn repack(kind: u8, src: &[u8], dst: &mut [u8], rows: usize, nb: usize) {
    let bb = block_bytes(kind);
    let (ws, qs, hdr) = (nb * bb, if kind == MXFP4 { 1 } else { 2 }, if kind == Q8_0 { 512 } else { 256 });
    let mut o = 0;
    for g in (0..rows).step_by(16) {
        for i in 0..nb {
            // SAFETY (this block): 16 rows of nb blocks at group g (the caller's contract);
            // every store stays inside this block's 16·bb bytes of dst.
            unsafe {
                let row = |r: usize| src.as_ptr().add((g + r) * ws + i * bb);
                let out = dst.as_mut_ptr().add(o);
                let z: [__m512i; 8] = std::array::from_fn(|r| {
                    let (a, b) = if kind == Q8_0 {
                        let q = |r: usize| _mm256_loadu_si256(row(r).add(2) as *const __m256i);
                        (q(r), q(r + 8))
                    } else {
                        let q = |r: usize| _mm256_zextsi128_si256(_mm_loadu_si128(row(r).add(qs) as *const __m128i));
                        (q(r), q(r + 8))
                    };
                    join(a, b)
                });
                let t = transpose16x8(z);
                for (k, v) in t.iter().enumerate().take(if kind == Q8_0 { 8 } else { 4 }) {
                    _mm512_storeu_si512(out.add(64 * k) as *mut _, *v);
                }
                let sb = if kind == MXFP4 { 1 } else { 2 };
                for r in 0..16 {
                    std::ptr::copy_nonoverlapping(row(r), out.add(hdr + sb * r), sb);
                }
            }
            o += 16 * bb;
        }
    }
}

/// Row r, token j of `o` = row r of `w` (`rows` rows of `n` elements of `kind` in the
/// `rows16` layout) · token j (`m` Q8_0 rows `astride` apart at `a`): bitwise `vec_dot`.
///
/// # Safety
/// AVX-512 F/BW/VL + VNNI available; `w` holds `rows` (a multiple of 16) rows, `a` `m`
/// tokens, `o` every (row, token) (checked by `quant::rows16`).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn block(kind: u8, n: usize, w: &[u8], rows: usize, a: &[u8], astride: usize, m: usize, o: Out) {
    let nb = n / 32;
    let rb = nb * block_bytes(kind);
    super::x86_block::PACKED_Q8.with(|sc| {
        let sc = &mut *sc.borrow_mut();
        // SAFETY: m activation rows of nb blocks (the caller's contract).
        unsafe { prepare(nb, a.as_ptr(), astride, m, sc, kind == Q8_0) };
        super::x86_rows16::groups::<16>(w, rows, rb, |g, next| {
            let (src, o, c) = (Pre(w[g * rb..].as_ptr()), o.at(g, 0), Prep { corr: &sc.corr, da: &sc.da, tiles: &sc.tiles });
            macro_rules! go {
                ($f:expr) => {
                    // SAFETY: 16 rows of nb blocks at src, m tokens (the caller's contract).
                    unsafe { tokens::<{ $f }, Pre>(nb, src, a.as_ptr(), astride, m, c, 16, o, next) }
                };
            }
            match kind {
                Q4_0 => go!(Q4_0),
                IQ4NL => go!(IQ4NL),
                MXFP4 => go!(MXFP4),
                _ => go!(Q8_0),
            }
        });
    });
}
