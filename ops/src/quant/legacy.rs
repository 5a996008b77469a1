//! The 32-element legacy formats (spec §7.2): Q4_0, Q4_1, Q5_0, Q5_1.
//!
//! Block layouts (byte offsets, little endian; element j from the low nibble of qs[j],
//! element j+16 from the high nibble):
//! - Q4_0 (18 B): `d: f16 @0, qs: [u8; 16] @2`
//! - Q4_1 (20 B): `d: f16 @0, m: f16 @2, qs: [u8; 16] @4`
//! - Q5_0 (22 B): `d: f16 @0, qh: u32 @2, qs: [u8; 16] @6`
//! - Q5_1 (24 B): `d: f16 @0, m: f16 @2, qh: u32 @4, qs: [u8; 16] @8`
//!
//! Dots pair Q4_0/Q5_0 with Q8_0 and Q4_1/Q5_1 with Q8_1 (spec §8.3).

use super::q8::{Q8_0_BYTES, Q8_1_BYTES};
use super::{rd_f16, rd_u32};

pub const Q4_0_BYTES: usize = 18;
pub const Q4_1_BYTES: usize = 20;
pub const Q5_0_BYTES: usize = 22;
pub const Q5_1_BYTES: usize = 24;
const _: () = assert!(Q4_0_BYTES == 2 + 16);
const _: () = assert!(Q4_1_BYTES == 2 + 2 + 16);
const _: () = assert!(Q5_0_BYTES == 2 + 4 + 16);
const _: () = assert!(Q5_1_BYTES == 2 + 2 + 4 + 16);

/// The 32 unsigned 4-bit values of a block (element order).
#[inline(always)]
fn nibbles(qs: &[u8]) -> [u8; 32] {
    let mut q = [0u8; 32];
    for j in 0..16 {
        q[j] = qs[j] & 15;
        q[j + 16] = qs[j] >> 4;
    }
    q
}

/// The 32 unsigned 5-bit values of a block (element order).
#[inline(always)]
fn five_bits(qh: u32, qs: &[u8]) -> [u8; 32] {
    let mut q = nibbles(qs);
    for (j, v) in q.iter_mut().enumerate() {
        *v |= (((qh >> j) & 1) as u8) << 4;
    }
    q
}

#[inline(always)]
fn act_i8(y: &[u8]) -> impl Iterator<Item = i32> + '_ {
    y[..32].iter().map(|&v| v as i8 as i32)
}

pub fn dequant_q4_0(src: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::x86::dequant_q4_0(src, out) {
        return;
    }
    for (b, o) in src.chunks_exact(Q4_0_BYTES).zip(out.chunks_exact_mut(32)) {
        let d = rd_f16(b, 0);
        for (y, q) in o.iter_mut().zip(nibbles(&b[2..])) {
            *y = (q as i32 - 8) as f32 * d;
        }
    }
}

pub fn dequant_q4_1(src: &[u8], out: &mut [f32]) {
    for (b, o) in src.chunks_exact(Q4_1_BYTES).zip(out.chunks_exact_mut(32)) {
        let (d, m) = (rd_f16(b, 0), rd_f16(b, 2));
        for (y, q) in o.iter_mut().zip(nibbles(&b[4..])) {
            *y = q as f32 * d + m;
        }
    }
}

pub fn dequant_q5_0(src: &[u8], out: &mut [f32]) {
    for (b, o) in src.chunks_exact(Q5_0_BYTES).zip(out.chunks_exact_mut(32)) {
        let d = rd_f16(b, 0);
        for (y, q) in o.iter_mut().zip(five_bits(rd_u32(b, 2), &b[6..])) {
            *y = (q as i32 - 16) as f32 * d;
        }
    }
}

pub fn dequant_q5_1(src: &[u8], out: &mut [f32]) {
    for (b, o) in src.chunks_exact(Q5_1_BYTES).zip(out.chunks_exact_mut(32)) {
        let (d, m) = (rd_f16(b, 0), rd_f16(b, 2));
        for (y, q) in o.iter_mut().zip(five_bits(rd_u32(b, 4), &b[8..])) {
            *y = q as f32 * d + m;
        }
    }
}

/// Q4_0·Q8_0: `Σ sumi·d_w·d_a`.
pub fn dot_q4_0(w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(Q4_0_BYTES).zip(a.chunks_exact(Q8_0_BYTES)) {
        let sumi: i32 = nibbles(&x[2..])
            .iter()
            .zip(act_i8(&y[2..]))
            .map(|(&q, v)| (q as i32 - 8) * v)
            .sum();
        sumf += sumi as f32 * (rd_f16(x, 0) * rd_f16(y, 0));
    }
    sumf
}

/// Q4_1·Q8_1: `Σ d_w·d_a·sumi + m_w·s_a`.
pub fn dot_q4_1(w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(Q4_1_BYTES).zip(a.chunks_exact(Q8_1_BYTES)) {
        let sumi: i32 = nibbles(&x[4..])
            .iter()
            .zip(act_i8(&y[4..]))
            .map(|(&q, v)| q as i32 * v)
            .sum();
        sumf += (rd_f16(x, 0) * rd_f16(y, 0)) * sumi as f32 + rd_f16(x, 2) * rd_f16(y, 2);
    }
    sumf
}

/// Q5_0·Q8_0: `Σ d_w·d_a·sumi`.
pub fn dot_q5_0(w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(Q5_0_BYTES).zip(a.chunks_exact(Q8_0_BYTES)) {
        let q = five_bits(rd_u32(x, 2), &x[6..]);
        let sumi: i32 = q
            .iter()
            .zip(act_i8(&y[2..]))
            .map(|(&q, v)| (q as i32 - 16) * v)
            .sum();
        sumf += (rd_f16(x, 0) * rd_f16(y, 0)) * sumi as f32;
    }
    sumf
}

/// Q5_1·Q8_1: `Σ d_w·d_a·sumi + m_w·s_a`.
pub fn dot_q5_1(w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(Q5_1_BYTES).zip(a.chunks_exact(Q8_1_BYTES)) {
        let q = five_bits(rd_u32(x, 4), &x[8..]);
        let sumi: i32 = q
            .iter()
            .zip(act_i8(&y[4..]))
            .map(|(&q, v)| q as i32 * v)
            .sum();
        sumf += (rd_f16(x, 0) * rd_f16(y, 0)) * sumi as f32 + rd_f16(x, 2) * rd_f16(y, 2);
    }
    sumf
}
