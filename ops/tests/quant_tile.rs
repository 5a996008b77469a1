//! `vec_dot_tile` (one weight row against several activation rows) is bitwise equal to
//! `vec_dot` for every weight type, tile size and stride.

mod quant_common;

use pn_ops::quant::{quantize_row, vec_dot, vec_dot_tile, vec_dot_type, MAX_TILE};
use quant_common::{random_weight_row, weight_types, Rng};

#[test]
fn tile_matches_vec_dot_bitwise() {
    let mut rng = Rng(0x7ea5_1de5_0ddb_a115);
    for ty in weight_types() {
        let bs = ty.block_size().max(32);
        for blocks in [1usize, 3, 8] {
            let n = bs * blocks;
            let a_ty = vec_dot_type(ty);
            let rb = a_ty.row_bytes(n).unwrap();
            for pad in [0usize, 7] {
                let stride = rb + pad;
                let w = random_weight_row(&mut rng, ty, n);
                let mut acts = vec![0u8; MAX_TILE * stride];
                for j in 0..MAX_TILE {
                    let x: Vec<f32> = (0..n).map(|_| rng.normalish()).collect();
                    quantize_row(a_ty, &x, &mut acts[j * stride..j * stride + rb]);
                }
                for m in 1..=MAX_TILE {
                    let mut out = vec![0f32; m];
                    vec_dot_tile(ty, n, &w, &acts[..(m - 1) * stride + rb], stride, &mut out);
                    for (j, &o) in out.iter().enumerate() {
                        let want = vec_dot(ty, n, &w, &acts[j * stride..]);
                        assert_eq!(o.to_bits(), want.to_bits(), "{ty} n={n} m={m} j={j}");
                    }
                }
            }
        }
    }
}

#[test]
fn tile_bad_lengths_give_nan() {
    let ty = pn_ops::GgmlType::Q4K;
    let mut out = [0f32; 2];
    vec_dot_tile(ty, 256, &[0u8; 100], &[0u8; 600], 292, &mut out);
    assert!(out.iter().all(|v| v.is_nan()));
    vec_dot_tile(ty, 256, &[0u8; 144], &[0u8; 300], 292, &mut out);
    assert!(out[1].is_nan());
}

/// Rough kernel throughput: `cargo test --release -p pn-ops --test quant_tile -- --ignored --nocapture`.
#[test]
#[ignore]
fn tile_throughput() {
    use pn_ops::quant::vec_dot_block;
    let mut rng = Rng(42);
    let (k, rows, toks) = (2048usize, 512usize, 64usize);
    for ty in [pn_ops::GgmlType::Q4K, pn_ops::GgmlType::Q6K, pn_ops::GgmlType::Q8_0, pn_ops::GgmlType::Q5K] {
        let wrb = ty.row_bytes(k).unwrap();
        let w: Vec<u8> = (0..rows).flat_map(|_| random_weight_row(&mut rng, ty, k)).collect();
        let a_ty = vec_dot_type(ty);
        let rb = a_ty.row_bytes(k).unwrap();
        let mut acts = vec![0u8; toks * rb];
        for j in 0..toks {
            let x: Vec<f32> = (0..k).map(|_| rng.normalish()).collect();
            quantize_row(a_ty, &x, &mut acts[j * rb..(j + 1) * rb]);
        }
        for m in [1usize, 4, 8] {
            let mut out = vec![0f32; rows * toks];
            let mut dt = f64::MAX;
            for _ in 0..7 {
                let t0 = std::time::Instant::now();
                for t0 in (0..toks).step_by(m) {
                    vec_dot_block(ty, k, &w, wrb, rows, &acts[t0 * rb..], rb, m, &mut out[t0..], toks);
                }
                dt = dt.min(t0.elapsed().as_secs_f64());
            }
            let gmac = (k * rows * toks) as f64 / dt / 1e9;
            eprintln!("{ty} m={m}: {gmac:.1} GMAC/s");
        }
    }
}
