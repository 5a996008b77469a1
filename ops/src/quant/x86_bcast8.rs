//! Q4_K on the AVX2 8-row layout, 4+ tokens: every activation broadcast once per call.
//!
//! `x86_pack8x2` issues a `vpbroadcastd ymm, m32` per 2 groups × 4 elements × token and
//! stores every decoded weight vector into a `Packed8` before its products: at 4 tokens
//! the packing (stores) took ~44% of its time and the broadcasts compete with the
//! products for Zen 3's vector pipes (docs/perf.md "Session 26"). Here a super-block's
//! broadcast activation vectors of a chunk of tokens are stored once (2 KB a token, in
//! L1) and read by every row group of the call as `vpmaddubsw` memory operands, and each
//! weight vector is decoded from the layout straight into a tile of up to 4 tokens'
//! products, in registers (4 i16 chains + 4 i32 sums).
//!
//! Measured (Zen 3, calls or rounds alternated): `moe_bench matmul_few_tokens` Q4_K
//! 2048×4096, 1 thread, 4 tokens 0.596–0.631 → 0.540–0.549 ms (weights streamed; in L3
//! 0.492 → 0.484), 5–7 tokens within ±5%; from 8 tokens slower (8 / 16 / 64: 0–20%,
//! 14%, 35%), hence [`BCAST_TO`]. In the model: full-dims q4_k_m K = 4 decode
//! (`decode_ab SLOTS=4`) per-round median 1.082 (old first) and 1/0.959 (new first);
//! real-dims pp128 (`prefill_ab`, experts with ~4 tokens) 1.035 and 1/0.995.
//!
//! Order: token chunks of [`CHUNK`]; in each, super-block by super-block (its activation
//! vectors built once), every 8-row group of the call, tiles of 4 tokens; each group's
//! float sums (`groups × CHUNK` vectors) stay in the thread's [`Scratch`] across the
//! super-blocks. The integer sums are exact and the float step per super-block and token
//! is `x86_pack8`'s (`pack_scales8`, `corr8`, `term8`) in block order, so every lane is
//! bitwise the 8-row kernel's, and `vec_dot`'s.

use super::q8::{Q8_K_BSUMS, Q8_K_BYTES, Q8_K_QS};
use super::x86_out::Out;
use super::x86_pack8::{bcast4, corr8, pack_scales8, store_rows8, term8, Packed8, Q4K};
use super::x86_rows8::{block_bytes, Pre8, Src8};
use std::arch::x86_64::*;

/// Tokens whose activation vectors (2 KB each) a super-block keeps in L1.
const CHUNK: usize = 8;

/// Fewest tokens that take this kernel (knob `KNOB_PACK8_BCAST_FROM`).
pub(super) const BCAST_FROM: usize = 4;

/// Most tokens that take it: from 8, `x86_pack8x2` (two tiles of 4 decode every weight
/// vector twice, a tile of 8 spills).
pub(super) const BCAST_TO: usize = 7;

/// A thread's buffers, grown only.
#[derive(Default)]
pub struct Scratch {
    /// Per token of the chunk: 64 broadcast element vectors, then 8 broadcast bsum pairs.
    acts: Vec<__m256i>,
    /// Per token of the chunk: its Q8_K scale, splat.
    yd: Vec<__m256>,
    /// Per group: `CHUNK` float sums (8 rows each).
    sums: Vec<__m256>,
    /// One group's scales and mins (`pack_scales8`; its element vectors unused).
    pk: Option<Box<Packed8>>,
}

/// Groups ahead whose super-block is prefetched.
const PF_GROUPS: usize = 2;

/// Prefetches `n` bytes at `p` into L1 (a prefetch never faults).
#[inline(always)]
fn prefetch(p: *const u8, n: usize) {
    for off in (0..n).step_by(64) {
        // SAFETY: a prefetch is a hint: it never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off) as *const i8) };
    }
}

/// Vectors a token takes in `Scratch::acts`.
const PER_TOKEN: usize = 64 + 8;

/// Grows `v` to `n` elements.
fn grown<T: Copy>(v: &mut Vec<T>, n: usize, zero: T) -> &mut [T] {
    if v.len() < n {
        v.resize(n, zero);
    }
    &mut v[..n]
}

/// The integer sums of one group's laid-out super-block at `blk` with `T` tokens whose
/// activation vectors start at `acts` (`PER_TOKEN` apart): lane r = Σ_s scale_s · Σ
/// products of row r over sub-block s.
#[inline(always)]
unsafe fn ints<const T: usize>(blk: *const u8, sc: &[__m256i; 16], acts: *const __m256i) -> [__m256i; T] {
    let z = _mm256_setzero_si256();
    let m4 = _mm256_set1_epi8(0x0f);
    let mut isum = [z; T];
    // SAFETY (whole body): a whole laid-out Q4_K super-block at blk (its qs chunk c is
    // vectors 4 + 8c.. of 32 bytes) and T tokens' PER_TOKEN vectors at acts (the caller's
    // contract).
    unsafe {
        for c in 0..4 {
            // nibble h of qs chunk c is sub-block 2c + h: its 8 groups summed in i16
            // (8·2·15·128 = 30720: no overflow), then scaled into i32
            for hi in 0..2 {
                let s = 2 * c + hi;
                let mut acc = [z; T];
                // an opaque base: each nibble pass loads its vectors again (from L1)
                // rather than the compiler keeping the chunk's 8 across both and spilling
                let b = std::hint::black_box(blk);
                for g in 0..8 {
                    let q = _mm256_loadu_si256(b.add(32 * (4 + 8 * c + g)) as *const __m256i);
                    let v = if hi == 0 { _mm256_and_si256(q, m4) } else { _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4) };
                    for (j, a) in acc.iter_mut().enumerate() {
                        *a = _mm256_add_epi16(*a, _mm256_maddubs_epi16(v, *acts.add(PER_TOKEN * j + 8 * s + g)));
                    }
                }
                for (is, a) in isum.iter_mut().zip(acc) {
                    *is = _mm256_add_epi32(*is, _mm256_madd_epi16(a, sc[s]));
                }
            }
        }
    }
    isum
}

