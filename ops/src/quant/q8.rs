//! The activation formats (spec §7.2, §7.3, §8.2): Q8_0, Q8_1 and Q8_K.
//!
//! Block layouts (byte offsets, little endian):
//! - Q8_0 (34 B): `d: f16 @0, qs: [i8; 32] @2`
//! - Q8_1 (36 B): `d: f16 @0, s: f16 @2, qs: [i8; 32] @4`
//! - Q8_K (292 B): `d: f32 @0, qs: [i8; 256] @4, bsums: [i16; 16] @260`

use super::{rd_f16, rd_f32, wr_f16};

pub const Q8_0_BYTES: usize = 34;
pub const Q8_1_BYTES: usize = 36;
pub const Q8_K_BYTES: usize = 292;
pub const Q8_K_QS: usize = 4;
pub const Q8_K_BSUMS: usize = 260;
const _: () = assert!(Q8_0_BYTES == 2 + 32);
const _: () = assert!(Q8_1_BYTES == 2 + 2 + 32);
const _: () = assert!(Q8_K_BYTES == 4 + 256 + 2 * 16 && Q8_K_BSUMS == Q8_K_QS + 256);

/// Q8_K block view used by the K-quant / IQ dot products.
#[derive(Clone, Copy)]
pub struct Q8K<'a> {
    pub d: f32,
    pub qs: &'a [i8; 256],
    bsums: &'a [u8],
}

impl<'a> Q8K<'a> {
    #[inline(always)]
    pub fn new(b: &'a [u8]) -> Q8K<'a> {
        let qs: &[u8; 256] = b[Q8_K_QS..Q8_K_QS + 256].try_into().expect("256 bytes");
        // SAFETY: u8 and i8 have the same size and alignment, every bit pattern is valid
        // for both, and the reference keeps the borrow of `b` alive.
        let qs: &'a [i8; 256] = unsafe { &*(qs as *const [u8; 256] as *const [i8; 256]) };
        Q8K {
            d: rd_f32(b, 0),
            qs,
            bsums: &b[Q8_K_BSUMS..Q8_K_BSUMS + 32],
        }
    }
    #[inline(always)]
    pub fn bsum(&self, i: usize) -> i32 {
        i16::from_le_bytes([self.bsums[2 * i], self.bsums[2 * i + 1]]) as i32
    }
}

/// `ggml`'s `nearest_int`: round to nearest even via the 1.5·2^23 trick (exact for
/// |x| < 2^22, which is all Q8_K ever feeds it).
#[inline(always)]
pub fn nearest_int(x: f32) -> i32 {
    let v = x + 12582912.0f32;
    ((v.to_bits() & 0x007f_ffff) as i32) - 0x0040_0000
}

/// Round to nearest, ties to even (`_mm256_round_ps(_, _MM_ROUND_NEAREST)`), then the
/// int8 saturation `_mm256_packs_epi32/epi16` applies.
#[inline(always)]
fn round_i8(x: f32) -> i8 {
    (x.round_ties_even() as i32).clamp(-128, 127) as i8
}

/// Quantizes one 32-element block like ggml's AVX `quantize_row_q8_0`: returns the
/// unrounded `d` and the integer sum.
#[inline(always)]
fn q8_block(x: &[f32], qs: &mut [u8]) -> (f32, i32) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (q, v) in qs.iter_mut().zip(x) {
        let i = round_i8(v * id);
        sum += i as i32;
        *q = i as u8;
    }
    (d, sum)
}

pub fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if super::x86::quantize_q8_0(x, out) {
        return;
    }
    quantize_q8_0_scalar(x, out)
}

pub fn quantize_q8_0_scalar(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(Q8_0_BYTES)) {
        let (d, _) = q8_block(xb, &mut ob[2..]);
        wr_f16(ob, 0, d);
    }
}

pub fn quantize_q8_1(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(Q8_1_BYTES)) {
        let (d, sum) = q8_block(xb, &mut ob[4..]);
        wr_f16(ob, 0, d);
        wr_f16(ob, 2, d * sum as f32);
    }
}

pub fn quantize_q8_k(x: &[f32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if super::x86::quantize_q8_k(x, out) {
        return;
    }
    quantize_q8_k_scalar(x, out)
}

/// `quantize_row_q8_K_ref`.
pub fn quantize_q8_k_scalar(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(256).zip(out.chunks_exact_mut(Q8_K_BYTES)) {
        let (mut max, mut amax) = (0f32, 0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            ob.fill(0);
            continue;
        }
        let iscale = -127.0f32 / max;
        let qs = &mut ob[Q8_K_QS..Q8_K_QS + 256];
        for (q, &v) in qs.iter_mut().zip(xb) {
            *q = nearest_int(iscale * v).min(127) as i8 as u8;
        }
        write_bsums(ob);
        ob[0..4].copy_from_slice(&(1.0f32 / iscale).to_le_bytes());
    }
}

/// Fills the 16 `bsums` of a Q8_K block from its `qs`.
pub(crate) fn write_bsums(ob: &mut [u8]) {
    for g in 0..16 {
        let s: i32 = ob[Q8_K_QS + 16 * g..Q8_K_QS + 16 * g + 16]
            .iter()
            .map(|&q| q as i8 as i32)
            .sum();
        let o = Q8_K_BSUMS + 2 * g;
        ob[o..o + 2].copy_from_slice(&(s as i16).to_le_bytes());
    }
}

pub fn dequant_q8_0(src: &[u8], out: &mut [f32]) {
    for (b, o) in src.chunks_exact(Q8_0_BYTES).zip(out.chunks_exact_mut(32)) {
        let d = rd_f16(b, 0);
        for (y, &q) in o.iter_mut().zip(&b[2..34]) {
            *y = (q as i8) as f32 * d;
        }
    }
}

pub fn dequant_q8_k(src: &[u8], out: &mut [f32]) {
    for (b, o) in src.chunks_exact(Q8_K_BYTES).zip(out.chunks_exact_mut(256)) {
        let d = rd_f32(b, 0);
        for (y, &q) in o.iter_mut().zip(&b[Q8_K_QS..Q8_K_QS + 256]) {
            *y = d * (q as i8) as f32;
        }
    }
}

#[inline(always)]
pub(crate) fn dot_i8_32(a: &[u8], b: &[u8]) -> i32 {
    let mut s = 0i32;
    for (x, y) in a[..32].iter().zip(&b[..32]) {
        s += (*x as i8 as i32) * (*y as i8 as i32);
    }
    s
}

/// Q8_0·Q8_0: `Σ sumi·(d_w·d_a)`.
pub fn dot_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(Q8_0_BYTES).zip(a.chunks_exact(Q8_0_BYTES)) {
        let sumi = dot_i8_32(&x[2..], &y[2..]);
        sumf += sumi as f32 * (rd_f16(x, 0) * rd_f16(y, 0));
    }
    sumf
}

/// Q8_K·Q8_K: `Σ (d_w·d_a)·sumi`.
pub fn dot_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(Q8_K_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        let (x, y) = (Q8K::new(x), Q8K::new(y));
        let sumi: i32 =
            x.qs.iter()
                .zip(y.qs.iter())
                .map(|(&p, &q)| p as i32 * q as i32)
                .sum();
        sumf += x.d * y.d * sumi as f32;
    }
    sumf
}
