//! The `rows16` layout of Q4_K / Q5_K / Q6_K / IQ4_XS weights (AVX-512 VNNI) and its dot
//! kernels.
//!
//! The 16-row kernels (`x86_pack16`, `x86_fused16`, `x86_amx`) read 16 rows' raw bytes
//! 32 at a time and transpose them (`raw16`: lane r = dword g of row r), the headers 16
//! at a time (`dwords16`). In a weight used for every step, that transpose is redone every
//! call: at one token it costs more than the products (the fused kernel ran at half the
//! per-row kernel's speed), at 16 tokens ~40% of the call. `rows16` stores each 16-row
//! group's super-blocks already transposed, the vectors those functions return, in the
//! order the kernels ask for them, so a kernel loads what it used to build: exactly the
//! same vectors, so results stay bitwise the plain layout's (and `vec_dot`'s). The same
//! bytes as the plain rows, in another order: 16 × the block size per super-block of a
//! group (Q4_K: header 4 vectors, then the 4 qs chunks of 8; Q5_K: header, qh, 4 qs
//! chunks; Q6_K: 4 ql chunks, 2 qh chunks, the scale header, then the 16 rows' d;
//! IQ4_XS: the first two header vectors (d + scales_h, scales_l), then its 4 qs chunks).

use super::q8::{Q8_K_BSUMS, Q8_K_BYTES};
use super::x86_pack16::{block_bytes, dwords16, raw16, IQ4XS, Q4K, Q5K, Q6K};
use std::arch::x86_64::*;

/// Where a 16-row kernel reads super-blocks from.
pub(crate) trait Src: Copy {
    /// Super-block `i` (self is block 0).
    unsafe fn block<const F: u8>(self, i: usize) -> Self;
    /// `raw16` of the 32 bytes at `off` of each row's block.
    unsafe fn raw<const F: u8>(self, off: usize) -> [__m512i; 8];
    /// `dwords16` of the 16 bytes at `off` of each row's block.
    unsafe fn hdr<const F: u8>(self, off: usize) -> [__m512i; 4];
    /// Q6_K: the 16 rows' d.
    unsafe fn d6(self) -> __m512;
    /// Whether the kernels reading this source may decode with GFNI's bit-matrix
    /// multiply (`x86_pack16::gf`): set only where the caller runs with GFNI enabled.
    const GFNI: bool = false;
}

/// Plain rows: `nr` rows (1..=16; past it, row `nr − 1` again) `ws` bytes apart at `xb`.
#[derive(Clone, Copy)]
pub(crate) struct Rows {
    pub xb: *const u8,
    pub ws: usize,
    pub nr: usize,
}

impl Src for Rows {
    #[inline(always)]
    unsafe fn block<const F: u8>(self, i: usize) -> Rows {
        Rows { xb: self.xb.wrapping_add(i * block_bytes::<F>()), ..self }
    }
    #[inline(always)]
    unsafe fn raw<const F: u8>(self, off: usize) -> [__m512i; 8] {
        // SAFETY: the caller guarantees the rows' blocks.
        unsafe { raw16(self.xb, self.ws, self.nr, off) }
    }
    #[inline(always)]
    unsafe fn hdr<const F: u8>(self, off: usize) -> [__m512i; 4] {
        // SAFETY: the caller guarantees the rows' blocks.
        unsafe { dwords16(self.xb.add(off), self.ws, self.nr) }
    }
    #[inline(always)]
    unsafe fn d6(self) -> __m512 {
        let mut d = [0u16; 16];
        for (r, dr) in d.iter_mut().enumerate() {
            // SAFETY: each row's block is a whole 210-byte Q6_K block (d @208).
            *dr = unsafe { (self.xb.add(r.min(self.nr - 1) * self.ws + 208) as *const u16).read_unaligned() };
        }
        // SAFETY: AVX-512 enabled in every caller.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(d.as_ptr() as *const __m256i)) }
    }
}

/// One 16-row group in the `rows16` layout, at super-block `p`; `G`: decoded with GFNI
/// (`Src::GFNI`).
#[derive(Clone, Copy)]
pub(crate) struct Pre<const G: bool> {
    pub p: *const u8,
}

