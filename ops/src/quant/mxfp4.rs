//! MXFP4 (spec §7.2): 32 E2M1 values sharing one E8M0 exponent; dotted with Q8_0.
//!
//! Block layout: `e: u8 @0 (E8M0), qs: [u8; 16] @1` (17 bytes).

use super::q8::Q8_0_BYTES;
use super::rd_f16;

pub const MXFP4_BYTES: usize = 17;
const _: () = assert!(MXFP4_BYTES == 1 + 16);

/// `kvalues_mxfp4`: the E2M1 values, doubled.
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `GGML_E8M0_TO_FP32_HALF(e)` = 2^(e-127) / 2.
#[inline(always)]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        ((e as u32) - 1) << 23
    };
    f32::from_bits(bits)
}

pub fn dequant_mxfp4(src: &[u8], out: &mut [f32]) {
    for (b, o) in src.chunks_exact(MXFP4_BYTES).zip(out.chunks_exact_mut(32)) {
        let d = e8m0_to_f32_half(b[0]);
        for j in 0..16 {
            o[j] = KVALUES_MXFP4[(b[1 + j] & 15) as usize] as f32 * d;
            o[j + 16] = KVALUES_MXFP4[(b[1 + j] >> 4) as usize] as f32 * d;
        }
    }
}

/// MXFP4·Q8_0: `Σ D_w·d_a·sumi`.
pub fn dot_mxfp4(w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(MXFP4_BYTES).zip(a.chunks_exact(Q8_0_BYTES)) {
        let mut sumi = 0i32;
        for j in 0..16 {
            sumi += KVALUES_MXFP4[(x[1 + j] & 15) as usize] as i32 * (y[2 + j] as i8 as i32);
            sumi += KVALUES_MXFP4[(x[1 + j] >> 4) as usize] as i32 * (y[18 + j] as i8 as i32);
        }
        sumf += e8m0_to_f32_half(x[0]) * rd_f16(y, 0) * sumi as f32;
    }
    sumf
}
