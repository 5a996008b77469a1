//! Round-to-nearest weight quantizers: f32 rows → GGUF weight blocks, for synthetic
//! models (`pn synth`) and tests. Simple per-block scales (no llama.cpp search for the
//! best scale): valid blocks that [`super::dequantize_row`] reads back within the
//! format's error, not llama.cpp's bytes.

use super::floats::{f32_to_f16_bits, quantize_bf16, quantize_f16, quantize_f32};
use super::iq4::KVALUES_IQ4NL;
use super::mxfp4::KVALUES_MXFP4;
use super::q8::quantize_q8_0;
use super::{check_row, QuantError};
use crate::GgmlType;

/// Weight types [`quantize_weights`] writes.
pub const QUANTIZABLE: &[GgmlType] = {
    use GgmlType::*;
    &[
        F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2K, Q3K, Q4K, Q5K, Q6K, IQ4NL, IQ4XS, MXFP4,
    ]
};

/// Quantize one row `x` into `out` (exactly `ty.row_bytes(x.len())` bytes).
pub fn quantize_weights(ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    use GgmlType::*;
    if !QUANTIZABLE.contains(&ty) {
        return Err(QuantError::Unsupported(ty));
    }
    check_row(ty, x.len(), out.len(), true)?;
    let ob = ty.type_size();
    let blocks = |bs: usize, out: &mut [u8], f: fn(&[f32], &mut [u8])| {
        for (xb, o) in x.chunks_exact(bs).zip(out.chunks_exact_mut(ob)) {
            f(xb, o)
        }
    };
    match ty {
        F32 => quantize_f32(x, out),
        F16 => quantize_f16(x, out),
        BF16 => quantize_bf16(x, out),
        Q8_0 => quantize_q8_0(x, out),
        Q4_0 => blocks(32, out, q4_0),
        Q4_1 => blocks(32, out, q4_1),
        Q5_0 => blocks(32, out, q5_0),
        Q5_1 => blocks(32, out, q5_1),
        Q2K => blocks(256, out, q2_k),
        Q3K => blocks(256, out, q3_k),
        Q4K => blocks(256, out, |x, o| q45_k(x, o, false)),
        Q5K => blocks(256, out, |x, o| q45_k(x, o, true)),
        Q6K => blocks(256, out, q6_k),
        IQ4NL => blocks(32, out, iq4_nl),
        IQ4XS => blocks(256, out, iq4_xs),
        MXFP4 => blocks(32, out, mxfp4),
        _ => unreachable!("checked above"),
    }
    Ok(())
}

fn wr_f16(o: &mut [u8], off: usize, v: f32) -> f32 {
    let b = f32_to_f16_bits(v);
    o[off..off + 2].copy_from_slice(&b.to_le_bytes());
    half::f16::from_bits(b).to_f32()
}

/// The element of largest magnitude, with its sign.
fn signed_max(x: &[f32]) -> f32 {
    x.iter()
        .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m })
}

fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter()
        .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)))
}

