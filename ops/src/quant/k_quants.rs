//! K-quants (spec §7.3): 256-element super-blocks Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, all
//! dotted with Q8_K activations (spec §8.3).
//!
//! Block layouts (byte offsets, little endian):
//! - Q2_K (84 B):  `scales: [u8; 16] @0, qs: [u8; 64] @16, d: f16 @80, dmin: f16 @82`
//! - Q3_K (110 B): `hmask: [u8; 32] @0, qs: [u8; 64] @32, scales: [u8; 12] @96, d: f16 @108`
//! - Q4_K (144 B): `d: f16 @0, dmin: f16 @2, scales: [u8; 12] @4, qs: [u8; 128] @16`
//! - Q5_K (176 B): `d: f16 @0, dmin: f16 @2, scales: [u8; 12] @4, qh: [u8; 32] @16, qs: [u8; 128] @48`
//! - Q6_K (210 B): `ql: [u8; 128] @0, qh: [u8; 64] @128, scales: [i8; 16] @192, d: f16 @208`
//!
//! Every dot decodes the integer weights of a super-block, forms the exact integer
//! sums and applies the float scales once per super-block.

use super::q8::{Q8K, Q8_K_BYTES};
use super::rd_f16;

pub const Q2_K_BYTES: usize = 84;
pub const Q3_K_BYTES: usize = 110;
pub const Q4_K_BYTES: usize = 144;
pub const Q5_K_BYTES: usize = 176;
pub const Q6_K_BYTES: usize = 210;
const _: () = assert!(Q2_K_BYTES == 16 + 64 + 2 + 2);
const _: () = assert!(Q3_K_BYTES == 32 + 64 + 12 + 2);
const _: () = assert!(Q4_K_BYTES == 2 + 2 + 12 + 128);
const _: () = assert!(Q5_K_BYTES == 2 + 2 + 12 + 32 + 128);
const _: () = assert!(Q6_K_BYTES == 128 + 64 + 16 + 2);

/// `get_scale_min_k4`: the 6-bit (scale, min) of sub-block `j` (0..8) from the 12
/// packed bytes.
#[inline(always)]
pub fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// The 16 signed Q3_K scales (already minus 32).
#[inline(always)]
pub fn q3_k_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let low = if i < 8 { s[i] & 15 } else { s[i - 8] >> 4 };
        let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        *o = (low | (high << 4)) as i8 - 32;
    }
    out
}

/// Q2_K integer weights (0..3) of one block, in element order.
#[inline(always)]
fn q2_k_ints(b: &[u8]) -> [i8; 256] {
    let mut q = [0i8; 256];
    for half in 0..2 {
        let qs = &b[16 + 32 * half..16 + 32 * half + 32];
        for j in 0..4 {
            for l in 0..32 {
                q[128 * half + 32 * j + l] = ((qs[l] >> (2 * j)) & 3) as i8;
            }
        }
    }
    q
}

/// Q3_K integer weights (-4..3) of one block, in element order.
#[inline(always)]
fn q3_k_ints(b: &[u8]) -> [i8; 256] {
    let mut q = [0i8; 256];
    let hmask = &b[0..32];
    for half in 0..2 {
        let qs = &b[32 + 32 * half..32 + 32 * half + 32];
        for j in 0..4 {
            let m = 1u8 << (4 * half + j);
            for l in 0..32 {
                let q2 = ((qs[l] >> (2 * j)) & 3) as i8;
                q[128 * half + 32 * j + l] = q2 - if hmask[l] & m != 0 { 0 } else { 4 };
            }
        }
    }
    q
}

/// Q4_K (`qh = None`) or Q5_K integer weights (0..15 / 0..31), in element order.
#[inline(always)]
fn q45_k_ints(qs: &[u8], qh: Option<&[u8]>) -> [i8; 256] {
    let mut q = [0i8; 256];
    for c in 0..4 {
        for l in 0..32 {
            let v = qs[32 * c + l];
            let (mut lo, mut hi) = (v & 15, v >> 4);
            if let Some(qh) = qh {
                lo |= ((qh[l] >> (2 * c)) & 1) << 4;
                hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
            }
            q[64 * c + l] = lo as i8;
            q[64 * c + 32 + l] = hi as i8;
        }
    }
    q
}

/// Q6_K integer weights (-32..31), in element order.
#[inline(always)]
fn q6_k_ints(b: &[u8]) -> [i8; 256] {
    let mut q = [0i8; 256];
    for half in 0..2 {
        let ql = &b[64 * half..64 * half + 64];
        let qh = &b[128 + 32 * half..128 + 32 * half + 32];
        for k in 0..4 {
            for l in 0..32 {
                let lb = ql[l + 32 * (k & 1)];
                let low4 = if k < 2 { lb & 15 } else { lb >> 4 };
                let high2 = (qh[l] >> (2 * k)) & 3;
                q[128 * half + 32 * k + l] = (low4 | (high2 << 4)) as i8 - 32;
            }
        }
    }
    q
}

pub fn dequant_q2_k(src: &[u8], out: &mut [f32]) {
    for (b, o) in src.chunks_exact(Q2_K_BYTES).zip(out.chunks_exact_mut(256)) {
        let (d, dmin) = (rd_f16(b, 80), rd_f16(b, 82));
        let q = q2_k_ints(b);
        for s in 0..16 {
            let dl = d * (b[s] & 15) as f32;
            let ml = dmin * (b[s] >> 4) as f32;
            for e in 16 * s..16 * s + 16 {
                o[e] = dl * q[e] as f32 - ml;
            }
        }
    }
}

