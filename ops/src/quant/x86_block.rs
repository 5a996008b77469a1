//! Row-block dispatch of the quantized dot products (x86_64): `vec_dot_block` picks the
//! packed 16-row kernels (`x86_pack16`, AVX-512 VNNI), the packed 8-row K-quant kernels
//! (`x86_pack8`, plain AVX2) or the per-row tile kernels
//! (`x86_tile`, AVX-512 VNNI or AVX2 build), and loops over rows and token tiles.

use super::x86::{has_avx2, has_tile, has_vnni};
use super::x86_amx::{self, has_amx};
use super::{x86_fused16, x86_fused8, x86_pack16, x86_pack8, x86_pack_q8, x86_tile};
use crate::GgmlType;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `out[r·ostride + j] = vec_dot(w_ty, n, w[r·wstride..], a[j·astride..])` for
/// `r < rows`, `j < m` (any number of tokens), bitwise equal to the single-row kernel. Returns
/// false (nothing written) when there is no tile kernel for `w_ty` or no AVX2. The caller
/// (`quant::vec_dot_block`) has checked that `w`, `a` and `out` hold every row.
#[allow(clippy::too_many_arguments)]
pub fn vec_dot_block(
    w_ty: GgmlType,
    n: usize,
    w: &[u8],
    wstride: usize,
    rows: usize,
    a: &[u8],
    astride: usize,
    m: usize,
    out: &mut [f32],
    ostride: usize,
) -> bool {
    if w_ty == GgmlType::F32 && m > 1 && super::avx512_available() && has_avx2() {
        // SAFETY: AVX-512 F (and AVX2 / FMA) detected; the caller checked every row.
        unsafe { super::x86_f32::block(n, w, wstride, rows, a, astride, m, out, ostride) };
        return true;
    }
    if w_ty == GgmlType::F32 && m > 1 && has_avx2() {
        // SAFETY: AVX2 / FMA detected; the caller checked every row.
        unsafe { super::x86_f32::block_avx2(n, w, wstride, rows, a, astride, m, out, ostride) };
        return true;
    }
    if w_ty == GgmlType::F32 && m == 1 && has_avx2() && knob(KNOB_F32_PREFETCH, 1) != 0 {
        // One token (a decode step's router): `vec_dot` row by row, as the generic loop,
        // with the row `PREFETCH_AHEAD` bytes on prefetched as the quantized rows are
        // (the plain loop left an F32 stream to the hardware prefetcher alone).
        let rb = 4 * n;
        for r in 0..rows {
            // SAFETY: prefetches never fault, whatever the address.
            unsafe { prefetch_row(w.as_ptr().wrapping_add(r * wstride + PREFETCH_AHEAD), rb) };
            out[r * ostride] = super::vec_dot(w_ty, n, &w[r * wstride..], a);
        }
        return true;
    }
    if !has_avx2() || !has_tile(w_ty) || m == 0 {
        return false;
    }
    if rows == 0 {
        return true;
    }
    debug_assert!(w.len() >= (rows - 1) * wstride + w_ty.row_bytes(n).unwrap_or(0));
    debug_assert!(a.len() >= (m - 1) * astride);
    debug_assert!(out.len() >= (rows - 1) * ostride + m);
    let q8_kind = match w_ty {
        GgmlType::Q8_0 => Some(x86_pack_q8::Q8_0),
        GgmlType::Q4_0 => Some(x86_pack_q8::Q4_0),
        GgmlType::IQ4NL => Some(x86_pack_q8::IQ4NL),
        GgmlType::MXFP4 => Some(x86_pack_q8::MXFP4),
        _ => None,
    };
    if let (true, Some(kind)) = (m >= PACK_MIN_TOKENS && has_vnni(), q8_kind) {
        PACKED_Q8.with(|sc| {
            let mut sc = sc.borrow_mut();
            // SAFETY: VNNI detected; m activation rows of n/32 blocks (checked by the caller).
            unsafe { x86_pack_q8::prepare(n / 32, a.as_ptr(), astride, m, &mut sc, false) };
            each_group(w, rows, 16, wstride, w_ty.row_bytes(n).unwrap_or(0), |g, nr, next| {
                // SAFETY: VNNI (and AVX2) detected; rows g..g+nr and every token are in
                // bounds (checked by the caller), and out rows g..g+nr too.
                unsafe {
                    x86_pack_q8::group16_q8(
                        kind,
                        n / 32,
                        nr,
                        w.as_ptr().add(g * wstride),
                        wstride,
                        a.as_ptr(),
                        astride,
                        m,
                        &mut out[g * ostride..],
                        ostride,
                        &mut sc,
                        next,
                    )
                }
            });
        });
        return true;
    }
    let f_kind = match w_ty {
        GgmlType::Q4K => Some((x86_pack16::Q4K, knob(KNOB_FUSED_Q4K_FROM, FUSED16_Q4K.0)..=knob(KNOB_FUSED_Q4K_TO, FUSED16_Q4K.1))),
        GgmlType::Q5K => Some((x86_pack16::Q5K, FUSED16_Q5K.0..=FUSED16_Q5K.1)),
        GgmlType::Q6K => Some((x86_pack16::Q6K, knob(KNOB_FUSED_Q6K_FROM, FUSED16_Q6K.0)..=knob(KNOB_FUSED_Q6K_TO, FUSED16_Q6K.1))),
        _ => None,
    };
    if let Some((kind, _)) = f_kind.filter(|(_, tokens)| has_vnni() && rows >= FUSED16_MIN_ROWS && tokens.contains(&m)) {
        SCALES16.with(|pk| {
            let mut pk = pk.borrow_mut();
            each_group(w, rows, 16, wstride, w_ty.row_bytes(n).unwrap_or(0), |g, nr, next| {
                // SAFETY: VNNI (and AVX2) detected; rows g..g+nr and every token are in
                // bounds (checked by the caller), and out rows g..g+nr too.
                unsafe {
                    x86_fused16::group16_fused(
                        kind,
                        n / 256,
                        nr,
                        w.as_ptr().add(g * wstride),
                        wstride,
                        a.as_ptr(),
                        astride,
                        m,
                        &mut out[g * ostride..],
                        ostride,
                        &mut pk,
                        next,
                    )
                }
            });
        });
        return true;
    }
    let k_kind = match w_ty {
        GgmlType::Q4K => Some(x86_pack16::Q4K),
        GgmlType::Q5K => Some(x86_pack16::Q5K),
        GgmlType::Q6K => Some(x86_pack16::Q6K),
        GgmlType::IQ4XS => Some(x86_pack16::IQ4XS),
        _ => None,
    };
    if let Some(kind) = k_kind.filter(|&k| takes_amx(k, m, n, astride)) {
        AMX.with(|sc| {
            let mut sc = sc.borrow_mut();
            let sc = &mut *sc;
            let tail = padded_tail(a, astride, m, (n / 256) * super::q8::Q8_K_BYTES, &mut sc.1);
            each_group(w, rows, 16, wstride, w_ty.row_bytes(n).unwrap_or(0), |g, nr, next| {
                // SAFETY: AMX (and VNNI) detected; rows g..g+nr and every token are in
                // bounds (checked by the caller), the tail tile holds 16 padded rows, and
                // out rows g..g+nr too.
                unsafe {
                    x86_amx::group16(
                        kind,
                        n / 256,
                        nr,
                        w.as_ptr().add(g * wstride),
                        wstride,
                        a.as_ptr(),
                        astride,
                        m,
                        tail,
                        &mut out[g * ostride..],
                        ostride,
                        &mut sc.0,
                        next,
                    )
                }
            });
        });
        return true;
    }
    if let (true, Some(kind)) = (m >= knob(KNOB_PACK_FROM, PACK_MIN_TOKENS) && has_vnni(), k_kind) {
        PACKED16.with(|sc| {
            let mut sc = sc.borrow_mut();
            each_group(w, rows, 16, wstride, w_ty.row_bytes(n).unwrap_or(0), |g, nr, next| {
                // SAFETY: VNNI (and AVX2) detected; rows g..g+nr and every token are in
                // bounds (checked by the caller), and out rows g..g+nr too.
                unsafe {
                    x86_pack16::group16(
                        kind,
                        n / 256,
                        nr,
                        w.as_ptr().add(g * wstride),
                        wstride,
                        a.as_ptr(),
                        astride,
                        m,
                        &mut out[g * ostride..],
                        ostride,
                        &mut sc,
                        next,
                    )
                }
            });
        });
        return true;
    }
    if w_ty == GgmlType::Q4K && !has_vnni() && rows >= FUSED8_MIN_ROWS && FUSED8_Q4K.contains(&m) {
        SCALES8.with(|pk| {
            let mut pk = pk.borrow_mut();
            each_group(w, rows, 8, wstride, w_ty.row_bytes(n).unwrap_or(0), |g, nr, next| {
                // SAFETY: AVX2 detected; rows g..g+nr and every token are in bounds
                // (checked by the caller), and out rows g..g+nr too.
                unsafe {
                    x86_fused8::group8_fused(
                        n / 256,
                        nr,
                        w.as_ptr().add(g * wstride),
                        wstride,
                        a.as_ptr(),
                        astride,
                        m,
                        &mut out[g * ostride..],
                        ostride,
                        &mut pk,
                        next,
                    )
                }
            });
        });
        return true;
    }
    let k8_kind = match w_ty {
        GgmlType::Q4K => Some(x86_pack8::Q4K),
        GgmlType::Q5K => Some(x86_pack8::Q5K),
        GgmlType::Q6K => Some(x86_pack8::Q6K),
        _ => None,
    };
    let pack8_from = if w_ty == GgmlType::Q6K { PACK8_MIN_TOKENS_Q6K } else { PACK8_MIN_TOKENS };
    if let (true, Some(kind)) = (m >= pack8_from && !has_vnni(), k8_kind) {
        PACKED8.with(|sc| {
            let mut sc = sc.borrow_mut();
            each_group(w, rows, 8, wstride, w_ty.row_bytes(n).unwrap_or(0), |g, nr, next| {
                // SAFETY: AVX2 detected; rows g..g+nr and every token are in bounds
                // (checked by the caller), and out rows g..g+nr too.
                unsafe {
                    x86_pack8::group8(
                        kind,
                        n / 256,
                        nr,
                        w.as_ptr().add(g * wstride),
                        wstride,
                        a.as_ptr(),
                        astride,
                        m,
                        &mut out[g * ostride..],
                        ostride,
                        &mut sc,
                        next,
                    )
                }
            });
        });
        return true;
    }
    let g = Geo { n, wstride, rows, astride, ostride };
    for t0 in (0..m).step_by(x86_tile::MAX_TILE) {
        let mt = x86_tile::MAX_TILE.min(m - t0);
        let (wp, ap) = (w.as_ptr(), a[t0 * astride..].as_ptr());
        let o = &mut out[t0..];
        // SAFETY: AVX2/FMA/F16C detected above; the caller checked the lengths.
        unsafe {
            macro_rules! go {
                ($m:literal) => {
                    block_m::<$m>(w_ty, &g, wp, ap, o)
                };
            }
            tokens_upto8!(mt, go)
        }
    }
    true
}

