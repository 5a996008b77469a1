//! The 8-row interleaved layout of the 32-element formats paired with Q8_0 activations
//! (Q8_0, Q4_0, IQ4_NL, MXFP4) for plain AVX2 (no AVX-512 VNNI), and its dot kernel: the
//! AVX2 counterpart of `x86_pack_q8`'s `rows16` path.
//!
//! From plain rows every 32-weight block of every row needs its own horizontal sum per
//! token (`x86_tile::tile_32`); here each ymm lane is a row, so a block's 8 rows sum in
//! their lanes and one float step per block and token serves all 8.
//!
//! Layout, per 8-row group and block (the 8 plain blocks' bytes, reordered): the quants
//! as vectors of 32 bytes, vector l lane r = quant bytes 4l..4l+4 of row r (Q8_0: 8
//! vectors; the 4-bit formats: 4, low nibbles elements 4l.., high ones 16 + 4l..); then
//! the 8 rows' scales (f16; MXFP4: e8m0 bytes). Same size as the plain rows.
//!
//! Products (no VNNI) on the signed weight values (Q8_0's bytes; IQ4_NL / MXFP4 through
//! their tables; Q4_0 takes its unsigned nibbles instead, `run_q4`): `maddubs(|w|,
//! sign(a, w))` — `|w|` ≤ 128 as u8 (−128 included), the activations' |a| ≤ 127 (Q8_0
//! scales by amax / 127), so a pair of products never saturates i16 (≤ 2·128·127) — then
//! `madd` by ones into i32 lanes. Per block the exact
//! integer `sumi` of each row, then `sumf += sumi as f32 · (d_w · d_a)` in block order:
//! the contract of `x86_tile::tile_32` and the scalar dots, so every result is bitwise
//! `vec_dot`'s.

use super::iq4::KVALUES_IQ4NL;
use super::mxfp4::KVALUES_MXFP4;
use super::q8::Q8_0_BYTES;
use super::x86_tile::{f16, ld, table16};
use super::x86_pack8::{nib_hi, nib_lo};
use super::x86_out::Out;
use std::arch::x86_64::*;

/// The layout's kinds in `x86_rows8` (distinct from `x86_pack8`'s K-quant kinds).
pub(crate) const Q8_0: u8 = 80;
pub(crate) const Q4_0: u8 = 81;
pub(crate) const IQ4NL: u8 = 82;
pub(crate) const MXFP4: u8 = 83;

/// The layout's kind of a weight format, if it has one.
pub(crate) fn kind(ty: crate::GgmlType) -> Option<u8> {
    match ty {
        crate::GgmlType::Q8_0 => Some(Q8_0),
        crate::GgmlType::Q4_0 => Some(Q4_0),
        crate::GgmlType::IQ4NL => Some(IQ4NL),
        crate::GgmlType::MXFP4 => Some(MXFP4),
        _ => None,
    }
}

/// Whether `kind` is one of this module's.
pub(crate) fn kind_is(kind: u8) -> bool {
    matches!(kind, Q8_0 | Q4_0 | IQ4NL | MXFP4)
}

/// One plain block of format `F`: its bytes, and where its quants start (after the scale).
const fn format<const F: u8>() -> (usize, usize) {
    match F {
        Q8_0 => (Q8_0_BYTES, 2),
        MXFP4 => (super::mxfp4::MXFP4_BYTES, 1),
        // Q4_0 and IQ4_NL: f16 d, 16 nibble bytes
        _ => (super::legacy::Q4_0_BYTES, 2),
    }
}

/// Tokens a kernel pass takes. Measured (`moe_bench matmul_few_tokens`, `PN_NO_AVX512=1`,
/// Xeon 6/207, 2 threads, Q8_0 2048×4096, tile sizes alternated, best ms) 4 / 6 / 8 tokens
/// a pass: at 16 tokens 1.42 / 1.35 / 1.32, at 256 23.2 / 21.9 / 21.3 (with every token's
/// integers of a block live at once, 8 spilled and ran slowest: 2.23 / 37.1 against 4's
/// 1.67 / 27.0; now only the first half's are kept: 8 against that form's 4, two builds
/// alternated, at 256 tokens 17.2–17.4 vs 18.8–19.4 ms).
const TOKENS: usize = 8;

