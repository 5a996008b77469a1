//! The non-linear 4-bit formats (spec §7.2, §7.3): IQ4_NL (32-element blocks, dotted
//! with Q8_0) and IQ4_XS (256-element super-blocks, dotted with Q8_K).
//!
//! Block layouts (byte offsets, little endian):
//! - IQ4_NL (18 B): `d: f16 @0, qs: [u8; 16] @2`
//! - IQ4_XS (136 B): `d: f16 @0, scales_h: u16 @2, scales_l: [u8; 4] @4, qs: [u8; 128] @8`

use super::q8::{Q8K, Q8_0_BYTES, Q8_K_BYTES};
use super::{rd_f16, rd_u16};

pub const IQ4_NL_BYTES: usize = 18;
pub const IQ4_XS_BYTES: usize = 136;
const _: () = assert!(IQ4_NL_BYTES == 2 + 16);
const _: () = assert!(IQ4_XS_BYTES == 2 + 2 + 4 + 128);

/// `kvalues_iq4nl`.
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The 6-bit scale of sub-block `ib` of an IQ4_XS block, minus 32.
#[inline(always)]
pub fn iq4_xs_scale(b: &[u8], ib: usize) -> i32 {
    let sh = rd_u16(b, 2) as i32;
    let lo = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) as i32;
    (lo | (((sh >> (2 * ib)) & 3) << 4)) - 32
}

pub fn dequant_iq4_nl(src: &[u8], out: &mut [f32]) {
    for (b, o) in src.chunks_exact(IQ4_NL_BYTES).zip(out.chunks_exact_mut(32)) {
        let d = rd_f16(b, 0);
        for j in 0..16 {
            o[j] = d * KVALUES_IQ4NL[(b[2 + j] & 15) as usize] as f32;
            o[j + 16] = d * KVALUES_IQ4NL[(b[2 + j] >> 4) as usize] as f32;
        }
    }
}

pub fn dequant_iq4_xs(src: &[u8], out: &mut [f32]) {
    for (b, o) in src
        .chunks_exact(IQ4_XS_BYTES)
        .zip(out.chunks_exact_mut(256))
    {
        let d = rd_f16(b, 0);
        for ib in 0..8 {
            let dl = d * iq4_xs_scale(b, ib) as f32;
            let qs = &b[8 + 16 * ib..8 + 16 * ib + 16];
            let o = &mut o[32 * ib..32 * ib + 32];
            for j in 0..16 {
                o[j] = dl * KVALUES_IQ4NL[(qs[j] & 15) as usize] as f32;
                o[j + 16] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
            }
        }
    }
}

/// Σ_j KV[lo(qs[j])]·q8[j] + KV[hi(qs[j])]·q8[j+16] over 16 bytes of `qs`.
#[inline(always)]
fn dot_kv16(qs: &[u8], q8: &[u8]) -> i32 {
    let mut s = 0i32;
    for j in 0..16 {
        s += KVALUES_IQ4NL[(qs[j] & 15) as usize] as i32 * (q8[j] as i8 as i32);
        s += KVALUES_IQ4NL[(qs[j] >> 4) as usize] as i32 * (q8[j + 16] as i8 as i32);
    }
    s
}

/// IQ4_NL·Q8_0: `Σ (d_w·d_a)·sumi`.
pub fn dot_iq4_nl(w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(IQ4_NL_BYTES).zip(a.chunks_exact(Q8_0_BYTES)) {
        let d = rd_f16(x, 0) * rd_f16(y, 0);
        sumf += d * dot_kv16(&x[2..18], &y[2..34]) as f32;
    }
    sumf
}

/// IQ4_XS·Q8_K: `Σ f16(d_w)·d_a·Σ_ib ls_ib·sumi_ib`.
pub fn dot_iq4_xs(w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, yb) in w.chunks_exact(IQ4_XS_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        let y = Q8K::new(yb);
        let mut sumi = 0i32;
        for ib in 0..8 {
            let q8 = &yb[4 + 32 * ib..4 + 32 * ib + 32];
            sumi += iq4_xs_scale(x, ib) * dot_kv16(&x[8 + 16 * ib..8 + 16 * ib + 16], q8);
        }
        sumf += rd_f16(x, 0) * y.d * sumi as f32;
    }
    sumf
}
