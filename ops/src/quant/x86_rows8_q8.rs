//! The 8-row interleaved layout of Q8_0 weights for plain AVX2 (no AVX-512 VNNI), and
//! its dot kernel: the AVX2 counterpart of `x86_pack_q8`'s `rows16` Q8_0 path.
//!
//! From plain rows every 32-weight block of every row needs its own horizontal sum per
//! token (`x86_tile::tile_32`); here each ymm lane is a row, so a block's 8 rows sum in
//! their lanes and one float step per block and token serves all 8.
//!
//! Layout, per 8-row group and block (the 8 plain blocks' 272 bytes, reordered): 8
//! vectors of 32 bytes, vector l lane r = bytes 4l..4l+4 of row r's 32 quants; then the
//! 8 rows' f16 scales. Same size as the plain rows.
//!
//! Products (no VNNI): `maddubs(|w|, sign(a, w))` — `|w|` ≤ 128 as u8 (−128 included),
//! the activations' |a| ≤ 127 (Q8_0 scales by amax / 127), so a pair of products never
//! saturates i16 (≤ 2·128·127) — then `madd` by ones into i32 lanes. Per block the exact
//! integer `sumi` of each row, then `sumf += sumi as f32 · (d_w · d_a)` in block order:
//! the contract of `x86_tile::tile_32` and the scalar dot, so every result is bitwise
//! `vec_dot`'s.

use super::q8::Q8_0_BYTES;
use super::x86_tile::{f16, ld};
use std::arch::x86_64::*;

/// The layout's kind in `x86_rows8` (distinct from `x86_pack8`'s K-quant kinds).
pub(crate) const Q8_0: u8 = 80;

/// Bytes of one block of 8 rows.
const GROUP_BLOCK: usize = 8 * Q8_0_BYTES;

/// Tokens a kernel pass takes (their float and integer accumulators in registers).
/// Measured (`moe_bench matmul_few_tokens`, `PN_NO_AVX512=1`, Xeon 6/207, 2 threads,
/// Q8_0 2048×4096, tile sizes alternated, best ms) 2 / 4 / 6 / 8 tokens a pass: at 16
/// tokens 1.95 / 1.67 / 1.61 / 2.23, at 256 31.4 / 27.0 / 26.2 / 37.1 (8 spills).
const TOKENS: usize = 4;