/// Whether a K-quant block (`kind`, `n`-element rows) of `m` tokens runs through the AMX
/// tiles: the CPU has them, there are enough tokens (Q6_K: its split form's break-even),
/// and the activation rows do not overlap (a tile load reads whole rows of 16 tokens).
pub(super) fn takes_amx(kind: u8, m: usize, n: usize, astride: usize) -> bool {
    let from = if kind == x86_pack16::Q6K {
        knob(KNOB_AMX_Q6K_FROM, AMX_Q6K_MIN_TOKENS)
    } else {
        knob(KNOB_AMX_FROM, AMX_MIN_TOKENS)
    };
    m >= from && astride >= (n / 256) * super::q8::Q8_K_BYTES && has_amx()
}

/// The last `m % 16` tokens of `a` (rows of `rb` bytes, `astride` apart) copied into `buf`
/// and padded with zero rows to a whole 16-token tile, when they are more than the
/// AVX-512 tail takes (`x86_amx::VNNI_TAIL`); else null.
pub(super) fn padded_tail(a: &[u8], astride: usize, m: usize, rb: usize, buf: &mut Vec<u8>) -> *const u8 {
    let full = m / 16 * 16;
    if m - full <= x86_amx::VNNI_TAIL {
        return std::ptr::null();
    }
    let end = ((m - 1) * astride + rb).min(a.len());
    buf.clear();
    buf.extend_from_slice(&a[full * astride..end]);
    buf.resize(16 * astride, 0);
    buf.as_ptr()
}

