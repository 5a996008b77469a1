//! A short run of the load and faults harness (bench/serve/loadtest.py) against an
//! in-process server with an API key: 1, 4 and 16 streaming clients, 30 % of them hanging
//! up mid-stream, malformed requests in between (each answered with its 4xx JSON error), a
//! client reading one byte a second; 0 stream errors, busy slots back to 0, RSS at the end
//! within 5 % of after warm-up. The 5-minute, 64-client run is a benchmark
//! (docs/server.md).

mod common;
mod loopback;

use common::*;

#[test]
fn short_load_run_with_faults() {
    let py = loopback::python_with("json");
    if !loopback::require(py.clone().map(|_| ())) {
        return;
    }
    let mut cfg = config();
    cfg.api_key = Some("load-key".into());
    let url = loopback::listen(server(cfg, spec(DEFAULT, 16, 1024)));
    let pid = std::process::id().to_string();
    let out = loopback::run_script(
        &py.unwrap(),
        "bench/serve/loadtest.py",
        &[&url, "--pid", &pid, "--clients", "1,4,16", "--seconds", "8", "--requests", "400", "--max-tokens", "32", "--faults", "--api-key", "load-key"],
    );
    assert!(out.contains("loadtest: all checks passed"), "{out}");
}