/// The vector index in a `rows16` super-block of `raw16` at `off` (format `F`).
#[inline(always)]
const fn raw_at<const F: u8>(off: usize) -> usize {
    match F {
        Q6K => 8 * (off / 32),
        IQ4XS => HDR_IQ4XS + 8 * ((off - 8) / 32),
        _ => 4 + 8 * ((off - 16) / 32),
    }
}

/// IQ4_XS keeps 2 of the 4 header vectors (its header is 8 bytes: the other two would
/// repeat qs bytes, and its scales read only these).
const HDR_IQ4XS: usize = 2;

/// The vector index of the header (`dwords16`): Q6_K's scales after its 6 chunks.
#[inline(always)]
const fn hdr_at<const F: u8>() -> usize {
    if F == Q6K {
        48
    } else {
        0
    }
}

/// The `raw16` offsets of format `F`'s element bytes, in layout order.
fn raw_offsets<const F: u8>() -> std::ops::Range<usize> {
    match F {
        Q6K => 0..6,
        Q5K => 0..5,
        _ => 0..4,
    }
}

#[inline(always)]
fn raw_off<const F: u8>(c: usize) -> usize {
    match F {
        Q6K => 32 * c,
        IQ4XS => 8 + 32 * c,
        _ => 16 + 32 * c,
    }
}

impl<const G: bool> Src for Pre<G> {
    const GFNI: bool = G;
    #[inline(always)]
    unsafe fn block<const F: u8>(self, i: usize) -> Pre<G> {
        Pre { p: self.p.wrapping_add(i * 16 * block_bytes::<F>()) }
    }
    #[inline(always)]
    unsafe fn raw<const F: u8>(self, off: usize) -> [__m512i; 8] {
        let v = self.p as *const __m512i;
        let at = raw_at::<F>(off);
        // SAFETY: a whole rows16 super-block at p (the caller's contract).
        unsafe { std::array::from_fn(|g| _mm512_loadu_si512(v.add(at + g) as *const _)) }
    }
    #[inline(always)]
    unsafe fn hdr<const F: u8>(self, _off: usize) -> [__m512i; 4] {
        let v = self.p as *const __m512i;
        let n = if F == IQ4XS { HDR_IQ4XS } else { 4 };
        // SAFETY: as above (IQ4_XS: its two header vectors; the others read as zero).
        unsafe { std::array::from_fn(|k| if k < n { _mm512_loadu_si512(v.add(hdr_at::<F>() + k) as *const _) } else { _mm512_setzero_si512() }) }
    }
    #[inline(always)]
    unsafe fn d6(self) -> __m512 {
        // SAFETY: as above (Q6_K: the 16 d after 52 vectors).
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(self.p.add(52 * 64) as *const __m256i)) }
    }
}

/// `rows` (a multiple of 16) rows of `nb` super-blocks of format `F` at `src` into the
/// `rows16` layout at `dst` (the same length).
///
/// # Safety
/// AVX-512 F/BW/VL available; `src` and `dst` hold `rows · nb · block_bytes::<F>()` bytes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn repack<const F: u8>(src: &[u8], dst: &mut [u8], rows: usize, nb: usize) {
    let bb = block_bytes::<F>();
    let ws = nb * bb;
    let mut o = 0;
    for g in (0..rows).step_by(16) {
        for i in 0..nb {
            // SAFETY (this block): 16 rows of nb blocks at group g (the caller's
            // contract); every store below stays inside this super-block's 16·bb bytes.
            unsafe {
                let s = Rows { xb: src.as_ptr().add(g * ws + i * bb), ws, nr: 16 };
                let out = dst.as_mut_ptr().add(o) as *mut __m512i;
                for c in raw_offsets::<F>() {
                    let v = s.raw::<F>(raw_off::<F>(c));
                    for (k, x) in v.iter().enumerate() {
                        _mm512_storeu_si512(out.add(raw_at::<F>(raw_off::<F>(c)) + k) as *mut _, *x);
                    }
                }
                let hoff = if F == Q6K { 192 } else { 0 };
                let nh = if F == IQ4XS { HDR_IQ4XS } else { 4 };
                for (k, x) in s.hdr::<F>(hoff).iter().enumerate().take(nh) {
                    _mm512_storeu_si512(out.add(hdr_at::<F>() + k) as *mut _, *x);
                }
                if F == Q6K {
                    let d = dst.as_mut_ptr().add(o + 52 * 64);
                    for r in 0..16 {
                        std::ptr::copy_nonoverlapping(src.as_ptr().add((g + r) * ws + i * bb + 208), d.add(2 * r), 2);
                    }
                }
            }
            o += 16 * bb;
        }
    }
}

