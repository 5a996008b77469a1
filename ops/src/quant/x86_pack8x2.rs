//! Q4_K on the AVX2 8-row layout, 8+ tokens (4–7: `x86_bcast8`, faster there; this
//! kernel takes them where a knob turns that one off): two 8-row groups a pass, two
//! tokens at a time. Each broadcast of 4 activation bytes feeds both groups' `vpmaddubsw` and each
//! weight vector loaded feeds two tokens: per 16 rows × 32 elements × 2 tokens the loop
//! issues 16 broadcasts and 16 weight loads, where `x86_pack8::dot8` issues 32 of each
//! (it reloads a tile's weights for every token: they cannot stay in registers beside its
//! 8 tokens' sums). On Zen 3 a `vpbroadcastd ymm, m32` competes with the products for the
//! vector pipes (docs/perf.md "Session 26"). The i16 chains and integer sums of the two
//! tokens and groups are 8 registers.
//!
//! Tried and not kept (docs/perf.md "Session 27"): one token at a time (the weights
//! reloaded per token: 10–25% slower), 4-token tiles (their 8 sums and 8 chains spill),
//! 3-token tiles (equal); the same loop for Q5_K (in the model 0.995), Q6_K (16-element
//! sub-blocks: a `vpmaddwd` per two products; 1–10% slower) and IQ4_XS (3–10% slower).
//!
//! Order: the super-blocks go one at a time (both groups packed into two `Packed8`, in
//! L1), dotted with every token of a chunk of up to [`CHUNK`], whose float sums stay in
//! the thread's [`Scratch`]; a longer batch runs chunk after chunk (each packing again:
//! ~1% of the products at 64 tokens). The integer sums are exact and the float step per
//! super-block and token is `x86_pack8`'s (`corr8`, `term8`) in block order, so every
//! lane is bitwise the 8-row kernel's, and `vec_dot`'s.

use super::q8::{Q8_K_BYTES, Q8_K_QS};
use super::x86_out::Out;
use super::x86_pack8::{bcast4, bsums8, corr8, pack8, store_rows8, term8, Packed8, Q4K};
use super::x86_rows8::Src8;
use std::arch::x86_64::*;

/// Tokens whose float sums stay in L1 while the super-blocks go by (4 KB).
const CHUNK: usize = 64;

/// The packed super-blocks of both groups and a chunk's float sums (a thread's, reused:
/// zeroing 10 KB a call cost ~10% at 4 tokens).
#[repr(C, align(32))]
pub struct Scratch {
    pk: [Packed8; 2],
    o: [[__m256; 2]; CHUNK],
}

impl Default for Scratch {
    fn default() -> Scratch {
        // SAFETY: an all-zero bit pattern is valid for vectors and floats.
        unsafe { std::mem::zeroed() }
    }
}

/// Fewest tokens that take this kernel where `x86_bcast8` does not (knob
/// `KNOB_PACK8_PAIRS_FROM`; below it the fused kernels run anyway): `moe_bench matmul_few_tokens` (Zen 3, Q4_K 2048×4096, calls
/// alternated) 1 thread 4 / 8 / 16 / 24 / 64 / 128 tokens 2–6 / 1–2 / 5 / 8 / 10 / 7–9%
/// faster, 2 threads 4 / 8 / 16 / 24 tokens 9 / 4 / 8 / 12%, 64 / 128 / 512 10–14%.
pub(super) const PAIRS_FROM: usize = 4;