/// `rows` (a multiple of 8) plain rows of `nb` blocks of format `F` at `src` into the
/// layout at `dst` (the same length). The caller checked the lengths.
fn repack_f<const F: u8>(src: &[u8], dst: &mut [u8], rows: usize, nb: usize) {
    let (bb, q0) = format::<F>();
    let (ws, nq) = (nb * bb, bb - q0);
    let mut o = 0;
    for g in (0..rows).step_by(8) {
        for i in 0..nb {
            let out = &mut dst[o..o + 8 * bb];
            for r in 0..8 {
                let b = &src[(g + r) * ws + i * bb..][..bb];
                for l in 0..nq / 4 {
                    out[32 * l + 4 * r..32 * l + 4 * r + 4].copy_from_slice(&b[q0 + 4 * l..q0 + 4 * l + 4]);
                }
                out[8 * nq + q0 * r..8 * nq + q0 * (r + 1)].copy_from_slice(&b[..q0]);
            }
            o += 8 * bb;
        }
    }
}

/// `src` (`rows` rows of `nb` blocks of `kind`) into the layout at `dst`.
pub(crate) fn repack(kind: u8, src: &[u8], dst: &mut [u8], rows: usize, nb: usize) {
    match kind {
        Q4_0 => repack_f::<Q4_0>(src, dst, rows, nb),
        IQ4NL => repack_f::<IQ4NL>(src, dst, rows, nb),
        MXFP4 => repack_f::<MXFP4>(src, dst, rows, nb),
        _ => repack_f::<Q8_0>(src, dst, rows, nb),
    }
}

/// The 8 rows' scales of the laid-out block at `b` as f32 lanes (`tile_32`'s `dw`;
/// MXFP4's `e8m0_to_f32_half`: e < 2 → 0x200000 << e, else (e − 1) << 23, as bits).
#[inline(always)]
unsafe fn scales<const F: u8>(b: *const u8) -> __m256 {
    let (bb, q0) = format::<F>();
    // SAFETY (whole body): a whole laid-out block at b: the scales after 8·(bb − q0) bytes.
    unsafe {
        let at = b.add(8 * (bb - q0));
        if F == MXFP4 {
            let e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(at as *const __m128i));
            let small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
            let big = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, _mm256_set1_epi32(1)));
            let sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
            _mm256_castsi256_ps(_mm256_blendv_epi8(big, sub, small))
        } else {
            _mm256_cvtph_ps(_mm_loadu_si128(at as *const __m128i))
        }
    }
}

/// Signed weight values of laid-out block `b`, elements 16h + 4l .. +4 of each row
/// (lane r), l = 0..4 (Q8_0, IQ4_NL, MXFP4; Q4_0 runs `run_q4` on its nibbles).
#[inline(always)]
unsafe fn values<const F: u8>(b: *const u8, h: usize) -> [__m256i; 4] {
    // SAFETY (whole body): a whole laid-out block at b.
    unsafe {
        if F == Q8_0 {
            return [ld(b.add(32 * (4 * h))), ld(b.add(32 * (4 * h + 1))), ld(b.add(32 * (4 * h + 2))), ld(b.add(32 * (4 * h + 3)))];
        }
        // (a macro, not a closure: a closure would not inherit the target features)
        macro_rules! v {
            ($l:expr) => {{
                let x = ld(b.add(32 * $l));
                let n = if h == 0 { nib_lo(x) } else { nib_hi(x) };
                match F {
                    IQ4NL => _mm256_shuffle_epi8(table16(&KVALUES_IQ4NL), n),
                    MXFP4 => _mm256_shuffle_epi8(table16(&KVALUES_MXFP4), n),
                    _ => unreachable!("Q4_0 runs run_q4"),
                }
            }};
        }
        [v!(0), v!(1), v!(2), v!(3)]
    }
}

/// The float step of a block for one token: `acc += sumi · (d_w · d_a)` per row lane,
/// unfused (`tile_32`'s order).
#[inline(always)]
unsafe fn step(acc: &mut __m256, sumi: __m256i, dw: __m256, da: f32) {
    *acc = _mm256_add_ps(*acc, _mm256_mul_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(dw, _mm256_set1_ps(da))));
}

/// `out[r·ostride + j]` = lane r of `acc[j]`.
///
/// # Safety
/// AVX enabled in the caller.
#[inline(always)]
unsafe fn store<const M: usize>(acc: &[__m256; M], out: Out) {
    for (j, v) in acc.iter().enumerate() {
        // SAFETY: the caller's.
        unsafe { super::x86_pack8::store_rows8(*v, 8, out, j) };
    }
}

