//! Servers on real loopback sockets for the browser, nginx and load tests: an in-process
//! `pn serve` (the same router as the binary) on 127.0.0.1, and a Python that has the
//! packages a test script needs.
#![allow(dead_code)]

use pn_server::Server;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

/// Serves `server` on 127.0.0.1 (a free port) on its own runtime thread; returns the URL.
pub fn listen(server: Arc<Server>) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1");
            tx.send(l.local_addr().unwrap()).unwrap();
            axum::serve(l, server.router()).await.expect("serve");
        });
    });
    format!("http://{}", rx.recv().expect("listening"))
}

/// `$PN_PYTHON`, else the repo's `.venv-ci/bin/python` (.ci/run fills it), else `python3`:
/// the first that can import `module`, or why none can.
pub fn python_with(module: &str) -> Result<PathBuf, String> {
    let venv = super::common::repo(".venv-ci/bin/python");
    let cands: Vec<PathBuf> = match std::env::var_os("PN_PYTHON") {
        Some(p) => vec![p.into()],
        None => vec![venv, "python3".into()],
    };
    for p in &cands {
        if Command::new(p).args(["-c", &format!("import {module}")]).output().is_ok_and(|o| o.status.success()) {
            return Ok(p.clone());
        }
    }
    Err(format!("no Python with `{module}` (tried {cands:?}): run `python3 -m venv .venv-ci && .venv-ci/bin/pip install {module}` (.ci/run does)"))
}

/// A missing tool: fail under CI (CI=true), else say why and skip (returns false).
pub fn require(what: Result<(), String>) -> bool {
    match what {
        Ok(()) => true,
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("{e}"),
        Err(e) => {
            eprintln!("skipped: {e}");
            false
        }
    }
}

/// An executable on PATH (or an absolute path), or why not.
pub fn which(name: &str) -> Result<PathBuf, String> {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain(["/usr/sbin".into(), "/usr/bin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file());
    found.ok_or_else(|| format!("`{name}` is not installed (Debian: apt-get install {name}; .ci/run does)"))
}

/// Runs a Python script with args; prints its output; fails the test when it fails.
pub fn run_script(py: &PathBuf, script: &str, args: &[&str]) -> String {
    let o = Command::new(py).arg(super::common::repo(script)).args(args).output().expect("python runs");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    eprintln!("{out}{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{script} failed:\n{out}\n{}", String::from_utf8_lossy(&o.stderr));
    out
}
