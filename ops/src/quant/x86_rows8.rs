//! The 8-row interleaved layout of Q4_K / Q5_K / Q6_K weights for plain AVX2 (no
//! AVX-512 VNNI), and its dot kernels: the AVX2 counterpart of `x86_rows16` (Q8_0's,
//! Q4_0's, IQ4_NL's and MXFP4's layout and kernel: `x86_rows8_q8`).
//!
//! `x86_pack8` and `x86_fused8` read 8 rows' raw bytes 32 at a time and transpose them
//! (`raw8`: lane r = dword g of row r), the headers 16 bytes at a time (`dwords8`), and
//! gather the rows' f16 d / dmin one by one. From the plain rows that is redone every
//! call, for every super-block: at one token it costs more than the products. This
//! layout stores each 8-row group's super-blocks already transposed, the vectors those
//! functions return, in the order the kernels ask for them (Q4_K: the header's 4 vectors,
//! then the 4 qs chunks of 8; Q5_K: header, qh, 4 qs chunks; Q6_K: 4 ql chunks, 2 qh
//! chunks, the scale header, then the 8 rows' d). The same bytes as the plain rows in
//! another order, and the kernels load exactly the vectors they used to build, so every
//! dot stays bitwise the plain rows' (and `vec_dot`'s).
//!
//! A `rows16` copy (`quant::rows16`) on an AVX2 machine is this layout: each 16-row
//! group is two 8-row groups, one after the other.

use super::k_quants::{Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES};
use super::iq4::IQ4_XS_BYTES;
use super::x86_pack8::{dwords8, f16_lanes, raw8, IQ4XS, Q4K, Q5K, Q6K};
use super::x86_tile::ld;
use std::arch::x86_64::*;

/// Where an 8-row kernel reads super-blocks from.
pub(crate) trait Src8: Copy {
    /// Super-block `i` (self is block 0).
    unsafe fn block<const F: u8>(self, i: usize) -> Self;
    /// `raw8` of the 32 bytes at `off` of each row's block.
    unsafe fn raw<const F: u8>(self, off: usize) -> [__m256i; 8];
    /// `dwords8` of the 16 bytes at `off` of each row's block.
    unsafe fn hdr<const F: u8>(self, off: usize) -> [__m256i; 4];
    /// The f16 at `off` of each row's block as f32 lanes (Q4_K / Q5_K: d @0, dmin @2;
    /// Q6_K: d @208).
    unsafe fn halves<const F: u8>(self, off: usize) -> __m256;
}

/// Bytes of one super-block of format `F`.
pub(crate) const fn block_bytes<const F: u8>() -> usize {
    match F {
        Q6K => Q6_K_BYTES,
        Q5K => Q5_K_BYTES,
        IQ4XS => IQ4_XS_BYTES,
        _ => Q4_K_BYTES,
    }
}

/// Plain rows: `nr` rows (1..=8; past it, row `nr − 1` again) `ws` bytes apart at `xb`.
#[derive(Clone, Copy)]
pub(crate) struct Rows8 {
    pub xb: *const u8,
    pub ws: usize,
    pub nr: usize,
}

impl Src8 for Rows8 {
    #[inline(always)]
    unsafe fn block<const F: u8>(self, i: usize) -> Rows8 {
        Rows8 { xb: self.xb.wrapping_add(i * block_bytes::<F>()), ..self }
    }
    #[inline(always)]
    unsafe fn raw<const F: u8>(self, off: usize) -> [__m256i; 8] {
        // SAFETY: the caller guarantees the rows' blocks.
        unsafe { raw8(self.xb, self.ws, self.nr, off) }
    }
    #[inline(always)]
    unsafe fn hdr<const F: u8>(self, off: usize) -> [__m256i; 4] {
        // SAFETY: the caller guarantees the rows' blocks.
        unsafe { dwords8(self.xb.add(off), self.ws, self.nr) }
    }
    #[inline(always)]
    unsafe fn halves<const F: u8>(self, off: usize) -> __m256 {
        // SAFETY: the caller guarantees the rows' blocks.
        unsafe { f16_lanes(self.xb, self.ws, self.nr, off) }
    }
}

/// One 8-row group in the layout, at super-block `p`.
#[derive(Clone, Copy)]
pub(crate) struct Pre8 {
    pub p: *const u8,
}

