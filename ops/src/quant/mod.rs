//! GGUF block formats (spec §7): exact reference dequantization for every supported
//! type, the activation quantizers llama.cpp applies before quantized dot products
//! (spec §8.2), and `vec_dot` of a weight row with a quantized activation row (§8.3).
//!
//! CONTRACT (used by pn-engine / pn-cpu; keep these signatures):
//! - `dequantize_row(ty, src, out)`: `src` holds exactly `out.len() / block_size` blocks.
//! - `vec_dot_type(w)`: the activation format for weight type `w`.
//! - `quantize_row(act_ty, x, out)`: f32 row -> `act_ty` blocks (`out.len()` = row bytes).
//! - `vec_dot(w_ty, n, w_row, act_row) -> f32`.
//!
//! Layout of this module:
//! - [`floats`]: F32 / F16 / BF16 conversion and dot products.
//! - [`q8`]: the activation formats Q8_0, Q8_1, Q8_K (quantizers, dequant, Q8·Q8 dots).
//! - [`legacy`]: Q4_0, Q4_1, Q5_0, Q5_1.
//! - [`k_quants`]: Q2_K .. Q6_K.
//! - [`iq4`]: IQ4_NL, IQ4_XS; [`mxfp4`]: MXFP4.
//! - [`iq_grid`]: the codebook types IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M
//!   (tables in the generated [`iq_grids`]).
//! - `x86` (detection, float types, activation quantizers), `x86_block` (row-block
//!   dispatch), `x86_tile` (quantized dot products for 1..=8 activation rows at once,
//!   AVX2 or AVX-512 VNNI), `x86_pack16` (K-quants decoded once per 16 rows for a
//!   whole batch, AVX-512 VNNI), `x86_pack8` (Q4_K / Q5_K / Q6_K once per 8 rows, plain
//!   AVX2): selected at run time, the scalar fallback always kept.
//! - [`rows16`]: the 16-row interleaved copy of K-quant weights a host backend makes at
//!   load (`x86_rows16`: the same kernels without their per-call transposes).
//!
//! Every scalar kernel is also reachable through [`scalar`] so SIMD kernels can be
//! tested against it.

// Kernel code indexes blocks by the offsets of the spec; ranges read better than iterators.
#![allow(clippy::needless_range_loop)]

use crate::GgmlType;
use thiserror::Error;

