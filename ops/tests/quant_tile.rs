//! `vec_dot_tile` (one weight row against several activation rows) is bitwise equal to
//! `vec_dot` for every weight type, tile size and stride.

mod quant_common;

use pn_ops::quant::{quantize_row, vec_dot, vec_dot_tile, vec_dot_type, MAX_TILE};
use quant_common::{random_weight_row, rerun_in_child, weight_types, Rng};

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

/// Many rows × many tokens (the packed 16-row paths with VNNI, the packed 8-row K-quant
/// path on plain AVX2, remainder rows and token tiles), with padded strides: every
/// (row, token) equals `vec_dot`.
#[test]
fn block_matches_vec_dot_bitwise() {
    use pn_ops::quant::vec_dot_block;
    let mut rng = Rng(0xb10c_b10c_0000_0001);
    for ty in weight_types() {
        let bs = ty.block_size().max(32);
        let n = if bs == 256 { 512 } else { 96 };
        let a_ty = vec_dot_type(ty);
        let (wrb, rb) = (ty.row_bytes(n).unwrap(), a_ty.row_bytes(n).unwrap());
        let (ws, st, rows) = (wrb + 3, rb + 5, 27usize);
        let mut w = vec![0u8; rows * ws];
        for r in 0..rows {
            w[r * ws..r * ws + wrb].copy_from_slice(&random_weight_row(&mut rng, ty, n));
        }
        for m in [1usize, 2, 3, 4, 5, 7, 8, 9, 16, 21, 32, 47, 130, 150] {
            let mut acts = vec![0u8; m * st];
            for j in 0..m {
                let x: Vec<f32> = (0..n).map(|_| rng.normalish() * 2.0).collect();
                quantize_row(a_ty, &x, &mut acts[j * st..j * st + rb]);
            }
            let os = m + 2;
            let mut out = vec![0f32; rows * os];
            vec_dot_block(ty, n, &w, ws, rows, &acts, st, m, &mut out, os);
            for r in 0..rows {
                for j in 0..m {
                    let want = vec_dot(ty, n, &w[r * ws..], &acts[j * st..]);
                    let got = out[r * os + j];
                    assert_eq!(got.to_bits(), want.to_bits(), "{ty} r={r} j={j} m={m}: {got} vs {want}");
                }
            }
        }
    }
}

/// The packed kernels' i16 partial sums at their bounds: every weight code at its
/// largest (all quant bits set) against activations of ±127 (all one sign, then
/// alternating), 1..=17 tokens and the AMX tiles' 32, 47, 130 and 150 (pairs of token tiles,
/// a padded single tile): exactly `vec_dot`.
#[test]
fn block_extremes_match_vec_dot_bitwise() {
    use pn_ops::quant::vec_dot_block;
    use pn_ops::GgmlType::*;
    for ty in [Q4K, Q5K, Q6K, IQ4XS, Q8_0, Q4_0] {
        let n = 512;
        let a_ty = vec_dot_type(ty);
        let (wrb, rb) = (ty.row_bytes(n).unwrap(), a_ty.row_bytes(n).unwrap());
        let rows = 19;
        let mut w = vec![0xffu8; rows * wrb];
        let f16s: &[usize] = match ty {
            Q4K | Q5K => &[0, 2],
            Q6K => &[208],
            _ => &[0],
        };
        for blk in w.chunks_exact_mut(ty.type_size()) {
            for &o in f16s {
                blk[o..o + 2].copy_from_slice(&half::f16::from_f32(0.03).to_bits().to_le_bytes());
            }
        }
        for sign in [1.0f32, -1.0] {
            for alternate in [false, true] {
                let m = 150;
                let mut acts = vec![0u8; m * rb];
                for j in 0..m {
                    let x: Vec<f32> = (0..n)
                        .map(|i| if alternate && (i / 2 + j) % 2 == 1 { -sign } else { sign })
                        .collect();
                    quantize_row(a_ty, &x, &mut acts[j * rb..(j + 1) * rb]);
                }
                for mm in (1..=17).chain([32, 47, 130, m]) {
                    let mut out = vec![0f32; rows * mm];
                    vec_dot_block(ty, n, &w, wrb, rows, &acts, rb, mm, &mut out, mm);
                    for r in 0..rows {
                        for j in 0..mm {
                            let want = vec_dot(ty, n, &w[r * wrb..], &acts[j * rb..]);
                            let got = out[r * mm + j];
                            assert_eq!(got.to_bits(), want.to_bits(), "{ty} r={r} j={j} m={mm} alt={alternate}: {got} vs {want}");
                        }
                    }
                }
            }
        }
    }
}

