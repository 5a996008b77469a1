//! Scale-out with real processes: two `pn serve` replicas (the built binary, 16 slots
//! each, the default model) behind Debian's `nginx` running deploy/nginx.conf as shipped
//! (its three loopback ports swapped for free ones). server/tests/nginx_check.py then runs
//! 32 concurrent streams through nginx (0 errors, both replicas used, counted by each
//! replica's `pn_requests_total`) and 6 two-turn conversations with an `x-session-id`
//! each: turn 2 through nginx is a prefix-cache hit on the replica that served turn 1.
//!
//! Without nginx (or a python3) the test says so and passes, except under `CI=true`,
//! where it fails (`.ci/run` installs nginx).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A missing tool: a panic under CI (CI=true), else a message and a skip (false).
fn require(what: Result<PathBuf, String>) -> Option<PathBuf> {
    match what {
        Ok(p) => Some(p),
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("{e}"),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

/// An executable on PATH or in /usr/sbin (Debian puts nginx there), or why not.
fn which(name: &str, package: &str) -> Result<PathBuf, String> {
    let dirs = std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).unwrap_or_default();
    dirs.into_iter()
        .chain(["/usr/sbin".into(), "/usr/bin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("`{name}` is not installed (Debian: apt-get install {package}; .ci/run does)"))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0").local_addr().unwrap().port()
}

/// A child process ended with SIGTERM when the test ends (nginx's master stops its
/// workers on SIGTERM; SIGKILL would orphan them), plus a directory to remove.
struct Proc(Child, Option<PathBuf>);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
        let t = Instant::now();
        while self.0.try_wait().ok().flatten().is_none() && t.elapsed() < Duration::from_secs(15) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
        if let Some(d) = &self.1 {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// `pn serve` on a free port; returns it and its URL once the ready line is out.
fn replica() -> (Proc, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pn"))
        .args(["serve", "--port", "0", "--slots", "16", "--ctx", "1024", "--grace", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("pn serve starts");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let p = Proc(child, None);
    let mut line = String::new();
    out.read_line(&mut line).expect("ready line");
    // "listening on http://127.0.0.1:PORT, model NAME, K slots"
    let url = line.strip_prefix("listening on ").and_then(|l| l.split(',').next()).unwrap_or_else(|| panic!("ready line: {line:?}")).to_string();
    assert!(line.contains("16 slots"), "{line}");
    (p, url)
}

#[test]
fn two_serve_processes_behind_nginx() {
    let Some(nginx) = require(which("nginx", "nginx")) else { return };
    let Some(py) = require(which("python3", "python3")) else { return };
    let (r1, u1) = replica();
    let (r2, u2) = replica();
    assert_ne!(r1.0.id(), r2.0.id());

    let lb_port = free_port();
    let conf = std::fs::read_to_string(repo().join("deploy/nginx.conf")).expect("deploy/nginx.conf");
    let mut patched = conf.replace("127.0.0.1:18080", &format!("127.0.0.1:{lb_port}"));
    for (i, u) in [&u1, &u2].iter().enumerate() {
        let old = format!("127.0.0.1:{}", 18081 + i);
        assert!(patched.contains(&old), "deploy/nginx.conf lists {old}");
        patched = patched.replace(&old, u.trim_start_matches("http://"));
    }
    let dir = std::env::temp_dir().join(format!("pn-nginx-procs-{}", std::process::id()));
    for d in ["logs", "tmp"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    std::fs::write(dir.join("nginx.conf"), patched).unwrap();
    let child = Command::new(&nginx)
        .arg("-p")
        .arg(&dir)
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .args(["-g", "daemon off;"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nginx starts");
    let lb_proc = Proc(child, Some(dir.clone()));
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", lb_port)).is_err() {
        let log = std::fs::read_to_string(dir.join("logs/error.log")).unwrap_or_default();
        assert!(t.elapsed() < Duration::from_secs(20), "nginx did not listen on {lb_port}: {log}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let lb = format!("http://127.0.0.1:{lb_port}");
    let o = Command::new(&py).arg(repo().join("server/tests/nginx_check.py")).args([&lb, &u1, &u2]).output().expect("python3 runs");
    let out = String::from_utf8_lossy(&o.stdout);
    eprintln!("{out}{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success() && out.contains("nginx: all checks passed"), "nginx_check.py failed:\n{out}");
    drop(lb_proc);
    // both replicas are still healthy processes after the run
    for (mut r, u) in [(r1, u1), (r2, u2)] {
        assert!(r.0.try_wait().unwrap().is_none(), "the replica at {u} exited during the run");
    }
}