pub mod floats;
pub mod iq4;
pub mod iq_grid;
#[rustfmt::skip]
pub mod iq_grids;
pub mod k_quants;
pub mod legacy;
pub mod mxfp4;
pub mod q8;
pub mod quantize_weights;
/// `$go!(k)` with the literal `k` = `$n` for 1 ≤ `$n` ≤ 7, else `$go!(8)`: a runtime
/// token count into a kernel's const-generic one (the x86 kernels take 8 tokens a pass
/// at the most).
#[cfg(target_arch = "x86_64")]
macro_rules! tokens_upto8 {
    ($n:expr, $go:ident) => {
        match $n {
            1 => $go!(1),
            2 => $go!(2),
            3 => $go!(3),
            4 => $go!(4),
            5 => $go!(5),
            6 => $go!(6),
            7 => $go!(7),
            _ => $go!(8),
        }
    };
}
#[cfg(target_arch = "x86_64")]
mod x86;
/// The previous single-row AVX2 kernels, kept as a test oracle: the tile kernels must
/// give bit for bit what they gave (see `x86::tests`).
#[cfg(all(test, target_arch = "x86_64"))]
#[allow(dead_code)]
mod x86_k;
#[cfg(target_arch = "x86_64")]
mod x86_tile;
#[cfg(target_arch = "x86_64")]
mod x86_block;
#[cfg(target_arch = "x86_64")]
pub use x86_block::{knob, set_knobs, KNOB_MOE_LONG_FROM, KNOB_MOE_ROW_TOKENS, KNOB_FUSED_Q4K_FROM, KNOB_FUSED_Q4K_TO, KNOB_FUSED_Q6K_FROM, KNOB_FUSED_Q6K_TO, KNOB_PACK_FROM, KNOB_AMX_FROM, KNOB_AMX_SPLIT_FROM, KNOB_AMX_Q6K_FROM, KNOB_ROWS16, KNOB_FUSED_UPTO, KNOB_AMX_Q8_FROM, KNOB_ROW_BLOCK_BATCH, KNOB_AMX_PAIRS, KNOB_MOE_FUSED_UPTO, KNOB_MOE_TOKEN_BLOCK, KNOB_F32_PREFETCH, KNOB_PACK_AHEAD, KNOB_DELTA_PREFETCH, KNOB_FUSED8_OTHER_UPTO, KNOB_PACK8_BLOCKWISE_UPTO, KNOB_PACK8_PAIRS_FROM, KNOB_PACK8_BCAST_FROM, KNOB_TOKEN_MAJOR, KNOB_ROW_BLOCK, N_KNOBS};
#[cfg(target_arch = "x86_64")]
mod x86_out;
#[cfg(target_arch = "x86_64")]
mod x86_pack16;
#[cfg(target_arch = "x86_64")]
mod x86_amx;
#[cfg(target_arch = "x86_64")]
mod x86_amx_split;
#[cfg(target_arch = "x86_64")]
pub use x86_amx::has_amx;
#[cfg(target_arch = "x86_64")]
pub use x86::has_gfni;
#[cfg(target_arch = "x86_64")]
mod x86_f32;
#[cfg(target_arch = "x86_64")]
mod x86_fused16;
#[cfg(target_arch = "x86_64")]
mod x86_fused8;
#[cfg(target_arch = "x86_64")]
mod x86_pack8;
#[cfg(target_arch = "x86_64")]
mod x86_pack8x2;
#[cfg(target_arch = "x86_64")]
mod x86_bcast8;
#[cfg(target_arch = "x86_64")]
mod x86_amx_q8;
#[cfg(target_arch = "x86_64")]
mod x86_pack_q8;
#[cfg(target_arch = "x86_64")]
mod x86_rows16;
#[cfg(target_arch = "x86_64")]
mod x86_rows8;
#[cfg(target_arch = "x86_64")]
mod x86_rows8_q8;
pub mod rows16;

/// F16 bits -> f32 with F16C when available (false: not done, use the scalar path).
#[cfg(target_arch = "x86_64")]
pub(crate) fn x86_f16_row(src: &[u16], out: &mut [f32]) -> bool {
    x86::f16_bits_to_f32_row(src, out)
}

/// Little-endian F16 bytes -> f32 with F16C when available (false: use the scalar path).
#[cfg(target_arch = "x86_64")]
pub(crate) fn x86_f16_bytes_row(src: &[u8], out: &mut [f32]) -> bool {
    x86::f16_bytes_to_f32_row(src, out)
}

#[derive(Debug, Error, Clone, PartialEq)]
pub enum QuantError {
    #[error("type {0} cannot be dequantized (unsupported block format)")]
    Unsupported(GgmlType),
    #[error("{ty}: row of {n} elements is not a multiple of the block size {block}")]
    BadLength {
        ty: GgmlType,
        n: usize,
        block: usize,
    },
    #[error("{ty}: expected {expected} bytes for {n} elements, found {found}")]
    BadBytes {
        ty: GgmlType,
        n: usize,
        expected: usize,
        found: usize,
    },
}

/// Whether `dequantize_row` / `vec_dot` know the block format `ty` as a weight.
fn is_weight(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16
            | BF16
            | Q4_0
            | Q4_1
            | Q5_0
            | Q5_1
            | Q8_0
            | Q2K
            | Q3K
            | Q4K
            | Q5K
            | Q6K
            | Q8K
            | IQ4NL
            | IQ4XS
            | MXFP4
            | IQ2XXS
            | IQ2XS
            | IQ2S
            | IQ3XXS
            | IQ3S
            | IQ1S
            | IQ1M
    )
}

/// Checks that `n` elements of `ty` fit in `found` bytes (`exact`: and nothing more);
/// returns the number of bytes of the row.
fn check_row(ty: GgmlType, n: usize, found: usize, exact: bool) -> Result<usize, QuantError> {
    let block = ty.block_size();
    if !n.is_multiple_of(block) {
        return Err(QuantError::BadLength { ty, n, block });
    }
    let expected = ty
        .row_bytes(n)
        .ok_or(QuantError::BadLength { ty, n, block })?;
    if found < expected || (exact && found != expected) {
        return Err(QuantError::BadBytes {
            ty,
            n,
            expected,
            found,
        });
    }
    Ok(expected)
}