/// The vector index in a laid-out super-block of `raw8` at `off` (format `F`).
#[inline(always)]
const fn raw_at<const F: u8>(off: usize) -> usize {
    match F {
        Q6K => 8 * (off / 32),
        IQ4XS => 2 + 8 * ((off - 8) / 32),
        _ => 4 + 8 * ((off - 16) / 32),
    }
}

/// Header vectors the layout stores (`dwords8`'s first ones): IQ4_XS's header is 8 bytes.
const fn hdr_count<const F: u8>() -> usize {
    if F == IQ4XS {
        2
    } else {
        4
    }
}

/// The vector index of the header (`dwords8`): Q6_K's scales after its 6 chunks.
#[inline(always)]
const fn hdr_at<const F: u8>() -> usize {
    if F == Q6K {
        48
    } else {
        0
    }
}

/// The `raw8` offsets of format `F`'s element bytes, in layout order.
fn raw_offsets<const F: u8>() -> impl Iterator<Item = usize> {
    let (n, first) = match F {
        Q6K => (6, 0),
        Q5K => (5, 16),
        IQ4XS => (4, 8),
        _ => (4, 16),
    };
    (0..n).map(move |c| first + 32 * c)
}

/// i32 lanes' low (`HI` = false) or high f16 halves as f32 lanes.
#[inline(always)]
unsafe fn halves_of<const HI: bool>(v: __m256i) -> __m256 {
    let v = if HI { _mm256_srli_epi32::<16>(v) } else { _mm256_and_si256(v, _mm256_set1_epi32(0xffff)) };
    // each 128-bit lane packs its 4 halves into its low 64 bits; qwords 0 and 2 joined
    let p = _mm256_permute4x64_epi64::<0b1000>(_mm256_packus_epi32(v, v));
    _mm256_cvtph_ps(_mm256_castsi256_si128(p))
}

impl Src8 for Pre8 {
    #[inline(always)]
    unsafe fn block<const F: u8>(self, i: usize) -> Pre8 {
        Pre8 { p: self.p.wrapping_add(i * 8 * block_bytes::<F>()) }
    }
    #[inline(always)]
    unsafe fn raw<const F: u8>(self, off: usize) -> [__m256i; 8] {
        let at = raw_at::<F>(off);
        // SAFETY: a whole laid-out super-block at p (the caller's contract).
        unsafe { std::array::from_fn(|g| ld(self.p.add(32 * (at + g)))) }
    }
    #[inline(always)]
    unsafe fn hdr<const F: u8>(self, _off: usize) -> [__m256i; 4] {
        // SAFETY: as above (IQ4_XS stores 2 header vectors: the other two read are its
        // first element vectors, unused).
        unsafe { std::array::from_fn(|k| ld(self.p.add(32 * (hdr_at::<F>() + k)))) }
    }
    #[inline(always)]
    unsafe fn halves<const F: u8>(self, off: usize) -> __m256 {
        // SAFETY: as above (Q6_K: the 8 d after 52 vectors; Q4_K / Q5_K: d and dmin are
        // the halves of the header's first dword).
        unsafe {
            if F == Q6K {
                _mm256_cvtph_ps(_mm_loadu_si128(self.p.add(52 * 32) as *const __m128i))
            } else if off == 0 {
                halves_of::<false>(ld(self.p))
            } else {
                halves_of::<true>(ld(self.p))
            }
        }
    }
}

/// `rows` (a multiple of 8) rows of `nb` super-blocks of format `F` at `src` into the
/// layout at `dst` (the same length).
///
/// # Safety
/// AVX2 + F16C available; `src` and `dst` hold `rows · nb · block_bytes::<F>()` bytes.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn repack<const F: u8>(src: &[u8], dst: &mut [u8], rows: usize, nb: usize) {
    let bb = block_bytes::<F>();
    let ws = nb * bb;
    let mut o = 0;
    for g in (0..rows).step_by(8) {
        for i in 0..nb {
            // SAFETY (this block): 8 rows of nb blocks at group g (the caller's contract);
            // every store below stays inside this super-block's 8·bb bytes.
            unsafe {
                let s = Rows8 { xb: src.as_ptr().add(g * ws + i * bb), ws, nr: 8 };
                let out = dst.as_mut_ptr().add(o);
                for off in raw_offsets::<F>() {
                    for (k, x) in s.raw::<F>(off).iter().enumerate() {
                        _mm256_storeu_si256(out.add(32 * (raw_at::<F>(off) + k)) as *mut __m256i, *x);
                    }
                }
                let hoff = if F == Q6K { 192 } else { 0 };
                for (k, x) in s.hdr::<F>(hoff).iter().enumerate().take(hdr_count::<F>()) {
                    _mm256_storeu_si256(out.add(32 * (hdr_at::<F>() + k)) as *mut __m256i, *x);
                }
                if F == Q6K {
                    for r in 0..8 {
                        std::ptr::copy_nonoverlapping(src.as_ptr().add((g + r) * ws + i * bb + 208), out.add(52 * 32 + 2 * r), 2);
                    }
                }
            }
            o += 8 * bb;
        }
    }
}

