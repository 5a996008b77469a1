//! Codebook ("grid") formats, 256-element super-blocks dotted with Q8_K: IQ2_XXS, IQ2_XS,
//! IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M. Tables come from the generated [`super::iq_grids`].
//!
//! Block layouts (byte offsets, little endian):
//! - IQ2_XXS (66 B): `d: f16 @0, qs: [u16; 32] @2` (per 32: 4 grid bytes, then a u32 of
//!   4×7 sign indices and a 4-bit scale)
//! - IQ2_XS (74 B): `d: f16 @0, qs: [u16; 32] @2 (9-bit grid | 7-bit sign index), scales: [u8; 8] @66`
//! - IQ2_S (82 B): `d: f16 @0, qs: [u8; 32] @2, signs: [u8; 32] @34, qh: [u8; 8] @66, scales: [u8; 8] @74`
//! - IQ3_XXS (98 B): `d: f16 @0, qs: [u8; 64] @2, scales_and_signs: [u32; 8] @66`
//! - IQ3_S (110 B): `d: f16 @0, qs: [u8; 64] @2, qh: [u8; 8] @66, signs: [u8; 32] @74, scales: [u8; 4] @106`
//! - IQ1_S (50 B): `d: f16 @0, qs: [u8; 32] @2, qh: [u16; 8] @34`
//! - IQ1_M (56 B): `qs: [u8; 32] @0, qh: [u8; 16] @32, scales: [u16; 4] @48` (f16 `d` spread
//!   over the top nibbles of the scales)
//!
//! The sign-grid types decode to signed integer values `v[256]` plus one 4-bit scale
//! nibble per 16 elements; dequantization applies gguf-py's float formula, the dot the
//! exact integer sums of ggml's generic kernels.

use super::iq_grids::{
    IQ1S_DELTA, IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
};
use super::q8::{Q8K, Q8_K_BYTES};
use super::{rd_f16, rd_u16, rd_u32};

pub const IQ2_XXS_BYTES: usize = 66;
pub const IQ2_XS_BYTES: usize = 74;
pub const IQ2_S_BYTES: usize = 82;
pub const IQ3_XXS_BYTES: usize = 98;
pub const IQ3_S_BYTES: usize = 110;
pub const IQ1_S_BYTES: usize = 50;
pub const IQ1_M_BYTES: usize = 56;
const _: () = assert!(IQ2_XXS_BYTES == 2 + 64);
const _: () = assert!(IQ2_XS_BYTES == 2 + 64 + 8);
const _: () = assert!(IQ2_S_BYTES == 2 + 32 + 32 + 8 + 8);
const _: () = assert!(IQ3_XXS_BYTES == 2 + 64 + 32);
const _: () = assert!(IQ3_S_BYTES == 2 + 64 + 8 + 32 + 4);
const _: () = assert!(IQ1_S_BYTES == 2 + 32 + 16);
const _: () = assert!(IQ1_M_BYTES == 32 + 16 + 8);

/// A decoded sign-grid super-block: signed grid values and the scale nibble of every
/// group of 16.
struct Signed {
    v: [i8; 256],
    s4: [u8; 16],
}

/// Writes `n` (4 or 8) grid bytes with the signs of `signs` (bit j set: negative).
#[inline(always)]
fn put(v: &mut [i8], grid: &[u8], signs: u8) {
    for (j, (o, &g)) in v.iter_mut().zip(grid).enumerate() {
        let g = g as i8;
        *o = if signs & (1 << j) != 0 { -g } else { g };
    }
}

fn decode_iq2_xxs(b: &[u8]) -> Signed {
    let mut r = Signed {
        v: [0; 256],
        s4: [0; 16],
    };
    for ib in 0..8 {
        let idx = rd_u32(b, 2 + 8 * ib).to_le_bytes();
        let aux = rd_u32(b, 2 + 8 * ib + 4);
        r.s4[2 * ib] = (aux >> 28) as u8;
        r.s4[2 * ib + 1] = (aux >> 28) as u8;
        for l in 0..4 {
            let grid = IQ2XXS_GRID[idx[l] as usize].to_le_bytes();
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
            put(&mut r.v[32 * ib + 8 * l..32 * ib + 8 * l + 8], &grid, signs);
        }
    }
    r
}