/// Dispatch thresholds that an in-process A/B sweep may override (`moe_bench`: every call
/// alternates between knob sets, the only comparison this noisy 2-core box leaves
/// meaningful); `usize::MAX` = the constant below. Never set outside benchmarks: every
/// kernel is bitwise equal to `vec_dot`, so a knob changes speed only.
static KNOBS: [AtomicUsize; N_KNOBS] = [const { AtomicUsize::new(usize::MAX) }; N_KNOBS];
/// How many knobs there are.
pub const N_KNOBS: usize = 26;
/// `KNOBS[0]`: `PACK_MIN_TOKENS` for the K-quants (AVX-512).
pub const KNOB_PACK_FROM: usize = 0;
/// `KNOBS[1..=4]`: the ends of `FUSED16_Q4K` and `FUSED16_Q6K` (an empty range disables).
pub const KNOB_FUSED_Q4K_FROM: usize = 1;
pub const KNOB_FUSED_Q4K_TO: usize = 2;
pub const KNOB_FUSED_Q6K_FROM: usize = 3;
pub const KNOB_FUSED_Q6K_TO: usize = 4;

/// `KNOBS[5]`, `KNOBS[6]`: the CPU backend's MoE `LONG_BLOCKS_FROM_EXPERTS` and
/// `EXPERT_ROW_TOKENS`.
pub const KNOB_MOE_LONG_FROM: usize = 5;
pub const KNOB_MOE_ROW_TOKENS: usize = 6;
/// `KNOBS[7]`: `AMX_MIN_TOKENS`; `KNOBS[8]`: `x86_amx`'s `SPLIT_MIN_TOKENS` (and `IQ4XS_SPLIT_MIN_TOKENS`).
pub const KNOB_AMX_FROM: usize = 7;
pub const KNOB_AMX_SPLIT_FROM: usize = 8;
/// `KNOBS[9]`: `AMX_Q6K_MIN_TOKENS`.
pub const KNOB_AMX_Q6K_FROM: usize = 9;
/// `KNOBS[10]`: 0 = the CPU backend's matmuls ignore the weights' `rows16` copies.
pub const KNOB_ROWS16: usize = 10;
/// `KNOBS[11]`: `x86_rows16::FUSED_UPTO` (tokens a `rows16` block runs through the fused
/// kernel, `MAX_FUSED` at a time).
pub const KNOB_FUSED_UPTO: usize = 11;
/// `KNOBS[12]`: `x86_pack_q8`'s `AMX_MIN_TOKENS`.
pub const KNOB_AMX_Q8_FROM: usize = 12;
/// `KNOBS[13]`: the CPU backend's `ROW_BLOCK_BATCH` (rows a batched matmul task takes).
pub const KNOB_ROW_BLOCK_BATCH: usize = 13;
/// `KNOBS[14]`: 0 = the AMX paths (`x86_pack_q8`'s, `x86_amx`'s split form) one token
/// tile a pass (not two sharing each `B` tile).
pub const KNOB_AMX_PAIRS: usize = 14;
/// `KNOBS[15]`: the CPU backend's MoE `FUSED_UPTO_TOKENS` (0: never one task per expert).
pub const KNOB_MOE_FUSED_UPTO: usize = 15;
/// `KNOBS[16]`: the CPU backend's MoE `MOE_TOKEN_BLOCK` (tokens per pass over the experts).
pub const KNOB_MOE_TOKEN_BLOCK: usize = 16;
/// `KNOBS[17]`: 0 = the one-token F32 rows without the row prefetch.
pub const KNOB_F32_PREFETCH: usize = 17;
/// `KNOBS[18]`: 0 = the 16-row blocks of 9 tokens and more pack all their super-blocks
/// before the products (`x86_pack16` up to two token tiles, `x86_amx`'s first tile),
/// not each one right before (VNNI) or a step ahead of (AMX) its products.
pub const KNOB_PACK_AHEAD: usize = 18;
/// `KNOBS[19]`: the CPU delta rule's `PREFETCH_GROUPS` (row groups of state prefetched
/// ahead; 0 = none).
pub const KNOB_DELTA_PREFETCH: usize = 19;
/// `KNOBS[20]`: `x86_fused8::fused_other_upto` (tokens up to which the AVX2 8-row
/// layout's Q5_K / Q6_K / IQ4_XS take the fused kernels; 0 = the packed ones).
pub const KNOB_FUSED8_OTHER_UPTO: usize = 20;
/// `KNOBS[21]`: tokens up to which the AVX2 8-row packed kernels (`x86_pack8`) pack each
/// super-block right before all the token tiles' products (0: never).
pub const KNOB_PACK8_BLOCKWISE_UPTO: usize = 21;
/// `KNOBS[22]`: tokens from which the AVX2 8-row layout's Q4_K takes two 8-row groups a
/// pass (`x86_pack8x2::PAIRS_FROM`).
pub const KNOB_PACK8_PAIRS_FROM: usize = 22;
/// `KNOBS[23]`: tokens from which the AVX2 8-row layout's Q4_K reads activations
/// broadcast once a call (`x86_bcast8::BCAST_FROM`).
pub const KNOB_PACK8_BCAST_FROM: usize = 23;
/// `KNOBS[24]`: at 0, batched matmuls take the per-task transpose
/// (`rows16::vec_dot_block_tokens` says no) instead of the kernels' token-major stores:
/// an A/B of the two in one process.
pub const KNOB_TOKEN_MAJOR: usize = 24;
/// `KNOBS[25]`: the CPU backend's `ROW_BLOCK` (rows a one-token matmul task takes).
pub const KNOB_ROW_BLOCK: usize = 25;

