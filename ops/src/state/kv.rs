//! KV-cache cell formats: the types, the Walsh–Hadamard rotation llama.cpp applies to
//! quantized caches (spec §9.1), and the reference row encoders / decoders.
//!
//! Every function here is scalar and deterministic, so the reference attention and every
//! backend decode exactly the same f32 values from a cell.

use crate::quant::floats::{f16_bits_to_f32, f32_to_f16_bits};
use crate::quant::legacy::{dequant_q4_0, Q4_0_BYTES};
use crate::quant::q8::{dequant_q8_0, Q8_0_BYTES};
use crate::GgmlType;
use std::fmt;
use std::str::FromStr;

/// The format of one attention layer's K and V cells (both use the same format).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvType {
    F32,
    F16,
    Q8_0,
    /// Q4_0 cells plus f16 shadows of the first [`SINK`] and the last [`WINDOW`] positions.
    #[default]
    Q4_0,
}

/// Attention-sink positions the default Q4_0 cache keeps in f16 (docs/kv-cache.md).
pub const SINK: usize = 4;
/// Most recent positions the default Q4_0 cache keeps in f16 (docs/kv-cache.md).
pub const WINDOW: usize = 64;
/// Window shadows are a ring of `window + SEG` slots; the attention kernels split a batch
/// into runs whose positions span at most `SEG`, so a write never overwrites a shadow an
/// earlier query of the same run still reads.
pub const SEG: usize = 128;

impl KvType {
    pub const ALL: [KvType; 4] = [KvType::F32, KvType::F16, KvType::Q8_0, KvType::Q4_0];

    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }
    /// The GGUF block type of a cell.
    pub fn ggml(self) -> GgmlType {
        match self {
            KvType::F32 => GgmlType::F32,
            KvType::F16 => GgmlType::F16,
            KvType::Q8_0 => GgmlType::Q8_0,
            KvType::Q4_0 => GgmlType::Q4_0,
        }
    }
    pub fn is_quantized(self) -> bool {
        matches!(self, KvType::Q8_0 | KvType::Q4_0)
    }
    /// Elements per block (a row must be a multiple of it).
    pub fn block(self) -> usize {
        if self.is_quantized() {
            32
        } else {
            1
        }
    }
    /// Bytes of one cell of `d` elements (`d` a multiple of [`KvType::block`]).
    pub fn row_bytes(self, d: usize) -> usize {
        match self {
            KvType::F32 => 4 * d,
            KvType::F16 => 2 * d,
            KvType::Q8_0 => d / 32 * Q8_0_BYTES,
            KvType::Q4_0 => d / 32 * Q4_0_BYTES,
        }
    }
    /// The format actually used for head dim `d`: quantized formats need `d % 32 == 0`
    /// and fall back to f16 otherwise.
    pub fn for_head_dim(self, d: usize) -> KvType {
        if self.is_quantized() && !d.is_multiple_of(32) {
            KvType::F16
        } else {
            self
        }
    }
    /// Default (sink, window) f16 shadows of this format: only Q4_0 keeps them.
    pub fn default_shadows(self) -> (usize, usize) {
        match self {
            KvType::Q4_0 => (SINK, WINDOW),
            _ => (0, 0),
        }
    }
    /// Hadamard chunk for Q and K (spec §9.1): for quantized K with `d % 64 == 0`, the
    /// largest power of two ≥ 64 dividing `d`; 0 = no rotation.
    pub fn rot_k(self, d: usize) -> usize {
        if !self.is_quantized() || d == 0 || !d.is_multiple_of(64) {
            return 0;
        }
        let mut n = 64;
        while d.is_multiple_of(2 * n) {
            n *= 2;
        }
        n
    }
    /// Hadamard chunk for V and the attention output: 64 for quantized V with
    /// `d % 64 == 0`; 0 = no rotation.
    pub fn rot_v(self, d: usize) -> usize {
        if self.is_quantized() && d > 0 && d.is_multiple_of(64) {
            64
        } else {
            0
        }
    }
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<KvType, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            "q8_0" | "q8" => Ok(KvType::Q8_0),
            "q4_0" | "q4" => Ok(KvType::Q4_0),
            _ => Err(format!("expected one of f32, f16, q8_0, q4_0, found {s:?}")),
        }
    }
}

/// What happens when a position does not fit in the cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Overflow {
    /// Position ≥ capacity is an error ("context full").
    #[default]
    Error,
    /// Cell = pos % capacity; a query attends to the last `capacity` positions (a sliding
    /// window, not exact attention over the whole sequence).
    Ring,
}

