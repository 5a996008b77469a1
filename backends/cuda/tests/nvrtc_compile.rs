//! Kernel sources checks. Without a GPU:
//! - `kernel_table_matches_files` / `no_device_is_a_clear_error` always run;
//! - `every_kernel_compiles` (ignored; run by tools/nvrtc-check.sh with libnvrtc on
//!   LD_LIBRARY_PATH) compiles every kernel file with NVRTC for sm_80 and sm_90 and
//!   fails on any error or warning (a non-empty NVRTC log) or a missing kernel;
//! - `cubin_cache_complete` (ignored; run by `tools/gpu-check.sh bundle`) fails unless
//!   `$PN_CUDA_CACHE` holds, for every architecture of `$PN_CUBIN_ARCHS` (default sm_90),
//!   the CUBIN of every module under the name this build looks for, with every kernel in
//!   it: the device then needs no NVRTC.

use pn_cuda::kernels::{self, FORMATS, MODULES};
use std::collections::BTreeSet;

#[test]
fn kernel_table_matches_files() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels");
    let on_disk: BTreeSet<String> = std::fs::read_dir(dir)
        .expect("kernels/ exists")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".cu"))
        .collect();
    let listed: BTreeSet<String> = MODULES.iter().map(|m| m.file.to_string()).collect();
    assert_eq!(
        on_disk, listed,
        "every kernels/*.cu file is a module in src/kernels.rs and vice versa"
    );
    for m in MODULES {
        let src = m.full_source();
        for e in m.entries {
            let found = if let Some(sfx) = e
                .strip_prefix("mm_")
                .or_else(|| e.strip_prefix("get_rows_"))
            {
                FORMATS.contains(&sfx) && src.contains(&format!("X({sfx},"))
            } else {
                src.contains(&format!("void {e}("))
            };
            assert!(found, "{}: kernel {e} not defined", m.file);
        }
    }
    use pn_ops::GgmlType::*;
    let native = [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K, IQ4NL, IQ4XS, MXFP4,
    ];
    let sfx: BTreeSet<&str> = native
        .iter()
        .map(|t| pn_cuda::formats::suffix(*t).expect("native"))
        .collect();
    assert_eq!(
        sfx,
        FORMATS.iter().copied().collect(),
        "formats::suffix and kernels::FORMATS agree"
    );
}

#[test]
fn no_device_is_a_clear_error() {
    match pn_cuda::CudaBackend::new(0) {
        Ok(b) => println!("device present: {}", b.describe()),
        Err(e) => {
            let msg = e.to_string();
            println!("{msg}");
            let ok = msg.starts_with("no CUDA driver/device") || msg.starts_with("NVRTC");
            assert!(ok, "unexpected error without a device: {msg}");
        }
    }
    // an index past the devices present is always NoDevice
    match pn_cuda::CudaBackend::new(1 << 20) {
        Ok(_) => panic!("device 2^20 cannot exist"),
        Err(e) => assert!(e.to_string().starts_with("no CUDA driver/device"), "{e}"),
    }
}

/// The kernels of `m` whose names (NUL-terminated symbols) are not in `cubin`.
fn missing_kernels(m: &kernels::Module, cubin: &[u8]) -> Vec<&'static str> {
    m.entries
        .iter()
        .copied()
        .filter(|e| {
            !cubin
                .windows(e.len() + 1)
                .any(|w| &w[..e.len()] == e.as_bytes() && w[e.len()] == 0)
        })
        .collect()
}

#[test]
#[ignore = "checks a CUBIN cache ($PN_CUDA_CACHE; tools/gpu-check.sh bundle)"]
fn cubin_cache_complete() {
    assert!(
        std::env::var_os("PN_CUDA_CACHE").is_some(),
        "set PN_CUDA_CACHE to the cache to check"
    );
    let archs = std::env::var("PN_CUBIN_ARCHS").unwrap_or_else(|_| "sm_90".into());
    let mut failures = Vec::new();
    for arch in archs.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        for m in MODULES {
            let p = kernels::cache_path(m, arch);
            match std::fs::read(&p) {
                Ok(b) if b.is_empty() => failures.push(format!("{}: empty", p.display())),
                Ok(b) => {
                    let missing = missing_kernels(m, &b);
                    if missing.is_empty() {
                        println!("ok  {arch}  {}", p.display());
                    } else {
                        failures.push(format!("{}: kernels missing {missing:?}", p.display()));
                    }
                }
                Err(e) => failures.push(format!("{} {arch}: {} ({e})", m.file, p.display())),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "CUBIN cache incomplete (the device would need NVRTC):\n{}",
        failures.join("\n")
    );
}

#[test]
#[ignore = "needs libnvrtc (tools/nvrtc-check.sh)"]
fn every_kernel_compiles() {
    assert!(
        kernels::nvrtc_present(),
        "libnvrtc not found: run tools/nvrtc-check.sh, or put libnvrtc.so.12 on LD_LIBRARY_PATH"
    );
    let (maj, min) = kernels::nvrtc_version().expect("nvrtcVersion");
    println!("NVRTC {maj}.{min}");
    let mut failures = Vec::new();
    for arch in ["sm_80", "sm_90"] {
        for m in MODULES {
            match kernels::compile(m, arch) {
                Err(e) => failures.push(format!("{} {arch}: {e}", m.file)),
                Ok(c) if !c.log.is_empty() => {
                    failures.push(format!("{} {arch}: warnings:\n{}", m.file, c.log))
                }
                Ok(c) => {
                    let missing = missing_kernels(m, &c.cubin);
                    if !missing.is_empty() {
                        failures.push(format!(
                            "{} {arch}: kernels missing from the CUBIN: {missing:?}",
                            m.file
                        ));
                    }
                    println!(
                        "ok  {arch}  {:<16} {:>8} bytes  {} kernels",
                        m.file,
                        c.cubin.len(),
                        m.entries.len()
                    );
                    if std::env::var_os("PN_CUDA_CACHE").is_some() {
                        let p = kernels::cache_path(m, arch);
                        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                        std::fs::write(&p, &c.cubin).unwrap();
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "NVRTC check failed:\n{}",
        failures.join("\n")
    );
}
