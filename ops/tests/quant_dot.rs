//! vec_dot of every weight type against a dequantize-then-dot reference, SIMD against
//! scalar, and the error paths.

mod quant_common;

use pn_ops::quant::{
    self, dequantize_row, quantize_row, scalar, try_quantize_row, try_vec_dot, vec_dot,
    vec_dot_type, QuantError,
};
use pn_ops::GgmlType;
use quant_common::{random_weight_row, weight_types, Rng};

fn f16(b: &[u8], o: usize) -> f64 {
    half::f16::from_bits(u16::from_le_bytes([b[o], b[o + 1]])).to_f32() as f64
}

/// Σ w·a in f64 with `w` dequantized and `a` the activation row decoded; also Σ|w·a|.
fn reference(w_ty: GgmlType, n: usize, w: &[u8], act: &[u8]) -> (f64, f64) {
    let mut wd = vec![0f32; n];
    dequantize_row(w_ty, w, &mut wd).unwrap();
    let a_ty = vec_dot_type(w_ty);
    if a_ty == GgmlType::Q8_1 {
        // Q8_1 carries s = f16(d·Σq) for the min term: Σ (d_w q_w)(d_a q_a) + m_w·s_a.
        let ts = w_ty.type_size();
        let (mut s, mut sa) = (0f64, 0f64);
        for (bi, (wb, ab)) in w.chunks_exact(ts).zip(act.chunks_exact(36)).enumerate() {
            let (m, da, sa_) = (f16(wb, 2), f16(ab, 0), f16(ab, 2));
            for j in 0..32 {
                let t = (wd[32 * bi + j] as f64 - m) * da * (ab[4 + j] as i8 as f64);
                s += t;
                sa += t.abs();
            }
            s += m * sa_;
            sa += (m * sa_).abs();
        }
        return (s, sa);
    }
    let mut ad = vec![0f32; n];
    dequantize_row(a_ty, act, &mut ad).unwrap();
    let s = wd.iter().zip(&ad).map(|(&x, &y)| x as f64 * y as f64).sum();
    let sa = wd
        .iter()
        .zip(&ad)
        .map(|(&x, &y)| (x as f64 * y as f64).abs())
        .sum();
    (s, sa)
}

fn act_row(rng: &mut Rng, a_ty: GgmlType, n: usize) -> Vec<u8> {
    let x: Vec<f32> = (0..n).map(|_| rng.normalish()).collect();
    let mut a = vec![0u8; a_ty.row_bytes(n).unwrap()];
    quantize_row(a_ty, &x, &mut a);
    a
}

#[test]
fn vec_dot_matches_dequantized_dot() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for ty in weight_types() {
        let bs = ty.block_size().max(32);
        for nblocks in [1usize, 3, 8] {
            let n = if ty.block_size() == 1 {
                32 * nblocks + 7
            } else {
                bs * nblocks
            };
            let w = random_weight_row(&mut rng, ty, n);
            let a = act_row(&mut rng, vec_dot_type(ty), n);
            let (want, mag) = reference(ty, n, &w, &a);
            for (what, got) in [
                ("dispatch", vec_dot(ty, n, &w, &a)),
                ("scalar", scalar::vec_dot(ty, n, &w, &a)),
            ] {
                let err = (got as f64 - want).abs();
                assert!(
                    err <= 2e-6 * mag + 1e-30,
                    "{ty} n={n} {what}: got {got} want {want} (err {err:e}, scale {mag:e})"
                );
            }
        }
    }
}

