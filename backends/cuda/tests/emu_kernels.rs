//! CUDA kernels run under a CPU emulation of the CUDA execution model
//! (tests/emu/cuda_emu.h: blocks in turn, a block's threads as fibers switched at every
//! barrier and warp shuffle), built with the host C++ compiler around the kernel files, so
//! the device code is checked here before any GPU runs it:
//! - kernels/delta.cu's multi-sequence kernels against each sequence computed alone,
//!   bitwise (tests/emu/delta_seqs.cpp);
//! - kernels/attention.cu's kernels for many one-token sequences (`kv_store_seqs`,
//!   `attn_kv_seqs`) against the single-sequence kernels launched once per sequence: every
//!   row and cache byte, each cell format, ring and plain (tests/emu/attention_seqs.cpp);
//! - kernels/matmul.cu's `mm_<format>` for every native weight format against pn-ops'
//!   `vec_dot`, dense and with expert ids (the MoE's form; tests/emu/matmul.cpp);
//! - kernels/quantize.cu's activation conversions against pn-ops' `quantize_row`, byte for
//!   byte (tests/emu/quantize.cpp);
//! - `get_rows_<format>` bitwise the reference GetRows, and delta_chunk.cu's chunked form
//!   against the reference recurrence (nmse ≤ 1e-8; ~1e-13 measured);
//! - attention.cu, norm.cu, moe.cu, elementwise.cu (with the slices) and rope.cu through a
//!   generic launcher (tests/emu/launch.cpp: buffers and launches given as the host code
//!   gives them) against the reference ops (Attention with its cache, TopK ids,
//!   MoeWeights, the combine and the slices bitwise; the rest within the GPU op-parity
//!   test's bounds).
//!
//! What it cannot show (a device's memory model, launch limits, the device's `expf` /
//! `logf`, real warp scheduling) is the GPU parity tests' business (tests/gpu_parity.rs,
//! tests/gpu_parity/resident.rs, run by tools/gpu-check.sh).
#![cfg(target_arch = "x86_64")]

use std::path::{Path, PathBuf};
use std::process::Command;

#[allow(dead_code)]
#[path = "emu/harness.rs"]
mod harness;

use harness::*;

#[test]
fn multi_sequence_delta_kernels_equal_each_sequence_alone() {
    run("delta_seqs.cpp", &[("COMMON_CUH", "common.cuh"), ("DELTA_CU", "delta.cu")], "bitwise equal to each sequence alone");
}

#[test]
fn multi_sequence_decode_attention_equals_the_per_sequence_kernels() {
    run(
        "attention_seqs.cpp",
        &[("COMMON_CUH", "common.cuh"), ("ATTENTION_CU", "attention.cu")],
        "every row and cache byte equal to the per-sequence kernels",
    );
}

/// A matmul launch: `n` rows of each of `n_exp` experts, `p` pairs (`ids[p]` their expert
/// with several, `act_div` pairs per activation row), `k` elements.
struct MmCase<'a> {
    n: usize,
    p: usize,
    k: usize,
    n_exp: usize,
    ids: &'a [i32],
    act_div: usize,
}