impl FromStr for Overflow {
    type Err = String;
    fn from_str(s: &str) -> Result<Overflow, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "error" => Ok(Overflow::Error),
            "ring" => Ok(Overflow::Ring),
            _ => Err(format!("expected error or ring, found {s:?}")),
        }
    }
}

/// In place: `x ← H_n x` for every `n`-chunk of `x`, with `H_n` the orthonormal Sylvester
/// Walsh–Hadamard matrix (`H_1 = [1/√n]`, `H_2k = [[H, H], [H, −H]]`). Butterflies in a
/// fixed order, then one scale by `1/√n`. `n == 0`: no-op. `H_n² = I` up to rounding.
pub fn hadamard(x: &mut [f32], n: usize) {
    if n == 0 {
        return;
    }
    let scale = 1.0 / (n as f32).sqrt();
    for c in x.chunks_exact_mut(n) {
        let mut h = 1;
        while h < n {
            for i in (0..n).step_by(2 * h) {
                for j in i..i + h {
                    let (a, b) = (c[j], c[j + h]);
                    c[j] = a + b;
                    c[j + h] = a - b;
                }
            }
            h *= 2;
        }
        for v in c.iter_mut() {
            *v *= scale;
        }
    }
}

/// ggml's `quantize_row_q4_0_ref`: per 32 values, `max` = the signed value of largest
/// magnitude, `d = max / −8`, `q = min(15, (int)(x·(1/d) + 8.5))`.
pub fn quantize_q4_0_ref(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(Q4_0_BYTES)) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xb {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        ob[..2].copy_from_slice(&f32_to_f16_bits(d).to_le_bytes());
        for j in 0..16 {
            let x0 = xb[j] * id;
            let x1 = xb[j + 16] * id;
            let q0 = ((x0 + 8.5) as i8).min(15) as u8;
            let q1 = ((x1 + 8.5) as i8).min(15) as u8;
            ob[2 + j] = q0 | (q1 << 4);
        }
    }
}

/// ggml's `quantize_row_q8_0_ref`: `d = amax / 127`, `q = roundf(x·(1/d))`.
pub fn quantize_q8_0_ref(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(Q8_0_BYTES)) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        ob[..2].copy_from_slice(&f32_to_f16_bits(d).to_le_bytes());
        for (q, &v) in ob[2..].iter_mut().zip(xb) {
            *q = ((v * id).round() as i8) as u8;
        }
    }
}