/// Dequantize one row: `out.len()` elements from `src` blocks of type `ty`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    use GgmlType::*;
    if !is_weight(ty) {
        return Err(QuantError::Unsupported(ty));
    }
    check_row(ty, out.len(), src.len(), true)?;
    match ty {
        F32 => floats::dequant_f32(src, out),
        F16 => floats::dequant_f16(src, out),
        BF16 => floats::dequant_bf16(src, out),
        Q4_0 => legacy::dequant_q4_0(src, out),
        Q4_1 => legacy::dequant_q4_1(src, out),
        Q5_0 => legacy::dequant_q5_0(src, out),
        Q5_1 => legacy::dequant_q5_1(src, out),
        Q8_0 => q8::dequant_q8_0(src, out),
        Q8K => q8::dequant_q8_k(src, out),
        Q2K => k_quants::dequant_q2_k(src, out),
        Q3K => k_quants::dequant_q3_k(src, out),
        Q4K => k_quants::dequant_q4_k(src, out),
        Q5K => k_quants::dequant_q5_k(src, out),
        Q6K => k_quants::dequant_q6_k(src, out),
        IQ4NL => iq4::dequant_iq4_nl(src, out),
        IQ4XS => iq4::dequant_iq4_xs(src, out),
        MXFP4 => mxfp4::dequant_mxfp4(src, out),
        IQ2XXS => iq_grid::dequant_iq2_xxs(src, out),
        IQ2XS => iq_grid::dequant_iq2_xs(src, out),
        IQ2S => iq_grid::dequant_iq2_s(src, out),
        IQ3XXS => iq_grid::dequant_iq3_xxs(src, out),
        IQ3S => iq_grid::dequant_iq3_s(src, out),
        IQ1S => iq_grid::dequant_iq1_s(src, out),
        IQ1M => iq_grid::dequant_iq1_m(src, out),
        _ => return Err(QuantError::Unsupported(ty)),
    }
    Ok(())
}

/// The type activations are converted to before a dot with a weight of type `w` (spec §8.1).
///
/// Types without a dot product (integers, F64, Q8_1, TQ*) map to Q8_K / themselves as
/// ggml does; `vec_dot` rejects them anyway.
pub fn vec_dot_type(w: GgmlType) -> GgmlType {
    use GgmlType::*;
    match w {
        F32 => F32,
        F16 => F16,
        BF16 => BF16,
        Q4_0 | Q5_0 | Q8_0 | IQ4NL | MXFP4 => Q8_0,
        Q4_1 | Q5_1 | Q8_1 => Q8_1,
        Q2K | Q3K | Q4K | Q5K | Q6K | Q8K | IQ4XS | IQ2XXS | IQ2XS | IQ2S | IQ3XXS | IQ3S
        | IQ1S | IQ1M | TQ1_0 | TQ2_0 => Q8K,
        I8 | I16 | I32 | I64 | F64 => w,
    }
}

/// Checked form of [`quantize_row`].
pub fn try_quantize_row(act_ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    use GgmlType::*;
    if !matches!(act_ty, F32 | F16 | BF16 | Q8_0 | Q8_1 | Q8K) {
        return Err(QuantError::Unsupported(act_ty));
    }
    check_row(act_ty, x.len(), out.len(), true)?;
    match act_ty {
        F32 => floats::quantize_f32(x, out),
        F16 => floats::quantize_f16(x, out),
        BF16 => floats::quantize_bf16(x, out),
        Q8_0 => q8::quantize_q8_0(x, out),
        Q8_1 => q8::quantize_q8_1(x, out),
        Q8K => q8::quantize_q8_k(x, out),
        _ => unreachable!("checked above"),
    }
    Ok(())
}

/// Convert an f32 row to `act_ty` (F32, F16, BF16, Q8_0, Q8_1, Q8_K) exactly as ggml's
/// x86 CPU path does. `out.len()` must be `act_ty.row_bytes(x.len())`.
///
/// Never panics: on a bad type or length (see [`try_quantize_row`]) `out` is zero-filled.
pub fn quantize_row(act_ty: GgmlType, x: &[f32], out: &mut [u8]) {
    if try_quantize_row(act_ty, x, out).is_err() {
        out.fill(0);
    }
}