/// The layout's kind of a weight format (`x86_pack8`'s `F`), if it has one.
pub(crate) fn kind(ty: crate::GgmlType) -> Option<u8> {
    match ty {
        crate::GgmlType::Q4K => Some(Q4K),
        crate::GgmlType::Q5K => Some(Q5K),
        crate::GgmlType::Q6K => Some(Q6K),
        crate::GgmlType::IQ4XS => Some(IQ4XS),
        t => super::x86_rows8_q8::kind(t),
    }
}

/// `src` (`rows` rows of `nb` blocks of `kind`) into the layout at `dst`.
pub(crate) fn repack_into(kind: u8, src: &[u8], dst: &mut [u8], rows: usize, nb: usize) {
    if super::x86_rows8_q8::kind_is(kind) {
        return super::x86_rows8_q8::repack(kind, src, dst, rows, nb);
    }
    // SAFETY: AVX2 / F16C detected by the caller (`rows16::available`); the lengths are
    // rows · nb · block bytes (checked by `rows16::repack`).
    unsafe {
        match kind {
            Q6K => repack::<Q6K>(src, dst, rows, nb),
            Q5K => repack::<Q5K>(src, dst, rows, nb),
            IQ4XS => repack::<IQ4XS>(src, dst, rows, nb),
            _ => repack::<Q4K>(src, dst, rows, nb),
        }
    }
}