/// Knob `i`, or `default` when unset.
#[inline(always)]
pub fn knob(i: usize, default: usize) -> usize {
    match KNOBS[i].load(Ordering::Relaxed) {
        usize::MAX => default,
        v => v,
    }
}

/// Sets every knob (`usize::MAX`: back to the default); for benchmarks only.
pub fn set_knobs(v: &[usize; N_KNOBS]) {
    for (k, &x) in KNOBS.iter().zip(v) {
        k.store(x, Ordering::Relaxed);
    }
}

/// Tokens from which rows are decoded once per 16 rows (`x86_pack16`, `x86_pack_q8`) for
/// the whole batch; below, the per-row tile kernels. Measured on a 256-expert full-dims
/// q4_k_m file (4 layers, 128-token prefill: ~4 tokens per expert, weights streamed from
/// memory), Zen 4, 2 threads, best of interleaved runs: from 6 tokens 707–724 tok/s,
/// from 4: 748–787, from 2 or 3: no better than 6 (the 16-row decode then outweighs the
/// dot products). Both paths are bitwise equal to the single-row kernel.
const PACK_MIN_TOKENS: usize = 4;

/// Tokens from which Q4_K, Q5_K and IQ4_XS run through the AMX tiles (`x86_amx`, 16
/// tokens per tile product) where the CPU has them. Measured (`moe_bench
/// matmul_few_tokens`, Intel Xeon 6/207 with AMX, 2 threads, calls interleaved, AMX vs
/// the AVX-512 kernels, best ms; session 34, after sessions 29–33 made the AVX-512 side
/// faster): Q4_K 2048×4096 n = 16 1.270 vs 0.978, 24 1.705 vs 1.509, 32 1.946 vs 1.904,
/// 48 2.680 vs 2.721, 64 3.482 vs 3.602; Q5_K 16 1.343 vs 1.105, 24 1.976 vs 1.793, 32
/// 2.123 vs 2.223; IQ4_XS 16 1.208 vs 1.046, 24 1.797 vs 1.661, 32 1.906 vs 2.147 (it was
/// 16 when AMX won at 16 tokens: 0.99 vs 1.23 ms in session 8).
const AMX_MIN_TOKENS: usize = 32;