#[test]
fn simd_matches_scalar() {
    if !quant::simd_available() {
        eprintln!("no AVX2/FMA/F16C: SIMD kernels not exercised");
        return;
    }
    let mut rng = Rng(0xfeed_beef_0bad_cafe);
    for ty in weight_types() {
        for rep in 0..12 {
            let n = match ty.block_size() {
                1 => [1, 7, 8, 15, 16, 31, 32, 33, 64, 100, 255, 1024][rep],
                32 => 32 * [1, 2, 3, 4, 5, 7, 8, 9, 16, 31, 33, 64][rep],
                _ => 256 * [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12][rep],
            };
            let w = random_weight_row(&mut rng, ty, n);
            let a = act_row(&mut rng, vec_dot_type(ty), n);
            let (_, mag) = reference(ty, n, &w, &a);
            let (got, want) = (vec_dot(ty, n, &w, &a), scalar::vec_dot(ty, n, &w, &a));
            let err = (got as f64 - want as f64).abs();
            assert!(
                err <= 1e-5 * mag.max(want.abs() as f64) + 1e-30,
                "{ty} n={n}: simd {got} scalar {want}"
            );
        }
    }
    // activation quantizers: SIMD == scalar bit for bit (ties included)
    for a_ty in [
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q8K,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::F32,
    ] {
        for n in [256usize, 512, 4096] {
            let mut x: Vec<f32> = (0..n).map(|_| rng.normalish() * 3.0).collect();
            for v in x.iter_mut().step_by(5) {
                *v = (*v * 4.0).round() / 4.0 + 0.5;
            }
            x[n - 32..].fill(0.0);
            let nb = a_ty.row_bytes(n).unwrap();
            let (mut p, mut q) = (vec![0u8; nb], vec![1u8; nb]);
            quantize_row(a_ty, &x, &mut p);
            scalar::quantize_row(a_ty, &x, &mut q).unwrap();
            assert_eq!(p, q, "{a_ty} n={n}");
        }
    }
}

#[test]
fn dequantize_dispatch_matches_scalar_on_random_rows() {
    // (F16 dequantization has a SIMD path; everything goes through the same API.)
    let mut rng = Rng(99);
    for n in [1usize, 7, 8, 9, 33, 1000] {
        let w = random_weight_row(&mut rng, GgmlType::F16, n);
        let mut out = vec![0f32; n];
        dequantize_row(GgmlType::F16, &w, &mut out).unwrap();
        for (i, v) in out.iter().enumerate() {
            assert_eq!(*v, f16(&w, 2 * i) as f32);
        }
    }
}

#[test]
fn vec_dot_types() {
    use GgmlType::*;
    for (w, a) in [
        (F32, F32),
        (F16, F16),
        (BF16, BF16),
        (Q4_0, Q8_0),
        (Q5_0, Q8_0),
        (Q8_0, Q8_0),
        (IQ4NL, Q8_0),
        (MXFP4, Q8_0),
        (Q4_1, Q8_1),
        (Q5_1, Q8_1),
        (Q2K, Q8K),
        (Q3K, Q8K),
        (Q4K, Q8K),
        (Q5K, Q8K),
        (Q6K, Q8K),
        (IQ4XS, Q8K),
        (IQ2XXS, Q8K),
        (IQ2XS, Q8K),
        (IQ2S, Q8K),
        (IQ3XXS, Q8K),
        (IQ3S, Q8K),
        (IQ1S, Q8K),
        (IQ1M, Q8K),
    ] {
        assert_eq!(vec_dot_type(w), a, "{w}");
    }
}