/// `out[r·ostride + j]` = row r · token j for the `rows` rows of `w` (the layout, `rows` a
/// multiple of 8) and `m` tokens of Q8_K activations at `a + j·astride`. Q4_K up to
/// `x86_fused8::MAX_FUSED` tokens, Q5_K / Q6_K / IQ4_XS up to
/// `x86_fused8::fused_other_upto`: `x86_fused8` (each decoded vector straight into the
/// products); Q4_K at 4–7 tokens `x86_bcast8` (activations broadcast once a call), from 8
/// `x86_pack8x2`; otherwise `x86_pack8` (each super-block decoded once into a `Packed8`,
/// then read per token). Measured (`moe_bench matmul_few_tokens`, `PN_NO_AVX512=1`, Intel Xeon
/// 6/207, 2 threads, 2048×4096, calls alternated, best ms, plain rows → this layout): Q4_K
/// 1 / 2 / 3 / 4 / 8 tokens 0.237 / 0.343 / 0.345 / 0.369 / 0.761 → 0.230 / 0.253 / 0.277 /
/// 0.304 / 0.724; Q5_K 0.300 / 0.390 / 0.670 / 0.748 / 1.146 → 0.288 / 0.313 / 0.571 /
/// 0.630 / 1.006; Q6_K 2 / 3 / 4 / 8 tokens 0.539 / 0.680 / 0.708 / 1.125 → 0.477 / 0.595 /
/// 0.647 / 0.985. (A fused Q5_K / Q6_K form for 1–3 tokens measured no faster than the
/// packed one on that proxy; on a 2-core Zen 3, where one core's products bound a
/// decode step, the fused forms for 1–2 tokens won: docs/perf.md "Session 25".)
///
/// # Safety
/// AVX2 + FMA + F16C available; `w` holds `rows` rows of `n` elements, `a` `m` tokens,
/// `out` `(rows − 1)·ostride + m` floats (checked by `quant::rows16::vec_dot_block`).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn block(kind: u8, n: usize, w: &[u8], rows: usize, a: &[u8], astride: usize, m: usize, out: super::x86_out::Out) {
    use super::x86_block::{PACKED8, SCALES8};
    use super::{x86_fused8, x86_pack8, x86_pack8x2, x86_rows8_q8};
    if x86_rows8_q8::kind_is(kind) {
        // SAFETY: the caller's contract (32-element blocks).
        return unsafe { x86_rows8_q8::block(kind, n / 32, w, rows, a, astride, m, out) };
    }
    let nb = n / 256;
    let rb = nb * match kind {
        Q6K => block_bytes::<Q6K>(),
        Q5K => block_bytes::<Q5K>(),
        IQ4XS => block_bytes::<IQ4XS>(),
        _ => block_bytes::<Q4K>(),
    };
    let ap = a.as_ptr();
    use super::x86_block::{knob, KNOB_FUSED8_OTHER_UPTO, KNOB_FUSED_UPTO};
    let in_regs = if kind == Q4K {
        m <= knob(KNOB_FUSED_UPTO, x86_fused8::MAX_FUSED)
    } else {
        m <= knob(KNOB_FUSED8_OTHER_UPTO, x86_fused8::fused_other_upto(kind)).min(2)
    };
    use super::x86_block::KNOB_PACK8_BCAST_FROM;
    if kind == Q4K && !in_regs && m >= knob(KNOB_PACK8_BCAST_FROM, super::x86_bcast8::BCAST_FROM) && m <= super::x86_bcast8::BCAST_TO {
        // SAFETY: rows laid-out rows of nb blocks, m tokens (the caller's contract).
        super::x86_block::BCAST8.with(|sc| unsafe { super::x86_bcast8::run(nb, w.as_ptr(), rows, ap, astride, m, out, &mut sc.borrow_mut()) });
        return;
    }
    // Q4_K from `x86_pack8x2::PAIRS_FROM` tokens: two groups a pass (the last 8 rows
    // alone where `rows` is an odd multiple of 8)
    use super::x86_block::KNOB_PACK8_PAIRS_FROM;
    let pairs = kind == Q4K && !in_regs && m >= knob(KNOB_PACK8_PAIRS_FROM, x86_pack8x2::PAIRS_FROM);
    let paired = if pairs { rows / 16 * 16 } else { 0 };
    super::x86_block::PAIRS8.with(|sc| {
        let sc = &mut *sc.borrow_mut();
        super::x86_rows16::groups::<16>(w, paired, rb, |g, next| {
            let (s0, s1) = (Pre8 { p: w[g * rb..].as_ptr() }, Pre8 { p: w[(g + 8) * rb..].as_ptr() });
            // SAFETY: 16 rows of nb blocks at s0 / s1 and m tokens (the caller's contract).
            unsafe { x86_pack8x2::run16::<Pre8>(nb, s0, s1, ap, astride, m, out.at(g, 0), next, sc) };
        });
    });
    if paired == rows {
        return;
    }
    SCALES8.with(|pk| PACKED8.with(|p8| {
        let (pk, p8) = (&mut *pk.borrow_mut(), &mut *p8.borrow_mut());
        super::x86_rows16::groups::<8>(&w[paired * rb..], rows - paired, rb, |g, next| {
            let g = paired + g;
            let src = Pre8 { p: w[g * rb..].as_ptr() };
            let o = out.at(g, 0);
            // SAFETY: 8 rows of nb blocks at src and m tokens (the caller's contract).
            unsafe {
                if in_regs {
                    match kind {
                        Q6K => x86_fused8::run_src::<Q6K, Pre8>(nb, 8, src, ap, astride, m, o, pk, next),
                        Q5K => x86_fused8::run_src::<Q5K, Pre8>(nb, 8, src, ap, astride, m, o, pk, next),
                        IQ4XS => x86_fused8::run_src::<IQ4XS, Pre8>(nb, 8, src, ap, astride, m, o, pk, next),
                        _ => x86_fused8::run_src::<Q4K, Pre8>(nb, 8, src, ap, astride, m, o, pk, next),
                    }
                } else {
                    match kind {
                        Q6K => x86_pack8::run::<Q6K, Pre8>(nb, 8, src, ap, astride, m, o, p8, next),
                        Q5K => x86_pack8::run::<Q5K, Pre8>(nb, 8, src, ap, astride, m, o, p8, next),
                        IQ4XS => x86_pack8::run::<IQ4XS, Pre8>(nb, 8, src, ap, astride, m, o, p8, next),
                        _ => x86_pack8::run::<Q4K, Pre8>(nb, 8, src, ap, astride, m, o, p8, next),
                    }
                }
            }
        });
    }));
}
