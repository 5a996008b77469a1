//! Helpers of the CPU backend's kernel tests (`mod common;` in each).
// each test crate uses some of them
#![allow(dead_code)]

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

/// The `rows16` copy the loader makes of `w` (`rows` rows of `k` elements of `ty`): its
/// whole 16-row groups (an expert stack's rows are whole groups, so all of them; see
/// `Gguf::prepare_rows16`). None where this CPU has no layout for `ty`.
pub fn rows16_copy(ty: GgmlType, k: usize, rows: usize, w: &[u8]) -> Option<Vec<u8>> {
    let covered = rows / 16 * 16;
    let mut p = vec![0u8; covered * ty.row_bytes(k)?];
    pn_ops::quant::rows16::repack(ty, k, covered, w.get(..p.len())?, &mut p).then_some(p)
}