/// The `rows16` kind of a weight format (`x86_pack16`'s `F`), if it has the layout.
pub(crate) fn kind(ty: crate::GgmlType) -> Option<u8> {
    use super::x86_pack_q8 as q8;
    match ty {
        crate::GgmlType::Q8_0 => Some(q8::Q8_0),
        crate::GgmlType::Q4_0 => Some(q8::Q4_0),
        crate::GgmlType::IQ4NL => Some(q8::IQ4NL),
        crate::GgmlType::MXFP4 => Some(q8::MXFP4),
        crate::GgmlType::Q4K => Some(Q4K),
        crate::GgmlType::Q5K => Some(Q5K),
        crate::GgmlType::Q6K => Some(Q6K),
        crate::GgmlType::IQ4XS => Some(IQ4XS),
        _ => None,
    }
}

/// Whether `kind` is one of the Q8_0-activation formats (`x86_pack_q8`).
fn q8_family(kind: u8) -> bool {
    use super::x86_pack_q8 as q8;
    matches!(kind, q8::Q8_0 | q8::Q4_0 | q8::IQ4NL | q8::MXFP4)
}

/// `src` (rows of `nb` blocks of `kind`, a multiple of 16 rows) into `dst` in the
/// `rows16` layout. The caller checked AVX-512 VNNI and the lengths.
pub(crate) fn repack_into(kind: u8, src: &[u8], dst: &mut [u8], rows: usize, nb: usize) {
    // SAFETY: AVX-512 checked by the caller (`rows16::available`), lengths too.
    unsafe {
        match kind {
            k if q8_family(k) => super::x86_pack_q8::repack(k, src, dst, rows, nb),
            IQ4XS => repack::<IQ4XS>(src, dst, rows, nb),
            Q6K => repack::<Q6K>(src, dst, rows, nb),
            Q5K => repack::<Q5K>(src, dst, rows, nb),
            _ => repack::<Q4K>(src, dst, rows, nb),
        }
    }
}

