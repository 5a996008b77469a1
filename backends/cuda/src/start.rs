//! Starting a backend: which physical device a die index names (`PN_CUDA_DEVICE_MAP`),
//! and what a test does when the start fails (`PN_REQUIRE_CUDA`).
//!
//! - `PN_CUDA_DEVICE_MAP=0,0`: die `cuda:i` opens physical device `map[i]`, so
//!   `--dies cuda:0,cuda:1` gives two backends on one GPU (two streams in its primary
//!   context): the split, the die-to-die copy and the two-phase step run on a one-GPU
//!   machine. Unset: `cuda:i` is device `i`.
//! - `PN_REQUIRE_CUDA=1` (set by `tools/gpu-check.sh run`): a test that cannot start
//!   the backend FAILS with the error, instead of taking it for "no GPU" and skipping
//!   (or comparing the reference backend with the CPU and reporting "pass").

use crate::{CudaBackend, CudaError};

pub const REQUIRE_VAR: &str = "PN_REQUIRE_CUDA";
pub const MAP_VAR: &str = "PN_CUDA_DEVICE_MAP";

/// Whether `PN_REQUIRE_CUDA` asks for a device (`1`, `true`, `yes`).
pub fn required() -> bool {
    std::env::var(REQUIRE_VAR).is_ok_and(|v| is_on(&v))
}

fn is_on(v: &str) -> bool {
    matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes")
}

/// The physical device of die index `logical` under `map` (the value of
/// `PN_CUDA_DEVICE_MAP`, a comma-separated list of device ordinals; None or empty: the
/// identity).
pub fn physical(logical: usize, map: Option<&str>) -> Result<usize, CudaError> {
    let Some(m) = map.map(str::trim).filter(|m| !m.is_empty()) else {
        return Ok(logical);
    };
    let ords = m
        .split(',')
        .map(|s| s.trim().parse::<usize>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| {
            CudaError::NoDevice(format!(
                "{MAP_VAR}: expected device ordinals separated by commas (e.g. 0,0), found {m:?}"
            ))
        })?;
    ords.get(logical).copied().ok_or_else(|| {
        CudaError::NoDevice(format!(
            "cuda:{logical}: {MAP_VAR}={m} maps dies cuda:0..cuda:{}",
            ords.len() - 1
        ))
    })
}

/// What a test does with a start result.
#[derive(Debug)]
pub enum Outcome<B> {
    /// The backend, and the line to print ("device present: NVIDIA H200 (sm_90)").
    Present(B, String),
    /// No device, not required: the skip line to print.
    Skip(String),
    /// The start failed while `PN_REQUIRE_CUDA` asks for a device: the failure message.
    Fail(String),
}

/// Decides on a start result; `what` names the test (in the skip / failure line).
pub fn decide<B>(
    r: Result<B, CudaError>,
    describe: impl FnOnce(&B) -> String,
    required: bool,
    what: &str,
) -> Outcome<B> {
    match r {
        Ok(b) => {
            let line = format!("device present: {}", describe(&b));
            Outcome::Present(b, line)
        }
        Err(e) if required => Outcome::Fail(format!(
            "{what}: {REQUIRE_VAR}=1 but the CUDA backend did not start: {e}"
        )),
        Err(e) => Outcome::Skip(format!("no CUDA device: {what} skipped ({e})")),
    }
}

/// For tests: `CudaBackend::new(index)`; prints "device present: …" and returns it;
/// without a device prints the skip line and returns None; PANICS (fails the test) with
/// the start error when `PN_REQUIRE_CUDA=1`.
pub fn for_test(index: usize, what: &str) -> Option<CudaBackend> {
    match decide(CudaBackend::new(index), |b| b.describe(), required(), what) {
        Outcome::Present(b, line) => {
            println!("{line}");
            Some(b)
        }
        Outcome::Skip(line) => {
            println!("{line}");
            None
        }
        Outcome::Fail(msg) => panic!("{msg}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_map_names_physical_devices() {
        assert_eq!(physical(3, None).unwrap(), 3);
        assert_eq!(physical(1, Some(" ")).unwrap(), 1);
        assert_eq!(physical(0, Some("0,0")).unwrap(), 0);
        assert_eq!(physical(1, Some("0, 0")).unwrap(), 0);
        assert_eq!(physical(1, Some("2,5")).unwrap(), 5);
        let e = physical(2, Some("0,0")).unwrap_err().to_string();
        assert!(e.contains("cuda:2") && e.contains("cuda:0..cuda:1"), "{e}");
        let e = physical(0, Some("0,x")).unwrap_err().to_string();
        assert!(
            e.contains("expected device ordinals") && e.contains("0,x"),
            "{e}"
        );
    }

    #[test]
    fn a_failed_start_fails_only_when_required() {
        let err = || Err::<u8, _>(CudaError::NoDevice("libcuda could not be loaded".into()));
        match decide(err(), |_| String::new(), true, "parity") {
            Outcome::Fail(m) => {
                assert!(
                    m.contains("PN_REQUIRE_CUDA=1") && m.contains("libcuda could not be loaded"),
                    "{m}"
                )
            }
            o => panic!("required: expected a failure, got {o:?}"),
        }
        match decide(err(), |_| String::new(), false, "parity") {
            Outcome::Skip(m) => assert!(m.starts_with("no CUDA device: parity skipped ("), "{m}"),
            o => panic!("not required: expected a skip, got {o:?}"),
        }
        match decide(Ok(7u8), |_| "NVIDIA H200 (sm_90)".into(), true, "parity") {
            Outcome::Present(7, l) => assert_eq!(l, "device present: NVIDIA H200 (sm_90)"),
            o => panic!("expected the backend, got {o:?}"),
        }
        assert!(is_on("1") && is_on(" TRUE ") && !is_on("0") && !is_on(""));
    }
}