/// `mm_<format>` of `ty` under the emulation for `c`: every finite output checked against
/// `vec_dot` (nmse ≤ 1e-10, the GPU op-parity test's bound), an out-of-range expert's rows NaN.
fn check_mm(exe: &Path, ty: pn_ops::GgmlType, c: &MmCase<'_>, seed: &mut u64) {
    let MmCase { n, p, k, n_exp, ids, act_div } = *c;
    use pn_ops::quant::quantize_weights::quantize_weights;
    use pn_ops::quant::{quantize_row, vec_dot, vec_dot_type};
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let sfx = pn_cuda::formats::suffix(ty).expect("a native format");
    let at = vec_dot_type(ty);
    assert_eq!(pn_cuda::formats::act_format(ty).0, at, "{ty}: the device's activation format is the CPU's");
    let (w_rb, a_rb) = (ty.row_bytes(k).unwrap(), at.row_bytes(k).unwrap());
    let estride = n * w_rb;
    let mut w = vec![0u8; n_exp * estride];
    for r in w.chunks_mut(w_rb) {
        quantize_weights(ty, &floats(seed, k, 1.0), r).unwrap();
    }
    let a_rows = p.div_ceil(act_div);
    let mut a = vec![0u8; a_rows * a_rb];
    for r in a.chunks_mut(a_rb) {
        quantize_row(at, &floats(seed, k, 3.0), r);
    }
    let nb = if matches!(ty, pn_ops::GgmlType::F32 | pn_ops::GgmlType::F16 | pn_ops::GgmlType::BF16) { k } else { k / ty.block_size() };
    let mut file = Vec::new();
    for v in [n, nb, p, w_rb, a_rb, n_exp, estride, act_div] {
        file.extend_from_slice(&(v as i64).to_le_bytes());
    }
    file.extend_from_slice(&w);
    file.extend_from_slice(&a);
    ids.iter().for_each(|i| file.extend_from_slice(&i.to_le_bytes()));
    let (inp, outp) = (out.join(format!("mm_{sfx}_{n_exp}.in")), out.join(format!("mm_{sfx}_{n_exp}.out")));
    std::fs::write(&inp, &file).unwrap();
    let ran = Command::new(exe).arg(sfx).arg(&inp).arg(&outp).output().unwrap();
    assert!(ran.status.success(), "mm_{sfx}: {}", String::from_utf8_lossy(&ran.stdout));
    let y: Vec<f32> = std::fs::read(&outp).unwrap().chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    assert_eq!(y.len(), n * p);
    let (mut err, mut norm) = (0f64, 0f64);
    for pi in 0..p {
        let e = if n_exp > 1 { ids[pi] } else { 0 };
        for r in 0..n {
            let got = y[pi * n + r] as f64;
            if e < 0 || e as usize >= n_exp {
                assert!(got.is_nan(), "mm_{sfx}: pair {pi} names expert {e} of {n_exp}: expected NaN, found {got}");
                continue;
            }
            let wr = &w[e as usize * estride + r * w_rb..][..w_rb];
            let want = vec_dot(ty, k, wr, &a[pi / act_div * a_rb..][..a_rb]) as f64;
            assert!(got.is_finite(), "mm_{sfx}: row {r} pair {pi} is {got}");
            err += (got - want) * (got - want);
            norm += want * want;
        }
    }
    let nmse = err / norm.max(1e-30);
    assert!(nmse <= 1e-10, "mm_{sfx}: nmse {nmse:e} against vec_dot ({n_exp} experts)");
}

fn mm_exe() -> Option<PathBuf> {
    build("matmul.cpp", &[("COMMON_CUH", "common.cuh"), ("BLOCKS_CUH", "blocks.cuh"), ("MATMUL_CU", "matmul.cu")])
}


#[test]
fn matmul_kernels_match_vec_dot_for_every_native_format() {
    let Some(exe) = mm_exe() else { return };
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    // 6 rows (a partly filled block of 4 warps), 11 activation rows (a partly filled tile
    // of 8 / 4 pairs), 512 elements (two 256-blocks)
    for ty in NATIVE {
        check_mm(&exe, ty, &MmCase { n: 6, p: 11, k: 512, n_exp: 1, ids: &[], act_div: 1 }, &mut seed);
    }
}

#[test]
fn expert_matmuls_follow_the_ids() {
    let Some(exe) = mm_exe() else { return };
    let mut seed = 0x1234_5678_9abc_def1u64;
    // 3 experts, 13 pairs of 2 per activation row (top-2), one id out of range
    let ids: Vec<i32> = (0..13).map(|i| if i == 7 { 3 } else { i * 5 % 3 }).collect();
    for ty in NATIVE {
        check_mm(&exe, ty, &MmCase { n: 5, p: 13, k: 256, n_exp: 3, ids: &ids, act_div: 2 }, &mut seed);
    }
}