/// `rows` (a multiple of 8) plain Q8_0 rows of `nb` blocks at `src` into the layout at
/// `dst` (the same length). The caller checked the lengths.
pub(crate) fn repack(src: &[u8], dst: &mut [u8], rows: usize, nb: usize) {
    let ws = nb * Q8_0_BYTES;
    let mut o = 0;
    for g in (0..rows).step_by(8) {
        for i in 0..nb {
            let out = &mut dst[o..o + GROUP_BLOCK];
            for r in 0..8 {
                let b = &src[(g + r) * ws + i * Q8_0_BYTES..][..Q8_0_BYTES];
                for l in 0..8 {
                    out[32 * l + 4 * r..32 * l + 4 * r + 4].copy_from_slice(&b[2 + 4 * l..6 + 4 * l]);
                }
                out[256 + 2 * r..258 + 2 * r].copy_from_slice(&b[..2]);
            }
            o += GROUP_BLOCK;
        }
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
unsafe fn run<const M: usize>(nb: usize, p: *const u8, a: *const u8, astride: usize, da: &[f32], out: &mut [f32], ostride: usize, pf: Option<(*const u8, usize)>) {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); M];
    // SAFETY (whole body): the caller's contract; a prefetch never faults.
    unsafe {
        for i in 0..nb {
            super::x86_pack_q8::prefetch_share(pf, nb, i);
            let b = p.add(i * GROUP_BLOCK);
            let mut sumi = [_mm256_setzero_si256(); M];
            // the block's 8 weight vectors in two halves of 4 (with their magnitudes: 8
            // registers), each half against every token's 16 activation bytes
            // (macros, not closures: a closure would not inherit the target features)
            for h in 0..2 {
                let q0 = ld(b.add(32 * (4 * h)));
                let q1 = ld(b.add(32 * (4 * h + 1)));
                let q2 = ld(b.add(32 * (4 * h + 2)));
                let q3 = ld(b.add(32 * (4 * h + 3)));
                let (a0, a1, a2, a3) = (_mm256_sign_epi8(q0, q0), _mm256_sign_epi8(q1, q1), _mm256_sign_epi8(q2, q2), _mm256_sign_epi8(q3, q3));
                for (j, s) in sumi.iter_mut().enumerate() {
                    let y = _mm256_broadcastsi128_si256(_mm_loadu_si128(a.add(j * astride + i * Q8_0_BYTES + 2 + 16 * h) as *const __m128i));
                    macro_rules! dot {
                        ($imm:literal, $aq:expr, $q:expr) => {
                            _mm256_madd_epi16(ones, _mm256_maddubs_epi16($aq, _mm256_sign_epi8(_mm256_shuffle_epi32::<$imm>(y), $q)))
                        };
                    }
                    let (p0, p1) = (dot!(0x00, a0, q0), dot!(0x55, a1, q1));
                    let (p2, p3) = (dot!(0xaa, a2, q2), dot!(0xff, a3, q3));
                    *s = _mm256_add_epi32(*s, _mm256_add_epi32(_mm256_add_epi32(p0, p1), _mm256_add_epi32(p2, p3)));
                }
            }
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(b.add(256) as *const __m128i));
            for (j, (acc, s)) in acc.iter_mut().zip(sumi).enumerate() {
                let da = _mm256_set1_ps(*da.get_unchecked(j * nb + i));
                *acc = _mm256_add_ps(*acc, _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, da)));
            }
        }
        for (j, v) in acc.iter().enumerate() {
            let mut l = [0f32; 8];
            _mm256_storeu_ps(l.as_mut_ptr(), *v);
            for (r, &x) in l.iter().enumerate() {
                out[r * ostride + j] = x;
            }
        }
    }
}

/// `out[r·ostride + j]` = row r · token j for the `rows` rows of `w` (the layout, `rows` a
/// multiple of 8, `nb` blocks a row) and `m` tokens of Q8_0 activations at `a + j·astride`:
/// each 8-row group against `TOKENS` tokens at a time (the group's bytes stay in L1/L2
/// between passes), the next group prefetched during the first pass.
///
/// # Safety
/// AVX2 + FMA + F16C available; `w` holds `rows` laid-out rows of `nb` blocks, `a` `m`
/// tokens, `out` `(rows − 1)·ostride + m` floats (checked by `quant::rows16`).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn block(nb: usize, w: &[u8], rows: usize, a: &[u8], astride: usize, m: usize, out: &mut [f32], ostride: usize) {
    let rb = nb * Q8_0_BYTES;
    let ap = a.as_ptr();
    DA.with(|da| {
    let da = &mut *da.borrow_mut();
    // every token's block scales as f32, once per call (every row group reads them)
    da.clear();
    for j in 0..m {
        // SAFETY: token j's nb blocks (the caller's contract).
        da.extend((0..nb).map(|i| unsafe { f16(ap.add(j * astride + i * Q8_0_BYTES)) }));
    }
    super::x86_rows16::groups::<8>(w, rows, rb, |g, next| {
        let p = w[g * rb..].as_ptr();
        let o = &mut out[g * ostride..];
        for t in (0..m).step_by(TOKENS) {
            let (at, o, pf) = (ap.wrapping_add(t * astride), &mut o[t..], if t == 0 { next } else { None });
            let d = &da[t * nb..];
            macro_rules! go {
                ($m:literal) => {
                    // SAFETY: the caller's contract, for tokens t..t + $m.
                    unsafe { run::<$m>(nb, p, at, astride, d, o, ostride, pf) }
                };
            }
            match m - t {
                1 => go!(1),
                2 => go!(2),
                3 => go!(3),
                _ => go!(4),
            }
        }
    });
    });
}

thread_local! {
    /// `block`'s activation scales as f32 (`[m][nb]`).
    static DA: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}