fn decode_iq2_xs(b: &[u8]) -> Signed {
    let mut r = Signed {
        v: [0; 256],
        s4: [0; 16],
    };
    for ib in 0..8 {
        let sc = b[66 + ib];
        r.s4[2 * ib] = sc & 15;
        r.s4[2 * ib + 1] = sc >> 4;
        for l in 0..4 {
            let q = rd_u16(b, 2 + 8 * ib + 2 * l);
            let grid = IQ2XS_GRID[(q & 511) as usize].to_le_bytes();
            let signs = KSIGNS_IQ2XS[(q >> 9) as usize];
            put(&mut r.v[32 * ib + 8 * l..32 * ib + 8 * l + 8], &grid, signs);
        }
    }
    r
}

fn decode_iq2_s(b: &[u8]) -> Signed {
    let mut r = Signed {
        v: [0; 256],
        s4: [0; 16],
    };
    for ib in 0..8 {
        let sc = b[74 + ib];
        r.s4[2 * ib] = sc & 15;
        r.s4[2 * ib + 1] = sc >> 4;
        let qh = b[66 + ib] as usize;
        for l in 0..4 {
            let idx = b[2 + 4 * ib + l] as usize | ((qh << (8 - 2 * l)) & 0x300);
            let grid = IQ2S_GRID[idx].to_le_bytes();
            put(
                &mut r.v[32 * ib + 8 * l..32 * ib + 8 * l + 8],
                &grid,
                b[34 + 4 * ib + l],
            );
        }
    }
    r
}

fn decode_iq3_xxs(b: &[u8]) -> Signed {
    let mut r = Signed {
        v: [0; 256],
        s4: [0; 16],
    };
    for ib in 0..8 {
        let aux = rd_u32(b, 66 + 4 * ib);
        r.s4[2 * ib] = (aux >> 28) as u8;
        r.s4[2 * ib + 1] = (aux >> 28) as u8;
        for l in 0..4 {
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
            let g1 = IQ3XXS_GRID[b[2 + 8 * ib + 2 * l] as usize].to_le_bytes();
            let g2 = IQ3XXS_GRID[b[2 + 8 * ib + 2 * l + 1] as usize].to_le_bytes();
            let o = 32 * ib + 8 * l;
            put(&mut r.v[o..o + 4], &g1, signs);
            put(&mut r.v[o + 4..o + 8], &g2, signs >> 4);
        }
    }
    r
}

fn decode_iq3_s(b: &[u8]) -> Signed {
    let mut r = Signed {
        v: [0; 256],
        s4: [0; 16],
    };
    for ib in 0..8 {
        let s = (b[106 + ib / 2] >> (4 * (ib % 2))) & 15;
        r.s4[2 * ib] = s;
        r.s4[2 * ib + 1] = s;
        let qh = b[66 + ib] as usize;
        for l in 0..4 {
            let i1 = b[2 + 8 * ib + 2 * l] as usize | ((qh << (8 - 2 * l)) & 256);
            let i2 = b[2 + 8 * ib + 2 * l + 1] as usize | ((qh << (7 - 2 * l)) & 256);
            let signs = b[74 + 4 * ib + l];
            let o = 32 * ib + 8 * l;
            put(&mut r.v[o..o + 4], &IQ3S_GRID[i1].to_le_bytes(), signs);
            put(
                &mut r.v[o + 4..o + 8],
                &IQ3S_GRID[i2].to_le_bytes(),
                signs >> 4,
            );
        }
    }
    r
}

/// Dequantizes a sign-grid super-block with the per-16 float scale `db(d, s4)`.
#[inline(always)]
fn dequant_signed(
    src: &[u8],
    out: &mut [f32],
    bytes: usize,
    dec: fn(&[u8]) -> Signed,
    db: fn(f32, u8) -> f32,
) {
    for (b, o) in src.chunks_exact(bytes).zip(out.chunks_exact_mut(256)) {
        let d = rd_f16(b, 0);
        let r = dec(b);
        for g in 0..16 {
            let dl = db(d, r.s4[g]);
            for e in 16 * g..16 * g + 16 {
                o[e] = dl * r.v[e] as f32;
            }
        }
    }
}