/// The few-token shapes of the fused 16-row kernels (AVX-512: Q4_K / Q5_K 2–3 tokens,
/// Q6_K 3) and of the 8-row AVX2 ones: row counts around the 8- and 16-row groups (the
/// last group's rows repeated then dropped), 1–3 super-blocks, 1–5 tokens, padded
/// strides, outputs strided: every (row, token) equals `vec_dot`.
#[test]
fn block_fused_shapes_match_vec_dot_bitwise() {
    use pn_ops::quant::vec_dot_block;
    use pn_ops::GgmlType::*;
    let mut rng = Rng(0xf05e_d16f_05ed_0016);
    for ty in [Q4K, Q5K, Q6K] {
        for nb in [1usize, 3] {
            let n = 256 * nb;
            let a_ty = vec_dot_type(ty);
            let (wrb, rb) = (ty.row_bytes(n).unwrap(), a_ty.row_bytes(n).unwrap());
            for rows in [7usize, 8, 9, 15, 16, 17, 40] {
                let ws = wrb + 5;
                let mut w = vec![0u8; rows * ws];
                for r in 0..rows {
                    w[r * ws..r * ws + wrb].copy_from_slice(&random_weight_row(&mut rng, ty, n));
                }
                for m in 1..=5usize {
                    let st = rb + 3;
                    let mut acts = vec![0u8; m * st];
                    for j in 0..m {
                        let x: Vec<f32> = (0..n).map(|_| rng.normalish() * 3.0).collect();
                        quantize_row(a_ty, &x, &mut acts[j * st..j * st + rb]);
                    }
                    let os = m + 1;
                    let mut out = vec![f32::NAN; rows * os];
                    vec_dot_block(ty, n, &w, ws, rows, &acts, st, m, &mut out, os);
                    for r in 0..rows {
                        for j in 0..m {
                            let want = vec_dot(ty, n, &w[r * ws..], &acts[j * st..]);
                            let got = out[r * os + j];
                            assert_eq!(got.to_bits(), want.to_bits(), "{ty} nb={nb} rows={rows} r={r} j={j} m={m}: {got} vs {want}");
                        }
                        assert!(out[r * os + m].is_nan(), "{ty} rows={rows} m={m}: wrote past the row's outputs");
                    }
                }
            }
        }
    }
}

/// Runs this binary's `block_` tests in a child process with `var=1` (the kernel switches
/// are read once per process) and checks that they ran and passed.
fn block_tests_pass_with(var: &str) {
    rerun_in_child(var, &["block_"], &["block_matches_vec_dot_bitwise", "block_extremes_match_vec_dot_bitwise", "block_fused_shapes_match_vec_dot_bitwise", "f32_block_matches_vec_dot_bitwise"]);
}

/// The same block tests through the plain-AVX2 kernels (`PN_NO_AVX512`) on a machine
/// that has AVX-512.
#[test]
fn block_tests_pass_on_the_avx2_path() {
    if std::env::var_os("PN_NO_AVX512").is_none() {
        block_tests_pass_with("PN_NO_AVX512");
    }
}

