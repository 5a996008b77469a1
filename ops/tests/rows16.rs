//! The `rows16` layout: a repacked weight's dots are bitwise `vec_dot` of the plain rows,
//! for every format it covers (Q4_K, Q5_K, Q6_K, IQ4_XS; Q8_0, Q4_0, IQ4_NL, MXFP4), any
//! number of tokens (the fused, packed and AMX paths),
//! padded activation strides and row blocks, row-major and (where the kernel writes it)
//! token-major output; bad lengths give NaN, never a panic. On a
//! machine with AVX-512 the tests run again in a child process with `PN_NO_AVX512=1`,
//! where the copy is the AVX2 kernels' 8-row layout (every format above).

mod quant_common;

use pn_ops::quant::{quantize_row, rows16, vec_dot, vec_dot_type};
use pn_ops::GgmlType;
use quant_common::{random_weight_row, rerun_in_child, Rng};

fn weights(rng: &mut Rng, ty: GgmlType, n: usize, rows: usize) -> Vec<u8> {
    (0..rows).flat_map(|_| random_weight_row(rng, ty, n)).collect()
}

fn acts(rng: &mut Rng, ty: GgmlType, n: usize, m: usize, stride: usize) -> Vec<u8> {
    let a_ty = vec_dot_type(ty);
    let rb = a_ty.row_bytes(n).unwrap();
    let mut a = vec![0u8; (m - 1) * stride + rb];
    for j in 0..m {
        let x: Vec<f32> = (0..n).map(|_| rng.normalish()).collect();
        quantize_row(a_ty, &x, &mut a[j * stride..j * stride + rb]);
    }
    a
}

#[test]
fn repacked_dots_are_bitwise_vec_dot() {
    let mut rng = Rng(0x0516_7a11_cafe_f00d);
    use GgmlType::*;
    let (mut checked, mut token_major) = (0, 0);
    for ty in [Q4K, Q5K, Q6K, IQ4XS, Q8_0, Q4_0, IQ4NL, MXFP4] {
        if !rows16::available(ty, 256, 16) {
            eprintln!("{ty}: no interleaved layout on this CPU");
            continue;
        }
        checked += 1;
        for (nb, rows) in [(1usize, 16usize), (3, 48), (8, 32)] {
            // 32-element formats: odd block counts too
            let n = if ty.block_size() == 256 { 256 * nb } else { 32 * (2 * nb + 1) };
            let rb = ty.row_bytes(n).unwrap();
            let w = weights(&mut rng, ty, n, rows);
            let mut p = vec![0u8; w.len()];
            assert!(rows16::repack(ty, n, rows, &w, &mut p));
            assert_ne!(p, w, "{ty}: the layout moved the bytes");
            let mut sorted = (w.clone(), p.clone());
            sorted.0.sort_unstable();
            sorted.1.sort_unstable();
            assert_eq!(sorted.0, sorted.1, "{ty}: the same bytes in another order");
            let ab = vec_dot_type(ty).row_bytes(n).unwrap();
            for m in [1usize, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 23, 25, 40, 130, 141, 160] {
                let stride = if m % 2 == 0 { ab } else { ab + 12 };
                let a = acts(&mut rng, ty, n, m, stride);
                // all rows, then a block of 16 rows starting at row 16
                for (r0, nr) in [(0, rows), (16.min(rows - 16), 16)] {
                    let ostride = m + 3;
                    let mut out = vec![f32::NAN; nr * ostride];
                    rows16::vec_dot_block(ty, n, &p[r0 * rb..], nr, &a, stride, m, &mut out, ostride);
                    for r in 0..nr {
                        for j in 0..m {
                            let want = vec_dot(ty, n, &w[(r0 + r) * rb..], &a[j * stride..]);
                            let got = out[r * ostride + j];
                            assert_eq!(got.to_bits(), want.to_bits(), "{ty} nb={nb} rows={rows} m={m} row {} token {j}: {got} vs {want}", r0 + r);
                        }
                    }
                    // token-major: the same bits at [j][r] (token rows tstride apart),
                    // the gaps between token rows untouched; or nothing written (false)
                    let tstride = nr + 5;
                    let mut tm = vec![f32::NAN; m * tstride];
                    // SAFETY: tm holds m token rows of tstride ≥ nr floats
                    let wrote = unsafe { rows16::vec_dot_block_tokens(ty, n, &p[r0 * rb..], nr, &a, stride, m, tm.as_mut_ptr(), tstride) };
                    token_major += usize::from(wrote);
                    for j in 0..m {
                        for c in 0..tstride {
                            let got = tm[j * tstride + c];
                            if wrote && c < nr {
                                let want = out[c * ostride + j];
                                assert_eq!(got.to_bits(), want.to_bits(), "{ty} nb={nb} rows={rows} m={m} token-major row {} token {j}: {got} vs {want}", r0 + c);
                            } else {
                                assert!(got.is_nan(), "{ty} m={m}: token-major wrote {got} at token {j} column {c} of {nr} rows (wrote: {wrote})");
                            }
                        }
                    }
                }
            }
        }
    }
    // every x86_64 CPU with AVX2 has a layout for the K-quants
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") && std::is_x86_feature_detected!("f16c") && std::env::var_os("PN_NO_REPACK").is_none() {
        assert!(checked >= 3, "only {checked} formats had a layout");
    }
    // the 16-row kernels write token-major (the K-quants, fused and packed)
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512vnni") && std::env::var_os("PN_NO_AVX512").is_none() && std::env::var_os("PN_NO_REPACK").is_none() {
        assert!(token_major > 0, "no token-major block was written");
    }
    let _ = (checked, token_major);
}