/// `factor · Σ_blocks f16(d_w)·d_a·Σ_g (2·s4_g + 1)·Σ v·q8`.
#[inline(always)]
fn dot_signed(w: &[u8], a: &[u8], bytes: usize, dec: fn(&[u8]) -> Signed, factor: f32) -> f32 {
    let mut sumf = 0f32;
    for (x, yb) in w.chunks_exact(bytes).zip(a.chunks_exact(Q8_K_BYTES)) {
        let y = Q8K::new(yb);
        let r = dec(x);
        let mut bsum = 0i32;
        for g in 0..16 {
            let s: i32 = r.v[16 * g..16 * g + 16]
                .iter()
                .zip(&y.qs[16 * g..16 * g + 16])
                .map(|(&p, &q)| p as i32 * q as i32)
                .sum();
            bsum += (2 * r.s4[g] as i32 + 1) * s;
        }
        sumf += rd_f16(x, 0) * y.d * bsum as f32;
    }
    factor * sumf
}

fn db_quarter(d: f32, s4: u8) -> f32 {
    d * (0.5 + s4 as f32) * 0.25
}
fn db_half(d: f32, s4: u8) -> f32 {
    d * (0.5 + s4 as f32) * 0.5
}
fn db_odd(d: f32, s4: u8) -> f32 {
    d * (1 + 2 * s4) as f32
}

pub fn dequant_iq2_xxs(src: &[u8], out: &mut [f32]) {
    dequant_signed(src, out, IQ2_XXS_BYTES, decode_iq2_xxs, db_quarter)
}
pub fn dequant_iq2_xs(src: &[u8], out: &mut [f32]) {
    dequant_signed(src, out, IQ2_XS_BYTES, decode_iq2_xs, db_quarter)
}
pub fn dequant_iq2_s(src: &[u8], out: &mut [f32]) {
    dequant_signed(src, out, IQ2_S_BYTES, decode_iq2_s, db_quarter)
}
pub fn dequant_iq3_xxs(src: &[u8], out: &mut [f32]) {
    dequant_signed(src, out, IQ3_XXS_BYTES, decode_iq3_xxs, db_half)
}
pub fn dequant_iq3_s(src: &[u8], out: &mut [f32]) {
    dequant_signed(src, out, IQ3_S_BYTES, decode_iq3_s, db_odd)
}

pub fn dot_iq2_xxs(w: &[u8], a: &[u8]) -> f32 {
    dot_signed(w, a, IQ2_XXS_BYTES, decode_iq2_xxs, 0.125)
}
pub fn dot_iq2_xs(w: &[u8], a: &[u8]) -> f32 {
    dot_signed(w, a, IQ2_XS_BYTES, decode_iq2_xs, 0.125)
}
pub fn dot_iq2_s(w: &[u8], a: &[u8]) -> f32 {
    dot_signed(w, a, IQ2_S_BYTES, decode_iq2_s, 0.125)
}
pub fn dot_iq3_xxs(w: &[u8], a: &[u8]) -> f32 {
    dot_signed(w, a, IQ3_XXS_BYTES, decode_iq3_xxs, 0.25)
}
pub fn dot_iq3_s(w: &[u8], a: &[u8]) -> f32 {
    dot_signed(w, a, IQ3_S_BYTES, decode_iq3_s, 1.0)
}

/// The 8 ternary values (-1, 0, 1) of IQ1 grid entry `idx`.
#[inline(always)]
fn iq1_grid(idx: usize) -> [i8; 8] {
    IQ1S_GRID[idx].to_le_bytes().map(|b| b as i8)
}

/// One IQ1_S 32-group: (scale ls, negative delta?, 4 grid indices).
#[inline(always)]
fn iq1_s_group(b: &[u8], ib: usize) -> (i32, bool, [usize; 4]) {
    let qh = rd_u16(b, 34 + 2 * ib) as usize;
    let idx = core::array::from_fn(|l| b[2 + 4 * ib + l] as usize | (((qh >> (3 * l)) & 7) << 8));
    (2 * ((qh >> 12) & 7) as i32 + 1, qh & 0x8000 != 0, idx)
}

pub fn dequant_iq1_s(src: &[u8], out: &mut [f32]) {
    for (b, o) in src.chunks_exact(IQ1_S_BYTES).zip(out.chunks_exact_mut(256)) {
        let d = rd_f16(b, 0);
        for ib in 0..8 {
            let (ls, neg, idx) = iq1_s_group(b, ib);
            let dl = d * ls as f32;
            let delta = if neg { -IQ1S_DELTA } else { IQ1S_DELTA };
            for (l, &i) in idx.iter().enumerate() {
                for (j, g) in iq1_grid(i).into_iter().enumerate() {
                    o[32 * ib + 8 * l + j] = dl * (g as f32 + delta);
                }
            }
        }
    }
}