/// Tokens from which Q6_K runs through the AMX tiles (its split form, `x86_amx_split`: 8
/// tile products per super-block and 16 tokens, the scales and the codes' offset folded
/// per call, no bsum correction). Measured (`moe_bench matmul_few_tokens`, Intel Xeon
/// 6/207, 2 threads, calls interleaved, AMX vs `x86_pack16`, best ms): 2048×8192 n=16
/// 3.37 vs 2.76, n=24 4.17 vs 4.23, n=32 3.02 vs 3.78, n=128 7.46 vs 13.4, n=512 29.7 vs
/// 56.4; 512×16384 n=16 1.74 vs 1.67, n=24 2.48 vs 2.42, n=32 2.68 vs 3.25 (the earlier
/// digit form, 16 products a super-block: n=32 4.30 vs 3.30, n=512 40.2 vs 46.7).
const AMX_Q6K_MIN_TOKENS: usize = 32;

/// Tokens from which the AVX2 path (no VNNI) decodes Q4_K / Q5_K rows once per 8 rows
/// (`x86_pack8`) instead of per row; Q6_K (its i16 sums chain only 2 groups: more
/// `vpmaddwd`) from 8. Measured (`quant_tile::tile_throughput`, `PN_NO_AVX512=1`, Zen 4,
/// one thread, GMAC/s tile → packed): Q4_K m=4 60 → 76, m=8 66 → 89, m=64 67 → 101;
/// Q5_K m=4 57 → 60, m=8 60 → 74; Q6_K m=4 63 → 56, m=6 66 → 58, m=8 62 → 73, m=64
/// 62 → 107.
const PACK8_MIN_TOKENS: usize = 4;
const PACK8_MIN_TOKENS_Q6K: usize = 8;