/// The tests above through the plain-AVX2 kernels and their 8-row layout
/// (`PN_NO_AVX512`, read once per process: a child process) on a machine with AVX-512.
#[test]
fn the_avx2_layout_passes_the_same_tests() {
    if std::env::var_os("PN_NO_AVX512").is_some() || !cfg!(target_arch = "x86_64") {
        return;
    }
    let tests = ["repacked_dots_are_bitwise_vec_dot", "mxfp4_every_scale_exponent", "bad_lengths_give_nan_or_false"];
    rerun_in_child("PN_NO_AVX512", &tests, &tests);
}

/// The same tests through the 16-row kernels' shift-and-mask decode (`PN_NO_GFNI`, a
/// child process) on a machine whose default is the GFNI decode.
#[test]
fn the_decode_without_gfni_passes_the_same_tests() {
    #[cfg(target_arch = "x86_64")]
    if std::env::var_os("PN_NO_GFNI").is_none() && std::env::var_os("PN_NO_AVX512").is_none() && pn_ops::quant::has_gfni() {
        let tests = ["repacked_dots_are_bitwise_vec_dot", "bad_lengths_give_nan_or_false"];
        rerun_in_child("PN_NO_GFNI", &tests, &tests);
    }
}

/// MXFP4's e8m0 scales, every exponent 0..=160 (the small ones take the subnormal-half
/// branch of `e8m0_to_f32_half`, which random scale bytes seldom hit; rows 0..8 only
/// exponents 0..6, so their sums are made of those), bitwise `vec_dot` through the layout
/// at 1, 3 and 8 tokens.
#[test]
fn mxfp4_every_scale_exponent() {
    let ty = GgmlType::MXFP4;
    let (nb, rows) = (161usize, 16usize);
    let n = 32 * nb;
    if !rows16::available(ty, n, rows) {
        return;
    }
    let mut rng = Rng(0x6e830);
    let rb = ty.row_bytes(n).unwrap();
    let mut w = weights(&mut rng, ty, n, rows);
    for r in 0..rows {
        for i in 0..nb {
            w[r * rb + i * ty.type_size()] = if r < 8 { (i + r) % 7 } else { (i + 7 * r) % nb } as u8;
        }
    }
    let mut p = vec![0u8; w.len()];
    assert!(rows16::repack(ty, n, rows, &w, &mut p));
    let ab = vec_dot_type(ty).row_bytes(n).unwrap();
    for m in [1usize, 3, 8] {
        let a = acts(&mut rng, ty, n, m, ab);
        let mut out = vec![f32::NAN; rows * m];
        rows16::vec_dot_block(ty, n, &p, rows, &a, ab, m, &mut out, m);
        for r in 0..rows {
            for j in 0..m {
                let want = vec_dot(ty, n, &w[r * rb..], &a[j * ab..]);
                assert_eq!(out[r * m + j].to_bits(), want.to_bits(), "row {r} token {j}");
            }
        }
    }
}