pub fn dot_iq1_s(w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, yb) in w.chunks_exact(IQ1_S_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        let y = Q8K::new(yb);
        let (mut sumi, mut sumi1) = (0i32, 0i32);
        for ib in 0..8 {
            let (ls, neg, idx) = iq1_s_group(x, ib);
            let mut lsum = 0i32;
            for (l, &i) in idx.iter().enumerate() {
                let q8 = &y.qs[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                lsum += iq1_grid(i)
                    .iter()
                    .zip(q8)
                    .map(|(&g, &q)| g as i32 * q as i32)
                    .sum::<i32>();
            }
            sumi += ls * lsum;
            let delta = if neg { -1 } else { 1 };
            sumi1 += ls * delta * (y.bsum(2 * ib) + y.bsum(2 * ib + 1));
        }
        sumf += rd_f16(x, 0) * y.d * (sumi as f32 + IQ1S_DELTA * sumi1 as f32);
    }
    sumf
}

/// The f16 super-block scale of an IQ1_M block (top nibbles of the 4 scale words).
#[inline(always)]
fn iq1_m_d(b: &[u8]) -> f32 {
    let sc = |i: usize| rd_u16(b, 48 + 2 * i);
    let u = (sc(0) >> 12) | ((sc(1) >> 8) & 0x00f0) | ((sc(2) >> 4) & 0x0f00) | (sc(3) & 0xf000);
    half::f16::from_bits(u).to_f32()
}

/// One IQ1_M 32-group: (ls of the first 16, ls of the second 16, negative delta per 8,
/// 4 grid indices).
#[inline(always)]
fn iq1_m_group(b: &[u8], ib: usize) -> (i32, i32, [bool; 4], [usize; 4]) {
    let sc = rd_u16(b, 48 + 2 * (ib / 2)) as i32;
    let ls1 = 2 * ((sc >> (6 * (ib % 2))) & 7) + 1;
    let ls2 = 2 * ((sc >> (6 * (ib % 2) + 3)) & 7) + 1;
    let qh = [b[32 + 2 * ib] as usize, b[32 + 2 * ib + 1] as usize];
    let idx = core::array::from_fn(|l| {
        b[4 * ib + l] as usize | ((qh[l / 2] << (8 - 4 * (l % 2))) & 0x700)
    });
    let neg = core::array::from_fn(|l| qh[l / 2] & (0x08 << (4 * (l % 2))) != 0);
    (ls1, ls2, neg, idx)
}

pub fn dequant_iq1_m(src: &[u8], out: &mut [f32]) {
    for (b, o) in src.chunks_exact(IQ1_M_BYTES).zip(out.chunks_exact_mut(256)) {
        let d = iq1_m_d(b);
        for ib in 0..8 {
            let (ls1, ls2, neg, idx) = iq1_m_group(b, ib);
            for l in 0..4 {
                let dl = d * (if l < 2 { ls1 } else { ls2 }) as f32;
                let delta = if neg[l] { -IQ1S_DELTA } else { IQ1S_DELTA };
                for (j, g) in iq1_grid(idx[l]).into_iter().enumerate() {
                    o[32 * ib + 8 * l + j] = dl * (g as f32 + delta);
                }
            }
        }
    }
}

pub fn dot_iq1_m(w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, yb) in w.chunks_exact(IQ1_M_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        let y = Q8K::new(yb);
        let (mut sumi1, mut sumi2) = (0i32, 0i32);
        for ib in 0..8 {
            let (ls1, ls2, neg, idx) = iq1_m_group(x, ib);
            let (mut sum1, mut sum2) = ([0i32; 2], [0i32; 2]);
            for l in 0..4 {
                let q8 = &y.qs[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                sum1[l / 2] += iq1_grid(idx[l])
                    .iter()
                    .zip(q8)
                    .map(|(&g, &q)| g as i32 * q as i32)
                    .sum::<i32>();
                let s8: i32 = q8.iter().map(|&q| q as i32).sum();
                sum2[l / 2] += if neg[l] { -s8 } else { s8 };
            }
            sumi1 += sum1[0] * ls1 + sum1[1] * ls2;
            sumi2 += sum2[0] * ls1 + sum2[1] * ls2;
        }
        sumf += iq1_m_d(x) * y.d * (sumi1 as f32 + IQ1S_DELTA * sumi2 as f32);
    }
    sumf
}
