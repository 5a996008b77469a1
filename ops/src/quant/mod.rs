//! GGUF block formats (spec §7): exact reference dequantization for every supported
//! type, the activation quantizers llama.cpp applies before quantized dot products
//! (spec §8.2), and `vec_dot` of a weight row with a quantized activation row (§8.3).
//!
//! CONTRACT (used by pn-engine / pn-cpu; keep these signatures):
//! - `dequantize_row(ty, src, out)`: `src` holds exactly `out.len() / block_size` blocks.
//! - `vec_dot_type(w)`: the activation format for weight type `w`.
//! - `quantize_row(act_ty, x, out)`: f32 row -> `act_ty` blocks (`out.len()` = row bytes).
//! - `vec_dot(w_ty, n, w_row, act_row) -> f32`.

use crate::GgmlType;
use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum QuantError {
    #[error("type {0} cannot be dequantized (unsupported block format)")]
    Unsupported(GgmlType),
    #[error("{ty}: row of {n} elements is not a multiple of the block size {block}")]
    BadLength { ty: GgmlType, n: usize, block: usize },
    #[error("{ty}: expected {expected} bytes for {n} elements, found {found}")]
    BadBytes { ty: GgmlType, n: usize, expected: usize, found: usize },
}

/// Dequantize one row: `out.len()` elements from `src` blocks of type `ty`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let _ = (ty, src, out);
    todo!("quant helper")
}

/// The type activations are converted to before a dot with a weight of type `w` (spec §8.1).
pub fn vec_dot_type(w: GgmlType) -> GgmlType {
    let _ = w;
    todo!("quant helper")
}

/// Convert an f32 row to `act_ty` (F32, F16, BF16, Q8_0, Q8_1, Q8_K) exactly as ggml's
/// x86 CPU path does. `out.len()` must be `act_ty.row_bytes(x.len())`.
pub fn quantize_row(act_ty: GgmlType, x: &[f32], out: &mut [u8]) {
    let _ = (act_ty, x, out);
    todo!("quant helper")
}

/// Dot product of `n` elements of a weight row (`w_ty` blocks) with an activation row
/// already converted to `vec_dot_type(w_ty)`.
pub fn vec_dot(w_ty: GgmlType, n: usize, w: &[u8], act: &[u8]) -> f32 {
    let _ = (w_ty, n, w, act);
    todo!("quant helper")
}
