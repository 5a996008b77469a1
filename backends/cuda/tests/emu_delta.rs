//! kernels/delta.cu's multi-sequence kernels (`delta_rule_seqs`, `conv1d_causal_seqs`,
//! `conv_state_update_seqs`, `conv_state_store_seqs`) run under a CPU emulation of the CUDA
//! execution model (tests/emu/delta_seqs.cpp, built with the host C++ compiler): every
//! output and state bitwise what each sequence gives alone, across two sequence tables.
//! What it cannot show (the device's memory model, launch limits, `expf`) is the GPU
//! parity tests' business (tests/gpu_parity/resident.rs).

use std::path::PathBuf;
use std::process::Command;

#[test]
fn multi_sequence_delta_kernels_equal_each_sequence_alone() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    // the kernel source as plain C++: no `extern "C"`, the dynamic shared array a static one
    let cu = std::fs::read_to_string(root.join("kernels/delta.cu")).unwrap();
    assert!(cu.contains("extern __shared__ float qk[];"), "delta.cu's shared staging array changed: update this test");
    let inc = out.join("delta_emu.inc");
    std::fs::write(&inc, cu.replace("extern \"C\" ", "").replace("extern __shared__ float qk[];", "float* qk = SH;")).unwrap();
    let exe = out.join("delta_emu");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let built = Command::new(&cxx)
        .args(["-O1", "-std=c++17", "-o"])
        .arg(&exe)
        .arg(format!("-DDELTA_CU=\"{}\"", inc.display()))
        .arg(root.join("tests/emu/delta_seqs.cpp"))
        .output();
    let built = match built {
        Ok(o) => o,
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("no C++ compiler ({cxx}: {e}): the emulation test did not run");
            return;
        }
        Err(e) => panic!("no C++ compiler ({cxx}): {e}"),
    };
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    let run = Command::new(&exe).output().unwrap();
    let said = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{said}");
    assert!(said.contains("bitwise equal to each sequence alone"), "{said}");
}