/// Checked form of [`vec_dot`]. `w` and `act` may be longer than the `n`-element rows
/// (only the leading bytes are read).
pub fn try_vec_dot(w_ty: GgmlType, n: usize, w: &[u8], act: &[u8]) -> Result<f32, QuantError> {
    if !is_weight(w_ty) {
        return Err(QuantError::Unsupported(w_ty));
    }
    let a_ty = vec_dot_type(w_ty);
    let wb = check_row(w_ty, n, w.len(), false)?;
    let ab = check_row(a_ty, n, act.len(), false)?;
    let (w, act) = (&w[..wb], &act[..ab]);
    #[cfg(target_arch = "x86_64")]
    if let Some(v) = x86::vec_dot(w_ty, n, w, act) {
        return Ok(v);
    }
    Ok(scalar::vec_dot(w_ty, n, w, act))
}

/// Dot product of `n` elements of a weight row (`w_ty` blocks) with an activation row
/// already converted to `vec_dot_type(w_ty)`.
///
/// Never panics and never reads out of bounds: on a bad type or length (see
/// [`try_vec_dot`]) it returns NaN.
pub fn vec_dot(w_ty: GgmlType, n: usize, w: &[u8], act: &[u8]) -> f32 {
    try_vec_dot(w_ty, n, w, act).unwrap_or(f32::NAN)
}

/// Most activation rows per [`vec_dot_tile`] call.
pub const MAX_TILE: usize = 8;

/// `out[j] = vec_dot(w_ty, n, w, &acts[j·stride..])` for every `j < out.len()`
/// (`out.len() <= MAX_TILE`), bitwise equal to [`vec_dot`], but each weight block is
/// decoded once for all the rows. Never panics: rows that do not fit (or more than
/// `MAX_TILE` of them) give NaN.
pub fn vec_dot_tile(w_ty: GgmlType, n: usize, w: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
    let m = out.len();
    if m > MAX_TILE {
        out.fill(f32::NAN);
        return;
    }
    vec_dot_block(w_ty, n, w, 0, 1, acts, stride, m, out, m);
}

/// The matmul kernel: `out[r·ostride + j] = vec_dot(w_ty, n, &w[r·wstride..],
/// &acts[j·astride..])` for `r < rows`, `j < m` (any number of activation rows),
/// bitwise equal to [`vec_dot`] for every (r, j) whatever `rows` and `m`: each weight
/// block is decoded once for up to `MAX_TILE` activation rows (Q4_K / Q6_K with
/// AVX-512 VNNI and 6+ rows: once for all of them, 16 weight rows at a time), and the
/// lengths are checked once.
/// Never panics: when the rows do not fit, every output it can reach is NaN.
#[allow(clippy::too_many_arguments)]
pub fn vec_dot_block(
    w_ty: GgmlType,
    n: usize,
    w: &[u8],
    wstride: usize,
    rows: usize,
    acts: &[u8],
    astride: usize,
    m: usize,
    out: &mut [f32],
    ostride: usize,
) {
    if m == 0 || rows == 0 {
        return;
    }
    let a_ty = vec_dot_type(w_ty);
    let (wb, ab) = (w_ty.row_bytes(n), a_ty.row_bytes(n));
    let fits = |len: usize, count: usize, stride: usize, one: Option<usize>| {
        one.is_some_and(|one| (count == 1 || one <= stride) && (count - 1).checked_mul(stride).and_then(|o| o.checked_add(one)).is_some_and(|e| e <= len))
    };
    let ok = is_weight(w_ty)
        && n.is_multiple_of(w_ty.block_size())
        && fits(w.len(), rows, wstride, wb)
        && fits(acts.len(), m, astride, ab)
        && fits(out.len(), rows, ostride, Some(m));
    #[cfg(target_arch = "x86_64")]
    if ok && x86_block::vec_dot_block(w_ty, n, w, wstride, rows, acts, astride, m, out, ostride) {
        return;
    }
    for r in 0..rows {
        for j in 0..m {
            let v = match (w.get(r * wstride..), acts.get(j * astride..)) {
                (Some(wr), Some(ar)) => vec_dot(w_ty, n, wr, ar),
                _ => f32::NAN,
            };
            if let Some(o) = out.get_mut(r * ostride + j) {
                *o = v;
            }
        }
    }
}