/// Encode one f32 row into a cell of an encoded format (F16, Q8_0, Q4_0).
pub fn encode_row(ty: KvType, x: &[f32], out: &mut [u8]) {
    match ty {
        KvType::F32 => {
            for (v, c) in x.iter().zip(out.chunks_exact_mut(4)) {
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        KvType::F16 => {
            for (v, c) in x.iter().zip(out.chunks_exact_mut(2)) {
                c.copy_from_slice(&f32_to_f16_bits(*v).to_le_bytes());
            }
        }
        KvType::Q8_0 => quantize_q8_0_ref(x, out),
        KvType::Q4_0 => quantize_q4_0_ref(x, out),
    }
}

/// Decode one cell into f32 (exact: the dequantized values of the block format).
pub fn decode_row(ty: KvType, src: &[u8], out: &mut [f32]) {
    match ty {
        KvType::F32 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        KvType::F16 => {
            #[cfg(target_arch = "x86_64")]
            if crate::quant::x86_f16_bytes_row(src, out) {
                return;
            }
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = f16_bits_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        KvType::Q8_0 => dequant_q8_0(src, out),
        KvType::Q4_0 => dequant_q4_0(src, out),
    }
}

/// f32 row -> f16 bits (shadows).
pub fn to_f16(x: &[f32], out: &mut [u16]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = f32_to_f16_bits(v);
    }
}

/// f16 bits -> f32 row (shadows).
pub fn from_f16(src: &[u16], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::quant::x86_f16_row(src, out) {
        return;
    }
    for (o, &b) in out.iter_mut().zip(src) {
        *o = f16_bits_to_f32(b);
    }
}

impl super::KvCache {
    /// Positions `j0..j0 + n` (all ≤ `p`) of K (`key`) or V, KV head `g`, as a query at
    /// `p` reads them, into `out` (`[n][head_dim]`): exactly what `n` calls of
    /// [`super::KvCache::read`] decode (the same conversions, element by element), but
    /// each run of cells stored side by side (sink shadows, window-ring slots up to the
    /// ring's end, main cells up to the window or the ring's wrap) in one call.
    pub fn read_cells(&self, key: bool, g: usize, j0: usize, n: usize, p: usize, out: &mut [f32]) {
        let d = self.head_dim;
        let s = &self.shadow;
        let end = j0 + n;
        assert!(end <= p + 1 && out.len() >= n * d, "read_cells: positions {j0}..{end} for a query at {p}");
        // the first position read from the window shadow (`source`: j + window > p)
        let w0 = if s.window > 0 { (p + 1).saturating_sub(s.window) } else { usize::MAX };
        let mut j = j0;
        while j < end {
            let o = &mut out[(j - j0) * d..];
            let m = if j < s.sink {
                let m = s.sink.min(end) - j;
                let a = (g * s.sink + j) * d;
                from_f16(&(if key { &s.k_sink } else { &s.v_sink })[a..a + m * d], &mut o[..m * d]);
                m
            } else if j >= w0 {
                let slot = j % s.slots;
                let m = (end - j).min(s.slots - slot);
                let a = (g * s.slots + slot) * d;
                from_f16(&(if key { &s.k_win } else { &s.v_win })[a..a + m * d], &mut o[..m * d]);
                m
            } else {
                let cell = self.main_cell(j);
                let m = end.min(w0).min(j + self.capacity - cell) - j;
                let c = g * self.capacity + cell;
                if self.ty == KvType::F32 {
                    o[..m * d].copy_from_slice(&(if key { &self.k } else { &self.v })[c * d..(c + m) * d]);
                } else {
                    let rb = self.row_bytes();
                    decode_row(self.ty, &(if key { &self.kq } else { &self.vq })[c * rb..(c + m) * rb], &mut o[..m * d]);
                }
                m
            };
            debug_assert!(m > 0, "every branch reads at least position j");
            j += m;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{decode_row, from_f16};
    use crate::quant::floats::f16_bits_to_f32;
    use crate::quant::legacy::Q4_0_BYTES;
    use crate::KvType;

    /// Q4_0 cells decode as the scalar formula `(q − 8)·d` gives, bit for bit, for every
    /// f16 scale (NaN scales: NaNs) and all 16 codes in both nibbles.
    #[test]
    fn q4_0_cells_decode_as_the_scalar_formula() {
        let blocks: Vec<u8> = (0..=u16::MAX)
            .flat_map(|d| {
                let mut b = vec![0u8; Q4_0_BYTES];
                b[..2].copy_from_slice(&d.to_le_bytes());
                for (i, q) in b[2..].iter_mut().enumerate() {
                    *q = ((i as u32 * 7 + d as u32) % 16) as u8 | ((((i as u32 * 5 + 3 * d as u32) % 16) as u8) << 4);
                }
                b
            })
            .collect();
        let mut got = vec![0.0f32; blocks.len() / Q4_0_BYTES * 32];
        // a few blocks per call (a cell row of 64 dims is two) and all at once
        for per in [2usize, 65536] {
            for (src, o) in blocks.chunks(per * Q4_0_BYTES).zip(got.chunks_mut(per * 32)) {
                decode_row(KvType::Q4_0, src, o);
            }
            for (b, o) in blocks.chunks_exact(Q4_0_BYTES).zip(got.chunks_exact(32)) {
                let d = f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]));
                for j in 0..32 {
                    let q = if j < 16 { b[2 + j] & 15 } else { b[2 + j - 16] >> 4 };
                    let want = (q as i32 - 8) as f32 * d;
                    assert!(o[j].to_bits() == want.to_bits() || (o[j].is_nan() && want.is_nan()), "scale {:#06x} value {j}: {} vs {want}", u16::from_le_bytes([b[0], b[1]]), o[j]);
                }
            }
        }
    }

    /// The F16C row conversions (cells as bytes at any alignment, shadows as u16) give
    /// what the scalar conversion gives, for every f16 bit pattern (NaNs: a NaN).
    #[test]
    fn f16_rows_convert_every_value_as_the_scalar_path() {
        let bits: Vec<u16> = (0..=u16::MAX).collect();
        let want: Vec<f32> = bits.iter().map(|&b| f16_bits_to_f32(b)).collect();
        let same = |got: &[f32]| {
            got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()))
        };
        let mut out = vec![0.0f32; bits.len()];
        from_f16(&bits, &mut out);
        assert!(same(&out), "shadow rows");
        // one byte in: the cells' rows need not be 2-byte aligned
        let mut bytes = vec![0u8; 1];
        bytes.extend(bits.iter().flat_map(|b| b.to_le_bytes()));
        for row in [7usize, 64, 128] {
            for (i, o) in out.chunks_mut(row).enumerate() {
                let a = 1 + 2 * i * row;
                decode_row(KvType::F16, &bytes[a..a + 2 * o.len()], o);
            }
            assert!(same(&out), "cell rows of {row}");
        }
    }
}
