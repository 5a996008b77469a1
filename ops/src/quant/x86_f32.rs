//! F32 weights against several tokens (AVX-512): the MoE router (`ffn_gate_inp`, 2048 ×
//! 256 in Qwen3.5) stays F32 in every quantized file, and a prefill pass dots each of its
//! rows with every token. One (row, token) pair at a time (`x86::dot_f32`) loads two
//! vectors per FMA and streams all the tokens' activations once per row; here a register
//! tile of `ROWS` rows × `TOKENS` tokens loads each weight vector once for its tokens and
//! each activation vector once for its rows, over a block of `TOKEN_BLOCK` tokens that
//! stays in L2 while the rows go by (2048 × 256 at 256 tokens: 3.1× faster on one thread).
//!
//! Exactness: `dot_f32` keeps four 8-lane accumulators, `acc[k]` lane l summing elements
//! 32s + 8k + l. Here a pair's two 16-lane accumulators hold `acc[0] | acc[1]` and
//! `acc[2] | acc[3]` (lane l of the first: elements 32s + l), the same FMA per element in
//! the same order, then `x86::dot_f32_tail` ends every pair: bitwise `dot_f32`.

use super::x86::dot_f32_tail;
use std::arch::x86_64::*;

/// Rows and tokens of the register tile: 8 pairs × 2 accumulators + 8 weight vectors + 2
/// activation vectors = 26 of the 32 zmm registers. Measured (2048 × 256, one thread,
/// Xeon 6/207, best of 7 against the pair-by-pair dots): 4 × 2 1.8 / 2.1 / 2.6 / 3.1× at
/// 2 / 4 / 64 / 256 tokens; 2 × 4 1.1 / 2.1 / 2.3 / 3.0×; 3 × 3 1.0 / 1.4 / 2.6 / 3.1×.
const ROWS: usize = 4;
const TOKENS: usize = 2;
/// Tokens whose activations stay in L2 while every row passes (2048 elements: 256 KB).
const TOKEN_BLOCK: usize = 32;

/// `out[r·ostride + j] = dot_f32(w row r, a row j)` for `r < rows`, `j < m` (`n` elements
/// a row; rows `wstride` and `astride` bytes apart), bitwise `x86::dot_f32`.
///
/// # Safety
/// AVX-512 F available; `w` holds `rows` rows and `a` `m` rows of `n` f32 (the last ones
/// `4n` bytes), `out` `(rows − 1)·ostride + m` floats (checked by `quant::vec_dot_block`).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub(super) unsafe fn block(n: usize, w: &[u8], wstride: usize, rows: usize, a: &[u8], astride: usize, m: usize, out: &mut [f32], ostride: usize) {
    let row = |r: usize| &w[r * wstride..r * wstride + 4 * n];
    let tok = |j: usize| &a[j * astride..j * astride + 4 * n];
    // SAFETY (whole body): AVX-512 F enabled; every row and token index below is within
    // `rows` / `m` (whole rows by the contract), every output within `out`.
    unsafe {
        let mut put = |r: usize, j: usize, z: [__m512; 2]| out[r * ostride + j] = finish(z, n, row(r), tok(j));
        for j0 in (0..m).step_by(TOKEN_BLOCK) {
            let j1 = (j0 + TOKEN_BLOCK).min(m);
            for r0 in (0..rows).step_by(ROWS) {
                let mut j = j0;
                while j < j1 {
                    if r0 + ROWS <= rows && j + TOKENS <= j1 {
                        let acc = tile::<ROWS, TOKENS>(n, std::array::from_fn(|r| row(r0 + r)), std::array::from_fn(|k| tok(j + k)));
                        for (r, ts) in acc.into_iter().enumerate() {
                            for (k, z) in ts.into_iter().enumerate() {
                                put(r0 + r, j + k, z);
                            }
                        }
                        j += TOKENS;
                    } else {
                        // the edges, pair by pair
                        for r in r0..(r0 + ROWS).min(rows) {
                            put(r, j, tile::<1, 1>(n, [row(r)], [tok(j)])[0][0]);
                        }
                        j += 1;
                    }
                }
            }
        }
    }
}

/// A pair's dot from its two accumulators (`[acc0 | acc1, acc2 | acc3]` after the
/// 32-element steps): `dot_f32`'s own tail and reduction.
#[inline(always)]
unsafe fn finish(z: [__m512; 2], n: usize, w: &[u8], a: &[u8]) -> f32 {
    let hi = |v: __m512| _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    let acc = [_mm512_castps512_ps256(z[0]), hi(z[0]), _mm512_castps512_ps256(z[1]), hi(z[1])];
    // SAFETY: AVX2/FMA available (AVX-512 F implies them here: the caller's contract).
    unsafe { dot_f32_tail(acc, n / 32 * 32, n, w, a) }
}