/// One tile of `T` tokens (chunk tokens `t0..t0 + T`) of one group's super-block: its
/// float terms added to `sums[t0..]`.
#[inline(always)]
unsafe fn tile<const T: usize>(blk: *const u8, pk: &Packed8, acts: &[__m256i], yd: &[__m256], t0: usize, sums: &mut [__m256]) {
    // SAFETY: the chunk's tokens t0..t0 + T have their vectors in acts (the caller's).
    let is = unsafe { ints::<T>(blk, &pk.sc, acts[PER_TOKEN * t0..].as_ptr()) };
    for (j, isj) in is.iter().enumerate() {
        let t = t0 + j;
        let bs: &[__m256i; 8] = acts[PER_TOKEN * t + 64..PER_TOKEN * (t + 1)].try_into().expect("8 bsum vectors");
        // SAFETY: AVX2 enabled in every caller.
        unsafe { sums[t] = _mm256_add_ps(sums[t], term8::<Q4K>(pk, *isj, corr8(pk, bs), yd[t])) };
    }
}

/// `rows` (a multiple of 8) Q4_K rows in the 8-row layout at `w` (`nb` super-blocks
/// each) against `m` tokens of Q8_K activations at `a + j·astride`: `out[r·ostride + j]`.
///
/// # Safety
/// AVX2 + FMA + F16C enabled in the caller; `w` holds `rows` laid-out rows of `nb`
/// blocks, `m` tokens of `nb` Q8_K blocks at `a + j·astride`, `out` holds
/// `(rows − 1)·ostride + m` floats.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) unsafe fn run(nb: usize, w: *const u8, rows: usize, a: *const u8, astride: usize, m: usize, out: Out, sc: &mut Scratch) {
    let groups = rows / 8;
    let gbytes = 8 * nb * block_bytes::<Q4K>();
    let Scratch { acts, yd, sums, pk } = sc;
    let acts = grown(acts, PER_TOKEN * CHUNK, _mm256_setzero_si256());
    let yd = grown(yd, CHUNK, _mm256_setzero_ps());
    let sums = grown(sums, groups * CHUNK, _mm256_setzero_ps());
    // SAFETY: an all-zero bit pattern is valid for vectors and floats.
    let pk = pk.get_or_insert_with(|| Box::new(unsafe { std::mem::zeroed() }));
    let mut c0 = 0;
    while c0 < m {
        let mc = CHUNK.min(m - c0);
        sums.fill(_mm256_setzero_ps());
        for i in 0..nb {
            for t in 0..mc {
                // SAFETY: token c0 + t's block i is Q8_K_BYTES at y (the caller's contract).
                unsafe {
                    let y = a.add((c0 + t) * astride + i * Q8_K_BYTES);
                    let at = &mut acts[PER_TOKEN * t..PER_TOKEN * (t + 1)];
                    for (v, x) in at[..64].iter_mut().enumerate() {
                        *x = bcast4(y.add(Q8_K_QS + 4 * v));
                    }
                    for (p, x) in at[64..].iter_mut().enumerate() {
                        *x = bcast4(y.add(Q8_K_BSUMS + 4 * p));
                    }
                    yd[t] = _mm256_set1_ps((y as *const f32).read_unaligned());
                }
            }
            for g in 0..groups {
                // SAFETY: group g's super-block i is within w (the caller's contract).
                let src = unsafe { Pre8 { p: w.add(g * gbytes) }.block::<Q4K>(i) };
                // the super-block PF_GROUPS groups on (or the next super-block's): the
                // groups' blocks are gbytes apart, where the hardware's streams stop
                let (pg, pi) = if g + PF_GROUPS < groups { (g + PF_GROUPS, i) } else { (g + PF_GROUPS - groups, i + 1) };
                if pi < nb {
                    prefetch(w.wrapping_add(pg * gbytes + pi * 8 * block_bytes::<Q4K>()), 8 * block_bytes::<Q4K>());
                }
                // SAFETY: as above.
                unsafe { pack_scales8::<Q4K, Pre8>(src, pk) };
                let s = &mut sums[g * CHUNK..(g + 1) * CHUNK];
                let mut t = 0;
                // SAFETY (each tile): the tokens t.. of the chunk have their vectors in acts.
                unsafe {
                    while t + 4 <= mc {
                        tile::<4>(src.p, pk, acts, yd, t, s);
                        t += 4;
                    }
                    match mc - t {
                        3 => tile::<3>(src.p, pk, acts, yd, t, s),
                        2 => tile::<2>(src.p, pk, acts, yd, t, s),
                        1 => tile::<1>(src.p, pk, acts, yd, t, s),
                        _ => {}
                    }
                }
            }
        }
        for g in 0..groups {
            for (j, v) in sums[g * CHUNK..g * CHUNK + mc].iter().enumerate() {
                // SAFETY: AVX2 enabled in every caller; out holds the group's 8 rows.
                unsafe { store_rows8(*v, 8, out.at(8 * g, 0), c0 + j) };
            }
        }
        c0 += mc;
    }
}
