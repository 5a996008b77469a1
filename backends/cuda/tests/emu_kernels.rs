//! CUDA kernels run under a CPU emulation of the CUDA execution model
//! (tests/emu/cuda_emu.h: blocks in turn, a block's threads as fibers switched at every
//! barrier and warp shuffle), built with the host C++ compiler around the kernel files:
//! - kernels/delta.cu's multi-sequence kernels against each sequence computed alone,
//!   bitwise (tests/emu/delta_seqs.cpp);
//! - kernels/attention.cu's decode kernels for many sequences (`kv_store_seqs`,
//!   `attn_kv_seqs`) against the single-sequence kernels launched once per sequence: every
//!   row and cache byte, each cell format, ring and plain (tests/emu/attention_seqs.cpp).
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

/// Builds tests/emu/`main` with the kernel files and runs it: its output, which must say
/// `expect`.
fn run(main: &str, kernels: &[(&str, &str)], expect: &str) {
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
            return;
        }
        Err(e) => panic!("no C++ compiler ({cxx}): {e}"),
    };
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
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
