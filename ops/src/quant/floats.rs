//! F32 / F16 / BF16 rows (spec §7.1): conversion, activation rounding and dot products.

use half::f16;

/// f32 -> bf16 bits as ggml's `GGML_FP32_TO_BF16`: NaN -> quiet NaN with the high half
/// kept, otherwise round to nearest even.
#[inline(always)]
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

#[inline(always)]
pub fn bf16_bits_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

#[inline(always)]
pub fn f16_bits_to_f32(b: u16) -> f32 {
    f16::from_bits(b).to_f32()
}

/// f32 -> f16 bits, IEEE round to nearest even (as F16C `_cvtss_sh(x, 0)`).
#[inline(always)]
pub fn f32_to_f16_bits(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

pub fn dequant_f32(src: &[u8], out: &mut [f32]) {
    for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

pub fn dequant_f16(src: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::x86::dequant_f16(src, out) {
        return;
    }
    for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
        *o = f16_bits_to_f32(u16::from_le_bytes([c[0], c[1]]));
    }
}

pub fn dequant_bf16(src: &[u8], out: &mut [f32]) {
    for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
        *o = bf16_bits_to_f32(u16::from_le_bytes([c[0], c[1]]));
    }
}

pub fn quantize_f32(x: &[f32], out: &mut [u8]) {
    for (v, c) in x.iter().zip(out.chunks_exact_mut(4)) {
        c.copy_from_slice(&v.to_le_bytes());
    }
}

pub fn quantize_f16(x: &[f32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if super::x86::quantize_f16(x, out) {
        return;
    }
    quantize_f16_scalar(x, out)
}

pub fn quantize_f16_scalar(x: &[f32], out: &mut [u8]) {
    for (v, c) in x.iter().zip(out.chunks_exact_mut(2)) {
        c.copy_from_slice(&f32_to_f16_bits(*v).to_le_bytes());
    }
}

pub fn quantize_bf16(x: &[f32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if super::x86::quantize_bf16(x, out) {
        return;
    }
    quantize_bf16_scalar(x, out)
}

pub fn quantize_bf16_scalar(x: &[f32], out: &mut [u8]) {
    for (v, c) in x.iter().zip(out.chunks_exact_mut(2)) {
        c.copy_from_slice(&f32_to_bf16_bits(*v).to_le_bytes());
    }
}

/// ggml's generic `ggml_vec_dot_f32` accumulates in double; so does this.
pub fn dot_f32(w: &[u8], a: &[u8]) -> f32 {
    let mut s = 0f64;
    for (x, y) in w.chunks_exact(4).zip(a.chunks_exact(4)) {
        let x = f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
        let y = f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
        s += (x * y) as f64;
    }
    s as f32
}

pub fn dot_f16(w: &[u8], a: &[u8]) -> f32 {
    let mut s = 0f64;
    for (x, y) in w.chunks_exact(2).zip(a.chunks_exact(2)) {
        let x = f16_bits_to_f32(u16::from_le_bytes([x[0], x[1]]));
        let y = f16_bits_to_f32(u16::from_le_bytes([y[0], y[1]]));
        s += (x * y) as f64;
    }
    s as f32
}

pub fn dot_bf16(w: &[u8], a: &[u8]) -> f32 {
    let mut s = 0f64;
    for (x, y) in w.chunks_exact(2).zip(a.chunks_exact(2)) {
        let x = bf16_bits_to_f32(u16::from_le_bytes([x[0], x[1]]));
        let y = bf16_bits_to_f32(u16::from_le_bytes([y[0], y[1]]));
        s += (x * y) as f64;
    }
    s as f32
}