fn inv(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// round(v·id) clamped to lo..=hi.
fn q(v: f32, id: f32, lo: i32, hi: i32) -> i32 {
    ((v * id).round() as i32).clamp(lo, hi)
}

/// Legacy 32-element blocks: (d, bias) per block, values `q - off` or `q·d + m`.
fn pack_nibbles(qv: &[i32; 32], qs: &mut [u8]) {
    for j in 0..16 {
        qs[j] = (qv[j] & 15) as u8 | (((qv[j + 16] & 15) as u8) << 4);
    }
}

fn high_bits(qv: &[i32; 32]) -> u32 {
    (0..32).fold(0u32, |h, j| h | ((((qv[j] >> 4) & 1) as u32) << j))
}

fn symmetric32(x: &[f32], o: &mut [u8], nmax: f32, off: i32) -> [i32; 32] {
    let d = wr_f16(o, 0, signed_max(x) / -nmax);
    let id = inv(d);
    let mut qv = [0i32; 32];
    for (j, v) in x.iter().enumerate() {
        qv[j] = q(*v, id, -off, off - 1) + off;
    }
    qv
}

fn affine32(x: &[f32], o: &mut [u8], levels: f32) -> [i32; 32] {
    let (mn, mx) = min_max(x);
    let d = wr_f16(o, 0, (mx - mn) / levels);
    let m = wr_f16(o, 2, mn);
    let id = inv(d);
    let mut qv = [0i32; 32];
    for (j, v) in x.iter().enumerate() {
        qv[j] = q(v - m, id, 0, levels as i32);
    }
    qv
}

fn q4_0(x: &[f32], o: &mut [u8]) {
    let qv = symmetric32(x, o, 8.0, 8);
    pack_nibbles(&qv, &mut o[2..18]);
}

fn q4_1(x: &[f32], o: &mut [u8]) {
    let qv = affine32(x, o, 15.0);
    pack_nibbles(&qv, &mut o[4..20]);
}

fn q5_0(x: &[f32], o: &mut [u8]) {
    let qv = symmetric32(x, o, 16.0, 16);
    o[2..6].copy_from_slice(&high_bits(&qv).to_le_bytes());
    pack_nibbles(&qv, &mut o[6..22]);
}

fn q5_1(x: &[f32], o: &mut [u8]) {
    let qv = affine32(x, o, 31.0);
    o[4..8].copy_from_slice(&high_bits(&qv).to_le_bytes());
    pack_nibbles(&qv, &mut o[8..24]);
}

/// Per sub-block (scale, min) with x ≈ scale·q − min, q in 0..=levels, min ≥ 0.
fn sub_affine(x: &[f32], levels: f32) -> (f32, f32) {
    let (mn, mx) = min_max(x);
    let mn = mn.min(0.0);
    ((mx - mn) / levels, -mn)
}

/// 6-bit (or `bits`-bit) integer scales for `v` ≥ 0: (d, ints) with v ≈ d·int.
fn int_scales<const N: usize>(v: &[f32; N], nmax: f32) -> (f32, [i32; N]) {
    let mx = v.iter().fold(0f32, |a, &b| a.max(b));
    let d = mx / nmax;
    let id = inv(d);
    let mut out = [0i32; N];
    for (o, s) in out.iter_mut().zip(v) {
        *o = q(*s, id, 0, nmax as i32);
    }
    (d, out)
}

/// Q4_K (`five` = false) and Q5_K super-blocks.
fn q45_k(x: &[f32], o: &mut [u8], five: bool) {
    let levels = if five { 31.0 } else { 15.0 };
    let (mut sc, mut mn) = ([0f32; 8], [0f32; 8]);
    for j in 0..8 {
        (sc[j], mn[j]) = sub_affine(&x[32 * j..32 * j + 32], levels);
    }
    let (d, ls) = int_scales(&sc, 63.0);
    let (dmin, lm) = int_scales(&mn, 63.0);
    let d = wr_f16(o, 0, d);
    let dmin = wr_f16(o, 2, dmin);
    let s = &mut o[4..16];
    s.fill(0);
    for j in 0..8 {
        let (a, b) = (ls[j] as u8, lm[j] as u8);
        if j < 4 {
            s[j] = a;
            s[j + 4] = b;
        } else {
            s[j + 4] = (a & 15) | ((b & 15) << 4);
            s[j - 4] |= (a >> 4) << 6;
            s[j] |= (b >> 4) << 6;
        }
    }
    let mut qv = [0i32; 256];
    for j in 0..8 {
        let (dl, ml) = (d * ls[j] as f32, dmin * lm[j] as f32);
        let id = inv(dl);
        for e in 32 * j..32 * j + 32 {
            qv[e] = q(x[e] + ml, id, 0, levels as i32);
        }
    }
    let qs_off = if five { 48 } else { 16 };
    if five {
        o[16..48].fill(0);
    }
    for c in 0..4 {
        for l in 0..32 {
            let (lo, hi) = (qv[64 * c + l], qv[64 * c + 32 + l]);
            o[qs_off + 32 * c + l] = (lo & 15) as u8 | (((hi & 15) as u8) << 4);
            if five {
                o[16 + l] |=
                    ((((lo >> 4) & 1) << (2 * c)) | (((hi >> 4) & 1) << (2 * c + 1))) as u8;
            }
        }
    }
}

/// Signed sub-block scales (16 of 16 elements) → (d, ints in -imax..=imax).
fn signed_scales(x: &[f32], nmax: f32, imax: f32) -> (f32, [i32; 16]) {
    let mut sc = [0f32; 16];
    for j in 0..16 {
        sc[j] = signed_max(&x[16 * j..16 * j + 16]) / -nmax;
    }
    let d = sc.iter().fold(0f32, |a, b| a.max(b.abs())) / imax;
    let id = inv(d);
    let mut ls = [0i32; 16];
    for j in 0..16 {
        ls[j] = q(sc[j], id, -(imax as i32), imax as i32);
    }
    (d, ls)
}

fn q6_k(x: &[f32], o: &mut [u8]) {
    let (d, ls) = signed_scales(x, 32.0, 127.0);
    let d = wr_f16(o, 208, d);
    let mut qv = [0i32; 256];
    for j in 0..16 {
        o[192 + j] = ls[j] as i8 as u8;
        let id = inv(d * ls[j] as f32);
        for e in 16 * j..16 * j + 16 {
            qv[e] = q(x[e], id, -32, 31) + 32;
        }
    }
    o[..192].fill(0);
    for half in 0..2 {
        for k in 0..4 {
            for l in 0..32 {
                let v = qv[128 * half + 32 * k + l];
                let ql = 64 * half + l + 32 * (k & 1);
                o[ql] |= ((v & 15) as u8) << if k < 2 { 0 } else { 4 };
                o[128 + 32 * half + l] |= (((v >> 4) & 3) as u8) << (2 * k);
            }
        }
    }
}

fn q3_k(x: &[f32], o: &mut [u8]) {
    let (d, ls) = signed_scales(x, 4.0, 31.0);
    let d = wr_f16(o, 108, d);
    o[..108].fill(0);
    let s = &mut o[96..108];
    for (i, &l) in ls.iter().enumerate() {
        let u = (l + 32) as u8; // 1..=63
        s[i % 8] |= (u & 15) << if i < 8 { 0 } else { 4 };
        s[8 + i % 4] |= (u >> 4) << (2 * (i / 4));
    }
    let mut qv = [0i32; 256];
    for j in 0..16 {
        let id = inv(d * ls[j] as f32);
        for e in 16 * j..16 * j + 16 {
            qv[e] = q(x[e], id, -4, 3) + 4;
        }
    }
    for half in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                let u = qv[128 * half + 32 * j + l];
                o[32 + 32 * half + l] |= ((u & 3) as u8) << (2 * j);
                o[l] |= (((u >> 2) & 1) as u8) << (4 * half + j);
            }
        }
    }
}