/// [`block`]'s body, expanded in each of its two target-feature functions (the
/// closures inside inherit the enclosing function's features; an inlined generic body's
/// closures would not); `$g`: the GFNI decode (`Src::GFNI`).
macro_rules! block_body {
    ($g:literal, $kind:ident, $n:ident, $w:ident, $rows:ident, $a:ident, $astride:ident, $m:ident, $o:ident) => {{
        const G: bool = $g;
        let (kind, n, w, rows, a, astride, m, o): (u8, usize, &[u8], usize, &[u8], usize, usize, super::x86_pack16::Out) = ($kind, $n, $w, $rows, $a, $astride, $m, $o);
        use super::x86_block::{padded_tail, takes_amx, AMX, PACKED16, SCALES16};
        use super::{x86_amx, x86_fused16, x86_pack16};
        if q8_family(kind) {
            // SAFETY: the caller's contract.
            return unsafe { super::x86_pack_q8::block(kind, n, w, rows, a, astride, m, o) };
        }
        let (nb, rb) = (n / 256, kind_bytes(kind) * (n / 256));
        let ap = a.as_ptr();
        let fused = m <= super::x86_block::knob(super::x86_block::KNOB_FUSED_UPTO, FUSED_UPTO);
        let amx = !fused && takes_amx(kind, m, n, astride);
        // (every path's scratch borrowed once per call, whichever runs)
        SCALES16.with(|pk| PACKED16.with(|p16| AMX.with(|am| PAIRS.with(|pp| {
            let (pk, p16, am, pp) = (&mut *pk.borrow_mut(), &mut *p16.borrow_mut(), &mut *am.borrow_mut(), &mut *pp.borrow_mut());
            let tail = if amx { padded_tail(a, astride, m, nb * super::q8::Q8_K_BYTES, &mut am.1) } else { std::ptr::null() };
            // the mins / offsets correction in pairs of sub-blocks (fused and packed kernels):
            // the tokens' bsum pairs once for every row group (Q4_K / IQ4_XS at 2–512 tokens
            // 2–5% faster, docs/perf.md "Session 32")
            // SAFETY: m tokens of nb Q8_K blocks at ap (the caller's contract)
            let pairs = (!amx && kind != Q6K).then(|| unsafe { pp.make(ap, astride, m, nb) });
            groups::<16>(w, rows, rb, |g, next| {
                let src = Pre::<G> { p: w[g * rb..].as_ptr() };
                let o = o.at(g, 0);
                // `$f`: the format, `$d`: its dot formula (Q5_K dots as Q4_K)
                macro_rules! go {
                    ($f:expr, $d:expr) => {
                        // SAFETY: 16 rows of nb blocks at src and m tokens (the caller's
                        // contract); AMX usable when `amx` (takes_amx), its tail padded to 16.
                        unsafe {
                            if fused {
                                // MAX_FUSED tokens at a time: the group's bytes stay in cache
                                for t in (0..m).step_by(x86_fused16::MAX_FUSED) {
                                    let (ap, o, next) = (ap.add(t * astride), o.at(0, t), if t == 0 { next } else { None });
                                    let pairs = pairs.map(|(p, st)| (p.add(t * st), st));
                                    match m - t {
                                        1 => x86_fused16::run::<{ $f }, 1, Pre<G>>(nb, 16, src, ap, astride, o, pk, next, pairs),
                                        2 => x86_fused16::run::<{ $f }, 2, Pre<G>>(nb, 16, src, ap, astride, o, pk, next, pairs),
                                        3 => x86_fused16::run::<{ $f }, 3, Pre<G>>(nb, 16, src, ap, astride, o, pk, next, pairs),
                                        _ => x86_fused16::run::<{ $f }, 4, Pre<G>>(nb, 16, src, ap, astride, o, pk, next, pairs),
                                    }
                                }
                            } else if amx {
                                x86_amx::run::<{ $f }, { $d }, Pre<G>>(nb, 16, src, ap, astride, m, tail, o, &mut am.0, next)
                            } else {
                                x86_pack16::run::<{ $f }, Pre<G>>(nb, 16, src, ap, astride, m, o, p16, next, false, pairs)
                            }
                        }
                    };
                }
                match kind {
                    IQ4XS => go!(IQ4XS, IQ4XS),
                    Q6K => go!(Q6K, Q6K),
                    Q5K => go!(Q5K, Q4K),
                    _ => go!(Q4K, Q4K),
                }
            });
        }))));
    }};
}

/// Row r of `w` (`rows` rows of `n` elements of format `kind` in the `rows16` layout,
/// `rows` a multiple of 16) · token j (`m` Q8_K rows `astride` apart at `a`) into row r,
/// token j of `o` (row- or token-major, `x86_pack16::Out`):
/// bitwise `vec_dot` of the plain row. One to `MAX_FUSED` tokens: the fused kernel
/// (every decoded vector straight into the products); more: the decoded super-blocks
/// once for all the tokens (AMX tiles where `takes_amx` says so).
///
/// # Safety
/// AVX-512 F/BW/VL + VNNI available; `w` holds `rows` rows, `a` `m` tokens, `o` every
/// (row, token) (checked by `quant::rows16`).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn block(kind: u8, n: usize, w: &[u8], rows: usize, a: &[u8], astride: usize, m: usize, o: super::x86_pack16::Out) {
    // SAFETY: the caller's contract; GFNI where detected.
    unsafe {
        if super::x86::has_gfni() {
            block_gfni(kind, n, w, rows, a, astride, m, o)
        } else {
            block_vnni(kind, n, w, rows, a, astride, m, o)
        }
    }
}