/// `T` tokens (activations at `a + t·astride`) against super-block `i` of both groups,
/// packed in `pk`: `sf[t][h]` lane r += row r of group h's dot product over it. Each
/// weight vector loaded feeds `T` tokens, each broadcast both groups: with `T` = 2 the
/// i16 chains and integer sums are 8 registers (more tokens at once spill).
#[inline(always)]
unsafe fn dot16<const T: usize>(pk: &[Packed8; 2], i: usize, a: *const u8, astride: usize, sf: &mut [[__m256; 2]]) {
    let mut is = [[_mm256_setzero_si256(); 2]; T];
    // SAFETY (whole body): token t's block i is Q8_K_BYTES at y[t] (the caller's
    // contract); the qs bytes read are 4 + 32·s + 4·g + 4 <= 260, the bsums @260.
    unsafe {
        let mut y = [a; T];
        for (t, yt) in y.iter_mut().enumerate() {
            *yt = a.add(t * astride + i * Q8_K_BYTES);
        }
        // per sub-block of 32 elements: its 8 groups' pairs summed in i16 (8·2·15·128 =
        // 30720: no overflow), then scaled into i32
        for s in 0..8 {
            let mut acc = [[_mm256_setzero_si256(); 2]; T];
            for g in 0..8 {
                let (w0, w1) = (pk[0].w[8 * s + g], pk[1].w[8 * s + g]);
                for (yt, at) in y.iter().zip(acc.iter_mut()) {
                    let b = bcast4(yt.add(Q8_K_QS + 32 * s + 4 * g));
                    let (p0, p1) = (_mm256_maddubs_epi16(w0, b), _mm256_maddubs_epi16(w1, b));
                    if g == 0 {
                        *at = [p0, p1];
                    } else {
                        at[0] = _mm256_add_epi16(at[0], p0);
                        at[1] = _mm256_add_epi16(at[1], p1);
                    }
                }
            }
            for (at, ist) in acc.iter().zip(is.iter_mut()) {
                ist[0] = _mm256_add_epi32(ist[0], _mm256_madd_epi16(at[0], pk[0].sc[s]));
                ist[1] = _mm256_add_epi32(ist[1], _mm256_madd_epi16(at[1], pk[1].sc[s]));
            }
        }
        for ((yt, ist), sft) in y.iter().zip(&is).zip(sf.iter_mut()) {
            let yd = _mm256_set1_ps((*yt as *const f32).read_unaligned());
            let bs = bsums8(*yt);
            sft[0] = _mm256_add_ps(sft[0], term8::<Q4K>(&pk[0], ist[0], corr8(&pk[0], &bs), yd));
            sft[1] = _mm256_add_ps(sft[1], term8::<Q4K>(&pk[1], ist[1], corr8(&pk[1], &bs), yd));
        }
    }
}

/// Rows 0..16 of two 8-row groups (`src0`, `src1`; `nb` super-blocks each) against `m`
/// tokens of Q8_K activations at `a + j·astride`: `out[r·ostride + j]` (rows 8.. from
/// `src1`); `next` (pointer, bytes): the weights to prefetch meanwhile, a share per
/// super-block of the first chunk; `sc`: the thread's scratch.
///
/// # Safety
/// AVX2 + FMA + F16C enabled in the caller; 8 rows of `nb` blocks at each source, `m`
/// tokens of `nb` Q8_K blocks at `a + j·astride`, `out` holds `15·ostride + m` floats.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) unsafe fn run16<S: Src8>(
    nb: usize,
    src0: S,
    src1: S,
    a: *const u8,
    astride: usize,
    m: usize,
    out: Out,
    next: Option<(*const u8, usize)>,
    sc: &mut Scratch,
) {
    let Scratch { pk, o } = sc;
    let mut c0 = 0;
    while c0 < m {
        let mc = CHUNK.min(m - c0);
        o[..mc].fill([_mm256_setzero_ps(); 2]);
        for i in 0..nb {
            if c0 == 0 {
                super::x86::prefetch_share::<false>(next, nb, i);
            }
            // SAFETY: 8 rows of nb blocks at each source (the caller's contract).
            unsafe {
                pack8::<Q4K, S>(src0.block::<Q4K>(i), &mut pk[0]);
                pack8::<Q4K, S>(src1.block::<Q4K>(i), &mut pk[1]);
            }
            let mut t = 0;
            while t < mc {
                // SAFETY: tokens c0 + t.. and their block i exist (the caller's contract).
                unsafe {
                    let at = a.add((c0 + t) * astride);
                    if t + 1 < mc {
                        dot16::<2>(pk, i, at, astride, &mut o[t..t + 2]);
                    } else {
                        dot16::<1>(pk, i, at, astride, &mut o[t..t + 1]);
                    }
                }
                t += 2;
            }
        }
        for (j, v) in o[..mc].iter().enumerate() {
            // SAFETY: AVX2 enabled in every caller; out holds 16 rows of ostride.
            unsafe {
                store_rows8(v[0], 8, out, c0 + j);
                store_rows8(v[1], 8, out.at(8, 0), c0 + j);
            }
        }
        c0 += mc;
    }
}