fn q2_k(x: &[f32], o: &mut [u8]) {
    let (mut sc, mut mn) = ([0f32; 16], [0f32; 16]);
    for j in 0..16 {
        (sc[j], mn[j]) = sub_affine(&x[16 * j..16 * j + 16], 3.0);
    }
    let (d, ls) = int_scales(&sc, 15.0);
    let (dmin, lm) = int_scales(&mn, 15.0);
    let d = wr_f16(o, 80, d);
    let dmin = wr_f16(o, 82, dmin);
    o[..80].fill(0);
    let mut qv = [0i32; 256];
    for j in 0..16 {
        o[j] = (ls[j] | (lm[j] << 4)) as u8;
        let (dl, ml) = (d * ls[j] as f32, dmin * lm[j] as f32);
        let id = inv(dl);
        for e in 16 * j..16 * j + 16 {
            qv[e] = q(x[e] + ml, id, 0, 3);
        }
    }
    for half in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                o[16 + 32 * half + l] |= (qv[128 * half + 32 * j + l] as u8) << (2 * j);
            }
        }
    }
}

/// Index of the table value nearest to `v`.
fn nearest(table: &[i8; 16], v: f32) -> u8 {
    let mut best = 0;
    for (i, &t) in table.iter().enumerate() {
        if (t as f32 - v).abs() < (table[best] as f32 - v).abs() {
            best = i;
        }
    }
    best as u8
}

fn table_nibbles(table: &[i8; 16], x: &[f32], id: f32, qs: &mut [u8]) {
    for j in 0..16 {
        qs[j] = nearest(table, x[j] * id) | (nearest(table, x[j + 16] * id) << 4);
    }
}

fn iq4_nl(x: &[f32], o: &mut [u8]) {
    let d = wr_f16(o, 0, signed_max(x) / KVALUES_IQ4NL[0] as f32);
    table_nibbles(&KVALUES_IQ4NL, x, inv(d), &mut o[2..18]);
}

