//! Scale-out: deploy/nginx.conf (as shipped, loopback ports swapped for free ones) in
//! front of two in-process `pn serve` replicas; server/tests/nginx_check.py runs 32 streams
//! through it (0 errors, both replicas used) and shows turn 2 of a conversation with the
//! same `x-session-id` hitting the prefix cache. Needs Debian's `nginx` (fails only in CI
//! without it).

mod common;
mod loopback;

use common::*;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Nginx(Child, std::path::PathBuf);
impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM: the master stops its workers (SIGKILL would orphan them)
        let _ = Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn two_replicas_behind_nginx() {
    let nginx = loopback::which("nginx");
    let py = loopback::python_with("json");
    if !loopback::require(nginx.clone().map(|_| ()).and(py.clone().map(|_| ()))) {
        return;
    }
    let replicas: Vec<String> = (0..2).map(|_| loopback::listen(server(config(), spec(DEFAULT, 16, 1024)))).collect();
    let lb_port = free_port();
    let conf = std::fs::read_to_string(repo("deploy/nginx.conf")).expect("deploy/nginx.conf");
    let mut patched = conf.replace("127.0.0.1:18080", &format!("127.0.0.1:{lb_port}"));
    for (i, r) in replicas.iter().enumerate() {
        let old = format!("127.0.0.1:{}", 18081 + i);
        assert!(patched.contains(&old), "deploy/nginx.conf lists {old}");
        patched = patched.replace(&old, r.trim_start_matches("http://"));
    }
    let dir = std::env::temp_dir().join(format!("pn-nginx-{}", std::process::id()));
    for d in ["logs", "tmp"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    std::fs::write(dir.join("nginx.conf"), patched).unwrap();
    let child = Command::new(nginx.unwrap())
        .arg("-p")
        .arg(&dir)
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .args(["-g", "daemon off;"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nginx starts");
    let _guard = Nginx(child, dir.clone());
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", lb_port)).is_err() {
        assert!(t.elapsed() < Duration::from_secs(20), "nginx did not listen on {lb_port}: {}", std::fs::read_to_string(dir.join("logs/error.log")).unwrap_or_default());
        std::thread::sleep(Duration::from_millis(50));
    }
    let lb = format!("http://127.0.0.1:{lb_port}");
    let out = loopback::run_script(&py.unwrap(), "server/tests/nginx_check.py", &[&lb, &replicas[0], &replicas[1]]);
    assert!(out.contains("nginx: all checks passed"), "{out}");
}