/// The 32-element steps of `R` rows × `T` tokens: per pair, `[acc0 | acc1, acc2 | acc3]`.
#[inline(always)]
unsafe fn tile<const R: usize, const T: usize>(n: usize, w: [&[u8]; R], a: [&[u8]; T]) -> [[[__m512; 2]; T]; R] {
    let mut acc = [[[_mm512_setzero_ps(); 2]; T]; R];
    let (pw, pa) = (w.map(|r| r.as_ptr() as *const f32), a.map(|t| t.as_ptr() as *const f32));
    let mut i = 0;
    while i + 32 <= n {
        // SAFETY (this block): i + 32 <= n elements of every row; unaligned loads.
        unsafe {
            let wv = pw.map(|p| [_mm512_loadu_ps(p.add(i)), _mm512_loadu_ps(p.add(i + 16))]);
            for t in 0..T {
                let x = [_mm512_loadu_ps(pa[t].add(i)), _mm512_loadu_ps(pa[t].add(i + 16))];
                for r in 0..R {
                    acc[r][t][0] = _mm512_fmadd_ps(wv[r][0], x[0], acc[r][t][0]);
                    acc[r][t][1] = _mm512_fmadd_ps(wv[r][1], x[1], acc[r][t][1]);
                }
            }
        }
        i += 32;
    }
    acc
}

/// Rows of the AVX2 register tile (one token): 3 rows × 4 accumulators + the token's
/// vector = 13 of the 16 ymm registers, the rows' vectors read as FMA operands.
const ROWS_AVX2: usize = 3;

/// [`block`] on plain AVX2: the same token blocks, a tile of `ROWS_AVX2` rows × one token
/// (its rows stay in L1 while the block's tokens pass), each pair with `dot_f32`'s four
/// 8-lane accumulators and the same FMA per element in the same order, then
/// `dot_f32_tail`: bitwise `x86::dot_f32`. Measured (real-dims router 2048 × 256, 512
/// tokens, `PN_NO_AVX512=1`, Intel Xeon 6/207, 2 threads, per call): see docs/perf.md
/// "Session 23".
///
/// # Safety
/// AVX2 + FMA available; as [`block`] otherwise.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn block_avx2(n: usize, w: &[u8], wstride: usize, rows: usize, a: &[u8], astride: usize, m: usize, out: &mut [f32], ostride: usize) {
    let row = |r: usize| &w[r * wstride..r * wstride + 4 * n];
    let tok = |j: usize| &a[j * astride..j * astride + 4 * n];
    // SAFETY (whole body): AVX2 / FMA enabled; every row and token index below is within
    // `rows` / `m` (whole rows by the contract), every output within `out`.
    unsafe {
        for j0 in (0..m).step_by(TOKEN_BLOCK) {
            let j1 = (j0 + TOKEN_BLOCK).min(m);
            let mut r0 = 0;
            while r0 < rows {
                let nr = if r0 + ROWS_AVX2 <= rows { ROWS_AVX2 } else { 1 };
                for j in j0..j1 {
                    if nr == ROWS_AVX2 {
                        let acc = tile_avx2::<ROWS_AVX2>(n, std::array::from_fn(|r| row(r0 + r)), tok(j));
                        for (r, acc) in acc.into_iter().enumerate() {
                            out[(r0 + r) * ostride + j] = dot_f32_tail(acc, n / 32 * 32, n, row(r0 + r), tok(j));
                        }
                    } else {
                        let [acc] = tile_avx2::<1>(n, [row(r0)], tok(j));
                        out[r0 * ostride + j] = dot_f32_tail(acc, n / 32 * 32, n, row(r0), tok(j));
                    }
                }
                r0 += nr;
            }
        }
    }
}

/// The 32-element steps of `R` rows × one token: per row, `dot_f32`'s four accumulators.
#[inline(always)]
unsafe fn tile_avx2<const R: usize>(n: usize, w: [&[u8]; R], a: &[u8]) -> [[__m256; 4]; R] {
    let mut acc = [[_mm256_setzero_ps(); 4]; R];
    let (pw, pa) = (w.map(|r| r.as_ptr() as *const f32), a.as_ptr() as *const f32);
    let mut i = 0;
    while i + 32 <= n {
        for k in 0..4 {
            // SAFETY (this block): i + 8k + 8 <= n elements of every row and of the token.
            unsafe {
                let x = _mm256_loadu_ps(pa.add(i + 8 * k));
                for r in 0..R {
                    acc[r][k] = _mm256_fmadd_ps(_mm256_loadu_ps(pw[r].add(i + 8 * k)), x, acc[r][k]);
                }
            }
        }
        i += 32;
    }
    acc
}
