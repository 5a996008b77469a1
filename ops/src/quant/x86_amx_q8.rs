//! The AMX path of the Q8_0-activation formats' 16-row kernels (`x86_pack_q8`): whole
//! 16-token tiles (and a zero-padded last one), one tile product per 32-element block,
//! then the same float step per block and token as the VNNI kernel (bitwise the same).
//! Q8_0 `rows16` blocks are signed B tiles as they lie in memory: two token tiles share
//! each B load (`run_amx2`); other sources pack B per block (`run_amx`).

use super::x86_pack16::{store_rows, Out};
use super::x86::prefetch_share;
use super::x86_pack_q8::{PackedQ8, SrcQ8};
use std::arch::asm;
use std::arch::x86_64::*;

/// The 16-token tiles of `m` tokens that go through AMX: the whole ones, and the last
/// partial one (zero-padded) when it holds more than `AMX_TAIL` tokens (fewer run on
/// the VNNI kernel).
pub(super) fn amx_tiles(m: usize) -> usize {
    let from = super::x86_block::knob(super::x86_block::KNOB_AMX_Q8_FROM, AMX_MIN_TOKENS).max(1);
    if m >= from && super::x86_amx::has_amx() {
        m / 16 + usize::from(m % 16 > AMX_TAIL)
    } else {
        0
    }
}

/// Tokens of a last partial tile left to the VNNI kernel.
const AMX_TAIL: usize = 4;

/// The `CONFIGURED` mark of [`configure_pairs`] (no sub-block size).
const PAIRS: u8 = 1;

/// Loads the tile configuration of [`pair_issue`]: C tiles 0..4 (16 tokens × 16 rows,
/// i32), A tiles 4 and 5 (16 tokens × 32 bytes), B tiles 6 and 7 (8 dwords × 16 rows).
///
/// # Safety
/// `has_amx()` returned true.
pub(super) unsafe fn configure_pairs() {
    // SAFETY: the caller's contract.
    unsafe { super::x86_amx::load_tiles(PAIRS, [(16, 64), (16, 64), (16, 64), (16, 64), (16, 32), (16, 32), (8, 64), (8, 64)]) }
}

/// Two 16-token tiles' products with one signed 32-byte B tile (`tdpbssd`), left in C
/// tiles `2P` and `2P + 1` ([`pair_store`] writes them out): A = 16 rows of 32 bytes at
/// `a0` and at `a1` (stride 32), B = 8 rows of 64 bytes at `b`. Two independent products
/// per B load keep the tile unit busy while the vector units scale the previous block.
#[inline(always)]
pub(super) unsafe fn pair_issue<const P: usize>(a0: *const u8, a1: *const u8, b: *const u8) {
    // SAFETY: `configure_pairs` ran (the caller), and the bytes above are readable.
    unsafe {
        asm!(
            "tileloadd tmm{tb}, [{b} + {s64}*1]",
            "tileloadd tmm4, [{a0} + {s32}*1]",
            "tileloadd tmm5, [{a1} + {s32}*1]",
            "tilezero tmm{c0}",
            "tilezero tmm{c1}",
            "tdpbssd tmm{c0}, tmm4, tmm{tb}",
            "tdpbssd tmm{c1}, tmm5, tmm{tb}",
            tb = const 6 + P, c0 = const 2 * P, c1 = const 2 * P + 1,
            a0 = in(reg) a0, a1 = in(reg) a1, b = in(reg) b, s32 = in(reg) 32usize, s64 = in(reg) 64usize,
            options(nostack, readonly),
        );
    }
}

/// C tiles `2P` and `2P + 1` into `c0` and `c1` (16 × 16 i32 each).
#[inline(always)]
pub(super) unsafe fn pair_store<const P: usize>(c0: *mut [i32; 256], c1: *mut [i32; 256]) {
    // SAFETY: 1 KB writable at each; `configure_pairs` ran (the caller).
    unsafe {
        asm!(
            "tilestored [{c0} + {s64}*1], tmm{t0}",
            "tilestored [{c1} + {s64}*1], tmm{t1}",
            t0 = const 2 * P, t1 = const 2 * P + 1, c0 = in(reg) c0, c1 = in(reg) c1, s64 = in(reg) 64usize,
            options(nostack),
        );
    }
}

/// Tokens from which whole 16-token tiles go through AMX ([`run_amx`]).
const AMX_MIN_TOKENS: usize = 16;