/// Whether AVX-512F kernels may be used (on top of `simd_available`; detected once;
/// `PN_NO_AVX512` says no).
pub fn avx512_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        x86::has_avx512f()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether AVX2 + FMA + F16C kernels are used (detected once, cached).
pub fn simd_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        x86::has_avx2()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The portable scalar kernels (the reference the SIMD kernels are tested against).
pub mod scalar {
    use super::*;

    /// Scalar `vec_dot`; the caller guarantees the lengths (checked by `try_vec_dot`):
    /// on violated lengths this returns NaN instead of panicking.
    pub fn vec_dot(w_ty: GgmlType, n: usize, w: &[u8], act: &[u8]) -> f32 {
        use GgmlType::*;
        let a_ty = vec_dot_type(w_ty);
        if !is_weight(w_ty)
            || check_row(w_ty, n, w.len(), false).is_err()
            || check_row(a_ty, n, act.len(), false).is_err()
        {
            return f32::NAN;
        }
        let wb = w_ty.row_bytes(n).unwrap_or(0);
        let ab = a_ty.row_bytes(n).unwrap_or(0);
        let (w, a) = (&w[..wb], &act[..ab]);
        match w_ty {
            F32 => floats::dot_f32(w, a),
            F16 => floats::dot_f16(w, a),
            BF16 => floats::dot_bf16(w, a),
            Q4_0 => legacy::dot_q4_0(w, a),
            Q4_1 => legacy::dot_q4_1(w, a),
            Q5_0 => legacy::dot_q5_0(w, a),
            Q5_1 => legacy::dot_q5_1(w, a),
            Q8_0 => q8::dot_q8_0(w, a),
            Q8K => q8::dot_q8_k(w, a),
            Q2K => k_quants::dot_q2_k(w, a),
            Q3K => k_quants::dot_q3_k(w, a),
            Q4K => k_quants::dot_q4_k(w, a),
            Q5K => k_quants::dot_q5_k(w, a),
            Q6K => k_quants::dot_q6_k(w, a),
            IQ4NL => iq4::dot_iq4_nl(w, a),
            IQ4XS => iq4::dot_iq4_xs(w, a),
            MXFP4 => mxfp4::dot_mxfp4(w, a),
            IQ2XXS => iq_grid::dot_iq2_xxs(w, a),
            IQ2XS => iq_grid::dot_iq2_xs(w, a),
            IQ2S => iq_grid::dot_iq2_s(w, a),
            IQ3XXS => iq_grid::dot_iq3_xxs(w, a),
            IQ3S => iq_grid::dot_iq3_s(w, a),
            IQ1S => iq_grid::dot_iq1_s(w, a),
            IQ1M => iq_grid::dot_iq1_m(w, a),
            _ => f32::NAN,
        }
    }

    /// Scalar activation quantizer (same contract as [`super::try_quantize_row`]).
    pub fn quantize_row(act_ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
        use GgmlType::*;
        check_row(act_ty, x.len(), out.len(), true)?;
        match act_ty {
            F32 => floats::quantize_f32(x, out),
            F16 => floats::quantize_f16_scalar(x, out),
            BF16 => floats::quantize_bf16_scalar(x, out),
            Q8_0 => q8::quantize_q8_0_scalar(x, out),
            Q8_1 => q8::quantize_q8_1(x, out),
            Q8K => q8::quantize_q8_k_scalar(x, out),
            _ => return Err(QuantError::Unsupported(act_ty)),
        }
        Ok(())
    }
}

/// Little-endian helpers shared by the block modules.
#[inline(always)]
pub(crate) fn rd_f16(b: &[u8], off: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}
#[inline(always)]
pub(crate) fn rd_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
#[inline(always)]
pub(crate) fn rd_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}
#[inline(always)]
pub(crate) fn rd_f32(b: &[u8], off: usize) -> f32 {
    f32::from_bits(rd_u32(b, off))
}
#[inline(always)]
pub(crate) fn wr_f16(b: &mut [u8], off: usize, v: f32) {
    b[off..off + 2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
}