/// [`block`] on a CPU with GFNI: the codes decoded with bit-matrix multiplies
/// (`x86_pack16::gf`), fewer operations a vector than shifts and masks.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,gfni")]
unsafe fn block_gfni(kind: u8, n: usize, w: &[u8], rows: usize, a: &[u8], astride: usize, m: usize, o: super::x86_pack16::Out) {
    block_body!(true, kind, n, w, rows, a, astride, m, o)
}

/// [`block`] without GFNI.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn block_vnni(kind: u8, n: usize, w: &[u8], rows: usize, a: &[u8], astride: usize, m: usize, o: super::x86_pack16::Out) {
    block_body!(false, kind, n, w, rows, a, astride, m, o)
}

thread_local! {
    /// [`block`]'s bsum pairs of the call's tokens.
    static PAIRS: std::cell::RefCell<BsumPairs> = std::cell::RefCell::new(Default::default());
}

/// The tokens' bsums summed per 32-element sub-block, two sub-blocks an i16 pair:
/// token j's block i at `16·(j·nb + i)`, dword q = (b_4q + b_4q+1) | (b_4q+2 + b_4q+3) <<
/// 16 (each sum of two bsums of 16 Q8_K bytes: |·| ≤ 4096, exact in i16). Made once a
/// call for every row group (`x86_pack16::Corr::Pairs`).
#[derive(Default)]
pub struct BsumPairs {
    v: Vec<[u32; 4]>,
}

impl BsumPairs {
    /// The pairs of `m` tokens of `nb` Q8_K blocks at `a + j·astride`; (pointer, bytes a
    /// token).
    ///
    /// # Safety
    /// `m` tokens of `nb` whole Q8_K blocks at `a + j·astride`; AVX-512 BW/VL available.
    #[inline(always)]
    unsafe fn make(&mut self, a: *const u8, astride: usize, m: usize, nb: usize) -> (*const u8, usize) {
        self.v.clear();
        self.v.resize(m * nb, [0; 4]);
        let ones = _mm256_set1_epi16(1);
        for j in 0..m {
            for i in 0..nb {
                // SAFETY: token j's block i is whole (the caller's contract); AVX-512 BW/VL
                // enabled in every caller. The 8 sums of adjacent bsums, as i16 in order.
                unsafe {
                    let b = _mm256_loadu_si256(a.add(j * astride + i * Q8_K_BYTES + Q8_K_BSUMS) as *const __m256i);
                    let s = _mm256_cvtepi32_epi16(_mm256_madd_epi16(b, ones));
                    _mm_storeu_si128(self.v.as_mut_ptr().add(j * nb + i) as *mut __m128i, s);
                }
            }
        }
        (self.v.as_ptr() as *const u8, 16 * nb)
    }
}

/// Tokens up to which a block runs the fused kernel (`MAX_FUSED` tokens a pass over the
/// group) rather than decoding its super-blocks once for all the tokens.
const FUSED_UPTO: usize = super::x86_fused16::MAX_FUSED;

/// `f(g, next)` for each `G`-row group `g` of the `rows` rows of `w` (`rb` bytes a row;
/// 16 here, 8 in `x86_rows8`), `next` the following group's bytes to prefetch meanwhile:
/// past the last row too, where `w` goes on (the rest of the tensor: a decode step's
/// matmul runs 16 rows a task, and the next task's rows are what the stream needs next).
#[inline(always)]
pub(super) fn groups<const G: usize>(w: &[u8], rows: usize, rb: usize, mut f: impl FnMut(usize, Option<(*const u8, usize)>)) {
    for g in (0..rows).step_by(G) {
        let start = (g + G) * rb;
        let next = (start < w.len()).then(|| (w[start..].as_ptr(), (G * rb).min(w.len() - start)));
        f(g, next);
    }
}

/// Bytes of one super-block of `kind`.
fn kind_bytes(kind: u8) -> usize {
    match kind {
        IQ4XS => block_bytes::<IQ4XS>(),
        Q6K => block_bytes::<Q6K>(),
        Q5K => block_bytes::<Q5K>(),
        _ => block_bytes::<Q4K>(),
    }
}