/// 8 rows (one group of the layout at `p`, `nb` blocks) against `M` tokens of Q8_0
/// activations at `a + j·astride` (their block scales as f32 at `da[j·nb + i]`):
/// `out[r·ostride + j]`; `pf` (pointer, bytes) prefetched meanwhile, a share per block.
///
/// # Safety
/// AVX2 + F16C enabled in the caller; `nb` laid-out blocks at `p`, `M` activation rows
/// of `nb` blocks, `da` `M·nb` scales, `out` holds `7·ostride + M` floats.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn run<const F: u8, const M: usize>(nb: usize, p: *const u8, a: *const u8, astride: usize, da: &[f32], out: Out, pf: Option<(*const u8, usize)>) {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); M];
    // SAFETY (whole body): the caller's contract; a prefetch never faults.
    unsafe {
        for i in 0..nb {
            super::x86::prefetch_share::<true>(pf, nb, i);
            let b = p.add(i * 8 * format::<F>().0);
            // the block's 8 weight vectors in two halves of 4 (with their magnitudes: 8
            // registers), each half against every token's 16 activation bytes: the first
            // half's integers kept per token, the second half's added and the float step
            // taken right away (one token's integers live at a time)
            // (macros, not closures: a closure would not inherit the target features)
            macro_rules! half {
                ($h:expr, $j:expr, $q0:expr, $q1:expr, $q2:expr, $q3:expr, $a0:expr, $a1:expr, $a2:expr, $a3:expr) => {{
                    let y = _mm256_broadcastsi128_si256(_mm_loadu_si128(a.add($j * astride + i * Q8_0_BYTES + 2 + 16 * $h) as *const __m128i));
                    macro_rules! dot {
                        ($imm:literal, $aq:expr, $q:expr) => {
                            _mm256_madd_epi16(ones, _mm256_maddubs_epi16($aq, _mm256_sign_epi8(_mm256_shuffle_epi32::<$imm>(y), $q)))
                        };
                    }
                    let (p0, p1) = (dot!(0x00, $a0, $q0), dot!(0x55, $a1, $q1));
                    let (p2, p3) = (dot!(0xaa, $a2, $q2), dot!(0xff, $a3, $q3));
                    _mm256_add_epi32(_mm256_add_epi32(p0, p1), _mm256_add_epi32(p2, p3))
                }};
            }
            let mut first = [_mm256_setzero_si256(); M];
            {
                let [q0, q1, q2, q3] = values::<F>(b, 0);
                let (a0, a1, a2, a3) = (_mm256_sign_epi8(q0, q0), _mm256_sign_epi8(q1, q1), _mm256_sign_epi8(q2, q2), _mm256_sign_epi8(q3, q3));
                for (j, f) in first.iter_mut().enumerate() {
                    *f = half!(0, j, q0, q1, q2, q3, a0, a1, a2, a3);
                }
            }
            let dw = scales::<F>(b);
            let [q0, q1, q2, q3] = values::<F>(b, 1);
            let (a0, a1, a2, a3) = (_mm256_sign_epi8(q0, q0), _mm256_sign_epi8(q1, q1), _mm256_sign_epi8(q2, q2), _mm256_sign_epi8(q3, q3));
            for (j, (acc, f)) in acc.iter_mut().zip(first).enumerate() {
                step(acc, _mm256_add_epi32(f, half!(1, j, q0, q1, q2, q3, a0, a1, a2, a3)), dw, *da.get_unchecked(j * nb + i));
            }
        }
        store(&acc, out);
    }
}

/// [`run`] for Q4_0, on its unsigned nibbles: `maddubs(q, a)` (q ≤ 15, so a pair is at
/// most 2·15·127 and a block's 8 groups sum in i16: ≤ 30480), one `madd` per block and
/// token, then `− 8·Σa` (`corr[j·nb + i]`) gives the exact integer of `(q − 8) · a`: half
/// the vector operations of the signed path. Same float step.
///
/// # Safety
/// As [`run`]; `corr` holds `M·nb` corrections.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn run_q4<const M: usize>(nb: usize, p: *const u8, a: *const u8, astride: usize, da: &[f32], corr: &[i32], out: Out, pf: Option<(*const u8, usize)>) {
    use super::x86_pack8::bcast4;
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); M];
    // SAFETY (whole body): the caller's contract; a prefetch never faults.
    unsafe {
        for i in 0..nb {
            super::x86::prefetch_share::<true>(pf, nb, i);
            let b = p.add(i * 8 * format::<Q4_0>().0);
            // elements 4l.. (low nibbles) and 16 + 4l.. (high) of each row
            // (no closures: a closure would not inherit the target features)
            let (mut lo, mut hi) = ([_mm256_setzero_si256(); 4], [_mm256_setzero_si256(); 4]);
            for l in 0..4 {
                let x = ld(b.add(32 * l));
                lo[l] = nib_lo(x);
                hi[l] = nib_hi(x);
            }
            let dw = scales::<Q4_0>(b);
            for (j, acc) in acc.iter_mut().enumerate() {
                let y = a.add(j * astride + i * Q8_0_BYTES + 2);
                let mut s = _mm256_maddubs_epi16(lo[0], bcast4(y));
                for l in 1..4 {
                    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(lo[l], bcast4(y.add(4 * l))));
                }
                for l in 0..4 {
                    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(hi[l], bcast4(y.add(16 + 4 * l))));
                }
                let sumi = _mm256_sub_epi32(_mm256_madd_epi16(s, ones), _mm256_set1_epi32(*corr.get_unchecked(j * nb + i)));
                step(acc, sumi, dw, *da.get_unchecked(j * nb + i));
            }
        }
        store(&acc, out);
    }
}

