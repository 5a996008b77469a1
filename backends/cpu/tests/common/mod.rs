//! Helpers of the CPU backend's kernel tests (`mod common;` in each).

use pn_ops::{GgmlType, Tensor};

/// `rows` rows of `k` elements of `ty` quantized from random floats (`seed`).
pub fn weights(ty: GgmlType, k: usize, rows: usize, seed: u32) -> Vec<u8> {
    let x = pn_ops::testing::uniform(k * rows, seed, 99991);
    let mut out = vec![0u8; ty.row_bytes(k).unwrap() * rows];
    pn_ops::quant::quantize_weights::quantize_weights(ty, &x, &mut out).unwrap();
    out
}

/// A float tensor's bits, to compare results exactly.
pub fn bits(t: &Tensor) -> Vec<u32> {
    t.as_f32().iter().map(|v| v.to_bits()).collect()
}