pub fn dequant_q3_k(src: &[u8], out: &mut [f32]) {
    for (b, o) in src.chunks_exact(Q3_K_BYTES).zip(out.chunks_exact_mut(256)) {
        let d = rd_f16(b, 108);
        let sc = q3_k_scales(&b[96..108]);
        let q = q3_k_ints(b);
        for s in 0..16 {
            let dl = d * sc[s] as f32;
            for e in 16 * s..16 * s + 16 {
                o[e] = dl * q[e] as f32;
            }
        }
    }
}

fn dequant_q45(b: &[u8], q: &[i8; 256], o: &mut [f32]) {
    let (d, dmin) = (rd_f16(b, 0), rd_f16(b, 2));
    for s in 0..8 {
        let (sc, mn) = scale_min_k4(s, &b[4..16]);
        let (d1, m1) = (d * sc as f32, dmin * mn as f32);
        for e in 32 * s..32 * s + 32 {
            o[e] = d1 * q[e] as f32 - m1;
        }
    }
}

pub fn dequant_q4_k(src: &[u8], out: &mut [f32]) {
    for (b, o) in src.chunks_exact(Q4_K_BYTES).zip(out.chunks_exact_mut(256)) {
        dequant_q45(b, &q45_k_ints(&b[16..144], None), o);
    }
}

pub fn dequant_q5_k(src: &[u8], out: &mut [f32]) {
    for (b, o) in src.chunks_exact(Q5_K_BYTES).zip(out.chunks_exact_mut(256)) {
        dequant_q45(b, &q45_k_ints(&b[48..176], Some(&b[16..48])), o);
    }
}

pub fn dequant_q6_k(src: &[u8], out: &mut [f32]) {
    for (b, o) in src.chunks_exact(Q6_K_BYTES).zip(out.chunks_exact_mut(256)) {
        let d = rd_f16(b, 208);
        let q = q6_k_ints(b);
        for s in 0..16 {
            let dl = d * (b[192 + s] as i8) as f32;
            for e in 16 * s..16 * s + 16 {
                o[e] = dl * q[e] as f32;
            }
        }
    }
}

/// Σ q·q8 over the `len` elements starting at `start`.
#[inline(always)]
fn isum(q: &[i8; 256], q8: &[i8; 256], start: usize, len: usize) -> i32 {
    q[start..start + len]
        .iter()
        .zip(&q8[start..start + len])
        .map(|(&a, &b)| a as i32 * b as i32)
        .sum()
}

pub fn dot_q2_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, yb) in w.chunks_exact(Q2_K_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        let y = Q8K::new(yb);
        let q = q2_k_ints(x);
        let (mut is, mut summs) = (0i32, 0i32);
        for s in 0..16 {
            summs += (x[s] >> 4) as i32 * y.bsum(s);
            is += (x[s] & 15) as i32 * isum(&q, y.qs, 16 * s, 16);
        }
        let dall = y.d * rd_f16(x, 80);
        let dmin = y.d * rd_f16(x, 82);
        sumf += dall * is as f32 - dmin * summs as f32;
    }
    sumf
}

pub fn dot_q3_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, yb) in w.chunks_exact(Q3_K_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        let y = Q8K::new(yb);
        let q = q3_k_ints(x);
        let sc = q3_k_scales(&x[96..108]);
        let mut is = 0i32;
        for s in 0..16 {
            is += sc[s] as i32 * isum(&q, y.qs, 16 * s, 16);
        }
        sumf += rd_f16(x, 108) * y.d * is as f32;
    }
    sumf
}

fn dot_q45(x: &[u8], q: &[i8; 256], y: &Q8K) -> f32 {
    let (mut is, mut summ) = (0i32, 0i32);
    for s in 0..8 {
        let (sc, mn) = scale_min_k4(s, &x[4..16]);
        summ += mn as i32 * (y.bsum(2 * s) + y.bsum(2 * s + 1));
        is += sc as i32 * isum(q, y.qs, 32 * s, 32);
    }
    let d = rd_f16(x, 0) * y.d;
    let dmin = rd_f16(x, 2) * y.d;
    d * is as f32 - dmin * summ as f32
}

pub fn dot_q4_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, yb) in w.chunks_exact(Q4_K_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        sumf += dot_q45(x, &q45_k_ints(&x[16..144], None), &Q8K::new(yb));
    }
    sumf
}

pub fn dot_q5_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, yb) in w.chunks_exact(Q5_K_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        sumf += dot_q45(x, &q45_k_ints(&x[48..176], Some(&x[16..48])), &Q8K::new(yb));
    }
    sumf
}

pub fn dot_q6_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, yb) in w.chunks_exact(Q6_K_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        let y = Q8K::new(yb);
        let q = q6_k_ints(x);
        let mut is = 0i32;
        for s in 0..16 {
            is += (x[192 + s] as i8) as i32 * isum(&q, y.qs, 16 * s, 16);
        }
        sumf += rd_f16(x, 208) * y.d * is as f32;
    }
    sumf
}