fn iq4_xs(x: &[f32], o: &mut [u8]) {
    let mut sc = [0f32; 8];
    for j in 0..8 {
        sc[j] = signed_max(&x[32 * j..32 * j + 32]) / KVALUES_IQ4NL[0] as f32;
    }
    let d = wr_f16(o, 0, sc.iter().fold(0f32, |a, b| a.max(b.abs())) / 31.0);
    let id = inv(d);
    let mut sh = 0u16;
    o[4..8].fill(0);
    for j in 0..8 {
        let l = q(sc[j], id, -32, 31);
        let u = (l + 32) as u8;
        o[4 + j / 2] |= (u & 15) << (4 * (j % 2));
        sh |= ((u >> 4) as u16) << (2 * j);
        let dl = d * l as f32;
        table_nibbles(
            &KVALUES_IQ4NL,
            &x[32 * j..32 * j + 32],
            inv(dl),
            &mut o[8 + 16 * j..24 + 16 * j],
        );
    }
    o[2..4].copy_from_slice(&sh.to_le_bytes());
}

fn mxfp4(x: &[f32], o: &mut [u8]) {
    let amax = signed_max(x).abs();
    // the scale 2^(e-128) is the smallest power of two with amax/scale ≤ 12 (the table's max)
    let e = if amax > 0.0 {
        ((amax / 12.0).log2().ceil() as i32 + 128).clamp(2, 254)
    } else {
        2
    };
    o[0] = e as u8;
    let id = inv(super::mxfp4::e8m0_to_f32_half(o[0]));
    table_nibbles(&KVALUES_MXFP4, x, id, &mut o[1..17]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize_row;

    /// Relative RMS error of quantize → dequantize on a smooth-ish random row, per format.
    fn roundtrip(ty: GgmlType, scale: f32) -> f64 {
        let n = 1024;
        let mut s = 0x9e37_79b9_7f4a_7c15u64 ^ ty.id() as u64;
        let x: Vec<f32> = (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect();
        let mut b = vec![0u8; ty.row_bytes(n).unwrap()];
        quantize_weights(ty, &x, &mut b).unwrap();
        let mut y = vec![0f32; n];
        dequantize_row(ty, &b, &mut y).unwrap();
        assert!(y.iter().all(|v| v.is_finite()), "{ty}: non-finite values");
        let err: f64 = x
            .iter()
            .zip(&y)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum();
        let norm: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum();
        (err / norm).sqrt()
    }

    #[test]
    fn every_format_round_trips_within_its_error() {
        use GgmlType::*;
        // bound on the relative RMS error (uniform data; about half a step of each format)
        let bounds = [
            (F32, 0.0),
            (F16, 1e-3),
            (BF16, 5e-3),
            (Q8_0, 0.01),
            (Q6K, 0.03),
            (Q5_0, 0.04),
            (Q5_1, 0.04),
            (Q5K, 0.05),
            (Q4_0, 0.08),
            (Q4_1, 0.08),
            (Q4K, 0.08),
            (IQ4NL, 0.08),
            (IQ4XS, 0.08),
            (MXFP4, 0.14),
            (Q3K, 0.16),
            (Q2K, 0.33),
        ];
        assert_eq!(bounds.len(), QUANTIZABLE.len());
        for (ty, bound) in bounds {
            for scale in [1e-3, 1.0, 40.0] {
                let e = roundtrip(ty, scale);
                println!("{ty:<8} scale {scale:<6} relative RMS error {e:.4}");
                assert!(
                    e <= bound,
                    "{ty} at scale {scale}: relative RMS error {e:.4} > {bound}"
                );
            }
        }
    }

    #[test]
    fn zeros_and_bad_input() {
        for &ty in QUANTIZABLE {
            let n = 256;
            let mut b = vec![0xffu8; ty.row_bytes(n).unwrap()];
            quantize_weights(ty, &vec![0.0; n], &mut b).unwrap();
            let mut y = vec![1f32; n];
            dequantize_row(ty, &b, &mut y).unwrap();
            assert!(
                y.iter().all(|v| v.abs() < 1e-30),
                "{ty}: zeros did not stay zero"
            );
        }
        assert!(quantize_weights(GgmlType::Q4K, &[0.0; 32], &mut [0u8; 18]).is_err());
        assert!(quantize_weights(GgmlType::IQ2XXS, &[0.0; 256], &mut [0u8; 66]).is_err());
    }
}
