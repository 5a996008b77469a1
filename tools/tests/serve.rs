//! `pn serve` end to end: the built binary on a free port, driven by the real `openai`
//! Python package (server/tests/openai_e2e.py), then SIGTERM: a running stream finishes
//! and the server exits 0.
//!
//! Python: $PN_PYTHON, else the repo's `.venv-ci/bin/python` (.ci/run installs `openai`
//! there), else `python3`. Without the package the test fails under CI (CI=true) and is
//! skipped with a message elsewhere.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A Python that can `import openai`, or why there is none.
fn python() -> Result<PathBuf, String> {
    let venv = repo().join(".venv-ci/bin/python");
    let cands: Vec<PathBuf> = match std::env::var_os("PN_PYTHON") {
        Some(p) => vec![p.into()],
        None => vec![venv, "python3".into()],
    };
    for p in &cands {
        if Command::new(p).args(["-c", "import openai"]).output().is_ok_and(|o| o.status.success()) {
            return Ok(p.clone());
        }
    }
    Err(format!("no Python with the `openai` package (tried {cands:?}): run `python3 -m venv .venv-ci && .venv-ci/bin/pip install openai` (.ci/run does)"))
}

/// Kills the server if the test fails half-way.
struct Serve(Child);
impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn openai_client_end_to_end_then_sigterm() {
    let py = match python() {
        Ok(p) => p,
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("{e}"),
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_pn"))
        .args(["serve", "--port", "0", "--slots", "4", "--ctx", "1024", "--api-key", "e2e-key", "--grace", "30", "--greedy"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("pn serve starts");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut srv = Serve(child);
    let mut line = String::new();
    out.read_line(&mut line).expect("ready line");
    // "listening on http://127.0.0.1:PORT, model NAME, K slots"
    let url = line.strip_prefix("listening on ").and_then(|l| l.split(',').next()).unwrap_or_else(|| panic!("ready line: {line:?}")).to_string();
    assert!(line.contains("4 slots"), "{line}");
    let script = repo().join("server/tests/openai_e2e.py");
    let o = Command::new(&py).arg(&script).args([&url, "e2e-key"]).output().expect("python runs");
    let report = String::from_utf8_lossy(&o.stdout);
    eprintln!("{report}{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "openai checks failed:\n{report}");
    assert!(report.contains("7 passed, 0 failed"), "{report}");

    // a stream in flight when SIGTERM arrives still finishes; then the server exits 0
    let mut drain = Command::new(&py).arg(&script).args([&url, "e2e-key", "drain"]).stdout(Stdio::piped()).spawn().expect("python runs");
    let mut dout = BufReader::new(drain.stdout.take().unwrap());
    let mut l = String::new();
    dout.read_line(&mut l).unwrap();
    assert_eq!(l.trim(), "STREAMING");
    let pid = srv.0.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    l.clear();
    dout.read_line(&mut l).unwrap();
    assert!(l.starts_with("DRAINED length"), "the stream was cut: {l:?}");
    assert!(drain.wait().unwrap().success());
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = srv.0.try_wait().unwrap() {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "pn serve did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "pn serve exited with {status}");
}