/// The same block tests through the AVX-512 kernels (`PN_NO_AMX`) on a machine whose
/// K-quant blocks of 32 or more tokens (Q8_0: 16) otherwise take the AMX tiles.
#[test]
fn block_tests_pass_without_amx() {
    if std::env::var_os("PN_NO_AMX").is_none() && std::env::var_os("PN_NO_AVX512").is_none() && pn_ops::quant::has_amx() {
        block_tests_pass_with("PN_NO_AMX");
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
    let only = std::env::var("TYPES").unwrap_or_default();
    for ty in [pn_ops::GgmlType::Q4K, pn_ops::GgmlType::Q6K, pn_ops::GgmlType::Q8_0, pn_ops::GgmlType::Q5K, pn_ops::GgmlType::IQ4XS, pn_ops::GgmlType::Q4_0, pn_ops::GgmlType::MXFP4].into_iter().filter(|t| only.is_empty() || only.split(',').any(|o| o == t.to_string())) {
        let wrb = ty.row_bytes(k).unwrap();
        let w: Vec<u8> = (0..rows).flat_map(|_| random_weight_row(&mut rng, ty, k)).collect();
        let a_ty = vec_dot_type(ty);
        let rb = a_ty.row_bytes(k).unwrap();
        let mut acts = vec![0u8; toks * rb];
        for j in 0..toks {
            let x: Vec<f32> = (0..k).map(|_| rng.normalish()).collect();
            quantize_row(a_ty, &x, &mut acts[j * rb..(j + 1) * rb]);
        }
        for m in [1usize, 2, 3, 4, 5, 6, 8, 16, 32, 64] {
            let mut out = vec![0f32; rows * toks];
            let mut dt = f64::MAX;
            for _ in 0..7 {
                let t0 = std::time::Instant::now();
                for t0 in (0..toks).step_by(m) {
                    let m = m.min(toks - t0);
                    vec_dot_block(ty, k, &w, wrb, rows, &acts[t0 * rb..], rb, m, &mut out[t0..], toks);
                }
                dt = dt.min(t0.elapsed().as_secs_f64());
            }
            let gmac = (k * rows * toks) as f64 / dt / 1e9;
            eprintln!("{ty} m={m}: {gmac:.1} GMAC/s");
        }
    }
}

/// Decode (M = 1) throughput streaming weights from memory (128 MB, past the L3), one
/// thread ($THREADS threads): GB/s of weights read. `cargo test --release -p pn-ops --test quant_tile
/// decode_stream -- --ignored --nocapture`.
#[test]
#[ignore]
fn decode_stream() {
    use pn_ops::quant::vec_dot_block;
    let mut rng = Rng(7);
    let k: usize = std::env::var("K").map_or(2048, |v| v.parse().unwrap());
    let threads: usize = std::env::var("THREADS").map_or(1, |v| v.parse().unwrap());
    // rows per `vec_dot_block` call (MatMul: 64 per task; MoeExperts: 1024 / tokens)
    let call: usize = std::env::var("ROWS").map_or(64, |v| v.parse().unwrap());
    let only = std::env::var("TYPES").unwrap_or_default();
    for ty in [pn_ops::GgmlType::Q4K, pn_ops::GgmlType::Q6K, pn_ops::GgmlType::Q5K].into_iter().filter(|t| only.is_empty() || only.split(',').any(|o| o == t.to_string())) {
        let wrb = ty.row_bytes(k).unwrap();
        let mb: usize = std::env::var("MB").map_or(128, |v| v.parse().unwrap());
        let rows = (mb << 20) / wrb / call / threads * call * threads;
        let row0 = random_weight_row(&mut rng, ty, k);
        let w: Vec<u8> = (0..rows).flat_map(|_| row0.iter().copied()).collect();
        let a_ty = vec_dot_type(ty);
        let m: usize = std::env::var("M").map_or(1, |v| v.parse().unwrap());
        let rb = a_ty.row_bytes(k).unwrap();
        let mut acts = vec![0u8; m * rb];
        for j in 0..m {
            let x: Vec<f32> = (0..k).map(|_| rng.normalish()).collect();
            quantize_row(a_ty, &x, &mut acts[j * rb..(j + 1) * rb]);
        }
        let mut out = vec![0f32; rows * m];
        let (mut dt, mut dcpu) = (f64::MAX, f64::MAX);
        for _ in 0..5 {
            let t0 = std::time::Instant::now();
            let half = rows / threads;
            let cpu = std::thread::scope(|s| {
                let hs: Vec<_> = out
                    .chunks_mut(half * m)
                    .enumerate()
                    .map(|(t, out)| {
                        let (w, acts) = (&w, &acts);
                        s.spawn(move || {
                            let c0 = thread_cpu_s();
                            for (i, o) in out.chunks_mut(call * m).enumerate() {
                                let r0 = t * half + i * call;
                                vec_dot_block(ty, k, &w[r0 * wrb..], wrb, o.len() / m, acts, rb, m, o, m);
                            }
                            thread_cpu_s() - c0
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).fold(0f64, f64::max)
            });
            dt = dt.min(t0.elapsed().as_secs_f64());
            dcpu = dcpu.min(cpu);
        }
        let gbs = (rows * wrb) as f64 / dt / 1e9;
        eprintln!(
            "{ty} m={m} stream: {gbs:.1} GB/s ({:.1} GMAC/s); per thread CPU time: {:.1} GB/s",
            (rows * k * m) as f64 / dt / 1e9,
            (rows * wrb) as f64 / dcpu / 1e9
        );
    }
}

/// This thread's CPU time in seconds (CLOCK_THREAD_CPUTIME_ID: time the host steals from
/// the virtual CPU and time other processes run are not counted, so shared-machine noise
/// mostly drops out of the kernel figures).
fn thread_cpu_s() -> f64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec (two 64-bit fields on x86_64 Linux).
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    ts.sec as f64 + ts.nsec as f64 * 1e-9
}

/// F32 weights against several tokens (the MoE router in prefill: the AVX-512 register
/// tile of 2 rows × 4 tokens over 32-token blocks) at lengths that reach every part of
/// `dot_f32` (32-element steps, 8-element steps, scalar tail), odd row and token counts
/// (tile edges), padded strides: every (row, token) bitwise `vec_dot`.
#[test]
fn f32_block_matches_vec_dot_bitwise() {
    use pn_ops::quant::vec_dot_block;
    use pn_ops::GgmlType::F32;
    let mut rng = Rng(0xf32b_10c5_0000_0007);
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    for n in [1usize, 7, 8, 31, 32, 45, 64, 100, 259, 2048] {
        for (rows, m) in [(1usize, 2usize), (2, 4), (3, 5), (7, 33), (16, 40), (5, 70)] {
            let (ws, st) = (4 * n + 12, 4 * n + 4 * (m % 3));
            let mut w = vec![0u8; rows * ws];
            for r in 0..rows {
                let x: Vec<f32> = (0..n).map(|_| rng.normalish()).collect();
                w[r * ws..r * ws + 4 * n].copy_from_slice(&bytes(&x));
            }
            let mut acts = vec![0u8; (m - 1) * st + 4 * n];
            for j in 0..m {
                let x: Vec<f32> = (0..n).map(|_| rng.normalish() * 3.0).collect();
                acts[j * st..j * st + 4 * n].copy_from_slice(&bytes(&x));
            }
            let os = m + 1;
            let mut out = vec![f32::NAN; rows * os];
            vec_dot_block(F32, n, &w, ws, rows, &acts, st, m, &mut out, os);
            for r in 0..rows {
                for j in 0..m {
                    let want = vec_dot(F32, n, &w[r * ws..r * ws + 4 * n], &acts[j * st..j * st + 4 * n]);
                    let got = out[r * os + j];
                    assert_eq!(got.to_bits(), want.to_bits(), "n={n} rows={rows} m={m} r={r} j={j}: {got} vs {want}");
                }
            }
        }
    }
}