#[test]
fn bad_lengths_give_nan_or_false() {
    let ty = GgmlType::Q4K;
    let n = 256;
    let rb = ty.row_bytes(n).unwrap();
    let mut rng = Rng(7);
    let w = weights(&mut rng, ty, n, 16);
    let mut p = vec![0u8; w.len()];
    // rows not a multiple of 16, short destination, a type without the layout
    assert!(!rows16::repack(ty, n, 15, &w[..15 * rb], &mut p[..15 * rb]));
    assert!(!rows16::repack(ty, n, 16, &w, &mut p[..10]));
    let q5 = vec![0u8; GgmlType::Q5_0.row_bytes(n).unwrap() * 16];
    assert!(!rows16::repack(GgmlType::Q5_0, n, 16, &q5, &mut q5.clone()));
    if !rows16::available(ty, n, 16) {
        return;
    }
    assert!(rows16::repack(ty, n, 16, &w, &mut p));
    let a = acts(&mut rng, ty, n, 2, vec_dot_type(ty).row_bytes(n).unwrap());
    let mut out = vec![0f32; 32];
    // weights short by a byte: NaN everywhere it can reach, nothing read past the end
    rows16::vec_dot_block(ty, n, &p[..p.len() - 1], 16, &a, a.len() / 2, 2, &mut out, 2);
    assert!(out.iter().all(|v| v.is_nan()));
    // activations short
    let mut out = vec![0f32; 32];
    rows16::vec_dot_block(ty, n, &p, 16, &a[..a.len() - 1], a.len() / 2, 2, &mut out, 2);
    assert!(out.iter().all(|v| v.is_nan()));
    // output short: no write past it
    let mut out = vec![0f32; 31];
    rows16::vec_dot_block(ty, n, &p, 16, &a, a.len() / 2, 2, &mut out, 2);
    assert!(out.iter().all(|v| v.is_nan()));
}

/// Benchmark (ignored): one thread, 64 MB of weights streamed per call, plain layout vs
/// `rows16`, calls alternated, best of 7, GB/s of weights.
/// `cargo test --release -p pn-ops --test rows16 -- --ignored --nocapture`
#[test]
#[ignore]
fn timing_plain_vs_rows16() {
    let mut rng = Rng(99);
    for ty in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q5K, GgmlType::IQ4XS] {
        if !rows16::available(ty, 2048, 16) {
            continue;
        }
        let n = 2048;
        let rb = ty.row_bytes(n).unwrap();
        let mb: usize = std::env::var("MB").ok().and_then(|v| v.parse().ok()).unwrap_or(64);
        let rows = (mb << 20) / rb / 16 * 16;
        let row = random_weight_row(&mut rng, ty, n);
        let w: Vec<u8> = (0..rows).flat_map(|r| row.iter().map(move |&b| b.wrapping_add((r % 7) as u8 * ((b & 1) << 4)))).collect();
        let mut p = vec![0u8; w.len()];
        assert!(rows16::repack(ty, n, rows, &w, &mut p));
        for m in [1usize, 2, 4, 8, 16] {
            let ab = vec_dot_type(ty).row_bytes(n).unwrap();
            let a = acts(&mut rng, ty, n, m, ab);
            let mut out = vec![0f32; rows * m];
            let (mut plain, mut packed) = (f64::MAX, f64::MAX);
            for _ in 0..(7 * 64 / mb.min(64)).min(200) {
                let t = std::time::Instant::now();
                for g in (0..rows).step_by(64) {
                    let nr = 64.min(rows - g);
                    pn_ops::quant::vec_dot_block(ty, n, &w[g * rb..], rb, nr, &a, ab, m, &mut out[g * m..], m);
                }
                plain = plain.min(t.elapsed().as_secs_f64());
                let t = std::time::Instant::now();
                for g in (0..rows).step_by(64) {
                    let nr = 64.min(rows - g);
                    rows16::vec_dot_block(ty, n, &p[g * rb..], nr, &a, ab, m, &mut out[g * m..], m);
                }
                packed = packed.min(t.elapsed().as_secs_f64());
            }
            let gb = w.len() as f64 / 1e9;
            println!("{ty} m={m:2}: plain {:.1} GB/s, rows16 {:.1} GB/s ({:.2}×)", gb / plain, gb / packed, plain / packed);
        }
    }
}