/// The rows of `w` (the layout of format `F`, `nb` blocks a row) against `m` tokens of
/// Q8_0 activations at `a + j·astride`, their scales `da` (`[m][nb]`; Q4_0: and `8·Σa`
/// per block, `corr`): each 8-row group
/// against `TOKENS` tokens at a time (the group's bytes stay in L1/L2 between passes),
/// the next group prefetched during the first pass.
///
/// # Safety
/// AVX2 + FMA + F16C available; as [`block`]. (A function of its own with the target
/// features, not `inline(always)`: its closure takes them from here.)
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn groups<const F: u8>(nb: usize, w: &[u8], rows: usize, a: *const u8, astride: usize, da: &[f32], corr: &[i32], m: usize, out: Out) {
    let rb = nb * format::<F>().0;
    super::x86_rows16::groups::<8>(w, rows, rb, |g, next| {
        let p = w[g * rb..].as_ptr();
        let o = out.at(g, 0);
        for t in (0..m).step_by(TOKENS) {
            let (at, o, pf, d) = (a.wrapping_add(t * astride), o.at(0, t), if t == 0 { next } else { None }, &da[t * nb..]);
            macro_rules! go {
                ($m:literal) => {
                    // SAFETY: the caller's contract, for tokens t..t + $m.
                    unsafe {
                        if F == Q4_0 {
                            run_q4::<$m>(nb, p, at, astride, d, &corr[t * nb..], o, pf)
                        } else {
                            run::<F, $m>(nb, p, at, astride, d, o, pf)
                        }
                    }
                };
            }
            tokens_upto8!(m - t, go)
        }
    });
}

/// `out[r·ostride + j]` = row r · token j for the `rows` rows of `w` (the layout of
/// `kind`, `rows` a multiple of 8, `nb` blocks a row) and `m` tokens of Q8_0 activations
/// at `a + j·astride`.
///
/// # Safety
/// AVX2 + FMA + F16C available; `w` holds `rows` laid-out rows of `nb` blocks, `a` `m`
/// tokens, `out` `(rows − 1)·ostride + m` floats (checked by `quant::rows16`).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn block(kind: u8, nb: usize, w: &[u8], rows: usize, a: &[u8], astride: usize, m: usize, out: Out) {
    let ap = a.as_ptr();
    PREP.with(|prep| {
        let (da, corr) = &mut *prep.borrow_mut();
        // every token's block scales as f32 (and Q4_0's 8·Σa), once per call: every row
        // group reads them
        da.clear();
        corr.clear();
        for j in 0..m {
            // SAFETY: token j's nb blocks (the caller's contract).
            da.extend((0..nb).map(|i| unsafe { f16(ap.add(j * astride + i * Q8_0_BYTES)) }));
            if kind == Q4_0 {
                corr.extend((0..nb).map(|i| 8 * a[j * astride + i * Q8_0_BYTES + 2..][..32].iter().map(|&q| q as i8 as i32).sum::<i32>()));
            }
        }
        // SAFETY: the caller's contract.
        unsafe {
            match kind {
                Q4_0 => groups::<Q4_0>(nb, w, rows, ap, astride, da, corr, m, out),
                IQ4NL => groups::<IQ4NL>(nb, w, rows, ap, astride, da, corr, m, out),
                MXFP4 => groups::<MXFP4>(nb, w, rows, ap, astride, da, corr, m, out),
                _ => groups::<Q8_0>(nb, w, rows, ap, astride, da, corr, m, out),
            }
        }
    });
}

thread_local! {
    /// `block`'s activation scales as f32 and Q4_0's corrections (each `[m][nb]`).
    static PREP: std::cell::RefCell<(Vec<f32>, Vec<i32>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}