/// Tokens (from, to) for which Q4_K / Q5_K / Q6_K rows run through the fused 16-row
/// kernels (`x86_fused16`, AVX-512 VNNI) instead of the per-row tile kernels (fewer) or
/// `x86_pack16` (more). Measured streaming 256 MB of weights, 256 rows per call (an
/// expert's block), 2 threads, GB/s of weights per thread CPU time (`quant_tile::
/// decode_stream`, Zen 4; the host's steal time left out): Q4_K m=2 22 → 27–42, m=3
/// 18 → 27; Q5_K m=2 24–27 → 32–36, m=3 19 → 27–28; Q6_K m=2 32–34 → 22–31 (the tile
/// kernel already streams at the bound), m=3 22 → 22–30; m=1 the tile kernel (Q6_K
/// 43–49 vs 23–28). m=4 (session 7, `moe_bench`, pack16 → fused, calls interleaved,
/// best of 40, 8 streamed copies): MatMul Q4_K 2048×4096 0.43 → 0.39 ms, 4096×2048
/// 0.45–0.51 → 0.44–0.45; Q6_K 2048×8192 1.32 → 0.95–0.97, 512×16384 0.53 → 0.44;
/// MoeExperts, 256 experts, 64 / 128 tokens: 22.2–24.3 → 21.4–22.2 / 32.6–37.1 →
/// 30.9–33.0 ms. (Q5_K not measured at m=4: stays on pack16.)
const FUSED16_Q4K: (usize, usize) = (2, 4);
const FUSED16_Q5K: (usize, usize) = (2, 3);
const FUSED16_Q6K: (usize, usize) = (3, 4);
/// Rows from which the fused kernels run (each pass decodes 16 rows: a single row, as
/// from `vec_dot`, keeps the tile kernel).
const FUSED16_MIN_ROWS: usize = 8;

/// Tokens for which Q4_K rows run through the fused 8-row AVX2 kernel (`x86_fused8`)
/// instead of the per-row tile kernel, and rows from which (8 per pass). Measured
/// (`PN_NO_AVX512=1`, Zen 4, `quant_tile`: streaming 256 MB, 2 threads, GB/s per thread
/// CPU time; in L2, one thread, GMAC/s): m=2 stream 19–23 → 26–29, in L2 48 → 57;
/// m=3 16–18 → 14–23, in L2 56 → 71; m=1 (decode) stays on the tile kernel.
const FUSED8_Q4K: std::ops::RangeInclusive<usize> = 2..=3;
const FUSED8_MIN_ROWS: usize = 4;

thread_local! {
    // SAFETY: an all-zero bit pattern is a valid Packed8 (vectors and floats).
    pub(super) static SCALES8: std::cell::RefCell<x86_pack8::Packed8> = const { std::cell::RefCell::new(unsafe { std::mem::zeroed() }) };
    // SAFETY: an all-zero bit pattern is a valid Packed16 (vectors and floats).
    pub(super) static SCALES16: std::cell::RefCell<x86_pack16::Packed16> = const { std::cell::RefCell::new(unsafe { std::mem::zeroed() }) };
    pub(super) static PACKED8: std::cell::RefCell<x86_pack8::Scratch8> = std::cell::RefCell::new(x86_pack8::Scratch8::default());
    pub(super) static PAIRS8: std::cell::RefCell<Box<super::x86_pack8x2::Scratch>> = std::cell::RefCell::new(Box::default());
    pub(super) static BCAST8: std::cell::RefCell<super::x86_bcast8::Scratch> = std::cell::RefCell::new(super::x86_bcast8::Scratch::default());
    pub(super) static PACKED16: std::cell::RefCell<x86_pack16::Scratch16> = std::cell::RefCell::new(x86_pack16::Scratch16::default());
    pub(super) static PACKED_Q8: std::cell::RefCell<x86_pack_q8::ScratchQ8> = std::cell::RefCell::new(x86_pack_q8::ScratchQ8::default());
    /// `x86_amx`'s scratch and the padded copy of the last token tile.
    pub(super) static AMX: std::cell::RefCell<(x86_amx::ScratchAmx, Vec<u8>)> = std::cell::RefCell::new(Default::default());
}