#[test]
fn errors_instead_of_panics() {
    use GgmlType::*;
    for ty in [Q8_1, I8, I16, I32, I64, F64, TQ1_0, TQ2_0] {
        let mut out = vec![0f32; 256];
        let src = vec![0u8; ty.row_bytes(256).unwrap()];
        assert_eq!(
            dequantize_row(ty, &src, &mut out),
            Err(QuantError::Unsupported(ty))
        );
        assert!(matches!(
            try_vec_dot(ty, 256, &src, &src),
            Err(QuantError::Unsupported(_))
        ));
        assert!(vec_dot(ty, 256, &src, &src).is_nan());
    }
    for ty in weight_types() {
        let bs = ty.block_size();
        let good = ty.row_bytes(2 * bs).unwrap();
        let mut out = vec![0f32; 2 * bs];
        let src = vec![0u8; good + 1];
        assert!(
            matches!(
                dequantize_row(ty, &src[..good - 1], &mut out),
                Err(QuantError::BadBytes { .. })
            ),
            "{ty}"
        );
        assert!(
            matches!(
                dequantize_row(ty, &src, &mut out),
                Err(QuantError::BadBytes { .. })
            ),
            "{ty}"
        );
        dequantize_row(ty, &src[..good], &mut out).unwrap();
        if bs > 1 {
            let mut out = vec![0f32; bs + 1];
            assert!(
                matches!(
                    dequantize_row(ty, &src, &mut out),
                    Err(QuantError::BadLength { .. })
                ),
                "{ty}"
            );
            assert!(matches!(
                try_vec_dot(ty, bs + 1, &src, &src),
                Err(QuantError::BadLength { .. })
            ));
            assert!(vec_dot(ty, bs - 1, &src, &src).is_nan());
        }
        let a_ty = vec_dot_type(ty);
        let act = vec![0u8; a_ty.row_bytes(2 * bs).unwrap()];
        assert!(matches!(
            try_vec_dot(ty, 2 * bs, &src[..good - 1], &act),
            Err(QuantError::BadBytes { .. })
        ));
        assert!(matches!(
            try_vec_dot(ty, 2 * bs, &src, &act[..act.len() - 1]),
            Err(QuantError::BadBytes { .. })
        ));
        assert!(vec_dot(ty, 2 * bs, &src[..good - 1], &act).is_nan());
        // longer rows are fine: only the leading bytes are read
        assert_eq!(vec_dot(ty, 2 * bs, &src, &act), 0.0, "{ty}");
    }
    // quantize_row: unsupported target types and bad lengths
    let x = vec![1f32; 256];
    for ty in [Q4_0, Q4K, I8, IQ4XS] {
        let mut out = vec![7u8; ty.row_bytes(256).unwrap()];
        assert!(try_quantize_row(ty, &x, &mut out).is_err());
        quantize_row(ty, &x, &mut out);
        assert!(out.iter().all(|&b| b == 0));
    }
    let mut out = vec![7u8; 34 * 8];
    assert!(matches!(
        try_quantize_row(Q8_0, &x[..255], &mut out),
        Err(QuantError::BadLength { .. })
    ));
    assert!(matches!(
        try_quantize_row(Q8_0, &x, &mut out[..34 * 8 - 1]),
        Err(QuantError::BadBytes { .. })
    ));
    assert!(matches!(
        try_quantize_row(Q8K, &x[..128], &mut out),
        Err(QuantError::BadLength { .. })
    ));
    quantize_row(Q8_0, &x[..255], &mut out);
    // n = 0 is a valid, empty row
    assert_eq!(vec_dot(Q4K, 0, &[], &[]), 0.0);
    dequantize_row(Q4K, &[], &mut []).unwrap();
}

#[test]
fn quantize_fixed_vectors() {
    use GgmlType::*;
    // Q8_0: amax 127 -> id = 1, ties round to even; d = 127/127 = 1.0
    let mut x = [0f32; 64];
    x[0] = 127.0;
    x[1] = 0.5;
    x[2] = 1.5;
    x[3] = 2.5;
    x[4] = -0.5;
    x[5] = -2.5;
    x[6] = 126.5;
    // second block all zero
    let mut out = [0u8; 68];
    quantize_row(Q8_0, &x, &mut out);
    assert_eq!(
        &out[0..2],
        &half::f16::from_f32(1.0).to_bits().to_le_bytes()
    );
    let q: Vec<i8> = out[2..9].iter().map(|&b| b as i8).collect();
    assert_eq!(q, [127, 0, 2, 2, 0, -2, 126]);
    assert!(out[34..].iter().all(|&b| b == 0));
    // Q8_K: signed max -127 -> iscale = +1, d = 1
    let mut x = [0f32; 512];
    x[0] = 0.5;
    x[1] = -127.0;
    x[2] = 3.5;
    x[3] = -3.5;
    x[17] = 127.0; // same |x| as the max but later: not the max
    let mut out = vec![0u8; 292 * 2];
    quantize_row(Q8K, &x, &mut out);
    assert_eq!(f32::from_le_bytes(out[0..4].try_into().unwrap()), 1.0);
    let q: Vec<i8> = out[4..8].iter().map(|&b| b as i8).collect();
    assert_eq!(q, [0, -127, 4, -4]);
    assert_eq!(out[4 + 17] as i8, 127);
    assert_eq!(i16::from_le_bytes([out[260], out[261]]), -127);
    assert_eq!(i16::from_le_bytes([out[262], out[263]]), 127);
    assert!(out[292..].iter().all(|&b| b == 0), "all-zero super-block");
    // positive max: iscale = -127/max < 0, so d < 0
    let mut x = [0.25f32; 256];
    x[9] = 2.0;
    let mut out = vec![0u8; 292];
    quantize_row(Q8K, &x, &mut out);
    assert_eq!(
        f32::from_le_bytes(out[0..4].try_into().unwrap()),
        1.0 / (-127.0f32 / 2.0)
    );
    assert_eq!(out[4 + 9] as i8, -127);
    assert_eq!(out[4] as i8, -16); // -15.875 -> -16
}