/// `x86_pack_q8`'s `run` for 16 tokens (`mt` of them real, the rest zero padding) through
/// AMX tiles: per block, one tile product gives the 16 tokens × 16 rows block integers (A = the tokens' activation bytes, B = the weight
/// vectors: `w[l]` is row l of a 32-byte B tile), then the same float step as `run`.
/// Each block's product runs during the previous block's scaling.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) unsafe fn run_amx<const F: u8, S: SrcQ8>(
    nb: usize,
    src: S,
    at: *const u8,
    corr: *const i32,
    da: *const f32,
    mt: usize,
    nr: usize,
    o: Out,
    pf: Option<(*const u8, usize)>,
) {
    use super::x86_amx::{tile_issue, tile_store};
    // signed weights straight from memory: no +128, so no corrections
    let direct = src.signed_b::<F>(0).is_some();
    let mut acc = [_mm512_setzero_ps(); 16];
    // SAFETY: an all-zero bit pattern is a valid PackedQ8 and [i32; 256].
    let (mut b, mut c): ([PackedQ8; 2], [[i32; 256]; 2]) = unsafe { std::mem::zeroed() };
    // block i's product on tile pair i % 2 (B from memory, or packed into b[i % 2]);
    // stored into c[i % 2] only after the previous block's scaling ran meanwhile
    macro_rules! issue {
        ($i:expr) => {{
            let (i, astride) = ($i, 32);
            let y = at.add(512 * i);
            match (src.signed_b::<F>(i), i % 2) {
                (Some(bp), 0) => tile_issue::<0, true>(y, astride, bp),
                (Some(bp), _) => tile_issue::<1, true>(y, astride, bp),
                (None, k) => {
                    b[k] = src.block::<F>(i);
                    let bp = b[k].w.as_ptr() as *const u8;
                    if k == 0 {
                        tile_issue::<0, false>(y, astride, bp);
                    } else {
                        tile_issue::<1, false>(y, astride, bp);
                    }
                }
            }
        }};
    }
    macro_rules! store {
        ($i:expr) => {{
            if $i % 2 == 0 {
                tile_store::<0>(&mut c[0]);
            } else {
                tile_store::<1>(&mut c[1]);
            }
        }};
    }
    // SAFETY (whole body): the caller's contract (tiles configured for 32-byte blocks, 16
    // tokens' A tiles at `at`); a prefetch never faults.
    unsafe {
        issue!(0);
        store!(0);
        for i in 0..nb {
            prefetch_share::<true>(pf, nb, i);
            let d = if direct { src.d::<F>(i) } else { b[i % 2].d };
            if i + 1 < nb {
                issue!(i + 1);
            }
            let ci = &c[i % 2];
            for (j, acc) in acc.iter_mut().enumerate() {
                let mut s = _mm512_loadu_si512(ci[16 * j..].as_ptr() as *const _);
                if !direct {
                    s = _mm512_add_epi32(s, _mm512_set1_epi32(*corr.add(nb * j + i)));
                }
                *acc = _mm512_add_ps(*acc, _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d, _mm512_set1_ps(*da.add(nb * j + i)))));
            }
            if i + 1 < nb {
                store!(i + 1);
            }
        }
        for (j, v) in acc.iter().enumerate().take(mt) {
            store_rows(*v, nr, o, j);
        }
    }
}

/// [`run_amx`] for two 16-token tiles at once (A tiles `at`; `mt` real tokens in each,
/// the second's 0 = none), B straight from a Q8_0 `rows16` source: one B load
/// feeds two tile products, so the tile unit has two independent products in flight.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) unsafe fn run_amx2<const F: u8, S: SrcQ8>(
    nb: usize,
    src: S,
    at: [*const u8; 2],
    da: [*const f32; 2],
    mt: [usize; 2],
    nr: usize,
    o: Out,
    pf: Option<(*const u8, usize)>,
) {
    let mut acc = [[_mm512_setzero_ps(); 16]; 2];
    // SAFETY: an all-zero bit pattern is a valid [i32; 256].
    let mut c: [[[i32; 256]; 2]; 2] = unsafe { std::mem::zeroed() };
    macro_rules! issue {
        ($i:expr, $p:literal) => {
            pair_issue::<$p>(at[0].add(512 * $i), at[1].add(512 * $i), src.signed_b::<F>($i).unwrap_or(core::ptr::null()))
        };
    }
    macro_rules! store {
        ($k:literal) => {{
            let [c0, c1] = &mut c[$k];
            pair_store::<$k>(c0, c1)
        }};
    }
    // SAFETY (whole body): the caller's contract (pair tiles configured; signed B blocks
    // from `src`, 16 tokens' A tiles at each `at`).
    unsafe {
        issue!(0, 0);
        store!(0);
        for i in 0..nb {
            prefetch_share::<true>(pf, nb, i);
            let d = src.d::<F>(i);
            let next = i + 1 < nb;
            if next {
                if (i + 1) % 2 == 0 {
                    issue!(i + 1, 0);
                } else {
                    issue!(i + 1, 1);
                }
            }
            for (h, acc) in acc.iter_mut().enumerate() {
                let ci = &c[i % 2][h];
                for (j, acc) in acc.iter_mut().enumerate().take(mt[h]) {
                    let s = _mm512_loadu_si512(ci[16 * j..].as_ptr() as *const _);
                    *acc = _mm512_add_ps(*acc, _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d, _mm512_set1_ps(*da[h].add(nb * j + i)))));
                }
            }
            if next {
                if (i + 1) % 2 == 0 {
                    store!(0);
                } else {
                    store!(1);
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            for (j, v) in acc.iter().enumerate().take(mt[h]) {
                store_rows(*v, nr, o, 16 * h + j);
            }
        }
    }
}