/// Geometry of one `vec_dot_block` call.
struct Geo {
    n: usize,
    wstride: usize,
    rows: usize,
    astride: usize,
    ostride: usize,
}

/// Row loop of `vec_dot_block` for `M` tokens: AVX-512 VNNI when present, else AVX2.
#[inline(always)]
unsafe fn block_m<const M: usize>(w_ty: GgmlType, g: &Geo, w: *const u8, a: *const u8, out: &mut [f32]) {
    // SAFETY: the caller detected AVX2/FMA/F16C; `has_vnni` the rest.
    unsafe {
        if has_vnni() {
            block_vnni::<M>(w_ty, g, w, a, out)
        } else {
            block_avx2::<M>(w_ty, g, w, a, out)
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_avx2<const M: usize>(w_ty: GgmlType, g: &Geo, w: *const u8, a: *const u8, out: &mut [f32]) {
    // SAFETY: features enabled here; the caller guarantees the rows.
    unsafe { block_rows::<x86_tile::Avx2, M>(w_ty, g, w, a, out) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn block_vnni<const M: usize>(w_ty: GgmlType, g: &Geo, w: *const u8, a: *const u8, out: &mut [f32]) {
    // SAFETY: features enabled here; the caller guarantees the rows.
    unsafe { block_rows::<x86_tile::Vnni, M>(w_ty, g, w, a, out) }
}

/// The tile kernel for every weight row of a block, the format dispatched once.
#[inline(always)]
unsafe fn block_rows<K: x86_tile::Mac, const M: usize>(
    w_ty: GgmlType,
    g: &Geo,
    w: *const u8,
    a: *const u8,
    out: &mut [f32],
) {
    use x86_tile::*;
    use GgmlType::*;
    macro_rules! rows {
        ($f:expr, $bs:expr) => {{
            for r in 0..g.rows {
                // SAFETY: prefetches never fault, whatever the address.
                unsafe { prefetch_row(w.wrapping_add(r * g.wstride + PREFETCH_AHEAD), g.wstride) };
                let mut o = [0f32; M];
                // SAFETY: the caller enabled the features and guarantees row r of the
                // weights at w + r·wstride and every token's activations.
                unsafe { $f(g.n / $bs, w.add(r * g.wstride), a, g.astride, &mut o) };
                out[r * g.ostride..r * g.ostride + M].copy_from_slice(&o);
            }
        }};
    }
    match w_ty {
        Q4K => rows!(tile_q45::<K, M, false>, 256),
        Q5K => rows!(tile_q45::<K, M, true>, 256),
        Q6K => rows!(tile_q6_k::<K, M>, 256),
        IQ4XS => rows!(tile_iq4_xs::<K, M>, 256),
        Q8_0 => rows!(tile_q8_0::<K, M>, 32),
        Q4_0 => rows!(tile_q4_0::<K, M>, 32),
        MXFP4 => rows!(tile_mxfp4::<K, M>, 32),
        IQ4NL => rows!(tile_iq4_nl::<K, M>, 32),
        _ => unreachable!("has_tile"),
    }
}

/// How far ahead of the row being dotted the row loop prefetches the weights (bytes), with
/// the non-temporal hint. Measured on full-dims q4_k_m decode (2 threads, weights
/// streamed from memory): none 110–120 tok/s; 4–12 KB ahead 125–129 (NTA) vs 118–126
/// (T0); 32 KB+ falls back. The hardware prefetcher alone leaves the stream short.
const PREFETCH_AHEAD: usize = 8192;

/// Prefetches the `bytes` at `p` (one weight row) into L1: non-temporal on AMD, plain
/// (T0) on Intel. Measured on the decode shapes (`moe_bench`, 1 token, calls interleaved,
/// best of 30, GB/s of weights): Intel Xeon (Sapphire Rapids, AVX-512 + AMX, 2 vCPUs)
/// MatMul 5.3–6.8 with NTA, 9.2–10.7 with T0 (3–8 KB ahead alike), 8.0–11.2 without;
/// MoeExperts 1.54 → 0.87 ms. Zen 4: NTA 125–129 tok/s, T0 118–126 (above).
#[inline(always)]
unsafe fn prefetch_row(p: *const u8, bytes: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_NTA, _MM_HINT_T0};
    let t0 = prefetch_t0();
    let mut off = 0;
    while off < bytes {
        // SAFETY: a prefetch is a hint; it never faults.
        unsafe {
            if t0 {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off) as *const i8)
            } else {
                _mm_prefetch::<_MM_HINT_NTA>(p.wrapping_add(off) as *const i8)
            }
        };
        off += 64;
    }
}

/// Whether the row prefetch uses the T0 hint (an Intel CPU; detected once).
fn prefetch_t0() -> bool {
    static T0: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
    super::x86::detected_once(&T0, || {
        let v = std::arch::x86_64::__cpuid(0);
        (v.ebx, v.edx, v.ecx) == (0x756e_6547, 0x4965_6e69, 0x6c65_746e) // "GenuineIntel"
    })
}

/// `f(g, nr, next)` for each group of `group` rows of `w` (row stride `wstride`, `wrb`
/// bytes a row): `g` its first row, `nr` ≤ `group` its rows, `next` the following group's
/// weights to prefetch meanwhile (`next_group`): the loop of every prefetching packed kernel.
#[inline(always)]
pub(super) fn each_group(w: &[u8], rows: usize, group: usize, wstride: usize, wrb: usize, mut f: impl FnMut(usize, usize, Option<(*const u8, usize)>)) {
    for g in (0..rows).step_by(group) {
        f(g, (rows - g).min(group), next_group(w, g, group, rows, wstride, wrb));
    }
}

/// The bytes of the row group after rows `g..g + group` (at most `group` rows, inside
/// `w`: the last row ends at its `wrb` bytes), for the packed kernels' prefetch; `None`
/// after the last group.
fn next_group(w: &[u8], g: usize, group: usize, rows: usize, wstride: usize, wrb: usize) -> Option<(*const u8, usize)> {
    (g + group < rows).then(|| {
        let end = ((rows - 1) * wstride + wrb).min(w.len());
        let start = (g + group) * wstride;
        (w[start..end].as_ptr(), (group * wstride).min(end - start))
    })
}

#[cfg(test)]
mod tests {
    use super::super::x86_k;
    use super::*;
    use crate::quant::x86::vec_dot;
    /// The tile kernels (M = 1) give exactly what the previous AVX2 kernels gave (the
    /// Q8_0-activation formats: their scalar dots).
    #[test]
    fn tile_equals_previous_kernels() {
        if !has_avx2() {
            return;
        }
        use GgmlType::*;
        let mut s = 0x1234_5678_9abc_def0u64;
        let mut rnd = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for ty in [Q8_0, Q4_0, MXFP4, IQ4NL, IQ4XS, Q4K, Q5K, Q6K] {
            for nb in [1usize, 2, 5, 8] {
                let n = nb * ty.block_size();
                let mut w: Vec<u8> = (0..ty.row_bytes(n).unwrap()).map(|_| rnd() as u8).collect();
                let ts = ty.type_size();
                for b in w.chunks_mut(ts) {
                    let h = half::f16::from_f32(0.01).to_le_bytes();
                    match ty {
                        Q6K => b[208..210].copy_from_slice(&h),
                        MXFP4 => b[0] = 120,
                        Q4K | Q5K => { b[0..2].copy_from_slice(&h); b[2..4].copy_from_slice(&h) }
                        _ => b[0..2].copy_from_slice(&h),
                    }
                }
                let at = crate::quant::vec_dot_type(ty);
                let x: Vec<f32> = (0..n).map(|_| (rnd() % 2001) as f32 / 1000.0 - 1.0).collect();
                let mut a = vec![0u8; at.row_bytes(n).unwrap()];
                crate::quant::quantize_row(at, &x, &mut a);
                // SAFETY: AVX2 detected; rows of exactly nb blocks.
                let old = unsafe {
                    match ty {
                        Q8_0 => crate::quant::q8::dot_q8_0(&w, &a),
                        Q4_0 => crate::quant::legacy::dot_q4_0(&w, &a),
                        MXFP4 => crate::quant::mxfp4::dot_mxfp4(&w, &a),
                        IQ4NL => crate::quant::iq4::dot_iq4_nl(&w, &a),
                        IQ4XS => x86_k::dot_iq4_xs(nb, &w, &a),
                        Q4K => x86_k::dot_q4_k(nb, &w, &a),
                        Q5K => x86_k::dot_q5_k(nb, &w, &a),
                        _ => x86_k::dot_q6_k(nb, &w, &a),
                    }
                };
                let new = vec_dot(ty, n, &w, &a).unwrap();
                assert_eq!(old.to_bits(), new.to_bits(), "{ty} nb={nb}: {old} vs {new}");
            }
        }
    }
}
