//! CUDA kernels run under a CPU emulation of the CUDA execution model
//! (tests/emu/cuda_emu.h: blocks in turn, a block's threads as fibers switched at every
//! barrier and warp shuffle), built with the host C++ compiler around the kernel files:
//! - kernels/delta.cu's multi-sequence kernels against each sequence computed alone,
//!   bitwise (tests/emu/delta_seqs.cpp);
//! - kernels/attention.cu's decode kernels for many sequences (`kv_store_seqs`,
//!   `attn_kv_seqs`) against the single-sequence kernels launched once per sequence: every
//!   row and cache byte, each cell format, ring and plain (tests/emu/attention_seqs.cpp);
//! - kernels/matmul.cu's `mm_<format>` for every native weight format against pn-ops'
//!   `vec_dot` (tests/emu/matmul.cpp; the tolerance of the GPU op-parity test).
//!
//! What it cannot show (a device's memory model, launch limits, `expf`) is the GPU parity
//! tests' business (tests/gpu_parity/resident.rs).
#![cfg(target_arch = "x86_64")]

use std::path::{Path, PathBuf};
use std::process::Command;

/// `file` under kernels/ as plain C++ in the test's temporary folder: no `extern "C"`, the
/// dynamic shared array the emulation's, common.cuh's f16 `asm` the emulation's F16C.
fn as_cpp(root: &Path, out: &Path, file: &str) -> PathBuf {
    let src = std::fs::read_to_string(root.join("kernels").join(file)).unwrap();
    let mut cpp = src.replace("extern \"C\" ", "");
    for arr in ["qk", "xs"] {
        cpp = cpp.replace(&format!("extern __shared__ float {arr}[];"), &format!("float* {arr} = emu_dyn_shared;"));
    }
    let asm = [
        ("asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h));", "f = emu_h2f(h);"),
        ("asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));", "h = emu_f2h(f);"),
    ];
    for (from, to) in asm {
        cpp = cpp.replace(from, to);
    }
    assert!(!cpp.contains("asm(") && !cpp.contains("extern __shared__"), "{file}: something the emulation does not rewrite");
    let path = out.join(format!("{file}.inc"));
    std::fs::write(&path, cpp).unwrap();
    path
}

/// Builds tests/emu/`main` with the kernel files (`(macro, file under kernels/)`): the
/// executable, or None (said on stderr) where no C++ compiler runs outside CI.
fn build(main: &str, kernels: &[(&str, &str)]) -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let exe = out.join(main.trim_end_matches(".cpp"));
    let mut cmd = Command::new(&cxx);
    cmd.args(["-O1", "-std=c++20", "-mf16c", "-o"]).arg(&exe).arg(format!("-I{}", root.join("tests/emu").display()));
    for (macro_name, file) in kernels {
        cmd.arg(format!("-D{macro_name}=\"{}\"", as_cpp(&root, &out, file).display()));
    }
    let built = match cmd.arg(root.join("tests/emu").join(main)).output() {
        Ok(o) => o,
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("no C++ compiler ({cxx}: {e}): the emulation test did not run");
            return None;
        }
        Err(e) => panic!("no C++ compiler ({cxx}): {e}"),
    };
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    Some(exe)
}

/// Builds tests/emu/`main` with the kernel files and runs it: its output must say `expect`.
fn run(main: &str, kernels: &[(&str, &str)], expect: &str) {
    let Some(exe) = build(main, kernels) else { return };
    let ran = Command::new(&exe).output().unwrap();
    let said = String::from_utf8_lossy(&ran.stdout);
    assert!(ran.status.success() && said.contains(expect), "{said}");
}

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

#[test]
fn matmul_kernels_match_vec_dot_for_every_native_format() {
    use pn_ops::quant::quantize_weights::quantize_weights;
    use pn_ops::quant::{quantize_row, vec_dot, vec_dot_type};
    use pn_ops::GgmlType::*;
    let Some(exe) = build("matmul.cpp", &[("COMMON_CUH", "common.cuh"), ("BLOCKS_CUH", "blocks.cuh"), ("MATMUL_CU", "matmul.cu")]) else { return };
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    // 6 rows (a partly filled block of 4 warps), 11 activation rows (a partly filled tile
    // of 8 / 4 pairs), 512 elements (two 256-blocks)
    let (n, p, k) = (6usize, 11usize, 512usize);
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        ((seed >> 11) % 20001) as f32 / 10000.0 - 1.0
    };
    for ty in [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K, IQ4NL, IQ4XS, MXFP4, F32, F16, BF16] {
        let sfx = pn_cuda::formats::suffix(ty).expect("a native format");
        let at = vec_dot_type(ty);
        assert_eq!(pn_cuda::formats::act_format(ty).0, at, "{ty}: the device's activation format is the CPU's");
        let (w_rb, a_rb) = (ty.row_bytes(k).unwrap(), at.row_bytes(k).unwrap());
        let mut w = vec![0u8; n * w_rb];
        for r in w.chunks_mut(w_rb) {
            let x: Vec<f32> = (0..k).map(|_| rnd()).collect();
            quantize_weights(ty, &x, r).unwrap();
        }
        let mut a = vec![0u8; p * a_rb];
        for r in a.chunks_mut(a_rb) {
            let x: Vec<f32> = (0..k).map(|_| 3.0 * rnd()).collect();
            quantize_row(at, &x, r);
        }
        let nb = if matches!(ty, F32 | F16 | BF16) { k } else { k / ty.block_size() };
        let mut file = Vec::new();
        for v in [n, nb, p, w_rb, a_rb] {
            file.extend_from_slice(&(v as i64).to_le_bytes());
        }
        file.extend_from_slice(&w);
        file.extend_from_slice(&a);
        let (inp, outp) = (out.join(format!("mm_{sfx}.in")), out.join(format!("mm_{sfx}.out")));
        std::fs::write(&inp, &file).unwrap();
        let ran = Command::new(&exe).arg(sfx).arg(&inp).arg(&outp).output().unwrap();
        assert!(ran.status.success(), "mm_{sfx}: {}", String::from_utf8_lossy(&ran.stdout));
        let y: Vec<f32> = std::fs::read(&outp).unwrap().chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        assert_eq!(y.len(), n * p);
        // the GPU op-parity test's measure: normalized squared error ≤ 1e-10
        let (mut err, mut norm) = (0f64, 0f64);
        for pi in 0..p {
            for r in 0..n {
                let want = vec_dot(ty, k, &w[r * w_rb..(r + 1) * w_rb], &a[pi * a_rb..(pi + 1) * a_rb]) as f64;
                let got = y[pi * n + r] as f64;
                assert!(got.is_finite(), "mm_{sfx}: row {r} pair {pi} is {got}");
                err += (got - want) * (got - want);
                norm += want * want;
            }
        }
        let nmse = err / norm.max(1e-30);
        assert!(nmse <= 1e-10, "mm_{sfx}: nmse {nmse:e} against vec_dot");
    }
}
