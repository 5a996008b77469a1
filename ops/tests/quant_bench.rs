//! Quick timing of vec_dot, scalar vs dispatch (AVX2 when available). Ignored by default:
//! `cargo test -p pn-ops --release --test quant_bench -- --ignored --nocapture`

mod quant_common;

use pn_ops::quant::{self, quantize_row, scalar, vec_dot, vec_dot_type};
use pn_ops::GgmlType;
use quant_common::{random_weight_row, Rng};
use std::hint::black_box;
use std::time::Instant;

/// Best of 7 trials of `reps` calls (the machine is shared: the minimum is the signal).
fn time(mut f: impl FnMut() -> f32, reps: usize) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..7 {
        let t = Instant::now();
        let mut s = 0f32;
        for _ in 0..reps {
            s += f();
        }
        black_box(s);
        best = best.min(t.elapsed().as_secs_f64() / reps as f64);
    }
    best
}

#[test]
#[ignore]
fn bench_vec_dot() {
    use GgmlType::*;
    println!("simd available: {}", quant::simd_available());
    let n = 4096;
    let mut rng = Rng(7);
    let x: Vec<f32> = (0..n).map(|_| rng.normalish()).collect();
    for ty in [
        F32, F16, BF16, Q8_0, Q4_0, MXFP4, IQ4NL, Q4K, Q5K, Q6K, IQ4XS, Q2K, Q3K, IQ3S, IQ2XXS,
    ] {
        let w = random_weight_row(&mut rng, ty, n);
        let a_ty = vec_dot_type(ty);
        let mut a = vec![0u8; a_ty.row_bytes(n).unwrap()];
        quantize_row(a_ty, &x, &mut a);
        let reps = 2000;
        let ts = time(
            || scalar::vec_dot(ty, n, black_box(&w), black_box(&a)),
            reps,
        );
        let tv = time(|| vec_dot(ty, n, black_box(&w), black_box(&a)), reps);
        println!(
            "{:8} n={n}: scalar {:8.2} us ({:6.2} GB/s w)  dispatch {:8.2} us ({:6.2} GB/s w)  x{:.1}",
            ty.name(),
            ts * 1e6,
            w.len() as f64 / ts / 1e9,
            tv * 1e6,
            w.len() as f64 / tv / 1e9,
            ts / tv
        );
    }
    for a_ty in [Q8_0, Q8K, F16, BF16] {
        let mut a = vec![0u8; a_ty.row_bytes(n).unwrap()];
        let ts = time(
            || {
                scalar::quantize_row(a_ty, black_box(&x), &mut a).unwrap();
                a[0] as f32
            },
            300,
        );
        let tv = time(
            || {
                quantize_row(a_ty, black_box(&x), &mut a);
                a[0] as f32
            },
            300,
        );
        println!(
            "quantize {:5} n={n}: scalar {:8.2} us  dispatch {:8.2} us  x{:.1}",
            a_ty.name(),
            ts * 1e6,
            tv * 1e6,
            ts / tv
        );
    }
}
