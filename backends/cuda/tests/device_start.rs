//! The device start-up probe (the first phase of `tools/gpu-check.sh run`) and the
//! `PN_REQUIRE_CUDA` contract: under it a backend that does not start is a test failure
//! printing the error; without it the test skips with a message.

use pn_cuda::kernels::{self, MODULES};
use pn_cuda::start::{for_test, MAP_VAR, REQUIRE_VAR};
use std::process::Command;

/// Starts cuda:0 (every kernel compiled or loaded from the CUBIN cache) and prints
/// "device present: <name> (sm_XX)", the line the device script requires, and what a
/// one-shot debug needs: where the kernels came from, shared memory per kernel.
#[test]
fn device_starts() {
    let Some(b) = for_test(0, "device_starts") else {
        return;
    };
    let arch = b.describe();
    let arch = arch
        .rsplit_once('(')
        .map_or("", |(_, a)| a.trim_end_matches(')'));
    let cached = MODULES
        .iter()
        .filter(|m| kernels::cache_path(m, arch).is_file())
        .count();
    println!(
        "kernels: {cached} of {} modules cached for {arch} in {} (NVRTC {})",
        MODULES.len(),
        kernels::cache_dir().display(),
        if kernels::nvrtc_present() {
            "present"
        } else {
            "absent"
        }
    );
    println!(
        "static shared memory: attn_kv {} B, kv_store {} B",
        b.static_shared("attn_kv"),
        b.static_shared("kv_store")
    );
}

/// Runs `device_starts` of this binary in a child process, on a device that cannot
/// exist (the map sends cuda:0 to device 2^20), with and without `PN_REQUIRE_CUDA=1`.
fn probe_child(require: bool) -> (bool, String) {
    let exe = std::env::current_exe().expect("the test binary");
    let mut c = Command::new(exe);
    c.args([
        "--exact",
        "device_starts",
        "--nocapture",
        "--test-threads",
        "1",
    ])
    .env(MAP_VAR, "1048576");
    if require {
        c.env(REQUIRE_VAR, "1");
    } else {
        c.env_remove(REQUIRE_VAR);
    }
    let out = c.output().expect("run the child test");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn a_failed_start_fails_under_require_cuda_and_skips_without() {
    let (ok, text) = probe_child(true);
    assert!(
        !ok,
        "PN_REQUIRE_CUDA=1 and no device: the probe must fail:\n{text}"
    );
    assert!(
        text.contains(
            "PN_REQUIRE_CUDA=1 but the CUDA backend did not start: no CUDA driver/device"
        ),
        "the failure prints the start error:\n{text}"
    );
    let (ok, text) = probe_child(false);
    assert!(ok, "without PN_REQUIRE_CUDA no device is a skip:\n{text}");
    assert!(
        text.contains("no CUDA device: device_starts skipped (no CUDA driver/device"),
        "the skip says why:\n{text}"
    );
    assert!(!text.contains("device present:"), "{text}");
}