#[test]
fn activation_conversions_are_byte_identical_to_pn_ops() {
    use pn_ops::quant::quantize_row;
    use pn_ops::GgmlType::*;
    let Some(exe) = build("quantize.cpp", &[("COMMON_CUH", "common.cuh"), ("QUANTIZE_CU", "quantize.cu")]) else { return };
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let (rows, k) = (5usize, 512usize);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut x: Vec<f32> = (0..rows * k)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ((seed >> 11) % 200001) as f32 / 1000.0 - 100.0
        })
        .collect();
    // edge rows: all zero, one large outlier, ties at .5 after scaling, tiny values
    x[..k].fill(0.0);
    x[k + 3] = 3.0e4;
    for (i, v) in x[2 * k..3 * k].iter_mut().enumerate() {
        *v = (i % 255) as f32 - 127.0 + if i % 2 == 0 { 0.5 } else { -0.5 };
    }
    for v in &mut x[3 * k..4 * k] {
        *v *= 1e-30;
    }
    let mut file = Vec::new();
    for v in [rows, k] {
        file.extend_from_slice(&(v as i64).to_le_bytes());
    }
    x.iter().for_each(|v| file.extend_from_slice(&v.to_le_bytes()));
    let inp = out.join("quantize.in");
    std::fs::write(&inp, &file).unwrap();
    for (ty, name) in [(Q8_0, "q8_0"), (Q8_1, "q8_1"), (Q8K, "q8_k"), (F16, "f16"), (BF16, "bf16")] {
        let outp = out.join(format!("quantize_{name}.out"));
        let ran = Command::new(&exe).arg(name).arg(&inp).arg(&outp).output().unwrap();
        assert!(ran.status.success(), "quantize_{name}: {}", String::from_utf8_lossy(&ran.stdout));
        let got = std::fs::read(&outp).unwrap();
        let rb = ty.row_bytes(k).unwrap();
        assert_eq!(got.len(), rows * rb, "quantize_{name}");
        for r in 0..rows {
            let mut want = vec![0u8; rb];
            quantize_row(ty, &x[r * k..(r + 1) * k], &mut want);
            assert!(got[r * rb..(r + 1) * rb] == want[..], "quantize_{name}: row {r} differs from pn-ops");
        }
    }
}

#[test]
fn get_rows_match_the_reference_for_every_native_format() {
    use pn_ops::quant::quantize_weights::quantize_weights;
    use pn_ops::{Op, Shape, Tensor, Value, WeightView};
    let (k, vocab) = (256usize, 40usize);
    let ids = vec![0i32, 39, 7, 7, 12];
    let mut seed = 3u64;
    let mut job = Job::default();
    let bids = job.i32s(&ids);
    let bad_ids = job.i32s(&[40, -1]);
    let mut cases = Vec::new();
    for ty in NATIVE {
        let rb = ty.row_bytes(k).unwrap();
        let mut w = vec![0u8; vocab * rb];
        for r in w.chunks_mut(rb) {
            quantize_weights(ty, &floats(&mut seed, k, 2.0), r).unwrap();
        }
        let bw = job.buf(w.clone());
        let sfx = pn_cuda::formats::suffix(ty).unwrap();
        let (y, ybad) = (job.f32s(&vec![0.5; k * ids.len()]), job.f32s(&vec![0.5; k * 2]));
        for (b, yb, t) in [(bids, y, ids.len()), (bad_ids, ybad, 2)] {
            let args = [A::P(bw, 0), A::L(rb as i64), A::P(b, 0), A::I(t as i32), A::I(k as i32), A::P(yb, 0), A::I(vocab as i32)];
            job.launch(&format!("get_rows_{sfx}"), [(k * t).div_ceil(256) as u32, 1, 1], [256, 1, 1], &args);
        }
        cases.push((ty, w, y, ybad));
    }
    let Some(out) = job.run("matmul.cu") else { return };
    let it = Tensor::i32(Shape::d1(ids.len()), ids.clone());
    for (ty, w, y, ybad) in cases {
        let view = Value::Weight(WeightView { name: "tok", ty, shape: Shape::d2(k, vocab), bytes: &w, rows16: None });
        let want = reference(&Op::GetRows, &[view, Value::Act(&it)]);
        assert!(as_f32(&out[y as usize]) == want.as_f32(), "get_rows {ty}: not bitwise the reference");
        assert!(as_f32(&out[ybad as usize]).iter().all(|v| v.is_nan()), "get_rows {ty}: an id outside the table gives NaN rows");
    }
}

